#!/usr/bin/env python3
"""bench/torch_reference.py, the PyTorch yardstick of bench_train and bench_resnet: its model formulas match
proplab's models, its arguments are checked, and, under every interpreter here that has torch (the bench virtual
environment's PyTorch 2.x, Debian's 1.13), one child step prints the JSON the benchmarks read.

    test_torch_reference.py [PATH/TO/torch_reference.py]   (default: ../../bench/torch_reference.py from this file)
"""

import importlib.util
import json
import math
import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.normpath(os.path.join(HERE, "..", "..", "bench", "torch_reference.py"))
tr = None


def load(path):
    spec = importlib.util.spec_from_file_location("torch_reference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def interpreters_with_torch():
    """(interpreter, torch major version) for the bench venv (PROPLAB_TORCH_PYTHON or .bench-venv) and Debian's."""
    root = os.path.dirname(os.path.dirname(SCRIPT))
    candidates = [os.environ.get("PROPLAB_TORCH_PYTHON") or os.path.join(root, ".bench-venv", "bin", "python"),
                  "/usr/bin/python3"]
    found = []
    for python in dict.fromkeys(candidates):
        if not os.path.exists(python):
            continue
        done = subprocess.run([python, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True)
        if done.returncode == 0:
            found.append((python, int(done.stdout.strip().split(".")[0])))
    return found


class Formulas(unittest.TestCase):
    def test_transformer_matches_bench_train(self):
        # bench_train prints 21.34 GFLOP/step for Transformer::train_flops and the model has 3,257,856 parameters.
        self.assertEqual(tr.step_flops(), 21340618752)
        self.assertEqual(tr.parameter_count(), 3257856)

    def test_resnet_matches_bench_resnet(self):
        # bench_resnet prints "ResNet-20, 272186 parameters" (ParamStore::count_elements).
        self.assertEqual(tr.resnet_parameter_count(), 272186)
        # Three stages of three blocks, the first of stages 2 and 3 strided with a projection shortcut.
        stages = tr.resnet_stages()
        self.assertEqual(len(stages), 9)
        self.assertEqual([s[2] for s in stages], [1, 1, 1, 2, 1, 1, 2, 1, 1])
        self.assertEqual(stages[-1][3], 7)


class Arguments(unittest.TestCase):
    def test_setup_parsing(self):
        self.assertEqual(tr.parse_setup("1,2"), (1, 2))
        self.assertEqual(tr.parse_setup("default,2"), (None, 2))
        for bad in ("1", "1,2,3", "a,b"):
            with self.assertRaises(Exception):
                tr.parse_setup(bad)

    def test_bad_variant_is_refused(self):
        done = subprocess.run([sys.executable, SCRIPT, "--variant", "fast"], capture_output=True, text=True)
        self.assertEqual(done.returncode, 2)
        self.assertIn("--variant", done.stderr)

    def test_venv_script_parses(self):
        script = os.path.join(os.path.dirname(SCRIPT), "make-torch-venv.sh")
        self.assertEqual(subprocess.run(["bash", "-n", script]).returncode, 0)


class ChildStep(unittest.TestCase):
    def test_one_step_under_every_torch(self):
        found = interpreters_with_torch()
        if not found:
            self.skipTest("no interpreter with torch here (bench/make-torch-venv.sh, or Debian's python3-torch)")
        first_losses = {}
        for python, major in found:
            for model in ("transformer", "resnet20"):
                with self.subTest(python=python, model=model):
                    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
                    done = subprocess.run([python, SCRIPT, "--model", model, "--setup", "1,1", "--steps", "1",
                                           "--warmup", "0", "--variant", "eager"], capture_output=True, text=True,
                                          env=env)
                    self.assertEqual(done.returncode, 0, done.stderr[-2000:])
                    row = json.loads(done.stdout.strip().splitlines()[-1])
                    self.assertEqual(row["variant"], "eager")
                    self.assertGreater(row["ms_per_step"], 0.0)
                    self.assertEqual(row["compile_available"], major >= 2)
                    # torch 2.x runs the modern path: SDPA (transformer) and a fused optimizer kernel.
                    if major >= 2:
                        self.assertEqual(row["sdpa"], model == "transformer")
                        self.assertTrue(row["fused_optimizer"])
                    # The first loss is the same model on the same data under any torch (1.13 and 2.x: 1e-6 apart):
                    # near ln 256 for the transformer (GPT-2's small init), ln 10 + 0.74 for the He-init ResNet.
                    expected = math.log(256) + 0.039 if model == "transformer" else math.log(10) + 0.738
                    self.assertLess(abs(row["first_loss"] - expected), 0.01)
                    first_losses.setdefault(model, []).append(row["first_loss"])
        for model, losses in first_losses.items():
            self.assertLess(max(losses) - min(losses), 1e-4, f"{model}: first losses differ between interpreters")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        SCRIPT = os.path.abspath(sys.argv.pop(1))
    tr = load(SCRIPT)
    unittest.main()
