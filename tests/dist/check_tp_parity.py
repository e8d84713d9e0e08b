#!/usr/bin/env python3
"""Tensor-parallel parity: the study of check_dp_parity.py (parity_util.PARITY_STUDY) run by one process and by `mpirun`
with [parallel] tp = 2 and dp = 2 x tp = 2 (4 ranks) must give the same run file (loss, every forward/backward
statistic recorded every step, parameter statistics) and the same full-tensor parameters after 5 steps, within 1e-5
(mean within 1e-5 of the probe's rms, corr within 1e-5 of 1, the rest relative). The tp = 2 layout is checked with
both norm placements that split differently (pre: final norm and norm probes; post: no final norm, untied head,
biases) and with dropout (masks on replicated tensors must agree across the tensor-parallel ranks). Resume across
layouts: a dp = 2 run stopped after 3 steps resumes at tp = 2, and a tp = 2 run stopped after 3 steps resumes as one
process and at dp = 2; each then matches the uninterrupted single-process run. A tp = 2 run repeated gives bitwise
the same run file statistics and checkpoint (determinism at a fixed layout). With AdamW the loss at tp = 2 matches
within 1e-5 (the parameters are not compared: see check_dp_parity.py on zero-gradient parameters under Adam). A
layout the model cannot split is refused.

usage: check_tp_parity.py PROPLAB MPIEXEC WORKDIR
"""
import os
import subprocess
import sys

from parity_util import (PARITY_STUDY, compare_checkpoints, compare_losses, compare_runs, finish, identical_runs,
                         mpi_env, mpirun_cmd, run, write_study)

SGD = 'optimizer = "sgd"\nmomentum = 0.9\ngrad_clip = 0.5'
# Variants of the study: (label, [model] lines replacing norm = "pre").
VARIANTS = [
    ("pre", 'norm = "pre"'),
    ("post-untied-bias-dropout", 'norm = "post"\nnorm_kind = "rmsnorm"\ntie_embeddings = false\nbias = true\n'
                                 'dropout = 0.1'),
]


def main():
    proplab, mpiexec, work = sys.argv[1], sys.argv[2], sys.argv[3]
    env = mpi_env()
    failures = []

    def mpirun(ranks, study, out, sets, extra=(), allowed=()):
        return run(mpirun_cmd(mpiexec, ranks, proplab, study, sets) + ["--out", out] + list(extra), env, allowed)

    for label, model_lines in VARIANTS:
        study = write_study(os.path.join(work, "parity-%s.toml" % label),
                            PARITY_STUDY.replace("{optimizer}", SGD).replace('norm = "pre"', model_lines))
        single = os.path.join(work, label + "-single")
        run([proplab, "run", study, "--out", single, "--force"], env)
        s_run, s_ckpt = os.path.join(single, "parity.h5"), os.path.join(single, "parity.ckpt.h5")
        layouts = [("tp=2", 2, ["parallel.tp=2"])]
        if label == "pre":
            layouts.append(("dp=2 tp=2", 4, ["parallel.dp=2", "parallel.tp=2"]))
        for name, ranks, sets in layouts:
            out = os.path.join(work, "%s-%s" % (label, name.replace(" ", "-").replace("=", "")))
            log = mpirun(ranks, study, out, sets, ["--force"])
            tag = "%s %s" % (label, name)
            if log.count("proplab: parity: completed") != 1:
                failures.append("%s: expected one final line from rank 0, got:\n%s" % (tag, log))
            compare_runs(s_run, os.path.join(out, "parity.h5"), tag, failures)
            compare_checkpoints(s_ckpt, os.path.join(out, "parity.ckpt.h5"), tag, failures)

        if label != "pre":
            continue
        # Determinism: the same layout again gives the same bits.
        again = os.path.join(work, "pre-tp2-again")
        mpirun(2, study, again, ["parallel.tp=2"], ["--force"])
        identical_runs(os.path.join(work, "pre-tp2"), again, "tp=2 repeated", failures)
        # Resume across layouts: dp = 2 → tp = 2; tp = 2 → one process; tp = 2 → dp = 2.
        moves = [("dp=2 then tp=2", ["parallel.dp=2"], 2, ["parallel.tp=2"], 2),
                 ("tp=2 then one process", ["parallel.tp=2"], 2, None, 1),
                 ("tp=2 then dp=2", ["parallel.tp=2"], 2, ["parallel.dp=2"], 2)]
        for name, first_sets, first_ranks, then_sets, then_ranks in moves:
            out = os.path.join(work, "resume-" + name.replace(" ", "-").replace("=", ""))
            mpirun(first_ranks, study, out, first_sets, ["--force", "--stop-after", "3"], allowed=(4,))
            if then_sets is None:
                resumed = run([proplab, "run", study, "--out", out, "--resume"], env)
            else:
                resumed = mpirun(then_ranks, study, out, then_sets, ["--resume"])
            if "resuming at step 3" not in resumed:
                failures.append("%s: did not resume at step 3:\n%s" % (name, resumed))
            compare_runs(s_run, os.path.join(out, "parity.h5"), name, failures)
            compare_checkpoints(s_ckpt, os.path.join(out, "parity.ckpt.h5"), name, failures)

    # AdamW: the loss.
    study = write_study(os.path.join(work, "parity-adamw.toml"), PARITY_STUDY.replace("{optimizer}", ""))
    single = os.path.join(work, "adamw-single")
    run([proplab, "run", study, "--out", single, "--force"], env)
    out = os.path.join(work, "adamw-tp2")
    mpirun(2, study, out, ["parallel.tp=2"], ["--force"])
    compare_losses(os.path.join(single, "parity.h5"), os.path.join(out, "parity.h5"), "adamw tp=2", failures)

    # A split the model does not allow: a clear error naming the key, exit 2, nothing written.
    study = os.path.join(work, "parity-pre.toml")
    bad = os.path.join(work, "bad")
    result = subprocess.run([mpiexec, "-np", "4", "--oversubscribe", proplab, "run", study, "--set",
                             "parallel.tp=4", "--out", bad, "--force"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, timeout=300)
    if result.returncode == 0 or "parallel.tp = 4 must divide model.heads = 2" not in result.stdout:
        failures.append("tp=4 with 2 heads: expected a refusal naming model.heads, got %d:\n%s" %
                        (result.returncode, result.stdout))
    if os.path.exists(os.path.join(bad, "parity.h5")):
        failures.append("tp=4 with 2 heads: a run file was written")

    finish(failures, "tensor-parallel parity holds for tp = 2 and dp = 2 x tp = 2; resume across layouts holds")


if __name__ == "__main__":
    main()
