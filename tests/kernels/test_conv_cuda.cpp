// CUDA-vs-CPU comparison of 2-D convolution (kernels/conv.cu against ops/conv.cpp) through the ops entry points:
// strides, paddings, groups (depthwise included), non-square and 1×1 kernels, optional bias and gradients, and a
// batch large enough to be cut into several sample chunks. Skipped at run time when no GPU is present.
//
// Tolerance: both sides accumulate the products in float, in different (blocked) orders, so each value is compared
// to 1e-5 relative to the sum of the absolute values of its terms — the same op applied to |x|, |w|, |d_y| (and
// the starting |d_weight|, |d_bias| for the accumulated gradients). The accumulated rounding error of a float sum
// of K terms grows like sqrt(K)·6e-8 relative to that scale (≤ 2e-6 for the largest K here).
#include <gtest/gtest.h>

#include <cstdint>
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

constexpr double kRelTol = 1e-5;

struct ConvCase {
  Shape x;  // [N, C_in, H, W]
  std::int64_t c_out, kh, kw;
  ops::Conv2dParams params;
  bool bias;
};

std::string describe(const ConvCase& c) {
  return "x " + shape_string(c.x) + " c_out " + std::to_string(c.c_out) + " kernel " + std::to_string(c.kh) + "x" +
         std::to_string(c.kw) + " stride " + std::to_string(c.params.stride) + " padding " +
         std::to_string(c.params.padding) + " groups " + std::to_string(c.params.groups) +
         (c.bias ? " bias" : " no bias");
}

const std::vector<ConvCase> kCases = {
    {{2, 3, 7, 9}, 4, 3, 3, {1, 1, 1}, true},
    {{3, 4, 11, 8}, 6, 3, 3, {2, 0, 2}, false},
    {{2, 6, 9, 9}, 6, 3, 3, {1, 1, 6}, true},  // depthwise
    {{4, 5, 6, 7}, 7, 1, 1, {1, 0, 1}, true},  // 1×1
    {{2, 3, 13, 10}, 5, 5, 3, {3, 2, 1}, true},
    {{1, 2, 4, 4}, 3, 4, 4, {1, 0, 1}, false},  // one output pixel
    {{2, 3, 32, 32}, 8, 7, 7, {2, 3, 1}, true},
    {{3, 8, 15, 17}, 12, 3, 3, {1, 2, 4}, true},  // padding wider than the kernel's half
    // 144 · 128 · 128 floats of columns per sample: kConvColumnBudget holds 14 samples, so two chunks (14 + 3).
    {{17, 16, 128, 128}, 16, 3, 3, {1, 1, 1}, true},
};

Shape weight_shape(const ConvCase& c) { return {c.c_out, c.x[1] / c.params.groups, c.kh, c.kw}; }

Shape output_shape(const ConvCase& c) {
  return {c.x[0], c.c_out, ops::conv2d_out_size(c.x[2], c.kh, c.params.stride, c.params.padding),
          ops::conv2d_out_size(c.x[3], c.kw, c.params.stride, c.params.padding)};
}

struct ConvInputs {
  Tensor x, weight, bias, d_y, d_weight0, d_bias0;
};

ConvInputs make_inputs(const ConvCase& c, std::uint64_t seed) {
  return {random_tensor(c.x, seed),
          random_tensor(weight_shape(c), seed + 1, 0.2),
          random_tensor({c.c_out}, seed + 2, 0.5),
          random_tensor(output_shape(c), seed + 3),
          random_tensor(weight_shape(c), seed + 4, 0.1),
          random_tensor({c.c_out}, seed + 5, 0.1)};
}

TEST(ConvCuda, ForwardMatchesCpu) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 100;
  for (const ConvCase& c : kCases) {
    SCOPED_TRACE(describe(c));
    const ConvInputs in = make_inputs(c, seed += 10);
    Tensor y_cpu = Tensor::empty(output_shape(c));
    ops::conv2d_forward(in.x, in.weight, c.bias ? &in.bias : nullptr, c.params, y_cpu);
    Tensor scale = Tensor::empty(output_shape(c));
    const Tensor abs_bias = absolute(in.bias);
    ops::conv2d_forward(absolute(in.x), absolute(in.weight), c.bias ? &abs_bias : nullptr, c.params, scale);

    const Tensor bias = to_cuda(in.bias);
    Tensor y = Tensor::empty(output_shape(c), DType::f32, Device::cuda);
    ops::conv2d_forward(to_cuda(in.x), to_cuda(in.weight), c.bias ? &bias : nullptr, c.params, y);
    expect_close(y.to_vector(), y_cpu.to_vector(), magnitudes(scale.to_vector()), kRelTol, "y");
  }
}

TEST(ConvCuda, BackwardMatchesCpuAndAccumulates) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 200;
  for (const ConvCase& c : kCases) {
    for (const bool optional : {true, false}) {
      SCOPED_TRACE(describe(c) + (optional ? " with d_x, d_bias" : " without d_x, d_bias"));
      const ConvInputs in = make_inputs(c, seed += 10);
      // CPU reference; nonzero starting parameter gradients (they accumulate).
      Tensor d_x_cpu = Tensor::empty(c.x), d_w_cpu = in.d_weight0.clone(), d_b_cpu = in.d_bias0.clone();
      ops::conv2d_backward(in.x, in.weight, in.d_y, c.params, optional ? &d_x_cpu : nullptr, d_w_cpu,
                           optional ? &d_b_cpu : nullptr);
      // Error scales: the same sums over absolute values.
      Tensor d_x_scale = Tensor::empty(c.x), d_w_scale = absolute(in.d_weight0), d_b_scale = absolute(in.d_bias0);
      ops::conv2d_backward(absolute(in.x), absolute(in.weight), absolute(in.d_y), c.params, &d_x_scale, d_w_scale,
                           &d_b_scale);

      Tensor d_x = Tensor::empty(c.x, DType::f32, Device::cuda);
      Tensor d_w = to_cuda(in.d_weight0), d_b = to_cuda(in.d_bias0);
      ops::conv2d_backward(to_cuda(in.x), to_cuda(in.weight), to_cuda(in.d_y), c.params, optional ? &d_x : nullptr, d_w,
                           optional ? &d_b : nullptr);
      expect_close(d_w.to_vector(), d_w_cpu.to_vector(), magnitudes(d_w_scale.to_vector()), kRelTol, "d_weight");
      if (optional) {
        expect_close(d_x.to_vector(), d_x_cpu.to_vector(), magnitudes(d_x_scale.to_vector()), kRelTol, "d_x");
        expect_close(d_b.to_vector(), d_b_cpu.to_vector(), magnitudes(d_b_scale.to_vector()), kRelTol, "d_bias");
      } else {
        expect_bitwise(d_b.to_vector(), in.d_bias0.to_vector(), "d_bias left alone");
      }
    }
  }
}

TEST(ConvCuda, ForwardAndBackwardAreBitwiseRepeatable) {
  SKIP_WITHOUT_GPU();
  for (const ConvCase& c : {kCases[1], kCases[2], kCases.back()}) {
    SCOPED_TRACE(describe(c));
    const ConvInputs in = make_inputs(c, 300);
    const Tensor x = to_cuda(in.x), weight = to_cuda(in.weight), bias = to_cuda(in.bias), d_y = to_cuda(in.d_y);
    std::vector<float> y[2], d_x[2], d_w[2], d_b[2];
    for (int run = 0; run < 2; ++run) {
      Tensor y_run = Tensor::empty(output_shape(c), DType::f32, Device::cuda);
      ops::conv2d_forward(x, weight, &bias, c.params, y_run);
      Tensor d_x_run = Tensor::empty(c.x, DType::f32, Device::cuda);
      Tensor d_w_run = to_cuda(in.d_weight0), d_b_run = to_cuda(in.d_bias0);
      ops::conv2d_backward(x, weight, d_y, c.params, &d_x_run, d_w_run, &d_b_run);
      y[run] = y_run.to_vector();
      d_x[run] = d_x_run.to_vector();
      d_w[run] = d_w_run.to_vector();
      d_b[run] = d_b_run.to_vector();
    }
    expect_bitwise(y[1], y[0], "y");
    expect_bitwise(d_x[1], d_x[0], "d_x");
    expect_bitwise(d_w[1], d_w[0], "d_weight");
    expect_bitwise(d_b[1], d_b[0], "d_bias");
  }
}

}  // namespace
}  // namespace proplab
