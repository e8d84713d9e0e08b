// CUDA-vs-CPU comparison of the pooling ops and the channels-last views (kernels/pool.cu against ops/pool.cpp)
// through the ops entry points: average and max pooling with overlapping, exact and gapped windows, max pooling
// with padding and ties, global average pooling, NCHW <-> NHWC. Skipped at run time when no GPU is present.
//
// Tolerances: every output is computed by one thread in the CPU's order with the CPU's arithmetic, so the
// forward passes, the argmax, max-pool backward (additions only), global average pooling (a double sum in element
// order) and the transposes must match bit for bit. avg_pool2d_backward forms d_y·(1/k²) and adds: bitwise too
// unless the CPU build fuses that multiply into the add, so it is compared to 1e-6 relative to Σ |terms|.
#include <gtest/gtest.h>

#include <cmath>
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

constexpr double kRelTol = 1e-6;

struct PoolCase {
  Shape x;
  int kernel, stride, padding;
};

std::string describe(const PoolCase& c) {
  return "x " + shape_string(c.x) + " kernel " + std::to_string(c.kernel) + " stride " + std::to_string(c.stride) +
         " padding " + std::to_string(c.padding);
}

// Exact tiling, overlapping windows, gaps between windows (stride > kernel), odd sizes, one large input.
const std::vector<PoolCase> kCases = {
    {{2, 3, 8, 8}, 2, 2, 0},  {{2, 3, 9, 11}, 3, 2, 1}, {{1, 4, 7, 7}, 3, 1, 1},    {{3, 2, 10, 9}, 2, 3, 0},
    {{2, 5, 13, 6}, 3, 3, 0}, {{1, 1, 1, 1}, 1, 1, 0},  {{8, 64, 56, 56}, 3, 2, 1},
};

Shape pooled(const PoolCase& c, int padding) {
  return {c.x[0], c.x[1], ops::conv2d_out_size(c.x[2], c.kernel, c.stride, padding),
          ops::conv2d_out_size(c.x[3], c.kernel, c.stride, padding)};
}

TEST(PoolCuda, AvgPoolForwardAndBackwardMatchCpu) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 100;
  for (const PoolCase& c : kCases) {
    SCOPED_TRACE(describe(c));
    const Shape out = pooled(c, 0);
    const Tensor x = random_tensor(c.x, seed += 10), d_y = random_tensor(out, seed + 1);
    Tensor y_cpu = Tensor::empty(out);
    ops::avg_pool2d_forward(x, c.kernel, c.stride, y_cpu);
    Tensor y = Tensor::empty(out, DType::f32, Device::cuda);
    ops::avg_pool2d_forward(to_cuda(x), c.kernel, c.stride, y);
    expect_bitwise(y.to_vector(), y_cpu.to_vector(), "y");

    Tensor d_x_cpu = Tensor::empty(c.x), d_x_scale = Tensor::empty(c.x);
    ops::avg_pool2d_backward(d_y, c.kernel, c.stride, d_x_cpu);
    ops::avg_pool2d_backward(absolute(d_y), c.kernel, c.stride, d_x_scale);
    Tensor d_x = to_cuda(random_tensor(c.x, seed + 2));  // overwritten
    ops::avg_pool2d_backward(to_cuda(d_y), c.kernel, c.stride, d_x);
    expect_close(d_x.to_vector(), d_x_cpu.to_vector(), magnitudes(d_x_scale.to_vector()), kRelTol, "d_x");
  }
}

// Values on a coarse grid so that windows hold ties (first one wins).
Tensor tied_tensor(const Shape& shape, std::uint64_t seed) {
  std::vector<float> values = random_tensor(shape, seed).to_vector();
  for (float& v : values) v = std::round(v * 2.0f) / 2.0f;
  return Tensor::from_vector(shape, values);
}

TEST(PoolCuda, MaxPoolForwardAndBackwardMatchCpu) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 200;
  for (const PoolCase& c : kCases) {
    if (2 * c.padding >= c.kernel) continue;
    for (const bool ties : {false, true}) {
      SCOPED_TRACE(describe(c) + (ties ? " with ties" : ""));
      const Shape out = pooled(c, c.padding);
      const Tensor x = ties ? tied_tensor(c.x, seed += 10) : random_tensor(c.x, seed += 10);
      const Tensor d_y = random_tensor(out, seed + 1);
      Tensor y_cpu = Tensor::empty(out), arg_cpu = Tensor::empty(out, DType::i32);
      ops::max_pool2d_forward(x, c.kernel, c.stride, c.padding, y_cpu, arg_cpu);
      Tensor y = Tensor::empty(out, DType::f32, Device::cuda), arg = Tensor::empty(out, DType::i32, Device::cuda);
      ops::max_pool2d_forward(to_cuda(x), c.kernel, c.stride, c.padding, y, arg);
      expect_bitwise(y.to_vector(), y_cpu.to_vector(), "y");
      expect_bitwise(to_host_i32(arg), to_host_i32(arg_cpu), "argmax");

      Tensor d_x_cpu = Tensor::empty(c.x);
      ops::max_pool2d_backward(d_y, arg_cpu, d_x_cpu);
      Tensor d_x = to_cuda(random_tensor(c.x, seed + 2));  // overwritten
      ops::max_pool2d_backward(to_cuda(d_y), arg, d_x);
      expect_bitwise(d_x.to_vector(), d_x_cpu.to_vector(), "d_x");
    }
  }
}

TEST(PoolCuda, GlobalAvgPoolMatchesCpu) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 300;
  for (const Shape& shape : {Shape{2, 3, 7, 7}, Shape{3, 5, 1, 1}, Shape{2, 700, 16, 16}, Shape{1, 2, 300, 301}}) {
    SCOPED_TRACE("x " + shape_string(shape));
    const Tensor x = random_tensor(shape, seed += 10), d_y = random_tensor({shape[0], shape[1]}, seed + 1);
    Tensor y_cpu = Tensor::empty({shape[0], shape[1]});
    ops::global_avg_pool_forward(x, y_cpu);
    Tensor y = Tensor::empty({shape[0], shape[1]}, DType::f32, Device::cuda);
    ops::global_avg_pool_forward(to_cuda(x), y);
    expect_bitwise(y.to_vector(), y_cpu.to_vector(), "y");

    Tensor d_x_cpu = Tensor::empty(shape);
    ops::global_avg_pool_backward(d_y, d_x_cpu);
    Tensor d_x = Tensor::empty(shape, DType::f32, Device::cuda);
    ops::global_avg_pool_backward(to_cuda(d_y), d_x);
    expect_bitwise(d_x.to_vector(), d_x_cpu.to_vector(), "d_x");
  }
}

TEST(PoolCuda, ChannelsLastRoundTripMatchesCpu) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 400;
  for (const Shape& shape :
       {Shape{2, 3, 5, 7}, Shape{1, 1, 1, 1}, Shape{4, 64, 17, 19}, Shape{3, 513, 9, 11}, Shape{4, 96, 33, 31}}) {
    SCOPED_TRACE("x " + shape_string(shape));
    const Shape nhwc = {shape[0], shape[2] * shape[3], shape[1]};
    const Tensor x = random_tensor(shape, seed += 10);
    Tensor y_cpu = Tensor::empty(nhwc);
    ops::nchw_to_nhwc(x, y_cpu);
    Tensor y = Tensor::empty(nhwc, DType::f32, Device::cuda);
    ops::nchw_to_nhwc(to_cuda(x), y);
    expect_bitwise(y.to_vector(), y_cpu.to_vector(), "nhwc");

    const Tensor t = random_tensor(nhwc, seed + 1);
    Tensor back_cpu = Tensor::empty(shape);
    ops::nhwc_to_nchw(t, back_cpu);
    Tensor back = Tensor::empty(shape, DType::f32, Device::cuda);
    ops::nhwc_to_nchw(to_cuda(t), back);
    expect_bitwise(back.to_vector(), back_cpu.to_vector(), "nchw");

    Tensor round_trip = Tensor::empty(shape, DType::f32, Device::cuda);
    ops::nhwc_to_nchw(y, round_trip);
    expect_bitwise(round_trip.to_vector(), x.to_vector(), "round trip");
  }
}

TEST(PoolCuda, BackwardPassesAreBitwiseRepeatable) {
  SKIP_WITHOUT_GPU();
  const PoolCase c = kCases.back();
  const Shape out = pooled(c, c.padding);
  const Tensor x = to_cuda(tied_tensor(c.x, 500)), d_y = to_cuda(random_tensor(out, 501));
  std::vector<float> max_d_x[2], avg_d_x[2];
  for (int run = 0; run < 2; ++run) {
    Tensor y = Tensor::empty(out, DType::f32, Device::cuda), arg = Tensor::empty(out, DType::i32, Device::cuda);
    ops::max_pool2d_forward(x, c.kernel, c.stride, c.padding, y, arg);
    Tensor d_x = Tensor::empty(c.x, DType::f32, Device::cuda);
    ops::max_pool2d_backward(d_y, arg, d_x);
    max_d_x[run] = d_x.to_vector();
    const Shape avg_out = pooled(c, 0);
    Tensor d_x_avg = Tensor::empty(c.x, DType::f32, Device::cuda);
    ops::avg_pool2d_backward(to_cuda(random_tensor(avg_out, 502)), c.kernel, c.stride, d_x_avg);
    avg_d_x[run] = d_x_avg.to_vector();
  }
  expect_bitwise(max_d_x[1], max_d_x[0], "max_pool2d_backward");
  expect_bitwise(avg_d_x[1], avg_d_x[0], "avg_pool2d_backward");
}

}  // namespace
}  // namespace proplab
