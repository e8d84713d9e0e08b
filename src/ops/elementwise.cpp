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

// Σ x² over [begin, end) in double: the one chunk body of sum_squares and sum_squares_each (the same code, so
// the same vectorised order).
inline double chunk_sum_squares(const float* x, std::int64_t begin, std::int64_t end) {
  double sum = 0.0;
#pragma omp simd reduction(+ : sum)
  for (std::int64_t i = begin; i < end; ++i) sum += static_cast<double>(x[i]) * x[i];
  return sum;
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
  return ordered_chunk_sum(x.numel(),
                           [=](std::int64_t begin, std::int64_t end) { return chunk_sum_squares(x_data, begin, end); });
}

std::vector<double> sum_squares_each(const std::vector<const Tensor*>& xs) {
  constexpr const char* op = "sum_squares_each";
  std::vector<double> sums(xs.size(), 0.0);
  bool all_cpu = true;
  for (const Tensor* x : xs) {
    PROPLAB_CHECK(x != nullptr, "op '", op, "': a null tensor");
    expect_f32(op, "x", *x);
    all_cpu = all_cpu && x->device() == Device::cpu;
  }
  if (!all_cpu) {
    for (std::size_t t = 0; t < xs.size(); ++t) sums[t] = sum_squares(*xs[t]);
    return sums;
  }
  // Every tensor's chunks in one list, summed in one parallel region; then each tensor's partials in chunk order,
  // as sum_squares adds them.
  std::vector<std::int64_t> first(xs.size() + 1, 0);
  for (std::size_t t = 0; t < xs.size(); ++t)
    first[t + 1] = first[t] + (xs[t]->numel() + kReduceChunk - 1) / kReduceChunk;
  std::vector<std::size_t> owner(static_cast<std::size_t>(first.back()));
  for (std::size_t t = 0; t < xs.size(); ++t)
    for (std::int64_t c = first[t]; c < first[t + 1]; ++c) owner[static_cast<std::size_t>(c)] = t;
  std::vector<double> partial(static_cast<std::size_t>(first.back()));
  std::int64_t total = 0;
  for (const Tensor* x : xs) total += x->numel();
#pragma omp parallel for schedule(static) if (total > kParallelMin)
  for (std::int64_t c = 0; c < first.back(); ++c) {
    const std::size_t t = owner[static_cast<std::size_t>(c)];
    const std::int64_t begin = (c - first[t]) * kReduceChunk;
    partial[static_cast<std::size_t>(c)] =
        chunk_sum_squares(xs[t]->f32(), begin, std::min(xs[t]->numel(), begin + kReduceChunk));
  }
  for (std::size_t t = 0; t < xs.size(); ++t) {
    double sum = 0.0;
    for (std::int64_t c = first[t]; c < first[t + 1]; ++c) sum += partial[static_cast<std::size_t>(c)];
    sums[t] = sum;
  }
  return sums;
}

}  // namespace proplab::ops
