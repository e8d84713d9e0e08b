// CUDA-vs-CPU comparison of LayerNorm and RMSNorm (kernels/norm.cu against the CPU reference in
// src/ops/norm.cpp), through the ops entry points on fresh random inputs. Skipped at run time when no GPU is present.
//
// Tolerances (each relative to the magnitude of the terms a value is computed from, in double on the host):
// - y, mean, rstd, d_x: 1e-5. Row sums are float on both sides but in different orders (the CPU's vector lanes,
//   the GPU's block tree), each within a few ulps·√D of Σ|terms|; 1e-5 leaves a margin of ~10 over D = 4099.
// - d_gamma, d_beta: 1e-6. Given the same saved statistics both sides add the same float products in the same
//   row-chunk order in double, so they should agree to the final float rounding (one ulp, ~6e-8).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "ops/ops.h"
#include "support/gradcheck.h"

namespace proplab {
namespace {

using testing::random_tensor;

constexpr float kEps = 1e-5f;
constexpr double kRowTol = 1e-5;
constexpr double kParamTol = 1e-6;

// More rows than the row grid (2^20 blocks), so rows are visited block-stride. The emulated GPU (PROPLAB_CUDA=
// EMULATE) runs every thread of every block in turn, and a million rows take it many minutes: there the case is a
// few thousand rows, and the block-stride loop is left to a real GPU.
#ifdef PROPLAB_CUDA_EMULATED
constexpr std::int64_t kManyRows = 4099;
#else
constexpr std::int64_t kManyRows = 1048579;
#endif

// D = 1 (zero variance), odd widths on both sides of the 512-feature block-size switch, a width over one block
// pass (4099 > 256 threads · 16), leading dimensions, and many rows (above).
const std::vector<Shape> kShapes = {{1, 1},   {2, 3},       {5, 64},   {7, 257},   {3, 512},
                                    {4, 513}, {2, 3, 1000}, {3, 4099}, {300, 768}, {kManyRows, 3}};

#define SKIP_WITHOUT_GPU() \
  if (!proplab::cuda_available()) GTEST_SKIP() << "no CUDA GPU: skipping CUDA-vs-CPU comparison"

Tensor to_cuda(const Tensor& host) {
  Tensor device = Tensor::empty(host.shape(), DType::f32, Device::cuda);
  device.copy_from(host);
  return device;
}

std::int64_t features_of(const Shape& shape) { return shape.back(); }
std::int64_t rows_of(const Shape& shape) { return shape_numel(shape) / std::max<std::int64_t>(shape.back(), 1); }

// The saved statistics' shape: x's leading dimensions for 3-d inputs (allowed by the ops), [rows] otherwise.
Shape stat_shape(const Shape& shape) {
  if (shape.size() > 2) return Shape(shape.begin(), shape.end() - 1);
  return Shape{rows_of(shape)};
}

// |actual - expected| <= tol * scale[i] for every element (a NaN expected value needs a NaN).
void expect_close(const std::vector<float>& actual, const std::vector<float>& expected,
                  const std::vector<double>& scale, double tol, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  ASSERT_EQ(scale.size(), expected.size()) << what;
  std::int64_t failures = 0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const bool ok = std::isnan(expected[i]) ? std::isnan(actual[i])
                                            : std::abs(static_cast<double>(actual[i]) - expected[i]) <= tol * scale[i];
    if (!ok && ++failures <= 5)
      ADD_FAILURE() << what << "[" << i << "]: cuda " << actual[i] << " vs cpu " << expected[i] << " (scale "
                    << scale[i] << ", tolerance " << tol << ")";
  }
  EXPECT_EQ(failures, 0) << what << ": " << failures << " of " << actual.size() << " elements differ";
}

void expect_bitwise(const Tensor& first, const Tensor& second, const std::string& what) {
  const std::vector<float> a = first.to_vector();
  const std::vector<float> b = second.to_vector();
  ASSERT_EQ(a.size(), b.size()) << what;
  std::int64_t differing = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::bit_cast<std::uint32_t>(a[i]) != std::bit_cast<std::uint32_t>(b[i])) ++differing;
  EXPECT_EQ(differing, 0) << what << ": " << differing << " of " << a.size() << " elements differ in their bits";
}

std::vector<double> magnitudes(const std::vector<float>& values) {
  std::vector<double> out(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) out[i] = std::abs(static_cast<double>(values[i]));
  return out;
}

// Scales of the forward outputs from the CPU results: y relative to rstd (|x| + |mean|) |gamma| + |beta| (the
// subtraction x − mean cancels), mean relative to the row's largest |x|, rstd relative to itself.
struct ForwardScales {
  std::vector<double> y, mean, rstd;
};

ForwardScales forward_scales(const std::vector<float>& x, const std::vector<float>* gamma,
                             const std::vector<float>* beta, const std::vector<float>& mean,
                             const std::vector<float>& rstd, std::int64_t rows, std::int64_t d) {
  ForwardScales s;
  s.y.resize(x.size());
  s.mean.resize(static_cast<std::size_t>(rows));
  s.rstd.resize(static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r) {
    const double m = mean.empty() ? 0.0 : std::abs(static_cast<double>(mean[r]));
    double row_max = 0.0;
    for (std::int64_t j = 0; j < d; ++j) {
      const double xj = std::abs(static_cast<double>(x[r * d + j]));
      row_max = std::max(row_max, xj);
      double v = rstd[r] * (xj + m) * (gamma ? std::abs(static_cast<double>((*gamma)[j])) : 1.0);
      if (beta) v += std::abs(static_cast<double>((*beta)[j]));
      s.y[r * d + j] = v;
    }
    s.mean[r] = row_max;
    s.rstd[r] = std::abs(static_cast<double>(rstd[r]));
  }
  return s;
}

// Scales of the backward outputs, in double from the host inputs: d_x relative to rstd (max|g| + |mean g| +
// max|x_hat| |mean g x_hat|) per row (the terms that cancel), d_gamma[j] relative to |start| + Σ_r |d_y x_hat|,
// d_beta[j] to |start| + Σ_r |d_y|.
struct BackwardScales {
  std::vector<double> d_x, d_gamma, d_beta;
};

BackwardScales backward_scales(bool centered, const std::vector<float>& x, const std::vector<float>* gamma,
                               const std::vector<float>& mean, const std::vector<float>& rstd,
                               const std::vector<float>& d_y, const std::vector<float>& gamma_start,
                               const std::vector<float>& beta_start, std::int64_t rows, std::int64_t d) {
  BackwardScales s;
  s.d_x.resize(x.size());
  s.d_gamma = magnitudes(gamma_start);
  s.d_beta = magnitudes(beta_start);
  for (std::int64_t r = 0; r < rows; ++r) {
    const double m = centered ? mean[r] : 0.0;
    double max_g = 0.0, max_xhat = 0.0, sum_g = 0.0, sum_g_xhat = 0.0;
    for (std::int64_t j = 0; j < d; ++j) {
      const double xhat = (x[r * d + j] - m) * rstd[r];
      const double g = d_y[r * d + j] * (gamma ? static_cast<double>((*gamma)[j]) : 1.0);
      max_g = std::max(max_g, std::abs(g));
      max_xhat = std::max(max_xhat, std::abs(xhat));
      sum_g += g;
      sum_g_xhat += g * xhat;
      s.d_gamma[j] += std::abs(d_y[r * d + j] * xhat);
      s.d_beta[j] += std::abs(static_cast<double>(d_y[r * d + j]));
    }
    const double mean_g = centered ? std::abs(sum_g) / d : 0.0;
    const double row_scale = rstd[r] * (max_g + mean_g + max_xhat * std::abs(sum_g_xhat) / d);
    for (std::int64_t j = 0; j < d; ++j) s.d_x[r * d + j] = row_scale;
  }
  return s;
}

struct NormInputs {
  Tensor x, gamma, beta, d_y;
};

// x with a nonzero mean (the two-pass variance), gamma around 1, distinct seeds (random_tensor's stream depends on
// the element count only).
NormInputs make_inputs(const Shape& shape, std::uint64_t seed) {
  const std::int64_t d = features_of(shape);
  return {random_tensor(shape, seed, 2.0, 0.5), random_tensor({d}, seed + 1, 0.5, 1.0),
          random_tensor({d}, seed + 2, 0.3), random_tensor(shape, seed + 3)};
}

TEST(NormCuda, LayerNormForwardMatchesCpu) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 1000;
  for (const Shape& shape : kShapes) {
    const std::int64_t rows = rows_of(shape), d = features_of(shape);
    NormInputs in = make_inputs(shape, seed += 10);
    const Tensor x_cuda = to_cuda(in.x), gamma_cuda = to_cuda(in.gamma), beta_cuda = to_cuda(in.beta);
    const std::vector<float> xs = in.x.to_vector(), gs = in.gamma.to_vector(), bs = in.beta.to_vector();
    for (int variant = 0; variant < 4; ++variant) {
      const bool with_gamma = variant & 1, with_beta = variant & 2;
      SCOPED_TRACE("shape " + shape_string(shape) + (with_gamma ? " gamma" : "") + (with_beta ? " beta" : ""));
      Tensor y = Tensor::empty(shape), mean = Tensor::empty(stat_shape(shape)), rstd = Tensor::empty({rows});
      ops::layernorm_forward(in.x, with_gamma ? &in.gamma : nullptr, with_beta ? &in.beta : nullptr, kEps, y, mean,
                             rstd);
      Tensor y_cuda = to_cuda(in.x);  // overwritten
      Tensor mean_cuda = Tensor::empty(stat_shape(shape), DType::f32, Device::cuda);
      Tensor rstd_cuda = Tensor::empty({rows}, DType::f32, Device::cuda);
      ops::layernorm_forward(x_cuda, with_gamma ? &gamma_cuda : nullptr, with_beta ? &beta_cuda : nullptr, kEps, y_cuda,
                             mean_cuda, rstd_cuda);

      const std::vector<float> mean_cpu = mean.to_vector(), rstd_cpu = rstd.to_vector();
      const ForwardScales s =
          forward_scales(xs, with_gamma ? &gs : nullptr, with_beta ? &bs : nullptr, mean_cpu, rstd_cpu, rows, d);
      expect_close(y_cuda.to_vector(), y.to_vector(), s.y, kRowTol, "layernorm y");
      expect_close(mean_cuda.to_vector(), mean_cpu, s.mean, kRowTol, "layernorm mean");
      expect_close(rstd_cuda.to_vector(), rstd_cpu, s.rstd, kRowTol, "layernorm rstd");
    }
  }
}

TEST(NormCuda, RmsNormForwardMatchesCpu) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 2000;
  for (const Shape& shape : kShapes) {
    const std::int64_t rows = rows_of(shape), d = features_of(shape);
    NormInputs in = make_inputs(shape, seed += 10);
    const Tensor x_cuda = to_cuda(in.x), gamma_cuda = to_cuda(in.gamma);
    const std::vector<float> xs = in.x.to_vector(), gs = in.gamma.to_vector();
    for (const bool with_gamma : {false, true}) {
      SCOPED_TRACE("shape " + shape_string(shape) + (with_gamma ? " gamma" : ""));
      Tensor y = Tensor::empty(shape), rstd = Tensor::empty(stat_shape(shape));
      ops::rmsnorm_forward(in.x, with_gamma ? &in.gamma : nullptr, kEps, y, rstd);
      Tensor y_cuda = to_cuda(in.x);
      Tensor rstd_cuda = Tensor::empty(stat_shape(shape), DType::f32, Device::cuda);
      ops::rmsnorm_forward(x_cuda, with_gamma ? &gamma_cuda : nullptr, kEps, y_cuda, rstd_cuda);

      const std::vector<float> rstd_cpu = rstd.to_vector();
      const ForwardScales s = forward_scales(xs, with_gamma ? &gs : nullptr, nullptr, {}, rstd_cpu, rows, d);
      expect_close(y_cuda.to_vector(), y.to_vector(), s.y, kRowTol, "rmsnorm y");
      expect_close(rstd_cuda.to_vector(), rstd_cpu, s.rstd, kRowTol, "rmsnorm rstd");
    }
  }
}

// Every optional combination: gamma absent (d_beta or not) or present (d_gamma and d_beta each or not), with the
// parameter gradients starting from nonzero values (they accumulate) and d_x starting from garbage (overwritten).
TEST(NormCuda, LayerNormBackwardMatchesCpu) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 3000;
  for (const Shape& shape : kShapes) {
    const std::int64_t rows = rows_of(shape), d = features_of(shape);
    NormInputs in = make_inputs(shape, seed += 10);
    Tensor y = Tensor::empty(shape), mean = Tensor::empty({rows}), rstd = Tensor::empty(stat_shape(shape));
    ops::layernorm_forward(in.x, &in.gamma, &in.beta, kEps, y, mean, rstd);
    const Tensor gamma_start = random_tensor({d}, seed + 5), beta_start = random_tensor({d}, seed + 6, 3.0);
    const Tensor x_cuda = to_cuda(in.x), gamma_cuda = to_cuda(in.gamma), mean_cuda = to_cuda(mean),
                 rstd_cuda = to_cuda(rstd), d_y_cuda = to_cuda(in.d_y);
    const std::vector<float> xs = in.x.to_vector(), gs = in.gamma.to_vector(), dys = in.d_y.to_vector();
    for (int variant = 0; variant < 6; ++variant) {
      const bool with_gamma = variant >= 2;
      const bool want_d_gamma = variant >= 4;
      const bool want_d_beta = variant % 2 == 1;
      SCOPED_TRACE("shape " + shape_string(shape) + (with_gamma ? " gamma" : "") + (want_d_gamma ? " d_gamma" : "") +
                   (want_d_beta ? " d_beta" : ""));
      Tensor d_x = Tensor::empty(shape), d_gamma = gamma_start.clone(), d_beta = beta_start.clone();
      ops::layernorm_backward(in.x, with_gamma ? &in.gamma : nullptr, mean, rstd, in.d_y, d_x,
                              want_d_gamma ? &d_gamma : nullptr, want_d_beta ? &d_beta : nullptr);
      Tensor d_x_cuda = to_cuda(in.x), d_gamma_cuda = to_cuda(gamma_start), d_beta_cuda = to_cuda(beta_start);
      ops::layernorm_backward(x_cuda, with_gamma ? &gamma_cuda : nullptr, mean_cuda, rstd_cuda, d_y_cuda, d_x_cuda,
                              want_d_gamma ? &d_gamma_cuda : nullptr, want_d_beta ? &d_beta_cuda : nullptr);

      const BackwardScales s = backward_scales(true, xs, with_gamma ? &gs : nullptr, mean.to_vector(), rstd.to_vector(),
                                               dys, gamma_start.to_vector(), beta_start.to_vector(), rows, d);
      expect_close(d_x_cuda.to_vector(), d_x.to_vector(), s.d_x, kRowTol, "layernorm d_x");
      // Untouched when not requested, accumulated when requested (the CPU results start from the same values).
      expect_close(d_gamma_cuda.to_vector(), d_gamma.to_vector(), s.d_gamma, kParamTol, "layernorm d_gamma");
      expect_close(d_beta_cuda.to_vector(), d_beta.to_vector(), s.d_beta, kParamTol, "layernorm d_beta");
      if (!want_d_gamma) expect_bitwise(d_gamma_cuda, gamma_start, "layernorm d_gamma not requested");
      if (!want_d_beta) expect_bitwise(d_beta_cuda, beta_start, "layernorm d_beta not requested");
    }
  }
}

TEST(NormCuda, RmsNormBackwardMatchesCpu) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 4000;
  for (const Shape& shape : kShapes) {
    const std::int64_t rows = rows_of(shape), d = features_of(shape);
    NormInputs in = make_inputs(shape, seed += 10);
    Tensor y = Tensor::empty(shape), rstd = Tensor::empty(stat_shape(shape));
    ops::rmsnorm_forward(in.x, &in.gamma, kEps, y, rstd);
    const Tensor gamma_start = random_tensor({d}, seed + 5);
    const Tensor x_cuda = to_cuda(in.x), gamma_cuda = to_cuda(in.gamma), rstd_cuda = to_cuda(rstd),
                 d_y_cuda = to_cuda(in.d_y);
    const std::vector<float> xs = in.x.to_vector(), gs = in.gamma.to_vector(), dys = in.d_y.to_vector();
    for (int variant = 0; variant < 3; ++variant) {
      const bool with_gamma = variant >= 1;
      const bool want_d_gamma = variant == 2;
      SCOPED_TRACE("shape " + shape_string(shape) + (with_gamma ? " gamma" : "") + (want_d_gamma ? " d_gamma" : ""));
      Tensor d_x = Tensor::empty(shape), d_gamma = gamma_start.clone();
      ops::rmsnorm_backward(in.x, with_gamma ? &in.gamma : nullptr, rstd, in.d_y, d_x,
                            want_d_gamma ? &d_gamma : nullptr);
      Tensor d_x_cuda = to_cuda(in.x), d_gamma_cuda = to_cuda(gamma_start);
      ops::rmsnorm_backward(x_cuda, with_gamma ? &gamma_cuda : nullptr, rstd_cuda, d_y_cuda, d_x_cuda,
                            want_d_gamma ? &d_gamma_cuda : nullptr);

      const BackwardScales s = backward_scales(false, xs, with_gamma ? &gs : nullptr, {}, rstd.to_vector(), dys,
                                               gamma_start.to_vector(), gamma_start.to_vector(), rows, d);
      expect_close(d_x_cuda.to_vector(), d_x.to_vector(), s.d_x, kRowTol, "rmsnorm d_x");
      expect_close(d_gamma_cuda.to_vector(), d_gamma.to_vector(), s.d_gamma, kParamTol, "rmsnorm d_gamma");
      if (!want_d_gamma) expect_bitwise(d_gamma_cuda, gamma_start, "rmsnorm d_gamma not requested");
    }
  }
}

// d_x aliasing d_y (allowed: the CPU writes d_x last) with both parameter gradients, and y aliasing x in forward:
// the same results as from separate buffers.
TEST(NormCuda, InPlaceMatchesCpu) {
  SKIP_WITHOUT_GPU();
  for (const Shape& shape : {Shape{9, 40}, Shape{70, 1025}}) {
    SCOPED_TRACE("shape " + shape_string(shape));
    const std::int64_t rows = rows_of(shape), d = features_of(shape);
    NormInputs in = make_inputs(shape, 5000 + d);
    const std::vector<float> xs = in.x.to_vector(), gs = in.gamma.to_vector(), bs = in.beta.to_vector(),
                             dys = in.d_y.to_vector();
    const Tensor gamma_cuda = to_cuda(in.gamma), beta_cuda = to_cuda(in.beta);
    const Tensor gamma_start = random_tensor({d}, 5100 + d), beta_start = random_tensor({d}, 5200 + d);

    // LayerNorm.
    Tensor y = Tensor::empty(shape), mean = Tensor::empty({rows}), rstd = Tensor::empty({rows});
    ops::layernorm_forward(in.x, &in.gamma, &in.beta, kEps, y, mean, rstd);
    Tensor d_x = Tensor::empty(shape), d_gamma = gamma_start.clone(), d_beta = beta_start.clone();
    ops::layernorm_backward(in.x, &in.gamma, mean, rstd, in.d_y, d_x, &d_gamma, &d_beta);

    Tensor x_in_place = to_cuda(in.x);
    Tensor mean_cuda = Tensor::empty({rows}, DType::f32, Device::cuda);
    Tensor rstd_cuda = Tensor::empty({rows}, DType::f32, Device::cuda);
    ops::layernorm_forward(x_in_place, &gamma_cuda, &beta_cuda, kEps, x_in_place, mean_cuda, rstd_cuda);
    const ForwardScales fs = forward_scales(xs, &gs, &bs, mean.to_vector(), rstd.to_vector(), rows, d);
    expect_close(x_in_place.to_vector(), y.to_vector(), fs.y, kRowTol, "layernorm y aliasing x");

    Tensor d_y_in_place = to_cuda(in.d_y);
    Tensor d_gamma_cuda = to_cuda(gamma_start), d_beta_cuda = to_cuda(beta_start);
    ops::layernorm_backward(to_cuda(in.x), &gamma_cuda, to_cuda(mean), to_cuda(rstd), d_y_in_place, d_y_in_place,
                            &d_gamma_cuda, &d_beta_cuda);
    const BackwardScales bs_ln = backward_scales(true, xs, &gs, mean.to_vector(), rstd.to_vector(), dys,
                                                 gamma_start.to_vector(), beta_start.to_vector(), rows, d);
    expect_close(d_y_in_place.to_vector(), d_x.to_vector(), bs_ln.d_x, kRowTol, "layernorm d_x aliasing d_y");
    expect_close(d_gamma_cuda.to_vector(), d_gamma.to_vector(), bs_ln.d_gamma, kParamTol,
                 "layernorm d_gamma with d_x aliasing d_y");
    expect_close(d_beta_cuda.to_vector(), d_beta.to_vector(), bs_ln.d_beta, kParamTol,
                 "layernorm d_beta with d_x aliasing d_y");

    // RMSNorm.
    Tensor rms_y = Tensor::empty(shape), rms_rstd = Tensor::empty({rows});
    ops::rmsnorm_forward(in.x, &in.gamma, kEps, rms_y, rms_rstd);
    Tensor rms_d_x = Tensor::empty(shape), rms_d_gamma = gamma_start.clone();
    ops::rmsnorm_backward(in.x, &in.gamma, rms_rstd, in.d_y, rms_d_x, &rms_d_gamma);

    Tensor rms_x_in_place = to_cuda(in.x);
    Tensor rms_rstd_cuda = Tensor::empty({rows}, DType::f32, Device::cuda);
    ops::rmsnorm_forward(rms_x_in_place, &gamma_cuda, kEps, rms_x_in_place, rms_rstd_cuda);
    const ForwardScales rfs = forward_scales(xs, &gs, nullptr, {}, rms_rstd.to_vector(), rows, d);
    expect_close(rms_x_in_place.to_vector(), rms_y.to_vector(), rfs.y, kRowTol, "rmsnorm y aliasing x");

    Tensor rms_d_y_in_place = to_cuda(in.d_y);
    Tensor rms_d_gamma_cuda = to_cuda(gamma_start);
    ops::rmsnorm_backward(to_cuda(in.x), &gamma_cuda, to_cuda(rms_rstd), rms_d_y_in_place, rms_d_y_in_place,
                          &rms_d_gamma_cuda);
    const BackwardScales bs_rms = backward_scales(false, xs, &gs, {}, rms_rstd.to_vector(), dys,
                                                  gamma_start.to_vector(), gamma_start.to_vector(), rows, d);
    expect_close(rms_d_y_in_place.to_vector(), rms_d_x.to_vector(), bs_rms.d_x, kRowTol, "rmsnorm d_x aliasing d_y");
    expect_close(rms_d_gamma_cuda.to_vector(), rms_d_gamma.to_vector(), bs_rms.d_gamma, kParamTol,
                 "rmsnorm d_gamma with d_x aliasing d_y");
  }
}

// No rows: nothing is written and nothing fails.
TEST(NormCuda, EmptyRowsAreANoOp) {
  SKIP_WITHOUT_GPU();
  const Shape shape = {0, 7};
  Tensor x = Tensor::empty(shape, DType::f32, Device::cuda), y = Tensor::empty(shape, DType::f32, Device::cuda);
  Tensor d_y = Tensor::empty(shape, DType::f32, Device::cuda), d_x = Tensor::empty(shape, DType::f32, Device::cuda);
  Tensor mean = Tensor::empty({0}, DType::f32, Device::cuda), rstd = Tensor::empty({0}, DType::f32, Device::cuda);
  Tensor gamma = to_cuda(random_tensor({7}, 6000));
  Tensor d_gamma = to_cuda(random_tensor({7}, 6001)), d_beta = to_cuda(random_tensor({7}, 6002));
  const Tensor d_gamma_before = d_gamma.to(Device::cpu), d_beta_before = d_beta.to(Device::cpu);
  ops::layernorm_forward(x, &gamma, nullptr, kEps, y, mean, rstd);
  ops::layernorm_backward(x, &gamma, mean, rstd, d_y, d_x, &d_gamma, &d_beta);
  ops::rmsnorm_forward(x, &gamma, kEps, y, rstd);
  ops::rmsnorm_backward(x, &gamma, rstd, d_y, d_x, &d_gamma);
  expect_bitwise(d_gamma, d_gamma_before, "d_gamma after zero rows");
  expect_bitwise(d_beta, d_beta_before, "d_beta after zero rows");
}

// Same inputs, same bits: forward twice, backward twice from the same starting parameter gradients.
TEST(NormCuda, BitwiseRepeatable) {
  SKIP_WITHOUT_GPU();
  for (const Shape& shape : {Shape{300, 768}, Shape{3, 4099}, Shape{kManyRows, 3}}) {
    SCOPED_TRACE("shape " + shape_string(shape));
    const std::int64_t rows = rows_of(shape), d = features_of(shape);
    NormInputs in = make_inputs(shape, 7000 + d);
    const Tensor x = to_cuda(in.x), gamma = to_cuda(in.gamma), beta = to_cuda(in.beta), d_y = to_cuda(in.d_y);
    const Tensor start = random_tensor({d}, 7100 + d);
    Tensor y[2], mean[2], rstd[2], d_x[2], d_gamma[2], d_beta[2], rms_y[2], rms_rstd[2], rms_d_x[2], rms_d_gamma[2];
    for (int run = 0; run < 2; ++run) {
      y[run] = Tensor::empty(shape, DType::f32, Device::cuda);
      mean[run] = Tensor::empty({rows}, DType::f32, Device::cuda);
      rstd[run] = Tensor::empty({rows}, DType::f32, Device::cuda);
      ops::layernorm_forward(x, &gamma, &beta, kEps, y[run], mean[run], rstd[run]);
      d_x[run] = Tensor::empty(shape, DType::f32, Device::cuda);
      d_gamma[run] = to_cuda(start);
      d_beta[run] = to_cuda(start);
      ops::layernorm_backward(x, &gamma, mean[run], rstd[run], d_y, d_x[run], &d_gamma[run], &d_beta[run]);
      rms_y[run] = Tensor::empty(shape, DType::f32, Device::cuda);
      rms_rstd[run] = Tensor::empty({rows}, DType::f32, Device::cuda);
      ops::rmsnorm_forward(x, &gamma, kEps, rms_y[run], rms_rstd[run]);
      rms_d_x[run] = Tensor::empty(shape, DType::f32, Device::cuda);
      rms_d_gamma[run] = to_cuda(start);
      ops::rmsnorm_backward(x, &gamma, rms_rstd[run], d_y, rms_d_x[run], &rms_d_gamma[run]);
    }
    expect_bitwise(y[0], y[1], "layernorm y");
    expect_bitwise(mean[0], mean[1], "layernorm mean");
    expect_bitwise(rstd[0], rstd[1], "layernorm rstd");
    expect_bitwise(d_x[0], d_x[1], "layernorm d_x");
    expect_bitwise(d_gamma[0], d_gamma[1], "layernorm d_gamma");
    expect_bitwise(d_beta[0], d_beta[1], "layernorm d_beta");
    expect_bitwise(rms_y[0], rms_y[1], "rmsnorm y");
    expect_bitwise(rms_rstd[0], rms_rstd[1], "rmsnorm rstd");
    expect_bitwise(rms_d_x[0], rms_d_x[1], "rmsnorm d_x");
    expect_bitwise(rms_d_gamma[0], rms_d_gamma[1], "rmsnorm d_gamma");
  }
}

}  // namespace
}  // namespace proplab
