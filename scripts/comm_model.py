#!/usr/bin/env python3
"""comm_model.py: an alpha-beta model of proplab's training step time on 8 to 1024 GPUs.

A model, not a measurement: it adds up compute, communication and pipeline bubble from a handful of inputs
(one GPU's step time, link latencies and bandwidths, the overlap of the gradient all-reduce with backward).
Its output is only as good as those inputs: measure them (bench/bench_nccl, bench/bench_gpu) and pass them in.

    scripts/comm_model.py [--inputs FILE.json] [--study studies/gpt2_124m.toml] [--markdown] [--json OUT.json]
                          [--gpus 8,16,...] [--layouts dp,tp2,tp4,tp8,tp4pp2,...] [--set key=value ...]
                          [--intra-bench NCCL.json] [--inter-bench NCCL.json]

Inputs (defaults below in DEFAULTS; --inputs FILE.json overrides any of them; --set key=value overrides one):
  step_ms            one GPU's compute time per step (ms) for the per-replica batch; null: from the FLOP estimate
                     flops_per_step / (peak_tflops * mfu)
  peak_tflops, mfu   the GPU's dense peak for the precision used and the assumed model FLOP utilisation
  params, layers, width, seq_len, heads, ffn_mult, vocab, batch
                     the model and the per-replica batch (sequences); read from --study, overridable
  bytes_per_value    bytes per communicated element (4: proplab's Communicator moves float32)
  bucket_mb          data-parallel all-reduce bucket size in MiB ([parallel] bucket_mb)
  microbatches       pipeline micro-batches per step (m); 0: the batch (one sequence per micro-batch)
  gpus_per_node      g (8)
  intra_alpha_us, intra_GBps   NVLink: per-step latency and per-GPU, per-direction bandwidth
  inter_alpha_us, inter_GBps   InfiniBand: the same, per GPU (one NIC per GPU)
  call_us            a fixed cost per collective call (launch, NCCL's base latency)
  overlap            the measured fraction (0..1) of the data-parallel all-reduce hidden behind backward
  inter_algorithm    "ring", "tree" or "auto" (the faster of the two per call, as NCCL's tuner picks)
--intra-bench / --inter-bench read bench_nccl's --json output (an 8-GPU one-node run; a run over two or more
nodes) and take alpha and bandwidth from its all-reduce fit (ring per-hop terms).

Formulas (times in seconds, S in bytes, beta = 1 / bandwidth; g GPUs of a group per node, k nodes, n = g*k):

  All-reduce, hierarchical ring (reduce-scatter inside the node, all-reduce of each GPU's 1/g shard across the
  nodes over that GPU's own NIC, all-gather inside the node):
      T_ar(S) = call + 2(g-1)/g * S * beta_intra + 2(k-1)/k * (S/g) * beta_inter + latency
      ring latency  = 2(n-k) * alpha_intra + 2(k-1) * alpha_inter      (the steps of one ring over n ranks,
                                                                       2(k-1) of them crossing nodes)
      tree latency  = 2(g-1) * alpha_intra + 2*ceil(log2 k) * alpha_inter  (inter-node part as a binary tree)
  Within one node (k = 1) this is the plain ring: 2(n-1)/n * S * beta + 2(n-1) * alpha (+ call). Why
  hierarchical: with one NIC per GPU, NCCL runs one ring channel per NIC, so a node's network traffic is spread
  over its g NICs; a single ring charged at the NIC's beta for every byte would overstate the bandwidth term
  g-fold. The latency terms are those of NCCL's own tuning model (src/graph/tuning.cc: ring steps inside and
  across nodes; the tree's log2 of the node count); "auto" takes the smaller of ring and tree per call.
  Point to point: T_p2p(S) = call + alpha + S * beta on the link between the two ranks.

  Layout (proplab's rank order, src/dist/communicator.h): world rank = (pp_rank*dp + dp_rank)*tp + tp_rank, so a
  tensor group is tp adjacent ranks (inside a node when tp divides g), a data-parallel group has stride tp
  (min(dp, g/tp) of its ranks per node), pipeline neighbours are dp*tp ranks apart (another node once
  dp*tp >= g).

  Weak scaling: every data-parallel replica (tp*pp GPUs) takes the same batch of `batch` sequences per step,
  so the global batch grows with dp. One GPU's compute for that batch is T1 (step_ms); on a replica each GPU
  computes C = T1 / (tp*pp) (an even split; smaller matrices on more GPUs run less efficiently in reality).
  FLOP estimate for T1: flops = batch*seq_len * (6*N' + 12*layers*width*seq_len) with N' the parameters that
  take part in matrix products (all but the position table): 6 per parameter per token forward and backward,
  plus attention's scores and mixing (PaLM's MFU accounting, Chowdhery et al. 2022, appendix B).

  Tensor parallel (Megatron-LM): per layer 2 all-reduces of the activations forward and 2 backward, each of
  A = (batch/m)*seq_len*width*bytes_per_value over the tp group, on the critical path (not overlapped):
      T_tp = 4 * (layers/pp) * m * T_ar(A; tp group)
  (the vocabulary-parallel loss's small all-reduces are left out).
  Pipeline parallel (1F1B): each stage boundary sends m activations forward and m gradients back, A each,
  blocking: T_p2p_stage = 2*m * T_p2p(A) when pp > 1. The stage's work W = C + T_tp + T_p2p_stage is cut into
  m slices; the step takes (m + pp - 1) slices, so bubble = W * (pp-1)/m, i.e. a fraction (pp-1)/(m+pp-1) of the
  step's pipeline part.
  Data parallel: each GPU all-reduces the fp32 gradients of its N/(tp*pp) parameters over the dp group in
  buckets of bucket_mb MiB: T_dp = sum over buckets of T_ar(bucket). The buckets overlap the backward of the
  step's last micro-batch, window = (2/3) * C / m_pp (backward ~ 2/3 of compute; m_pp = m with pp > 1, else 1):
      exposed_dp = max((1 - overlap) * T_dp, T_dp - window)
  Step: T = W + bubble + exposed_dp = C + (T_tp + T_p2p_stage + exposed_dp) + bubble
  Parts: compute C, exposed communication T_tp + T_p2p_stage + exposed_dp, bubble.
  Parallel efficiency (tokens/s per GPU against one GPU): E = T1 / (tp*pp*T) = C / T; 1 for one GPU.
"""

import argparse
import json
import math
import os
import sys

try:
    import tomllib
except ImportError:  # Python < 3.11
    tomllib = None

# Defaults: H200 SXM nodes of 8 GPUs, NVLink 4 through NVSwitch, one 400 Gb/s NDR InfiniBand NIC per GPU.
# Each value's source is in SOURCES; none is a measurement on proplab's machines.
DEFAULTS = {
    "step_ms": None,
    "peak_tflops": 989.0,
    "mfu": 0.40,
    "params": None,
    "layers": None,
    "width": None,
    "seq_len": None,
    "heads": None,
    "ffn_mult": None,
    "vocab": None,
    "batch": None,
    "tie_embeddings": True,
    "bytes_per_value": 4,
    "bucket_mb": 25.0,
    "microbatches": 0,
    "gpus_per_node": 8,
    "intra_alpha_us": 3.4,
    "intra_GBps": 450.0,
    "inter_alpha_us": 9.6,
    "inter_GBps": 50.0,
    "call_us": 8.4,
    "overlap": 0.8,
    "inter_algorithm": "auto",
}

SOURCES = {
    "peak_tflops": "NVIDIA H200 datasheet: 989 TFLOP/s dense BF16 tensor core (1,979 with sparsity); "
    "needs [device] precision = \"bf16\" (fp32 without tensor cores: 67)",
    "mfu": "assumption: 40% model FLOP utilisation (not measured; bench_gpu measures it)",
    "intra_GBps": "NVIDIA H200 datasheet: NVLink 900 GB/s per GPU (both directions together) -> 450 GB/s each way",
    "inter_GBps": "NVIDIA DGX H200 datasheet: 8 x ConnectX-7, 400 Gb/s InfiniBand (NDR) per GPU -> 50 GB/s",
    "intra_alpha_us": "NCCL's tuning model (src/graph/tuning.cc, hwLat NVLink ring/Simple): 3.4 us per ring step",
    "inter_alpha_us": "NCCL's tuning model (src/graph/tuning.cc, hwLat network ring/Simple): 9.6 us per ring step",
    "call_us": "NCCL's tuning model (src/graph/tuning.cc, baseLat ring/Simple): 8.4 us per call",
    "overlap": "assumption: 0.8 of the data-parallel all-reduce hidden behind backward (bench_nccl measures it)",
    "bucket_mb": "assumption: 25 MiB buckets (proplab's [parallel] bucket_mb default is 1 MiB)",
    "bytes_per_value": "proplab's Communicator moves float32 (gradients and activations)",
    "gpus_per_node": "8 GPUs per node (HGX/DGX H200)",
}

DEFAULT_GPUS = [8, 16, 32, 64, 128, 256, 512, 1024]
DEFAULT_LAYOUTS = ["dp", "tp2", "tp4", "tp8", "tp4pp2", "tp4pp4"]


def study_numbers(path):
    """The model and batch numbers of a proplab study file (a transformer), with the parameter count."""
    if tomllib is None:
        raise SystemExit("comm_model.py: reading a study needs Python 3.11 (tomllib); pass the numbers with --set")
    with open(path, "rb") as f:
        study = tomllib.load(f)
    model, train = study.get("model", {}), study.get("train", {})
    if model.get("type", "transformer") != "transformer":
        raise SystemExit(f"comm_model.py: {path}: model.type = {model.get('type')!r}; allowed: \"transformer\"")
    numbers = {
        "layers": int(model["layers"]),
        "width": int(model["width"]),
        "seq_len": int(model["seq_len"]),
        "heads": int(model.get("heads", 1)),
        "ffn_mult": int(model.get("ffn_mult", 4)),
        "vocab": int(model["vocab"]),
        "batch": int(train.get("batch", 1)),
        "tie_embeddings": bool(model.get("tie_embeddings", True)),
    }
    parallel = study.get("parallel", {})
    if "bucket_mb" in parallel:
        numbers["bucket_mb"] = float(parallel["bucket_mb"])
    return numbers


def transformer_params(m):
    """Parameters of proplab's transformer with biases and affine norms: per block attention 4D^2 + 4D, FFN
    2fD^2 + fD + D, two norms 4D; token and learned position embeddings; a final norm; an untied head VD."""
    d, f = m["width"], m["ffn_mult"]
    block = (4 + 2 * f) * d * d + (9 + f) * d
    total = m["layers"] * block + m["vocab"] * d + m["seq_len"] * d + 2 * d
    if not m.get("tie_embeddings", True):
        total += m["vocab"] * d
    return total


def flops_per_step(p):
    """Training FLOP of one step of `batch` sequences: tokens * (6 N' + 12 L D T), N' without the position table."""
    tokens = p["batch"] * p["seq_len"]
    matmul_params = p["params"] - p["seq_len"] * p["width"]
    return tokens * (6.0 * matmul_params + 12.0 * p["layers"] * p["width"] * p["seq_len"])


def one_gpu_step_s(p):
    if p.get("step_ms") is not None:
        return p["step_ms"] / 1e3
    return flops_per_step(p) / (p["peak_tflops"] * 1e12 * p["mfu"])


def all_reduce_s(nbytes, g, k, p, algorithm=None):
    """Hierarchical all-reduce of `nbytes` over g GPUs per node on k nodes (see the module docstring)."""
    n = g * k
    if n <= 1:
        return 0.0
    a_in, a_out = p["intra_alpha_us"] * 1e-6, p["inter_alpha_us"] * 1e-6
    b_in, b_out = 1.0 / (p["intra_GBps"] * 1e9), 1.0 / (p["inter_GBps"] * 1e9)
    bandwidth = 2.0 * (g - 1) / g * nbytes * b_in + 2.0 * (k - 1) / k * (nbytes / g) * b_out
    ring = 2 * (n - k) * a_in + 2 * (k - 1) * a_out
    tree = 2 * (g - 1) * a_in + 2 * math.ceil(math.log2(k)) * a_out if k > 1 else ring
    algorithm = algorithm or p["inter_algorithm"]
    latency = {"ring": ring, "tree": tree, "auto": min(ring, tree)}[algorithm]
    return p["call_us"] * 1e-6 + bandwidth + latency


def p2p_s(nbytes, inter_node, p):
    alpha = (p["inter_alpha_us"] if inter_node else p["intra_alpha_us"]) * 1e-6
    bandwidth = (p["inter_GBps"] if inter_node else p["intra_GBps"]) * 1e9
    return p["call_us"] * 1e-6 + alpha + nbytes / bandwidth


def bubble_fraction(pp, m):
    """1F1B's idle share of the pipelined part of a step: (pp - 1) / (m + pp - 1)."""
    return (pp - 1) / (m + pp - 1)


def parse_layout(name):
    """'dp' -> (1, 1); 'tp4' -> (4, 1); 'tp4pp2' -> (4, 2); 'pp2' -> (1, 2)."""
    tp = pp = 1
    rest = name
    if rest == "dp":
        return tp, pp
    if rest.startswith("tp"):
        digits = ""
        rest = rest[2:]
        while rest and rest[0].isdigit():
            digits, rest = digits + rest[0], rest[1:]
        tp = int(digits)
    if rest.startswith("pp"):
        pp = int(rest[2:])
        rest = ""
    if rest or tp < 1 or pp < 1:
        raise SystemExit(f"comm_model.py: layout {name!r}: allowed: dp, tpT, ppP, tpTppP (e.g. tp4pp2)")
    return tp, pp


def proplab_refusals(p, tp, pp, dp):
    """Why proplab would refuse this layout for the model (src/models/tensor_parallel.cpp, docs/studies.md)."""
    notes = []
    for key, value in (("heads", p.get("heads")), ("vocab", p.get("vocab"))):
        if tp > 1 and value is not None and value % tp:
            notes.append(f"{key} {value} % tp {tp} != 0")
    if tp > 1 and p.get("ffn_mult") and (p["ffn_mult"] * p["width"]) % tp:
        notes.append(f"ffn width % tp {tp} != 0")
    if pp > p["layers"]:
        notes.append(f"pp {pp} > layers {p['layers']}")
    if p["batch"] % (microbatches(p, pp)):
        notes.append(f"microbatches {microbatches(p, pp)} do not divide the batch {p['batch']}")
    return notes


def microbatches(p, pp):
    if pp == 1:
        return 1
    return p["microbatches"] or p["batch"]


def model_step(p, n, tp, pp):
    """The modelled step at n GPUs with tensor width tp and pp stages (dp = n / (tp*pp)); None if not a layout."""
    if n % (tp * pp):
        return None
    dp = n // (tp * pp)
    g = p["gpus_per_node"]
    if tp > g or g % tp:
        return None
    t1 = one_gpu_step_s(p)
    compute = t1 / (tp * pp)
    m = microbatches(p, pp)
    activation = (p["batch"] / m) * p["seq_len"] * p["width"] * p["bytes_per_value"]

    tp_comm = 4 * (p["layers"] / pp) * m * all_reduce_s(activation, tp, 1, p) if tp > 1 else 0.0

    p2p = 0.0
    if pp > 1:
        inter_node = dp * tp >= g  # pipeline neighbours are dp*tp ranks apart
        p2p = 2 * m * p2p_s(activation, inter_node, p)

    # The data-parallel group: stride tp; min(dp, g/tp) members share a node.
    per_node = min(dp, g // tp)
    nodes = dp // per_node
    grad_bytes = p["params"] / (tp * pp) * p["bytes_per_value"]
    bucket = p["bucket_mb"] * 2**20
    full, rest = divmod(grad_bytes, bucket)
    dp_total = 0.0
    if dp > 1:
        dp_total = int(full) * all_reduce_s(bucket, per_node, nodes, p)
        if rest > 0:
            dp_total += all_reduce_s(rest, per_node, nodes, p)
    window = (2.0 / 3.0) * compute / (m if pp > 1 else 1)
    dp_exposed = max((1.0 - p["overlap"]) * dp_total, dp_total - window)

    work = compute + tp_comm + p2p
    bubble = work * (pp - 1) / m
    step = work + bubble + dp_exposed
    return {
        "gpus": n,
        "layout": f"dp{dp}" + (f"·tp{tp}" if tp > 1 else "") + (f"·pp{pp}" if pp > 1 else ""),
        "dp": dp,
        "tp": tp,
        "pp": pp,
        "microbatches": m,
        "global_batch_tokens": dp * p["batch"] * p["seq_len"],
        "step_ms": step * 1e3,
        "compute_ms": compute * 1e3,
        "tp_comm_ms": tp_comm * 1e3,
        "pp_p2p_ms": p2p * 1e3,
        "dp_allreduce_ms": dp_total * 1e3,
        "dp_exposed_ms": dp_exposed * 1e3,
        "exposed_comm_ms": (tp_comm + p2p + dp_exposed) * 1e3,
        "bubble_ms": bubble * 1e3,
        "efficiency": compute / step,
        "proplab_refuses": proplab_refusals(p, tp, pp, dp),
    }


def from_bench(path, prefix, p):
    """alpha and bandwidth from bench_nccl's JSON all-reduce fit (its ring per-hop terms)."""
    with open(path) as f:
        bench = json.load(f)
    fit = bench["fits"]["all_reduce"]
    if bench.get("ranks", 1) < 2 or fit.get("link_GBps", 0) <= 0:
        raise SystemExit(f"comm_model.py: {path}: needs a bench_nccl run on 2 or more ranks (a link to fit)")
    p[f"{prefix}_alpha_us"] = fit["alpha_hop_us"]
    p[f"{prefix}_GBps"] = fit["link_GBps"]
    SOURCES[f"{prefix}_alpha_us"] = SOURCES[f"{prefix}_GBps"] = f"measured: bench_nccl --json {path}"
    if bench.get("overlap"):
        p["overlap"] = bench["overlap"]["hidden_fraction"]
        SOURCES["overlap"] = f"measured: bench_nccl --json {path}"


def parse_value(text):
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return None if text == "null" else text


def build_inputs(args):
    p = dict(DEFAULTS)
    if args.study:
        p.update(study_numbers(args.study))
        SOURCES["model"] = f"{os.path.relpath(args.study)} (parameters counted from its shape)"
    if args.inputs:
        with open(args.inputs) as f:
            given = json.load(f)
        for key, value in given.items():
            if key not in p:
                raise SystemExit(f"comm_model.py: {args.inputs}: unknown input {key!r}; allowed: {', '.join(p)}")
            p[key] = value
            SOURCES[key] = f"{args.inputs}"
    if args.intra_bench:
        from_bench(args.intra_bench, "intra", p)
    if args.inter_bench:
        from_bench(args.inter_bench, "inter", p)
    for item in args.set or []:
        key, _, value = item.partition("=")
        if key not in p:
            raise SystemExit(f"comm_model.py: --set {item}: unknown input {key!r}; allowed: {', '.join(p)}")
        p[key] = parse_value(value)
        SOURCES[key] = "--set"
    shape = ("layers", "width", "seq_len", "vocab", "ffn_mult")
    if p.get("params") is None and all(p.get(k) is not None for k in shape):
        p["params"] = transformer_params(p)
        SOURCES["params"] = "counted from the model's shape (transformer_params)"
    missing = [k for k in ("params", "layers", "width", "seq_len", "batch") if p.get(k) is None]
    if missing:
        raise SystemExit(f"comm_model.py: missing inputs {', '.join(missing)}: pass --study or --set them")
    if not 0.0 <= p["overlap"] <= 1.0:
        raise SystemExit(f"comm_model.py: overlap = {p['overlap']}: allowed: 0..1")
    if p["inter_algorithm"] not in ("ring", "tree", "auto"):
        raise SystemExit(f"comm_model.py: inter_algorithm = {p['inter_algorithm']!r}: allowed: ring, tree, auto")
    return p


def markdown(p, rows):
    lines = []
    t1 = one_gpu_step_s(p) * 1e3
    how = "given" if p.get("step_ms") is not None else (
        f"FLOP estimate {flops_per_step(p) / 1e12:.2f} TFLOP / ({p['peak_tflops']:g} TFLOP/s x MFU {p['mfu']:g})")
    lines.append("Model output of scripts/comm_model.py (alpha-beta), not a measurement.")
    lines.append("")
    lines.append(f"One GPU: {t1:.1f} ms per step of {p['batch']} x {p['seq_len']} tokens ({how}); "
                 f"{p['params']:,} parameters; weak scaling ({p['batch']} sequences per data-parallel replica).")
    lines.append("")
    lines.append("| GPUs | layout | m | step ms | compute | tp comm | pp p2p | dp exposed (of all-reduce) | bubble "
                 "| efficiency | proplab |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        refuses = "refuses: " + "; ".join(r["proplab_refuses"]) if r["proplab_refuses"] else "runs"
        lines.append(
            f"| {r['gpus']} | {r['layout']} | {r['microbatches']} | {r['step_ms']:.1f} | {r['compute_ms']:.1f} "
            f"| {r['tp_comm_ms']:.1f} | {r['pp_p2p_ms']:.1f} | {r['dp_exposed_ms']:.1f} ({r['dp_allreduce_ms']:.1f}) "
            f"| {r['bubble_ms']:.1f} | {r['efficiency'] * 100:.0f}% | {refuses} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--inputs", help="JSON file of inputs (any of the keys in DEFAULTS)")
    default_study = os.path.normpath(
        os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "studies", "gpt2_124m.toml"))
    parser.add_argument("--study", default=default_study,
                        help="a proplab transformer study (model shape and batch; default studies/gpt2_124m.toml; "
                        "'none': give the numbers with --inputs/--set)")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE", help="override one input")
    parser.add_argument("--intra-bench", help="bench_nccl --json output of one node (NVLink)")
    parser.add_argument("--inter-bench", help="bench_nccl --json output over nodes (InfiniBand)")
    parser.add_argument("--gpus", default=",".join(map(str, DEFAULT_GPUS)), help="GPU counts (comma-separated)")
    parser.add_argument("--layouts", default=",".join(DEFAULT_LAYOUTS), help="dp, tpT, tpTppP, ... (comma-separated)")
    parser.add_argument("--markdown", action="store_true", help="print a markdown table")
    parser.add_argument("--json", help="write inputs, sources and rows to this JSON file ('-': standard output)")
    args = parser.parse_args(argv)
    if args.study == "none":
        args.study = None
    p = build_inputs(args)
    rows = []
    for n in (int(x) for x in args.gpus.split(",")):
        for layout in args.layouts.split(","):
            tp, pp = parse_layout(layout)
            row = model_step(p, n, tp, pp)
            if row is not None:
                rows.append(row)
    result = {"model": "alpha-beta step-time model, not a measurement", "inputs": p,
              "sources": {k: v for k, v in SOURCES.items()}, "one_gpu_step_ms": one_gpu_step_s(p) * 1e3,
              "rows": rows}
    if args.json == "-":
        json.dump(result, sys.stdout, indent=1)
        print()
    elif args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    if args.markdown or not args.json:
        print(markdown(p, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
