// ops/residual: the residual combine y = lambda * x + beta * f and its backward, alone or fused with a ReLU after
// it (y = relu(lambda * x + beta * f): one pass less over memory each way).
//
// d_lambda and d_beta are double sums over fixed kReduceChunk element chunks combined in chunk order
// (core/parallel.h), so they are bitwise the same for any thread count.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/parallel.h"
#include "ops/dispatch.h"
#include "ops/ops.h"

#ifdef PROPLAB_WITH_CUDA
#include "kernels/context.cuh"
#include "kernels/residual.cuh"
#endif

namespace proplab::ops {

namespace {

constexpr std::int64_t kParallelMin = 1 << 15;

// The CPU forward; kRelu: then activation_forward's relu (relu(NaN) = NaN), in the same pass.
template <bool kRelu>
void residual_forward_cpu(const Tensor& x, const Tensor& f, float lambda, float beta, Tensor& y) {
  const float* x_data = x.f32();
  const float* f_data = f.f32();
  float* y_data = y.f32();
  const std::int64_t n = x.numel();
  if constexpr (kRelu) {
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
    for (std::int64_t i = 0; i < n; ++i) {
      const float v = lambda * x_data[i] + beta * f_data[i];
      y_data[i] = v < 0.0f ? 0.0f : v;
    }
  } else {
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
    for (std::int64_t i = 0; i < n; ++i) y_data[i] = lambda * x_data[i] + beta * f_data[i];
  }
}

// The CPU backward; kRelu: d_y (dL/d relu output on entry) is first masked by y > 0 in place, chunk by chunk
// (activation_backward's relu), so the chunk is in cache for the rest.
template <bool kRelu>
void residual_backward_cpu(const Tensor& x, const Tensor& f, const Tensor* y, const Tensor& d_y, float lambda,
                           float beta, Tensor* d_x, Tensor* d_f, double* d_lambda, double* d_beta) {
  const float* x_data = x.f32();
  const float* f_data = f.f32();
  const float* grad = d_y.f32();
  const float* y_data = kRelu ? y->f32() : nullptr;
  float* masked = kRelu ? const_cast<float*>(grad) : nullptr;  // d_y, an in/out argument of the fused op
  float* d_x_data = d_x ? d_x->f32() : nullptr;
  float* d_f_data = d_f ? d_f->f32() : nullptr;
  const std::int64_t n = x.numel();
  const std::int64_t chunks = (n + kReduceChunk - 1) / kReduceChunk;
  const bool want_sums = d_lambda != nullptr || d_beta != nullptr;
  // Per-chunk partial sums: [chunk] for d_lambda, [chunks + chunk] for d_beta.
  std::vector<double> partial(want_sums ? static_cast<std::size_t>(2 * chunks) : 0);
  double* partial_data = partial.data();
  // One pass: every element of d_y is read once, before d_x (which may alias it) is written.
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (std::int64_t c = 0; c < chunks; ++c) {
    const std::int64_t begin = c * kReduceChunk;
    const std::int64_t end = std::min(n, begin + kReduceChunk);
    if constexpr (kRelu) {
#pragma omp simd
      for (std::int64_t i = begin; i < end; ++i) masked[i] = y_data[i] > 0.0f ? masked[i] : 0.0f;
    }
    if (want_sums) {
      double sum_x = 0.0, sum_f = 0.0;
#pragma omp simd reduction(+ : sum_x, sum_f)
      for (std::int64_t i = begin; i < end; ++i) {
        sum_x += static_cast<double>(grad[i]) * x_data[i];
        sum_f += static_cast<double>(grad[i]) * f_data[i];
      }
      partial_data[c] = sum_x;
      partial_data[chunks + c] = sum_f;
    }
    if (d_f_data) {
#pragma omp simd
      for (std::int64_t i = begin; i < end; ++i) d_f_data[i] = beta * grad[i];
    }
    if (d_x_data) {
#pragma omp simd
      for (std::int64_t i = begin; i < end; ++i) d_x_data[i] = lambda * grad[i];
    }
  }
  if (d_lambda) {
    double total = 0.0;
    for (std::int64_t c = 0; c < chunks; ++c) total += partial_data[c];
    *d_lambda += total;
  }
  if (d_beta) {
    double total = 0.0;
    for (std::int64_t c = 0; c < chunks; ++c) total += partial_data[chunks + c];
    *d_beta += total;
  }
}

}  // namespace

void residual_forward(const Tensor& x, const Tensor& f, float lambda, float beta, Tensor& y) {
  constexpr const char* op = "residual_forward";
  expect_shape(op, "x", x, x.shape());
  expect_shape(op, "f", f, x.shape());
  expect_shape(op, "y", y, x.shape());
  const Device device = common_device(op, {&x, &f, &y});
  if (device == Device::cuda) {
#ifdef PROPLAB_WITH_CUDA
    kernels::residual_forward(x.f32(), f.f32(), lambda, beta, y.f32(), x.numel(), kernels::context().stream);
    return;
#else
    missing_device_impl("residual_forward", device);
#endif
  }

  residual_forward_cpu<false>(x, f, lambda, beta, y);
}

void residual_backward(const Tensor& x, const Tensor& f, const Tensor& d_y, float lambda, float beta, Tensor* d_x,
                       Tensor* d_f, double* d_lambda, double* d_beta) {
  constexpr const char* op = "residual_backward";
  expect_shape(op, "x", x, x.shape());
  expect_shape(op, "f", f, x.shape());
  expect_shape(op, "d_y", d_y, x.shape());
  if (d_x) expect_shape(op, "d_x", *d_x, x.shape());
  if (d_f) expect_shape(op, "d_f", *d_f, x.shape());
  const Device device = common_device(op, {&x, &f, &d_y, d_x, d_f});
  if (device == Device::cuda) {
#ifdef PROPLAB_WITH_CUDA
    kernels::residual_backward(x.f32(), f.f32(), d_y.f32(), lambda, beta, d_x ? d_x->f32() : nullptr,
                               d_f ? d_f->f32() : nullptr, d_lambda, d_beta, x.numel(), kernels::context().stream);
    return;
#else
    missing_device_impl("residual_backward", device);
#endif
  }

  residual_backward_cpu<false>(x, f, nullptr, d_y, lambda, beta, d_x, d_f, d_lambda, d_beta);
}

void residual_relu_forward(const Tensor& x, const Tensor& f, float lambda, float beta, Tensor& y) {
  constexpr const char* op = "residual_relu_forward";
  expect_shape(op, "x", x, x.shape());
  expect_shape(op, "f", f, x.shape());
  expect_shape(op, "y", y, x.shape());
  if (common_device(op, {&x, &f, &y}) != Device::cpu) {
    residual_forward(x, f, lambda, beta, y);
    activation_forward(Activation::relu, y, y);
    return;
  }
  residual_forward_cpu<true>(x, f, lambda, beta, y);
}

void residual_relu_backward(const Tensor& x, const Tensor& f, const Tensor& y, Tensor& d_y, float lambda, float beta,
                            Tensor* d_x, Tensor* d_f, double* d_lambda, double* d_beta) {
  constexpr const char* op = "residual_relu_backward";
  expect_shape(op, "x", x, x.shape());
  expect_shape(op, "f", f, x.shape());
  expect_shape(op, "y", y, x.shape());
  expect_shape(op, "d_y", d_y, x.shape());
  if (d_x) expect_shape(op, "d_x", *d_x, x.shape());
  if (d_f) expect_shape(op, "d_f", *d_f, x.shape());
  if (common_device(op, {&x, &f, &y, &d_y, d_x, d_f}) != Device::cpu) {
    activation_backward(Activation::relu, y, d_y, d_y);
    residual_backward(x, f, d_y, lambda, beta, d_x, d_f, d_lambda, d_beta);
    return;
  }
  residual_backward_cpu<true>(x, f, &y, d_y, lambda, beta, d_x, d_f, d_lambda, d_beta);
}

}  // namespace proplab::ops
