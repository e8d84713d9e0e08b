// probe/finalize: statistics from moment sums (finalize), one statistic of a Moments (Moments::value), and the
// moment sums of a distributed loss's logits (moment_sums).
#include <cmath>
#include <limits>

#include "core/error.h"
#include "probe/moments.h"
#include "probe/needs.h"

namespace proplab::probe {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

}  // namespace

using detail::Needs;
using detail::needs_for;

double Moments::value(Stat stat) const {
  switch (stat) {
    case Stat::mean:
      return mean;
    case Stat::var:
      return var;
    case Stat::rms:
      return rms;
    case Stat::max_abs:
      return max_abs;
    case Stat::kurtosis:
      return kurtosis;
    case Stat::nonfinite:
      return nonfinite;
    case Stat::corr:
      return corr;
    case Stat::chan_mean_sq:
      return chan_mean_sq;
    case Stat::chan_var:
      return chan_var;
  }
  PROPLAB_CHECK(false, "unknown Stat ", static_cast<int>(stat));
  return kNaN;
}

Moments finalize(const MomentSums& sums) {
  Moments m{kNaN, kNaN, kNaN, kNaN, kNaN, kNaN, kNaN, kNaN, kNaN};
  const StatSelection& s = sums.selection;
  if (sums.empty()) {
    m.nonfinite = 0.0;
    return m;
  }
  if (s.has(Stat::nonfinite)) m.nonfinite = static_cast<double>(sums.nonfinite);
  if (s.has(Stat::max_abs)) m.max_abs = sums.max_abs;
  const Needs needs = needs_for(s);
  if (!needs.sums) return m;

  const double n = static_cast<double>(sums.count);
  const double e = sums.sum / n;  // mean of d = x - shift
  const double mean = sums.shift + e;
  double m2 = sums.sum_sq / n - e * e;
  if (m2 < 0.0) m2 = 0.0;  // rounding of an all-equal tensor; NaN passes through
  if (s.has(Stat::mean)) m.mean = mean;
  if (s.has(Stat::var)) m.var = m2;
  if (s.has(Stat::rms)) m.rms = std::sqrt(m2 + mean * mean);
  if (s.has(Stat::kurtosis)) {
    const double e2 = e * e;
    const double m4 = sums.sum_quad / n - 4.0 * e * (sums.sum_cube / n) + 6.0 * e2 * (sums.sum_sq / n) - 3.0 * e2 * e2;
    m.kurtosis = m4 / (m2 * m2);
  }
  if (s.has(Stat::corr)) {
    const double T = static_cast<double>(sums.tokens_per_sequence);
    if (sums.tokens_per_sequence > 1) {
      // Σ_b ‖Σ_t (x_bt - μ)‖² = Σ_b ‖S_b‖² - T·n·e² (expanding the centring; S_b = Σ_t d_bt).
      const double within = n * m2;  // Σ_{b,t} ‖x_bt - μ‖²
      const double across = sums.seq_sum_norm_sq - T * n * e * e;
      m.corr = (across - within) / ((T - 1.0) * within);
    }
  }
  if (needs.features) {
    const double per_feature = static_cast<double>(sums.sequences * sums.tokens_per_sequence);
    double mean_sq = 0.0, var = 0.0;
    for (std::size_t f = 0; f < sums.feature_sum.size(); ++f) {
      const double feature_e = sums.feature_sum[f] / per_feature;
      const double feature_mean = sums.shift + feature_e;
      double feature_var = sums.feature_sum_sq[f] / per_feature - feature_e * feature_e;
      if (feature_var < 0.0) feature_var = 0.0;
      mean_sq += feature_mean * feature_mean;
      var += feature_var;
    }
    const double F = static_cast<double>(sums.features);
    if (s.has(Stat::chan_mean_sq)) m.chan_mean_sq = mean_sq / F;
    if (s.has(Stat::chan_var)) m.chan_var = var / F;
  }
  return m;
}

MomentSums moment_sums(const LogitSums& sums, const StatSelection& which) {
  MomentSums m;
  if (sums.count == 0) return m;
  for (Stat stat : {Stat::mean, Stat::var, Stat::rms, Stat::max_abs, Stat::kurtosis, Stat::nonfinite})
    if (which.has(stat)) m.selection.add(stat);
  m.count = sums.count;
  m.sequences = 1;
  m.tokens_per_sequence = 1;
  m.features = sums.count;
  m.shift = 0.0;
  // As accumulate(): non-finite values make the moment statistics non-finite.
  const double poison = sums.nonfinite > 0 ? kNaN : 0.0;
  m.sum = sums.sum + poison;
  m.sum_sq = sums.sum_sq + poison;
  m.sum_cube = sums.sum_cube + poison;
  m.sum_quad = sums.sum_quad + poison;
  m.max_abs = sums.nonfinite > 0 ? kNaN : sums.max_abs;
  m.nonfinite = sums.nonfinite;
  return m;
}

}  // namespace proplab::probe
