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
#include "ops/gather.h"
#include "ops/ops.h"

#ifdef PROPLAB_WITH_CUDA
#include "kernels/context.cuh"
#include "kernels/residual.cuh"
#endif

namespace proplab::ops {

namespace {

constexpr std::int64_t kParallelMin = 1 << 15;

// d_f = beta·d_y and d_x = lambda·d_y over [begin, end), d_f first (d_x may alias d_y); each skipped when null.
inline void scale_gradient(const float* grad, float lambda, float beta, float* d_x, float* d_f, std::int64_t begin,
                           std::int64_t end) {
  if (d_f) {
#pragma omp simd
    for (std::int64_t i = begin; i < end; ++i) d_f[i] = beta * grad[i];
  }
  if (d_x) {
#pragma omp simd
    for (std::int64_t i = begin; i < end; ++i) d_x[i] = lambda * grad[i];
  }
}

// d_y masked by y > 0 in place over [begin, end) (activation_backward's relu).
inline void mask_gradient(const float* y, float* grad, std::int64_t begin, std::int64_t end) {
#pragma omp simd
  for (std::int64_t i = begin; i < end; ++i) grad[i] = y[i] > 0.0f ? grad[i] : 0.0f;
}

// The CPU forward; kRelu: then activation_forward's relu (relu(NaN) = NaN), in the same pass. With `moments`, the
// statistics of f and y gathered as y is computed (ops/gather.h).
template <bool kRelu>
void residual_forward_cpu(const Tensor& x, const Tensor& f, float lambda, float beta, Tensor& y,
                          const OpMoments* moments) {
  const float* x_data = x.f32();
  const float* f_data = f.f32();
  float* y_data = y.f32();
  auto value = [=](std::int64_t i) {
    const float v = lambda * x_data[i] + beta * f_data[i];
    if constexpr (kRelu) return v < 0.0f ? 0.0f : v;
    return v;
  };
  auto compute = [=](std::int64_t begin, std::int64_t end) {
#pragma omp simd
    for (std::int64_t i = begin; i < end; ++i) y_data[i] = value(i);
  };
  if (gather_moments(moments, f, y, kParallelMin, compute, value)) return;
  in_thread_ranges(x.numel(), kParallelMin, compute);
}

// The CPU backward; kRelu: d_y (dL/d relu output on entry) is first masked by y > 0 in place, chunk by chunk
// (activation_backward's relu), so the chunk is in cache for the rest. With `moments`, the statistics of d_y as it
// enters and of d_f: gathered chunk by chunk (ops/gather.h), or, where the learnable scalars' sums keep their own
// fixed chunks, summed whole before and after.
template <bool kRelu>
void residual_backward_cpu(const Tensor& x, const Tensor& f, const Tensor* y, const Tensor& d_y, float lambda,
                           float beta, Tensor* d_x, Tensor* d_f, double* d_lambda, double* d_beta,
                           const OpMoments* moments) {
  PROPLAB_CHECK(moments == nullptr || moments->output == nullptr || d_f != nullptr,
                "op 'residual_backward': gathered output moments need d_f");
  const float* x_data = x.f32();
  const float* f_data = f.f32();
  const float* grad = d_y.f32();
  const float* y_data = kRelu ? y->f32() : nullptr;
  float* masked = kRelu ? const_cast<float*>(grad) : nullptr;  // d_y, an in/out argument of the fused op
  float* d_x_data = d_x ? d_x->f32() : nullptr;
  float* d_f_data = d_f ? d_f->f32() : nullptr;
  const std::int64_t n = x.numel();
  const bool want_sums = d_lambda != nullptr || d_beta != nullptr;
  if (!want_sums) {
    auto compute = [=](std::int64_t begin, std::int64_t end) {
      if constexpr (kRelu) mask_gradient(y_data, masked, begin, end);
      scale_gradient(grad, lambda, beta, d_x_data, d_f_data, begin, end);
    };
    auto d_f_at = [=](std::int64_t i) {
      if constexpr (kRelu) return beta * (y_data[i] > 0.0f ? grad[i] : 0.0f);
      return beta * grad[i];
    };
    Tensor unused;
    if (gather_moments(moments, d_y, d_f ? *d_f : unused, kParallelMin, compute, d_f_at)) return;
  } else {
    accumulate_input(moments, d_y);  // before the ReLU form masks it
  }
  const std::int64_t chunks = (n + kReduceChunk - 1) / kReduceChunk;
  // Per-chunk partial sums: [chunk] for d_lambda, [chunks + chunk] for d_beta.
  std::vector<double> partial(want_sums ? static_cast<std::size_t>(2 * chunks) : 0);
  double* partial_data = partial.data();
  // One pass: every element of d_y is read once, before d_x (which may alias it) is written.
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (std::int64_t c = 0; c < chunks; ++c) {
    const std::int64_t begin = c * kReduceChunk;
    const std::int64_t end = std::min(n, begin + kReduceChunk);
    if constexpr (kRelu) mask_gradient(y_data, masked, begin, end);
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
    scale_gradient(grad, lambda, beta, d_x_data, d_f_data, begin, end);
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
  if (want_sums && d_f) accumulate_output(moments, *d_f);
}

}  // namespace

void residual_forward(const Tensor& x, const Tensor& f, float lambda, float beta, Tensor& y, const OpMoments* moments) {
  constexpr const char* op = "residual_forward";
  expect_shape(op, "x", x, x.shape());
  expect_shape(op, "f", f, x.shape());
  expect_shape(op, "y", y, x.shape());
  const Device device = common_device(op, {&x, &f, &y});
  if (device == Device::cuda) {
#ifdef PROPLAB_WITH_CUDA
    accumulate_input(moments, f);
    kernels::residual_forward(x.f32(), f.f32(), lambda, beta, y.f32(), x.numel(), kernels::context().stream);
    accumulate_output(moments, y);
    return;
#else
    missing_device_impl("residual_forward", device);
#endif
  }

  residual_forward_cpu<false>(x, f, lambda, beta, y, moments);
}

void residual_backward(const Tensor& x, const Tensor& f, const Tensor& d_y, float lambda, float beta, Tensor* d_x,
                       Tensor* d_f, double* d_lambda, double* d_beta, const OpMoments* moments) {
  constexpr const char* op = "residual_backward";
  expect_shape(op, "x", x, x.shape());
  expect_shape(op, "f", f, x.shape());
  expect_shape(op, "d_y", d_y, x.shape());
  if (d_x) expect_shape(op, "d_x", *d_x, x.shape());
  if (d_f) expect_shape(op, "d_f", *d_f, x.shape());
  const Device device = common_device(op, {&x, &f, &d_y, d_x, d_f});
  if (device == Device::cuda) {
#ifdef PROPLAB_WITH_CUDA
    accumulate_input(moments, d_y);  // (d_x may alias d_y)
    kernels::residual_backward(x.f32(), f.f32(), d_y.f32(), lambda, beta, d_x ? d_x->f32() : nullptr,
                               d_f ? d_f->f32() : nullptr, d_lambda, d_beta, x.numel(), kernels::context().stream);
    if (d_f) accumulate_output(moments, *d_f);
    return;
#else
    missing_device_impl("residual_backward", device);
#endif
  }

  residual_backward_cpu<false>(x, f, nullptr, d_y, lambda, beta, d_x, d_f, d_lambda, d_beta, moments);
}

void residual_relu_forward(const Tensor& x, const Tensor& f, float lambda, float beta, Tensor& y,
                           const OpMoments* moments) {
  constexpr const char* op = "residual_relu_forward";
  expect_shape(op, "x", x, x.shape());
  expect_shape(op, "f", f, x.shape());
  expect_shape(op, "y", y, x.shape());
  if (common_device(op, {&x, &f, &y}) != Device::cpu) {
    accumulate_input(moments, f);
    residual_forward(x, f, lambda, beta, y);
    activation_forward(Activation::relu, y, y);
    accumulate_output(moments, y);
    return;
  }
  residual_forward_cpu<true>(x, f, lambda, beta, y, moments);
}

void residual_relu_backward(const Tensor& x, const Tensor& f, const Tensor& y, Tensor& d_y, float lambda, float beta,
                            Tensor* d_x, Tensor* d_f, double* d_lambda, double* d_beta, const OpMoments* moments) {
  constexpr const char* op = "residual_relu_backward";
  expect_shape(op, "x", x, x.shape());
  expect_shape(op, "f", f, x.shape());
  expect_shape(op, "y", y, x.shape());
  expect_shape(op, "d_y", d_y, x.shape());
  if (d_x) expect_shape(op, "d_x", *d_x, x.shape());
  if (d_f) expect_shape(op, "d_f", *d_f, x.shape());
  if (common_device(op, {&x, &f, &y, &d_y, d_x, d_f}) != Device::cpu) {
    accumulate_input(moments, d_y);
    activation_backward(Activation::relu, y, d_y, d_y);
    residual_backward(x, f, d_y, lambda, beta, d_x, d_f, d_lambda, d_beta);
    if (d_f) accumulate_output(moments, *d_f);
    return;
  }
  residual_backward_cpu<true>(x, f, &y, d_y, lambda, beta, d_x, d_f, d_lambda, d_beta, moments);
}

}  // namespace proplab::ops
