// ops/norm: LayerNorm and RMSNorm over the last dimension, with or without the affine gamma (and beta).
//
// x may carry any leading dimensions; they are flattened into rows and the saved statistics (mean, rstd) have
// one entry per row, shaped [rows] or like x's leading dimensions. Row statistics use a two-pass mean/variance so
// a large mean does not cancel the variance. d_gamma/d_beta are summed over fixed row chunks (a function of the
// row count only) into double partials, combined in chunk order: bitwise the same for any thread count.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "ops/dispatch.h"
#include "ops/gather.h"
#include "ops/ops.h"

#ifdef PROPLAB_WITH_CUDA
#include "kernels/norm.cuh"
#endif

namespace proplab::ops {

namespace {

constexpr std::int64_t kParallelMin = 1 << 15;
// Parameter-gradient row chunks: at most this many (enough to feed every core) and at least kMinChunkRows rows.
constexpr std::int64_t kMaxRowChunks = 64;
constexpr std::int64_t kMinChunkRows = 8;
// Columns per task when combining the chunk partials.
constexpr std::int64_t kCombineColumns = 256;

struct RowShape {
  std::int64_t rows = 0;
  std::int64_t features = 0;
};

RowShape row_shape(const char* op, const Tensor& x) {
  PROPLAB_CHECK(x.ndim() >= 1, "op '", op, "': x must be [rows, D], got ", shape_string(x.shape()));
  expect_shape(op, "x", x, x.shape());
  RowShape shape;
  shape.features = x.dim(-1);
  shape.rows = shape_numel(Shape(x.shape().begin(), x.shape().end() - 1));
  return shape;
}

// A per-row statistic may be [rows] or shaped like x's leading dimensions.
void expect_row_stat(const char* op, const char* what, const Tensor& stat, const Tensor& x) {
  const Shape leading(x.shape().begin(), x.shape().end() - 1);
  const Shape flat{shape_numel(leading)};
  expect_shape(op, what, stat, stat.defined() && stat.shape() == flat ? flat : leading);
}

// Fixed row chunking for the parameter-gradient partial sums; depends on the row count only.
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

// Scratch for the chunk partials, reused across calls on the calling thread (no allocation per step).
double* partial_scratch(std::size_t count) {
  thread_local std::vector<double> scratch;
  if (scratch.size() < count) scratch.resize(count);
  return scratch.data();
}

// grad[j] += Σ_c partial[c * features + j], summed in chunk order.
void combine_partials(const double* partial, std::int64_t chunks, std::int64_t features, float* grad) {
  const std::int64_t blocks = (features + kCombineColumns - 1) / kCombineColumns;
#pragma omp parallel for schedule(static) if (chunks * features > kParallelMin)
  for (std::int64_t block = 0; block < blocks; ++block) {
    const std::int64_t begin = block * kCombineColumns;
    const std::int64_t end = std::min(features, begin + kCombineColumns);
    double sums[kCombineColumns];
    for (std::int64_t j = begin; j < end; ++j) sums[j - begin] = partial[j];
    for (std::int64_t c = 1; c < chunks; ++c) {
      const double* row = partial + c * features;
#pragma omp simd
      for (std::int64_t j = begin; j < end; ++j) sums[j - begin] += row[j];
    }
    for (std::int64_t j = begin; j < end; ++j) grad[j] += static_cast<float>(sums[j - begin]);
  }
}

// One row of layernorm_forward: y_row, and the row's mean and rstd.
template <bool kGamma, bool kBeta>
inline void layernorm_forward_row(const float* x_row, const float* gamma, const float* beta, float eps, std::int64_t d,
                                  float* y_row, float& mean, float& rstd) {
  const float inv_d = 1.0f / static_cast<float>(d);
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (std::int64_t j = 0; j < d; ++j) sum += x_row[j];
  const float row_mean = sum * inv_d;
  float sum_sq = 0.0f;
#pragma omp simd reduction(+ : sum_sq)
  for (std::int64_t j = 0; j < d; ++j) {
    const float centered = x_row[j] - row_mean;
    sum_sq += centered * centered;
  }
  const float row_rstd = 1.0f / std::sqrt(sum_sq * inv_d + eps);
  mean = row_mean;
  rstd = row_rstd;
#pragma omp simd
  for (std::int64_t j = 0; j < d; ++j) {
    float value = (x_row[j] - row_mean) * row_rstd;
    if constexpr (kGamma) value *= gamma[j];
    if constexpr (kBeta) value += beta[j];
    y_row[j] = value;
  }
}

// One row of rmsnorm_forward: y_row and the row's rstd.
template <bool kGamma>
inline void rmsnorm_forward_row(const float* x_row, const float* gamma, float eps, std::int64_t d, float* y_row,
                                float& rstd) {
  const float inv_d = 1.0f / static_cast<float>(d);
  float sum_sq = 0.0f;
#pragma omp simd reduction(+ : sum_sq)
  for (std::int64_t j = 0; j < d; ++j) sum_sq += x_row[j] * x_row[j];
  const float row_rstd = 1.0f / std::sqrt(sum_sq * inv_d + eps);
  rstd = row_rstd;
#pragma omp simd
  for (std::int64_t j = 0; j < d; ++j) {
    float value = x_row[j] * row_rstd;
    if constexpr (kGamma) value *= gamma[j];
    y_row[j] = value;
  }
}

// A norm's forward over its rows: row(r) computes row r (and saves its statistics). With `moments`, the output's
// statistics are gathered as the rows are computed (ops::OpMoments; the input is not a norm's to gather: null);
// `output_row(r, buffer)` computes row r into `buffer` alone (the output's shift samples), as row(r) would.
template <typename Row, typename OutputRow>
void norm_forward_rows(const Tensor& x, Tensor& y, RowShape shape, const OpMoments* moments, Row row,
                       OutputRow output_row) {
  const std::int64_t d = shape.features;
  auto compute = [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t r = begin / d; r < end / d; ++r) row(r);
  };
  auto output_at = [&](std::int64_t i) {
    thread_local std::vector<float> buffer;
    buffer.resize(static_cast<std::size_t>(d));
    output_row(i / d, buffer.data());
    return buffer[static_cast<std::size_t>(i % d)];
  };
  PROPLAB_CHECK(moments == nullptr || moments->input == nullptr, "a norm gathers its output's moments only");
  if (gather_moments(moments, x, y, kParallelMin, compute, output_at, true, true)) return;
#pragma omp parallel for schedule(static) if (shape.rows * d > kParallelMin)
  for (std::int64_t r = 0; r < shape.rows; ++r) row(r);
}

template <bool kGamma, bool kBeta>
void layernorm_forward_rows(const Tensor& x, const float* gamma, const float* beta, float eps, RowShape shape,
                            Tensor& y, float* mean, float* rstd, const OpMoments* moments) {
  const std::int64_t d = shape.features;
  const float* x_data = x.f32();
  float* y_data = y.f32();
  norm_forward_rows(
      x, y, shape, moments,
      [=](std::int64_t r) {
        layernorm_forward_row<kGamma, kBeta>(x_data + r * d, gamma, beta, eps, d, y_data + r * d, mean[r], rstd[r]);
      },
      [=](std::int64_t r, float* buffer) {
        float row_mean, row_rstd;
        layernorm_forward_row<kGamma, kBeta>(x_data + r * d, gamma, beta, eps, d, buffer, row_mean, row_rstd);
      });
}

// d_x (overwrite) and, when d_gamma_partial/d_beta_partial are given, the per-chunk parameter partials.
template <bool kGamma>
void layernorm_backward_rows(const float* x, const float* gamma, const float* mean, const float* rstd, const float* d_y,
                             RowShape shape, RowChunks chunks, float* d_x, double* d_gamma_partial,
                             double* d_beta_partial) {
  const std::int64_t d = shape.features;
  const float inv_d = 1.0f / static_cast<float>(d);
#pragma omp parallel for schedule(static) if (shape.rows * d > kParallelMin)
  for (std::int64_t c = 0; c < chunks.count; ++c) {
    double* gamma_acc = d_gamma_partial ? d_gamma_partial + c * d : nullptr;
    double* beta_acc = d_beta_partial ? d_beta_partial + c * d : nullptr;
    if (gamma_acc) std::fill(gamma_acc, gamma_acc + d, 0.0);
    if (beta_acc) std::fill(beta_acc, beta_acc + d, 0.0);
    const std::int64_t row_end = std::min(shape.rows, (c + 1) * chunks.rows_per_chunk);
    for (std::int64_t r = c * chunks.rows_per_chunk; r < row_end; ++r) {
      const float* x_row = x + r * d;
      const float* d_y_row = d_y + r * d;
      float* d_x_row = d_x + r * d;
      const float row_mean = mean[r], row_rstd = rstd[r];
      float sum_g = 0.0f, sum_g_xhat = 0.0f;
#pragma omp simd reduction(+ : sum_g, sum_g_xhat)
      for (std::int64_t j = 0; j < d; ++j) {
        const float xhat = (x_row[j] - row_mean) * row_rstd;
        const float g = kGamma ? d_y_row[j] * gamma[j] : d_y_row[j];
        sum_g += g;
        sum_g_xhat += g * xhat;
      }
      const float mean_g = sum_g * inv_d, mean_g_xhat = sum_g_xhat * inv_d;
      if (gamma_acc) {
#pragma omp simd
        for (std::int64_t j = 0; j < d; ++j) gamma_acc[j] += d_y_row[j] * ((x_row[j] - row_mean) * row_rstd);
      }
      if (beta_acc) {
#pragma omp simd
        for (std::int64_t j = 0; j < d; ++j) beta_acc[j] += d_y_row[j];
      }
      // Written last: d_x may alias d_y.
#pragma omp simd
      for (std::int64_t j = 0; j < d; ++j) {
        const float xhat = (x_row[j] - row_mean) * row_rstd;
        const float g = kGamma ? d_y_row[j] * gamma[j] : d_y_row[j];
        d_x_row[j] = row_rstd * (g - mean_g - xhat * mean_g_xhat);
      }
    }
  }
}

template <bool kGamma>
void rmsnorm_forward_rows(const Tensor& x, const float* gamma, float eps, RowShape shape, Tensor& y, float* rstd,
                          const OpMoments* moments) {
  const std::int64_t d = shape.features;
  const float* x_data = x.f32();
  float* y_data = y.f32();
  norm_forward_rows(
      x, y, shape, moments,
      [=](std::int64_t r) { rmsnorm_forward_row<kGamma>(x_data + r * d, gamma, eps, d, y_data + r * d, rstd[r]); },
      [=](std::int64_t r, float* buffer) {
        float row_rstd;
        rmsnorm_forward_row<kGamma>(x_data + r * d, gamma, eps, d, buffer, row_rstd);
      });
}

template <bool kGamma>
void rmsnorm_backward_rows(const float* x, const float* gamma, const float* rstd, const float* d_y, RowShape shape,
                           RowChunks chunks, float* d_x, double* d_gamma_partial) {
  const std::int64_t d = shape.features;
  const float inv_d = 1.0f / static_cast<float>(d);
#pragma omp parallel for schedule(static) if (shape.rows * d > kParallelMin)
  for (std::int64_t c = 0; c < chunks.count; ++c) {
    double* gamma_acc = d_gamma_partial ? d_gamma_partial + c * d : nullptr;
    if (gamma_acc) std::fill(gamma_acc, gamma_acc + d, 0.0);
    const std::int64_t row_end = std::min(shape.rows, (c + 1) * chunks.rows_per_chunk);
    for (std::int64_t r = c * chunks.rows_per_chunk; r < row_end; ++r) {
      const float* x_row = x + r * d;
      const float* d_y_row = d_y + r * d;
      float* d_x_row = d_x + r * d;
      const float row_rstd = rstd[r];
      float sum_g_xhat = 0.0f;
#pragma omp simd reduction(+ : sum_g_xhat)
      for (std::int64_t j = 0; j < d; ++j) {
        const float g = kGamma ? d_y_row[j] * gamma[j] : d_y_row[j];
        sum_g_xhat += g * (x_row[j] * row_rstd);
      }
      const float mean_g_xhat = sum_g_xhat * inv_d;
      if (gamma_acc) {
#pragma omp simd
        for (std::int64_t j = 0; j < d; ++j) gamma_acc[j] += d_y_row[j] * (x_row[j] * row_rstd);
      }
      // Written last: d_x may alias d_y.
#pragma omp simd
      for (std::int64_t j = 0; j < d; ++j) {
        const float xhat = x_row[j] * row_rstd;
        const float g = kGamma ? d_y_row[j] * gamma[j] : d_y_row[j];
        d_x_row[j] = row_rstd * (g - xhat * mean_g_xhat);
      }
    }
  }
}

}  // namespace

void layernorm_forward(const Tensor& x, const Tensor* gamma, const Tensor* beta, float eps, Tensor& y, Tensor& mean,
                       Tensor& rstd, const OpMoments* moments) {
  constexpr const char* op = "layernorm_forward";
  const RowShape shape = row_shape(op, x);
  if (gamma) expect_shape(op, "gamma", *gamma, {shape.features});
  if (beta) expect_shape(op, "beta", *beta, {shape.features});
  expect_shape(op, "y", y, x.shape());
  expect_row_stat(op, "mean", mean, x);
  expect_row_stat(op, "rstd", rstd, x);
  PROPLAB_CHECK(eps >= 0.0f, "op '", op, "': eps must be >= 0, got ", eps);
  const Device device = common_device(op, {&x, gamma, beta, &y, &mean, &rstd});
  if (device == Device::cuda) {
#ifdef PROPLAB_WITH_CUDA
    kernels::layernorm_forward(x.f32(), gamma ? gamma->f32() : nullptr, beta ? beta->f32() : nullptr, eps, shape.rows,
                               shape.features, y.f32(), mean.f32(), rstd.f32());
    accumulate_output(moments, y);
    return;
#else
    missing_device_impl(op, device);
#endif
  }
  if (shape.features == 0) return;

  const float* g = gamma ? gamma->f32() : nullptr;
  const float* b = beta ? beta->f32() : nullptr;
  if (g && b)
    layernorm_forward_rows<true, true>(x, g, b, eps, shape, y, mean.f32(), rstd.f32(), moments);
  else if (g)
    layernorm_forward_rows<true, false>(x, g, b, eps, shape, y, mean.f32(), rstd.f32(), moments);
  else if (b)
    layernorm_forward_rows<false, true>(x, g, b, eps, shape, y, mean.f32(), rstd.f32(), moments);
  else
    layernorm_forward_rows<false, false>(x, g, b, eps, shape, y, mean.f32(), rstd.f32(), moments);
}

void layernorm_backward(const Tensor& x, const Tensor* gamma, const Tensor& mean, const Tensor& rstd, const Tensor& d_y,
                        Tensor& d_x, Tensor* d_gamma, Tensor* d_beta) {
  constexpr const char* op = "layernorm_backward";
  const RowShape shape = row_shape(op, x);
  if (gamma) expect_shape(op, "gamma", *gamma, {shape.features});
  expect_row_stat(op, "mean", mean, x);
  expect_row_stat(op, "rstd", rstd, x);
  expect_shape(op, "d_y", d_y, x.shape());
  expect_shape(op, "d_x", d_x, x.shape());
  PROPLAB_CHECK(d_gamma == nullptr || gamma != nullptr, "op '", op, "': d_gamma given without gamma");
  if (d_gamma) expect_shape(op, "d_gamma", *d_gamma, {shape.features});
  if (d_beta) expect_shape(op, "d_beta", *d_beta, {shape.features});
  const Device device = common_device(op, {&x, gamma, &mean, &rstd, &d_y, &d_x, d_gamma, d_beta});
  if (device == Device::cuda) {
#ifdef PROPLAB_WITH_CUDA
    kernels::layernorm_backward(x.f32(), gamma ? gamma->f32() : nullptr, mean.f32(), rstd.f32(), d_y.f32(), shape.rows,
                                shape.features, d_x.f32(), d_gamma ? d_gamma->f32() : nullptr,
                                d_beta ? d_beta->f32() : nullptr);
    return;
#else
    missing_device_impl(op, device);
#endif
  }
  if (shape.features == 0 || shape.rows == 0) return;

  const RowChunks chunks = row_chunks(shape.rows);
  const std::int64_t partial_size = chunks.count * shape.features;
  double* scratch = (d_gamma || d_beta) ? partial_scratch(static_cast<std::size_t>(2 * partial_size)) : nullptr;
  double* gamma_partial = d_gamma ? scratch : nullptr;
  double* beta_partial = d_beta ? scratch + partial_size : nullptr;
  if (gamma)
    layernorm_backward_rows<true>(x.f32(), gamma->f32(), mean.f32(), rstd.f32(), d_y.f32(), shape, chunks, d_x.f32(),
                                  gamma_partial, beta_partial);
  else
    layernorm_backward_rows<false>(x.f32(), nullptr, mean.f32(), rstd.f32(), d_y.f32(), shape, chunks, d_x.f32(),
                                   gamma_partial, beta_partial);
  if (d_gamma) combine_partials(gamma_partial, chunks.count, shape.features, d_gamma->f32());
  if (d_beta) combine_partials(beta_partial, chunks.count, shape.features, d_beta->f32());
}

void rmsnorm_forward(const Tensor& x, const Tensor* gamma, float eps, Tensor& y, Tensor& rstd,
                     const OpMoments* moments) {
  constexpr const char* op = "rmsnorm_forward";
  const RowShape shape = row_shape(op, x);
  if (gamma) expect_shape(op, "gamma", *gamma, {shape.features});
  expect_shape(op, "y", y, x.shape());
  expect_row_stat(op, "rstd", rstd, x);
  PROPLAB_CHECK(eps >= 0.0f, "op '", op, "': eps must be >= 0, got ", eps);
  const Device device = common_device(op, {&x, gamma, &y, &rstd});
  if (device == Device::cuda) {
#ifdef PROPLAB_WITH_CUDA
    kernels::rmsnorm_forward(x.f32(), gamma ? gamma->f32() : nullptr, eps, shape.rows, shape.features, y.f32(),
                             rstd.f32());
    accumulate_output(moments, y);
    return;
#else
    missing_device_impl(op, device);
#endif
  }
  if (shape.features == 0) return;

  if (gamma)
    rmsnorm_forward_rows<true>(x, gamma->f32(), eps, shape, y, rstd.f32(), moments);
  else
    rmsnorm_forward_rows<false>(x, nullptr, eps, shape, y, rstd.f32(), moments);
}

void rmsnorm_backward(const Tensor& x, const Tensor* gamma, const Tensor& rstd, const Tensor& d_y, Tensor& d_x,
                      Tensor* d_gamma) {
  constexpr const char* op = "rmsnorm_backward";
  const RowShape shape = row_shape(op, x);
  if (gamma) expect_shape(op, "gamma", *gamma, {shape.features});
  expect_row_stat(op, "rstd", rstd, x);
  expect_shape(op, "d_y", d_y, x.shape());
  expect_shape(op, "d_x", d_x, x.shape());
  PROPLAB_CHECK(d_gamma == nullptr || gamma != nullptr, "op '", op, "': d_gamma given without gamma");
  if (d_gamma) expect_shape(op, "d_gamma", *d_gamma, {shape.features});
  const Device device = common_device(op, {&x, gamma, &rstd, &d_y, &d_x, d_gamma});
  if (device == Device::cuda) {
#ifdef PROPLAB_WITH_CUDA
    kernels::rmsnorm_backward(x.f32(), gamma ? gamma->f32() : nullptr, rstd.f32(), d_y.f32(), shape.rows,
                              shape.features, d_x.f32(), d_gamma ? d_gamma->f32() : nullptr);
    return;
#else
    missing_device_impl(op, device);
#endif
  }
  if (shape.features == 0 || shape.rows == 0) return;

  const RowChunks chunks = row_chunks(shape.rows);
  double* gamma_partial = d_gamma ? partial_scratch(static_cast<std::size_t>(chunks.count * shape.features)) : nullptr;
  if (gamma)
    rmsnorm_backward_rows<true>(x.f32(), gamma->f32(), rstd.f32(), d_y.f32(), shape, chunks, d_x.f32(), gamma_partial);
  else
    rmsnorm_backward_rows<false>(x.f32(), nullptr, rstd.f32(), d_y.f32(), shape, chunks, d_x.f32(), nullptr);
  if (d_gamma) combine_partials(gamma_partial, chunks.count, shape.features, d_gamma->f32());
}

}  // namespace proplab::ops
