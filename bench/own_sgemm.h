// bench/own_sgemm: a packed AVX-512 sgemm of our own, the candidate bench_blas measures against the libraries
// (issue 20's GEMM item): row-major C[M, N] = op(A) op(B) + beta C, single-threaded like each piece of ops::sgemm,
// optionally with a fused epilogue (a bias per column, then ReLU), the way a Linear layer's forward would call it.
//
// The classic layout (Goto; BLIS's five loops): B is packed per KC rows into column panels of 32 ([N/32][KC][32],
// zero past N), A per MC × KC block into row panels of MR ([MC/MR][KC][MR], zero past M), and a MR × 32 register
// tile (2·MR zmm accumulators: one broadcast of A and two FMAs per row and k) runs over KC. The first KC block
// stores beta·C + the tile, the later ones add to C; the epilogue runs on the last. Edges use masked stores.
// Sizes: KC 384 (a B panel of 48 KiB stays in L1/L2 across a row panel), MC 168 (A's block of 252 KiB in L2).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <vector>

// GCC 12's AVX-512 intrinsics start from an undefined vector, which -Wmaybe-uninitialized reports inside the
// headers; the values are always defined (as in ops/conv_direct.cpp).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace proplab::bench {

struct OwnSgemmShape {
  int m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  float beta = 0.0f;
};

namespace own_sgemm_detail {

constexpr int kNr = 32, kKc = 384;
using Vec = float __attribute__((vector_size(64)));

// A's block rows [m0, m0 + mc) × columns [k0, k0 + kc) into panels of MR rows: [panel][k][MR]. One gather (or,
// transposed, one masked load) of a panel's MR rows per k.
template <int MR>
__attribute__((target("avx512f"))) void pack_a(const float* a, const OwnSgemmShape& s, int m0, int mc, int k0, int kc,
                                               float* out) {
  const int lda = s.trans_a ? s.m : s.k;
  for (int p = 0; p < mc; p += MR) {
    float* panel = out + static_cast<std::int64_t>(p) * kc;
    const int rows = std::min(MR, mc - p);
    const __mmask16 live = static_cast<__mmask16>((1u << rows) - 1u);
    const __mmask16 store = static_cast<__mmask16>((1u << MR) - 1u);
    if (s.trans_a) {
      for (int kk = 0; kk < kc; ++kk)
        _mm512_mask_storeu_ps(panel + kk * MR, store,
                              _mm512_maskz_loadu_ps(live, a + static_cast<std::int64_t>(k0 + kk) * lda + m0 + p));
    } else {
      const __m512i index = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                               _mm512_set1_epi32(lda));
      const float* base = a + static_cast<std::int64_t>(m0 + p) * lda + k0;
      for (int kk = 0; kk < kc; ++kk)
        _mm512_mask_storeu_ps(panel + kk * MR, store,
                              _mm512_mask_i32gather_ps(_mm512_setzero_ps(), live, index, base + kk, 4));
    }
  }
}

// B's rows [k0, k0 + kc) into panels of 32 columns: [panel][k][32].
__attribute__((target("avx512f"))) inline void pack_b(const float* b, const OwnSgemmShape& s, int k0, int kc,
                                                      float* out) {
  const int ldb = s.trans_b ? s.k : s.n;
  for (int j = 0; j < s.n; j += kNr) {
    float* panel = out + static_cast<std::int64_t>(j / kNr) * kc * kNr;
    const int cols = std::min(kNr, s.n - j);
    if (!s.trans_b) {
      const __mmask16 m0 = static_cast<__mmask16>(cols >= 16 ? 0xFFFF : (1u << cols) - 1u);
      const __mmask16 m1 = static_cast<__mmask16>(cols >= 32 ? 0xFFFF : cols <= 16 ? 0 : (1u << (cols - 16)) - 1u);
      for (int kk = 0; kk < kc; ++kk) {
        const float* row = b + static_cast<std::int64_t>(k0 + kk) * ldb + j;
        _mm512_store_ps(panel + kk * kNr, _mm512_maskz_loadu_ps(m0, row));
        _mm512_store_ps(panel + kk * kNr + 16, _mm512_maskz_loadu_ps(m1, row + 16));
      }
    } else {
      const __m512i index = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                               _mm512_set1_epi32(ldb));
      const __mmask16 m0 = static_cast<__mmask16>(cols >= 16 ? 0xFFFF : (1u << cols) - 1u);
      const __mmask16 m1 = static_cast<__mmask16>(cols >= 32 ? 0xFFFF : cols <= 16 ? 0 : (1u << (cols - 16)) - 1u);
      const float* base = b + static_cast<std::int64_t>(j) * ldb + k0;
      for (int kk = 0; kk < kc; ++kk) {
        _mm512_store_ps(panel + kk * kNr, _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m0, index, base + kk, 4));
        _mm512_store_ps(panel + kk * kNr + 16,
                        _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m1, index,
                                                 base + 16 * static_cast<std::int64_t>(ldb) + kk, 4));
      }
    }
  }
}

// The MR × 32 tile over kc: C rows [row0, row0 + rows), columns [col0, col0 + cols). first: C = beta·C + tile,
// else C += tile; epilogue (on the last KC block): + bias[col], then max(·, 0) when relu.
template <int MR>
__attribute__((target("avx512f"))) void tile(const float* a_panel, const float* b_panel, int kc, float* c, int ldc,
                                             int rows, int cols, bool first, float beta, const float* bias, bool relu) {
  Vec acc[MR][2];
#pragma GCC unroll 32
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = Vec{};
  for (int kk = 0; kk < kc; ++kk) {
    const Vec b0 = reinterpret_cast<const Vec*>(b_panel + kk * kNr)[0];
    const Vec b1 = reinterpret_cast<const Vec*>(b_panel + kk * kNr)[1];
#pragma GCC unroll 32
    for (int r = 0; r < MR; ++r) {
      const Vec av = _mm512_set1_ps(a_panel[kk * MR + r]);
      acc[r][0] = _mm512_fmadd_ps(av, b0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(av, b1, acc[r][1]);
    }
  }
  const __mmask16 m0 = static_cast<__mmask16>(cols >= 16 ? 0xFFFF : (1u << cols) - 1u);
  const __mmask16 m1 = static_cast<__mmask16>(cols >= 32 ? 0xFFFF : cols <= 16 ? 0 : (1u << (cols - 16)) - 1u);
  __m512 bias0 = _mm512_setzero_ps(), bias1 = _mm512_setzero_ps();
  if (bias) {
    bias0 = _mm512_maskz_loadu_ps(m0, bias);
    bias1 = _mm512_maskz_loadu_ps(m1, bias + 16);
  }
  for (int r = 0; r < rows; ++r) {
    float* out = c + static_cast<std::int64_t>(r) * ldc;
    __m512 v0 = acc[r][0], v1 = acc[r][1];
    if (first) {
      if (beta != 0.0f) {
        v0 = _mm512_fmadd_ps(_mm512_set1_ps(beta), _mm512_maskz_loadu_ps(m0, out), v0);
        v1 = _mm512_fmadd_ps(_mm512_set1_ps(beta), _mm512_maskz_loadu_ps(m1, out + 16), v1);
      }
    } else {
      v0 = _mm512_add_ps(_mm512_maskz_loadu_ps(m0, out), v0);
      v1 = _mm512_add_ps(_mm512_maskz_loadu_ps(m1, out + 16), v1);
    }
    if (bias) {
      v0 = _mm512_add_ps(v0, bias0);
      v1 = _mm512_add_ps(v1, bias1);
    }
    if (relu) {
      v0 = _mm512_max_ps(v0, _mm512_setzero_ps());
      v1 = _mm512_max_ps(v1, _mm512_setzero_ps());
    }
    _mm512_mask_storeu_ps(out, m0, v0);
    _mm512_mask_storeu_ps(out + 16, m1, v1);
  }
}

}  // namespace own_sgemm_detail

// C = op(A) op(B) + beta C (+ bias per column, then ReLU, when given). MR: rows of the register tile (2·MR
// accumulators of the 32 zmm registers).
template <int MR>
__attribute__((target("avx512f"))) void own_sgemm(const OwnSgemmShape& s, const float* a, const float* b, float* c,
                                                  const float* bias = nullptr, bool relu = false) {
  using namespace own_sgemm_detail;
  constexpr int kMc = (168 / MR) * MR;
  thread_local std::vector<float, std::allocator<float>> a_buffer, b_buffer;
  const int n_panels = (s.n + kNr - 1) / kNr;
  b_buffer.resize(static_cast<std::size_t>(n_panels) * kKc * kNr + 16);
  a_buffer.resize(static_cast<std::size_t>(kMc) * kKc + 16);
  auto align = [](std::vector<float>& v) {
    return reinterpret_cast<float*>((reinterpret_cast<std::uintptr_t>(v.data()) + 63) / 64 * 64);
  };
  float* b_packed = align(b_buffer);
  float* a_packed = align(a_buffer);
  for (int k0 = 0; k0 < s.k; k0 += kKc) {
    const int kc = std::min(kKc, s.k - k0);
    const bool first = k0 == 0, last = k0 + kc >= s.k;
    pack_b(b, s, k0, kc, b_packed);
    for (int m0 = 0; m0 < s.m; m0 += kMc) {
      const int mc = std::min(kMc, s.m - m0);
      pack_a<MR>(a, s, m0, mc, k0, kc, a_packed);
      for (int j = 0; j < s.n; j += kNr)
        for (int p = 0; p < mc; p += MR)
          tile<MR>(a_packed + static_cast<std::int64_t>(p) * kc,
                   b_packed + static_cast<std::int64_t>(j / kNr) * kc * kNr, kc,
                   c + static_cast<std::int64_t>(m0 + p) * s.n + j, s.n, std::min(MR, mc - p), std::min(kNr, s.n - j),
                   first, s.beta, last && bias ? bias + j : nullptr, last && relu);
    }
  }
  if (s.k == 0)
    for (int i = 0; i < s.m; ++i)
      for (int j = 0; j < s.n; ++j) {
        float& v = c[static_cast<std::int64_t>(i) * s.n + j];
        v = s.beta == 0.0f ? 0.0f : s.beta * v;
        if (bias) v += bias[j];
        if (relu) v = std::max(v, 0.0f);
      }
}

}  // namespace proplab::bench

#pragma GCC diagnostic pop
