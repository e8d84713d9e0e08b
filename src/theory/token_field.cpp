#include "theory/token_field.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <numbers>
#include <utility>

#include "core/error.h"

namespace proplab::theory {

namespace {

std::size_t cells(std::int64_t buckets) { return static_cast<std::size_t>(buckets * buckets); }
std::size_t at_index(std::int64_t a, std::int64_t b, std::int64_t buckets) {
  return static_cast<std::size_t>(a * buckets + b);
}

double pair_r(double cov, double var_i, double var_j) {
  const double scale = std::sqrt(var_i * var_j);
  return scale > 0.0 ? std::clamp(cov / scale, -1.0, 1.0) : 1.0;
}

// A bucket's representative position: its middle. h = (m + 1)/2 is how many of its positions a prefix ending
// there (or a suffix starting there) covers, and n = start + h the representative query's key count.
struct Representative {
  double m = 1.0, h = 1.0, n = 1.0;
};

std::vector<Representative> representatives(const TokenLayout& layout) {
  std::vector<Representative> out(static_cast<std::size_t>(layout.buckets()));
  for (std::int64_t a = 0; a < layout.buckets(); ++a) {
    Representative& r = out[static_cast<std::size_t>(a)];
    r.m = static_cast<double>(layout.size[static_cast<std::size_t>(a)]);
    r.h = (r.m + 1.0) / 2.0;
    r.n = static_cast<double>(layout.start[static_cast<std::size_t>(a)]) + r.h;
  }
  return out;
}

// The total of a bucketed covariance over each bucket pair's token pairs: m_a·m_b·cov(a, b) for a ≠ b, and
// m_a(m_a - 1)·within(a) + m_a·var(a) on the diagonal.
std::vector<double> block_totals(const std::vector<double>& cov, const std::vector<double>& within,
                                 const std::vector<Representative>& reps) {
  const std::int64_t p = static_cast<std::int64_t>(reps.size());
  std::vector<double> t(cells(p));
  for (std::int64_t a = 0; a < p; ++a) {
    const double ma = reps[static_cast<std::size_t>(a)].m;
    for (std::int64_t b = 0; b < p; ++b) {
      const double mb = reps[static_cast<std::size_t>(b)].m;
      const double c = cov[at_index(a, b, p)];
      t[at_index(a, b, p)] = a == b ? ma * (ma - 1.0) * within[static_cast<std::size_t>(a)] + ma * c : ma * mb * c;
    }
  }
  return t;
}

// Sums of a block-total matrix over the token pairs of two representative prefixes (or suffixes): prefix a covers
// buckets before a fully and h_a of bucket a. For identical partial ranges in one bucket, `correction(a)` adds
// h(1 - h/m)·(diagonal term - within term) (the block average spreads the diagonal pairs over the bucket).
class RangeSums {
 public:
  RangeSums(std::vector<double> totals, const std::vector<Representative>& reps, bool suffix)
      : p_(static_cast<std::int64_t>(reps.size())), reps_(&reps), suffix_(suffix), t_(std::move(totals)) {
    // full(a, b): the sum over buckets before a (after a for suffixes) × before b; row(a, b): bucket a × buckets
    // before b; column(a, b): buckets before a × bucket b.
    full_.assign(cells(p_ + 1), 0.0);
    row_.assign(cells(p_ + 1), 0.0);
    column_.assign(cells(p_ + 1), 0.0);
    for (std::int64_t step_a = 0; step_a < p_; ++step_a) {
      for (std::int64_t step_b = 0; step_b < p_; ++step_b) {
        const std::int64_t a = bucket(step_a), b = bucket(step_b);
        const double t = t_[at_index(a, b, p_)];
        // Index by "steps taken": entry (i, j) covers the first i buckets in range order × the first j.
        full_[index(step_a + 1, step_b + 1)] =
            t + full_[index(step_a, step_b + 1)] + full_[index(step_a + 1, step_b)] - full_[index(step_a, step_b)];
        row_[index(step_a, step_b + 1)] = row_[index(step_a, step_b)] + t;
        column_[index(step_a + 1, step_b)] = column_[index(step_a, step_b)] + t;
      }
    }
  }
  // The sum over the token pairs of representative ranges a and b.
  double sum(std::int64_t a, std::int64_t b, double correction = 0.0) const {
    const std::int64_t step_a = step(a), step_b = step(b);
    const double fa = rep(a).h / rep(a).m, fb = rep(b).h / rep(b).m;
    double s = full_[index(step_a, step_b)] + fa * row_[index(step_a, step_b)] + fb * column_[index(step_a, step_b)] +
               fa * fb * t_[at_index(a, b, p_)];
    if (a == b) s += rep(a).h * (1.0 - rep(a).h / rep(a).m) * correction;
    return s;
  }

 private:
  std::int64_t bucket(std::int64_t step) const { return suffix_ ? p_ - 1 - step : step; }
  std::int64_t step(std::int64_t bucket) const { return suffix_ ? p_ - 1 - bucket : bucket; }
  std::size_t index(std::int64_t i, std::int64_t j) const { return static_cast<std::size_t>(i * (p_ + 1) + j); }
  const Representative& rep(std::int64_t a) const { return (*reps_)[static_cast<std::size_t>(a)]; }
  std::int64_t p_;
  const std::vector<Representative>* reps_;
  bool suffix_;
  std::vector<double> t_, full_, row_, column_;
};

// Per representative query a: the variance sum over its keys' diagonal, Σ_{k≤i} var(k), and the prefix spread
// Σ_{k≤i} var(k)/n - Σ_{k,m≤i} cov(k, m)/n².
struct PrefixStats {
  std::vector<double> diagonal, spread;
};

PrefixStats prefix_stats(const TokenCov& x, const std::vector<Representative>& reps, const RangeSums& sums) {
  const std::int64_t p = x.buckets();
  PrefixStats out{std::vector<double>(static_cast<std::size_t>(p)), std::vector<double>(static_cast<std::size_t>(p))};
  double before = 0.0;
  for (std::int64_t a = 0; a < p; ++a) {
    const Representative& r = reps[static_cast<std::size_t>(a)];
    const double diagonal = before + r.h * x.diag(a);
    before += r.m * x.diag(a);
    out.diagonal[static_cast<std::size_t>(a)] = diagonal;
    const double total = sums.sum(a, a, x.diag(a) - x.within[static_cast<std::size_t>(a)]);
    out.spread[static_cast<std::size_t>(a)] = std::max(0.0, diagonal / r.n - total / (r.n * r.n));
  }
  return out;
}

// Applies f(covariance, var_i, var_j, same_token) to every entry: off-diagonal pairs, the diagonal (same token)
// and the within-bucket pairs.
template <typename F>
void map_pairs(const TokenCov& in, TokenCov& out, F f) {
  const std::int64_t p = in.buckets();
  out.layout = in.layout;
  out.cov.resize(cells(p));
  out.within.resize(static_cast<std::size_t>(p));
  for (std::int64_t a = 0; a < p; ++a) {
    for (std::int64_t b = 0; b < p; ++b)
      out.cov[at_index(a, b, p)] = f(in.at(a, b), in.diag(a), in.diag(b), a == b, a, b);
    out.within[static_cast<std::size_t>(a)] =
        f(in.within[static_cast<std::size_t>(a)], in.diag(a), in.diag(a), false, a, a);
  }
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
    const Signal y = relu_forward(Signal{0.0, var, 0.0});
    return {y.mean, y.var, 0.5};
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
  // A table within 10⁻⁴ (relative) of the asked variance is reused: the normalised maps move by O(10⁻⁴) over it,
  // and the norms' ε makes every block's normed variance differ in its last digits (s²/(s² + ε)).
  bool matches(Activation kind, double mean, double var) const {
    return kind == kind_ && mean == mean_ && std::abs(var - var_) <= 1e-4 * std::max(1e-300, std::abs(var_));
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

std::shared_ptr<const TokenLayout> TokenLayout::exact(std::int64_t length) {
  PROPLAB_CHECK(length > 0, "TokenLayout::exact: needs length > 0");
  auto layout = std::make_shared<TokenLayout>();
  layout->length = length;
  for (std::int64_t i = 0; i < length; ++i) layout->start.push_back(i), layout->size.push_back(1);
  return layout;
}

std::shared_ptr<const TokenLayout> TokenLayout::for_length(std::int64_t length) {
  if (length <= 40) return exact(length);
  auto layout = std::make_shared<TokenLayout>();
  layout->length = length;
  std::int64_t at = 0;
  while (at < length) {
    const std::int64_t width =
        at < 32 ? 1 : std::min(length - at, static_cast<std::int64_t>(std::ceil(0.15 * static_cast<double>(at))));
    layout->start.push_back(at);
    layout->size.push_back(width);
    at += width;
  }
  return layout;
}

double TokenCov::var() const {
  double sum = 0.0;
  for (std::int64_t a = 0; a < buckets(); ++a)
    sum += static_cast<double>(layout->size[static_cast<std::size_t>(a)]) * diag(a);
  return sum / static_cast<double>(layout->length);
}

double TokenCov::pair_mean() const {
  const std::int64_t p = buckets();
  double sum = 0.0;
  for (std::int64_t a = 0; a < p; ++a) {
    const double ma = static_cast<double>(layout->size[static_cast<std::size_t>(a)]);
    sum += ma * diag(a) + ma * (ma - 1.0) * within[static_cast<std::size_t>(a)];
    for (std::int64_t b = 0; b < p; ++b)
      if (b != a) sum += ma * static_cast<double>(layout->size[static_cast<std::size_t>(b)]) * at(a, b);
  }
  const double length = static_cast<double>(layout->length);
  return sum / (length * length);
}

double TokenCov::corr(double none) const {
  const std::int64_t p = buckets();
  double pairs = 0.0, diagonal = 0.0;
  for (std::int64_t a = 0; a < p; ++a) {
    const double ma = static_cast<double>(layout->size[static_cast<std::size_t>(a)]);
    diagonal += ma * diag(a);
    pairs += ma * (ma - 1.0) * within[static_cast<std::size_t>(a)];
    for (std::int64_t b = 0; b < p; ++b)
      if (b != a) pairs += ma * static_cast<double>(layout->size[static_cast<std::size_t>(b)]) * at(a, b);
  }
  if (layout->length < 2 || diagonal <= 0.0) return none;
  return std::clamp(pairs / (static_cast<double>(layout->length - 1) * diagonal), -1.0, 1.0);
}

TokenCov TokenCov::filled(std::shared_ptr<const TokenLayout> layout, double var, double covariance) {
  PROPLAB_CHECK(layout != nullptr, "TokenCov::filled: needs a layout");
  const std::int64_t p = layout->buckets();
  TokenCov c{std::move(layout), std::vector<double>(cells(p), covariance),
             std::vector<double>(static_cast<std::size_t>(p), covariance)};
  for (std::int64_t a = 0; a < p; ++a) c.at(a, a) = var;
  return c;
}

TokenField TokenField::exchangeable(std::shared_ptr<const TokenLayout> layout, const Signal& s) {
  TokenField f;
  static_cast<TokenCov&>(f) = TokenCov::filled(std::move(layout), s.var, s.corr * s.var);
  f.mean = s.mean;
  return f;
}

TokenGrad TokenGrad::white(std::shared_ptr<const TokenLayout> layout, double var) {
  TokenGrad g;
  static_cast<TokenCov&>(g) = TokenCov::filled(std::move(layout), var, 0.0);
  return g;
}

TokenField linear_forward(const TokenField& x, std::int64_t fan_in, double weight_var, double bias_var) {
  PROPLAB_CHECK(fan_in > 0 && weight_var >= 0.0 && bias_var >= 0.0, "token linear_forward: bad arguments");
  const double gain = static_cast<double>(fan_in) * weight_var, shared = gain * x.mean * x.mean + bias_var;
  TokenField y = x;
  y.mean = 0.0;
  y.bucket_mean.clear();
  if (!x.bucket_mean.empty()) {
    // The positions' own means: E[x_a x_b] = cov(a, b) + μ·(μ_a + μ_b) − μ² (the covariances are about μ).
    const std::int64_t p = x.buckets();
    PROPLAB_CHECK(static_cast<std::int64_t>(x.bucket_mean.size()) == p, "token linear_forward: bucket means");
    const double mu = x.mean;
    for (std::int64_t a = 0; a < p; ++a) {
      const double ma = x.bucket_mean[static_cast<std::size_t>(a)];
      for (std::int64_t b = 0; b < p; ++b)
        y.at(a, b) = gain * (x.at(a, b) + mu * (ma + x.bucket_mean[static_cast<std::size_t>(b)]) - mu * mu) + bias_var;
      y.within[static_cast<std::size_t>(a)] =
          gain * (x.within[static_cast<std::size_t>(a)] + 2.0 * mu * ma - mu * mu) + bias_var;
    }
    return y;
  }
  for (double& c : y.cov) c = gain * c + shared;
  for (double& c : y.within) c = gain * c + shared;
  return y;
}

TokenGrad linear_backward(const TokenGrad& d_y, std::int64_t fan_out, double weight_var) {
  return scaled(d_y, static_cast<double>(fan_out) * weight_var);
}

TokenField norm_forward(NormKind kind, const TokenField& x, std::int64_t features, double eps) {
  TokenField y;
  for (std::int64_t a = 0; a < x.buckets(); ++a)
    PROPLAB_CHECK(x.diag(a) > 0.0, "token norm_forward: needs a positive variance at every position");
  if (kind == NormKind::layernorm) {
    // layernorm_forward per pair: variance 1, correlation layernorm_pair_corr(r) (the two outputs' expected
    // cosine); ε shrinks a token whose feature variance is s² ≈ (1 - 1/features)·var by s²/(s² + ε).
    const double centred = 1.0 - 1.0 / static_cast<double>(features);
    auto shrink = [&](double v) { return eps > 0.0 ? centred * v / (centred * v + eps) : 1.0; };
    map_pairs(x, y, [&](double c, double vi, double vj, bool same, std::int64_t, std::int64_t) {
      return same ? shrink(vi)
                  : layernorm_pair_corr(pair_r(c, vi, vj), features) * std::sqrt(shrink(vi) * shrink(vj));
    });
    return y;
  }
  const double mu_sq = x.mean * x.mean;
  y.mean = x.mean / std::sqrt(x.var() + mu_sq + eps);
  map_pairs(x, y, [mu_sq, eps](double c, double vi, double vj, bool, std::int64_t, std::int64_t) {
    return c / std::sqrt((vi + mu_sq + eps) * (vj + mu_sq + eps));
  });
  return y;
}

TokenGrad norm_backward(NormKind kind, const TokenField& x, const TokenGrad& d_y, double eps) {
  const double shift = (kind == NormKind::layernorm ? 0.0 : x.mean * x.mean) + eps;
  const std::int64_t p = x.buckets();
  std::vector<double> inv_std(static_cast<std::size_t>(p));
  for (std::int64_t a = 0; a < p; ++a) {
    PROPLAB_CHECK(x.diag(a) + shift > 0.0, "token norm_backward: needs a positive variance at every position");
    inv_std[static_cast<std::size_t>(a)] = 1.0 / std::sqrt(x.diag(a) + shift);
  }
  TokenGrad g;
  map_pairs(d_y, g, [&](double c, double, double, bool, std::int64_t a, std::int64_t b) {
    return c * inv_std[static_cast<std::size_t>(a)] * inv_std[static_cast<std::size_t>(b)];
  });
  return g;
}

TokenField activation_forward(Activation kind, const TokenField& x, ActivationPairMaps& tables) {
  const std::int64_t p = x.buckets();
  const std::vector<Representative> reps = representatives(*x.layout);
  std::vector<PointMoments> point(static_cast<std::size_t>(p));
  for (std::int64_t a = 0; a < p; ++a) {
    const bool same = a > 0 && x.diag(a) == x.diag(a - 1);
    point[static_cast<std::size_t>(a)] =
        same ? point[static_cast<std::size_t>(a - 1)] : point_moments(kind, x.mean, x.diag(a), tables.rule());
  }
  double mean = 0.0;
  for (std::int64_t a = 0; a < p; ++a)
    mean += reps[static_cast<std::size_t>(a)].m * point[static_cast<std::size_t>(a)].mean;
  mean /= static_cast<double>(x.layout->length);
  const PairMaps& maps = tables.get(kind, x.mean, x.var());
  TokenField y;
  y.mean = mean;
  for (std::int64_t a = 1; a < p; ++a)
    if (point[static_cast<std::size_t>(a)].mean != point[0].mean) {
      y.bucket_mean.resize(static_cast<std::size_t>(p));
      for (std::int64_t b = 0; b < p; ++b)
        y.bucket_mean[static_cast<std::size_t>(b)] = point[static_cast<std::size_t>(b)].mean;
      break;
    }
  map_pairs(x, y, [&](double c, double vi, double vj, bool same, std::int64_t a, std::int64_t b) {
    const PointMoments& pa = point[static_cast<std::size_t>(a)];
    const PointMoments& pb = point[static_cast<std::size_t>(b)];
    const double shifted = (pa.mean - mean) * (pb.mean - mean);
    return same ? pa.var + shifted : maps.forward(pair_r(c, vi, vj)) * std::sqrt(pa.var * pb.var) + shifted;
  });
  return y;
}

TokenGrad activation_backward(Activation kind, const TokenField& x, const TokenGrad& d_y, ActivationPairMaps& tables) {
  const std::int64_t p = x.buckets();
  std::vector<double> slope(static_cast<std::size_t>(p));
  for (std::int64_t a = 0; a < p; ++a) {
    const bool same = a > 0 && x.diag(a) == x.diag(a - 1);
    slope[static_cast<std::size_t>(a)] =
        same ? slope[static_cast<std::size_t>(a - 1)]
             : std::sqrt(point_moments(kind, x.mean, x.diag(a), tables.rule()).slope_sq);
  }
  const PairMaps& maps = tables.get(kind, x.mean, x.var());
  // The slope correlation of each pair comes from the forward field's pair correlation.
  TokenGrad factors;
  map_pairs(x, factors, [&](double c, double vi, double vj, bool same, std::int64_t a, std::int64_t b) {
    return slope[static_cast<std::size_t>(a)] * slope[static_cast<std::size_t>(b)] *
           (same ? 1.0 : maps.backward(pair_r(c, vi, vj)));
  });
  TokenGrad g = d_y;
  for (std::size_t i = 0; i < g.cov.size(); ++i) g.cov[i] *= factors.cov[i];
  for (std::size_t i = 0; i < g.within.size(); ++i) g.within[i] *= factors.within[i];
  return g;
}

TokenField dropout_forward(const TokenField& x, double p) {
  PROPLAB_CHECK(p >= 0.0 && p < 1.0, "token dropout_forward: needs 0 <= p < 1");
  TokenField y = x;
  for (std::int64_t a = 0; a < x.buckets(); ++a) y.at(a, a) += p * (x.diag(a) + x.mean * x.mean) / (1.0 - p);
  return y;
}

TokenGrad dropout_backward(const TokenGrad& d_y, double p) {
  PROPLAB_CHECK(p >= 0.0 && p < 1.0, "token dropout_backward: needs 0 <= p < 1");
  TokenGrad g = d_y;
  for (std::int64_t a = 0; a < g.buckets(); ++a) g.at(a, a) /= 1.0 - p;
  return g;
}

TokenField residual_forward(const TokenField& skip, const TokenField& branch, double lambda, double beta) {
  PROPLAB_CHECK(skip.layout == branch.layout, "token residual_forward: layouts differ");
  TokenField y = skip;
  y.bucket_mean.clear();  // a residual sum's inputs have position-independent means here (linear outputs)
  y.mean = lambda * skip.mean + beta * branch.mean;
  const double l2 = lambda * lambda, b2 = beta * beta;
  for (std::size_t i = 0; i < y.cov.size(); ++i) y.cov[i] = l2 * skip.cov[i] + b2 * branch.cov[i];
  for (std::size_t i = 0; i < y.within.size(); ++i) y.within[i] = l2 * skip.within[i] + b2 * branch.within[i];
  return y;
}

TokenGrad residual_backward(const TokenGrad& d_y, const TokenGrad& d_x_branch, double lambda) {
  PROPLAB_CHECK(d_y.layout == d_x_branch.layout, "token residual_backward: layouts differ");
  TokenGrad g = d_y;
  const double l2 = lambda * lambda;
  for (std::size_t i = 0; i < g.cov.size(); ++i) g.cov[i] = l2 * d_y.cov[i] + d_x_branch.cov[i];
  for (std::size_t i = 0; i < g.within.size(); ++i) g.within[i] = l2 * d_y.within[i] + d_x_branch.within[i];
  return g;
}

std::vector<double> sum_norm_gradient_factors(NormKind kind, const TokenField& input, const TokenField& sum,
                                              double lambda, double input_kappa, double branch_kappa,
                                              std::int64_t features, const std::vector<double>& mean_share,
                                              std::vector<double>* jensen) {
  const std::int64_t p = sum.buckets();
  PROPLAB_CHECK(input.buckets() == p && static_cast<std::int64_t>(mean_share.size()) == p && features > 0,
                "sum_norm_gradient_factors: needs one mean share per position and features > 0");
  const double d = static_cast<double>(features);
  std::vector<double> factor(static_cast<std::size_t>(p), 1.0);
  if (jensen) jensen->assign(static_cast<std::size_t>(p), 1.0);
  for (std::int64_t t = 0; t < p; ++t) {
    const std::size_t i = static_cast<std::size_t>(t);
    const double total = sum.diag(t);
    const double a = total > 0.0 ? std::clamp(lambda * lambda * input.diag(t) / total, 0.0, 1.0) : 1.0, b = 1.0 - a;
    const double spread = 1.0 + (input_kappa * a * a + 4.0 * a * b + branch_kappa * b * b) / d;
    if (jensen) (*jensen)[i] = spread;
    // LayerNorm divides by the token's variance about its own feature mean, E = Var·(1 − u/d) with u the share that
    // is not centred already (the branch's, or the whole of a Gaussian input's), and projects out the gradient's
    // mean, which only a branch's return has.
    const double uncentred = input_kappa > 0.0 ? 1.0 : b;
    factor[i] = spread + (kind == NormKind::layernorm ? (uncentred - std::clamp(mean_share[i], 0.0, 1.0)) / d : 0.0);
  }
  return factor;
}

TokenGrad scale_positions(const TokenGrad& g, const std::vector<double>& factor) {
  PROPLAB_CHECK(static_cast<std::int64_t>(factor.size()) == g.buckets(),
                "scale_positions: needs one factor per bucket");
  TokenGrad out;
  map_pairs(g, out, [&](double c, double, double, bool, std::int64_t a, std::int64_t b) {
    return c * std::sqrt(factor[static_cast<std::size_t>(a)] * factor[static_cast<std::size_t>(b)]);
  });
  return out;
}

double activation_square_ratio(Activation kind, double mean, double var, const GaussHermite& rule) {
  if (kind == Activation::identity) {  // E[u⁴] = μ⁴ + 6μ²σ² + 3σ⁴ over E[u²]² = (μ² + σ²)²
    const double mu_sq = mean * mean, second = mu_sq + var;
    return second > 0.0 ? (mu_sq * mu_sq + 6.0 * mu_sq * var + 3.0 * var * var) / (second * second) : 1.0;
  }
  if (kind == Activation::relu && mean == 0.0) return 6.0;  // E[z⁴; z > 0]/E[z²; z > 0]² = (3/2)/(1/4), exactly
  const double std_dev = std::sqrt(std::max(0.0, var));
  const double second = rule.expect([kind](double u) { return std::pow(activation_value(kind, u), 2); }, mean, std_dev);
  const double fourth = rule.expect([kind](double u) { return std::pow(activation_value(kind, u), 4); }, mean, std_dev);
  return second > 0.0 ? fourth / (second * second) : 1.0;
}

TokenGrad scaled(const TokenGrad& g, double factor) {
  TokenGrad out = g;
  for (double& c : out.cov) c *= factor;
  for (double& c : out.within) c *= factor;
  return out;
}

namespace {

// softmax_weight_moments' tables: per √spread grid point, on a grid of log t, log φ(t), t²ψ_2, t³ψ_3 and t⁴ψ_4
// (trapezoid over z ~ N(0, spread) on ±8 sd; with u = log t + z each term is exp(k·u − e^u), which neither
// overflows nor loses its peak).
constexpr int kRootSteps = 60;  // √spread in steps of 0.1 up to 6
constexpr double kRootStep = 0.1;
constexpr int kLogT = 600, kZ = 201;
// The weights of n keys sit near log t ≈ −log n − spread/2: this range holds 10⁸ keys at the largest spread and the
// slow tail of two keys (φ(t) ≈ Φ(−log t/√spread)).
constexpr double kLogTLow = -40.0, kLogTHigh = 56.0;

struct SpreadTable {
  // chi = t·E[z e^z exp(−t e^z)] and psi2_zz = t²·E[z² e^{2z} exp(−t e^z)] (z the logit) give the weighted logits'
  // moments E[(Σ_j P_j z_j)²] and E[Σ_j P_j² z_j²].
  std::array<double, kLogT> log_phi{}, psi1{}, psi2{}, psi3{}, psi4{}, chi{}, psi2_zz{};
};

SpreadTable spread_table(double spread) {
  SpreadTable table;
  const double sd = std::sqrt(spread), dz = 16.0 * sd / (kZ - 1), dlt = (kLogTHigh - kLogTLow) / (kLogT - 1);
  std::array<double, kZ> z{}, w{};
  for (int i = 0; i < kZ; ++i) {
    z[i] = -8.0 * sd + i * dz;
    w[i] = spread > 0.0 ? std::exp(-0.5 * z[i] * z[i] / spread) / std::sqrt(2.0 * std::numbers::pi * spread) * dz *
                              (i == 0 || i == kZ - 1 ? 0.5 : 1.0)
                        : (i == 0 ? 1.0 : 0.0);  // every logit 0
  }
  for (int k = 0; k < kLogT; ++k) {
    const double lt = kLogTLow + k * dlt;
    double phi = 0.0, p1 = 0.0, p2 = 0.0, p3 = 0.0, p4 = 0.0, chi = 0.0, p2zz = 0.0;
    for (int i = 0; i < kZ; ++i) {
      const double u = lt + z[i];
      if (u > 700.0) continue;  // exp(−e^u) = 0
      const double e = std::exp(u), a = w[i] * std::exp(-e);
      phi += a;
      p1 += a * e;
      p2 += a * e * e;
      p3 += a * e * e * e;
      p4 += a * e * e * e * e;
      chi += a * e * z[i];
      p2zz += a * e * e * z[i] * z[i];
    }
    table.log_phi[k] = phi > 0.0 ? std::log(phi) : -1e300;
    table.psi1[k] = p1;
    table.psi2[k] = p2;
    table.psi3[k] = p3;
    table.psi4[k] = p4;
    table.chi[k] = chi;
    table.psi2_zz[k] = p2zz;
  }
  return table;
}

// The table at grid point `index` (√spread = index·kRootStep), built on first use and kept.
const SpreadTable& table_at(int index) {
  static std::mutex mutex;
  static std::map<int, SpreadTable> tables;
  const std::lock_guard<std::mutex> lock(mutex);
  auto table = tables.find(index);
  if (table == tables.end()) {
    const double r = index * kRootStep;
    table = tables.emplace(index, spread_table(r * r)).first;
  }
  return table->second;  // std::map keeps its elements in place
}

// The moments at one grid point (logit variance `spread` > 0) for n keys.
SoftmaxWeightMoments moments_at(const SpreadTable& table, double n, double spread) {
  const double dlt = (kLogTHigh - kLogTLow) / (kLogT - 1);
  double p2 = 0.0, p3 = 0.0, p4 = 0.0, p22 = 0.0, pzz = 0.0, chi2 = 0.0;
  for (int k = 0; k < kLogT; ++k) {
    if (table.log_phi[k] < -1e299) continue;
    const double trap = (k == 0 || k == kLogT - 1 ? 0.5 : 1.0) * dlt;
    const double others = std::exp((n - 1.0) * table.log_phi[k]);   // φ^{n−1}
    const double others2 = std::exp((n - 2.0) * table.log_phi[k]);  // φ^{n−2}
    p2 += trap * table.psi2[k] * others;
    p3 += trap * table.psi3[k] * others / 2.0;
    p4 += trap * table.psi4[k] * others / 6.0;
    p22 += trap * table.psi2[k] * table.psi2[k] * others2 / 6.0;
    pzz += trap * table.psi2_zz[k] * others;
    chi2 += trap * table.chi[k] * table.chi[k] * others2;
  }
  const double sum_sq = n * p2, sum_cube = n * p3, sum_sq_sq = n * p4 + n * (n - 1.0) * p22;
  const double self_tilt = n * pzz / spread, tilt_sq = self_tilt + n * (n - 1.0) * chi2 / spread;
  return {std::clamp(sum_sq, 1.0 / n, 1.0), std::max(0.0, sum_sq - 2.0 * sum_cube + sum_sq_sq), tilt_sq, self_tilt};
}

// E[z_max²] for the largest of n i.i.d. N(0, 1): ∫ z²·n·φ(z)·Φ(z)^{n−1} dz (trapezoid on [−8, 12]).
double max_square_uncached(double n) {
  constexpr int steps = 4000;
  const double low = -8.0, dz = 20.0 / steps;
  double sum = 0.0;
  for (int i = 0; i <= steps; ++i) {
    const double z = low + i * dz, cdf = normal_cdf(z);
    const double density = n * normal_pdf(z) * std::pow(cdf, n - 1.0);
    sum += (i == 0 || i == steps ? 0.5 : 1.0) * dz * z * z * density;
  }
  return sum;
}

double max_square(double n) {
  static std::mutex mutex;
  static std::map<double, double> cache;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto found = cache.find(n);
  return found != cache.end() ? found->second : cache.emplace(n, max_square_uncached(n)).first->second;
}

}  // namespace

SoftmaxWeightMoments softmax_weight_moments(double keys, double spread) {
  PROPLAB_CHECK(keys >= 1.0 && spread >= 0.0, "softmax_weight_moments: needs keys >= 1 and spread >= 0, got ", keys,
                " and ", spread);
  if (keys <= 1.0) return {1.0, 0.0, 1.0, 1.0};
  static std::mutex mutex;
  static std::map<std::pair<double, int>, SoftmaxWeightMoments> cache;
  auto at = [&](int index) {
    if (index == 0)  // uniform weights
      return SoftmaxWeightMoments{1.0 / keys, (1.0 / keys) * (1.0 - 1.0 / keys), 1.0 / keys, 1.0 / keys};
    {
      const std::lock_guard<std::mutex> lock(mutex);
      const auto found = cache.find({keys, index});
      if (found != cache.end()) return found->second;
    }
    const double r = index * kRootStep;
    const SoftmaxWeightMoments m = moments_at(table_at(index), keys, r * r);
    const std::lock_guard<std::mutex> lock(mutex);
    cache.emplace(std::make_pair(keys, index), m);
    return m;
  };
  const double root = std::sqrt(spread), table_root = kRootSteps * kRootStep;
  if (root > table_root) {
    // Beyond the table the weights are nearly one-hot, and both moments fall as 1/√spread (docs/theory.md,
    // "Saturated softmax"): 1 − E[ΣP²] from the table's last point, the Jacobian towards (1 − E[ΣP²])/3 with a
    // 1/spread correction that meets the table there, capped by the table's last value (which the correction would
    // exceed just past the edge for thousands of keys).
    const SoftmaxWeightMoments edge = at(kRootSteps);
    const double gap = (1.0 - edge.sum_sq) * table_root / root;
    const double correction = table_root * table_root * ((1.0 - edge.sum_sq) / 3.0 - edge.jacobian);
    // The weighted logits: E[Σ P² z²] tends to E[z_max²] as the top weight does to 1, closing its gap at the
    // table's edge as 1/√spread; the pairs' part of E[(Σ P z)²] falls with the second weight, as 1 − E[ΣP²] does.
    const double top = max_square(keys), self = top - (top - edge.self_tilt) * table_root / root;
    const double pairs = (edge.tilt_sq - edge.self_tilt) * table_root / root;
    return {std::clamp(1.0 - gap, 1.0 / keys, 1.0), std::clamp(gap / 3.0 - correction / spread, 0.0, edge.jacobian),
            self + pairs, self};
  }
  const int below = std::min(static_cast<int>(root / kRootStep), kRootSteps - 1);
  const double frac = root / kRootStep - below;
  const SoftmaxWeightMoments lo = at(below), hi = at(below + 1);
  auto mix = [&](double SoftmaxWeightMoments::*field) { return lo.*field + frac * (hi.*field - lo.*field); };
  return {mix(&SoftmaxWeightMoments::sum_sq), mix(&SoftmaxWeightMoments::jacobian), mix(&SoftmaxWeightMoments::tilt_sq),
          mix(&SoftmaxWeightMoments::self_tilt)};
}

namespace {

// The weights' integrals once each bucket's functions are on a grid of log t: per bucket x with keys, E[w] =
// Σ_i weight(i)·Π_{m≠x} φ_m·ψ_1,x and E[w²] the same with ψ_2,x over the grid points that `use(i)` keeps and where
// Π_{m≠x} φ_m is above e^{−60} (a bucket that shares its source's spread copies its integrals), E[w] then normalised
// so that Σ_x counts[x]·E[w_x] = 1 (the quadrature's drift). False when no weight is found.
template <class Functions, class Weight, class Use>
bool weight_integrals(const std::vector<double>& counts, const std::vector<std::size_t>& source, std::size_t points,
                      const Functions& log_all, const std::vector<Functions>& log_phi,
                      const std::vector<Functions>& psi1, const std::vector<Functions>& psi2, Weight weight, Use use,
                      std::vector<double>& mean, std::vector<double>& sq) {
  const std::size_t nx = counts.size();
  mean.assign(nx, 0.0);
  sq.assign(nx, 0.0);
  double total = 0.0;
  for (std::size_t x = 0; x < nx; ++x) {
    if (counts[x] <= 0.0) continue;
    const std::size_t from = source[x];
    if (from != x) {
      mean[x] = mean[from];
      sq[x] = sq[from];
    } else {
      for (std::size_t i = 0; i < points; ++i) {
        const double others = log_all[i] - log_phi[x][i];  // log Π_{m≠x} φ_m
        if (!use(i) || others < -60.0) continue;
        const double f = weight(i) * std::exp(others);
        mean[x] += f * psi1[x][i];
        sq[x] += f * psi2[x][i];
      }
    }
    total += counts[x] * mean[x];
  }
  if (!(total > 0.0)) return false;
  for (std::size_t x = 0; x < nx; ++x) mean[x] /= total;
  return true;
}

// The functions of a spread within the table (√D = root ≤ 6) at the tables' grid point k of log t, interpolated
// linearly in √D between the two table points around it.
struct TableMix {
  const SpreadTable *lo, *hi;
  double frac;
  explicit TableMix(double root) {
    const int below = std::min(static_cast<int>(root / kRootStep), kRootSteps - 1);
    frac = root / kRootStep - below;
    lo = &table_at(below);
    hi = &table_at(below + 1);
  }
  double log_phi(std::size_t k) const { return lo->log_phi[k] + frac * (hi->log_phi[k] - lo->log_phi[k]); }
  double psi1(std::size_t k) const { return lo->psi1[k] + frac * (hi->psi1[k] - lo->psi1[k]); }
  double psi2(std::size_t k) const { return lo->psi2[k] + frac * (hi->psi2[k] - lo->psi2[k]); }
};

// The representation's functions of one logit spread D beyond the table, as functions of log t: with Y = log E − z
// (E ~ Exp(1), z ~ N(0, D)), φ(t) = E[exp(−t·e^z)] = P(Y > log t) and t·ψ_1(t) = E[t·e^z·exp(−t·e^z)] is Y's density
// at log t; t²·ψ_2 is the density of log G − z (G ~ Gamma(2)). log E has mean −γ, variance π²/6 and third cumulant
// −2ζ(3), so past √D = 6 Y's skewness is under 0.011 and both are Gaussian: Y ~ N(−γ, D + π²/6), log G − z ~
// N(1 − γ, D + π²/6 − 1).
struct SpreadFunctions {
  double log_phi, psi1, psi2;
};
constexpr double kEulerGamma = 0.57721566490153286;                            // −E[log E]
constexpr double kLogExpVariance = std::numbers::pi * std::numbers::pi / 6.0;  // Var(log E)
SpreadFunctions wide_spread_functions(double log_t, double spread) {
  constexpr double gamma = kEulerGamma, zeta_term = kLogExpVariance;
  const double s1 = std::sqrt(spread + zeta_term), s2 = std::sqrt(spread + zeta_term - 1.0);
  const double cdf = normal_cdf((-gamma - log_t) / s1);
  return {cdf > 0.0 ? std::log(cdf) : -1e300, normal_pdf((log_t + gamma) / s1) / s1,
          normal_pdf((log_t - 1.0 + gamma) / s2) / s2};
}

// own_spread_weights with a spread beyond the table: the same integrals on a grid of log t that is the tables' own
// inside [kLogTLow, kLogTHigh] and grows geometrically (5% a step) outside it, out to 9 sd of the widest Y; a spread
// within the table reads its table inside that range and φ = 1 (below) or 0 (above) outside it, where its weight
// functions have fallen below e^{−40}. `widest`: the largest spread of a bucket with keys.
bool wide_spread_weights(const std::vector<double>& counts, const std::vector<double>& spreads, double widest,
                         std::vector<double>& mean, std::vector<double>& sq) {
  const std::size_t nx = counts.size();
  const double table_root = kRootSteps * kRootStep, dlt = (kLogTHigh - kLogTLow) / (kLogT - 1);
  const double reach = 9.0 * std::sqrt(widest + std::numbers::pi * std::numbers::pi / 6.0) + 1.0;
  std::vector<double> below, nodes;
  for (double step = dlt, at = kLogTLow - dlt; at > -reach; step *= 1.05, at -= step) below.push_back(at);
  nodes.assign(below.rbegin(), below.rend());
  for (int k = 0; k < kLogT; ++k) nodes.push_back(kLogTLow + k * dlt);
  for (double step = dlt * 1.05, at = kLogTHigh + step; at < reach; step *= 1.05, at += step) nodes.push_back(at);
  const std::size_t nn = nodes.size(), first_table = below.size();
  std::vector<double> trap(nn);
  for (std::size_t i = 0; i < nn; ++i)
    trap[i] = 0.5 * ((i + 1 < nn ? nodes[i + 1] : nodes[i]) - (i > 0 ? nodes[i - 1] : nodes[i]));
  std::vector<std::vector<double>> log_phi(nx), psi1(nx), psi2(nx);
  std::vector<double> log_all(nn, 0.0);
  std::vector<std::size_t> source(nx, nx);
  std::size_t last = nx;
  for (std::size_t x = 0; x < nx; ++x) {
    if (counts[x] <= 0.0) continue;
    if (last < nx && spreads[x] == spreads[last]) {
      source[x] = source[last];
    } else {
      source[x] = x;
      log_phi[x].assign(nn, 0.0);
      psi1[x].assign(nn, 0.0);
      psi2[x].assign(nn, 0.0);
      const double root = std::sqrt(std::max(spreads[x], 0.0));
      if (root > table_root) {
        for (std::size_t i = 0; i < nn; ++i) {
          const SpreadFunctions f = wide_spread_functions(nodes[i], spreads[x]);
          log_phi[x][i] = f.log_phi, psi1[x][i] = f.psi1, psi2[x][i] = f.psi2;
        }
      } else {
        const TableMix table(root);
        for (std::size_t i = 0; i < nn; ++i) {
          if (i < first_table) continue;  // φ = 1, no weight
          if (i >= first_table + kLogT) {
            log_phi[x][i] = -1e300;
            continue;
          }
          const std::size_t k = i - first_table;
          log_phi[x][i] = table.log_phi(k), psi1[x][i] = table.psi1(k), psi2[x][i] = table.psi2(k);
        }
      }
    }
    last = x;
    for (std::size_t i = 0; i < nn; ++i) log_all[i] += counts[x] * log_phi[source[x]][i];
  }
  return weight_integrals(
      counts, source, nn, log_all, log_phi, psi1, psi2, [&](std::size_t i) { return trap[i]; },
      [](std::size_t) { return true; }, mean, sq);
}

// Per key bucket x of one query's prefix (counts[x] keys of logit variance spreads[x], independent): one key's mean
// weight E[w_k] and mean square weight E[w_k²], E[w_k^j] = ∫ t^j ψ_j(t; D_k)·Π_{m≠k} φ(t; D_m) d(log t)
// (softmax_weight_moments' representation, Γ(1) = Γ(2) = 1), the tables interpolated linearly in √D. A spread beyond
// the table (√D > 6) takes the forms of wide_spread_functions on a grid of log t that reaches its tails. False when
// the quadrature finds no weight.
bool own_spread_weights(const std::vector<double>& counts, const std::vector<double>& spreads,
                        std::vector<double>& mean, std::vector<double>& sq) {
  const std::size_t nx = counts.size();
  const double table_root = kRootSteps * kRootStep, dlt = (kLogTHigh - kLogTLow) / (kLogT - 1);
  double widest = 0.0;
  for (std::size_t x = 0; x < nx; ++x)
    if (counts[x] > 0.0) widest = std::max(widest, spreads[x]);
  if (std::sqrt(widest) > table_root) return wide_spread_weights(counts, spreads, widest, mean, sq);
  // Buckets of one spread share their interpolated tables and their integrals (the prefix's one spread, which
  // causal_weights calibrates with, has a single one): `source[x]` is the first of the consecutive buckets with
  // keys that share x's spread.
  // (The tables live on in a per-thread scratch: a fresh 14 KiB per bucket each call, twice per query bucket, had
  // the allocator return the pages to the system and fault them in again, a third of a long prediction's time.)
  thread_local std::vector<std::array<double, kLogT>> log_phi, psi1, psi2;
  if (log_phi.size() < nx) {
    log_phi.resize(nx);
    psi1.resize(nx);
    psi2.resize(nx);
  }
  std::vector<std::size_t> source(nx);
  std::array<double, kLogT> log_all{};
  double keys = 0.0, top = 0.0;
  std::size_t last = nx;  // the last bucket with keys
  for (std::size_t x = 0; x < nx; ++x) {
    if (counts[x] <= 0.0) continue;
    const double root = std::sqrt(std::max(spreads[x], 0.0));
    if (last < nx && spreads[x] == spreads[last]) {
      source[x] = source[last];
    } else {
      source[x] = x;
      const TableMix table(root);
      for (std::size_t k = 0; k < kLogT; ++k)
        log_phi[x][k] = table.log_phi(k), psi1[x][k] = table.psi1(k), psi2[x][k] = table.psi2(k);
    }
    last = x;
    const std::array<double, kLogT>& own = log_phi[source[x]];
    for (int k = 0; k < kLogT; ++k) log_all[k] += counts[x] * own[k];
    keys += counts[x];
    top = std::max(top, spreads[x]);
  }
  // Below this log t every weight's integrand is under e^{−25} of its peak (near −log n − D/2).
  const double low = -std::log(keys) - 0.5 * top - 25.0;
  return weight_integrals(
      counts, source, kLogT, log_all, log_phi, psi1, psi2,
      [&](std::size_t k) { return (k == 0 || k == kLogT - 1 ? 0.5 : 1.0) * dlt; },
      [&](std::size_t k) { return kLogTLow + static_cast<double>(k) * dlt >= low; }, mean, sq);
}

// wide_spread_functions' two normal forms, log Φ(−u) and φ(u), interpolated linearly in one table of the standardised
// u (steps of 1/128 on [−12, 12], within 10⁻⁵ of their own values; exact beyond).
class StandardNormalTable {
 public:
  static const StandardNormalTable& get() {
    static const StandardNormalTable table;
    return table;
  }
  double log_upper(double u) const {
    if (u < -kEnd) return std::log(normal_cdf(-u));
    if (u > kEnd)  // Mills' ratio: Φ(−u) = φ(u)/u·(1 − 1/u² + 3/u⁴ − …), finite where Φ(−u) underflows
      return -0.5 * u * u - std::log(u * std::sqrt(2.0 * std::numbers::pi)) +
             std::log1p(-1.0 / (u * u) + 3.0 / (u * u * u * u));
    return at(log_upper_, u);
  }
  double density(double u) const { return u < -kEnd || u > kEnd ? normal_pdf(u) : at(density_, u); }

 private:
  static constexpr double kEnd = 12.0, kPerUnit = 128.0;
  StandardNormalTable() {
    const int n = static_cast<int>(2.0 * kEnd * kPerUnit) + 1;
    for (int i = 0; i < n; ++i) {
      const double u = -kEnd + i / kPerUnit;
      log_upper_.push_back(std::log(normal_cdf(-u)));
      density_.push_back(normal_pdf(u));
    }
  }
  double at(const std::vector<double>& f, double u) const {
    const double position = (u + kEnd) * kPerUnit;
    const std::size_t k = std::min(static_cast<std::size_t>(position), f.size() - 2);
    const double frac = position - static_cast<double>(k);
    return f[k] + frac * (f[k + 1] - f[k]);
  }
  std::vector<double> log_upper_, density_;
};

// Per key bucket x of one query's prefix (counts[x] keys whose logits are independent N(shifts[x], spreads[x])): one
// key's mean weight E[w_k] and mean square weight E[w_k²], as own_spread_weights with each key's functions of log t
// moved by its mean (e^{z + μ} = e^μ·e^z: φ, t·ψ_1 and t²·ψ_2 of N(μ, D) at log t are those of N(0, D) at log t + μ;
// beyond the table the normal forms of wide_spread_functions through StandardNormalTable). The grid of log t covers
// where some key's weight lives: from 9 sd (√(D + π²/6)) below each key's place (or 30 + log n, the exponential lower
// tail of a narrow one) to 9 sd above the highest-placed key's, beyond which the product of the φ vanishes; its step
// is an eighth of the narrowest sd, or a thousandth of the range if that is wider. False when the quadrature finds
// no weight.
bool shifted_spread_weights(const std::vector<double>& counts, const std::vector<double>& spreads,
                            const std::vector<double>& shifts, double keys, std::vector<double>& mean,
                            std::vector<double>& sq) {
  const std::size_t nx = counts.size();
  const double table_root = kRootSteps * kRootStep, dlt = (kLogTHigh - kLogTLow) / (kLogT - 1);
  constexpr double zeta_term = kLogExpVariance, gamma = kEulerGamma;
  double lo = std::numeric_limits<double>::infinity(), hi = lo, narrowest = lo;
  for (std::size_t x = 0; x < nx; ++x) {
    if (counts[x] <= 0.0) continue;
    const double sd = std::sqrt(std::max(spreads[x], 0.0) + zeta_term);
    lo = std::min(lo, -shifts[x] - std::max(9.0 * sd + 5.0, 30.0 + std::log(keys)));
    hi = std::min(hi, -shifts[x] + 9.0 * sd + 5.0);
    narrowest = std::min(narrowest, sd);
  }
  if (!(hi > lo)) return false;
  const double step = std::max(narrowest / 8.0, (hi - lo) / 1000.0);
  const std::size_t points = static_cast<std::size_t>(std::ceil((hi - lo) / step)) + 1;
  const StandardNormalTable& normal = StandardNormalTable::get();
  thread_local std::vector<std::vector<double>> log_phi, psi1, psi2;
  thread_local std::vector<double> log_all;
  if (log_phi.size() < nx) {
    log_phi.resize(nx);
    psi1.resize(nx);
    psi2.resize(nx);
  }
  log_all.assign(points, 0.0);
  std::vector<std::size_t> source(nx);
  for (std::size_t x = 0; x < nx; ++x) {
    source[x] = x;
    if (counts[x] <= 0.0) continue;
    log_phi[x].assign(points, 0.0);
    psi1[x].assign(points, 0.0);
    psi2[x].assign(points, 0.0);
    const double spread = std::max(spreads[x], 0.0), root = std::sqrt(spread);
    if (root > table_root) {
      const double s1 = std::sqrt(spread + zeta_term), s2 = std::sqrt(spread + zeta_term - 1.0);
      for (std::size_t i = 0; i < points; ++i) {
        const double y = lo + static_cast<double>(i) * step + shifts[x];
        log_phi[x][i] = normal.log_upper((y + gamma) / s1);
        psi1[x][i] = normal.density((y + gamma) / s1) / s1;
        psi2[x][i] = normal.density((y - 1.0 + gamma) / s2) / s2;
      }
    } else {
      const TableMix table(root);
      for (std::size_t i = 0; i < points; ++i) {
        const double at = (lo + static_cast<double>(i) * step + shifts[x] - kLogTLow) / dlt;
        if (at < 0.0) continue;  // φ = 1, no weight
        if (at > kLogT - 1) {
          log_phi[x][i] = -1e300;
          continue;
        }
        const std::size_t k = std::min(static_cast<std::size_t>(at), static_cast<std::size_t>(kLogT - 2));
        const double f = at - static_cast<double>(k);
        log_phi[x][i] = (1.0 - f) * table.log_phi(k) + f * table.log_phi(k + 1);
        psi1[x][i] = (1.0 - f) * table.psi1(k) + f * table.psi1(k + 1);
        psi2[x][i] = (1.0 - f) * table.psi2(k) + f * table.psi2(k + 1);
      }
    }
    for (std::size_t i = 0; i < points; ++i) log_all[i] += counts[x] * log_phi[x][i];
  }
  return weight_integrals(
      counts, source, points, log_all, log_phi, psi1, psi2,
      [&](std::size_t i) { return (i == 0 || i + 1 == points ? 0.5 : 1.0) * step; }, [](std::size_t) { return true; },
      mean, sq);
}

// The leading eigenpair of a symmetric n×n matrix (row-major) by cyclic Jacobi rotations, to 10⁻¹⁴ of its norm or 60
// sweeps.
std::pair<double, std::vector<double>> leading_eigenpair(std::vector<double> a, std::size_t n) {
  std::vector<double> v(n * n, 0.0);
  for (std::size_t i = 0; i < n; ++i) v[i * n + i] = 1.0;
  double norm = 0.0;
  for (const double e : a) norm += e * e;
  for (int sweep = 0; sweep < 60; ++sweep) {
    double off = 0.0;
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = i + 1; j < n; ++j) off += 2.0 * a[i * n + j] * a[i * n + j];
    if (!(off > 1e-28 * norm)) break;
    for (std::size_t p = 0; p < n; ++p) {
      for (std::size_t q = p + 1; q < n; ++q) {
        const double apq = a[p * n + q];
        if (apq == 0.0) continue;
        const double theta = (a[q * n + q] - a[p * n + p]) / (2.0 * apq);
        const double t = (theta >= 0.0 ? 1.0 : -1.0) / (std::abs(theta) + std::sqrt(theta * theta + 1.0));
        const double c = 1.0 / std::sqrt(t * t + 1.0), s = t * c;
        for (std::size_t k = 0; k < n; ++k) {  // columns p, q
          const double akp = a[k * n + p], akq = a[k * n + q];
          a[k * n + p] = c * akp - s * akq;
          a[k * n + q] = s * akp + c * akq;
        }
        for (std::size_t k = 0; k < n; ++k) {  // rows p, q
          const double apk = a[p * n + k], aqk = a[q * n + k];
          a[p * n + k] = c * apk - s * aqk;
          a[q * n + k] = s * apk + c * aqk;
        }
        for (std::size_t k = 0; k < n; ++k) {
          const double vkp = v[k * n + p], vkq = v[k * n + q];
          v[k * n + p] = c * vkp - s * vkq;
          v[k * n + q] = s * vkp + c * vkq;
        }
      }
    }
  }
  std::size_t top = 0;
  for (std::size_t i = 1; i < n; ++i)
    if (a[i * n + i] > a[top * n + top]) top = i;
  std::vector<double> vec(n);
  for (std::size_t k = 0; k < n; ++k) vec[k] = v[k * n + top];
  return {a[top * n + top], vec};
}

// The keys' leading own mode over the positions (CausalWeights::Mode): among the vectors constant on each bucket, the
// leading eigenvector of the covariance centred over the whole sequence, C_c = P·C·P (P removes the mean over
// positions, the part every token shares). In the basis e_x·√size_x the covariance of bucket-constant vectors is
// S(x, y) = total(x, y)/√(size_x·size_y) (block_totals) and the centring removes √(size_x/L).
std::pair<double, std::vector<double>> leading_own_mode(const TokenCov& k, const std::vector<Representative>& reps) {
  const std::size_t p = reps.size();
  const std::vector<double> totals = block_totals(k.cov, k.within, reps);
  std::vector<double> root(p), s(p * p), e(p);
  double length = 0.0;
  for (std::size_t x = 0; x < p; ++x) root[x] = std::sqrt(reps[x].m), length += reps[x].m;
  for (std::size_t x = 0; x < p; ++x) e[x] = root[x] / std::sqrt(length);
  for (std::size_t x = 0; x < p; ++x)
    for (std::size_t y = 0; y < p; ++y) s[x * p + y] = totals[x * p + y] / (root[x] * root[y]);
  // P·S·P with P = I − e·eᵀ.
  std::vector<double> se(p, 0.0);
  double ese = 0.0;
  for (std::size_t x = 0; x < p; ++x) {
    for (std::size_t y = 0; y < p; ++y) se[x] += s[x * p + y] * e[y];
    ese += e[x] * se[x];
  }
  for (std::size_t x = 0; x < p; ++x)
    for (std::size_t y = 0; y < p; ++y) s[x * p + y] += -se[x] * e[y] - e[x] * se[y] + ese * e[x] * e[y];
  auto [value, w] = leading_eigenpair(std::move(s), p);
  for (std::size_t x = 0; x < p; ++x) w[x] /= root[x];
  return {std::max(value, 0.0), w};
}

// ∫ f̂(ξ)·N(ξ; c, σ²) dξ for f̂ the piecewise-linear interpolant of values on the uniform grid `nodes` (constant
// beyond its ends), as weights on the nodes: the normal's mass over each interval shared between its two ends by the
// hat functions (σ = 0: linear interpolation at c). Intervals beyond 9σ of c are left out.
void hat_weights(const std::vector<double>& nodes, double c, double sigma, std::vector<double>& out) {
  const std::size_t g = nodes.size();
  const double h = nodes[1] - nodes[0];
  out.assign(g, 0.0);
  if (!(sigma > 1e-9 * h)) {
    const double at = std::clamp((c - nodes[0]) / h, 0.0, static_cast<double>(g - 1));
    const std::size_t k = std::min(static_cast<std::size_t>(at), g - 2);
    out[k] = 1.0 - (at - static_cast<double>(k));
    out[k + 1] = at - static_cast<double>(k);
    return;
  }
  out[0] = normal_cdf((nodes[0] - c) / sigma);
  out[g - 1] = 1.0 - normal_cdf((nodes[g - 1] - c) / sigma);
  const std::size_t first = static_cast<std::size_t>(
      std::clamp(std::floor((c - 9.0 * sigma - nodes[0]) / h), 0.0, static_cast<double>(g - 2)));
  const std::size_t last = static_cast<std::size_t>(
      std::clamp(std::ceil((c + 9.0 * sigma - nodes[0]) / h), 0.0, static_cast<double>(g - 2)));
  for (std::size_t j = first; j <= last; ++j) {
    const double a = (nodes[j] - c) / sigma, b = (nodes[j + 1] - c) / sigma;
    const double mass = normal_cdf(b) - normal_cdf(a), moment = sigma * (normal_pdf(a) - normal_pdf(b));
    out[j] += ((nodes[j + 1] - c) * mass - moment) / h;
    out[j + 1] += (moment + (c - nodes[j]) * mass) / h;
  }
}

// How many keys of bucket x the representative query of bucket a reads (all of a bucket before it, h of its own).
double key_count(const std::vector<Representative>& reps, std::int64_t a, std::int64_t x) {
  return x < a ? reps[static_cast<std::size_t>(x)].m : x == a ? reps[static_cast<std::size_t>(a)].h : 0.0;
}

// The weight products of two representative queries (a, b), as causal_mix_forward and causal_mix_backward read them:
// E[w_ak w_bk] = same(x) for a key k of bucket x both read, and E[w_ak w_bm] = row(x)·col(y)·E[w_ak]·E[w_bm] for
// keys k ≠ m of buckets x and y: the product of the mean weights scaled so that each key's products sum to its mean
// weight, Σ_m E[w_ak w_bm] = E[w_ak] and Σ_k E[w_ak w_bm] = E[w_bm], as Σ_m w_bm = 1 has them (docs/theory.md,
// "Products of two weights"). `kind`: the same query (a = b), two queries of bucket a (within), or two queries of
// different buckets.
enum class QueryPair { same, within, different };
struct PairProducts {
  std::vector<double> shared, same;  // per key bucket: keys both read, and their product
  std::vector<double> row, col;      // per key bucket of a and of b: the scaling of the products of different keys
  double other(std::size_t x, std::size_t y) const { return row[x] * col[y]; }
};
// The n-point Gauss–Legendre rule on [−1, 1]: nodes by Newton's method on the Legendre recurrence from the
// standard cosine guesses, weights 2/((1 − x²)·P_n'(x)²).
template <int N>
struct Legendre {
  std::array<double, N> x{}, w{};
  Legendre() {
    for (int i = 0; i < N; ++i) {
      double z = std::cos(std::numbers::pi * (i + 0.75) / (N + 0.5)), slope = 0.0;
      for (int step = 0; step < 100; ++step) {
        double p0 = 1.0, p1 = z;
        for (int k = 2; k <= N; ++k) {
          const double p2 = ((2.0 * k - 1.0) * z * p1 - (k - 1.0) * p0) / k;
          p0 = p1, p1 = p2;
        }
        slope = N * (z * p1 - p0) / (z * z - 1.0);
        const double next = z - p1 / slope;
        const bool done = std::abs(next - z) < 1e-15;
        z = next;
        if (done) break;
      }
      x[static_cast<std::size_t>(i)] = z;
      w[static_cast<std::size_t>(i)] = 2.0 / ((1.0 - z * z) * slope * slope);
    }
  }
};

// sin θ for |θ| ≤ π/2 by its Taylor series to θ¹⁵ (error below 3·10⁻¹¹): the orthant integrals below take it
// O(buckets³) times per attention map.
double sin_half_turn(double theta) {
  static constexpr std::array<double, 8> kCoefficients{
      -1.0 / 1307674368000.0, 1.0 / 6227020800.0, -1.0 / 39916800.0, 1.0 / 362880.0,
      -1.0 / 5040.0,          1.0 / 120.0,        -1.0 / 6.0,        1.0};
  const double t2 = theta * theta;
  double sum = 0.0;
  for (const double c : kCoefficients) sum = sum * t2 + c;
  return theta * sum;
}

// Φ₂(h_a, h_b; r) − Φ(h_a)·Φ(h_b) for a standard bivariate normal of correlation r, by Plackett's identity
// ∫_0^r φ₂(h_a, h_b; t) dt with t = sin θ, which leaves a smooth integrand: Gauss–Legendre in θ, 4 points for
// |r| ≤ 1/2 and 8 beyond, within 0.03% and 0.3% of a converged quadrature for h in [−4, 1].
template <int N>
double orthant_sum(const Legendre<N>& rule, double end, double diff, double cross) {
  double sum = 0.0;
  for (std::size_t k = 0; k < rule.x.size(); ++k) {
    const double t = sin_half_turn(0.5 * end * (rule.x[k] + 1.0)), below = 1.0 - t, above = 1.0 + t;
    double exponent = cross / above;
    if (diff > 0.0) exponent += below > 0.0 ? diff / (2.0 * below * above) : std::numeric_limits<double>::infinity();
    sum += rule.w[k] * std::exp(-exponent);
  }
  return sum;
}

double orthant_excess(double ha, double hb, double r) {
  static const Legendre<4> short_rule;
  static const Legendre<8> long_rule;
  r = std::clamp(r, -1.0, 1.0);
  if (r == 0.0) return 0.0;
  const double end = std::asin(r), diff = (ha - hb) * (ha - hb), cross = ha * hb;
  const double sum =
      std::abs(r) <= 0.5 ? orthant_sum(short_rule, end, diff, cross) : orthant_sum(long_rule, end, diff, cross);
  return sum * 0.5 * end / (2.0 * std::numbers::pi);
}

// Φ⁻¹(p) for p in (0, 1): Abramowitz & Stegun's 26.2.23 (error below 4.5·10⁻⁴) polished by three Newton steps on
// Φ(x) = erfc(−x/√2)/2.
double normal_quantile(double p) {
  const double tail = std::min(p, 1.0 - p), t = std::sqrt(-2.0 * std::log(tail));
  double x = t - (2.515517 + t * (0.802853 + t * 0.010328)) / (1.0 + t * (1.432788 + t * (0.189269 + t * 0.001308)));
  if (p < 0.5) x = -x;
  for (int step = 0; step < 3; ++step) {
    const double density = normal_pdf(x);
    if (!(density > 0.0)) break;
    x -= (normal_cdf(x) - p) / density;
  }
  return x;
}

PairProducts pair_products(const CausalWeights& w, const std::vector<Representative>& reps, std::int64_t a,
                           std::int64_t b, QueryPair kind) {
  const std::int64_t p = static_cast<std::int64_t>(reps.size());
  PairProducts out;
  out.shared.assign(static_cast<std::size_t>(p), 0.0);
  out.same.assign(static_cast<std::size_t>(p), 0.0);
  const double rho = kind == QueryPair::within      ? w.query_corr_within[static_cast<std::size_t>(a)]
                     : kind == QueryPair::different ? w.query_corr[at_index(a, b, p)]
                                                    : 1.0;
  for (std::int64_t x = 0; x <= std::min(a, b); ++x) {
    const std::size_t ax = at_index(a, x, p), bx = at_index(b, x, p), ix = static_cast<std::size_t>(x);
    out.shared[ix] = std::min(key_count(reps, a, x), key_count(reps, b, x));
    if (kind == QueryPair::same) {
      out.same[ix] = w.key_sq[ax];
    } else {
      // The two weights' covariance: their own variances (exact, key_sq) times the correlation the threshold model
      // gives them (docs/theory.md, "Two queries on one key"): w ≈ Φ(κ(l − c)), a probit in the key's logit l
      // with its threshold c set by the key's mean weight, so that E[w_a w_b] − E[w_a]E[w_b] ∝ Φ₂(h_a, h_b; r) −
      // Φ(h_a)Φ(h_b), h = Φ⁻¹(E[w]), r = ρ·√(reach_a·reach_b), reach = κ²D/(1 + κ²D), κ² = π/8.
      const double mean_a = w.key_mean[ax], mean_b = w.key_mean[bx];
      const double var_a = std::max(0.0, w.key_sq[ax] - mean_a * mean_a),
                   var_b = std::max(0.0, w.key_sq[bx] - mean_b * mean_b);
      const double own = w.key_self[ax] * w.key_self[bx];
      const double corr = own > 0.0 ? orthant_excess(w.key_threshold[ax], w.key_threshold[bx],
                                                     rho * std::sqrt(w.key_reach[ax] * w.key_reach[bx])) /
                                          std::sqrt(own)
                                    : 0.0;
      // Capped by Cauchy–Schwarz and by w ≤ 1: E[w_a w_b] ≤ min(E[w_a], E[w_b]), which pair products' sums need.
      out.same[ix] = std::min({mean_a * mean_b + corr * std::sqrt(var_a * var_b),
                               std::sqrt(w.key_sq[ax] * w.key_sq[bx]), std::min(mean_a, mean_b)});
    }
  }
  // The products of different keys, T(x, y) = row(x)·col(y)·E[w_ax]·E[w_by], by iterative proportional fitting
  // to their sums. A key of bucket x that a reads meets, among the keys b reads, c_b(y) of bucket y, less itself
  // with probability shared(x)/c_a(x) when y = x; its products with them sum to E[w_ax] less its own product with
  // itself, E[w_ax] − (shared(x)/c_a(x))·same(x), and the same holds for b's keys. Both sets of sums total
  // 1 − Σ_x shared(x)·same(x) (same ≤ the smaller mean keeps every sum ≥ 0), so the fit converges. For one query,
  // or two of one bucket, with uniform mean weights it is the one scale κ that makes the products total 1; for two
  // queries of different buckets it departs from κ on the keys only one of them reads whenever the two queries'
  // weights on their shared keys correlate. The result meets the column sums exactly and the row sums to the stop. It
  // stops when no column factor moves by 10⁻¹² of itself (about 5 sweeps where the weights are soft) or after 50
  // sweeps: where they are nearly one-hot it creeps, and 2 000 sweeps move the saturated no-norm `xavier` accuracy
  // study's prediction by 0.2%.
  const std::size_t pp = static_cast<std::size_t>(p);
  out.row.assign(pp, 0.0);
  out.col.assign(pp, 0.0);
  // Per key bucket: keys read (c), mean weight (m), the share of them both read (f), the products' sum (r); a's and
  // b's. Buckets no query reads stay 0 and drop out of every sum.
  thread_local std::vector<double> scratch;
  scratch.assign(8 * pp, 0.0);
  double *ca = scratch.data(), *cb = ca + pp, *ma = cb + pp, *mb = ma + pp, *fa = mb + pp, *fb = fa + pp, *ra = fb + pp,
         *rb = ra + pp;
  for (std::int64_t x = 0; x <= std::max(a, b); ++x) {
    const std::size_t ix = static_cast<std::size_t>(x);
    ca[ix] = key_count(reps, a, x), cb[ix] = key_count(reps, b, x);
    if (ca[ix] > 0.0) {
      ma[ix] = w.key_mean[at_index(a, x, p)];
      fa[ix] = out.shared[ix] / ca[ix];
      ra[ix] = std::max(0.0, ma[ix] - fa[ix] * out.same[ix]);
      out.row[ix] = 1.0;
    }
    if (cb[ix] > 0.0) {
      mb[ix] = w.key_mean[at_index(b, x, p)];
      fb[ix] = out.shared[ix] / cb[ix];
      rb[ix] = std::max(0.0, mb[ix] - fb[ix] * out.same[ix]);
      out.col[ix] = 1.0;
    }
  }
  const std::size_t na = static_cast<std::size_t>(a) + 1, nb = static_cast<std::size_t>(b) + 1;
  for (int step = 0; step < 50; ++step) {
    double total = 0.0;
    for (std::size_t y = 0; y < nb; ++y) total += cb[y] * out.col[y] * mb[y];
    for (std::size_t x = 0; x < na; ++x) {
      const double sum = ma[x] * (total - fa[x] * out.col[x] * mb[x]);
      out.row[x] = sum > 0.0 ? ra[x] / sum : 0.0;
    }
    total = 0.0;
    for (std::size_t x = 0; x < na; ++x) total += ca[x] * out.row[x] * ma[x];
    bool moved = false;
    for (std::size_t y = 0; y < nb; ++y) {
      const double sum = mb[y] * (total - fb[y] * out.row[y] * ma[y]);
      const double next = sum > 0.0 ? rb[y] / sum : 0.0;
      moved = moved || std::abs(next - out.col[y]) > 1e-12 * next;
      out.col[y] = next;
    }
    if (!moved) break;
  }
  return out;
}

// CausalWeights::Mode for the weights `w` of the independent per-key law: the keys' leading own mode, each query's
// loadings on it, and where some query's mean loading² reaches kModeLogitVariance, the weights given ξ on a grid of
// 49 nodes (ξ in [−6, 6]): each query's per-key law at each node and the mean weights over ξ. Leaves the mode
// inactive when a quadrature finds no weight.
void condition_on_mode(const TokenField& q, const TokenField& k, const std::vector<Representative>& reps,
                       double per_query, CausalWeights& w) {
  const std::int64_t p = q.buckets();
  const std::size_t pp = static_cast<std::size_t>(p);
  auto [value, direction] = leading_own_mode(k, reps);
  std::vector<double> loading(cells(p), 0.0);
  double strongest = 0.0;
  for (std::int64_t a = 0; a < p; ++a) {
    const double n = reps[static_cast<std::size_t>(a)].n;
    if (n <= 1.0) continue;
    double centre = 0.0;
    for (std::int64_t x = 0; x <= a; ++x) centre += key_count(reps, a, x) * direction[static_cast<std::size_t>(x)];
    centre /= n;
    const double scale = std::sqrt(per_query * q.diag(a) * value);
    double along = 0.0;
    for (std::int64_t x = 0; x <= a; ++x) {
      const double m = scale * (direction[static_cast<std::size_t>(x)] - centre);
      loading[at_index(a, x, p)] = m;
      along += key_count(reps, a, x) * m * m;
    }
    strongest = std::max(strongest, along / n);
  }
  if (strongest < kModeLogitVariance) return;
  CausalWeights::Mode mode;
  constexpr int kNodes = 49;
  constexpr double kReach = 6.0;
  double total = 0.0;
  for (int g = 0; g < kNodes; ++g) {
    const double xi = -kReach + 2.0 * kReach * g / (kNodes - 1);
    mode.nodes.push_back(xi);
    mode.weights.push_back(normal_pdf(xi));
    total += mode.weights.back();
  }
  for (double& weight : mode.weights) weight /= total;
  const std::size_t nodes = mode.nodes.size(), cube = pp * nodes * pp;
  mode.mean.assign(cells(p), 0.0);
  mode.reach.assign(cells(p), 0.0);
  mode.given.assign(cube, 0.0);
  mode.given_sq.assign(cube, 0.0);
  mode.given_threshold.assign(cube, 0.0);
  mode.given_self.assign(cube, 0.0);
  const double kappa_sq = std::numbers::pi / 8.0;
  // Each query's weights given ξ, independently of the others (in parallel; every query's numbers are its own).
  bool found = true;
#pragma omp parallel for schedule(dynamic)
  for (std::int64_t a = 0; a < p; ++a) {
    const std::size_t ia = static_cast<std::size_t>(a);
    const double n = reps[ia].n;
    if (n <= 1.0) {  // one key: weight 1 whatever ξ
      mode.mean[at_index(a, a, p)] = 1.0;
      for (std::size_t g = 0; g < nodes; ++g)
        mode.given[(ia * nodes + g) * pp + ia] = mode.given_sq[(ia * nodes + g) * pp + ia] = 1.0;
      continue;
    }
    const double unbias = n / (n - 1.0);
    std::vector<double> counts(pp), spreads(pp), shifts(pp), mean, sq;
    for (std::int64_t x = 0; x < p; ++x) {
      const std::size_t ix = static_cast<std::size_t>(x);
      counts[ix] = key_count(reps, a, x);
      const double m = x <= a ? loading[at_index(a, x, p)] : 0.0;
      // The rest of the key's spread, independent per key: what the prefix's centring leaves of it is (n − 1)/n.
      spreads[ix] = x <= a ? std::max(0.0, (w.key_logit[at_index(a, x, p)] - m * m) * unbias) : 0.0;
      if (x <= a) mode.reach[at_index(a, x, p)] = kappa_sq * spreads[ix] / (1.0 + kappa_sq * spreads[ix]);
    }
    bool ok = true;
    for (std::size_t g = 0; g < nodes && ok; ++g) {
      for (std::int64_t x = 0; x <= a; ++x)
        shifts[static_cast<std::size_t>(x)] = loading[at_index(a, x, p)] * mode.nodes[g];
      ok = shifted_spread_weights(counts, spreads, shifts, n, mean, sq);
      if (!ok) break;
      for (std::int64_t x = 0; x <= a; ++x) {
        const std::size_t ix = static_cast<std::size_t>(x), at = (ia * nodes + g) * pp + ix;
        const double m = mean[ix], reach = mode.reach[at_index(a, x, p)];
        mode.given[at] = m;
        mode.given_sq[at] = sq[ix];
        mode.mean[at_index(a, x, p)] += mode.weights[g] * m;
        mode.given_threshold[at] = m > 0.0 && m < 1.0 ? normal_quantile(m) : 0.0;
        mode.given_self[at] =
            m > 0.0 && m < 1.0 ? orthant_excess(mode.given_threshold[at], mode.given_threshold[at], reach) : 0.0;
      }
    }
    if (!ok) {
#pragma omp atomic write
      found = false;
    }
  }
  if (!found) return;
  mode.active = true;
  w.mode = std::move(mode);
}

}  // namespace

CausalWeights causal_weights(const TokenField& q, const TokenField& k, double scale_sq, std::int64_t head_dim) {
  PROPLAB_CHECK(q.layout == k.layout, "causal_weights: layouts differ");
  const std::int64_t p = q.buckets();
  const std::vector<Representative> reps = representatives(*q.layout);
  const RangeSums k_sums(block_totals(k.cov, k.within, reps), reps, false);
  const PrefixStats k_stats = prefix_stats(k, reps, k_sums);
  const double per_query = scale_sq * static_cast<double>(head_dim);
  const std::size_t pp = static_cast<std::size_t>(p);
  CausalWeights w;
  w.layout = q.layout;
  w.key_spread = k_stats.spread;
  w.logit_spread.assign(pp, 0.0);
  w.aligned_gaussian.assign(pp, 0.0);
  w.aligned_fixed.assign(pp, 0.0);
  w.key_mean.assign(cells(p), 0.0);
  w.key_sq.assign(cells(p), 0.0);
  w.key_logit.assign(cells(p), 0.0);
  w.key_reach.assign(cells(p), 0.0);
  w.key_threshold.assign(cells(p), 0.0);
  w.key_self.assign(cells(p), 0.0);
  w.query_corr.assign(cells(p), 0.0);
  w.query_corr_within.assign(pp, 0.0);
  std::vector<double> counts(pp), rows(pp), spreads(pp), mean, sq;
  for (std::int64_t a = 0; a < p; ++a) {
    const std::size_t ia = static_cast<std::size_t>(a);
    const double n = reps[ia].n;
    const double d = per_query * q.diag(a) * k_stats.spread[ia];
    w.logit_spread[ia] = d;
    const double unbias = n > 1.0 ? n / (n - 1.0) : 0.0;
    const SoftmaxWeightMoments m = softmax_weight_moments(n, d * unbias);
    w.aligned_gaussian[ia] = m.tilt_sq - m.sum_sq;
    w.aligned_fixed[ia] = m.tilt_sq - m.self_tilt;
    // Each key's own spread: its deviation from the prefix's mean key, Var(k_k − k̄) = C_kk − 2·mean_m C_km + mean C,
    // whose mean over the keys is the prefix's spread.
    double all = 0.0;
    for (std::int64_t x = 0; x < p; ++x) {
      const std::size_t ix = static_cast<std::size_t>(x);
      counts[ix] = key_count(reps, a, x);
      if (counts[ix] <= 0.0) continue;
      double row = k.diag(x) + (counts[ix] - 1.0) * k.within[ix];
      for (std::int64_t y = 0; y <= a; ++y)
        if (y != x) row += key_count(reps, a, y) * k.at(x, y);
      rows[ix] = row / n;
      all += counts[ix] * row;
    }
    all /= n * n;
    for (std::int64_t x = 0; x <= a; ++x) {
      const std::size_t ix = static_cast<std::size_t>(x);
      const double own = per_query * q.diag(a) * std::max(0.0, k.diag(x) - 2.0 * rows[ix] + all);
      w.key_logit[at_index(a, x, p)] = own;
      spreads[ix] = own * unbias;
    }
    // The same integrals at the prefix's one spread (interpolated alike) calibrate the mean squares: their
    // interpolation in √D errs by up to a few percent for thousands of keys, and equal spreads give exactly s/n.
    std::vector<double> equal_mean, equal_sq;
    const bool own_spreads = n > 1.0 && own_spread_weights(counts, spreads, mean, sq) &&
                             own_spread_weights(counts, std::vector<double>(pp, d * unbias), equal_mean, equal_sq) &&
                             equal_sq[static_cast<std::size_t>(a)] > 0.0;
    const double calibration = own_spreads ? m.sum_sq / n / equal_sq[static_cast<std::size_t>(a)] : 1.0;
    for (std::int64_t x = 0; x <= a; ++x) {
      const std::size_t ax = at_index(a, x, p);
      w.key_mean[ax] = own_spreads ? mean[static_cast<std::size_t>(x)] : 1.0 / n;
      w.key_sq[ax] = own_spreads ? calibration * sq[static_cast<std::size_t>(x)] : m.sum_sq / n;
      if (!own_spreads) w.key_logit[ax] = d;
      // The threshold model's numbers for pair_products: the logit's reach κ²D/(1 + κ²D) (D with the n/(n − 1)),
      // the threshold h = Φ⁻¹(E[w]) and the weight's own variance in the model, Φ₂(h, h; reach) − Φ(h)².
      const double spread = w.key_logit[ax] * unbias, kappa_sq = std::numbers::pi / 8.0;
      w.key_reach[ax] = kappa_sq * spread / (1.0 + kappa_sq * spread);
      const double mean_weight = w.key_mean[ax];
      w.key_threshold[ax] = mean_weight > 0.0 && mean_weight < 1.0 ? normal_quantile(mean_weight) : 0.0;
      w.key_self[ax] = mean_weight > 0.0 && mean_weight < 1.0
                           ? orthant_excess(w.key_threshold[ax], w.key_threshold[ax], w.key_reach[ax])
                           : 0.0;
    }
    for (std::int64_t b = 0; b < p; ++b) w.query_corr[at_index(a, b, p)] = pair_r(q.at(a, b), q.diag(a), q.diag(b));
    w.query_corr_within[ia] = pair_r(q.within[ia], q.diag(a), q.diag(a));
  }
  w.logit_var = per_query * (q.var() + q.mean * q.mean) * (k.var() + k.mean * k.mean);
  condition_on_mode(q, k, reps, per_query, w);
  return w;
}

namespace {

// Σ_{k,m} E[w_ak w_bm]·cov(v_k, v_m) for two representative queries under the per-key law `w`: a key both read with
// itself, and different keys through pair_products' fit. `column`: scratch of at least b + 1.
double mix_pair(const TokenField& v, const CausalWeights& w, const std::vector<Representative>& reps, std::int64_t a,
                std::int64_t b, QueryPair kind, std::vector<double>& column) {
  const std::int64_t p = v.buckets();
  const PairProducts pr = pair_products(w, reps, a, b, kind);
  const std::size_t nb = static_cast<std::size_t>(b) + 1;
  // n_b(y)·E[w_by]·col(y): the keys of bucket y that query b reads, times one's mean weight and the fit's factor.
  for (std::size_t y = 0; y < nb; ++y) {
    const std::int64_t iy = static_cast<std::int64_t>(y);
    const double counted = key_count(reps, b, iy) * w.key_mean[at_index(b, iy, p)];
    column[y] = counted * pr.col[y];
  }
  double same = 0.0, other = 0.0;
  for (std::int64_t x = 0; x <= std::max(a, b); ++x) {
    const std::size_t ix = static_cast<std::size_t>(x);
    const double ca = key_count(reps, a, x), cb = key_count(reps, b, x);
    const double ma = w.key_mean[at_index(a, x, p)], mb = w.key_mean[at_index(b, x, p)];
    same += pr.shared[ix] * pr.same[ix] * v.diag(x);
    if (ca <= 0.0) continue;
    // Σ_{y ≠ x} n_b(y)·E[w_by]·col(y)·cov(x, y): what a key of bucket x shares with b's keys of other buckets.
    const double* cov = &v.cov[at_index(x, 0, p)];
    double shares = 0.0;
    for (std::size_t y = 0; y < nb; ++y) shares += column[y] * cov[y];
    if (ix < nb) shares -= column[ix] * cov[ix];
    other += ca * ma * pr.row[ix] * shares + ma * mb * pr.other(ix, ix) * (ca * cb - pr.shared[ix]) * v.within[ix];
  }
  return same + other;
}

// mix_pair for every pair of representative queries (and two of one bucket) under the per-key law.
TokenCov mixed_pairs(const TokenField& v, const CausalWeights& w, const std::vector<Representative>& reps) {
  const std::int64_t p = v.buckets();
  std::vector<double> column(static_cast<std::size_t>(p));
  TokenCov out;
  out.layout = v.layout;
  out.cov.assign(cells(p), 0.0);
  out.within.assign(static_cast<std::size_t>(p), 0.0);
  for (std::int64_t a = 0; a < p; ++a) {
    // The products of (b, a) are those of (a, b) transposed: each pair once, mirrored.
    for (std::int64_t b = 0; b <= a; ++b)
      out.at(a, b) = out.at(b, a) = mix_pair(v, w, reps, a, b, a == b ? QueryPair::same : QueryPair::different, column);
    out.within[static_cast<std::size_t>(a)] = mix_pair(v, w, reps, a, a, QueryPair::within, column);
  }
  return out;
}

// mixed_pairs under the keys' leading own mode (CausalWeights::Mode; docs/theory.md, "Correlated logits"). Given the
// two queries' mode coefficients (ξ_a, ξ_b), standard normal with correlation ρ_ab (1 for one query, the within-bucket
// correlation for two of one bucket), each query's logits are independent per key, so
//   E[w_ak w_bm] = E[μ_ak(ξ_a)·μ_bm(ξ_b)] + E[Cov(w_ak, w_bm | ξ_a, ξ_b)],
// μ_a(ξ) the weights given ξ. The first is integrated over the grid of ξ, ξ_b given ξ_a being N(ρ·ξ_a, 1 − ρ²)
// against μ_b's linear interpolant (hat_weights). The second is the per-key law's own (mix_pair less its product of
// means) with a's law at ξ_a and b's at the node nearest ρ·ξ_a: what couples the two queries' weights given the
// mode is their logits' rest on the keys both read, and that is strong only where ρ is near 1. For one query this
// is exactly E_ξ[mix_pair given ξ].
TokenCov mixed_pairs_with_mode(const TokenField& v, const CausalWeights& w, const std::vector<Representative>& reps) {
  const CausalWeights::Mode& mode = w.mode;
  const std::int64_t p = v.buckets();
  const std::size_t pp = static_cast<std::size_t>(p), nodes = mode.nodes.size();
  // reads(b, μ)[x] = Σ_y n_b(y)·μ_y·cov(x, y), the within-bucket covariance for y = x: what query b's weighted keys
  // share with one key of bucket x other than itself.
  std::vector<double> reads(pp * nodes * pp, 0.0);
  for (std::int64_t b = 0; b < p; ++b)
    for (std::size_t j = 0; j < nodes; ++j) {
      const double* mu = &mode.given[(static_cast<std::size_t>(b) * nodes + j) * pp];
      double* out_x = &reads[(static_cast<std::size_t>(b) * nodes + j) * pp];
      for (std::int64_t x = 0; x < p; ++x) {
        double sum = 0.0;
        for (std::int64_t y = 0; y <= b; ++y)
          sum += key_count(reps, b, y) * mu[y] * (y == x ? v.within[static_cast<std::size_t>(x)] : v.at(x, y));
        out_x[x] = sum;
      }
    }
  // Σ_{k,m} u_k·g_m·cov(k, m) over a's keys k and b's keys m: n_a(x)·u_x·reads_b[x] plus, on the keys both read,
  // their own variance less the within-bucket covariance that reads counted for them.
  auto contract = [&](std::int64_t a, std::int64_t b, const double* u, const double* reads_b, const double* g) {
    double sum = 0.0;
    for (std::int64_t x = 0; x <= a; ++x) {
      const std::size_t ix = static_cast<std::size_t>(x);
      const double ca = key_count(reps, a, x), both = std::min(ca, key_count(reps, b, x));
      sum += ca * u[ix] * reads_b[ix] + both * u[ix] * g[ix] * (v.diag(x) - v.within[ix]);
    }
    return sum;
  };
  CausalWeights law = w;  // rows a and b set to each node's law in turn
  law.key_reach = mode.reach;
  auto set_row = [&](std::int64_t a, std::size_t g) {
    const std::size_t from = (static_cast<std::size_t>(a) * nodes + g) * pp;
    for (std::int64_t x = 0; x <= a; ++x) {
      const std::size_t ax = at_index(a, x, p), ix = from + static_cast<std::size_t>(x);
      law.key_mean[ax] = mode.given[ix];
      law.key_sq[ax] = mode.given_sq[ix];
      law.key_threshold[ax] = mode.given_threshold[ix];
      law.key_self[ax] = mode.given_self[ix];
    }
  };
  const double step = mode.nodes[1] - mode.nodes[0];
  std::vector<double> kernel, smooth_reads(pp), smooth_given(pp), column(pp);
  auto pair = [&](std::int64_t a, std::int64_t b, QueryPair kind) {
    const std::size_t ia = static_cast<std::size_t>(a), ib = static_cast<std::size_t>(b);
    const double rho = kind == QueryPair::same     ? 1.0
                       : kind == QueryPair::within ? w.query_corr_within[ia]
                                                   : w.query_corr[at_index(a, b, p)];
    const double sigma = std::sqrt(std::max(0.0, 1.0 - rho * rho));
    double total = 0.0;
    for (std::size_t g = 0; g < nodes; ++g) {
      const double* mu_a = &mode.given[(ia * nodes + g) * pp];
      // The products of the conditional means, ξ_b integrated given ξ_a.
      hat_weights(mode.nodes, rho * mode.nodes[g], sigma, kernel);
      std::fill(smooth_reads.begin(), smooth_reads.end(), 0.0);
      std::fill(smooth_given.begin(), smooth_given.end(), 0.0);
      for (std::size_t j = 0; j < nodes; ++j) {
        const double kj = kernel[j];
        if (kj == 0.0) continue;
        const double* r = &reads[(ib * nodes + j) * pp];
        const double* m = &mode.given[(ib * nodes + j) * pp];
        for (std::size_t x = 0; x <= ia; ++x) smooth_reads[x] += kj * r[x], smooth_given[x] += kj * m[x];
      }
      double sum = contract(a, b, mu_a, smooth_reads.data(), smooth_given.data());
      // The fluctuation given the coefficients: the per-key law's pair less its product of means.
      const std::size_t h =
          kind == QueryPair::different
              ? static_cast<std::size_t>(std::clamp(std::round((rho * mode.nodes[g] - mode.nodes[0]) / step), 0.0,
                                                    static_cast<double>(nodes - 1)))
              : g;
      set_row(a, g);
      if (b != a) set_row(b, h);
      sum += mix_pair(v, law, reps, a, b, kind, column) -
             contract(a, b, mu_a, &reads[(ib * nodes + h) * pp], &mode.given[(ib * nodes + h) * pp]);
      total += mode.weights[g] * sum;
    }
    return total;
  };
  TokenCov out;
  out.layout = v.layout;
  out.cov.assign(cells(p), 0.0);
  out.within.assign(pp, 0.0);
  for (std::int64_t a = 0; a < p; ++a) {
    for (std::int64_t b = 0; b <= a; ++b)
      out.at(a, b) = out.at(b, a) = pair(a, b, a == b ? QueryPair::same : QueryPair::different);
    out.within[static_cast<std::size_t>(a)] = pair(a, a, QueryPair::within);
  }
  return out;
}

}  // namespace

TokenField causal_mix_forward(const TokenField& v, const CausalWeights& w, const ValueSource& source) {
  PROPLAB_CHECK(v.layout == w.layout, "causal_mix_forward: layouts differ");
  PROPLAB_CHECK(source.fan_in >= 0, "causal_mix_forward: needs fan_in >= 0");
  const std::int64_t p = v.buckets();
  const std::vector<Representative> reps = representatives(*v.layout);
  const PrefixStats stats = source.fan_in > 0
                                ? prefix_stats(v, reps, RangeSums(block_totals(v.cov, v.within, reps), reps, false))
                                : PrefixStats{};
  TokenField out;
  static_cast<TokenCov&>(out) = w.mode.active ? mixed_pairs_with_mode(v, w, reps) : mixed_pairs(v, w, reps);
  out.mean = v.mean;
  for (std::int64_t a = 0; a < p; ++a) {
    // The values' share along the query's logit direction (header comment; docs/theory.md, "Values along the
    // logits"): 1/fan_in of their spread (n/(n − 1) times the prefix's sample variance) is weighted by the logits.
    const double n = reps[static_cast<std::size_t>(a)].n;
    if (source.fan_in > 0 && n > 1.0) {
      const std::size_t i = static_cast<std::size_t>(a);
      const double aligned = source.fixed_norm ? w.aligned_fixed[i] : w.aligned_gaussian[i];
      out.at(a, a) += stats.spread[i] * n / (n - 1.0) * aligned / static_cast<double>(source.fan_in);
    }
  }
  return out;
}

TokenGrad causal_mix_backward(const TokenGrad& d_out, const CausalWeights& w) {
  PROPLAB_CHECK(d_out.layout == w.layout, "causal_mix_backward: layouts differ");
  const std::int64_t p = d_out.buckets();
  const std::vector<Representative> reps = representatives(*d_out.layout);
  // d_v_k = Σ_{i ≥ k} w_ik d_out_i. The queries of bucket a that read a key of bucket x: all of a later bucket, h_x of
  // its own.
  auto readers = [&](std::int64_t x, std::int64_t a) {
    return a > x ? reps[static_cast<std::size_t>(a)].m : a == x ? reps[static_cast<std::size_t>(x)].h : 0.0;
  };
  std::vector<PairProducts> pairs(cells(p)), within(static_cast<std::size_t>(p));
  for (std::int64_t a = 0; a < p; ++a) {
    for (std::int64_t b = 0; b <= a; ++b) {
      PairProducts& pr = pairs[at_index(a, b, p)];
      pr = pair_products(w, reps, a, b, a == b ? QueryPair::same : QueryPair::different);
      if (b < a) pairs[at_index(b, a, p)] = PairProducts{pr.shared, pr.same, pr.col, pr.row};  // (b, a): transposed
    }
    within[static_cast<std::size_t>(a)] = pair_products(w, reps, a, a, QueryPair::within);
  }
  // Two different keys of buckets x and y (x = y: two keys of one bucket): Σ over the queries that read them of
  // E[w_ax w_by]·G(a, b), with pair_products' fit of the products of different keys, r_x·c_y·E[w_ax]·E[w_by]. For
  // queries of different buckets a ≠ b that is one outer product per pair: (n_x(a)·E[w_ax]·r_x) ⊗ (n_y(b)·E[w_by]·c_y)
  // times G(a, b), added over the keys each reads.
  std::vector<double> other(cells(p), 0.0), left(static_cast<std::size_t>(p)), right(static_cast<std::size_t>(p));
  for (std::int64_t a = 0; a < p; ++a) {
    for (std::int64_t b = 0; b < p; ++b) {
      const double gab = d_out.at(a, b);
      if (b == a || gab == 0.0) continue;
      const PairProducts& pr = pairs[at_index(a, b, p)];
      for (std::int64_t x = 0; x <= a; ++x)
        left[static_cast<std::size_t>(x)] =
            readers(x, a) * w.key_mean[at_index(a, x, p)] * pr.row[static_cast<std::size_t>(x)];
      for (std::int64_t y = 0; y <= b; ++y)
        right[static_cast<std::size_t>(y)] =
            readers(y, b) * w.key_mean[at_index(b, y, p)] * pr.col[static_cast<std::size_t>(y)] * gab;
      for (std::int64_t x = 0; x <= a; ++x) {
        const double lx = left[static_cast<std::size_t>(x)];
        if (lx == 0.0) continue;
        double* row = &other[at_index(x, 0, p)];
        for (std::int64_t y = 0; y <= b; ++y) row[y] += lx * right[static_cast<std::size_t>(y)];
      }
    }
    // The same query (both keys read by it) and two queries of bucket a.
    const PairProducts &same = pairs[at_index(a, a, p)], &pair = within[static_cast<std::size_t>(a)];
    for (std::int64_t x = 0; x <= a; ++x) {
      const double qx = readers(x, a), mx = w.key_mean[at_index(a, x, p)];
      for (std::int64_t y = 0; y <= a; ++y) {
        const double qy = readers(y, a), my = w.key_mean[at_index(a, y, p)];
        const double both = std::min(qx, qy);  // the queries of bucket a that read both keys
        const std::size_t ix = static_cast<std::size_t>(x), iy = static_cast<std::size_t>(y);
        other[at_index(x, y, p)] += mx * my *
                                    (both * same.other(ix, iy) * d_out.diag(a) +
                                     (qx * qy - both) * pair.other(ix, iy) * d_out.within[static_cast<std::size_t>(a)]);
      }
    }
  }
  // One key with itself: pairs of queries that both read it.
  auto same_key = [&](std::int64_t x) {
    double g = 0.0;
    const std::size_t ix = static_cast<std::size_t>(x);
    for (std::int64_t a = x; a < p; ++a) {
      const double qa = readers(x, a);
      g += qa * pairs[at_index(a, a, p)].same[ix] * d_out.diag(a) +
           (qa * qa - qa) * within[static_cast<std::size_t>(a)].same[ix] * d_out.within[static_cast<std::size_t>(a)];
      for (std::int64_t b = x; b < p; ++b)
        if (b != a) g += qa * readers(x, b) * pairs[at_index(a, b, p)].same[ix] * d_out.at(a, b);
    }
    return g;
  };
  TokenGrad g;
  g.layout = d_out.layout;
  g.cov.assign(cells(p), 0.0);
  g.within.assign(static_cast<std::size_t>(p), 0.0);
  for (std::int64_t x = 0; x < p; ++x) {
    for (std::int64_t y = 0; y < p; ++y) g.at(x, y) = x == y ? same_key(x) : other[at_index(x, y, p)];
    g.within[static_cast<std::size_t>(x)] = other[at_index(x, x, p)];
  }
  return g;
}

namespace {

// The query path's Jacobian term beyond i.i.d. keys (docs/theory.md, "The query path's own parts"): over the values'
// and keys' weights, E|d_q|² carries tr(A·M·A·M) for the softmax Jacobian A = diag(w) − wwᵀ and the prefix's Gram M
// of the projections' input, which the i.i.d. form takes as K²·tr(A²) (K the prefix's spread). With the carried
// covariance C (per feature, `v`'s shape: the values, keys and queries are linear maps of one input), the mean
// weights w̄ and M = fan_in·C plus its finite-width fluctuation (Wick: E[tr(A·M·A·M)] = (d² + d)·tr(ACAC) +
// d·tr(AC)²), the Jacobian J becomes (1 + 1/d)·(J + tr(ĀCĀC)/K² − tr(Ā²)) + (tr(ĀC)/K)²/d. Returns that.
double query_path_jacobian(const TokenField& v, const CausalWeights& w, const std::vector<Representative>& reps,
                           std::int64_t a, double spread, const SoftmaxWeightMoments& moments, std::int64_t fan_in) {
  const double jacobian = moments.jacobian;
  const std::int64_t p = v.buckets();
  if (!(spread > 0.0)) return jacobian;
  std::vector<double> cw(static_cast<std::size_t>(a + 1), 0.0);  // (C·w̄) at a key of bucket x
  double dcdc = 0.0, a2 = 0.0, a3 = 0.0, diag = 0.0;
  for (std::int64_t x = 0; x <= a; ++x) {
    const double cx = key_count(reps, a, x), wx = w.key_mean[at_index(a, x, p)];
    if (cx <= 0.0) continue;
    const double own = v.diag(x), within = v.within[static_cast<std::size_t>(x)];
    double row = wx * (own + (cx - 1.0) * within);
    dcdc += cx * wx * wx * (own * own + (cx - 1.0) * within * within);
    for (std::int64_t y = 0; y <= a; ++y) {
      if (y == x) continue;
      const double cy = key_count(reps, a, y), wy = w.key_mean[at_index(a, y, p)], c = v.at(x, y);
      row += cy * wy * c;
      dcdc += cx * cy * wx * wy * c * c;
    }
    cw[static_cast<std::size_t>(x)] = row;
    a2 += cx * wx * wx;
    a3 += cx * wx * wx * wx;
    diag += cx * wx * own;
  }
  double cdc = 0.0, wcw = 0.0;
  for (std::int64_t x = 0; x <= a; ++x) {
    const double cx = key_count(reps, a, x), wx = w.key_mean[at_index(a, x, p)], r = cw[static_cast<std::size_t>(x)];
    if (cx <= 0.0) continue;
    cdc += cx * wx * r * r;
    wcw += cx * wx * r;
  }
  const double acac = dcdc - 2.0 * cdc + wcw * wcw;  // tr(ĀCĀC), Ā = diag(w̄) − w̄w̄ᵀ
  const double aa = a2 - 2.0 * a3 + a2 * a2;         // tr(Ā²)
  const double structured = jacobian + acac / (spread * spread) - aa;
  if (fan_in <= 0) return structured;
  // tr(ĀC)/K is 1 − Σw̄² for isotropic own parts; the weights' own randomness makes it 1 − E[Σw²] there.
  const double d = static_cast<double>(fan_in), ac = (diag - wcw) / spread + a2 - moments.sum_sq;
  return (1.0 + 1.0 / d) * structured + ac * ac / d;
}

}  // namespace

ScoreGrads causal_score_backward(const TokenGrad& d_out, const TokenField& v, const TokenField& q,
                                 const CausalWeights& w, double scale_sq, std::int64_t head_dim, std::int64_t fan_in,
                                 bool own_structure) {
  const std::int64_t p = d_out.buckets();
  const std::vector<Representative> reps = representatives(*d_out.layout);
  const PrefixStats v_stats = prefix_stats(v, reps, RangeSums(block_totals(v.cov, v.within, reps), reps, false));
  ScoreGrads out{TokenGrad::white(d_out.layout, 0.0), TokenGrad::white(d_out.layout, 0.0)};
  const double per_query = scale_sq * static_cast<double>(head_dim);
  double after = 0.0;  // Σ over the queries of later buckets
  for (std::int64_t a = p - 1; a >= 0; --a) {
    const std::size_t at = static_cast<std::size_t>(a);
    const Representative& r = reps[at];
    // The spreads are sample variances over the prefix: (1 − 1/n) of what differs between keys.
    const double unbias = r.n > 1.0 ? r.n / (r.n - 1.0) : 0.0;
    const SoftmaxWeightMoments moments = softmax_weight_moments(r.n, w.logit_spread[at] * unbias);
    const double jacobian = moments.jacobian;
    const double per_jacobian = per_query * d_out.diag(a) * v_stats.spread[at] * unbias, score = per_jacobian * jacobian;
    const double query_jacobian = r.n > 1.0 && own_structure
                                      ? query_path_jacobian(v, w, reps, a, v_stats.spread[at] * unbias, moments, fan_in)
                                      : jacobian;
    out.d_q.at(a, a) = per_jacobian * query_jacobian * w.key_spread[at] * unbias;
    const double key_term = score / r.n * (q.diag(a) + q.mean * q.mean);
    out.d_k.at(a, a) = after + r.h * key_term;
    after += r.m * key_term;
  }
  return out;
}

}  // namespace proplab::theory
