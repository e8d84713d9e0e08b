// kernels/reduce: the second stage of every deterministic reduction, and the plain reductions ops need (sums of
// products and squares, column sums) — host launchers; device helpers are in kernels/block_reduce.cuh.
//
// Invariants:
// - Partials are combined in index order by one block: results repeat bit for bit.
// - All work is enqueued on context().stream; nothing here synchronises unless it returns a host value.
// - Host-compilable.
#pragma once

#include <cstdint>

namespace proplab::kernels {

// out[v] (+)= Σ_{b < blocks} partials[b * values + v] for v < values, each in block order (device pointers).
// With accumulate the sums are added to out, otherwise out is overwritten.
void sum_partials(const double* partials, std::int64_t blocks, int values, double* out, bool accumulate);

// Σ x_i·y_i (y null: Σ x_i²) over n floats, in double, deterministic; result written to the device double `out`
// (overwritten, or added to with accumulate).
void dot_device(const float* x, const float* y, std::int64_t n, double* out, bool accumulate);
// The same, returned to the host (waits for the GPU).
double dot(const float* x, const float* y, std::int64_t n);

// column_sum: out[c] (+)= Σ_r x[r * cols + c] over rows, float output, accumulated in double in row-chunk order
// (rows split in fixed chunks of kColumnChunk, chunks combined in order). accumulate adds into out.
constexpr std::int64_t kColumnChunk = 256;
void column_sum(const float* x, std::int64_t rows, std::int64_t cols, float* out, bool accumulate);

}  // namespace proplab::kernels
