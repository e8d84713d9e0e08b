#!/usr/bin/env python3
"""Fault: under `mpirun -np 2 proplab run` with [parallel] dp = 2 and timeout_s = 3, rank 1 is stopped (SIGSTOP)
mid-run, or with --exit, ends (SIGKILL: a rank that exits early). Rank 0's next collective must time out: the job
ends within timeout_s plus a margin (exit status 5, from rank 0's MPI_Abort; with --exit mpirun reports rank 1's
death instead, 137) with a message naming the operation, and the run file is
readable with status "failed" and that message.

A rank that exits is noticed by Open MPI's mpirun, which by default kills the whole job at once, before rank 0's
timeout (rank 0's run file then stays "running"). With `--mca orte_abort_on_non_zero_status 0` mpirun lets the
other ranks run on after a rank exits with a non-zero status or by a signal (not after an exit with status 0
without MPI_Finalize, which it always treats as fatal): the --exit case launches with it.

With --set KEY=VALUE options (e.g. device.type=cuda parallel.comm=staged: CUDA ranks, whose collectives on device
buffers time out the same way) the run gets them too; exit 77 (skipped) when such a run is refused because this
proplab has no CUDA backend or the machine no GPU.

usage: check_fault.py PROPLAB MPIEXEC WORKDIR [--exit] [--set KEY=VALUE ...]
"""
import os
import signal
import subprocess
import sys
import textwrap
import time

import h5py

from parity_util import finish, mpi_env, write_study

STUDY = textwrap.dedent("""\
    name = "fault"
    seed = 1
    [model]
    type = "transformer"
    layers = 2
    width = 32
    heads = 2
    vocab = 32
    seq_len = 16
    [train]
    steps = 1000000
    batch = 8
    eval_every = 0
    checkpoint_every = 0
    [record]
    every = 5
    [parallel]
    dp = 2
    timeout_s = 3
    [device]
    threads = 1
    """)
TIMEOUT_S = 3.0
MARGIN_S = 20.0


def rank_pids(study):
    """The proplab processes running `study` (its full path: the stalled- and exited-rank checks may run at the same
    time, each with its own folder), by their Open MPI world rank."""
    ranks = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/environ" % pid, "rb") as f:
                env = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if b"OMPI_COMM_WORLD_RANK" in env and b"proplab" in cmdline and study.encode() in cmdline:
            ranks[int(env[b"OMPI_COMM_WORLD_RANK"])] = int(pid)
    return ranks


def main():
    proplab, mpiexec, work = sys.argv[1:4]
    exits = "--exit" in sys.argv[4:]
    sets = []
    for i, arg in enumerate(sys.argv[4:], start=4):
        if arg == "--set":
            sets += ["--set", sys.argv[i + 1]]
    study = write_study(os.path.join(work, "fault.toml"), STUDY)
    run_file = os.path.join(work, "out", "fault.h5")
    env = mpi_env()
    launch = [mpiexec, "-np", "2", "--oversubscribe"]
    if exits:
        launch += ["--mca", "orte_abort_on_non_zero_status", "0"]
    job = subprocess.Popen(launch + [proplab, "run", study, "--out", os.path.join(work, "out"), "--force"] + sets,
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    failures = []
    deadline = time.time() + 120
    ranks = {}
    while time.time() < deadline and job.poll() is None and (len(ranks) < 2 or not os.path.exists(run_file)):
        time.sleep(0.2)
        ranks = rank_pids(study)
    if len(ranks) < 2 or not os.path.exists(run_file):
        job.kill()
        output = job.communicate()[0]
        if sets and ("no CUDA backend" in output or "no CUDA GPU" in output):
            print("skipped: the run was refused: " + next(line for line in output.splitlines() if "CUDA" in line))
            sys.exit(77)
        sys.exit("the job did not start: ranks %s, run file %s\n%s" % (ranks, os.path.exists(run_file), output))
    time.sleep(2.0)  # a few steps in
    os.kill(ranks[1], signal.SIGKILL if exits else signal.SIGSTOP)
    stopped = time.time()
    try:
        output, _ = job.communicate(timeout=TIMEOUT_S + MARGIN_S)
    except subprocess.TimeoutExpired:
        os.kill(ranks[1], signal.SIGKILL)
        job.kill()
        sys.exit("the job did not end within timeout_s + %g s after rank 1 %s:\n%s" % (
            MARGIN_S, "exited" if exits else "stalled", job.communicate()[0]))
    ended = time.time() - stopped
    try:
        os.kill(ranks[1], signal.SIGKILL)
    except ProcessLookupError:
        pass
    # mpirun reports the first rank that ended abnormally: rank 0's MPI_Abort (5), or with --exit rank 1's SIGKILL.
    expected_status = 128 + signal.SIGKILL if exits else 5
    if job.returncode != expected_status:
        failures.append("exit status %d, expected %d" % (job.returncode, expected_status))
    # (MPI names the world rank; NCCL the rank within the communicator whose collective waited)
    if "did not complete within timeout_s = 3 s on" not in output:
        failures.append("no timeout message from rank 0 in:\n" + output)
    if ended < TIMEOUT_S:
        failures.append("ended %.1f s after the stall, before the timeout" % ended)
    with h5py.File(run_file, "r") as f:
        status = f.attrs["status"].decode()
        detail = f.attrs["status_detail"].decode()
        rows = f["train/loss"].shape[0]
    if status != "failed" or "did not complete within timeout_s" not in detail:
        failures.append("run file status %r, detail %r" % (status, detail))
    if rows < 1:
        failures.append("no training rows were flushed before the fault")
    finish(failures, "rank 1 %s; the job ended %.1f s later (timeout_s = 3) with exit %d; run file failed after %d "
           "steps: %s" % ("exited (SIGKILL)" if exits else "stalled (SIGSTOP)", ended, job.returncode, rows, detail))


if __name__ == "__main__":
    main()
