#include "theory/moments.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"

namespace proplab::theory {

namespace {

constexpr double kPi = std::numbers::pi;
constexpr double kTwoPi = 2.0 * std::numbers::pi;
// GPT-2 gelu: x/2·(1 + tanh(√(2/π)(x + 0.044715 x³))).
constexpr double kGeluTanhScale = 0.7978845608028654;
constexpr double kGeluTanhCubic = 0.044715;
// Slack on |corr| <= 1 for correlations that went through arithmetic.
constexpr double kCorrSlack = 1e-12;

void check_signal(const Signal& x, const char* map) {
  PROPLAB_CHECK(std::isfinite(x.mean) && std::isfinite(x.var) && x.var >= 0.0, map,
                ": input needs a finite mean and a finite variance >= 0, got mean ", x.mean, ", var ", x.var);
  PROPLAB_CHECK(std::abs(x.corr) <= 1.0 + kCorrSlack, map, ": input correlation must be in [-1, 1], got ", x.corr);
}

void check_grad(const GradSignal& g, const char* map) {
  PROPLAB_CHECK(std::isfinite(g.var) && g.var >= 0.0, map, ": gradient variance must be finite and >= 0, got ", g.var);
  PROPLAB_CHECK(std::abs(g.corr) <= 1.0 + kCorrSlack, map, ": gradient correlation must be in [-1, 1], got ", g.corr);
}

void check_zero_mean(const Signal& x, const char* map) {
  // The closed forms are for a centred Gaussian; a mean that is rounding noise against σ is accepted.
  PROPLAB_CHECK(std::abs(x.mean) <= 1e-12 * std::sqrt(x.var), map,
                ": the closed form needs a zero-mean input, got mean ", x.mean,
                " (use pointwise_forward/pointwise_backward for a shifted input)");
}

void check_rate(double p, const char* map) {
  PROPLAB_CHECK(p >= 0.0 && p < 1.0, map, ": dropout rate must be in [0, 1), got ", p);
}

double clamp_corr(double r) { return std::clamp(r, -1.0, 1.0); }

// Correlation from a covariance and a variance; a zero-variance signal has all tokens equal (corr 1).
double corr_of(double cov, double var) { return var > 0.0 ? clamp_corr(cov / var) : 1.0; }

// Number of eigenvalues below `lambda` of the symmetric tridiagonal matrix with zero diagonal and off-diagonal
// b_k = √(k/2) (the Jacobi matrix of the physicists' Hermite polynomials), by the Sturm sequence of pivots.
int hermite_eigenvalues_below(int n, double lambda) {
  int count = 0;
  double pivot = -lambda;
  if (pivot < 0.0) ++count;
  for (int k = 1; k < n; ++k) {
    const double prev = pivot != 0.0 ? pivot : 1e-300;
    pivot = -lambda - (0.5 * k) / prev;
    if (pivot < 0.0) ++count;
  }
  return count;
}

// Orthonormal Hermite polynomials (weight e^{-x²}) p_0..p_{n} at x: returns p_n, sets p_{n-1} and Σ_{k<n} p_k².
double hermite_orthonormal(int n, double x, double& previous, double& sum_sq_below) {
  double p_km1 = 0.0;
  double p_k = 1.0 / std::pow(kPi, 0.25);
  sum_sq_below = 0.0;
  for (int k = 1; k <= n; ++k) {
    sum_sq_below += p_k * p_k;
    const double p_kp1 = std::sqrt(2.0 / k) * x * p_k - std::sqrt((k - 1.0) / k) * p_km1;
    p_km1 = p_k;
    p_k = p_kp1;
  }
  previous = p_km1;
  return p_k;
}

double gelu_erf(double x) { return x * normal_cdf(x); }
double gelu_erf_grad(double x) { return normal_cdf(x) + x * normal_pdf(x); }

double gelu_tanh(double x) {
  const double u = kGeluTanhScale * (x + kGeluTanhCubic * x * x * x);
  return 0.5 * x * (1.0 + std::tanh(u));
}
double gelu_tanh_grad(double x) {
  const double u = kGeluTanhScale * (x + kGeluTanhCubic * x * x * x);
  const double t = std::tanh(u);
  const double du = kGeluTanhScale * (1.0 + 3.0 * kGeluTanhCubic * x * x);
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du;
}

}  // namespace

double normal_cdf(double x) { return 0.5 * std::erfc(-x / std::numbers::sqrt2); }
double normal_pdf(double x) { return std::exp(-0.5 * x * x) / std::sqrt(kTwoPi); }

const char* activation_identifier(Activation kind) {
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
  PROPLAB_CHECK(false, "unknown activation ", static_cast<int>(kind));
  return "";
}

double activation_value(Activation kind, double x) {
  switch (kind) {
    case Activation::identity:
      return x;
    case Activation::relu:
      return x > 0.0 ? x : 0.0;
    case Activation::tanh:
      return std::tanh(x);
    case Activation::gelu_tanh:
      return gelu_tanh(x);
    case Activation::gelu_erf:
      return gelu_erf(x);
  }
  PROPLAB_CHECK(false, "unknown activation ", static_cast<int>(kind));
  return 0.0;
}

double activation_derivative(Activation kind, double x) {
  switch (kind) {
    case Activation::identity:
      return 1.0;
    case Activation::relu:
      return x > 0.0 ? 1.0 : 0.0;
    case Activation::tanh: {
      const double t = std::tanh(x);
      return 1.0 - t * t;
    }
    case Activation::gelu_tanh:
      return gelu_tanh_grad(x);
    case Activation::gelu_erf:
      return gelu_erf_grad(x);
  }
  PROPLAB_CHECK(false, "unknown activation ", static_cast<int>(kind));
  return 0.0;
}

// ---- GELU closed forms (a = σ²/(1 + σ²), zero-mean input N(0, σ²)) ---------------------------------------

double gelu_mean(double var) {
  const double a = var / (1.0 + var);
  return std::sqrt(var / kTwoPi) * std::sqrt(a);
}
double gelu_var(double var) {
  const double a = var / (1.0 + var);
  return var / kTwoPi * (kPi - a - std::acos(a) + 2.0 * a * std::sqrt((1.0 - a) / (1.0 + a)));
}
double gelu_slope_sq(double var) {
  const double a = var / (1.0 + var);
  return 0.5 + (-std::acos(a) + a * (5.0 * var + 3.0) / std::pow(1.0 + 2.0 * var, 1.5)) / kTwoPi;
}

// ---- Gauss–Hermite --------------------------------------------------------------------------------------------

GaussHermite::GaussHermite(int points) {
  PROPLAB_CHECK(points >= 1 && points <= kMaxPoints, "GaussHermite: points must be in [1, ", kMaxPoints, "], got ",
                points);
  const int n = points;
  // Gershgorin: every eigenvalue lies in [-2·max b_k, 2·max b_k].
  const double bound = 2.0 * std::sqrt(0.5 * (n - 1)) + 1.0;
  std::vector<double> roots(n);
  for (int i = 0; i < n; ++i) {
    // The (i+1)-th smallest eigenvalue: the least λ with more than i eigenvalues below it.
    double lo = -bound, hi = bound;
    for (int iter = 0; iter < 200 && hi - lo > 1e-15 * std::max(1.0, std::abs(hi)); ++iter) {
      const double mid = 0.5 * (lo + hi);
      if (hermite_eigenvalues_below(n, mid) > i) {
        hi = mid;
      } else {
        lo = mid;
      }
    }
    double x = 0.5 * (lo + hi);
    // Newton on p_n polishes the last bits; p_n' = √(2n)·p_{n-1}.
    for (int step = 0; step < 2; ++step) {
      double previous = 0.0, sum_sq = 0.0;
      const double value = hermite_orthonormal(n, x, previous, sum_sq);
      const double slope = std::sqrt(2.0 * n) * previous;
      if (slope != 0.0) x -= value / slope;
    }
    roots[i] = x;
  }
  // Exact symmetry: x_i = -x_{n-1-i}, and the middle node of an odd rule is 0.
  for (int i = 0; i < n / 2; ++i) {
    const double m = 0.5 * (roots[n - 1 - i] - roots[i]);
    roots[i] = -m;
    roots[n - 1 - i] = m;
  }
  if (n % 2 == 1) roots[n / 2] = 0.0;

  nodes_.resize(n);
  weights_.resize(n);
  for (int i = 0; i < n; ++i) {
    double previous = 0.0, sum_sq = 0.0;
    hermite_orthonormal(n, roots[i], previous, sum_sq);
    // Christoffel number for weight e^{-x²}; dividing by √π makes it a probability weight under N(0, 1/2),
    // and z = √2·x turns that into N(0, 1).
    nodes_[i] = std::numbers::sqrt2 * roots[i];
    weights_[i] = 1.0 / (sum_sq * std::sqrt(kPi));
  }
}

double GaussHermite::expect(const std::function<double(double)>& f, double mean, double std) const {
  double sum = 0.0;
  for (std::size_t i = 0; i < nodes_.size(); ++i) sum += weights_[i] * f(mean + std * nodes_[i]);
  return sum;
}

double GaussHermite::expect_pair(const std::function<double(double)>& f, const std::function<double(double)>& g,
                                 double mean, double std, double corr) const {
  const double r = clamp_corr(corr);
  const double rest = std::sqrt(std::max(0.0, 1.0 - r * r));
  double sum = 0.0;
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    const double fu = f(mean + std * nodes_[i]);
    if (fu == 0.0) continue;
    double inner = 0.0;
    for (std::size_t j = 0; j < nodes_.size(); ++j) {
      inner += weights_[j] * g(mean + std * (r * nodes_[i] + rest * nodes_[j]));
    }
    sum += weights_[i] * fu * inner;
  }
  return sum;
}

// ---- linear ---------------------------------------------------------------------------------------------------

Signal linear_forward(const Signal& x, std::int64_t fan_in, double weight_var, double bias_var) {
  check_signal(x, "linear_forward");
  PROPLAB_CHECK(fan_in > 0 && weight_var >= 0.0 && bias_var >= 0.0,
                "linear_forward: needs fan_in > 0, weight_var >= 0, bias_var >= 0, got ", fan_in, ", ", weight_var,
                ", ", bias_var);
  const double second_moment = x.var + x.mean * x.mean;
  const double var = static_cast<double>(fan_in) * weight_var * second_moment + bias_var;
  const double cov = static_cast<double>(fan_in) * weight_var * (x.mean * x.mean + x.corr * x.var) + bias_var;
  return {0.0, var, corr_of(cov, var)};
}

GradSignal linear_backward(const GradSignal& d_y, std::int64_t fan_out, double weight_var) {
  check_grad(d_y, "linear_backward");
  PROPLAB_CHECK(fan_out > 0 && weight_var >= 0.0, "linear_backward: needs fan_out > 0, weight_var >= 0, got ", fan_out,
                ", ", weight_var);
  return {static_cast<double>(fan_out) * weight_var * d_y.var, d_y.corr};
}

// ---- pointwise ------------------------------------------------------------------------------------------------

Signal identity_forward(const Signal& x) {
  check_signal(x, "identity_forward");
  return x;
}

GradSignal identity_backward(const GradSignal& d_y) {
  check_grad(d_y, "identity_backward");
  return d_y;
}

Signal relu_forward(const Signal& x) {
  check_signal(x, "relu_forward");
  check_zero_mean(x, "relu_forward");
  const double r = clamp_corr(x.corr);
  const double sigma = std::sqrt(x.var);
  const double mean = sigma / std::sqrt(kTwoPi);
  const double var = x.var * (kPi - 1.0) / kTwoPi;
  const double cov = x.var * (kPi * r + std::sqrt(1.0 - r * r) - r * std::acos(r) - 1.0) / kTwoPi;
  return {mean, var, corr_of(cov, var)};
}

GradSignal relu_backward(const Signal& x, const GradSignal& d_y) {
  check_signal(x, "relu_backward");
  check_grad(d_y, "relu_backward");
  check_zero_mean(x, "relu_backward");
  const double r = clamp_corr(x.corr);
  const double var = 0.5 * d_y.var;
  const double cov = (0.25 + std::asin(r) / kTwoPi) * d_y.var * d_y.corr;
  return {var, corr_of(cov, var)};
}

Signal pointwise_forward(const std::function<double(double)>& phi, const Signal& x, const GaussHermite& rule) {
  check_signal(x, "pointwise_forward");
  const double sigma = std::sqrt(x.var);
  const double mean = rule.expect(phi, x.mean, sigma);
  const double second = rule.expect([&](double u) { return phi(u) * phi(u); }, x.mean, sigma);
  const double var = std::max(0.0, second - mean * mean);
  const double cross = rule.expect_pair(phi, phi, x.mean, sigma, x.corr);
  return {mean, var, corr_of(cross - mean * mean, var)};
}

GradSignal pointwise_backward(const std::function<double(double)>& d_phi, const Signal& x, const GradSignal& d_y,
                              const GaussHermite& rule) {
  check_signal(x, "pointwise_backward");
  check_grad(d_y, "pointwise_backward");
  const double sigma = std::sqrt(x.var);
  const double slope_sq = rule.expect([&](double u) { return d_phi(u) * d_phi(u); }, x.mean, sigma);
  const double slope_cross = rule.expect_pair(d_phi, d_phi, x.mean, sigma, x.corr);
  const double var = d_y.var * slope_sq;
  return {var, corr_of(d_y.var * d_y.corr * slope_cross, var)};
}

Signal gelu_forward(const Signal& x, const GaussHermite& rule) {
  check_signal(x, "gelu_forward");
  check_zero_mean(x, "gelu_forward");
  const double mean = gelu_mean(x.var);
  const double var = gelu_var(x.var);
  // No closed form for the cross moment: the correlation comes from quadrature, normalised by the quadrature's
  // own variance so that r = 1 maps to 1 exactly.
  const double sigma = std::sqrt(x.var);
  const double q_mean = rule.expect(gelu_erf, 0.0, sigma);
  const double q_second = rule.expect([](double u) { return gelu_erf(u) * gelu_erf(u); }, 0.0, sigma);
  const double q_cross = rule.expect_pair(gelu_erf, gelu_erf, 0.0, sigma, x.corr);
  return {mean, var, corr_of(q_cross - q_mean * q_mean, q_second - q_mean * q_mean)};
}

GradSignal gelu_backward(const Signal& x, const GradSignal& d_y, const GaussHermite& rule) {
  check_signal(x, "gelu_backward");
  check_grad(d_y, "gelu_backward");
  check_zero_mean(x, "gelu_backward");
  const double sigma = std::sqrt(x.var);
  const double q_slope_sq = rule.expect([](double u) { return gelu_erf_grad(u) * gelu_erf_grad(u); }, 0.0, sigma);
  const double q_slope_cross = rule.expect_pair(gelu_erf_grad, gelu_erf_grad, 0.0, sigma, x.corr);
  const double slope_ratio = q_slope_sq > 0.0 ? q_slope_cross / q_slope_sq : 1.0;
  return {d_y.var * gelu_slope_sq(x.var), clamp_corr(d_y.corr * slope_ratio)};
}

Signal tanh_forward(const Signal& x, const GaussHermite& rule) {
  return pointwise_forward([](double u) { return std::tanh(u); }, x, rule);
}

GradSignal tanh_backward(const Signal& x, const GradSignal& d_y, const GaussHermite& rule) {
  return pointwise_backward([](double u) { return activation_derivative(Activation::tanh, u); }, x, d_y, rule);
}

Signal activation_forward(Activation kind, const Signal& x, const GaussHermite& rule) {
  switch (kind) {
    case Activation::identity:
      return identity_forward(x);
    case Activation::relu:
      return relu_forward(x);
    case Activation::tanh:
      return tanh_forward(x, rule);
    case Activation::gelu_tanh:
    case Activation::gelu_erf:
      return gelu_forward(x, rule);
  }
  PROPLAB_CHECK(false, "unknown activation ", static_cast<int>(kind));
  return x;
}

GradSignal activation_backward(Activation kind, const Signal& x, const GradSignal& d_y, const GaussHermite& rule) {
  switch (kind) {
    case Activation::identity:
      return identity_backward(d_y);
    case Activation::relu:
      return relu_backward(x, d_y);
    case Activation::tanh:
      return tanh_backward(x, d_y, rule);
    case Activation::gelu_tanh:
    case Activation::gelu_erf:
      return gelu_backward(x, d_y, rule);
  }
  PROPLAB_CHECK(false, "unknown activation ", static_cast<int>(kind));
  return d_y;
}

// ---- normalisation --------------------------------------------------------------------------------------------

Signal layernorm_forward(const Signal& x, std::int64_t features) {
  check_signal(x, "layernorm_forward");
  PROPLAB_CHECK(features > 1 && x.var > 0.0, "layernorm_forward: needs features > 1 and var > 0, got ", features, ", ",
                x.var);
  return {0.0, 1.0, clamp_corr(layernorm_pair_corr(x.corr, features))};
}

double layernorm_pair_corr(double r, std::int64_t features) {
  PROPLAB_CHECK(features > 1, "layernorm_pair_corr: needs features > 1, got ", features);
  // The expected cosine of two Gaussian vectors of correlation r in n = features − 1 dimensions (the centring
  // leaves features − 1): r·(1 − (1 − r²)/(2n)) to first order in 1/n (docs/theory.md, "LayerNorm").
  return r * (1.0 - (1.0 - r * r) / (2.0 * static_cast<double>(features - 1)));
}

GradSignal layernorm_backward(const Signal& x, const GradSignal& d_y) {
  check_signal(x, "layernorm_backward");
  check_grad(d_y, "layernorm_backward");
  PROPLAB_CHECK(x.var > 0.0, "layernorm_backward: needs var > 0, got ", x.var);
  return {d_y.var / x.var, d_y.corr};
}

Signal rmsnorm_forward(const Signal& x) {
  check_signal(x, "rmsnorm_forward");
  const double second_moment = x.var + x.mean * x.mean;
  PROPLAB_CHECK(second_moment > 0.0, "rmsnorm_forward: needs var + mean² > 0");
  return {x.mean / std::sqrt(second_moment), x.var / second_moment, x.corr};
}

GradSignal rmsnorm_backward(const Signal& x, const GradSignal& d_y) {
  check_signal(x, "rmsnorm_backward");
  check_grad(d_y, "rmsnorm_backward");
  const double second_moment = x.var + x.mean * x.mean;
  PROPLAB_CHECK(second_moment > 0.0, "rmsnorm_backward: needs var + mean² > 0");
  return {d_y.var / second_moment, d_y.corr};
}

// ---- dropout --------------------------------------------------------------------------------------------------

Signal dropout_forward(const Signal& x, double p) {
  check_signal(x, "dropout_forward");
  check_rate(p, "dropout_forward");
  const double var = (x.var + p * x.mean * x.mean) / (1.0 - p);
  return {x.mean, var, corr_of(x.corr * x.var, var)};
}

GradSignal dropout_backward(const GradSignal& d_y, double p) {
  check_grad(d_y, "dropout_backward");
  check_rate(p, "dropout_backward");
  return {d_y.var / (1.0 - p), d_y.corr * (1.0 - p)};
}

// ---- softmax --------------------------------------------------------------------------------------------------

Signal softmax_forward(const Signal& logits, std::int64_t length) {
  check_signal(logits, "softmax_forward");
  PROPLAB_CHECK(length > 1, "softmax_forward: needs length > 1, got ", length);
  const double l = static_cast<double>(length);
  const double var = std::expm1((1.0 - logits.corr) * logits.var) / (l * l);
  return {1.0 / l, var, -1.0 / (l - 1.0)};
}

GradSignal softmax_backward(const Signal& logits, const GradSignal& d_probs, std::int64_t length) {
  check_signal(logits, "softmax_backward");
  check_grad(d_probs, "softmax_backward");
  PROPLAB_CHECK(length > 1, "softmax_backward: needs length > 1, got ", length);
  const double l = static_cast<double>(length);
  const double var = std::exp((1.0 - logits.corr) * logits.var) * (1.0 - d_probs.corr) * d_probs.var / (l * l);
  return {var, -1.0 / (l - 1.0)};
}

// ---- attention ------------------------------------------------------------------------------------------------

namespace {
void check_attention(const AttentionShape& a, const char* map) {
  PROPLAB_CHECK(a.model_dim > 0 && a.head_dim > 0 && a.heads > 0 && a.seq_len > 0, map,
                ": model_dim, head_dim, heads and seq_len must be positive");
  PROPLAB_CHECK(a.q_std >= 0.0 && a.k_std >= 0.0 && a.v_std >= 0.0, map, ": weight stds must be >= 0");
  check_rate(a.dropout, map);
}
}  // namespace

Signal attention_forward(const Signal& x, const AttentionShape& shape) {
  check_signal(x, "attention_forward");
  check_attention(shape, "attention_forward");
  // The mean is a component shared by every token: fold it into the variance and the correlation.
  const double var = x.var + x.mean * x.mean;
  const double r = var > 0.0 ? clamp_corr((x.mean * x.mean + x.corr * x.var) / var) : 1.0;
  const double d = static_cast<double>(shape.model_dim);
  const double l = static_cast<double>(shape.seq_len);
  const double p = shape.dropout;
  const double qk = shape.q_std * shape.k_std;
  const double s = d * var * qk * qk;
  const double logit_var = d * s * var;
  const double var4 = var * var;
  const double v_scale = d * shape.v_std * shape.v_std;
  const double own =
      std::exp((1.0 - r) * logit_var) / (1.0 - p) * (4.0 * (1.0 - r) * (1.0 - r) * s * var4 + (1.0 - r) * var);
  const double out_var = v_scale * (((1.0 - r) * (1.0 - r) * (l - 1.0) * s * var4 + own) / l + r * var);
  const double cross_own =
      std::exp(r * (1.0 - r) * logit_var) * (2.0 * (1.0 + r) * (1.0 - r) * (1.0 - r) * s * var4 + (1.0 - r) * var);
  const double out_cov = v_scale * (r * var + (r * (1.0 - r) * (1.0 - r) * (l - 1.0) * s * var4 + cross_own) / l);
  return {0.0, out_var, corr_of(out_cov, out_var)};
}

GradSignal attention_backward(const GradSignal& d_y, const AttentionShape& shape) {
  check_grad(d_y, "attention_backward");
  check_attention(shape, "attention_backward");
  const double l = static_cast<double>(shape.seq_len);
  const double keep = 1.0 - shape.dropout;
  const double heads = static_cast<double>(shape.heads);
  const double d_k = static_cast<double>(shape.head_dim);
  const double var =
      heads * d_y.var * d_k * shape.v_std * shape.v_std * (1.0 + (l - 1.0) * d_y.corr * keep) / (l * keep);
  const double denom = 1.0 + (l - 1.0) * d_y.corr * keep;
  const double corr = denom != 0.0 ? (1.0 + (l - 1.0) * d_y.corr) * keep / denom : 1.0;
  return {var, clamp_corr(corr)};
}

// ---- residual -------------------------------------------------------------------------------------------------

Signal residual_forward(const Signal& skip, const Signal& branch, double lambda, double beta) {
  check_signal(skip, "residual_forward (skip)");
  check_signal(branch, "residual_forward (branch)");
  const double skip_var = lambda * lambda * skip.var;
  const double branch_var = beta * beta * branch.var;
  const double var = skip_var + branch_var;
  return {lambda * skip.mean + beta * branch.mean, var, corr_of(skip_var * skip.corr + branch_var * branch.corr, var)};
}

GradSignal residual_branch_backward(const GradSignal& d_y, double beta) {
  check_grad(d_y, "residual_branch_backward");
  return {beta * beta * d_y.var, d_y.corr};
}

GradSignal residual_backward(const GradSignal& d_y, const GradSignal& d_x_branch, double lambda) {
  check_grad(d_y, "residual_backward");
  check_grad(d_x_branch, "residual_backward (branch)");
  const double skip_var = lambda * lambda * d_y.var;
  const double var = skip_var + d_x_branch.var;
  return {var, corr_of(skip_var * d_y.corr + d_x_branch.var * d_x_branch.corr, var)};
}

}  // namespace proplab::theory
