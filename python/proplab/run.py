"""Run files (docs/run-format.md) as pandas DataFrames: `open_run(path)` gives a `Run`.

A run file can be read while its run is still going and after its writer was killed, the way the C++ RunReader
(src/io/run_reader.h) reads it:

- The file is opened read-only: plainly first, and in HDF5 SWMR-read mode when that fails because a writer has it
  open (or a killed writer left it marked open for write; `proplab recover` clears that mark). `Run.swmr` says
  which.
- In SWMR mode every dataset is refreshed before it is read, so each call sees every row the writer has flushed.
  `Run.refresh()` reopens the file, which also re-reads the root attributes (`status` changes when the run ends).
- A reader beside the writer may see `/steps` and the series (or the `/train` columns) at different lengths for a
  moment: each method cuts them to the shortest, so every frame is whole records.

Frames are tidy (one value per row) unless the method says otherwise; string columns hold str, integer columns
int64 and values float64 (NaN: not computed, or no prediction).
"""

import errno
import os

import h5py
import numpy as np
import pandas as pd

from ._toml import parse_toml

FORMAT = "proplab-run"
FORMAT_VERSIONS = (1,)
DIRECTIONS = ("forward", "backward")
TRAIN_COLUMNS = ("step", "loss", "lr", "grad_norm", "tokens_per_s", "wall_time")
EVAL_COLUMNS = ("step", "loss")
ALL_PARAMS = "(all)"  # the param of /replicas/disagreement_total: every parameter together


class RunFileError(ValueError):
    """The file exists but is not a readable proplab run file (not HDF5, no `format`, another version, malformed)."""


def open_run(path):
    """The run file at `path` as a `Run`. FileNotFoundError when it does not exist; RunFileError (a ValueError) when it
    is not HDF5, not a proplab run file or of a format version this package does not read."""
    return Run(path)


def _text(value):
    if isinstance(value, (bytes, np.bytes_)):
        return value.decode("utf-8", errors="replace").rstrip("\0")
    if isinstance(value, np.ndarray) and value.shape == ():
        return _text(value[()])
    return value


def _plain(value):
    """An attribute as str, int or float (numpy scalars and 1-element arrays unwrapped)."""
    value = _text(value)
    if isinstance(value, np.ndarray) and value.size == 1:
        value = value.reshape(())[()]
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    return value


def _as_list(selection):
    if selection is None:
        return None
    if isinstance(selection, str):
        return [selection]
    return list(selection)


class Run:
    """One run file. Open with `open_run(path)`; close with `close()` or use it in a `with` block."""

    def __init__(self, path):
        self.path = os.path.abspath(os.fspath(path))
        self._file = None
        self._open()

    # ---- opening ------------------------------------------------------------------------------------------------

    def _open(self):
        if not os.path.exists(self.path):
            raise FileNotFoundError(errno.ENOENT, "run file not found: '%s'" % self.path, self.path)
        if os.path.isdir(self.path):
            raise RunFileError("'%s' is a folder, not a proplab run file (open_sweep reads a sweep folder)" % self.path)
        errors = []
        handle, swmr = None, False
        for use_swmr in (False, True):
            try:
                if use_swmr:
                    handle = h5py.File(self.path, "r", libver="latest", swmr=True)
                else:
                    handle = h5py.File(self.path, "r")
                swmr = use_swmr
                break
            except OSError as error:
                errors.append(str(error))
        if handle is None:
            raise RunFileError("'%s' cannot be opened as HDF5 (%s)" % (self.path, "; ".join(errors)))
        try:
            self._check_format(handle)
        except Exception:
            handle.close()
            raise
        self._file, self.swmr = handle, swmr
        self._attrs = {name: _plain(handle.attrs[name]) for name in handle.attrs}
        self._probes = None
        self._config_dict = None

    def _check_format(self, handle):
        if "format" not in handle.attrs:
            raise RunFileError("'%s' is not a proplab run file: it has no root attribute 'format' (expected '%s')"
                               % (self.path, FORMAT))
        found = _plain(handle.attrs["format"])
        if found != FORMAT:
            raise RunFileError("'%s' is not a proplab run file: root attribute 'format' is '%s' (expected '%s')"
                               % (self.path, found, FORMAT))
        version = _plain(handle.attrs.get("format_version"))
        if version not in FORMAT_VERSIONS:
            raise RunFileError("'%s' has format_version %r; this package reads %s"
                               % (self.path, version, ", ".join(str(v) for v in FORMAT_VERSIONS)))

    def refresh(self):
        """Reopens the file: new root attribute values (`status` when the run has ended) and rows. Returns self."""
        self.close()
        self._open()
        return self

    def close(self):
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        if self._file is None:
            return "<proplab.Run %s (closed)>" % self.path
        return "<proplab.Run %r %s: %d records, %d train rows%s; %s>" % (
            self.name, self.status, len(self.steps), len(self.train()), ", SWMR" if self.swmr else "", self.path)

    # ---- low-level reads ----------------------------------------------------------------------------------------

    def _handle(self):
        if self._file is None:
            raise ValueError("run file '%s' is closed" % self.path)
        return self._file

    def has(self, object_path):
        """True when the group or dataset at `object_path` (e.g. "/replicas") exists."""
        return object_path in self._handle()

    def read(self, dataset_path):
        """The whole dataset at `dataset_path` as numpy (strings as a list of str), refreshed first in SWMR mode."""
        handle = self._handle()
        if dataset_path not in handle:
            raise RunFileError("run file '%s' has no dataset %s" % (self.path, dataset_path))
        dataset = handle[dataset_path]
        if not isinstance(dataset, h5py.Dataset):
            raise RunFileError("run file '%s': %s is a group, not a dataset" % (self.path, dataset_path))
        if self.swmr:
            dataset.refresh()
        values = dataset[()]
        if dataset.dtype.kind in ("S", "O", "U"):
            return [_text(v) for v in values]
        return values

    def _list(self, group_path):
        handle = self._handle()
        if group_path not in handle:
            return []
        return sorted(name for name, item in handle[group_path].items() if isinstance(item, h5py.Dataset))

    # ---- attributes -----------------------------------------------------------------------------------------------

    @property
    def attrs(self):
        """The root attributes (docs/run-format.md) as str, int or float, as of the last open or refresh()."""
        return dict(self._attrs)

    @property
    def status(self):
        """`running`, `completed`, `diverged` or `failed`; a killed run's file says `running`."""
        return self._attrs.get("status", "")

    @property
    def status_detail(self):
        return self._attrs.get("status_detail", "")

    @property
    def config(self):
        """The resolved study TOML text the run was started with."""
        return self._attrs.get("config", "")

    @property
    def config_dict(self):
        """The resolved study as a dict (`config` parsed: tomllib, or this package's own parser before 3.11)."""
        if self._config_dict is None:
            self._config_dict = parse_toml(self.config)
        return self._config_dict

    @property
    def name(self):
        """The study's `name`, else the file name without `.h5`."""
        try:
            name = self.config_dict.get("name")
        except ValueError:
            name = None
        return name if isinstance(name, str) else os.path.splitext(os.path.basename(self.path))[0]

    # ---- structure ------------------------------------------------------------------------------------------------

    @property
    def steps(self):
        """The training step of each record (`/steps`), int64; empty without statistics."""
        return self.read("/steps").astype(np.int64) if self.has("/steps") else np.zeros(0, np.int64)

    def stat_names(self, direction="forward"):
        """The statistics recorded for `direction` ("forward", "backward" or "params"), sorted."""
        if direction not in DIRECTIONS + ("params",):
            raise ValueError("direction %r: expected 'forward', 'backward' or 'params'" % (direction,))
        return [name for name in self._list("/" + direction) if name != "name"]

    def probes(self):
        """One row per probe in forward order: depth, probe (its name), kind, block; with `/blocks` (ResNets) also
        stage and transition of the probe's block (stage -1 and transition False outside blocks)."""
        if self._probes is None:
            if not self.has("/probes/name"):
                return pd.DataFrame({"depth": np.zeros(0, np.int64), "probe": [], "kind": [],
                                     "block": np.zeros(0, np.int64)})
            columns = {"depth": self.read("/probes/depth").astype(np.int64), "probe": self.read("/probes/name"),
                       "kind": self.read("/probes/kind"), "block": self.read("/probes/block").astype(np.int64)}
            lengths = {key: len(value) for key, value in columns.items()}
            if len(set(lengths.values())) != 1:
                raise RunFileError("run file '%s' is malformed: /probes columns have different lengths %s"
                                   % (self.path, lengths))
            frame = pd.DataFrame(columns)
            blocks = self.blocks()
            if len(blocks):
                inside = frame["block"].to_numpy() >= 0
                if (frame["block"] >= len(blocks)).any():
                    raise RunFileError("run file '%s' is malformed: /probes/block indexes past /blocks (%d blocks)"
                                       % (self.path, len(blocks)))
                index = np.where(inside, frame["block"].to_numpy(), 0)
                frame["stage"] = np.where(inside, blocks["stage"].to_numpy()[index], -1)
                frame["transition"] = np.where(inside, blocks["transition"].to_numpy()[index], False)
            self._probes = frame
        return self._probes.copy()

    def blocks(self):
        """ResNets' stage layout (`/blocks`): one row per block with block, stage and transition (bool); empty for
        models without stages."""
        if not self.has("/blocks/stage"):
            return pd.DataFrame({"block": np.zeros(0, np.int64), "stage": np.zeros(0, np.int64),
                                 "transition": np.zeros(0, bool)})
        stage = self.read("/blocks/stage").astype(np.int64)
        transition = self.read("/blocks/transition").astype(np.int64)
        if len(stage) != len(transition):
            raise RunFileError("run file '%s' is malformed: /blocks/stage and /blocks/transition have lengths %d, %d"
                               % (self.path, len(stage), len(transition)))
        return pd.DataFrame({"block": np.arange(len(stage), dtype=np.int64), "stage": stage,
                             "transition": transition.astype(bool)})

    # ---- statistics -----------------------------------------------------------------------------------------------

    def _rows(self, dataset_path):
        """The length of the dataset at `dataset_path` (refreshed first in SWMR mode), without reading it."""
        dataset = self._handle()[dataset_path]
        if self.swmr:
            dataset.refresh()
        return dataset.shape[0]

    def _series(self, group, names, width, label):
        """{name: [rows, width] array} for the datasets `group/name`, with the records, all cut to the shortest
        series of the group (asked for or not): whole records only, whichever statistics are read."""
        steps = self.steps
        arrays = {}
        for name in names:
            values = self.read("%s/%s" % (group, name))
            if values.ndim != 2 or values.shape[1] != width:
                raise RunFileError("run file '%s' is malformed: %s/%s has shape %s for %d %s"
                                   % (self.path, group, name, values.shape, width, label))
            arrays[name] = values
        others = [self._rows("%s/%s" % (group, name)) for name in self.stat_names(group.lstrip("/"))
                  if name not in arrays]
        records = min([len(steps)] + [len(v) for v in arrays.values()] + others)
        return steps[:records], {name: values[:records] for name, values in arrays.items()}

    @staticmethod
    def _select_records(steps, step):
        keep = np.arange(len(steps)) if step is None else np.flatnonzero(np.isin(steps, np.atleast_1d(step)))
        return keep

    def stats(self, direction=None, stat=None, step=None):
        """Activation statistics (`/forward`, `/backward`), tidy: columns step, direction, stat, depth, probe, kind,
        block, value; rows by direction, stat, step, then depth. `direction`, `stat` (a name or a list) and `step`
        (a step or a list) select; None takes every one recorded."""
        directions = _as_list(direction) or list(DIRECTIONS)
        for d in directions:
            if d not in DIRECTIONS:
                raise ValueError("direction %r: expected 'forward' or 'backward'" % (d,))
        probes = self.probes()
        count = len(probes)
        wanted = _as_list(stat)
        parts = []
        for d in directions:
            recorded = self.stat_names(d)
            if wanted is not None:
                missing = [s for s in wanted if s not in recorded]
                if missing and direction is not None:
                    raise ValueError("statistic %s not recorded in /%s of '%s' (recorded: %s)"
                                     % (", ".join(missing), d, self.path, ", ".join(recorded) or "none"))
                recorded = [s for s in recorded if s in wanted]
            if not recorded:
                continue
            steps, arrays = self._series("/" + d, recorded, count, "probes")
            keep = self._select_records(steps, step)
            for name in recorded:
                parts.append((d, name, steps[keep], arrays[name][keep]))
        if wanted is not None:
            found = {name for _, name, _, _ in parts}
            missing = [s for s in wanted if s not in found]
            if missing:
                raise ValueError("statistic %s not recorded in /%s of '%s'"
                                 % (", ".join(missing), " or /".join(directions), self.path))
        return self._tidy(parts, probes, ["step", "direction", "stat"])

    @staticmethod
    def _tidy(parts, probes, leading):
        """Long frame from [(direction, stat, steps [n], values [n, P])] with the probe columns."""
        count = len(probes)
        columns = leading + ["depth", "probe", "kind", "block", "value"]
        if not parts:
            frame = pd.DataFrame({c: pd.Series(dtype=object) for c in columns})
            for c in ("step", "depth", "block"):
                if c in columns:
                    frame[c] = frame[c].astype(np.int64)
            frame["value"] = frame["value"].astype(np.float64)
            return frame
        rows = [len(values) * count for _, _, _, values in parts]
        index = np.concatenate([np.tile(np.arange(count), len(values)) for _, _, _, values in parts]).astype(np.int64)
        data = {}
        if "step" in leading:
            data["step"] = np.concatenate([np.repeat(steps, count) for _, _, steps, _ in parts]).astype(np.int64)
        data["direction"] = np.repeat(np.array([d for d, _, _, _ in parts], dtype=object), rows)
        data["stat"] = np.repeat(np.array([s for _, s, _, _ in parts], dtype=object), rows)
        for column in ("depth", "probe", "kind", "block"):
            data[column] = probes[column].to_numpy()[index]
        data["value"] = np.concatenate([values.reshape(-1) for _, _, _, values in parts]).astype(np.float64)
        return pd.DataFrame(data, columns=columns)

    def stat_table(self, stat="var", direction="forward"):
        """One statistic as a matrix: index step, one column per probe (named by probe, in forward order)."""
        if stat not in self.stat_names(direction):
            raise ValueError("statistic %r not recorded in /%s of '%s' (recorded: %s)"
                             % (stat, direction, self.path, ", ".join(self.stat_names(direction)) or "none"))
        probes = self.probes()
        steps, arrays = self._series("/" + direction, [stat], len(probes), "probes")
        return pd.DataFrame(arrays[stat], index=pd.Index(steps, name="step"),
                            columns=pd.Index(probes["probe"].tolist(), name="probe"))

    def params(self, stat=None, step=None):
        """Parameter statistics (`/params`), tidy: columns step, stat, param, value; rows by stat, step, then
        parameter in file order. `stat` and `step` select as in stats()."""
        names = self.read("/params/name") if self.has("/params/name") else []
        recorded = self.stat_names("params")
        wanted = _as_list(stat)
        if wanted is not None:
            missing = [s for s in wanted if s not in recorded]
            if missing:
                raise ValueError("parameter statistic %s not recorded in /params of '%s' (recorded: %s)"
                                 % (", ".join(missing), self.path, ", ".join(recorded) or "none"))
            recorded = wanted
        frames = []
        if recorded:
            steps, arrays = self._series("/params", recorded, len(names), "parameters")
            keep = self._select_records(steps, step)
            count = len(names)
            for name in recorded:
                values = arrays[name][keep]
                frames.append(pd.DataFrame({
                    "step": np.repeat(steps[keep], count).astype(np.int64),
                    "stat": name,
                    "param": np.tile(np.array(names, dtype=object), len(values)),
                    "value": values.reshape(-1).astype(np.float64)}))
        if not frames:
            return pd.DataFrame({"step": np.zeros(0, np.int64), "stat": pd.Series(dtype=object),
                                 "param": pd.Series(dtype=object), "value": np.zeros(0)})
        return pd.concat(frames, ignore_index=True)

    def _columns(self, group, columns):
        present = [c for c in columns if self.has("%s/%s" % (group, c))]
        arrays = {c: self.read("%s/%s" % (group, c)) for c in present}
        rows = min([len(v) for v in arrays.values()], default=0)
        frame = pd.DataFrame({c: arrays[c][:rows] for c in present}, columns=present)
        if "step" in frame:
            frame["step"] = frame["step"].astype(np.int64)
        return frame

    def train(self):
        """Training curves (`/train`), one row per optimizer step: step, loss, lr, grad_norm, tokens_per_s,
        wall_time (cut to the shortest column while the run is being written)."""
        return self._columns("/train", TRAIN_COLUMNS)

    def eval(self):
        """Evaluations (`/eval`): step (the optimizer step after which it ran) and loss (held-out mean)."""
        return self._columns("/eval", EVAL_COLUMNS)

    def theory(self, measured=False):
        """Predictions at initialisation (`/theory/<direction>/<stat>`), tidy: columns direction, stat, depth, probe,
        kind, block, value (NaN: no prediction; the reasons are in `.attrs["no_prediction"]`, the maps used in
        `.attrs["formulae"]`). With `measured=True` also `measured`: the statistic at the record of step 0 (NaN when
        step 0 or that statistic was not recorded)."""
        probes = self.probes()
        parts = []
        for d in DIRECTIONS:
            for name in self._list("/theory/" + d):
                values = self.read("/theory/%s/%s" % (d, name)).astype(np.float64)
                if values.shape != (len(probes),):
                    raise RunFileError("run file '%s' is malformed: /theory/%s/%s has shape %s for %d probes"
                                       % (self.path, d, name, values.shape, len(probes)))
                parts.append((d, name, None, values.reshape(1, -1)))
        frame = self._tidy(parts, probes, ["direction", "stat"])
        if measured:
            at_init = self.stats(step=0)
            at_init = at_init[at_init["step"] == 0][["direction", "stat", "depth", "value"]]
            frame = frame.merge(at_init.rename(columns={"value": "measured"}), how="left",
                                on=["direction", "stat", "depth"])
        if self.has("/theory"):
            for key in ("formulae", "no_prediction"):
                if key in self._handle()["/theory"].attrs:
                    frame.attrs[key] = _plain(self._handle()["/theory"].attrs[key])
        return frame

    def _param_table(self, group, columns):
        """A tidy table of `group`'s per-parameter series (`<group>/<column>` [n, n_params] and `<column>_total`
        [n, 1], rows at `<group>/steps`): columns step, param and each column (NaN for one the file lacks), the param
        "(all)" the total; whole records only; empty when the file has no `<group>/steps`."""
        if not self.has(group + "/steps"):
            empty = {"step": np.zeros(0, np.int64), "param": pd.Series(dtype=object)}
            empty.update({column: np.zeros(0) for column in columns})
            return pd.DataFrame(empty)
        names = list(self.read("/params/name")) + [ALL_PARAMS]
        steps = self.read(group + "/steps").astype(np.int64)
        series = {}
        for column in columns:
            if not self.has(group + "/" + column):
                continue
            per_param = self.read(group + "/" + column)
            total = self.read("%s/%s_total" % (group, column))
            rows = min(len(per_param), len(total))
            series[column] = np.concatenate([per_param[:rows], total[:rows].reshape(rows, -1)[:, :1]], axis=1)
        rows = min([len(steps)] + [len(v) for v in series.values()])
        data = {"step": np.repeat(steps[:rows], len(names)),
                "param": np.tile(np.array(names, dtype=object), rows)}
        for column in columns:
            data[column] = series[column][:rows].reshape(-1) if column in series else np.full(rows * len(names), np.nan)
        return pd.DataFrame(data, columns=["step", "param"] + list(columns))

    def compression(self):
        """What compressed communication did (`/compression`, `[parallel] compress` only), tidy: columns step,
        param, error, residual; the param "(all)" is every parameter together. Empty when the file has none."""
        return self._param_table("/compression", ("error", "residual"))

    def replicas(self):
        """Data-parallel disagreement (`/replicas`, dp > 1 only), tidy: columns step, param, disagreement,
        disagreement_before_mix; the param "(all)" is every parameter together. Empty when the file has none."""
        return self._param_table("/replicas", ("disagreement", "disagreement_before_mix"))
