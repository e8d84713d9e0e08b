#!/usr/bin/env python3
"""Data-parallel parity: the same study run by one process and by `mpirun -np N` with [parallel] dp = N must give
the same run file (loss, every recorded statistic, parameter statistics) and the same parameters after the steps,
within 1e-5 relative (fp32); so must a dp run stopped after 3 steps and resumed by one process, local SGD
that averages the parameters every step, gossip at dp = 2 (whose ring mixing is the exact average), the bucketed
all-reduce (tiny buckets, started during backward) and ZeRO-1 (sharded optimizer state, whose checkpoint holds the
full state: a zero = 1 run resumes in one process and a one-process run resumes with zero = 1). At dp = 2 the
bucketed all-reduce is bitwise identical to one all-reduce per tensor after backward. Statistics that can sit near zero (mean, corr) are compared within 1e-5 of the
probe's rms (mean) or of 1 (corr). The full comparison uses SGD with momentum; with AdamW only the loss is held
to 1e-5: parameters whose true gradient is zero (the key bias: softmax ignores a shift shared by a row's logits)
get rounding-noise gradients that differ with the summation order, and Adam divides them by their own size, so
such parameters move by ±lr in either layout and do not agree to 1e-5.

usage: check_dp_parity.py PROPLAB MPIEXEC WORKDIR [--ranks N ...]
"""
import os
import subprocess
import sys
import textwrap

import h5py
import numpy as np

STUDY = textwrap.dedent("""\
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


def run(cmd, env, allowed=()):
    result = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    if result.returncode != 0 and result.returncode not in allowed:
        sys.exit("command failed (%d): %s\n%s" % (result.returncode, " ".join(cmd), result.stdout))
    return result.stdout


def close(a, b, scale):
    return np.all(np.abs(a - b) <= TOL * scale)


def compare_runs(single, parallel, label, failures, skip_params=()):
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
                ok = both_nan | (np.abs(a - b) <= TOL * scale + 1e-30)
                if not np.all(ok):
                    where = np.argwhere(~ok)[0]
                    failures.append("%s: /%s/%s[%d, %d] %r vs %r" % (label, direction, stat, where[0], where[1],
                                                                    a[tuple(where)], b[tuple(where)]))
        for stat in s["params"]:
            if stat == "name" or stat in skip_params:
                continue
            a, b = s["params"][stat][()], p["params"][stat][()]
            if not close(a, b, np.abs(a) + 1e-12):
                failures.append("%s: /params/%s differs (max rel %g)" % (label, stat,
                                                                         np.max(np.abs(a - b) / (np.abs(a) + 1e-12))))


def compare_checkpoints(single, parallel, label, failures, prefixes=("tensors/param",)):
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
    """Bitwise: the loss, every statistic and every checkpointed tensor."""
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


def main():
    proplab, mpiexec, work = sys.argv[1], sys.argv[2], sys.argv[3]
    ranks = [int(r) for r in sys.argv[4:]] or [2]
    os.makedirs(work, exist_ok=True)
    study = os.path.join(work, "parity.toml")
    env = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    failures = []
    for optimizer in ("sgd", "adamw"):
        with open(study, "w") as f:
            f.write(STUDY.replace("{optimizer}",
                                     # no clipping: local SGD clips each replica's own gradient
                                     'optimizer = "sgd"\nmomentum = 0.9\ngrad_clip = 0' if optimizer == "sgd" else ""))
        single = os.path.join(work, optimizer + "-single")
        run([proplab, "run", study, "--out", single, "--force"], env)
        for n in ranks:
            out = os.path.join(work, "%s-dp%d" % (optimizer, n))
            label = "%s dp=%d" % (optimizer, n)
            log = run([mpiexec, "-np", str(n), "--oversubscribe", proplab, "run", study, "--set",
                       "parallel.dp=%d" % n, "--out", out, "--force"], env)
            if log.count("proplab: parity: completed") != 1:
                failures.append("%s: expected one final line from rank 0, got:\n%s" % (label, log))
            mpirun = [mpiexec, "-np", str(n), "--oversubscribe", proplab, "run", study, "--set", "parallel.dp=%d" % n]
            # Tiny buckets (many, started during backward) against one all-reduce per tensor after backward.
            buckets, unbucketed = out + "-buckets", out + "-unbucketed"
            run(mpirun + ["--set", "parallel.bucket_mb=0.002", "--out", buckets, "--force"], env)
            run(mpirun + ["--set", "parallel.bucket_mb=0", "--out", unbucketed, "--force"], env)
            if n == 2:
                identical_runs(buckets, unbucketed, label + " bucketed vs unbucketed", failures)
            # ZeRO-1, and resuming across it both ways.
            zero = out + "-zero"
            run(mpirun + ["--set", "parallel.zero=1", "--out", zero, "--force"], env)
            zero_moved = out + "-zero-resumed"
            run(mpirun + ["--set", "parallel.zero=1", "--out", zero_moved, "--force", "--stop-after", "3"], env,
                allowed=(4,))
            run([proplab, "run", study, "--out", zero_moved, "--resume"], env)
            into_zero = out + "-into-zero"
            run([proplab, "run", study, "--out", into_zero, "--force", "--stop-after", "3"], env, allowed=(4,))
            resumed = run(mpirun + ["--set", "parallel.zero=1", "--out", into_zero, "--resume"], env)
            if "resuming at step 3" not in resumed:
                failures.append("%s: the zero = 1 run did not resume at step 3:\n%s" % (label, resumed))
            for name, where in (("zero=1", zero), ("zero=1 then resumed by one process", zero_moved),
                                ("one process then resumed with zero=1", into_zero)):
                if optimizer == "sgd":
                    compare_runs(os.path.join(single, "parity.h5"), os.path.join(where, "parity.h5"),
                                 label + " " + name, failures)
                    compare_checkpoints(os.path.join(single, "parity.ckpt.h5"), os.path.join(where, "parity.ckpt.h5"),
                                        label + " " + name, failures, prefixes=("tensors/param", "tensors/optim"))
                else:
                    with h5py.File(os.path.join(single, "parity.h5"), "r") as s, \
                            h5py.File(os.path.join(where, "parity.h5"), "r") as p:
                        a, b = s["train/loss"][()], p["train/loss"][()]
                        if a.shape != b.shape or not close(a, b, np.abs(a)):
                            failures.append("%s %s: loss %s vs %s" % (label, name, a, b))
            if optimizer == "sgd":
                compare_runs(os.path.join(single, "parity.h5"), os.path.join(out, "parity.h5"), label, failures)
                compare_runs(os.path.join(single, "parity.h5"), os.path.join(buckets, "parity.h5"),
                             label + " bucket_mb=0.002", failures)
                # Gossip at dp = 2 mixes with weights 1/2, 1/2: the exact average, as local SGD every step.
                if n == 2:
                    gossip = out + "-gossip"
                    run(mpirun + ["--set", 'parallel.dp_mode="gossip"', "--out", gossip, "--force"], env)
                    compare_runs(os.path.join(single, "parity.h5"), os.path.join(gossip, "parity.h5"),
                                 label + " gossip", failures, skip_params=("grad_rms", "update_ratio"))
                    compare_checkpoints(os.path.join(single, "parity.ckpt.h5"), os.path.join(gossip, "parity.ckpt.h5"),
                                        label + " gossip", failures)
                # Local SGD averaging every step is plain data parallelism again (SGD is linear in the gradient).
                local = out + "-local"
                run([mpiexec, "-np", str(n), "--oversubscribe", proplab, "run", study, "--set",
                     "parallel.dp=%d" % n, "--set", 'parallel.dp_mode="local_sgd"', "--set", "parallel.sync_every=1",
                     "--out", local, "--force"], env)
                # (its gradient and update statistics are rank 0's own replica's, not the averaged ones)
                compare_runs(os.path.join(single, "parity.h5"), os.path.join(local, "parity.h5"),
                             label + " local_sgd sync_every=1", failures, skip_params=("grad_rms", "update_ratio"))
                compare_checkpoints(os.path.join(single, "parity.ckpt.h5"), os.path.join(local, "parity.ckpt.h5"),
                                    label + " local_sgd sync_every=1", failures)
                # Resume across layouts: stop the dp run after 3 steps, continue as one process to the end.
                moved = out + "-resumed"
                run([mpiexec, "-np", str(n), "--oversubscribe", proplab, "run", study, "--set",
                     "parallel.dp=%d" % n, "--out", moved, "--force", "--stop-after", "3"], env, allowed=(4,))
                resumed = run([proplab, "run", study, "--out", moved, "--resume"], env)
                if "resuming at step 3" not in resumed:
                    failures.append("%s: the one-process run did not resume at step 3:\n%s" % (label, resumed))
                compare_runs(os.path.join(single, "parity.h5"), os.path.join(moved, "parity.h5"),
                             label + " then resumed by one process", failures)
                compare_checkpoints(os.path.join(single, "parity.ckpt.h5"), os.path.join(moved, "parity.ckpt.h5"),
                                    label + " then resumed by one process", failures)
                compare_checkpoints(os.path.join(single, "parity.ckpt.h5"), os.path.join(out, "parity.ckpt.h5"),
                                    label, failures)
            else:
                with h5py.File(os.path.join(single, "parity.h5"), "r") as s, \
                        h5py.File(os.path.join(out, "parity.h5"), "r") as p:
                    a, b = s["train/loss"][()], p["train/loss"][()]
                    if a.shape != b.shape or not close(a, b, np.abs(a)):
                        failures.append("%s: loss %s vs %s" % (label, a, b))
    for f in failures:
        print(f)
    if failures:
        sys.exit(1)
    print("data-parallel parity holds for dp = %s" % ", ".join(map(str, ranks)))


if __name__ == "__main__":
    main()
