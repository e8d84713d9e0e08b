// kernels/elementwise: the CUDA side of axpy, scale and zero (ops::axpy, ops::scale, ops::zero in src/ops/ops.h;
// src/ops/elementwise.cpp is the reference) — host launchers. ops::dot and ops::sum_squares use kernels/reduce.cuh.
//
// Invariants:
// - Pointers are device pointers to n contiguous floats; n == 0 does nothing.
// - axpy computes y[i] + alpha · x[i] per element as the CPU loop does (the compilers may fuse the multiply-add on
//   either side); scale multiplies each element once; zero writes +0.0f everywhere (all bits clear).
// - Grid-stride kernels whose grid depends on n only. Enqueued on context().stream; nothing synchronises.
// - Host-compilable.
#pragma once

#include <cstdint>

namespace proplab::kernels {

// y[i] += alpha · x[i]. x may alias y.
void axpy(float alpha, const float* x, float* y, std::int64_t n);

// x[i] *= alpha.
void scale(float* x, float alpha, std::int64_t n);

// x[i] = +0.0f.
void zero(float* x, std::int64_t n);

}  // namespace proplab::kernels
