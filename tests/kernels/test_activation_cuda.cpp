// CUDA-vs-CPU comparison of the pointwise activations (kernels/activation.cu against the CPU reference in
// src/ops/activation.cpp), through the ops entry points, for every Activation kind, forward and backward. Skipped
// at run time when no GPU is present.
//
// Tolerances: both sides evaluate the same approximations term for term; only multiply-add contraction may differ
// between the compilers, a few float ulps. Forward: |cuda − cpu| <= 1e-5 (|cpu| + 1e-30) (the floor only admits
// values below the float normal range in the far tails). Backward: <= 1e-5 |cpu| + 1e-6 |d_y|, the second term
// for the derivatives' cancellation (Φ(x) + xφ(x) near x ≈ −0.75, 1 − tanh² in the tails), whose terms are at
// most ~1.2 |d_y|. identity and relu are exact (bitwise) and checked bitwise. NaN must stay NaN, ±inf exact.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "ops/ops.h"
#include "spec/model.h"
#include "support/gradcheck.h"

namespace proplab {
namespace {

using testing::random_tensor;

constexpr double kRelTol = 1e-5;
constexpr double kForwardFloor = 1e-30;
constexpr double kBackwardAbsTol = 1e-6;

const std::vector<Activation> kKinds = {Activation::identity, Activation::relu, Activation::tanh, Activation::gelu_tanh,
                                        Activation::gelu_erf};

// Odd sizes, sizes around a block, and one larger than a full grid pass (1024 blocks · 256 threads).
const std::vector<Shape> kShapes = {{1}, {7}, {1023}, {4097}, {3, 17, 61}, {3'000'017}};

#define SKIP_WITHOUT_GPU() \
  if (!proplab::cuda_available()) GTEST_SKIP() << "no CUDA GPU: skipping CUDA-vs-CPU comparison"

Tensor to_cuda(const Tensor& host) {
  Tensor device = Tensor::empty(host.shape(), DType::f32, Device::cuda);
  device.copy_from(host);
  return device;
}

std::string kind_name(Activation kind) { return activation_name(kind); }

bool exact_kind(Activation kind) { return kind == Activation::identity || kind == Activation::relu; }

// The branches and clamps of the approximations: signed zeros, tiny values, the tanh polynomial switch (0.625),
// the normal tail clamp (14), the gelu_tanh_grad clamp (20), the exp range ends (±87, ±88), overflow, ±inf, NaN.
Tensor special_values() {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> values = {0.0f,    -0.0f,  1e-30f,  -1e-30f, 1e-6f,  -1e-6f, 0.3f,         -0.3f,  0.625f,
                                     -0.625f, 0.626f, -0.626f, 0.75f,   -0.75f, 1.0f,   -1.0f,        3.0f,   -3.0f,
                                     9.0f,    -9.0f,  9.9f,    -9.9f,   14.0f,  -14.0f, 15.0f,        -15.0f, 20.0f,
                                     -20.0f,  30.0f,  -30.0f,  43.9f,   -43.9f, 44.1f,  -44.1f,       87.0f,  -87.0f,
                                     88.5f,   -88.5f, 1e10f,   -1e10f,  inf,    -inf,   std::nanf("")};
  return Tensor::from_vector({static_cast<std::int64_t>(values.size())}, values);
}

bool same_bits(float a, float b) { return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b); }

// Elementwise: bitwise for the exact kinds; otherwise NaN ↔ NaN, inf exact, finite within tol_rel |e| + abs[i].
void expect_matches(Activation kind, const std::vector<float>& actual, const std::vector<float>& expected,
                    const std::vector<double>& abs_tol, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  std::int64_t failures = 0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const float a = actual[i], e = expected[i];
    bool ok;
    if (exact_kind(kind))
      ok = same_bits(a, e);
    else if (std::isnan(e))
      ok = std::isnan(a);
    else if (std::isinf(e))
      ok = a == e;
    else
      ok = std::isfinite(a) && std::abs(static_cast<double>(a) - e) <= kRelTol * std::abs(double(e)) + abs_tol[i];
    if (!ok && ++failures <= 5)
      ADD_FAILURE() << what << "[" << i << "]: cuda " << a << " vs cpu " << e << " (absolute allowance " << abs_tol[i]
                    << ")";
  }
  EXPECT_EQ(failures, 0) << what << ": " << failures << " of " << actual.size() << " elements differ";
}

void check_forward(Activation kind, const Tensor& x, const std::string& what) {
  Tensor y = Tensor::empty(x.shape());
  ops::activation_forward(kind, x, y);
  Tensor y_cuda = to_cuda(random_tensor(x.shape(), 77));  // overwritten
  ops::activation_forward(kind, to_cuda(x), y_cuda);
  const std::vector<double> floor(static_cast<std::size_t>(x.numel()), kRelTol * kForwardFloor);
  expect_matches(kind, y_cuda.to_vector(), y.to_vector(), floor, what + " forward " + kind_name(kind));
}

std::vector<double> backward_allowance(const Tensor& d_y) {
  std::vector<double> out;
  for (float g : d_y.to_vector()) out.push_back(kBackwardAbsTol * std::abs(static_cast<double>(g)));
  return out;
}

void check_backward(Activation kind, const Tensor& x, const Tensor& d_y, const std::string& what) {
  Tensor d_x = Tensor::empty(x.shape());
  ops::activation_backward(kind, x, d_y, d_x);
  Tensor d_x_cuda = to_cuda(random_tensor(x.shape(), 78));  // overwritten
  ops::activation_backward(kind, to_cuda(x), to_cuda(d_y), d_x_cuda);
  expect_matches(kind, d_x_cuda.to_vector(), d_x.to_vector(), backward_allowance(d_y),
                 what + " backward " + kind_name(kind));
}

TEST(ActivationCuda, ForwardAndBackwardMatchCpu) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 100;
  for (const Shape& shape : kShapes) {
    // std 3 reaches the tails where the approximations switch branches.
    const Tensor x = random_tensor(shape, seed += 10, 3.0);
    const Tensor d_y = random_tensor(shape, seed + 1);
    for (Activation kind : kKinds) {
      check_forward(kind, x, "shape " + shape_string(shape));
      check_backward(kind, x, d_y, "shape " + shape_string(shape));
    }
  }
}

TEST(ActivationCuda, SpecialValuesMatchCpu) {
  SKIP_WITHOUT_GPU();
  const Tensor x = special_values();
  const Tensor d_y = random_tensor(x.shape(), 200, 1.0, 0.5);
  for (Activation kind : kKinds) {
    check_forward(kind, x, "special values");
    check_backward(kind, x, d_y, "special values");
  }
}

// y aliasing x and d_x aliasing d_y (both allowed): the same values as from separate buffers.
TEST(ActivationCuda, InPlaceMatchesCpu) {
  SKIP_WITHOUT_GPU();
  const Shape shape = {5, 1001};
  const Tensor x = random_tensor(shape, 300, 2.0), d_y = random_tensor(shape, 301);
  for (Activation kind : kKinds) {
    Tensor y = Tensor::empty(shape), d_x = Tensor::empty(shape);
    ops::activation_forward(kind, x, y);
    ops::activation_backward(kind, x, d_y, d_x);

    Tensor in_place = to_cuda(x);
    ops::activation_forward(kind, in_place, in_place);
    const std::vector<double> floor(static_cast<std::size_t>(x.numel()), kRelTol * kForwardFloor);
    expect_matches(kind, in_place.to_vector(), y.to_vector(), floor, "y aliasing x, " + kind_name(kind));

    Tensor grad_in_place = to_cuda(d_y);
    ops::activation_backward(kind, to_cuda(x), grad_in_place, grad_in_place);
    expect_matches(kind, grad_in_place.to_vector(), d_x.to_vector(), backward_allowance(d_y),
                   "d_x aliasing d_y, " + kind_name(kind));
  }
}

TEST(ActivationCuda, BitwiseRepeatable) {
  SKIP_WITHOUT_GPU();
  const Shape shape = {3'000'017};
  const Tensor x = to_cuda(random_tensor(shape, 400, 3.0)), d_y = to_cuda(random_tensor(shape, 401));
  for (Activation kind : kKinds) {
    std::vector<float> y[2], d_x[2];
    for (int run = 0; run < 2; ++run) {
      Tensor y_cuda = Tensor::empty(shape, DType::f32, Device::cuda);
      Tensor d_x_cuda = Tensor::empty(shape, DType::f32, Device::cuda);
      ops::activation_forward(kind, x, y_cuda);
      ops::activation_backward(kind, x, d_y, d_x_cuda);
      y[run] = y_cuda.to_vector();
      d_x[run] = d_x_cuda.to_vector();
    }
    std::int64_t differing = 0;
    for (std::size_t i = 0; i < y[0].size(); ++i)
      differing += !same_bits(y[0][i], y[1][i]) + !same_bits(d_x[0][i], d_x[1][i]);
    EXPECT_EQ(differing, 0) << kind_name(kind) << ": repeated runs differ in their bits";
  }
}

}  // namespace
}  // namespace proplab
