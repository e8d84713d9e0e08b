#include "ops/conv_direct.h"

#include <immintrin.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <numeric>
#include <vector>

// GCC 12's AVX-512 intrinsics start from an undefined vector (_mm512_undefined_ps), which -Wmaybe-uninitialized
// and -Wuninitialized report inside the headers; the values are always defined.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace proplab::ops::detail {

namespace {

using Index = std::int64_t;
constexpr Index kLanes = 16;  // output pixels per block: one zmm
constexpr Index kRows = 16;   // output channels per register tile
constexpr Index kLineTaps = 49;   // kernels up to 7×7 read x without a panel where they can (multiply_lines)
constexpr int kLineSegments = 2;  // samples a block may span and still be read as lines
// 16 floats in a zmm, as __m512 but without its licence to alias anything: GCC keeps an array of these in
// registers across a loop that also loads through other pointers (an __m512 array it stored back every iteration).
using Accumulator = float __attribute__((vector_size(64)));

bool cpu_has_kernel_features() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("bmi2");
  return has;
#else
  return false;
#endif
}

// One block's gather table, per tap t: lane l reads the input at (block base) + offsets[t·16 + l] where bit l of
// masks[t] is set, else 0. When the set lanes read consecutive elements (as in every stride-1 convolution whose
// block stays within one sample), starts[t] = offset of lane 0 on that line and loads[t] = 1: one masked load.
// Stride 1 only: when every tap reads consecutive elements within each of the block's (at most kLineSegments)
// samples, lines[0] = the number of segments and lane l of segment g reads line_starts[t·kLineSegments + g] + l
// where bit l of line_masks[t·kLineSegments + g] is set: one masked load per segment, no gather (else lines[0] = 0).
struct BlockTable {
  std::int32_t* offsets;
  std::uint16_t* masks;
  std::int32_t* starts;
  std::uint8_t* loads;
  std::int32_t* line_starts;
  std::uint16_t* line_masks;
  std::uint8_t* lines;
};

// Output segments of one block: lanes [first, first + count) belong to one sample, whose output for channel 0
// starts at y + out_offset (pixel of lane `first` included).
struct Segment {
  int first = 0, count = 0;
  Index sample = 0, out_offset = 0;
};

}  // namespace

bool direct_conv_fits(const DirectConvShape& s) {
  if (!cpu_has_kernel_features()) return false;
  // A block spans at most ceil(16 / pixels) + 1 samples; its offsets are relative to the first.
  const Index pixels = std::max<Index>(s.h_out * s.w_out, 1);
  const Index samples = (kLanes + pixels - 1) / pixels + 1;
  return s.c_in * s.h * s.w * samples < INT_MAX && s.kh * s.kw > 0;
}

namespace {

// weight [C_out, K] → packed [ceil(C_out / 16)][K][16], zero rows past C_out.
void pack_weights(const float* weight, Index c_out, Index k_total, float* packed) {
  const Index tiles = (c_out + kRows - 1) / kRows;
#pragma omp parallel for schedule(static) if (tiles * k_total * kRows > (1 << 15))
  for (Index tile = 0; tile < tiles; ++tile)
    for (Index k = 0; k < k_total; ++k)
      for (Index r = 0; r < kRows; ++r) {
        const Index co = tile * kRows + r;
        packed[(tile * k_total + k) * kRows + r] = co < c_out ? weight[co * k_total + k] : 0.0f;
      }
}

// The table's lines (see BlockTable) from its offsets and masks.
void plan_lines(const DirectConvShape& s, const BlockTable& table, const Segment* segments, int count) {
  const Index taps = s.kh * s.kw;
  bool lines = s.stride == 1 && count <= kLineSegments && taps <= kLineTaps;
  for (Index t = 0; t < taps && lines; ++t)
    for (int g = 0; g < kLineSegments; ++g) {
      std::uint16_t mask = 0;
      std::int32_t start = 0;
      if (g < count) {
        const std::uint32_t lanes = ((1u << segments[g].count) - 1u) << segments[g].first;
        mask = static_cast<std::uint16_t>(table.masks[t] & lanes);
        if (mask != 0) {
          const int first = __builtin_ctz(mask);
          start = table.offsets[t * kLanes + first] - first;
          for (int l = first; l < kLanes; ++l)
            if (((mask >> l) & 1u) != 0 && table.offsets[t * kLanes + l] != start + l) lines = false;
        }
      }
      table.line_starts[t * kLineSegments + g] = start;
      table.line_masks[t * kLineSegments + g] = mask;
    }
  table.lines[0] = static_cast<std::uint8_t>(lines ? count : 0);
}

// Fills the block's gather table and output segments; returns the number of segments.
__attribute__((target("avx512f"))) int plan_block(const DirectConvShape& s, Index q0, const BlockTable& table,
                                                  Segment* segments) {
  const Index pixels = s.h_out * s.w_out, total = s.n * pixels;
  const Index first_sample = q0 / pixels;
  const Index sample_elements = s.c_in * s.h * s.w;
  alignas(64) std::int32_t row0[kLanes], column0[kLanes], base[kLanes];
  int count = 0;
  std::uint32_t live = 0;
  for (int l = 0; l < kLanes; ++l) {
    const Index q = q0 + l;
    if (q >= total) {
      row0[l] = column0[l] = base[l] = 0;
      continue;
    }
    live |= 1u << l;
    const Index sample = q / pixels, p = q % pixels;
    if (count == 0 || sample != segments[count - 1].sample) {
      segments[count].first = l;
      segments[count].count = 0;
      segments[count].sample = sample;
      segments[count].out_offset = sample * s.c_out * pixels + p;
      ++count;
    }
    ++segments[count - 1].count;
    const Index oh = p / s.w_out, ow = p % s.w_out;
    row0[l] = static_cast<std::int32_t>(oh * s.stride - s.padding);
    column0[l] = static_cast<std::int32_t>(ow * s.stride - s.padding);
    base[l] = static_cast<std::int32_t>((sample - first_sample) * sample_elements);
  }
  const __m512i rows = _mm512_load_si512(row0), columns = _mm512_load_si512(column0);
  const __m512i bases = _mm512_load_si512(base);
  const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512i height = _mm512_set1_epi32(static_cast<std::int32_t>(s.h));
  const __m512i width = _mm512_set1_epi32(static_cast<std::int32_t>(s.w));
  const __m512i zero = _mm512_setzero_si512();
  for (Index i = 0; i < s.kh; ++i) {
    const __m512i ih = _mm512_add_epi32(rows, _mm512_set1_epi32(static_cast<std::int32_t>(i)));
    const __mmask16 row_ok =
        static_cast<__mmask16>(live & _mm512_cmpge_epi32_mask(ih, zero) & _mm512_cmplt_epi32_mask(ih, height));
    const __m512i row_offset = _mm512_add_epi32(bases, _mm512_mullo_epi32(ih, width));
    for (Index j = 0; j < s.kw; ++j) {
      const Index t = i * s.kw + j;
      const __m512i iw = _mm512_add_epi32(columns, _mm512_set1_epi32(static_cast<std::int32_t>(j)));
      const __mmask16 ok =
          static_cast<__mmask16>(row_ok & _mm512_cmpge_epi32_mask(iw, zero) & _mm512_cmplt_epi32_mask(iw, width));
      const __m512i offsets = _mm512_maskz_add_epi32(ok, row_offset, iw);
      _mm512_storeu_si512(table.offsets + t * kLanes, offsets);
      table.masks[t] = ok;
      // Evenly spaced over the set lanes (stride 1 or 2): offset − stride·lane is the same for all of them.
      table.loads[t] = 0;
      table.starts[t] = 0;
      if (ok != 0 && s.stride <= 2) {
        const __m512i start = _mm512_sub_epi32(offsets, _mm512_mullo_epi32(lane, _mm512_set1_epi32(s.stride)));
        const int first = __builtin_ctz(ok);
        const std::int32_t first_start = table.offsets[t * kLanes + first] - s.stride * first;
        table.starts[t] = first_start;
        if (_mm512_mask_cmpneq_epi32_mask(ok, start, _mm512_set1_epi32(first_start)) == 0)
          table.loads[t] = static_cast<std::uint8_t>(s.stride);
      }
    }
  }
  plan_lines(s, table, segments, count);
  return count;
}

// The block plans of one call, made once. A block's plan, relative to its first sample, repeats every
// lcm(pixels, 16) / 16 blocks (`period`); a full block (16 live lanes) looks its plan up, shifting the segments'
// output offsets by the samples between, and the last, partial block makes its own. Without a short enough
// period (or with fewer full blocks than one period) every block plans itself.
class BlockPlans {
 public:
  explicit BlockPlans(const DirectConvShape& s) : s_(s) {
    const Index pixels = s.h_out * s.w_out;
    taps_ = s.kh * s.kw;
    full_blocks_ = s.n * pixels / kLanes;
    period_ = std::lcm(pixels, kLanes) / kLanes;
    if (period_ > full_blocks_ || period_ * taps_ > (Index{1} << 13)) {
      period_ = 0;
      return;
    }
    samples_per_period_ = period_ * kLanes / pixels;
    offsets_.resize(static_cast<std::size_t>(period_ * taps_ * kLanes));
    starts_.resize(static_cast<std::size_t>(period_ * taps_));
    masks_.resize(static_cast<std::size_t>(period_ * taps_));
    loads_.resize(static_cast<std::size_t>(period_ * taps_));
    line_starts_.resize(static_cast<std::size_t>(period_ * taps_ * kLineSegments));
    line_masks_.resize(static_cast<std::size_t>(period_ * taps_ * kLineSegments));
    lines_.resize(static_cast<std::size_t>(period_));
    segments_.resize(static_cast<std::size_t>(period_ * kLanes));
    counts_.resize(static_cast<std::size_t>(period_));
    for (Index r = 0; r < period_; ++r) counts_[r] = plan_block(s, r * kLanes, row(r), segments_.data() + r * kLanes);
  }

  // Block `block`'s table (into the cache, or `scratch` filled) and segments; returns the segment count.
  int get(Index block, const BlockTable& scratch, BlockTable& table, Segment* segments) const {
    if (period_ == 0 || block >= full_blocks_) {
      table = scratch;
      return plan_block(s_, block * kLanes, scratch, segments);
    }
    const Index r = block % period_, shift = (block / period_) * samples_per_period_;
    table = row(r);
    const int count = counts_[r];
    for (int g = 0; g < count; ++g) {
      segments[g] = segments_[r * kLanes + g];
      segments[g].sample += shift;
      segments[g].out_offset += shift * s_.c_out * s_.h_out * s_.w_out;
    }
    return count;
  }

 private:
  BlockTable row(Index r) const {
    auto* self = const_cast<BlockPlans*>(this);
    return BlockTable{self->offsets_.data() + r * taps_ * kLanes,
                      self->masks_.data() + r * taps_,
                      self->starts_.data() + r * taps_,
                      self->loads_.data() + r * taps_,
                      self->line_starts_.data() + r * taps_ * kLineSegments,
                      self->line_masks_.data() + r * taps_ * kLineSegments,
                      self->lines_.data() + r};
  }

  DirectConvShape s_;
  Index taps_ = 0, full_blocks_ = 0, period_ = 0, samples_per_period_ = 0;
  std::vector<std::int32_t> offsets_, starts_, line_starts_;
  std::vector<std::uint16_t> masks_, line_masks_;
  std::vector<std::uint8_t> loads_, lines_;
  std::vector<Segment> segments_;
  std::vector<int> counts_;
};

// One (input channel, tap) line of a block read as lines (see BlockTable): one masked load per segment.
template <int kSegments>
__attribute__((target("avx512f"))) inline __m512 load_line(const float* base, const std::int32_t* starts,
                                                           const __mmask16* masks) {
  __m512 v = _mm512_maskz_loadu_ps(masks[0], base + starts[0]);
  if constexpr (kSegments == 2) v = _mm512_mask_loadu_ps(v, masks[1], base + starts[1]);
  return v;
}

// A block's lines, copied out of the table into locals (loads through the table's pointers could alias the
// callers' accumulators and keep them in memory).
struct Lines {
  std::int32_t starts[kLineTaps * kLineSegments];
  __mmask16 masks[kLineTaps * kLineSegments];
  Lines(const BlockTable& table, Index taps) {
    for (Index i = 0; i < taps * kLineSegments; ++i) {
      starts[i] = table.line_starts[i];
      masks[i] = static_cast<__mmask16>(table.line_masks[i]);
    }
  }
};

// pack_panel for a block read as lines: the same values, no branch or gather per element.
template <int kSegments>
__attribute__((target("avx512f"))) void pack_lines(const float* x_block, const DirectConvShape& s,
                                                   const BlockTable& table, float* panel) {
  const Index taps = s.kh * s.kw, plane = s.h * s.w;
  const Lines lines(table, taps);
  for (Index ci = 0; ci < s.c_in; ++ci) {
    const float* base = x_block + ci * plane;
    float* out = panel + ci * taps * kLanes;
    for (Index t = 0; t < taps; ++t)
      _mm512_store_ps(out + t * kLanes,
                      load_line<kSegments>(base, lines.starts + t * kLineSegments, lines.masks + t * kLineSegments));
  }
}

__attribute__((target("avx512f,bmi2"))) void pack_panel(const float* x_block, const DirectConvShape& s,
                                                        const BlockTable& table, float* panel) {
  const Index taps = s.kh * s.kw, plane = s.h * s.w;
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  for (Index ci = 0; ci < s.c_in; ++ci) {
    const float* base = x_block + ci * plane;
    float* out = panel + ci * taps * kLanes;
    for (Index t = 0; t < taps; ++t) {
      __m512 v;
      const __mmask16 mask = static_cast<__mmask16>(table.masks[t]);
      if (mask == 0) {
        v = _mm512_setzero_ps();
      } else if (table.loads[t] == 1) {
        // Lanes outside the mask are not read (masked loads do not fault), so the line may start before the plane.
        v = _mm512_maskz_loadu_ps(mask, base + table.starts[t]);
      } else if (table.loads[t] == 2) {
        // Every other element of 32: two masked loads (lane l's element at 2l), then the even elements.
        const std::uint32_t wide = _pdep_u32(mask, 0x55555555u);
        const float* line = base + table.starts[t];
        const __m512 low = _mm512_maskz_loadu_ps(static_cast<__mmask16>(wide & 0xFFFFu), line);
        const __m512 high = _mm512_maskz_loadu_ps(static_cast<__mmask16>(wide >> 16), line + kLanes);
        v = _mm512_permutex2var_ps(low, even, high);
      } else {
        const __m512i index = _mm512_loadu_si512(table.offsets + t * kLanes);
        v = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), mask, index, base, 4);
      }
      _mm512_store_ps(out + t * kLanes, v);
    }
  }
}

// Stores a tile's rows (plus bias) into y, lane by lane to each segment's sample.
__attribute__((target("avx512f"))) void store_tile(const __m512* acc, Index rows, const float* bias, Index tile_first,
                                                   const Segment* segments, int segment_count, float* y, Index pixels) {
  for (Index r = 0; r < rows; ++r) {
    const Index co = tile_first + r;
    const __m512 v = bias ? _mm512_add_ps(acc[r], _mm512_set1_ps(bias[co])) : acc[r];
    for (int sgm = 0; sgm < segment_count; ++sgm) {
      const Segment& g = segments[sgm];
      const __mmask16 store = static_cast<__mmask16>((1u << g.count) - 1u);
      const __mmask16 lanes = static_cast<__mmask16>(store << g.first);
      const __m512 part = g.first == 0 ? v : _mm512_maskz_compress_ps(lanes, v);
      _mm512_mask_storeu_ps(y + g.out_offset + co * pixels, store, part);
    }
  }
}

// acc[r] = Σ_k packed[k][r] · panel[k] for one tile of 16 output channels, then stored (plus bias) into y.
__attribute__((target("avx512f"))) void multiply_tile(const float* panel, const float* packed_tile, Index k_total,
                                                      Index rows, const float* bias, Index tile_first,
                                                      const Segment* segments, int segment_count, float* y,
                                                      Index pixels) {
  __m512 acc[kRows];
#pragma GCC unroll 16
  for (Index r = 0; r < kRows; ++r) acc[r] = _mm512_setzero_ps();
  for (Index k = 0; k < k_total; ++k) {
    const __m512 b = _mm512_load_ps(panel + k * kLanes);
    const float* w = packed_tile + k * kRows;
#pragma GCC unroll 16
    for (Index r = 0; r < kRows; ++r) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(w[r]), b, acc[r]);
  }
  store_tile(acc, rows, bias, tile_first, segments, segment_count, y, pixels);
}

// multiply_tile without a panel, for a block read as lines: each (input channel, tap) line is loaded from x where
// the panel would have held it; the same values and the same FMAs in the same order, so the result is bitwise
// the panel path's.
template <int kSegments>
__attribute__((target("avx512f"))) void multiply_lines(const float* x_block, const DirectConvShape& s,
                                                       const BlockTable& table, const float* packed_tile, Index rows,
                                                       const float* bias, Index tile_first, const Segment* segments,
                                                       int segment_count, float* y, Index pixels) {
  const Index taps = s.kh * s.kw, plane = s.h * s.w;
  const Lines lines(table, taps);
  Accumulator acc[kRows];
#pragma GCC unroll 16
  for (Index r = 0; r < kRows; ++r) acc[r] = _mm512_setzero_ps();
  // One loop over k = ci·taps + t (nested loops here made GCC keep the accumulators in memory).
  const float* base = x_block;
  Index t = 0;
  for (Index k = 0; k < s.c_in * taps; ++k) {
    const __m512 b = load_line<kSegments>(base, lines.starts + t * kLineSegments, lines.masks + t * kLineSegments);
    const float* w = packed_tile + k * kRows;
#pragma GCC unroll 16
    for (Index r = 0; r < kRows; ++r) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(w[r]), b, acc[r]);
    if (++t == taps) {
      t = 0;
      base += plane;
    }
  }
  __m512 out[kRows];
  for (Index r = 0; r < kRows; ++r) out[r] = acc[r];
  store_tile(out, rows, bias, tile_first, segments, segment_count, y, pixels);
}

// Per thread, reused across calls: a 64-byte aligned panel of at least `floats` floats, and a block table for
// `taps` taps.
float* thread_panel(Index floats) {
  thread_local std::vector<float> buffer;
  return aligned_buffer(buffer, floats);
}

BlockTable thread_table(Index taps) {
  thread_local std::vector<std::int32_t> offsets, starts, line_starts;
  thread_local std::vector<std::uint16_t> masks, line_masks;
  thread_local std::vector<std::uint8_t> loads, lines;
  offsets.resize(static_cast<std::size_t>(taps * kLanes));
  starts.resize(static_cast<std::size_t>(taps));
  masks.resize(static_cast<std::size_t>(taps));
  loads.resize(static_cast<std::size_t>(taps));
  line_starts.resize(static_cast<std::size_t>(taps * kLineSegments));
  line_masks.resize(static_cast<std::size_t>(taps * kLineSegments));
  lines.resize(1);
  return BlockTable{offsets.data(),     masks.data(),      starts.data(), loads.data(),
                    line_starts.data(), line_masks.data(), lines.data()};
}

// in: 16 rows of 16 floats (row stride 16); out: their transpose, row i at out + i·out_stride. Unpacks pair the
// rows, shuffles gather four, and 128-bit lane shuffles assemble the columns.
__attribute__((target("avx512f"))) void transpose16(const float* in, float* out, Index out_stride) {
  __m512 r[16], t[16], u[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_load_ps(in + i * kLanes);
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    u[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  // u[4i + j], 128-bit lane m: column 4m + j of rows 4i .. 4i + 3.
  for (int j = 0; j < 4; ++j) {
    const __m512 x0 = _mm512_shuffle_f32x4(u[j], u[4 + j], 0x44), x1 = _mm512_shuffle_f32x4(u[j], u[4 + j], 0xEE);
    const __m512 y0 = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0x44);
    const __m512 y1 = _mm512_shuffle_f32x4(u[8 + j], u[12 + j], 0xEE);
    _mm512_storeu_ps(out + (0 + j) * out_stride, _mm512_shuffle_f32x4(x0, y0, 0x88));
    _mm512_storeu_ps(out + (4 + j) * out_stride, _mm512_shuffle_f32x4(x0, y0, 0xDD));
    _mm512_storeu_ps(out + (8 + j) * out_stride, _mm512_shuffle_f32x4(x1, y1, 0x88));
    _mm512_storeu_ps(out + (12 + j) * out_stride, _mm512_shuffle_f32x4(x1, y1, 0xDD));
  }
}

// The weight gradient's register tile, 16 patch elements × 16 output channels: for every pixel of the chunk's
// blocks, one load of its d_y for the 16 output channels (transposed d_y [16 pixels][16 channels] per block and
// tile) and 16 FMAs, each with one patch element broadcast from the block's panel ([k_padded][16 pixels]). Each
// (channel, patch element) sum runs over the pixels in the same order as a tile laid out the other way round, so
// the result does not depend on the layout. The tile is transposed once at the end and added to partial (row
// stride k_total) for the channels and patch elements that exist.
__attribute__((target("avx512f"))) void weight_grad_tile(const float* dy_tile, const float* patch_tile, Index blocks,
                                                         Index dy_block_stride, Index patch_block_stride, Index rows,
                                                         Index cols, float* partial, Index k_total) {
  Accumulator acc[kLanes];
#pragma GCC unroll 16
  for (Index k = 0; k < kLanes; ++k) acc[k] = _mm512_setzero_ps();
  for (Index b = 0; b < blocks; ++b) {
    const float* dy = dy_tile + b * dy_block_stride;
    const float* patch = patch_tile + b * patch_block_stride;
    for (Index l = 0; l < kLanes; ++l) {
      const __m512 v = _mm512_load_ps(dy + l * kRows);
#pragma GCC unroll 16
      for (Index k = 0; k < kLanes; ++k) acc[k] = _mm512_fmadd_ps(_mm512_set1_ps(patch[k * kLanes + l]), v, acc[k]);
    }
  }
  alignas(64) float tile[kLanes * kRows], by_channel[kRows * kLanes];
  for (Index k = 0; k < kLanes; ++k) _mm512_store_ps(tile + k * kRows, acc[k]);
  transpose16(tile, by_channel, kLanes);
  const __mmask16 columns = static_cast<__mmask16>(cols >= kLanes ? 0xFFFFu : (1u << cols) - 1u);
  for (Index r = 0; r < rows; ++r) {
    float* to = partial + r * k_total;
    const __m512 add = _mm512_load_ps(by_channel + r * kLanes);
    _mm512_mask_storeu_ps(to, columns, _mm512_add_ps(_mm512_maskz_loadu_ps(columns, to), add));
  }
}

// The block's d_y for output channels [0, rows_padded): 16 lanes per channel from its segments (zero past C_out
// and in lanes past the last pixel).
__attribute__((target("avx512f"))) void pack_dy(const float* d_y, const DirectConvShape& s, const Segment* segments,
                                                int segment_count, Index rows_padded, float* out) {
  const Index pixels = s.h_out * s.w_out;
  for (Index co = 0; co < rows_padded; ++co) {
    __m512 v = _mm512_setzero_ps();
    if (co < s.c_out) {
      for (int sgm = 0; sgm < segment_count; ++sgm) {
        const Segment& g = segments[sgm];
        const __mmask16 count = static_cast<__mmask16>((1u << g.count) - 1u);
        const __m512 line = _mm512_maskz_loadu_ps(count, d_y + g.out_offset + co * pixels);
        v = g.first == 0 ? line : _mm512_mask_expand_ps(v, static_cast<__mmask16>(count << g.first), line);
      }
    }
    _mm512_store_ps(out + co * kLanes, v);
  }
}

}  // namespace

void direct_conv_forward(const float* x, const float* weight, const float* bias, float* y, const DirectConvShape& s) {
  const Index taps = s.kh * s.kw, k_total = s.c_in * taps;
  const Index pixels = s.h_out * s.w_out, total = s.n * pixels;
  const Index tiles = (s.c_out + kRows - 1) / kRows;
  const Index blocks = (total + kLanes - 1) / kLanes;
  if (blocks == 0 || s.c_out == 0) return;
  thread_local std::vector<float> packed_buffer;
  if (static_cast<Index>(packed_buffer.size()) < tiles * k_total * kRows)
    packed_buffer.resize(static_cast<std::size_t>(tiles * k_total * kRows));
  float* packed = packed_buffer.data();
  pack_weights(weight, s.c_out, k_total, packed);
  const Index sample_elements = s.c_in * s.h * s.w;
  const BlockPlans plans(s);
#pragma omp parallel if (blocks > 1)
  {
    float* panel = thread_panel(k_total * kLanes);
    const BlockTable table = thread_table(taps);
    Segment segments[kLanes];
#pragma omp for schedule(static)
    for (Index block = 0; block < blocks; ++block) {
      const Index q0 = block * kLanes;
      BlockTable plan;
      const int segment_count = plans.get(block, table, plan, segments);
      const float* x_block = x + (q0 / pixels) * sample_elements;
      if (plan.lines[0] != 0) {
        for (Index tile = 0; tile < tiles; ++tile) {
          const float* packed_tile = packed + tile * k_total * kRows;
          const Index rows = std::min(kRows, s.c_out - tile * kRows);
          if (plan.lines[0] == 1)
            multiply_lines<1>(x_block, s, plan, packed_tile, rows, bias, tile * kRows, segments, segment_count, y,
                              pixels);
          else
            multiply_lines<2>(x_block, s, plan, packed_tile, rows, bias, tile * kRows, segments, segment_count, y,
                              pixels);
        }
        continue;
      }
      pack_panel(x_block, s, plan, panel);
      for (Index tile = 0; tile < tiles; ++tile)
        multiply_tile(panel, packed + tile * k_total * kRows, k_total, std::min(kRows, s.c_out - tile * kRows), bias,
                      tile * kRows, segments, segment_count, y, pixels);
    }
  }
}

void direct_conv_weight_grad(const float* x, const float* d_y, float* d_weight, const DirectConvShape& s) {
  const Index taps = s.kh * s.kw, k_total = s.c_in * taps;
  const Index pixels = s.h_out * s.w_out, total = s.n * pixels;
  const Index blocks = (total + kLanes - 1) / kLanes;
  if (blocks == 0 || s.c_out == 0 || k_total == 0) return;
  const Index k_padded = (k_total + kLanes - 1) / kLanes * kLanes;
  const Index rows_padded = (s.c_out + kRows - 1) / kRows * kRows;
  // Chunks of blocks whose panels fill about 256 KiB (they stay in L2 across the tiles), grouped into at
  // most kGroups runs of consecutive chunks: each group adds its chunks in order into its own partial, and the
  // partials are added in group order. All of it depends on the shape alone, not on the threads.
  constexpr Index kGroups = 16;
  const Index chunk_blocks = std::max<Index>(1, (Index{1} << 16) / (k_padded * kLanes));
  const Index chunks = (blocks + chunk_blocks - 1) / chunk_blocks;
  const Index groups = std::min(kGroups, chunks);
  const Index weight_numel = s.c_out * k_total;
  thread_local std::vector<float> partial_buffer;
  partial_buffer.assign(static_cast<std::size_t>(groups * weight_numel), 0.0f);
  float* partials = partial_buffer.data();
  const Index sample_elements = s.c_in * s.h * s.w;
  const Index patch_stride = k_padded * kLanes, dy_stride = rows_padded * kLanes;
  const BlockPlans plans(s);
#pragma omp parallel if (groups > 1)
  {
    // [one block's packed d_y][chunk's panels][chunk's transposed d_y], 64-byte aligned.
    float* panel = thread_panel(dy_stride + chunk_blocks * (patch_stride + dy_stride));
    float* patches = panel + dy_stride;
    float* dys = patches + chunk_blocks * patch_stride;
    const BlockTable table = thread_table(taps);
    Segment segments[kLanes];
#pragma omp for schedule(dynamic)
    for (Index group = 0; group < groups; ++group) {
      float* partial = partials + group * weight_numel;
      for (Index chunk = group * chunks / groups; chunk < (group + 1) * chunks / groups; ++chunk) {
        const Index first = chunk * chunk_blocks, count = std::min(chunk_blocks, blocks - first);
        for (Index b = 0; b < count; ++b) {
          const Index q0 = (first + b) * kLanes;
          BlockTable plan;
          const int segment_count = plans.get(first + b, table, plan, segments);
          // The block's panel, padded with zero rows to whole tiles, and its d_y transposed tile by tile.
          float* patch = patches + b * patch_stride;
          const float* x_block = x + (q0 / pixels) * sample_elements;
          if (plan.lines[0] == 1)
            pack_lines<1>(x_block, s, plan, patch);
          else if (plan.lines[0] == 2)
            pack_lines<2>(x_block, s, plan, patch);
          else
            pack_panel(x_block, s, plan, patch);
          std::fill(patch + k_total * kLanes, patch + patch_stride, 0.0f);
          pack_dy(d_y, s, segments, segment_count, rows_padded, panel);
          for (Index co = 0; co < rows_padded; co += kRows)
            transpose16(panel + co * kLanes, dys + b * dy_stride + co * kLanes, kRows);
        }
        for (Index k = 0; k < k_padded; k += kLanes)
          for (Index co = 0; co < rows_padded; co += kRows)
            weight_grad_tile(dys + co * kLanes, patches + k * kLanes, count, dy_stride, patch_stride,
                             std::min(kRows, s.c_out - co), std::min(kLanes, k_total - k), partial + co * k_total + k,
                             k_total);
      }
    }
  }
#pragma omp parallel for schedule(static) if (weight_numel * groups > (1 << 14))
  for (Index i = 0; i < weight_numel; ++i) {
    float sum = d_weight[i];
    for (Index group = 0; group < groups; ++group) sum += partials[group * weight_numel + i];
    d_weight[i] = sum;
  }
}

float* aligned_buffer(std::vector<float>& buffer, std::int64_t floats) {
  if (static_cast<std::int64_t>(buffer.size()) < floats + 16) buffer.resize(static_cast<std::size_t>(floats + 16));
  return reinterpret_cast<float*>((reinterpret_cast<std::uintptr_t>(buffer.data()) + 63) / 64 * 64);
}

}  // namespace proplab::ops::detail
