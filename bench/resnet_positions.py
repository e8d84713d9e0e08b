#!/usr/bin/env python3
"""What BatchNorm's 1/σ_c² costs in a pre-activation ResNet at initialisation, split into its parts.

Usage: resnet_positions.py [--depth 56] [--seeds 8] [--batch 16] [--big 512] [--size 32]

A float64 PyTorch replica of proplab's pre-activation BatchNorm ResNet (width 1: 16/32/64 channels; each block
BN → ReLU → conv3×3 → BN → ReLU → conv3×3 plus the identity or a 1×1 stride-2 projection of the first ReLU's output;
He-initialised convs, no norm gains or biases; N(0, 1) pixels, as proplab's data.kind = "images"). At every norm it
measures F = E[1/σ_c²]·E[σ_c²] over channels and seeds (the factor by which BatchNorm's division exceeds dividing by
the average variance; docs/theory.md, "The channels' variances spread") for the study's batch and for a batch of
--big images, whose F is the weights' part alone (the batch's sampling part there is 32 times smaller); "within",
the same over each seed's channels alone (what is left of F(big) when the seeds' overall scales are taken out); and
the positions' correlation within an image for the fixed network, S = (1/HW)·Σ_{p≠p'} ρ_c(p, p')², averaged over
channels (ρ over the --big images). With positions independent, the batch's sampling part is 2/(N·HW); with them
correlated it is 2·(1 + S)/(N·HW) (Gaussian elements), which the script prints beside the measured difference
F(batch) − F(big). docs/theory.md ("ResNets", "The zero padding spreads the channels' variances") quotes
`resnet_positions.py --depth 20 --seeds 8 --big 256` (a few minutes on 2 cores). Needs torch
(bench/make-torch-venv.sh; bench-only, not a proplab dependency).
"""
import argparse
import math

import torch


def conv(cin, cout, k, stride, gain, gen):
    w = torch.randn(cout, cin, k, k, generator=gen, dtype=torch.float64) * math.sqrt(gain / (cin * k * k))
    return (w, stride, k // 2)


def apply(c, x):
    w, stride, pad = c
    return torch.nn.functional.conv2d(x, w, stride=stride, padding=pad)


class Replica:
    def __init__(self, depth, gen):
        n = (depth - 2) // 6
        self.stem = conv(3, 16, 3, 1, 1.0, gen)
        self.blocks = []
        cin = 16
        for stage, cout in enumerate((16, 32, 64)):
            for b in range(n):
                stride = 2 if (stage > 0 and b == 0) else 1
                block = {"c1": conv(cin, cout, 3, stride, 2.0, gen), "c2": conv(cout, cout, 3, 1, 2.0, gen),
                         "proj": conv(cin, cout, 1, stride, 2.0, gen) if (stride != 1 or cin != cout) else None,
                         "name": f"blocks.{len(self.blocks)}", "stage": stage}
                self.blocks.append(block)
                cin = cout

    def norms(self, images):
        """Yields (name, stage, the norm's input) for every norm, in order, normalising with the batch's statistics."""
        x = apply(self.stem, images)
        for blk in self.blocks:
            h = x
            yield blk["name"] + ".norm0", blk["stage"], h
            a = torch.relu(bn(h))
            out = apply(blk["c1"], a)
            yield blk["name"] + ".norm1", blk["stage"], out
            out = apply(blk["c2"], torch.relu(bn(out)))
            x = out + (apply(blk["proj"], a) if blk["proj"] is not None else x)
        yield "final_norm", 2, x


def bn(x):
    mean = x.mean(dim=(0, 2, 3), keepdim=True)
    var = x.var(dim=(0, 2, 3), unbiased=False, keepdim=True)
    return (x - mean) / torch.sqrt(var + 1e-5)


def positions_correlation(x):
    """S = (1/HW)·Σ_{p≠p'} ρ(p, p')² per channel (ρ over the images), averaged over channels."""
    n, c, h, w = x.shape
    y = x.reshape(n, c, h * w)
    y = y - y.mean(dim=0, keepdim=True)
    cov = torch.einsum("ncp,ncq->cpq", y, y) / n
    sd = torch.sqrt(torch.diagonal(cov, dim1=1, dim2=2))
    rho = cov / (sd[:, :, None] * sd[:, None, :])
    s = (rho ** 2).sum(dim=(1, 2)) - h * w
    # An estimate from n images adds about (HW − 1)/n to every row's Σρ²; take it off.
    return float((s / (h * w) - (h * w - 1) / n).mean())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--depth", type=int, default=56)
    p.add_argument("--seeds", type=int, default=8)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--big", type=int, default=512)
    p.add_argument("--size", type=int, default=32)
    args = p.parse_args()
    torch.set_grad_enabled(False)
    acc = {}
    for seed in range(1, args.seeds + 1):
        gen = torch.Generator().manual_seed(seed)
        net = Replica(args.depth, gen)
        small = torch.randn(args.batch, 3, args.size, args.size, generator=gen, dtype=torch.float64)
        big = torch.randn(args.big, 3, args.size, args.size, generator=gen, dtype=torch.float64)
        for (name, stage, xs), (_, _, xb) in zip(net.norms(small), net.norms(big)):
            e = acc.setdefault(name, {"stage": stage, "hw": xs.shape[2] * xs.shape[3], "vs": [], "vb": [], "s": []})
            e["vs"].append(xs.var(dim=(0, 2, 3), unbiased=False))
            e["vb"].append(xb.var(dim=(0, 2, 3), unbiased=False))
            e["s"].append(positions_correlation(xb))
        print(f"resnet_positions: seed {seed} of {args.seeds}", flush=True)
    print("norm                 HW   F(batch)-1  F(big)-1  within-1  sampling: measured  independent  with S   S")
    for name, e in acc.items():
        def factor(vs):
            v = torch.cat(vs)
            return float((1 / v).mean() * v.mean())
        fs, fb = factor(e["vs"]), factor(e["vb"])
        within = sum(factor([v]) for v in e["vb"]) / len(e["vb"])
        s = sum(e["s"]) / len(e["s"])
        ind = 2 / (args.batch * e["hw"])
        print(f"{name:18s} {e['hw']:5d}  {fs - 1:9.5f}  {fb - 1:9.5f}  {within - 1:8.5f}  {fs - fb:17.5f}  {ind:11.5f}  {ind * (1 + s):7.5f}"
              f"  {s:6.3f}")


if __name__ == "__main__":
    main()
