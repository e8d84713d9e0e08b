#!/usr/bin/env python3
"""Sequence-parallel parity: the study of check_dp_parity.py (parity_util.PARITY_STUDY, 16 tokens per sequence) run by
one process and by `mpirun` with [parallel] sp = 2, sp = 4, dp = 2 x sp = 2, tp = 2 x sp = 2, sp = 2 x pp = 2 and
dp = 2 x tp = 2 x sp = 2 (8 ranks) must give the same run file (loss, validation loss, every forward/backward
statistic recorded every step — corr, whose per-sequence sums span the ring, included —, parameter statistics) and
the same parameters after 5 steps, within 1e-5 (mean within 1e-5 of the probe's rms, corr within 1e-5 of 1, the rest
relative). A post-RMSNorm model with an untied head and biases is checked at sp = 2 too. Pipeline boundaries
compressed to bf16 (elementwise, so the split does not change what is rounded) give the same run file and the same
boundary compression errors at sp = 2 x pp = 2 as at pp = 2. Resume across layouts: an sp = 2 run stopped after 3
steps resumes as one process, and a one-process run stopped after 3 steps resumes at sp = 2; each then matches the
uninterrupted run. An sp = 2 run repeated gives bitwise the same run file statistics and checkpoint, with dropout
too (each ring rank draws its own masks). ZeRO-1 at dp = 2 x sp = 2 and per-tensor exchanges match too. The gradient
exchange compressed over the dp x sp ranks (topk) resumes bitwise, and bf16's loss stays within 1e-3 of one process. With
AdamW the loss at sp = 2 matches within 1e-5. Bad combinations are
refused with exit 2 and a message naming the key, and no run file is written.

usage: check_sp_parity.py PROPLAB MPIEXEC WORKDIR
"""
import os
import subprocess
import sys

import h5py
import numpy as np

from parity_util import (PARITY_STUDY, compare_checkpoints, compare_losses, compare_runs, finish, identical_runs,
                         mpi_env, mpirun_cmd, run, write_study)

SGD = 'optimizer = "sgd"\nmomentum = 0.9\ngrad_clip = 0.5'
PP = ["parallel.pp=2", "parallel.microbatches=4"]
LAYOUTS = [
    ("sp=2", 2, ["parallel.sp=2"]),
    ("sp=4", 4, ["parallel.sp=4"]),
    ("dp=2 sp=2", 4, ["parallel.dp=2", "parallel.sp=2"]),
    ("tp=2 sp=2", 4, ["parallel.tp=2", "parallel.sp=2"]),
    ("sp=2 pp=2", 4, ["parallel.sp=2"] + PP),
    ("dp=2 tp=2 sp=2", 8, ["parallel.dp=2", "parallel.tp=2", "parallel.sp=2"]),
    ("dp=2 sp=2 zero=1", 4, ["parallel.dp=2", "parallel.sp=2", "parallel.zero=1"]),
    ("sp=2 per-tensor", 2, ["parallel.sp=2", "parallel.bucket_mb=0"]),
]
POST_UNTIED = 'norm = "post"\nnorm_kind = "rmsnorm"\ntie_embeddings = false\nbias = true'


def compare_eval(single, parallel, label, failures):
    compare_losses(single, parallel, label, failures, dataset="eval/loss", what="validation loss")


def main():
    proplab, mpiexec, work = sys.argv[1], sys.argv[2], sys.argv[3]
    env = mpi_env()
    failures = []

    def mpirun(ranks, study, out, sets, extra=(), allowed=()):
        return run(mpirun_cmd(mpiexec, ranks, proplab, study, sets) + ["--out", out] + list(extra), env, allowed)

    def check(study, single, ranks, sets, label, extra=()):
        out = os.path.join(work, label.replace(" ", "-").replace("=", ""))
        log = mpirun(ranks, study, out, sets, ["--force"] + list(extra))
        if log.count("proplab: parity: completed") != 1:
            failures.append("%s: expected one final line from rank 0, got:\n%s" % (label, log))
        s_run, p_run = os.path.join(single, "parity.h5"), os.path.join(out, "parity.h5")
        compare_runs(s_run, p_run, label, failures)
        compare_eval(s_run, p_run, label, failures)
        compare_checkpoints(os.path.join(single, "parity.ckpt.h5"), os.path.join(out, "parity.ckpt.h5"), label,
                            failures)
        with h5py.File(p_run, "r") as f:
            wanted = "sp=" + dict(s.split("=") for s in sets)["parallel.sp"]
            if wanted not in f.attrs["layout"].decode().split():
                failures.append("%s: layout attribute %r lacks %s" % (label, f.attrs["layout"], wanted))
        return out

    # The pre-LN study under every layout.
    study = write_study(os.path.join(work, "parity-pre.toml"), PARITY_STUDY.replace("{optimizer}", SGD))
    single = os.path.join(work, "pre-single")
    run([proplab, "run", study, "--out", single, "--force"], env)
    for label, ranks, sets in LAYOUTS:
        check(study, single, ranks, sets, "pre " + label)
    # Determinism: the same layout again gives the same bits.
    again = os.path.join(work, "pre-sp2-again")
    mpirun(2, study, again, ["parallel.sp=2"], ["--force"])
    identical_runs(os.path.join(work, "pre-sp2"), again, "sp=2 repeated", failures)

    # Post-LN, RMSNorm, untied head, biases.
    post = write_study(os.path.join(work, "parity-post.toml"),
                       PARITY_STUDY.replace("{optimizer}", SGD).replace('norm = "pre"', POST_UNTIED))
    post_single = os.path.join(work, "post-single")
    run([proplab, "run", post, "--out", post_single, "--force"], env)
    check(post, post_single, 2, ["parallel.sp=2"], "post sp=2")

    # Compressed pipeline boundaries: sp = 2 x pp = 2 against pp = 2.
    bf16 = ["parallel.pp_compress=bf16"]
    pp_alone = os.path.join(work, "bf16-pp2")
    mpirun(2, study, pp_alone, PP + bf16, ["--force"])
    pp_sp = os.path.join(work, "bf16-sp2-pp2")
    mpirun(4, study, pp_sp, PP + bf16 + ["parallel.sp=2"], ["--force"])
    compare_runs(os.path.join(pp_alone, "parity.h5"), os.path.join(pp_sp, "parity.h5"), "bf16 sp=2 pp=2", failures)
    with h5py.File(os.path.join(pp_alone, "parity.h5"), "r") as a, h5py.File(os.path.join(pp_sp, "parity.h5"),
                                                                              "r") as b:
        for name in ("activation_error", "gradient_error"):
            x, y = a["compression/boundaries/" + name][()], b["compression/boundaries/" + name][()]
            if x.shape != y.shape or not np.all(x > 0) or not np.allclose(x, y, rtol=1e-5, atol=0):
                failures.append("bf16 sp=2 pp=2: /compression/boundaries/%s %s vs %s (pp=2)" % (name, y, x))

    # Resume across layouts: sp = 2 then one process; one process then sp = 2.
    moves = [("sp=2 then one process", ["parallel.sp=2"], 2, None, 1),
             ("one process then sp=2", None, 1, ["parallel.sp=2"], 2)]
    for name, first_sets, first_ranks, then_sets, then_ranks in moves:
        out = os.path.join(work, "resume-" + name.replace(" ", "-").replace("=", ""))
        if first_sets is None:
            run([proplab, "run", study, "--out", out, "--force", "--stop-after", "3"], env, allowed=(4,))
        else:
            mpirun(first_ranks, study, out, first_sets, ["--force", "--stop-after", "3"], allowed=(4,))
        if then_sets is None:
            resumed = run([proplab, "run", study, "--out", out, "--resume"], env)
        else:
            resumed = mpirun(then_ranks, study, out, then_sets, ["--resume"])
        if "resuming at step 3" not in resumed:
            failures.append("%s: did not resume at step 3:\n%s" % (name, resumed))
        compare_runs(os.path.join(single, "parity.h5"), os.path.join(out, "parity.h5"), name, failures)
        compare_checkpoints(os.path.join(single, "parity.ckpt.h5"), os.path.join(out, "parity.ckpt.h5"), name,
                            failures)

    # Compressed exchange over the replicas and their rings (dp = 2 x sp = 2, topk with error feedback): a run
    # stopped after 3 steps and resumed is bitwise the uninterrupted one, and bf16 stays within its rounding of the
    # uncompressed run.
    topk = ["parallel.dp=2", "parallel.sp=2", "parallel.compress=topk", "parallel.compress_ratio=0.1"]
    whole, moved = os.path.join(work, "topk-dp2-sp2"), os.path.join(work, "topk-dp2-sp2-resumed")
    mpirun(4, study, whole, topk, ["--force"])
    mpirun(4, study, moved, topk, ["--force", "--stop-after", "3"], allowed=(4,))
    resumed = mpirun(4, study, moved, topk, ["--resume"])
    if "resuming at step 3" not in resumed or "afresh" in resumed:
        failures.append("topk dp=2 sp=2: did not resume at step 3 with its state:\n" + resumed)
    identical_runs(whole, moved, "topk dp=2 sp=2 resumed", failures)
    with h5py.File(os.path.join(whole, "parity.h5"), "r") as f:
        if "compress=topk" not in f.attrs["layout"].decode() or not np.all(f["compression/residual_total"][()] > 0):
            failures.append("topk dp=2 sp=2: layout %s, residual %s" % (f.attrs["layout"],
                                                                       f["compression/residual_total"][()].ravel()))
    bf16 = os.path.join(work, "bf16-dp2-sp2")
    mpirun(4, study, bf16, ["parallel.dp=2", "parallel.sp=2", "parallel.compress=bf16"], ["--force"])
    with h5py.File(os.path.join(single, "parity.h5"), "r") as a, h5py.File(os.path.join(bf16, "parity.h5"), "r") as b:
        u, v = a["train/loss"][()], b["train/loss"][()]
        error = b["compression/error_total"][()]
        if not np.all(np.abs(u - v) <= 1e-3 * np.abs(u)) or not np.all((error > 0) & (error < 2.0 ** -8)):
            failures.append("bf16 dp=2 sp=2: loss %s against %s, error %s" % (v, u, error.ravel()))

    # Dropout: no single-process parity (the ring ranks draw their own masks), but bitwise repeatable.
    dropout = write_study(os.path.join(work, "parity-dropout.toml"),
                          PARITY_STUDY.replace("{optimizer}", SGD).replace('norm = "pre"', 'norm = "pre"\ndropout = 0.1'))
    first, second = os.path.join(work, "dropout-sp2"), os.path.join(work, "dropout-sp2-again")
    mpirun(2, dropout, first, ["parallel.sp=2"], ["--force"])
    mpirun(2, dropout, second, ["parallel.sp=2"], ["--force"])
    identical_runs(first, second, "dropout sp=2 repeated", failures)

    # AdamW: the loss.
    adamw = write_study(os.path.join(work, "parity-adamw.toml"), PARITY_STUDY.replace("{optimizer}", ""))
    adamw_single = os.path.join(work, "adamw-single")
    run([proplab, "run", adamw, "--out", adamw_single, "--force"], env)
    out = os.path.join(work, "adamw-sp2")
    mpirun(2, adamw, out, ["parallel.sp=2"], ["--force"])
    compare_losses(os.path.join(adamw_single, "parity.h5"), os.path.join(out, "parity.h5"), "adamw sp=2", failures)

    # Refusals: exit 2, a message naming the key, nothing written.
    mlp = write_study(os.path.join(work, "mlp.toml"), 'name = "parity"\n[model]\ntype = "mlp"\n[train]\nsteps = 2\n')
    refusals = [
        ("sp=3 with seq_len 16", study, 3, ["parallel.sp=3"], "parallel.sp = 3 must divide model.seq_len = 16"),
        ("sp=2 on an MLP", mlp, 2, ["parallel.sp=2"], "parallel.sp = 2: sequence parallelism splits a transformer"),
        ("sp=2 on 4 ranks", study, 4, ["parallel.sp=2"], "needs 2 processes, but 4 were started"),
        ("sp=2 with local_sgd", study, 4, ["parallel.sp=2", "parallel.dp=2", "parallel.dp_mode=local_sgd"],
         "parallel.dp_mode = \"local_sgd\" with parallel.sp = 2: each replica steps on its own gradient"),
        ("sp=2 with gossip", study, 2, ["parallel.sp=2", "parallel.dp_mode=gossip"],
         "allowed with sp > 1: dp_mode = \"allreduce\""),
    ]
    for name, path, ranks, sets, expected in refusals:
        bad = os.path.join(work, "bad-" + name.replace(" ", "-").replace("=", ""))
        result = subprocess.run(mpirun_cmd(mpiexec, ranks, proplab, path, sets) + ["--out", bad, "--force"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
        if result.returncode != 2 or expected not in result.stdout:
            failures.append("%s: expected exit 2 and %r, got %d:\n%s" % (name, expected, result.returncode,
                                                                       result.stdout))
        if os.path.exists(os.path.join(bad, "parity.h5")):
            failures.append("%s: a run file was written" % name)

    finish(failures, "sequence-parallel parity holds for sp = 2, 4, dp x sp, tp x sp, sp x pp and dp x tp x sp; "
                     "resume across layouts, compression over dp x sp, determinism and refusals hold")


if __name__ == "__main__":
    main()
