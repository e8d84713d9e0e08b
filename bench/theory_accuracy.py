#!/usr/bin/env python3
"""How exact the theory is: median and worst relative error of /theory against the step-0 record, for every scaling
rule x norm placement x model kind, written as the markdown table of docs/theory.md ("Accuracy").

Usage: bench/theory_accuracy.py PROPLAB OUT_DIR [--width 512] [--layers 48] [--tokens 64,128] [--seeds 4]
                                [--small-seeds 48] [--resnet-seeds 144] [--batch 2] [--jobs 2]
                                [--only NORM:RULE,...] [--quick]

Every setting is a `proplab sweep` of one-step runs (the step-0 record is the network at initialisation, and the run
file holds the prediction beside it). For each setting the measured variances are averaged over the seeds first,
then compared with the prediction probe by probe:
- transformers: the residual stream (blocks.l.in / .mid / .out), forward var and backward var;
- MLPs (ReLU/He, tanh and GELU near their critical points): every preact and postact, forward and backward var;
- ResNet-56 at 32×32 (basic and bottleneck, pre- and post-activation; NF, SkipInit, Fixup, BatchNorm and
  unnormalised): the stream at every block's input and output, forward and backward var;
- transformers also: the token correlation of the stream and of its gradient (the `corr` statistic), as an absolute
  error (a correlation can be near 0); a stream whose correlation is off shows in the backward only later, through
  the attention's maps (Post-LN admin: 0.09 low at the top until 2026-12-06, while its forward variances were right).
MLPs average --small-seeds networks (48 by default), ResNets --resnet-seeds (144): one network's variances scatter
around the mean by its finite-width band (docs/theory.md, "Finite-width bands"), by several percent at a ResNet's
width 1 (16 to 64 channels), which four seeds leave in a row's median (the bottleneck NF-ResNet forward: 3.9% over
seeds 1-4, 1.1% over 1-48), and 144 still in the basic SkipInit backward's (4.0% / 4.1% over seeds 1-144, 1.4% /
1.9% over 1-432: one network's input gradient scatters by about 35%), whose rows (and the BatchNorm ones) average
three times as many. Every cell shows, in brackets, the seed average's own standard error: its median over
the probes and its value at the worst probe. --only (e.g. pre:deepscalelm,post:xavier) remeasures just those
transformer rows, and no MLPs or ResNets. Combinations a rule rejects (tfixup needs no norms; deepnorm and admin
Post-LN) are left out. --quick runs a tiny shape (for the test that keeps this script working). Prints progress to stderr and the table to stdout; also writes
OUT_DIR/accuracy.md.
"""
import argparse
import csv
import math
import os
import shutil
import subprocess
import sys

import h5py

TRANSFORMER_RULES = ["standard", "xavier", "deepnorm", "deepscalelm", "tfixup", "admin"]
NORMS = ["pre", "post", "none"]
MLPS = [("relu", 2.0, 0.0), ("tanh", 1.76, 0.05), ("gelu", 2.3, 0.05)]
# Residual MLPs (activation, σ_w², σ_b², rule): their forward prediction includes the O(1/width) shift.
RESIDUAL_MLPS = [("relu", 2.0, 0.0, "deepscalelm"), ("relu", 2.0, 0.0, "depth_mup"), ("tanh", 1.5, 0.05, "deepscalelm")]
# Every study here: one step of one point per seed, recorded.
HEAD = 'name = "accuracy"\nseed = 1\n[model]\n'
TAIL = '[record]\nevery = 1\n[device]\ntype = "cpu"\n'
# ResNets (block, pre-activation, norm, rule), ResNet-56 at 32×32, width 1, batch 16 (--quick: ResNet-20 at 16×16).
# (block, pre-activation, norm, rule, networks as a multiple of --resnet-seeds): the basic SkipInit rows average
# three times as many, their input gradient's heavy tail (one network's scatters by about 35%, up to 2.9 times the
# mean) moving 144 networks' median by 2-3 points (docs/theory.md, "The classifier's coupling"), and so do the
# BatchNorm rows, whose first 144 networks put the pre-activation median 0.9 point low.
RESNETS = [("basic", True, "none", "nf", 1), ("bottleneck", True, "none", "nf", 1),
           ("basic", True, "none", "skipinit", 3), ("bottleneck", True, "none", "skipinit", 1),
           ("basic", False, "none", "skipinit", 3), ("basic", False, "none", "fixup", 1),
           ("bottleneck", False, "none", "fixup", 1), ("basic", True, "batchnorm", "standard", 3),
           ("basic", False, "batchnorm", "standard", 3), ("basic", True, "none", "standard", 1)]


def text(values):
    return [v.decode() if isinstance(v, bytes) else v for v in values]


def is_stream(name):
    if not name.startswith("blocks."):
        return False
    parts = name.split(".")
    return len(parts) == 3 and parts[2] in ("in", "mid", "out")


def run_sweep(proplab, study_text, out, jobs):
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    path = os.path.join(out, "study.toml")
    with open(path, "w") as f:
        f.write(study_text)
    runs = os.path.join(out, "runs")
    # No point keeps a checkpoint (parameters and optimiser state: about 1.8 GB at width 512, 48 layers), which
    # nothing here reads.
    result = subprocess.run([proplab, "sweep", path, "--out", runs, "--jobs", str(jobs),
                             "--set", "train.final_checkpoint=false"], capture_output=True, text=True)
    points = {}
    if os.path.exists(os.path.join(runs, "index.csv")):
        with open(os.path.join(runs, "index.csv")) as f:
            for row in csv.DictReader(f):
                points[row.get("run", str(len(points)))] = row
    if result.returncode != 0 or not points:
        raise SystemExit(f"proplab sweep {path} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return runs, points


def applicable(proplab, study, out, settings):
    """True when the study with these --set values is valid (proplab theory exits 0); 2 means a rule rejects it."""
    path = os.path.join(out, "probe.toml")
    with open(path, "w") as f:
        f.write(study)
    command = [proplab, "theory", path]
    for key, value in settings.items():
        command += ["--set", f"{key}={value}"]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode not in (0, 2):
        raise SystemExit(f"{' '.join(command)} failed ({result.returncode}): {result.stderr}")
    return result.returncode == 0


def point_path(runs, **values):
    """The run file of the sweep point with these varied values (whatever order the sweep names them in)."""
    wanted = {k: str(v) for k, v in values.items()}
    for name in os.listdir(runs):
        if not name.endswith(".h5") or name.endswith(".ckpt.h5"):
            continue
        pairs = dict(part.split("=", 1) for part in name[:-3].split(","))
        if pairs == wanted:
            return os.path.join(runs, name)
    return os.path.join(runs, ",".join(f"{k}={v}" for k, v in wanted.items()) + ".h5")


def read(path, direction, statistic="var"):
    with h5py.File(path, "r") as f:
        names = text(f["probes/name"][:])
        kinds = text(f["probes/kind"][:])
        measured = f[f"{direction}/{statistic}"][0]
        predicted = f[f"theory/{direction}/{statistic}"][:]
    return names, kinds, measured, predicted


def errors(paths, direction, select, statistic="var"):
    """Errors of the seed-averaged measurement against the seed-averaged prediction over the selected probes, and
    each probe's standard error of that seed average (the seeds' own scatter). Variances ("var") are compared
    relative to the prediction; a token correlation ("corr", which may be near 0 or of either sign) absolutely."""
    relative = statistic == "var"
    samples, predictions, names, kinds = [], [], None, None
    for path in paths:
        names, kinds, measured, predicted = read(path, direction, statistic)
        samples.append(measured)
        predictions.append(predicted)
    n = len(samples)
    # Each run's prediction reads its own first batch (the embedding's token correlation, the targets' counts), so
    # the seeds' predictions differ slightly: the seed average is compared with the average prediction.
    predicted = [sum(p[i] for p in predictions) / n for i in range(len(names))]
    out, scatter, unpredicted = [], [], 0
    for i, name in enumerate(names):
        if not select(name, kinds[i]):
            continue
        values = [sample[i] for sample in samples]
        mean = sum(values) / n
        if relative and predicted[i] == 0 and mean == 0:
            out.append(0.0)  # exact: e.g. Fixup's zero classifier leaves every gradient 0
            scatter.append(0.0)
        elif math.isfinite(predicted[i]) and (predicted[i] != 0 or not relative) and math.isfinite(mean):
            scale = abs(predicted[i]) if relative else 1.0
            out.append(abs(mean - predicted[i]) / scale)
            spread = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
            scatter.append(spread / math.sqrt(n) / scale)
        else:
            unpredicted += 1
    return out, scatter, unpredicted


def summary(result, absolute=False):
    """"median / worst (±scatter / ±scatter at the worst)": the errors' median and worst, the median standard error
    of the seed averages, and the standard error at the worst probe (with one seed, no scatter is shown); relative
    errors in percent, absolute ones (absolute=True: correlations) to three decimals. Upper blocks of a deep
    transformer scatter several times more than the median probe (Pre-LN deepscalelm, width 512, 48 blocks: 4% per
    seed at the top), so the worst error is read against its own."""
    values, scatter, unpredicted = result
    if not values:
        return "-"
    worst = max(range(len(values)), key=lambda i: values[i])
    show = (lambda v: f"{v:.3f}") if absolute else (lambda v: f"{100 * v:.1f}%")
    text = f"{show(median(values))} / {show(values[worst])}"
    if any(scatter):
        text += f" (±{show(median(scatter))} / ±{show(scatter[worst])})"
    return text + (f" ({unpredicted} of {len(values) + unpredicted} without a finite value)" if unpredicted else "")


def median(values):
    values = sorted(values)
    n = len(values)
    return values[n // 2] if n % 2 else 0.5 * (values[n // 2 - 1] + values[n // 2])


def transformer_rows(args, out):
    rows = []
    for tokens in args.tokens:
        study = f"""{HEAD}type = "transformer"
layers = {args.layers}
width = {args.width}
heads = {max(1, args.width // 64)}
vocab = 256
seq_len = {tokens}
[data]
kind = "markov"
markov_successors = 3
[train]
steps = 1
batch = {args.batch}
eval_every = 0
{TAIL}"""
        # The combinations the rules accept (a rule that fixes the norm placement rejects the others: exit 2).
        combos = [(norm, rule) for norm in NORMS for rule in TRANSFORMER_RULES
                  if (not args.only or (norm, rule) in args.only)
                  and applicable(args.proplab, study, out, {"model.norm": norm, "scaling.rule": rule})]
        rejected = [f"{norm}:{rule}" for norm, rule in args.only if (norm, rule) not in combos]
        if rejected:
            print(f"theory_accuracy: --only {','.join(rejected)}: the rule rejects that norm placement "
                  f"(`proplab theory` exits 2 for it)", file=sys.stderr)
            sys.exit(2)
        sweep = (f'[sweep]\nzip = {{ "model.norm" = {[n for n, _ in combos]}, '
                 f'"scaling.rule" = {[r for _, r in combos]} }}\n'
                 f'grid = {{ "seed" = {list(range(1, args.seeds + 1))} }}\n').replace("'", '"')
        print(f"theory_accuracy: transformers at {tokens} tokens ({len(combos) * args.seeds} points)", file=sys.stderr,
              flush=True)
        runs, points = run_sweep(args.proplab, study + sweep, os.path.join(out, f"transformer_{tokens}"), args.jobs)
        for norm in NORMS:
            for rule in TRANSFORMER_RULES:
                label = f"transformer, {norm}-LN" if norm != "none" else "transformer, no norm"
                if (norm, rule) not in combos:
                    continue
                paths = [point_path(runs, norm=norm, rule=rule, seed=s) for s in range(1, args.seeds + 1)]
                missing = [p for p in paths if not os.path.exists(p)]
                if missing:
                    raise SystemExit(f"theory_accuracy: {missing[0]} was not written (see {runs}/logs)")
                select = lambda name, kind: is_stream(name)
                rows.append((label, rule, tokens, summary(errors(paths, "forward", select)),
                             summary(errors(paths, "backward", select)),
                             summary(errors(paths, "forward", select, "corr"), absolute=True),
                             summary(errors(paths, "backward", select, "corr"), absolute=True)))
    return rows


def mlp_rows(args, out):
    rows = []
    variants = [(a, w, b, None) for a, w, b in MLPS] + RESIDUAL_MLPS
    for activation, sigma_w2, sigma_b2, rule in variants:
        residual = rule is not None
        # deepscalelm's β² = 2/N_adds needs at least two residual adds (--quick has 2 layers).
        layers = max(args.layers, 4) if residual else args.layers
        study = f"""{HEAD}type = "mlp"
layers = {layers}
width = {args.width}
input_dim = {args.width}
activation = "{activation}"
sigma_w2 = {sigma_w2}
sigma_b2 = {sigma_b2}
residual = {"true" if residual else "false"}
[scaling]
rule = "{rule or "standard"}"
[train]
steps = 1
batch = 64
eval_every = 0
{TAIL}[sweep]
grid = {{ "seed" = {list(range(1, args.small_seeds + 1))} }}
"""
        label = f"mlp_{activation}" + (f"_residual_{rule}" if residual else "")
        print(f"theory_accuracy: MLP {activation}" + (f" residual {rule}" if residual else ""), file=sys.stderr,
              flush=True)
        runs, _ = run_sweep(args.proplab, study, os.path.join(out, label), args.jobs)
        paths = [point_path(runs, seed=s) for s in range(1, args.small_seeds + 1)]
        kinds = ("preact", "postact", "residual") if residual else ("preact", "postact")
        select = lambda name, kind, kinds=kinds: kind in kinds
        name = f"{activation} (σ_w² = {sigma_w2}, σ_b² = {sigma_b2})" + (f", residual {rule}" if residual else "")
        rows.append(("MLP", name, "-", summary(errors(paths, "forward", select)),
                     summary(errors(paths, "backward", select)), "-", "-"))
    return rows


def resnet_rows(args, out):
    depth = 20 if args.quick else 56
    rows = []
    for block, preact, norm, rule, multiple in RESNETS:
        networks = multiple * args.resnet_seeds
        study = f"""{HEAD}type = "resnet"
depth = {depth}
block = "{block}"
width = 1
preact = {"true" if preact else "false"}
norm = "{norm}"
image_size = {16 if args.quick else 32}
in_channels = 3
classes = 10
[scaling]
rule = "{rule}"
[data]
kind = "images"
[train]
optimizer = "sgd"
steps = 1
batch = 16
lr = 0.01
{TAIL}[sweep]
grid = {{ "seed" = {list(range(1, networks + 1))} }}
"""
        label = f"{block}, {'pre' if preact else 'post'}-act, {'no norm' if norm == 'none' else norm}"
        print(f"theory_accuracy: ResNet-{depth} {label}, {rule} ({networks} networks)", file=sys.stderr, flush=True)
        runs, _ = run_sweep(args.proplab, study,
                            os.path.join(out, f"resnet_{block}_{'pre' if preact else 'post'}_{norm}_{rule}"), args.jobs)
        paths = [point_path(runs, seed=s) for s in range(1, networks + 1)]
        # The stream: every block's input and output.
        select = lambda name, kind: (name.startswith("blocks.") and name.count(".") == 2
                                     and (name.endswith(".in") or name.endswith(".out")))
        rows.append((f"ResNet-{depth}, {label}", rule, "-", summary(errors(paths, "forward", select)),
                     summary(errors(paths, "backward", select)), "-", "-"))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("proplab")
    parser.add_argument("out")
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--layers", type=int, default=48)
    parser.add_argument("--tokens", default="64,128")
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--small-seeds", type=int, default=48, help="networks averaged per MLP row")
    parser.add_argument("--resnet-seeds", type=int, default=144, help="networks averaged per ResNet row")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--only", default="", help="NORM:RULE,... : only these transformer rows (no MLPs, ResNets)")
    parser.add_argument("--quick", action="store_true", help="a tiny shape: width 32, 2 layers, 16 tokens, 1 seed (MLPs and ResNets: 2)")
    args = parser.parse_args()
    if args.seeds < 1 or args.small_seeds < 1 or args.resnet_seeds < 1:
        parser.error("--seeds, --small-seeds and --resnet-seeds: at least 1")
    if args.quick:
        args.width, args.layers, args.tokens, args.seeds, args.small_seeds, args.resnet_seeds = 32, 2, "16", 1, 2, 2
    try:
        args.tokens = [int(t) for t in args.tokens.split(",")]
    except ValueError:
        parser.error(f"--tokens {args.tokens}: expected comma-separated integers")
    args.only = [tuple(item.split(":", 1)) for item in args.only.split(",") if item]
    for item in args.only:
        if len(item) != 2 or item[0] not in NORMS or item[1] not in TRANSFORMER_RULES:
            parser.error(f"--only {':'.join(item)}: expected NORM:RULE with NORM in {NORMS} and RULE in "
                         f"{TRANSFORMER_RULES}")
    if not os.access(args.proplab, os.X_OK):
        parser.error(f"{args.proplab}: not an executable")
    os.makedirs(args.out, exist_ok=True)
    rows = transformer_rows(args, args.out)
    if not args.only:
        rows += mlp_rows(args, args.out) + resnet_rows(args, args.out)
    seeds = (f", averaged over {args.seeds} seed(s): " if args.only else
             f" (ResNets: as stated), averaged over {args.seeds} seed(s) ({args.small_seeds} for MLPs, "
             f"{args.resnet_seeds} for ResNets, three times that for the basic SkipInit and BatchNorm ones): ")
    lines = [f"Width {args.width}, {args.layers} layers{seeds}"
             "relative error of the seed-averaged measured variance against the seed-averaged prediction, median / "
             "worst over the probes, and in brackets the seed average's standard error relative to the prediction, "
             "its median over the probes / at the worst probe "
             + ("(the residual stream)" if args.only else
                "(transformers: the residual stream; MLPs: preact and postact, and the stream of residual ones; "
                "ResNets: each block's output)")
             + "; the corr columns: the absolute error of the stream's token correlation, forward and of the "
             "gradient (transformers only), the same way.",
             "",
             "| model | rule | tokens | forward var | backward var | forward corr | backward corr |",
             "|---|---|---|---|---|---|---|"]
    for model, rule, tokens, forward, backward, forward_corr, backward_corr in rows:
        lines.append(f"| {model} | `{rule}` | {tokens} | {forward} | {backward} | {forward_corr} | {backward_corr} |")
    table = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "accuracy.md"), "w") as f:
        f.write(table)
    sys.stdout.write(table)


if __name__ == "__main__":
    main()
