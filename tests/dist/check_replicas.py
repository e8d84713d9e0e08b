#!/usr/bin/env python3
"""Replica disagreement (/replicas in the run file) under each data-parallel mode, run by mpirun:

- allreduce (bucketed) and zero = 1: the replicas apply identical updates, so the disagreement is exactly 0;
- local_sgd with sync_every = 2: exactly 0 right after each averaging step (steps 1, 3, ...), and above 0 after
  the steps in between (the replicas saw different data), which shows the measure can see a difference;
- gossip (D-PSGD on a ring, W = 1/3 on a replica and its two neighbours): mixing is x ← W x. With J the averaging
  matrix, W J = J W = J, so the deviations from the mean map as (I − J) x ← W (I − J) x, and on the space of
  deviations W's largest |eigenvalue| is λ = max_{k=1..n-1} |1/3 + 2/3 cos(2πk/n)| (1/3 for n = 4; for n = 2,
  W = J and λ = 0). The mean is unchanged by W, so each step the recorded disagreement after the mix is at most λ
  times the one before it, per parameter tensor and in total (up to float rounding: 1e-6 absolute). For n = 2
  the two replicas compute the same sum and end bitwise equal: exactly 0.

usage: check_replicas.py PROPLAB MPIEXEC WORKDIR
"""
import math
import os
import sys
import textwrap

import h5py
import numpy as np

from parity_util import finish, mpi_env, mpirun_cmd, run, write_study

STUDY = textwrap.dedent("""\
    name = "replicas"
    seed = 5
    [model]
    type = "transformer"
    layers = 2
    width = 32
    heads = 2
    vocab = 32
    seq_len = 16
    [data]
    kind = "markov"
    [train]
    steps = 8
    batch = 8
    lr = 1e-2
    eval_every = 0
    [record]
    every = 1
    [device]
    threads = 1
    """)
ROUNDING = 1e-6


def second_eigenvalue(n):
    if n <= 2:
        return 0.0
    return max(abs(1.0 / 3.0 + 2.0 / 3.0 * math.cos(2.0 * math.pi * k / n)) for k in range(1, n))


def run_replicas(mpiexec, proplab, study, n, out, settings, env):
    run(mpirun_cmd(mpiexec, n, proplab, study, ["parallel.dp=%d" % n] + settings) + ["--out", out, "--force"], env)
    with h5py.File(os.path.join(out, "replicas.h5"), "r") as f:
        return {name: f["replicas"][name][()] for name in f["replicas"]}


def main():
    proplab, mpiexec, work = sys.argv[1:4]
    study = write_study(os.path.join(work, "replicas.toml"), STUDY)
    env = mpi_env()
    failures = []
    steps = list(range(8))

    for label, n, settings in (("allreduce dp=2", 2, ["parallel.bucket_mb=0.002"]),
                               ("zero=1 dp=2", 2, ["parallel.zero=1"])):
        r = run_replicas(mpiexec, proplab, study, n, os.path.join(work, label.replace(" ", "-")), settings, env)
        if list(r["steps"]) != steps:
            failures.append("%s: /replicas/steps %s" % (label, r["steps"]))
        for name in ("disagreement", "disagreement_total", "disagreement_before_mix",
                     "disagreement_before_mix_total"):
            if np.any(r[name] != 0.0):
                failures.append("%s: /replicas/%s not 0: max %g" % (label, name, np.max(r[name])))

    label = "local_sgd sync_every=2 dp=2"
    r = run_replicas(mpiexec, proplab, study, 2, os.path.join(work, "local"),
            ['parallel.dp_mode="local_sgd"', "parallel.sync_every=2"], env)
    for i, step in enumerate(r["steps"]):
        after, before = r["disagreement_total"][i, 0], r["disagreement_before_mix_total"][i, 0]
        if (step + 1) % 2 == 0:
            if after != 0.0 or np.any(r["disagreement"][i] != 0.0):
                failures.append("%s: step %d (an averaging step): disagreement %g, expected 0" % (label, step, after))
            if not before > 0.0:
                failures.append("%s: step %d: disagreement before averaging %g, expected > 0" % (label, step, before))
        elif not after > 0.0 or after != before:
            failures.append("%s: step %d (no averaging): disagreement %g (before %g), expected > 0 and equal"
                            % (label, step, after, before))

    for n in (2, 4):
        label = "gossip dp=%d" % n
        lam = second_eigenvalue(n)
        r = run_replicas(mpiexec, proplab, study, n, os.path.join(work, "gossip%d" % n),
                         ['parallel.dp_mode="gossip"'], env)
        if list(r["steps"]) != steps:
            failures.append("%s: /replicas/steps %s" % (label, r["steps"]))
        before, after = r["disagreement_before_mix"], r["disagreement"]
        if n == 2 and np.any(after != 0.0):
            failures.append("%s: disagreement after mixing not 0: max %g" % (label, np.max(after)))
        bad = after > lam * before + ROUNDING
        if np.any(bad):
            i, p = np.argwhere(bad)[0]
            failures.append("%s: step %d parameter %d: after mixing %g > λ·before = %g·%g" % (label, i, p, after[i, p],
                                                                                         lam, before[i, p]))
        total_before, total_after = r["disagreement_before_mix_total"][:, 0], r["disagreement_total"][:, 0]
        if np.any(total_after > lam * total_before + ROUNDING):
            failures.append("%s: total after mixing %s exceeds λ = %g times before %s" % (label, total_after, lam,
                                                                                          total_before))
        # The bound is only worth something if the replicas do drift apart between mixes.
        if not np.all(total_before[1:] > 100 * ROUNDING):
            failures.append("%s: disagreement before mixing %s: too small to test the bound" % (label, total_before))
        if n == 4 and not np.all(total_after[1:] > 0.0):
            failures.append("%s: disagreement after mixing %s: a ring of 4 does not average exactly" % (label,
                                                                                                       total_after))
        print("%s: λ = %.4f; before mixing %s; after %s" % (label, lam, np.array2string(total_before, precision=3),
                                                          np.array2string(total_after, precision=3)))
    finish(failures,
           "replica disagreement: 0 for allreduce and zero = 1, 0 after each local-SGD average, gossip within λ")


if __name__ == "__main__":
    main()
