#!/usr/bin/env python3
"""scripts/comm_model.py's formulas on hand-computed cases, and its --markdown output.

    test_comm_model.py [PATH/TO/comm_model.py]   (default: ../../scripts/comm_model.py from this file)
"""

import importlib.util
import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.normpath(os.path.join(HERE, "..", "..", "scripts", "comm_model.py"))


def load(path):
    spec = importlib.util.spec_from_file_location("comm_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


cm = None


def inputs(**changes):
    """GPT-2 124M's shape and batch with round link numbers, no per-call cost."""
    p = dict(cm.DEFAULTS)
    p.update(layers=12, width=768, seq_len=1024, heads=12, ffn_mult=4, vocab=50304, batch=16, step_ms=40.0,
             intra_alpha_us=2.0, intra_GBps=100.0, inter_alpha_us=10.0, inter_GBps=10.0, call_us=0.0,
             overlap=0.5, bucket_mb=25.0, inter_algorithm="ring")
    p["params"] = cm.transformer_params(p)
    p.update(changes)
    return p


class Formulas(unittest.TestCase):
    def test_ring_all_reduce_one_node(self):
        # 1 MiB on 8 ranks: 2*7/8 * 2^20 B / 100 GB/s + 2*7 * 2 us = 18.35008 us + 28 us.
        p = inputs()
        self.assertAlmostEqual(cm.all_reduce_s(2**20, 8, 1, p) * 1e6, 46.35008, places=6)
        # The per-call cost adds once.
        self.assertAlmostEqual(cm.all_reduce_s(2**20, 8, 1, inputs(call_us=5.0)) * 1e6, 51.35008, places=6)
        self.assertEqual(cm.all_reduce_s(2**20, 1, 1, p), 0.0)

    def test_hierarchical_all_reduce_two_nodes(self):
        # 8 GPUs x 2 nodes, 1 MiB: NVLink 2*7/8 * 2^20 / 1e11 = 18.35008 us; network 2*1/2 * 2^17 / 1e10 = 13.1072 us.
        # Ring latency 2*(16-2)*2 + 2*1*10 = 76 us; tree 2*7*2 + 2*1*10 = 48 us.
        ring = cm.all_reduce_s(2**20, 8, 2, inputs(inter_algorithm="ring")) * 1e6
        tree = cm.all_reduce_s(2**20, 8, 2, inputs(inter_algorithm="tree")) * 1e6
        auto = cm.all_reduce_s(2**20, 8, 2, inputs(inter_algorithm="auto")) * 1e6
        self.assertAlmostEqual(ring, 18.35008 + 13.1072 + 76.0, places=6)
        self.assertAlmostEqual(tree, 18.35008 + 13.1072 + 48.0, places=6)
        self.assertAlmostEqual(auto, tree, places=9)

    def test_bubble_fraction(self):
        self.assertAlmostEqual(cm.bubble_fraction(4, 8), 3 / 11)
        self.assertAlmostEqual(cm.bubble_fraction(2, 4), 0.2)
        self.assertEqual(cm.bubble_fraction(1, 7), 0.0)

    def test_pipeline_bubble_in_the_step(self):
        # pp = 2, m = 16 on 2 GPUs of one node (dp = 1, tp = 1): the bubble is W * (pp - 1) / m, a fraction
        # (pp - 1) / (m + pp - 1) of W + bubble.
        row = cm.model_step(inputs(), 2, 1, 2)
        work = row["compute_ms"] + row["pp_p2p_ms"]
        self.assertAlmostEqual(row["bubble_ms"], work / 16, places=9)
        self.assertAlmostEqual(row["bubble_ms"] / (work + row["bubble_ms"]), cm.bubble_fraction(2, 16), places=9)

    def test_one_gpu_is_fully_efficient(self):
        row = cm.model_step(inputs(), 1, 1, 1)
        self.assertEqual(row["efficiency"], 1.0)
        self.assertEqual(row["step_ms"], 40.0)
        self.assertEqual(row["exposed_comm_ms"], 0.0)

    def test_data_parallel_exposed_part(self):
        # dp = 8 in one node: the all-reduce of 4 N bytes in 25 MiB buckets, half hidden (overlap 0.5) unless it
        # outlasts the backward window (2/3 of 40 ms).
        p = inputs()
        row = cm.model_step(p, 8, 1, 1)
        bucket = 25 * 2**20
        full, rest = divmod(4 * p["params"], bucket)
        total = full * cm.all_reduce_s(bucket, 8, 1, p) + cm.all_reduce_s(rest, 8, 1, p)
        self.assertAlmostEqual(row["dp_allreduce_ms"], total * 1e3, places=9)
        self.assertAlmostEqual(row["dp_exposed_ms"], max(0.5 * total, total - 0.04 * 2 / 3) * 1e3, places=9)
        self.assertAlmostEqual(row["step_ms"], 40.0 + row["dp_exposed_ms"], places=9)

    def test_step_time_grows_with_gpus(self):
        p = inputs()
        for layout in ("dp", "tp2", "tp4", "tp4pp2"):
            tp, pp = cm.parse_layout(layout)
            steps = [cm.model_step(p, n, tp, pp) for n in cm.DEFAULT_GPUS]
            steps = [r["step_ms"] for r in steps if r is not None]
            self.assertGreater(len(steps), 4, layout)
            self.assertEqual(steps, sorted(steps), layout)

    def test_gpt2_parameter_count(self):
        # GPT-2 small with learned positions and a tied head: 124,439,808.
        self.assertEqual(cm.transformer_params(dict(layers=12, width=768, seq_len=1024, ffn_mult=4, vocab=50257)),
                         124439808)

    def test_layouts_and_refusals(self):
        self.assertEqual(cm.parse_layout("dp"), (1, 1))
        self.assertEqual(cm.parse_layout("tp4pp2"), (4, 2))
        self.assertEqual(cm.parse_layout("pp4"), (1, 4))
        self.assertIsNone(cm.model_step(inputs(), 8, 4, 4))  # 16 GPUs needed
        self.assertIn("heads 12 % tp 8 != 0", cm.model_step(inputs(), 8, 8, 1)["proplab_refuses"])
        self.assertIn("vocab 50257 % tp 2 != 0", cm.model_step(inputs(vocab=50257), 8, 2, 1)["proplab_refuses"])


class CommandLine(unittest.TestCase):
    def test_markdown_prints_every_row(self):
        out = subprocess.run([sys.executable, SCRIPT, "--markdown", "--gpus", "8,16,1024", "--layouts", "dp,tp4"],
                             check=True, capture_output=True, text=True).stdout
        rows = [line for line in out.splitlines() if line.startswith("| ") and line[2].isdigit()]
        self.assertEqual(len(rows), 6, out)
        self.assertTrue(rows[0].startswith("| 8 | dp8 |"), rows[0])
        self.assertTrue(rows[-1].startswith("| 1024 | dp256·tp4 |"), rows[-1])
        self.assertIn("FLOP estimate", out)

    def test_unknown_input_is_refused(self):
        result = subprocess.run([sys.executable, SCRIPT, "--set", "nvlink=1"], capture_output=True, text=True)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("unknown input 'nvlink'", result.stderr)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1].endswith(".py"):
        SCRIPT = os.path.abspath(sys.argv.pop(1))
    cm = load(SCRIPT)
    unittest.main()
