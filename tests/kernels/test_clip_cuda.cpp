// CUDA-vs-CPU comparison of global gradient-norm clipping (ops/clip.cpp's CUDA path: kernels::dot_device per
// tensor, the sums added in list order on the host, kernels::scale) through ops::clip_grad_norm. Skipped at run
// time when no GPU is present.
//
// Tolerances: the norm is a double sum whose order within a tensor differs from the CPU's chunked sum: 1e-9
// relative (the rounding error of a few million double additions is ~1e-13 relative). The clipped gradients are
// scaled by the same float factor unless the two norms straddle a float rounding boundary of max_norm / norm:
// 1e-6 relative to each value.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "compare_image_ops.h"
#include "core/tensor.h"
#include "ops/ops.h"
#include "support/gradcheck.h"

namespace proplab {
namespace {

using namespace testing::cuda_compare;
using testing::random_tensor;

constexpr double kNormTol = 1e-9;
constexpr double kValueTol = 1e-6;

// Several tensors of odd sizes, one larger than a full grid pass of the reduction, one empty.
const std::vector<Shape> kShapes = {{1}, {7, 3}, {0}, {4097}, {3, 17, 61}, {1'200'007}, {255}};

std::vector<Tensor> random_grads(std::uint64_t seed, double std) {
  std::vector<Tensor> grads;
  for (const Shape& shape : kShapes) grads.push_back(random_tensor(shape, seed++, std));
  return grads;
}

std::vector<Tensor*> pointers(std::vector<Tensor>& tensors) {
  std::vector<Tensor*> out;
  for (Tensor& t : tensors) out.push_back(&t);
  return out;
}

// Runs clip_grad_norm on CPU copies and CUDA copies of `grads` and compares norm and clipped values.
void check_clip(const std::vector<Tensor>& grads, double max_norm, bool expect_clipped) {
  std::vector<Tensor> cpu, gpu;
  for (const Tensor& g : grads) {
    cpu.push_back(g.clone());
    gpu.push_back(to_cuda(g));
  }
  const double norm_cpu = ops::clip_grad_norm(pointers(cpu), max_norm);
  const double norm_gpu = ops::clip_grad_norm(pointers(gpu), max_norm);
  expect_close_scalar(norm_gpu, norm_cpu, kNormTol, "norm");
  EXPECT_EQ(norm_cpu > max_norm && max_norm > 0.0, expect_clipped) << "test setup: norm " << norm_cpu;
  for (std::size_t i = 0; i < grads.size(); ++i) {
    SCOPED_TRACE("tensor " + std::to_string(i) + " " + shape_string(grads[i].shape()));
    const std::vector<float> expected = cpu[i].to_vector();
    const std::vector<float> actual = gpu[i].to_vector();
    if (expect_clipped)
      expect_close_rel(actual, expected, kValueTol, "clipped gradient");
    else
      expect_bitwise(actual, grads[i].to_vector(), "unclipped gradient");
  }
}

TEST(ClipCuda, NormAndScalingMatchCpu) {
  SKIP_WITHOUT_GPU();
  const std::vector<Tensor> grads = random_grads(100, 0.2);
  check_clip(grads, 1.0, true);   // norm ≈ 0.2·sqrt(1.2e6) ≫ 1: clipped
  check_clip(grads, 1e6, false);  // below max_norm: untouched
  check_clip(grads, 0.0, false);  // max_norm 0: only measured
}

TEST(ClipCuda, SingleTensorAndEmptyList) {
  SKIP_WITHOUT_GPU();
  std::vector<Tensor> one = {random_tensor({513}, 200)};
  check_clip(one, 0.5, true);
  std::vector<Tensor*> none;
  EXPECT_EQ(ops::clip_grad_norm(none, 1.0), 0.0);
}

TEST(ClipCuda, NonFiniteNormIsReturnedUnscaled) {
  SKIP_WITHOUT_GPU();
  std::vector<float> values(1000, 0.5f);
  values[417] = std::numeric_limits<float>::infinity();
  Tensor host = Tensor::from_vector({1000}, values);
  Tensor gpu = to_cuda(host);
  std::vector<Tensor*> list = {&gpu};
  EXPECT_TRUE(std::isinf(ops::clip_grad_norm(list, 1.0)));
  expect_bitwise(gpu.to_vector(), values, "gradient with an infinite norm");
}

TEST(ClipCuda, NormIsBitwiseRepeatable) {
  SKIP_WITHOUT_GPU();
  const std::vector<Tensor> grads = random_grads(300, 1.0);
  std::vector<Tensor> gpu;
  for (const Tensor& g : grads) gpu.push_back(to_cuda(g));
  const double first = ops::clip_grad_norm(pointers(gpu), 0.0);
  for (int run = 0; run < 3; ++run) EXPECT_EQ(ops::clip_grad_norm(pointers(gpu), 0.0), first) << "run " << run;
  // And the clipped values repeat too.
  std::vector<Tensor> a, b;
  for (const Tensor& g : grads) {
    a.push_back(to_cuda(g));
    b.push_back(to_cuda(g));
  }
  ops::clip_grad_norm(pointers(a), 0.1);
  ops::clip_grad_norm(pointers(b), 0.1);
  for (std::size_t i = 0; i < a.size(); ++i) expect_bitwise(a[i].to_vector(), b[i].to_vector(), "clipped");
}

}  // namespace
}  // namespace proplab
