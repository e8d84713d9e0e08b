#include "theory/mean_field.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>

#include "core/error.h"

namespace proplab::theory {

namespace {

constexpr double kPi = std::numbers::pi;
// A q beyond this counts as diverged.
constexpr double kQMax = 1e15;
// Plain iterations of the q map before switching to bracketing.
constexpr int kFixedPointIterations = 500;
constexpr double kFixedPointTolerance = 1e-14;

void check_q(double q, const char* what) {
  PROPLAB_CHECK(std::isfinite(q) && q >= 0.0, what, ": q must be finite and >= 0, got ", q);
}

}  // namespace

const char* phase_name(Phase phase) {
  switch (phase) {
    case Phase::ordered:
      return "ordered";
    case Phase::critical:
      return "critical";
    case Phase::chaotic:
      return "chaotic";
  }
  PROPLAB_CHECK(false, "unknown phase ", static_cast<int>(phase));
  return "";
}

MeanField::MeanField(Activation phi, double weight_var, double bias_var, int quadrature_points)
    : MeanField(phi, weight_var, bias_var, GaussHermite(quadrature_points)) {}

MeanField::MeanField(Activation phi, double weight_var, double bias_var, const GaussHermite& rule)
    : phi_(phi), weight_var_(weight_var), bias_var_(bias_var), rule_(rule) {
  PROPLAB_CHECK(std::isfinite(weight_var) && weight_var > 0.0, "MeanField: weight_var must be > 0, got ", weight_var);
  PROPLAB_CHECK(std::isfinite(bias_var) && bias_var >= 0.0, "MeanField: bias_var must be >= 0, got ", bias_var);
}

double MeanField::second_moment(double q) const {
  check_q(q, "MeanField::second_moment");
  switch (phi_) {
    case Activation::identity:
      return q;
    case Activation::relu:
      return 0.5 * q;
    case Activation::gelu_tanh:
    case Activation::gelu_erf: {
      const double mean = gelu_mean(q);
      return gelu_var(q) + mean * mean;
    }
    case Activation::tanh:
      return rule_.expect(
          [](double u) {
            const double t = std::tanh(u);
            return t * t;
          },
          0.0, std::sqrt(q));
  }
  PROPLAB_CHECK(false, "unknown activation ", static_cast<int>(phi_));
  return 0.0;
}

double MeanField::cross_moment(double q, double c) const {
  check_q(q, "MeanField::cross_moment");
  PROPLAB_CHECK(std::abs(c) <= 1.0 + 1e-12, "MeanField::cross_moment: c must be in [-1, 1], got ", c);
  const double r = std::clamp(c, -1.0, 1.0);
  switch (phi_) {
    case Activation::identity:
      return q * r;
    case Activation::relu:
      // Arc-cosine kernel of degree 1 (Cho & Saul): E[relu(u)relu(v)] = q(√(1-c²) + (π - arccos c)c)/(2π).
      return q * (std::sqrt(1.0 - r * r) + (kPi - std::acos(r)) * r) / (2.0 * kPi);
    case Activation::gelu_tanh:
    case Activation::gelu_erf: {
      const auto phi = [](double u) { return activation_value(Activation::gelu_erf, u); };
      return rule_.expect_pair(phi, phi, 0.0, std::sqrt(q), r);
    }
    case Activation::tanh: {
      const auto phi = [](double u) { return std::tanh(u); };
      return rule_.expect_pair(phi, phi, 0.0, std::sqrt(q), r);
    }
  }
  PROPLAB_CHECK(false, "unknown activation ", static_cast<int>(phi_));
  return 0.0;
}

double MeanField::slope_second_moment(double q) const {
  check_q(q, "MeanField::slope_second_moment");
  switch (phi_) {
    case Activation::identity:
      return 1.0;
    case Activation::relu:
      return 0.5;
    case Activation::gelu_tanh:
    case Activation::gelu_erf:
      return gelu_slope_sq(q);
    case Activation::tanh:
      return rule_.expect(
          [](double u) {
            const double t = std::tanh(u);
            return (1.0 - t * t) * (1.0 - t * t);
          },
          0.0, std::sqrt(q));
  }
  PROPLAB_CHECK(false, "unknown activation ", static_cast<int>(phi_));
  return 0.0;
}

double MeanField::q_map(double q) const { return weight_var_ * second_moment(q) + bias_var_; }

double MeanField::c_map(double q, double c) const {
  const double q_next = q_map(q);
  // Two zero vectors (q = 0, no bias) have no angle; they are equal, so c = 1.
  if (q_next <= 0.0) return 1.0;
  return std::clamp((weight_var_ * cross_moment(q, c) + bias_var_) / q_next, -1.0, 1.0);
}

double MeanField::chi1(double q) const { return weight_var_ * slope_second_moment(q); }

std::optional<double> MeanField::fixed_point(double q_init) const {
  check_q(q_init, "MeanField::fixed_point");
  double q = q_init;
  for (int iter = 0; iter < kFixedPointIterations; ++iter) {
    const double next = q_map(q);
    if (!(next <= kQMax)) return std::nullopt;
    if (std::abs(next - q) <= kFixedPointTolerance * std::max(next, q)) return next;
    q = next;
  }
  // Slow convergence (a fixed point where the q map's slope is near 1). The map is increasing, so the iterates
  // move monotonically towards the fixed point; bracket it on that side and bisect. Invariant of the bracket:
  // excess(lo) > 0 >= excess(hi) when moving down, excess(lo) >= 0 > excess(hi) when moving up.
  const auto excess = [this](double v) { return q_map(v) - v; };
  const double excess_q = excess(q);
  if (excess_q == 0.0) return q;
  double lo = 0.0, hi = 0.0;
  if (excess_q < 0.0) {
    hi = q;
    // Halve towards 0; q_map(0) = σ_b² >= 0 (φ(0) = 0 for every supported φ), so 0 closes the bracket.
    for (double probe = 0.5 * q; probe > 0.0; probe *= 0.5) {
      if (excess(probe) > 0.0) {
        lo = probe;
        break;
      }
      hi = probe;
    }
  } else {
    lo = q;
    hi = std::max(2.0 * q, 1e-300);
    while (excess(hi) > 0.0) {
      lo = hi;
      hi *= 2.0;
      if (hi > kQMax) return std::nullopt;
    }
  }
  for (int iter = 0; iter < 4000 && hi - lo > kFixedPointTolerance * hi && hi > 1e-300; ++iter) {
    const double mid = 0.5 * (lo + hi);
    if (excess(mid) > 0.0) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

double MeanField::chi1_at_fixed_point(double q_init) const {
  const std::optional<double> q_star = fixed_point(q_init);
  if (q_star) return chi1(*q_star);
  switch (phi_) {
    case Activation::identity:
      return weight_var_;
    case Activation::relu:
    case Activation::gelu_tanh:
    case Activation::gelu_erf:
      return 0.5 * weight_var_;
    case Activation::tanh:
      break;
  }
  PROPLAB_CHECK(false, "MeanField: q diverged for bounded activation ", activation_identifier(phi_));
  return 0.0;
}

Phase MeanField::phase(double tolerance, double q_init) const {
  const double chi = chi1_at_fixed_point(q_init);
  if (std::abs(chi - 1.0) <= tolerance) return Phase::critical;
  return chi < 1.0 ? Phase::ordered : Phase::chaotic;
}

std::vector<MeanFieldLayer> MeanField::propagate(double q0, double c0, int layers) const {
  check_q(q0, "MeanField::propagate");
  PROPLAB_CHECK(layers >= 0, "MeanField::propagate: layers must be >= 0, got ", layers);
  std::vector<MeanFieldLayer> out;
  out.reserve(static_cast<std::size_t>(layers) + 1);
  out.push_back({q0, c0});
  for (int l = 0; l < layers; ++l) {
    const MeanFieldLayer& prev = out.back();
    out.push_back({q_map(prev.q), c_map(prev.q, prev.c)});
  }
  return out;
}

CriticalPoint critical_point(Activation phi, double bias_var, int quadrature_points) {
  PROPLAB_CHECK(std::isfinite(bias_var) && bias_var >= 0.0, "critical_point: bias_var must be >= 0, got ", bias_var);
  switch (phi) {
    case Activation::identity:
    case Activation::relu: {
      const double weight_var = phi == Activation::relu ? 2.0 : 1.0;
      if (bias_var > 0.0) return {weight_var, std::numeric_limits<double>::infinity(), 1.0};
      return {weight_var, 1.0, 1.0};
    }
    case Activation::tanh:
    case Activation::gelu_tanh:
    case Activation::gelu_erf:
      break;
  }
  // Only φ's Gaussian moments are used below, which do not depend on the weights: σ_w² = 1, σ_b² = 0 are arbitrary.
  const MeanField moments(phi, 1.0, 0.0, quadrature_points);
  const auto bias_on_line = [&](double q) { return q - moments.second_moment(q) / moments.slope_second_moment(q); };
  double lo = 0.0, hi = 0.0;
  if (bias_var > 0.0) {
    hi = 1.0;
    while (bias_on_line(hi) < bias_var) {
      lo = hi;
      hi *= 2.0;
      PROPLAB_CHECK(hi < kQMax, "critical_point: no critical fixed point below q = ", kQMax, " for ",
                    activation_identifier(phi), ", σ_b² = ", bias_var);
    }
    for (int iter = 0; iter < 200 && hi - lo > kFixedPointTolerance * hi; ++iter) {
      const double mid = 0.5 * (lo + hi);
      if (bias_on_line(mid) < bias_var) {
        lo = mid;
      } else {
        hi = mid;
      }
    }
  }
  const double q_star = 0.5 * (lo + hi);
  const double weight_var = 1.0 / moments.slope_second_moment(q_star);
  const MeanField net(phi, weight_var, bias_var, quadrature_points);
  // Central difference (one-sided at q* = 0) of the q map.
  const double step = 1e-5 * std::max(q_star, 1e-3);
  const double slope = q_star > step ? (net.q_map(q_star + step) - net.q_map(q_star - step)) / (2.0 * step)
                                     : (net.q_map(q_star + step) - net.q_map(q_star)) / step;
  return {weight_var, q_star, slope};
}

double critical_weight_var(Activation phi, double bias_var, int quadrature_points) {
  return critical_point(phi, bias_var, quadrature_points).weight_var;
}

}  // namespace proplab::theory
