#include "ops/conv_winograd.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <vector>

// GCC 12's AVX-512 intrinsics start from an undefined vector (_mm512_undefined_ps), which -Wmaybe-uninitialized
// and -Wuninitialized report inside the headers; the values are always defined.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace proplab::ops::detail {

namespace {

using Index = std::int64_t;
constexpr Index kLanes = 16;       // tiles per block: one zmm
constexpr Index kRows = 16;        // output channels per register tile
constexpr Index kPoints = 16;      // transform points of a 4 × 4 tile
constexpr int kSegmentTiles = 15;  // a segment's input line (2·tiles + 2 elements) fits two zmm
// 16 floats in a zmm, as __m512 but without its licence to alias anything (see conv_direct.cpp's Accumulator).
using Accumulator = float __attribute__((vector_size(64)));

bool cpu_has_kernel_features() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool has = __builtin_cpu_supports("avx512f");
  return has;
#else
  return false;
#endif
}

// One run of a block's tiles on one tile row: lanes [first, first + count) hold tiles (tile_row, tile_column +
// 0 .. count − 1) of `sample`, with what loading their inputs and storing their outputs needs.
struct Segment {
  int first = 0, count = 0;
  Index sample = 0, tile_row = 0, tile_column = 0;
  __mmask16 lanes = 0;
  // Input: the four lines' offsets in a channel plane (row · W + first column), their element masks (two halves;
  // padding, the image's edges and missing rows read zero), whether a line needs its second half,
  // and per tile column b the permutation taking line element 2·(lane − first) + b to the lane.
  Index line_offset[4] = {};
  __mmask16 row_mask[4][2] = {};
  bool wide = false;
  alignas(64) std::int32_t gather[4][kLanes] = {};
  // Output: the permutations interleaving a row's two output columns into the line (its first 16 elements, then
  // the next), and the line's length within the image.
  alignas(64) std::int32_t scatter[2][kLanes] = {};
  int out_length = 0;
};

struct Geometry {
  Index tiles_h = 0, tiles_w = 0, per_sample = 0, total = 0;
};

// The block's segments; returns their number. Walks the tiles from the first one's position (one division per
// block) and fills each segment's masks and permutations with vector operations.
__attribute__((target("avx512f"))) int plan_block(const DirectConvShape& s, const Geometry& geo, Index q0,
                                                  Segment* segments) {
  int count = 0;
  Index sample = q0 / geo.per_sample, row = (q0 % geo.per_sample) / geo.tiles_w, column = q0 % geo.tiles_w;
  const Index lanes = std::min(kLanes, geo.total - q0);
  for (int l = 0; l < lanes; ++l) {
    if (count == 0 || column == 0 || segments[count - 1].count == kSegmentTiles) {
      Segment& g = segments[count++];
      g.first = l, g.count = 0;
      g.sample = sample, g.tile_row = row, g.tile_column = column;
    }
    ++segments[count - 1].count;
    if (++column == geo.tiles_w) {
      column = 0;
      if (++row == geo.tiles_h) row = 0, ++sample;
    }
  }
  const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512i half = _mm512_and_si512(lane, _mm512_set1_epi32(1)), tile = _mm512_srli_epi32(lane, 1);
  for (int i = 0; i < count; ++i) {
    Segment& g = segments[i];
    g.lanes = static_cast<__mmask16>(((1u << g.count) - 1u) << g.first);
    // Line elements e in [0, 2·count + 2) whose column 2·tile_column − padding + e lies in [0, W).
    const Index column0 = 2 * g.tile_column - s.padding;
    const Index from = std::max<Index>(0, -column0), to = std::min<Index>(2 * Index{g.count} + 2, s.w - column0);
    const std::uint64_t mask = to > from ? ((std::uint64_t{1} << to) - 1u) & ~((std::uint64_t{1} << from) - 1u) : 0u;
    g.wide = 2 * g.count + 2 > kLanes;
    for (int a = 0; a < 4; ++a) {
      const Index r = 2 * g.tile_row - s.padding + a;
      const bool row_ok = r >= 0 && r < s.h;
      g.row_mask[a][0] = static_cast<__mmask16>(row_ok ? mask & 0xFFFFu : 0u);
      g.row_mask[a][1] = static_cast<__mmask16>(row_ok ? (mask >> 16) & 0xFFFFu : 0u);
      g.line_offset[a] = row_ok ? r * s.w + column0 : 0;
    }
    // Lane l of the segment takes line element 2·(l − first) + b (lanes outside it are never written).
    const __m512i base = _mm512_slli_epi32(_mm512_sub_epi32(lane, _mm512_set1_epi32(g.first)), 1);
    for (int b = 0; b < 4; ++b)
      _mm512_store_si512(g.gather[b], _mm512_maskz_add_epi32(g.lanes, base, _mm512_set1_epi32(b)));
    // Output element e of a row's line: tile first + e / 2 (its lane), column e % 2 (which of the two vectors).
    const __m512i fifteen = _mm512_set1_epi32(15);
    for (int part = 0; part < 2; ++part) {
      const __m512i source = _mm512_and_si512(_mm512_add_epi32(tile, _mm512_set1_epi32(g.first + 8 * part)), fifteen);
      _mm512_store_si512(g.scatter[part], _mm512_or_si512(_mm512_slli_epi32(half, 4), source));
    }
    g.out_length = static_cast<int>(std::min<Index>(2 * Index{g.count}, s.w_out - 2 * g.tile_column));
  }
  return count;
}

// weight [C_out, C_in, 3, 3] → packed [ceil(C_out / 16)][16 points][C_in][16] of G g Gᵀ (in double, rounded once),
// zero past C_out. G = [[1, 0, 0], [½, ½, ½], [½, −½, ½], [0, 0, 1]].
void pack_weights(const float* weight, Index c_out, Index c_in, float* packed) {
  const Index tiles = (c_out + kRows - 1) / kRows;
  std::fill(packed, packed + tiles * kPoints * c_in * kRows, 0.0f);
  for (Index co = 0; co < c_out; ++co)
    for (Index ci = 0; ci < c_in; ++ci) {
      const float* g = weight + (co * c_in + ci) * 9;
      double gg[4][3];  // G g
      for (int j = 0; j < 3; ++j) {
        const double g0 = g[j], g1 = g[3 + j], g2 = g[6 + j];
        gg[0][j] = g0;
        gg[1][j] = 0.5 * (g0 + g1 + g2);
        gg[2][j] = 0.5 * (g0 - g1 + g2);
        gg[3][j] = g2;
      }
      for (int a = 0; a < 4; ++a) {
        const double u[4] = {gg[a][0], 0.5 * (gg[a][0] + gg[a][1] + gg[a][2]), 0.5 * (gg[a][0] - gg[a][1] + gg[a][2]),
                             gg[a][2]};
        for (int b = 0; b < 4; ++b)
          packed[(((co / kRows) * kPoints + a * 4 + b) * c_in + ci) * kRows + co % kRows] = static_cast<float>(u[b]);
      }
    }
}

// v [16 points][C_in][16 lanes] = Bᵀ d B for every tile of the block and input channel, Bᵀ = [[1, 0, −1, 0],
// [0, 1, 1, 0], [0, −1, 1, 0], [0, 1, 0, −1]]; lanes without a tile hold zero.
__attribute__((target("avx512f"))) void transform_input(const float* x, const DirectConvShape& s,
                                                        const Segment* segments, int count, float* v) {
  const Index plane = s.h * s.w, sample_elements = s.c_in * plane;
  for (Index ci = 0; ci < s.c_in; ++ci) {
    // d[a·4 + b]: patch element (a, b) of every lane's tile. Every loop below is unrolled, so that the arrays live
    // in registers (a loop over a kept them in memory).
    Accumulator d[16];
#pragma GCC unroll 16
    for (int k = 0; k < 16; ++k) d[k] = _mm512_setzero_ps();
    for (int sg = 0; sg < count; ++sg) {
      const Segment& g = segments[sg];
      const float* channel = x + g.sample * sample_elements + ci * plane;
      const __m512i gather[4] = {_mm512_load_si512(g.gather[0]), _mm512_load_si512(g.gather[1]),
                                 _mm512_load_si512(g.gather[2]), _mm512_load_si512(g.gather[3])};
      // Lanes outside the masks are not read (masked loads do not fault): a missing row reads nothing, and a line
      // may start before its plane.
      if (!g.wide) {
#pragma GCC unroll 4
        for (int a = 0; a < 4; ++a) {
          const __m512 low = _mm512_maskz_loadu_ps(g.row_mask[a][0], channel + g.line_offset[a]);
#pragma GCC unroll 4
          for (int b = 0; b < 4; ++b) d[a * 4 + b] = _mm512_mask_permutexvar_ps(d[a * 4 + b], g.lanes, gather[b], low);
        }
      } else {
#pragma GCC unroll 4
        for (int a = 0; a < 4; ++a) {
          const float* line = channel + g.line_offset[a];
          const __m512 low = _mm512_maskz_loadu_ps(g.row_mask[a][0], line);
          const __m512 high = _mm512_maskz_loadu_ps(g.row_mask[a][1], line + kLanes);
#pragma GCC unroll 4
          for (int b = 0; b < 4; ++b)
            d[a * 4 + b] = _mm512_mask_mov_ps(d[a * 4 + b], g.lanes, _mm512_permutex2var_ps(low, gather[b], high));
        }
      }
    }
    // Rows (Bᵀ d), then columns (· B).
    Accumulator t[16];
#pragma GCC unroll 4
    for (int b = 0; b < 4; ++b) {
      t[0 * 4 + b] = d[0 * 4 + b] - d[2 * 4 + b];
      t[1 * 4 + b] = d[1 * 4 + b] + d[2 * 4 + b];
      t[2 * 4 + b] = d[2 * 4 + b] - d[1 * 4 + b];
      t[3 * 4 + b] = d[1 * 4 + b] - d[3 * 4 + b];
    }
#pragma GCC unroll 4
    for (int a = 0; a < 4; ++a) {
      const Accumulator* r = t + a * 4;
      _mm512_store_ps(v + ((a * 4 + 0) * s.c_in + ci) * kLanes, r[0] - r[2]);
      _mm512_store_ps(v + ((a * 4 + 1) * s.c_in + ci) * kLanes, r[1] + r[2]);
      _mm512_store_ps(v + ((a * 4 + 2) * s.c_in + ci) * kLanes, r[2] - r[1]);
      _mm512_store_ps(v + ((a * 4 + 3) * s.c_in + ci) * kLanes, r[1] - r[3]);
    }
  }
}

// m [16 rows][16 lanes] = Σ_ci u[ci][row] · v[ci] for one transform point and 16 output channels.
__attribute__((target("avx512f"))) void multiply_point(const float* v, const float* u, Index c_in, float* m) {
  Accumulator acc[kRows];
#pragma GCC unroll 16
  for (Index r = 0; r < kRows; ++r) acc[r] = _mm512_setzero_ps();
  for (Index ci = 0; ci < c_in; ++ci) {
    const __m512 b = _mm512_load_ps(v + ci * kLanes);
    const float* w = u + ci * kRows;
#pragma GCC unroll 16
    for (Index r = 0; r < kRows; ++r) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(w[r]), b, acc[r]);
  }
#pragma GCC unroll 16
  for (Index r = 0; r < kRows; ++r) _mm512_store_ps(m + r * kLanes, acc[r]);
}

// For the tile's output channels [co0, co0 + rows): Y = Aᵀ m A (+ bias), Aᵀ = [[1, 1, 1, 0], [0, 1, −1, −1]],
// stored into each segment's two output lines. m is [16 points][16 rows][16 lanes].
__attribute__((target("avx512f"))) void store_outputs(const float* m, Index co0, Index rows, const float* bias,
                                                      const Segment* segments, int count, float* y,
                                                      const DirectConvShape& s) {
  const Index pixels = s.h_out * s.w_out;
  for (Index r = 0; r < rows; ++r) {
    __m512 p[16];
    for (int k = 0; k < 16; ++k) p[k] = _mm512_load_ps(m + (k * kRows + r) * kLanes);
    __m512 s0[4], s1[4];
    for (int j = 0; j < 4; ++j) {
      s0[j] = _mm512_add_ps(_mm512_add_ps(p[0 * 4 + j], p[1 * 4 + j]), p[2 * 4 + j]);
      s1[j] = _mm512_sub_ps(_mm512_sub_ps(p[1 * 4 + j], p[2 * 4 + j]), p[3 * 4 + j]);
    }
    __m512 out[2][2];
    out[0][0] = _mm512_add_ps(_mm512_add_ps(s0[0], s0[1]), s0[2]);
    out[0][1] = _mm512_sub_ps(_mm512_sub_ps(s0[1], s0[2]), s0[3]);
    out[1][0] = _mm512_add_ps(_mm512_add_ps(s1[0], s1[1]), s1[2]);
    out[1][1] = _mm512_sub_ps(_mm512_sub_ps(s1[1], s1[2]), s1[3]);
    const Index co = co0 + r;
    if (bias) {
      const __m512 b = _mm512_set1_ps(bias[co]);
      for (auto& row : out)
        for (auto& column : row) column = _mm512_add_ps(column, b);
    }
    for (int sg = 0; sg < count; ++sg) {
      const Segment& g = segments[sg];
      float* channel = y + (g.sample * s.c_out + co) * pixels + 2 * g.tile_column;
      const int length = g.out_length;
      const __mmask16 low = static_cast<__mmask16>(length >= kLanes ? 0xFFFFu : (1u << length) - 1u);
      for (int half = 0; half < 2; ++half) {
        const Index row = 2 * g.tile_row + half;
        if (row >= s.h_out) break;
        float* line = channel + row * s.w_out;
        _mm512_mask_storeu_ps(line, low,
                              _mm512_permutex2var_ps(out[half][0], _mm512_load_si512(g.scatter[0]), out[half][1]));
        if (length > kLanes)
          _mm512_mask_storeu_ps(line + kLanes, static_cast<__mmask16>((1u << (length - kLanes)) - 1u),
                                _mm512_permutex2var_ps(out[half][0], _mm512_load_si512(g.scatter[1]), out[half][1]));
      }
    }
  }
}

}  // namespace

bool winograd_conv_fits(const DirectConvShape& s) {
  return cpu_has_kernel_features() && s.kh == 3 && s.kw == 3 && s.stride == 1;
}

void winograd_conv_forward(const float* x, const float* weight, const float* bias, float* y, const DirectConvShape& s) {
  Geometry geo;
  geo.tiles_h = (s.h_out + 1) / 2, geo.tiles_w = (s.w_out + 1) / 2;
  geo.per_sample = geo.tiles_h * geo.tiles_w;
  geo.total = s.n * geo.per_sample;
  const Index blocks = (geo.total + kLanes - 1) / kLanes;
  const Index co_tiles = (s.c_out + kRows - 1) / kRows;
  if (blocks == 0 || s.c_out == 0) return;
  thread_local std::vector<float> packed_buffer;
  float* packed = aligned_buffer(packed_buffer, co_tiles * kPoints * s.c_in * kRows);
  pack_weights(weight, s.c_out, s.c_in, packed);
#pragma omp parallel if (blocks > 1)
  {
    thread_local std::vector<float> v_buffer, m_buffer;
    float* v = aligned_buffer(v_buffer, kPoints * s.c_in * kLanes);
    float* m = aligned_buffer(m_buffer, kPoints * kRows * kLanes);
    Segment segments[kLanes];
#pragma omp for schedule(static)
    for (Index block = 0; block < blocks; ++block) {
      const int count = plan_block(s, geo, block * kLanes, segments);
      transform_input(x, s, segments, count, v);
      for (Index tile = 0; tile < co_tiles; ++tile) {
        const float* u = packed + tile * kPoints * s.c_in * kRows;
        for (Index point = 0; point < kPoints; ++point)
          multiply_point(v + point * s.c_in * kLanes, u + point * s.c_in * kRows, s.c_in, m + point * kRows * kLanes);
        store_outputs(m, tile * kRows, std::min(kRows, s.c_out - tile * kRows), bias, segments, count, y, s);
      }
    }
  }
}

}  // namespace proplab::ops::detail
