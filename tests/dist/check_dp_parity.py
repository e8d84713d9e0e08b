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
import sys

from parity_util import (PARITY_STUDY, compare_checkpoints, compare_losses, compare_runs, finish, identical_runs,
                         mpi_env, mpirun_cmd, run, write_study)


def main():
    proplab, mpiexec, work = sys.argv[1], sys.argv[2], sys.argv[3]
    ranks = [int(r) for r in sys.argv[4:]] or [2]
    study = os.path.join(work, "parity.toml")
    env = mpi_env()
    failures = []
    for optimizer in ("sgd", "adamw"):
        # no clipping: local SGD clips each replica's own gradient
        write_study(study, PARITY_STUDY.replace(
            "{optimizer}", 'optimizer = "sgd"\nmomentum = 0.9\ngrad_clip = 0' if optimizer == "sgd" else ""))
        single = os.path.join(work, optimizer + "-single")
        run([proplab, "run", study, "--out", single, "--force"], env)
        for n in ranks:
            out = os.path.join(work, "%s-dp%d" % (optimizer, n))
            label = "%s dp=%d" % (optimizer, n)
            mpirun = mpirun_cmd(mpiexec, n, proplab, study, ["parallel.dp=%d" % n])
            log = run(mpirun + ["--out", out, "--force"], env)
            if log.count("proplab: parity: completed") != 1:
                failures.append("%s: expected one final line from rank 0, got:\n%s" % (label, log))
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
                    compare_losses(os.path.join(single, "parity.h5"), os.path.join(where, "parity.h5"),
                                   label + " " + name, failures)
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
                run(mpirun + ["--set", 'parallel.dp_mode="local_sgd"', "--set", "parallel.sync_every=1", "--out",
                              local, "--force"], env)
                # (its gradient and update statistics are rank 0's own replica's, not the averaged ones)
                compare_runs(os.path.join(single, "parity.h5"), os.path.join(local, "parity.h5"),
                             label + " local_sgd sync_every=1", failures, skip_params=("grad_rms", "update_ratio"))
                compare_checkpoints(os.path.join(single, "parity.ckpt.h5"), os.path.join(local, "parity.ckpt.h5"),
                                    label + " local_sgd sync_every=1", failures)
                # Resume across layouts: stop the dp run after 3 steps, continue as one process to the end.
                moved = out + "-resumed"
                run(mpirun + ["--out", moved, "--force", "--stop-after", "3"], env, allowed=(4,))
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
                compare_losses(os.path.join(single, "parity.h5"), os.path.join(out, "parity.h5"), label, failures)
    finish(failures, "data-parallel parity holds for dp = %s" % ", ".join(map(str, ranks)))


if __name__ == "__main__":
    main()
