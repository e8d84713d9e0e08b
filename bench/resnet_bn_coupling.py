#!/usr/bin/env python3
"""How much a pre-activation BatchNorm ResNet's gradient leans on its own weights at initialisation.

Usage: bench/resnet_bn_coupling.py [--depth 56] [--seeds 96] [--first 1] [--post]

A float64 PyTorch replica of proplab's pre-activation BatchNorm ResNet (width 1: 16/32/64 channels; each block
BN → ReLU → conv3×3 → BN → ReLU → conv3×3 plus the identity or a 1×1 stride-2 projection of the first ReLU's output;
He-initialised convs, norms without gains or biases; the final BN → ReLU → average pool → classifier of variance
1/64; 16 N(0, 1) images of 32×32 with the classes the C++ tests give them, (7·i + seed) mod 10); --post: the
post-activation one (stem conv → BN → ReLU; blocks ReLU(x + BN(conv(ReLU(BN(conv(x)))))) with the projection
BN(conv1×1(x)); no final norm). One backward pass
per network in three forms, the forward always the network's own:
  T  the network's own backward pass;
  F  every conv's and the classifier's transpose drawn afresh from the same law (BatchNorm's backward keeps the
     batch statistics): the independence between a gradient and the weights it passes through that the
     bookkeeping assumes;
  H  only the classifier's transpose drawn afresh.
Prints, for the stream at the stem's output and after every block, the seeds' mean of T and of H over the mean of
F, with T's standard error (docs/theory.md, "What remains: the pre-activation 8×8 stage"). About 1.5 minutes for
96 networks on 2 cores. Needs torch (bench/make-torch-venv.sh; bench-only, not a proplab dependency).
"""
import argparse
import math
import statistics
import sys

import torch

IMAGES, CLASSES = 16, 10


class Conv(torch.autograd.Function):
    """conv2d whose backward to its input uses `backward_weight` (the same tensor as `weight`, or a fresh draw)."""

    @staticmethod
    def forward(ctx, x, weight, backward_weight, stride, pad):
        ctx.save_for_backward(x, backward_weight)
        ctx.stride, ctx.pad = stride, pad
        return torch.nn.functional.conv2d(x, weight, stride=stride, padding=pad)

    @staticmethod
    def backward(ctx, g):
        x, backward_weight = ctx.saved_tensors
        return (torch.nn.grad.conv2d_input(x.shape, backward_weight, g, stride=ctx.stride, padding=ctx.pad),
                None, None, None, None)


class Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, backward_weight):
        ctx.save_for_backward(backward_weight)
        return x @ weight.T

    @staticmethod
    def backward(ctx, g):
        (backward_weight,) = ctx.saved_tensors
        return g @ backward_weight, None, None


def bn(x):
    mean = x.mean(dim=(0, 2, 3), keepdim=True)
    var = x.var(dim=(0, 2, 3), unbiased=False, keepdim=True)
    return (x - mean) / torch.sqrt(var + 1e-5)


def he(gen, cout, cin, k):
    return torch.randn(cout, cin, k, k, generator=gen, dtype=torch.float64) * math.sqrt(2.0 / (cin * k * k))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--depth", type=int, default=56)
    parser.add_argument("--seeds", type=int, default=96)
    parser.add_argument("--first", type=int, default=1)
    parser.add_argument("--post", action="store_true", help="the post-activation ResNet instead")
    args = parser.parse_args()
    per_stage = (args.depth - 2) // 6
    values = {}
    for seed in range(args.first, args.first + args.seeds):
        gen = torch.Generator().manual_seed(seed)
        stem = he(gen, 16, 3, 3)
        blocks, cin = [], 16
        for stage, cout in enumerate((16, 32, 64)):
            for b in range(per_stage):
                stride = 2 if (stage > 0 and b == 0) else 1
                blocks.append({"c1": he(gen, cout, cin, 3), "c2": he(gen, cout, cout, 3), "stride": stride,
                               "proj": he(gen, cout, cin, 1) if stride != 1 else None})
                cin = cout
        head = torch.randn(CLASSES, 64, generator=gen, dtype=torch.float64) / 8.0
        fresh = [{key: he(gen, *w.shape[:3]) if torch.is_tensor(w) and w.dim() == 4 else None
                  for key, w in blk.items()} for blk in blocks]
        fresh_head = torch.randn(CLASSES, 64, generator=gen, dtype=torch.float64) / 8.0
        images = torch.randn(IMAGES, 3, 32, 32, generator=gen, dtype=torch.float64).requires_grad_(True)
        labels = torch.tensor([(7 * i + seed) % CLASSES for i in range(IMAGES)])
        for form in ("T", "F", "H"):
            def back(own, other):
                return other if form == "F" else own
            x = Conv.apply(images, stem, stem, 1, 1)
            if args.post:
                x = torch.relu(bn(x))
            x.retain_grad()
            streams = [x]
            for blk, new in zip(blocks, fresh):
                if args.post:  # ReLU(x + BN(conv(ReLU(BN(conv(x)))))), the projection BN(conv1×1(x))
                    out = torch.relu(bn(Conv.apply(x, blk["c1"], back(blk["c1"], new["c1"]), blk["stride"], 1)))
                    out = bn(Conv.apply(out, blk["c2"], back(blk["c2"], new["c2"]), 1, 1))
                    shortcut = (bn(Conv.apply(x, blk["proj"], back(blk["proj"], new["proj"]), blk["stride"], 0))
                                if blk["proj"] is not None else x)
                    x = torch.relu(out + shortcut)
                else:
                    a = torch.relu(bn(x))
                    out = Conv.apply(a, blk["c1"], back(blk["c1"], new["c1"]), blk["stride"], 1)
                    out = Conv.apply(torch.relu(bn(out)), blk["c2"], back(blk["c2"], new["c2"]), 1, 1)
                    shortcut = (Conv.apply(a, blk["proj"], back(blk["proj"], new["proj"]), blk["stride"], 0)
                                if blk["proj"] is not None else x)
                    x = out + shortcut
                x.retain_grad()
                streams.append(x)
            features = (x if args.post else torch.relu(bn(x))).mean(dim=(2, 3))
            logits = Linear.apply(features, head, head if form == "T" else fresh_head)
            torch.nn.functional.cross_entropy(logits, labels).backward()
            for i, s in enumerate(streams):
                values.setdefault((form, i), []).append(float((s.grad ** 2).mean()))
        print(f"resnet_bn_coupling: seed {seed}", file=sys.stderr, flush=True)
    print(f"{args.seeds} networks, {'post' if args.post else 'pre'}-activation BatchNorm ResNet-{args.depth}: the "
          "stream's gradient second moment "
          "over the independent-transposes one (F)")
    for i in range(len(blocks) + 1):
        f = statistics.mean(values[("F", i)])
        t = values[("T", i)]
        se = statistics.stdev(t) / math.sqrt(len(t)) / f if len(t) > 1 else 0.0
        name = "stem.out" if i == 0 else f"blocks.{i - 1}.out"
        print(f"  {name:14s} T/F {statistics.mean(t) / f:.4f} ± {se:.4f}   "
              f"H/F {statistics.mean(values[('H', i)]) / f:.4f}")


if __name__ == "__main__":
    main()
