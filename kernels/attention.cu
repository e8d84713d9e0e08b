// kernels/attention: causal multi-head self-attention on the GPU (see kernels/attention.cuh for the contract).
//
// Forward: one block per query row (pair, i) writes the row's logits into its probs row, takes the row maximum,
// optionally the row's logit power sums, then exponentiates, sums and normalises in place; a second kernel forms
// out = P·V with one thread per output element. Backward: one block per row forms d_scores = P ⊙ (d_P − Σ P⊙d_P)
// · logit_scale in a scratch [B, H, T, T] buffer (d_P = d_out·V^T), then one thread per element of d_qkv sums
// d_q = d_S·K, d_k = d_S^T·Q or d_v = P^T·d_out in index order.
#include "kernels/attention.cuh"

#include <cuda_runtime.h>

#include <math_constants.h>

#include "core/error.h"
#include "kernels/block_reduce.cuh"
#include "kernels/common.cuh"
#include "kernels/context.cuh"

namespace proplab::kernels {
namespace {

// Threads per row block (a power of two, as the block reductions need). Rows are T long; T ~ 128 in practice.
constexpr int kRowThreads = 128;

// Sizes shared by the kernels; everything in int64 (B·H·T·T overflows int quickly).
struct Dims {
  std::int64_t batch, tokens, model_dim, head_dim, heads;
  std::int64_t qkv_stride;  // 3·D: distance between tokens in qkv and d_qkv
};

// ==== forward =====================================================================================================

// One block per query row: row = pair·T + i, pair = b·H + h. probs row ← softmax of the causal logits (0 above the
// diagonal). When row_sums is given (uniform over the grid), thread 0 adds up the row's logit power sums in column
// order, as the CPU's add_logit_sums does.
__global__ void __launch_bounds__(kRowThreads) attention_softmax_kernel(const float* qkv, Dims dims, float logit_scale,
                                                                        float* probs, AttentionLogitSums* row_sums) {
  __shared__ float shared[kRowThreads];
  const std::int64_t T = dims.tokens, Dh = dims.head_dim;
  const std::int64_t row = blockIdx.x;
  const std::int64_t pair = row / T, i = row % T;
  const std::int64_t b = pair / dims.heads, h = pair % dims.heads;
  const float* q = qkv + (b * T + i) * dims.qkv_stride + h * Dh;
  const float* k_base = qkv + b * T * dims.qkv_stride + dims.model_dim + h * Dh;
  float* p = probs + row * T;

  // Logits of columns j <= i (each thread its own columns), zeros beyond the diagonal.
  float local_max = -CUDART_INF_F;
  for (std::int64_t j = threadIdx.x; j <= i; j += kRowThreads) {
    const float* k = k_base + j * dims.qkv_stride;
    float dot = 0.0f;
    for (std::int64_t d = 0; d < Dh; ++d) dot += q[d] * k[d];
    const float logit = logit_scale * dot;
    p[j] = logit;
    local_max = fmaxf(local_max, logit);
  }
  for (std::int64_t j = i + 1 + threadIdx.x; j < T; j += kRowThreads) p[j] = 0.0f;
  // Ends with __syncthreads: every logit of the row is visible to every thread of the block after it.
  const float row_max = block_max_float<kRowThreads>(local_max, shared);

  if (row_sums != nullptr) {
    if (threadIdx.x == 0) {
      AttentionLogitSums sums;
      for (std::int64_t j = 0; j <= i; ++j) {
        const double x = p[j];
        const double x2 = __dmul_rn(x, x);
        if (!isfinite(x)) {
          ++sums.nonfinite;
          continue;
        }
        sums.sum = __dadd_rn(sums.sum, x);
        sums.sum_sq = __dadd_rn(sums.sum_sq, x2);
        sums.sum_cube = __dadd_rn(sums.sum_cube, __dmul_rn(x2, x));
        sums.sum_quad = __dadd_rn(sums.sum_quad, __dmul_rn(x2, x2));
        sums.max_abs = fmax(sums.max_abs, fabs(x));
      }
      row_sums[row] = sums;
    }
    __syncthreads();  // the logits are read above before they are overwritten below
  }

  float local_sum = 0.0f;
  for (std::int64_t j = threadIdx.x; j <= i; j += kRowThreads) {
    const float e = expf(p[j] - row_max);
    p[j] = e;
    local_sum += e;
  }
  const float inverse = 1.0f / block_sum_float<kRowThreads>(local_sum, shared);
  for (std::int64_t j = threadIdx.x; j <= i; j += kRowThreads) p[j] *= inverse;
}

// One thread per pair (b, h): the rows' sums added in row order, as the CPU adds them into the pair's LogitSums.
__global__ void attention_pair_sums_kernel(const AttentionLogitSums* row_sums, std::int64_t pairs, std::int64_t tokens,
                                           AttentionLogitSums* pair_sums) {
  const std::int64_t pair = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (pair >= pairs) return;
  AttentionLogitSums total;
  for (std::int64_t i = 0; i < tokens; ++i) {
    const AttentionLogitSums& row = row_sums[pair * tokens + i];
    total.nonfinite += row.nonfinite;
    total.sum = __dadd_rn(total.sum, row.sum);
    total.sum_sq = __dadd_rn(total.sum_sq, row.sum_sq);
    total.sum_cube = __dadd_rn(total.sum_cube, row.sum_cube);
    total.sum_quad = __dadd_rn(total.sum_quad, row.sum_quad);
    total.max_abs = fmax(total.max_abs, row.max_abs);
  }
  pair_sums[pair] = total;
}

// out[b, i, h·Dh + d] = Σ_{j <= i} probs[b, h, i, j] · v[b, j, h·Dh + d], one thread per element, j ascending.
__global__ void __launch_bounds__(kBlockThreads)
    attention_out_kernel(const float* qkv, const float* probs, Dims dims, float* out) {
  const std::int64_t T = dims.tokens, D = dims.model_dim;
  const std::int64_t n = dims.batch * T * D;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t index = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; index < n;
       index += stride) {
    const std::int64_t b = index / (T * D), rest = index % (T * D);
    const std::int64_t i = rest / D, c = rest % D;
    const std::int64_t h = c / dims.head_dim;
    const float* p = probs + ((b * dims.heads + h) * T + i) * T;
    const float* v = qkv + b * T * dims.qkv_stride + 2 * D + c;
    float sum = 0.0f;
    for (std::int64_t j = 0; j <= i; ++j) sum += p[j] * v[j * dims.qkv_stride];
    out[index] = sum;
  }
}

// ==== backward ====================================================================================================

// One block per row (pair, i): d_scores[row, j] = p_j · (d_P_j − Σ_k p_k·d_P_k) · logit_scale for j <= i, 0 above
// the diagonal, where d_P_j = Σ_d d_out[b, i, h·Dh + d] · v[b, j, h·Dh + d].
__global__ void __launch_bounds__(kRowThreads)
    attention_d_scores_kernel(const float* qkv, const float* probs, const float* d_out, Dims dims, float logit_scale,
                              float* d_scores) {
  __shared__ float shared[kRowThreads];
  const std::int64_t T = dims.tokens, Dh = dims.head_dim;
  const std::int64_t row = blockIdx.x;
  const std::int64_t pair = row / T, i = row % T;
  const std::int64_t b = pair / dims.heads, h = pair % dims.heads;
  const float* d_o = d_out + (b * T + i) * dims.model_dim + h * Dh;
  const float* v_base = qkv + b * T * dims.qkv_stride + 2 * dims.model_dim + h * Dh;
  const float* p = probs + row * T;
  float* d_s = d_scores + row * T;

  float local_dot = 0.0f;
  for (std::int64_t j = threadIdx.x; j <= i; j += kRowThreads) {
    const float* v = v_base + j * dims.qkv_stride;
    float d_p = 0.0f;
    for (std::int64_t d = 0; d < Dh; ++d) d_p += d_o[d] * v[d];
    d_s[j] = d_p;
    local_dot += p[j] * d_p;
  }
  const float dot = block_sum_float<kRowThreads>(local_dot, shared);
  // Each thread rewrites only the columns it wrote above.
  for (std::int64_t j = threadIdx.x; j <= i; j += kRowThreads) d_s[j] = p[j] * (d_s[j] - dot) * logit_scale;
  for (std::int64_t j = i + 1 + threadIdx.x; j < T; j += kRowThreads) d_s[j] = 0.0f;
}

// One thread per element of d_qkv [B, T, 3D]; column c3 of token t is part c3 / D (q, k, v), feature c = c3 % D of
// head h = c / Dh:
//   d_q[t] = Σ_{j <= t} d_S[t, j] · k[j]     d_k[t] = Σ_{i >= t} d_S[i, t] · q[i]     d_v[t] = Σ_{i >= t} P[i, t] ·
//   d_out[i]
__global__ void __launch_bounds__(kBlockThreads)
    attention_d_qkv_kernel(const float* qkv, const float* probs, const float* d_out, const float* d_scores, Dims dims,
                           float* d_qkv) {
  const std::int64_t T = dims.tokens, D = dims.model_dim, S = dims.qkv_stride;
  const std::int64_t n = dims.batch * T * S;
  const std::int64_t grid_stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t index = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; index < n;
       index += grid_stride) {
    const std::int64_t b = index / (T * S), rest = index % (T * S);
    const std::int64_t t = rest / S, c3 = rest % S;
    const std::int64_t part = c3 / D, c = c3 % D;
    const std::int64_t pair = b * dims.heads + c / dims.head_dim;
    const float* sequence = qkv + b * T * S;
    float sum = 0.0f;
    if (part == 0) {
      const float* d_s = d_scores + (pair * T + t) * T;
      const float* k = sequence + D + c;
      for (std::int64_t j = 0; j <= t; ++j) sum += d_s[j] * k[j * S];
    } else if (part == 1) {
      const float* d_s = d_scores + pair * T * T + t;
      const float* q = sequence + c;
      for (std::int64_t i = t; i < T; ++i) sum += d_s[i * T] * q[i * S];
    } else {
      const float* p = probs + pair * T * T + t;
      const float* d_o = d_out + b * T * D + c;
      for (std::int64_t i = t; i < T; ++i) sum += p[i * T] * d_o[i * D];
    }
    d_qkv[index] = sum;
  }
}

Dims make_dims(std::int64_t batch, std::int64_t tokens, std::int64_t model_dim, int heads) {
  PROPLAB_CHECK(batch >= 0 && tokens >= 0 && model_dim >= 0 && heads > 0 && model_dim % heads == 0,
                "attention: bad sizes B=", batch, " T=", tokens, " D=", model_dim, " H=", heads);
  return Dims{batch, tokens, model_dim, model_dim / heads, heads, 3 * model_dim};
}

// Blocks for the row kernels: one per (pair, row), in gridDim.x (at most 2^31 − 1).
unsigned row_blocks(const Dims& dims, const char* op) {
  const std::int64_t rows = dims.batch * dims.heads * dims.tokens;
  PROPLAB_CHECK(rows <= 0x7fffffff, op, ": ", rows, " attention rows exceed one grid");
  return static_cast<unsigned>(rows);
}

}  // namespace

void attention_forward(const float* qkv, std::int64_t batch, std::int64_t tokens, std::int64_t model_dim, int heads,
                       float logit_scale, float* probs, float* out, AttentionLogitSums* pair_sums) {
  const Dims dims = make_dims(batch, tokens, model_dim, heads);
  const std::int64_t pairs = batch * heads;
  if (pairs == 0 || tokens == 0) {
    for (std::int64_t pair = 0; pair < (pair_sums != nullptr ? pairs : 0); ++pair) pair_sums[pair] = {};
    return;
  }
  const cudaStream_t stream = context().stream;
  const unsigned blocks = row_blocks(dims, "attention_forward");
  // Per-row sums, then per-pair totals, in one scratch: [pairs · T] rows followed by [pairs].
  const std::int64_t rows = pairs * tokens;
  Scratch sums(pair_sums != nullptr ? sizeof(AttentionLogitSums) * static_cast<std::size_t>(rows + pairs) : 0);
  AttentionLogitSums* row_sums = pair_sums != nullptr ? sums.as<AttentionLogitSums>() : nullptr;
  attention_softmax_kernel<<<blocks, kRowThreads, 0, stream>>>(qkv, dims, logit_scale, probs, row_sums);
  PROPLAB_CUDA_CHECK_LAUNCH("attention_softmax_kernel");
  const std::int64_t out_elements = batch * tokens * model_dim;
  if (out_elements > 0) {
    attention_out_kernel<<<grid_blocks(out_elements), kBlockThreads, 0, stream>>>(qkv, probs, dims, out);
    PROPLAB_CUDA_CHECK_LAUNCH("attention_out_kernel");
  }
  if (pair_sums == nullptr) return;
  AttentionLogitSums* device_pair_sums = row_sums + rows;
  const int threads = 128;
  attention_pair_sums_kernel<<<static_cast<unsigned>((pairs + threads - 1) / threads), threads, 0, stream>>>(
      row_sums, pairs, tokens, device_pair_sums);
  PROPLAB_CUDA_CHECK_LAUNCH("attention_pair_sums_kernel");
  copy_to_host(pair_sums, device_pair_sums, sizeof(AttentionLogitSums) * static_cast<std::size_t>(pairs));
}

void attention_backward(const float* qkv, const float* probs, const float* d_out, std::int64_t batch,
                        std::int64_t tokens, std::int64_t model_dim, int heads, float logit_scale, float* d_qkv) {
  const Dims dims = make_dims(batch, tokens, model_dim, heads);
  // d_qkv has no elements without features, tokens or sequences.
  if (batch == 0 || tokens == 0 || model_dim == 0) return;
  const cudaStream_t stream = context().stream;
  const unsigned blocks = row_blocks(dims, "attention_backward");
  Scratch d_scores(sizeof(float) * static_cast<std::size_t>(batch * heads * tokens * tokens));
  attention_d_scores_kernel<<<blocks, kRowThreads, 0, stream>>>(qkv, probs, d_out, dims, logit_scale,
                                                                d_scores.as<float>());
  PROPLAB_CUDA_CHECK_LAUNCH("attention_d_scores_kernel");
  const std::int64_t elements = batch * tokens * dims.qkv_stride;
  attention_d_qkv_kernel<<<grid_blocks(elements), kBlockThreads, 0, stream>>>(qkv, probs, d_out, d_scores.as<float>(),
                                                                              dims, d_qkv);
  PROPLAB_CUDA_CHECK_LAUNCH("attention_d_qkv_kernel");
}

}  // namespace proplab::kernels
