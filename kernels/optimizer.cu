#include "kernels/optimizer.cuh"

#include <cuda_runtime.h>

#include "core/error.h"
#include "kernels/block_reduce.cuh"
#include "kernels/common.cuh"
#include "kernels/context.cuh"
#include "kernels/reduce.cuh"

namespace proplab::kernels {
namespace {

// One AdamW element, rounded as the C++ expressions of ops/optimizer.cpp read.
struct AdamWStep {
  AdamWCoefficients k;
  const float* grad;
  float* m;
  float* v;
  __device__ float operator()(std::int64_t i, float p) const {
    const float g = grad[i];
    const float m_i = __fadd_rn(__fmul_rn(k.beta1, m[i]), __fmul_rn(k.one_minus_beta1, g));
    const float v_i = __fadd_rn(__fmul_rn(k.beta2, v[i]), __fmul_rn(__fmul_rn(k.one_minus_beta2, g), g));
    m[i] = m_i;
    v[i] = v_i;
    const float denominator = __fadd_rn(__fmul_rn(__fsqrt_rn(v_i), k.inv_sqrt_bc2), k.eps);
    return __fsub_rn(__fmul_rn(p, k.decay), __fdiv_rn(__fmul_rn(k.step_size, m_i), denominator));
  }
};

// One SGD element without momentum: p − lr·(g + wd·p).
struct SgdPlainStep {
  const float* grad;
  float lr, weight_decay;
  __device__ float operator()(std::int64_t i, float p) const {
    return __fsub_rn(p, __fmul_rn(lr, __fadd_rn(grad[i], __fmul_rn(weight_decay, p))));
  }
};

// One SGD element with momentum (and optionally nesterov).
struct SgdMomentumStep {
  const float* grad;
  float* buf;
  float lr, momentum, weight_decay;
  bool nesterov;
  __device__ float operator()(std::int64_t i, float p) const {
    const float g_i = __fadd_rn(grad[i], __fmul_rn(weight_decay, p));
    const float buf_i = __fadd_rn(__fmul_rn(momentum, buf[i]), g_i);
    buf[i] = buf_i;
    const float direction = nesterov ? __fadd_rn(g_i, __fmul_rn(momentum, buf_i)) : buf_i;
    return __fsub_rn(p, __fmul_rn(lr, direction));
  }
};

// param[i] = step(i, param[i]) grid-stride. With kMeasure, block b writes Σ old² to partials[2b] and Σ (new − old)²
// to partials[2b + 1], in double (as the CPU forms them). Needs blockDim.x == kBlockThreads.
template <bool kMeasure, typename Step>
__global__ void __launch_bounds__(kBlockThreads)
    update_kernel(float* param, std::int64_t n, Step step, double* partials) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  double sums[2] = {0.0, 0.0};
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float old = param[i];
    const float updated = step(i, old);
    param[i] = updated;
    if constexpr (kMeasure) {
      const double before = old;
      const double delta = __dsub_rn(static_cast<double>(updated), before);
      sums[0] = __dadd_rn(sums[0], __dmul_rn(before, before));
      sums[1] = __dadd_rn(sums[1], __dmul_rn(delta, delta));
    }
  }
  if constexpr (kMeasure) {
    __shared__ double shared[2 * kBlockThreads];
    block_sum<2>(sums, shared);
    if (threadIdx.x == 0) {
      partials[2 * blockIdx.x] = sums[0];
      partials[2 * blockIdx.x + 1] = sums[1];
    }
  }
}

__global__ void scale_kernel(float* data, std::int64_t n, float factor) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    data[i] = __fmul_rn(data[i], factor);
}

// Runs one update over n elements, measured when sums is given (see the header's invariants).
template <typename Step>
void run_update(float* param, std::int64_t n, const Step& step, UpdateSums* sums) {
  if (n == 0) return;
  const unsigned blocks = grid_blocks(n);
  cudaStream_t stream = context().stream;
  if (sums == nullptr) {
    update_kernel<false><<<blocks, kBlockThreads, 0, stream>>>(param, n, step, nullptr);
    PROPLAB_CUDA_CHECK_LAUNCH("update_kernel<unmeasured>");
    return;
  }
  // Layout: [2 * blocks] per-block partials, then the two totals.
  Scratch scratch(sizeof(double) * (2 * static_cast<std::size_t>(blocks) + 2));
  double* partials = scratch.as<double>();
  double* totals = partials + 2 * static_cast<std::size_t>(blocks);
  update_kernel<true><<<blocks, kBlockThreads, 0, stream>>>(param, n, step, partials);
  PROPLAB_CUDA_CHECK_LAUNCH("update_kernel<measured>");
  sum_partials(partials, blocks, 2, totals, false);
  double host[2] = {0.0, 0.0};
  copy_to_host(host, totals, sizeof(host));
  sums->weight_sq += host[0];
  sums->update_sq += host[1];
}

}  // namespace

void adamw_update(float* param, const float* grad, float* m, float* v, std::int64_t n,
                  const AdamWCoefficients& coefficients, UpdateSums* sums) {
  PROPLAB_CHECK(n >= 0, "adamw_update: negative size ", n);
  if (n == 0) return;
  PROPLAB_CHECK(param && grad && m && v, "adamw_update: null param, grad, m or v");
  run_update(param, n, AdamWStep{coefficients, grad, m, v}, sums);
}

void sgd_update(float* param, const float* grad, float* momentum_buffer, std::int64_t n, float lr, float momentum,
                float weight_decay, bool nesterov, UpdateSums* sums) {
  PROPLAB_CHECK(n >= 0, "sgd_update: negative size ", n);
  if (n == 0) return;
  PROPLAB_CHECK(param && grad, "sgd_update: null param or grad");
  if (momentum == 0.0f) {
    run_update(param, n, SgdPlainStep{grad, lr, weight_decay}, sums);
    return;
  }
  PROPLAB_CHECK(momentum_buffer != nullptr, "sgd_update: momentum ", momentum, " without a momentum buffer");
  run_update(param, n, SgdMomentumStep{grad, momentum_buffer, lr, momentum, weight_decay, nesterov}, sums);
}

void scale(float* data, std::int64_t n, float factor) {
  PROPLAB_CHECK(n >= 0, "scale: negative size ", n);
  if (n == 0) return;
  scale_kernel<<<grid_blocks(n), kBlockThreads, 0, context().stream>>>(data, n, factor);
  PROPLAB_CUDA_CHECK_LAUNCH("scale_kernel");
}

}  // namespace proplab::kernels
