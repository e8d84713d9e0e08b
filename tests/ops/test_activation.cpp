#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "ops/ops.h"
#include "ops_testing.h"
#include "support/gradcheck.h"
#include "support/moments_equal.h"

namespace proplab {
namespace {

using testing::check_gradient;
using testing::project;
using testing::projection_weights;
using testing::random_tensor;

constexpr Activation kAll[] = {Activation::identity, Activation::relu, Activation::tanh, Activation::gelu_tanh,
                               Activation::gelu_erf};

std::string name(Activation kind) {
  switch (kind) {
    case Activation::identity:
      return "identity";
    case Activation::relu:
      return "relu";
    case Activation::tanh:
      return "tanh";
    case Activation::gelu_tanh:
      return "gelu_tanh";
    case Activation::gelu_erf:
      return "gelu_erf";
  }
  return "?";
}

constexpr double kPi = 3.141592653589793;

double naive_value(Activation kind, double x) {
  switch (kind) {
    case Activation::identity:
      return x;
    case Activation::relu:
      return x > 0 ? x : 0.0;
    case Activation::tanh:
      return std::tanh(x);
    case Activation::gelu_tanh:
      // x/2 (1 + tanh u) written as x σ(2u): in the negative tail 1 + tanh u cancels to 0 even in double.
      return x / (1.0 + std::exp(-2.0 * std::sqrt(2.0 / kPi) * (x + 0.044715 * x * x * x)));
    case Activation::gelu_erf:
      return 0.5 * x * std::erfc(-x / std::sqrt(2.0));
  }
  return 0.0;
}

double naive_derivative(Activation kind, double x) {
  switch (kind) {
    case Activation::identity:
      return 1.0;
    case Activation::relu:
      return x > 0 ? 1.0 : 0.0;
    case Activation::tanh:
      return 1.0 - std::tanh(x) * std::tanh(x);
    case Activation::gelu_tanh: {
      const double k = std::sqrt(2.0 / kPi);
      const double t = std::tanh(k * (x + 0.044715 * x * x * x));
      return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * x * x);
    }
    case Activation::gelu_erf:
      return 0.5 * std::erfc(-x / std::sqrt(2.0)) + x * std::exp(-0.5 * x * x) / std::sqrt(2.0 * kPi);
  }
  return 0.0;
}

// Inputs across the whole range: tails, the polynomial/exponential switch points, tiny magnitudes, and zero.
Tensor sweep_inputs() {
  std::vector<float> values;
  for (int i = -6000; i <= 6000; ++i) values.push_back(static_cast<float>(i) * 0.0025f);  // [-15, 15]
  for (float tiny = 1e-8f; tiny < 1.0f; tiny *= 1.7f) {
    values.push_back(tiny);
    values.push_back(-tiny);
  }
  for (float v : {0.625f, -0.625f, 0.62499f, 0.62501f, 40.0f, -40.0f, 1e4f, -1e4f, 1e20f, -1e20f}) values.push_back(v);
  return Tensor::from_vector({static_cast<std::int64_t>(values.size())}, values);
}

TEST(Activation, ForwardAndDerivativeMatchNaiveDouble) {
  Tensor x = sweep_inputs();
  Tensor y = Tensor::empty(x.shape()), ones = Tensor::empty(x.shape()), d_x = Tensor::empty(x.shape());
  ones.fill(1.0f);
  for (Activation kind : kAll) {
    ops::activation_forward(kind, x, y);
    ops::activation_backward(kind, x, ones, d_x);
    std::vector<double> values, derivatives;
    for (float v : x.to_vector()) {
      values.push_back(naive_value(kind, v));
      derivatives.push_back(naive_derivative(kind, v));
    }
    // About two float ulps relative. In gelu_tanh's negative tail, y = x σ(2u) ≈ x e^(2u), so the float rounding
    // of u = √(2/π)(x + 0.044715 x³) is amplified by |2u|; the tolerance scales with that condition number.
    const std::vector<float> xs = x.to_vector(), ys = y.to_vector();
    int reported = 0;
    for (std::size_t i = 0; i < xs.size(); ++i) {
      const double u = std::sqrt(2.0 / kPi) * (xs[i] + 0.044715 * xs[i] * xs[i] * xs[i]);
      const double condition = kind == Activation::gelu_tanh && u < 0.0 ? std::max(1.0, -2.0 * u) : 1.0;
      const double error = std::fabs(ys[i] - values[i]);
      if (!(error <= 1e-37 + 5e-7 * condition * std::fabs(values[i])) && reported++ < 5)
        ADD_FAILURE() << name(kind) << "(" << xs[i] << ") = " << ys[i] << ", expected " << values[i];
    }
    testing::expect_all_close(d_x, derivatives, 1e-6, 2e-6, name(kind) + " derivative");
  }
}

TEST(Activation, GradientsByFiniteDifferences) {
  for (Activation kind : kAll) {
    Tensor x = random_tensor({8, 12}, 1, 1.5);
    Tensor y = Tensor::empty(x.shape());
    auto loss = [&] {
      ops::activation_forward(kind, x, y);
      return project(y, 2);
    };
    Tensor d_y = projection_weights(x.shape(), 2), d_x = Tensor::empty(x.shape());
    ops::activation_backward(kind, x, d_y, d_x);
    EXPECT_GRAD_OK(check_gradient(loss, x, d_x)) << name(kind);
  }
}

TEST(Activation, ReluKinksAreSkippedNotFailed) {
  Tensor x = random_tensor({64}, 3);
  // Three inputs closer to 0 than the finite-difference step: the checker must detect and skip these kinks.
  x.f32()[5] = 1.5e-3f;
  x.f32()[20] = -2e-3f;
  x.f32()[41] = 1e-4f;
  Tensor y = Tensor::empty(x.shape());
  auto loss = [&] {
    ops::activation_forward(Activation::relu, x, y);
    return project(y, 4);
  };
  Tensor d_y = projection_weights(x.shape(), 4), d_x = Tensor::empty(x.shape());
  ops::activation_backward(Activation::relu, x, d_y, d_x);
  const testing::GradCheckResult result = check_gradient(loss, x, d_x);
  EXPECT_GRAD_OK(result);
  EXPECT_GE(result.kinks, 3);
  EXPECT_EQ(d_x.f32()[20], 0.0f);
  EXPECT_EQ(d_x.f32()[41], d_y.f32()[41]);
}

TEST(Activation, BackwardOverwritesAndMayAliasGradient) {
  Tensor x = random_tensor({50000}, 5), d_y = random_tensor({50000}, 6);
  for (Activation kind : kAll) {
    Tensor d_x = random_tensor(x.shape(), 7);
    ops::activation_backward(kind, x, d_y, d_x);
    Tensor again = d_x.clone();
    ops::activation_backward(kind, x, d_y, again);
    EXPECT_TRUE(testing::bitwise_equal(d_x, again)) << name(kind) << ": d_x must be overwritten";
    Tensor shared = d_y.clone();
    ops::activation_backward(kind, x, shared, shared);
    EXPECT_TRUE(testing::bitwise_equal(shared, d_x)) << name(kind) << ": d_x aliasing d_y";
  }
}

// Statistics gathered inside the op (ops::OpMoments) are bitwise probe::accumulate of the finished tensors, and the
// op's result is bitwise the same with and without them: every activation, forward and backward (d_x apart from d_y
// and aliasing it), with 1 and 2 threads, on shapes split into whole sequences ([8, 128, 256]), into pieces of
// sequences ([4, 128, 1024]) and under the parallel threshold; a selection the op does not take in chunks
// (layout-free statistics over 2000 features) is summed after the op, and so are sums already holding a tensor.
TEST(Activation, GatheredMomentsAreBitwiseAccumulateOfTheResult) {
  struct Case {
    std::int64_t sequences, tokens, features;
    probe::StatSelection input_stats, output_stats;
  };
  const probe::StatSelection all = probe::StatSelection::all();
  const probe::StatSelection layout_free = probe::StatSelection::parse({"mean", "kurtosis", "max_abs"});
  const std::vector<Case> cases = {{8, 128, 256, all, all},
                                   {4, 128, 1024, all, probe::StatSelection::parse({"corr", "nonfinite"})},
                                   {3, 5, 7, all, all},
                                   {2, 16, 2000, layout_free, all}};
  std::uint64_t seed = 40;
  for (const Case& c : cases) {
    const Shape shape{c.sequences * c.tokens, c.features};
    const Tensor x = random_tensor(shape, seed++), d_y = random_tensor(shape, seed++);
    for (Activation kind : kAll) {
      for (int threads : {1, 2}) {
        testing::ScopedThreads scoped(threads);
        const std::string what = name(kind) + " [" + std::to_string(c.sequences) + ", " + std::to_string(c.tokens) +
                                 ", " + std::to_string(c.features) + "] threads " + std::to_string(threads);
        for (bool prefilled : {false, true}) {
          // Forward: the statistics of x and y.
          Tensor y = Tensor::empty(shape, DType::f32), y_plain = Tensor::empty(shape, DType::f32);
          probe::MomentSums x_sums, y_sums, x_expected, y_expected;
          if (prefilled) {
            for (probe::MomentSums* sums : {&x_sums, &x_expected})
              probe::accumulate(d_y, c.sequences, *sums, c.input_stats);
            for (probe::MomentSums* sums : {&y_sums, &y_expected})
              probe::accumulate(x, c.sequences, *sums, c.output_stats);
          }
          ops::OpMoments moments{&x_sums, c.input_stats, &y_sums, c.output_stats, c.sequences};
          ops::activation_forward(kind, x, y, &moments);
          ops::activation_forward(kind, x, y_plain);
          EXPECT_TRUE(testing::bitwise_equal(y, y_plain)) << what << ": forward result";
          probe::accumulate(x, c.sequences, x_expected, c.input_stats);
          probe::accumulate(y_plain, c.sequences, y_expected, c.output_stats);
          probe::expect_bitwise_equal(x_sums, x_expected, what + " forward input");
          probe::expect_bitwise_equal(y_sums, y_expected, what + " forward output");
        }
        for (bool aliased : {false, true}) {
          // Backward: the statistics of d_y and d_x.
          Tensor d_plain = Tensor::empty(shape, DType::f32);
          ops::activation_backward(kind, x, d_y, d_plain);
          Tensor d_in = aliased ? d_y.clone() : Tensor::empty(shape, DType::f32);
          const Tensor d_out = aliased ? d_in : d_y;
          probe::MomentSums d_y_sums, d_x_sums, d_y_expected, d_x_expected;
          ops::OpMoments moments{&d_y_sums, c.input_stats, &d_x_sums, c.output_stats, c.sequences};
          ops::activation_backward(kind, x, d_out, d_in, &moments);
          EXPECT_TRUE(testing::bitwise_equal(d_in, d_plain)) << what << ": backward result, aliased " << aliased;
          probe::accumulate(d_y, c.sequences, d_y_expected, c.input_stats);
          probe::accumulate(d_plain, c.sequences, d_x_expected, c.output_stats);
          probe::expect_bitwise_equal(d_y_sums, d_y_expected, what + " backward input");
          probe::expect_bitwise_equal(d_x_sums, d_x_expected, what + " backward output");
        }
      }
    }
  }
}

TEST(Activation, NanPropagatesThroughForwardAndBackward) {
  // A diverging run must show up as NaN, not be masked by the approximations' clamps.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor x = Tensor::from_vector({3}, {nan, 1.0f, nan}), ones = Tensor::from_vector({3}, {1.0f, 1.0f, 1.0f});
  Tensor y = Tensor::empty({3}), d_x = Tensor::empty({3});
  for (Activation kind : kAll) {
    ops::activation_forward(kind, x, y);
    ops::activation_backward(kind, x, ones, d_x);
    EXPECT_TRUE(std::isnan(y.f32()[0]) && std::isnan(y.f32()[2])) << name(kind) << " forward";
    EXPECT_FALSE(std::isnan(y.f32()[1])) << name(kind);
    // identity passes d_y through and relu's derivative at NaN is 0 (the forward NaN already poisons the loss).
    if (kind != Activation::identity && kind != Activation::relu) {
      EXPECT_TRUE(std::isnan(d_x.f32()[0]) && std::isnan(d_x.f32()[2])) << name(kind) << " backward";
    }
  }
}

TEST(Activation, ShapeMismatchIsAnInternalError) {
  Tensor x = random_tensor({4, 5}, 8), y = Tensor::empty({5, 4});
  EXPECT_THROW(ops::activation_forward(Activation::gelu_tanh, x, y), InternalError);
}

}  // namespace
}  // namespace proplab
