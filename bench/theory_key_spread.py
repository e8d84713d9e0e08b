#!/usr/bin/env python3
"""Causal attention on an unnormalised deep stream: how much the keys' unequal spreads matter.

Usage: bench/theory_key_spread.py CHECKPOINT.ckpt.h5 [--seeds 8] [--draws 4] [--blocks 0,8,20,40,47]
                                  [--beta-sq B] [--lambda-sq L] [--samples 3000]

CHECKPOINT is a proplab checkpoint of a transformer without norms (model.norm = "none", GELU) written after one step,
e.g. `proplab run study.toml --set train.steps=1`; only its tensors' stds are read (each weight is redrawn normal
with its checkpoint tensor's std, the packed QKV by thirds). The residual weights are DeepScaleLM's, β² = 1/layers
per sublayer and λ² = 1 − β², unless --beta-sq gives β² (and --lambda-sq λ²: `xavier` is --beta-sq 1 --lambda-sq 1).
For each of SEEDS networks (float64, PyTorch from the bench
virtual environment: bench/make-torch-venv.sh) a batch of 2 sequences of uniform tokens runs through the stack; at
each block of --blocks it records the stream's per-feature token covariance C (over the positions, averaged over the
sequences and networks) and the attention's mixed output variance per position for that stream under DRAWS fresh
unit-scale q/k/v projections. It then prints, per block, the mean mixed variance of

- `actual`: the stream itself;
- `gaussian`: Gaussian tokens with covariance C and isotropic features (so only C matters);
- `equal keys`: per query, i.i.d. logits of one spread, the prefix's sample spread (as theory/token_field's
  causal_weights took it before 2026-12-04; that map, fed the same C, read within 0.1% of this);
- `own spreads`: per query, independent logits with each key's own spread (its deviation from the prefix mean), as
  causal_weights now takes them, mixing C exactly (Monte Carlo, SAMPLES draws per query);
- `correlated`: per query, the logits the Gaussian field itself gives: for a query of squared length |q_h|² over
  its head's d_h features (χ² with d_h degrees of freedom about its mean), the keys' logits are jointly normal,
  N(shift, |q_h|²/d_h·(P·C·P)) with P the centring over the prefix, so keys whose deviations from the prefix mean are
  alike have alike logits (docs/theory.md, "Correlated logits").

Then, per block, the weights' concentration E[Σ_k w_k²] (mean over the queries) in the `actual` stream and in the
`own spreads` and `correlated` models.

Both models leave out the 1/width term of the values along the logits (docs/theory.md), which the `actual` and
`gaussian` columns carry. Biases are left out (zero at initialisation under deepscalelm).

docs/theory.md ("Keys of unequal spread" under "Predictions along the model") reads these figures.
"""
import argparse
import math
import sys

try:
    import numpy as np
    import torch
    from unnormalised_replica import gelu, read_checkpoint, residual_weights
except ImportError as e:
    sys.exit(f"theory_key_spread: needs PyTorch, NumPy and h5py ({e}); see bench/make-torch-venv.sh")

torch.set_default_dtype(torch.float64)


def fail(message):
    print(f"theory_key_spread: {message}", file=sys.stderr)
    sys.exit(2)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint")
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--draws", type=int, default=4, help="fresh attention projections per recorded block")
    parser.add_argument("--blocks", default="0,8,20,40,47")
    parser.add_argument("--beta-sq", type=float, default=None, help="β² per sublayer (default 1/layers)")
    parser.add_argument("--lambda-sq", type=float, default=None, help="λ² per sublayer (default 1 − β²)")
    parser.add_argument("--samples", type=int, default=3000, help="logit draws per query for the key models")
    args = parser.parse_args()
    for name in ("seeds", "draws", "samples"):
        if getattr(args, name) < 1:
            fail(f"--{name}: {getattr(args, name)}; needs at least 1")
    ck = read_checkpoint(args.checkpoint, fail)
    std, thirds = ck.std, ck.thirds
    V, d, T, L, H = ck.vocab, ck.width, ck.tokens, ck.layers, ck.heads
    beta_sq, lambda_sq = residual_weights(ck, args.beta_sq, args.lambda_sq, fail)
    try:
        blocks = sorted({int(b) for b in args.blocks.split(",")})
    except ValueError:
        fail(f"--blocks: {args.blocks!r} is not a comma-separated list of block indices")
    if not blocks or blocks[0] < 0 or blocks[-1] >= L:
        fail(f"--blocks: {args.blocks!r}; the checkpoint has blocks 0..{L - 1}")
    beta, lam = math.sqrt(beta_sq), math.sqrt(lambda_sq)
    B, dh = 2, d // H
    g = torch.Generator().manual_seed(777)

    def rn(*shape, s):
        return torch.randn(*shape, generator=g) * s

    def heads(x, w):
        return (x @ w.T).view(x.shape[0], T, H, dh).transpose(1, 2)

    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)

    def attention(x, s_qk, s_v, concentration=None):
        wq, wk, wv = rn(d, d, s=s_qk[0]), rn(d, d, s=s_qk[1]), rn(d, d, s=s_v)
        logits = heads(x, wq) @ heads(x, wk).transpose(-1, -2) / math.sqrt(dh)
        p = logits.masked_fill(mask, float("-inf")).softmax(-1)
        if concentration is not None:
            concentration += p.pow(2).sum(-1).mean((0, 1)).numpy()
        return p @ heads(x, wv)

    def mixed_var(x, concentration=None):  # per position, per feature: E[y_t²] under unit-scale projections
        unit = 1.0 / math.sqrt(d)
        total = sum((attention(x, (unit, unit), unit, concentration) ** 2).mean((0, 1, 3)).numpy()
                    for _ in range(args.draws))
        if concentration is not None:
            concentration /= args.draws
        return total / args.draws

    cov = {b: np.zeros((T, T)) for b in blocks}
    actual = {b: np.zeros(T) for b in blocks}
    actual_sq = {b: np.zeros(T) for b in blocks}
    for seed in range(args.seeds):
        x = rn(V, d, s=std["embed.token.weight"])[torch.randint(0, V, (B, T), generator=g)]
        x = x + rn(T, d, s=std["embed.position.weight"])
        for l in range(L):
            if l in cov:
                cov[l] += torch.einsum("bif,bjf->ij", x, x).numpy() / (B * d * args.seeds)
                concentration = np.zeros(T)
                actual[l] += mixed_var(x, concentration) / args.seeds
                actual_sq[l] += concentration / args.seeds
            y = attention(x, thirds[l][:2], thirds[l][2]).transpose(1, 2).reshape(B, T, d)
            x = lam * x + beta * (y @ rn(d, d, s=std[f"blocks.{l}.attn.out.weight"]).T)
            h = gelu(x @ rn(4 * d, d, s=std[f"blocks.{l}.ffn.fc.weight"]).T)
            x = lam * x + beta * (h @ rn(d, 4 * d, s=std[f"blocks.{l}.ffn.proj.weight"]).T)
        print(f"theory_key_spread: network {seed + 1}/{args.seeds}", file=sys.stderr, flush=True)

    rng = np.random.default_rng(5)
    print(f"{'block':>5}  {'actual':>9}  {'gaussian':>9}  {'equal keys':>10}  {'own spreads':>11}  {'correlated':>10}  "
          f"{'equal/gauss':>11}  {'own/gauss':>9}  {'corr/gauss':>10}  key spread, first key / last  "
          f"E[Σw²]: actual / own spreads / correlated")
    for b in blocks:
        C = cov[b]
        root = torch.linalg.cholesky(torch.tensor(C) + 1e-10 * torch.eye(T))
        gaussian = sum(mixed_var(root @ torch.randn(B, T, d, generator=g)) for _ in range(4)) / 4
        equal, own, correlated = np.zeros(T), np.zeros(T), np.zeros(T)
        own_sq, correlated_sq = np.ones(T), np.ones(T)
        for i in range(T):
            n, prefix = i + 1, C[:i + 1, :i + 1]
            if n == 1:
                equal[i] = own[i] = correlated[i] = prefix[0, 0]
                continue
            # Each key's deviation from the prefix mean; the logits of query i have variance E[q_i²]·(deviation).
            deviation = np.diag(prefix) - 2 * prefix.mean(1) + prefix.mean()
            for spreads, out in ((np.full(n, deviation.mean()), equal), (deviation, own)):
                z = rng.standard_normal((args.samples, n)) * np.sqrt(np.maximum(C[i, i] * spreads * n / (n - 1), 0))
                p = np.exp(z - z.max(1, keepdims=True))
                p /= p.sum(1, keepdims=True)
                out[i] = np.einsum("sk,km,sm->s", p, prefix, p).mean()
                if out is own:
                    own_sq[i] = (p ** 2).sum(1).mean()
            # The field's own logits: N(0, |q_h|²/d_h · P·C·P), |q_h|²/d_h = C_ii·χ²_{d_h}/d_h (P·C·P is singular).
            centring = np.eye(n) - 1.0 / n
            values, vectors = np.linalg.eigh(centring @ prefix @ centring)
            root = vectors * np.sqrt(np.maximum(values, 0))
            length = C[i, i] * rng.chisquare(dh, args.samples) / dh
            z = (rng.standard_normal((args.samples, n)) @ root.T) * np.sqrt(length)[:, None]
            p = np.exp(z - z.max(1, keepdims=True))
            p /= p.sum(1, keepdims=True)
            correlated[i] = np.einsum("sk,km,sm->s", p, prefix, p).mean()
            correlated_sq[i] = (p ** 2).sum(1).mean()
        dev = np.diag(C) - 2 * C.mean(1) + C.mean()
        print(f"{b:5d}  {actual[b].mean():9.5f}  {gaussian.mean():9.5f}  {equal.mean():10.5f}  {own.mean():11.5f}  "
              f"{correlated.mean():10.5f}  {equal.mean() / gaussian.mean():11.4f}  "
              f"{own.mean() / gaussian.mean():9.4f}  "
              f"{correlated.mean() / gaussian.mean():10.4f}  {dev[0] / dev[-1]:29.2f}  "
              f"{actual_sq[b].mean():.3f} / {own_sq.mean():.3f} / {correlated_sq.mean():.3f}", flush=True)


if __name__ == "__main__":
    main()
