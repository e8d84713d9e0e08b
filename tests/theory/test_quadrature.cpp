// theory/moments: the Gauss–Hermite rule (nodes, weights, polynomial exactness, the bivariate rule) and the
// closed-form GELU/ReLU moments checked against it to near machine precision.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "core/error.h"
#include "theory/moments.h"

namespace proplab::theory {
namespace {

// E[z^k] for z ~ N(0, 1): 0 for odd k, (k-1)!! for even k.
double normal_moment(int k) {
  if (k % 2 == 1) return 0.0;
  double m = 1.0;
  for (int j = k - 1; j > 1; j -= 2) m *= j;
  return m;
}

TEST(GaussHermite, ThreePointRuleIsTheKnownOne) {
  // Physicists' nodes 0, ±√(3/2) with weights 2√π/3, √π/6 -> standard normal nodes 0, ±√3, weights 2/3, 1/6.
  const GaussHermite rule(3);
  ASSERT_EQ(rule.points(), 3);
  EXPECT_NEAR(rule.nodes()[0], -std::sqrt(3.0), 1e-14);
  EXPECT_EQ(rule.nodes()[1], 0.0);
  EXPECT_NEAR(rule.nodes()[2], std::sqrt(3.0), 1e-14);
  EXPECT_NEAR(rule.weights()[0], 1.0 / 6.0, 1e-15);
  EXPECT_NEAR(rule.weights()[1], 2.0 / 3.0, 1e-15);
  EXPECT_NEAR(rule.weights()[2], 1.0 / 6.0, 1e-15);
}

TEST(GaussHermite, ExactForPolynomialsUpToDegree2NMinus1) {
  for (int n : {1, 2, 5, 16, 64, 128, 256}) {
    SCOPED_TRACE("points " + std::to_string(n));
    const GaussHermite rule(n);
    ASSERT_EQ(rule.points(), n);
    double weight_sum = 0.0;
    for (int i = 0; i < n; ++i) {
      EXPECT_GT(rule.weights()[i], 0.0);
      EXPECT_EQ(rule.nodes()[i], -rule.nodes()[n - 1 - i]);  // symmetric
      if (i > 0) {
        EXPECT_LT(rule.nodes()[i - 1], rule.nodes()[i]);
      }
      weight_sum += rule.weights()[i];
    }
    EXPECT_NEAR(weight_sum, 1.0, 1e-13);
    for (int k = 1; k <= std::min(2 * n - 1, 24); ++k) {
      const double got = rule.expect([k](double z) { return std::pow(z, k); });
      // Rounding is relative to the size of the summed terms, E|z|^k, not to the (zero) odd moments.
      const double scale = rule.expect([k](double z) { return std::pow(std::abs(z), k); });
      EXPECT_NEAR(got, normal_moment(k), 1e-13 * scale) << "moment " << k;
    }
  }
  // Degree 2N is not exact: for N = 3, E[z^6] = 15 but the rule gives 2·(1/6)·27 = 9.
  EXPECT_NEAR(GaussHermite(3).expect([](double z) { return std::pow(z, 6); }), 9.0, 1e-12);
}

TEST(GaussHermite, SmoothExpectationsConvergeToMachinePrecision) {
  const GaussHermite rule;  // default points
  // E[cos(a z)] = e^{-a²/2}, E[e^{t z}] = e^{t²/2}, E[(μ + σz)²] = μ² + σ².
  EXPECT_NEAR(rule.expect([](double z) { return std::cos(2.0 * z); }), std::exp(-2.0), 1e-14);
  EXPECT_NEAR(rule.expect([](double z) { return std::exp(1.5 * z); }), std::exp(1.125), 1e-12);
  EXPECT_NEAR(rule.expect([](double u) { return u * u; }, 0.7, 1.3), 0.49 + 1.69, 1e-13);
}

TEST(GaussHermite, PairRuleHasTheRequestedCorrelation) {
  const GaussHermite rule(32);
  const auto id = [](double u) { return u; };
  const auto sq = [](double u) { return u * u; };
  for (double r : {-1.0, -0.6, 0.0, 0.35, 0.9, 1.0}) {
    SCOPED_TRACE("corr " + std::to_string(r));
    // E[uv] = μ² + rσ²; for zero mean E[u²v²] = σ⁴(1 + 2r²).
    EXPECT_NEAR(rule.expect_pair(id, id, 0.4, 1.5, r), 0.16 + r * 2.25, 1e-12);
    EXPECT_NEAR(rule.expect_pair(sq, sq, 0.0, 1.5, r), 2.25 * 2.25 * (1.0 + 2.0 * r * r), 1e-11);
  }
}

TEST(GaussHermite, RejectsBadPointCounts) {
  EXPECT_THROW(GaussHermite(0), InternalError);
  EXPECT_THROW(GaussHermite(GaussHermite::kMaxPoints + 1), InternalError);
}

TEST(ClosedForms, GeluMomentsMatchQuadrature) {
  // The reference's GELU formulas (mean, variance, E[φ'²]) against quadrature, which is exact to rounding for
  // the smooth GELU at these variances.
  const GaussHermite rule;
  const auto phi = [](double u) { return activation_value(Activation::gelu_erf, u); };
  const auto d_phi = [](double u) { return activation_derivative(Activation::gelu_erf, u); };
  for (double var : {0.05, 0.5, 1.0, 2.0, 3.0}) {
    SCOPED_TRACE("var " + std::to_string(var));
    const double sigma = std::sqrt(var);
    const double mean = rule.expect(phi, 0.0, sigma);
    const double second = rule.expect([&](double u) { return phi(u) * phi(u); }, 0.0, sigma);
    const double slope_sq = rule.expect([&](double u) { return d_phi(u) * d_phi(u); }, 0.0, sigma);
    EXPECT_NEAR(gelu_mean(var), mean, 1e-12 * mean);
    EXPECT_NEAR(gelu_var(var), second - mean * mean, 1e-11 * (second - mean * mean));
    EXPECT_NEAR(gelu_slope_sq(var), slope_sq, 1e-11 * slope_sq);
  }
}

TEST(ClosedForms, ReluMatchesQuadratureUpToTheKink) {
  // Gauss–Hermite converges slowly across ReLU's kink (≈ 3e-3 at 128 points); the closed forms are exact.
  const GaussHermite rule;
  const Signal x{0.0, 1.7, 0.45};
  const Signal closed = relu_forward(x);
  const Signal quad = pointwise_forward([](double u) { return u > 0.0 ? u : 0.0; }, x, rule);
  EXPECT_NEAR(quad.mean, closed.mean, 5e-3 * closed.mean);
  EXPECT_NEAR(quad.var, closed.var, 5e-3 * closed.var);
  EXPECT_NEAR(quad.corr, closed.corr, 2e-3);
  // The even part of ReLU² is z²/2, which the symmetric rule integrates exactly.
  EXPECT_NEAR(rule.expect([](double u) { return u > 0.0 ? u * u : 0.0; }, 0.0, std::sqrt(1.7)), 0.85, 1e-13);
}

}  // namespace
}  // namespace proplab::theory
