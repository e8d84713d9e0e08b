#!/usr/bin/env python3
"""Pipeline-parallel parity: the same study run by one process and by `mpirun` with [parallel] pp = 2 (4
micro-batches), dp = 2 x pp = 2 (4 ranks), pp = 3 with fewer micro-batches than stages, tp = 2 x pp = 2 (4 ranks:
stages split over tensor groups) and dp = 2 x tp = 2 x pp = 2 (8 ranks) must give a run file of the same layout with
the same loss, every recorded statistic and the same parameter statistics, and the same parameters after the steps,
within 1e-5 (statistics that can sit near zero, mean and corr, within 1e-5 of the probe's rms or of 1). tp = 2 x
pp = 2 is also checked on a post-RMSNorm model with an untied head and biases (no final norm: the head's input
gradient is the last stage's output gradient). A pp = 2 run and a tp = 2 x pp = 2 run stopped after 3 steps and
resumed by one process must match too (their checkpoints are full-tensor), and so must a one-process run stopped
after 2 steps and resumed with pp = 2 or with tp = 2 x pp = 2. A tp = 2 x pp = 2 run repeated gives bitwise the same
statistics and checkpoint. Uses SGD with momentum and gradient clipping, so the pipelined global gradient norm is
checked.

usage: check_pp_parity.py PROPLAB MPIEXEC WORKDIR
"""
import os
import sys
import textwrap

import h5py

from parity_util import (compare_checkpoints, compare_losses, compare_runs, finish, identical_runs, mpi_env,
                         mpirun_cmd, run, write_study)

STUDY = textwrap.dedent("""\
    name = "parity"
    seed = 3
    [model]
    type = "transformer"
    layers = 3
    width = 32
    heads = 2
    vocab = 32
    seq_len = 16
    norm = "pre"
    [data]
    kind = "markov"
    [train]
    steps = 5
    batch = 8
    grad_accum = 2
    lr = 3e-2
    warmup = 1
    optimizer = "sgd"
    momentum = 0.9
    grad_clip = 0.5
    eval_every = 5
    [record]
    every = 1
    [device]
    threads = 1
    """)


PP = ["parallel.pp=2", "parallel.microbatches=4"]
TP_PP = ["parallel.tp=2"] + PP
POST_UNTIED = 'norm = "post"\nnorm_kind = "rmsnorm"\ntie_embeddings = false\nbias = true'


def layout(path):
    """Every dataset's name and shape, and the probe and parameter names. /replicas (the data-parallel replicas'
    disagreement) exists only with dp > 1."""
    shapes = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, node: shapes.__setitem__(name, node.shape)
                     if isinstance(node, h5py.Dataset) and not name.startswith(("train/", "replicas/")) else None)
        names = (list(f["probes/name"][()]), list(f["params/name"][()]))
    return shapes, names


def main():
    proplab, mpiexec, work = sys.argv[1], sys.argv[2], sys.argv[3]
    study = write_study(os.path.join(work, "parity.toml"), STUDY)
    env = mpi_env()
    failures = []
    single = os.path.join(work, "single")
    run([proplab, "run", study, "--out", single, "--force"], env)
    layouts = [  # (label, processes, --set options)
        ("pp=2 microbatches=4", 2, PP),
        ("dp=2 x pp=2 microbatches=4", 4, ["parallel.dp=2"] + PP),
        ("pp=3 microbatches=2", 3, ["parallel.pp=3", "parallel.microbatches=2"]),
        ("tp=2 x pp=2 microbatches=4", 4, TP_PP),
        ("dp=2 x tp=2 x pp=2 microbatches=4", 8, ["parallel.dp=2"] + TP_PP),
    ]
    compare_layouts(proplab, mpiexec, work, study, env, single, layouts, failures)
    # tp x pp without a final norm, with an untied (vocabulary-split) head and biases.
    post = write_study(os.path.join(work, "parity-post.toml"), STUDY.replace('norm = "pre"', POST_UNTIED))
    post_single = os.path.join(work, "post-single")
    run([proplab, "run", post, "--out", post_single, "--force"], env)
    compare_layouts(proplab, mpiexec, work, post, env, post_single,
                    [("post-untied tp=2 x pp=2 microbatches=4", 4, TP_PP)], failures)
    # Resume across layouts, both ways: pp = 2 and tp = 2 x pp = 2 <-> one process.
    resume_checks(proplab, mpiexec, work, study, env, single, failures, "pp=2", 2, PP)
    resume_checks(proplab, mpiexec, work, study, env, single, failures, "tp=2 x pp=2", 4, TP_PP)
    # Determinism at a fixed layout: tp = 2 x pp = 2 repeated.
    again = os.path.join(work, "tp2_x_pp2_again")
    run(mpirun_cmd(mpiexec, 4, proplab, study, TP_PP) + ["--out", again, "--force"], env)
    identical_runs(os.path.join(work, "tp2_x_pp2_microbatches4"), again, "tp=2 x pp=2 repeated", failures)
    finish(failures, "pipeline-parallel parity holds for pp = 2, dp = 2 x pp = 2, pp = 3, tp = 2 x pp = 2 (pre and "
           "post-untied), dp = 2 x tp = 2 x pp = 2, and resuming pp = 2 and tp = 2 x pp = 2 <-> one process")


def compare_layouts(proplab, mpiexec, work, study, env, single, layouts, failures):
    single_run, single_ckpt = os.path.join(single, "parity.h5"), os.path.join(single, "parity.ckpt.h5")
    for label, ranks, sets in layouts:
        out = os.path.join(work, label.replace(" ", "_").replace("=", ""))
        log = run(mpirun_cmd(mpiexec, ranks, proplab, study, sets) + ["--out", out, "--force"], env)
        if log.count("proplab: parity: completed") != 1:
            failures.append("%s: expected one final line from rank 0, got:\n%s" % (label, log))
        parallel_run = os.path.join(out, "parity.h5")
        if layout(single_run) != layout(parallel_run):
            failures.append("%s: the run file's layout differs from the single process's" % label)
            continue
        compare_runs(single_run, parallel_run, label, failures)
        compare_checkpoints(single_ckpt, os.path.join(out, "parity.ckpt.h5"), label, failures)
        compare_losses(single_run, parallel_run, label, failures, dataset="eval/loss", what="validation loss")


def resume_checks(proplab, mpiexec, work, study, env, single, failures, label, ranks, sets):
    """A `label` run stopped after 3 steps and continued by one process, and a one-process run stopped after 2 steps
    and continued under `label` (every rank reads the full-tensor file), each against the uninterrupted run."""
    single_run, single_ckpt = os.path.join(single, "parity.h5"), os.path.join(single, "parity.ckpt.h5")
    mpirun = mpirun_cmd(mpiexec, ranks, proplab, study, sets)
    name = label.replace(" ", "").replace("=", "")
    moved = os.path.join(work, name + "-resumed")
    run(mpirun + ["--out", moved, "--force", "--stop-after", "3"], env, allowed=(4,))
    resumed = run([proplab, "run", study, "--out", moved, "--resume"], env)
    if "resuming at step 3" not in resumed:
        failures.append("%s then one process: did not resume at step 3:\n%s" % (label, resumed))
    what = "%s then resumed by one process" % label
    compare_runs(single_run, os.path.join(moved, "parity.h5"), what, failures)
    compare_checkpoints(single_ckpt, os.path.join(moved, "parity.ckpt.h5"), what, failures)
    back = os.path.join(work, "single-then-" + name)
    run([proplab, "run", study, "--out", back, "--force", "--stop-after", "2"], env, allowed=(4,))
    resumed = run(mpirun + ["--out", back, "--resume"], env)
    if "resuming at step 2" not in resumed:
        failures.append("one process then %s: did not resume at step 2:\n%s" % (label, resumed))
    what = "one process then resumed by %s" % label
    compare_runs(single_run, os.path.join(back, "parity.h5"), what, failures)
    compare_checkpoints(single_ckpt, os.path.join(back, "parity.ckpt.h5"), what, failures)


if __name__ == "__main__":
    main()
