#!/usr/bin/env python3
"""A ReLU after a conv of small fan-in: the Gaussian scale mixture that the bookkeeping's closure leaves out.

Usage: bench/resnet_scale_mixture.py [--networks 1500] [--images 4] [--seed 0]

A NumPy Monte Carlo of a post-activation ResNet's first two maps at initialisation, as `proplab` builds a
bottleneck Fixup ResNet (docs/theory.md, "Accuracy", 2026-12-06): the stem, a 3×3 conv from 3 channels of i.i.d.
N(0, 1) pixels (32×32, zero padding) to 16 with He weights, then ReLU; and the first block, whose branch is zero at
initialisation, so its output is ReLU of the 1×1 projection of its shortcut from 16 channels to 64 (He weights).

Over the random weights a conv's output at one position is exactly Gaussian given its input patch x, with variance
σ_w²·|x|², so the ReLU after it has the mean E[σ_w·|x|]/√(2π), below the Gaussian closure's √(σ_w²·E|x|²)/√(2π).
Prints the measured variance of each ReLU's output over the closure's (the projection's against its own input's
measured variance, which the closure keeps), beside the derivation's factor for |x|²/E|x|² Gamma-distributed with
the relative variance CV² of the patch's squared norm: 2/27 for the stem's pixels, 5/16 for 16 independent rectified
channels (E[ReLU⁴]/E[ReLU²]² = 6), and 0.41 if the stem channels' shared patch scale were added (which the Monte
Carlo rules out). About 10 s; a network's variance scatters by a few percent, so fewer networks leave the stem's
0.9% unresolved (200 networks: ±0.5%).
"""
import argparse
import math

import numpy as np


def closure_factor(cv2):
    """Var[ReLU(y)] over the Gaussian closure's when y | x ~ N(0, σ²|x|²) and |x|²/E|x|² ~ Gamma of variance cv2."""
    k = 1.0 / cv2
    ratio = math.exp(math.lgamma(k + 0.5) - math.lgamma(k)) / math.sqrt(k)  # E|x| / √(E|x|²)
    return (0.5 - ratio * ratio / (2 * math.pi)) / (0.5 - 1 / (2 * math.pi))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--networks", type=int, default=1500)
    parser.add_argument("--images", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.networks < 2 or args.images < 1:
        parser.error("--networks needs at least 2 and --images at least 1")
    rng = np.random.default_rng(args.seed)
    size, stem_in, stem_out, wide = 32, 3, 16, 64
    # The stem's pixels are N(0, 1): at a position whose 3×3 window has t taps inside the image (zero padding), the
    # closure takes z ~ N(0, s²), s² = 2/27·3·t, so ReLU(z) has mean s/√(2π) and second moment s²/2; the variance
    # over all positions is the mean second moment less the square of the mean mean.
    inside = np.ones((size + 2, size + 2))
    inside[0, :] = inside[-1, :] = inside[:, 0] = inside[:, -1] = 0
    s2 = 2.0 / (9 * stem_in) * stem_in * sum(inside[i:i + size, j:j + size] for i in range(3) for j in range(3))
    closure_stem = 0.5 * s2.mean() - (np.sqrt(s2).mean() / math.sqrt(2 * math.pi)) ** 2
    stem, projection = [], []
    for _ in range(args.networks):
        images = rng.standard_normal((args.images, stem_in, size + 2, size + 2)) * inside
        weights = rng.standard_normal((stem_out, stem_in, 3, 3)) * math.sqrt(2.0 / (9 * stem_in))
        z = sum(np.einsum("oc,ncij->noij", weights[:, :, i, j], images[:, :, i:i + size, j:j + size])
                for i in range(3) for j in range(3))
        x = np.maximum(z, 0.0)
        y = np.einsum("oc,ncij->noij", rng.standard_normal((wide, stem_out)) * math.sqrt(2.0 / stem_out), x)
        stem.append(x.var() / closure_stem)
        projection.append(np.maximum(y, 0.0).var() / x.var())
    for name, values, cv2s in (("stem ReLU", stem, [("2/27", 2 / 27)]),
                               ("projection ReLU", projection, [("5/16", 5 / 16), ("0.41", (1 + 2 / 27) * (1 + 5 / 16) - 1)])):
        mean, error = np.mean(values), np.std(values, ddof=1) / math.sqrt(len(values))
        derived = ", ".join(f"{closure_factor(c):.4f} (CV² {label})" for label, c in cv2s)
        print(f"{name:16s} measured over the closure {mean:.4f} ± {error:.4f}; derived {derived}")


if __name__ == "__main__":
    main()
