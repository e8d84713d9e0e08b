// kernels/attention: the CUDA side of causal multi-head self-attention (proplab::ops::attention_forward/backward in
// src/ops/ops.h, whose CPU implementation in src/ops/attention.cpp is the reference).
//
// Layout: qkv [B, T, 3D] row-major (q, k, v of head h are the columns [h·Dh, (h+1)·Dh) of the first, second and
// third D columns), probs [B, H, T, T], out and d_out [B, T, D], d_qkv [B, T, 3D]; Dh = D / H.
//
// Invariants:
// - probs[b, h, i, j] is the softmax over j <= i of logit_scale · q_i·k_j and exactly 0 for j > i, as on the CPU.
//   Logits, the softmax (max, exp, sum) and every product are in float; each output element is computed by one
//   thread looping over its sum in a fixed order, and block-wide row maxima and sums are fixed trees
//   (kernels/block_reduce.cuh). No atomics; geometry depends only on the sizes: the same inputs give the same bits.
// - Backward OVERWRITES every element of d_qkv (d_q, d_k, d_v of every head and token), as the CPU does; d_qkv
//   must not alias qkv, probs or d_out.
// - The logit power sums (recorded steps) are formed per query row in double, in column order, by one thread;
//   rows are combined per (sequence, head) pair in row order on the device, and the per-pair totals come back to
//   the host (one copy, which synchronises), where src/ops/attention.cpp adds them in pair order, as the CPU does.
// - Everything is enqueued on context().stream; temporaries come from kernels::Scratch. Host-compilable.
#pragma once

#include <cstdint>

namespace proplab::kernels {

// The logit power sums of one (sequence, head) pair: Σx, Σx², Σx³, Σx⁴ and max |x| over its finite causal logits,
// and how many were not finite (the count of all logits, T(T+1)/2 per pair, is known on the host).
struct AttentionLogitSums {
  double sum = 0.0, sum_sq = 0.0, sum_cube = 0.0, sum_quad = 0.0, max_abs = 0.0;
  std::int64_t nonfinite = 0;
};

// probs and out (overwritten) from qkv (device pointers). When pair_sums (a HOST array of batch · heads entries)
// is given, it receives the logit sums of every pair (b, h) at index b · heads + h; the call then waits for the
// GPU. model_dim is D (qkv has 3·D columns); heads divides it.
void attention_forward(const float* qkv, std::int64_t batch, std::int64_t tokens, std::int64_t model_dim, int heads,
                       float logit_scale, float* probs, float* out, AttentionLogitSums* pair_sums);

// d_qkv (overwritten) from qkv, probs and d_out (device pointers).
void attention_backward(const float* qkv, const float* probs, const float* d_out, std::int64_t batch,
                        std::int64_t tokens, std::int64_t model_dim, int heads, float logit_scale, float* d_qkv);

}  // namespace proplab::kernels
