// kernels/norm: the CUDA side of LayerNorm and RMSNorm over the last dimension (ops::layernorm_forward/backward and
// ops::rmsnorm_forward/backward in src/ops/ops.h; src/ops/norm.cpp is the reference) — host launchers.
//
// Invariants:
// - x, y, d_y, d_x are device pointers to rows * features contiguous floats; mean and rstd to `rows` floats; gamma,
//   beta, d_gamma, d_beta to `features` floats. gamma and beta are optional (null), as are d_gamma and d_beta.
// - Row statistics are float, as on the CPU: mean = Σx · (1/D), rstd = 1/sqrt(Σ(x − mean)² · (1/D) + eps) (two
//   passes), each sum a fixed-order block tree (kernels/block_reduce.cuh) — one block per row.
// - d_x OVERWRITES (it may alias d_y; y may alias x). d_gamma and d_beta ACCUMULATE: per-column sums over the same
//   fixed row chunks as the CPU (a function of the row count only), each chunk summed in row order in double from
//   the float products d_y · x_hat, chunks combined in order, the double total rounded to float once and added.
//   Given the same saved statistics, that is the CPU's summation order term for term.
// - rows == 0 or features == 0: nothing is written (as on the CPU).
// - No atomics, launch geometry a function of rows and features only: repeated calls give identical bits.
// - Everything is enqueued on context().stream; nothing synchronises. Host-compilable.
#pragma once

#include <cstdint>

namespace proplab::kernels {

// y = (x − mean) · rstd (· gamma) (+ beta) per row; writes mean[rows] and rstd[rows].
void layernorm_forward(const float* x, const float* gamma, const float* beta, float eps, std::int64_t rows,
                       std::int64_t features, float* y, float* mean, float* rstd);

// d_x = rstd · (g − mean(g) − x_hat · mean(g · x_hat)), g = d_y (· gamma); d_gamma += Σ_rows d_y · x_hat,
// d_beta += Σ_rows d_y (each skipped when null; d_gamma requires gamma).
void layernorm_backward(const float* x, const float* gamma, const float* mean, const float* rstd, const float* d_y,
                        std::int64_t rows, std::int64_t features, float* d_x, float* d_gamma, float* d_beta);

// y = x · rstd (· gamma) per row, rstd = 1/sqrt(Σx² · (1/D) + eps); writes rstd[rows].
void rmsnorm_forward(const float* x, const float* gamma, float eps, std::int64_t rows, std::int64_t features, float* y,
                     float* rstd);

// d_x = rstd · (g − x_hat · mean(g · x_hat)), g = d_y (· gamma), x_hat = x · rstd; d_gamma += Σ_rows d_y · x_hat
// (skipped when null; requires gamma).
void rmsnorm_backward(const float* x, const float* gamma, const float* rstd, const float* d_y, std::int64_t rows,
                      std::int64_t features, float* d_x, float* d_gamma);

}  // namespace proplab::kernels
