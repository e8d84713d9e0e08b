"""What the multi-process check scripts (check_dp_parity.py, check_tp_parity.py, check_pp_parity.py,
check_replicas.py, check_fault.py) share: the environment they launch proplab in, writing a study, running a
command (one process or under mpirun) and failing with its output, comparing run files and checkpoints (within
1e-5, or bitwise), and reporting the failures. ctest runs the scripts with this folder on sys.path.
"""
import os
import subprocess
import sys
import textwrap

import h5py
import numpy as np

# The study of the data- and tensor-parallel parity checks; {optimizer} takes the [train] optimizer lines.
PARITY_STUDY = textwrap.dedent("""\
    name = "parity"
    seed = 3
    [model]
    type = "transformer"
    layers = 2
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
    lr = 3e-3
    warmup = 1
    {optimizer}
    eval_every = 5
    [record]
    every = 1
    [device]
    threads = 1
    """)

TOL = 1e-5


def mpi_env():
    """The environment for proplab under mpirun: one OpenMP thread per rank, and Open MPI allowed to run as root."""
    return dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")


def write_study(path, text):
    """Writes a study file (creating its folder) and returns its path."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    return path


def sets_of(options):
    """`--set` arguments for each of the key=value options."""
    out = []
    for s in options:
        out += ["--set", s]
    return out


def mpirun_cmd(mpiexec, ranks, proplab, study, sets=()):
    """The command that runs `study` on `ranks` processes with the given --set options (add --out and the rest)."""
    return [mpiexec, "-np", str(ranks), "--oversubscribe", proplab, "run", study] + sets_of(sets)


def run(cmd, env, allowed=()):
    """Runs a command and returns its output; exits with the output when its status is neither 0 nor allowed."""
    result = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    if result.returncode != 0 and result.returncode not in allowed:
        sys.exit("command failed (%d): %s\n%s" % (result.returncode, " ".join(cmd), result.stdout))
    return result.stdout


def close(a, b, scale, tol=TOL):
    return np.all(np.abs(a - b) <= tol * scale)


def compare_losses(single, parallel, label, failures, dataset="train/loss", what="loss"):
    """The losses of two run files within 1e-5 relative."""
    with h5py.File(single, "r") as s, h5py.File(parallel, "r") as p:
        a, b = s[dataset][()], p[dataset][()]
        if a.shape != b.shape or not close(a, b, np.abs(a)):
            failures.append("%s: %s %s vs %s" % (label, what, a, b))


def compare_runs(single, parallel, label, failures, skip_params=(), stat_tol=TOL):
    """Two run files: the status, the loss (within 1e-5 relative), every forward/backward statistic (mean within
    stat_tol of the probe's rms, corr within stat_tol of 1, the rest relative; stat_tol 1e-5 unless given) and the
    parameter statistics (stat_tol relative)."""
    with h5py.File(single, "r") as s, h5py.File(parallel, "r") as p:
        if p.attrs["status"].decode() != "completed":
            failures.append("%s: status %s" % (label, p.attrs["status"].decode()))
        loss_s, loss_p = s["train/loss"][()], p["train/loss"][()]
        if loss_s.shape != loss_p.shape or not close(loss_s, loss_p, np.abs(loss_s)):
            failures.append("%s: loss %s vs %s" % (label, loss_s, loss_p))
        for direction in ("forward", "backward"):
            rms = s[direction + "/rms"][()]
            for stat in s[direction]:
                a, b = s[direction][stat][()], p[direction][stat][()]
                if stat == "mean":
                    scale = np.abs(rms)
                elif stat == "corr":
                    scale = np.ones_like(a)
                else:
                    scale = np.abs(a)
                both_nan = np.isnan(a) & np.isnan(b)
                ok = both_nan | (np.abs(a - b) <= stat_tol * scale + 1e-30)
                if not np.all(ok):
                    where = np.argwhere(~ok)[0]
                    failures.append("%s: /%s/%s[%d, %d] %r vs %r" % (label, direction, stat, where[0], where[1],
                                                                    a[tuple(where)], b[tuple(where)]))
        for stat in s["params"]:
            if stat == "name" or stat in skip_params:
                continue
            a, b = s["params"][stat][()], p["params"][stat][()]
            if not close(a, b, np.abs(a) + 1e-12, stat_tol):
                failures.append("%s: /params/%s differs (max rel %g)" % (label, stat,
                                                                         np.max(np.abs(a - b) / (np.abs(a) + 1e-12))))


def compare_checkpoints(single, parallel, label, failures, prefixes=("tensors/param",)):
    """Two checkpoints' tensors under `prefixes`, within 1e-5."""
    with h5py.File(single, "r") as s, h5py.File(parallel, "r") as p:
        def visit(name, node):
            if isinstance(node, h5py.Dataset) and name.startswith(prefixes):
                if name not in p or p[name].shape != node.shape:
                    failures.append("%s: %s missing or of another shape" % (label, name))
                    return
                a, b = node[()], p[name][()]
                # Parameters elementwise; optimizer state (sums of gradients whose small elements carry the
                # summation order's rounding, ~1e-8 absolute) against the tensor's largest element.
                scale = np.maximum(np.abs(a), 1e-3) if name.startswith("tensors/param") else np.max(np.abs(a))
                if not close(a, b, scale):
                    failures.append("%s: %s differs (max abs %g)" % (label, name, np.max(np.abs(a - b))))
        s.visititems(visit)


def identical_runs(a, b, label, failures):
    """Bitwise, for two output folders of the parity study: the loss, every statistic and every checkpointed
    tensor."""
    with h5py.File(os.path.join(a, "parity.h5"), "r") as x, h5py.File(os.path.join(b, "parity.h5"), "r") as y:
        paths = ["train/loss"] + ["%s/%s" % (d, k) for d in ("forward", "backward", "params") for k in x[d]]
        for path in paths:
            u, v = x[path][()], y[path][()]
            if u.dtype.kind == "f" and not np.array_equal(u, v, equal_nan=True) or u.dtype.kind != "f" and not \
                    np.array_equal(u, v):
                failures.append("%s: /%s not bitwise identical" % (label, path))
    with h5py.File(os.path.join(a, "parity.ckpt.h5"), "r") as x, h5py.File(os.path.join(b, "parity.ckpt.h5"), "r") as y:
        def visit(name, node):
            if isinstance(node, h5py.Dataset) and name.startswith("tensors/") and not np.array_equal(node[()],
                                                                                                   y[name][()]):
                failures.append("%s: %s not bitwise identical" % (label, name))
        x.visititems(visit)


def finish(failures, summary):
    """Prints the failures and exits 1 when there are any; prints the summary otherwise."""
    for f in failures:
        print(f)
    if failures:
        sys.exit(1)
    print(summary)
