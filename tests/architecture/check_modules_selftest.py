#!/usr/bin/env python3
"""The architecture check catches what it is for (ctest architecture.catches_wrong_arrows): on small planted trees
it must fail, naming file and line, for an include its module does not declare, for a declared module that nothing
includes, for a cycle and for theory using models; and pass on a clean tree.

usage: check_modules_selftest.py CHECK_MODULES_PY
"""
import os
import subprocess
import sys
import tempfile


def plant(root, files, deps):
    for path, text in files.items():
        os.makedirs(os.path.join(root, os.path.dirname(path)), exist_ok=True)
        with open(os.path.join(root, path), "w") as f:
            f.write(text)
    with open(os.path.join(root, "module_deps.txt"), "w") as f:
        f.write("absent: kernels\n" + "".join("%s: %s\n" % (m, " ".join(d)) for m, d in deps.items()))


def check(script, files, deps):
    with tempfile.TemporaryDirectory() as root:
        plant(root, files, deps)
        result = subprocess.run([sys.executable, script, os.path.join(root, "module_deps.txt"), root],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        return result.returncode, result.stdout


def main():
    script = sys.argv[1]
    failures = []
    clean = {
        "src/core/error.h": "#pragma once\n",
        "src/spec/model.h": "#pragma once\n",
        "src/theory/moments.cpp": '#include "theory/moments.h"\n#include "core/error.h"\n#include "spec/model.h"\n',
        "src/theory/moments.h": "#pragma once\n",
        "src/models/model.h": '#include "theory/moments.h"\n',
        "src/ops/residual.cpp": '#ifdef PROPLAB_WITH_CUDA\n#include "kernels/residual.cuh"\n#endif\n',
    }
    deps = {"core": [], "spec": [], "theory": ["core", "spec"], "models": ["theory"], "ops": []}
    code, out = check(script, clean, deps)
    if code != 0:
        failures.append("a clean tree failed:\n" + out)

    cases = [
        ("an undeclared include",
         dict(clean, **{"src/theory/moments.cpp": clean["src/theory/moments.cpp"] + '#include "models/model.h"\n'}),
         deps, 'src/theory/moments.cpp:4: includes "models/model.h", but module theory does not declare models'),
        ("a declared module nothing includes", clean, dict(deps, models=["theory", "spec"]),
         "module models declares spec but includes nothing from it"),
        ("a cycle",
         dict(clean, **{"src/theory/moments.h": '#include "models/model.h"\n'}),
         dict(deps, theory=["core", "spec", "models"]),
         "the modules form a cycle: models -> theory -> models"),
        ("an include through src/",
         dict(clean, **{"src/models/model.h": '#include "src/theory/moments.h"\n'}), deps,
         'src/models/model.h:1: includes "src/theory/moments.h"; allowed: modules by their own path'),
        ("theory using more than spec and core",
         dict(clean, **{"src/theory/moments.h": '#include "ops/ops.h"\n', "src/ops/ops.h": "#pragma once\n"}),
         dict(deps, theory=["core", "spec", "ops"]),
         "module theory uses core, ops, spec; allowed: core, spec"),
    ]
    for label, files, declared, expected in cases:
        code, out = check(script, files, declared)
        if code != 1 or expected not in out:
            failures.append("%s: exit %d, expected 1 with `%s`:\n%s" % (label, code, expected, out))
    for f in failures:
        print(f)
    if failures:
        return 1
    print("architecture check: a clean tree passes; %d planted wrong arrows are each caught" % len(cases))
    return 0


if __name__ == "__main__":
    sys.exit(main())
