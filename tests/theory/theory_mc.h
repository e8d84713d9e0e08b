// Monte Carlo helpers for the theory tests: Gaussian token sequences with a chosen mean, variance and token
// correlation drawn from proplab::CounterRng, small dense kernels, and an accumulator that measures a signal's
// statistics the way probe/moments defines them (corr centred by the measured scalar mean).
//
// Layout: a sequence is [tokens, features] row-major (token t, feature f at t * features + f), as in
// core/tensor.h. Every draw is a pure function of (seed, stream, index), so each test is deterministic.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <numbers>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "theory/moments.h"

namespace proplab::theory::testing {

// Standard normals (Box–Muller on two 53-bit uniforms, two normals per Philox block) and uniforms from one
// counter-based stream, consumed in order.
class NormalStream {
 public:
  NormalStream(std::uint64_t seed, std::uint64_t stream) : rng_(seed, stream) {}

  double normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    std::uint32_t w[4];
    rng_.words(block_++, w);
    const double u1 = to_unit(w[0], w[1]);
    const double u2 = to_unit(w[2], w[3]);
    const double radius = std::sqrt(-2.0 * std::log(u1));
    const double angle = 2.0 * std::numbers::pi * u2;
    spare_ = radius * std::sin(angle);
    has_spare_ = true;
    return radius * std::cos(angle);
  }

  // Uniform in (0, 1).
  double uniform() {
    std::uint32_t w[4];
    rng_.words(block_++, w);
    return to_unit(w[0], w[1]);
  }

 private:
  // 53 random bits, offset by half a step: strictly inside (0, 1).
  static double to_unit(std::uint32_t hi, std::uint32_t lo) {
    const std::uint64_t bits = ((static_cast<std::uint64_t>(hi) << 32) | lo) >> 11;
    return (static_cast<double>(bits) + 0.5) * (1.0 / 9007199254740992.0);
  }

  CounterRng rng_;
  std::uint64_t block_ = 0;
  double spare_ = 0.0;
  bool has_spare_ = false;
};

// Fills x [tokens, features] with a Gaussian sequence: every element N(mean, var), the same feature of two tokens
// correlated `corr`, features independent. corr >= 0 for more than two tokens (a shared component per feature);
// two tokens may have any corr in [-1, 1].
inline void fill_sequence(NormalStream& normals, double mean, double var, double corr, int tokens, int features,
                          std::vector<double>& x) {
  PROPLAB_CHECK(tokens == 2 || corr >= 0.0, "fill_sequence: negative corr needs exactly two tokens");
  x.resize(static_cast<std::size_t>(tokens) * features);
  const double sigma = std::sqrt(var);
  if (tokens == 2) {
    const double rest = std::sqrt(1.0 - corr * corr);
    for (int f = 0; f < features; ++f) {
      const double z1 = normals.normal();
      const double z2 = normals.normal();
      x[f] = mean + sigma * z1;
      x[features + f] = mean + sigma * (corr * z1 + rest * z2);
    }
    return;
  }
  const double shared = std::sqrt(corr);
  const double own = std::sqrt(1.0 - corr);
  for (int f = 0; f < features; ++f) {
    const double c = normals.normal();
    for (int t = 0; t < tokens; ++t) x[static_cast<std::size_t>(t) * features + f] = mean + sigma * (shared * c);
  }
  for (std::size_t i = 0; i < x.size(); ++i) x[i] += sigma * own * normals.normal();
}

inline void fill_sequence(NormalStream& normals, const Signal& s, int tokens, int features, std::vector<double>& x) {
  fill_sequence(normals, s.mean, s.var, s.corr, tokens, features, x);
}

// A [rows, cols] matrix with N(0, var) entries.
inline std::vector<double> random_matrix(NormalStream& normals, int rows, int cols, double var) {
  std::vector<double> w(static_cast<std::size_t>(rows) * cols);
  const double sigma = std::sqrt(var);
  for (double& v : w) v = sigma * normals.normal();
  return w;
}

// y [n, m] = a [n, k] · b [k, m] (all row-major).
inline void matmul(const std::vector<double>& a, const std::vector<double>& b, int n, int k, int m,
                   std::vector<double>& y) {
  y.assign(static_cast<std::size_t>(n) * m, 0.0);
  for (int i = 0; i < n; ++i) {
    for (int p = 0; p < k; ++p) {
      const double aip = a[static_cast<std::size_t>(i) * k + p];
      const double* brow = &b[static_cast<std::size_t>(p) * m];
      double* yrow = &y[static_cast<std::size_t>(i) * m];
      for (int j = 0; j < m; ++j) yrow[j] += aip * brow[j];
    }
  }
}

// y [n, m] = a [n, k] · bᵀ with b [m, k].
inline void matmul_bt(const std::vector<double>& a, const std::vector<double>& b, int n, int k, int m,
                      std::vector<double>& y) {
  y.assign(static_cast<std::size_t>(n) * m, 0.0);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < m; ++j) {
      double sum = 0.0;
      for (int p = 0; p < k; ++p)
        sum += a[static_cast<std::size_t>(i) * k + p] * b[static_cast<std::size_t>(j) * k + p];
      y[static_cast<std::size_t>(i) * m + j] = sum;
    }
  }
}

// y [k, m] = aᵀ · b with a [n, k], b [n, m].
inline void matmul_at(const std::vector<double>& a, const std::vector<double>& b, int n, int k, int m,
                      std::vector<double>& y) {
  y.assign(static_cast<std::size_t>(k) * m, 0.0);
  for (int i = 0; i < n; ++i) {
    for (int p = 0; p < k; ++p) {
      const double aip = a[static_cast<std::size_t>(i) * k + p];
      const double* brow = &b[static_cast<std::size_t>(i) * m];
      double* yrow = &y[static_cast<std::size_t>(p) * m];
      for (int j = 0; j < m; ++j) yrow[j] += aip * brow[j];
    }
  }
}

// Mean, variance and token correlation of many sequences [tokens, features], pooled: mean and var over every
// element, corr = Σ_groups (|Σ_t (x_t - m)|² - Σ_t (x_t - m)²) / ((T - 1)·Σ (x - m)²) over groups (one feature of
// one sequence), m the pooled mean — probe/moments' definition.
class SequenceMoments {
 public:
  void add(const std::vector<double>& x, int tokens, int features) {
    PROPLAB_CHECK(tokens >= 2 && x.size() == static_cast<std::size_t>(tokens) * features,
                  "SequenceMoments::add: bad shape");
    tokens_ = tokens;
    for (int f = 0; f < features; ++f) {
      double column = 0.0;
      for (int t = 0; t < tokens; ++t) {
        const double v = x[static_cast<std::size_t>(t) * features + f];
        column += v;
        sum_sq_ += v * v;
      }
      sum_ += column;
      column_sq_ += column * column;
    }
    groups_ += features;
  }

  double count() const { return static_cast<double>(groups_) * tokens_; }
  double mean() const { return sum_ / count(); }
  double var() const {
    const double m = mean();
    return sum_sq_ / count() - m * m;
  }
  double corr() const {
    const double m = mean();
    const double n = count();
    const double t = tokens_;
    const double centred_sq = sum_sq_ - 2.0 * m * sum_ + n * m * m;
    const double column_centred_sq = column_sq_ - 2.0 * t * m * sum_ + static_cast<double>(groups_) * t * t * m * m;
    return (column_centred_sq - centred_sq) / ((t - 1.0) * centred_sq);
  }
  Signal signal() const { return {mean(), var(), corr()}; }
  GradSignal grad_signal() const { return {var(), corr()}; }

 private:
  int tokens_ = 0;
  std::int64_t groups_ = 0;
  double sum_ = 0.0;
  double sum_sq_ = 0.0;
  double column_sq_ = 0.0;
};

// EXPECT a Monte Carlo estimate within a relative tolerance of the prediction.
#define EXPECT_REL_NEAR(measured, predicted, rel_tol)                 \
  EXPECT_NEAR((measured), (predicted), (rel_tol)*std::abs(predicted)) \
      << "relative error " << ((measured) / (predicted)-1.0)

// EXPECT every statistic of a measured signal near the prediction: mean within mean_tol (absolute, in units of
// the predicted standard deviation), var within var_rel (relative), corr within corr_abs (absolute).
inline void expect_signal_near(const Signal& measured, const Signal& predicted, double mean_tol, double var_rel,
                               double corr_abs) {
  EXPECT_NEAR(measured.mean, predicted.mean, mean_tol * std::sqrt(predicted.var)) << "mean";
  EXPECT_REL_NEAR(measured.var, predicted.var, var_rel) << " (var)";
  EXPECT_NEAR(measured.corr, predicted.corr, corr_abs) << "corr";
}

inline void expect_grad_near(const GradSignal& measured, const GradSignal& predicted, double var_rel, double corr_abs) {
  EXPECT_REL_NEAR(measured.var, predicted.var, var_rel) << " (gradient var)";
  EXPECT_NEAR(measured.corr, predicted.corr, corr_abs) << "gradient corr";
}

}  // namespace proplab::theory::testing
