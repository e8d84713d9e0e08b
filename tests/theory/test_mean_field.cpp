// theory/mean_field: the q and c maps, fixed points, χ₁, phases and critical weight variances against known
// values (ReLU/He, the tanh edge of chaos), against their own consistency relations, and against Monte Carlo of
// finite-width deep MLPs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <optional>
#include <vector>

#include "core/error.h"
#include "theory/mean_field.h"
#include "theory_mc.h"

namespace proplab::theory {
namespace {

using testing::NormalStream;

TEST(MeanField, ReluHeCorrelationSequence) {
  // c' = (√(1-c²) + (π - arccos c)c)/π from c₀ = 0: 1/π, 0.4937, 0.6048.
  const MeanField he(Activation::relu, 2.0, 0.0);
  const std::vector<MeanFieldLayer> layers = he.propagate(1.0, 0.0, 3);
  ASSERT_EQ(layers.size(), 4u);
  EXPECT_NEAR(layers[1].c, 0.3183, 1e-4);
  EXPECT_NEAR(layers[2].c, 0.4937, 1e-4);
  EXPECT_NEAR(layers[3].c, 0.6048, 1e-4);
  double c = 0.0;
  for (int l = 1; l <= 3; ++l) {
    c = (std::sqrt(1.0 - c * c) + (std::numbers::pi - std::acos(c)) * c) / std::numbers::pi;
    EXPECT_NEAR(layers[l].c, c, 1e-15) << "layer " << l;
  }
}

TEST(MeanField, ReluHePreservesQExactly) {
  const MeanField he(Activation::relu, 2.0, 0.0);
  for (double q0 : {0.3, 1.0, 7.25}) {
    for (const MeanFieldLayer& layer : he.propagate(q0, 0.5, 20)) EXPECT_EQ(layer.q, q0);
    EXPECT_EQ(*he.fixed_point(q0), q0);  // every q is a fixed point
  }
  EXPECT_EQ(he.chi1(3.0), 1.0);
  EXPECT_EQ(he.phase(), Phase::critical);
}

TEST(MeanField, TanhEdgeOfChaosWithoutBias) {
  // σ_b² = 0: q* = 0 is the fixed point and χ₁ = σ_w²·tanh'(0)² = σ_w², so σ_w² = 1 is critical. The q map
  // approaches 0 only like 1/(2l) there; the fixed point solver must still land on it.
  const MeanField net(Activation::tanh, 1.0, 0.0);
  const std::optional<double> q_star = net.fixed_point();
  ASSERT_TRUE(q_star.has_value());
  EXPECT_LT(*q_star, 1e-12);
  EXPECT_NEAR(net.chi1(*q_star), 1.0, 1e-12);
  EXPECT_NEAR(net.chi1_at_fixed_point(), 1.0, 1e-12);
  EXPECT_EQ(net.phase(), Phase::critical);
  EXPECT_NEAR(critical_weight_var(Activation::tanh, 0.0), 1.0, 1e-9);
}

TEST(MeanField, TanhCriticalPointWithBias) {
  // Poole et al. / Schoenholz et al.: σ_b² = 0.05 puts the edge of chaos at σ_w² ≈ 1.76 with q* ≈ 0.57.
  const double critical = critical_weight_var(Activation::tanh, 0.05);
  EXPECT_NEAR(critical, 1.76, 0.01);
  const MeanField net(Activation::tanh, critical, 0.05);
  const std::optional<double> q_star = net.fixed_point();
  ASSERT_TRUE(q_star.has_value());
  EXPECT_NEAR(*q_star, 0.57, 0.01);
  EXPECT_NEAR(net.q_map(*q_star), *q_star, 1e-12 * *q_star);
  EXPECT_NEAR(net.chi1(*q_star), 1.0, 1e-9);
  EXPECT_EQ(net.phase(), Phase::critical);
  EXPECT_EQ(MeanField(Activation::tanh, 1.5, 0.05).phase(), Phase::ordered);
  EXPECT_EQ(MeanField(Activation::tanh, 2.5, 0.05).phase(), Phase::chaotic);
}

TEST(MeanField, ChiOneIsTheSlopeOfTheCorrelationMapAtOne) {
  // Schoenholz et al.: ∂c'/∂c at c = 1 equals χ₁ at the fixed point (Price's theorem).
  for (const MeanField& net : {MeanField(Activation::tanh, 1.76, 0.05), MeanField(Activation::tanh, 2.5, 0.3),
                               MeanField(Activation::gelu_erf, 2.0, 0.1), MeanField(Activation::relu, 1.5, 0.2)}) {
    SCOPED_TRACE(std::string(activation_name(net.activation())) + " σ_w² " + std::to_string(net.weight_var()));
    const std::optional<double> q_star = net.fixed_point();
    ASSERT_TRUE(q_star.has_value());
    EXPECT_NEAR(net.c_map(*q_star, 1.0), 1.0, 1e-9);
    const double step = 1e-6;
    const double slope = (net.c_map(*q_star, 1.0) - net.c_map(*q_star, 1.0 - step)) / step;
    EXPECT_NEAR(slope, net.chi1(*q_star), 2e-3 * net.chi1(*q_star));
  }
}

TEST(MeanField, CriticalWeightVariances) {
  EXPECT_NEAR(critical_weight_var(Activation::relu, 0.0), 2.0, 1e-10);
  EXPECT_NEAR(critical_weight_var(Activation::identity, 0.0), 1.0, 1e-10);
  // ReLU with a bias: below σ_w² = 2 q settles (χ₁ = σ_w²/2 < 1), above it diverges (chaotic growth).
  EXPECT_EQ(MeanField(Activation::relu, 1.5, 0.1).phase(), Phase::ordered);
  EXPECT_FALSE(MeanField(Activation::relu, 2.5, 0.1).fixed_point().has_value());
  EXPECT_EQ(MeanField(Activation::relu, 2.5, 0.1).phase(), Phase::chaotic);
  EXPECT_EQ(critical_point(Activation::relu, 0.1).q_star, std::numeric_limits<double>::infinity());
}

TEST(MeanField, CriticalPointsOnTheEdgeOfChaos) {
  // tanh, σ_b² = 0.05: the same point as the phase scan, and it attracts.
  const CriticalPoint tanh_point = critical_point(Activation::tanh, 0.05);
  EXPECT_NEAR(tanh_point.weight_var, 1.76, 0.01);
  EXPECT_NEAR(tanh_point.q_star, 0.57, 0.01);
  EXPECT_LT(tanh_point.q_map_slope, 1.0);
  const MeanField tanh_net(Activation::tanh, tanh_point.weight_var, 0.05);
  EXPECT_NEAR(tanh_net.q_map(tanh_point.q_star), tanh_point.q_star, 1e-12);
  EXPECT_NEAR(*tanh_net.fixed_point(), tanh_point.q_star, 1e-9);
  // GELU: E[φ'²] runs from 1/4 (q -> 0) to about 1/2, so σ_w² = 4 at σ_b² = 0. For small σ_b² > 0 the fixed point
  // with χ₁ = 1 repels (iterating from q* + 1% leaves it); for σ_b² = 0.3 it attracts.
  const CriticalPoint gelu_zero = critical_point(Activation::gelu_erf, 0.0);
  EXPECT_NEAR(gelu_zero.weight_var, 4.0, 1e-12);
  EXPECT_EQ(gelu_zero.q_star, 0.0);
  for (double bias_var : {0.02, 0.05, 0.3}) {
    SCOPED_TRACE("σ_b² " + std::to_string(bias_var));
    const CriticalPoint point = critical_point(Activation::gelu_erf, bias_var);
    const MeanField net(Activation::gelu_erf, point.weight_var, bias_var);
    EXPECT_GT(point.weight_var, 1.9);
    EXPECT_LT(point.weight_var, 4.0);
    EXPECT_NEAR(net.chi1(point.q_star), 1.0, 1e-9);
    EXPECT_NEAR(net.q_map(point.q_star), point.q_star, 1e-10 * point.q_star);
    double q = 1.01 * point.q_star;
    for (int l = 0; l < 2000 && q < 100.0 * point.q_star; ++l) q = net.q_map(q);
    if (bias_var < 0.1) {
      EXPECT_GT(point.q_map_slope, 1.0);
      EXPECT_GT(q, 2.0 * point.q_star);
    } else {
      EXPECT_LT(point.q_map_slope, 1.0);
      EXPECT_NEAR(q, point.q_star, 1e-3 * point.q_star);
    }
  }
}

TEST(MeanField, LinearMapsAreAffine) {
  const MeanField net(Activation::identity, 0.8, 0.3);
  EXPECT_DOUBLE_EQ(net.q_map(2.0), 0.8 * 2.0 + 0.3);
  EXPECT_DOUBLE_EQ(net.c_map(2.0, 0.4), (0.8 * 2.0 * 0.4 + 0.3) / (0.8 * 2.0 + 0.3));
  EXPECT_NEAR(*net.fixed_point(), 0.3 / (1.0 - 0.8), 1e-12);
  EXPECT_EQ(net.chi1(5.0), 0.8);
  EXPECT_EQ(net.phase(), Phase::ordered);
}

TEST(MeanField, RejectsBadArguments) {
  EXPECT_THROW(MeanField(Activation::tanh, 0.0, 0.1), InternalError);
  EXPECT_THROW(MeanField(Activation::tanh, 1.0, -0.1), InternalError);
  EXPECT_THROW(MeanField(Activation::tanh, 1.0, 0.1).q_map(-1.0), InternalError);
  EXPECT_THROW(MeanField(Activation::tanh, 1.0, 0.1).c_map(1.0, 1.5), InternalError);
}

// Per-layer q and c measured on finite-width networks: their mean over networks and its standard error.
struct MeasuredLayer {
  double q = 0.0, q_se = 0.0;
  double c = 0.0, c_se = 0.0;
};

// `networks` random networks h' = W φ(h) + b of width `width` and `depth` layers, each fed `pairs` input pairs
// (Gaussian pre-activations of length q0 and correlation c0). Per network and layer: q = mean of |h|²/width over
// the inputs, c = mean over the pairs of h_a·h_b/(|h_a||h_b|). The inputs of one network share its weights (and,
// after a ReLU, a common mean), so networks, not inputs, are the independent samples.
std::vector<MeasuredLayer> simulate_mlp(const MeanField& net, double q0, double c0, int depth, int width, int pairs,
                                        int networks, std::uint64_t stream) {
  NormalStream normals(31, stream);
  std::vector<MeasuredLayer> sums(static_cast<std::size_t>(depth) + 1), sums_sq(sums.size());
  std::vector<double> h, act, next;
  const double rest = std::sqrt(1.0 - c0 * c0);
  for (int n = 0; n < networks; ++n) {
    // h [2·pairs, width]: row 2i is input a of pair i, row 2i+1 input b.
    h.assign(static_cast<std::size_t>(2 * pairs) * width, 0.0);
    for (int i = 0; i < pairs; ++i) {
      for (int f = 0; f < width; ++f) {
        const double z1 = normals.normal(), z2 = normals.normal();
        h[static_cast<std::size_t>(2 * i) * width + f] = std::sqrt(q0) * z1;
        h[static_cast<std::size_t>(2 * i + 1) * width + f] = std::sqrt(q0) * (c0 * z1 + rest * z2);
      }
    }
    for (int layer = 0; layer <= depth; ++layer) {
      double q = 0.0, c = 0.0;
      for (int i = 0; i < pairs; ++i) {
        const double* a = &h[static_cast<std::size_t>(2 * i) * width];
        const double* b = a + width;
        double aa = 0.0, bb = 0.0, ab = 0.0;
        for (int f = 0; f < width; ++f) {
          aa += a[f] * a[f];
          bb += b[f] * b[f];
          ab += a[f] * b[f];
        }
        q += 0.5 * (aa + bb) / width / pairs;
        c += ab / std::sqrt(aa * bb) / pairs;
      }
      sums[layer].q += q;
      sums[layer].c += c;
      sums_sq[layer].q += q * q;
      sums_sq[layer].c += c * c;
      if (layer == depth) break;
      act.resize(h.size());
      for (std::size_t i = 0; i < h.size(); ++i) act[i] = activation_value(net.activation(), h[i]);
      const auto w = testing::random_matrix(normals, width, width, net.weight_var() / width);
      const auto b = testing::random_matrix(normals, 1, width, net.bias_var());
      testing::matmul_bt(act, w, 2 * pairs, width, width, next);
      for (int row = 0; row < 2 * pairs; ++row) {
        for (int f = 0; f < width; ++f) next[static_cast<std::size_t>(row) * width + f] += b[f];
      }
      h.swap(next);
    }
  }
  const double m = networks;
  for (std::size_t l = 0; l < sums.size(); ++l) {
    MeasuredLayer& out = sums[l];
    out.q /= m;
    out.c /= m;
    out.q_se = std::sqrt(std::max(0.0, sums_sq[l].q / m - out.q * out.q) / (m - 1.0));
    out.c_se = std::sqrt(std::max(0.0, sums_sq[l].c / m - out.c * out.c) / (m - 1.0));
  }
  return sums;
}

TEST(MeanField, PredictionsMatchFiniteWidthNetworks) {
  // The mean-field predictions hold at infinite width; at width 128 the bias is O(1/width), allowed as 1.5% on
  // q and 0.015 on c, on top of 4 Monte Carlo standard errors (q performs a multiplicative random walk over the
  // shared weights, so its standard error is a few percent at this size; the test also bounds it).
  struct Case {
    MeanField net;
    double q0, c0;
  };
  const Case cases[] = {
      {MeanField(Activation::relu, 2.0, 0.0), 1.0, 0.0},    // He: q preserved, c -> 1 slowly
      {MeanField(Activation::tanh, 2.5, 0.05), 0.5, 0.95},  // chaotic: nearby inputs decorrelate
      {MeanField(Activation::tanh, 1.2, 0.3), 2.0, 0.2},    // ordered with a large bias: c -> 1
      {MeanField(Activation::gelu_erf, 2.0, 0.1), 1.0, 0.5},
  };
  constexpr int kDepth = 4, kWidth = 128, kPairs = 8, kNetworks = 64;
  std::uint64_t stream = 1;
  for (const Case& test_case : cases) {
    const MeanField& net = test_case.net;
    SCOPED_TRACE(std::string(activation_name(net.activation())) + " σ_w² " + std::to_string(net.weight_var()));
    const std::vector<MeanFieldLayer> predicted = net.propagate(test_case.q0, test_case.c0, kDepth);
    const std::vector<MeasuredLayer> measured =
        simulate_mlp(net, test_case.q0, test_case.c0, kDepth, kWidth, kPairs, kNetworks, stream++);
    for (int l = 1; l <= kDepth; ++l) {
      SCOPED_TRACE("layer " + std::to_string(l));
      EXPECT_LT(measured[l].q_se, 0.04 * predicted[l].q);
      EXPECT_LT(measured[l].c_se, 0.01);
      EXPECT_NEAR(measured[l].q, predicted[l].q, 0.015 * predicted[l].q + 4.0 * measured[l].q_se);
      EXPECT_NEAR(measured[l].c, predicted[l].c, 0.015 + 4.0 * measured[l].c_se);
    }
  }
}

}  // namespace
}  // namespace proplab::theory
