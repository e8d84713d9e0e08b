// theory/mean_field: mean-field theory of a deep fully connected network at initialisation (Poole et al. 2016,
// Schoenholz et al. 2017).
//
// The network: h^{l+1} = W^{l+1} φ(h^l) + b^{l+1}, W entries N(0, σ_w²/fan_in), b entries N(0, σ_b²), infinitely
// wide. Two inputs give pre-activations of squared length q (per unit: q = |h|²/width) and cosine correlation c
// (uncentred: c = h_a·h_b / √(|h_a|²|h_b|²)). Layer by layer:
//   q' = σ_w²·E[φ(√q z)²] + σ_b²,                                    z ~ N(0, 1)
//   c' = (σ_w²·E[φ(u)φ(v)] + σ_b²) / q',  u, v ~ N(0, q) with correlation c (both inputs of length q),
//   χ₁ = σ_w²·E[φ'(√q* z)²] at the fixed point q* of the q map: the slope of the c map at c = 1, and the factor by
//   which a layer multiplies the squared gradient norm. χ₁ < 1: ordered (correlations converge to 1),
//   χ₁ > 1: chaotic (nearby inputs decorrelate), χ₁ = 1: critical (the edge of chaos).
// Expectations use closed forms where they exist (relu, identity; gelu's E[φ²] and E[φ'²]) and Gauss–Hermite
// quadrature otherwise (tanh, gelu's cross moment). gelu_tanh uses gelu_erf's maps.
//
// Invariants: weight_var > 0, bias_var >= 0, q >= 0, |c| <= 1 (checked with PROPLAB_CHECK).
#pragma once

#include <optional>
#include <vector>

#include "theory/moments.h"

namespace proplab::theory {

enum class Phase { ordered, critical, chaotic };
const char* phase_name(Phase phase);

// q and c after a layer (l = 0: the pre-activations of the first nonlinearity).
struct MeanFieldLayer {
  double q = 0.0;
  double c = 0.0;
};

class MeanField {
 public:
  MeanField(Activation phi, double weight_var, double bias_var, int quadrature_points = GaussHermite::kDefaultPoints);
  // The same with a quadrature rule built once by the caller (cheap to construct many networks).
  MeanField(Activation phi, double weight_var, double bias_var, const GaussHermite& rule);

  Activation activation() const { return phi_; }
  double weight_var() const { return weight_var_; }
  double bias_var() const { return bias_var_; }

  // E[φ(√q z)²], E[φ(u)φ(v)] (u, v ~ N(0, q), correlation c) and E[φ'(√q z)²].
  double second_moment(double q) const;
  double cross_moment(double q, double c) const;
  double slope_second_moment(double q) const;

  // q' = σ_w²·E[φ(√q z)²] + σ_b².
  double q_map(double q) const;
  // c' for two inputs of length q and correlation c.
  double c_map(double q, double c) const;
  // χ₁ = σ_w²·E[φ'(√q z)²].
  double chi1(double q) const;

  // The fixed point q* the q map reaches from q_init (the map is increasing, so iterates move monotonically to the
  // nearest fixed point in their direction): found by iteration, then by bisection on a bracket when iteration is
  // slow (e.g. the critical tanh network, σ_b² = 0, whose q decays like 1/l to q* = 0). Empty when q grows
  // without bound (beyond 1e15).
  std::optional<double> fixed_point(double q_init = 1.0) const;
  // χ₁ at the fixed point reached from q_init; when q diverges, χ₁'s limit as q -> ∞ (σ_w²/2 for relu and gelu,
  // σ_w² for identity), the growth rate of a network whose signal explodes.
  double chi1_at_fixed_point(double q_init = 1.0) const;
  // The phase from chi1_at_fixed_point: critical when |χ₁ - 1| <= tolerance.
  Phase phase(double tolerance = 1e-6, double q_init = 1.0) const;

  // q_l and c_l for l = 0..layers, starting from (q0, c0).
  std::vector<MeanFieldLayer> propagate(double q0, double c0, int layers) const;

 private:
  Activation phi_;
  double weight_var_;
  double bias_var_;
  GaussHermite rule_;
};

// The edge of chaos for a bias variance σ_b²: the weight variance σ_w² and fixed point q* with χ₁(q*) = 1.
// On that line σ_w² = 1/E[φ'(√q* z)²] and q* = σ_w²·E[φ(√q* z)²] + σ_b², so q* is the root of
// q - E[φ²]/E[φ'²] = σ_b² (bisection on q), as in Poole et al.'s phase diagram.
// - tanh: for σ_b² > 0 the critical fixed point attracts (q_map_slope < 1); σ_b² = 0 gives σ_w² = 1, q* = 0.
// - gelu: σ_b² = 0 gives σ_w² = 4, q* = 0. For 0 < σ_b² < about 0.17 the critical fixed point repels
//   (q_map_slope > 1): iterates from any other q move away from it, to an ordered fixed point below or to
//   divergence above, so no trajectory settles at χ₁ = 1; for larger σ_b² it attracts.
// - relu, identity: E[φ²]/q = E[φ'²] for every q, so χ₁ = 1 at σ_w² = 2 (relu) or 1 (identity) whatever q;
//   with σ_b² = 0 every q is a fixed point (q_star reports 1, q_map_slope 1); with σ_b² > 0 there is none
//   (q grows by σ_b² per layer): q_star is +∞.
struct CriticalPoint {
  double weight_var = 0.0;
  double q_star = 0.0;
  double q_map_slope = 0.0;  // dq'/dq at q_star
};
CriticalPoint critical_point(Activation phi, double bias_var, int quadrature_points = GaussHermite::kDefaultPoints);
// critical_point(phi, bias_var).weight_var.
double critical_weight_var(Activation phi, double bias_var, int quadrature_points = GaussHermite::kDefaultPoints);

}  // namespace proplab::theory
