// probe/needs: what a selection of statistics needs the moment sums to hold (the probe module's private helper,
// shared by accumulation, probe/moments.cpp, and finalisation, probe/finalize.cpp).
#pragma once

#include "probe/moments.h"

namespace proplab::probe::detail {

// What the sums must hold for a selection.
struct Needs {
  bool sums = false;      // Σd, Σd² (every moment statistic)
  bool higher = false;    // Σd³, Σd⁴ (kurtosis)
  bool max = false;       // max |x|
  bool seq = false;       // Σ_b ‖S_b‖² (corr)
  bool features = false;  // per-feature Σd, Σd² (chan statistics)
  bool nonfinite = false;
};

inline Needs needs_for(const StatSelection& which) {
  Needs needs;
  needs.higher = which.has(Stat::kurtosis);
  needs.max = which.has(Stat::max_abs);
  needs.seq = which.has(Stat::corr);
  needs.features = which.has(Stat::chan_mean_sq) || which.has(Stat::chan_var);
  needs.nonfinite = which.has(Stat::nonfinite);
  needs.sums = needs.higher || needs.seq || needs.features || which.has(Stat::mean) || which.has(Stat::var) ||
               which.has(Stat::rms);
  return needs;
}

}  // namespace proplab::probe::detail
