#!/usr/bin/env python3
"""Checks a proplab run file with h5py, independently of proplab's own reader (docs/run-format.md).

Opens the file plainly (not SWMR: a killed run's file must have been recovered first) and asserts that the root
attributes exist with their types, /train and /eval have the expected columns, shapes and dtypes, the
statistics groups exist (/theory included), and, when /steps exists (or --expect-stats is given), that every
statistics dataset of the layout has the right shape and dtype. Exit status 0 when every check passes, 1 with
one line per failed check otherwise.

usage: check_run_file.py RUN.h5 [--train-rows N | --min-train-rows N] [--eval-rows N] [--status S]
                         [--detail D] [--expect-stats]
"""
import argparse
import sys

import h5py
import numpy as np

ROOT_STRINGS = ["format", "proplab_version", "config", "status", "status_detail", "start_time", "end_time", "host",
                "device", "layout", "precision"]
ROOT_INTS = ["format_version", "threads"]
TRAIN_COLUMNS = {"step": np.int64, "loss": np.float64, "lr": np.float64, "grad_norm": np.float64,
                 "tokens_per_s": np.float64, "wall_time": np.float64}
EVAL_COLUMNS = {"step": np.int64, "loss": np.float64}
GROUPS = ["probes", "params", "forward", "backward", "theory"]
PROBE_KINDS = {"residual", "branch", "norm", "preact", "postact", "logits", "embed"}
ACTIVATION_STATS = {"mean", "var", "rms", "max_abs", "kurtosis", "nonfinite", "corr", "chan_mean_sq", "chan_var"}
PARAM_STATS = {"weight_rms", "grad_rms", "update_ratio"}

failures = []


def check(condition, message):
    if not condition:
        failures.append(message)
    return condition


def text(value):
    return value.decode("utf-8") if isinstance(value, (bytes, np.bytes_)) else str(value)


def check_dataset(group, name, dtype, shape):
    path = f"{group.name.rstrip('/')}/{name}"
    if not check(name in group and isinstance(group[name], h5py.Dataset), f"{path}: missing or not a dataset"):
        return None
    dataset = group[name]
    check(dataset.dtype == np.dtype(dtype), f"{path}: dtype {dataset.dtype}, expected {np.dtype(dtype)}")
    check(dataset.shape == shape, f"{path}: shape {dataset.shape}, expected {shape}")
    return dataset


def check_strings(group, name, count):
    path = f"{group.name.rstrip('/')}/{name}"
    if not check(name in group and isinstance(group[name], h5py.Dataset), f"{path}: missing or not a dataset"):
        return []
    dataset = group[name]
    check(dataset.dtype.kind == "S", f"{path}: dtype {dataset.dtype}, expected fixed-length strings")
    check(dataset.shape == (count,), f"{path}: shape {dataset.shape}, expected ({count},)")
    return [text(value) for value in dataset[:]]


def check_statistics(f):
    steps = check_dataset(f, "steps", np.int64, f["steps"].shape if "steps" in f else (0,))
    if steps is None:
        return
    check(steps.ndim == 1, f"/steps: rank {steps.ndim}, expected 1")
    records = steps.shape[0]
    values = steps[:]
    check(bool(np.all(np.diff(values) > 0)), "/steps: not strictly increasing")
    check(records == 0 or values[0] >= 0, "/steps: negative step")

    probes = f["probes"]
    count = probes["name"].shape[0] if "name" in probes else 0
    names = check_strings(probes, "name", count)
    check(len(set(names)) == len(names), "/probes/name: names repeat")
    depth = check_dataset(probes, "depth", np.int64, (count,))
    if depth is not None:
        check(list(depth[:]) == list(range(count)), "/probes/depth: not 0..P-1 in order")
    block = check_dataset(probes, "block", np.int64, (count,))
    if block is not None:
        check(bool(np.all(block[:] >= -1)), "/probes/block: values below -1")
    kinds = check_strings(probes, "kind", count)
    for kind in kinds:
        check(kind in PROBE_KINDS, f"/probes/kind: unknown kind '{kind}'")
    for member in probes:
        check(member in {"name", "depth", "block", "kind"}, f"/probes/{member}: not in the layout")

    for direction in ["forward", "backward"]:
        for stat in f[direction]:
            check(stat in ACTIVATION_STATS, f"/{direction}/{stat}: not a statistic of the layout")
            check_dataset(f[direction], stat, np.float64, (records, count))

    params = f["params"]
    stats = [member for member in params if member != "name"]
    if stats or "name" in params:
        n_params = params["name"].shape[0] if "name" in params else 0
        check_strings(params, "name", n_params)
        for stat in stats:
            check(stat in PARAM_STATS, f"/params/{stat}: not a statistic of the layout")
            check_dataset(params, stat, np.float64, (records, n_params))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("path")
    parser.add_argument("--train-rows", type=int)
    parser.add_argument("--min-train-rows", type=int)
    parser.add_argument("--eval-rows", type=int)
    parser.add_argument("--status")
    parser.add_argument("--detail")
    parser.add_argument("--expect-stats", action="store_true")
    args = parser.parse_args()

    with h5py.File(args.path, "r") as f:
        for name in ROOT_STRINGS:
            if check(name in f.attrs, f"root attribute {name}: missing"):
                check(isinstance(f.attrs[name], (bytes, np.bytes_)), f"root attribute {name}: not a string")
        for name in ROOT_INTS:
            if check(name in f.attrs, f"root attribute {name}: missing"):
                check(np.asarray(f.attrs[name]).dtype == np.int64, f"root attribute {name}: not int64")
        if "format" in f.attrs:
            check(text(f.attrs["format"]) == "proplab-run", f"format is {text(f.attrs['format'])!r}")
        if "format_version" in f.attrs:
            check(int(f.attrs["format_version"]) == 1, f"format_version is {f.attrs['format_version']}")
        if args.status is not None and "status" in f.attrs:
            check(text(f.attrs["status"]) == args.status, f"status is {text(f.attrs['status'])!r}, expected "
                                                          f"{args.status!r}")
        if args.detail is not None and "status_detail" in f.attrs:
            check(text(f.attrs["status_detail"]) == args.detail,
                  f"status_detail is {text(f.attrs['status_detail'])!r}, expected {args.detail!r}")

        for name in GROUPS + ["train", "eval"]:
            check(name in f and isinstance(f[name], h5py.Group), f"/{name}: missing or not a group")

        if "train" in f:
            rows = f["train"]["step"].shape[0] if "step" in f["train"] else 0
            if args.train_rows is not None:
                check(rows == args.train_rows, f"/train: {rows} rows, expected {args.train_rows}")
            if args.min_train_rows is not None:
                check(rows >= args.min_train_rows, f"/train: {rows} rows, expected at least {args.min_train_rows}")
            for column, dtype in TRAIN_COLUMNS.items():
                check_dataset(f["train"], column, dtype, (rows,))
            if "step" in f["train"]:
                check(list(f["train"]["step"][:]) == list(range(rows)), "/train/step: not 0..rows-1")
        if "eval" in f:
            rows = f["eval"]["step"].shape[0] if "step" in f["eval"] else 0
            if args.eval_rows is not None:
                check(rows == args.eval_rows, f"/eval: {rows} rows, expected {args.eval_rows}")
            for column, dtype in EVAL_COLUMNS.items():
                check_dataset(f["eval"], column, dtype, (rows,))

        if args.expect_stats:
            check("steps" in f, "/steps: missing (statistics expected)")
        if "steps" in f and all(name in f for name in GROUPS):
            check_statistics(f)

    for failure in failures:
        print(f"{args.path}: {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
