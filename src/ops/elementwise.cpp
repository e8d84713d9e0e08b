// ops/elementwise: axpy, scale, zero and the deterministic double-precision reductions dot and sum_squares.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/parallel.h"
#include "ops/dispatch.h"
#include "ops/ops.h"

#ifdef PROPLAB_WITH_CUDA
#include "kernels/elementwise.cuh"
#include "kernels/reduce.cuh"
#endif

namespace proplab::ops {

namespace {

// Below this many elements a parallel region costs more than the loop.
constexpr std::int64_t kParallelMin = 1 << 15;

void expect_f32(const char* op, const char* what, const Tensor& t) { expect_shape(op, what, t, t.shape()); }

// Σ chunk_sum(begin, end) over kReduceChunk chunks combined in chunk order: the same chunking and order as
// core's chunked_sum (so bitwise the same for any thread count), but inlined and without a parallel region for
// single-chunk tensors (biases, gains), which are most of the calls from gradient-norm clipping.
template <typename ChunkSum>
double ordered_chunk_sum(std::int64_t n, ChunkSum chunk_sum) {
  const std::int64_t chunks = (n + kReduceChunk - 1) / kReduceChunk;
  if (chunks <= 1) return chunks == 1 ? chunk_sum(0, n) : 0.0;
  std::vector<double> partial(static_cast<std::size_t>(chunks));
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (std::int64_t c = 0; c < chunks; ++c)
    partial[c] = chunk_sum(c * kReduceChunk, std::min(n, (c + 1) * kReduceChunk));
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

}  // namespace

void axpy(float alpha, const Tensor& x, Tensor& y) {
  constexpr const char* op = "axpy";
  expect_f32(op, "x", x);
  expect_shape(op, "y", y, x.shape());
  const Device device = common_device(op, {&x, &y});
  if (device == Device::cuda) {
#ifdef PROPLAB_WITH_CUDA
    kernels::axpy(alpha, x.f32(), y.f32(), x.numel());
    return;
#else
    missing_device_impl(op, device);
#endif
  }
  const float* x_data = x.f32();
  float* y_data = y.f32();
  const std::int64_t n = x.numel();
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (std::int64_t i = 0; i < n; ++i) y_data[i] += alpha * x_data[i];
}

void scale(Tensor& x, float alpha) {
  constexpr const char* op = "scale";
  expect_f32(op, "x", x);
  const Device device = common_device(op, {&x});
  if (device == Device::cuda) {
#ifdef PROPLAB_WITH_CUDA
    kernels::scale(x.f32(), alpha, x.numel());
    return;
#else
    missing_device_impl(op, device);
#endif
  }
  float* x_data = x.f32();
  const std::int64_t n = x.numel();
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (std::int64_t i = 0; i < n; ++i) x_data[i] *= alpha;
}

void zero(Tensor& x) {
  constexpr const char* op = "zero";
  expect_f32(op, "x", x);
  const Device device = common_device(op, {&x});
  if (device == Device::cuda) {
#ifdef PROPLAB_WITH_CUDA
    kernels::zero(x.f32(), x.numel());
    return;
#else
    missing_device_impl(op, device);
#endif
  }
  float* x_data = x.f32();
  const std::int64_t n = x.numel();
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (std::int64_t i = 0; i < n; ++i) x_data[i] = 0.0f;
}

double dot(const Tensor& x, const Tensor& y) {
  constexpr const char* op = "dot";
  expect_f32(op, "x", x);
  expect_shape(op, "y", y, x.shape());
  const Device device = common_device(op, {&x, &y});
  if (device == Device::cuda) {
#ifdef PROPLAB_WITH_CUDA
    // Σ x·y in double (exact float products), deterministic; the host waits for the value.
    return x.numel() == 0 ? 0.0 : kernels::dot(x.f32(), y.f32(), x.numel());
#else
    missing_device_impl(op, device);
#endif
  }
  const float* x_data = x.f32();
  const float* y_data = y.f32();
  return ordered_chunk_sum(x.numel(), [=](std::int64_t begin, std::int64_t end) {
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (std::int64_t i = begin; i < end; ++i) sum += static_cast<double>(x_data[i]) * y_data[i];
    return sum;
  });
}

double sum_squares(const Tensor& x) {
  constexpr const char* op = "sum_squares";
  expect_f32(op, "x", x);
  const Device device = common_device(op, {&x});
  if (device == Device::cuda) {
#ifdef PROPLAB_WITH_CUDA
    return x.numel() == 0 ? 0.0 : kernels::dot(x.f32(), nullptr, x.numel());
#else
    missing_device_impl(op, device);
#endif
  }
  const float* x_data = x.f32();
  return ordered_chunk_sum(x.numel(), [=](std::int64_t begin, std::int64_t end) {
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (std::int64_t i = begin; i < end; ++i) sum += static_cast<double>(x_data[i]) * x_data[i];
    return sum;
  });
}

}  // namespace proplab::ops
