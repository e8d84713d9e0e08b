// CUDA-vs-CPU comparison of causal multi-head attention (kernels/attention.cu against the CPU reference in
// src/ops/attention.cpp), through the ops entry points. Skipped at run time when no GPU is present.
//
// Tolerances: tests/ops/test_attention.cpp holds the CPU within 2e-6 + 1e-5·|p| (probs) and 2e-5 + 1e-5·|out| (out)
// of a double-precision reference; the GPU rounds differently (fused multiply-adds, another summation order, expf
// for the polynomial exp), so CPU and GPU may differ by twice those bounds. Backward has no double reference: both
// are float sums of at most T products of well-scaled terms (errors ~1e-7 of the tensor's scale), so 1e-5 of
// (|value| + the tensor's RMS) leaves a wide margin. The logit power sums are double sums of the float logits,
// whose absolute errors are ~1e-7 of their scale: 1e-5 relative to a bound of Σ|x|^k.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/cuda_compare.h"
#include "ops/ops.h"
#include "probe/moments.h"
#include "support/gradcheck.h"

namespace proplab {
namespace {

using testing::expect_close;
using testing::random_tensor;
using testing::to_cuda;

struct Case {
  std::int64_t batch, tokens, model_dim;
  int heads;
};

// Odd sizes, one token, rows longer than the 128-thread row block (T = 130, 300), a head dim of 1 and 6, and one
// case whose out (B·T·D = 307200) and d_qkv exceed one grid pass (1024 blocks · 256 threads).
const std::vector<Case> kCases = {{1, 1, 4, 1},    {2, 5, 12, 3},  {1, 17, 16, 2}, {3, 33, 24, 4},
                                  {2, 130, 64, 4}, {1, 300, 8, 1}, {1, 9, 3, 3},   {8, 200, 192, 3}};

std::string describe(const Case& c) {
  return "B=" + std::to_string(c.batch) + " T=" + std::to_string(c.tokens) + " D=" + std::to_string(c.model_dim) +
         " H=" + std::to_string(c.heads);
}

float default_scale(const Case& c) { return float(1.0 / std::sqrt(double(c.model_dim / c.heads))); }

// Probabilities: exactly 0 above the diagonal on both; elsewhere within twice the CPU test's bound.
void expect_probs_close(const std::vector<float>& actual, const std::vector<float>& expected, std::int64_t tokens) {
  ASSERT_EQ(actual.size(), expected.size());
  std::int64_t failures = 0;
  for (std::size_t n = 0; n < actual.size(); ++n) {
    const std::int64_t i = (static_cast<std::int64_t>(n) / tokens) % tokens, j = static_cast<std::int64_t>(n) % tokens;
    const bool ok = j > i ? actual[n] == 0.0f
                          : std::abs(double(actual[n]) - expected[n]) <= 4e-6 + 2e-5 * std::abs(double(expected[n]));
    if (!ok && ++failures <= 5)
      ADD_FAILURE() << "probs[" << n << "] (row " << i << ", col " << j << "): cuda " << actual[n] << " vs cpu "
                    << expected[n];
  }
  EXPECT_EQ(failures, 0) << failures << " probabilities differ";
}

TEST(AttentionCuda, ForwardMatchesCpu) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 100;
  for (const Case& c : kCases) {
    for (const float scale : {default_scale(c), 0.7f}) {
      SCOPED_TRACE(describe(c) + " scale=" + std::to_string(scale));
      const Tensor qkv = random_tensor({c.batch, c.tokens, 3 * c.model_dim}, seed++);
      Tensor probs_cpu = Tensor::empty({c.batch, c.heads, c.tokens, c.tokens});
      Tensor out_cpu = Tensor::empty({c.batch, c.tokens, c.model_dim});
      ops::attention_forward(qkv, c.heads, scale, probs_cpu, out_cpu);

      // NaN-filled outputs: every element must be written.
      const float nan = std::numeric_limits<float>::quiet_NaN();
      Tensor probs = testing::cuda_filled(probs_cpu.shape(), nan), out = testing::cuda_filled(out_cpu.shape(), nan);
      ops::attention_forward(to_cuda(qkv), c.heads, scale, probs, out);
      expect_probs_close(probs.to(Device::cpu).to_vector(), probs_cpu.to_vector(), c.tokens);
      expect_close(out.to(Device::cpu).to_vector(), out_cpu.to_vector(), 2e-5, 4e-5, "out");
    }
  }
}

TEST(AttentionCuda, BackwardMatchesCpu) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 200;
  for (const Case& c : kCases) {
    SCOPED_TRACE(describe(c));
    const float scale = default_scale(c);
    const Tensor qkv = random_tensor({c.batch, c.tokens, 3 * c.model_dim}, seed++);
    const Tensor d_out = random_tensor({c.batch, c.tokens, c.model_dim}, seed++);
    // Both backwards read the same (CPU-computed) probabilities, so only the backward kernels are compared.
    Tensor probs = Tensor::empty({c.batch, c.heads, c.tokens, c.tokens});
    Tensor out = Tensor::empty({c.batch, c.tokens, c.model_dim});
    ops::attention_forward(qkv, c.heads, scale, probs, out);
    Tensor d_qkv_cpu = Tensor::empty(qkv.shape());
    ops::attention_backward(qkv, probs, d_out, c.heads, scale, d_qkv_cpu);

    // Overwritten: no NaN may survive.
    Tensor d_qkv = testing::cuda_filled(qkv.shape(), std::numeric_limits<float>::quiet_NaN());
    ops::attention_backward(to_cuda(qkv), to_cuda(probs), to_cuda(d_out), c.heads, scale, d_qkv);
    const std::vector<float> expected = d_qkv_cpu.to_vector();
    expect_close(d_qkv.to(Device::cpu).to_vector(), expected, 1e-5, 1e-5 * testing::rms(expected), "d_qkv");
  }
}

// Upper bounds of Σ|x|, Σ|x|³ by Cauchy-Schwarz from the (positive) even sums.
void expect_logit_sums_close(const probe::LogitSums& actual, const probe::LogitSums& expected) {
  EXPECT_EQ(actual.count, expected.count);
  EXPECT_EQ(actual.nonfinite, expected.nonfinite);
  const double abs_sum = std::sqrt(double(expected.count) * expected.sum_sq);
  const double abs_cube = std::sqrt(expected.sum_sq * expected.sum_quad);
  EXPECT_LE(std::abs(actual.sum - expected.sum), 1e-5 * abs_sum) << actual.sum << " vs " << expected.sum;
  EXPECT_LE(std::abs(actual.sum_sq - expected.sum_sq), 1e-5 * expected.sum_sq);
  EXPECT_LE(std::abs(actual.sum_cube - expected.sum_cube), 1e-5 * abs_cube);
  EXPECT_LE(std::abs(actual.sum_quad - expected.sum_quad), 1e-5 * expected.sum_quad);
  EXPECT_LE(std::abs(actual.max_abs - expected.max_abs), 1e-5 * expected.max_abs);
}

TEST(AttentionCuda, LogitSumsMatchCpuAndAccumulate) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 300;
  for (const Case& c : kCases) {
    SCOPED_TRACE(describe(c));
    const float scale = default_scale(c);
    const Tensor qkv = random_tensor({c.batch, c.tokens, 3 * c.model_dim}, seed++);
    // Nonzero starting sums (a second recorded layer adds into the first's).
    probe::LogitSums start;
    start.count = 11;
    start.sum = 0.5;
    start.sum_sq = 3.0;
    start.sum_cube = -0.25;
    start.sum_quad = 9.0;
    start.max_abs = 0.75;
    probe::LogitSums cpu = start, cuda = start;
    Tensor probs_cpu = Tensor::empty({c.batch, c.heads, c.tokens, c.tokens});
    Tensor out_cpu = Tensor::empty({c.batch, c.tokens, c.model_dim});
    ops::attention_forward(qkv, c.heads, scale, probs_cpu, out_cpu, &cpu);

    const Tensor qkv_cuda = to_cuda(qkv);
    Tensor probs = to_cuda(probs_cpu), out = to_cuda(out_cpu);
    ops::attention_forward(qkv_cuda, c.heads, scale, probs, out, &cuda);
    expect_logit_sums_close(cuda, cpu);
    EXPECT_EQ(cuda.count, start.count + c.batch * c.heads * c.tokens * (c.tokens + 1) / 2);

    // Recording the sums does not change the outputs.
    Tensor probs_plain = to_cuda(probs_cpu), out_plain = to_cuda(out_cpu);
    ops::attention_forward(qkv_cuda, c.heads, scale, probs_plain, out_plain);
    testing::expect_bitwise(probs.to(Device::cpu).to_vector(), probs_plain.to(Device::cpu).to_vector(), "probs");
    testing::expect_bitwise(out.to(Device::cpu).to_vector(), out_plain.to(Device::cpu).to_vector(), "out");
  }
}

TEST(AttentionCuda, BitwiseRepeatable) {
  SKIP_WITHOUT_GPU();
  const Case c{4, 129, 96, 3};
  const float scale = default_scale(c);
  const Tensor qkv = to_cuda(random_tensor({c.batch, c.tokens, 3 * c.model_dim}, 400));
  const Tensor d_out = to_cuda(random_tensor({c.batch, c.tokens, c.model_dim}, 401));
  std::vector<float> first[3];
  probe::LogitSums first_sums;
  for (int run = 0; run < 3; ++run) {
    Tensor probs = Tensor::empty({c.batch, c.heads, c.tokens, c.tokens}, DType::f32, Device::cuda);
    Tensor out = Tensor::empty({c.batch, c.tokens, c.model_dim}, DType::f32, Device::cuda);
    Tensor d_qkv = Tensor::empty(qkv.shape(), DType::f32, Device::cuda);
    probe::LogitSums sums;
    ops::attention_forward(qkv, c.heads, scale, probs, out, &sums);
    ops::attention_backward(qkv, probs, d_out, c.heads, scale, d_qkv);
    const std::vector<float> results[3] = {probs.to(Device::cpu).to_vector(), out.to(Device::cpu).to_vector(),
                                           d_qkv.to(Device::cpu).to_vector()};
    if (run == 0) {
      for (int k = 0; k < 3; ++k) first[k] = results[k];
      first_sums = sums;
      continue;
    }
    SCOPED_TRACE("run " + std::to_string(run));
    testing::expect_bitwise(results[0], first[0], "probs");
    testing::expect_bitwise(results[1], first[1], "out");
    testing::expect_bitwise(results[2], first[2], "d_qkv");
    EXPECT_EQ(std::memcmp(&sums, &first_sums, sizeof(sums)), 0) << "logit sums differ";
  }
}

}  // namespace
}  // namespace proplab
