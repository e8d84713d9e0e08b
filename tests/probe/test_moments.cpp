// probe/moments: every statistic against a direct two-pass float64 computation, corr against a literal
// pairwise implementation of its definition, merging of partial sums, thread-count independence, non-finite
// counting and statistic selection.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "probe/moments.h"
#include "support/moments_equal.h"

namespace proplab::probe {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

struct Shape3 {
  std::int64_t sequences, tokens, features;
  std::int64_t numel() const { return sequences * tokens * features; }
  std::string str() const {
    std::ostringstream out;
    out << "[" << sequences << "," << tokens << "," << features << "]";
    return out.str();
  }
};

class ScopedThreads {
 public:
  explicit ScopedThreads(int count) : saved_(threads()) { set_threads(count); }
  ~ScopedThreads() { set_threads(saved_); }
  ScopedThreads(const ScopedThreads&) = delete;
  ScopedThreads& operator=(const ScopedThreads&) = delete;

 private:
  int saved_;
};

// x_btf = offset + feature_offset_f + scale · (√ρ · u_bf + √(1-ρ) · z_btf): tokens of one sequence share u_b,
// so their correlation is about ρ; feature offsets make chan_mean_sq differ from mean².
std::vector<float> make_tensor(const Shape3& s, std::uint64_t seed, double offset, double scale, double rho) {
  const CounterRng shared(seed, 1), own(seed, 2), feature(seed, 3);
  std::vector<float> x(static_cast<std::size_t>(s.numel()));
  for (std::int64_t b = 0; b < s.sequences; ++b)
    for (std::int64_t t = 0; t < s.tokens; ++t)
      for (std::int64_t f = 0; f < s.features; ++f) {
        const std::int64_t i = (b * s.tokens + t) * s.features + f;
        const double u = shared.normal(static_cast<std::uint64_t>(b * s.features + f));
        const double z = own.normal(static_cast<std::uint64_t>(i));
        const double feature_offset = 0.5 * feature.normal(static_cast<std::uint64_t>(f));
        x[static_cast<std::size_t>(i)] =
            static_cast<float>(offset + feature_offset + scale * (std::sqrt(rho) * u + std::sqrt(1.0 - rho) * z));
      }
  return x;
}

// Two-pass float64 reference of every statistic, straight from the definitions.
Moments reference(const std::vector<float>& x, const Shape3& s) {
  const std::int64_t B = s.sequences, T = s.tokens, F = s.features;
  const double n = static_cast<double>(s.numel());
  Moments m{};
  double sum = 0.0, max_abs = 0.0, nonfinite = 0.0;
  for (float v : x) {
    sum += v;
    max_abs = std::max(max_abs, std::fabs(static_cast<double>(v)));
    if (!std::isfinite(v)) nonfinite += 1.0;
  }
  const double mu = sum / n;
  double m2 = 0.0, m4 = 0.0, sum_sq = 0.0;
  for (float v : x) {
    const double d = v - mu;
    m2 += d * d;
    m4 += d * d * d * d;
    sum_sq += static_cast<double>(v) * v;
  }
  m.mean = mu;
  m.var = m2 / n;
  m.rms = std::sqrt(sum_sq / n);
  m.max_abs = max_abs;
  m.kurtosis = (m4 / n) / (m.var * m.var);
  m.nonfinite = nonfinite;
  // corr as written in the header: Σ_b (‖Σ_t v_bt‖² - Σ_t ‖v_bt‖²) / ((T-1) Σ_{b,t} ‖v_bt‖²), v = x - μ.
  double across = 0.0;
  std::vector<double> seq(static_cast<std::size_t>(F));
  for (std::int64_t b = 0; b < B; ++b) {
    std::fill(seq.begin(), seq.end(), 0.0);
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t f = 0; f < F; ++f) seq[static_cast<std::size_t>(f)] += x[(b * T + t) * F + f] - mu;
    for (double v : seq) across += v * v;
  }
  m.corr = T > 1 ? (across - m2) / (static_cast<double>(T - 1) * m2) : kNaN;
  double mean_sq = 0.0, var = 0.0;
  for (std::int64_t f = 0; f < F; ++f) {
    double fs = 0.0;
    for (std::int64_t r = 0; r < B * T; ++r) fs += x[r * F + f];
    const double fm = fs / static_cast<double>(B * T);
    double fv = 0.0;
    for (std::int64_t r = 0; r < B * T; ++r) fv += (x[r * F + f] - fm) * (x[r * F + f] - fm);
    mean_sq += fm * fm;
    var += fv / static_cast<double>(B * T);
  }
  m.chan_mean_sq = mean_sq / static_cast<double>(F);
  m.chan_var = var / static_cast<double>(F);
  return m;
}

// The definition of corr, literally: the mean over sequences and ordered pairs of different tokens of the
// inner product of the centred tokens, over the mean squared norm of a centred token.
double literal_corr(const std::vector<float>& x, const Shape3& s) {
  const std::int64_t B = s.sequences, T = s.tokens, F = s.features;
  double mu = 0.0;
  for (float v : x) mu += v;
  mu /= static_cast<double>(s.numel());
  double pair_sum = 0.0, norm_sum = 0.0;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t u = 0; u < T; ++u) {
        double inner = 0.0;
        for (std::int64_t f = 0; f < F; ++f) inner += (x[(b * T + t) * F + f] - mu) * (x[(b * T + u) * F + f] - mu);
        if (t == u)
          norm_sum += inner;
        else
          pair_sum += inner;
      }
  const double mean_pair = pair_sum / static_cast<double>(B * T * (T - 1));
  const double mean_norm = norm_sum / static_cast<double>(B * T);
  return mean_pair / mean_norm;
}

void expect_close(double actual, double expected, double rtol, const std::string& what) {
  if (std::isnan(expected)) {
    EXPECT_TRUE(std::isnan(actual)) << what << " = " << actual << ", expected NaN";
    return;
  }
  EXPECT_LE(std::fabs(actual - expected), rtol * std::fabs(expected))
      << what << " = " << actual << ", expected " << expected << " (relative error "
      << std::fabs(actual - expected) / std::fabs(expected) << ")";
}

void expect_moments_close(const Moments& actual, const Moments& expected, double rtol, const std::string& what) {
  for (int i = 0; i < kStatCount; ++i) {
    const auto stat = static_cast<Stat>(i);
    expect_close(actual.value(stat), expected.value(stat), rtol, what + " " + std::string(stat_name(stat)));
  }
}

Moments one_shot(const std::vector<float>& x, const Shape3& s, const StatSelection& which = StatSelection::all()) {
  MomentSums sums;
  accumulate(x.data(), s.sequences, s.tokens, s.features, sums, which);
  return finalize(sums);
}

// Whole-sequence chunks, several chunks, split sequences (T·F above a chunk), odd sizes and F = 1.
// The last is more chunks than run on the calling thread alone (kSerialChunks in probe/moments.cpp): the pool's path.
const std::vector<Shape3> kShapes = {{3, 17, 33},   {40, 16, 256}, {2, 100, 1024}, {4, 50, 1},
                                     {2, 70001, 1}, {5, 7, 3},     {1, 300, 700},  {6, 128, 512}};

TEST(Moments, HandComputedExample) {
  // Tokens (1, 2) and (3, 4): μ = 2.5, centred tokens (-1.5, -0.5) and (0.5, 1.5).
  const std::vector<float> x{1, 2, 3, 4};
  const Moments m = one_shot(x, {1, 2, 2});
  EXPECT_DOUBLE_EQ(m.mean, 2.5);
  EXPECT_DOUBLE_EQ(m.var, 1.25);
  EXPECT_DOUBLE_EQ(m.rms, std::sqrt(7.5));
  EXPECT_DOUBLE_EQ(m.max_abs, 4.0);
  EXPECT_DOUBLE_EQ(m.kurtosis, 2.5625 / 1.5625);
  EXPECT_DOUBLE_EQ(m.nonfinite, 0.0);
  EXPECT_DOUBLE_EQ(m.corr, -0.6);  // (‖(-1, 1)‖² - 5) / (1 · 5)
  EXPECT_DOUBLE_EQ(m.chan_mean_sq, 6.5);
  EXPECT_DOUBLE_EQ(m.chan_var, 1.0);
}

TEST(Moments, MatchTwoPassReference) {
  std::uint64_t seed = 11;
  for (const Shape3& s : kShapes) {
    for (double offset : {0.0, 0.7, -3.0}) {
      const std::vector<float> x = make_tensor(s, seed++, offset, 1.3, 0.3);
      expect_moments_close(one_shot(x, s), reference(x, s), 1e-10, s.str() + " offset " + std::to_string(offset));
    }
  }
}

TEST(Moments, LargeOffsetKeepsCentralMoments) {
  // |μ| / σ = 1000: raw power sums about zero would lose ~12 digits of the fourth central moment.
  const Shape3 s{4, 64, 96};
  const std::vector<float> x = make_tensor(s, 5, 1000.0, 1.0, 0.2);
  expect_moments_close(one_shot(x, s), reference(x, s), 1e-10, "offset 1000");
}

TEST(Moments, RecentredSumsAreTheSumsAboutTheNewShift) {
  // The sums of one tensor about another shift equal the sums accumulated about that shift from the start (within
  // rounding), every finished statistic is unchanged, and an empty accumulator only takes the shift.
  const Shape3 s{3, 17, 33};
  const std::vector<float> x = make_tensor(s, 21, 0.7, 1.3, 0.3);
  MomentSums sums;
  accumulate(x.data(), s.sequences, s.tokens, s.features, sums, StatSelection::all());
  const Moments before = finalize(sums);
  for (double shift : {0.0, 2.5, -40.0}) {
    MomentSums moved = sums;
    moved.recentre(shift);
    EXPECT_EQ(moved.shift, shift);
    expect_moments_close(finalize(moved), before, 1e-9, "recentred on " + std::to_string(shift));
    double direct = 0.0, direct_sq = 0.0;
    for (float v : x) {
      direct += v - shift;
      direct_sq += (v - shift) * (v - shift);
    }
    expect_close(moved.sum, direct, 1e-10, "Σ(x - s)");
    expect_close(moved.sum_sq, direct_sq, 1e-10, "Σ(x - s)²");
    // Back where it was: the same sums (within rounding).
    moved.recentre(sums.shift);
    expect_close(moved.sum_quad, sums.sum_quad, 1e-9, "Σd⁴ after a round trip");
  }
  MomentSums empty;
  empty.recentre(3.0);
  EXPECT_EQ(empty.shift, 3.0);
  EXPECT_TRUE(empty.empty());
}

TEST(Moments, SingleTokenCorrIsNaN) {
  const Shape3 s{50, 1, 64};
  const std::vector<float> x = make_tensor(s, 3, 0.4, 1.0, 0.0);
  const Moments m = one_shot(x, s);
  EXPECT_TRUE(std::isnan(m.corr));
  expect_moments_close(m, reference(x, s), 1e-10, "T = 1");
}

TEST(Moments, CorrMatchesLiteralDefinition) {
  std::uint64_t seed = 100;
  for (const Shape3& s : std::vector<Shape3>{{3, 9, 17}, {2, 33, 40}, {6, 2, 5}, {1, 40, 1}}) {
    for (double rho : {0.0, 0.5, 0.95}) {
      const std::vector<float> x = make_tensor(s, seed++, 0.8, 2.0, rho);
      const double expected = literal_corr(x, s);
      const double actual = one_shot(x, s).corr;
      // Uncorrelated tokens give a corr near zero: compare against its scale, the definition's denominator.
      EXPECT_LE(std::fabs(actual - expected), 1e-10 * std::max(std::fabs(expected), 1e-2))
          << s.str() << " rho " << rho << ": corr " << actual << ", literal " << expected;
      // (With one sequence of one feature, centring by the scalar mean removes the shared component.)
      if (rho >= 0.5 && s.sequences * s.features > 1) {
        EXPECT_GT(actual, 0.3) << s.str() << " rho " << rho;
      }
    }
  }
}

TEST(Moments, ConstantTensorHasZeroVariance) {
  const Shape3 s{2, 8, 16};
  const std::vector<float> x(static_cast<std::size_t>(s.numel()), -2.5f);
  const Moments m = one_shot(x, s);
  EXPECT_EQ(m.mean, -2.5);
  EXPECT_EQ(m.var, 0.0);
  EXPECT_EQ(m.rms, 2.5);
  EXPECT_EQ(m.chan_var, 0.0);
  EXPECT_EQ(m.chan_mean_sq, 6.25);
  EXPECT_TRUE(std::isnan(m.kurtosis));  // 0 / 0
  EXPECT_TRUE(std::isnan(m.corr));
}

// The sums of x's sequences [first, first + count).
MomentSums sums_of(const std::vector<float>& x, const Shape3& s, std::int64_t first, std::int64_t count,
                   const StatSelection& which = StatSelection::all()) {
  MomentSums sums;
  accumulate(x.data() + first * s.tokens * s.features, count, s.tokens, s.features, sums, which);
  return sums;
}

TEST(Moments, MergedPartsEqualOneShot) {
  std::uint64_t seed = 40;
  for (const Shape3& s : std::vector<Shape3>{{9, 17, 33}, {6, 100, 1024}, {8, 16, 256}, {7, 5, 1}}) {
    const std::vector<float> x = make_tensor(s, seed++, 1.5, 0.8, 0.4);
    const Moments expected = one_shot(x, s);
    const std::int64_t B = s.sequences;
    const std::vector<std::vector<std::int64_t>> splits = {
        {1, B - 1}, {B - 1, 1}, {B / 2, B - B / 2}, {2, 3, B - 5}, std::vector<std::int64_t>(B, 1)};
    for (const auto& split : splits) {
      std::string name = s.str() + " split";
      MomentSums merged;  // merged into an empty accumulator first
      MomentSums sequential;
      std::int64_t first = 0;
      for (std::int64_t count : split) {
        name += ' ';
        name += std::to_string(count);
        merged.merge(sums_of(x, s, first, count));
        accumulate(x.data() + first * s.tokens * s.features, count, s.tokens, s.features, sequential,
                   StatSelection::all());
        first += count;
      }
      ASSERT_EQ(first, B);
      EXPECT_EQ(merged.count, s.numel());
      EXPECT_EQ(merged.sequences, B);
      expect_moments_close(finalize(merged), expected, 1e-12, name + " merged");
      expect_moments_close(finalize(sequential), expected, 1e-12, name + " accumulated in turn");
    }
    // Merging in the other order, and merging an empty accumulator, change nothing beyond rounding.
    MomentSums reversed = sums_of(x, s, B / 2, B - B / 2);
    reversed.merge(sums_of(x, s, 0, B / 2));
    reversed.merge(MomentSums{});
    expect_moments_close(finalize(reversed), expected, 1e-12, s.str() + " reversed");
  }
}

TEST(Moments, MergeRejectsDifferentShapesAndSelections) {
  const Shape3 s{4, 8, 16};
  const std::vector<float> x = make_tensor(s, 9, 0.0, 1.0, 0.0);
  MomentSums a = sums_of(x, s, 0, 2);
  MomentSums wider;
  accumulate(x.data(), 2, 4, 32, wider, StatSelection::all());
  EXPECT_THROW(a.merge(wider), InternalError);
  EXPECT_THROW(accumulate(x.data(), 2, 4, 32, a, StatSelection::all()), InternalError);
  const MomentSums fewer = sums_of(x, s, 2, 2, StatSelection::parse({"mean", "var"}));
  EXPECT_THROW(a.merge(fewer), InternalError);
  EXPECT_THROW(accumulate(x.data(), 2, s.tokens, s.features, a, StatSelection::parse({"mean"})), InternalError);
}

TEST(Moments, BitwiseIdenticalForAnyThreadCount) {
  std::uint64_t seed = 70;
  for (const Shape3& s : kShapes) {
    const std::vector<float> x = make_tensor(s, seed++, 0.3, 1.0, 0.5);
    for (const StatSelection& which :
         {StatSelection::all(), StatSelection::parse({"corr"}), StatSelection::parse({"max_abs", "kurtosis"})}) {
      MomentSums one, two;
      {
        ScopedThreads scoped(1);
        accumulate(x.data(), s.sequences, s.tokens, s.features, one, which);
      }
      {
        ScopedThreads scoped(2);
        accumulate(x.data(), s.sequences, s.tokens, s.features, two, which);
      }
      expect_bitwise_equal(one, two, s.str());
    }
  }
}

TEST(Moments, FlatVectorWithLayoutFreeStatistics) {
  // One long row (as for packed attention logits): scanned as rows of a fixed width plus a shorter tail.
  const Shape3 s{1, 1, 300001};
  std::vector<float> x = make_tensor(s, 17, 0.9, 3.0, 0.0);
  const StatSelection which = StatSelection::parse({"mean", "var", "rms", "max_abs", "kurtosis", "nonfinite"});
  const Moments expected = reference(x, s);
  const Moments m = one_shot(x, s, which);
  for (Stat stat : {Stat::mean, Stat::var, Stat::rms, Stat::max_abs, Stat::kurtosis, Stat::nonfinite})
    expect_close(m.value(stat), expected.value(stat), 1e-10, std::string("flat ") + std::string(stat_name(stat)));
  MomentSums one, two;
  {
    ScopedThreads scoped(1);
    accumulate(x.data(), s.sequences, s.tokens, s.features, one, which);
  }
  {
    ScopedThreads scoped(2);
    accumulate(x.data(), s.sequences, s.tokens, s.features, two, which);
  }
  expect_bitwise_equal(one, two, "flat");
  x[s.numel() - 3] = std::numeric_limits<float>::quiet_NaN();  // in the short last row
  const Moments with_nan = one_shot(x, s, which);
  EXPECT_EQ(with_nan.nonfinite, 1.0);
  EXPECT_TRUE(std::isnan(with_nan.max_abs));
}

TEST(Moments, CountsNonFiniteElements) {
  const Shape3 s{3, 40, 600};  // split into several chunks
  const std::vector<float> clean = make_tensor(s, 21, 0.5, 1.0, 0.1);
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  struct Case {
    std::vector<std::pair<std::size_t, float>> inserts;
    double max_abs;  // expected; NaN: must be NaN
  };
  const std::size_t last = clean.size() - 1;
  const std::vector<Case> cases = {
      {{{0, nan}}, kNaN},
      {{{7, inf}, {last, -inf}}, kInf},
      {{{5, -inf}}, kInf},
      {{{1, nan}, {50000, inf}, {60000, -inf}, {last, nan}, {123, nan}}, kNaN},
  };
  const std::vector<StatSelection> selections = {StatSelection::all(), StatSelection::parse({"nonfinite"}),
                                                 StatSelection::parse({"max_abs", "nonfinite"}),
                                                 StatSelection::parse({"mean", "nonfinite"})};
  for (const Case& c : cases) {
    std::vector<float> x = clean;
    for (const auto& [index, value] : c.inserts) x[index] = value;
    for (const StatSelection& which : selections) {
      const Moments m = one_shot(x, s, which);
      const std::string what =
          std::to_string(c.inserts.size()) + " inserted, stats " + std::to_string(which.names().size());
      EXPECT_EQ(m.nonfinite, static_cast<double>(c.inserts.size())) << what;
      if (which.has(Stat::max_abs)) {
        if (std::isnan(c.max_abs)) {
          EXPECT_TRUE(std::isnan(m.max_abs)) << what;
        } else {
          EXPECT_EQ(m.max_abs, c.max_abs) << what;
        }
      }
      if (which.has(Stat::mean)) {
        EXPECT_FALSE(std::isfinite(m.mean)) << what;
      }
    }
  }
  for (const StatSelection& which : selections) EXPECT_EQ(one_shot(clean, s, which).nonfinite, 0.0);

  // Counts add up across accumulate and merge.
  std::vector<float> x = clean;
  x[3] = nan;
  x[last] = inf;
  MomentSums merged = sums_of(x, s, 0, 1);
  merged.merge(sums_of(x, s, 1, 2));
  EXPECT_EQ(finalize(merged).nonfinite, 2.0);
  EXPECT_TRUE(std::isnan(finalize(merged).max_abs));
}

TEST(Moments, SelectionParsesNamesAndRejectsUnknownOnes) {
  const auto& names = stat_names();
  ASSERT_EQ(names.size(), 9u);
  const std::vector<std::string> expected{"mean",      "var",  "rms",          "max_abs", "kurtosis",
                                          "nonfinite", "corr", "chan_mean_sq", "chan_var"};
  for (std::size_t i = 0; i < names.size(); ++i) {
    EXPECT_EQ(names[i], expected[i]);
    EXPECT_EQ(stat_name(static_cast<Stat>(i)), expected[i]);
  }
  EXPECT_EQ(StatSelection::parse(expected), StatSelection::all());
  EXPECT_EQ(StatSelection::all().names(), expected);
  const StatSelection some = StatSelection::parse({"corr", "mean", "corr"});
  EXPECT_TRUE(some.has(Stat::mean));
  EXPECT_TRUE(some.has(Stat::corr));
  EXPECT_FALSE(some.has(Stat::var));
  EXPECT_EQ(some.names(), (std::vector<std::string>{"mean", "corr"}));
  EXPECT_TRUE(StatSelection::parse({}).empty());

  try {
    StatSelection::parse({"mean", "kurt"}, "study.toml: probe.stats");
    FAIL() << "an unknown statistic was accepted";
  } catch (const UserError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("study.toml: probe.stats"), std::string::npos) << message;
    EXPECT_NE(message.find("'kurt'"), std::string::npos) << message;
    for (const std::string& name : expected) EXPECT_NE(message.find(name), std::string::npos) << message;
  }
}

TEST(Moments, SkippedStatisticsAreNaNAndCostNoStorage) {
  const Shape3 s{4, 24, 48};
  const std::vector<float> x = make_tensor(s, 31, -0.6, 1.1, 0.3);
  const Moments full = one_shot(x, s);
  for (int i = 0; i < kStatCount; ++i) {
    const auto stat = static_cast<Stat>(i);
    StatSelection which;
    which.add(stat);
    MomentSums sums;
    accumulate(x.data(), s.sequences, s.tokens, s.features, sums, which);
    const Moments m = finalize(sums);
    const std::string name(stat_name(stat));
    expect_close(m.value(stat), full.value(stat), 1e-12, name + " alone");
    for (int j = 0; j < kStatCount; ++j)
      if (j != i) {
        EXPECT_TRUE(std::isnan(m.value(static_cast<Stat>(j)))) << name << " alone: " << stat_names()[j];
      }
    const bool chan = stat == Stat::chan_mean_sq || stat == Stat::chan_var;
    EXPECT_EQ(sums.feature_sum.empty(), !chan) << name;
    EXPECT_EQ(sums.feature_sum_sq.empty(), !chan) << name;
    if (stat != Stat::corr) {
      EXPECT_EQ(sums.seq_sum_norm_sq, 0.0) << name;
    }
    if (stat != Stat::kurtosis) {
      EXPECT_EQ(sums.sum_cube, 0.0) << name;
      EXPECT_EQ(sums.sum_quad, 0.0) << name;
    }
    if (stat != Stat::max_abs) {
      EXPECT_EQ(sums.max_abs, 0.0) << name;
    }
    if (stat == Stat::max_abs || stat == Stat::nonfinite) {
      EXPECT_EQ(sums.sum, 0.0) << name;
      EXPECT_EQ(sums.sum_sq, 0.0) << name;
    }
  }
}

TEST(Moments, ClearedSumsStartAfreshAndKeepCapacity) {
  const Shape3 wide{2, 8, 64}, narrow{3, 5, 16};
  const std::vector<float> x = make_tensor(wide, 12, 0.1, 1.0, 0.2);
  const std::vector<float> y = make_tensor(narrow, 13, -0.4, 2.0, 0.2);
  MomentSums sums;
  accumulate(x.data(), wide.sequences, wide.tokens, wide.features, sums, StatSelection::all());
  sums.clear();
  EXPECT_TRUE(sums.empty());
  EXPECT_GE(sums.feature_sum.capacity(), 64u);
  EXPECT_TRUE(sums.feature_sum.empty());
  // A cleared accumulator takes any shape and selection again.
  accumulate(y.data(), narrow.sequences, narrow.tokens, narrow.features, sums, StatSelection::all());
  expect_moments_close(finalize(sums), reference(y, narrow), 1e-10, "after clear");
}

TEST(Moments, EmptySumsFinalizeToNaN) {
  const Moments m = finalize(MomentSums{});
  EXPECT_TRUE(std::isnan(m.mean));
  EXPECT_TRUE(std::isnan(m.var));
  EXPECT_TRUE(std::isnan(m.corr));
  EXPECT_EQ(m.nonfinite, 0.0);
}

TEST(Moments, TensorOverloadViewsRowsAsSequences) {
  const Shape3 s{4, 12, 20};
  const std::vector<float> x = make_tensor(s, 8, 0.2, 1.0, 0.6);
  const Tensor rows = Tensor::from_vector({s.sequences * s.tokens, s.features}, x);
  MomentSums from_rows, from_3d;
  accumulate(rows, s.sequences, from_rows, StatSelection::all());
  accumulate(rows.reshape({s.sequences, s.tokens, s.features}), s.sequences, from_3d, StatSelection::all());
  EXPECT_EQ(from_rows.tokens_per_sequence, s.tokens);
  expect_bitwise_equal(from_rows, from_3d, "rows vs [B, T, F]");
  expect_moments_close(finalize(from_rows), reference(x, s), 1e-10, "tensor overload");
  MomentSums bad;
  EXPECT_THROW(accumulate(rows, 5, bad, StatSelection::all()), InternalError);
}

// accumulate_planes reads an NCHW image in place and must give accumulate()'s sums of its channels-last view, up to
// rounding: every statistic, per-feature sums, ‖S_b‖², max and non-finite count, over two accumulated tensors
// (so the merge of a second image into started sums too), and bitwise the same on 1 and 2 threads.
// Adds every chunk of `chunked`: in order (order 0), reversed (1), or the even ones here and the odd ones from a
// second thread at the same time (2).
void add_chunks(const ChunkedAccumulation& chunked, int order) {
  const std::int64_t chunks = chunked.chunks();
  if (order == 2) {
    std::thread odd([&] {
      for (std::int64_t c = 1; c < chunks; c += 2) chunked.add(c);
    });
    for (std::int64_t c = 0; c < chunks; c += 2) chunked.add(c);
    odd.join();
  } else {
    for (std::int64_t c = 0; c < chunks; ++c) chunked.add(order == 1 ? chunks - 1 - c : c);
  }
}

// Sums taken chunk by chunk, as an op takes them inside its own loop (ops::OpMoments), are bitwise accumulate()'s:
// into empty and into non-empty sums, with the chunks added in order, in reverse and from two threads at once, with
// the pool at 1 and 2 threads; the chunks tile the tensor in order. Layout-free statistics over rows of more than
// 1024 features are not taken (accumulate() reads those as other rows).
TEST(Moments, ChunkedAccumulationIsBitwiseAccumulate) {
  std::uint64_t seed = 300;
  std::vector<Shape3> shapes = kShapes;
  shapes.push_back({2, 3, 2000});
  for (const Shape3& s : shapes) {
    const std::vector<float> x = make_tensor(s, seed++, 0.3, 1.0, 0.5);
    const std::vector<float> y = make_tensor(s, seed++, -2.0, 3.0, 0.1);
    for (const StatSelection& which :
         {StatSelection::all(), StatSelection::parse({"corr"}), StatSelection::parse({"max_abs", "kurtosis"}),
          StatSelection::parse({"chan_var"}), StatSelection::parse({"nonfinite"}), StatSelection::parse({"mean"})}) {
      MomentSums expected;
      accumulate(x.data(), s.sequences, s.tokens, s.features, expected, which);
      accumulate(y.data(), s.sequences, s.tokens, s.features, expected, which);
      const bool layout_free = !which.has(Stat::corr) && !which.has(Stat::chan_mean_sq) && !which.has(Stat::chan_var);
      const bool scanned = which.has(Stat::mean) || which.has(Stat::max_abs) || which.has(Stat::corr) ||
                           which.has(Stat::chan_var) || which.has(Stat::kurtosis);
      for (int pool : {1, 2}) {
        for (int order = 0; order < 3; ++order) {  // in order, reversed, from two threads
          ScopedThreads scoped(pool);
          MomentSums got;
          for (const std::vector<float>* t : {&x, &y}) {
            ChunkedAccumulation chunked(t->data(), s.sequences, s.tokens, s.features, got, which,
                                        [t](std::int64_t i) { return (*t)[static_cast<std::size_t>(i)]; });
            const std::string what = s.str() + " " + which.names().front() + " pool " + std::to_string(pool) +
                                     " order " + std::to_string(order);
            if (!chunked.supported()) {
              EXPECT_TRUE(layout_free && scanned && s.features > 1024) << what;
              accumulate(t->data(), s.sequences, s.tokens, s.features, got, which);
              continue;
            }
            const std::int64_t chunks = chunked.chunks();
            ASSERT_GE(chunks, 1) << what;
            EXPECT_EQ(chunked.begin(0), 0) << what;
            EXPECT_EQ(chunked.end(chunks - 1), s.numel()) << what;
            for (std::int64_t c = 0; c + 1 < chunks; ++c) EXPECT_EQ(chunked.end(c), chunked.begin(c + 1)) << what;
            add_chunks(chunked, order);
            chunked.finish();
          }
          expect_bitwise_equal(got, expected, s.str() + " pool " + std::to_string(pool));
        }
      }
    }
  }
}

// Image planes taken chunk by chunk (ChunkedAccumulation::Images) are bitwise accumulate_planes()'s, into empty
// and non-empty sums, chunks in order, reversed and from two threads; the chunks are whole planes tiling the tensor.
TEST(Moments, ChunkedImagePlanesAreBitwiseAccumulatePlanes) {
  struct Image {
    std::int64_t samples, channels, pixels;
  };
  std::uint64_t seed = 400;
  for (const Image& im : {Image{16, 8, 784}, Image{3, 5, 7}, Image{2, 2, 70001}}) {
    const Shape3 s{im.samples, im.pixels, im.channels};
    const std::vector<float> x = make_tensor(s, seed++, 0.3, 1.0, 0.5), y = make_tensor(s, seed++, -1.0, 2.0, 0.2);
    for (const StatSelection& which :
         {StatSelection::all(), StatSelection::parse({"corr"}), StatSelection::parse({"nonfinite"})}) {
      MomentSums expected;
      accumulate_planes(x.data(), im.samples, im.channels, im.pixels, expected, which);
      accumulate_planes(y.data(), im.samples, im.channels, im.pixels, expected, which);
      for (int order = 0; order < 3; ++order) {
        MomentSums got;
        for (const std::vector<float>* t : {&x, &y}) {
          ChunkedAccumulation chunked(ChunkedAccumulation::Images{}, t->data(), im.samples, im.channels, im.pixels, got,
                                      which, [t](std::int64_t i) { return (*t)[static_cast<std::size_t>(i)]; });
          ASSERT_TRUE(chunked.supported());
          const std::int64_t chunks = chunked.chunks();
          EXPECT_EQ(chunked.begin(0), 0);
          EXPECT_EQ(chunked.end(chunks - 1), s.numel());
          for (std::int64_t c = 0; c < chunks; ++c) {
            EXPECT_EQ(chunked.begin(c) % im.pixels, 0);
            if (c + 1 < chunks) {
              EXPECT_EQ(chunked.end(c), chunked.begin(c + 1));
            }
          }
          add_chunks(chunked, order);
          chunked.finish();
        }
        expect_bitwise_equal(got, expected, "planes order " + std::to_string(order));
      }
    }
  }
}

TEST(Moments, PlanesOfAnImageMatchItsChannelsLastView) {
  const std::int64_t n = 5, c = 19, pixels = 7 * 11;
  std::vector<float> images[2], views[2];
  for (int t = 0; t < 2; ++t) {
    images[t].resize(static_cast<std::size_t>(n * c * pixels));
    views[t].resize(images[t].size());
    const CounterRng rng(31, static_cast<std::uint64_t>(t));
    for (std::int64_t b = 0; b < n; ++b)
      for (std::int64_t ch = 0; ch < c; ++ch)
        for (std::int64_t p = 0; p < pixels; ++p) {
          const std::size_t at = static_cast<std::size_t>((b * c + ch) * pixels + p);
          images[t][at] = static_cast<float>(1.5 + 0.1 * ch + (1.0 + 0.05 * b) * rng.normal(at));
          views[t][static_cast<std::size_t>((b * pixels + p) * c + ch)] = images[t][at];
        }
  }
  images[1][17] = std::numeric_limits<float>::infinity();  // a non-finite element in the second image
  views[1][static_cast<std::size_t>(17 * c)] = images[1][17];
  const StatSelection all = StatSelection::all();
  MomentSums reference;
  for (int t = 0; t < 2; ++t) accumulate(views[t].data(), n, pixels, c, reference, all);
  MomentSums planes[2];
  for (int run = 0; run < 2; ++run) {
    ScopedThreads scoped(run + 1);
    for (int t = 0; t < 2; ++t) accumulate_planes(images[t].data(), n, c, pixels, planes[run], all);
  }
  // The image with an Inf makes the sums non-finite in both; compare the finite first image on its own too.
  EXPECT_EQ(planes[0].nonfinite, reference.nonfinite);
  EXPECT_EQ(planes[0].count, reference.count);
  EXPECT_EQ(planes[0].sequences, reference.sequences);
  EXPECT_EQ(planes[0].max_abs, reference.max_abs);
  EXPECT_EQ(std::memcmp(&planes[0].sum, &planes[1].sum, sizeof(double)), 0);
  EXPECT_EQ(planes[0].feature_sum, planes[1].feature_sum);
  EXPECT_EQ(planes[0].seq_sum_norm_sq, planes[1].seq_sum_norm_sq);
  MomentSums one_reference, one_planes;
  accumulate(views[0].data(), n, pixels, c, one_reference, all);
  accumulate_planes(images[0].data(), n, c, pixels, one_planes, all);
  one_planes.recentre(one_reference.shift);
  auto close = [](double a, double b) { return std::abs(a - b) <= 1e-10 * std::max(1.0, std::abs(b)); };
  EXPECT_TRUE(close(one_planes.sum, one_reference.sum)) << one_planes.sum << " " << one_reference.sum;
  EXPECT_TRUE(close(one_planes.sum_sq, one_reference.sum_sq));
  EXPECT_TRUE(close(one_planes.sum_cube, one_reference.sum_cube));
  EXPECT_TRUE(close(one_planes.sum_quad, one_reference.sum_quad));
  EXPECT_TRUE(close(one_planes.seq_sum_norm_sq, one_reference.seq_sum_norm_sq));
  EXPECT_EQ(one_planes.max_abs, one_reference.max_abs);
  ASSERT_EQ(one_planes.feature_sum.size(), static_cast<std::size_t>(c));
  for (std::size_t f = 0; f < static_cast<std::size_t>(c); ++f) {
    EXPECT_TRUE(close(one_planes.feature_sum[f], one_reference.feature_sum[f])) << f;
    EXPECT_TRUE(close(one_planes.feature_sum_sq[f], one_reference.feature_sum_sq[f])) << f;
  }
  const Moments a = finalize(one_planes), b = finalize(one_reference);
  for (const double* pair : {&a.mean, &a.var, &a.kurtosis, &a.corr, &a.chan_mean_sq, &a.chan_var}) {
    const double other = *(&b.mean + (pair - &a.mean));
    EXPECT_TRUE(close(*pair, other)) << *pair << " " << other;
  }
}

}  // namespace
}  // namespace proplab::probe
