// ops/batchnorm: BatchNorm over (N, H, W) per channel of NCHW images (or [N, C] features), train and eval, alone
// or fused with the ReLU after it (one pass less over memory each way), or in the forward with a post-activation
// residual block's sum and ReLU (the branch tensor never written).
//
// One task per channel; each channel's sums run over samples in order, each sample's plane summed in double
// by 8 interleaved partial sums combined in a fixed order (so the loops vectorise), so every statistic and
// parameter gradient is bitwise the same for any thread count. Mean and variance are two-pass. The CUDA path
// (kernels/batchnorm.cuh) sums in double too, in fixed chunks per channel.
#include <cmath>
#include <cstdint>
#include <utility>

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

// What the CPU forward's last pass writes: batchnorm(x); relu(batchnorm(x)) (activation_forward's relu);
// relu(λ·shortcut + β·batchnorm(x)) (residual_relu_forward's arithmetic).
enum class Epilogue { none, relu, residual_relu };
// The residual epilogue's operands.
struct ResidualArgs {
  const float* shortcut = nullptr;
  float lambda = 1.0f, beta = 1.0f;
};

// The CPU forward, its last pass per Epilogue (the same arithmetic as the separate ops, so bitwise the same).
template <Epilogue kEpilogue>
void batchnorm_forward_cpu(const Tensor& x, const Tensor* gamma, const Tensor* beta, float eps, bool training,
                           float momentum, Tensor& running_mean, Tensor& running_var, Tensor& y, Tensor& mean,
                           Tensor& rstd, const ChannelShape& s, const ResidualArgs& residual = {}) {
  const std::int64_t count = s.n * s.spatial;
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
      if constexpr (kEpilogue == Epilogue::relu) {
#pragma omp simd
        for (std::int64_t p = 0; p < s.spatial; ++p) {
          const float v = (plane[p] - m) * a + shift;
          out[p] = v < 0.0f ? 0.0f : v;  // activation_forward's relu (relu(NaN) = NaN)
        }
      } else if constexpr (kEpilogue == Epilogue::residual_relu) {
        const float* shortcut = residual.shortcut + (b * s.c + c) * s.spatial;
        const float lambda = residual.lambda, scale = residual.beta;
#pragma omp simd
        for (std::int64_t p = 0; p < s.spatial; ++p) {
          const float f = (plane[p] - m) * a + shift;
          const float v = lambda * shortcut[p] + scale * f;  // residual_relu_forward's sum and relu
          out[p] = v < 0.0f ? 0.0f : v;
        }
      } else {
#pragma omp simd
        for (std::int64_t p = 0; p < s.spatial; ++p) out[p] = (plane[p] - m) * a + shift;
      }
    }
  }
}

// The CPU backward; kRelu: d_y is dL/dz of z = relu(normalised value), masked by z > 0 first.
template <bool kRelu>
void batchnorm_backward_cpu(const Tensor& x, const Tensor* gamma, const Tensor& mean, const Tensor& rstd,
                            const Tensor* z, const Tensor& d_y, bool training, Tensor& d_x, Tensor* d_gamma,
                            Tensor* d_beta, const ChannelShape& s) {
  const std::int64_t count = s.n * s.spatial;

  const float* x_data = x.f32();
  const float* d_y_data = d_y.f32();
  const float* z_data = kRelu ? z->f32() : nullptr;
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
      if constexpr (kRelu) {
        // dL/d(normalised value) = d_y through the ReLU's mask (activation_backward's relu), written into d_x's
        // plane (d_x may be d_y) and summed from there while it is in cache.
        const float* z_plane = z_data + (b * s.c + c) * s.spatial;
        float* g_plane = d_x_data + (b * s.c + c) * s.spatial;
#pragma omp simd
        for (std::int64_t p = 0; p < s.spatial; ++p) g_plane[p] = z_plane[p] > 0.0f ? d_plane[p] : 0.0f;
        d_plane = g_plane;
      }
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
      if constexpr (kRelu) d_plane = out;  // the masked gradient, written there by the first pass
#pragma omp simd
      for (std::int64_t p = 0; p < s.spatial; ++p)
        out[p] = gr * (d_plane[p] - mean_d_y - (plane[p] - m) * r * mean_d_y_xhat);
    }
  }
}

// The forward's arguments checked (y: the output, named `y_name`); returns the shape and the device.
std::pair<ChannelShape, Device> check_forward(const char* op, const Tensor& x, const Tensor* gamma, const Tensor* beta,
                                              bool training, const Tensor& running_mean, const Tensor& running_var,
                                              const char* y_name, const Tensor& y, const Tensor& mean,
                                              const Tensor& rstd) {
  const ChannelShape s = channel_shape(op, x);
  if (gamma) expect_shape(op, "gamma", *gamma, {s.c});
  if (beta) expect_shape(op, "beta", *beta, {s.c});
  expect_shape(op, "running_mean", running_mean, {s.c});
  expect_shape(op, "running_var", running_var, {s.c});
  expect_shape(op, y_name, y, x.shape());
  expect_shape(op, "mean", mean, {s.c});
  expect_shape(op, "rstd", rstd, {s.c});
  const Device device = common_device(op, {&x, gamma, beta, &running_mean, &running_var, &y, &mean, &rstd});
  if (training)
    PROPLAB_CHECK(s.n * s.spatial > 1, "op '", op, "': training BatchNorm needs more than one value per channel, got ",
                  shape_string(x.shape()));
  return {s, device};
}

// The backward's arguments checked (d_y: the incoming gradient, named `d_y_name`; z: the fused ReLU's output).
std::pair<ChannelShape, Device> check_backward(const char* op, const Tensor& x, const Tensor* gamma, const Tensor& mean,
                                               const Tensor& rstd, const Tensor* z, const char* d_y_name,
                                               const Tensor& d_y, const Tensor& d_x, const Tensor* d_gamma,
                                               const Tensor* d_beta) {
  const ChannelShape s = channel_shape(op, x);
  if (gamma) expect_shape(op, "gamma", *gamma, {s.c});
  expect_shape(op, "mean", mean, {s.c});
  expect_shape(op, "rstd", rstd, {s.c});
  if (z) expect_shape(op, "z", *z, x.shape());
  expect_shape(op, d_y_name, d_y, x.shape());
  expect_shape(op, "d_x", d_x, x.shape());
  if (d_gamma) expect_shape(op, "d_gamma", *d_gamma, {s.c});
  if (d_beta) expect_shape(op, "d_beta", *d_beta, {s.c});
  const Device device = common_device(op, {&x, gamma, &mean, &rstd, z, &d_y, &d_x, d_gamma, d_beta});
  return {s, device};
}

}  // namespace

void batchnorm_forward(const Tensor& x, const Tensor* gamma, const Tensor* beta, float eps, bool training,
                       float momentum, Tensor& running_mean, Tensor& running_var, Tensor& y, Tensor& mean,
                       Tensor& rstd) {
  constexpr const char* op = "batchnorm_forward";
  const auto [s, device] = check_forward(op, x, gamma, beta, training, running_mean, running_var, "y", y, mean, rstd);
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
  batchnorm_forward_cpu<Epilogue::none>(x, gamma, beta, eps, training, momentum, running_mean, running_var, y, mean,
                                        rstd, s);
}

void batchnorm_backward(const Tensor& x, const Tensor* gamma, const Tensor& mean, const Tensor& rstd, const Tensor& d_y,
                        bool training, Tensor& d_x, Tensor* d_gamma, Tensor* d_beta) {
  constexpr const char* op = "batchnorm_backward";
  const auto [s, device] = check_backward(op, x, gamma, mean, rstd, nullptr, "d_y", d_y, d_x, d_gamma, d_beta);
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
  batchnorm_backward_cpu<false>(x, gamma, mean, rstd, nullptr, d_y, training, d_x, d_gamma, d_beta, s);
}

void batchnorm_relu_forward(const Tensor& x, const Tensor* gamma, const Tensor* beta, float eps, bool training,
                            float momentum, Tensor& running_mean, Tensor& running_var, Tensor& z, Tensor& mean,
                            Tensor& rstd) {
  constexpr const char* op = "batchnorm_relu_forward";
  const auto [s, device] = check_forward(op, x, gamma, beta, training, running_mean, running_var, "z", z, mean, rstd);
  if (device != Device::cpu) {
    // The two ops (their kernels), the normalised values held in z until the ReLU.
    batchnorm_forward(x, gamma, beta, eps, training, momentum, running_mean, running_var, z, mean, rstd);
    activation_forward(Activation::relu, z, z);
    return;
  }
  batchnorm_forward_cpu<Epilogue::relu>(x, gamma, beta, eps, training, momentum, running_mean, running_var, z, mean,
                                        rstd, s);
}

void batchnorm_residual_relu_forward(const Tensor& x, const Tensor* gamma, const Tensor* beta, float eps, bool training,
                                     float momentum, Tensor& running_mean, Tensor& running_var, const Tensor& shortcut,
                                     float lambda, float branch_scale, Tensor& out, Tensor& mean, Tensor& rstd) {
  constexpr const char* op = "batchnorm_residual_relu_forward";
  const auto [s, device] =
      check_forward(op, x, gamma, beta, training, running_mean, running_var, "out", out, mean, rstd);
  expect_shape(op, "shortcut", shortcut, x.shape());
  PROPLAB_CHECK(common_device(op, {&x, &shortcut, &out}) == device, "op '", op, "': shortcut on another device");
  PROPLAB_CHECK(out.raw() != shortcut.raw() && out.raw() != x.raw(), "op '", op,
                "': out may alias neither x nor shortcut");
  if (device != Device::cpu) {
    // The two ops (their kernels), the normalised values held in out until the sum.
    batchnorm_forward(x, gamma, beta, eps, training, momentum, running_mean, running_var, out, mean, rstd);
    residual_relu_forward(shortcut, out, lambda, branch_scale, out);
    return;
  }
  batchnorm_forward_cpu<Epilogue::residual_relu>(x, gamma, beta, eps, training, momentum, running_mean, running_var,
                                                 out, mean, rstd, s,
                                                 ResidualArgs{shortcut.f32(), lambda, branch_scale});
}

void batchnorm_relu_backward(const Tensor& x, const Tensor* gamma, const Tensor& mean, const Tensor& rstd,
                             const Tensor& z, const Tensor& d_z, bool training, Tensor& d_x, Tensor* d_gamma,
                             Tensor* d_beta) {
  constexpr const char* op = "batchnorm_relu_backward";
  const auto [s, device] = check_backward(op, x, gamma, mean, rstd, &z, "d_z", d_z, d_x, d_gamma, d_beta);
  if (device != Device::cpu) {
    // The two ops: the ReLU's mask (z > 0 where the normalised value is > 0) into d_x, then BatchNorm in place.
    activation_backward(Activation::relu, z, d_z, d_x);
    batchnorm_backward(x, gamma, mean, rstd, d_x, training, d_x, d_gamma, d_beta);
    return;
  }
  batchnorm_backward_cpu<true>(x, gamma, mean, rstd, &z, d_z, training, d_x, d_gamma, d_beta, s);
}

}  // namespace proplab::ops
