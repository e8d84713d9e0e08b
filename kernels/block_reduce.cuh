// kernels/block_reduce: device-side building blocks for deterministic reductions (included by .cu files only).
//
// Invariants:
// - Every sum here is a fixed-order tree over the block's threads (a power-of-two block, kBlockThreads unless a
//   template argument says otherwise): the same inputs give the same bits on every run and every GPU.
// - No floating-point atomics anywhere in kernels/: a sum across blocks is written as one partial per block and
//   combined in block order by a second launch (sum_partials in kernels/reduce.cuh).
#pragma once

#include <cuda_runtime.h>

#include "kernels/common.cuh"

namespace proplab::kernels {

// Sums `values[0..N)` of every thread over the block (fixed tree); thread 0 gets the totals, other threads get
// unspecified values. `shared` holds N * kThreads doubles. Ends with __syncthreads (shared may be reused).
template <int N, int kThreads = kBlockThreads>
__device__ void block_sum(double (&values)[N], double* shared) {
  const int t = threadIdx.x;
#pragma unroll
  for (int k = 0; k < N; ++k) shared[k * kThreads + t] = values[k];
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride >>= 1) {
    if (t < stride) {
#pragma unroll
      for (int k = 0; k < N; ++k) shared[k * kThreads + t] += shared[k * kThreads + t + stride];
    }
    __syncthreads();
  }
  if (t == 0) {
#pragma unroll
    for (int k = 0; k < N; ++k) values[k] = shared[k * kThreads];
  }
  __syncthreads();
}

// The block's total of one value, in every thread (fixed tree). `shared` holds kThreads values.
template <typename T, int kThreads = kBlockThreads>
__device__ T block_total(T value, T* shared) {
  const int t = threadIdx.x;
  shared[t] = value;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride >>= 1) {
    if (t < stride) shared[t] += shared[t + stride];
    __syncthreads();
  }
  const T total = shared[0];
  __syncthreads();
  return total;
}

template <int kThreads = kBlockThreads>
__device__ float block_sum_float(float value, float* shared) {
  return block_total<float, kThreads>(value, shared);
}

template <int kThreads = kBlockThreads>
__device__ double block_sum_double(double value, double* shared) {
  return block_total<double, kThreads>(value, shared);
}

// The block's maximum of one float, in every thread. NaN-propagating: NaN when any thread holds NaN.
template <int kThreads = kBlockThreads>
__device__ float block_max_float(float value, float* shared) {
  const int t = threadIdx.x;
  shared[t] = value;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride >>= 1) {
    if (t < stride) {
      const float a = shared[t], b = shared[t + stride];
      shared[t] = (a != a || b != b) ? __int_as_float(0x7fc00000) : fmaxf(a, b);
    }
    __syncthreads();
  }
  const float total = shared[0];
  __syncthreads();
  return total;
}

}  // namespace proplab::kernels
