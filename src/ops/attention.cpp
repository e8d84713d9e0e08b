// ops/attention (CPU reference): causal multi-head self-attention from a packed qkv.
//
// Why our own kernels rather than per-head sgemm calls: at the sizes proplab trains (T ~ 128, Dh ~ 64) one
// head's products are too small for OpenBLAS to thread well, and most of their work lies above the causal
// diagonal. Here every (batch, head) pair is one OpenMP task that packs its q, k, v into padded thread-local
// buffers and runs register-blocked tiles that stop at the diagonal. Each pair is computed by one thread with
// a fixed loop order, so results are bitwise identical for any thread count. OpenBLAS is not called here.
//
// Padding: tokens are padded to a multiple of kLanes (tokens_padded), head features likewise (head_dim_padded).
// Padded rows and columns of the packed buffers are zero and are never written, so tiles may run over them.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "ops/cpu_simd.h"
#include "ops/dispatch.h"
#include "ops/ops.h"

#ifdef PROPLAB_WITH_CUDA
#include "kernels/attention.cuh"
#endif

namespace proplab::ops {
namespace {

using simd::kLanes;
using simd::load;
using simd::store;
using simd::Vec;

// Register tile: kTileRows rows by kTileVecs vectors of kLanes columns. Its kTileRows * kTileVecs accumulators
// plus the kTileVecs loaded values must fit the register file; 8 x 2 measured fastest with AVX-512.
constexpr std::int64_t kTileRows = simd::kVectorRegisters >= 32 ? 8 : 4;
constexpr int kTileVecs = 2;
static_assert(kLanes % kTileRows == 0, "padded token counts must be whole register tiles");

// c[r*ldc + col] = alpha * Σ_{k in [k_begin, k_end)} a[r*a_row + k*a_step] * b[k*ldb + col]
// for r < kTileRows, col < NV*kLanes. (a_row, a_step) = (lda, 1) reads A, (1, lda) reads A^T.
template <int NV>
inline void tile_kernel(const float* a, std::int64_t a_row, std::int64_t a_step, const float* b, std::int64_t ldb,
                        std::int64_t k_begin, std::int64_t k_end, float alpha, float* c, std::int64_t ldc) {
  Vec acc[kTileRows][NV];
  for (int r = 0; r < kTileRows; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = Vec{};
  for (std::int64_t k = k_begin; k < k_end; ++k) {
    Vec b_row[NV];
    for (int v = 0; v < NV; ++v) b_row[v] = load(b + k * ldb + v * kLanes);
    for (int r = 0; r < kTileRows; ++r) {
      const float a_value = a[r * a_row + k * a_step];
      for (int v = 0; v < NV; ++v) acc[r][v] += a_value * b_row[v];
    }
  }
  for (int r = 0; r < kTileRows; ++r)
    for (int v = 0; v < NV; ++v) store(c + r * ldc + v * kLanes, alpha * acc[r][v]);
}

// tile_kernel over `width` columns (a multiple of kLanes), kTileVecs vectors at a time.
void tile_rows(const float* a, std::int64_t a_row, std::int64_t a_step, const float* b, std::int64_t ldb,
               std::int64_t k_begin, std::int64_t k_end, float alpha, float* c, std::int64_t ldc, std::int64_t width) {
  std::int64_t col = 0;
  for (; col + kTileVecs * kLanes <= width; col += kTileVecs * kLanes)
    tile_kernel<kTileVecs>(a, a_row, a_step, b + col, ldb, k_begin, k_end, alpha, c + col, ldc);
  for (; col < width; col += kLanes)
    tile_kernel<1>(a, a_row, a_step, b + col, ldb, k_begin, k_end, alpha, c + col, ldc);
}

std::int64_t round_up(std::int64_t x, std::int64_t multiple) { return (x + multiple - 1) / multiple * multiple; }

struct Layout {
  std::int64_t batch, tokens, heads, head_dim, model_dim;
  std::int64_t qkv_stride;       // 3 * model_dim: distance between tokens in qkv
  std::int64_t tokens_padded;    // tokens rounded up to kLanes (a multiple of kTileRows too)
  std::int64_t head_dim_padded;  // head_dim rounded up to kLanes
  std::int64_t transposed_ld;    // leading dim of [head_dim, tokens] buffers; +kLanes avoids cache-set conflicts
};

Layout make_layout(const Tensor& qkv, int heads) {
  Layout layout{};
  layout.batch = qkv.dim(0);
  layout.tokens = qkv.dim(1);
  layout.model_dim = qkv.dim(2) / 3;
  layout.heads = heads;
  layout.head_dim = layout.model_dim / heads;
  layout.qkv_stride = 3 * layout.model_dim;
  layout.tokens_padded = round_up(std::max<std::int64_t>(layout.tokens, 1), kLanes);
  layout.head_dim_padded = round_up(layout.head_dim, kLanes);
  layout.transposed_ld = layout.tokens_padded + kLanes;
  return layout;
}

// This thread's scratch, reused across calls (OpenMP keeps its threads), so steady-state calls neither allocate
// nor page-fault. take() hands out consecutive vector-aligned buffers, zeroed once per call; one Scratch per
// thread at a time.
class Scratch {
 public:
  explicit Scratch(std::int64_t floats) {
    thread_local std::vector<float> storage;
    storage.assign(static_cast<std::size_t>(floats + kLanes), 0.0f);
    next_ = storage.data();
    next_ += (kLanes - (reinterpret_cast<std::uintptr_t>(next_) / sizeof(float)) % kLanes) % kLanes;
  }
  float* take(std::int64_t floats) {
    float* buffer = next_;
    next_ += round_up(floats, kLanes);
    return buffer;
  }

 private:
  float* next_ = nullptr;
};

// Copies `cols` floats, a vector at a time (a head's rows are 16-64 floats: a call to memcpy for each row, millions
// a step, had cost about 6% of a 32-block, width-64 model's training step).
inline void copy_row(const float* source, std::int64_t cols, float* target) {
  std::int64_t c = 0;
  for (; c + kLanes <= cols; c += kLanes) store(target + c, load(source + c));
  for (; c < cols; ++c) target[c] = source[c];
}

// Copies `rows` rows of `cols` floats (source stride source_ld) into a [*, ld] buffer.
void pack_rows(const float* source, std::int64_t source_ld, std::int64_t rows, std::int64_t cols, float* target,
               std::int64_t ld) {
  for (std::int64_t t = 0; t < rows; ++t) copy_row(source + t * source_ld, cols, target + t * ld);
}

// target[d*ld + t] = source[t*source_ld + d]: blocks of kLanes tokens keep the writes contiguous.
void pack_transposed(const float* source, std::int64_t source_ld, std::int64_t rows, std::int64_t cols, float* target,
                     std::int64_t ld) {
  for (std::int64_t t0 = 0; t0 < rows; t0 += kLanes) {
    const std::int64_t t1 = std::min(rows, t0 + kLanes);
    for (std::int64_t d = 0; d < cols; ++d)
      for (std::int64_t t = t0; t < t1; ++t) target[d * ld + t] = source[t * source_ld + d];
  }
}

// The largest of row[0, valid) (-inf for none).
float row_max(const float* row, std::int64_t valid) {
  Vec max_v = simd::splat(-std::numeric_limits<float>::infinity());
  for (std::int64_t j = 0; j < round_up(valid, kLanes); j += kLanes)
    max_v = simd::max(max_v, simd::select(simd::lanes_below(j, valid), load(row + j), max_v));
  return simd::horizontal_max(max_v);
}

// In place: row[0, valid) <- exp(row[0, valid) - shift) (shift at least their maximum), row[valid, padded) <- 0;
// returns their sum.
float exp_row(float* row, std::int64_t valid, std::int64_t padded, float shift) {
  const std::int64_t chunks_end = round_up(valid, kLanes);
  const Vec shift_v = simd::splat(shift);
  Vec sum_v = Vec{};
  for (std::int64_t j = 0; j < chunks_end; j += kLanes) {
    Vec e = simd::select(simd::lanes_below(j, valid), simd::exp_nonpositive(load(row + j) - shift_v), Vec{});
    store(row + j, e);
    sum_v += e;
  }
  for (std::int64_t j = chunks_end; j < padded; j += kLanes) store(row + j, Vec{});
  return simd::horizontal_sum(sum_v);
}

// In place: row[0, valid) <- softmax(row[0, valid)) with max subtraction; row[valid, padded) <- 0.
void softmax_row(float* row, std::int64_t valid, std::int64_t padded) {
  const Vec inverse = simd::splat(1.0f / exp_row(row, valid, padded, row_max(row, valid)));
  for (std::int64_t j = 0; j < round_up(valid, kLanes); j += kLanes) store(row + j, load(row + j) * inverse);
}

// In place: d_row[j] <- p[j] * (d_row[j] - Σ_k p[k] d_row[k]) * scale for j < valid; 0 for j in [valid, padded).
void softmax_backward_row(const float* p, float* d_row, std::int64_t valid, std::int64_t padded, float scale) {
  const std::int64_t chunks_end = round_up(valid, kLanes);
  Vec dot_v = Vec{};
  for (std::int64_t j = 0; j < chunks_end; j += kLanes)
    dot_v += simd::select(simd::lanes_below(j, valid), load(p + j) * load(d_row + j), Vec{});
  const Vec dot = simd::splat(simd::horizontal_sum(dot_v));
  const Vec scale_v = simd::splat(scale);
  for (std::int64_t j = 0; j < chunks_end; j += kLanes)
    store(d_row + j, simd::select(simd::lanes_below(j, valid), load(p + j) * (load(d_row + j) - dot) * scale_v, Vec{}));
  for (std::int64_t j = chunks_end; j < padded; j += kLanes) store(d_row + j, Vec{});
}

void attention_forward_cpu(const Tensor& qkv, int heads, float logit_scale, Tensor& probs, Tensor& out,
                           LogitSums* logit_sums) {
  const Layout L = make_layout(qkv, heads);
  const std::int64_t Tp = L.tokens_padded, Dp = L.head_dim_padded, T = L.tokens, Dh = L.head_dim;
  const float* qkv_data = qkv.f32();
  float* probs_data = probs.f32();
  float* out_data = out.f32();
  const std::int64_t pairs = L.batch * L.heads;
  std::vector<LogitSums> pair_sums(logit_sums ? static_cast<std::size_t>(pairs) : 0);
#pragma omp parallel
  {
    const std::int64_t head_floats = round_up(Tp * Dp, kLanes),
                       transposed_floats = round_up(Dp * L.transposed_ld, kLanes);
    Scratch scratch(3 * head_floats + transposed_floats + Tp * Tp);
    float* q = scratch.take(Tp * Dp);
    float* k_t = scratch.take(Dp * L.transposed_ld);
    float* v = scratch.take(Tp * Dp);
    float* p = scratch.take(Tp * Tp);
    float* head_out = scratch.take(Tp * Dp);
#pragma omp for schedule(static)
    for (std::int64_t pair = 0; pair < pairs; ++pair) {
      const std::int64_t b = pair / L.heads, h = pair % L.heads;
      const float* q_source = qkv_data + b * T * L.qkv_stride + h * Dh;
      pack_rows(q_source, L.qkv_stride, T, Dh, q, Dp);
      pack_transposed(q_source + L.model_dim, L.qkv_stride, T, Dh, k_t, L.transposed_ld);
      pack_rows(q_source + 2 * L.model_dim, L.qkv_stride, T, Dh, v, Dp);
      // Logits, only the column blocks that reach the diagonal.
      for (std::int64_t i0 = 0; i0 < Tp; i0 += kTileRows)
        tile_rows(q + i0 * Dp, Dp, 1, k_t, L.transposed_ld, 0, Dh, logit_scale, p + i0 * Tp, Tp,
                  std::min(Tp, round_up(i0 + kTileRows, kLanes)));
      float* probs_pair = probs_data + pair * T * T;
      for (std::int64_t i = 0; i < T; ++i) {
        if (logit_sums) probe::add_logit_row(p + i * Tp, i + 1, pair_sums[pair]);
        softmax_row(p + i * Tp, i + 1, Tp);
        copy_row(p + i * Tp, T, probs_pair + i * T);
      }
      // out = P V, summing only up to each tile's last row (P is 0 above the diagonal).
      for (std::int64_t i0 = 0; i0 < Tp; i0 += kTileRows)
        tile_rows(p + i0 * Tp, Tp, 1, v, Dp, 0, std::min(i0 + kTileRows, T), 1.0f, head_out + i0 * Dp, Dp, Dp);
      pack_rows(head_out, Dp, T, Dh, out_data + b * T * L.model_dim + h * Dh, L.model_dim);
    }
  }
  if (logit_sums) {
    for (const LogitSums& part : pair_sums) logit_sums->add(part);  // in (sequence, head) order
  }
}

void attention_backward_cpu(const Tensor& qkv, const Tensor& probs, const Tensor& d_out, int heads, float logit_scale,
                            Tensor& d_qkv) {
  const Layout L = make_layout(qkv, heads);
  const std::int64_t Tp = L.tokens_padded, Dp = L.head_dim_padded, T = L.tokens, Dh = L.head_dim;
  const float* qkv_data = qkv.f32();
  const float* probs_data = probs.f32();
  const float* d_out_data = d_out.f32();
  float* d_qkv_data = d_qkv.f32();
  const std::int64_t pairs = L.batch * L.heads;
#pragma omp parallel
  {
    const std::int64_t head_floats = round_up(Tp * Dp, kLanes),
                       transposed_floats = round_up(Dp * L.transposed_ld, kLanes);
    Scratch scratch(6 * head_floats + transposed_floats + 2 * Tp * Tp);
    float* q = scratch.take(Tp * Dp);
    float* k = scratch.take(Tp * Dp);
    float* v_t = scratch.take(Dp * L.transposed_ld);
    float* d_o = scratch.take(Tp * Dp);
    float* p = scratch.take(Tp * Tp);
    float* d_s = scratch.take(Tp * Tp);
    float* d_q = scratch.take(Tp * Dp);
    float* d_k = scratch.take(Tp * Dp);
    float* d_v = scratch.take(Tp * Dp);
#pragma omp for schedule(static)
    for (std::int64_t pair = 0; pair < pairs; ++pair) {
      const std::int64_t b = pair / L.heads, h = pair % L.heads;
      const float* q_source = qkv_data + b * T * L.qkv_stride + h * Dh;
      pack_rows(q_source, L.qkv_stride, T, Dh, q, Dp);
      pack_rows(q_source + L.model_dim, L.qkv_stride, T, Dh, k, Dp);
      pack_transposed(q_source + 2 * L.model_dim, L.qkv_stride, T, Dh, v_t, L.transposed_ld);
      pack_rows(d_out_data + b * T * L.model_dim + h * Dh, L.model_dim, T, Dh, d_o, Dp);
      pack_rows(probs_data + pair * T * T, T, T, T, p, Tp);
      // d_v = P^T d_out: row j of d_v sums over i >= j.
      for (std::int64_t j0 = 0; j0 < Tp; j0 += kTileRows)
        tile_rows(p + j0, 1, Tp, d_o, Dp, j0, T, 1.0f, d_v + j0 * Dp, Dp, Dp);
      // d_P = d_out V^T, only the column blocks that reach the diagonal.
      for (std::int64_t i0 = 0; i0 < Tp; i0 += kTileRows)
        tile_rows(d_o + i0 * Dp, Dp, 1, v_t, L.transposed_ld, 0, Dh, 1.0f, d_s + i0 * Tp, Tp,
                  std::min(Tp, round_up(i0 + kTileRows, kLanes)));
      // d_S = P ⊙ (d_P - rowsum(d_P ⊙ P)) * logit_scale, zero above the diagonal and in padded rows.
      for (std::int64_t i = 0; i < Tp; ++i)
        softmax_backward_row(p + i * Tp, d_s + i * Tp, i < T ? i + 1 : 0, Tp, logit_scale);
      // d_q = d_S K (sum over j <= i); d_k = d_S^T Q (sum over i >= j).
      for (std::int64_t i0 = 0; i0 < Tp; i0 += kTileRows)
        tile_rows(d_s + i0 * Tp, Tp, 1, k, Dp, 0, std::min(i0 + kTileRows, T), 1.0f, d_q + i0 * Dp, Dp, Dp);
      for (std::int64_t j0 = 0; j0 < Tp; j0 += kTileRows)
        tile_rows(d_s + j0, 1, Tp, q, Dp, j0, T, 1.0f, d_k + j0 * Dp, Dp, Dp);
      float* d_q_target = d_qkv_data + b * T * L.qkv_stride + h * Dh;
      pack_rows(d_q, Dp, T, Dh, d_q_target, L.qkv_stride);
      pack_rows(d_k, Dp, T, Dh, d_q_target + L.model_dim, L.qkv_stride);
      pack_rows(d_v, Dp, T, Dh, d_q_target + 2 * L.model_dim, L.qkv_stride);
    }
  }
}

// The shapes of a blockwise step: queries from qkv [B, Tq, 3D], keys and values from kv [B, Tk, W].
struct BlockLayout {
  std::int64_t batch, queries, keys, heads, head_dim, model_dim, kv_stride;
  std::int64_t queries_padded, keys_padded, head_dim_padded, transposed_ld;
};

BlockLayout make_block_layout(const char* op, const Tensor& qkv, const Tensor& kv, int heads, bool causal,
                              std::int64_t kv_features) {
  PROPLAB_CHECK(qkv.device() == Device::cpu && kv.device() == Device::cpu, "op '", op, "': CPU tensors only");
  PROPLAB_CHECK(qkv.dtype() == DType::f32 && qkv.ndim() == 3 && qkv.dim(2) % 3 == 0 && qkv.is_contiguous(), "op '", op,
                "': qkv must be contiguous f32 [B, Tq, 3D], got ", shape_string(qkv.shape()));
  BlockLayout L{};
  L.batch = qkv.dim(0);
  L.queries = qkv.dim(1);
  L.model_dim = qkv.dim(2) / 3;
  L.heads = heads;
  PROPLAB_CHECK(heads > 0 && L.model_dim % heads == 0, "op '", op, "': ", heads, " heads do not divide the width ",
                L.model_dim);
  L.head_dim = L.model_dim / heads;
  PROPLAB_CHECK(kv.dtype() == DType::f32 && kv.ndim() == 3 && kv.dim(0) == L.batch &&
                    kv.dim(2) >= kv_features * L.model_dim && kv.is_contiguous(),
                "op '", op, "': kv must be contiguous f32 [", L.batch, ", Tk, >= ", kv_features * L.model_dim,
                "], got ", shape_string(kv.shape()));
  L.keys = kv.dim(1);
  PROPLAB_CHECK(!causal || L.keys == L.queries, "op '", op, "': a causal block holds the queries' own ", L.queries,
                " tokens, got ", L.keys);
  L.kv_stride = kv.dim(2);
  L.queries_padded = round_up(std::max<std::int64_t>(L.queries, 1), kLanes);
  L.keys_padded = round_up(std::max<std::int64_t>(L.keys, 1), kLanes);
  L.head_dim_padded = round_up(L.head_dim, kLanes);
  L.transposed_ld = L.keys_padded + kLanes;
  return L;
}

// Keys of `row` (query i) visible in the block.
std::int64_t visible_keys(const BlockLayout& L, std::int64_t i, bool causal) { return causal ? i + 1 : L.keys; }

// The logit columns a tile of rows [i0, i0 + kTileRows) needs: up to the diagonal's column block in a causal block
// (the rest is masked, and the rows' tails are zeroed after), every one otherwise.
std::int64_t causal_width(const BlockLayout& L, std::int64_t i0, bool causal) {
  return causal ? std::min(L.keys_padded, round_up(i0 + kTileRows, kLanes)) : L.keys_padded;
}

void attention_block_forward_cpu(const Tensor& qkv, const Tensor& kv, const BlockLayout& L, float logit_scale,
                                 bool causal, float* m, float* l, float* o, LogitSums* logit_sums) {
  const std::int64_t Tqp = L.queries_padded, Tkp = L.keys_padded, Dp = L.head_dim_padded, Dh = L.head_dim;
  const std::int64_t Tq = L.queries, Tk = L.keys, D = L.model_dim;
  const float* qkv_data = qkv.f32();
  const float* kv_data = kv.f32();
  const std::int64_t pairs = L.batch * L.heads;
  std::vector<LogitSums> pair_sums(logit_sums ? static_cast<std::size_t>(pairs) : 0);
#pragma omp parallel
  {
    Scratch scratch(2 * round_up(Tqp * Dp, kLanes) + round_up(Tkp * Dp, kLanes) +
                    round_up(Dp * L.transposed_ld, kLanes) + Tqp * Tkp);
    float* q = scratch.take(Tqp * Dp);
    float* k_t = scratch.take(Dp * L.transposed_ld);
    float* v = scratch.take(Tkp * Dp);
    float* p = scratch.take(Tqp * Tkp);
    float* block_out = scratch.take(Tqp * Dp);
#pragma omp for schedule(static)
    for (std::int64_t pair = 0; pair < pairs; ++pair) {
      const std::int64_t b = pair / L.heads, h = pair % L.heads;
      pack_rows(qkv_data + b * Tq * 3 * D + h * Dh, 3 * D, Tq, Dh, q, Dp);
      const float* k_source = kv_data + b * Tk * L.kv_stride + h * Dh;
      pack_transposed(k_source, L.kv_stride, Tk, Dh, k_t, L.transposed_ld);
      pack_rows(k_source + D, L.kv_stride, Tk, Dh, v, Dp);
      // Logits (a causal block's only up to the column blocks that reach the diagonal).
      for (std::int64_t i0 = 0; i0 < Tqp; i0 += kTileRows)
        tile_rows(q + i0 * Dp, Dp, 1, k_t, L.transposed_ld, 0, Dh, logit_scale, p + i0 * Tkp, Tkp,
                  causal_width(L, i0, causal));
      for (std::int64_t i = 0; i < Tq; ++i) {
        float* row = p + i * Tkp;
        const std::int64_t valid = visible_keys(L, i, causal);
        if (valid == 0) {  // (a block without keys adds nothing)
          std::fill(row, row + Tkp, 0.0f);
          continue;
        }
        if (logit_sums) probe::add_logit_row(row, valid, pair_sums[static_cast<std::size_t>(pair)]);
        const std::int64_t at = (b * L.heads + h) * Tq + i;
        const float m_new = std::max(m[at], row_max(row, valid));
        // (0 on the first block: m = -inf)
        const float factor = m[at] == -std::numeric_limits<float>::infinity() ? 0.0f : std::exp(m[at] - m_new);
        l[at] = l[at] * factor + exp_row(row, valid, Tkp, m_new);
        m[at] = m_new;
        float* o_row = o + (b * Tq + i) * D + h * Dh;
        for (std::int64_t d = 0; d < Dh; ++d) o_row[d] *= factor;
      }
      // The block's P V (a causal block's rows sum only up to each tile's last row), added to the running output.
      for (std::int64_t i0 = 0; i0 < Tqp; i0 += kTileRows)
        tile_rows(p + i0 * Tkp, Tkp, 1, v, Dp, 0, causal ? std::min(i0 + kTileRows, Tk) : Tk, 1.0f, block_out + i0 * Dp,
                  Dp, Dp);
      for (std::int64_t i = 0; i < Tq; ++i) {
        float* o_row = o + (b * Tq + i) * D + h * Dh;
        for (std::int64_t d = 0; d < Dh; ++d) o_row[d] += block_out[i * Dp + d];
      }
    }
  }
  if (logit_sums) {
    for (const LogitSums& part : pair_sums) logit_sums->add(part);  // in (sequence, head) order
  }
}

void attention_block_backward_cpu(const Tensor& qkv, const Tensor& d_out, const float* lse, const float* row_dot,
                                  const BlockLayout& L, float logit_scale, bool causal, float* kv_data, float* d_q) {
  const std::int64_t Tqp = L.queries_padded, Tkp = L.keys_padded, Dp = L.head_dim_padded, Dh = L.head_dim;
  const std::int64_t Tq = L.queries, Tk = L.keys, D = L.model_dim;
  const float* qkv_data = qkv.f32();
  const float* d_out_data = d_out.f32();
  const std::int64_t pairs = L.batch * L.heads;
#pragma omp parallel
  {
    Scratch scratch(3 * round_up(Tqp * Dp, kLanes) + 3 * round_up(Tkp * Dp, kLanes) +
                    2 * round_up(Dp * L.transposed_ld, kLanes) + 2 * Tqp * Tkp);
    float* q = scratch.take(Tqp * Dp);
    float* k = scratch.take(Tkp * Dp);
    float* k_t = scratch.take(Dp * L.transposed_ld);
    float* v_t = scratch.take(Dp * L.transposed_ld);
    float* d_o = scratch.take(Tqp * Dp);
    float* p = scratch.take(Tqp * Tkp);
    float* d_s = scratch.take(Tqp * Tkp);
    float* d_q_block = scratch.take(Tqp * Dp);
    float* d_k = scratch.take(Tkp * Dp);
    float* d_v = scratch.take(Tkp * Dp);
#pragma omp for schedule(static)
    for (std::int64_t pair = 0; pair < pairs; ++pair) {
      const std::int64_t b = pair / L.heads, h = pair % L.heads;
      pack_rows(qkv_data + b * Tq * 3 * D + h * Dh, 3 * D, Tq, Dh, q, Dp);
      float* k_source = kv_data + b * Tk * L.kv_stride + h * Dh;
      pack_rows(k_source, L.kv_stride, Tk, Dh, k, Dp);
      pack_transposed(k_source, L.kv_stride, Tk, Dh, k_t, L.transposed_ld);
      pack_transposed(k_source + D, L.kv_stride, Tk, Dh, v_t, L.transposed_ld);
      pack_rows(d_out_data + b * Tq * D + h * Dh, D, Tq, Dh, d_o, Dp);
      // P recomputed from the saved log-sum-exp; dP = d_out V^T.
      for (std::int64_t i0 = 0; i0 < Tqp; i0 += kTileRows) {
        const std::int64_t width = causal_width(L, i0, causal);
        tile_rows(q + i0 * Dp, Dp, 1, k_t, L.transposed_ld, 0, Dh, logit_scale, p + i0 * Tkp, Tkp, width);
        tile_rows(d_o + i0 * Dp, Dp, 1, v_t, L.transposed_ld, 0, Dh, 1.0f, d_s + i0 * Tkp, Tkp, width);
      }
      const Vec scale_v = simd::splat(logit_scale);
      for (std::int64_t i = 0; i < Tqp; ++i) {
        float* p_row = p + i * Tkp;
        float* d_row = d_s + i * Tkp;
        const std::int64_t valid = i < Tq ? visible_keys(L, i, causal) : 0, chunks_end = round_up(valid, kLanes);
        const std::int64_t at = (b * L.heads + h) * Tq + i;
        const Vec shift = simd::splat(i < Tq ? lse[at] : 0.0f), dot = simd::splat(i < Tq ? row_dot[at] : 0.0f);
        for (std::int64_t j = 0; j < chunks_end; j += kLanes) {
          const auto visible = simd::lanes_below(j, valid);
          // (a logit can exceed the rounded log-sum-exp by an ulp: exp of a non-positive argument)
          const Vec x = load(p_row + j) - shift;
          const Vec e = simd::select(visible, simd::exp_nonpositive(simd::select(x < Vec{}, x, Vec{})), Vec{});
          store(p_row + j, e);
          store(d_row + j, simd::select(visible, e * (load(d_row + j) - dot) * scale_v, Vec{}));
        }
        for (std::int64_t j = chunks_end; j < Tkp; j += kLanes) {
          store(p_row + j, Vec{});
          store(d_row + j, Vec{});
        }
      }
      // d_v = P^T d_out, d_k = dS^T Q (sums over the queries), d_q = dS K (sum over the keys).
      for (std::int64_t j0 = 0; j0 < Tkp; j0 += kTileRows) {
        tile_rows(p + j0, 1, Tkp, d_o, Dp, causal ? j0 : 0, Tq, 1.0f, d_v + j0 * Dp, Dp, Dp);
        tile_rows(d_s + j0, 1, Tkp, q, Dp, causal ? j0 : 0, Tq, 1.0f, d_k + j0 * Dp, Dp, Dp);
      }
      for (std::int64_t i0 = 0; i0 < Tqp; i0 += kTileRows)
        tile_rows(d_s + i0 * Tkp, Tkp, 1, k, Dp, 0, causal ? std::min(i0 + kTileRows, Tk) : Tk, 1.0f,
                  d_q_block + i0 * Dp, Dp, Dp);
      for (std::int64_t i = 0; i < Tq; ++i) {
        float* target = d_q + (b * Tq + i) * D + h * Dh;
        for (std::int64_t d = 0; d < Dh; ++d) target[d] += d_q_block[i * Dp + d];
      }
      for (std::int64_t j = 0; j < Tk; ++j) {
        float* d_k_target = k_source + j * L.kv_stride + 2 * D;
        float* d_v_target = d_k_target + D;
        for (std::int64_t d = 0; d < Dh; ++d) {
          d_k_target[d] += d_k[j * Dp + d];
          d_v_target[d] += d_v[j * Dp + d];
        }
      }
    }
  }
}

void check_qkv(const char* op, const Tensor& qkv, int heads) {
  PROPLAB_CHECK(qkv.defined() && qkv.ndim() == 3, "op '", op, "': qkv must be [B, T, 3D], got ",
                qkv.defined() ? shape_string(qkv.shape()) : std::string("undefined"));
  PROPLAB_CHECK(qkv.dim(2) % 3 == 0, "op '", op, "': qkv last dim ", qkv.dim(2), " is not 3 * D");
  PROPLAB_CHECK(heads > 0 && (qkv.dim(2) / 3) % heads == 0, "op '", op, "': model dim ", qkv.dim(2) / 3,
                " is not divisible by heads = ", heads);
  expect_shape(op, "qkv", qkv, qkv.shape());
}

}  // namespace

void attention_forward(const Tensor& qkv, int heads, float logit_scale, Tensor& probs, Tensor& out,
                       LogitSums* logit_sums) {
  const char* op = "attention_forward";
  check_qkv(op, qkv, heads);
  const std::int64_t B = qkv.dim(0), T = qkv.dim(1), D = qkv.dim(2) / 3;
  expect_shape(op, "probs", probs, {B, heads, T, T});
  expect_shape(op, "out", out, {B, T, D});
  const Device device = common_device(op, {&qkv, &probs, &out});
  if (device == Device::cuda) {
#ifdef PROPLAB_WITH_CUDA
    std::vector<kernels::AttentionLogitSums> pair_sums(logit_sums ? static_cast<std::size_t>(B * heads) : 0);
    kernels::attention_forward(qkv.f32(), B, T, D, heads, logit_scale, probs.f32(), out.f32(),
                               logit_sums ? pair_sums.data() : nullptr);
    // The pairs' sums added in pair order, as attention_forward_cpu adds them; every pair has T(T+1)/2 logits.
    for (const kernels::AttentionLogitSums& part : pair_sums) {
      logit_sums->count += T * (T + 1) / 2;
      logit_sums->nonfinite += part.nonfinite;
      logit_sums->sum += part.sum;
      logit_sums->sum_sq += part.sum_sq;
      logit_sums->sum_cube += part.sum_cube;
      logit_sums->sum_quad += part.sum_quad;
      logit_sums->max_abs = std::max(logit_sums->max_abs, part.max_abs);
    }
    return;
#else
    missing_device_impl(op, device);
#endif
  }
  attention_forward_cpu(qkv, heads, logit_scale, probs, out, logit_sums);
}

void attention_backward(const Tensor& qkv, const Tensor& probs, const Tensor& d_out, int heads, float logit_scale,
                        Tensor& d_qkv) {
  const char* op = "attention_backward";
  check_qkv(op, qkv, heads);
  const std::int64_t B = qkv.dim(0), T = qkv.dim(1), D = qkv.dim(2) / 3;
  expect_shape(op, "probs", probs, {B, heads, T, T});
  expect_shape(op, "d_out", d_out, {B, T, D});
  expect_shape(op, "d_qkv", d_qkv, qkv.shape());
  const Device device = common_device(op, {&qkv, &probs, &d_out, &d_qkv});
  if (device == Device::cuda) {
#ifdef PROPLAB_WITH_CUDA
    kernels::attention_backward(qkv.f32(), probs.f32(), d_out.f32(), B, T, D, heads, logit_scale, d_qkv.f32());
    return;
#else
    missing_device_impl(op, device);
#endif
  }
  attention_backward_cpu(qkv, probs, d_out, heads, logit_scale, d_qkv);
}

void attention_block_forward(const Tensor& qkv, const Tensor& kv, int heads, float logit_scale, bool causal, Tensor& m,
                             Tensor& l, Tensor& o, LogitSums* logit_sums) {
  const char* op = "attention_block_forward";
  const BlockLayout L = make_block_layout(op, qkv, kv, heads, causal, 2);
  const std::int64_t rows = L.batch * L.heads * L.queries;
  PROPLAB_CHECK(m.numel() == rows && l.numel() == rows && o.numel() == L.batch * L.queries * L.model_dim &&
                    m.device() == Device::cpu && l.device() == Device::cpu && o.device() == Device::cpu &&
                    m.is_contiguous() && l.is_contiguous() && o.is_contiguous(),
                "op '", op, "': m and l must hold [B, H, Tq] and o [B, Tq, D] on the host");
  attention_block_forward_cpu(qkv, kv, L, logit_scale, causal, m.f32(), l.f32(), o.f32(), logit_sums);
}

void attention_block_backward(const Tensor& qkv, const Tensor& d_out, const Tensor& lse, const Tensor& row_dot,
                              int heads, float logit_scale, bool causal, Tensor& kv, Tensor& d_q) {
  const char* op = "attention_block_backward";
  const BlockLayout L = make_block_layout(op, qkv, kv, heads, causal, 4);
  const std::int64_t rows = L.batch * L.heads * L.queries, values = L.batch * L.queries * L.model_dim;
  PROPLAB_CHECK(lse.numel() == rows && row_dot.numel() == rows && d_out.numel() == values && d_q.numel() == values &&
                    lse.device() == Device::cpu && row_dot.device() == Device::cpu && d_out.device() == Device::cpu &&
                    d_q.device() == Device::cpu && lse.is_contiguous() && row_dot.is_contiguous() &&
                    d_out.is_contiguous() && d_q.is_contiguous(),
                "op '", op, "': lse and row_dot must hold [B, H, Tq], d_out and d_q [B, Tq, D], on the host");
  attention_block_backward_cpu(qkv, d_out, lse.f32(), row_dot.f32(), L, logit_scale, causal, kv.f32(), d_q.f32());
}

}  // namespace proplab::ops
