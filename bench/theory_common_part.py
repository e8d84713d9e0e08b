#!/usr/bin/env python3
"""The gradient along the stream's common part, measured in a float64 replica of an initialised transformer.

Usage: bench/theory_common_part.py CHECKPOINT.ckpt.h5 [--tokens-seed N] [--beta-sq B]

CHECKPOINT is a proplab checkpoint of a tied-head GELU transformer with affine LayerNorm, Pre-LN or Post-LN, and the
`deepscalelm` rule (its study is read from the checkpoint), written after one step at a negligible learning rate,
e.g. `proplab run study.toml --set train.steps=1 --set train.lr=1e-12`. The residual weights are DeepScaleLM's,
β² = 2/(2·layers) per sublayer and λ² = 1 − β², unless --beta-sq gives β² (for another rule with λ² + β² = 1). The replica draws one batch of 2
sequences of uniform tokens with next-token targets, runs forward and backward in float64 (PyTorch, from the bench
virtual environment: bench/make-torch-venv.sh) and prints, at a few blocks:

- the gradient's variance and token correlation at the stream (what proplab's probes record),
- cos(ḡ, c): the gradient's sum over the tokens against the stream's common part (its mean over the tokens),
- the same variance with ḡ's component along c removed at every sublayer's sum (a backward hook; the forward pass
  is unchanged).

docs/theory.md ("The gradient along the stream's common part") reads these figures against `proplab theory`.
"""
import argparse
import math
import sys
import tomllib

try:
    import h5py
    import torch
except ImportError as e:
    sys.exit(f"theory_common_part: needs PyTorch and h5py ({e}); see bench/make-torch-venv.sh")

torch.set_default_dtype(torch.float64)


def fail(message):
    print(f"theory_common_part: {message}", file=sys.stderr)
    sys.exit(2)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint")
    parser.add_argument("--tokens-seed", type=int, default=0)
    parser.add_argument("--beta-sq", type=float, default=None, help="β² per sublayer (default 1/layers)")
    args = parser.parse_args()
    try:
        f = h5py.File(args.checkpoint, "r")
        P = {k: torch.tensor(f["tensors/param/" + k][:]) for k in f["tensors/param"].keys()}
        study = tomllib.loads(f["strings/config"][()].decode())
    except (OSError, KeyError, tomllib.TOMLDecodeError) as e:
        fail(f"{args.checkpoint}: not a proplab checkpoint ({e})")
    model = study.get("model", {})
    wanted = {"type": "transformer", "activation": "gelu", "norm_kind": "layernorm", "tie_embeddings": True,
              "norm_affine": True, "bias": True}
    for key, value in wanted.items():
        if model.get(key) != value:
            fail(f"{args.checkpoint}: model.{key} = {model.get(key)!r}; the replica needs {value!r}")
    if model.get("norm") not in ("pre", "post"):
        fail(f"{args.checkpoint}: model.norm = {model.get('norm')!r}; the replica needs pre or post")
    if study.get("scaling", {}).get("rule") != "deepscalelm" and args.beta_sq is None:
        fail(f"{args.checkpoint}: scaling.rule is not deepscalelm; give --beta-sq")
    V, d = P["embed.token.weight"].shape
    T = P["embed.position.weight"].shape[0]
    L, H = model["layers"], model["heads"]
    pre = model["norm"] == "pre"
    beta_sq = args.beta_sq if args.beta_sq is not None else 1.0 / L
    beta, lam = math.sqrt(beta_sq), math.sqrt(1.0 - beta_sq)
    B, dh = 2, d // H
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)

    def ln(x, w, b):
        m = x.mean(-1, keepdim=True)
        v = ((x - m) ** 2).mean(-1, keepdim=True)
        return (x - m) / torch.sqrt(v + 1e-5) * w + b

    def gelu(x):
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))

    def attn(x, l):
        p = f"blocks.{l}.attn."
        q, k, v = (x @ P[p + "qkv.weight"].T + P[p + "qkv.bias"]).split(d, -1)
        q, k, v = (t.view(B, T, H, dh).transpose(1, 2) for t in (q, k, v))
        a = ((q @ k.transpose(-1, -2)) / math.sqrt(dh)).masked_fill(mask, float("-inf")).softmax(-1)
        return (a @ v).transpose(1, 2).reshape(B, T, d) @ P[p + "out.weight"].T + P[p + "out.bias"]

    def ffn(x, l):
        p = f"blocks.{l}.ffn."
        return gelu(x @ P[p + "fc.weight"].T + P[p + "fc.bias"]) @ P[p + "proj.weight"].T + P[p + "proj.bias"]

    def tokcorr(g):
        G = torch.einsum("btd,bsd->bts", g, g)
        diag = torch.diagonal(G, dim1=1, dim2=2)
        return ((G.sum((1, 2)) - diag.sum(1)).sum() / (B * T * (T - 1)) / diag.mean()).item()

    seq = torch.randint(0, V, (B, T + 1), generator=torch.Generator().manual_seed(args.tokens_seed))

    def run(remove_common):
        def hook(s):
            if not remove_common:
                return
            c = s.detach().mean(1, keepdim=True)
            ch = c / c.norm(dim=-1, keepdim=True)
            s.register_hook(lambda g: g - (g.sum(1, keepdim=True) * ch).sum(-1, keepdim=True) * ch / T)

        x = (P["embed.token.weight"][seq[:, :T]] + P["embed.position.weight"][:T]).requires_grad_(True)
        outs = []
        for l in range(L):
            for kind in ("attn", "ffn"):
                branch = attn if kind == "attn" else ffn
                norm = (P[f"blocks.{l}.{kind}.norm.weight"], P[f"blocks.{l}.{kind}.norm.bias"])
                s = lam * x + beta * branch(ln(x, *norm) if pre else x, l)
                hook(s)
                x = s if pre else ln(s, *norm)
                if kind == "ffn":
                    x.retain_grad()
                    outs.append(x)
        head_in = ln(x, P["final_norm.weight"], P["final_norm.bias"]) if pre else x
        logits = head_in @ P["embed.token.weight"].T
        torch.nn.functional.cross_entropy(logits.reshape(-1, V), seq[:, 1:].reshape(-1)).backward()
        return outs

    plain, removed = run(False), run(True)
    print(f"{'Pre' if pre else 'Post'}-LN, {L} blocks, width {d}, {T} tokens, β² = {beta_sq:.4g}")
    print(f"{'probe':14s} {'grad var':>10s} {'grad corr':>9s} {'cos(ḡ, c)':>9s} {'var, common part removed':>25s}")
    for l in sorted({0, 1, L // 10, L // 4, L // 2, 3 * L // 4, L - 1}):
        g, x = plain[l].grad, plain[l].detach()
        c, gb = x.mean(1), g.sum(1)
        cos = ((gb * c).sum(-1) / gb.norm(dim=-1) / c.norm(dim=-1)).mean().item()
        print(f"blocks.{l}.out".ljust(14) + f" {(g ** 2).mean().item():10.4e} {tokcorr(g):9.4f} {cos:9.3f} "
              f"{(removed[l].grad ** 2).mean().item():25.4e}")


if __name__ == "__main__":
    main()
