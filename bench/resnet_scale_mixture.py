#!/usr/bin/env python3
"""A ReLU after a conv of small fan-in: the Gaussian scale mixture that the Gaussian closure leaves out.

Usage: bench/resnet_scale_mixture.py [--networks 2000] [--images 4] [--seed 7]

A NumPy Monte Carlo of the first maps of a post-activation bottleneck Fixup ResNet at initialisation, as `proplab`
builds it (docs/theory.md, "A ReLU after a conv of small fan-in"): the stem, a 3×3 conv from 3 channels of i.i.d.
N(0, 1) pixels (32×32, zero padding) to 16 with He weights, then ReLU; the first block, whose branch is zero at
initialisation, so its output is ReLU of the 1×1 projection of its shortcut from 16 channels to 64; and the first
block of the second stage, ReLU of the 1×1 stride-2 projection from 64 channels to 128 (He weights throughout).

Over the random weights a conv's output at one position is exactly N(0, σ_w²·|x|²) given its input patch x, so a
ReLU after it has the mean σ_w·E|x|/√(2π), below the Gaussian closure's √(σ_w²·E|x|²)/√(2π). Prints each ReLU's
measured variance over the closure's at the same second moment (the stem's from its per-position tap counts, each
projection's from its own input's measured E[x²]), beside the factor (½ − E[√s]²/(2π))/(½ − 1/(2π)) that the
bookkeeping derives (the stem's for an interior position), s = |x|²/E|x|² a product of independent Gamma factors: 2/27 for the stem's pixels, then per 1×1
conv from C ReLU channels a fresh 5/C (E[a⁴] = 6·E[a²]² given the scale the channels share), the earlier factors
shared by all of a position's channels. Also the measured E[√s] and Var[s] of each projection's input patch, and the
factor one Gamma of the whole product's variance would give. About a minute; one network's variances scatter by
several percent, so fewer networks leave the differences between the forms unresolved (400 networks: ±0.7%).
"""
import argparse
import math

import numpy as np

CLOSURE = 0.5 - 1 / (2 * math.pi)


def gamma_root(cv2):
    """E[√s] for s Gamma-distributed of mean 1 and relative variance cv2."""
    k = 1.0 / cv2
    return math.exp(math.lgamma(k + 0.5) - math.lgamma(k)) / math.sqrt(k)


def factor(root):
    """Var[ReLU(y)] over the Gaussian closure's, for y | s ~ N(0, v·s) with E[√s] = root."""
    return (0.5 - root * root / (2 * math.pi)) / CLOSURE


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--networks", type=int, default=2000)
    parser.add_argument("--images", type=int, default=4)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    if args.networks < 2 or args.images < 1:
        parser.error("--networks needs at least 2 and --images at least 1")
    rng = np.random.default_rng(args.seed)
    size, stem_in, stem_out, wide, wider = 32, 3, 16, 64, 128
    # The stem's pixels are N(0, 1): at a position whose 3×3 window has t taps inside the image (zero padding), the
    # closure takes z ~ N(0, s²), s² = 2/27·3·t, so ReLU(z) has mean s/√(2π) and second moment s²/2; the variance
    # over all positions is the mean second moment less the square of the mean mean.
    inside = np.ones((size + 2, size + 2))
    inside[0, :] = inside[-1, :] = inside[:, 0] = inside[:, -1] = 0
    s2 = 2.0 / (9 * stem_in) * stem_in * sum(inside[i:i + size, j:j + size] for i in range(3) for j in range(3))
    closure_stem = 0.5 * s2.mean() - (np.sqrt(s2).mean() / math.sqrt(2 * math.pi)) ** 2
    measured = {"stem": [], "projection 16 -> 64": [], "projection 64 -> 128, stride 2": []}
    patches = {"projection 16 -> 64": ([], []), "projection 64 -> 128, stride 2": ([], [])}
    for _ in range(args.networks):
        images = rng.standard_normal((args.images, stem_in, size + 2, size + 2)) * inside
        weights = rng.standard_normal((stem_out, stem_in, 3, 3)) * math.sqrt(2.0 / (9 * stem_in))
        z = sum(np.einsum("oc,ncij->noij", weights[:, :, i, j], images[:, :, i:i + size, j:j + size])
                for i in range(3) for j in range(3))
        x = np.maximum(z, 0.0)
        measured["stem"].append(x.var() / closure_stem)
        for name, c_out, stride in (("projection 16 -> 64", wide, 1), ("projection 64 -> 128, stride 2", wider, 2)):
            x = x[:, :, ::stride, ::stride]
            c_in = x.shape[1]
            y = np.einsum("oc,ncij->noij", rng.standard_normal((c_out, c_in)) * math.sqrt(2.0 / c_in), x)
            measured[name].append(np.maximum(y, 0.0).var() / (2.0 * (x ** 2).mean() * CLOSURE))
            norm = (x ** 2).sum(axis=1)  # |x|² at each position
            patches[name][0].append(np.sqrt(norm).mean() / math.sqrt(norm.mean()))
            patches[name][1].append(norm.var() / norm.mean() ** 2)
            x = np.maximum(y, 0.0)
    stem_root = gamma_root(2 / 27)
    derived = {"stem": (stem_root, 2 / 27),
               "projection 16 -> 64": (stem_root * gamma_root(5 / 16), (1 + 2 / 27) * (1 + 5 / 16) - 1),
               "projection 64 -> 128, stride 2": (stem_root * gamma_root(5 / 16) * gamma_root(5 / 64),
                                                  (1 + 2 / 27) * (1 + 5 / 16) * (1 + 5 / 64) - 1)}
    for name, values in measured.items():
        mean, error = np.mean(values), np.std(values, ddof=1) / math.sqrt(len(values))
        root, cv2 = derived[name]
        line = (f"{name:31s} measured over the closure {mean:.4f} ± {error:.4f}; derived {factor(root):.4f} "
                f"(E[√s] {root:.4f}, Var[s] {cv2:.3f}; one Gamma of that variance: {factor(gamma_root(cv2)):.4f})")
        if name in patches:
            roots, cv2s = patches[name]
            line += f"; the patches' E[√s] {np.mean(roots):.4f}, Var[s] {np.mean(cv2s):.3f}"
        print(line)


if __name__ == "__main__":
    main()
