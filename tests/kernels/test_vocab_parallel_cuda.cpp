// CUDA-vs-CPU comparison of the vocab-parallel pieces (src/ops/vocab_parallel.h: the shard embedding through
// kernels/embedding.cu, the shard cross-entropy through kernels/vocab_parallel.cu), through the ops entry points,
// for every shard of a split vocabulary. Skipped at run time when no GPU is present.
//
// Tolerances: the embedding pieces and the row maxima are bitwise the CPU's (copies, one float addition, float
// additions in the CPU's order, a maximum). Σ exp differs only by exp (expf against the CPU's, ~1 ulp) and the
// summation order: 1e-6 relative. The finishing loss is summed on the host from the host's sums exactly as the CPU
// does: bitwise. d_logits = coef · exp: 1e-5 relative, plus 1e-5 of grad_coef for the target entry's cancellation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "kernels/cuda_compare.h"
#include "ops/vocab_parallel.h"
#include "support/gradcheck.h"

namespace proplab {
namespace {

using testing::expect_bitwise;
using testing::expect_close;
using testing::random_ids;
using testing::random_tensor;
using testing::to_cuda;

// The shards [first, first + size) of a vocabulary split in `parts` (the last takes the remainder).
std::vector<std::pair<std::int64_t, std::int64_t>> shards(std::int64_t vocab, int parts) {
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  const std::int64_t size = vocab / parts;
  for (int k = 0; k < parts; ++k) out.emplace_back(k * size, k + 1 == parts ? vocab - k * size : size);
  return out;
}

struct EmbeddingCase {
  std::int64_t batch, seq, vocab, features;
  int parts;
};

const std::vector<EmbeddingCase> kEmbeddingCases = {
    {1, 1, 2, 1, 2}, {2, 7, 11, 5, 3}, {4, 64, 1001, 96, 4}, {8, 128, 37, 300, 2}, {16, 256, 50257, 33, 8}};

TEST(VocabParallelCuda, ShardEmbeddingMatchesCpuBitwise) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 100;
  for (const EmbeddingCase& c : kEmbeddingCases) {
    const Tensor tokens = random_ids({c.batch, c.seq}, seed++, 0, c.vocab);
    const Tensor d_y = random_tensor({c.batch, c.seq, c.features}, seed++);
    const Tensor tokens_cuda = to_cuda(tokens), d_y_cuda = to_cuda(d_y);
    for (const auto& [first, size] : shards(c.vocab, c.parts)) {
      SCOPED_TRACE("B=" + std::to_string(c.batch) + " T=" + std::to_string(c.seq) + " V=" + std::to_string(c.vocab) +
                   " D=" + std::to_string(c.features) + " shard [" + std::to_string(first) + ", +" +
                   std::to_string(size) + ")");
      const Tensor table = random_tensor({size, c.features}, seed++);
      Tensor y_cpu = Tensor::empty({c.batch, c.seq, c.features});
      ops::embedding_shard_forward(tokens, table, first, c.vocab, y_cpu);
      Tensor y = Tensor::empty(y_cpu.shape(), DType::f32, Device::cuda);
      ops::embedding_shard_forward(tokens_cuda, to_cuda(table), first, c.vocab, y);
      expect_bitwise(y.to(Device::cpu).to_vector(), y_cpu.to_vector(), "y");

      // Accumulates onto a nonzero gradient.
      const Tensor start = random_tensor({size, c.features}, seed++, 0.1);
      Tensor d_table_cpu = start.clone();
      ops::embedding_shard_backward(tokens, d_y, first, d_table_cpu);
      Tensor d_table = to_cuda(start);
      ops::embedding_shard_backward(tokens_cuda, d_y_cuda, first, d_table);
      expect_bitwise(d_table.to(Device::cpu).to_vector(), d_table_cpu.to_vector(), "d_table_shard");
    }
  }
}

TEST(VocabParallelCuda, ShardEmbeddingRejectsOutOfRangeTokens) {
  SKIP_WITHOUT_GPU();
  Tensor tokens = random_ids({2, 3}, 150, 0, 8);
  tokens.i32()[4] = 8;
  Tensor y = Tensor::empty({2, 3, 5}, DType::f32, Device::cuda);
  EXPECT_THROW(ops::embedding_shard_forward(to_cuda(tokens), to_cuda(random_tensor({4, 5}, 151)), 4, 8, y), UserError);
}

TEST(VocabParallelCuda, PositionAddMatchesCpuBitwise) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 200;
  for (const EmbeddingCase& c : kEmbeddingCases) {
    SCOPED_TRACE("B=" + std::to_string(c.batch) + " T=" + std::to_string(c.seq) + " D=" + std::to_string(c.features));
    const Tensor pos = random_tensor({c.seq + 3, c.features}, seed++);
    const Tensor y_start = random_tensor({c.batch, c.seq, c.features}, seed++);
    Tensor y_cpu = y_start.clone();
    ops::position_add_forward(pos, y_cpu);
    Tensor y = to_cuda(y_start);
    ops::position_add_forward(to_cuda(pos), y);
    expect_bitwise(y.to(Device::cpu).to_vector(), y_cpu.to_vector(), "y");

    const Tensor d_pos_start = random_tensor(pos.shape(), seed++, 0.1);
    Tensor d_pos_cpu = d_pos_start.clone();
    ops::position_add_backward(y_start, d_pos_cpu);
    Tensor d_pos = to_cuda(d_pos_start);
    ops::position_add_backward(to_cuda(y_start), d_pos);
    expect_bitwise(d_pos.to(Device::cpu).to_vector(), d_pos_cpu.to_vector(), "d_pos_table");
  }
}

struct CrossEntropyCase {
  std::int64_t rows, vocab;
  int parts;
};

// One row, odd sizes, shards narrower and wider than a 256-thread block, many rows (chunks of 8 and a remainder).
const std::vector<CrossEntropyCase> kCrossEntropyCases = {
    {1, 2, 2}, {3, 11, 3}, {9, 1000, 4}, {130, 50257, 8}, {1027, 97, 2}};

TEST(VocabParallelCuda, ShardCrossEntropyMatchesCpu) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 300;
  for (const CrossEntropyCase& c : kCrossEntropyCases) {
    const Tensor targets = random_ids({c.rows}, seed++, 0, c.vocab);
    const Tensor targets_cuda = to_cuda(targets);
    for (const auto& [first, size] : shards(c.vocab, c.parts)) {
      SCOPED_TRACE("rows=" + std::to_string(c.rows) + " V=" + std::to_string(c.vocab) + " shard [" +
                   std::to_string(first) + ", +" + std::to_string(size) + ")");
      Tensor logits = random_tensor({c.rows, size}, seed++, 3.0, -0.5);
      if (c.rows * size > 3) logits.f32()[2] = std::numeric_limits<float>::quiet_NaN();  // ignored by the maximum
      const Tensor logits_cuda = to_cuda(logits);

      std::vector<double> max_cpu, max_cuda;
      ops::cross_entropy_shard_max(logits, max_cpu);
      ops::cross_entropy_shard_max(logits_cuda, max_cuda);
      ASSERT_EQ(max_cuda.size(), max_cpu.size());
      for (std::size_t r = 0; r < max_cpu.size(); ++r) EXPECT_EQ(max_cuda[r], max_cpu[r]) << "row_max " << r;

      if (c.rows * size > 3) {  // the NaN would make Σ exp NaN: compare the sums on clean logits
        logits.f32()[2] = 0.25f;
        ops::cross_entropy_shard_max(logits, max_cpu);
      }
      const Tensor clean_cuda = to_cuda(logits);
      std::vector<double> sums_cpu, sums_cuda;
      ops::cross_entropy_shard_sums(logits, max_cpu, targets, first, sums_cpu);
      ops::cross_entropy_shard_sums(clean_cuda, max_cpu, targets_cuda, first, sums_cuda);
      ASSERT_EQ(sums_cuda.size(), sums_cpu.size());
      for (std::size_t r = 0; r < max_cpu.size(); ++r) {
        EXPECT_LE(std::abs(sums_cuda[2 * r] - sums_cpu[2 * r]), 1e-6 * sums_cpu[2 * r]) << "Σ exp, row " << r;
        EXPECT_EQ(sums_cuda[2 * r + 1], sums_cpu[2 * r + 1]) << "target logit, row " << r;
      }

      // The finish from the same host maxima and sums.
      const float grad_scale = 0.6f;
      Tensor d_cpu = Tensor::empty(logits.shape());
      const double loss_cpu =
          ops::cross_entropy_shard_finish(logits, max_cpu, sums_cpu, targets, first, &d_cpu, grad_scale);
      Tensor d = Tensor::empty(logits.shape(), DType::f32, Device::cuda);
      const double loss_cuda =
          ops::cross_entropy_shard_finish(clean_cuda, max_cpu, sums_cpu, targets_cuda, first, &d, grad_scale);
      EXPECT_EQ(loss_cuda, loss_cpu);
      const double grad_coef = double(grad_scale) / double(c.rows);
      expect_close(d.to(Device::cpu).to_vector(), d_cpu.to_vector(), 1e-5, 1e-5 * grad_coef, "d_logits_shard");
      EXPECT_EQ(ops::cross_entropy_shard_finish(clean_cuda, max_cpu, sums_cpu, targets_cuda, first, nullptr), loss_cpu);
    }
  }
}

TEST(VocabParallelCuda, ShardPiecesBitwiseRepeatable) {
  SKIP_WITHOUT_GPU();
  const Tensor logits = to_cuda(random_tensor({300, 5003}, 400, 2.0));
  const Tensor targets = to_cuda(random_ids({300}, 401, 0, 20000));
  const Tensor tokens = to_cuda(random_ids({8, 128}, 402, 0, 64));
  const Tensor d_y = to_cuda(random_tensor({8, 128, 40}, 403));
  std::vector<double> first_max, first_sums;
  std::vector<float> first_d, first_table;
  for (int run = 0; run < 3; ++run) {
    std::vector<double> row_max, sums;
    ops::cross_entropy_shard_max(logits, row_max);
    ops::cross_entropy_shard_sums(logits, row_max, targets, 5003, sums);
    Tensor d = Tensor::empty(logits.shape(), DType::f32, Device::cuda);
    ops::cross_entropy_shard_finish(logits, row_max, sums, targets, 5003, &d);
    Tensor d_table = to_cuda(Tensor::zeros({32, 40}));
    ops::embedding_shard_backward(tokens, d_y, 16, d_table);
    if (run == 0) {
      first_max = row_max;
      first_sums = sums;
      first_d = d.to(Device::cpu).to_vector();
      first_table = d_table.to(Device::cpu).to_vector();
      continue;
    }
    EXPECT_EQ(row_max, first_max);
    EXPECT_EQ(sums, first_sums);
    expect_bitwise(d.to(Device::cpu).to_vector(), first_d, "d_logits_shard");
    expect_bitwise(d_table.to(Device::cpu).to_vector(), first_table, "d_table_shard");
  }
}

}  // namespace
}  // namespace proplab
