// CUDA-vs-CPU comparison of axpy, scale, zero, dot and sum_squares (kernels/elementwise.cu and kernels/reduce.cu
// against the CPU reference in src/ops/elementwise.cpp), through the ops entry points. Skipped at run time when no
// GPU is present.
//
// Tolerances:
// - scale and zero: bitwise (one rounded multiply per element; all bits clear).
// - axpy: 1e-6 relative to |y| + |alpha x|: either compiler may fuse y + alpha·x into one multiply-add (one
//   rounding instead of two), a difference of at most one ulp of the product.
// - dot, sum_squares: 1e-12 relative to Σ|x_i y_i|: both sum the exact double products in double, in different
//   orders (CPU: 4096-element chunks; GPU: a grid-stride block tree), each within ~n·2^-53 of Σ|x y|.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "ops/ops.h"
#include "support/gradcheck.h"

namespace proplab {
namespace {

using testing::random_tensor;

constexpr double kAxpyTol = 1e-6;
constexpr double kSumTol = 1e-12;

// Odd sizes, sizes around a block and a CPU reduction chunk (4096), and one larger than a full grid pass.
const std::vector<Shape> kShapes = {{1}, {7}, {1023}, {4097}, {3, 17, 61}, {3'000'017}};

#define SKIP_WITHOUT_GPU() \
  if (!proplab::cuda_available()) GTEST_SKIP() << "no CUDA GPU: skipping CUDA-vs-CPU comparison"

Tensor to_cuda(const Tensor& host) {
  Tensor device = Tensor::empty(host.shape(), DType::f32, Device::cuda);
  device.copy_from(host);
  return device;
}

void expect_bitwise(const std::vector<float>& actual, const std::vector<float>& expected, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  std::int64_t differing = 0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    if (std::bit_cast<std::uint32_t>(actual[i]) != std::bit_cast<std::uint32_t>(expected[i]) && ++differing <= 5)
      ADD_FAILURE() << what << "[" << i << "]: cuda " << actual[i] << " vs cpu " << expected[i];
  }
  EXPECT_EQ(differing, 0) << what << ": " << differing << " of " << actual.size() << " elements differ in their bits";
}

// Σ|x_i y_i| (y null: Σ x_i²) in double: the scale of a dot product's rounding.
double abs_dot(const std::vector<float>& x, const std::vector<float>* y) {
  double total = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i)
    total += std::abs(static_cast<double>(x[i]) * (y ? static_cast<double>((*y)[i]) : static_cast<double>(x[i])));
  return total;
}

TEST(ElementwiseCuda, AxpyMatchesCpu) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 100;
  for (const Shape& shape : kShapes) {
    const Tensor x = random_tensor(shape, seed += 10), y0 = random_tensor(shape, seed + 1, 2.0, 0.5);
    const std::vector<float> xs = x.to_vector(), ys = y0.to_vector();
    for (float alpha : {0.0f, 1.0f, -0.37f, 3.5f}) {
      SCOPED_TRACE("shape " + shape_string(shape) + " alpha " + std::to_string(alpha));
      Tensor y = y0.clone();
      ops::axpy(alpha, x, y);
      Tensor y_cuda = to_cuda(y0);
      ops::axpy(alpha, to_cuda(x), y_cuda);
      const std::vector<float> actual = y_cuda.to_vector(), expected = y.to_vector();
      std::int64_t failures = 0;
      for (std::size_t i = 0; i < actual.size(); ++i) {
        const double scale = std::abs(static_cast<double>(ys[i])) + std::abs(static_cast<double>(alpha) * xs[i]);
        if (std::abs(static_cast<double>(actual[i]) - expected[i]) > kAxpyTol * scale && ++failures <= 5)
          ADD_FAILURE() << "y[" << i << "]: cuda " << actual[i] << " vs cpu " << expected[i];
      }
      EXPECT_EQ(failures, 0);
    }
  }
}

// x aliasing y: y += alpha · y.
TEST(ElementwiseCuda, AxpyInPlaceMatchesCpu) {
  SKIP_WITHOUT_GPU();
  const Tensor y0 = random_tensor({4099}, 200);
  Tensor y = y0.clone();
  ops::axpy(-0.25f, y, y);
  Tensor y_cuda = to_cuda(y0);
  ops::axpy(-0.25f, y_cuda, y_cuda);
  const std::vector<float> ys = y0.to_vector(), actual = y_cuda.to_vector(), expected = y.to_vector();
  for (std::size_t i = 0; i < ys.size(); ++i)
    ASSERT_LE(std::abs(static_cast<double>(actual[i]) - expected[i]), kAxpyTol * 1.25 * std::abs(double(ys[i])))
        << "element " << i;
}

TEST(ElementwiseCuda, ScaleAndZeroBitwiseEqualCpu) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 300;
  for (const Shape& shape : kShapes) {
    SCOPED_TRACE("shape " + shape_string(shape));
    const Tensor x0 = random_tensor(shape, seed += 10);
    for (float alpha : {0.0f, -1.0f, 0.3f, 1e-3f}) {
      Tensor x = x0.clone();
      ops::scale(x, alpha);
      Tensor x_cuda = to_cuda(x0);
      ops::scale(x_cuda, alpha);
      expect_bitwise(x_cuda.to_vector(), x.to_vector(), "scale by " + std::to_string(alpha));
    }
    Tensor x = x0.clone();
    ops::zero(x);
    Tensor x_cuda = to_cuda(x0);
    ops::zero(x_cuda);
    expect_bitwise(x_cuda.to_vector(), x.to_vector(), "zero");
  }
}

TEST(ElementwiseCuda, DotAndSumSquaresMatchCpu) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 400;
  for (const Shape& shape : kShapes) {
    SCOPED_TRACE("shape " + shape_string(shape));
    const Tensor x = random_tensor(shape, seed += 10, 1.0, 0.1), y = random_tensor(shape, seed + 1);
    const std::vector<float> xs = x.to_vector(), ys = y.to_vector();
    const Tensor x_cuda = to_cuda(x), y_cuda = to_cuda(y);
    const double dot_cpu = ops::dot(x, y), dot_cuda = ops::dot(x_cuda, y_cuda);
    EXPECT_LE(std::abs(dot_cuda - dot_cpu), kSumTol * abs_dot(xs, &ys))
        << "dot: cuda " << dot_cuda << " cpu " << dot_cpu;
    const double sq_cpu = ops::sum_squares(x), sq_cuda = ops::sum_squares(x_cuda);
    EXPECT_LE(std::abs(sq_cuda - sq_cpu), kSumTol * abs_dot(xs, nullptr))
        << "sum_squares: cuda " << sq_cuda << " cpu " << sq_cpu;
  }
}

TEST(ElementwiseCuda, EmptyTensors) {
  SKIP_WITHOUT_GPU();
  Tensor x = Tensor::empty({0}, DType::f32, Device::cuda), y = Tensor::empty({0}, DType::f32, Device::cuda);
  ops::axpy(2.0f, x, y);
  ops::scale(x, 2.0f);
  ops::zero(x);
  EXPECT_EQ(ops::dot(x, y), 0.0);
  EXPECT_EQ(ops::sum_squares(x), 0.0);
}

TEST(ElementwiseCuda, BitwiseRepeatable) {
  SKIP_WITHOUT_GPU();
  const Shape shape = {3'000'017};
  const Tensor x = to_cuda(random_tensor(shape, 500)), y = to_cuda(random_tensor(shape, 501));
  const double dot_first = ops::dot(x, y), sq_first = ops::sum_squares(x);
  for (int run = 0; run < 3; ++run) {
    EXPECT_EQ(ops::dot(x, y), dot_first) << "run " << run;
    EXPECT_EQ(ops::sum_squares(x), sq_first) << "run " << run;
  }
  std::vector<float> results[2];
  for (int run = 0; run < 2; ++run) {
    Tensor z = to_cuda(random_tensor(shape, 502));
    ops::axpy(0.7f, x, z);
    ops::scale(z, -1.3f);
    results[run] = z.to_vector();
  }
  expect_bitwise(results[1], results[0], "axpy then scale, repeated");
}

}  // namespace
}  // namespace proplab
