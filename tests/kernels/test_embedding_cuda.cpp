// CUDA-vs-CPU comparison of the token and position embeddings (kernels/embedding.cu against the CPU reference in
// src/ops/embedding.cpp), through the ops entry points. Skipped at run time when no GPU is present.
//
// Tolerance: none. Forward is a copy plus one float addition, and backward adds each element's gradients in float
// onto the table in position (or batch) order, exactly as the CPU does, so results are compared bitwise.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "kernels/cuda_compare.h"
#include "ops/ops.h"
#include "support/gradcheck.h"

namespace proplab {
namespace {

using testing::expect_bitwise;
using testing::random_ids;
using testing::random_tensor;
using testing::to_cuda;

struct Case {
  std::int64_t batch, seq, vocab, features, max_seq;
};

// One token, odd sizes, a vocabulary smaller than the positions (long runs of repeated ids: a run far longer than
// a block), a large vocabulary, and more elements than one grid pass (1024 blocks · 256 threads).
const std::vector<Case> kCases = {{1, 1, 1, 1, 1},        {2, 3, 5, 7, 4},       {3, 17, 4, 33, 20},
                                  {4, 64, 50257, 48, 64}, {8, 128, 3, 300, 130}, {16, 256, 1000, 97, 256}};

std::string describe(const Case& c) {
  return "B=" + std::to_string(c.batch) + " T=" + std::to_string(c.seq) + " V=" + std::to_string(c.vocab) +
         " D=" + std::to_string(c.features);
}

TEST(EmbeddingCuda, ForwardMatchesCpuBitwise) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 100;
  for (const Case& c : kCases) {
    SCOPED_TRACE(describe(c));
    const Tensor tokens = random_ids({c.batch, c.seq}, seed++, 0, c.vocab);
    const Tensor table = random_tensor({c.vocab, c.features}, seed++);
    const Tensor pos = random_tensor({c.max_seq, c.features}, seed++, 0.5);
    for (const bool with_pos : {false, true}) {
      Tensor y_cpu = Tensor::empty({c.batch, c.seq, c.features});
      ops::embedding_forward(tokens, table, with_pos ? &pos : nullptr, y_cpu);
      Tensor y = Tensor::empty(y_cpu.shape(), DType::f32, Device::cuda);
      const Tensor pos_cuda = to_cuda(pos);
      ops::embedding_forward(to_cuda(tokens), to_cuda(table), with_pos ? &pos_cuda : nullptr, y);
      expect_bitwise(y.to(Device::cpu).to_vector(), y_cpu.to_vector(), with_pos ? "y (with positions)" : "y");
    }
  }
}

TEST(EmbeddingCuda, BackwardAccumulatesBitwiseAsCpu) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 200;
  for (const Case& c : kCases) {
    SCOPED_TRACE(describe(c));
    const Tensor tokens = random_ids({c.batch, c.seq}, seed++, 0, c.vocab);
    const Tensor d_y = random_tensor({c.batch, c.seq, c.features}, seed++);
    // Nonzero starting gradients: both tables accumulate.
    const Tensor d_table_start = random_tensor({c.vocab, c.features}, seed++, 0.1);
    const Tensor d_pos_start = random_tensor({c.max_seq, c.features}, seed++, 0.1);
    for (const bool with_pos : {false, true}) {
      Tensor d_table_cpu = d_table_start.clone(), d_pos_cpu = d_pos_start.clone();
      ops::embedding_backward(tokens, d_y, d_table_cpu, with_pos ? &d_pos_cpu : nullptr);
      Tensor d_table = to_cuda(d_table_start), d_pos = to_cuda(d_pos_start);
      ops::embedding_backward(to_cuda(tokens), to_cuda(d_y), d_table, with_pos ? &d_pos : nullptr);
      expect_bitwise(d_table.to(Device::cpu).to_vector(), d_table_cpu.to_vector(), "d_token_table");
      expect_bitwise(d_pos.to(Device::cpu).to_vector(), d_pos_cpu.to_vector(), "d_pos_table");
    }
  }
}

TEST(EmbeddingCuda, RejectsOutOfRangeTokens) {
  SKIP_WITHOUT_GPU();
  Tensor tokens = random_ids({2, 5}, 300, 0, 10);
  tokens.i32()[7] = 10;
  const Tensor table = to_cuda(random_tensor({10, 4}, 301));
  Tensor y = Tensor::empty({2, 5, 4}, DType::f32, Device::cuda);
  EXPECT_THROW(ops::embedding_forward(to_cuda(tokens), table, nullptr, y), UserError);
  Tensor d_table = to_cuda(Tensor::zeros({10, 4}));
  const Tensor d_y = to_cuda(random_tensor({2, 5, 4}, 302));
  tokens.i32()[7] = -3;
  EXPECT_THROW(ops::embedding_backward(to_cuda(tokens), d_y, d_table, nullptr), UserError);
  for (float v : d_table.to(Device::cpu).to_vector()) EXPECT_EQ(v, 0.0f);
}

TEST(EmbeddingCuda, BackwardBitwiseRepeatable) {
  SKIP_WITHOUT_GPU();
  const Tensor tokens = to_cuda(random_ids({16, 256}, 400, 0, 37));
  const Tensor d_y = to_cuda(random_tensor({16, 256, 64}, 401));
  std::vector<float> first_table, first_pos;
  for (int run = 0; run < 3; ++run) {
    Tensor d_table = to_cuda(Tensor::zeros({37, 64})), d_pos = to_cuda(Tensor::zeros({256, 64}));
    ops::embedding_backward(tokens, d_y, d_table, &d_pos);
    if (run == 0) {
      first_table = d_table.to(Device::cpu).to_vector();
      first_pos = d_pos.to(Device::cpu).to_vector();
      continue;
    }
    expect_bitwise(d_table.to(Device::cpu).to_vector(), first_table, "d_token_table");
    expect_bitwise(d_pos.to(Device::cpu).to_vector(), first_pos, "d_pos_table");
  }
}

}  // namespace
}  // namespace proplab
