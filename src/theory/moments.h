// theory/moments: closed-form moment maps of signal propagation through one network component at initialisation.
//
// Each component has a forward map (input Signal -> output Signal) and a backward map (the GradSignal of the
// gradient arriving at its output -> the GradSignal of the gradient at its input). The formulas, their sources,
// assumptions and measured accuracy are listed in docs/theory.md; each one is checked against Monte Carlo in
// tests/theory/.
//
// Conventions (the same statistics that probe/moments records, taken over the ensemble of random weights and
// inputs):
// - A representation is a sequence of tokens, each a vector of features. Every element has mean `mean` (μ) and
//   variance `var` (σ²); `corr` (r) is the correlation between the same feature of two different tokens,
//   centred by μ: Cov(x_t,i, x_s,i) = r·σ² for t ≠ s. Different features are independent.
// - A gradient has mean 0, variance `var` (σ_g²) and token correlation `corr` (r_g), defined the same way.
// - Backward maps assume the gradient arriving from above is independent of the forward activations (the usual
//   gradient-independence assumption of mean-field theory).
// - Maps through a nonlinearity assume Gaussian pre-activations. The closed forms for ReLU and GELU assume a
//   zero-mean input (as after any linear layer with zero-mean weights); pointwise_forward/backward handle any mean
//   by Gauss–Hermite quadrature.
// - A signal with zero variance has corr 1 by convention (all its tokens are equal).
// - Argument domains (var >= 0, |corr| <= 1, 0 <= p < 1, positive sizes) are invariants checked with
//   PROPLAB_CHECK: callers validate user input before building a theory prediction.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "spec/model.h"

namespace proplab::theory {

// Forward statistics of a representation: per-element mean μ, variance σ², token correlation r.
struct Signal {
  double mean = 0.0;
  double var = 1.0;
  double corr = 0.0;
};

// Statistics of a gradient (mean 0): variance σ_g², token correlation r_g.
struct GradSignal {
  double var = 1.0;
  double corr = 0.0;
};

// The pointwise nonlinearities (spec/model.h). gelu_tanh is GPT-2's tanh approximation; its moment maps use the
// exact (erf) GELU formulas (see docs/theory.md for the error).
using ::proplab::Activation;
// The enumerator's own name ("identity", "gelu_tanh", ...), as derivations print it.
const char* activation_identifier(Activation kind);
// φ(x) and φ'(x) in double precision (gelu_tanh evaluates the tanh approximation itself).
double activation_value(Activation kind, double x);
double activation_derivative(Activation kind, double x);

// The standard normal distribution function Φ and density φ.
double normal_cdf(double x);
double normal_pdf(double x);

// ---- Gauss–Hermite quadrature --------------------------------------------------------------------------------
// An N-point Gauss–Hermite rule in standard-normal form: E[f(z)] ≈ Σ w_i f(z_i), z ~ N(0, 1), exact for
// polynomials of degree <= 2N-1. Nodes are the eigenvalues of the Hermite Jacobi matrix (Golub–Welsch), found by
// Sturm-sequence bisection and polished by Newton steps on the orthonormal Hermite recurrence; weights are the
// Christoffel numbers 1 / Σ_{k<N} p_k(x_i)². Nodes ascend and are symmetric about 0; the weights sum to 1.
class GaussHermite {
 public:
  static constexpr int kDefaultPoints = 128;
  static constexpr int kMaxPoints = 256;

  explicit GaussHermite(int points = kDefaultPoints);

  int points() const { return static_cast<int>(nodes_.size()); }
  const std::vector<double>& nodes() const { return nodes_; }
  const std::vector<double>& weights() const { return weights_; }

  // E[f(mean + std·z)], z ~ N(0, 1).
  double expect(const std::function<double(double)>& f, double mean = 0.0, double std = 1.0) const;
  // E[f(u)·g(v)] for (u, v) jointly Gaussian, both N(mean, std²), Corr(u, v) = corr (tensor-product rule over
  // u = mean + std·z1, v = mean + std·(corr·z1 + √(1-corr²)·z2)).
  double expect_pair(const std::function<double(double)>& f, const std::function<double(double)>& g, double mean,
                     double std, double corr) const;

 private:
  std::vector<double> nodes_;
  std::vector<double> weights_;
};

// ---- linear ---------------------------------------------------------------------------------------------------
// y = W x (+ b), W [fan_out, fan_in] with entries N(0, weight_var), b with entries N(0, bias_var), one b for all
// tokens. Forward: μ = 0, σ² = fan_in·σ_w²·(σ² + μ²) + σ_b², Cov = fan_in·σ_w²·(μ² + r·σ²) + σ_b².
Signal linear_forward(const Signal& x, std::int64_t fan_in, double weight_var, double bias_var = 0.0);
// Backward: σ²_g,in = fan_out·σ_w²·σ_g², r_g unchanged.
GradSignal linear_backward(const GradSignal& d_y, std::int64_t fan_out, double weight_var);

// ---- pointwise nonlinearities ---------------------------------------------------------------------------------
Signal identity_forward(const Signal& x);
GradSignal identity_backward(const GradSignal& d_y);

// ReLU, closed forms (arc-cosine kernel); x.mean must be 0.
Signal relu_forward(const Signal& x);
GradSignal relu_backward(const Signal& x, const GradSignal& d_y);

// GELU x·Φ(x): closed-form mean, variance and gradient variance (x.mean must be 0); the token correlations
// forward and backward by bivariate quadrature with `rule`.
Signal gelu_forward(const Signal& x, const GaussHermite& rule);
GradSignal gelu_backward(const Signal& x, const GradSignal& d_y, const GaussHermite& rule);

// tanh, by quadrature (any mean).
Signal tanh_forward(const Signal& x, const GaussHermite& rule);
GradSignal tanh_backward(const Signal& x, const GradSignal& d_y, const GaussHermite& rule);

// Any pointwise φ, by quadrature (any mean): μ = E[φ(u)], σ² = Var φ(u), r = Cov(φ(u), φ(v)) / σ² with
// (u, v) ~ N(μ_in, σ_in²) correlated r_in.
Signal pointwise_forward(const std::function<double(double)>& phi, const Signal& x, const GaussHermite& rule);
// Backward of any pointwise φ given φ': σ²_g,in = σ_g²·E[φ'(u)²], r_g,in = r_g·E[φ'(u)φ'(v)] / E[φ'(u)²].
GradSignal pointwise_backward(const std::function<double(double)>& d_phi, const Signal& x, const GradSignal& d_y,
                              const GaussHermite& rule);

// GELU's closed-form Gaussian moments for a zero-mean input of variance `var`, with a = var/(1 + var):
// E[φ] = √(var/2π)·√a, Var φ = (var/2π)(π - a - arccos a + 2a√((1-a)/(1+a))),
// E[φ'²] = 1/2 + (1/2π)(-arccos a + a(5·var + 3)/(1 + 2·var)^{3/2}).
double gelu_mean(double var);
double gelu_var(double var);
double gelu_slope_sq(double var);

// Dispatch on `kind` to the maps above (gelu_tanh uses gelu's).
Signal activation_forward(Activation kind, const Signal& x, const GaussHermite& rule);
GradSignal activation_backward(Activation kind, const Signal& x, const GradSignal& d_y, const GaussHermite& rule);

// ---- normalisation (no affine) --------------------------------------------------------------------------------
// LayerNorm over `features` features: μ = 0, σ² = 1, r_out = layernorm_pair_corr(r, features).
Signal layernorm_forward(const Signal& x, std::int64_t features);
// The correlation of two tokens' LayerNorm outputs (their expected cosine) whose inputs correlate by r.
double layernorm_pair_corr(double r, std::int64_t features);
// Backward: σ²_g,in = σ_g² / σ², r_g unchanged (leading order in 1/features).
GradSignal layernorm_backward(const Signal& x, const GradSignal& d_y);

// RMSNorm y = x / rms(x): μ_out = μ/√(σ² + μ²), σ²_out = σ²/(σ² + μ²), r unchanged (leading order in 1/features).
Signal rmsnorm_forward(const Signal& x);
// Backward: σ²_g,in = σ_g² / (σ² + μ²), r_g unchanged (leading order in 1/features).
GradSignal rmsnorm_backward(const Signal& x, const GradSignal& d_y);

// ---- dropout (inverted: kept elements scaled by 1/(1-p)) ------------------------------------------------------
// Forward: μ kept, σ²_out = (σ² + p·μ²)/(1-p), covariance r·σ² kept.
Signal dropout_forward(const Signal& x, double p);
// Backward: σ²_g,in = σ_g²/(1-p), r_g,in = r_g·(1-p) (independent masks per token).
GradSignal dropout_backward(const GradSignal& d_y, double p);

// ---- softmax over `length` logits -----------------------------------------------------------------------------
// `logits` are the L entries of one row (mean irrelevant, variance σ², correlation r between entries); "tokens"
// of the output are the L probabilities of one row. μ_out = 1/L, σ²_out ≈ (e^{(1-r)σ²} - 1)/L²,
// r_out = -1/(L-1) (exact: a row sums to 1).
Signal softmax_forward(const Signal& logits, std::int64_t length);
// Backward for the gradient d_p arriving at the probabilities (r_g: correlation between its entries in a row):
// σ²_g,in ≈ e^{(1-r)σ²}·(1 - r_g)·σ_g²/L² (the reference formula at r_g = 0; the softmax Jacobian removes the
// part shared by the row), r_g,in = -1/(L-1) (exact: the logit gradient of a row sums to 0).
GradSignal softmax_backward(const Signal& logits, const GradSignal& d_probs, std::int64_t length);

// ---- softmax self-attention -----------------------------------------------------------------------------------
// Per head: Q, K, V = x·W_q, x·W_k, x·W_v with W_* [model_dim, head_dim] entries N(0, std²); logits q·k/√head_dim
// over all seq_len tokens (no causal mask); softmax; dropout p on the probabilities; output P·V. Heads are
// independent and identically distributed; the output is the heads' concatenation (no output projection: follow
// with linear_forward).
struct AttentionShape {
  std::int64_t model_dim = 0;  // d
  std::int64_t head_dim = 0;   // d_k
  std::int64_t heads = 1;
  std::int64_t seq_len = 0;  // L
  double q_std = 0.0;        // σ_q
  double k_std = 0.0;        // σ_k
  double v_std = 0.0;        // σ_v
  double dropout = 0.0;      // p, on the attention probabilities
};
// Forward (Kedia et al. single-head formula, per head), with s = d·σ²·(σ_qσ_k)², D = d·s·σ² the logit variance:
// σ²_out = d·σ_v²·[((1-r)²(L-1)·s·σ⁴ + e^{(1-r)D}/(1-p)·(4(1-r)²·s·σ⁴ + (1-r)σ²))/L + r·σ²], μ_out = 0, and
// r_out = C/σ²_out with the cross-query covariance (proplab's derivation under the same approximations)
// C = d·σ_v²·[r·σ² + (r(1-r)²(L-1)·s·σ⁴ + e^{r(1-r)D}·(2(1+r)(1-r)²·s·σ⁴ + (1-r)σ²))/L].
// A nonzero input mean enters as a shared component: σ² -> σ² + μ², r -> (μ² + rσ²)/(σ² + μ²).
Signal attention_forward(const Signal& x, const AttentionShape& shape);
// Backward through the value path under near-uniform attention (Kedia et al.), summed over heads:
// σ²_g,in = heads·σ_g²·d_k·σ_v²·(1 + (L-1)·r_g·(1-p))/(L·(1-p)),
// r_g,in = (1 + (L-1)·r_g)·(1-p)/(1 + (L-1)·r_g·(1-p)) (proplab's derivation, same approximation).
// The query/key paths are neglected: accurate only when the logit variance D is small against 1 + (L-1)·r_g.
GradSignal attention_backward(const GradSignal& d_y, const AttentionShape& shape);

// ---- residual add y = λ·skip + β·branch -----------------------------------------------------------------------
// The skip and branch signals are assumed uncorrelated (no cross-covariance; holds in expectation over
// zero-mean branch weights): μ = λμ_s + βμ_b, σ² = λ²σ_s² + β²σ_b², r = (λ²r_sσ_s² + β²r_bσ_b²)/σ².
Signal residual_forward(const Signal& skip, const Signal& branch, double lambda, double beta);
// The gradient entering the branch's output: β·d_y.
GradSignal residual_branch_backward(const GradSignal& d_y, double beta);
// The gradient at the residual input: λ·d_y plus d_x_branch (what the branch passed back to its input from
// residual_branch_backward(d_y, β)), assumed uncorrelated: σ² = λ²σ_g² + σ_b², r = (λ²r_gσ_g² + r_bσ_b²)/σ².
GradSignal residual_backward(const GradSignal& d_y, const GradSignal& d_x_branch, double lambda);

}  // namespace proplab::theory
