#!/usr/bin/env python3
"""Compressed communication end to end ([parallel] compress and pp_compress, docs/distributed.md).

- Bytes: bench_dist --check on a small transformer counts every byte the layout's communicators are handed per
  step and requires it to equal the documented formula: dp = 2 with each compressor, dp = 4 with topk and
  powersgd, pp = 2 with bf16 and int8 boundaries, and (uncompressed) sequence parallelism at sp = 2 and 4: ring
  attention's transfers, the gradient exchange over the dp·sp ranks and the loss.
- Run files: dp = 2 with each compressor records /compression (error and residual per parameter and in total,
  every recorded step) and names the scheme in the layout; bf16 and int8 stay within their rounding of the
  uncompressed run and keep no residual, topk and powersgd keep one; a repeated topk run is bitwise identical;
  pp = 2 with bf16 boundaries records each boundary's activation and gradient error.
- `proplab inspect` shows the scheme and the last record's errors.
- Resume: topk and powersgd runs stopped after 3 steps and resumed keep their /compression rows and their error
  feedback (bitwise the uninterrupted runs); under another layout the state starts afresh with a note.
- Sweeps: points of several processes run under `proplab sweep --mpirun`, and are refused without it.
- Refusals: a compressor without replicas, pp_compress without stages, powersgd's rank above a matrix's smaller
  side and compression with ZeRO-1 end with exit status 2 naming the key, before any run file is written.

usage: check_compression.py PROPLAB BENCH_DIST MPIEXEC WORKDIR
"""
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np

from parity_util import PARITY_STUDY, mpi_env, mpirun_cmd, run, write_study

SMALL = ["model.width=32", "model.seq_len=16", "model.vocab=32", "model.heads=2", "model.layers=3"]
SCHEMES = ["bf16", "int8", "topk", "powersgd"]


def sets(options):
    out = []
    for s in options:
        out += ["--set", s]
    return out


def main():
    proplab, bench, mpiexec, work = sys.argv[1:5]
    env = mpi_env()
    failures = []

    # Bytes per step against the formulas.
    layouts = [(2, ["parallel.dp=2", "parallel.compress=" + s]) for s in SCHEMES]
    layouts += [(4, ["parallel.dp=4", "parallel.compress=topk", "parallel.compress_ratio=0.05"]),
                (4, ["parallel.dp=4", "parallel.compress=powersgd", "parallel.compress_rank=2"])]
    layouts += [(2, ["parallel.pp=2", "parallel.microbatches=4", "parallel.pp_compress=" + s]) for s in ("bf16", "int8")]
    layouts += [(2, ["parallel.sp=2"]), (4, ["parallel.sp=4"])]
    for ranks, options in layouts:
        result = run([mpiexec, "-np", str(ranks), "--oversubscribe", bench, "--steps", "6", "--threads", "1", "--check",
                      "--out", os.path.join(work, "bench")] + sets(SMALL + options), env, allowed=(1,))
        if "formula" not in result or "differ" in result:
            failures.append("bytes, %s:\n%s" % (" ".join(options), result))

    study = write_study(os.path.join(work, "study.toml"), PARITY_STUDY.replace(
        "{optimizer}", 'optimizer = "sgd"\nmomentum = 0.9\ngrad_clip = 0').replace("layers = 2", "layers = 3"))
    base = os.path.join(work, "none")
    run(mpirun_cmd(mpiexec, 2, proplab, study, ["parallel.dp=2"]) + ["--out", base, "--force"], env)
    with h5py.File(os.path.join(base, "parity.h5"), "r") as f:
        base_loss = f["train/loss"][()]
        n_params = len(f["params/name"])
        if "compression" in f:
            failures.append("compress = none wrote /compression")
    for scheme in SCHEMES:
        out = os.path.join(work, scheme)
        run(mpirun_cmd(mpiexec, 2, proplab, study, ["parallel.dp=2", "parallel.compress=" + scheme]) +
            ["--out", out, "--force"], env)
        with h5py.File(os.path.join(out, "parity.h5"), "r") as f:
            label = "dp=2 " + scheme
            if f.attrs["status"].decode() != "completed":
                failures.append("%s: status %s" % (label, f.attrs["status"].decode()))
            if ("compress=" + scheme) not in f.attrs["layout"].decode():
                failures.append("%s: layout %s" % (label, f.attrs["layout"].decode()))
            c = f["compression"]
            if list(c["steps"][()]) != [0, 1, 2, 3, 4]:
                failures.append("%s: /compression/steps %s" % (label, c["steps"][()]))
            for name, width in (("error", n_params), ("residual", n_params), ("error_total", 1),
                                ("residual_total", 1)):
                if c[name].shape != (5, width):
                    failures.append("%s: /compression/%s of shape %s" % (label, name, c[name].shape))
            error, residual = c["error_total"][()][:, 0], c["residual_total"][()][:, 0]
            loss = f["train/loss"][()]
            if scheme in ("bf16", "int8"):
                # bf16 rounds each element by at most 2^-9 of itself; int8 by half a step of max|x|/127 per block
                bound = 2.0 ** -9 if scheme == "bf16" else 0.05
                if not (np.all(error > 0) and np.all(error < bound)):
                    failures.append("%s: error %s outside (0, %g)" % (label, error, bound))
                if np.any(residual != 0):
                    failures.append("%s: a residual %s without error feedback" % (label, residual))
                if not np.all(np.abs(loss - base_loss) <= 1e-3 * np.abs(base_loss)):
                    failures.append("%s: loss %s against uncompressed %s" % (label, loss, base_loss))
            else:
                if not (np.all(residual > 0) and np.all(error > 0) and np.all(error <= 1.0 + 1e-9)):
                    failures.append("%s: error %s, residual %s" % (label, error, residual))

    # A repeated run: bitwise the same.
    again = os.path.join(work, "topk-again")
    run(mpirun_cmd(mpiexec, 2, proplab, study, ["parallel.dp=2", "parallel.compress=topk"]) +
        ["--out", again, "--force"], env)
    with h5py.File(os.path.join(work, "topk", "parity.h5"), "r") as a, \
            h5py.File(os.path.join(again, "parity.h5"), "r") as b:
        for path in ("train/loss", "compression/error", "compression/residual", "forward/var", "backward/var"):
            if not np.array_equal(a[path][()], b[path][()], equal_nan=True):  # (a probe's var may be NaN)
                failures.append("topk repeated: %s differs" % path)

    # Pipeline boundaries.
    pp_sets = ["parallel.pp=2", "parallel.microbatches=4"]
    pp_none, pp_bf16 = os.path.join(work, "pp-none"), os.path.join(work, "pp-bf16")
    run(mpirun_cmd(mpiexec, 2, proplab, study, pp_sets) + ["--out", pp_none, "--force"], env)
    run(mpirun_cmd(mpiexec, 2, proplab, study, pp_sets + ["parallel.pp_compress=bf16"]) +
        ["--out", pp_bf16, "--force"], env)
    with h5py.File(os.path.join(pp_none, "parity.h5"), "r") as a, h5py.File(os.path.join(pp_bf16, "parity.h5"), "r") as b:
        g = b["compression/boundaries"]
        for name in ("activation_error", "gradient_error"):
            e = g[name][()]
            if e.shape != (5, 1) or not (np.all(e > 0) and np.all(e < 2.0 ** -9)):
                failures.append("pp bf16: /compression/boundaries/%s = %s" % (name, e))
        if list(g["steps"][()]) != [0, 1, 2, 3, 4]:
            failures.append("pp bf16: boundary steps %s" % g["steps"][()])
        la, lb = a["train/loss"][()], b["train/loss"][()]
        if not np.all(np.abs(la - lb) <= 1e-3 * np.abs(la)):
            failures.append("pp bf16: loss %s against %s" % (lb, la))
        if "pp_compress=bf16" not in b.attrs["layout"].decode():
            failures.append("pp bf16: layout %s" % b.attrs["layout"].decode())

    # `proplab inspect` says what compression did.
    shown = run([proplab, "inspect", os.path.join(work, "topk", "parity.h5")], env)
    if "compression: topk(ratio=0.01): relative error" not in shown or "at step 4 (5 records)" not in shown:
        failures.append("inspect of the topk run:\n" + shown)
    shown = run([proplab, "inspect", os.path.join(pp_bf16, "parity.h5")], env)
    if "pp_compress: bf16: boundary 0 activations" not in shown:
        failures.append("inspect of the pp bf16 run:\n" + shown)

    # Resume keeps the history and the error feedback: a stopped and resumed run is bitwise the uninterrupted one.
    for scheme in ("topk", "powersgd"):
        moved = os.path.join(work, scheme + "-resumed")
        command = mpirun_cmd(mpiexec, 2, proplab, study, ["parallel.dp=2", "parallel.compress=" + scheme])
        run(command + ["--out", moved, "--force", "--stop-after", "3"], env, allowed=(4,))
        resumed = run(command + ["--out", moved, "--resume"], env)
        if "resuming at step 3" not in resumed or "afresh" in resumed:
            failures.append("%s resume did not resume at step 3 with its state:\n%s" % (scheme, resumed))
        with h5py.File(os.path.join(moved, "parity.h5"), "r") as f, \
                h5py.File(os.path.join(work, scheme, "parity.h5"), "r") as whole:
            if list(f["compression/steps"][()]) != [0, 1, 2, 3, 4] or f["compression/error"].shape[0] != 5:
                failures.append("%s resumed: /compression/steps %s" % (scheme, f["compression/steps"][()]))
            for path in ("train/loss", "compression/error", "compression/residual", "forward/var", "backward/var",
                         "params/grad_rms"):
                if not np.array_equal(f[path][()], whole[path][()], equal_nan=True):
                    failures.append("%s resumed: %s differs from the uninterrupted run" % (scheme, path))
    # Under another layout the state starts afresh, said once, and the run goes on: a topk checkpoint resumed with
    # powersgd, and as one process without compression.
    stopped, alone = os.path.join(work, "topk-then-powersgd"), os.path.join(work, "topk-then-one-process")
    run(mpirun_cmd(mpiexec, 2, proplab, study, ["parallel.dp=2", "parallel.compress=topk"]) +
        ["--out", stopped, "--force", "--stop-after", "3"], env, allowed=(4,))
    shutil.rmtree(alone, ignore_errors=True)
    shutil.copytree(stopped, alone)
    resumed = run(mpirun_cmd(mpiexec, 2, proplab, study, ["parallel.dp=2", "parallel.compress=powersgd"]) +
                  ["--out", stopped, "--resume"], env)
    if resumed.count("the powersgd error feedback starts afresh: the checkpoint was written under another layout "
                     "(dp=2 tp=1 pp=1 compress=topk(ratio=0.01) ranks=2)") != 1 or "completed" not in resumed:
        failures.append("powersgd resumed from topk: expected one note and completion, got:\n" + resumed)
    resumed = run([proplab, "run", study, "--out", alone, "--resume"], env)
    if "resuming at step 3" not in resumed or "completed" not in resumed:
        failures.append("one process resumed from topk:\n" + resumed)

    # Refusals: exit 2, the key named, no run file.
    refusals = [
        (1, ["parallel.compress=topk"], "parallel.compress = \"topk\""),
        (1, ["parallel.pp_compress=int8"], "parallel.pp_compress = \"int8\""),
        (2, ["parallel.dp=2", "parallel.compress=powersgd", "parallel.compress_rank=40"], "parallel.compress_rank = 40"),
        (2, ["parallel.dp=2", "parallel.compress=int8", "parallel.zero=1"], "parallel.compress = \"int8\""),
    ]
    for ranks, options, words in refusals:
        out = os.path.join(work, "refused")
        cmd = ([proplab, "run", study] + sets(options) if ranks == 1 else mpirun_cmd(mpiexec, ranks, proplab, study, options))
        result = subprocess.run(cmd + ["--out", out, "--force"], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, timeout=300)
        # (under mpirun the job's status is the first failing rank's: 2)
        if result.returncode != 2 or words not in result.stdout or os.path.exists(os.path.join(out, "parity.h5")):
            failures.append("refusal %s: exit %d\n%s" % (" ".join(options), result.returncode, result.stdout))

    # A sweep of data-parallel points: refused without a launcher (exit 2, nothing run), run under it with one.
    sweep_study = write_study(os.path.join(work, "sweep.toml"), open(study).read().replace(
        'name = "parity"', 'name = "swept"') + '[parallel]\ndp = 2\n[sweep]\ngrid = { "parallel.compress" = ["none", "int8"] }\n')
    swept = os.path.join(work, "swept")
    shutil.rmtree(swept, ignore_errors=True)  # (a rerun starts from nothing: the refusal must write nothing)
    refused = subprocess.run([proplab, "sweep", sweep_study, "--out", swept], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, timeout=300)
    if refused.returncode != 2 or "needs 2 processes" not in refused.stdout or os.path.exists(swept):
        failures.append("sweep without --mpirun: exit %d\n%s" % (refused.returncode, refused.stdout))
    run([proplab, "sweep", sweep_study, "--out", swept, "--mpirun", mpiexec + " --oversubscribe"], env)
    for name, scheme in (("compress=none", None), ("compress=int8", "int8")):
        with h5py.File(os.path.join(swept, name + ".h5"), "r") as f:
            layout = f.attrs["layout"].decode()
            if f.attrs["status"].decode() != "completed" or not layout.startswith("dp=2") or \
                    (scheme is not None) != ("compression" in f):
                failures.append("sweep point %s: %s, layout %s" % (name, f.attrs["status"].decode(), layout))

    if failures:
        print("\n".join(failures))
        sys.exit(1)
    print("check_compression: bytes equal the formulas for %d layouts; run files, determinism, pipeline boundaries, "
          "resume and refusals as documented" % len(layouts))


if __name__ == "__main__":
    main()
