// kernels/elementwise: axpy, scale and zero (see kernels/elementwise.cuh for the contract and invariants).
#include "kernels/elementwise.cuh"

#include <cuda_runtime.h>

#include "core/error.h"
#include "kernels/common.cuh"
#include "kernels/context.cuh"

namespace proplab::kernels {
namespace {

// y[i] += alpha * x[i]; x may alias y (each element read, then written, by one thread).
__global__ void __launch_bounds__(kBlockThreads) axpy_kernel(float alpha, const float* x, float* y, std::int64_t n) {
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step)
    y[i] += alpha * x[i];
}

// x[i] *= alpha.
__global__ void __launch_bounds__(kBlockThreads) scale_kernel(float* x, float alpha, std::int64_t n) {
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step)
    x[i] *= alpha;
}

}  // namespace

void axpy(float alpha, const float* x, float* y, std::int64_t n) {
  PROPLAB_CHECK(n >= 0, "axpy: negative size ", n);
  if (n == 0) return;
  PROPLAB_CHECK(x != nullptr && y != nullptr, "axpy: null x or y");
  axpy_kernel<<<grid_blocks(n), kBlockThreads, 0, context().stream>>>(alpha, x, y, n);
  PROPLAB_CUDA_CHECK_LAUNCH("axpy_kernel");
}

void scale(float* x, float alpha, std::int64_t n) {
  PROPLAB_CHECK(n >= 0, "scale: negative size ", n);
  if (n == 0) return;
  PROPLAB_CHECK(x != nullptr, "scale: null x");
  scale_kernel<<<grid_blocks(n), kBlockThreads, 0, context().stream>>>(x, alpha, n);
  PROPLAB_CUDA_CHECK_LAUNCH("scale_kernel");
}

void zero(float* x, std::int64_t n) {
  PROPLAB_CHECK(n >= 0, "zero: negative size ", n);
  if (n == 0) return;
  PROPLAB_CHECK(x != nullptr, "zero: null x");
  PROPLAB_CUDA_CHECK(cudaMemsetAsync(x, 0, sizeof(float) * static_cast<std::size_t>(n), context().stream));
}

}  // namespace proplab::kernels
