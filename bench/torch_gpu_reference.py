#!/usr/bin/env python3
"""bench/torch_gpu_reference: the GPU speed yardsticks in PyTorch (2.x with CUDA), one JSON line per setting.

--model gpt2: GPT-2 small's shape as studies/gpt2_124m.toml builds it in proplab: 12 Pre-LN blocks, width 768,
12 heads, FFN 4x with tanh-approximated GELU, learned position embeddings, biases everywhere, affine LayerNorm
(eps 1e-5), a final LayerNorm and tied embeddings; vocab 50257, seq 1024. Attention is
F.scaled_dot_product_attention (causal: flash attention on Hopper). Training step: zero_grad + forward +
cross-entropy + backward + clip 1.0 + fused AdamW (lr 6e-4, betas (0.9, 0.95)), on one fixed batch of uniform
random tokens. --precision bf16 runs the forward under torch.autocast(bfloat16) with fp32 master weights;
fp32 disables TF32 (the arithmetic proplab's fp32 path does). --compile wraps the model in torch.compile.

--model resnet56: a CIFAR ResNet-56 (three stages of nine post-activation basic blocks at 16/32/64 channels,
BatchNorm, projection shortcuts at the transitions) on 32x32 images, batch 256, 10 classes, SGD with Nesterov
momentum 0.9, lr 0.1, weight decay 5e-4; --channels-last uses torch.channels_last memory format.

Timing: --warmup untimed steps (compilation happens there), then --steps steps each timed between CUDA events
after a synchronise; the median is reported as ms/step with tokens/s (images/s).
"""
import argparse
import json
import math
import statistics
import sys
import time


def gpt2(torch, nn, F, vocab, seq, width, layers, heads):
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(width, eps=1e-5)
            self.qkv = nn.Linear(width, 3 * width)
            self.proj = nn.Linear(width, width)
            self.ln2 = nn.LayerNorm(width, eps=1e-5)
            self.fc = nn.Linear(width, 4 * width)
            self.out = nn.Linear(4 * width, width)

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
            q, k, v = (z.view(b, t, heads, d // heads).transpose(1, 2) for z in (q, k, v))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
            return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class Gpt(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(vocab, width)
            self.pos = nn.Embedding(seq, width)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln = nn.LayerNorm(width, eps=1e-5)
            for p in self.parameters():
                if p.dim() > 1:
                    nn.init.normal_(p, std=0.02)
                else:
                    nn.init.zeros_(p)
            for blk in self.blocks:
                nn.init.normal_(blk.proj.weight, std=0.02 / math.sqrt(2 * layers))
                nn.init.normal_(blk.out.weight, std=0.02 / math.sqrt(2 * layers))
                for ln in (blk.ln1, blk.ln2):
                    nn.init.ones_(ln.weight)
            nn.init.ones_(self.ln.weight)

        def forward(self, idx):
            t = idx.shape[1]
            x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
            for blk in self.blocks:
                x = blk(x)
            return self.ln(x) @ self.tok.weight.t()

    return Gpt()


def resnet56(torch, nn, F):
    class BasicBlock(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.b1 = nn.BatchNorm2d(cout)
            self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.b2 = nn.BatchNorm2d(cout)
            self.short = None
            if stride != 1 or cin != cout:
                self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            y = self.b2(self.c2(F.relu(self.b1(self.c1(x)))))
            return F.relu(y + (x if self.short is None else self.short(x)))

    class ResNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
            layers, cin = [], 16
            for cout, stride in ((16, 1), (32, 2), (64, 2)):
                for i in range(9):
                    layers.append(BasicBlock(cin, cout, stride if i == 0 else 1))
                    cin = cout
            self.blocks = nn.Sequential(*layers)
            self.fc = nn.Linear(64, 10)

        def forward(self, x):
            return self.fc(F.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1).flatten(1))

    return ResNet()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["gpt2", "resnet56"], default="gpt2")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="bf16")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("--batch", type=int, default=0, help="0: 16 sequences (gpt2), 256 images (resnet56)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
    try:
        import torch
        import torch.nn as nn
        import torch.nn.functional as F
    except ImportError as error:
        sys.exit("torch_gpu_reference: PyTorch is not importable: %s" % error)
    if not torch.cuda.is_available():
        sys.exit("torch_gpu_reference: torch.cuda.is_available() is False")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = torch.device("cuda")
    generator = torch.Generator(device="cpu").manual_seed(0)
    if args.model == "gpt2":
        batch = args.batch or 16
        vocab, seq = 50257, 1024
        model = gpt2(torch, nn, F, vocab, seq, 768, 12, 12).to(device)
        tokens = torch.randint(0, vocab, (batch, seq + 1), generator=generator).to(device)
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.0, fused=True)
        per_step = batch * seq

        def loss_of(m):
            return F.cross_entropy(m(inputs).float().view(-1, vocab), targets.reshape(-1))
    else:
        batch = args.batch or 256
        model = resnet56(torch, nn, F).to(device)
        images = torch.randn(batch, 3, 32, 32, generator=generator).to(device)
        labels = torch.randint(0, 10, (batch,), generator=generator).to(device)
        if args.channels_last:
            model = model.to(memory_format=torch.channels_last)
            images = images.contiguous(memory_format=torch.channels_last)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
        per_step = batch

        def loss_of(m):
            return F.cross_entropy(m(images).float(), labels)

    step_model = torch.compile(model) if args.compile else model

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            loss = loss_of(step_model)
        loss.backward()
        if args.model == "gpt2":
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return loss

    start = time.time()
    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    warmup_s = time.time() - start
    times = []
    for _ in range(args.steps):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        loss = step()
        end.record()
        torch.cuda.synchronize()
        times.append(begin.elapsed_time(end))
    ms = statistics.median(times)
    print(json.dumps({"bench": "torch_gpu_reference", "model": args.model, "precision": args.precision,
                      "compile": args.compile, "channels_last": args.channels_last, "batch": batch,
                      "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0), "step_ms": round(ms, 4),
                      "per_s": round(per_step / (ms / 1e3), 1), "unit": "tokens" if args.model == "gpt2" else "images",
                      "warmup_s": round(warmup_s, 1), "peak_bytes": torch.cuda.max_memory_allocated(),
                      "final_loss": round(float(loss), 4)}))


if __name__ == "__main__":
    main()
