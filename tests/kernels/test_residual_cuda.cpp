// CUDA-vs-CPU comparison of the residual combine op (kernels/residual.cu against the CPU reference), through the
// ops entry points on fresh random inputs. Skipped at run time when no GPU is present.
#include <gtest/gtest.h>

#include <algorithm>
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

constexpr double kRelTol = 1e-6;

// Odd sizes (not multiples of 4: the float4 tail), n = 1, sizes around a quad and a block, and one larger than a
// full grid pass (1024 blocks * 256 threads * 4) so the grid-stride loop runs several times.
const std::vector<Shape> kShapes = {{1}, {3}, {5}, {7}, {2, 3, 5}, {1023}, {4097}, {3, 17, 61}, {3'000'017}};

Tensor to_cuda(const Tensor& host) {
  Tensor device = Tensor::empty(host.shape(), DType::f32, Device::cuda);
  device.copy_from(host);
  return device;
}

// A CUDA tensor of `shape` whose data starts one float past a 16-byte boundary (a contiguous view of a larger
// buffer), holding the values of `host`: exercises the non-float4 path.
Tensor to_cuda_misaligned(const Tensor& host) {
  Tensor buffer = Tensor::empty({host.numel() + 1}, DType::f32, Device::cuda);
  Tensor view = buffer.slice(0, 1, host.numel()).reshape(host.shape());
  view.copy_from(host);
  return view;
}

// Elementwise |actual - expected| <= kRelTol * scale, scale[i] the magnitude the value is relative to.
void expect_close(const std::vector<float>& actual, const std::vector<float>& expected,
                  const std::vector<double>& scale, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  std::int64_t failures = 0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const double error = std::abs(static_cast<double>(actual[i]) - expected[i]);
    if (error > kRelTol * scale[i]) {
      if (++failures <= 5)
        ADD_FAILURE() << what << "[" << i << "]: cuda " << actual[i] << " vs cpu " << expected[i] << " (scale "
                      << scale[i] << ")";
    }
  }
  EXPECT_EQ(failures, 0) << what << ": " << failures << " of " << actual.size() << " elements differ";
}

std::vector<double> magnitudes(const std::vector<float>& values) {
  std::vector<double> out(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) out[i] = std::abs(static_cast<double>(values[i]));
  return out;
}

void expect_close_scalar(double actual, double expected, const std::string& what) {
  EXPECT_LE(std::abs(actual - expected), kRelTol * std::abs(expected))
      << what << ": cuda " << actual << " vs cpu " << expected;
}

struct Inputs {
  Tensor x, f, d_y;
};

// Fresh random inputs; distinct seeds because random_tensor's stream depends only on the shape.
Inputs make_inputs(const Shape& shape, std::uint64_t seed) {
  return {random_tensor(shape, seed), random_tensor(shape, seed + 1, 2.0, 0.5), random_tensor(shape, seed + 2)};
}

#define SKIP_WITHOUT_GPU() \
  if (!proplab::cuda_available()) GTEST_SKIP() << "no CUDA GPU: skipping CUDA-vs-CPU comparison"

TEST(ResidualCuda, ForwardMatchesCpu) {
  SKIP_WITHOUT_GPU();
  const float lambda = 0.83f;
  const float beta = -0.41f;
  std::uint64_t seed = 100;
  for (const Shape& shape : kShapes) {
    SCOPED_TRACE("shape " + shape_string(shape));
    Inputs in = make_inputs(shape, seed += 10);
    Tensor y_cpu = Tensor::empty(shape);
    ops::residual_forward(in.x, in.f, lambda, beta, y_cpu);

    Tensor y_cuda = Tensor::empty(shape, DType::f32, Device::cuda);
    ops::residual_forward(to_cuda(in.x), to_cuda(in.f), lambda, beta, y_cuda);

    // Relative to |lambda*x| + |beta*f|: a CPU build that fuses multiply-add may round the sum once less.
    const std::vector<float> x = in.x.to_vector();
    const std::vector<float> f = in.f.to_vector();
    std::vector<double> scale(x.size());
    for (std::size_t i = 0; i < x.size(); ++i)
      scale[i] = std::abs(lambda * double(x[i])) + std::abs(beta * double(f[i]));
    expect_close(y_cuda.to_vector(), y_cpu.to_vector(), scale, "y");
  }
}

TEST(ResidualCuda, BackwardMatchesCpuAndAccumulatesScalars) {
  SKIP_WITHOUT_GPU();
  const float lambda = 0.92f;
  const float beta = 0.27f;
  std::uint64_t seed = 200;
  for (const Shape& shape : kShapes) {
    SCOPED_TRACE("shape " + shape_string(shape));
    Inputs in = make_inputs(shape, seed += 10);
    // Nonzero starting values: d_lambda and d_beta accumulate.
    double d_lambda_cpu = 0.25, d_beta_cpu = -1.5;
    Tensor d_x_cpu = Tensor::empty(shape), d_f_cpu = Tensor::empty(shape);
    ops::residual_backward(in.x, in.f, in.d_y, lambda, beta, &d_x_cpu, &d_f_cpu, &d_lambda_cpu, &d_beta_cpu);

    double d_lambda_cuda = 0.25, d_beta_cuda = -1.5;
    Tensor d_x_cuda = Tensor::empty(shape, DType::f32, Device::cuda);
    Tensor d_f_cuda = Tensor::empty(shape, DType::f32, Device::cuda);
    ops::residual_backward(to_cuda(in.x), to_cuda(in.f), to_cuda(in.d_y), lambda, beta, &d_x_cuda, &d_f_cuda,
                           &d_lambda_cuda, &d_beta_cuda);

    const std::vector<float> expected_d_x = d_x_cpu.to_vector();
    const std::vector<float> expected_d_f = d_f_cpu.to_vector();
    expect_close(d_x_cuda.to_vector(), expected_d_x, magnitudes(expected_d_x), "d_x");
    expect_close(d_f_cuda.to_vector(), expected_d_f, magnitudes(expected_d_f), "d_f");
    expect_close_scalar(d_lambda_cuda, d_lambda_cpu, "d_lambda");
    expect_close_scalar(d_beta_cuda, d_beta_cpu, "d_beta");
    // The sums really were added to the starting values (not overwritten).
    EXPECT_NE(d_lambda_cuda, 0.25);
    EXPECT_NE(d_beta_cuda, -1.5);
  }
}

// The fused residual + ReLU (on a GPU the two kernels in turn) against the CPU's fused op; the backward gets the
// CPU's y on both sides, so the mask is the same.
TEST(ResidualCuda, ReluFusedMatchesCpu) {
  SKIP_WITHOUT_GPU();
  const float lambda = 0.83f, beta = -0.41f;
  std::uint64_t seed = 900;
  for (const Shape& shape : kShapes) {
    SCOPED_TRACE("shape " + shape_string(shape));
    Inputs in = make_inputs(shape, seed += 10);
    Tensor y_cpu = Tensor::empty(shape);
    ops::residual_relu_forward(in.x, in.f, lambda, beta, y_cpu);
    Tensor y_cuda = Tensor::empty(shape, DType::f32, Device::cuda);
    ops::residual_relu_forward(to_cuda(in.x), to_cuda(in.f), lambda, beta, y_cuda);
    const std::vector<float> x = in.x.to_vector(), f = in.f.to_vector();
    std::vector<double> scale(x.size());
    for (std::size_t i = 0; i < x.size(); ++i)
      scale[i] = std::abs(lambda * double(x[i])) + std::abs(beta * double(f[i]));
    expect_close(y_cuda.to_vector(), y_cpu.to_vector(), scale, "y");

    Tensor d_y_cpu = in.d_y.clone(), d_x_cpu = Tensor::empty(shape), d_f_cpu = Tensor::empty(shape);
    double d_lambda_cpu = 0.25, d_beta_cpu = -1.5;
    ops::residual_relu_backward(in.x, in.f, y_cpu, d_y_cpu, lambda, beta, &d_x_cpu, &d_f_cpu, &d_lambda_cpu,
                                &d_beta_cpu);
    Tensor d_y_cuda = to_cuda(in.d_y), d_x_cuda = Tensor::empty(shape, DType::f32, Device::cuda);
    Tensor d_f_cuda = Tensor::empty(shape, DType::f32, Device::cuda);
    double d_lambda_cuda = 0.25, d_beta_cuda = -1.5;
    ops::residual_relu_backward(to_cuda(in.x), to_cuda(in.f), to_cuda(y_cpu), d_y_cuda, lambda, beta, &d_x_cuda,
                                &d_f_cuda, &d_lambda_cuda, &d_beta_cuda);
    const std::vector<float> masked = d_y_cpu.to_vector(), expected_d_x = d_x_cpu.to_vector();
    const std::vector<float> expected_d_f = d_f_cpu.to_vector();
    expect_close(d_y_cuda.to_vector(), masked, magnitudes(masked), "d_y (masked)");
    expect_close(d_x_cuda.to_vector(), expected_d_x, magnitudes(expected_d_x), "d_x");
    expect_close(d_f_cuda.to_vector(), expected_d_f, magnitudes(expected_d_f), "d_f");
    expect_close_scalar(d_lambda_cuda, d_lambda_cpu, "d_lambda");
    expect_close_scalar(d_beta_cuda, d_beta_cpu, "d_beta");
  }
}

TEST(ResidualCuda, BackwardOptionalOutputsAndAliasing) {
  SKIP_WITHOUT_GPU();
  const float lambda = 1.1f;
  const float beta = 0.6f;
  const Shape shape = {5, 203};
  Inputs in = make_inputs(shape, 300);
  double d_lambda_cpu = 0.0, d_beta_cpu = 0.0;
  Tensor d_x_cpu = Tensor::empty(shape), d_f_cpu = Tensor::empty(shape);
  ops::residual_backward(in.x, in.f, in.d_y, lambda, beta, &d_x_cpu, &d_f_cpu, &d_lambda_cpu, &d_beta_cpu);
  const std::vector<float> expected_d_x = d_x_cpu.to_vector();
  const std::vector<float> expected_d_f = d_f_cpu.to_vector();
  Tensor x = to_cuda(in.x), f = to_cuda(in.f), d_y = to_cuda(in.d_y);

  {  // Scalars only.
    double d_lambda = 0.0, d_beta = 0.0;
    ops::residual_backward(x, f, d_y, lambda, beta, nullptr, nullptr, &d_lambda, nullptr);
    ops::residual_backward(x, f, d_y, lambda, beta, nullptr, nullptr, nullptr, &d_beta);
    expect_close_scalar(d_lambda, d_lambda_cpu, "d_lambda alone");
    expect_close_scalar(d_beta, d_beta_cpu, "d_beta alone");
  }
  {  // Activation gradients only.
    Tensor d_x = Tensor::empty(shape, DType::f32, Device::cuda);
    Tensor d_f = Tensor::empty(shape, DType::f32, Device::cuda);
    ops::residual_backward(x, f, d_y, lambda, beta, &d_x, nullptr, nullptr, nullptr);
    ops::residual_backward(x, f, d_y, lambda, beta, nullptr, &d_f, nullptr, nullptr);
    expect_close(d_x.to_vector(), expected_d_x, magnitudes(expected_d_x), "d_x alone");
    expect_close(d_f.to_vector(), expected_d_f, magnitudes(expected_d_f), "d_f alone");
  }
  {  // d_x aliasing d_y (allowed by the contract): d_f and the sums must still see the original d_y.
    Tensor d_y_in_place = to_cuda(in.d_y);
    Tensor d_f = Tensor::empty(shape, DType::f32, Device::cuda);
    double d_lambda = 0.0, d_beta = 0.0;
    ops::residual_backward(x, f, d_y_in_place, lambda, beta, &d_y_in_place, &d_f, &d_lambda, &d_beta);
    expect_close(d_y_in_place.to_vector(), expected_d_x, magnitudes(expected_d_x), "d_x aliasing d_y");
    expect_close(d_f.to_vector(), expected_d_f, magnitudes(expected_d_f), "d_f with d_x aliasing d_y");
    expect_close_scalar(d_lambda, d_lambda_cpu, "d_lambda with d_x aliasing d_y");
    expect_close_scalar(d_beta, d_beta_cpu, "d_beta with d_x aliasing d_y");
  }
}

TEST(ResidualCuda, MisalignedViewsMatchCpuAndAlignedSums) {
  SKIP_WITHOUT_GPU();
  const float lambda = 0.7f;
  const float beta = 1.3f;
  for (const Shape& shape : {Shape{7}, Shape{4099}, Shape{3'000'017}}) {
    SCOPED_TRACE("shape " + shape_string(shape));
    Inputs in = make_inputs(shape, 400 + shape[0]);
    Tensor y_cpu = Tensor::empty(shape);
    ops::residual_forward(in.x, in.f, lambda, beta, y_cpu);
    double d_lambda_cpu = 0.0, d_beta_cpu = 0.0;
    Tensor d_x_cpu = Tensor::empty(shape), d_f_cpu = Tensor::empty(shape);
    ops::residual_backward(in.x, in.f, in.d_y, lambda, beta, &d_x_cpu, &d_f_cpu, &d_lambda_cpu, &d_beta_cpu);

    Tensor x = to_cuda_misaligned(in.x), f = to_cuda_misaligned(in.f), d_y = to_cuda_misaligned(in.d_y);
    Tensor y = to_cuda_misaligned(in.x);
    ops::residual_forward(x, f, lambda, beta, y);
    const std::vector<float> xs = in.x.to_vector();
    const std::vector<float> fs = in.f.to_vector();
    std::vector<double> scale(xs.size());
    for (std::size_t i = 0; i < xs.size(); ++i)
      scale[i] = std::abs(lambda * double(xs[i])) + std::abs(beta * double(fs[i]));
    expect_close(y.to_vector(), y_cpu.to_vector(), scale, "y (misaligned)");

    Tensor d_x = to_cuda_misaligned(in.x), d_f = to_cuda_misaligned(in.f);
    double d_lambda = 0.0, d_beta = 0.0;
    ops::residual_backward(x, f, d_y, lambda, beta, &d_x, &d_f, &d_lambda, &d_beta);
    const std::vector<float> expected_d_x = d_x_cpu.to_vector();
    const std::vector<float> expected_d_f = d_f_cpu.to_vector();
    expect_close(d_x.to_vector(), expected_d_x, magnitudes(expected_d_x), "d_x (misaligned)");
    expect_close(d_f.to_vector(), expected_d_f, magnitudes(expected_d_f), "d_f (misaligned)");
    expect_close_scalar(d_lambda, d_lambda_cpu, "d_lambda (misaligned)");
    expect_close_scalar(d_beta, d_beta_cpu, "d_beta (misaligned)");

    // The scalar and float4 paths sum in the same order: bitwise the same sums as from aligned copies.
    double d_lambda_aligned = 0.0, d_beta_aligned = 0.0;
    ops::residual_backward(to_cuda(in.x), to_cuda(in.f), to_cuda(in.d_y), lambda, beta, nullptr, nullptr,
                           &d_lambda_aligned, &d_beta_aligned);
    EXPECT_EQ(d_lambda, d_lambda_aligned);
    EXPECT_EQ(d_beta, d_beta_aligned);
  }
}

TEST(ResidualCuda, BackwardSumsAreBitwiseRepeatable) {
  SKIP_WITHOUT_GPU();
  const Shape shape = {3'000'017};
  Inputs in = make_inputs(shape, 500);
  Tensor x = to_cuda(in.x), f = to_cuda(in.f), d_y = to_cuda(in.d_y);
  double d_lambda_first = 0.0, d_beta_first = 0.0;
  ops::residual_backward(x, f, d_y, 0.9f, 0.1f, nullptr, nullptr, &d_lambda_first, &d_beta_first);
  ASSERT_NE(d_lambda_first, 0.0);
  for (int run = 0; run < 3; ++run) {
    double d_lambda = 0.0, d_beta = 0.0;
    ops::residual_backward(x, f, d_y, 0.9f, 0.1f, nullptr, nullptr, &d_lambda, &d_beta);
    EXPECT_EQ(d_lambda, d_lambda_first) << "run " << run;
    EXPECT_EQ(d_beta, d_beta_first) << "run " << run;
  }
}

}  // namespace
}  // namespace proplab
