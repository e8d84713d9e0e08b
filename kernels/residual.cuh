// kernels/residual: the CUDA side of the residual combine op (proplab::ops::residual_forward/backward in
// src/ops/ops.h, whose CPU implementation is the reference): y = lambda * x + beta * f over n floats.
//
// Invariants:
// - x, f, y, d_y, d_x, d_f are device pointers to n contiguous floats; any alignment is accepted (float4 paths
//   are taken only when every pointer used is 16-byte aligned).
// - Gradient rule as in ops.h: d_x = lambda*d_y and d_f = beta*d_y OVERWRITE (each skipped when null; d_x may
//   alias d_y); d_lambda += Σ d_y·x and d_beta += Σ d_y·f ACCUMULATE into HOST doubles (each skipped when null).
// - The sums are computed on the device in double with a fixed-order block reduction (no atomics) whose
//   geometry depends only on n, so repeated calls give bitwise identical results. Products d_y·x are formed in
//   double (exact), so only the summation order differs from the CPU reference.
// - Forward rounds as lambda*x and beta*f separately, then adds (no fused multiply-add), matching plain C++.
// - All work is enqueued on `stream`, which must be context().stream (kernels/context.cuh): the per-block partial
//   sums live in a Scratch from the caching pool, whose reuse is ordered by that stream; backward synchronises `stream`
//   only when d_lambda or d_beta is requested (the host needs the sums). Every call and launch is checked
//   (kernels/common.cuh).
// - Host-compilable: the ops dispatch (src/ops/residual.cpp) includes this header.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace proplab::kernels {

// y = lambda * x + beta * f (y overwritten; y may alias x or f).
void residual_forward(const float* x, const float* f, float lambda, float beta, float* y, std::int64_t n,
                      cudaStream_t stream);

// d_x = lambda*d_y, d_f = beta*d_y (device, overwrite, each skipped when null); *d_lambda += Σ d_y·x,
// *d_beta += Σ d_y·f (host, accumulate, each skipped when null). x may be null when d_lambda is, f when d_beta is.
void residual_backward(const float* x, const float* f, const float* d_y, float lambda, float beta, float* d_x,
                       float* d_f, double* d_lambda, double* d_beta, std::int64_t n, cudaStream_t stream);

}  // namespace proplab::kernels
