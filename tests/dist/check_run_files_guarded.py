#!/usr/bin/env python3
"""Run files under mpirun: one writer per run file, and an I/O failure on rank 0 that stops every rank.

1. While `mpirun -np 2 proplab run` (dp = 2) writes a run, a second `mpirun -np 2 ... --resume` into the same output
   ends with exit status 2 at once, naming rank 0's process id; so does a plain one-process `--force`. The first job
   goes on and stops cleanly on SIGINT (its run file says interrupted).
2. Rank 0's disk fills right after the checkpoint of step 10 (tests/support/write_fault.c, preloaded in every rank):
   the job ends with exit status 6, one message (from rank 0) says what failed and how to continue, every record in
   the run file equals the undisturbed dp = 2 run's bit for bit, and `--resume` under mpirun completes to exactly the
   undisturbed run file.
3. With train.final_checkpoint = false (and no periodic checkpoints) the dp = 2 job completes without a checkpoint,
   its records the undisturbed run's bit for bit.

usage: check_run_files_guarded.py PROPLAB MPIEXEC WORKDIR WRITE_FAULT_LIBRARY
"""
import os
import signal
import subprocess
import sys
import textwrap
import time

import h5py
import numpy as np

from parity_util import finish, mpi_env, write_study

STUDY = textwrap.dedent("""\
    name = "guarded"
    seed = 4
    [model]
    type = "transformer"
    layers = 1
    width = 16
    heads = 2
    vocab = 16
    seq_len = 8
    [data]
    kind = "markov"
    [train]
    steps = 40
    batch = 8
    eval_every = 10
    checkpoint_every = 10
    [record]
    every = 1
    [parallel]
    dp = 2
    [device]
    threads = 1
    """)


def series(path):
    """Every record series and training column but the timing ones, as arrays."""
    out = {}
    with h5py.File(path, "r", swmr=True) as f:
        for name in ("steps", "train/step", "train/loss", "train/lr", "train/grad_norm", "eval/step", "eval/loss"):
            out[name] = f[name][()]
        for group in ("forward", "backward", "params"):
            for key in f[group]:
                if f[group][key].ndim == 2:
                    out[group + "/" + key] = f[group][key][()]
    return out


def same(a, b):
    return a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")


def main():
    proplab, mpiexec, work, fault_library = sys.argv[1:5]
    env = mpi_env()
    failures = []
    study = write_study(os.path.join(work, "guarded.toml"), STUDY)
    endless = write_study(os.path.join(work, "endless.toml"), STUDY.replace("steps = 40", "steps = 100000000"))
    launch = [mpiexec, "-np", "2", "--oversubscribe"]

    # 1. One writer per run file.
    out = os.path.join(work, "endless")
    job = subprocess.Popen(launch + [proplab, "run", endless, "--out", out, "--force"], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lock = os.path.join(out, "guarded.lock")
    deadline = time.time() + 120
    while time.time() < deadline and not (os.path.exists(os.path.join(out, "guarded.h5")) and os.path.exists(lock)):
        time.sleep(0.1)
    try:
        with open(lock) as f:
            holder = f.read().split("\n")[0]
    except OSError:
        job.kill()
        sys.exit("the first job did not take its lock:\n" + job.communicate()[0])
    for label, command in (("mpirun --resume", launch + [proplab, "run", endless, "--out", out, "--resume"]),
                           ("one process --force", [proplab, "run", endless, "--out", out, "--force",
                                                    "--set", "parallel.dp=1"])):
        started = time.time()
        second = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                timeout=120)
        if second.returncode != 2:
            failures.append("%s: exit %d, expected 2:\n%s" % (label, second.returncode, second.stdout))
        expected = "is being written by another proplab run: process " + holder.split(" ")[1]
        if expected not in second.stdout:
            failures.append("%s: no `%s` in:\n%s" % (label, expected, second.stdout))
        if time.time() - started > 60:
            failures.append("%s: took %.0f s to be refused" % (label, time.time() - started))
    job.send_signal(signal.SIGINT)  # (mpirun passes it on, and itself exits 1 for the interrupted job)
    output, _ = job.communicate(timeout=120)
    with h5py.File(os.path.join(out, "guarded.h5"), "r") as f:
        detail = f.attrs["status_detail"].decode()
    if not detail.startswith("interrupted at step"):
        failures.append("the first job did not end interrupted (%r):\n%s" % (detail, output))

    # 2. Rank 0's disk fills after the first checkpoint.
    reference = os.path.join(work, "reference")
    subprocess.run(launch + [proplab, "run", study, "--out", reference, "--force"], env=env, check=True,
                   stdout=subprocess.DEVNULL, timeout=300)
    out = os.path.join(work, "full")
    fault_env = dict(env, LD_PRELOAD=fault_library, PROPLAB_FAULT_FILE="/full/guarded.h5", PROPLAB_FAULT_ARM_RENAME="1")
    exported = sum((["-x", name] for name in ("LD_PRELOAD", "PROPLAB_FAULT_FILE", "PROPLAB_FAULT_ARM_RENAME")), [])
    failed = subprocess.run([mpiexec] + exported + launch[1:] + [proplab, "run", study, "--out", out, "--force"],
                            env=fault_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    if failed.returncode != 6:
        failures.append("disk full: exit %d, expected 6:\n%s%s" % (failed.returncode, failed.stdout, failed.stderr))
    message = "proplab: error: guarded: I/O failure after 10 steps: No space left on device while writing the run file"
    if failed.stderr.count(message) != 1:
        failures.append("disk full: the message is not there exactly once:\n" + failed.stderr)
    if "continue with: mpirun -np 2 proplab run " not in failed.stderr:
        failures.append("disk full: no mpirun command to continue with:\n" + failed.stderr)
    written, expected = series(os.path.join(out, "guarded.h5")), series(os.path.join(reference, "guarded.h5"))
    for name, values in written.items():
        if len(values) > len(expected[name]) or not same(values, expected[name][:len(values)]):
            failures.append("disk full: /%s is not a prefix of the undisturbed run's" % name)
    if len(written["steps"]) < 10:
        failures.append("disk full: only %d records kept" % len(written["steps"]))
    resumed = subprocess.run(launch + [proplab, "run", study, "--out", out, "--resume"], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    if resumed.returncode != 0:
        failures.append("resume: exit %d:\n%s" % (resumed.returncode, resumed.stdout))
    else:
        written = series(os.path.join(out, "guarded.h5"))
        for name, values in expected.items():
            if not same(written[name], values):
                failures.append("resume: /%s differs from the undisturbed run's" % name)

    # 3. train.final_checkpoint = false under mpirun: every rank skips the final save together (it gathers), so the
    #    job completes, leaves no checkpoint, and computed what the reference did.
    out = os.path.join(work, "no_final_checkpoint")
    command = launch + [proplab, "run", study, "--out", out, "--force", "--set", "train.final_checkpoint=false",
                        "--set", "train.checkpoint_every=0"]
    plain = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    if plain.returncode != 0:
        failures.append("final_checkpoint = false: exit %d:\n%s" % (plain.returncode, plain.stdout))
    else:
        if os.path.exists(os.path.join(out, "guarded.ckpt.h5")):
            failures.append("final_checkpoint = false: the completed run left a checkpoint")
        written = series(os.path.join(out, "guarded.h5"))
        for name, values in expected.items():
            if not same(written[name], values):
                failures.append("final_checkpoint = false: /%s differs from the reference run's" % name)
    finish(failures, "one writer per run file under mpirun, and rank 0's I/O failure stops the job resumably")


if __name__ == "__main__":
    main()
