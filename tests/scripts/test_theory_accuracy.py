#!/usr/bin/env python3
"""bench/theory_accuracy.py on its tiny shape (--quick): it sweeps every applicable rule x norm placement, the MLPs
and the ResNets through the real `proplab`, and writes a table with one well-formed row each.

Usage: test_theory_accuracy.py THEORY_ACCURACY_PY PROPLAB WORK_DIR
"""
import os
import re
import shutil
import subprocess
import sys


def main():
    script, proplab, work = sys.argv[1:4]
    shutil.rmtree(work, ignore_errors=True)
    result = subprocess.run([sys.executable, script, proplab, work, "--quick"], capture_output=True, text=True)
    if result.returncode != 0:
        print(result.stdout, result.stderr)
        return 1
    with open(os.path.join(work, "accuracy.md")) as f:
        table = f.read()
    assert table == result.stdout, "the table printed and the table written differ"
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| model")]
    cell = re.compile(r"^(\d+\.\d% / \d+\.\d%( \(±\d+\.\d% / ±\d+\.\d%\))?"
                      r"( \(\d+ of \d+ without a finite value\))?|-)$")
    corr_cell = re.compile(r"^(\d\.\d{3} / \d\.\d{3}( \(±\d\.\d{3} / ±\d\.\d{3}\))?"
                           r"( \(\d+ of \d+ without a finite value\))?|-)$")
    expected = {
        ("transformer, pre-LN", "standard"), ("transformer, pre-LN", "xavier"), ("transformer, pre-LN", "deepscalelm"),
        ("transformer, post-LN", "standard"), ("transformer, post-LN", "xavier"), ("transformer, post-LN", "deepnorm"),
        ("transformer, post-LN", "deepscalelm"), ("transformer, post-LN", "admin"),
        ("transformer, no norm", "standard"), ("transformer, no norm", "xavier"),
        ("transformer, no norm", "deepscalelm"), ("transformer, no norm", "tfixup"),
    }
    seen = set()
    for row in rows:
        fields = [f.strip() for f in row.strip("|").split("|")]
        assert len(fields) == 7, row
        model, rule, _, forward, backward, forward_corr, backward_corr = fields
        assert cell.match(forward), row
        assert cell.match(backward), row
        assert corr_cell.match(forward_corr) and corr_cell.match(backward_corr), row
        if model.startswith("transformer"):
            seen.add((model, rule.strip("`")))
            assert forward != "-" and backward != "-", row
            assert forward_corr != "-" and backward_corr != "-", row  # the tokens' correlation is predicted
        else:
            assert forward_corr == "-" and backward_corr == "-", row  # samples and images: no token correlation
        if model.startswith("ResNet"):
            assert forward != "-" and backward != "-", row  # forward and backward predictions
        if model.startswith("ResNet") or model.startswith("MLP"):
            assert "(±" in forward, row  # two seeds: the seed average's scatter is shown
        else:
            assert "(±" not in forward + backward, row  # one seed: no scatter
    assert seen == expected, f"transformer rows {sorted(seen)} != {sorted(expected)}"
    assert sum(1 for r in rows if r.startswith("| MLP")) == 6, table  # 3 plain, 3 residual
    assert sum(1 for r in rows if r.startswith("| MLP") and "residual" in r) == 3, table
    assert sum(1 for r in rows if r.startswith("| ResNet")) == 10, table  # basic/bottleneck x pre/post x rules
    # --only: just the named transformer rows, no MLPs or ResNets; a bad name is a usage error (exit 2).
    only = subprocess.run([sys.executable, script, proplab, os.path.join(work, "only"), "--quick", "--only",
                           "post:deepnorm"], capture_output=True, text=True)
    assert only.returncode == 0, only.stderr
    only_rows = [line for line in only.stdout.splitlines() if line.startswith("| ") and not line.startswith("| model")]
    assert len(only_rows) == 1 and only_rows[0].startswith("| transformer, post-LN | `deepnorm`"), only.stdout
    bad = subprocess.run([sys.executable, script, proplab, os.path.join(work, "bad"), "--only", "post:nonesuch"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "--only post:nonesuch" in bad.stderr, (bad.returncode, bad.stderr)
    # A pair the rule rejects (admin is Post-LN only) is a usage error too, not an empty sweep.
    rejected = subprocess.run([sys.executable, script, proplab, os.path.join(work, "rejected"), "--quick", "--only",
                               "pre:admin"], capture_output=True, text=True)
    assert rejected.returncode == 2 and "--only pre:admin" in rejected.stderr, (rejected.returncode, rejected.stderr)
    assert "MLPs" not in only.stdout.splitlines()[0], only.stdout  # the header names only what ran
    check_seed_averaging(script, work)
    print(f"theory_accuracy --quick: {len(rows)} rows, all well-formed; --only and the seed averaging hold")
    return 0


def check_seed_averaging(script, work):
    """Each run file holds its own prediction (it reads its own first batch): the seed-averaged measurement is
    compared with the seed-averaged prediction, and the worst probe's own scatter is reported beside it."""
    import importlib.util
    import h5py
    spec = importlib.util.spec_from_file_location("theory_accuracy", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    paths = []
    # Two probes; seed 1 measures (1.0, 2.0) against predictions (1.0, 1.0), seed 2 (1.2, 2.0) against (1.4, 3.0).
    for seed, measured, predicted in ((1, [1.0, 2.0], [1.0, 1.0]), (2, [1.2, 2.0], [1.4, 3.0])):
        path = os.path.join(work, f"seed{seed}.h5")
        with h5py.File(path, "w") as f:
            f["probes/name"] = [b"blocks.0.in", b"blocks.0.out"]
            f["probes/kind"] = [b"residual", b"residual"]
            f["forward/var"] = [measured]
            f["theory/forward/var"] = predicted
        paths.append(path)
    values, scatter, unpredicted = module.errors(paths, "forward", lambda name, kind: True)
    # Averages: measured (1.1, 2.0), predicted (1.2, 2.0): errors 1/12 and 0 (the last seed's prediction alone
    # would give 3/14 and 1/3).
    assert unpredicted == 0 and abs(values[0] - 1.0 / 12.0) < 1e-12 and values[1] == 0.0, values
    assert abs(scatter[0] - 0.1 / 1.2) < 1e-12 and scatter[1] == 0.0, scatter
    assert module.summary((values, scatter, 0)) == "4.2% / 8.3% (±4.2% / ±8.3%)", module.summary((values, scatter, 0))
    # A correlation is compared absolutely (it may be near 0 or negative): seed 1 measures (0.5, -0.02) against
    # (0.4, 0.0), seed 2 (0.7, 0.02) against (0.4, 0.0): errors |0.6 - 0.4| = 0.2 and 0 (relative: undefined).
    for seed, measured in ((1, [0.5, -0.02]), (2, [0.7, 0.02])):
        with h5py.File(paths[seed - 1], "a") as f:
            f["forward/corr"] = [measured]
            f["theory/forward/corr"] = [0.4, 0.0]
    values, scatter, unpredicted = module.errors(paths, "forward", lambda name, kind: True, "corr")
    assert unpredicted == 0 and abs(values[0] - 0.2) < 1e-12 and abs(values[1]) < 1e-12, values
    assert abs(scatter[0] - 0.1) < 1e-12 and abs(scatter[1] - 0.02) < 1e-12, scatter
    assert module.summary((values, scatter, 0), absolute=True) == "0.100 / 0.200 (±0.060 / ±0.100)", \
        module.summary((values, scatter, 0), absolute=True)


if __name__ == "__main__":
    sys.exit(main())
