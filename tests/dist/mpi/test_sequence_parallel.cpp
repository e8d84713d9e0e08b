// Ring attention (models/sequence_parallel.h) under mpirun (2 and 4 ranks, the world as the ring): each rank holds
// its slice of every sequence's tokens, and its attention output, gradients and logit power sums match the
// one-process causal attention (ops::attention_forward/backward) on the whole sequences; the bytes sent are the
// documented formula; a repeated call is bitwise the same; and the result does not depend on the thread count.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/rng.h"
#include "dist/communicator.h"
#include "models/sequence_parallel.h"
#include "mpi_test_main.h"
#include "ops/ops.h"

namespace proplab {
namespace {

Tensor random_tensor(const Shape& shape, std::uint64_t stream, float scale) {
  Tensor t = Tensor::empty(shape);
  const CounterRng rng(11, stream);
  for (std::int64_t e = 0; e < t.numel(); ++e) t.f32()[e] = scale * rng.normal(static_cast<std::uint64_t>(e));
  return t;
}

// This rank's tokens of every sequence of x [B, T, F] (sequence_split: zigzag chunks when 2·ranks divides T), in
// local order.
Tensor tokens_of(const Tensor& x, int rank, int ranks) {
  const std::int64_t B = x.dim(0), T = x.dim(1), F = x.dim(2), count = T / ranks;
  const SequenceSplit split = sequence_split(T, rank, ranks);
  Tensor out = Tensor::empty({B, count, F});
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < count; ++t)
      std::copy(x.f32() + (b * T + split.position(t)) * F, x.f32() + (b * T + split.position(t) + 1) * F,
                out.f32() + (b * count + t) * F);
  return out;
}

TEST(SequenceSplit, ZigzagWhenTwiceTheRanksDivideTheLength) {
  const SequenceSplit zigzag = sequence_split(16, 1, 4);  // chunks of 2: rank 1 holds chunks 1 and 6
  EXPECT_EQ(zigzag.chunk, 2);
  EXPECT_EQ(zigzag.chunks, (std::vector<int>{1, 6}));
  EXPECT_EQ(zigzag.position(0), 2);
  EXPECT_EQ(zigzag.position(3), 13);
  const SequenceSplit plain = sequence_split(12, 2, 4);  // 8 does not divide 12: chunk 2 of 3 tokens
  EXPECT_EQ(plain.chunks, (std::vector<int>{2}));
  EXPECT_EQ(plain.position(1), 7);
  // Every position held once.
  for (int ranks : {1, 2, 3, 4}) {
    for (std::int64_t tokens : {ranks * 1, ranks * 2, ranks * 6}) {
      std::vector<int> seen(static_cast<std::size_t>(tokens), 0);
      for (int r = 0; r < ranks; ++r) {
        const SequenceSplit s = sequence_split(tokens, r, ranks);
        for (std::int64_t t = 0; t < tokens / ranks; ++t) ++seen[static_cast<std::size_t>(s.position(t))];
      }
      EXPECT_EQ(seen, std::vector<int>(static_cast<std::size_t>(tokens), 1)) << ranks << " ranks, " << tokens;
    }
  }
}

double largest(const Tensor& x) {
  double m = 0.0;
  for (std::int64_t e = 0; e < x.numel(); ++e) m = std::max(m, std::fabs(static_cast<double>(x.f32()[e])));
  return m;
}

void expect_close(const Tensor& got, const Tensor& want, double tolerance, const std::string& what) {
  ASSERT_EQ(got.numel(), want.numel()) << what;
  const double scale = std::max(largest(want), 1e-30);
  double worst = 0.0;
  for (std::int64_t e = 0; e < got.numel(); ++e)
    worst = std::max(worst, std::fabs(static_cast<double>(got.f32()[e]) - want.f32()[e]));
  EXPECT_LE(worst, tolerance * scale) << what << ": largest difference " << worst << " of " << scale;
}

struct Case {
  std::int64_t batch, tokens_per_rank;
  int heads;
  std::int64_t head_dim;
  float logit_scale, qkv_scale;
};

TEST(RingAttention, MatchesTheWholeSequencesAttention) {
  auto world = dist::make_mpi_world(60.0);
  const int ranks = world->size(), rank = world->rank();
  const std::vector<Case> cases = {
      {2, 5, 2, 4, 0.5f, 1.0f}, {1, 1, 1, 8, 0.35f, 1.0f}, {3, 7, 3, 5, 0.45f, 2.5f}, {2, 16, 4, 16, 0.25f, 1.0f}};
  for (const Case& c : cases) {
    const std::int64_t T = c.tokens_per_rank * ranks, D = c.heads * c.head_dim, Tl = c.tokens_per_rank;
    SCOPED_TRACE("B " + std::to_string(c.batch) + " T " + std::to_string(T) + " H " + std::to_string(c.heads) + " Dh " +
                 std::to_string(c.head_dim));
    const Tensor qkv = random_tensor({c.batch, T, 3 * D}, 1, c.qkv_scale);
    const Tensor d_out = random_tensor({c.batch, T, D}, 2, 1.0f);
    // The one-process reference on the whole sequences.
    Tensor probs = Tensor::empty({c.batch, c.heads, T, T}), out = Tensor::empty({c.batch, T, D});
    probe::LogitSums whole;
    ops::attention_forward(qkv, c.heads, c.logit_scale, probs, out, &whole);
    Tensor d_qkv = Tensor::empty({c.batch, T, 3 * D});
    ops::attention_backward(qkv, probs, d_out, c.heads, c.logit_scale, d_qkv);
    // This rank's slice.
    const Tensor local_qkv = tokens_of(qkv, rank, ranks);
    Tensor local_out = Tensor::empty({c.batch, Tl, D}), lse = Tensor::empty({c.batch, c.heads, Tl});
    probe::LogitSums sums;
    const std::int64_t sent_before = world->bytes_communicated(dist::Traffic::send);
    ring_attention_forward(*world, local_qkv, c.heads, c.logit_scale, local_out, lse, &sums);
    const std::int64_t forward_bytes = world->bytes_communicated(dist::Traffic::send) - sent_before;
    expect_close(local_out, tokens_of(out, rank, ranks), 2e-6, "out");
    Tensor local_d_qkv = Tensor::empty({c.batch, Tl, 3 * D});
    ring_attention_backward(*world, local_qkv, local_out, lse, tokens_of(d_out, rank, ranks), c.heads, c.logit_scale,
                            local_d_qkv);
    const std::int64_t backward_bytes = world->bytes_communicated(dist::Traffic::send) - sent_before - forward_bytes;
    expect_close(local_d_qkv, tokens_of(d_qkv, rank, ranks), 1e-5, "d_qkv");
    // Bytes: the forward passes each key/value block sp − 1 times, the backward sp times with its gradient.
    EXPECT_EQ(forward_bytes, 4 * (ranks - 1) * c.batch * Tl * 2 * D);
    EXPECT_EQ(backward_bytes, 4 * ranks * c.batch * Tl * 4 * D);
    // The logits' power sums, over the ring, are the whole sequences'.
    std::vector<double> totals = {static_cast<double>(sums.count),
                                  static_cast<double>(sums.nonfinite),
                                  sums.sum,
                                  sums.sum_sq,
                                  sums.sum_cube,
                                  sums.sum_quad};
    world->all_reduce(totals.data(), static_cast<std::int64_t>(totals.size()));
    double max_abs = sums.max_abs;
    world->all_reduce(&max_abs, 1, dist::ReduceOp::max);
    EXPECT_EQ(totals[0], static_cast<double>(whole.count));
    EXPECT_EQ(totals[1], 0.0);
    const double moments[] = {whole.sum, whole.sum_sq, whole.sum_cube, whole.sum_quad};
    for (int k = 0; k < 4; ++k)
      EXPECT_NEAR(totals[2 + k], moments[k], 1e-5 * (std::fabs(moments[k]) + whole.sum_quad + 1.0))
          << "moment " << k + 1;
    EXPECT_NEAR(max_abs, whole.max_abs, 1e-6 * whole.max_abs);
  }
}

TEST(RingAttention, BitwiseRepeatableForAnyThreadCount) {
  auto world = dist::make_mpi_world(60.0);
  const std::int64_t B = 2, Tl = 6, H = 2, Dh = 8, D = H * Dh;
  const Tensor qkv = random_tensor({B, Tl, 3 * D}, 3 + static_cast<std::uint64_t>(world->rank()), 1.0f);
  const Tensor d_out = random_tensor({B, Tl, D}, 40 + static_cast<std::uint64_t>(world->rank()), 1.0f);
  std::vector<std::vector<float>> first;
  const int threads = omp_get_max_threads();
  for (int repeat = 0; repeat < 3; ++repeat) {
    omp_set_num_threads(repeat == 2 ? 1 : std::max(2, threads));
    Tensor out = Tensor::empty({B, Tl, D}), lse = Tensor::empty({B, H, Tl}), d_qkv = Tensor::empty({B, Tl, 3 * D});
    ring_attention_forward(*world, qkv, static_cast<int>(H), 0.3f, out, lse);
    ring_attention_backward(*world, qkv, out, lse, d_out, static_cast<int>(H), 0.3f, d_qkv);
    std::vector<std::vector<float>> now;
    for (const Tensor* t : {&out, &lse, &d_qkv}) now.emplace_back(t->f32(), t->f32() + t->numel());
    if (repeat == 0)
      first = now;
    else
      EXPECT_EQ(now, first) << "repeat " << repeat;
  }
  omp_set_num_threads(threads);
}

}  // namespace
}  // namespace proplab

int main(int argc, char** argv) { return proplab::testing::run_mpi_tests(argc, argv); }
