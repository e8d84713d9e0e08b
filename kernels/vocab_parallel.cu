// kernels/vocab_parallel: the vocab-parallel cross-entropy pieces on the GPU (see kernels/vocab_parallel.cuh).
#include "kernels/vocab_parallel.cuh"

#include <cuda_runtime.h>

#include <math_constants.h>

#include "core/error.h"
#include "kernels/block_reduce.cuh"
#include "kernels/common.cuh"
#include "kernels/context.cuh"

namespace proplab::kernels {
namespace {

// std::max(a, b) as the CPU takes it: b only when a < b, so a NaN b never wins.
__device__ __forceinline__ float cpu_max(float a, float b) { return a < b ? b : a; }

// One block per row: row_max[r] = the row's maximum, folded from −inf with cpu_max (fixed tree).
__global__ void __launch_bounds__(kBlockThreads)
    shard_max_kernel(const float* logits, std::int64_t classes, double* row_max) {
  __shared__ float shared[kBlockThreads];
  const std::int64_t r = blockIdx.x;
  const float* row = logits + r * classes;
  float m = -CUDART_INF_F;
  for (std::int64_t j = threadIdx.x; j < classes; j += kBlockThreads) m = cpu_max(m, row[j]);
  const int t = threadIdx.x;
  shared[t] = m;
  __syncthreads();
  for (int half = kBlockThreads / 2; half > 0; half >>= 1) {
    if (t < half) shared[t] = cpu_max(shared[t], shared[t + half]);
    __syncthreads();
  }
  if (t == 0) row_max[r] = shared[0];
}

// One block per row: sums[2r] = Σ_j exp(l_j − m) (exp in float, summed in double), sums[2r + 1] = the target logit.
__global__ void __launch_bounds__(kBlockThreads)
    shard_sums_kernel(const float* logits, const double* row_max, const std::int32_t* targets, std::int64_t classes,
                      std::int64_t first, double* sums) {
  __shared__ double shared[kBlockThreads];
  const std::int64_t r = blockIdx.x;
  const float* row = logits + r * classes;
  const float m = static_cast<float>(row_max[r]);
  double local = 0.0;
  for (std::int64_t j = threadIdx.x; j < classes; j += kBlockThreads) local += expf(__fsub_rn(row[j], m));
  const double total = block_sum_double(local, shared);
  if (threadIdx.x == 0) {
    const std::int64_t column = static_cast<std::int64_t>(targets[r]) - first;
    sums[2 * r] = total;
    sums[2 * r + 1] = column >= 0 && column < classes ? static_cast<double>(row[column]) : 0.0;
  }
}

// One block per row: d[r, j] = coef · exp(l_j − m), then the target's column (when in this shard) minus
// float(grad_coef), each rounded as on the CPU.
__global__ void __launch_bounds__(kBlockThreads)
    shard_grad_kernel(const float* logits, const double* row_max, const double* sums, const std::int32_t* targets,
                      std::int64_t classes, std::int64_t first, double grad_coef, float* d_logits) {
  const std::int64_t r = blockIdx.x;
  const float* row = logits + r * classes;
  float* d_row = d_logits + r * classes;
  const float m = static_cast<float>(row_max[r]);
  const float coef = static_cast<float>(grad_coef / sums[2 * r]);
  const float target_coef = static_cast<float>(grad_coef);
  const std::int64_t column = static_cast<std::int64_t>(targets[r]) - first;
  for (std::int64_t j = threadIdx.x; j < classes; j += kBlockThreads) {
    float d = __fmul_rn(coef, expf(__fsub_rn(row[j], m)));
    if (j == column) d = __fsub_rn(d, target_coef);
    d_row[j] = d;
  }
}

unsigned row_grid(std::int64_t rows, const char* op) {
  PROPLAB_CHECK(rows <= 0x7fffffff, op, ": ", rows, " rows exceed one grid");
  return static_cast<unsigned>(rows);
}

}  // namespace

void cross_entropy_shard_max(const float* logits, std::int64_t rows, std::int64_t classes, double* row_max) {
  if (rows == 0) return;
  PROPLAB_CHECK(classes > 0, "cross_entropy_shard_max: no classes");
  shard_max_kernel<<<row_grid(rows, "cross_entropy_shard_max"), kBlockThreads, 0, context().stream>>>(logits, classes,
                                                                                                      row_max);
  PROPLAB_CUDA_CHECK_LAUNCH("shard_max_kernel");
}

void cross_entropy_shard_sums(const float* logits, const double* row_max, const std::int32_t* targets,
                              std::int64_t rows, std::int64_t classes, std::int64_t first, double* sums) {
  if (rows == 0) return;
  PROPLAB_CHECK(classes > 0, "cross_entropy_shard_sums: no classes");
  shard_sums_kernel<<<row_grid(rows, "cross_entropy_shard_sums"), kBlockThreads, 0, context().stream>>>(
      logits, row_max, targets, classes, first, sums);
  PROPLAB_CUDA_CHECK_LAUNCH("shard_sums_kernel");
}

void cross_entropy_shard_grad(const float* logits, const double* row_max, const double* sums,
                              const std::int32_t* targets, std::int64_t rows, std::int64_t classes, std::int64_t first,
                              double grad_coef, float* d_logits) {
  if (rows == 0) return;
  PROPLAB_CHECK(classes > 0, "cross_entropy_shard_finish: no classes");
  shard_grad_kernel<<<row_grid(rows, "cross_entropy_shard_finish"), kBlockThreads, 0, context().stream>>>(
      logits, row_max, sums, targets, classes, first, grad_coef, d_logits);
  PROPLAB_CUDA_CHECK_LAUNCH("shard_grad_kernel");
}

}  // namespace proplab::kernels
