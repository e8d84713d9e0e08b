#!/usr/bin/env python3
"""CUDA ranks against one GPU: the parity study (parity_util.PARITY_STUDY, SGD with momentum and clipping, fp32)
run by one process with device.type = "cuda" and by `mpirun` with device.type = "cuda" and parallel.comm = COMM in
every layout: dp = 2 (one bucket, several overlapped buckets, one all-reduce per tensor, ZeRO-1), tp = 2,
pp = 2 with 4 micro-batches, dp = 2 x tp = 2, dp = 2 x pp = 2, sp = 2 and dp = 2 x sp = 2 (ring attention staged
through host memory). Each must match the one-GPU run after 5 steps
with every statistic recorded every step: loss within 1e-5 relative, statistics within 1e-4 relative (mean against
the probe's rms, corr against 1), parameters within 1e-5. Also:
- the run file's layout attribute names the transport ("comm=<COMM>");
- the same layout twice gives bitwise the same statistics and checkpoint (determinism on the device);
- local SGD and gossip on CUDA ranks match the same modes on CPU ranks (MPI), replica disagreement included;
- AdamW with ZeRO-1 at dp = 2 matches the one-GPU loss;
- a ZeRO-1 dp = 2 run stopped after 3 steps resumes at tp = 2 and matches the uninterrupted run;
- compressed communication on CUDA ranks (the gradients and boundary tensors staged through host memory) against CPU
  ranks with the same scheme: dp = 2 with bf16, int8, topk and powersgd, pp = 2 with bf16 boundaries — loss within
  1e-3 relative and the recorded compression errors within 2% (the compressors see the devices' float rounding); a
  topk run repeated is bitwise identical, and a powersgd run stopped after 3 steps and resumed is bitwise the
  uninterrupted one (its error feedback checkpointed).
With COMM = "nccl" the layouts need one GPU per rank: on a machine with fewer GPUs than 4 ranks, the check instead
requires the refusal (exit 2 naming parallel.comm) and stops there. Exits 77 (skipped) when this proplab has no CUDA
backend or the machine has no GPU.

usage: check_cuda_parity.py PROPLAB MPIEXEC WORKDIR COMM
"""
import os
import sys

import h5py
import numpy as np

from parity_util import (PARITY_STUDY, compare_checkpoints, compare_losses, compare_runs, finish, identical_runs,
                         mpi_env, mpirun_cmd, run, write_study)

SGD = 'optimizer = "sgd"\nmomentum = 0.9\ngrad_clip = 0.5'
ADAMW = 'optimizer = "adamw"\nweight_decay = 0.1'
STAT_TOL = 1e-4
SKIP = 77

LAYOUTS = [
    ("dp=2", 2, ["parallel.dp=2"]),
    ("dp=2 buckets", 2, ["parallel.dp=2", "parallel.bucket_mb=0.01"]),
    ("dp=2 per-tensor", 2, ["parallel.dp=2", "parallel.bucket_mb=0"]),
    ("dp=2 zero=1", 2, ["parallel.dp=2", "parallel.zero=1"]),
    ("tp=2", 2, ["parallel.tp=2"]),
    ("pp=2", 2, ["parallel.pp=2", "parallel.microbatches=4"]),
    ("dp=2 tp=2", 4, ["parallel.dp=2", "parallel.tp=2"]),
    ("dp=2 pp=2", 4, ["parallel.dp=2", "parallel.pp=2", "parallel.microbatches=2"]),
    ("sp=2", 2, ["parallel.sp=2"]),
    ("dp=2 sp=2", 4, ["parallel.dp=2", "parallel.sp=2"]),
]


def folder(work, name):
    return os.path.join(work, name.replace(" ", "-").replace("=", ""))


def main():
    proplab, mpiexec, work, comm = sys.argv[1:5]
    env = mpi_env()
    failures = []
    cuda = ["device.type=cuda", "parallel.comm=" + comm]

    study = write_study(os.path.join(work, "parity.toml"), PARITY_STUDY.replace("{optimizer}", SGD))
    single = os.path.join(work, "single")
    probe = run([proplab, "run", study, "--out", single, "--force", "--set", "device.type=cuda"], env, allowed=(2,))
    if "no CUDA backend" in probe or "no CUDA GPU" in probe:
        print("skipped: " + probe.strip().splitlines()[-1])
        sys.exit(SKIP)
    if "completed" not in probe:
        sys.exit("the one-GPU run did not complete:\n" + probe)
    s_run, s_ckpt = os.path.join(single, "parity.h5"), os.path.join(single, "parity.ckpt.h5")

    def mpirun(ranks, sets, out, extra=(), allowed=(), study_path=study):
        return run(mpirun_cmd(mpiexec, ranks, proplab, study_path, sets) + ["--out", out] + list(extra), env, allowed)

    if comm == "nccl":
        # One GPU per rank: where a node has fewer GPUs than ranks, the layout is refused before anything is written.
        out = folder(work, "nccl-probe")
        log = mpirun(4, cuda + ["parallel.dp=4"], out, ["--force"], allowed=(2,))
        if "more ranks than GPUs" in log:
            if 'parallel.comm = "nccl"' not in log or os.path.exists(os.path.join(out, "parity.h5")):
                failures.append("the refusal of 4 ranks on fewer GPUs does not name parallel.comm or wrote a file:\n"
                                + log)
            finish(failures, "nccl: fewer GPUs than 4 ranks on this machine: refused with exit 2 naming "
                             "parallel.comm; the layouts need one GPU per rank (run with COMM = staged here)")
            return

    compared = []
    for name, ranks, sets in LAYOUTS:
        out = folder(work, name)
        log = mpirun(ranks, cuda + sets, out, ["--force"])
        if log.count("proplab: parity: completed") != 1:
            failures.append("%s: expected one final line from rank 0, got:\n%s" % (name, log))
            continue
        run_file = os.path.join(out, "parity.h5")
        with h5py.File(run_file, "r") as f:
            layout = f.attrs["layout"].decode() if "layout" in f.attrs else ""
        if "comm=" + comm not in layout:
            failures.append("%s: run file layout %r does not name comm=%s" % (name, layout, comm))
        compare_runs(s_run, run_file, name, failures, stat_tol=STAT_TOL)
        compare_checkpoints(s_ckpt, os.path.join(out, "parity.ckpt.h5"), name, failures)
        compared.append(name)

    # Determinism on the device: the same layout again gives the same bits.
    again = folder(work, "dp=2 buckets again")
    mpirun(2, cuda + ["parallel.dp=2", "parallel.bucket_mb=0.01"], again, ["--force"])
    identical_runs(folder(work, "dp=2 buckets"), again, "dp=2 buckets repeated", failures)

    # Local SGD and gossip: CUDA ranks against CPU ranks in the same mode.
    for mode, sets in (("gossip", ["parallel.dp_mode=gossip"]),
                       ("local_sgd", ["parallel.dp_mode=local_sgd", "parallel.sync_every=2"])):
        on_gpu, on_cpu = folder(work, mode + "-cuda"), folder(work, mode + "-cpu")
        mpirun(2, cuda + ["parallel.dp=2"] + sets, on_gpu, ["--force"])
        mpirun(2, ["device.type=cpu", "parallel.dp=2"] + sets, on_cpu, ["--force"])
        a, b = os.path.join(on_cpu, "parity.h5"), os.path.join(on_gpu, "parity.h5")
        compare_runs(a, b, mode, failures, stat_tol=STAT_TOL)
        with h5py.File(a, "r") as x, h5py.File(b, "r") as y:
            for path in ("replicas/disagreement_total", "replicas/disagreement_before_mix_total"):
                u, v = x[path][()], y[path][()]
                if u.shape != v.shape or not np.all(np.abs(u - v) <= STAT_TOL * np.abs(u) + 1e-9):
                    failures.append("%s: /%s CPU %s vs CUDA %s" % (mode, path, u.ravel(), v.ravel()))
                elif path.endswith("before_mix_total") and not np.any(u > 0):
                    failures.append("%s: /%s is zero on every step: the replicas never disagreed" % (mode, path))

    # Compressed communication: CUDA ranks against CPU ranks with the same scheme.
    schemes = [("dp=2 " + s, ["parallel.dp=2", "parallel.compress=" + s], "compression/error_total")
               for s in ("bf16", "int8", "topk", "powersgd")]
    schemes.append(("pp=2 bf16", ["parallel.pp=2", "parallel.microbatches=4", "parallel.pp_compress=bf16"],
                    "compression/boundaries/activation_error"))
    for name, sets, errors in schemes:
        on_gpu, on_cpu = folder(work, name + "-cuda"), folder(work, name + "-cpu")
        mpirun(2, cuda + sets, on_gpu, ["--force"])
        mpirun(2, ["device.type=cpu"] + sets, on_cpu, ["--force"])
        with h5py.File(os.path.join(on_cpu, "parity.h5"), "r") as x, h5py.File(os.path.join(on_gpu, "parity.h5"),
                                                                                "r") as y:
            u, v = x["train/loss"][()], y["train/loss"][()]
            if u.shape != v.shape or not np.all(np.abs(u - v) <= 1e-3 * np.abs(u)):
                failures.append("%s: loss CPU %s vs CUDA %s" % (name, u, v))
            u, v = x[errors][()], y[errors][()]
            if u.shape != v.shape or not np.all(u > 0) or not np.all(np.abs(u - v) <= 2e-2 * u):
                failures.append("%s: /%s CPU %s vs CUDA %s" % (name, errors, u.ravel(), v.ravel()))
    again = folder(work, "dp=2 topk again")
    mpirun(2, cuda + ["parallel.dp=2", "parallel.compress=topk"], again, ["--force"])
    identical_runs(folder(work, "dp=2 topk-cuda"), again, "dp=2 topk repeated on CUDA ranks", failures)
    out = folder(work, "powersgd-resumed")
    mpirun(2, cuda + ["parallel.dp=2", "parallel.compress=powersgd"], out, ["--force", "--stop-after", "3"],
           allowed=(4,))
    resumed = mpirun(2, cuda + ["parallel.dp=2", "parallel.compress=powersgd"], out, ["--resume"])
    if "resuming at step 3" not in resumed or "afresh" in resumed:
        failures.append("powersgd on CUDA ranks did not resume at step 3 with its state:\n" + resumed)
    identical_runs(folder(work, "dp=2 powersgd-cuda"), out, "dp=2 powersgd resumed on CUDA ranks", failures)

    # AdamW with ZeRO-1: the loss.
    adamw = write_study(os.path.join(work, "parity-adamw.toml"), PARITY_STUDY.replace("{optimizer}", ADAMW))
    adamw_single = folder(work, "adamw-single")
    run([proplab, "run", adamw, "--out", adamw_single, "--force", "--set", "device.type=cuda"], env)
    adamw_zero = folder(work, "adamw-dp2-zero1")
    mpirun(2, cuda + ["parallel.dp=2", "parallel.zero=1"], adamw_zero, ["--force"], study_path=adamw)
    compare_losses(os.path.join(adamw_single, "parity.h5"), os.path.join(adamw_zero, "parity.h5"), "adamw zero=1",
                   failures)

    # Resume across layouts on the device: ZeRO-1 dp = 2 stopped after 3 steps, resumed at tp = 2.
    out = folder(work, "resume-zero-then-tp")
    mpirun(2, cuda + ["parallel.dp=2", "parallel.zero=1"], out, ["--force", "--stop-after", "3"], allowed=(4,))
    resumed = mpirun(2, cuda + ["parallel.tp=2"], out, ["--resume"])
    if "resuming at step 3" not in resumed:
        failures.append("zero=1 dp=2 then tp=2: did not resume at step 3:\n" + resumed)
    compare_runs(s_run, os.path.join(out, "parity.h5"), "zero=1 dp=2 then tp=2", failures, stat_tol=STAT_TOL)
    compare_checkpoints(s_ckpt, os.path.join(out, "parity.ckpt.h5"), "zero=1 dp=2 then tp=2", failures)

    finish(failures, "comm=%s: %d CUDA layouts match the one-GPU run (loss 1e-5, statistics 1e-4, parameters "
                     "1e-5): %s; repeated run bitwise identical; gossip and local SGD match CPU ranks; AdamW ZeRO-1 "
                     "loss matches; ZeRO-1 dp=2 resumed at tp=2 matches; compression matches CPU ranks" % (comm, len(compared), ", ".join(compared)))


if __name__ == "__main__":
    main()
