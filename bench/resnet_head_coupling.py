#!/usr/bin/env python3
"""The classifier's coupling: how much of a SkipInit ResNet's input gradient leans on the classifier's own weights.

Usage: bench/resnet_head_coupling.py [--networks 1600] [--width 1] [--seed 11]

A float64 NumPy replica of a pre-activation SkipInit ResNet at initialisation, as `proplab` builds it (every block
is the identity while its branch multiplier is 0; docs/theory.md, "ResNets", "The classifier's coupling"): the stem,
a 3×3 conv from 3 channels of i.i.d. N(0, 1) pixels (32×32, zero padding) to 16·width with He weights; then ReLU
and the first transition's 1×1 stride-2 projection to 32·width; ReLU and the second's to 64·width; the final ReLU,
average pooling and the classifier (10 classes, weights of variance 1/fan_in); the mean softmax cross-entropy of 16
images whose classes a random linear teacher of the pixels gives. Per network it measures the second moment of the
gradient at the top stream (below the final ReLU), below the second transition and at the stem's output, for
  A  the network's own backward pass,
  H  the same with the classifier's transpose drawn afresh (independent of the logits it made),
  C  every transpose drawn afresh (the independent-weights bookkeeping's assumption),
and E|Jᵀf|², f each image's pooled features carried backward through the network's own weights, times
σ⁴·((tr S)² + tr S²)/N² per image (S = diag p − ppᵀ): the term the bookkeeping adds. Prints A/C and H/C per level
(their excess is the coupling; H/C = 1 shows it is all the classifier's) and (C + term)/C beside it. About two
minutes for 1600 networks; one network's input gradient scatters by about 35%, so 400 networks resolve it to ±2%.
"""
import argparse
import math

import numpy as np

CLASSES, IMAGES, SIZE = 10, 16, 32


def network(rng, width):
    c1, c2, c3 = 16 * width, 32 * width, 64 * width
    pad = np.zeros((SIZE + 2, SIZE + 2))
    pad[1:-1, 1:-1] = 1
    images = rng.standard_normal((IMAGES, 3, SIZE + 2, SIZE + 2)) * pad
    teacher = rng.standard_normal((CLASSES, 3 * SIZE * SIZE))
    labels = np.argmax(images[:, :, 1:-1, 1:-1].reshape(IMAGES, -1) @ teacher.T, axis=1)
    stem = rng.standard_normal((c1, 3, 3, 3)) * math.sqrt(2 / 27)
    x1 = sum(np.einsum("oc,ncij->noij", stem[:, :, i, j], images[:, :, i:i + SIZE, j:j + SIZE])
             for i in range(3) for j in range(3))
    weights = {"p1": rng.standard_normal((c2, c1)) * math.sqrt(2 / c1),
               "p2": rng.standard_normal((c3, c2)) * math.sqrt(2 / c2),
               "head": rng.standard_normal((CLASSES, c3)) * math.sqrt(1 / c3)}
    x2 = np.einsum("oc,ncij->noij", weights["p1"], np.maximum(x1, 0)[:, :, ::2, ::2])
    x3 = np.einsum("oc,ncij->noij", weights["p2"], np.maximum(x2, 0)[:, :, ::2, ::2])
    features = np.maximum(x3, 0).mean(axis=(2, 3))
    logits = features @ weights["head"].T
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    return x1, x2, x3, features, p, np.eye(CLASSES)[labels], weights


def backward(d_features, x1, x2, x3, p1, p2):
    """Second moments of the gradient at the top stream, below the second transition and at the stem's output."""
    area = x3.shape[2] * x3.shape[3]
    g3 = (x3 > 0) * (d_features / area)[:, :, None, None]
    g2 = np.zeros_like(x2)
    g2[:, :, ::2, ::2] = np.einsum("oc,noij->ncij", p2, g3)
    g2 *= x2 > 0
    g1 = np.zeros_like(x1)
    g1[:, :, ::2, ::2] = np.einsum("oc,noij->ncij", p1, g2)
    g1 *= x1 > 0
    return np.array([(g3 ** 2).mean(), (g2 ** 2).mean(), (g1 ** 2).mean()])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--networks", type=int, default=1600)
    parser.add_argument("--width", type=int, default=1)
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    sums = {key: [] for key in ("A", "H", "C", "term")}
    for _ in range(args.networks):
        x1, x2, x3, features, p, targets, w = network(rng, args.width)
        c1, c2, c3 = x1.shape[1], x2.shape[1], x3.shape[1]
        fresh = {"p1": rng.standard_normal((c2, c1)) * math.sqrt(2 / c1),
                 "p2": rng.standard_normal((c3, c2)) * math.sqrt(2 / c2),
                 "head": rng.standard_normal((CLASSES, c3)) * math.sqrt(1 / c3)}
        r = (p - targets) / IMAGES
        sums["A"].append(backward(r @ w["head"], x1, x2, x3, w["p1"], w["p2"]))
        sums["H"].append(backward(r @ fresh["head"], x1, x2, x3, w["p1"], w["p2"]))
        sums["C"].append(backward(r @ fresh["head"], x1, x2, x3, fresh["p1"], fresh["p2"]))
        s = p[:, :, None] * np.eye(CLASSES)[None] - p[:, :, None] * p[:, None, :]
        factor = np.einsum("nkk->n", s) ** 2 + np.einsum("nkj,njk->n", s, s)
        sigma2 = 1 / c3
        sums["term"].append(backward(features * sigma2 * np.sqrt(factor)[:, None] / IMAGES, x1, x2, x3,
                                     w["p1"], w["p2"]))
    values = {key: np.array(v) for key, v in sums.items()}
    base = values["C"].mean(axis=0)
    print(f"{args.networks} networks, width {args.width}: second moment over the independent-weights one (C), "
          "± the standard error")
    for level, name in enumerate(("top stream (below the final ReLU)", "below the second transition",
                                  "stem output")):
        def ratio(key):
            v = values[key][:, level] / base[level]
            return f"{v.mean():.4f} ± {v.std(ddof=1) / math.sqrt(len(v)):.4f}"
        predicted = (base[level] + values["term"][:, level].mean()) / base[level]
        print(f"  {name:34s} A/C {ratio('A')}   H/C {ratio('H')}   (C + term)/C {predicted:.4f}")


if __name__ == "__main__":
    main()
