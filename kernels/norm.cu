// kernels/norm: LayerNorm and RMSNorm kernels (see kernels/norm.cuh for the contract and invariants).
//
// Layout of the work:
// - Forward and the d_x part of backward: one block per row (rows beyond kMaxRowBlocks are visited block-stride),
//   kSmallThreads threads for rows of at most kSmallMaxFeatures features and kBlockThreads otherwise; the row sums
//   are block_sum_float trees in float, as the CPU sums rows in float.
// - d_gamma / d_beta: a partials kernel, grid (column blocks, row chunks), one thread per (column, chunk) summing
//   its chunk's rows in row order in double; then one thread per column adds the chunk partials in chunk order and
//   adds the float-rounded total to the gradient. The chunking is src/ops/norm.cpp's row_chunks.
#include "kernels/norm.cuh"

#include <cuda_runtime.h>

#include <algorithm>

#include "core/error.h"
#include "kernels/block_reduce.cuh"
#include "kernels/common.cuh"
#include "kernels/context.cuh"

namespace proplab::kernels {
namespace {

// Block size for narrow rows (each thread still has several features when D is near the bound).
constexpr int kSmallThreads = 64;
constexpr std::int64_t kSmallMaxFeatures = 512;
// At most this many row blocks in a grid; further rows are visited block-stride. A constant, not the SM count.
constexpr std::int64_t kMaxRowBlocks = std::int64_t{1} << 20;
// The CPU's parameter-gradient row chunks (src/ops/norm.cpp: kMaxRowChunks, kMinChunkRows, row_chunks), so the
// double partials are formed over the same rows and combined in the same order.
constexpr std::int64_t kMaxRowChunks = 64;
constexpr std::int64_t kMinChunkRows = 8;

struct RowChunks {
  std::int64_t rows_per_chunk = 1;
  std::int64_t count = 0;
};

RowChunks row_chunks(std::int64_t rows) {
  RowChunks chunks;
  chunks.rows_per_chunk = std::max(kMinChunkRows, (rows + kMaxRowChunks - 1) / kMaxRowChunks);
  chunks.count = (rows + chunks.rows_per_chunk - 1) / chunks.rows_per_chunk;
  return chunks;
}

unsigned row_blocks(std::int64_t rows) { return static_cast<unsigned>(std::min(rows, kMaxRowBlocks)); }

unsigned column_blocks(std::int64_t features) {
  return static_cast<unsigned>((features + kBlockThreads - 1) / kBlockThreads);
}

// The saved mean of `row` for LayerNorm (kCentered); RMSNorm has none.
template <bool kCentered>
__device__ __forceinline__ float saved_mean(const float* mean, std::int64_t row) {
  if constexpr (kCentered) {
    return mean[row];
  } else {
    return 0.0f;
  }
}

// x_hat as the CPU forms it: (x − mean) · rstd for LayerNorm, x · rstd for RMSNorm.
template <bool kCentered>
__device__ __forceinline__ float normalised(float x, float mean, float rstd) {
  if constexpr (kCentered) {
    return (x - mean) * rstd;
  } else {
    return x * rstd;
  }
}

// ==== forward =====================================================================================================

// One block per row. y may alias x: every read of a row happens before the block reductions' barriers, except
// the last pass, where each thread reads x[j] and then writes y[j] itself.
template <int kThreads, bool kGamma, bool kBeta>
__global__ void __launch_bounds__(kThreads)
    layernorm_forward_kernel(const float* x, const float* gamma, const float* beta, float eps, std::int64_t rows,
                             std::int64_t features, float inv_d, float* y, float* mean, float* rstd) {
  __shared__ float shared[kThreads];
  for (std::int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const float* x_row = x + row * features;
    float* y_row = y + row * features;
    float sum = 0.0f;
    for (std::int64_t j = threadIdx.x; j < features; j += kThreads) sum += x_row[j];
    const float row_mean = block_sum_float<kThreads>(sum, shared) * inv_d;
    float sum_sq = 0.0f;
    for (std::int64_t j = threadIdx.x; j < features; j += kThreads) {
      const float centered = x_row[j] - row_mean;
      sum_sq += centered * centered;
    }
    const float row_rstd = 1.0f / sqrtf(block_sum_float<kThreads>(sum_sq, shared) * inv_d + eps);
    if (threadIdx.x == 0) {
      mean[row] = row_mean;
      rstd[row] = row_rstd;
    }
    for (std::int64_t j = threadIdx.x; j < features; j += kThreads) {
      float value = (x_row[j] - row_mean) * row_rstd;
      if constexpr (kGamma) value *= gamma[j];
      if constexpr (kBeta) value += beta[j];
      y_row[j] = value;
    }
  }
}

// One block per row; y may alias x (as above).
template <int kThreads, bool kGamma>
__global__ void __launch_bounds__(kThreads)
    rmsnorm_forward_kernel(const float* x, const float* gamma, float eps, std::int64_t rows, std::int64_t features,
                           float inv_d, float* y, float* rstd) {
  __shared__ float shared[kThreads];
  for (std::int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const float* x_row = x + row * features;
    float* y_row = y + row * features;
    float sum_sq = 0.0f;
    for (std::int64_t j = threadIdx.x; j < features; j += kThreads) sum_sq += x_row[j] * x_row[j];
    const float row_rstd = 1.0f / sqrtf(block_sum_float<kThreads>(sum_sq, shared) * inv_d + eps);
    if (threadIdx.x == 0) rstd[row] = row_rstd;
    for (std::int64_t j = threadIdx.x; j < features; j += kThreads) {
      float value = x_row[j] * row_rstd;
      if constexpr (kGamma) value *= gamma[j];
      y_row[j] = value;
    }
  }
}

// ==== backward ====================================================================================================

// d_x for one row per block: LayerNorm (kCentered) d_x = rstd (g − mean(g) − x_hat mean(g x_hat)), RMSNorm
// d_x = rstd (g − x_hat mean(g x_hat)), g = d_y (· gamma). d_x may alias d_y: the first pass reads the whole row
// before the reductions' barriers, and in the last pass each thread reads d_y[j] before it writes d_x[j].
template <int kThreads, bool kCentered, bool kGamma>
__global__ void __launch_bounds__(kThreads)
    norm_backward_kernel(const float* x, const float* gamma, const float* mean, const float* rstd, const float* d_y,
                         std::int64_t rows, std::int64_t features, float inv_d, float* d_x) {
  __shared__ float shared[kThreads];
  for (std::int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const float* x_row = x + row * features;
    const float* d_y_row = d_y + row * features;
    float* d_x_row = d_x + row * features;
    const float row_mean = saved_mean<kCentered>(mean, row);
    const float row_rstd = rstd[row];
    float sum_g = 0.0f, sum_g_xhat = 0.0f;
    for (std::int64_t j = threadIdx.x; j < features; j += kThreads) {
      const float xhat = normalised<kCentered>(x_row[j], row_mean, row_rstd);
      const float g = kGamma ? d_y_row[j] * gamma[j] : d_y_row[j];
      if constexpr (kCentered) sum_g += g;
      sum_g_xhat += g * xhat;
    }
    float mean_g = 0.0f;
    if constexpr (kCentered) mean_g = block_sum_float<kThreads>(sum_g, shared) * inv_d;
    const float mean_g_xhat = block_sum_float<kThreads>(sum_g_xhat, shared) * inv_d;
    for (std::int64_t j = threadIdx.x; j < features; j += kThreads) {
      const float xhat = normalised<kCentered>(x_row[j], row_mean, row_rstd);
      const float g = kGamma ? d_y_row[j] * gamma[j] : d_y_row[j];
      if constexpr (kCentered) {
        d_x_row[j] = row_rstd * (g - mean_g - xhat * mean_g_xhat);
      } else {
        d_x_row[j] = row_rstd * (g - xhat * mean_g_xhat);
      }
    }
  }
}

// Chunk partials of the parameter gradients, grid (column blocks, chunks): gamma_partial[c * features + j] =
// Σ_{r in chunk c} d_y[r, j] · x_hat[r, j] and beta_partial[c * features + j] = Σ_{r in chunk c} d_y[r, j], each
// in double, rows in order, each product rounded to float first (as the CPU's float product). Either output may be
// null (skipped).
template <bool kCentered>
__global__ void __launch_bounds__(kBlockThreads)
    norm_param_partials_kernel(const float* x, const float* mean, const float* rstd, const float* d_y,
                               std::int64_t rows, std::int64_t features, std::int64_t rows_per_chunk,
                               double* gamma_partial, double* beta_partial) {
  const std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= features) return;
  const std::int64_t chunk = blockIdx.y;
  const std::int64_t begin = chunk * rows_per_chunk;
  const std::int64_t end = begin + rows_per_chunk < rows ? begin + rows_per_chunk : rows;
  double gamma_sum = 0.0, beta_sum = 0.0;
  for (std::int64_t r = begin; r < end; ++r) {
    const float dy = d_y[r * features + j];
    if (gamma_partial != nullptr) {
      const float xhat = normalised<kCentered>(x[r * features + j], saved_mean<kCentered>(mean, r), rstd[r]);
      gamma_sum += static_cast<double>(__fmul_rn(dy, xhat));
    }
    if (beta_partial != nullptr) beta_sum += static_cast<double>(dy);
  }
  if (gamma_partial != nullptr) gamma_partial[chunk * features + j] = gamma_sum;
  if (beta_partial != nullptr) beta_partial[chunk * features + j] = beta_sum;
}

// grad[j] += (float) Σ_c partial[c * features + j], chunks in order (the CPU's combine_partials).
__global__ void __launch_bounds__(kBlockThreads)
    norm_param_combine_kernel(const double* partial, std::int64_t chunks, std::int64_t features, float* grad) {
  const std::int64_t j = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= features) return;
  double sum = partial[j];
  for (std::int64_t c = 1; c < chunks; ++c) sum += partial[c * features + j];
  grad[j] += static_cast<float>(sum);
}

// ==== launchers ===================================================================================================

template <int kThreads>
void launch_layernorm_forward(const float* x, const float* gamma, const float* beta, float eps, std::int64_t rows,
                              std::int64_t features, float inv_d, float* y, float* mean, float* rstd) {
  const unsigned blocks = row_blocks(rows);
  cudaStream_t stream = context().stream;
  if (gamma != nullptr && beta != nullptr) {
    layernorm_forward_kernel<kThreads, true, true>
        <<<blocks, kThreads, 0, stream>>>(x, gamma, beta, eps, rows, features, inv_d, y, mean, rstd);
    PROPLAB_CUDA_CHECK_LAUNCH("layernorm_forward_kernel<gamma, beta>");
  } else if (gamma != nullptr) {
    layernorm_forward_kernel<kThreads, true, false>
        <<<blocks, kThreads, 0, stream>>>(x, gamma, beta, eps, rows, features, inv_d, y, mean, rstd);
    PROPLAB_CUDA_CHECK_LAUNCH("layernorm_forward_kernel<gamma>");
  } else if (beta != nullptr) {
    layernorm_forward_kernel<kThreads, false, true>
        <<<blocks, kThreads, 0, stream>>>(x, gamma, beta, eps, rows, features, inv_d, y, mean, rstd);
    PROPLAB_CUDA_CHECK_LAUNCH("layernorm_forward_kernel<beta>");
  } else {
    layernorm_forward_kernel<kThreads, false, false>
        <<<blocks, kThreads, 0, stream>>>(x, gamma, beta, eps, rows, features, inv_d, y, mean, rstd);
    PROPLAB_CUDA_CHECK_LAUNCH("layernorm_forward_kernel<plain>");
  }
}

template <int kThreads>
void launch_rmsnorm_forward(const float* x, const float* gamma, float eps, std::int64_t rows, std::int64_t features,
                            float inv_d, float* y, float* rstd) {
  const unsigned blocks = row_blocks(rows);
  cudaStream_t stream = context().stream;
  if (gamma != nullptr) {
    rmsnorm_forward_kernel<kThreads, true>
        <<<blocks, kThreads, 0, stream>>>(x, gamma, eps, rows, features, inv_d, y, rstd);
    PROPLAB_CUDA_CHECK_LAUNCH("rmsnorm_forward_kernel<gamma>");
  } else {
    rmsnorm_forward_kernel<kThreads, false>
        <<<blocks, kThreads, 0, stream>>>(x, gamma, eps, rows, features, inv_d, y, rstd);
    PROPLAB_CUDA_CHECK_LAUNCH("rmsnorm_forward_kernel<plain>");
  }
}

template <int kThreads, bool kCentered>
void launch_norm_backward(const float* x, const float* gamma, const float* mean, const float* rstd, const float* d_y,
                          std::int64_t rows, std::int64_t features, float inv_d, float* d_x) {
  const unsigned blocks = row_blocks(rows);
  cudaStream_t stream = context().stream;
  if (gamma != nullptr) {
    norm_backward_kernel<kThreads, kCentered, true>
        <<<blocks, kThreads, 0, stream>>>(x, gamma, mean, rstd, d_y, rows, features, inv_d, d_x);
    PROPLAB_CUDA_CHECK_LAUNCH("norm_backward_kernel<gamma>");
  } else {
    norm_backward_kernel<kThreads, kCentered, false>
        <<<blocks, kThreads, 0, stream>>>(x, gamma, mean, rstd, d_y, rows, features, inv_d, d_x);
    PROPLAB_CUDA_CHECK_LAUNCH("norm_backward_kernel<plain>");
  }
}

// d_gamma += Σ_rows d_y x_hat, d_beta += Σ_rows d_y (each skipped when null). Enqueued before the d_x kernel,
// which may overwrite d_y in place.
template <bool kCentered>
void accumulate_param_grads(const float* x, const float* mean, const float* rstd, const float* d_y, std::int64_t rows,
                            std::int64_t features, float* d_gamma, float* d_beta) {
  if (d_gamma == nullptr && d_beta == nullptr) return;
  const RowChunks chunks = row_chunks(rows);
  const std::int64_t partial_size = chunks.count * features;
  const std::int64_t buffers = (d_gamma != nullptr ? 1 : 0) + (d_beta != nullptr ? 1 : 0);
  Scratch scratch(sizeof(double) * static_cast<std::size_t>(partial_size * buffers));
  double* gamma_partial = d_gamma != nullptr ? scratch.as<double>() : nullptr;
  double* beta_partial = d_beta != nullptr ? scratch.as<double>() + (d_gamma != nullptr ? partial_size : 0) : nullptr;
  cudaStream_t stream = context().stream;
  const unsigned col_blocks = column_blocks(features);
  norm_param_partials_kernel<kCentered>
      <<<dim3(col_blocks, static_cast<unsigned>(chunks.count)), kBlockThreads, 0, stream>>>(
          x, mean, rstd, d_y, rows, features, chunks.rows_per_chunk, gamma_partial, beta_partial);
  PROPLAB_CUDA_CHECK_LAUNCH("norm_param_partials_kernel");
  if (d_gamma != nullptr) {
    norm_param_combine_kernel<<<col_blocks, kBlockThreads, 0, stream>>>(gamma_partial, chunks.count, features, d_gamma);
    PROPLAB_CUDA_CHECK_LAUNCH("norm_param_combine_kernel<gamma>");
  }
  if (d_beta != nullptr) {
    norm_param_combine_kernel<<<col_blocks, kBlockThreads, 0, stream>>>(beta_partial, chunks.count, features, d_beta);
    PROPLAB_CUDA_CHECK_LAUNCH("norm_param_combine_kernel<beta>");
  }
}

void check_sizes(const char* op, std::int64_t rows, std::int64_t features) {
  PROPLAB_CHECK(rows >= 0 && features >= 0, op, ": negative size (rows ", rows, ", features ", features, ")");
}

}  // namespace

void layernorm_forward(const float* x, const float* gamma, const float* beta, float eps, std::int64_t rows,
                       std::int64_t features, float* y, float* mean, float* rstd) {
  check_sizes("layernorm_forward", rows, features);
  if (rows == 0 || features == 0) return;
  PROPLAB_CHECK(x != nullptr && y != nullptr && mean != nullptr && rstd != nullptr,
                "layernorm_forward: null x, y, mean or rstd");
  const float inv_d = 1.0f / static_cast<float>(features);
  if (features <= kSmallMaxFeatures)
    launch_layernorm_forward<kSmallThreads>(x, gamma, beta, eps, rows, features, inv_d, y, mean, rstd);
  else
    launch_layernorm_forward<kBlockThreads>(x, gamma, beta, eps, rows, features, inv_d, y, mean, rstd);
}

void layernorm_backward(const float* x, const float* gamma, const float* mean, const float* rstd, const float* d_y,
                        std::int64_t rows, std::int64_t features, float* d_x, float* d_gamma, float* d_beta) {
  check_sizes("layernorm_backward", rows, features);
  if (rows == 0 || features == 0) return;
  PROPLAB_CHECK(x != nullptr && mean != nullptr && rstd != nullptr && d_y != nullptr && d_x != nullptr,
                "layernorm_backward: null x, mean, rstd, d_y or d_x");
  PROPLAB_CHECK(d_gamma == nullptr || gamma != nullptr, "layernorm_backward: d_gamma given without gamma");
  const float inv_d = 1.0f / static_cast<float>(features);
  accumulate_param_grads<true>(x, mean, rstd, d_y, rows, features, d_gamma, d_beta);
  if (features <= kSmallMaxFeatures)
    launch_norm_backward<kSmallThreads, true>(x, gamma, mean, rstd, d_y, rows, features, inv_d, d_x);
  else
    launch_norm_backward<kBlockThreads, true>(x, gamma, mean, rstd, d_y, rows, features, inv_d, d_x);
}

void rmsnorm_forward(const float* x, const float* gamma, float eps, std::int64_t rows, std::int64_t features, float* y,
                     float* rstd) {
  check_sizes("rmsnorm_forward", rows, features);
  if (rows == 0 || features == 0) return;
  PROPLAB_CHECK(x != nullptr && y != nullptr && rstd != nullptr, "rmsnorm_forward: null x, y or rstd");
  const float inv_d = 1.0f / static_cast<float>(features);
  if (features <= kSmallMaxFeatures)
    launch_rmsnorm_forward<kSmallThreads>(x, gamma, eps, rows, features, inv_d, y, rstd);
  else
    launch_rmsnorm_forward<kBlockThreads>(x, gamma, eps, rows, features, inv_d, y, rstd);
}

void rmsnorm_backward(const float* x, const float* gamma, const float* rstd, const float* d_y, std::int64_t rows,
                      std::int64_t features, float* d_x, float* d_gamma) {
  check_sizes("rmsnorm_backward", rows, features);
  if (rows == 0 || features == 0) return;
  PROPLAB_CHECK(x != nullptr && rstd != nullptr && d_y != nullptr && d_x != nullptr,
                "rmsnorm_backward: null x, rstd, d_y or d_x");
  PROPLAB_CHECK(d_gamma == nullptr || gamma != nullptr, "rmsnorm_backward: d_gamma given without gamma");
  const float inv_d = 1.0f / static_cast<float>(features);
  accumulate_param_grads<false>(x, nullptr, rstd, d_y, rows, features, d_gamma, nullptr);
  if (features <= kSmallMaxFeatures)
    launch_norm_backward<kSmallThreads, false>(x, gamma, nullptr, rstd, d_y, rows, features, inv_d, d_x);
  else
    launch_norm_backward<kBlockThreads, false>(x, gamma, nullptr, rstd, d_y, rows, features, inv_d, d_x);
}

}  // namespace proplab::kernels
