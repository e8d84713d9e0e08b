#!/usr/bin/python3
"""bench/torch_reference: the proplab reference model trained in PyTorch on the CPU, as a speed yardstick.

The model is the default TransformerConfig of src/spec/model.h: a decoder-only GPT-2-style transformer with
4 layers, width 256, 4 heads, FFN 4x (1024) with tanh-approximated GELU, learned position embeddings, biases
everywhere, Pre-LN affine LayerNorm (eps 1e-5), a final LayerNorm and tied embeddings (logits = x E^T, no
bias); vocab 256, seq 128, batch 8, fp32, no dropout. Training: AdamW (lr 1e-3, betas (0.9, 0.95), eps 1e-8,
weight decay 0), gradient-norm clip 1.0, one batch of uniform random tokens (inputs and next-token targets,
fixed seed) reused every step, so runs repeat and the loss falls from ln 256 as the batch is memorised. Init is GPT-2's:
every weight N(0, 0.02^2), the two residual output projections N(0, (0.02 / sqrt(2 * layers))^2), biases 0,
LayerNorm gain 1 and shift 0. Attention is torch's scaled_dot_product_attention(is_causal=True) where torch has it
(2.x), written out (q k^T / sqrt(dh), causal mask, softmax, @ v) on torch 1.13; the optimizer is torch's fused
CPU kernel where torch has one (AdamW from 2.4, SGD from 2.5), its default otherwise. The JSON names what ran.

A timed step is zero_grad + forward + loss + backward + clip + AdamW step; ms/step is the median of --steps
timed steps after --warmup untimed ones.

Threads: torch's intra-op pool (OpenMP) and OpenBLAS's own pthread pool both default to the core count, and on
2 cores they oversubscribe. OpenBLAS reads OPENBLAS_NUM_THREADS only when it is loaded, i.e. before torch is
imported, so each thread setup runs in a fresh subprocess of this script (`--setup intra,blas`, which prints
one JSON line). The parent tries every setup and keeps the fastest.

Eager and compiled: the thread setups are searched eagerly; then the fastest setup also runs under
torch.compile (default mode, inductor; torch 2.x only, its first steps compile and are untimed) and the report
keeps the faster of the two (`variant`), with both timings. `--variant` pins one.

With --model resnet20 the yardstick is instead bench/bench_resnet's model, the default ResnetConfig of
src/spec/model.h on Fashion-MNIST-shaped input: a CIFAR-style ResNet-20 (stem conv3x3 1->16, three stages of
three post-activation basic blocks at widths 16/32/64 on 28x28, 14x14, 7x7 images, each block
relu(shortcut + bn(conv3x3(relu(bn(conv3x3(x)))))), stride 2 in the first conv of stages 2 and 3 with a
projection shortcut bn(conv1x1 stride 2)), convs without bias, BatchNorm (eps 1e-5, momentum 0.1) in training
mode, global average pooling and a linear classifier with bias; He init (convs N(0, 2/fan_in), classifier
N(0, 1/fan_in), bias 0, BatchNorm gain 1 and shift 0). Training: SGD with Nesterov momentum 0.9, lr 0.1, weight
decay 5e-4 (as bench/bench_resnet_fmnist.cpp), no clipping, softmax cross-entropy, batch 128 of fixed N(0, 1)
images with fixed random labels reused every step. A timed step is zero_grad + forward + loss + backward + SGD
step; the throughput is images/s.

Run it with the bench-only virtual environment's interpreter (PyTorch 2.x from PyPI, made by
bench/make-torch-venv.sh) or with Debian's, which has python3-torch 1.13:
    .bench-venv/bin/python bench/torch_reference.py [--json] [--model resnet20] [--variant eager|compiled|best]
    /usr/bin/python3 bench/torch_reference.py [--json] [--model resnet20]
"""

import argparse
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import time

LAYERS = 4
WIDTH = 256
HEADS = 4
FFN_MULT = 4
VOCAB = 256
SEQ_LEN = 128
BATCH = 8
LN_EPS = 1e-5
INIT_STD = 0.02

# (torch intra-op threads, OpenBLAS threads) tried by the parent, after one run with both libraries left at
# their defaults (shown for reference, not eligible as "best").
THREAD_SETUPS = [(1, 1), (1, 2), (2, 1), (2, 2)]


def step_flops(layers=LAYERS, width=WIDTH, ffn_mult=FFN_MULT, vocab=VOCAB, seq_len=SEQ_LEN, batch=BATCH):
    """Matmul FLOPs of one training step (forward + backward), counting a multiply-add as 2 FLOPs.

    With R = batch * seq_len rows, D = width, F = ffn_mult * D, per layer the forward matmuls are
      qkv projection   2 R D (3D)
      attention out    2 R D D
      FFN up (fc)      2 R D F
      FFN down (proj)  2 R F D
      q k^T            2 batch T T D   (all heads together: heads * dh = D; the full T x T square is computed,
      p v              2 batch T T D    the causal mask does not skip work)
    and once per step the tied LM head 2 R D vocab. Backward runs two matmuls of the same size per forward
    matmul (d_input and d_weight, or d_q/d_k and d_p/d_v for attention), so a step is 3x the forward.
    Elementwise work (LayerNorm, GELU, softmax, AdamW) is left out; it is O(R D), not O(R D^2).
    For the reference model: forward 7.11 GFLOP, step 21.34 GFLOP.
    """
    rows = batch * seq_len
    ffn = ffn_mult * width
    per_layer = (2 * rows * width * 3 * width + 2 * rows * width * width + 2 * rows * width * ffn +
                 2 * rows * ffn * width + 2 * 2 * batch * seq_len * seq_len * width)
    forward = layers * per_layer + 2 * rows * width * vocab
    return 3 * forward


def parameter_count():
    per_layer = (2 * 2 * WIDTH +                        # two LayerNorms (gain, shift)
                 WIDTH * 3 * WIDTH + 3 * WIDTH +        # qkv
                 WIDTH * WIDTH + WIDTH +                # attention out
                 WIDTH * FFN_MULT * WIDTH + FFN_MULT * WIDTH +  # fc
                 FFN_MULT * WIDTH * WIDTH + WIDTH)      # proj
    return VOCAB * WIDTH + SEQ_LEN * WIDTH + LAYERS * per_layer + 2 * WIDTH


def has_sdpa(torch):
    return hasattr(torch.nn.functional, "scaled_dot_product_attention")


def make_optimizer(torch, kind, params, **options):
    """torch.optim.<kind> with fused=True where this torch has a fused CPU kernel for it, else its default;
    returns (optimizer, fused)."""
    params = list(params)
    try:
        return getattr(torch.optim, kind)(params, fused=True, **options), True
    except (TypeError, RuntimeError, ValueError):
        return getattr(torch.optim, kind)(params, **options), False


def has_compile(torch):
    return hasattr(torch, "compile") and int(torch.__version__.split(".")[0]) >= 2


def build_model(torch):
    nn = torch.nn

    class CausalSelfAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
            self.out = nn.Linear(WIDTH, WIDTH)
            mask = torch.tril(torch.ones(SEQ_LEN, SEQ_LEN, dtype=torch.bool))
            self.register_buffer("causal_mask", mask.view(1, 1, SEQ_LEN, SEQ_LEN))

        def forward(self, x):
            batch, tokens, width = x.shape
            head_dim = width // HEADS
            q, k, v = self.qkv(x).split(width, dim=2)
            q = q.view(batch, tokens, HEADS, head_dim).transpose(1, 2)
            k = k.view(batch, tokens, HEADS, head_dim).transpose(1, 2)
            v = v.view(batch, tokens, HEADS, head_dim).transpose(1, 2)
            if has_sdpa(torch):
                y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
                return self.out(y.transpose(1, 2).contiguous().view(batch, tokens, width))
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(head_dim))
            scores = scores.masked_fill(~self.causal_mask[:, :, :tokens, :tokens], float("-inf"))
            probs = torch.softmax(scores, dim=-1)
            y = (probs @ v).transpose(1, 2).contiguous().view(batch, tokens, width)
            return self.out(y)

    class Mlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(WIDTH, FFN_MULT * WIDTH)
            self.act = nn.GELU(approximate="tanh")
            self.proj = nn.Linear(FFN_MULT * WIDTH, WIDTH)

        def forward(self, x):
            return self.proj(self.act(self.fc(x)))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_attn = nn.LayerNorm(WIDTH, eps=LN_EPS)
            self.attn = CausalSelfAttention()
            self.ln_mlp = nn.LayerNorm(WIDTH, eps=LN_EPS)
            self.mlp = Mlp()

        def forward(self, x):
            x = x + self.attn(self.ln_attn(x))
            return x + self.mlp(self.ln_mlp(x))

    class Gpt(nn.Module):
        def __init__(self):
            super().__init__()
            self.token_embedding = nn.Embedding(VOCAB, WIDTH)
            self.position_embedding = nn.Embedding(SEQ_LEN, WIDTH)
            self.blocks = nn.ModuleList([Block() for _ in range(LAYERS)])
            self.ln_final = nn.LayerNorm(WIDTH, eps=LN_EPS)
            self.register_buffer("positions", torch.arange(SEQ_LEN))
            self._init_gpt2()

        def _init_gpt2(self):
            residual_std = INIT_STD / math.sqrt(2 * LAYERS)
            for name, module in self.named_modules():
                if isinstance(module, (nn.Linear, nn.Embedding)):
                    std = residual_std if name.endswith("attn.out") or name.endswith("mlp.proj") else INIT_STD
                    nn.init.normal_(module.weight, mean=0.0, std=std)
                    if getattr(module, "bias", None) is not None:
                        nn.init.zeros_(module.bias)
                elif isinstance(module, nn.LayerNorm):
                    nn.init.ones_(module.weight)
                    nn.init.zeros_(module.bias)

        def forward(self, tokens):
            x = self.token_embedding(tokens) + self.position_embedding(self.positions[:tokens.shape[1]])
            for block in self.blocks:
                x = block(x)
            x = self.ln_final(x)
            return x @ self.token_embedding.weight.t()  # tied LM head, no bias

    return Gpt()


RESNET_DEPTH = 20
RESNET_BASE_WIDTH = 16
RESNET_IN_CHANNELS = 1
RESNET_IMAGE_SIZE = 28
RESNET_CLASSES = 10
RESNET_BATCH = 128
BN_EPS = 1e-5
BN_MOMENTUM = 0.1


def resnet_stages():
    """(in channels, out channels, stride, input size) of every basic block, stage by stage."""
    blocks_per_stage = (RESNET_DEPTH - 2) // 6
    blocks = []
    channels, size = RESNET_BASE_WIDTH, RESNET_IMAGE_SIZE
    for stage in range(3):
        width = RESNET_BASE_WIDTH << stage
        for b in range(blocks_per_stage):
            stride = 2 if stage > 0 and b == 0 else 1
            blocks.append((channels, width, stride, size))
            size = (size + 2 - 3) // stride + 1
            channels = width
    return blocks


def resnet_step_flops(batch=RESNET_BATCH):
    """Conv and classifier FLOPs of one training step (multiply-add = 2), forward x 3, as Resnet::train_flops."""
    def conv(c_in, c_out, kernel, out_size):
        return 2 * c_in * kernel * kernel * c_out * out_size * out_size
    forward = conv(RESNET_IN_CHANNELS, RESNET_BASE_WIDTH, 3, RESNET_IMAGE_SIZE)
    for c_in, c_out, stride, size in resnet_stages():
        out_size = (size + 2 - 3) // stride + 1
        forward += conv(c_in, c_out, 3, out_size) + conv(c_out, c_out, 3, out_size)
        if stride != 1 or c_in != c_out:
            forward += conv(c_in, c_out, 1, out_size)
    forward += 2 * (RESNET_BASE_WIDTH << 2) * RESNET_CLASSES
    return 3 * forward * batch


def resnet_parameter_count():
    count = RESNET_IN_CHANNELS * RESNET_BASE_WIDTH * 9 + 2 * RESNET_BASE_WIDTH
    for c_in, c_out, stride, _ in resnet_stages():
        count += c_in * c_out * 9 + c_out * c_out * 9 + 4 * c_out
        if stride != 1 or c_in != c_out:
            count += c_in * c_out + 2 * c_out
    final = RESNET_BASE_WIDTH << 2
    return count + final * RESNET_CLASSES + RESNET_CLASSES


def build_resnet(torch):
    nn = torch.nn

    def batchnorm(channels):
        return nn.BatchNorm2d(channels, eps=BN_EPS, momentum=BN_MOMENTUM)

    class BasicBlock(nn.Module):
        def __init__(self, c_in, c_out, stride):
            super().__init__()
            self.conv0 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
            self.norm0 = batchnorm(c_out)
            self.conv1 = nn.Conv2d(c_out, c_out, 3, stride=1, padding=1, bias=False)
            self.norm1 = batchnorm(c_out)
            self.shortcut = None
            if stride != 1 or c_in != c_out:
                self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), batchnorm(c_out))

        def forward(self, x):
            branch = self.norm1(self.conv1(torch.relu(self.norm0(self.conv0(x)))))
            return torch.relu((x if self.shortcut is None else self.shortcut(x)) + branch)

    class Resnet(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(RESNET_IN_CHANNELS, RESNET_BASE_WIDTH, 3, padding=1, bias=False)
            self.stem_norm = batchnorm(RESNET_BASE_WIDTH)
            self.blocks = nn.Sequential(*[BasicBlock(c_in, c_out, stride) for c_in, c_out, stride, _ in resnet_stages()])
            self.head = nn.Linear(RESNET_BASE_WIDTH << 2, RESNET_CLASSES)
            for module in self.modules():
                if isinstance(module, (nn.Conv2d, nn.Linear)):
                    fan_in = module.weight[0].numel()
                    gain = 2.0 if isinstance(module, nn.Conv2d) else 1.0
                    nn.init.normal_(module.weight, mean=0.0, std=math.sqrt(gain / fan_in))
                    if module.bias is not None:
                        nn.init.zeros_(module.bias)

        def forward(self, images):
            x = torch.relu(self.stem_norm(self.stem(images)))
            x = self.blocks(x)
            return self.head(x.mean(dim=(2, 3)))

    return Resnet()


def attach_stat_hooks(torch, model, sink, module_types):
    """Forward + backward hooks on every module of the given types: mean, var and max of the output and of the
    gradient w.r.t. the output, read back as Python floats (what per-layer logging in PyTorch looks like)."""
    handles = []

    def record(name, kind, tensor):
        with torch.no_grad():
            t = tensor.detach()
            sink.append((name, kind, t.mean().item(), t.var().item(), t.max().item()))

    for name, module in model.named_modules():
        if isinstance(module, module_types):
            handles.append(module.register_forward_hook(
                lambda mod, inputs, output, name=name: record(name, "out", output)))
            handles.append(module.register_full_backward_hook(
                lambda mod, grad_input, grad_output, name=name: record(name, "d_out", grad_output[0])))
    return handles


def train_step(torch, model, optimizer, inputs, targets):
    """One AdamW step; returns the loss before the update."""
    optimizer.zero_grad(set_to_none=True)
    logits = model(inputs)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return loss.item()


def resnet_train_step(torch, model, optimizer, images, labels):
    """One SGD step; returns the loss before the update."""
    optimizer.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(model(images), labels)
    loss.backward()
    optimizer.step()
    return loss.item()


class Workload:
    """One benchmarked model: the module, a closure running one training step (returns the loss), the module
    types the stat hooks attach to, and what a step processes (samples_per_step of `unit`)."""

    def __init__(self, torch, kind, compiled=False):
        nn = torch.nn
        self.kind = kind
        if kind == "transformer":
            self.model = build_model(torch)
            # The step calls `run` (the compiled module, or the model itself); hooks attach to `model`.
            run = torch.compile(self.model) if compiled else self.model
            optimizer, self.fused = make_optimizer(torch, "AdamW", self.model.parameters(), lr=1e-3,
                                                   betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
            tokens = torch.randint(0, VOCAB, (BATCH, SEQ_LEN + 1), generator=torch.Generator().manual_seed(1))
            inputs, targets = tokens[:, :-1], tokens[:, 1:]
            self.step = lambda: train_step(torch, run, optimizer, inputs, targets)
            self.hook_types = (nn.Linear, nn.LayerNorm, nn.Embedding)
            self.unit, self.samples_per_step = "tokens", BATCH * SEQ_LEN
            self.expected_params, self.flops = parameter_count(), step_flops()
        else:
            self.model = build_resnet(torch)
            self.model.train()
            run = torch.compile(self.model) if compiled else self.model
            optimizer, self.fused = make_optimizer(torch, "SGD", self.model.parameters(), lr=0.1, momentum=0.9,
                                                   nesterov=True, weight_decay=5e-4)
            generator = torch.Generator().manual_seed(1)
            images = torch.randn(RESNET_BATCH, RESNET_IN_CHANNELS, RESNET_IMAGE_SIZE, RESNET_IMAGE_SIZE,
                                 generator=generator)
            labels = torch.randint(0, RESNET_CLASSES, (RESNET_BATCH,), generator=generator)
            self.step = lambda: resnet_train_step(torch, run, optimizer, images, labels)
            self.hook_types = (nn.Conv2d, nn.BatchNorm2d, nn.Linear)
            self.unit, self.samples_per_step = "images", RESNET_BATCH
            self.expected_params, self.flops = resnet_parameter_count(), resnet_step_flops()


def time_training(step, steps, warmup, give_up_ms=None):
    """Median ms/step over `steps` timed steps after `warmup`, and every step's loss. With give_up_ms, stops
    after 3 timed steps whose median is already slower than that (a hopeless setup need not run to the end)."""
    times = []
    losses = []
    for index in range(warmup + steps):
        start = time.perf_counter()
        losses.append(step())
        if index >= warmup:
            times.append(time.perf_counter() - start)
            if give_up_ms is not None and len(times) >= 3 and statistics.median(times) * 1e3 > give_up_ms:
                break
    return statistics.median(times) * 1e3, losses


def time_hook_overhead(torch, workload, steps, warmup):
    """Median ms/step without and with the stat hooks, and the stat records per hooked step. Plain and hooked
    steps alternate (hooks attached before a hooked step and removed after it, both outside the timing), so
    both medians see the same process state and machine load; separate runs of one setup differed by up to
    ~30% on the 2-core dev machine, more than the overhead itself."""
    plain, hooked = [], []
    records = 0
    for index in range(2 * (warmup + steps)):
        with_hooks = index % 2 == 1
        sink = []
        handles = attach_stat_hooks(torch, workload.model, sink, workload.hook_types) if with_hooks else []
        start = time.perf_counter()
        workload.step()
        elapsed = time.perf_counter() - start
        for handle in handles:
            handle.remove()
        if with_hooks:
            records = len(sink)
        if index >= 2 * warmup:
            (hooked if with_hooks else plain).append(elapsed)
    return statistics.median(plain) * 1e3, statistics.median(hooked) * 1e3, records


class OtherLoad:
    """Average number of cores busy with other processes over a span: all busy CPU time (/proc/stat) minus this
    process's own (getrusage, all threads), divided by wall time. On a shared machine a span with other load
    well above 0 gave a slow, noisy timing. None where /proc/stat is missing."""

    def __enter__(self):
        self.start = (self._busy_seconds(), self._own_seconds(), time.perf_counter())
        return self

    def __exit__(self, *exc):
        busy, own, wall = self._busy_seconds(), self._own_seconds(), time.perf_counter()
        if busy is None or self.start[0] is None:
            self.cores = None
        else:
            self.cores = max(0.0, ((busy - self.start[0]) - (own - self.start[1])) / (wall - self.start[2]))
        return False

    @staticmethod
    def _busy_seconds():
        try:
            with open("/proc/stat") as stat:
                fields = [int(v) for v in stat.readline().split()[1:]]
        except OSError:
            return None
        idle = fields[3] + fields[4]  # idle + iowait
        return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")

    @staticmethod
    def _own_seconds():
        import resource
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime


def openblas_threads():
    """OpenBLAS's thread count as the library itself reports it (None when torch is not on OpenBLAS)."""
    import ctypes
    try:
        return ctypes.CDLL("libopenblas.so.0").openblas_get_num_threads()
    except (OSError, AttributeError):
        return None


def run_setup(intra, blas, steps, warmup, hooks, give_up_ms=None, model_kind="transformer", variant="eager"):
    """Child process: OPENBLAS_NUM_THREADS was set by the parent before this interpreter imported torch."""
    import torch
    if intra is not None:
        torch.set_num_threads(intra)
    torch.set_num_interop_threads(1)
    torch.manual_seed(0)
    compiled = variant == "compiled"
    if compiled and not has_compile(torch):
        raise SystemExit(f"torch_reference: torch {torch.__version__} has no torch.compile (--variant compiled)")
    if compiled and os.path.isdir("/usr/include/ATen"):
        # Inductor's C++ kernels then see Debian's torch 1.13 headers (libtorch-dev): they build slow kernels or
        # fail to load (undefined Sleef symbols). Measured: 253 ms/step compiled with them, 150 without.
        raise SystemExit("torch_reference: /usr/include/ATen (Debian's libtorch-dev) shadows this torch's headers "
                         "in torch.compile's C++ kernels; remove it (apt-get remove libtorch-dev; python3-torch "
                         "does not need it) or use --variant eager")
    if compiled:
        warmup = max(warmup, 2)  # the first forward and backward compile
    workload = Workload(torch, model_kind, compiled=compiled)
    n_params = sum(p.numel() for p in workload.model.parameters())
    if n_params != workload.expected_params:
        raise AssertionError(f"parameter count {n_params} != formula {workload.expected_params}")
    with OtherLoad() as other_load:
        ms, losses = time_training(workload.step, steps, warmup, give_up_ms=give_up_ms)
    result = {
        "model": model_kind,
        "intra_threads": torch.get_num_threads(),
        "blas_threads": openblas_threads(),
        "ms_per_step": ms,
        f"{workload.unit}_per_s": workload.samples_per_step / (ms / 1e3),
        "timed_steps": len(losses) - warmup,
        "other_load_cores": other_load.cores,
        "first_loss": losses[0],
        "last_loss": losses[-1],
        "params": n_params,
        "torch_version": torch.__version__,
        "mkldnn": torch.backends.mkldnn.is_available(),
        "variant": variant,
        "sdpa": model_kind == "transformer" and has_sdpa(torch),
        "fused_optimizer": workload.fused,
        "compile_available": has_compile(torch),
    }
    if hooks:
        with OtherLoad() as hooks_load:
            ms_plain, ms_hooks, records = time_hook_overhead(torch, workload, steps, warmup)
        result["hooks"] = {"ms_per_step_plain": ms_plain, "ms_per_step_hooks": ms_hooks,
                           "overhead_percent": 100.0 * (ms_hooks / ms_plain - 1.0),
                           "stat_records_per_step": records, "other_load_cores": hooks_load.cores}
    return result


def spawn_setup(intra, blas, args, hooks, give_up_ms=None, variant="eager"):
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)
    if blas is None:
        env.pop("OPENBLAS_NUM_THREADS", None)
    else:
        env["OPENBLAS_NUM_THREADS"] = str(blas)
    command = [sys.executable, os.path.abspath(__file__), "--setup",
               f"{'default' if intra is None else intra},{'default' if blas is None else blas}",
               "--steps", str(args.steps), "--warmup", str(args.warmup), "--model", args.model,
               "--variant", variant]
    if hooks:
        command.append("--hooks")
    if give_up_ms is not None:
        command += ["--give-up-ms", f"{give_up_ms:.3f}"]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"setup intra={intra} blas={blas} variant={variant} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def parse_setup(text):
    parts = text.split(",")
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"--setup takes 'intra,blas' (e.g. 1,2), got '{text}'")
    try:
        return tuple(None if p == "default" else int(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--setup takes two integers or 'default', got '{text}'")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="timed steps per setup (median is reported)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps before timing")
    parser.add_argument("--hooks", action="store_true",
                        help="also time the best setup with mean/var/max hooks on every Linear/LayerNorm/Embedding "
                        "(resnet20: Conv2d/BatchNorm2d/Linear)")
    parser.add_argument("--model", choices=("transformer", "resnet20"), default="transformer",
                        help="the yardstick: the reference transformer or bench_resnet's ResNet-20")
    parser.add_argument("--rounds", type=int, default=1,
                        help="times to cycle through all setups; each setup keeps its fastest round")
    parser.add_argument("--variant", choices=("best", "eager", "compiled"), default="best",
                        help="eager, torch.compile, or best: search the thread setups eagerly, then also time the "
                        "fastest setup compiled (torch 2.x) and keep the faster")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument("--setup", type=parse_setup, help=argparse.SUPPRESS)  # child mode: one setup, JSON out
    parser.add_argument("--give-up-ms", type=float, help=argparse.SUPPRESS)  # child mode: stop a hopeless setup
    args = parser.parse_args()
    if args.steps < 1 or args.warmup < 0 or args.rounds < 1:
        parser.error("--steps and --rounds must be >= 1 and --warmup >= 0")

    if args.setup is not None:
        intra, blas = args.setup
        variant = "eager" if args.variant == "best" else args.variant
        print(json.dumps(run_setup(intra, blas, args.steps, args.warmup, args.hooks, args.give_up_ms, args.model,
                                   variant)))
        return

    if importlib.util.find_spec("torch") is None:
        sys.exit(f"torch_reference: this interpreter ({sys.executable}) has no torch; run it with /usr/bin/python3 "
                 "(Debian's python3-torch)")
    resnet = args.model == "resnet20"
    flops = resnet_step_flops() if resnet else step_flops()
    unit = "images" if resnet else "tokens"
    best_ms = None
    by_setup = {}
    round_ms = {}
    search_variant = "compiled" if args.variant == "compiled" else "eager"
    for round_index in range(args.rounds):
        for intra, blas in [(None, None)] + THREAD_SETUPS:
            # A setup 5x slower than the best so far (oversubscribed pools spin) is cut short after 3 timed steps.
            row = spawn_setup(intra, blas, args, hooks=False, give_up_ms=None if best_ms is None else 5 * best_ms,
                              variant=search_variant)
            best_ms = row["ms_per_step"] if best_ms is None else min(best_ms, row["ms_per_step"])
            row["setup"] = f"{'default' if intra is None else intra},{'default' if blas is None else blas}"
            row["gflops_per_s"] = flops / (row["ms_per_step"] / 1e3) / 1e9
            round_ms.setdefault(row["setup"], []).append(row["ms_per_step"])
            # Across rounds a setup keeps its fastest median: on a shared machine slower rounds met other load.
            if row["setup"] not in by_setup or row["ms_per_step"] < by_setup[row["setup"]]["ms_per_step"]:
                by_setup[row["setup"]] = row
            if not args.json:
                print(f"round {round_index + 1} setup intra={row['setup'].split(',')[0]:>7} "
                      f"blas={row['setup'].split(',')[1]:>7}: {row['ms_per_step']:8.2f} ms/step  "
                      f"{row[unit + '_per_s']:8.0f} {unit}/s  {row['gflops_per_s']:6.2f} GFLOP/s  "
                      f"({row['timed_steps']} timed steps, other load {row['other_load_cores']:.2f} cores)",
                      flush=True)
    table = [dict(row, round_ms_per_step=round_ms[setup]) for setup, row in by_setup.items()]
    # Only explicit setups compete; the default row shows what an untuned run gets.
    best = min((r for r in table if r["setup"] != "default,default"), key=lambda r: r["ms_per_step"])
    variants = {search_variant: best["ms_per_step"]}
    compile_error = None
    if args.variant == "best" and best["compile_available"]:
        # The fastest eager setup, compiled; the faster of the two is the yardstick.
        intra, blas = (int(p) for p in best["setup"].split(","))
        if not args.json:
            print(f"setup {best['setup']} under torch.compile (the first steps compile) ...", flush=True)
        try:
            compiled = spawn_setup(intra, blas, args, hooks=False, variant="compiled")
        except RuntimeError as error:
            compile_error = str(error).strip().splitlines()[-1]
            print(f"torch_reference: the compiled variant failed, keeping eager: {compile_error}", file=sys.stderr)
        else:
            compiled["setup"] = best["setup"]
            compiled["gflops_per_s"] = flops / (compiled["ms_per_step"] / 1e3) / 1e9
            variants["compiled"] = compiled["ms_per_step"]
            if compiled["ms_per_step"] < best["ms_per_step"]:
                best = compiled
    if resnet:
        model = {"name": "resnet20", "depth": RESNET_DEPTH, "widths": [RESNET_BASE_WIDTH << s for s in range(3)],
                 "in_channels": RESNET_IN_CHANNELS, "image_size": RESNET_IMAGE_SIZE, "classes": RESNET_CLASSES,
                 "batch": RESNET_BATCH, "params": best["params"]}
    else:
        model = {"layers": LAYERS, "width": WIDTH, "heads": HEADS, "ffn": FFN_MULT * WIDTH, "vocab": VOCAB,
                 "seq_len": SEQ_LEN, "batch": BATCH, "params": best["params"]}
    report = {
        "model": model,
        "mkldnn": best["mkldnn"],
        "torch_version": best["torch_version"],
        "flops_per_step": flops,
        "steps": args.steps,
        "warmup": args.warmup,
        "rounds": args.rounds,
        "best_setup": best["setup"],
        "variant": best["variant"],
        "variants_ms_per_step": variants,
        "compile_error": compile_error,
        "sdpa": best["sdpa"],
        "fused_optimizer": best["fused_optimizer"],
        "ms_per_step": best["ms_per_step"],
        f"{unit}_per_s": best[f"{unit}_per_s"],
        "gflops_per_s": best["gflops_per_s"],
        "setups": table,
    }
    if args.hooks:
        intra, blas = (int(p) for p in best["setup"].split(","))
        hooked = spawn_setup(intra, blas, args, hooks=True)
        report["hooks"] = dict(setup=best["setup"], **hooked["hooks"])
    if args.json:
        print(json.dumps(report, indent=2))
        return
    kind = "convs and classifier" if resnet else "matmuls"
    print(f"model: {best['params']} params, {flops / 1e9:.2f} GFLOP/step ({kind}, fwd+bwd)")
    classes = RESNET_CLASSES if resnet else VOCAB
    print(f"loss: first {best['first_loss']:.4f} (ln {classes} = {math.log(classes):.4f}), last {best['last_loss']:.4f}")
    print(f"torch {best['torch_version']}: " + ", ".join(f"{k} {v:.2f} ms/step" for k, v in variants.items()) +
          f" (sdpa {best['sdpa']}, fused optimizer {best['fused_optimizer']})")
    print(f"best setup intra,blas = {best['setup']} {best['variant']}: {best['ms_per_step']:.2f} ms/step, "
          f"{best[unit + '_per_s']:.0f} {unit}/s, {best['gflops_per_s']:.2f} GFLOP/s")
    if args.hooks:
        h = report["hooks"]
        print(f"stat hooks ({h['stat_records_per_step']} records/step): {h['ms_per_step_plain']:.2f} -> "
              f"{h['ms_per_step_hooks']:.2f} ms/step, overhead {h['overhead_percent']:+.1f}%")


if __name__ == "__main__":
    main()
