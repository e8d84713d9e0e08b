// ops/gemm: every CPU matrix product in proplab (Linear, convolution, the sgemm benchmarks) goes through sgemm
// here, which gives results that are bitwise the same for any thread count.
//
// Why not OpenBLAS's own threading: a multi-threaded OpenBLAS sgemm splits the product among its threads, and the
// piece each thread gets decides which micro-kernel (and which edge kernels) compute an element, so the last bits
// of C depend on the thread count (measured with Debian's OpenBLAS 0.3.21 on an AMD EPYC, Haswell kernels: 22444
// of 262144 elements of a 256×1024×256 product differ between 1 and 2 threads). So OpenBLAS always runs on one
// thread, and sgemm splits C into pieces that are a function of the shape alone (rows or columns, whichever
// dimension is longer; near-equal multiples of 16, none thinner than 64, about 64 MFLOP each), each computed by one
// single-threaded OpenBLAS call on proplab's OpenMP pool (dynamic schedule, so a thread that loses its core does
// not hold up the rest). K is never split, so each element is one dot product in OpenBLAS's order whatever the
// pool. Called inside a parallel region (the convolution's per-chunk loop), the pieces run on the calling thread.
#pragma once

#include <cstdint>
#include <string>

namespace proplab::ops {

// The library that computes each piece: oneDNN's dnnl_sgemm (Debian's libdnnl2, loaded at run time; about 17%
// faster than OpenBLAS at the reference transformer's shapes on one AVX-512 core, bench_blas) when it loads, else
// OpenBLAS; PROPLAB_GEMM=openblas in the environment keeps OpenBLAS. Process-wide. Each is bitwise independent of
// the thread count; they differ from each other in the last bits, so a run file records which one ran
// (gemm_backend_name(), e.g. "oneDNN 2.7.3" or "OpenBLAS 0.3.21"). set_gemm_backend(onednn) returns false (and
// changes nothing) where oneDNN is not installed.
enum class GemmBackend { openblas, onednn };
GemmBackend gemm_backend();
bool set_gemm_backend(GemmBackend backend);
std::string gemm_backend_name();

// C[m, n] = alpha · op(A) · op(B) + beta · C, row-major; op(A) is [m, k] (A stored [k, m] when trans_a), op(B)
// is [k, n] (B stored [n, k] when trans_b); lda, ldb, ldc are the stored matrices' row strides. beta = 0 ignores
// C's previous contents (NaN included), as in BLAS.
void sgemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
           std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc);

// C[m, n] = op(A) · op(B) + bias (bias[n], added to every row): each piece of C is seeded with the bias just before
// its product accumulates onto it (beta = 1), while it is in cache and on the same thread. Bitwise the same as
// seeding all of C first and calling sgemm with alpha = beta = 1.
void sgemm_bias(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                std::int64_t lda, const float* b, std::int64_t ldb, const float* bias, float* c, std::int64_t ldc);

// The pieces sgemm splits an m × n × k product into, along rows (split_rows) or columns of C: `count` pieces of
// `size` (the last one shorter). Exposed for the tests; a function of the shape alone.
struct GemmPieces {
  bool split_rows = true;
  std::int64_t size = 0;
  std::int64_t count = 1;
};
GemmPieces gemm_pieces(std::int64_t m, std::int64_t n, std::int64_t k);

}  // namespace proplab::ops
