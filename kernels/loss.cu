// kernels/loss: softmax cross-entropy and squared error on the GPU (see kernels/loss.cuh for the contract).
//
// Cross-entropy: one block per row takes the row maximum (float, fixed tree), Σ exp(l − max) (exp in float, summed
// in double, fixed tree), writes the row's loss and, when asked, the row's gradient. Squared error: one thread per
// chunk of the CPU's chunking sums (pred − target)² in double in index order; the gradient is elementwise.
#include "kernels/loss.cuh"

#include <cuda_runtime.h>

#include <math_constants.h>

#include "core/error.h"
#include "kernels/block_reduce.cuh"
#include "kernels/common.cuh"
#include "kernels/context.cuh"
#include "kernels/reduce.cuh"

namespace proplab::kernels {
namespace {

// chunk_sums[c] = Σ values[c·chunk, min(n, (c+1)·chunk)) in index order, one thread per chunk.
__global__ void chunk_sums_kernel(const double* values, std::int64_t n, std::int64_t chunk, std::int64_t chunks,
                                  double* chunk_sums) {
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= chunks) return;
  const std::int64_t begin = c * chunk;
  const std::int64_t end = begin + chunk < n ? begin + chunk : n;
  double sum = 0.0;
  for (std::int64_t i = begin; i < end; ++i) sum += values[i];
  chunk_sums[c] = sum;
}

// One block per row r. row_loss[r] = log(Σ_j exp(l_j − max)) + max − l_target in double, as cross_entropy_row on
// the CPU; d_row (when given) = float(grad_coef / Σ) · exp(l_j − max), minus float(grad_coef) at the target.
__global__ void __launch_bounds__(kBlockThreads)
    cross_entropy_row_kernel(const float* logits, const std::int32_t* targets, std::int64_t classes, float* d_logits,
                             double grad_coef, double* row_loss) {
  __shared__ float shared_float[kBlockThreads];
  __shared__ double shared_double[kBlockThreads];
  const std::int64_t r = blockIdx.x;
  const float* row = logits + r * classes;
  const std::int64_t target = targets[r];
  const float target_logit = row[target];  // read by every thread before the barrier below, so d_row may alias row

  float local_max = -CUDART_INF_F;
  for (std::int64_t j = threadIdx.x; j < classes; j += kBlockThreads) local_max = fmaxf(local_max, row[j]);
  const float row_max = block_max_float(local_max, shared_float);

  double local_sum = 0.0;
  for (std::int64_t j = threadIdx.x; j < classes; j += kBlockThreads) local_sum += expf(row[j] - row_max);
  const double sum = block_sum_double(local_sum, shared_double);

  if (d_logits != nullptr) {
    float* d_row = d_logits + r * classes;
    const float coef = static_cast<float>(grad_coef / sum);
    const float target_coef = static_cast<float>(grad_coef);
    for (std::int64_t j = threadIdx.x; j < classes; j += kBlockThreads) {
      float d = __fmul_rn(expf(row[j] - row_max), coef);
      if (j == target) d = __fsub_rn(d, target_coef);  // stored, then decremented, as on the CPU
      d_row[j] = d;
    }
  }
  if (threadIdx.x == 0) row_loss[r] = log(sum) + static_cast<double>(row_max) - static_cast<double>(target_logit);
}

// d_pred[i] = grad_coef · (pred[i] − target[i]) (float, as the CPU; d_pred may alias pred or target).
__global__ void __launch_bounds__(kBlockThreads)
    squared_error_grad_kernel(const float* pred, const float* target, std::int64_t n, float grad_coef, float* d_pred) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    d_pred[i] = __fmul_rn(grad_coef, __fsub_rn(pred[i], target[i]));
}

// chunk_sums[c] = Σ (pred − target)² over chunk c in index order, in double (no fused multiply-add, as the CPU).
__global__ void squared_error_chunks_kernel(const float* pred, const float* target, std::int64_t n, std::int64_t chunks,
                                            double* chunk_sums) {
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= chunks) return;
  const std::int64_t begin = c * kSquaredErrorChunk;
  const std::int64_t end = begin + kSquaredErrorChunk < n ? begin + kSquaredErrorChunk : n;
  double sum = 0.0;
  for (std::int64_t i = begin; i < end; ++i) {
    const double diff = static_cast<double>(pred[i]) - static_cast<double>(target[i]);
    sum = __dadd_rn(sum, __dmul_rn(diff, diff));
  }
  chunk_sums[c] = sum;
}

constexpr int kChunkThreads = 128;

unsigned chunk_blocks(std::int64_t chunks) {
  return static_cast<unsigned>((chunks + kChunkThreads - 1) / kChunkThreads);
}

}  // namespace

void chunked_sum(const double* values, std::int64_t n, std::int64_t chunk, double* out) {
  PROPLAB_CHECK(n >= 0 && chunk > 0, "chunked_sum: bad sizes n=", n, " chunk=", chunk);
  const cudaStream_t stream = context().stream;
  if (n == 0) {
    PROPLAB_CUDA_CHECK(cudaMemsetAsync(out, 0, sizeof(double), stream));
    return;
  }
  const std::int64_t chunks = (n + chunk - 1) / chunk;
  Scratch chunk_sums(sizeof(double) * static_cast<std::size_t>(chunks));
  chunk_sums_kernel<<<chunk_blocks(chunks), kChunkThreads, 0, stream>>>(values, n, chunk, chunks,
                                                                        chunk_sums.as<double>());
  PROPLAB_CUDA_CHECK_LAUNCH("chunk_sums_kernel");
  sum_partials(chunk_sums.as<double>(), chunks, 1, out, false);
}

double softmax_cross_entropy_sum(const float* logits, const std::int32_t* targets, std::int64_t rows,
                                 std::int64_t classes, float* d_logits, double grad_coef) {
  PROPLAB_CHECK(rows > 0 && classes > 0, "softmax_cross_entropy: empty logits [", rows, ", ", classes, "]");
  PROPLAB_CHECK(rows <= 0x7fffffff, "softmax_cross_entropy: ", rows, " rows exceed one grid");
  const cudaStream_t stream = context().stream;
  // [rows] per-row losses, then the total.
  Scratch scratch(sizeof(double) * static_cast<std::size_t>(rows + 1));
  double* row_loss = scratch.as<double>();
  double* total = row_loss + rows;
  cross_entropy_row_kernel<<<static_cast<unsigned>(rows), kBlockThreads, 0, stream>>>(logits, targets, classes,
                                                                                      d_logits, grad_coef, row_loss);
  PROPLAB_CUDA_CHECK_LAUNCH("cross_entropy_row_kernel");
  chunked_sum(row_loss, rows, kCrossEntropyChunk, total);
  double host = 0.0;
  copy_to_host(&host, total, sizeof(double));
  return host;
}

double squared_error_sum(const float* pred, const float* target, std::int64_t n, float* d_pred, float grad_coef) {
  PROPLAB_CHECK(n > 0, "mse_loss: empty pred");
  const cudaStream_t stream = context().stream;
  const std::int64_t chunks = (n + kSquaredErrorChunk - 1) / kSquaredErrorChunk;
  // [chunks] chunk sums, then the total.
  Scratch scratch(sizeof(double) * static_cast<std::size_t>(chunks + 1));
  double* chunk_sums = scratch.as<double>();
  double* total = chunk_sums + chunks;
  // The sums read pred and target before the gradient (which may alias either) is written: same stream, in order.
  squared_error_chunks_kernel<<<chunk_blocks(chunks), kChunkThreads, 0, stream>>>(pred, target, n, chunks, chunk_sums);
  PROPLAB_CUDA_CHECK_LAUNCH("squared_error_chunks_kernel");
  sum_partials(chunk_sums, chunks, 1, total, false);
  if (d_pred != nullptr) {
    squared_error_grad_kernel<<<grid_blocks(n), kBlockThreads, 0, stream>>>(pred, target, n, grad_coef, d_pred);
    PROPLAB_CUDA_CHECK_LAUNCH("squared_error_grad_kernel");
  }
  double host = 0.0;
  copy_to_host(&host, total, sizeof(double));
  return host;
}

}  // namespace proplab::kernels
