#include "theory/token_field.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <numbers>

#include "core/error.h"

namespace proplab::theory {

namespace {

std::size_t cells(std::int64_t length) { return static_cast<std::size_t>(length * length); }

double diagonal_mean(const std::vector<double>& cov, std::int64_t length) {
  double sum = 0.0;
  for (std::int64_t i = 0; i < length; ++i) sum += cov[static_cast<std::size_t>(i * length + i)];
  return length > 0 ? sum / static_cast<double>(length) : 0.0;
}

// (Σ_ij - Σ_i) / ((L - 1)·Σ_i), or `none` when the diagonal is 0 or L = 1.
double pair_corr(const std::vector<double>& cov, std::int64_t length, double none) {
  double total = 0.0, diagonal = 0.0;
  for (const double c : cov) total += c;
  for (std::int64_t i = 0; i < length; ++i) diagonal += cov[static_cast<std::size_t>(i * length + i)];
  if (length < 2 || diagonal <= 0.0) return none;
  return std::clamp((total - diagonal) / (static_cast<double>(length - 1) * diagonal), -1.0, 1.0);
}

// prefix(i, j) = Σ_{a≤i, b≤j} m(a, b).
std::vector<double> prefix_sums(const std::vector<double>& m, std::int64_t length) {
  std::vector<double> out(cells(length));
  for (std::int64_t i = 0; i < length; ++i) {
    double row = 0.0;
    for (std::int64_t j = 0; j < length; ++j) {
      row += m[static_cast<std::size_t>(i * length + j)];
      out[static_cast<std::size_t>(i * length + j)] =
          row + (i > 0 ? out[static_cast<std::size_t>((i - 1) * length + j)] : 0.0);
    }
  }
  return out;
}

// suffix(i, j) = Σ_{a≥i, b≥j} m(a, b).
std::vector<double> suffix_sums(const std::vector<double>& m, std::int64_t length) {
  std::vector<double> out(cells(length));
  for (std::int64_t i = length - 1; i >= 0; --i) {
    double row = 0.0;
    for (std::int64_t j = length - 1; j >= 0; --j) {
      row += m[static_cast<std::size_t>(i * length + j)];
      out[static_cast<std::size_t>(i * length + j)] =
          row + (i + 1 < length ? out[static_cast<std::size_t>((i + 1) * length + j)] : 0.0);
    }
  }
  return out;
}

// The variance across keys 0..i of a field, for each i: Σ_{k≤i} m_kk/n - Σ_{k,m≤i} m_km/n².
std::vector<double> prefix_spread(const TokenField& x) {
  const std::int64_t l = x.length;
  const std::vector<double> prefix = prefix_sums(x.cov, l);
  std::vector<double> spread(static_cast<std::size_t>(l));
  double diagonal = 0.0;
  for (std::int64_t i = 0; i < l; ++i) {
    diagonal += x.at(i, i);
    const double n = static_cast<double>(i + 1);
    spread[static_cast<std::size_t>(i)] =
        std::max(0.0, diagonal / n - prefix[static_cast<std::size_t>(i * l + i)] / (n * n));
  }
  return spread;
}

double pair_r(double cov, double var_i, double var_j) {
  const double scale = std::sqrt(var_i * var_j);
  return scale > 0.0 ? std::clamp(cov / scale, -1.0, 1.0) : 1.0;
}

// The mean, variance and E[φ'²] of φ(u), u ~ N(mean, var).
struct PointMoments {
  double mean = 0.0, var = 0.0, slope_sq = 0.0;
};

PointMoments point_moments(Activation kind, double mean, double var, const GaussHermite& rule) {
  PointMoments m;
  if (var <= 0.0) {
    m.mean = activation_value(kind, mean);
    m.slope_sq = std::pow(activation_derivative(kind, mean), 2);
    return m;
  }
  const bool centred = mean == 0.0;
  if (kind == Activation::identity) return {mean, var, 1.0};
  if (centred && kind == Activation::relu) {
    return {std::sqrt(var / (2.0 * std::numbers::pi)), var * (0.5 - 0.5 / std::numbers::pi), 0.5};
  }
  if (centred && (kind == Activation::gelu_erf || kind == Activation::gelu_tanh)) {
    return {gelu_mean(var), gelu_var(var), gelu_slope_sq(var)};
  }
  const double std_dev = std::sqrt(var);
  auto phi = [kind](double u) { return activation_value(kind, u); };
  m.mean = rule.expect(phi, mean, std_dev);
  m.var = std::max(0.0, rule.expect([&](double u) { return phi(u) * phi(u); }, mean, std_dev) - m.mean * m.mean);
  m.slope_sq = rule.expect([kind](double u) { return std::pow(activation_derivative(kind, u), 2); }, mean, std_dev);
  return m;
}

// The output correlation (forward) and the slope correlation E[φ'(u)φ'(v)]/E[φ'²] (backward) as functions of
// the input pair correlation r at one input mean and variance. ReLU and identity in closed form; others tabulated
// on a uniform grid in θ = arccos r, where both maps are smooth (the arc-cosine kernels are analytic in θ).
}  // namespace

class PairMaps {
 public:
  PairMaps(Activation kind, double mean, double var, const GaussHermite& rule) : kind_(kind), mean_(mean), var_(var) {
    closed_ = kind == Activation::identity || (kind == Activation::relu && mean == 0.0) || var <= 0.0;
    if (closed_) return;
    forward_.resize(kGrid + 1);
    backward_.resize(kGrid + 1);
    for (int g = 0; g <= kGrid; ++g) {
      const double r = std::cos(std::numbers::pi * g / kGrid);
      const Signal x{mean, var, r};
      forward_[g] = activation_forward(kind, x, rule).corr;
      backward_[g] = activation_backward(kind, x, GradSignal{1.0, 1.0}, rule).corr;
    }
  }
  bool matches(Activation kind, double mean, double var) const {
    return kind == kind_ && mean == mean_ && std::abs(var - var_) <= 1e-12 * std::max(1.0, std::abs(var_));
  }
  double forward(double r) const {
    if (kind_ == Activation::identity) return r;
    if (closed_) {
      // ReLU arc-cosine kernel of degree 1, normalised: (√(1-r²) + (π - θ)r - 1) / (π - 1).
      const double theta = std::acos(std::clamp(r, -1.0, 1.0));
      return (std::sin(theta) + (std::numbers::pi - theta) * r - 1.0) / (std::numbers::pi - 1.0);
    }
    return lookup(forward_, r);
  }
  double backward(double r) const {
    if (kind_ == Activation::identity) return 1.0;
    if (closed_) return (std::numbers::pi - std::acos(std::clamp(r, -1.0, 1.0))) / std::numbers::pi;
    return lookup(backward_, r);
  }

 private:
  static constexpr int kGrid = 64;
  static double lookup(const std::vector<double>& table, double r) {
    const double at = std::acos(std::clamp(r, -1.0, 1.0)) / std::numbers::pi * kGrid;
    const int g = std::min(static_cast<int>(at), kGrid - 1);
    const double frac = at - g;
    return table[g] * (1.0 - frac) + table[g + 1] * frac;
  }
  Activation kind_;
  double mean_, var_;
  bool closed_ = false;
  std::vector<double> forward_, backward_;
};

ActivationPairMaps::ActivationPairMaps(const GaussHermite& rule) : rule_(&rule) {}
ActivationPairMaps::~ActivationPairMaps() = default;

const PairMaps& ActivationPairMaps::get(Activation kind, double mean, double var) {
  for (const auto& maps : tables_)
    if (maps->matches(kind, mean, var)) return *maps;
  if (tables_.size() >= 16) tables_.erase(tables_.begin());
  tables_.push_back(std::make_unique<PairMaps>(kind, mean, var, *rule_));
  return *tables_.back();
}

double TokenField::var() const { return diagonal_mean(cov, length); }
double TokenField::corr() const { return pair_corr(cov, length, 1.0); }

TokenField TokenField::exchangeable(std::int64_t length, const Signal& s) {
  PROPLAB_CHECK(length > 0, "TokenField::exchangeable: needs length > 0");
  TokenField f{length, s.mean, std::vector<double>(cells(length), s.corr * s.var)};
  for (std::int64_t i = 0; i < length; ++i) f.at(i, i) = s.var;
  return f;
}

double TokenGrad::var() const { return diagonal_mean(cov, length); }
double TokenGrad::corr() const { return pair_corr(cov, length, 0.0); }

TokenGrad TokenGrad::white(std::int64_t length, double var) {
  TokenGrad g{length, std::vector<double>(cells(length), 0.0)};
  for (std::int64_t i = 0; i < length; ++i) g.at(i, i) = var;
  return g;
}

TokenField linear_forward(const TokenField& x, std::int64_t fan_in, double weight_var, double bias_var) {
  PROPLAB_CHECK(fan_in > 0 && weight_var >= 0.0 && bias_var >= 0.0, "token linear_forward: bad arguments");
  const double gain = static_cast<double>(fan_in) * weight_var, shared = gain * x.mean * x.mean + bias_var;
  TokenField y{x.length, 0.0, x.cov};
  for (double& c : y.cov) c = gain * c + shared;
  return y;
}

TokenGrad linear_backward(const TokenGrad& d_y, std::int64_t fan_out, double weight_var) {
  return scaled(d_y, static_cast<double>(fan_out) * weight_var);
}

TokenField norm_forward(NormKind kind, const TokenField& x, std::int64_t features) {
  const std::int64_t l = x.length;
  TokenField y{l, 0.0, std::vector<double>(cells(l))};
  if (kind == NormKind::layernorm) {
    // layernorm_forward per pair: variance 1, correlation r·(1 - 1/features).
    const double keep = layernorm_forward(Signal{0.0, 1.0, 1.0}, features).corr;
    std::vector<double> inv_std(static_cast<std::size_t>(l));
    for (std::int64_t i = 0; i < l; ++i) {
      PROPLAB_CHECK(x.at(i, i) > 0.0, "token norm_forward: needs a positive variance at every position");
      inv_std[static_cast<std::size_t>(i)] = 1.0 / std::sqrt(x.at(i, i));
    }
#pragma omp parallel for schedule(static)
    for (std::int64_t i = 0; i < l; ++i) {
      for (std::int64_t j = 0; j < l; ++j) {
        const double r = std::clamp(
            x.at(i, j) * inv_std[static_cast<std::size_t>(i)] * inv_std[static_cast<std::size_t>(j)], -1.0, 1.0);
        y.at(i, j) = i == j ? 1.0 : r * keep;
      }
    }
    return y;
  }
  const double mu_sq = x.mean * x.mean;
  y.mean = x.mean / std::sqrt(x.var() + mu_sq);
  for (std::int64_t i = 0; i < l; ++i)
    for (std::int64_t j = 0; j < l; ++j)
      y.at(i, j) = x.at(i, j) / std::sqrt((x.at(i, i) + mu_sq) * (x.at(j, j) + mu_sq));
  return y;
}

TokenGrad norm_backward(NormKind kind, const TokenField& x, const TokenGrad& d_y) {
  const std::int64_t l = x.length;
  const double shift = kind == NormKind::layernorm ? 0.0 : x.mean * x.mean;
  std::vector<double> inv_std(static_cast<std::size_t>(l));
  for (std::int64_t i = 0; i < l; ++i) {
    const double second = x.at(i, i) + shift;
    PROPLAB_CHECK(second > 0.0, "token norm_backward: needs a positive variance at every position");
    inv_std[static_cast<std::size_t>(i)] = 1.0 / std::sqrt(second);
  }
  TokenGrad g{l, std::vector<double>(cells(l))};
  for (std::int64_t i = 0; i < l; ++i)
    for (std::int64_t j = 0; j < l; ++j)
      g.at(i, j) = d_y.at(i, j) * inv_std[static_cast<std::size_t>(i)] * inv_std[static_cast<std::size_t>(j)];
  return g;
}

TokenField activation_forward(Activation kind, const TokenField& x, ActivationPairMaps& tables) {
  const GaussHermite& rule = tables.rule();
  const std::int64_t l = x.length;
  std::vector<PointMoments> point(static_cast<std::size_t>(l));
  for (std::int64_t i = 0; i < l; ++i) {
    const bool same = i > 0 && x.at(i, i) == x.at(i - 1, i - 1);
    point[static_cast<std::size_t>(i)] =
        same ? point[static_cast<std::size_t>(i - 1)] : point_moments(kind, x.mean, x.at(i, i), rule);
  }
  double mean = 0.0;
  for (const PointMoments& p : point) mean += p.mean;
  mean /= static_cast<double>(l);
  const PairMaps& maps = tables.get(kind, x.mean, x.var());
  TokenField y{l, mean, std::vector<double>(cells(l))};
#pragma omp parallel for schedule(dynamic, 8)
  for (std::int64_t i = 0; i < l; ++i) {
    const PointMoments& a = point[static_cast<std::size_t>(i)];
    for (std::int64_t j = 0; j <= i; ++j) {
      const PointMoments& b = point[static_cast<std::size_t>(j)];
      const double shifted = (a.mean - mean) * (b.mean - mean);
      const double c =
          i == j ? a.var + shifted
                 : maps.forward(pair_r(x.at(i, j), x.at(i, i), x.at(j, j))) * std::sqrt(a.var * b.var) + shifted;
      y.at(i, j) = c;
      y.at(j, i) = c;
    }
  }
  return y;
}

TokenGrad activation_backward(Activation kind, const TokenField& x, const TokenGrad& d_y, ActivationPairMaps& tables) {
  const GaussHermite& rule = tables.rule();
  const std::int64_t l = x.length;
  std::vector<double> slope(static_cast<std::size_t>(l));
  for (std::int64_t i = 0; i < l; ++i) {
    const bool same = i > 0 && x.at(i, i) == x.at(i - 1, i - 1);
    slope[static_cast<std::size_t>(i)] = same ? slope[static_cast<std::size_t>(i - 1)]
                                              : std::sqrt(point_moments(kind, x.mean, x.at(i, i), rule).slope_sq);
  }
  const PairMaps& maps = tables.get(kind, x.mean, x.var());
  TokenGrad g{l, std::vector<double>(cells(l))};
#pragma omp parallel for schedule(dynamic, 8)
  for (std::int64_t i = 0; i < l; ++i) {
    for (std::int64_t j = 0; j <= i; ++j) {
      const double factor = slope[static_cast<std::size_t>(i)] * slope[static_cast<std::size_t>(j)] *
                            (i == j ? 1.0 : maps.backward(pair_r(x.at(i, j), x.at(i, i), x.at(j, j))));
      g.at(i, j) = d_y.at(i, j) * factor;
      g.at(j, i) = d_y.at(j, i) * factor;
    }
  }
  return g;
}

TokenField dropout_forward(const TokenField& x, double p) {
  PROPLAB_CHECK(p >= 0.0 && p < 1.0, "token dropout_forward: needs 0 <= p < 1");
  TokenField y = x;
  for (std::int64_t i = 0; i < x.length; ++i) y.at(i, i) += p * (x.at(i, i) + x.mean * x.mean) / (1.0 - p);
  return y;
}

TokenGrad dropout_backward(const TokenGrad& d_y, double p) {
  PROPLAB_CHECK(p >= 0.0 && p < 1.0, "token dropout_backward: needs 0 <= p < 1");
  TokenGrad g = d_y;
  for (std::int64_t i = 0; i < g.length; ++i) g.at(i, i) /= 1.0 - p;
  return g;
}

TokenField residual_forward(const TokenField& skip, const TokenField& branch, double lambda, double beta) {
  PROPLAB_CHECK(skip.length == branch.length, "token residual_forward: lengths differ");
  TokenField y{skip.length, lambda * skip.mean + beta * branch.mean, std::vector<double>(skip.cov.size())};
  for (std::size_t c = 0; c < y.cov.size(); ++c) y.cov[c] = lambda * lambda * skip.cov[c] + beta * beta * branch.cov[c];
  return y;
}

TokenGrad residual_backward(const TokenGrad& d_y, const TokenGrad& d_x_branch, double lambda) {
  PROPLAB_CHECK(d_y.length == d_x_branch.length, "token residual_backward: lengths differ");
  TokenGrad g{d_y.length, std::vector<double>(d_y.cov.size())};
  for (std::size_t c = 0; c < g.cov.size(); ++c) g.cov[c] = lambda * lambda * d_y.cov[c] + d_x_branch.cov[c];
  return g;
}

TokenGrad scaled(const TokenGrad& g, double factor) {
  TokenGrad out = g;
  for (double& c : out.cov) c *= factor;
  return out;
}

CausalWeights causal_weights(const TokenField& q, const TokenField& k, double scale_sq, std::int64_t head_dim) {
  PROPLAB_CHECK(q.length == k.length, "causal_weights: lengths differ");
  const std::int64_t l = q.length;
  CausalWeights w;
  w.length = l;
  const std::vector<double> spread_k = prefix_spread(k);
  const double per_query = scale_sq * static_cast<double>(head_dim);
  w.logit_spread.resize(static_cast<std::size_t>(l));
  w.self_sq.resize(static_cast<std::size_t>(l));
  std::vector<double> same_self(static_cast<std::size_t>(l));
  for (std::int64_t i = 0; i < l; ++i) {
    const double n = static_cast<double>(i + 1);
    const double d = per_query * q.at(i, i) * spread_k[static_cast<std::size_t>(i)];
    const double growth = std::exp(std::min(d, 700.0));
    w.logit_spread[static_cast<std::size_t>(i)] = d;
    w.self_sq[static_cast<std::size_t>(i)] = growth / (growth + n - 1.0);
    same_self[static_cast<std::size_t>(i)] = w.self_sq[static_cast<std::size_t>(i)] / n;
  }
  w.logit_var = per_query * (q.var() + q.mean * q.mean) * (k.var() + k.mean * k.mean);
  w.same_key.assign(cells(l), 0.0);
  w.other_keys.assign(cells(l), 0.0);
#pragma omp parallel for schedule(dynamic, 8)
  for (std::int64_t i = 0; i < l; ++i) {
    const double n_i = static_cast<double>(i + 1);
    for (std::int64_t j = 0; j <= i; ++j) {
      const double n_j = static_cast<double>(j + 1);
      double same = 0.0, other = 0.0;
      if (i == j) {
        same = same_self[static_cast<std::size_t>(i)];
        other = i > 0 ? (1.0 - w.self_sq[static_cast<std::size_t>(i)]) / (n_i * (n_i - 1.0)) : 0.0;
      } else {
        const double rho = pair_r(q.at(i, j), q.at(i, i), q.at(j, j));
        const double boost = std::exp(std::min(
            rho * std::sqrt(w.logit_spread[static_cast<std::size_t>(i)] * w.logit_spread[static_cast<std::size_t>(j)]),
            700.0));
        same = std::min(boost / (n_i * n_j),
                        std::sqrt(same_self[static_cast<std::size_t>(i)] * same_self[static_cast<std::size_t>(j)]));
        // j < i: the shared keys are 0..j (n_j of them); the other n_i·n_j - n_j pairs share the rest.
        other = std::max(0.0, (1.0 - n_j * same) / (n_i * n_j - n_j));
      }
      w.same_key[static_cast<std::size_t>(i * l + j)] = w.same_key[static_cast<std::size_t>(j * l + i)] = same;
      w.other_keys[static_cast<std::size_t>(i * l + j)] = w.other_keys[static_cast<std::size_t>(j * l + i)] = other;
    }
  }
  return w;
}

TokenField causal_mix_forward(const TokenField& v, const CausalWeights& w) {
  PROPLAB_CHECK(v.length == w.length, "causal_mix_forward: lengths differ");
  const std::int64_t l = v.length;
  const std::vector<double> prefix = prefix_sums(v.cov, l);
  std::vector<double> diagonal(static_cast<std::size_t>(l));
  double running = 0.0;
  for (std::int64_t i = 0; i < l; ++i) diagonal[static_cast<std::size_t>(i)] = running += v.at(i, i);
  TokenField out{l, v.mean, std::vector<double>(cells(l))};
  for (std::int64_t i = 0; i < l; ++i) {
    for (std::int64_t j = 0; j <= i; ++j) {
      const std::size_t c = static_cast<std::size_t>(i * l + j);
      const double shared = diagonal[static_cast<std::size_t>(j)];
      const double value = w.same_key[c] * shared + w.other_keys[c] * (prefix[c] - shared);
      out.at(i, j) = out.at(j, i) = value;
    }
  }
  return out;
}

TokenGrad causal_mix_backward(const TokenGrad& d_out, const CausalWeights& w) {
  PROPLAB_CHECK(d_out.length == w.length, "causal_mix_backward: lengths differ");
  const std::int64_t l = d_out.length;
  std::vector<double> other(cells(l)), same(cells(l));
  for (std::size_t c = 0; c < other.size(); ++c) {
    other[c] = w.other_keys[c] * d_out.cov[c];
    same[c] = w.same_key[c] * d_out.cov[c];
  }
  const std::vector<double> other_suffix = suffix_sums(other, l), same_suffix = suffix_sums(same, l);
  TokenGrad g{l, other_suffix};
  for (std::int64_t k = 0; k < l; ++k) g.at(k, k) = same_suffix[static_cast<std::size_t>(k * l + k)];
  return g;
}

ScoreGrads causal_score_backward(const TokenGrad& d_out, const TokenField& v, const TokenField& q, const TokenField& k,
                                 const CausalWeights& w, double scale_sq, std::int64_t head_dim) {
  const std::int64_t l = d_out.length;
  const std::vector<double> spread_v = prefix_spread(v), spread_k = prefix_spread(k);
  ScoreGrads out{TokenGrad::white(l, 0.0), TokenGrad::white(l, 0.0)};
  const double per_query = scale_sq * static_cast<double>(head_dim);
  double key_sum = 0.0;
  for (std::int64_t i = l - 1; i >= 0; --i) {
    const std::size_t at = static_cast<std::size_t>(i);
    const double n = static_cast<double>(i + 1);
    const double score = per_query * d_out.at(i, i) * spread_v[at] * (1.0 - 1.0 / n);
    out.d_q.at(i, i) = score * w.self_sq[at] * spread_k[at];
    key_sum += score * w.self_sq[at] / n * (q.at(i, i) + q.mean * q.mean);
    out.d_k.at(i, i) = key_sum;
  }
  return out;
}

}  // namespace proplab::theory
