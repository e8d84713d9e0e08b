// probe/moments: mergeable moment accumulators, the heart of per-layer recording.
//
// A recorded tensor x (f32, contiguous, on the CPU or a CUDA GPU) is viewed as [sequences B, tokens T, features F]: an
// activation [B, T, F] as it is, a [rows, F] tensor with T = rows / B (row index = b * T + t, as in
// core/tensor.h). Every statistic is taken over the whole tensor and accumulated in float64:
//   mean, var (population), rms, max_abs, kurtosis = E[(x-μ)^4] / var^2, nonfinite (count of NaN/±Inf),
//   corr = mean correlation between different tokens of one sequence, centred by the scalar mean μ:
//          Σ_b (‖Σ_t (x_bt - μ)‖² - Σ_t ‖x_bt - μ‖²) / ((T - 1) · Σ_{b,t} ‖x_bt - μ‖²)   (NaN when T = 1),
//   chan_mean_sq = mean over features of (per-feature mean over all B·T tokens)²,
//   chan_var = mean over features of the per-feature population variance.
//
// Invariants:
// - MomentSums holds sums, never finished statistics, so partial accumulators merge exactly: merging adds sums
//   and counts and takes the maximum of maxima; finalize() turns sums into Moments at the end.
// - All power sums are taken about `shift` (a value near the mean chosen from the first data seen), so the
//   central moments do not lose their digits to cancellation when |μ| is large against the spread. merge()
//   re-expresses the other side's sums about this side's shift (binomial expansion) before adding.
// - Results are bitwise identical for any thread count: accumulate() splits the tensor into fixed chunks
//   (a function of the shape only) and combines the chunks' sums in chunk order.
// - Only the selected statistics are computed; the others cost nothing and finalize() reports them as NaN.
//   Without corr and the chan statistics the layout does not matter: a flat vector may be passed as [1, 1, n].
// - A CUDA tensor's sums are computed on the GPU (kernels/moments.cuh, in a build with CUDA) with the same
//   definitions: the same shift (chosen on the device from the same elements, in the same arithmetic), float64
//   sums combined in a fixed order (bitwise repeatable, equal to the CPU's up to rounding), max_abs and the counts
//   exactly as on the CPU. Only the totals (and the per-feature sums) are copied back, once per call; they are
//   added to `into` as the CPU path adds its own, so CPU and CUDA tensors may be accumulated into the same sums.
// - Non-finite elements make the moment statistics non-finite (NaN or ±Inf, as IEEE arithmetic gives);
//   max_abs is NaN when any element is NaN, else +Inf when any element is ±Inf.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"

namespace proplab::probe {

// The statistics, in the order of stat_names().
enum class Stat : std::uint8_t { mean, var, rms, max_abs, kurtosis, nonfinite, corr, chan_mean_sq, chan_var };
constexpr int kStatCount = 9;

// The statistic names, indexed by Stat: mean, var, rms, max_abs, kurtosis, nonfinite, corr, chan_mean_sq,
// chan_var.
const std::array<std::string_view, kStatCount>& stat_names();
std::string_view stat_name(Stat stat);

// A set of statistics (a bitmask over Stat).
class StatSelection {
 public:
  StatSelection() = default;
  static StatSelection all();
  // The statistics with these names; an unknown name is a UserError that names it, says where (`where`, e.g.
  // "study.toml: probe.stats") and lists the valid names.
  static StatSelection parse(const std::vector<std::string>& names, std::string_view where = "statistics");

  StatSelection& add(Stat stat);
  bool has(Stat stat) const { return (bits_ >> static_cast<unsigned>(stat)) & 1u; }
  bool empty() const { return bits_ == 0; }
  std::uint32_t bits() const { return bits_; }
  // The selection whose bits() are `bits` (for sums sent between processes).
  static StatSelection from_bits(std::uint32_t bits) {
    StatSelection s;
    s.bits_ = bits;
    return s;
  }
  // The selected names, in stat_names() order.
  std::vector<std::string> names() const;
  bool operator==(const StatSelection&) const = default;

 private:
  std::uint32_t bits_ = 0;
};

// Running sums over one or more accumulated tensors of the same [*, T, F] shape. All power sums are of
// d = x - shift. A default-constructed MomentSums is empty (count 0) and takes its shape, selection and shift
// from the first accumulate() or merge().
struct MomentSums {
  std::int64_t count = 0;                                          // elements
  std::int64_t sequences = 0;                                      // B, summed over accumulated tensors
  std::int64_t tokens_per_sequence = 0;                            // T
  std::int64_t features = 0;                                       // F
  StatSelection selection;                                         // what the sums below support
  double shift = 0.0;                                              // every sum below is of d = x - shift
  double sum = 0.0, sum_sq = 0.0, sum_cube = 0.0, sum_quad = 0.0;  // Σd, Σd², Σd³ (kurtosis), Σd⁴ (kurtosis)
  double max_abs = 0.0;                                            // max |x| (max_abs): NaN if any NaN was seen
  std::int64_t nonfinite = 0;                                      // NaN/±Inf elements (nonfinite)
  double seq_sum_norm_sq = 0.0;                                    // Σ_b ‖Σ_t d_bt‖² (corr)
  std::vector<double> feature_sum, feature_sum_sq;  // [F]: Σ_{b,t} d_btf, Σ_{b,t} d_btf² (chan statistics)

  bool empty() const { return count == 0; }
  // Back to empty, keeping the per-feature arrays' capacity (a recorder reusing its sums allocates nothing).
  void clear();
  // Adds other's sums into these. Both must agree in T, F and selection (unless one is empty); sequences add.
  void merge(const MomentSums& other);
  // The same sums about another shift (exact algebra: Σ(x − s') = Σ(x − s) − n·(s' − s), and so on for every power
  // and the per-feature and per-sequence sums). Empty sums only take the new shift.
  void recentre(double new_shift);
};

// Raw power sums of values that have no [B, T, F] structure, gathered where they are computed (the attention
// logits inside the attention op): count, sums of x, x², x³, x⁴ over the finite values, max |x| of the finite
// values, and the number of non-finite ones. moment_sums() turns them into MomentSums of a flat [1, 1, count]
// tensor (no token correlation or per-feature statistics).
struct LogitSums {
  std::int64_t count = 0;
  std::int64_t nonfinite = 0;
  double sum = 0.0, sum_sq = 0.0, sum_cube = 0.0, sum_quad = 0.0;
  double max_abs = 0.0;
  // Adds another part's sums (counts and sums add, max_abs takes the larger).
  void add(const LogitSums& part);
};
// Adds the power sums of row[0, count) to `sums` (double; NaN/Inf only counted). Vectorised (the compiler's fixed
// lane order; a scalar double chain cost about 1 ms of a recorded reference-transformer step).
void add_logit_row(const float* row, std::int64_t count, LogitSums& sums);
// MomentSums (shift 0) holding `sums` for the statistics of `which` that apply (corr and chan ones dropped).
MomentSums moment_sums(const LogitSums& sums, const StatSelection& which);

// The same sums for an NCHW image tensor x [samples, channels, pixels] (CPU) as accumulate() gives for its
// channels-last view [samples, pixels, channels] (sequences = samples, tokens = pixels, features = channels), read
// in place: each (sample, channel) plane is summed on its own, its sums are that channel's per-feature sums, and
// ‖S_b‖² is the sum of sample b's squared plane sums. Equal up to rounding (another summation order and shift),
// bitwise independent of the thread count; it saves the channels-last copy, a pass over memory per probe.
void accumulate_planes(const float* x, std::int64_t samples, std::int64_t channels, std::int64_t pixels,
                       MomentSums& into, const StatSelection& which);

// accumulate() of a tensor that an op writes (or reads) chunk by chunk inside its own parallel loop, so the sums are
// taken while each chunk is in cache and in the op's parallel region rather than in a pass and a region of their
// own. The chunks are accumulate()'s (a function of the shape only); the sums are bitwise those accumulate(x, ...)
// gives for the finished tensor, whatever the thread count, given the same shift: when `into` is empty the shift is
// chosen from value_at(i), which must return the element i the tensor will hold (the op's own arithmetic, read at
// the up to 64 positions accumulate() samples), before any chunk is written.
//
//   ChunkedAccumulation sums(y, B, T, F, into, which, [&](std::int64_t i) { return op(x[i]); });
//   #pragma omp parallel for schedule(static)
//   for (c = 0; c < sums.chunks(); ++c) { write y[sums.begin(c), sums.end(c)); sums.add(c); }
//   sums.finish();
//
// `slot` (0 to kChunkedSlots − 1) names the calling thread's buffers: sums in flight at the same time on one thread
// need different slots. Tensors whose layout accumulate() would change (only layout-free statistics over rows of
// more than 1024 features) are not taken: supported() is false, and the op accumulates the finished tensor instead.
constexpr int kChunkedSlots = 2;
class ChunkedAccumulation {
 public:
  ChunkedAccumulation(const float* x, std::int64_t sequences, std::int64_t tokens, std::int64_t features,
                      MomentSums& into, const StatSelection& which, const std::function<float(std::int64_t)>& value_at,
                      int slot = 0);
  // The same for an NCHW image tensor [samples, channels, pixels], summed as accumulate_planes() sums it (its
  // channels-last view): bitwise accumulate_planes' sums given the same shift; the chunks are whole planes.
  struct Images {};
  ChunkedAccumulation(Images, const float* x, std::int64_t samples, std::int64_t channels, std::int64_t pixels,
                      MomentSums& into, const StatSelection& which, const std::function<float(std::int64_t)>& value_at,
                      int slot = 0);
  ~ChunkedAccumulation();
  ChunkedAccumulation(const ChunkedAccumulation&) = delete;
  ChunkedAccumulation& operator=(const ChunkedAccumulation&) = delete;

  // Whether the tensor is taken in chunks (until finish()).
  bool supported() const { return state_ != nullptr; }
  // Chunks, and chunk c's elements [begin(c), end(c)) of the flat tensor (consecutive, covering it in order).
  std::int64_t chunks() const;
  std::int64_t begin(std::int64_t chunk) const;
  std::int64_t end(std::int64_t chunk) const;
  // Sums chunk c (its elements must hold their final values); from any thread, each chunk once.
  void add(std::int64_t chunk) const;
  // After every chunk: merges the chunks' sums in chunk order and adds them to `into` (the calling thread).
  void finish();

  struct State;

 private:
  std::unique_ptr<State> state_;  // null when not supported, and after finish()
};

// Finished statistics; NaN for statistics the sums were not accumulated for (nonfinite is a count).
struct Moments {
  double mean, var, rms, max_abs, kurtosis, nonfinite, corr, chan_mean_sq, chan_var;
  double value(Stat stat) const;
};

// Adds the statistics `which` of x (sequences · tokens · features f32 elements, row-major [B, T, F]) into
// `into`. `into` must be empty or hold sums of the same T, F and selection.
void accumulate(const float* x, std::int64_t sequences, std::int64_t tokens, std::int64_t features, MomentSums& into,
                const StatSelection& which);
// The same for a contiguous f32 tensor (CPU, or CUDA in a build with CUDA) viewed as [sequences, rows / sequences,
// last dimension].
void accumulate(const Tensor& x, std::int64_t sequences, MomentSums& into, const StatSelection& which);

// The statistics from the sums (all NaN for empty sums, nonfinite 0).
Moments finalize(const MomentSums& sums);

}  // namespace proplab::probe
