#!/usr/bin/env python3
"""The Python package (python/proplab) on run files that the real `proplab run` and `proplab sweep` write here.

Every DataFrame is checked against the file's datasets read independently with h5py, and against `proplab inspect`
(which reads through the C++ RunReader, src/io/run_reader.h): the depth tables of every statistic, both directions,
at several steps, and the summary lines. Also: a run file read while its run is going (more rows appear; the status
changes on refresh() once the run stops), a run killed with SIGKILL (read as it was left, then after `proplab
recover`), a data-parallel run's /replicas (with MPIEXEC), a ResNet's stage layout (when Debian's Fashion-MNIST is installed), a 2-point sweep through open_sweep,
the errors for files that are not run files, the version against the project's, and `pip install ./python` into a
temporary virtual environment (offline: --no-index; skipped with a message when venv has no pip).

The package is imported from the source tree, so nothing needs installing.

usage: test_proplab_package.py PROPLAB WORKDIR [MPIEXEC]   (with MPIEXEC also a data-parallel run's /replicas)
"""
import concurrent.futures
import importlib.util
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest

import h5py
import numpy as np

SOURCE = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(SOURCE, "python"))

if importlib.util.find_spec("pandas") is None:
    sys.exit("test_proplab_package.py: pandas is missing (Debian: python3-pandas; scripts/setup-debian.sh installs it)")

import proplab  # noqa: E402
from proplab._toml import parse_toml, parse_toml_minimal  # noqa: E402

PROPLAB = None
WORKDIR = None
MPIEXEC = None
FASHION_MNIST = "/usr/share/datasets/fashion-mnist"
INSPECT_TOLERANCE = 1e-6  # inspect prints %.6e: 7 significant digits

TRANSFORMER = """\
    name = "{name}"
    seed = 3
    [model]
    type = "transformer"
    layers = 2
    width = 16
    heads = 2
    vocab = 32
    seq_len = 8
    [data]
    kind = "markov"
    [train]
    steps = {steps}
    batch = 4
    lr = 1e-2
    eval_every = 3
    [record]
    every = 1
    [device]
    threads = 1
    """
MLP = """\
    name = "mlp"
    [model]
    type = "mlp"
    layers = 3
    width = 16
    residual = true
    [data]
    kind = "gaussian"
    [train]
    steps = 3
    batch = 8
    eval_every = 0
    [record]
    every = 1
    [device]
    threads = 1
    """
RESNET = """\
    name = "resnet"
    [model]
    type = "resnet"
    depth = 8
    width = 1
    in_channels = 1
    image_size = 28
    classes = 10
    [data]
    kind = "idx"
    path = "{path}"
    [train]
    steps = 2
    batch = 4
    eval_every = 0
    [record]
    every = 1
    [device]
    threads = 1
    """
SWEEP = TRANSFORMER.format(name="grid", steps=3) + """\
    [sweep]
    grid = {{ "model.layers" = [1, 2] }}
    """.format()


def write_study(name, text):
    path = os.path.join(WORKDIR, name + ".toml")
    with open(path, "w") as handle:
        handle.write(textwrap.dedent(text))
    return path


def run_study(name, text, out):
    study = write_study(name, text)
    result = subprocess.run([PROPLAB, "run", study, "--out", out, "--force"], capture_output=True, text=True)
    if result.returncode != 0:
        raise AssertionError("proplab run %s failed (%d):\n%s%s" % (study, result.returncode, result.stdout,
                                                                    result.stderr))
    return os.path.join(out, name + ".h5")


def inspect(path, *args):
    result = subprocess.run([PROPLAB, "inspect", path] + list(args), capture_output=True, text=True)
    if result.returncode != 0:
        raise AssertionError("proplab inspect %s %s failed (%d):\n%s" % (path, " ".join(args), result.returncode,
                                                                         result.stderr))
    return result.stdout


def inspect_table(path, direction, stat, step):
    """`proplab inspect` depth table: (step, [(depth, block, kind, name, value)])."""
    args = ["--stat", stat, "--step", str(step)] + (["--backward"] if direction == "backward" else [])
    text = inspect(path, *args)
    match = re.search(r"^%s %s at step (\d+) \(record \d+ of \d+\):\n.*?\n((?:.+\n?)*)" % (direction, stat), text,
                      re.M)
    if not match:
        raise AssertionError("no depth table in `proplab inspect %s`:\n%s" % (" ".join(args), text))
    rows = []
    for line in match.group(2).splitlines():
        depth, block, kind, name, value = line.split()
        rows.append((int(depth), -1 if block == "-" else int(block), kind, name, float(value)))
    return int(match.group(1)), rows


def summary(text):
    """`proplab inspect` summary lines as {label: value}."""
    lines = {}
    for line in text.splitlines():
        if not line.strip():
            break
        label, _, value = line.partition(":")
        lines[label.strip()] = value.strip()
    return lines


def text_attr(value):
    return value.decode() if isinstance(value, (bytes, np.bytes_)) else value


def h5_strings(dataset):
    return [text_attr(v) for v in dataset[()]]


def assert_same(test, actual, expected, what):
    actual, expected = np.asarray(actual, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    test.assertEqual(actual.shape, expected.shape, what)
    test.assertTrue(np.array_equal(actual, expected, equal_nan=True), "%s: package and h5py differ" % what)


def assert_close_to_inspect(test, package_values, inspect_values, what):
    for depth, (mine, printed) in enumerate(zip(package_values, inspect_values)):
        if math.isnan(printed):
            test.assertTrue(math.isnan(mine), "%s depth %d: inspect NaN, package %r" % (what, depth, mine))
        else:
            test.assertTrue(math.isclose(mine, printed, rel_tol=INSPECT_TOLERANCE, abs_tol=1e-300),
                            "%s depth %d: package %r, inspect %r" % (what, depth, mine, printed))


def check_against_h5py(test, run, path):
    """Every frame of `run` against the datasets of `path` read with h5py (SWMR when the file is marked open)."""
    with h5py.File(path, "r", swmr=run.swmr) as f:
        steps = f["steps"][()]
        names, kinds = h5_strings(f["probes/name"]), h5_strings(f["probes/kind"])
        probes = run.probes()
        test.assertEqual(probes["probe"].tolist(), names)
        test.assertEqual(probes["kind"].tolist(), kinds)
        test.assertEqual(probes["block"].tolist(), f["probes/block"][()].tolist())
        test.assertEqual(probes["depth"].tolist(), f["probes/depth"][()].tolist())
        stats = run.stats()
        test.assertEqual(list(stats.columns), ["step", "direction", "stat", "depth", "probe", "kind", "block", "value"])
        for direction in ("forward", "backward"):
            test.assertEqual(run.stat_names(direction), sorted(f[direction]))
            for stat in f[direction]:
                expected = f[direction][stat][()]
                # Whole records only: a file whose writer was killed mid-record may hold more rows in some series
                # than in others; the package keeps the records that every series of the direction has.
                records = min([len(steps)] + [len(f[direction][name]) for name in f[direction]])
                part = stats[(stats["direction"] == direction) & (stats["stat"] == stat)]
                test.assertEqual(len(part), records * len(names), "%s/%s rows" % (direction, stat))
                assert_same(test, part["value"].to_numpy().reshape(records, len(names)), expected[:records],
                            "%s/%s" % (direction, stat))
                test.assertEqual(part["step"].to_numpy()[::len(names)].tolist(), steps[:records].tolist())
                test.assertEqual(part["probe"].tolist(), names * records)
                assert_same(test, run.stat_table(stat, direction).to_numpy(), expected[:records],
                            "stat_table %s/%s" % (direction, stat))
        params = run.params()
        param_names = h5_strings(f["params/name"])
        for stat in run.stat_names("params"):
            part = params[params["stat"] == stat]
            expected = f["params"][stat][()]
            records = min([len(steps)] + [len(f["params"][name]) for name in f["params"] if name != "name"])
            assert_same(test, part["value"].to_numpy().reshape(-1, len(param_names)), expected[:records],
                        "params/" + stat)
            test.assertEqual(part["param"].tolist()[:len(param_names)], param_names)
        train = run.train()
        rows = min(len(f["train"][c]) for c in f["train"])
        test.assertEqual(len(train), rows)
        for column in f["train"]:
            assert_same(test, train[column], f["train"][column][:rows], "train/" + column)
        evals = run.eval()
        for column in f["eval"]:
            assert_same(test, evals[column], f["eval"][column][()], "eval/" + column)
        theory = run.theory(measured=True)
        for direction in f["theory"]:
            for stat in f["theory"][direction]:
                part = theory[(theory["direction"] == direction) & (theory["stat"] == stat)]
                assert_same(test, part["value"], f["theory"][direction][stat][()], "theory/%s/%s" % (direction, stat))
                if len(steps) and steps[0] == 0 and stat in f[direction]:
                    assert_same(test, part["measured"], f[direction][stat][0], "measured %s/%s" % (direction, stat))
        test.assertEqual(theory.attrs.get("no_prediction"), text_attr(f["theory"].attrs["no_prediction"]))
        for key, value in f.attrs.items():
            expected = text_attr(value)
            expected = int(expected) if isinstance(expected, np.integer) else expected
            test.assertEqual(run.attrs[key], expected, "attribute " + key)


def check_against_inspect(test, run, path, steps=None):
    """The depth tables and summary lines of `proplab inspect` (RunReader) against the package's frames."""
    recorded = run.steps.tolist()
    chosen = steps if steps is not None else sorted({recorded[0], recorded[len(recorded) // 2], recorded[-1]})
    stats = run.stats()
    # var at every chosen step, the other statistics at the last one (each table is one inspect process)
    tables = [(direction, stat, step) for direction in ("forward", "backward") for stat in run.stat_names(direction)
              for step in (chosen if stat == "var" else chosen[-1:])]
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        printed = list(pool.map(lambda table: inspect_table(path, *table), tables))
    for (direction, stat, step), (printed_step, rows) in zip(tables, printed):
        test.assertEqual(printed_step, step)
        part = stats[(stats["direction"] == direction) & (stats["stat"] == stat) & (stats["step"] == step)]
        test.assertEqual(part["probe"].tolist(), [r[3] for r in rows])
        test.assertEqual(part["kind"].tolist(), [r[2] for r in rows])
        test.assertEqual(part["block"].tolist(), [r[1] for r in rows])
        assert_close_to_inspect(test, part["value"].tolist(), [r[4] for r in rows],
                                "%s %s step %d" % (direction, stat, step))
    lines = summary(inspect(path))
    test.assertEqual(lines["status"].split()[0], run.status)
    test.assertEqual(lines["name"], run.name)
    test.assertEqual(lines["probes"], str(len(run.probes())))
    test.assertEqual(lines["records"], "%d (steps %d..%d)" % (len(recorded), recorded[0], recorded[-1]))
    train = run.train()
    test.assertEqual(lines["train"], "%d rows, last loss %.6g at step %d"
                     % (len(train), train["loss"].iloc[-1], train["step"].iloc[-1]))
    evals = run.eval()
    if len(evals):
        test.assertEqual(lines["eval"], "%d rows, last loss %.6g at step %d"
                         % (len(evals), evals["loss"].iloc[-1], evals["step"].iloc[-1]))
    test.assertEqual("note" in lines, run.swmr, "inspect notes SWMR mode exactly when the package uses it")


class FinishedTransformer(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.path = run_study("tiny", TRANSFORMER.format(name="tiny", steps=6), os.path.join(WORKDIR, "tiny"))
        cls.reader = proplab.open_run(cls.path)

    @classmethod
    def tearDownClass(cls):
        cls.reader.close()

    def test_attributes(self):
        run = self.reader
        self.assertEqual(run.status, "completed")
        self.assertFalse(run.swmr)
        self.assertEqual(run.name, "tiny")
        self.assertEqual(run.config_dict["model"]["width"], 16)
        self.assertEqual(parse_toml_minimal(run.config), parse_toml(run.config))
        self.assertEqual(run.steps.tolist(), list(range(6)))
        self.assertIn("'tiny' completed", repr(run))

    def test_against_h5py(self):
        check_against_h5py(self, self.reader, self.path)

    def test_against_inspect(self):
        check_against_inspect(self, self.reader, self.path)

    def test_a_partial_record_is_left_out_of_every_frame(self):
        # A writer killed mid-record: one statistic of /forward holds a row more than the others (and /steps).
        # stats() and stat_table() of any statistic, the longer one included, keep the whole records only.
        partial = os.path.join(WORKDIR, "tiny", "partial.h5")
        shutil.copyfile(self.path, partial)
        with h5py.File(partial, "r+") as f:
            longer = sorted(f["forward"])[0]
            f["steps"].resize((len(f["steps"]) + 1,))
            f["steps"][-1] = 6
            dataset = f["forward"][longer]
            dataset.resize((dataset.shape[0] + 1, dataset.shape[1]))
            dataset[-1] = 1.0
        with proplab.open_run(partial) as run:
            for stat in run.stat_names("forward"):
                self.assertEqual(len(run.stat_table(stat, "forward")), 6, stat)
            self.assertEqual(len(run.stats(direction="forward", stat=longer)), 6 * len(run.probes()))

    def test_selection(self):
        run = self.reader
        probes = len(run.probes())
        part = run.stats(direction="forward", stat=["var", "rms"], step=[0, 2])
        self.assertEqual(len(part), 2 * 2 * probes)
        self.assertEqual(sorted(set(part["step"])), [0, 2])
        self.assertEqual(len(run.stats(step=99)), 0)
        with self.assertRaisesRegex(ValueError, "not_a_stat"):
            run.stats(stat="not_a_stat")
        with self.assertRaisesRegex(ValueError, "direction"):
            run.stats(direction="sideways")
        self.assertEqual(len(run.params(stat="weight_rms", step=5)), len(run.read("/params/name")))
        self.assertEqual(len(run.replicas()), 0)
        self.assertEqual(len(run.blocks()), 0)
        self.assertEqual(run.eval()["step"].tolist(), [3, 6])


class OtherModels(unittest.TestCase):
    def test_mlp(self):
        path = run_study("mlp", MLP, os.path.join(WORKDIR, "mlp"))
        with proplab.open_run(path) as run:
            check_against_h5py(self, run, path)
            check_against_inspect(self, run, path)
            self.assertIn("preact", set(run.probes()["kind"]))
            corr = run.stats(direction="forward", stat="corr")
            self.assertTrue(corr["value"].isna().all(), "an MLP's samples are one token: corr is NaN")

    def test_resnet_blocks(self):
        if not os.path.isdir(FASHION_MNIST):
            self.skipTest("%s missing (Debian's dataset-fashion-mnist): no ResNet run" % FASHION_MNIST)
        path = run_study("resnet", RESNET.format(path=FASHION_MNIST), os.path.join(WORKDIR, "resnet"))
        with proplab.open_run(path) as run, h5py.File(path, "r") as f:
            check_against_inspect(self, run, path, steps=[0])
            blocks = run.blocks()
            self.assertEqual(blocks["stage"].tolist(), f["blocks/stage"][()].tolist())
            self.assertEqual(blocks["transition"].tolist(), [bool(t) for t in f["blocks/transition"][()]])
            probes = run.probes()
            inside = probes[probes["block"] >= 0]
            self.assertEqual(inside["stage"].tolist(), [blocks["stage"][b] for b in inside["block"]])
            self.assertTrue((probes[probes["block"] < 0]["stage"] == -1).all())

    def test_data_parallel_replicas(self):
        if not MPIEXEC:
            self.skipTest("no mpirun given: no data-parallel run")
        study = write_study("dp", TRANSFORMER.format(name="dp", steps=4))
        out = os.path.join(WORKDIR, "dp")
        env = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        result = subprocess.run([MPIEXEC, "-np", "2", "--oversubscribe", PROPLAB, "run", study, "--set",
                                 "parallel.dp=2", "--set", "parallel.dp_mode=gossip", "--out", out, "--force"],
                                capture_output=True, text=True, env=env)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        path = os.path.join(out, "dp.h5")
        with proplab.open_run(path) as run, h5py.File(path, "r") as f:
            replicas = run.replicas()
            names = h5_strings(f["params/name"]) + [proplab.ALL_PARAMS]
            steps = f["replicas/steps"][()]
            self.assertEqual(replicas["param"].tolist(), names * len(steps))
            self.assertEqual(replicas["step"].tolist(), np.repeat(steps, len(names)).tolist())
            for column in ("disagreement", "disagreement_before_mix"):
                expected = np.concatenate([f["replicas"][column][()], f["replicas"][column + "_total"][()]], axis=1)
                assert_same(self, replicas[column].to_numpy().reshape(len(steps), -1), expected, "replicas/" + column)
            self.assertTrue((replicas["disagreement_before_mix"] > 0).any(), "gossip replicas drift apart")
            self.assertEqual(len(run.compression()), 0)

    def test_compressed_exchange(self):
        if not MPIEXEC:
            self.skipTest("no mpirun given: no data-parallel run")
        study = write_study("compressed", TRANSFORMER.format(name="compressed", steps=4))
        out = os.path.join(WORKDIR, "compressed")
        env = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        result = subprocess.run([MPIEXEC, "-np", "2", "--oversubscribe", PROPLAB, "run", study, "--set",
                                 "parallel.dp=2", "--set", "parallel.compress=topk", "--out", out, "--force"],
                                capture_output=True, text=True, env=env)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        path = os.path.join(out, "compressed.h5")
        with proplab.open_run(path) as run, h5py.File(path, "r") as f:
            compression = run.compression()
            names = h5_strings(f["params/name"]) + [proplab.ALL_PARAMS]
            steps = f["compression/steps"][()]
            self.assertGreater(len(steps), 0)
            self.assertEqual(compression["param"].tolist(), names * len(steps))
            self.assertEqual(compression["step"].tolist(), np.repeat(steps, len(names)).tolist())
            for column in ("error", "residual"):
                expected = np.concatenate([f["compression"][column][()], f["compression"][column + "_total"][()]],
                                          axis=1)
                assert_same(self, compression[column].to_numpy().reshape(len(steps), -1), expected,
                            "compression/" + column)
            self.assertTrue((compression["residual"] > 0).any(), "topk keeps a residual")


def start_long_run(name):
    study = write_study(name, TRANSFORMER.format(name=name, steps=1000000))
    out = os.path.join(WORKDIR, name)
    shutil.rmtree(out, ignore_errors=True)
    log = open(os.path.join(WORKDIR, name + ".log"), "w")
    process = subprocess.Popen([PROPLAB, "run", study, "--out", out, "--force"], stdout=log, stderr=subprocess.STDOUT)
    return process, os.path.join(out, name + ".h5")


def wait_for(condition, what, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = condition()
        except (OSError, ValueError, KeyError):  # the file is not there yet, or not yet switched to SWMR writing
            value = None
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("timed out after %.0f s waiting for %s" % (timeout, what))


def records_at_least(run, count):
    return len(run.steps) >= count and len(run.train()) >= count


class LiveAndKilled(unittest.TestCase):
    def tearDown(self):
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def test_live_run_grows_then_ends_on_refresh(self):
        self.process, path = start_long_run("live")
        run = wait_for(lambda: proplab.open_run(path), "the running file to open")
        self.assertTrue(run.swmr, "a file a writer has open is read in SWMR mode")
        self.assertEqual(run.status, "running")
        wait_for(lambda: records_at_least(run, 1), "the first record")
        seen = len(run.steps)
        # The same open Run sees the rows flushed since (datasets are refreshed on every read).
        wait_for(lambda: len(run.steps) > seen and len(run.train()) > seen, "more records without reopening")
        stats = run.stats(direction="forward", stat="var")
        self.assertEqual(len(stats) % len(run.probes()), 0, "whole records only")
        self.assertIs(run.refresh(), run)
        self.assertEqual(run.status, "running")
        self.process.send_signal(signal.SIGTERM)  # stops at the next step boundary, status failed (interrupted)
        self.assertEqual(self.process.wait(timeout=60), 4)
        self.assertEqual(run.status, "running", "attributes are those of the last open until refresh()")
        run.refresh()
        self.assertFalse(run.swmr)
        self.assertEqual(run.status, "failed")
        self.assertTrue(run.status_detail.startswith("interrupted at step"), run.status_detail)
        stopped_at = int(re.search(r"step (\d+)", run.status_detail).group(1))
        self.assertEqual(len(run.train()), stopped_at)
        check_against_h5py(self, run, path)
        run.close()

    def test_killed_run(self):
        self.process, path = start_long_run("killed")
        probe = wait_for(lambda: proplab.open_run(path), "the running file to open")
        wait_for(lambda: records_at_least(probe, 2), "two records")
        seen = len(probe.steps)
        probe.close()
        self.process.kill()
        self.process.wait()
        with proplab.open_run(path) as run:
            self.assertTrue(run.swmr, "a killed writer leaves the file marked open for write")
            self.assertEqual(run.status, "running")
            self.assertGreaterEqual(len(run.steps), seen)
            check_against_h5py(self, run, path)
            # The kill can fall between a record's rows: /steps may hold a step whose statistics were not all
            # written, which neither the package's frames nor inspect show. The last whole record's step:
            before = run.stats()
            whole = int(before.groupby(["direction", "stat"])["step"].max().min())
            check_against_inspect(self, run, path, steps=[0, whole])
        result = subprocess.run([PROPLAB, "recover", path], capture_output=True, text=True)
        self.assertEqual(result.returncode, 0, result.stderr)
        with proplab.open_run(path) as run:
            self.assertFalse(run.swmr)
            self.assertEqual((run.status, run.status_detail), ("failed", "killed"))
            self.assertTrue(run.stats().equals(before), "recover keeps every row")


class SweepFolder(unittest.TestCase):
    def test_open_sweep(self):
        study = write_study("grid", SWEEP)
        out = os.path.join(WORKDIR, "grid")
        shutil.rmtree(out, ignore_errors=True)
        result = subprocess.run([PROPLAB, "sweep", study, "--jobs", "1", "--out", out], capture_output=True,
                                text=True)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        with open(study) as handle:  # the fallback TOML parser (Python < 3.11) on a [sweep] table's inline tables
            text = handle.read()
        self.assertEqual(parse_toml_minimal(text), parse_toml(text))
        self.assertEqual(parse_toml_minimal(text)["sweep"]["grid"], {"model.layers": [1, 2]})
        with proplab.open_sweep(out) as sweep:
            index = sweep.index
            self.assertEqual(sweep.keys, ["model.layers"])
            self.assertEqual(index["model.layers"].tolist(), [1, 2])
            self.assertEqual(str(index["model.layers"].dtype), "int64")
            self.assertEqual(index["status"].tolist(), ["completed", "completed"])
            self.assertEqual(index["steps"].tolist(), [3, 3])
            self.assertEqual(len(sweep), 2)
            for name, run in sweep.runs():
                row = index[index["run"] == name].iloc[0]
                self.assertEqual(run.path, row["path"])
                self.assertEqual(run.config_dict["model"]["layers"], row["model.layers"])
                # final_loss is written in the shortest text that reads back as the same double
                self.assertEqual(run.train()["loss"].iloc[-1], row["final_loss"])
                self.assertEqual(run.eval()["loss"].iloc[-1], row["final_val_loss"])
            stats = sweep.stats(stat="var", step=0)
            self.assertEqual(list(stats.columns[:2]), ["run", "model.layers"])
            self.assertEqual(len(stats), sum(2 * len(run.probes()) for _, run in sweep.runs()))
            for name, run in sweep.runs():
                mine = stats[stats["run"] == name].drop(columns=["run", "model.layers"]).reset_index(drop=True)
                self.assertTrue(mine.equals(run.stats(stat="var", step=0)))
            self.assertEqual(len(sweep.train()), 6)
            with self.assertRaisesRegex(KeyError, "layers=1"):
                sweep.run("no-such-run")
        with self.assertRaisesRegex(FileNotFoundError, "index.csv"):
            proplab.open_sweep(os.path.join(WORKDIR, "tiny"))


class Errors(unittest.TestCase):
    def test_missing_file(self):
        path = os.path.join(WORKDIR, "absent.h5")
        with self.assertRaises(FileNotFoundError) as caught:
            proplab.open_run(path)
        self.assertIn(path, str(caught.exception))

    def test_not_hdf5(self):
        path = os.path.join(WORKDIR, "notes.h5")
        with open(path, "w") as handle:
            handle.write("not HDF5\n")
        with self.assertRaisesRegex(ValueError, re.escape(path) + ".*cannot be opened as HDF5"):
            proplab.open_run(path)

    def test_other_hdf5(self):
        path = os.path.join(WORKDIR, "other.h5")
        with h5py.File(path, "w") as f:
            f["x"] = np.arange(3)
        with self.assertRaisesRegex(proplab.RunFileError, "no root attribute 'format'"):
            proplab.open_run(path)
        with h5py.File(path, "a") as f:
            f.attrs["format"] = np.bytes_("proplab-checkpoint")
        with self.assertRaisesRegex(ValueError, "'proplab-checkpoint' \\(expected 'proplab-run'\\)"):
            proplab.open_run(path)
        with h5py.File(path, "a") as f:
            f.attrs["format"] = np.bytes_("proplab-run")
            f.attrs["format_version"] = np.int64(2)
        with self.assertRaisesRegex(ValueError, "format_version 2"):
            proplab.open_run(path)

    def test_folder(self):
        with self.assertRaisesRegex(ValueError, "is a folder"):
            proplab.open_run(WORKDIR)


class Packaging(unittest.TestCase):
    def test_version_is_the_projects(self):
        with open(os.path.join(SOURCE, "CMakeLists.txt")) as handle:
            project = re.search(r"project\(proplab VERSION ([0-9.]+)", handle.read()).group(1)
        with open(os.path.join(SOURCE, "python", "pyproject.toml")) as handle:
            pyproject = re.search(r'^version = "([^"]+)"', handle.read(), re.M).group(1)
        self.assertEqual((pyproject, proplab.__version__), (project, project))
        result = subprocess.run([PROPLAB, "--version"], capture_output=True, text=True)
        self.assertIn(project, result.stdout)

    def test_pip_install(self):
        with tempfile.TemporaryDirectory(dir=WORKDIR) as scratch:
            venv = os.path.join(scratch, "venv")
            # The system's pip (and setuptools) from inside the venv, which installs into the venv: no download,
            # and no time spent putting pip into the venv.
            result = subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", venv],
                                    capture_output=True, text=True)
            python = os.path.join(venv, "bin", "python")
            if result.returncode == 0:
                result = subprocess.run([python, "-m", "pip", "--version"], capture_output=True, text=True)
            if result.returncode != 0:
                self.skipTest("no venv with pip here (Debian: python3-venv, python3-pip): %s" % result.stderr.strip())
            # --no-build-isolation builds with the setuptools and wheel already there (pyproject.toml needs >= 61)
            result = subprocess.run([python, "-c", "import setuptools, wheel; print(setuptools.__version__)"],
                                    capture_output=True, text=True)
            if result.returncode != 0 or int(result.stdout.split(".")[0]) < 61:
                self.skipTest("no setuptools >= 61 with wheel here to build the package offline (Debian: "
                              "python3-setuptools, python3-wheel): %s" % (result.stdout + result.stderr).strip())
            source = os.path.join(scratch, "python")  # a copy: building writes build/ and *.egg-info beside it
            shutil.copytree(os.path.join(SOURCE, "python"), source,
                            ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
            result = subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                                     "--no-index", source], capture_output=True, text=True)
            self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
            result = subprocess.run([python, "-c",
                                     "import proplab; print(proplab.__file__); print(proplab.open_run(%r).status)"
                                     % os.path.join(WORKDIR, "tiny", "tiny.h5")],
                                    capture_output=True, text=True, cwd=scratch)
            self.assertEqual(result.returncode, 0, result.stderr)
            installed, status = result.stdout.split()
            self.assertTrue(installed.startswith(venv), installed)
            self.assertEqual(status, "completed")


def main():
    global PROPLAB, WORKDIR, MPIEXEC
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    PROPLAB, WORKDIR = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    MPIEXEC = sys.argv[3] if len(sys.argv) > 3 else None
    shutil.rmtree(WORKDIR, ignore_errors=True)
    os.makedirs(WORKDIR)
    loader = unittest.TestLoader()
    # Packaging reads the finished transformer's file, so it runs after FinishedTransformer.
    suite = unittest.TestSuite(loader.loadTestsFromTestCase(case) for case in (
        FinishedTransformer, OtherModels, LiveAndKilled, SweepFolder, Errors, Packaging))
    result = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(suite)
    sys.exit(0 if result.wasSuccessful() else 1)


if __name__ == "__main__":
    main()
