// kernels/dropout: the dropout mask kernel (see kernels/dropout.cuh for the contract and invariants).
//
// One grid-stride kernel, grid a function of n only. Each element draws its own uniform from (seed, stream, i)
// through core/philox.h's host/device functions, so the mask does not depend on the launch geometry either.
#include "kernels/dropout.cuh"

#include <cuda_runtime.h>

#include "core/error.h"
#include "core/philox.h"
#include "kernels/common.cuh"
#include "kernels/context.cuh"

namespace proplab::kernels {
namespace {

// out[i] = dropped ? +0 : in[i] * keep_scale. The product is one explicitly rounded multiply (__fmul_rn), never
// fused with anything, as the CPU's `in[i] * keep_scale`. in and out may alias (same thread reads, then writes).
__global__ void __launch_bounds__(kBlockThreads)
    dropout_kernel(const float* in, float p, float keep_scale, std::uint64_t seed, std::uint64_t stream, std::int64_t n,
                   float* out) {
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const float u = philox_uniform(seed, stream, static_cast<std::uint64_t>(i));
    out[i] = u < p ? 0.0f : __fmul_rn(in[i], keep_scale);
  }
}

}  // namespace

void dropout_apply(const float* in, float p, std::uint64_t seed, std::uint64_t stream, std::int64_t n, float* out) {
  PROPLAB_CHECK(n >= 0, "dropout: negative size ", n);
  PROPLAB_CHECK(p >= 0.0f && p < 1.0f, "dropout: rate must be in [0, 1), got ", p);
  if (n == 0) return;
  PROPLAB_CHECK(in != nullptr && out != nullptr, "dropout: null input or output");
  if (p == 0.0f) {
    if (out != in)
      PROPLAB_CUDA_CHECK(cudaMemcpyAsync(out, in, sizeof(float) * static_cast<std::size_t>(n), cudaMemcpyDeviceToDevice,
                                         context().stream));
    return;
  }
  // The CPU's keep scale, the same float operations on the host.
  const float keep_scale = 1.0f / (1.0f - p);
  dropout_kernel<<<grid_blocks(n), kBlockThreads, 0, context().stream>>>(in, p, keep_scale, seed, stream, n, out);
  PROPLAB_CUDA_CHECK_LAUNCH("dropout_kernel");
}

}  // namespace proplab::kernels
