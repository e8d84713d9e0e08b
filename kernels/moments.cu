// kernels/moments: the kernels behind kernels::moment_sums (definitions in kernels/moments.cuh, which are those of
// src/probe/moments.cpp).
//
// Two paths, chosen by the request:
// - Layout-free (neither seq nor features): x is a flat array of n elements, reduced grid-stride (grid_blocks(n)
//   blocks), one partial row per block.
// - Per-feature (seq or features): thread (f, chunk) of a 2-D grid walks feature f down the rows of one chunk of
//   the [B, T, F] tensor (consecutive threads read consecutive features of a row: coalesced). The chunk plan is a
//   function of (B, T, F) only: whole sequences per chunk when a sequence fits, otherwise pieces of one sequence.
//   The chunks' per-feature sums are kept and combined per feature in chunk order by a second kernel, which in
//   split mode also forms each sequence's Σ_t d_btf from its pieces (in piece order) for Σ_b ‖Σ_t d_bt‖².
// Each block writes one row of kSlots partials (fixed-order tree over its threads); finish_kernel adds the rows up
// in row order (the maximum for the max slot). Integer quantities (non-finite counts, |x| bits) travel as doubles,
// which hold them exactly (counts below 2^53, 32-bit patterns). No atomics anywhere.
#include "kernels/moments.cuh"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/error.h"
#include "kernels/block_reduce.cuh"
#include "kernels/common.cuh"
#include "kernels/context.cuh"

namespace proplab::kernels {
namespace {

// Blocks the per-feature pass aims for (feature tiles × row chunks): several per SM on any current GPU.
constexpr std::int64_t kTargetBlocks = 1024;
// Fewest rows in a chunk, so that the per-chunk, per-feature partials stay small next to x.
constexpr std::int64_t kMinChunkRows = 32;
// Elements the shift is chosen from (probe/moments.cpp, choose_shift).
constexpr std::int64_t kShiftSamples = 64;
// Threads of finish_kernel (one per slot; at least kSlots).
constexpr int kFinishThreads = 32;

// A block's row of partials: the summed slots first, then the maximum of the |x| bits.
enum Slot : int { kSum = 0, kSumSq, kCube, kQuad, kNorm, kNonfinite, kMaxBits, kSlots };
constexpr int kSummedSlots = kMaxBits;
// The result buffer (copied to the host in one piece): [0] the shift, [1, 1 + kSlots) the totals by slot, then
// per-feature Σd [F] and Σd² [F] when features are requested.
constexpr int kHeader = 1 + kSlots;

constexpr std::uint32_t kAbsMask = 0x7fffffffu;
constexpr std::uint32_t kExponentMask = 0x7f800000u;

struct Flags {
  bool sums, higher, max, seq, features;
};

// How the per-feature pass splits [B, T, F] into chunks of rows (a function of the shape only). Whole mode: chunk c
// holds sequences [c·sequences_per_chunk, (c+1)·sequences_per_chunk) ∩ [0, B). Split mode: chunk c is rows
// [p·rows_per_piece, (p+1)·rows_per_piece) ∩ [0, T) of sequence c / pieces, p = c % pieces.
struct Plan {
  std::int64_t sequences, tokens, features;
  bool split;
  std::int64_t sequences_per_chunk;
  std::int64_t rows_per_piece;
  std::int64_t pieces;
  std::int64_t chunks;  // gridDim.y of column_kernel
  std::int64_t tiles;   // feature tiles of kBlockThreads: gridDim.x of both per-feature kernels
};

// One thread's running sums.
struct ThreadSums {
  double sum = 0.0, sum_sq = 0.0, cube = 0.0, quad = 0.0, norm = 0.0;
  std::int64_t nonfinite = 0;
  std::uint32_t max_bits = 0;
};

// ==== device helpers ==============================================================================================

// Adds element v to everything but Σd: Σd², Σd³, Σd⁴ (flags.sums, flags.higher), |v|'s bits to the maximum
// (flags.max) and v to the non-finite count. Returns d = v - shift (0 without sums) for the caller's Σd.
__device__ __forceinline__ double add_element(float v, double shift, const Flags& flags, ThreadSums& s) {
  const std::uint32_t bits = __float_as_uint(v) & kAbsMask;
  if ((bits & kExponentMask) == kExponentMask) ++s.nonfinite;
  if (flags.max && bits > s.max_bits) s.max_bits = bits;
  if (!flags.sums) return 0.0;
  const double d = static_cast<double>(v) - shift;
  const double q = d * d;
  s.sum_sq += q;
  if (flags.higher) {
    s.cube += q * d;
    s.quad += q * q;
  }
  return d;
}

// Reduces every thread's sums over the block (fixed trees) and thread 0 writes the block's row of kSlots values.
// Every thread of the block must call it (blockDim.x == kBlockThreads).
__device__ void write_block_row(const ThreadSums& s, double* row) {
  __shared__ double shared[kSummedSlots * kBlockThreads];
  __shared__ std::uint32_t shared_max[kBlockThreads];
  double values[kSummedSlots] = {s.sum, s.sum_sq, s.cube, s.quad, s.norm, static_cast<double>(s.nonfinite)};
  block_sum<kSummedSlots>(values, shared);
  const int t = threadIdx.x;
  shared_max[t] = s.max_bits;
  __syncthreads();
  for (int stride = kBlockThreads / 2; stride > 0; stride >>= 1) {
    if (t < stride && shared_max[t + stride] > shared_max[t]) shared_max[t] = shared_max[t + stride];
    __syncthreads();
  }
  if (t == 0) {
    for (int k = 0; k < kSummedSlots; ++k) row[k] = values[k];
    row[kMaxBits] = static_cast<double>(shared_max[0]);
  }
}

__device__ __forceinline__ double read_shift(double shift_value, const double* shift_device) {
  return shift_device != nullptr ? *shift_device : shift_value;
}

// ==== kernels =====================================================================================================

// out[0] = the shift probe/moments.cpp's choose_shift picks: one thread, the same samples, order and arithmetic
// (float64 sum of the finite samples in k order, divided by their number).
__global__ void choose_shift_kernel(const float* x, std::int64_t n, double* out) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  const std::int64_t samples = n < kShiftSamples ? n : kShiftSamples;
  double total = 0.0;
  std::int64_t used = 0;
  for (std::int64_t k = 0; k < samples; ++k) {
    const float v = x[k * n / samples];
    if (isfinite(v)) {
      total += static_cast<double>(v);
      ++used;
    }
  }
  out[0] = used > 0 ? total / static_cast<double>(used) : 0.0;
}

// Layout-free sums of x[0, n), grid-stride: block b writes rows[b].
__global__ void __launch_bounds__(kBlockThreads)
    flat_kernel(const float* x, std::int64_t n, Flags flags, double shift_value, const double* shift_device,
                double* rows) {
  const double shift = read_shift(shift_value, shift_device);
  ThreadSums s;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    s.sum += add_element(x[i], shift, flags, s);
  write_block_row(s, rows + static_cast<std::int64_t>(blockIdx.x) * kSlots);
}

// Thread (f = blockIdx.x·kBlockThreads + threadIdx.x, chunk = blockIdx.y): feature f over the chunk's rows. In whole
// mode each sequence's Σ_t d_btf is formed on its own and its square added to the norm (flags.seq). With
// store_features the chunk's per-feature Σd and Σd² go to feature_partials[(2·chunk)·F + f] and
// feature_partials[(2·chunk + 1)·F + f]. Block (x, y) writes rows[y·gridDim.x + x].
__global__ void __launch_bounds__(kBlockThreads)
    column_kernel(const float* x, Plan plan, Flags flags, double shift_value, const double* shift_device,
                  bool store_features, double* feature_partials, double* rows) {
  const double shift = read_shift(shift_value, shift_device);
  const std::int64_t F = plan.features;
  const std::int64_t T = plan.tokens;
  const std::int64_t f = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t chunk = blockIdx.y;
  ThreadSums s;
  if (f < F) {  // (no return: every thread takes part in write_block_row)
    if (!plan.split) {
      const std::int64_t first = chunk * plan.sequences_per_chunk;
      const std::int64_t end = first + plan.sequences_per_chunk;
      const std::int64_t last = end < plan.sequences ? end : plan.sequences;
      for (std::int64_t b = first; b < last; ++b) {
        const float* column = x + b * T * F + f;
        double sequence_sum = 0.0;
        for (std::int64_t t = 0; t < T; ++t) sequence_sum += add_element(column[t * F], shift, flags, s);
        s.sum += sequence_sum;
        if (flags.seq) s.norm += sequence_sum * sequence_sum;
      }
    } else {
      const std::int64_t b = chunk / plan.pieces;
      const std::int64_t first_row = (chunk % plan.pieces) * plan.rows_per_piece;
      const std::int64_t end = first_row + plan.rows_per_piece;
      const std::int64_t last_row = end < T ? end : T;
      const float* column = x + b * T * F + f;
      for (std::int64_t t = first_row; t < last_row; ++t) s.sum += add_element(column[t * F], shift, flags, s);
    }
    if (store_features) {
      feature_partials[(2 * chunk) * F + f] = s.sum;
      feature_partials[(2 * chunk + 1) * F + f] = s.sum_sq;
    }
  }
  write_block_row(s, rows + (static_cast<std::int64_t>(blockIdx.y) * gridDim.x + blockIdx.x) * kSlots);
}

// Thread f = blockIdx.x·kBlockThreads + threadIdx.x: the chunks' per-feature partials of feature f combined in chunk
// order into feature_out[f] (Σd) and feature_out[F + f] (Σd²) when flags.features. In split mode with flags.seq each
// sequence's Σ_t d_btf is first formed from its pieces in piece order and its square added to the thread's norm;
// block x writes rows[x] (the norm; every other slot 0).
__global__ void __launch_bounds__(kBlockThreads)
    merge_kernel(const double* feature_partials, Plan plan, Flags flags, double* feature_out, double* rows) {
  const std::int64_t F = plan.features;
  const std::int64_t f = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  ThreadSums s;
  if (f < F) {  // (no return: every thread takes part in write_block_row)
    double total = 0.0;
    if (plan.split && flags.seq) {
      for (std::int64_t b = 0; b < plan.sequences; ++b) {
        double sequence_sum = 0.0;
        for (std::int64_t piece = 0; piece < plan.pieces; ++piece)
          sequence_sum += feature_partials[(2 * (b * plan.pieces + piece)) * F + f];
        s.norm += sequence_sum * sequence_sum;
        total += sequence_sum;
      }
    } else {
      for (std::int64_t c = 0; c < plan.chunks; ++c) total += feature_partials[(2 * c) * F + f];
    }
    if (flags.features) {
      double total_sq = 0.0;
      for (std::int64_t c = 0; c < plan.chunks; ++c) total_sq += feature_partials[(2 * c + 1) * F + f];
      feature_out[f] = total;
      feature_out[F + f] = total_sq;
    }
  }
  write_block_row(s, rows + static_cast<std::int64_t>(blockIdx.x) * kSlots);
}

// totals[k] = slot k of rows[0, count) combined in row order: the sum, or for kMaxBits the maximum (the values are
// exact 32-bit patterns, never NaN). One thread per slot.
__global__ void finish_kernel(const double* rows, std::int64_t count, double* totals) {
  const int k = threadIdx.x;
  if (k >= kSlots) return;
  double total = 0.0;
  for (std::int64_t r = 0; r < count; ++r) {
    const double v = rows[r * kSlots + k];
    if (k == kMaxBits) {
      if (v > total) total = v;
    } else {
      total += v;
    }
  }
  totals[k] = total;
}

// ==== launcher ====================================================================================================

Plan plan_columns(std::int64_t sequences, std::int64_t tokens, std::int64_t features) {
  Plan plan{};
  plan.sequences = sequences;
  plan.tokens = tokens;
  plan.features = features;
  plan.tiles = (features + kBlockThreads - 1) / kBlockThreads;
  const std::int64_t target_chunks = std::max<std::int64_t>(1, kTargetBlocks / plan.tiles);
  const std::int64_t rows = sequences * tokens;
  const std::int64_t chunk_rows = std::max(kMinChunkRows, (rows + target_chunks - 1) / target_chunks);
  if (tokens <= chunk_rows) {
    plan.split = false;
    plan.sequences_per_chunk = std::max<std::int64_t>(1, chunk_rows / tokens);
    plan.rows_per_piece = tokens;
    plan.pieces = 1;
    plan.chunks = (sequences + plan.sequences_per_chunk - 1) / plan.sequences_per_chunk;
  } else {
    plan.split = true;
    plan.sequences_per_chunk = 1;
    plan.rows_per_piece = chunk_rows;
    plan.pieces = (tokens + chunk_rows - 1) / chunk_rows;
    plan.chunks = sequences * plan.pieces;
  }
  // (chunks <= 2·target_chunks + 1 <= 2049 by construction; checked against the grid limits all the same.)
  PROPLAB_CHECK(plan.chunks >= 1 && plan.chunks <= 65535 && plan.tiles <= std::numeric_limits<int>::max(),
                "moment_sums: no launch geometry for [", sequences, ", ", tokens, ", ", features, "]");
  return plan;
}

// The host copy of the result buffer, kept per thread so that a recorder calling every step does not allocate.
std::vector<double>& host_buffer() {
  thread_local std::vector<double> buffer;
  return buffer;
}

}  // namespace

MomentTotals moment_sums(const float* x, std::int64_t sequences, std::int64_t tokens, std::int64_t features,
                         const MomentRequest& request, double* feature_sum, double* feature_sum_sq) {
  PROPLAB_CHECK(sequences >= 0 && tokens >= 1 && features >= 1, "moment_sums needs B >= 0, T >= 1, F >= 1, got [",
                sequences, ", ", tokens, ", ", features, "]");
  PROPLAB_CHECK(request.sums || (!request.higher && !request.seq && !request.features),
                "moment_sums: higher, seq and features need sums");
  PROPLAB_CHECK(!request.features || (feature_sum != nullptr && feature_sum_sq != nullptr),
                "moment_sums: features requested without host arrays for them");
  MomentTotals totals;
  totals.shift = request.shift;
  const std::int64_t n = sequences * tokens * features;
  if (n == 0 || !(request.sums || request.max || request.nonfinite)) return totals;
  PROPLAB_CHECK(x != nullptr, "moment_sums: null x");

  const Flags flags{request.sums, request.higher, request.max, request.seq, request.features};
  const cudaStream_t stream = context().stream;
  const bool columns = request.seq || request.features;
  const std::int64_t feature_values = request.features ? 2 * features : 0;
  Plan plan{};
  bool merge = false;
  unsigned flat_blocks = 0;
  std::int64_t row_count = 0;
  std::int64_t partial_values = 0;
  if (columns) {
    plan = plan_columns(sequences, tokens, features);
    merge = request.features || (plan.split && request.seq);
    row_count = plan.tiles * plan.chunks + (merge ? plan.tiles : 0);
    partial_values = merge ? 2 * plan.chunks * features : 0;
  } else {
    flat_blocks = grid_blocks(n);
    row_count = flat_blocks;
  }

  // Scratch layout (doubles): the result buffer [kHeader + feature_values], the block rows [row_count · kSlots],
  // the chunks' per-feature partials [partial_values].
  const std::int64_t result_values = kHeader + feature_values;
  Scratch scratch(sizeof(double) * static_cast<std::size_t>(result_values + row_count * kSlots + partial_values));
  double* result = scratch.as<double>();
  double* rows = result + result_values;
  double* feature_partials = rows + row_count * kSlots;

  const bool choose = request.sums && request.choose_shift;
  const double* shift_device = nullptr;
  if (choose) {
    choose_shift_kernel<<<1, 1, 0, stream>>>(x, n, result);
    PROPLAB_CUDA_CHECK_LAUNCH("choose_shift_kernel");
    shift_device = result;
  }
  if (columns) {
    const dim3 grid(static_cast<unsigned>(plan.tiles), static_cast<unsigned>(plan.chunks));
    column_kernel<<<grid, kBlockThreads, 0, stream>>>(x, plan, flags, request.shift, shift_device, merge,
                                                      feature_partials, rows);
    PROPLAB_CUDA_CHECK_LAUNCH("column_kernel");
    if (merge) {
      merge_kernel<<<static_cast<unsigned>(plan.tiles), kBlockThreads, 0, stream>>>(
          feature_partials, plan, flags, result + kHeader, rows + plan.tiles * plan.chunks * kSlots);
      PROPLAB_CUDA_CHECK_LAUNCH("merge_kernel");
    }
  } else {
    flat_kernel<<<flat_blocks, kBlockThreads, 0, stream>>>(x, n, flags, request.shift, shift_device, rows);
    PROPLAB_CUDA_CHECK_LAUNCH("flat_kernel");
  }
  finish_kernel<<<1, kFinishThreads, 0, stream>>>(rows, row_count, result + 1);
  PROPLAB_CUDA_CHECK_LAUNCH("finish_kernel");

  std::vector<double>& host = host_buffer();
  host.resize(static_cast<std::size_t>(result_values));
  copy_to_host(host.data(), result, sizeof(double) * host.size());

  if (choose) totals.shift = host[0];
  const double* slot = host.data() + 1;
  if (request.sums) {
    totals.sum = slot[kSum];
    totals.sum_sq = slot[kSumSq];
  }
  if (request.higher) {
    totals.sum_cube = slot[kCube];
    totals.sum_quad = slot[kQuad];
  }
  if (request.seq) totals.seq_sum_norm_sq = slot[kNorm];
  if (request.max) totals.max_abs_bits = static_cast<std::uint32_t>(slot[kMaxBits]);
  if (request.nonfinite) totals.nonfinite = static_cast<std::int64_t>(slot[kNonfinite]);
  if (request.features) {
    const double* sums = host.data() + kHeader;
    for (std::int64_t f = 0; f < features; ++f) {
      feature_sum[f] += sums[f];
      feature_sum_sq[f] += sums[features + f];
    }
  }
  return totals;
}

}  // namespace proplab::kernels
