#include "kernels/weight_standardization.cuh"

#include <cuda_runtime.h>

#include <limits>

#include "core/error.h"
#include "kernels/block_reduce.cuh"
#include "kernels/common.cuh"
#include "kernels/context.cuh"

namespace proplab::kernels {
namespace {

// Block o standardises row o: μ = Σ w / n, Σ (w − μ)², r = 1/sqrt(Σ + eps), w_hat = (w − m)·(r·scale·gain).
__global__ void __launch_bounds__(kBlockThreads)
    standardize_forward_kernel(const float* weight, const float* gain, float scale, float eps, float* w_hat,
                               float* mean, float* rstd, std::int64_t fan_in) {
  __shared__ double shared[kBlockThreads];
  const std::int64_t o = blockIdx.x;
  const float* row = weight + o * fan_in;
  double sum = 0.0;
  for (std::int64_t j = threadIdx.x; j < fan_in; j += blockDim.x) sum = __dadd_rn(sum, static_cast<double>(row[j]));
  const double row_mean = __ddiv_rn(block_sum_double(sum, shared), static_cast<double>(fan_in));
  double sum_sq = 0.0;
  for (std::int64_t j = threadIdx.x; j < fan_in; j += blockDim.x) {
    const double centred = __dsub_rn(static_cast<double>(row[j]), row_mean);
    sum_sq = __dadd_rn(sum_sq, __dmul_rn(centred, centred));
  }
  const double total_sq = block_sum_double(sum_sq, shared);
  const float r = static_cast<float>(__ddiv_rn(1.0, __dsqrt_rn(__dadd_rn(total_sq, static_cast<double>(eps)))));
  const float m = static_cast<float>(row_mean);
  if (threadIdx.x == 0) {
    mean[o] = m;
    rstd[o] = r;
  }
  const float a = __fmul_rn(__fmul_rn(r, scale), gain != nullptr ? gain[o] : 1.0f);
  float* out = w_hat + o * fan_in;
  for (std::int64_t j = threadIdx.x; j < fan_in; j += blockDim.x) out[j] = __fmul_rn(__fsub_rn(row[j], m), a);
}

// Block o: Σ d, Σ d·x̂ over row o; d_gain[o] += scale·Σ d·x̂; d_w += r·(a·d − mean_g − x̂·sum_g_xhat).
__global__ void __launch_bounds__(kBlockThreads)
    standardize_backward_kernel(const float* weight, const float* gain, float scale, const float* mean,
                                const float* rstd, const float* d_w_hat, float* d_weight, float* d_gain,
                                std::int64_t fan_in) {
  __shared__ double shared[kBlockThreads];
  const std::int64_t o = blockIdx.x;
  const float m = mean[o], r = rstd[o];
  const float a = __fmul_rn(scale, gain != nullptr ? gain[o] : 1.0f);
  const float* row = weight + o * fan_in;
  const float* d_row = d_w_hat + o * fan_in;
  double sum_d = 0.0, sum_d_xhat = 0.0;
  for (std::int64_t j = threadIdx.x; j < fan_in; j += blockDim.x) {
    const double d = d_row[j];
    sum_d = __dadd_rn(sum_d, d);
    sum_d_xhat = __dadd_rn(sum_d_xhat, __dmul_rn(d, static_cast<double>(__fmul_rn(__fsub_rn(row[j], m), r))));
  }
  const double total_d = block_sum_double(sum_d, shared);
  const double total_d_xhat = block_sum_double(sum_d_xhat, shared);
  if (threadIdx.x == 0 && d_gain != nullptr)
    d_gain[o] = __fadd_rn(d_gain[o], static_cast<float>(__dmul_rn(static_cast<double>(scale), total_d_xhat)));
  const float mean_g =
      static_cast<float>(__ddiv_rn(__dmul_rn(static_cast<double>(a), total_d), static_cast<double>(fan_in)));
  const float sum_g_xhat = static_cast<float>(__dmul_rn(static_cast<double>(a), total_d_xhat));
  float* d_w = d_weight + o * fan_in;
  for (std::int64_t j = threadIdx.x; j < fan_in; j += blockDim.x) {
    const float xhat_term = __fmul_rn(__fmul_rn(__fsub_rn(row[j], m), r), sum_g_xhat);
    const float step = __fmul_rn(r, __fsub_rn(__fsub_rn(__fmul_rn(a, d_row[j]), mean_g), xhat_term));
    d_w[j] = __fadd_rn(d_w[j], step);
  }
}

}  // namespace

void weight_standardize_forward(const float* weight, const float* gain, float scale, float eps, float* w_hat,
                                float* mean, float* rstd, std::int64_t rows, std::int64_t fan_in) {
  PROPLAB_CHECK(rows >= 0 && fan_in >= 1, "weight_standardize_forward: bad shape ", rows, " x ", fan_in);
  PROPLAB_CHECK(rows <= std::numeric_limits<int>::max(), "weight_standardize_forward: too many rows ", rows);
  if (rows == 0) return;
  standardize_forward_kernel<<<static_cast<unsigned>(rows), kBlockThreads, 0, context().stream>>>(
      weight, gain, scale, eps, w_hat, mean, rstd, fan_in);
  PROPLAB_CUDA_CHECK_LAUNCH("standardize_forward_kernel");
}

void weight_standardize_backward(const float* weight, const float* gain, float scale, const float* mean,
                                 const float* rstd, const float* d_w_hat, float* d_weight, float* d_gain,
                                 std::int64_t rows, std::int64_t fan_in) {
  PROPLAB_CHECK(rows >= 0 && fan_in >= 1, "weight_standardize_backward: bad shape ", rows, " x ", fan_in);
  PROPLAB_CHECK(rows <= std::numeric_limits<int>::max(), "weight_standardize_backward: too many rows ", rows);
  if (rows == 0) return;
  standardize_backward_kernel<<<static_cast<unsigned>(rows), kBlockThreads, 0, context().stream>>>(
      weight, gain, scale, mean, rstd, d_w_hat, d_weight, d_gain, fan_in);
  PROPLAB_CUDA_CHECK_LAUNCH("standardize_backward_kernel");
}

}  // namespace proplab::kernels
