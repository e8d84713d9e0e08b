#!/usr/bin/env python3
"""Snapshots of the shipped studies, for proving that a change alters no result.

  study_snapshots.py run PROPLAB OUT [--steps N]   runs every studies/*.toml (its [sweep] and [parallel] tables
                                                   removed: the base point, in one process) for N steps (default 3)
                                                   with every statistic recorded every step, into OUT/<study>/
  study_snapshots.py compare A B                   compares two such folders: every dataset of every run file and every
                                                   checkpoint tensor bit for bit, and the root attributes that describe
                                                   the run (not start/end time, host or version); exit 1 on any
                                                   difference

Typical use: build the tree before and after a change, `run` each binary into its own folder, then `compare`.
Timing columns (/train/tokens_per_s, /train/wall_time) differ from run to run and are skipped.
"""
import glob
import os
import re
import subprocess
import sys

import h5py
import numpy as np

SKIPPED_DATASETS = {"train/tokens_per_s", "train/wall_time"}
SKIPPED_ATTRIBUTES = {"start_time", "end_time", "host", "proplab_version"}


def without_table(text, table):
    """The study text without the table [table] (from its header to the next table or the end)."""
    return re.sub(r"(?ms)^\[%s\]\n.*?(?=^\[|\Z)" % re.escape(table), "", text)


# GPU-scale studies: a CPU step of either takes a minute or more, so snapshots leave them out (their CPU path is the
# transformer's, which the other studies cover).
GPU_STUDIES = {"gpt2_124m", "deep1000_deepscalelm"}


def run(proplab, out, steps):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    studies = sorted(glob.glob(os.path.join(root, "studies", "*.toml")))
    os.makedirs(out, exist_ok=True)
    for study in studies:
        name = os.path.splitext(os.path.basename(study))[0]
        if name in GPU_STUDIES:
            print("study_snapshots: %s skipped (a GPU study)" % name, flush=True)
            continue
        with open(study) as f:
            # (a layout of several processes runs as one: the parallel paths have their own parity tests)
            text = without_table(without_table(f.read(), "sweep"), "parallel")
        point = os.path.join(out, name + ".toml")
        with open(point, "w") as f:
            f.write(text)
        sets = ["train.steps=%d" % steps, "train.warmup=0", "record.every=1", "record.forward=[]", "record.backward=[]",
                "record.params=[]", "device.type=cpu", "device.threads=1"]
        command = [proplab, "run", point, "--out", os.path.join(out, name), "--force"]
        for s in sets:
            command += ["--set", s]
        print("study_snapshots: %s" % name, flush=True)
        result = subprocess.run(command, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if result.returncode not in (0, 3):
            sys.exit("study_snapshots: %s failed (%d):\n%s" % (name, result.returncode, result.stdout))


def datasets(path):
    out = {}
    with h5py.File(path, "r") as f:
        def visit(name, node):
            if isinstance(node, h5py.Dataset) and name not in SKIPPED_DATASETS:
                out[name] = node[()]
        f.visititems(visit)
        attributes = {k: f.attrs[k] for k in f.attrs if k not in SKIPPED_ATTRIBUTES}
    return out, attributes


def same(a, b):
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.kind == "f":
        return a.tobytes() == b.tobytes()
    return np.array_equal(a, b)


def compare(a, b):
    differences = []
    files = sorted(os.path.relpath(p, a) for p in glob.glob(os.path.join(a, "*", "*.h5")))
    other = sorted(os.path.relpath(p, b) for p in glob.glob(os.path.join(b, "*", "*.h5")))
    if files != other:
        differences.append("different files: %s vs %s" % (files, other))
    for relative in files:
        if relative not in other:
            continue
        data_a, attrs_a = datasets(os.path.join(a, relative))
        data_b, attrs_b = datasets(os.path.join(b, relative))
        if set(data_a) != set(data_b):
            differences.append("%s: datasets %s differ" % (relative, sorted(set(data_a) ^ set(data_b))))
        for name in sorted(set(data_a) & set(data_b)):
            if not same(data_a[name], data_b[name]):
                differences.append("%s: /%s differs" % (relative, name))
        for key in sorted(set(attrs_a) | set(attrs_b)):
            if key not in attrs_a or key not in attrs_b or not same(attrs_a[key], attrs_b[key]):
                differences.append("%s: attribute %s differs" % (relative, key))
    for d in differences:
        print(d)
    print("study_snapshots: %d files compared, %d differences" % (len(files), len(differences)))
    return 1 if differences else 0


def main():
    if len(sys.argv) >= 4 and sys.argv[1] == "run":
        steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 3
        run(os.path.abspath(sys.argv[2]), os.path.abspath(sys.argv[3]), steps)
        return 0
    if len(sys.argv) == 4 and sys.argv[1] == "compare":
        return compare(sys.argv[2], sys.argv[3])
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main())
