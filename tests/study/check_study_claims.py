#!/usr/bin/env python3
"""The shipped studies' "What you should see" lines about initialisation, checked on the studies' own output.

Usage: check_study_claims.py PROPLAB WORK_DIR [STUDY_NAME...]

Each study is swept as shipped, except that every point trains one step (`--set train.steps=1`): the record at
step 0 (the network at initialisation, before any update) is then exactly the one the full study writes, because
initialisation and the first batch depend on the seed alone. Every claim a study's header makes about step 0 is
asserted below, next to the line it checks. mup_coord_check, whose claims are about its 10 training steps, runs
whole (about 30 s). Claims about longer training (loss curves) need the full studies and are not checked here. Exit 0 when every claim holds, 1 (listing the failures) otherwise.
"""
import math
import os
import sys

import h5py

from claims_common import Checker, sweep_study


def text(values):
    return [v.decode() if isinstance(v, bytes) else v for v in values]


class Run:
    """The step-0 record of one run file."""

    def __init__(self, path):
        with h5py.File(path, "r") as f:
            self.names = text(f["probes/name"][:])
            self.kinds = text(f["probes/kind"][:])
            self.forward = f["forward/var"][0]
            self.backward = f["backward/var"][0]
            self.rms_last = f["forward/rms"][-1] if "forward/rms" in f else None
            self.theory = f["theory/forward/var"][:] if "theory/forward/var" in f else None
            self.band = f["theory/forward/var_log_sd"][:] if "theory/forward/var_log_sd" in f else None
            self.stage = list(f["blocks/stage"][:]) if "blocks" in f else []
            self.transition = list(f["blocks/transition"][:]) if "blocks" in f else []

    def probe(self, name):
        return self.names.index(name)

    def stream(self, suffix, direction="forward"):
        """The statistic at blocks.<l>.<suffix> for l = 0, 1, ... (in block order)."""
        values = self.forward if direction == "forward" else self.backward
        out = []
        block = 0
        while f"blocks.{block}.{suffix}" in self.names:
            out.append(float(values[self.probe(f"blocks.{block}.{suffix}")]))
            block += 1
        return out

    def kind_values(self, kind, direction="forward"):
        values = self.forward if direction == "forward" else self.backward
        return [float(values[i]) for i, k in enumerate(self.kinds) if k == kind]


def sweep(proplab, study, work, extra=(), full=False):
    """The study's points for one step (or whole, with full), with extra `--set` overrides."""
    overrides = [] if full else ["train.steps=1", "train.eval_every=1", *extra]
    out = sweep_study(proplab, study, work, overrides)
    return lambda point: Run(os.path.join(out, point + ".h5"))


def spread(values):
    """max / min of positive values."""
    return max(values) / min(values)


def slope(values):
    """The least-squares slope of values against their index, and the fit's R^2."""
    n = len(values)
    mx, my = (n - 1) / 2.0, sum(values) / n
    sxx = sum((i - mx) ** 2 for i in range(n))
    sxy = sum((i - mx) * (v - my) for i, v in enumerate(values))
    syy = sum((v - my) ** 2 for v in values)
    b = sxy / sxx
    return b, (sxy * sxy / (sxx * syy) if syy > 0 else 1.0)


def stages(run, values):
    """`values` (one per block) split by the run's stages."""
    out = []
    for value, stage in zip(values, run.stage):
        if stage >= len(out):
            out.append([])
        out[stage].append(value)
    return out


def compare_norms(proplab, work, c):
    point = sweep(proplab, "compare_norms", work, ["train.warmup=0"])
    name = "compare_norms"
    pre, post, dslm = point("norm=pre,rule=standard"), point("norm=post,rule=standard"), point(
        "norm=post,rule=deepscalelm")
    # "norm=pre,rule=standard: forward variance of the residual stream grows linearly with depth ... about 40% over
    # the 24 blocks; the gradient changes by less than 2x from the last block to the first".
    fwd = pre.stream("in")
    b, r2 = slope(fwd)
    c.check(name, "Pre-LN stream variance grows linearly", b > 0 and r2 > 0.98, f"slope {b:.3g}/block, R^2 {r2:.4f}")
    c.check(name, "Pre-LN grows by about 40%", 1.25 < fwd[-1] / fwd[0] < 1.6, f"last/first {fwd[-1] / fwd[0]:.3f}")
    bwd = pre.stream("in", "backward")
    c.check(name, "Pre-LN gradient within 2x over the stack", spread(bwd) < 2, f"max/min {spread(bwd):.3f}")
    # "norm=post,rule=standard: forward variance is flat; ... the gradient is flat from the last block down to
    # block 1 (block 0's is larger, through the first norm's Jacobian on the 0.02-std embedding)".
    fwd = post.stream("in")[1:]
    c.check(name, "Post-LN forward variance flat at 1", max(abs(v - 1) for v in fwd) < 0.01,
            f"worst |var - 1| {max(abs(v - 1) for v in fwd):.2e}")
    bwd = post.stream("in", "backward")
    c.check(name, "Post-LN gradient flat over blocks 1..23", spread(bwd[1:]) < 1.01, f"max/min {spread(bwd[1:]):.5f}")
    c.check(name, "Post-LN block 0 gradient larger", bwd[0] > 10 * max(bwd[1:]), f"block 0 / block 1 {bwd[0] / bwd[1]:.3g}")
    # "norm=post,rule=deepscalelm: forward variance stays near 1 at every depth; the gradient grows towards the first
    # blocks, by about 2x".
    fwd = dslm.stream("in")
    c.check(name, "DeepScaleLM forward variance near 1", max(abs(v - 1) for v in fwd) < 0.05,
            f"worst |var - 1| {max(abs(v - 1) for v in fwd):.3f}")
    bwd = dslm.stream("in", "backward")
    c.check(name, "DeepScaleLM gradient grows towards the input, about 2x", 1.5 < bwd[0] / bwd[-1] < 3,
            f"block 0 / last block {bwd[0] / bwd[-1]:.3f}")


def transformer_depth(proplab, work, c):
    point = sweep(proplab, "transformer_depth", work, ["train.warmup=0"])
    name = "transformer_depth"
    growth = []
    for layers in (12, 48, 192):
        pre = point(f"layers={layers},norm=pre,rule=standard")
        post = point(f"layers={layers},norm=post,rule=standard")
        # "norm=pre,rule=standard: residual-stream variance grows linearly within the stack, by the same ~40% at
        # every depth ...; gradients stay usable (within 2x)".
        fwd = pre.stream("in")
        b, r2 = slope(fwd)
        growth.append(fwd[-1] / fwd[0])
        c.check(name, f"{layers} layers: Pre-LN stream variance grows linearly", b > 0 and r2 > 0.98,
                f"R^2 {r2:.4f}, last/first {fwd[-1] / fwd[0]:.3f}")
        bwd = pre.stream("in", "backward")
        c.check(name, f"{layers} layers: Pre-LN gradient within 2x", spread(bwd) < 2, f"max/min {spread(bwd):.3f}")
        # "norm=post,rule=standard: flat forward variance; with GPT-2's init the gradient is flat through the blocks
        # too, at every depth".
        fwd = post.stream("in")[1:]
        c.check(name, f"{layers} layers: Post-LN forward variance flat at 1", max(abs(v - 1) for v in fwd) < 0.01,
                f"worst |var - 1| {max(abs(v - 1) for v in fwd):.2e}")
        bwd = post.stream("in", "backward")[1:]
        c.check(name, f"{layers} layers: Post-LN gradient flat over blocks 1..", spread(bwd) < 1.01,
                f"max/min {spread(bwd):.5f}")
        # "rule=deepscalelm (pre and post): forward variance near 1 at every depth; the gradient grows towards the
        # input by a factor of 1.5 to 5 (most for Post-LN)".
        for norm in ("pre", "post"):
            run = point(f"layers={layers},norm={norm},rule=deepscalelm")
            fwd = run.stream("in")
            c.check(name, f"{layers} layers: {norm} DeepScaleLM forward variance near 1",
                    max(abs(v - 1) for v in fwd) < 0.1, f"worst |var - 1| {max(abs(v - 1) for v in fwd):.3f}")
            bwd = run.stream("in", "backward")
            c.check(name, f"{layers} layers: {norm} DeepScaleLM gradient grows 1.5x to 5x towards the input",
                    1.3 < bwd[0] / bwd[-1] < 5, f"block 0 / last block {bwd[0] / bwd[-1]:.3f}")
        # "norm=post,rule=deepnorm: flat forward variance and a flat gradient through the blocks, tens of times
        # larger than Post-LN standard's".
        deep = point(f"layers={layers},norm=post,rule=deepnorm")
        fwd = deep.stream("in")[1:]
        c.check(name, f"{layers} layers: DeepNet forward variance flat at 1", max(abs(v - 1) for v in fwd) < 0.01,
                f"worst |var - 1| {max(abs(v - 1) for v in fwd):.2e}")
        bwd = deep.stream("in", "backward")[1:]
        c.check(name, f"{layers} layers: DeepNet gradient flat", spread(bwd) < 1.02, f"max/min {spread(bwd):.4f}")
        ratio = min(bwd) / max(post.stream("in", "backward")[1:])
        c.check(name, f"{layers} layers: DeepNet gradient > 10x Post-LN standard's", ratio > 10, f"ratio {ratio:.3g}")
    c.check(name, "Pre-LN total growth the same at 12, 48 and 192 layers", spread(growth) < 1.1,
            "last/first " + ", ".join(f"{g:.3f}" for g in growth))


def rezero_skipinit(proplab, work, c):
    point = sweep(proplab, "rezero_skipinit", work, ["train.warmup=0"])
    name = "rezero_skipinit"
    for layers in (16, 64):
        rezero, skipinit = point(f"layers={layers},norm=none,rule=rezero"), point(f"layers={layers},norm=none,rule=skipinit")
        # "the rezero and skipinit runs have identical forward variance at every depth (each block is the identity)
        # and gradients that reach the first block undiminished".
        for run, rule in ((rezero, "rezero"), (skipinit, "skipinit")):
            fwd, bwd = run.stream("in") + run.stream("out")[-1:], run.stream("in", "backward")
            c.check(name, f"{layers} layers: {rule} forward variance the same at every block", spread(fwd) < 1 + 1e-6,
                    f"max/min - 1 = {spread(fwd) - 1:.1e}")
            c.check(name, f"{layers} layers: {rule} gradient undiminished", spread(bwd) < 1 + 1e-6,
                    f"max/min - 1 = {spread(bwd) - 1:.1e}")
        c.check(name, f"{layers} layers: rezero and skipinit identical", rezero.stream("in") == skipinit.stream("in"),
                f"{rezero.stream('in')[0]:.6g} vs {skipinit.stream('in')[0]:.6g}")
        # "Post-LN: flat forward variance and, at GPT-2's init, a flat gradient through the blocks as well".
        post = point(f"layers={layers},norm=post,rule=standard")
        bwd = post.stream("in", "backward")[1:]
        c.check(name, f"{layers} layers: Post-LN gradient flat over blocks 1..", spread(bwd) < 1.01,
                f"max/min {spread(bwd):.5f}")


def depth_mup(proplab, work, c):
    point = sweep(proplab, "depth_mup", work, ["train.warmup=0"])
    name = "depth_mup"
    # "rule=depth_mup: final-block forward variance about the same at 4, 16 and 64 layers ... rule=standard: at
    # initialisation its final-block variance is nearly depth-independent too".
    for rule in ("depth_mup", "standard"):
        last = [point(f"layers={layers},rule={rule}").stream("out")[-1] for layers in (4, 16, 64)]
        c.check(name, f"{rule}: final-block variance the same (within 10%) at 4, 16, 64 layers", spread(last) < 1.1,
                ", ".join(f"{v:.4g}" for v in last))


def mlp_meanfield(proplab, work, c):
    point = sweep(proplab, "mlp_meanfield", work)
    name = "mlp_meanfield"

    def gradient(run):
        bwd = run.kind_values("preact", "backward")
        return bwd[0], bwd[-1]

    # "sigma_w2 < 1.76 (ordered): the activation variance settles to a fixed point, and gradients vanish
    # exponentially towards the input".
    for w in ("0.5", "1", "1.5"):
        run = point(f"activation=tanh,sigma_w2={w},sigma_b2=0.05")
        first, last = gradient(run)
        c.check(name, f"tanh sigma_w2={w}: gradient vanishes towards the input", first < 1e-2 * last,
                f"first/last {first / last:.2e}")
        # Settled: the second half's mean is the mean-field fixed point (the prediction at the last layer), within 5%.
        var = run.kind_values("preact")[32:]
        fixed = [float(run.theory[i]) for i, k in enumerate(run.kinds) if k == "preact"][-1]
        mean = sum(var) / len(var)
        c.check(name, f"tanh sigma_w2={w}: variance settled at the fixed point", abs(mean / fixed - 1) < 0.05,
                f"layers 32-63 mean {mean:.4g}, fixed point {fixed:.4g}")
    # "sigma_w2 ~ 1.76 (edge of chaos): gradients pass through all 64 layers with little change".
    first, last = gradient(point("activation=tanh,sigma_w2=1.76,sigma_b2=0.05"))
    c.check(name, "tanh sigma_w2=1.76: gradient within 10x over 64 layers", 0.1 < first / last < 10,
            f"first/last {first / last:.3g}")
    # "sigma_w2 > 1.76 (chaotic): gradients explode".
    for w in ("2.5", "4"):
        first, last = gradient(point(f"activation=tanh,sigma_w2={w},sigma_b2=0.05"))
        c.check(name, f"tanh sigma_w2={w}: gradient explodes towards the input", first > 100 * last,
                f"first/last {first / last:.3g}")
    # "activation=relu, sigma_w2 = 2 (He): the predicted variance is constant through depth; the one network of
    # width 256 drifts from it like a random walk in log-variance, inside the run's finite-width band ... gradients
    # within 10x".
    run = point("activation=relu,sigma_w2=2,sigma_b2=0")
    pre = [i for i, k in enumerate(run.kinds) if k == "preact"]
    predicted = [float(run.theory[i]) for i in pre]
    c.check(name, "ReLU He: predicted variance constant through depth", spread(predicted) < 1 + 1e-9,
            f"max/min - 1 = {spread(predicted) - 1:.1e}")
    worst = max(abs(math.log(run.forward[i] / run.theory[i]) + 0.5 * run.band[i] ** 2) / run.band[i] for i in pre)
    c.check(name, "ReLU He: every layer inside 3 sd of the finite-width band", worst < 3,
            f"worst |z| {worst:.2f} (last layer: var {run.forward[pre[-1]]:.3g}, band sd {run.band[pre[-1]]:.2f})")
    first, last = gradient(run)
    c.check(name, "ReLU He: gradient within 10x", 0.1 < first / last < 10, f"first/last {first / last:.3g}")


def resnet_spp(proplab, work, c):
    point = sweep(proplab, "resnet_spp", work)
    name = "resnet_spp"
    # "BatchNorm: the stream variance grows by 1 per block within a stage and drops back to 2 at each transition".
    bn = point("norm=batchnorm,rule=standard")
    for s, values in enumerate(stages(bn, bn.stream("out"))):
        b, r2 = slope(values)
        c.check(name, f"BatchNorm stage {s + 1}: grows by about 1 per block", 0.85 < b < 1.2 and r2 > 0.98,
                f"slope {b:.3f}, R^2 {r2:.4f}")
        if s > 0:
            c.check(name, f"BatchNorm stage {s + 1}: starts near 2", values[0] < 3, f"first block {values[0]:.3f}")
    # "NF (alpha = 0.2): it grows by alpha^2 = 0.04 per block (1 -> 1.72 over a stage) and resets to 1 + alpha^2".
    nf = point("norm=none,rule=nf")
    for s, values in enumerate(stages(nf, nf.stream("out"))):
        b, r2 = slope(values)
        c.check(name, f"NF stage {s + 1}: grows by about 0.04 per block", 0.03 < b < 0.05 and r2 > 0.98,
                f"slope {b:.4f}, R^2 {r2:.4f}")
        c.check(name, f"NF stage {s + 1}: starts near 1 + alpha^2", abs(values[0] - 1.04) < 0.1,
                f"first block {values[0]:.3f}")
    # "unnormalised: it doubles every block".
    plain = point("norm=none,rule=standard").stream("out")
    rate = (plain[-1] / plain[0]) ** (1.0 / (len(plain) - 1))
    c.check(name, "unnormalised: doubles every block", 1.7 < rate < 2.3, f"geometric growth {rate:.3f}/block")


def resnet_depth(proplab, work, c):
    point = sweep(proplab, "resnet_depth", work, ["train.warmup=0", "train.eval_batches=1"])
    name = "resnet_depth"
    for depth in (20, 56):
        # "Fixup and SkipInit runs have the same stream variance at every block of a stage (identity blocks)".
        for rule, preact in (("fixup", "false"), ("skipinit", "true")):
            run = point(f"depth={depth},rule={rule},norm=none,preact={preact}")
            for s, values in enumerate(stages(run, run.stream("out"))):
                c.check(name, f"ResNet-{depth} {rule} stage {s + 1}: the same variance at every block",
                        spread(values) < 1 + 1e-5, f"max/min - 1 = {spread(values) - 1:.1e}")
        # "NF's grows by alpha^2 times its input's variance per block and resets at transitions".
        run = point(f"depth={depth},rule=nf,norm=none,preact=true")
        per_stage = stages(run, run.stream("out"))
        for s, values in enumerate(per_stage):
            # Linear where a stage has enough blocks to tell (ResNet-56's 9; ResNet-20's 3 only grow).
            b, r2 = slope(values)
            c.check(name, f"ResNet-{depth} NF stage {s + 1}: grows linearly", b > 0 and (r2 > 0.98 or len(values) < 6),
                    f"slope {b:.4f}, R^2 {r2:.4f}")
            if s > 0:
                c.check(name, f"ResNet-{depth} NF stage {s + 1}: resets at the transition",
                        values[0] < per_stage[s - 1][-1], f"{per_stage[s - 1][-1]:.3f} -> {values[0]:.3f}")
        # "BatchNorm's (post-activation blocks) grows linearly within a stage, by about 0.35 per block".
        run = point(f"depth={depth},rule=standard,norm=batchnorm,preact=false")
        for s, values in enumerate(stages(run, run.stream("out"))):
            b, r2 = slope(values)
            c.check(name, f"ResNet-{depth} BatchNorm stage {s + 1}: grows linearly by 0.2-0.5 per block",
                    0.2 < b < 0.5 and r2 > 0.98, f"slope {b:.3f}, R^2 {r2:.4f}")


def mup_coord_check(proplab, work, c):
    # The whole study (10 steps a point, about 30 s): its claims are about the activations after 10 updates.
    point = sweep(proplab, "mup_coord_check", work, full=True)
    name = "mup_coord_check"
    widths = (64, 128, 256, 512, 1024)

    def rms(rule, probe):
        run = [point(f"rule={rule},width={w}") for w in widths]
        return [float(r.rms_last[r.probe(probe)]) for r in run]

    # "rule=standard: the rms grows with width".
    for probe, factor in (("blocks.1.out", 100), ("head.logits", 5)):
        values = rms("standard", probe)
        c.check(name, f"standard: {probe} rms grows with width", all(b > a for a, b in zip(values[1:], values[2:]))
                and values[-1] > factor * values[0], ", ".join(f"{v:.3g}" for v in values))
    # "rule=mup: it stays bounded and settles as width grows (above the base width 256 approaching a width-free
    # limit)".
    for probe in ("blocks.1.out", "head.logits"):
        values = rms("mup", probe)
        c.check(name, f"mup: {probe} rms bounded and settling", all(b <= a for a, b in zip(values[2:], values[3:]))
                and values[-1] > values[2] / 1.5, ", ".join(f"{v:.3g}" for v in values))


STUDIES = {
    "compare_norms": compare_norms,
    "transformer_depth": transformer_depth,
    "rezero_skipinit": rezero_skipinit,
    "depth_mup": depth_mup,
    "mlp_meanfield": mlp_meanfield,
    "resnet_spp": resnet_spp,
    "resnet_depth": resnet_depth,
    "mup_coord_check": mup_coord_check,
}


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    proplab, work = sys.argv[1], sys.argv[2]
    chosen = sys.argv[3:] or list(STUDIES)
    os.makedirs(work, exist_ok=True)
    c = Checker()
    for study in chosen:
        print(f"{study}: sweeping its points for one step (the step-0 record of the full study)", flush=True)
        STUDIES[study](proplab, work, c)
    return c.report()


if __name__ == "__main__":
    sys.exit(main())
