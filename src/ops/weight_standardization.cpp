// ops/weight_standardization: scaled weight standardisation (Brock et al. 2021, NF-Nets) per output row.
//
// w_hat[o, j] = gain[o]·scale·(w[o, j] − μ_o)·r_o with r_o = 1/sqrt(fan_in·var_o + eps). With x̂ = (w − μ)·r and
// g_j = d_w_hat[o, j]·gain[o]·scale, d_w[o, j] = r_o·(g_j − mean(g) − x̂_j·Σ_i g_i·x̂_i) (Σ, not mean: x̂ has
// squared norm ≈ 1 rather than variance 1), d_gain[o] = scale·Σ_j d_w_hat[o, j]·x̂_j. One task per row, sums
// in double in a fixed order: bitwise the same for any thread count. The CUDA path
// (kernels/weight_standardization.cuh) runs one block per row, its sums in double too.
#include <cmath>
#include <cstdint>

#include "ops/dispatch.h"
#include "ops/ops.h"

#ifdef PROPLAB_WITH_CUDA
#include "kernels/weight_standardization.cuh"
#endif

namespace proplab::ops {

namespace {
constexpr std::int64_t kParallelMin = 1 << 14;

struct RowsOfWeight {
  std::int64_t rows = 0, fan_in = 0;
};

RowsOfWeight rows_of(const char* op, const Tensor& weight) {
  PROPLAB_CHECK(weight.ndim() >= 2, "op '", op, "': weight must be [C_out, ...], got ", shape_string(weight.shape()));
  expect_shape(op, "weight", weight, weight.shape());
  RowsOfWeight r;
  r.rows = weight.dim(0);
  r.fan_in = r.rows > 0 ? weight.numel() / r.rows : 0;
  PROPLAB_CHECK(r.fan_in > 0, "op '", op, "': weight ", shape_string(weight.shape()), " has no fan-in");
  return r;
}
}  // namespace

void weight_standardize_forward(const Tensor& weight, const Tensor* gain, float scale, float eps, Tensor& w_hat,
                                Tensor& mean, Tensor& rstd) {
  constexpr const char* op = "weight_standardize_forward";
  const RowsOfWeight shape = rows_of(op, weight);
  if (gain) expect_shape(op, "gain", *gain, {shape.rows});
  expect_shape(op, "w_hat", w_hat, weight.shape());
  expect_shape(op, "mean", mean, {shape.rows});
  expect_shape(op, "rstd", rstd, {shape.rows});
  const Device device = common_device(op, {&weight, gain, &w_hat, &mean, &rstd});
  if (device == Device::cuda) {
#ifdef PROPLAB_WITH_CUDA
    kernels::weight_standardize_forward(weight.f32(), gain ? gain->f32() : nullptr, scale, eps, w_hat.f32(), mean.f32(),
                                        rstd.f32(), shape.rows, shape.fan_in);
    return;
#else
    missing_device_impl(op, device);
#endif
  }
  const std::int64_t n = shape.fan_in;
  const float* w = weight.f32();
  float* out = w_hat.f32();
#pragma omp parallel for schedule(static) if (weight.numel() > kParallelMin)
  for (std::int64_t o = 0; o < shape.rows; ++o) {
    const float* row = w + o * n;
    double sum = 0.0;
    for (std::int64_t j = 0; j < n; ++j) sum += row[j];
    const double row_mean = sum / static_cast<double>(n);
    double sum_sq = 0.0;
    for (std::int64_t j = 0; j < n; ++j) sum_sq += (row[j] - row_mean) * (row[j] - row_mean);
    // fan_in·var = Σ (w − μ)².
    const float r = static_cast<float>(1.0 / std::sqrt(sum_sq + eps));
    const float m = static_cast<float>(row_mean);
    mean.f32()[o] = m;
    rstd.f32()[o] = r;
    const float a = r * scale * (gain ? gain->f32()[o] : 1.0f);
#pragma omp simd
    for (std::int64_t j = 0; j < n; ++j) out[o * n + j] = (row[j] - m) * a;
  }
}

void weight_standardize_backward(const Tensor& weight, const Tensor* gain, float scale, const Tensor& mean,
                                 const Tensor& rstd, const Tensor& d_w_hat, Tensor& d_weight, Tensor* d_gain) {
  constexpr const char* op = "weight_standardize_backward";
  const RowsOfWeight shape = rows_of(op, weight);
  if (gain) expect_shape(op, "gain", *gain, {shape.rows});
  expect_shape(op, "mean", mean, {shape.rows});
  expect_shape(op, "rstd", rstd, {shape.rows});
  expect_shape(op, "d_w_hat", d_w_hat, weight.shape());
  expect_shape(op, "d_weight", d_weight, weight.shape());
  if (d_gain) expect_shape(op, "d_gain", *d_gain, {shape.rows});
  const Device device = common_device(op, {&weight, gain, &mean, &rstd, &d_w_hat, &d_weight, d_gain});
  if (device == Device::cuda) {
#ifdef PROPLAB_WITH_CUDA
    kernels::weight_standardize_backward(weight.f32(), gain ? gain->f32() : nullptr, scale, mean.f32(), rstd.f32(),
                                         d_w_hat.f32(), d_weight.f32(), d_gain ? d_gain->f32() : nullptr, shape.rows,
                                         shape.fan_in);
    return;
#else
    missing_device_impl(op, device);
#endif
  }
  const std::int64_t n = shape.fan_in;
  const float* w = weight.f32();
  const float* d_out = d_w_hat.f32();
  float* d_w = d_weight.f32();
#pragma omp parallel for schedule(static) if (weight.numel() > kParallelMin)
  for (std::int64_t o = 0; o < shape.rows; ++o) {
    const float m = mean.f32()[o], r = rstd.f32()[o];
    const float a = scale * (gain ? gain->f32()[o] : 1.0f);
    const float* row = w + o * n;
    const float* d_row = d_out + o * n;
    double sum_d = 0.0, sum_d_xhat = 0.0;
    for (std::int64_t j = 0; j < n; ++j) {
      sum_d += d_row[j];
      sum_d_xhat += static_cast<double>(d_row[j]) * ((row[j] - m) * r);
    }
    if (d_gain) d_gain->f32()[o] += static_cast<float>(scale * sum_d_xhat);
    const float mean_g = static_cast<float>(a * sum_d / static_cast<double>(n));
    const float sum_g_xhat = static_cast<float>(a * sum_d_xhat);
#pragma omp simd
    for (std::int64_t j = 0; j < n; ++j) d_w[o * n + j] += r * (a * d_row[j] - mean_g - (row[j] - m) * r * sum_g_xhat);
  }
}

}  // namespace proplab::ops
