"""Sweep folders (`proplab sweep`, docs/studies.md "Sweeps"): `open_sweep(folder)` gives a `Sweep`.

`Sweep.index` is `index.csv` with typed columns: run, one column per swept key path (and seed), status,
final_loss, final_val_loss, steps, seconds, file, detail, and `path` (the run file's absolute path). Swept columns
whose values are all integers, or all numbers, or all true/false, get that type; the others stay str. Run files are
opened when first asked for, so a sweep that is still running (rows `pending` or `running`) can be read as it goes.
"""

import csv
import errno
import os

import numpy as np
import pandas as pd

from .run import Run

INDEX_FILE = "index.csv"
FIXED_COLUMNS = ("run", "status", "final_loss", "final_val_loss", "steps", "seconds", "file", "detail")


def open_sweep(folder):
    """The sweep written into `folder`. FileNotFoundError when the folder or its index.csv does not exist; ValueError
    naming the file when index.csv lacks a column of the format."""
    return Sweep(folder)


def _typed(values):
    """A swept column's values (str) as int, float or bool when every non-empty one reads as that type."""
    present = [v for v in values if v != ""]
    if not present:
        return pd.Series(values, dtype=object)
    try:
        if all(v.lstrip("+-").isdigit() for v in present) and len(present) == len(values):
            return pd.Series([int(v) for v in values], dtype=np.int64)
        return pd.Series([float(v) if v != "" else np.nan for v in values], dtype=np.float64)
    except ValueError:
        pass
    if all(v in ("true", "false") for v in present) and len(present) == len(values):
        return pd.Series([v == "true" for v in values], dtype=bool)
    return pd.Series(values, dtype=object)


def _numbers(values):
    return pd.Series([float(v) if v != "" else np.nan for v in values], dtype=np.float64)


class Sweep:
    """A sweep folder: its index (`index`), swept key columns (`keys`) and run files (`run(name)`)."""

    def __init__(self, folder):
        self.folder = os.path.abspath(os.fspath(folder))
        self._runs = {}
        self._read_index()

    def _read_index(self):
        index_path = os.path.join(self.folder, INDEX_FILE)
        if not os.path.isdir(self.folder):
            raise FileNotFoundError(errno.ENOENT, "sweep folder not found: '%s'" % self.folder, self.folder)
        if not os.path.exists(index_path):
            raise FileNotFoundError(errno.ENOENT, "'%s' is not a sweep folder: it has no %s (written by `proplab "
                                    "sweep`)" % (self.folder, INDEX_FILE), index_path)
        with open(index_path, newline="", encoding="utf-8") as handle:
            rows = list(csv.reader(handle))
        if not rows:
            raise ValueError("'%s' is empty (expected a header: %s)" % (index_path, ", ".join(FIXED_COLUMNS)))
        header, body = rows[0], rows[1:]
        missing = [c for c in FIXED_COLUMNS if c not in header]
        if missing or header[0] != "run":
            raise ValueError("'%s' is not a sweep index: its header lacks %s (expected run, <swept keys>, status, "
                             "final_loss, final_val_loss, steps, seconds, file, detail)"
                             % (index_path, ", ".join(missing) or "'run' first"))
        for number, row in enumerate(body, start=2):
            if len(row) != len(header):
                raise ValueError("%s:%d: %d fields, expected %d (%s)"
                                 % (index_path, number, len(row), len(header), ", ".join(header)))
        self.keys = header[1:header.index("status")]
        columns = {name: [row[i] for row in body] for i, name in enumerate(header)}
        data = {}
        for name in header:
            values = columns[name]
            if name in self.keys:
                data[name] = _typed(values)
            elif name in ("final_loss", "final_val_loss", "seconds"):
                data[name] = _numbers(values)
            elif name == "steps":
                data[name] = pd.array([int(v) if v != "" else None for v in values], dtype="Int64")
            else:
                data[name] = pd.Series(values, dtype=object)
        index = pd.DataFrame(data, columns=header)
        index["path"] = [os.path.join(self.folder, f) if f else "" for f in columns["file"]]
        self.index = index

    def __len__(self):
        return len(self.index)

    def __repr__(self):
        counts = self.index["status"].value_counts()
        return "<proplab.Sweep %s: %d runs (%s); swept %s>" % (
            self.folder, len(self), ", ".join("%s %d" % (s, n) for s, n in counts.items()), ", ".join(self.keys))

    def refresh(self):
        """Re-reads index.csv and reopens the run files already opened. Returns self."""
        self._read_index()
        for run in self._runs.values():
            run.refresh()
        return self

    def close(self):
        for run in self._runs.values():
            run.close()
        self._runs.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def run(self, name):
        """The Run of the point named `name` (the index's run column), opened on first use. KeyError for a name
        the index does not list; FileNotFoundError when its run file does not exist (yet)."""
        if name not in self._runs:
            matches = self.index.index[self.index["run"] == name]
            if len(matches) == 0:
                raise KeyError("no run %r in '%s' (runs: %s)"
                               % (name, os.path.join(self.folder, INDEX_FILE), ", ".join(self.index["run"])))
            self._runs[name] = Run(self.index.at[matches[0], "path"])
        return self._runs[name]

    def runs(self, status=None):
        """(name, Run) for every point whose run file exists, in index order; `status` (a status or a list of them)
        keeps only those points."""
        wanted = [status] if isinstance(status, str) else status
        for _, row in self.index.iterrows():
            if wanted is not None and row["status"] not in wanted:
                continue
            if row["path"] and os.path.exists(row["path"]):
                yield row["run"], self.run(row["run"])

    def collect(self, method, status=None, **options):
        """`Run.<method>(**options)` of every run concatenated, with columns run and the swept keys in front."""
        frames = []
        for name, run in self.runs(status):
            frame = getattr(run, method)(**options)
            row = self.index[self.index["run"] == name].iloc[0]
            front = pd.DataFrame({"run": [name] * len(frame)}, index=frame.index)
            for key in self.keys:
                front[key] = pd.Series([row[key]] * len(frame), index=frame.index, dtype=self.index[key].dtype)
            frames.append(pd.concat([front, frame], axis=1))
        if not frames:
            return pd.DataFrame(columns=["run"] + self.keys)
        return pd.concat(frames, ignore_index=True)

    def stats(self, status=None, **options):
        """Every run's `Run.stats(**options)` (direction, stat, step) with run and swept key columns."""
        return self.collect("stats", status, **options)

    def params(self, status=None, **options):
        return self.collect("params", status, **options)

    def train(self, status=None):
        return self.collect("train", status)

    def eval(self, status=None):
        return self.collect("eval", status)

    def theory(self, status=None, **options):
        return self.collect("theory", status, **options)
