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
    cell = re.compile(r"^(\d+\.\d% / \d+\.\d%( \(±\d+\.\d%\))?( \(\d+ of \d+ without a finite value\))?|-)$")
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
        assert len(fields) == 5, row
        model, rule, _, forward, backward = fields
        assert cell.match(forward), row
        assert cell.match(backward), row
        if model.startswith("transformer"):
            seen.add((model, rule.strip("`")))
            assert forward != "-" and backward != "-", row
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
    print(f"theory_accuracy --quick: {len(rows)} rows, all well-formed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
