#!/usr/bin/env python3
"""The learning-rate sweep table of `proplab report`, computed from a sweep folder's run files with h5py alone.

Reads every run file DIR/*.h5 (checkpoints excluded): its resolved config (the root attribute `config`, TOML), its
status, /train/loss and /eval/loss, and applies the rules of docs/gui.md ("Reports") written out again: final loss
= the last evaluation loss, else the mean training loss over the last 20 steps; initial loss = the mean training
loss over the first 5 steps; a run is diverged when its status is diverged or failed or its final loss is not
finite or exceeds its initial loss; a point (series value, lr) averages its seeds' final losses and is diverged
when any of its runs is; the best lr has the lowest final loss among the points not diverged (ties: the smaller
lr).

Prints one line per value of SERIES_KEY (a dotted config key), by increasing value, tab-separated:
value, best lr ("%.6g", or "all diverged"), its final loss ("%.17g", or "n/a"), the lrs tried and the diverged
lrs (each "%.6g", joined by ", "; "none" without any).

usage: lr_sweep_expected.py DIR SERIES_KEY
"""
import math
import pathlib
import sys
import tomllib

import h5py


def text(value):
    return value.decode() if isinstance(value, bytes) else str(value)


def config_value(config, key):
    node = config
    for part in key.split("."):
        node = node[part]
    return node


def run_loss(path):
    """(config, final loss, diverged) of one run file."""
    with h5py.File(path, "r") as f:
        config = tomllib.loads(text(f.attrs["config"]))
        status = text(f.attrs["status"])
        train = [float(v) for v in f["train/loss"][:]] if "train/loss" in f else []
        evals = [float(v) for v in f["eval/loss"][:]] if "eval/loss" in f else []
    initial = sum(train[:5]) / len(train[:5]) if train else math.nan
    if evals:
        final = evals[-1]
    elif train:
        final = sum(train[-20:]) / len(train[-20:])
    else:
        final = math.nan
    diverged = status in ("diverged", "failed") or not math.isfinite(final) or final > initial
    return config, final, diverged


def main():
    folder, series_key = pathlib.Path(sys.argv[1]), sys.argv[2]
    points = {}  # (series value, lr) -> [final losses], diverged
    for path in sorted(folder.glob("*.h5")):
        if path.name.endswith(".ckpt.h5"):
            continue
        config, final, diverged = run_loss(path)
        key = (config_value(config, series_key), float(config["train"]["lr"]))
        losses, was_diverged = points.get(key, ([], False))
        points[key] = (losses + [final], was_diverged or diverged)
    for value in sorted({value for value, _ in points}):
        lrs = sorted(lr for v, lr in points if v == value)
        best, best_loss, diverged = None, math.inf, []
        for lr in lrs:
            losses, is_diverged = points[(value, lr)]
            mean = sum(losses) / len(losses)
            if is_diverged:
                diverged.append(lr)
            elif mean < best_loss:
                best, best_loss = lr, mean
        print("\t".join([
            str(value),
            "%.6g" % best if best is not None else "all diverged",
            "%.17g" % best_loss if best is not None else "n/a",
            ", ".join("%.6g" % lr for lr in lrs),
            ", ".join("%.6g" % lr for lr in diverged) or "none",
        ]))


if __name__ == "__main__":
    main()
