#include "kernels/reduce.cuh"

#include <cuda_runtime.h>

#include "kernels/block_reduce.cuh"
#include "kernels/common.cuh"
#include "kernels/context.cuh"

namespace proplab::kernels {
namespace {

// One thread per value v: Σ over blocks in order.
__global__ void sum_partials_kernel(const double* partials, std::int64_t blocks, int values, double* out,
                                    bool accumulate) {
  const int v = blockIdx.x * blockDim.x + threadIdx.x;
  if (v >= values) return;
  double total = 0.0;
  for (std::int64_t b = 0; b < blocks; ++b) total += partials[b * values + v];
  out[v] = accumulate ? out[v] + total : total;
}

// Per-block partial of Σ x·y (or Σ x² when y is null), grid-stride in double.
__global__ void __launch_bounds__(kBlockThreads)
    dot_partials_kernel(const float* x, const float* y, std::int64_t n, double* partials) {
  __shared__ double shared[kBlockThreads];
  double sum[1] = {0.0};
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const double a = x[i];
    sum[0] += y ? a * static_cast<double>(y[i]) : a * a;
  }
  block_sum<1>(sum, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = sum[0];
}

// partials[chunk * cols + c] = Σ_{r in chunk} x[r, c] (double).
__global__ void column_partials_kernel(const float* x, std::int64_t rows, std::int64_t cols, double* partials) {
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t chunk = blockIdx.y;
  if (c >= cols) return;
  const std::int64_t begin = chunk * kColumnChunk;
  const std::int64_t end = begin + kColumnChunk < rows ? begin + kColumnChunk : rows;
  double sum = 0.0;
  for (std::int64_t r = begin; r < end; ++r) sum += x[r * cols + c];
  partials[chunk * cols + c] = sum;
}

__global__ void column_finish_kernel(const double* partials, std::int64_t chunks, std::int64_t cols, float* out,
                                     bool accumulate) {
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  double total = 0.0;
  for (std::int64_t k = 0; k < chunks; ++k) total += partials[k * cols + c];
  // As the CPU does (ops/linear.cpp): the double sum rounded to float once, then added in float.
  out[c] = accumulate ? out[c] + static_cast<float>(total) : static_cast<float>(total);
}

}  // namespace

void sum_partials(const double* partials, std::int64_t blocks, int values, double* out, bool accumulate) {
  const int threads = 128;
  sum_partials_kernel<<<(values + threads - 1) / threads, threads, 0, context().stream>>>(partials, blocks, values, out,
                                                                                           accumulate);
  PROPLAB_CUDA_CHECK_LAUNCH("sum_partials_kernel");
}

void dot_device(const float* x, const float* y, std::int64_t n, double* out, bool accumulate) {
  const unsigned blocks = grid_blocks(n);
  Scratch partials(sizeof(double) * blocks);
  dot_partials_kernel<<<blocks, kBlockThreads, 0, context().stream>>>(x, y, n, partials.as<double>());
  PROPLAB_CUDA_CHECK_LAUNCH("dot_partials_kernel");
  sum_partials(partials.as<double>(), blocks, 1, out, accumulate);
}

double dot(const float* x, const float* y, std::int64_t n) {
  Scratch total(sizeof(double));
  dot_device(x, y, n, total.as<double>(), false);
  double host = 0.0;
  copy_to_host(&host, total.as<double>(), sizeof(double));
  return host;
}

void column_sum(const float* x, std::int64_t rows, std::int64_t cols, float* out, bool accumulate) {
  if (cols == 0) return;
  const std::int64_t chunks = rows == 0 ? 1 : (rows + kColumnChunk - 1) / kColumnChunk;
  Scratch partials(sizeof(double) * chunks * cols);
  const unsigned col_blocks = static_cast<unsigned>((cols + kBlockThreads - 1) / kBlockThreads);
  if (rows > 0) {
    column_partials_kernel<<<dim3(col_blocks, static_cast<unsigned>(chunks)), kBlockThreads, 0, context().stream>>>(
        x, rows, cols, partials.as<double>());
    PROPLAB_CUDA_CHECK_LAUNCH("column_partials_kernel");
  } else {
    PROPLAB_CUDA_CHECK(cudaMemsetAsync(partials.as<double>(), 0, sizeof(double) * cols, context().stream));
  }
  column_finish_kernel<<<col_blocks, kBlockThreads, 0, context().stream>>>(partials.as<double>(), chunks, cols, out,
                                                                           accumulate);
  PROPLAB_CUDA_CHECK_LAUNCH("column_finish_kernel");
}

}  // namespace proplab::kernels
