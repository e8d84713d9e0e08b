// kernels/matmul: row-major matrix products through cuBLASLt — the linear layers, convolution's im2col products
// and anything else that is a GEMM.
//
// Invariants:
// - Row-major, as everywhere in proplab: C[M, N] = alpha · op(A) · op(B) + beta · C (+ bias[N] added to every row
//   when bias is given, fused as cuBLASLt's bias epilogue), op(A) [M, K] is A [M, K] (lda >= K) or, transposed,
//   A [K, M] (lda >= M); likewise B. C is f32 [M, N] with ldc >= N.
// - A and B are f32 or bf16 (both the same); accumulation is always in f32 (CUBLAS_COMPUTE_32F: no TF32, so an
//   f32 product matches the CPU's sgemm to rounding).
// - Deterministic: the algorithm is chosen once per shape by cuBLASLt's heuristic (a function of shape, types and
//   GPU) and cached, and split-K reductions across thread blocks are excluded (reduction scheme NONE), so the
//   same inputs give the same bits on every call.
// - Enqueued on context().stream with the context's workspace; never synchronises. Host-compilable.
#pragma once

#include <cstdint>

namespace proplab::kernels {

enum class GemmInput : std::uint8_t { f32, bf16 };

void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const void* a, std::int64_t lda,
          const void* b, std::int64_t ldb, float* c, std::int64_t ldc, float alpha, float beta,
          const float* bias = nullptr, GemmInput input = GemmInput::f32);

}  // namespace proplab::kernels
