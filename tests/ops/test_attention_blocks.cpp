// ops::attention_block_forward/backward (ring attention's steps) against the whole-sequence attention op: the
// sequence cut into equal chunks, each chunk's queries run over the earlier chunks' blocks and its own (causal), as
// the ranks of a ring do, in one process.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/parallel.h"
#include "core/tensor.h"
#include "ops/ops.h"
#include "support/gradcheck.h"

namespace proplab {
namespace {

struct BlockCase {
  std::int64_t batch, tokens, model_dim;
  int heads, chunks;
};

// Tokens [c·Tc, (c+1)·Tc) of every sequence of x [B, T, W], features [0, take) into a zeroed [B, Tc, width].
Tensor chunk_of(const Tensor& x, std::int64_t c, std::int64_t tokens, std::int64_t first_feature, std::int64_t take,
                std::int64_t width) {
  const std::int64_t B = x.dim(0), T = x.dim(1), W = x.dim(2);
  Tensor out = Tensor::zeros({B, tokens, width});
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < tokens; ++t)
      std::memcpy(out.f32() + (b * tokens + t) * width, x.f32() + (b * T + c * tokens + t) * W + first_feature,
                  static_cast<std::size_t>(take) * sizeof(float));
  return out;
}

struct Blockwise {
  Tensor out, d_qkv;  // [B, T, D] and [B, T, 3D] assembled from the chunks
  ops::LogitSums sums;
};

// After a query block's last step: out = o / l, lse = m + log l and row_dot = Σ_d out·d_out [B, H, Tq] (d_out: the
// block's gradient [B, Tq, D]).
struct Finished {
  Tensor out, lse, row_dot;
};
Finished finish(const Tensor& m, const Tensor& l, const Tensor& o, const Tensor& d_out, std::int64_t heads) {
  const std::int64_t B = o.dim(0), Tq = o.dim(1), D = o.dim(2), Dh = D / heads;
  Finished f{Tensor::empty({B, Tq, D}), Tensor::empty({B, heads, Tq}), Tensor::empty({B, heads, Tq})};
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t i = 0; i < Tq; ++i) {
        const std::int64_t at = (b * heads + h) * Tq + i;
        f.lse.f32()[at] = m.f32()[at] + std::log(l.f32()[at]);
        double dot = 0.0;
        for (std::int64_t d = 0; d < Dh; ++d) {
          const std::int64_t e = (b * Tq + i) * D + h * Dh + d;
          f.out.f32()[e] = o.f32()[e] / l.f32()[at];
          dot += static_cast<double>(f.out.f32()[e]) * d_out.f32()[e];
        }
        f.row_dot.f32()[at] = static_cast<float>(dot);
      }
  return f;
}

Blockwise run_blockwise(const BlockCase& c, const Tensor& qkv, const Tensor& d_out, float scale) {
  const std::int64_t B = c.batch, T = c.tokens, D = c.model_dim, H = c.heads, Tc = T / c.chunks;
  Blockwise result{Tensor::zeros({B, T, D}), Tensor::zeros({B, T, 3 * D}), {}};
  // Every chunk's key/value block with room for its gradients, [B, Tc, 4D].
  std::vector<Tensor> blocks;
  for (int k = 0; k < c.chunks; ++k) blocks.push_back(chunk_of(qkv, k, Tc, D, 2 * D, 4 * D));
  for (int q = 0; q < c.chunks; ++q) {
    const Tensor queries = chunk_of(qkv, q, Tc, 0, 3 * D, 3 * D);
    Tensor m = Tensor::empty({B, H, Tc}), l = Tensor::zeros({B, H, Tc}), o = Tensor::zeros({B, Tc, D});
    std::fill(m.f32(), m.f32() + m.numel(), -std::numeric_limits<float>::infinity());
    for (int k = 0; k <= q; ++k)
      ops::attention_block_forward(queries, blocks[static_cast<std::size_t>(k)], c.heads, scale, k == q, m, l, o,
                                   &result.sums);
    const Tensor g = chunk_of(d_out, q, Tc, 0, D, D);
    const Finished done = finish(m, l, o, g, H);
    const Tensor &out = done.out, &lse = done.lse, &row_dot = done.row_dot;
    Tensor d_q = Tensor::zeros({B, Tc, D});
    for (int k = 0; k <= q; ++k)
      ops::attention_block_backward(queries, g, lse, row_dot, c.heads, scale, k == q,
                                    blocks[static_cast<std::size_t>(k)], d_q);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = 0; t < Tc; ++t) {
        const std::int64_t row = b * T + q * Tc + t;
        std::memcpy(result.out.f32() + row * D, out.f32() + (b * Tc + t) * D, static_cast<std::size_t>(D) * 4);
        std::memcpy(result.d_qkv.f32() + row * 3 * D, d_q.f32() + (b * Tc + t) * D, static_cast<std::size_t>(D) * 4);
      }
  }
  for (int k = 0; k < c.chunks; ++k)  // each block's key and value gradients, home
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = 0; t < Tc; ++t)
        std::memcpy(result.d_qkv.f32() + (b * T + k * Tc + t) * 3 * D + D,
                    blocks[static_cast<std::size_t>(k)].f32() + (b * Tc + t) * 4 * D + 2 * D,
                    static_cast<std::size_t>(2 * D) * 4);
  return result;
}

double max_abs_difference(const Tensor& a, const Tensor& b) {
  double worst = 0.0;
  for (std::int64_t i = 0; i < a.numel(); ++i)
    worst = std::max(worst, std::abs(static_cast<double>(a.f32()[i]) - b.f32()[i]));
  return worst;
}

TEST(AttentionBlocks, ChunksMatchTheWholeSequence) {
  // Chunks of one token, sizes below and above a vector's lanes, and several heads; two tensor widths.
  for (const BlockCase c :
       {BlockCase{2, 10, 8, 2, 2}, BlockCase{1, 3, 4, 1, 3}, BlockCase{3, 40, 24, 3, 4}, BlockCase{2, 64, 32, 2, 2}}) {
    SCOPED_TRACE("B " + std::to_string(c.batch) + " T " + std::to_string(c.tokens) + " chunks " +
                 std::to_string(c.chunks));
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.model_dim / c.heads));
    const Tensor qkv = testing::random_tensor({c.batch, c.tokens, 3 * c.model_dim}, 11);
    const Tensor d_out = testing::random_tensor({c.batch, c.tokens, c.model_dim}, 12);
    Tensor probs = Tensor::empty({c.batch, c.heads, c.tokens, c.tokens});
    Tensor out = Tensor::empty({c.batch, c.tokens, c.model_dim}), d_qkv = Tensor::empty(qkv.shape());
    ops::LogitSums whole;
    ops::attention_forward(qkv, c.heads, scale, probs, out, &whole);
    ops::attention_backward(qkv, probs, d_out, c.heads, scale, d_qkv);
    const Blockwise blocks = run_blockwise(c, qkv, d_out, scale);
    EXPECT_LT(max_abs_difference(out, blocks.out), 2e-6);
    EXPECT_LT(max_abs_difference(d_qkv, blocks.d_qkv), 1e-5);
    EXPECT_EQ(blocks.sums.count, whole.count);
    EXPECT_NEAR(blocks.sums.sum, whole.sum, 1e-9 * (1.0 + std::abs(whole.sum)));
    EXPECT_NEAR(blocks.sums.sum_sq, whole.sum_sq, 1e-9 * whole.sum_sq);
    EXPECT_NEAR(blocks.sums.sum_cube, whole.sum_cube, 1e-9 * (whole.sum_sq * std::sqrt(whole.sum_sq) + 1.0));
    EXPECT_NEAR(blocks.sums.sum_quad, whole.sum_quad, 1e-9 * whole.sum_quad);
    EXPECT_EQ(blocks.sums.max_abs, whole.max_abs);  // (the same float logits)
  }
}

// Queries [8, 12) of a 12-token sequence against a non-causal block of the 8 earlier tokens (Tk != Tq) and their own
// causal block. With d_out zero on tokens [0, 8), the whole-sequence op's gradients come from those queries alone, so
// every gradient is comparable: d_q of the 4 queries, and the keys' and values' of both blocks.
TEST(AttentionBlocks, AnEarlierBlockOfAnotherLength) {
  const std::int64_t B = 2, T = 12, D = 8, first = 8, Tq = T - first;
  const int H = 2;
  const float scale = 0.35f;
  const Tensor qkv = testing::random_tensor({B, T, 3 * D}, 31);
  Tensor d_out = testing::random_tensor({B, T, D}, 32);
  for (std::int64_t b = 0; b < B; ++b) std::fill(d_out.f32() + b * T * D, d_out.f32() + (b * T + first) * D, 0.0f);
  Tensor probs = Tensor::empty({B, H, T, T}), out = Tensor::empty({B, T, D}), d_qkv = Tensor::empty(qkv.shape());
  ops::attention_forward(qkv, H, scale, probs, out);
  ops::attention_backward(qkv, probs, d_out, H, scale, d_qkv);

  const Tensor queries = chunk_of(qkv, 2, Tq, 0, 3 * D, 3 * D);  // tokens [8, 12): chunk 2 of length 4
  Tensor earlier = chunk_of(qkv, 0, first, D, 2 * D, 4 * D), own = chunk_of(qkv, 2, Tq, D, 2 * D, 4 * D);
  Tensor m = Tensor::empty({B, H, Tq}), l = Tensor::zeros({B, H, Tq}), o = Tensor::zeros({B, Tq, D});
  std::fill(m.f32(), m.f32() + m.numel(), -std::numeric_limits<float>::infinity());
  ops::attention_block_forward(queries, earlier, H, scale, false, m, l, o);
  ops::attention_block_forward(queries, own, H, scale, true, m, l, o);
  const Tensor g = chunk_of(d_out, 2, Tq, 0, D, D);
  const Finished done = finish(m, l, o, g, H);
  const Tensor &lse = done.lse, &row_dot = done.row_dot;
  const double worst_out = max_abs_difference(done.out, chunk_of(out, 2, Tq, 0, D, D));
  EXPECT_LT(worst_out, 2e-6);
  Tensor d_q = Tensor::zeros({B, Tq, D});
  ops::attention_block_backward(queries, g, lse, row_dot, H, scale, false, earlier, d_q);
  ops::attention_block_backward(queries, g, lse, row_dot, H, scale, true, own, d_q);
  const Tensor whole_d_q = chunk_of(d_qkv, 2, Tq, 0, D, D);
  EXPECT_LT(max_abs_difference(d_q, whole_d_q), 1e-5);
  // Keys' and values' gradients: features [2D, 4D) of each block against the whole op's [D, 3D).
  EXPECT_LT(
      max_abs_difference(chunk_of(earlier, 0, first, 2 * D, 2 * D, 2 * D), chunk_of(d_qkv, 0, first, D, 2 * D, 2 * D)),
      1e-5);
  EXPECT_LT(max_abs_difference(chunk_of(own, 0, Tq, 2 * D, 2 * D, 2 * D), chunk_of(d_qkv, 2, Tq, D, 2 * D, 2 * D)),
            1e-5);
}

TEST(AttentionBlocks, BitwiseIdenticalForAnyThreadCount) {
  const BlockCase c{3, 24, 16, 2, 3};
  const Tensor qkv = testing::random_tensor({c.batch, c.tokens, 3 * c.model_dim}, 21);
  const Tensor d_out = testing::random_tensor({c.batch, c.tokens, c.model_dim}, 22);
  const int before = threads();
  set_threads(1);
  const Blockwise one = run_blockwise(c, qkv, d_out, 0.25f);
  set_threads(2);
  const Blockwise two = run_blockwise(c, qkv, d_out, 0.25f);
  set_threads(before);
  EXPECT_EQ(one.out.to_vector(), two.out.to_vector());
  EXPECT_EQ(one.d_qkv.to_vector(), two.d_qkv.to_vector());
}

TEST(AttentionBlocks, RejectsBadShapes) {
  const Tensor qkv = testing::random_tensor({2, 4, 12}, 1);  // D = 4
  Tensor m = Tensor::empty({2, 2, 4}), l = Tensor::zeros({2, 2, 4}), o = Tensor::zeros({2, 4, 4});
  const Tensor narrow = Tensor::zeros({2, 4, 7});  // fewer than 2D features per token
  EXPECT_THROW(ops::attention_block_forward(qkv, narrow, 2, 1.0f, false, m, l, o), InternalError);
  const Tensor other_length = Tensor::zeros({2, 3, 8});  // a causal block must be the queries' own tokens
  EXPECT_THROW(ops::attention_block_forward(qkv, other_length, 2, 1.0f, true, m, l, o), InternalError);
  EXPECT_NO_THROW(ops::attention_block_forward(qkv, other_length, 2, 1.0f, false, m, l, o));
  Tensor kv = Tensor::zeros({2, 4, 8}), d_q = Tensor::zeros({2, 4, 4});  // backward needs 4D features
  const Tensor rows = Tensor::zeros({2, 2, 4}), d_out = Tensor::zeros({2, 4, 4});
  EXPECT_THROW(ops::attention_block_backward(qkv, d_out, rows, rows, 2, 1.0f, true, kv, d_q), InternalError);
}

}  // namespace
}  // namespace proplab
