#include "probe/moments.h"

#include <algorithm>
#include <array>
#include <bit>
#include <utility>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>

#include "core/error.h"
#include "probe/needs.h"

#ifdef PROPLAB_WITH_CUDA
#include "kernels/moments.cuh"
#endif

namespace proplab::probe {

namespace {

// Elements per chunk (rows of a chunk = this / F, at least one): large enough that the per-chunk merge is a
// small fraction of the work, small enough that a [8,128,256] tensor still splits over two threads.
constexpr std::int64_t kChunkElements = std::int64_t{1} << 16;
// Up to this many chunks a tensor's moments run on the calling thread: waking the pool (tens of microseconds under
// OMP_WAIT_POLICY=passive) costs more than the second thread saves. The chunks and their order are the same either
// way, so the result is too.
constexpr std::int64_t kSerialChunks = 4;
// Rows handled together by the kernel, so each per-feature array is loaded and stored once per block of rows.
constexpr std::int64_t kRowBlock = 4;
// Row width used for tensors with very long rows when only layout-free statistics are wanted.
constexpr std::int64_t kFlatWidth = 1024;
// Features per block when the chunks' per-feature sums are merged (in parallel over blocks).
constexpr std::int64_t kMergeFeatures = 128;
// Interleaved partial sums of ordered_sum(): a fixed order that still vectorises.
constexpr int kLanes = 16;
constexpr std::uint32_t kAbsMask = 0x7fffffffu;
constexpr std::uint32_t kExponentMask = 0x7f800000u;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
// Elements the shift is chosen from (kernels/moments.cu samples the same).
constexpr std::int64_t kShiftSamples = 64;

using Index = std::int64_t;
using detail::Needs;
using detail::needs_for;

// a·b + c, fused where the target has FMA (the kernels' throughput depends on it).
inline double mul_add(double a, double b, double c) {
#ifdef __FMA__
  return std::fma(a, b, c);
#else
  return a * b + c;
#endif
}

// |x| as bits: for non-negative floats the integer order is the float order, and NaN sorts above +Inf, so an
// integer max gives max |x|, or +Inf when an Inf is present, or a NaN when a NaN is present.
inline std::uint32_t abs_bits(float x) { return std::bit_cast<std::uint32_t>(x) & kAbsMask; }

inline bool is_nonfinite_bits(std::uint32_t bits) { return (bits & kExponentMask) == kExponentMask; }

// Σ v[0, n) in a fixed order that vectorises: kLanes interleaved partial sums, then the lanes in order.
double ordered_sum(const double* __restrict v, Index n) {
  double lanes[kLanes] = {};
  Index i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) lanes[j] += v[i + j];
  for (int j = 0; i < n; ++i, ++j) lanes[j] += v[i];
  double total = 0.0;
  for (double lane : lanes) total += lane;
  return total;
}

// Σ v[i]² over [0, n), in the same fixed order.
double ordered_sum_sq(const double* __restrict v, Index n) {
  double lanes[kLanes] = {};
  Index i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) lanes[j] = mul_add(v[i + j], v[i + j], lanes[j]);
  for (int j = 0; i < n; ++i, ++j) lanes[j] = mul_add(v[i], v[i], lanes[j]);
  double total = 0.0;
  for (double lane : lanes) total += lane;
  return total;
}

// The hot loop: adds `rows` rows of x (row stride F) into per-feature arrays, kRowBlock rows at a time. Every
// array is indexed by feature, so the loop over features carries no dependency and vectorises without
// reassociation; the arithmetic order is fixed by this source, hence by the chunk plan alone.
template <bool kSums, bool kHigher, bool kMax>
void accumulate_rows(const float* __restrict x, Index rows, Index features, double shift, double* __restrict sum,
                     double* __restrict sum_sq, double* __restrict cube, double* __restrict quad,
                     std::uint32_t* __restrict max_bits) {
  Index r = 0;
  for (; r + kRowBlock <= rows; r += kRowBlock) {
    const float* __restrict x0 = x + r * features;
    const float* __restrict x1 = x0 + features;
    const float* __restrict x2 = x1 + features;
    const float* __restrict x3 = x2 + features;
    for (Index f = 0; f < features; ++f) {
      if constexpr (kSums) {
        const double d0 = static_cast<double>(x0[f]) - shift;
        const double d1 = static_cast<double>(x1[f]) - shift;
        const double d2 = static_cast<double>(x2[f]) - shift;
        const double d3 = static_cast<double>(x3[f]) - shift;
        sum[f] += (d0 + d1) + (d2 + d3);
        const double q0 = d0 * d0, q1 = d1 * d1, q2 = d2 * d2, q3 = d3 * d3;
        sum_sq[f] += (q0 + q1) + (q2 + q3);
        if constexpr (kHigher) {
          cube[f] = mul_add(q3, d3, mul_add(q2, d2, mul_add(q1, d1, mul_add(q0, d0, cube[f]))));
          quad[f] = mul_add(q3, q3, mul_add(q2, q2, mul_add(q1, q1, mul_add(q0, q0, quad[f]))));
        }
      }
      if constexpr (kMax) {
        const std::uint32_t a =
            std::max(std::max(abs_bits(x0[f]), abs_bits(x1[f])), std::max(abs_bits(x2[f]), abs_bits(x3[f])));
        max_bits[f] = std::max(max_bits[f], a);
      }
    }
  }
  for (; r < rows; ++r) {
    const float* __restrict x0 = x + r * features;
    for (Index f = 0; f < features; ++f) {
      if constexpr (kSums) {
        const double d0 = static_cast<double>(x0[f]) - shift;
        sum[f] += d0;
        const double q0 = d0 * d0;
        sum_sq[f] += q0;
        if constexpr (kHigher) {
          cube[f] = mul_add(q0, d0, cube[f]);
          quad[f] = mul_add(q0, q0, quad[f]);
        }
      }
      if constexpr (kMax) max_bits[f] = std::max(max_bits[f], abs_bits(x0[f]));
    }
  }
}

// Per-feature working arrays of one thread, kept between calls (OpenMP threads persist) so the hot path does
// not allocate once warm. Each array starts on a 64-byte boundary.
struct Scratch {
  std::vector<double> storage;
  Index capacity = 0;  // features the arrays hold
  double* seq_sum = nullptr;
  double* cube = nullptr;
  double* quad = nullptr;
  double* sum = nullptr;
  double* sum_sq = nullptr;
  std::uint32_t* max_bits = nullptr;

  void reserve(Index features) {
    if (features <= capacity) return;
    const Index padded = (features + 7) / 8 * 8;
    storage.assign(static_cast<std::size_t>(5 * padded + padded / 2 + 8), 0.0);
    auto address = reinterpret_cast<std::uintptr_t>(storage.data());
    double* base = reinterpret_cast<double*>((address + 63) / 64 * 64);
    seq_sum = base;
    cube = base + padded;
    quad = base + 2 * padded;
    sum = base + 3 * padded;
    sum_sq = base + 4 * padded;
    max_bits = reinterpret_cast<std::uint32_t*>(base + 5 * padded);
    capacity = features;
  }
};

Scratch& thread_scratch() {
  thread_local Scratch scratch;
  return scratch;
}

// How accumulate() splits a [B, T, F] tensor: a function of the shape only, never of the thread count.
// Whole mode (T rows fit a chunk): each chunk holds `sequences_per_chunk` whole sequences. Split mode: each
// sequence is cut into `pieces_per_sequence` pieces of `rows_per_piece` rows (the last may be shorter).
struct ChunkPlan {
  bool split = false;
  Index sequences_per_chunk = 1;
  Index rows_per_piece = 0;
  Index pieces_per_sequence = 1;
  Index chunks = 0;
};

ChunkPlan plan_chunks(Index sequences, Index tokens, Index features) {
  Index rows = std::max<Index>(1, kChunkElements / features);
  if (rows >= kRowBlock) rows = rows / kRowBlock * kRowBlock;
  ChunkPlan plan;
  if (tokens <= rows) {
    plan.sequences_per_chunk = std::max<Index>(1, rows / tokens);
    plan.chunks = (sequences + plan.sequences_per_chunk - 1) / plan.sequences_per_chunk;
  } else {
    plan.split = true;
    plan.rows_per_piece = rows;
    plan.pieces_per_sequence = (tokens + rows - 1) / rows;
    plan.chunks = sequences * plan.pieces_per_sequence;
  }
  return plan;
}

// One chunk's scalar sums (its per-feature sums, when kept, live in the call's partial buffer).
struct ChunkSums {
  double sum = 0.0, sum_sq = 0.0, sum_cube = 0.0, sum_quad = 0.0, seq_sum_norm_sq = 0.0;
  std::uint32_t max_bits = 0;
};

// Buffers of one accumulate() call, owned by the calling thread and reused by its later calls.
struct CallBuffers {
  std::vector<ChunkSums> chunk_sums;
  std::vector<double> partials;     // [chunks][2][padded F]: per-feature Σd, Σd² of each chunk (when kept)
  std::vector<double> block_norms;  // [sequences][merge blocks]: split mode's ‖S_b‖² per feature block
};

CallBuffers& call_buffers() {
  thread_local CallBuffers buffers;
  return buffers;
}

// The calling thread's buffers for ChunkedAccumulation slot `slot` (apart from accumulate()'s).
CallBuffers& chunked_buffers(int slot) {
  PROPLAB_CHECK(slot >= 0 && slot < kChunkedSlots, "ChunkedAccumulation slot ", slot, " out of [0, ", kChunkedSlots,
                ")");
  thread_local std::array<CallBuffers, kChunkedSlots> buffers;
  return buffers[static_cast<std::size_t>(slot)];
}

struct Problem {
  const float* x;
  Index sequences, tokens, features, padded;
  double shift;
  Needs needs;
  ChunkPlan plan;
  bool keep_partials;  // per-feature sums of each chunk are needed after the chunk pass
  double* partials;
  ChunkSums* chunk_sums;
  // Merge of the partials, per block of kMergeFeatures features: into these per-feature totals (when
  // needs.features) and, in split mode with needs.seq, into ‖S_b‖² restricted to each block
  // ([sequences][merge_blocks]).
  Index merge_blocks;
  double* feature_sum;
  double* feature_sum_sq;
  double* block_norms;
};

template <bool kSums, bool kHigher, bool kMax>
void run_chunk(const Problem& p, Index chunk) {
  const Index F = p.features;
  Scratch& scratch = thread_scratch();
  scratch.reserve(F);
  double* sum = p.keep_partials ? p.partials + chunk * 2 * p.padded : scratch.sum;
  double* sum_sq = p.keep_partials ? sum + p.padded : scratch.sum_sq;
  if constexpr (kSums) {
    std::fill(sum, sum + F, 0.0);
    std::fill(sum_sq, sum_sq + F, 0.0);
  }
  if constexpr (kHigher) {
    std::fill(scratch.cube, scratch.cube + F, 0.0);
    std::fill(scratch.quad, scratch.quad + F, 0.0);
  }
  if constexpr (kMax) std::fill(scratch.max_bits, scratch.max_bits + F, 0u);

  ChunkSums out;
  const Index sequence_elements = p.tokens * F;
  if (!p.plan.split) {
    const Index first = chunk * p.plan.sequences_per_chunk;
    const Index last = std::min(p.sequences, first + p.plan.sequences_per_chunk);
    for (Index b = first; b < last; ++b) {
      const float* xb = p.x + b * sequence_elements;
      if (kSums && p.needs.seq) {
        // Sum this sequence on its own to form ‖S_b‖², then add it into the chunk's feature sums.
        double* seq_sum = scratch.seq_sum;
        std::fill(seq_sum, seq_sum + F, 0.0);
        accumulate_rows<kSums, kHigher, kMax>(xb, p.tokens, F, p.shift, seq_sum, sum_sq, scratch.cube, scratch.quad,
                                              scratch.max_bits);
        out.seq_sum_norm_sq += ordered_sum_sq(seq_sum, F);
        for (Index f = 0; f < F; ++f) sum[f] += seq_sum[f];
      } else {
        accumulate_rows<kSums, kHigher, kMax>(xb, p.tokens, F, p.shift, sum, sum_sq, scratch.cube, scratch.quad,
                                              scratch.max_bits);
      }
    }
  } else {
    // A piece of one sequence; ‖S_b‖² is formed from the pieces' feature sums after the parallel pass.
    const Index b = chunk / p.plan.pieces_per_sequence;
    const Index first_row = (chunk % p.plan.pieces_per_sequence) * p.plan.rows_per_piece;
    const Index rows = std::min(p.tokens, first_row + p.plan.rows_per_piece) - first_row;
    accumulate_rows<kSums, kHigher, kMax>(p.x + b * sequence_elements + first_row * F, rows, F, p.shift, sum, sum_sq,
                                          scratch.cube, scratch.quad, scratch.max_bits);
  }
  if constexpr (kSums) {
    out.sum = ordered_sum(sum, F);
    out.sum_sq = ordered_sum(sum_sq, F);
  }
  if constexpr (kHigher) {
    out.sum_cube = ordered_sum(scratch.cube, F);
    out.sum_quad = ordered_sum(scratch.quad, F);
  }
  if constexpr (kMax) {
    std::uint32_t m = 0;
    for (Index f = 0; f < F; ++f) m = std::max(m, scratch.max_bits[f]);
    out.max_bits = m;
  }
  p.chunk_sums[chunk] = out;
}

// Merges the chunks' per-feature sums for features [block·kMergeFeatures, ...): each feature's total is
// added up in chunk order, whichever thread does it.
void merge_block(const Problem& p, Index block) {
  const Index first = block * kMergeFeatures;
  const Index width = std::min(p.features, first + kMergeFeatures) - first;
  const Index stride = 2 * p.padded;
  double* __restrict feature_sum = p.needs.features ? p.feature_sum + first : nullptr;
  double* __restrict feature_sum_sq = p.needs.features ? p.feature_sum_sq + first : nullptr;
  if (p.plan.split && p.needs.seq) {
    // S_b restricted to the block = Σ of its pieces' sums, in piece order.
    Scratch& scratch = thread_scratch();
    scratch.reserve(p.features);
    double* __restrict sequence_sum = scratch.seq_sum;
    for (Index b = 0; b < p.sequences; ++b) {
      const double* pieces = p.partials + b * p.plan.pieces_per_sequence * stride + first;
      std::copy(pieces, pieces + width, sequence_sum);
      for (Index piece = 1; piece < p.plan.pieces_per_sequence; ++piece) {
        const double* __restrict s = pieces + piece * stride;
        for (Index f = 0; f < width; ++f) sequence_sum[f] += s[f];
      }
      p.block_norms[b * p.merge_blocks + block] = ordered_sum_sq(sequence_sum, width);
      if (p.needs.features)
        for (Index f = 0; f < width; ++f) feature_sum[f] += sequence_sum[f];
    }
  } else if (p.needs.features) {
    for (Index c = 0; c < p.plan.chunks; ++c) {
      const double* __restrict s = p.partials + c * stride + first;
      for (Index f = 0; f < width; ++f) feature_sum[f] += s[f];
    }
  }
  if (p.needs.features) {
    for (Index c = 0; c < p.plan.chunks; ++c) {
      const double* __restrict q = p.partials + c * stride + p.padded + first;
      for (Index f = 0; f < width; ++f) feature_sum_sq[f] += q[f];
    }
  }
}

// The chunk pass, then (same parallel region, after its barrier) the merge of the per-feature partials.
template <bool kSums, bool kHigher, bool kMax>
void run_chunks(const Problem& p) {
  const Index merge_blocks = p.keep_partials ? p.merge_blocks : 0;
#pragma omp parallel if (p.plan.chunks > kSerialChunks)
  {
#pragma omp for schedule(static)
    for (Index c = 0; c < p.plan.chunks; ++c) run_chunk<kSums, kHigher, kMax>(p, c);
#pragma omp for schedule(static)
    for (Index block = 0; block < merge_blocks; ++block) merge_block(p, block);
  }
}

void dispatch_chunks(const Problem& p) {
  const Needs& n = p.needs;
  if (n.sums) {
    if (n.higher) {
      n.max ? run_chunks<true, true, true>(p) : run_chunks<true, true, false>(p);
    } else {
      n.max ? run_chunks<true, false, true>(p) : run_chunks<true, false, false>(p);
    }
  } else if (n.max) {
    run_chunks<false, false, true>(p);
  }
}

// Number of NaN/±Inf among x[0, n) (integer sums: exact in any order).
std::int64_t count_nonfinite(const float* x, Index n) {
  const Index chunks = (n + kChunkElements - 1) / kChunkElements;
  std::int64_t total = 0;
#pragma omp parallel for schedule(static) reduction(+ : total) if (chunks > 1)
  for (Index c = 0; c < chunks; ++c) {
    const Index end = std::min(n, (c + 1) * kChunkElements);
    std::int64_t count = 0;
    for (Index i = c * kChunkElements; i < end; ++i) count += is_nonfinite_bits(std::bit_cast<std::uint32_t>(x[i]));
    total += count;
  }
  return total;
}

// A reference point near the mean: the mean of up to kShiftSamples finite elements spread evenly over the n
// elements value_at(i) gives.
template <typename ValueAt>
double choose_shift(ValueAt value_at, Index n) {
  const Index samples = std::min<Index>(n, kShiftSamples);
  double total = 0.0;
  Index used = 0;
  for (Index k = 0; k < samples; ++k) {
    const float v = value_at(k * n / samples);
    if (std::isfinite(v)) {
      total += v;
      ++used;
    }
  }
  return used > 0 ? total / static_cast<double>(used) : 0.0;
}

double choose_shift(const float* x, Index n) {
  return choose_shift([x](Index i) { return x[i]; }, n);
}

void add_sums(ChunkSums& total, const ChunkSums& part) {
  total.sum += part.sum;
  total.sum_sq += part.sum_sq;
  total.sum_cube += part.sum_cube;
  total.sum_quad += part.sum_quad;
  total.seq_sum_norm_sq += part.seq_sum_norm_sq;
  total.max_bits = std::max(total.max_bits, part.max_bits);
}

// The problem of summing x as [sequences, tokens, features] about `shift` into `buffers` (per-feature sums, when
// needed, into `into`'s arrays).
Problem prepare(const float* x, Index sequences, Index tokens, Index features, double shift, const Needs& needs,
                MomentSums& into, CallBuffers& buffers) {
  Problem p{};
  p.x = x;
  p.sequences = sequences;
  p.tokens = tokens;
  p.features = features;
  p.padded = (features + 7) / 8 * 8;
  p.shift = shift;
  p.needs = needs;
  p.plan = plan_chunks(sequences, tokens, features);
  p.keep_partials = needs.sums && (needs.features || (p.plan.split && needs.seq));
  buffers.chunk_sums.resize(static_cast<std::size_t>(p.plan.chunks));
  p.chunk_sums = buffers.chunk_sums.data();
  if (p.keep_partials) {
    const auto size = static_cast<std::size_t>(p.plan.chunks * 2 * p.padded + 8);
    if (buffers.partials.size() < size) buffers.partials.resize(size);
    const auto address = reinterpret_cast<std::uintptr_t>(buffers.partials.data());
    p.partials = reinterpret_cast<double*>((address + 63) / 64 * 64);
  }
  p.merge_blocks = (features + kMergeFeatures - 1) / kMergeFeatures;
  if (needs.features) {
    p.feature_sum = into.feature_sum.data();
    p.feature_sum_sq = into.feature_sum_sq.data();
  }
  if (p.keep_partials && p.plan.split && needs.seq) {
    buffers.block_norms.resize(static_cast<std::size_t>(sequences * p.merge_blocks));
    p.block_norms = buffers.block_norms.data();
  }
  return p;
}

// The scalar sums of a problem whose chunks (and merge) have run, combined in chunk order.
ChunkSums collect(const Problem& p) {
  ChunkSums total;
  for (Index c = 0; c < p.plan.chunks; ++c) add_sums(total, p.chunk_sums[c]);
  if (p.block_norms != nullptr)
    for (Index i = 0; i < p.sequences * p.merge_blocks; ++i) total.seq_sum_norm_sq += p.block_norms[i];
  return total;
}

// One pass over x as [sequences, tokens, features]: the scalar sums, combined in chunk order; per-feature sums
// (needs.features) are added into `into`'s arrays.
ChunkSums scan(const float* x, Index sequences, Index tokens, Index features, double shift, const Needs& needs,
               MomentSums& into) {
  const Problem p = prepare(x, sequences, tokens, features, shift, needs, into, call_buffers());
  dispatch_chunks(p);
  return collect(p);
}

// run_chunk for chunk c alone, with the kernel the needs select (ChunkedAccumulation::add).
void run_one_chunk(const Problem& p, Index c) {
  const Needs& n = p.needs;
  if (n.sums) {
    if (n.higher) {
      n.max ? run_chunk<true, true, true>(p, c) : run_chunk<true, true, false>(p, c);
    } else {
      n.max ? run_chunk<true, false, true>(p, c) : run_chunk<true, false, false>(p, c);
    }
  } else if (n.max) {
    run_chunk<false, false, true>(p, c);
  }
}

// max of two max_abs values, NaN when either is NaN.
double max_abs_merge(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return kNaN;
  return std::max(a, b);
}

// Checks that a [sequences, tokens, features] tensor may be added to `into` under `which`; when it has elements
// and `into` is empty, starts `into`: shape, selection, zeroed per-feature arrays (the shift is the caller's, taken
// from the data). Returns whether `into` was started here (false too when there are no elements).
bool start_accumulate(Index sequences, Index tokens, Index features, MomentSums& into, const StatSelection& which,
                      const Needs& needs) {
  PROPLAB_CHECK(sequences >= 0 && tokens >= 1 && features >= 1, "accumulate needs B >= 0, T >= 1, F >= 1, got [",
                sequences, ", ", tokens, ", ", features, "]");
  if (!into.empty()) {
    PROPLAB_CHECK(into.tokens_per_sequence == tokens && into.features == features,
                  "accumulated tensors must share [*, T, F]: T ", into.tokens_per_sequence, " vs ", tokens, ", F ",
                  into.features, " vs ", features);
    PROPLAB_CHECK(into.selection == which, "accumulated tensors must use one statistic selection");
    return false;
  }
  if (sequences * tokens * features == 0) return false;
  into.clear();
  into.tokens_per_sequence = tokens;
  into.features = features;
  into.selection = which;
  if (needs.features) {
    into.feature_sum.assign(static_cast<std::size_t>(features), 0.0);
    into.feature_sum_sq.assign(static_cast<std::size_t>(features), 0.0);
  }
  return true;
}

// Adds one tensor's scalar sums (about into.shift), its n elements, its sequences and its non-finite count to
// `into` (per-feature sums are added where they are computed).
void add_totals(MomentSums& into, Index n, Index sequences, const ChunkSums& total, std::int64_t nonfinite,
                const Needs& needs) {
  into.count += n;
  into.sequences += sequences;
  into.sum += total.sum;
  into.sum_sq += total.sum_sq;
  into.sum_cube += total.sum_cube;
  into.sum_quad += total.sum_quad;
  into.seq_sum_norm_sq += total.seq_sum_norm_sq;
  if (needs.max) into.max_abs = max_abs_merge(into.max_abs, std::bit_cast<float>(total.max_bits));
  into.nonfinite += nonfinite;
}

// add_totals for a tensor x of n elements scanned as rows (accumulate(), ChunkedAccumulation): its non-finite
// elements are counted only when the scan's sums or maximum show some, or when nothing else was scanned.
void add_scanned(MomentSums& into, const float* x, Index n, Index sequences, const ChunkSums& total,
                 const Needs& needs) {
  std::int64_t nonfinite = 0;
  if (needs.nonfinite) {
    const bool suspicious = (!needs.sums && !needs.max) || (needs.sums && !std::isfinite(total.sum)) ||
                            (needs.max && is_nonfinite_bits(total.max_bits));
    if (suspicious) nonfinite = count_nonfinite(x, n);
  }
  add_totals(into, n, sequences, total, nonfinite, needs);
}

// One (sample, channel) plane's sums (accumulate_planes): kLanes interleaved partial sums, a fixed order whatever
// the threads, combined in lane order.
ChunkSums sum_plane(const float* v, Index pixels, double shift, const Needs& needs) {
  double s1[kLanes] = {}, s2[kLanes] = {}, s3[kLanes] = {}, s4[kLanes] = {};
  std::uint32_t m[kLanes] = {};
  Index i = 0;
  for (; i + kLanes <= pixels; i += kLanes)
    for (int j = 0; j < kLanes; ++j) {
      const double d = static_cast<double>(v[i + j]) - shift, q = d * d;
      s1[j] += d;
      s2[j] += q;
      if (needs.higher) {
        s3[j] = mul_add(q, d, s3[j]);
        s4[j] = mul_add(q, q, s4[j]);
      }
      m[j] = std::max(m[j], abs_bits(v[i + j]));
    }
  for (int j = 0; i < pixels; ++i, ++j) {
    const double d = static_cast<double>(v[i]) - shift, q = d * d;
    s1[j] += d;
    s2[j] += q;
    if (needs.higher) {
      s3[j] = mul_add(q, d, s3[j]);
      s4[j] = mul_add(q, q, s4[j]);
    }
    m[j] = std::max(m[j], abs_bits(v[i]));
  }
  ChunkSums out;
  for (int j = 0; j < kLanes; ++j) {
    out.sum += s1[j];
    out.sum_sq += s2[j];
    out.sum_cube += s3[j];
    out.sum_quad += s4[j];
    out.max_bits = std::max(out.max_bits, m[j]);
  }
  return out;
}

// Adds the planes' sums of an NCHW tensor x (accumulate_planes), combined in (sample, channel) order, to `into`.
void add_planes(const ChunkSums* plane_sums, const float* x, Index samples, Index channels, Index pixels,
                const Needs& needs, MomentSums& into) {
  ChunkSums total;
  for (Index b = 0; b < samples; ++b) {
    double seq_norm = 0.0;
    for (Index c = 0; c < channels; ++c) {
      const ChunkSums& plane = plane_sums[b * channels + c];
      add_sums(total, plane);
      seq_norm += plane.sum * plane.sum;  // ‖S_b‖²: S_b's entry for channel c is the plane's sum
      if (needs.features) {
        into.feature_sum[static_cast<std::size_t>(c)] += plane.sum;
        into.feature_sum_sq[static_cast<std::size_t>(c)] += plane.sum_sq;
      }
    }
    total.seq_sum_norm_sq += seq_norm;
  }
  if (!needs.seq) total.seq_sum_norm_sq = 0.0;
  if (!needs.higher) total.sum_cube = total.sum_quad = 0.0;
  if (!needs.sums) total.sum = total.sum_sq = 0.0;
  const Index n = samples * channels * pixels;
  std::int64_t nonfinite = 0;
  if (needs.nonfinite) {
    const bool suspicious = !std::isfinite(total.sum) || is_nonfinite_bits(total.max_bits) || !needs.sums;
    if (suspicious) nonfinite = count_nonfinite(x, n);
  }
  add_totals(into, n, samples, total, nonfinite, needs);
}

#ifdef PROPLAB_WITH_CUDA
// accumulate() for x on the GPU (a device pointer): the same sums, the same shift choice for empty sums, computed
// by kernels/moments.cu; the totals come back in one copy and are added to `into` as the CPU path adds its own.
void accumulate_cuda(const float* x, Index sequences, Index tokens, Index features, MomentSums& into,
                     const StatSelection& which) {
  const Needs needs = needs_for(which);
  const bool started = start_accumulate(sequences, tokens, features, into, which, needs);
  const Index n = sequences * tokens * features;
  if (n == 0) return;
  kernels::MomentRequest request;
  request.sums = needs.sums;
  request.higher = needs.higher;
  request.max = needs.max;
  request.seq = needs.seq;
  request.features = needs.features;
  request.nonfinite = needs.nonfinite;
  request.choose_shift = started && needs.sums;
  request.shift = into.shift;
  const kernels::MomentTotals device =
      kernels::moment_sums(x, sequences, tokens, features, request, needs.features ? into.feature_sum.data() : nullptr,
                           needs.features ? into.feature_sum_sq.data() : nullptr);
  if (request.choose_shift) into.shift = device.shift;
  ChunkSums total;
  total.sum = device.sum;
  total.sum_sq = device.sum_sq;
  total.sum_cube = device.sum_cube;
  total.sum_quad = device.sum_quad;
  total.seq_sum_norm_sq = device.seq_sum_norm_sq;
  total.max_bits = device.max_abs_bits;
  add_totals(into, n, sequences, total, needs.nonfinite ? device.nonfinite : 0, needs);
}
#endif

}  // namespace

void MomentSums::clear() {
  count = sequences = tokens_per_sequence = features = 0;
  selection = StatSelection{};
  shift = sum = sum_sq = sum_cube = sum_quad = max_abs = seq_sum_norm_sq = 0.0;
  nonfinite = 0;
  feature_sum.clear();
  feature_sum_sq.clear();
}

void MomentSums::recentre(double new_shift) {
  const double h = new_shift - shift;
  shift = new_shift;
  if (empty() || h == 0.0) return;
  const Needs needs = needs_for(selection);
  if (!needs.sums) return;
  const double T = static_cast<double>(tokens_per_sequence);
  const double n = static_cast<double>(count);
  // The sums were of e = x - old shift; now of d = x - new shift = e - h (each line uses the old sums only).
  const double h2 = h * h, h3 = h2 * h, h4 = h2 * h2;
  const double s1 = sum, s2 = sum_sq, s3 = sum_cube, s4 = sum_quad;
  sum = s1 - n * h;
  sum_sq = s2 - 2.0 * h * s1 + n * h2;
  if (needs.higher) {
    sum_cube = s3 - 3.0 * h * s2 + 3.0 * h2 * s1 - n * h3;
    sum_quad = s4 - 4.0 * h * s3 + 6.0 * h2 * s2 - 4.0 * h3 * s1 + n * h4;
  }
  if (needs.seq) {
    // Σ_b ‖S_b - T·h·1‖² = Σ_b ‖S_b‖² - 2·T·h·Σe + B·T²·F·h².
    seq_sum_norm_sq = seq_sum_norm_sq - 2.0 * T * h * s1 +
                      static_cast<double>(sequences) * T * T * static_cast<double>(features) * h2;
  }
  if (needs.features) {
    const double per_feature = static_cast<double>(sequences) * T;
    for (std::size_t f = 0; f < feature_sum.size(); ++f) {
      const double f1 = feature_sum[f];
      feature_sum[f] = f1 - per_feature * h;
      feature_sum_sq[f] = feature_sum_sq[f] - 2.0 * h * f1 + per_feature * h * h;
    }
  }
}

void MomentSums::merge(const MomentSums& other) {
  if (other.empty()) return;
  if (empty()) {
    *this = other;
    return;
  }
  PROPLAB_CHECK(tokens_per_sequence == other.tokens_per_sequence && features == other.features,
                "merged moment sums must share [*, T, F]: T ", tokens_per_sequence, " vs ", other.tokens_per_sequence,
                ", F ", features, " vs ", other.features);
  PROPLAB_CHECK(selection == other.selection, "merged moment sums must hold the same statistics");
  const Needs needs = needs_for(selection);
  // other's sums about our shift, then added.
  MomentSums about_ours;
  const MomentSums* add = &other;
  if (needs.sums && other.shift != shift) {
    about_ours = other;
    about_ours.recentre(shift);
    add = &about_ours;
  }
  if (needs.sums) {
    sum += add->sum;
    sum_sq += add->sum_sq;
    sum_cube += add->sum_cube;
    sum_quad += add->sum_quad;
    seq_sum_norm_sq += add->seq_sum_norm_sq;
    if (needs.features)
      for (std::size_t f = 0; f < feature_sum.size(); ++f) {
        feature_sum[f] += add->feature_sum[f];
        feature_sum_sq[f] += add->feature_sum_sq[f];
      }
  }
  if (needs.max) max_abs = max_abs_merge(max_abs, other.max_abs);
  nonfinite += other.nonfinite;
  count += other.count;
  sequences += other.sequences;
}

void accumulate(const float* x, std::int64_t sequences, std::int64_t tokens, std::int64_t features, MomentSums& into,
                const StatSelection& which) {
  const Needs needs = needs_for(which);
  const bool started = start_accumulate(sequences, tokens, features, into, which, needs);
  const Index n = sequences * tokens * features;
  if (n == 0) return;
  if (started && needs.sums) into.shift = choose_shift(x, n);

  ChunkSums total;
  if (needs.sums || needs.max) {  // (only nonfinite selected: nothing to scan, it is counted below)
    if (!needs.seq && !needs.features && features > kFlatWidth) {
      // Only layout-free statistics: rows of kFlatWidth (and a shorter last row) instead of a few very long
      // rows, so per-feature scratch stays small and the chunks spread over the threads.
      const Index rows = n / kFlatWidth, tail = n % kFlatWidth;
      if (rows > 0) add_sums(total, scan(x, rows, 1, kFlatWidth, into.shift, needs, into));
      if (tail > 0) add_sums(total, scan(x + rows * kFlatWidth, 1, 1, tail, into.shift, needs, into));
    } else {
      total = scan(x, sequences, tokens, features, into.shift, needs, into);
    }
  }

  add_scanned(into, x, n, sequences, total, needs);
}

void LogitSums::add(const LogitSums& part) {
  count += part.count;
  nonfinite += part.nonfinite;
  sum += part.sum;
  sum_sq += part.sum_sq;
  sum_cube += part.sum_cube;
  sum_quad += part.sum_quad;
  max_abs = std::max(max_abs, part.max_abs);
}

void add_logit_row(const float* row, std::int64_t count, LogitSums& sums) {
  double s1 = 0.0, s2 = 0.0, s3 = 0.0, s4 = 0.0, largest = 0.0;
  std::int64_t nonfinite = 0;
  constexpr double kLargest = std::numeric_limits<double>::max();
#pragma omp simd reduction(+ : s1, s2, s3, s4, nonfinite) reduction(max : largest)
  for (std::int64_t j = 0; j < count; ++j) {
    const double x = row[j];
    const bool finite = std::fabs(x) <= kLargest;  // false for NaN and ±Inf
    const double v = finite ? x : 0.0, v2 = v * v;
    nonfinite += finite ? 0 : 1;
    s1 += v;
    s2 += v2;
    s3 += v2 * v;
    s4 += v2 * v2;
    largest = std::max(largest, std::fabs(v));
  }
  sums.count += count;
  sums.nonfinite += nonfinite;
  sums.sum += s1;
  sums.sum_sq += s2;
  sums.sum_cube += s3;
  sums.sum_quad += s4;
  sums.max_abs = std::max(sums.max_abs, largest);
}

void accumulate_planes(const float* x, std::int64_t samples, std::int64_t channels, std::int64_t pixels,
                       MomentSums& into, const StatSelection& which) {
  const Needs needs = needs_for(which);
  const bool started = start_accumulate(samples, pixels, channels, into, which, needs);
  const Index n = samples * channels * pixels;
  if (n == 0) return;
  if (started && needs.sums) into.shift = choose_shift(x, n);
  const double shift = into.shift;
  const Index planes = samples * channels;
  thread_local std::vector<ChunkSums> plane_buffer;
  plane_buffer.assign(static_cast<std::size_t>(planes), ChunkSums{});
  ChunkSums* plane_sums = plane_buffer.data();
#pragma omp parallel for schedule(static) if (n > kChunkElements)
  for (Index plane = 0; plane < planes; ++plane)
    plane_sums[plane] = sum_plane(x + plane * pixels, pixels, shift, needs);
  add_planes(plane_sums, x, samples, channels, pixels, needs, into);
}

void accumulate(const Tensor& x, std::int64_t sequences, MomentSums& into, const StatSelection& which) {
  PROPLAB_CHECK(x.dtype() == DType::f32 && x.is_contiguous(), "moment accumulation needs a contiguous f32 tensor");
  PROPLAB_CHECK(sequences >= 1, "sequences must be >= 1, got ", sequences);
  if (x.numel() == 0) return;
  const std::int64_t features = x.ndim() == 0 ? 1 : x.dim(-1);
  const std::int64_t rows = x.numel() / features;
  PROPLAB_CHECK(rows % sequences == 0, "rows (", rows, ") of ", shape_string(x.shape()), " do not split into ",
                sequences, " sequences");
  if (x.device() == Device::cuda) {
#ifdef PROPLAB_WITH_CUDA
    accumulate_cuda(x.f32(), sequences, rows / sequences, features, into, which);
    return;
#else
    PROPLAB_CHECK(false, "moment accumulation of a CUDA tensor needs a build with the CUDA backend");
#endif
  }
  accumulate(x.f32(), sequences, rows / sequences, features, into, which);
}

struct ChunkedAccumulation::State {
  Problem problem;  // rows of [B, T, F]
  MomentSums* into;
  Needs needs;
  Index n;
  // Image planes (accumulate_planes): the planes' sums, planes_per_chunk planes a chunk.
  bool images = false;
  Index samples = 0, channels = 0, pixels = 0, planes_per_chunk = 1;
  ChunkSums* plane_sums = nullptr;
};

ChunkedAccumulation::ChunkedAccumulation(const float* x, std::int64_t sequences, std::int64_t tokens,
                                         std::int64_t features, MomentSums& into, const StatSelection& which,
                                         const std::function<float(std::int64_t)>& value_at, int slot) {
  CallBuffers& buffers = chunked_buffers(slot);
  const Needs needs = needs_for(which);
  const Index n = sequences * tokens * features;
  // accumulate() reads such tensors as rows of kFlatWidth, another chunking.
  const bool flat = (needs.sums || needs.max) && !needs.seq && !needs.features && features > kFlatWidth;
  if (n == 0 || flat) return;
  const bool started = start_accumulate(sequences, tokens, features, into, which, needs);
  if (started && needs.sums) into.shift = choose_shift(value_at, n);
  state_ = std::make_unique<State>();
  state_->problem = prepare(x, sequences, tokens, features, into.shift, needs, into, buffers);
  state_->into = &into;
  state_->needs = needs;
  state_->n = n;
}

ChunkedAccumulation::ChunkedAccumulation(Images, const float* x, std::int64_t samples, std::int64_t channels,
                                         std::int64_t pixels, MomentSums& into, const StatSelection& which,
                                         const std::function<float(std::int64_t)>& value_at, int slot) {
  std::vector<ChunkSums>& buffer = chunked_buffers(slot).chunk_sums;
  const Needs needs = needs_for(which);
  const Index n = samples * channels * pixels;
  if (n == 0) return;
  const bool started = start_accumulate(samples, pixels, channels, into, which, needs);
  if (started && needs.sums) into.shift = choose_shift(value_at, n);
  state_ = std::make_unique<State>();
  State& st = *state_;
  st.problem.x = x;
  st.into = &into;
  st.needs = needs;
  st.n = n;
  st.images = true;
  st.samples = samples;
  st.channels = channels;
  st.pixels = pixels;
  st.planes_per_chunk = std::max<Index>(1, kChunkElements / pixels);
  buffer.assign(static_cast<std::size_t>(samples * channels), ChunkSums{});
  st.plane_sums = buffer.data();
}

ChunkedAccumulation::~ChunkedAccumulation() = default;

std::int64_t ChunkedAccumulation::chunks() const {
  if (!state_) return 0;
  if (state_->images) {
    const Index planes = state_->samples * state_->channels;
    return (planes + state_->planes_per_chunk - 1) / state_->planes_per_chunk;
  }
  return state_->problem.plan.chunks;
}

namespace {

// Chunk c's elements [first, last) of the flat tensor: whole planes (images), whole sequences or a piece of one.
std::pair<Index, Index> chunk_elements(const ChunkedAccumulation::State& st, Index chunk) {
  if (st.images) {
    const Index planes = st.samples * st.channels;
    return {std::min(planes, chunk * st.planes_per_chunk) * st.pixels,
            std::min(planes, (chunk + 1) * st.planes_per_chunk) * st.pixels};
  }
  const Problem& p = st.problem;
  const Index row = p.tokens * p.features;
  if (!p.plan.split)
    return {std::min(p.sequences, chunk * p.plan.sequences_per_chunk) * row,
            std::min(p.sequences, (chunk + 1) * p.plan.sequences_per_chunk) * row};
  const Index b = chunk / p.plan.pieces_per_sequence;
  const Index first_row = (chunk % p.plan.pieces_per_sequence) * p.plan.rows_per_piece;
  const Index last_row = std::min(p.tokens, first_row + p.plan.rows_per_piece);
  return {b * row + first_row * p.features, b * row + last_row * p.features};
}

}  // namespace

std::int64_t ChunkedAccumulation::begin(std::int64_t chunk) const { return chunk_elements(*state_, chunk).first; }

std::int64_t ChunkedAccumulation::end(std::int64_t chunk) const { return chunk_elements(*state_, chunk).second; }

void ChunkedAccumulation::add(std::int64_t chunk) const {
  const State& st = *state_;
  if (st.images) {
    const Index first = chunk * st.planes_per_chunk;
    const Index last = std::min(st.samples * st.channels, first + st.planes_per_chunk);
    for (Index plane = first; plane < last; ++plane)
      st.plane_sums[plane] = sum_plane(st.problem.x + plane * st.pixels, st.pixels, st.into->shift, st.needs);
    return;
  }
  const Problem& p = st.problem;
  if (p.needs.sums || p.needs.max)
    run_one_chunk(p, chunk);
  else
    p.chunk_sums[chunk] = ChunkSums{};  // only nonfinite: counted in finish()
}

void ChunkedAccumulation::finish() {
  if (!state_) return;
  const State& st = *state_;
  if (st.images) {
    add_planes(st.plane_sums, st.problem.x, st.samples, st.channels, st.pixels, st.needs, *st.into);
    state_.reset();
    return;
  }
  const Problem& p = st.problem;
  if (p.keep_partials)
    for (Index block = 0; block < p.merge_blocks; ++block) merge_block(p, block);
  const ChunkSums total = collect(p);
  add_scanned(*st.into, p.x, st.n, p.sequences, total, st.needs);
  state_.reset();
}

}  // namespace proplab::probe
