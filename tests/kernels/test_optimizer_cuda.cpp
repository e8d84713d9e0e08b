// CUDA-vs-CPU comparison of the optimizer steps (kernels/optimizer.cu against ops/optimizer.cpp) through the ops
// entry points, with and without the update measurements. Skipped at run time when no GPU is present.
//
// Tolerances: the GPU rounds every operation as the C++ expressions read; a CPU build that contracts a·b + c into
// a fused multiply-add (GCC's default for C++ with -march=native) rounds some of them once less, so parameters and
// moments are compared to 1e-6 relative to the magnitudes of the terms combined (a few ulps). Σ w² depends only on
// the inputs (products exact in double, only the summation order differs): 1e-9 relative. Σ Δw² is checked to
// 1e-9 against the same sum formed on the host from the GPU's own parameters, and to 1e-3 against the CPU's (one
// ulp of a parameter is ~1e-4 of a 1e-3-sized step, so a contracted CPU build legitimately differs there).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "compare_image_ops.h"
#include "ops/ops.h"
#include "support/gradcheck.h"

namespace proplab {
namespace {

using namespace testing::cuda_compare;
using testing::random_tensor;

constexpr double kElementTol = 1e-6;
constexpr double kSumTol = 1e-9;
constexpr double kUpdateVsCpuTol = 1e-3;

// Odd sizes, sizes around a block and the CPU's 4096-element measurement block, and sizes larger than a full grid
// pass (1024 blocks · 256 threads) so the grid-stride loop runs several times.
const std::vector<Shape> kShapes = {{1}, {7}, {255}, {4095}, {4097}, {3, 17, 61}, {1'000'003}, {3'000'017}};

// Σ before² and Σ (after − before)² in double, in order (the self-consistency reference for the measurements).
ops::UpdateNorms host_norms(const std::vector<float>& before, const std::vector<float>& after) {
  ops::UpdateNorms norms;
  for (std::size_t i = 0; i < before.size(); ++i) {
    const double old = before[i], delta = static_cast<double>(after[i]) - old;
    norms.weight_sq += old * old;
    norms.update_sq += delta * delta;
  }
  return norms;
}

// The measurements of a CUDA step that started from `start` norms, checked against the host sums of the GPU's own
// parameters and against the CPU's measurements.
void expect_norms(const ops::UpdateNorms& cuda, const ops::UpdateNorms& cpu, const ops::UpdateNorms& start,
                  const std::vector<float>& before, const std::vector<float>& after_cuda) {
  const ops::UpdateNorms own = host_norms(before, after_cuda);
  expect_close_scalar(cuda.weight_sq - start.weight_sq, own.weight_sq, kSumTol, "weight_sq (own)");
  expect_close_scalar(cuda.update_sq - start.update_sq, own.update_sq, kSumTol, "update_sq (own)");
  expect_close_scalar(cuda.weight_sq, cpu.weight_sq, kSumTol, "weight_sq vs cpu");
  expect_close_scalar(cuda.update_sq, cpu.update_sq, kUpdateVsCpuTol, "update_sq vs cpu");
}

struct AdamState {
  Tensor param, grad, m, v;
};

AdamState adam_state(const Shape& shape, std::uint64_t seed) {
  return {random_tensor(shape, seed), random_tensor(shape, seed + 1, 0.5), random_tensor(shape, seed + 2, 0.1),
          absolute(random_tensor(shape, seed + 3, 0.05))};
}

void check_adamw(const Shape& shape, const ops::AdamWHyper& hyper, std::uint64_t seed, bool measure) {
  AdamState cpu = adam_state(shape, seed);
  const std::vector<float> p0 = cpu.param.to_vector(), g = cpu.grad.to_vector();
  const std::vector<float> m0 = cpu.m.to_vector(), v0 = cpu.v.to_vector();
  AdamState gpu{to_cuda(cpu.param), to_cuda(cpu.grad), to_cuda(cpu.m), to_cuda(cpu.v)};
  const ops::UpdateNorms start{0.75, 0.125};  // nonzero: the measurements are added
  ops::UpdateNorms cpu_norms = start, gpu_norms = start;
  ops::adamw_update(cpu.param, cpu.grad, cpu.m, cpu.v, hyper, measure ? &cpu_norms : nullptr);
  ops::adamw_update(gpu.param, gpu.grad, gpu.m, gpu.v, hyper, measure ? &gpu_norms : nullptr);

  const std::vector<float> p_cpu = cpu.param.to_vector(), p_gpu = gpu.param.to_vector();
  std::vector<double> p_scale(p0.size()), m_scale(p0.size()), v_scale(p0.size());
  for (std::size_t i = 0; i < p0.size(); ++i) {
    p_scale[i] = 2.0 * std::abs(double(p0[i])) + std::abs(double(p_cpu[i]));
    m_scale[i] = std::abs(double(m0[i])) + std::abs(double(g[i]));
    v_scale[i] = std::abs(double(v0[i])) + double(g[i]) * g[i];
  }
  expect_close(p_gpu, p_cpu, p_scale, kElementTol, "param");
  expect_close(gpu.m.to_vector(), cpu.m.to_vector(), m_scale, kElementTol, "m");
  expect_close(gpu.v.to_vector(), cpu.v.to_vector(), v_scale, kElementTol, "v");
  if (measure) {
    expect_norms(gpu_norms, cpu_norms, start, p0, p_gpu);
  } else {
    EXPECT_EQ(gpu_norms.weight_sq, start.weight_sq);
    EXPECT_EQ(gpu_norms.update_sq, start.update_sq);
  }
}

TEST(OptimizerCuda, AdamWMatchesCpu) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 1000;
  for (const Shape& shape : kShapes) {
    SCOPED_TRACE("shape " + shape_string(shape));
    ops::AdamWHyper hyper;
    hyper.lr = 3e-3f;
    hyper.weight_decay = 0.1f;
    hyper.step = 1;
    check_adamw(shape, hyper, seed += 10, true);
    hyper.step = 57;
    hyper.beta2 = 0.999f;
    check_adamw(shape, hyper, seed += 10, false);
  }
}

struct SgdState {
  Tensor param, grad, buffer;
};

void check_sgd(const Shape& shape, const ops::SgdHyper& hyper, std::uint64_t seed, bool measure) {
  const bool with_buffer = hyper.momentum != 0.0f;
  SgdState cpu{random_tensor(shape, seed), random_tensor(shape, seed + 1, 0.5),
               with_buffer ? random_tensor(shape, seed + 2, 0.3) : Tensor()};
  const std::vector<float> p0 = cpu.param.to_vector(), g = cpu.grad.to_vector();
  const std::vector<float> b0 = with_buffer ? cpu.buffer.to_vector() : std::vector<float>(p0.size(), 0.0f);
  SgdState gpu{to_cuda(cpu.param), to_cuda(cpu.grad), with_buffer ? to_cuda(cpu.buffer) : Tensor()};
  const ops::UpdateNorms start{2.5, 0.5};
  ops::UpdateNorms cpu_norms = start, gpu_norms = start;
  ops::sgd_update(cpu.param, cpu.grad, cpu.buffer, hyper, measure ? &cpu_norms : nullptr);
  ops::sgd_update(gpu.param, gpu.grad, gpu.buffer, hyper, measure ? &gpu_norms : nullptr);

  const std::vector<float> p_cpu = cpu.param.to_vector(), p_gpu = gpu.param.to_vector();
  std::vector<double> p_scale(p0.size()), b_scale(p0.size());
  for (std::size_t i = 0; i < p0.size(); ++i) {
    // Every term the step combines: p, g, wd·p, momentum·buf (twice with nesterov).
    b_scale[i] = std::abs(double(g[i])) + std::abs(double(p0[i])) + 2.0 * std::abs(double(b0[i]));
    p_scale[i] = std::abs(double(p0[i])) + std::abs(double(p_cpu[i])) + b_scale[i];
  }
  expect_close(p_gpu, p_cpu, p_scale, kElementTol, "param");
  if (with_buffer) expect_close(gpu.buffer.to_vector(), cpu.buffer.to_vector(), b_scale, kElementTol, "buffer");
  if (measure) expect_norms(gpu_norms, cpu_norms, start, p0, p_gpu);
}

TEST(OptimizerCuda, SgdMatchesCpu) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 2000;
  for (const Shape& shape : kShapes) {
    SCOPED_TRACE("shape " + shape_string(shape));
    ops::SgdHyper plain;
    plain.momentum = 0.0f;
    plain.weight_decay = 5e-4f;
    check_sgd(shape, plain, seed += 10, true);
    ops::SgdHyper momentum;
    momentum.weight_decay = 1e-4f;
    check_sgd(shape, momentum, seed += 10, true);
    ops::SgdHyper nesterov;
    nesterov.lr = 0.05f;
    nesterov.nesterov = true;
    check_sgd(shape, nesterov, seed += 10, false);
    check_sgd(shape, nesterov, seed += 10, true);
  }
}

TEST(OptimizerCuda, MeasuringDoesNotChangeTheStep) {
  SKIP_WITHOUT_GPU();
  const Shape shape = {70'001};
  AdamState a = adam_state(shape, 3000);
  AdamState first{to_cuda(a.param), to_cuda(a.grad), to_cuda(a.m), to_cuda(a.v)};
  AdamState second{to_cuda(a.param), to_cuda(a.grad), to_cuda(a.m), to_cuda(a.v)};
  ops::AdamWHyper hyper;
  hyper.weight_decay = 0.05f;
  ops::UpdateNorms norms;
  ops::adamw_update(first.param, first.grad, first.m, first.v, hyper, &norms);
  ops::adamw_update(second.param, second.grad, second.m, second.v, hyper, nullptr);
  expect_bitwise(first.param.to_vector(), second.param.to_vector(), "param measured vs not");
  expect_bitwise(first.m.to_vector(), second.m.to_vector(), "m measured vs not");
  expect_bitwise(first.v.to_vector(), second.v.to_vector(), "v measured vs not");
}

TEST(OptimizerCuda, StepsAndMeasurementsAreBitwiseRepeatable) {
  SKIP_WITHOUT_GPU();
  const Shape shape = {3'000'017};
  AdamState a = adam_state(shape, 4000);
  ops::AdamWHyper adam;
  adam.weight_decay = 0.1f;
  ops::SgdHyper sgd;
  sgd.nesterov = true;
  sgd.weight_decay = 1e-4f;
  std::vector<float> params[2];
  ops::UpdateNorms adam_norms[2], sgd_norms[2];
  for (int run = 0; run < 2; ++run) {
    AdamState s{to_cuda(a.param), to_cuda(a.grad), to_cuda(a.m), to_cuda(a.v)};
    ops::adamw_update(s.param, s.grad, s.m, s.v, adam, &adam_norms[run]);
    ops::sgd_update(s.param, s.grad, s.m, sgd, &sgd_norms[run]);
    params[run] = s.param.to_vector();
  }
  expect_bitwise(params[1], params[0], "param");
  EXPECT_EQ(adam_norms[1].weight_sq, adam_norms[0].weight_sq);
  EXPECT_EQ(adam_norms[1].update_sq, adam_norms[0].update_sq);
  EXPECT_EQ(sgd_norms[1].weight_sq, sgd_norms[0].weight_sq);
  EXPECT_EQ(sgd_norms[1].update_sq, sgd_norms[0].update_sq);
  EXPECT_GT(adam_norms[0].update_sq, 0.0);
}

}  // namespace
}  // namespace proplab
