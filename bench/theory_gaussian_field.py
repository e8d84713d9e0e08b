#!/usr/bin/env python3
"""An unnormalised deep transformer's stream against `proplab theory` and against the Gaussian field's own law.

Usage: bench/theory_gaussian_field.py PROPLAB CHECKPOINT.ckpt.h5 [--networks 96] [--blocks 22] [--draws 16]
                                      [--sequences 32] [--beta-sq B] [--lambda-sq L]

CHECKPOINT is a proplab checkpoint of a transformer without norms (model.norm = "none", GELU) written after one step,
e.g. `proplab run study.toml --set train.steps=1 --set train.final_checkpoint=true`; only its tensors' stds and its
study are read (a role's std pooled over the blocks where they agree; the embedding tables' stds are one draw's, off
the rule's by up to about 0.5%, which shows at block 0). The residual weights are λ·x + β·f per sublayer with
β² = 1/layers and λ² = 1 − β² (DeepScaleLM) unless --beta-sq and --lambda-sq give them (another rule must give
them; `xavier`: --beta-sq 1 --lambda-sq 1). Three things are compared, block by block, at each block's input
(`blocks.l.in`), for uniform tokens (float32 with float64 sums, PyTorch from the bench virtual environment:
bench/make-torch-venv.sh):

- `theory`: `PROPLAB theory` on the checkpoint's study with data.kind = "uniform";
- `replica`: NETWORKS networks (each weight redrawn normal with its checkpoint tensor's std, the packed QKV by thirds)
  on a batch of 2 sequences each: the mean over the networks of the stream's variance and token covariance;
- `gaussian field`: the covariance propagated with no theory map at all: at each sublayer, Gaussian tokens with the
  current token covariance C (isotropic features, the embedding's exact covariance to start) go through DRAWS fresh
  weight draws of SEQUENCES sequences each, and C takes λ²·C + β²·(the branch's token covariance). This is what every
  map would give if it were exact for a Gaussian input, its finite-width terms included (the sublayers run at the
  study's width).

Printed per block: the theory's variance and own part 1 − r (r the token correlation), and the replica's and the
Gaussian field's over the theory's (the replica's variance with its standard error over the networks). Where the
replica follows the Gaussian field and the theory does not, a map misses what a Gaussian input does; where the replica
leaves the Gaussian field, the stream's departure from a Gaussian field matters. docs/theory.md ("On 2026-12-07
(late)" under "Accuracy") reads these figures.
"""
import argparse
import math
import os
import re
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
    from unnormalised_replica import gelu, read_checkpoint, residual_weights
except ImportError as e:
    sys.exit(f"theory_gaussian_field: needs PyTorch, NumPy and h5py ({e}); see bench/make-torch-venv.sh")


def fail(message):
    print(f"theory_gaussian_field: {message}", file=sys.stderr)
    sys.exit(2)


def theory_stream(proplab, config_text, blocks):
    """`proplab theory` on the study with uniform tokens: {block: (var, corr)} at blocks.l.in."""
    # The Markov chain's own keys are valid only with data.kind = "markov".
    text = re.sub(r"(?m)^markov_\w+\s*=.*\n", "", config_text)
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write(text)
        path = f.name
    try:
        result = subprocess.run([proplab, "theory", path, "--set", 'data.kind="uniform"'], capture_output=True,
                                text=True)
    except OSError as e:
        fail(f"{proplab}: cannot run it ({e})")
    finally:
        os.unlink(path)
    if result.returncode != 0:
        fail(f"{proplab} theory on the checkpoint's study failed: {result.stderr.strip()}")
    stream = {}
    for line in result.stdout.splitlines():
        fields = line.split()
        if len(fields) >= 7 and re.fullmatch(r"blocks\.\d+\.in", fields[3]):
            stream[int(fields[1])] = (float(fields[4]), float(fields[6]))
    missing = [b for b in range(blocks) if b not in stream]
    if missing:
        fail(f"{proplab} theory printed no blocks.l.in line for blocks {missing}")
    return stream


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("proplab")
    parser.add_argument("checkpoint")
    parser.add_argument("--networks", type=int, default=96)
    parser.add_argument("--blocks", type=int, default=22, help="compare blocks 0..BLOCKS-1")
    parser.add_argument("--draws", type=int, default=16, help="weight draws per sublayer of the Gaussian field")
    parser.add_argument("--sequences", type=int, default=32, help="Gaussian sequences per weight draw")
    parser.add_argument("--beta-sq", type=float, default=None, help="β² per sublayer (default 1/layers)")
    parser.add_argument("--lambda-sq", type=float, default=None, help="λ² per sublayer (default 1 − β²)")
    args = parser.parse_args()
    for name in ("networks", "blocks", "draws", "sequences"):
        if getattr(args, name) < 1:
            fail(f"--{name.replace('_', '-')}: {getattr(args, name)}; needs at least 1")
    ck = read_checkpoint(args.checkpoint, fail)
    std, thirds = ck.std, ck.thirds
    V, d, T, L, H = ck.vocab, ck.width, ck.tokens, ck.layers, ck.heads
    if args.blocks > L:
        fail(f"--blocks: {args.blocks}; the checkpoint has {L} blocks")
    beta_sq, lambda_sq = residual_weights(ck, args.beta_sq, args.lambda_sq, fail)
    theory = theory_stream(args.proplab, ck.config_text, args.blocks)
    # One drawn tensor's std is off its rule's by about 1/√(2·size) (0.1% for a block's weights), which compounds
    # over the blocks: where every block has the same std for a role (within 2%), their mean stands in for each.
    for role in ("attn.out", "ffn.fc", "ffn.proj"):
        names = [f"blocks.{l}.{role}.weight" for l in range(L)]
        values = np.array([std[n] for n in names])
        if values.max() < 1.02 * values.min():
            std.update({n: float(values.mean()) for n in names})
    for i in range(3):
        values = np.array([t[i] for t in thirds])
        if values.max() < 1.02 * values.min():
            for t in thirds:
                t[i] = float(values.mean())

    lam, beta, dh, blocks = math.sqrt(lambda_sq), math.sqrt(beta_sq), d // H, args.blocks
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    g = torch.Generator().manual_seed(2026)

    def rn(*shape, s):
        return torch.randn(*shape, generator=g) * s

    def attention(x, l):
        n = x.shape[0]
        q, k, v = (x @ rn(d, d, s=thirds[l][i]).T for i in range(3))
        q, k, v = (t.view(n, T, H, dh).transpose(1, 2) for t in (q, k, v))
        p = (q @ k.transpose(-1, -2) / math.sqrt(dh)).masked_fill(mask, float("-inf")).softmax(-1)
        return (p @ v).transpose(1, 2).reshape(n, T, d) @ rn(d, d, s=std[f"blocks.{l}.attn.out.weight"]).T

    def ffn(x, l):
        h = gelu(x @ rn(4 * d, d, s=std[f"blocks.{l}.ffn.fc.weight"]).T)
        return h @ rn(d, 4 * d, s=std[f"blocks.{l}.ffn.proj.weight"]).T

    def stats(c):
        trace = torch.diagonal(c).sum()
        return (trace / T).item(), ((c.sum() - trace) / ((T - 1) * trace)).item()

    # The replica.
    cov = torch.zeros(blocks, T, T, dtype=torch.float64)
    scale = torch.zeros(args.networks, blocks, dtype=torch.float64)
    for n in range(args.networks):
        x = rn(V, d, s=std["embed.token.weight"])[torch.randint(0, V, (2, T), generator=g)]
        x = x + rn(T, d, s=std["embed.position.weight"])
        for l in range(blocks):
            c = torch.einsum("btf,bsf->ts", x, x).double() / (2 * d)
            cov[l] += c / args.networks
            scale[n, l] = torch.diagonal(c).mean()
            x = lam * x + beta * attention(x, l)
            x = lam * x + beta * ffn(x, l)
        print(f"theory_gaussian_field: replica network {n + 1}/{args.networks}", file=sys.stderr, flush=True)

    # The Gaussian field, from the embedding's exact covariance for uniform tokens.
    tok, pos = std["embed.token.weight"] ** 2, std["embed.position.weight"] ** 2
    c = torch.full((T, T), tok / V, dtype=torch.float64) + torch.eye(T, dtype=torch.float64) * (tok + pos - tok / V)
    field = []

    def branch_cov(c, sublayer, l):
        eye = torch.eye(T, dtype=torch.float64)
        root = torch.linalg.cholesky(c + 1e-10 * torch.diagonal(c).mean() * eye).float()
        total = torch.zeros(T, T, dtype=torch.float64)
        for _ in range(args.draws):
            y = sublayer(torch.einsum("ts,bsf->btf", root, torch.randn(args.sequences, T, d, generator=g)), l)
            total += torch.einsum("btf,bsf->ts", y, y).double() / (args.sequences * d * args.draws)
        return total

    for l in range(blocks):
        field.append(c)
        c = lambda_sq * c + beta_sq * branch_cov(c, attention, l)
        c = lambda_sq * c + beta_sq * branch_cov(c, ffn, l)
        print(f"theory_gaussian_field: Gaussian field block {l + 1}/{blocks}", file=sys.stderr, flush=True)

    print(f"{'block':>5}  {'theory var':>11}  {'1 - r':>8}  {'replica/theory':>17}  {'field/theory':>12}  "
          f"{'replica/field':>13}  own part 1 - r: replica/theory  field/theory")
    for l in range(blocks):
        tv, tr = theory[l]
        rv, rr = stats(cov[l])
        fv, fr = stats(field[l])
        ratio = scale[:, l] / scale[:, l].mean()
        se = ratio.std().item() / math.sqrt(args.networks) if args.networks > 1 else float("nan")
        print(f"{l:5d}  {tv:11.4e}  {1 - tr:8.5f}  {rv / tv:9.4f} ± {se:.4f}  {fv / tv:12.4f}  {rv / fv:13.4f}  "
              f"{(1 - rr) / (1 - tr):30.3f}  {(1 - fr) / (1 - tr):12.3f}", flush=True)


if __name__ == "__main__":
    main()
