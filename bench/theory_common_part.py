#!/usr/bin/env python3
"""The gradient along the stream's common part, measured in a float64 replica of an initialised transformer.

Usage: bench/theory_common_part.py CHECKPOINT.ckpt.h5 [--tokens-seed N] [--beta-sq B]
                                   [--profile SEEDS | --factors SEEDS | --pre-factors SEEDS | --sublayer-maps SEEDS]

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

With --profile SEEDS it instead redraws the weights SEEDS times (each tensor normal with the checkpoint tensor's
std, the packed QKV by thirds), runs a batch of 4 sequences of uniform tokens each time and prints how the common
part α_k = Σ_tokens g·ĉ at every sublayer's output changes across the sublayers below it: the mean change per
attention and per FFN sublayer over ranges of depth, and (Post-LN) what each norm's backward does to it (α at the
norm's input times its scale over α at its output, against the 1 − cos² a removal of its own projection would
leave).

With --factors SEEDS (Post-LN) it redraws the weights the same way and takes each sublayer apart (sublayer k from
its input x = Norm(s_{k-1}) to its sum s_k): α_s = Σ_t g(s_k)_t·ĉ_s, and what reaches ĉ_x at the input through the
skip (λ·Σ_t g_t·ĉ_x) and through the branch (β·Σ_t g_t·dF_t, dF_t the branch's response to a shift of every token
along ĉ_x, by central differences), each for the whole gradient and for the part alone (g_t replaced by α_t·ĉ_s,
what proplab's bookkeeping carries; the branch's response averaged over the positions, and per position), per
unit of α_s; and what each norm's backward keeps of the part, α at its input times the sum's scale σ (per token)
over α at its output (sublayers over ranges of depth, summed over SEEDS networks of 4 sequences).

With --pre-factors SEEDS (Pre-LN) it redraws the weights the same way and takes each sublayer apart (sublayer k
from its input x, the stream below, to its sum s_k): per unit of α_s = Σ_t g(s_k)_t·ĉ_s, what reaches ĉ_x at the
input, through the skip and through the branch, the branch split by what it reads: the part α_t·ĉ_s alone (what
proplab carries), the gradient's part along each token's own direction (ω_t·û_t, û_t the unit vector along s_t less
the tokens' mean) and the rest.

With --sublayer-maps SEEDS (Post-LN) it redraws the weights the same way (batches of 2 sequences) and checks, for each
sublayer of the top 24 blocks, the step from the gradient at its sum to the gradient at its input against what
gradient independence takes for it given the gradient that arrived: attention, the value path's expectation over the
value and output weights with the network's own attention weights, |g_s|² + Σ_h (1/H)·(P_hᵀ·G·P_h)_jj (G the
tokens' Gram of g_s per feature); the FFN, the expectation over its output weights with its own hidden units,
|g_s,t|²·(1 + ffn_mult·(d·σ_in²)·(d·σ_out²)·mean φ'(h_t)²). Per block and over the two halves it prints the
measured over that expected gain (the mean of per-network ratios and its standard error), the attention's largest
deviation of (i + 1)·E[P_i0] from 1 (uniform weights), and the attention's gain for the gradient at the norm's
output turned by a random orthogonal matrix (its tokens' Gram kept) over the gain for the gradient itself: a
dependence of the gradient on the sublayer's own weights would move it from 1 (docs/theory.md, "On 2026-12-07
(last)" under "Accuracy", Post-LN `xavier`; `--beta-sq 0.5` there: a Post-LN network is the same for any λ = β).

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
    modes = parser.add_mutually_exclusive_group()
    modes.add_argument("--profile", type=int, default=0, metavar="SEEDS",
                       help="the common part's change per sublayer, averaged over SEEDS redrawn networks")
    modes.add_argument("--factors", type=int, default=0, metavar="SEEDS",
                       help="each Post-LN sublayer's skip, branch and norm factors on the common part (SEEDS networks)")
    modes.add_argument("--sublayer-maps", type=int, default=0, metavar="SEEDS",
                       help="each top Post-LN sublayer's measured gradient gain against its expectation over its own "
                            "weights given the arriving gradient, and against a rotated gradient (SEEDS networks)")
    modes.add_argument("--pre-factors", type=int, default=0, metavar="SEEDS",
                       help="each Pre-LN sublayer's skip and branch factors on the common part, the branch's split by "
                            "the part of the gradient it reads (SEEDS networks)")
    args = parser.parse_args()
    if args.profile < 0 or args.factors < 0 or args.pre_factors < 0 or args.sublayer_maps < 0:
        fail("--profile, --factors, --pre-factors and --sublayer-maps take a positive number of networks")
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

    def attn(x, l, W, weights_only=False):
        """Block l's attention on x, or (weights_only) its weights [batch, heads, query, key]."""
        p, n = f"blocks.{l}.attn.", x.shape[0]
        q, k, v = (x @ W[p + "qkv.weight"].T + W[p + "qkv.bias"]).split(d, -1)
        q, k, v = (t.view(n, T, H, dh).transpose(1, 2) for t in (q, k, v))
        a = ((q @ k.transpose(-1, -2)) / math.sqrt(dh)).masked_fill(mask, float("-inf")).softmax(-1)
        if weights_only:
            return a
        return (a @ v).transpose(1, 2).reshape(n, T, d) @ W[p + "out.weight"].T + W[p + "out.bias"]

    def ffn(x, l, W):
        p = f"blocks.{l}.ffn."
        return gelu(x @ W[p + "fc.weight"].T + W[p + "fc.bias"]) @ W[p + "proj.weight"].T + W[p + "proj.bias"]

    def tokcorr(g):
        G = torch.einsum("btd,bsd->bts", g, g)
        diag = torch.diagonal(G, dim1=1, dim2=2)
        return ((G.sum((1, 2)) - diag.sum(1)).sum() / (B * T * (T - 1)) / diag.mean()).item()

    seq = torch.randint(0, V, (B, T + 1), generator=torch.Generator().manual_seed(args.tokens_seed))

    def norm_of(k, W):
        """Sublayer k's norm (2l: block l's attention, 2l + 1: its FFN), weight and bias."""
        kind = "attn" if k % 2 == 0 else "ffn"
        return W[f"blocks.{k // 2}.{kind}.norm.weight"], W[f"blocks.{k // 2}.{kind}.norm.bias"]

    def branch_of(k, W):
        """Sublayer k's branch as a function of its input x (Pre-LN's reads Norm(x))."""
        branch = attn if k % 2 == 0 else ffn
        return lambda x: branch(ln(x, *norm_of(k, W)) if pre else x, k // 2, W)

    def forward(W, tokens, on_sum=None, retain=False):
        """Forward and backward (mean cross-entropy on the next tokens) with the weights W; every sublayer's sum and
        output keep their gradients. on_sum(s) sees each sum as it is made (e.g. to register a backward hook)."""
        x = (W["embed.token.weight"][tokens[:, :T]] + W["embed.position.weight"][:T]).requires_grad_(True)
        sums, outs = [], []
        for k in range(2 * L):
            s = lam * x + beta * branch_of(k, W)(x)
            s.retain_grad()
            if on_sum:
                on_sum(s)
            x = s if pre else ln(s, *norm_of(k, W))
            x.retain_grad()
            sums.append(s)
            outs.append(x)
        head_in = ln(x, W["final_norm.weight"], W["final_norm.bias"]) if pre else x
        logits = head_in @ W["embed.token.weight"].T
        torch.nn.functional.cross_entropy(logits.reshape(-1, V), tokens[:, 1:].reshape(-1)).backward(retain_graph=retain)
        return sums, outs

    def remove_common_part(s):
        c = s.detach().mean(1, keepdim=True)
        ch = c / c.norm(dim=-1, keepdim=True)
        s.register_hook(lambda g: g - (g.sum(1, keepdim=True) * ch).sum(-1, keepdim=True) * ch / T)

    def run(remove_common):
        return forward(P, seq, remove_common_part if remove_common else None)[1][1::2]  # the blocks' outputs

    if args.profile > 0:
        profile(P, args.profile, L, T, d, V, pre, forward)
        return
    if args.factors > 0:
        if pre:
            fail(f"{args.checkpoint}: --factors takes a Post-LN model")
        factors(P, args.factors, L, T, d, V, lam, beta, forward, branch_of)
        return
    if args.sublayer_maps > 0:
        if pre:
            fail(f"{args.checkpoint}: --sublayer-maps takes a Post-LN model")

        def attention_weights(x, l, W):
            return attn(x, l, W, weights_only=True)

        def hidden_slope_sq(x, l, W):
            h = (x @ W[f"blocks.{l}.ffn.fc.weight"].T + W[f"blocks.{l}.ffn.fc.bias"]).detach().requires_grad_(True)
            return torch.autograd.grad(gelu(h).sum(), h)[0].pow(2).mean(-1)

        sublayer_maps(P, args.sublayer_maps, L, T, d, V, H, lam, beta, forward, attention_weights, hidden_slope_sq)
        return
    if args.pre_factors > 0:
        if not pre:
            fail(f"{args.checkpoint}: --pre-factors takes a Pre-LN model")
        pre_factors(P, args.pre_factors, L, T, d, V, lam, beta, forward, branch_of)
        return
    plain, removed = run(False), run(True)
    print(f"{'Pre' if pre else 'Post'}-LN, {L} blocks, width {d}, {T} tokens, β² = {beta_sq:.4g}")
    print(f"{'probe':14s} {'grad var':>10s} {'grad corr':>9s} {'cos(ḡ, c)':>9s} {'var, common part removed':>25s}")
    for l in sorted({0, 1, L // 10, L // 4, L // 2, 3 * L // 4, L - 1}):
        g, x = plain[l].grad, plain[l].detach()
        c, gb = x.mean(1), g.sum(1)
        cos = ((gb * c).sum(-1) / gb.norm(dim=-1) / c.norm(dim=-1)).mean().item()
        print(f"blocks.{l}.out".ljust(14) + f" {(g ** 2).mean().item():10.4e} {tokcorr(g):9.4f} {cos:9.3f} "
              f"{(removed[l].grad ** 2).mean().item():25.4e}")


def profile(P0, seeds, L, T, d, V, pre, forward):
    """--profile: α_k = Σ_tokens g(x_k)·ĉ(x_k) at every sublayer output x_k, summed over SEEDS redrawn networks of
    4 sequences each (only ratios of these sums are printed, so the loss's scale does not matter)."""
    batch = 4
    generator = torch.Generator().manual_seed(5)
    alpha = [0.0] * (2 * L)
    norm_in, norm_kept = [0.0] * (2 * L), [0.0] * (2 * L)

    for seed in range(seeds):
        P = redraw(P0, d, generator)
        sums, outs = forward(P, torch.randint(0, V, (batch, T + 1), generator=generator))
        for k in range(2 * L):
            a_out = (outs[k].grad * unit_common(outs[k])).sum(-1)  # per sequence and token
            alpha[k] += a_out.sum().item()
            if not pre:
                s = sums[k].detach()
                centred = s - s.mean(-1, keepdim=True)
                cs = unit_common(sums[k])
                cos = (centred * cs).sum(-1) / centred.norm(dim=-1)
                norm_in[k] += ((sums[k].grad * cs).sum(-1) * s.std(-1, unbiased=False)).sum().item()
                norm_kept[k] += (a_out * (1 - cos ** 2)).sum().item()
        print(f"theory_common_part: network {seed + 1}/{seeds}", file=sys.stderr, flush=True)
    print(f"{'Pre' if pre else 'Post'}-LN, {L} blocks, width {d}, {T} tokens, {seeds} networks of 4 sequences: the "
          f"common part's change across each sublayer, log(α below / α above) per sublayer")
    edges = sorted({1, max(2, L // 6), L // 2, (5 * L) // 4, (15 * L) // 8, 2 * L - 4})
    for lo, hi in zip(edges, edges[1:]):
        change = {0: [], 1: []}
        for k in range(lo, hi):
            if alpha[k] != 0 and alpha[k - 1] / alpha[k] > 0:
                change[k % 2].append(math.log(alpha[k - 1] / alpha[k]))
        mean = {kind: 100 * sum(v) / len(v) if v else float("nan") for kind, v in change.items()}
        print(f"  sublayers {lo:3d}-{hi - 1:3d}: attention {mean[0]:+.3f}%, FFN {mean[1]:+.3f}%")
    if not pre:
        print("  Post-LN norms, α at the input times its scale over α at the output (a removal of the output's own "
              "projection would leave 1 − cos²):")
        for k in sorted({2, L // 4, L, (3 * L) // 2, 2 * L - 6}):
            print(f"    sublayer {k:3d}: {norm_in[k] / alpha[k]:.4f} (1 − cos²: {norm_kept[k] / alpha[k]:.4f})")


def unit_common(t):
    """ĉ: the unit vector along the tokens' mean, per sequence ([batch, 1, width])."""
    c = t.detach().mean(1, keepdim=True)
    return c / c.norm(dim=-1, keepdim=True)


def redraw(P0, d, generator):
    """The checkpoint's tensors redrawn: each weight normal with the checkpoint tensor's std (the packed QKV by
    thirds); norms and biases kept."""
    P = {}
    for key, value in P0.items():
        if key.endswith(".qkv.weight"):
            P[key] = torch.cat([torch.randn(part.shape, generator=generator) * part.std() for part in value.split(d)])
        elif key.endswith(".weight") and "norm" not in key:
            P[key] = torch.randn(value.shape, generator=generator) * value.std()
        else:
            P[key] = value.clone()
    return P


def factors(P0, seeds, L, T, d, V, lam, beta, forward, branch_of):
    """--factors: per sublayer k ≥ 1 (Post-LN), sums over SEEDS networks of: α_s; λ·Σ g·ĉ_x (skip) and β·Σ g·dF
    (branch) for the whole gradient g at the sum; the same for the part α_t·ĉ_s alone, the branch's response both
    averaged over the positions and per position; α at the output of the norm below; and α_s times the sum's scale
    σ per token (what the norm above it divides by)."""
    batch, eps = 4, 1e-4
    generator = torch.Generator().manual_seed(5)
    acc = torch.zeros(2 * L, 8, dtype=torch.float64)

    for seed in range(seeds):
        P = redraw(P0, d, generator)
        sums, outs = forward(P, torch.randint(0, V, (batch, T + 1), generator=generator))
        with torch.no_grad():
            for k in range(1, 2 * L):
                x, s, g = outs[k - 1].detach(), sums[k].detach(), sums[k].grad
                branch = branch_of(k, P)
                cx, cs = unit_common(x), unit_common(s)
                dF = (branch(x + eps * cx) - branch(x - eps * cx)) / (2 * eps)
                alpha = (g * cs).sum(-1)  # per sequence and position
                response = (dF * cs).sum(-1)
                acc[k] += torch.tensor([
                    alpha.sum().item(),
                    lam * (g * cx).sum().item(), beta * (g * dF).sum().item(),
                    lam * (alpha * (cs * cx).sum(-1)).sum().item(),
                    beta * (alpha.sum(1) * response.mean(1)).sum().item(), beta * (alpha * response).sum().item(),
                    (outs[k - 1].grad * unit_common(outs[k - 1])).sum().item(),
                    ((sums[k].grad * cs).sum(-1) * s.std(-1, unbiased=False)).sum().item()])
        print(f"theory_common_part: network {seed + 1}/{seeds}", file=sys.stderr, flush=True)
    print(f"Post-LN, {L} blocks, width {d}, {seeds} networks of 4 sequences: per sublayer, per unit of α at its sum, "
          "what reaches the common part at its input (means over the sublayers of each range), and what the norm "
          "below keeps (α at its input times the sum's scale σ, over α at its output)")
    print(f"  {'sublayers':10s} {'kind':4s} {'skip: part':>10s} {'whole':>7s} {'branch: part':>12s} {'per position':>12s} "
          f"{'whole':>7s} {'norm keeps':>10s}")
    for lo, hi, kind, name, mean in depth_ranges(acc, {1, 4, 8, L // 3, L, (3 * L) // 2, 2 * L}, L):
        keeps = [acc[k - 1][7].item() / acc[k][6].item() for k in range(lo, hi) if k % 2 == kind and k > 1]
        keep = sum(keeps) / len(keeps) if keeps else float("nan")
        print(f"  {lo:3d}-{hi - 1:<6d} {name:4s} {mean(3):10.4f} {mean(1):7.4f} {mean(4):12.4f} {mean(5):12.4f} "
              f"{mean(2):7.4f} {keep:10.4f}")


def depth_ranges(acc, edges, L):
    """Per range of sublayers between the edges (those within 1..2L) and per kind (0 attention, 1 FFN) that has a
    sublayer with a nonzero acc[k][0]: (lo, hi, kind, name, mean), mean(j) the mean over those sublayers of
    acc[k][j] per unit of acc[k][0]."""
    edges = sorted(e for e in edges if 1 <= e <= 2 * L)
    for lo, hi in zip(edges, edges[1:]):
        for kind, name in ((0, "attn"), (1, "ffn")):
            rows = [acc[k] for k in range(lo, hi) if k % 2 == kind and acc[k][0] != 0]
            if rows:
                yield lo, hi, kind, name, lambda j, rows=rows: sum(r[j].item() / r[0].item() for r in rows) / len(rows)


def sublayer_maps(P0, seeds, L, T, d, V, H, lam, beta, forward, attention_weights, hidden_slope_sq):
    """--sublayer-maps: per sublayer of the top 24 blocks, per network, the measured gain of the gradient from the
    sum to the input over its expectation given the arriving gradient (attention and FFN), and (attention) the gain of
    a rotated gradient over the gain of the gradient itself; means and standard errors over SEEDS networks."""
    generator = torch.Generator().manual_seed(7)
    blocks = list(range(max(L - 24, 1), L))
    ratios = {key: torch.zeros(seeds, len(blocks)) for key in ("attn", "ffn", "rotated")}
    gains = {key: torch.zeros(len(blocks)) for key in ("attn", "ffn")}
    uniform = torch.zeros(len(blocks))
    positions = torch.arange(1, T + 1, dtype=torch.float64).unsqueeze(1)
    for seed in range(seeds):
        W = redraw(P0, d, generator)
        sums, outs = forward(W, torch.randint(0, V, (2, T + 1), generator=generator), retain=True)
        # The gradients as the loss's backward left them (the rotated gradient's autograd.grad below would add to the
        # .grad of tensors that retain it).
        at_sum, at_out = [s.grad.clone() for s in sums], [x.grad.clone() for x in outs]
        for n, l in enumerate(blocks):
            k = 2 * l
            x_in, g_s, g_in = outs[k - 1], at_sum[k], at_out[k - 1]
            weights = attention_weights(x_in.detach(), l, W)
            gram = torch.einsum("bid,bjd->bij", g_s, g_s) / d
            value_path = torch.einsum("bhij,bik,bhkj->bj", weights, gram, weights) / H
            expected = lam ** 2 * (g_s ** 2).mean() + beta ** 2 * value_path.mean()
            ratios["attn"][seed, n] = (g_in ** 2).mean() / expected
            gains["attn"][n] += ((g_in ** 2).mean() / (g_s ** 2).mean()).item() / lam ** 2 / seeds
            uniform[n] = max(uniform[n], ((weights.mean((0, 1)) * positions)[:, 0] - 1).abs().max().item())
            turn, _ = torch.linalg.qr(torch.randn(d, d, generator=generator))
            g_s_turned = torch.autograd.grad(outs[k], sums[k], at_out[k] @ turn, retain_graph=True)[0]
            g_in_turned = torch.autograd.grad(sums[k], x_in, g_s_turned, retain_graph=True)[0]
            ratios["rotated"][seed, n] = ((g_in_turned ** 2).mean() / (g_s_turned ** 2).mean()) / \
                ((g_in ** 2).mean() / (g_s ** 2).mean())
            k += 1
            g_s, g_in = at_sum[k], at_out[k - 1]
            fc, proj = W[f"blocks.{l}.ffn.fc.weight"], W[f"blocks.{l}.ffn.proj.weight"]
            branch = (fc.shape[0] / d) * (d * fc.var()) * (d * proj.var()) * hidden_slope_sq(outs[k - 1].detach(), l, W)
            expected = ((g_s ** 2).mean(-1) * (lam ** 2 + beta ** 2 * branch)).mean()
            ratios["ffn"][seed, n] = (g_in ** 2).mean() / expected
            gains["ffn"][n] += ((g_in ** 2).mean() / (g_s ** 2).mean()).item() / lam ** 2 / seeds
        print(f"sublayer-maps: network {seed + 1}/{seeds}", file=sys.stderr, flush=True)

    def mean_se(values):
        return values.mean().item(), (values.std().item() / math.sqrt(seeds) if seeds > 1 else float("nan"))

    print(f"Post-LN, {L} blocks, width {d}, {T} tokens, {seeds} networks: measured over expected gain per sublayer "
          f"(mean ± standard error over the networks); the gains per λ²")
    print(f"{'block':>5s} {'attention':>16s} {'gain':>7s} {'|(i+1)P_i0-1|':>13s} {'rotated/real':>16s} "
          f"{'FFN':>16s} {'gain':>7s}")
    for n, l in enumerate(blocks):
        a, r, f = mean_se(ratios["attn"][:, n]), mean_se(ratios["rotated"][:, n]), mean_se(ratios["ffn"][:, n])
        print(f"{l:5d} {a[0]:8.4f} ± {a[1]:.4f} {gains['attn'][n]:7.4f} {uniform[n]:13.2e} {r[0]:8.4f} ± {r[1]:.4f} "
              f"{f[0]:8.4f} ± {f[1]:.4f} {gains['ffn'][n]:7.4f}")
    half = len(blocks) // 2
    for name, part in (("lower half", slice(0, half)), ("upper half", slice(half, None))):
        a, r, f = (mean_se(ratios[key][:, part].mean(1)) for key in ("attn", "rotated", "ffn"))
        print(f"blocks {blocks[part][0]}-{blocks[part][-1]} ({name}): attention {a[0]:.4f} ± {a[1]:.4f}, "
              f"rotated/real {r[0]:.4f} ± {r[1]:.4f}, FFN {f[0]:.4f} ± {f[1]:.4f} (per block)")


def pre_factors(P0, seeds, L, T, d, V, lam, beta, forward, branch_of):
    """--pre-factors: per sublayer k ≥ 1 (Pre-LN: its sum s_k = λx + β·F(Norm(x)) is the stream above it), summed over
    SEEDS networks of 4 sequences: α_s = Σ_t g_t·ĉ_s at the sum and ω_s = Σ_t g_t·û_t (û_t the unit vector along
    token t's own part, s_t less the tokens' mean); what reaches ĉ_x at the input, Σ_t g(x)_t·ĉ_x; through the skip,
    λ·Σ_t α_t·ĉ_s·ĉ_x; and through the branch (β·Jᵀ by autograd, read along ĉ_x) for the part α_t·ĉ_s alone (what
    proplab's bookkeeping carries, β²Γ), for the own part ω_t·û_t alone and for the rest of the gradient; all per
    unit of α_s, means over the sublayers of each range of depth."""
    batch = 4
    generator = torch.Generator().manual_seed(5)
    acc = torch.zeros(2 * L, 7, dtype=torch.float64)

    def own_unit(t):
        u = t.detach() - t.detach().mean(1, keepdim=True)
        return u / u.norm(dim=-1, keepdim=True)

    for seed in range(seeds):
        P = redraw(P0, d, generator)
        _, outs = forward(P, torch.randint(0, V, (batch, T + 1), generator=generator))
        for k in range(1, 2 * L):
            x, g = outs[k - 1].detach(), outs[k].grad.detach()
            cs, cx, us = unit_common(outs[k]), unit_common(outs[k - 1]), own_unit(outs[k])
            alpha, omega = (g * cs).sum(-1, keepdim=True), (g * us).sum(-1, keepdim=True)
            branch = branch_of(k, P)

            def returned(v):
                xx = x.clone().requires_grad_(True)
                (branch(xx) * v).sum().backward()
                return beta * (xx.grad * cx).sum().item()

            # x feeds only this sublayer, so its gradient is λ·g plus the branch's whole return.
            reaching = (outs[k - 1].grad * cx).sum().item()
            whole = reaching - lam * (g * cx).sum().item()
            part, own = returned(alpha * cs), returned(omega * us)
            acc[k] += torch.tensor([alpha.sum().item(), omega.sum().item(), reaching,
                                    lam * (alpha * cs * cx).sum().item(), part, own, whole - part - own])
        print(f"theory_common_part: network {seed + 1}/{seeds}", file=sys.stderr, flush=True)
    print(f"Pre-LN, {L} blocks, width {d}, {seeds} networks of 4 sequences: per sublayer, per unit of α at its sum, "
          "what reaches the common part at its input (means over the sublayers of each range)")
    print(f"  {'sublayers':10s} {'kind':4s} {'ω/α':>7s} {'input':>7s} {'skip':>7s} {'branch: part':>12s} {'own':>7s} "
          f"{'rest':>7s}")
    for lo, hi, _, name, mean in depth_ranges(acc, {1, 4, 8, L // 3, L, (3 * L) // 2, 2 * L - 8, 2 * L}, L):
        print(f"  {lo:3d}-{hi - 1:<6d} {name:4s} {mean(1):7.3f} {mean(2):7.4f} {mean(3):7.4f} {mean(4):12.4f} "
              f"{mean(5):7.4f} {mean(6):7.4f}")


if __name__ == "__main__":
    main()
