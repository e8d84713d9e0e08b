#include "kernels/residual.cuh"

#include <cuda_runtime.h>

#include <optional>

#include "core/error.h"
#include "kernels/common.cuh"
#include "kernels/context.cuh"

namespace proplab::kernels {
namespace {

// ==== kernels =====================================================================================================
//
// Work is split into quads (4 consecutive elements) visited grid-stride, plus a tail of n % 4 elements handled by
// the first threads. Quads are loaded as float4 when every pointer is 16-byte aligned (kVectorised) and element by
// element otherwise; both paths visit elements in the same order, so the sums are bitwise the same either way.

template <bool kVectorised>
__device__ __forceinline__ float4 load_quad(const float* data, std::int64_t quad) {
  if constexpr (kVectorised) {
    return reinterpret_cast<const float4*>(data)[quad];
  } else {
    const float* p = data + 4 * quad;
    return make_float4(p[0], p[1], p[2], p[3]);
  }
}

template <bool kVectorised>
__device__ __forceinline__ void store_quad(float* data, std::int64_t quad, float4 value) {
  if constexpr (kVectorised) {
    reinterpret_cast<float4*>(data)[quad] = value;
  } else {
    float* p = data + 4 * quad;
    p[0] = value.x;
    p[1] = value.y;
    p[2] = value.z;
    p[3] = value.w;
  }
}

// Explicit rounding: no fused multiply-add, so the result matches the plain C++ expression on the CPU.
__device__ __forceinline__ float combine(float lambda, float x, float beta, float f) {
  return __fadd_rn(__fmul_rn(lambda, x), __fmul_rn(beta, f));
}

// Fixed-order tree sum of one pair of doubles per thread over the block; the block total lands in every thread.
// Needs blockDim.x == kBlockThreads (a power of two).
__device__ void block_sum_pair(double& first, double& second) {
  __shared__ double shared_first[kBlockThreads];
  __shared__ double shared_second[kBlockThreads];
  const int t = threadIdx.x;
  shared_first[t] = first;
  shared_second[t] = second;
  __syncthreads();
  for (int stride = kBlockThreads / 2; stride > 0; stride >>= 1) {
    if (t < stride) {
      shared_first[t] += shared_first[t + stride];
      shared_second[t] += shared_second[t + stride];
    }
    __syncthreads();
  }
  first = shared_first[0];
  second = shared_second[0];
}

// y = lambda*x + beta*f. y may alias x or f (each element is read before it is written, by the same thread).
template <bool kVectorised>
__global__ void __launch_bounds__(kBlockThreads)
    residual_forward_kernel(const float* x, const float* f, float lambda, float beta, float* y, std::int64_t n) {
  const std::int64_t quads = n / 4;
  const std::int64_t thread = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t q = thread; q < quads; q += stride) {
    const float4 xq = load_quad<kVectorised>(x, q);
    const float4 fq = load_quad<kVectorised>(f, q);
    store_quad<kVectorised>(y, q,
                            make_float4(combine(lambda, xq.x, beta, fq.x), combine(lambda, xq.y, beta, fq.y),
                                        combine(lambda, xq.z, beta, fq.z), combine(lambda, xq.w, beta, fq.w)));
  }
  const std::int64_t i = 4 * quads + thread;
  if (i < n) y[i] = combine(lambda, x[i], beta, f[i]);
}

// d_x = lambda*d_y, d_f = beta*d_y (each skipped when null; d_x may alias d_y: d_y is read first). When block_sums
// is given, block b writes its partial Σ d_y·x to block_sums[2b] (when sum_lambda) and Σ d_y·f to
// block_sums[2b+1] (when sum_beta), each summed in double in a fixed order.
template <bool kVectorised>
__global__ void __launch_bounds__(kBlockThreads)
    residual_backward_kernel(const float* x, const float* f, const float* d_y, float lambda, float beta, float* d_x,
                             float* d_f, bool sum_lambda, bool sum_beta, double* block_sums, std::int64_t n) {
  const std::int64_t quads = n / 4;
  const std::int64_t thread = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  double partial_lambda = 0.0;
  double partial_beta = 0.0;
  for (std::int64_t q = thread; q < quads; q += stride) {
    const float4 dyq = load_quad<kVectorised>(d_y, q);
    if (sum_lambda) {
      const float4 xq = load_quad<kVectorised>(x, q);
      partial_lambda += static_cast<double>(dyq.x) * xq.x;
      partial_lambda += static_cast<double>(dyq.y) * xq.y;
      partial_lambda += static_cast<double>(dyq.z) * xq.z;
      partial_lambda += static_cast<double>(dyq.w) * xq.w;
    }
    if (sum_beta) {
      const float4 fq = load_quad<kVectorised>(f, q);
      partial_beta += static_cast<double>(dyq.x) * fq.x;
      partial_beta += static_cast<double>(dyq.y) * fq.y;
      partial_beta += static_cast<double>(dyq.z) * fq.z;
      partial_beta += static_cast<double>(dyq.w) * fq.w;
    }
    if (d_x != nullptr)
      store_quad<kVectorised>(d_x, q, make_float4(lambda * dyq.x, lambda * dyq.y, lambda * dyq.z, lambda * dyq.w));
    if (d_f != nullptr)
      store_quad<kVectorised>(d_f, q, make_float4(beta * dyq.x, beta * dyq.y, beta * dyq.z, beta * dyq.w));
  }
  const std::int64_t i = 4 * quads + thread;
  if (i < n) {
    const float dy = d_y[i];
    if (sum_lambda) partial_lambda += static_cast<double>(dy) * x[i];
    if (sum_beta) partial_beta += static_cast<double>(dy) * f[i];
    if (d_x != nullptr) d_x[i] = lambda * dy;
    if (d_f != nullptr) d_f[i] = beta * dy;
  }
  if (block_sums == nullptr) return;  // uniform over the grid: no thread skips the block reduction alone
  block_sum_pair(partial_lambda, partial_beta);
  if (threadIdx.x == 0) {
    block_sums[2 * blockIdx.x] = partial_lambda;
    block_sums[2 * blockIdx.x + 1] = partial_beta;
  }
}

// totals[0] = Σ_b block_sums[2b], totals[1] = Σ_b block_sums[2b+1], in a fixed order. One block of kBlockThreads.
__global__ void __launch_bounds__(kBlockThreads)
    residual_sum_blocks_kernel(const double* block_sums, unsigned blocks, double* totals) {
  double total_lambda = 0.0;
  double total_beta = 0.0;
  for (unsigned b = threadIdx.x; b < blocks; b += kBlockThreads) {
    total_lambda += block_sums[2 * b];
    total_beta += block_sums[2 * b + 1];
  }
  block_sum_pair(total_lambda, total_beta);
  if (threadIdx.x == 0) {
    totals[0] = total_lambda;
    totals[1] = total_beta;
  }
}

// ==== launchers ===================================================================================================

// Grid of the residual kernels: a function of n only (see kernels/common.cuh), whichever path is taken.
unsigned residual_grid(std::int64_t n) { return grid_blocks(n / 4 > 0 ? n / 4 : 1); }

}  // namespace

void residual_forward(const float* x, const float* f, float lambda, float beta, float* y, std::int64_t n,
                      cudaStream_t stream) {
  PROPLAB_CHECK(n >= 0, "residual_forward: negative size ", n);
  if (n == 0) return;
  PROPLAB_CHECK(x != nullptr && f != nullptr && y != nullptr, "residual_forward: null x, f or y");
  const unsigned blocks = residual_grid(n);
  if (is_aligned(x, 16) && is_aligned(f, 16) && is_aligned(y, 16)) {
    residual_forward_kernel<true><<<blocks, kBlockThreads, 0, stream>>>(x, f, lambda, beta, y, n);
    PROPLAB_CUDA_CHECK_LAUNCH("residual_forward_kernel<vectorised>");
  } else {
    residual_forward_kernel<false><<<blocks, kBlockThreads, 0, stream>>>(x, f, lambda, beta, y, n);
    PROPLAB_CUDA_CHECK_LAUNCH("residual_forward_kernel<scalar>");
  }
}

void residual_backward(const float* x, const float* f, const float* d_y, float lambda, float beta, float* d_x,
                       float* d_f, double* d_lambda, double* d_beta, std::int64_t n, cudaStream_t stream) {
  PROPLAB_CHECK(n >= 0, "residual_backward: negative size ", n);
  const bool sum_lambda = d_lambda != nullptr;
  const bool sum_beta = d_beta != nullptr;
  if (n == 0 || (!sum_lambda && !sum_beta && d_x == nullptr && d_f == nullptr)) return;
  PROPLAB_CHECK(d_y != nullptr, "residual_backward: null d_y");
  PROPLAB_CHECK(!sum_lambda || x != nullptr, "residual_backward: d_lambda requested but x is null");
  PROPLAB_CHECK(!sum_beta || f != nullptr, "residual_backward: d_beta requested but f is null");

  const bool vectorised = is_aligned(d_y, 16) && is_aligned(d_x, 16) && is_aligned(d_f, 16) &&
                          (!sum_lambda || is_aligned(x, 16)) && (!sum_beta || is_aligned(f, 16));
  const unsigned blocks = residual_grid(n);
  const bool reduce = sum_lambda || sum_beta;

  // Layout of the scratch: [2 * blocks] per-block partial pairs, then the two totals.
  // From the caching pool (kernels/context.cuh), only when the sums are wanted.
  std::optional<Scratch> scratch;
  if (reduce) scratch.emplace((2 * static_cast<std::size_t>(blocks) + 2) * sizeof(double));
  double* block_sums = reduce ? scratch->as<double>() : nullptr;
  if (vectorised) {
    residual_backward_kernel<true>
        <<<blocks, kBlockThreads, 0, stream>>>(x, f, d_y, lambda, beta, d_x, d_f, sum_lambda, sum_beta, block_sums, n);
    PROPLAB_CUDA_CHECK_LAUNCH("residual_backward_kernel<vectorised>");
  } else {
    residual_backward_kernel<false>
        <<<blocks, kBlockThreads, 0, stream>>>(x, f, d_y, lambda, beta, d_x, d_f, sum_lambda, sum_beta, block_sums, n);
    PROPLAB_CUDA_CHECK_LAUNCH("residual_backward_kernel<scalar>");
  }
  if (!reduce) return;

  double* totals = block_sums + 2 * static_cast<std::size_t>(blocks);
  residual_sum_blocks_kernel<<<1, kBlockThreads, 0, stream>>>(block_sums, blocks, totals);
  PROPLAB_CUDA_CHECK_LAUNCH("residual_sum_blocks_kernel");
  double host_totals[2] = {0.0, 0.0};
  PROPLAB_CUDA_CHECK(cudaMemcpyAsync(host_totals, totals, sizeof(host_totals), cudaMemcpyDeviceToHost, stream));
  PROPLAB_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (sum_lambda) *d_lambda += host_totals[0];
  if (sum_beta) *d_beta += host_totals[1];
}

}  // namespace proplab::kernels
