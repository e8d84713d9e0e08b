// CUDA-vs-CPU comparison of the probe's moment sums (kernels/moments.cu through probe::accumulate on a CUDA tensor
// against the CPU path on the same values): every finished statistic within 1e-6 relative, the shift, max_abs and
// the counts exactly equal, over shapes that take every launch path (layout-free, whole sequences per chunk, pieces
// of a sequence, several feature tiles), statistic selections, large offsets and non-finite values; merging into
// non-empty sums; bitwise repeatability. Skipped at run time when no GPU is present.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "probe/moments.h"

namespace proplab {
namespace {

using probe::Moments;
using probe::MomentSums;
using probe::Stat;
using probe::StatSelection;

constexpr double kRelTol = 1e-6;
constexpr float kNaNf = std::numeric_limits<float>::quiet_NaN();
constexpr float kInff = std::numeric_limits<float>::infinity();

struct Shape3 {
  std::int64_t sequences, tokens, features;
  std::int64_t numel() const { return sequences * tokens * features; }
  std::string str() const {
    std::ostringstream out;
    out << "[" << sequences << ", " << tokens << ", " << features << "]";
    return out.str();
  }
};

// T = 1, F = 1, a single element, long rows (several feature tiles, and a flat vector), many short sequences
// (whole sequences per chunk), long sequences (split into pieces), and a large tensor.
const std::vector<Shape3> kShapes = {{1, 1, 1},      {3, 1, 5},    {4, 7, 1},      {1000, 1, 1000}, {2, 3, 5000},
                                     {1, 1, 100003}, {64, 512, 4}, {2, 4096, 300}, {4096, 3, 64},   {8, 1024, 768}};

// x_btf = offset + 0.5·g_f + √ρ·u_bf + √(1-ρ)·z_btf: tokens of a sequence share u_b (correlation about ρ) and the
// per-feature offsets g_f make the chan statistics differ from the scalar ones.
std::vector<float> make_values(const Shape3& s, std::uint64_t seed, double offset, double rho = 0.3) {
  const CounterRng shared(seed, 1), own(seed, 2), feature(seed, 3);
  std::vector<float> x(static_cast<std::size_t>(s.numel()));
  for (std::int64_t b = 0; b < s.sequences; ++b)
    for (std::int64_t t = 0; t < s.tokens; ++t)
      for (std::int64_t f = 0; f < s.features; ++f) {
        const std::int64_t i = (b * s.tokens + t) * s.features + f;
        const double u = shared.normal(static_cast<std::uint64_t>(b * s.features + f));
        const double z = own.normal(static_cast<std::uint64_t>(i));
        const double g = feature.normal(static_cast<std::uint64_t>(f));
        x[static_cast<std::size_t>(i)] =
            static_cast<float>(offset + 0.5 * g + std::sqrt(rho) * u + std::sqrt(1.0 - rho) * z);
      }
  return x;
}

Tensor cpu_tensor(const std::vector<float>& values, const Shape3& s) {
  return Tensor::from_vector({s.sequences, s.tokens, s.features}, values);
}

Tensor cuda_tensor(const std::vector<float>& values, const Shape3& s) { return cpu_tensor(values, s).to(Device::cuda); }

StatSelection selection(const std::vector<std::string>& names) { return StatSelection::parse(names); }

// The selections that take different paths: everything; no layout statistics (the flat kernel); one statistic
// alone (mean; max_abs or nonfinite without sums); corr without the chan statistics (pieces merged without
// per-feature output) and the reverse; kurtosis with corr; nothing at all.
std::vector<std::pair<std::string, StatSelection>> selections() {
  return {{"all", StatSelection::all()},
          {"no corr/chan", selection({"mean", "var", "rms", "max_abs", "kurtosis", "nonfinite"})},
          {"mean", selection({"mean"})},
          {"max_abs", selection({"max_abs"})},
          {"nonfinite", selection({"nonfinite"})},
          {"corr", selection({"corr"})},
          {"chan", selection({"chan_mean_sq", "chan_var"})},
          {"kurtosis+corr+max", selection({"kurtosis", "corr", "max_abs"})},
          {"none", StatSelection{}}};
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof(double)) == 0; }

// Both NaN, equal (infinities of one sign included), or within kRelTol of the CPU's value.
void expect_stat_close(double cuda, double cpu, const std::string& what) {
  if (std::isnan(cpu) || std::isnan(cuda)) {
    EXPECT_TRUE(std::isnan(cpu) && std::isnan(cuda)) << what << ": cuda " << cuda << " vs cpu " << cpu;
    return;
  }
  if (cuda == cpu) return;
  EXPECT_LE(std::abs(cuda - cpu), kRelTol * std::abs(cpu)) << what << ": cuda " << cuda << " vs cpu " << cpu;
}

// Every finished statistic within tolerance; what must be exact (shape, counts, shift, max |x|) exactly equal;
// with finite data, the per-feature sums within 1e-10 of their natural scale √(n_f · Σd²).
void expect_sums_match(const MomentSums& cuda, const MomentSums& cpu, const std::string& what, bool finite) {
  EXPECT_EQ(cuda.count, cpu.count) << what;
  EXPECT_EQ(cuda.sequences, cpu.sequences) << what;
  EXPECT_EQ(cuda.tokens_per_sequence, cpu.tokens_per_sequence) << what;
  EXPECT_EQ(cuda.features, cpu.features) << what;
  EXPECT_TRUE(cuda.selection == cpu.selection) << what;
  EXPECT_TRUE(same_bits(cuda.shift, cpu.shift)) << what << ": shift cuda " << cuda.shift << " vs cpu " << cpu.shift;
  EXPECT_TRUE(same_bits(cuda.max_abs, cpu.max_abs) || (std::isnan(cuda.max_abs) && std::isnan(cpu.max_abs)))
      << what << ": max_abs cuda " << cuda.max_abs << " vs cpu " << cpu.max_abs;
  EXPECT_EQ(cuda.nonfinite, cpu.nonfinite) << what;
  ASSERT_EQ(cuda.feature_sum.size(), cpu.feature_sum.size()) << what;
  ASSERT_EQ(cuda.feature_sum_sq.size(), cpu.feature_sum_sq.size()) << what;
  if (finite && cpu.features > 0) {
    const double per_feature = static_cast<double>(cpu.count / cpu.features);
    std::int64_t failures = 0;
    for (std::size_t f = 0; f < cpu.feature_sum.size(); ++f) {
      const double scale = std::sqrt(per_feature * cpu.feature_sum_sq[f]);
      const bool ok = std::abs(cuda.feature_sum[f] - cpu.feature_sum[f]) <= 1e-10 * scale &&
                      std::abs(cuda.feature_sum_sq[f] - cpu.feature_sum_sq[f]) <= 1e-10 * cpu.feature_sum_sq[f];
      if (!ok && ++failures <= 5)
        ADD_FAILURE() << what << ": feature " << f << ": sum " << cuda.feature_sum[f] << " vs " << cpu.feature_sum[f]
                      << ", sum_sq " << cuda.feature_sum_sq[f] << " vs " << cpu.feature_sum_sq[f];
    }
    EXPECT_EQ(failures, 0) << what;
  }
  const Moments a = probe::finalize(cuda);
  const Moments b = probe::finalize(cpu);
  for (int k = 0; k < probe::kStatCount; ++k) {
    const auto stat = static_cast<Stat>(k);
    expect_stat_close(a.value(stat), b.value(stat), what + " " + std::string(probe::stat_name(stat)));
  }
}

MomentSums accumulate_cpu(const std::vector<float>& values, const Shape3& s, const StatSelection& which) {
  MomentSums sums;
  probe::accumulate(cpu_tensor(values, s), s.sequences, sums, which);
  return sums;
}

MomentSums accumulate_cuda(const std::vector<float>& values, const Shape3& s, const StatSelection& which) {
  MomentSums sums;
  probe::accumulate(cuda_tensor(values, s), s.sequences, sums, which);
  return sums;
}

// All fields bitwise equal (two runs of the same accumulation).
void expect_identical(const MomentSums& a, const MomentSums& b, const std::string& what) {
  EXPECT_EQ(a.count, b.count) << what;
  EXPECT_EQ(a.sequences, b.sequences) << what;
  EXPECT_EQ(a.nonfinite, b.nonfinite) << what;
  for (auto [x, y, name] : {std::tuple{a.shift, b.shift, "shift"}, std::tuple{a.sum, b.sum, "sum"},
                            std::tuple{a.sum_sq, b.sum_sq, "sum_sq"}, std::tuple{a.sum_cube, b.sum_cube, "sum_cube"},
                            std::tuple{a.sum_quad, b.sum_quad, "sum_quad"}, std::tuple{a.max_abs, b.max_abs, "max_abs"},
                            std::tuple{a.seq_sum_norm_sq, b.seq_sum_norm_sq, "seq_sum_norm_sq"}})
    EXPECT_TRUE(same_bits(x, y)) << what << ": " << name << " " << x << " vs " << y;
  ASSERT_EQ(a.feature_sum.size(), b.feature_sum.size()) << what;
  ASSERT_EQ(a.feature_sum_sq.size(), b.feature_sum_sq.size()) << what;
  const std::size_t bytes = sizeof(double) * a.feature_sum.size();
  EXPECT_EQ(std::memcmp(a.feature_sum.data(), b.feature_sum.data(), bytes), 0) << what << ": feature_sum";
  EXPECT_EQ(std::memcmp(a.feature_sum_sq.data(), b.feature_sum_sq.data(), bytes), 0) << what << ": feature_sum_sq";
}

#define SKIP_WITHOUT_GPU() \
  if (!proplab::cuda_available()) GTEST_SKIP() << "no CUDA GPU: skipping CUDA-vs-CPU comparison"

TEST(MomentsCuda, MatchCpuOverShapesAndSelections) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 10;
  for (const Shape3& s : kShapes) {
    const std::vector<float> values = make_values(s, ++seed, 0.0);
    for (const auto& [name, which] : selections()) {
      const std::string what = s.str() + " " + name;
      SCOPED_TRACE(what);
      expect_sums_match(accumulate_cuda(values, s, which), accumulate_cpu(values, s, which), what, true);
    }
  }
}

TEST(MomentsCuda, LargeMeanOffset) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 100;
  for (const Shape3& s : {Shape3{1, 1, 1}, Shape3{4, 7, 1}, Shape3{64, 512, 4}, Shape3{2, 3, 5000},
                          Shape3{8, 1024, 768}, Shape3{1, 1, 100003}}) {
    const std::vector<float> values = make_values(s, ++seed, 1e3);
    for (const auto& [name, which] : selections()) {
      const std::string what = s.str() + " offset 1e3 " + name;
      SCOPED_TRACE(what);
      expect_sums_match(accumulate_cuda(values, s, which), accumulate_cpu(values, s, which), what, true);
    }
  }
}

TEST(MomentsCuda, NonFiniteValues) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 200;
  for (const Shape3& s : {Shape3{3, 1, 5}, Shape3{4, 7, 1}, Shape3{2, 4096, 300}, Shape3{1, 1, 100003}}) {
    const std::vector<float> clean = make_values(s, ++seed, 0.5);
    const std::size_t n = clean.size();
    // +Inf only; NaN and ±Inf (one NaN at element 0, a shift sample, which the shift must skip); -Inf only.
    std::vector<float> inf = clean, mixed = clean, negative = clean;
    inf[n / 2] = kInff;
    mixed[0] = kNaNf;
    mixed[n - 1] = kInff;
    if (n > 2) mixed[n / 3] = -kInff;
    negative[n - 1] = -kInff;
    for (const auto& [label, values] :
         {std::pair{"+inf", &inf}, std::pair{"nan", &mixed}, std::pair{"-inf", &negative}})
      for (const auto& [name, which] : selections()) {
        const std::string what = s.str() + " " + label + " " + name;
        SCOPED_TRACE(what);
        expect_sums_match(accumulate_cuda(*values, s, which), accumulate_cpu(*values, s, which), what, false);
      }
  }
  // Every element non-finite: no finite shift sample (shift 0).
  const Shape3 s{2, 3, 4};
  std::vector<float> values(static_cast<std::size_t>(s.numel()), kNaNf);
  for (std::size_t i = 0; i < values.size(); i += 2) values[i] = -kInff;
  const MomentSums cuda = accumulate_cuda(values, s, StatSelection::all());
  expect_sums_match(cuda, accumulate_cpu(values, s, StatSelection::all()), "all non-finite", false);
  EXPECT_EQ(cuda.nonfinite, s.numel());
}

TEST(MomentsCuda, AccumulatesIntoNonEmptySums) {
  SKIP_WITHOUT_GPU();
  for (const Shape3& s : {Shape3{3, 1, 5}, Shape3{64, 512, 4}, Shape3{2, 3, 5000}}) {
    // Different offsets, so the second tensor's sums are about a shift chosen from the first.
    const std::vector<float> first = make_values(s, 300, 2.0);
    const std::vector<float> second = make_values(s, 301, -3.0);
    for (const auto& [name, which] : selections()) {
      const std::string what = s.str() + " " + name;
      SCOPED_TRACE(what);
      MomentSums cpu, cuda, mixed;
      probe::accumulate(cpu_tensor(first, s), s.sequences, cpu, which);
      probe::accumulate(cpu_tensor(second, s), s.sequences, cpu, which);
      probe::accumulate(cuda_tensor(first, s), s.sequences, cuda, which);
      probe::accumulate(cuda_tensor(second, s), s.sequences, cuda, which);
      expect_sums_match(cuda, cpu, what + " (cuda, cuda)", true);
      // A CPU tensor first, then a CUDA one, into the same sums.
      probe::accumulate(cpu_tensor(first, s), s.sequences, mixed, which);
      probe::accumulate(cuda_tensor(second, s), s.sequences, mixed, which);
      expect_sums_match(mixed, cpu, what + " (cpu, cuda)", true);
      // Sums from the GPU merged into sums from the CPU (different shifts: merge re-centres them).
      MomentSums merged_cpu = accumulate_cpu(first, s, which);
      MomentSums merged_cuda = accumulate_cpu(first, s, which);
      merged_cpu.merge(accumulate_cpu(second, s, which));
      merged_cuda.merge(accumulate_cuda(second, s, which));
      expect_sums_match(merged_cuda, merged_cpu, what + " (merged)", true);
    }
  }
}

TEST(MomentsCuda, RowsViewAndEmptyTensor) {
  SKIP_WITHOUT_GPU();
  // A [rows, F] tensor split into sequences, as a recorder passes activations.
  const Shape3 s{6, 5, 33};
  const std::vector<float> values = make_values(s, 400, 0.0);
  MomentSums cuda;
  probe::accumulate(Tensor::from_vector({s.sequences * s.tokens, s.features}, values).to(Device::cuda), s.sequences,
                    cuda, StatSelection::all());
  expect_sums_match(cuda, accumulate_cpu(values, s, StatSelection::all()), "rows view", true);
  // No elements: nothing added.
  MomentSums empty;
  probe::accumulate(Tensor::empty({0, 8}, DType::f32, Device::cuda), 1, empty, StatSelection::all());
  EXPECT_TRUE(empty.empty());
}

TEST(MomentsCuda, BitwiseRepeatable) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 500;
  for (const Shape3& s :
       {Shape3{1000, 1, 1000}, Shape3{64, 512, 4}, Shape3{2, 4096, 300}, Shape3{8, 1024, 768}, Shape3{1, 1, 100003}}) {
    const std::vector<float> values = make_values(s, ++seed, 1.0);
    const Tensor x = cuda_tensor(values, s);
    for (const auto& [name, which] : selections()) {
      const std::string what = s.str() + " " + name;
      MomentSums first, second;
      probe::accumulate(x, s.sequences, first, which);
      probe::accumulate(x, s.sequences, second, which);
      expect_identical(first, second, what);
    }
  }
}

}  // namespace
}  // namespace proplab
