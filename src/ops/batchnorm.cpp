// ops/batchnorm: BatchNorm over (N, H, W) per channel of NCHW images (or [N, C] features), train and eval.
//
// One task per channel; each channel's sums run over samples in order, each sample's plane summed in double
// by 8 interleaved partial sums combined in a fixed order (so the loops vectorise), so every statistic and
// parameter gradient is bitwise the same for any thread count. Mean and variance are two-pass. The CUDA path
// (kernels/batchnorm.cuh) sums in double too, in fixed chunks per channel.
#include <cmath>
#include <cstdint>

#include "ops/dispatch.h"
#include "ops/ops.h"

#ifdef PROPLAB_WITH_CUDA
#include "kernels/batchnorm.cuh"
#endif

namespace proplab::ops {

namespace {

constexpr std::int64_t kParallelMin = 1 << 14;

struct ChannelShape {
  std::int64_t n = 0, c = 0, spatial = 1;
};

ChannelShape channel_shape(const char* op, const Tensor& x) {
  PROPLAB_CHECK(x.ndim() >= 2, "op '", op, "': x must be [N, C, ...], got ", shape_string(x.shape()));
  expect_shape(op, "x", x, x.shape());
  ChannelShape s;
  s.n = x.dim(0);
  s.c = x.dim(1);
  s.spatial = s.n * s.c > 0 ? x.numel() / (s.n * s.c) : 0;
  return s;
}

constexpr int kLanes = 8;

// Σ_p f(p) over [0, n) in double: kLanes interleaved partial sums (lane k takes p ≡ k mod kLanes), the tail into
// lane 0, combined pairwise in a fixed order. The order depends on n only.
template <typename F>
double lane_sum(std::int64_t n, F f) {
  double lanes[kLanes] = {};
  std::int64_t p = 0;
  for (; p + kLanes <= n; p += kLanes)
    for (int k = 0; k < kLanes; ++k) lanes[k] += f(p + k);
  for (; p < n; ++p) lanes[0] += f(p);
  return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

}  // namespace

void batchnorm_forward(const Tensor& x, const Tensor* gamma, const Tensor* beta, float eps, bool training,
                       float momentum, Tensor& running_mean, Tensor& running_var, Tensor& y, Tensor& mean,
                       Tensor& rstd) {
  constexpr const char* op = "batchnorm_forward";
  const ChannelShape s = channel_shape(op, x);
  if (gamma) expect_shape(op, "gamma", *gamma, {s.c});
  if (beta) expect_shape(op, "beta", *beta, {s.c});
  expect_shape(op, "running_mean", running_mean, {s.c});
  expect_shape(op, "running_var", running_var, {s.c});
  expect_shape(op, "y", y, x.shape());
  expect_shape(op, "mean", mean, {s.c});
  expect_shape(op, "rstd", rstd, {s.c});
  const Device device = common_device(op, {&x, gamma, beta, &running_mean, &running_var, &y, &mean, &rstd});
  const std::int64_t count = s.n * s.spatial;
  if (training)
    PROPLAB_CHECK(count > 1, "op '", op, "': training BatchNorm needs more than one value per channel, got ",
                  shape_string(x.shape()));
  if (device == Device::cuda) {
#ifdef PROPLAB_WITH_CUDA
    kernels::batchnorm_forward(x.f32(), gamma ? gamma->f32() : nullptr, beta ? beta->f32() : nullptr, eps, training,
                               momentum, running_mean.f32(), running_var.f32(), y.f32(), mean.f32(), rstd.f32(), s.n,
                               s.c, s.spatial);
    return;
#else
    missing_device_impl(op, device);
#endif
  }

  const float* x_data = x.f32();
  float* y_data = y.f32();
  float* mean_data = mean.f32();
  float* rstd_data = rstd.f32();
  float* running_mean_data = running_mean.f32();
  float* running_var_data = running_var.f32();
  const float* gamma_data = gamma ? gamma->f32() : nullptr;
  const float* beta_data = beta ? beta->f32() : nullptr;
#pragma omp parallel for schedule(static) if (x.numel() > kParallelMin)
  for (std::int64_t c = 0; c < s.c; ++c) {
    double channel_mean = 0.0, channel_var = 0.0;
    if (training) {
      for (std::int64_t b = 0; b < s.n; ++b) {
        const float* plane = x_data + (b * s.c + c) * s.spatial;
        channel_mean += lane_sum(s.spatial, [plane](std::int64_t p) { return static_cast<double>(plane[p]); });
      }
      channel_mean /= static_cast<double>(count);
      for (std::int64_t b = 0; b < s.n; ++b) {
        const float* plane = x_data + (b * s.c + c) * s.spatial;
        channel_var += lane_sum(s.spatial, [plane, channel_mean](std::int64_t p) {
          const double centred = plane[p] - channel_mean;
          return centred * centred;
        });
      }
      channel_var /= static_cast<double>(count);
      const double unbiased = channel_var * static_cast<double>(count) / static_cast<double>(count - 1);
      running_mean_data[c] = static_cast<float>((1.0 - momentum) * running_mean_data[c] + momentum * channel_mean);
      running_var_data[c] = static_cast<float>((1.0 - momentum) * running_var_data[c] + momentum * unbiased);
    } else {
      channel_mean = running_mean_data[c];
      channel_var = running_var_data[c];
    }
    const float m = static_cast<float>(channel_mean);
    const float r = static_cast<float>(1.0 / std::sqrt(channel_var + eps));
    mean_data[c] = m;
    rstd_data[c] = r;
    // y = x·a + b with a = r·gamma, b = beta − m·a.
    const float a = r * (gamma_data ? gamma_data[c] : 1.0f);
    const float shift = beta_data ? beta_data[c] : 0.0f;
    for (std::int64_t b = 0; b < s.n; ++b) {
      const float* plane = x_data + (b * s.c + c) * s.spatial;
      float* out = y_data + (b * s.c + c) * s.spatial;
#pragma omp simd
      for (std::int64_t p = 0; p < s.spatial; ++p) out[p] = (plane[p] - m) * a + shift;
    }
  }
}

void batchnorm_backward(const Tensor& x, const Tensor* gamma, const Tensor& mean, const Tensor& rstd, const Tensor& d_y,
                        bool training, Tensor& d_x, Tensor* d_gamma, Tensor* d_beta) {
  constexpr const char* op = "batchnorm_backward";
  const ChannelShape s = channel_shape(op, x);
  if (gamma) expect_shape(op, "gamma", *gamma, {s.c});
  expect_shape(op, "mean", mean, {s.c});
  expect_shape(op, "rstd", rstd, {s.c});
  expect_shape(op, "d_y", d_y, x.shape());
  expect_shape(op, "d_x", d_x, x.shape());
  if (d_gamma) expect_shape(op, "d_gamma", *d_gamma, {s.c});
  if (d_beta) expect_shape(op, "d_beta", *d_beta, {s.c});
  const Device device = common_device(op, {&x, gamma, &mean, &rstd, &d_y, &d_x, d_gamma, d_beta});
  if (device == Device::cuda) {
#ifdef PROPLAB_WITH_CUDA
    kernels::batchnorm_backward(x.f32(), gamma ? gamma->f32() : nullptr, mean.f32(), rstd.f32(), d_y.f32(), training,
                                d_x.f32(), d_gamma ? d_gamma->f32() : nullptr, d_beta ? d_beta->f32() : nullptr, s.n,
                                s.c, s.spatial);
    return;
#else
    missing_device_impl(op, device);
#endif
  }
  const std::int64_t count = s.n * s.spatial;

  const float* x_data = x.f32();
  const float* d_y_data = d_y.f32();
  float* d_x_data = d_x.f32();
  const float* gamma_data = gamma ? gamma->f32() : nullptr;
#pragma omp parallel for schedule(static) if (x.numel() > kParallelMin)
  for (std::int64_t c = 0; c < s.c; ++c) {
    const float m = mean.f32()[c], r = rstd.f32()[c];
    const float g = gamma_data ? gamma_data[c] : 1.0f;
    // Σ d_y and Σ d_y·x̂ over the channel.
    double sum_d_y = 0.0, sum_d_y_xhat = 0.0;
    for (std::int64_t b = 0; b < s.n; ++b) {
      const float* plane = x_data + (b * s.c + c) * s.spatial;
      const float* d_plane = d_y_data + (b * s.c + c) * s.spatial;
      sum_d_y += lane_sum(s.spatial, [d_plane](std::int64_t p) { return static_cast<double>(d_plane[p]); });
      sum_d_y_xhat += lane_sum(s.spatial, [plane, d_plane, m, r](std::int64_t p) {
        return static_cast<double>(d_plane[p]) * ((plane[p] - m) * r);
      });
    }
    if (d_gamma) d_gamma->f32()[c] += static_cast<float>(sum_d_y_xhat);
    if (d_beta) d_beta->f32()[c] += static_cast<float>(sum_d_y);
    // Training: d_x = g·r·(d_y − mean(d_y) − x̂·mean(d_y·x̂)); eval: the statistics are constants, d_x = g·r·d_y.
    const float gr = g * r;
    const float mean_d_y = training ? static_cast<float>(sum_d_y / static_cast<double>(count)) : 0.0f;
    const float mean_d_y_xhat = training ? static_cast<float>(sum_d_y_xhat / static_cast<double>(count)) : 0.0f;
    for (std::int64_t b = 0; b < s.n; ++b) {
      const float* plane = x_data + (b * s.c + c) * s.spatial;
      const float* d_plane = d_y_data + (b * s.c + c) * s.spatial;
      float* out = d_x_data + (b * s.c + c) * s.spatial;
#pragma omp simd
      for (std::int64_t p = 0; p < s.spatial; ++p)
        out[p] = gr * (d_plane[p] - mean_d_y - (plane[p] - m) * r * mean_d_y_xhat);
    }
  }
}

}  // namespace proplab::ops
