// CUDA-vs-CPU comparison of BatchNorm (kernels/batchnorm.cu against ops/batchnorm.cpp) through the ops entry
// points: training and eval, [N, C] features and NCHW images (channels of more than one summation chunk
// included), gamma/beta present or absent, d_gamma/d_beta present or absent and accumulating into nonzero values.
// Skipped at run time when no GPU is present.
//
// Tolerances: the per-channel sums are in double on both sides (only the order differs), so the float statistics
// agree to the last bit except where a double lands on a float rounding boundary (one ulp). Elementwise values are
// compared to 1e-6 relative to the magnitudes of the terms combined (a few ulps: a CPU build that contracts into
// fused multiply-adds rounds once less, and a statistic may differ by its last bit); the backward's d_x, which
// subtracts two means, to 1e-5 of its terms. Statistics and parameter gradients: 1e-6 relative.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "compare_image_ops.h"
#include "core/tensor.h"
#include "ops/ops.h"
#include "support/gradcheck.h"

namespace proplab {
namespace {

using namespace testing::cuda_compare;
using testing::random_tensor;

constexpr double kValueTol = 1e-6;
constexpr double kGradTol = 1e-5;

// [N, C] features, small and odd images, channels of 19 028 and 36 864 values (two and three 16 384-value chunks),
// and 294 912 values in all (more than one grid pass of the elementwise kernels).
const std::vector<Shape> kShapes = {{8, 5},         {2, 3, 5, 7},   {3, 1, 1, 1},
                                    {4, 3, 67, 71}, {9, 4, 64, 64}, {16, 8, 48, 48}};

std::int64_t spatial_of(const Shape& shape) {
  std::int64_t spatial = 1;
  for (std::size_t i = 2; i < shape.size(); ++i) spatial *= shape[i];
  return spatial;
}

// scale[i] for y = (x − m)·a + shift per channel: (|x| + |m|)·|a| + |shift|.
std::vector<double> affine_scale(const std::vector<float>& x, const Shape& shape, const std::vector<float>& m,
                                 const std::vector<float>& a, const std::vector<float>& shift) {
  const std::int64_t c = shape[1], spatial = spatial_of(shape);
  std::vector<double> scale(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const std::size_t ch = static_cast<std::size_t>((static_cast<std::int64_t>(i) / spatial) % c);
    scale[i] =
        (std::abs(double(x[i])) + std::abs(double(m[ch]))) * std::abs(double(a[ch])) + std::abs(double(shift[ch]));
  }
  return scale;
}

struct BnParams {
  Tensor gamma, beta, running_mean, running_var;
};

BnParams make_params(std::int64_t c, std::uint64_t seed) {
  return {random_tensor({c}, seed, 0.3, 1.0), random_tensor({c}, seed + 1, 0.5), random_tensor({c}, seed + 2, 0.2),
          absolute(random_tensor({c}, seed + 3, 0.3, 1.0))};
}

void check_forward(const Shape& shape, bool training, bool affine, std::uint64_t seed) {
  const std::int64_t c = shape[1];
  const Tensor x = random_tensor(shape, seed, 2.0, 0.7);
  const BnParams p = make_params(c, seed + 10);
  const float eps = 1e-5f, momentum = 0.1f;
  Tensor rm_cpu = p.running_mean.clone(), rv_cpu = p.running_var.clone();
  Tensor y_cpu = Tensor::empty(shape), mean_cpu = Tensor::empty({c}), rstd_cpu = Tensor::empty({c});
  ops::batchnorm_forward(x, affine ? &p.gamma : nullptr, affine ? &p.beta : nullptr, eps, training, momentum, rm_cpu,
                         rv_cpu, y_cpu, mean_cpu, rstd_cpu);

  const Tensor gamma = to_cuda(p.gamma), beta = to_cuda(p.beta);
  Tensor rm = to_cuda(p.running_mean), rv = to_cuda(p.running_var);
  Tensor y = Tensor::empty(shape, DType::f32, Device::cuda);
  Tensor mean = Tensor::empty({c}, DType::f32, Device::cuda), rstd = Tensor::empty({c}, DType::f32, Device::cuda);
  ops::batchnorm_forward(to_cuda(x), affine ? &gamma : nullptr, affine ? &beta : nullptr, eps, training, momentum, rm,
                         rv, y, mean, rstd);

  expect_close_rel(mean.to_vector(), mean_cpu.to_vector(), kValueTol, "mean");
  expect_close_rel(rstd.to_vector(), rstd_cpu.to_vector(), kValueTol, "rstd");
  expect_close_rel(rm.to_vector(), rm_cpu.to_vector(), kValueTol, "running_mean");
  expect_close_rel(rv.to_vector(), rv_cpu.to_vector(), kValueTol, "running_var");
  if (!training) {
    expect_bitwise(rm.to_vector(), p.running_mean.to_vector(), "running_mean unchanged in eval");
    expect_bitwise(rv.to_vector(), p.running_var.to_vector(), "running_var unchanged in eval");
  }
  const std::vector<float> r = rstd_cpu.to_vector(), g = p.gamma.to_vector(), b = p.beta.to_vector();
  std::vector<float> a(r.size()), shift(r.size(), 0.0f);
  for (std::size_t i = 0; i < r.size(); ++i) {
    a[i] = affine ? r[i] * g[i] : r[i];
    if (affine) shift[i] = b[i];
  }
  expect_close(y.to_vector(), y_cpu.to_vector(), affine_scale(x.to_vector(), shape, mean_cpu.to_vector(), a, shift),
               kValueTol, "y");
}

TEST(BatchnormCuda, ForwardMatchesCpu) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 100;
  for (const Shape& shape : kShapes) {
    for (const bool training : {true, false}) {
      for (const bool affine : {true, false}) {
        if (training && shape[0] * spatial_of(shape) <= 1) continue;
        SCOPED_TRACE("shape " + shape_string(shape) + (training ? " training" : " eval") +
                     (affine ? " affine" : " plain"));
        check_forward(shape, training, affine, seed += 20);
      }
    }
  }
}

void check_backward(const Shape& shape, bool training, bool affine, bool param_grads, std::uint64_t seed) {
  const std::int64_t c = shape[1];
  const Tensor x = random_tensor(shape, seed, 2.0, 0.7);
  const Tensor d_y = random_tensor(shape, seed + 1);
  const BnParams p = make_params(c, seed + 10);
  // Statistics from a CPU forward (the backward takes them as inputs; both sides get the same ones).
  Tensor rm = p.running_mean.clone(), rv = p.running_var.clone();
  Tensor y = Tensor::empty(shape), mean = Tensor::empty({c}), rstd = Tensor::empty({c});
  ops::batchnorm_forward(x, affine ? &p.gamma : nullptr, affine ? &p.beta : nullptr, 1e-5f, training, 0.1f, rm, rv, y,
                         mean, rstd);
  const Tensor d_gamma0 = random_tensor({c}, seed + 20, 0.5), d_beta0 = random_tensor({c}, seed + 21, 0.5);

  Tensor d_x_cpu = Tensor::empty(shape), d_gamma_cpu = d_gamma0.clone(), d_beta_cpu = d_beta0.clone();
  ops::batchnorm_backward(x, affine ? &p.gamma : nullptr, mean, rstd, d_y, training, d_x_cpu,
                          param_grads ? &d_gamma_cpu : nullptr, param_grads ? &d_beta_cpu : nullptr);

  const Tensor gamma = to_cuda(p.gamma);
  Tensor d_x = Tensor::empty(shape, DType::f32, Device::cuda);
  Tensor d_gamma = to_cuda(d_gamma0), d_beta = to_cuda(d_beta0);
  ops::batchnorm_backward(to_cuda(x), affine ? &gamma : nullptr, to_cuda(mean), to_cuda(rstd), to_cuda(d_y), training,
                          d_x, param_grads ? &d_gamma : nullptr, param_grads ? &d_beta : nullptr);

  // d_x = g·r·(d_y − mean(d_y) − x̂·mean(d_y·x̂)): scale |g·r|·(|d_y| + |mean d_y| + |x̂|·|mean d_y·x̂|), with the
  // means bounded by the channel's mean |d_y| and mean |d_y·x̂|.
  const std::vector<float> xs = x.to_vector(), dys = d_y.to_vector(), ms = mean.to_vector(), rs = rstd.to_vector();
  const std::vector<float> gs = p.gamma.to_vector();
  const std::int64_t spatial = spatial_of(shape), n = shape[0];
  std::vector<double> mean_abs_dy(c, 0.0), mean_abs_dy_xhat(c, 0.0);
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const std::size_t ch = static_cast<std::size_t>((static_cast<std::int64_t>(i) / spatial) % c);
    const double xhat = (double(xs[i]) - ms[ch]) * rs[ch];
    mean_abs_dy[ch] += std::abs(double(dys[i])) / double(n * spatial);
    mean_abs_dy_xhat[ch] += std::abs(double(dys[i]) * xhat) / double(n * spatial);
  }
  std::vector<double> scale(xs.size());
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const std::size_t ch = static_cast<std::size_t>((static_cast<std::int64_t>(i) / spatial) % c);
    const double xhat = std::abs((double(xs[i]) - ms[ch]) * rs[ch]);
    const double gr = std::abs((affine ? double(gs[ch]) : 1.0) * rs[ch]);
    scale[i] = gr * (std::abs(double(dys[i])) + (training ? mean_abs_dy[ch] + xhat * mean_abs_dy_xhat[ch] : 0.0));
  }
  expect_close(d_x.to_vector(), d_x_cpu.to_vector(), scale, kGradTol, "d_x");
  if (param_grads) {
    // Accumulated: |start| + Σ |terms| bounds the rounding of the float result.
    std::vector<double> gamma_scale(c), beta_scale(c);
    const std::vector<float> dg0 = d_gamma0.to_vector(), db0 = d_beta0.to_vector();
    for (std::int64_t ch = 0; ch < c; ++ch) {
      gamma_scale[ch] = std::abs(double(dg0[ch])) + mean_abs_dy_xhat[ch] * double(n * spatial);
      beta_scale[ch] = std::abs(double(db0[ch])) + mean_abs_dy[ch] * double(n * spatial);
    }
    expect_close(d_gamma.to_vector(), d_gamma_cpu.to_vector(), gamma_scale, kValueTol, "d_gamma");
    expect_close(d_beta.to_vector(), d_beta_cpu.to_vector(), beta_scale, kValueTol, "d_beta");
  } else {
    expect_bitwise(d_gamma.to_vector(), d_gamma0.to_vector(), "d_gamma left alone");
    expect_bitwise(d_beta.to_vector(), d_beta0.to_vector(), "d_beta left alone");
  }
}

TEST(BatchnormCuda, BackwardMatchesCpu) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 1000;
  for (const Shape& shape : kShapes) {
    for (const bool training : {true, false}) {
      if (training && shape[0] * spatial_of(shape) <= 1) continue;
      for (const bool affine : {true, false}) {
        for (const bool param_grads : {true, false}) {
          SCOPED_TRACE("shape " + shape_string(shape) + (training ? " training" : " eval") +
                       (affine ? " affine" : " plain") + (param_grads ? " d_gamma/d_beta" : " no param grads"));
          check_backward(shape, training, affine, param_grads, seed += 30);
        }
      }
    }
  }
}

// A post-activation block's end, relu(λ·shortcut + β·batchnorm(x)) (on a GPU the two kernels in turn), against the
// CPU's fused op: out to the forward's tolerance of the terms it combines.
TEST(BatchnormCuda, ResidualReluFusedMatchesCpu) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 8000;
  const float lambda = 0.8f, branch_scale = 1.2f;
  for (const Shape& shape : kShapes) {
    for (const bool training : {true, false}) {
      if (training && shape[0] * spatial_of(shape) <= 1) continue;
      SCOPED_TRACE("shape " + shape_string(shape) + (training ? " training" : " eval"));
      const std::int64_t c = shape[1];
      const Tensor x = random_tensor(shape, seed += 10, 2.0, 0.7), shortcut = random_tensor(shape, seed + 1);
      const BnParams p = make_params(c, seed + 2);
      Tensor rm_cpu = p.running_mean.clone(), rv_cpu = p.running_var.clone();
      Tensor out_cpu = Tensor::empty(shape), mean_cpu = Tensor::empty({c}), rstd_cpu = Tensor::empty({c});
      ops::batchnorm_residual_relu_forward(x, &p.gamma, &p.beta, 1e-5f, training, 0.1f, rm_cpu, rv_cpu, shortcut,
                                           lambda, branch_scale, out_cpu, mean_cpu, rstd_cpu);
      const Tensor gamma = to_cuda(p.gamma), beta = to_cuda(p.beta);
      Tensor rm = to_cuda(p.running_mean), rv = to_cuda(p.running_var);
      Tensor out = Tensor::empty(shape, DType::f32, Device::cuda);
      Tensor mean = Tensor::empty({c}, DType::f32, Device::cuda), rstd = Tensor::empty({c}, DType::f32, Device::cuda);
      ops::batchnorm_residual_relu_forward(to_cuda(x), &gamma, &beta, 1e-5f, training, 0.1f, rm, rv, to_cuda(shortcut),
                                           lambda, branch_scale, out, mean, rstd);
      expect_close_rel(rstd.to_vector(), rstd_cpu.to_vector(), kValueTol, "rstd");
      expect_close_rel(rm.to_vector(), rm_cpu.to_vector(), kValueTol, "running_mean");
      const std::vector<float> r = rstd_cpu.to_vector(), g = p.gamma.to_vector(), s = shortcut.to_vector();
      std::vector<float> a(r.size());
      for (std::size_t i = 0; i < r.size(); ++i) a[i] = r[i] * g[i];
      std::vector<double> scale = affine_scale(x.to_vector(), shape, mean_cpu.to_vector(), a, p.beta.to_vector());
      for (std::size_t i = 0; i < scale.size(); ++i)
        scale[i] = std::abs(double(lambda) * s[i]) + std::abs(double(branch_scale)) * scale[i];
      expect_close(out.to_vector(), out_cpu.to_vector(), scale, kValueTol, "out");
    }
  }
}

// The fused BatchNorm + ReLU (on a GPU the two kernels in turn) against the CPU's fused op: z to the forward's
// tolerance (the ReLU only clips), and the backward, given the same z, statistics and d_z on both sides, to the
// backward's (its mask is then the same on both).
TEST(BatchnormCuda, ReluFusedMatchesCpu) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 7000;
  for (const Shape& shape : kShapes) {
    for (const bool training : {true, false}) {
      if (training && shape[0] * spatial_of(shape) <= 1) continue;
      SCOPED_TRACE("shape " + shape_string(shape) + (training ? " training" : " eval"));
      const std::int64_t c = shape[1];
      const Tensor x = random_tensor(shape, seed += 10, 2.0, 0.7), d_z = random_tensor(shape, seed + 1);
      const BnParams p = make_params(c, seed + 2);
      Tensor rm_cpu = p.running_mean.clone(), rv_cpu = p.running_var.clone();
      Tensor z_cpu = Tensor::empty(shape), mean_cpu = Tensor::empty({c}), rstd_cpu = Tensor::empty({c});
      ops::batchnorm_relu_forward(x, &p.gamma, &p.beta, 1e-5f, training, 0.1f, rm_cpu, rv_cpu, z_cpu, mean_cpu,
                                  rstd_cpu);
      const Tensor gamma = to_cuda(p.gamma), beta = to_cuda(p.beta);
      Tensor rm = to_cuda(p.running_mean), rv = to_cuda(p.running_var);
      Tensor z = Tensor::empty(shape, DType::f32, Device::cuda);
      Tensor mean = Tensor::empty({c}, DType::f32, Device::cuda), rstd = Tensor::empty({c}, DType::f32, Device::cuda);
      ops::batchnorm_relu_forward(to_cuda(x), &gamma, &beta, 1e-5f, training, 0.1f, rm, rv, z, mean, rstd);
      expect_close_rel(rstd.to_vector(), rstd_cpu.to_vector(), kValueTol, "rstd");
      const std::vector<float> r = rstd_cpu.to_vector(), g = p.gamma.to_vector();
      std::vector<float> a(r.size());
      for (std::size_t i = 0; i < r.size(); ++i) a[i] = r[i] * g[i];
      expect_close(z.to_vector(), z_cpu.to_vector(),
                   affine_scale(x.to_vector(), shape, mean_cpu.to_vector(), a, p.beta.to_vector()), kValueTol, "z");

      Tensor d_x_cpu = Tensor::empty(shape), d_gamma_cpu = Tensor::zeros({c}), d_beta_cpu = Tensor::zeros({c});
      ops::batchnorm_relu_backward(x, &p.gamma, mean_cpu, rstd_cpu, z_cpu, d_z, training, d_x_cpu, &d_gamma_cpu,
                                   &d_beta_cpu);
      Tensor d_x = Tensor::empty(shape, DType::f32, Device::cuda);
      Tensor d_gamma = Tensor::zeros({c}, DType::f32, Device::cuda),
             d_beta = Tensor::zeros({c}, DType::f32, Device::cuda);
      ops::batchnorm_relu_backward(to_cuda(x), &gamma, to_cuda(mean_cpu), to_cuda(rstd_cpu), to_cuda(z_cpu),
                                   to_cuda(d_z), training, d_x, &d_gamma, &d_beta);
      // Scale as in check_backward, of the masked gradient.
      const std::vector<float> xs = x.to_vector(), zs = z_cpu.to_vector(), dzs = d_z.to_vector();
      const std::vector<float> ms = mean_cpu.to_vector();
      const std::int64_t spatial = spatial_of(shape), count = shape[0] * spatial;
      std::vector<double> mean_abs(c, 0.0), mean_abs_xhat(c, 0.0), scale(xs.size());
      for (std::size_t i = 0; i < xs.size(); ++i) {
        const std::size_t ch = static_cast<std::size_t>((static_cast<std::int64_t>(i) / spatial) % c);
        const double dy = zs[i] > 0.0f ? std::abs(double(dzs[i])) : 0.0;
        mean_abs[ch] += dy / double(count);
        mean_abs_xhat[ch] += dy * std::abs((double(xs[i]) - ms[ch]) * r[ch]) / double(count);
      }
      for (std::size_t i = 0; i < xs.size(); ++i) {
        const std::size_t ch = static_cast<std::size_t>((static_cast<std::int64_t>(i) / spatial) % c);
        const double dy = zs[i] > 0.0f ? std::abs(double(dzs[i])) : 0.0;
        const double xhat = std::abs((double(xs[i]) - ms[ch]) * r[ch]);
        scale[i] = std::abs(double(g[ch]) * r[ch]) * (dy + (training ? mean_abs[ch] + xhat * mean_abs_xhat[ch] : 0.0));
      }
      expect_close(d_x.to_vector(), d_x_cpu.to_vector(), scale, kGradTol, "d_x");
      std::vector<double> gamma_scale(c), beta_scale(c);
      for (std::int64_t ch = 0; ch < c; ++ch) {
        gamma_scale[ch] = mean_abs_xhat[ch] * double(count);
        beta_scale[ch] = mean_abs[ch] * double(count);
      }
      expect_close(d_gamma.to_vector(), d_gamma_cpu.to_vector(), gamma_scale, kValueTol, "d_gamma");
      expect_close(d_beta.to_vector(), d_beta_cpu.to_vector(), beta_scale, kValueTol, "d_beta");
    }
  }
}

TEST(BatchnormCuda, ForwardAndBackwardAreBitwiseRepeatable) {
  SKIP_WITHOUT_GPU();
  const Shape shape = {9, 4, 64, 64};
  const Tensor x = to_cuda(random_tensor(shape, 5000, 2.0, 0.7)), d_y = to_cuda(random_tensor(shape, 5001));
  const BnParams p = make_params(4, 5002);
  const Tensor gamma = to_cuda(p.gamma), beta = to_cuda(p.beta);
  std::vector<float> out[2][6];
  for (int run = 0; run < 2; ++run) {
    Tensor rm = to_cuda(p.running_mean), rv = to_cuda(p.running_var);
    Tensor y = Tensor::empty(shape, DType::f32, Device::cuda);
    Tensor mean = Tensor::empty({4}, DType::f32, Device::cuda), rstd = Tensor::empty({4}, DType::f32, Device::cuda);
    ops::batchnorm_forward(x, &gamma, &beta, 1e-5f, true, 0.1f, rm, rv, y, mean, rstd);
    Tensor d_x = Tensor::empty(shape, DType::f32, Device::cuda);
    Tensor d_gamma = Tensor::zeros({4}, DType::f32, Device::cuda),
           d_beta = Tensor::zeros({4}, DType::f32, Device::cuda);
    ops::batchnorm_backward(x, &gamma, mean, rstd, d_y, true, d_x, &d_gamma, &d_beta);
    out[run][0] = y.to_vector();
    out[run][1] = mean.to_vector();
    out[run][2] = rstd.to_vector();
    out[run][3] = d_x.to_vector();
    out[run][4] = d_gamma.to_vector();
    out[run][5] = rv.to_vector();
  }
  const char* names[6] = {"y", "mean", "rstd", "d_x", "d_gamma", "running_var"};
  for (int k = 0; k < 6; ++k) expect_bitwise(out[1][k], out[0][k], names[k]);
}

}  // namespace
}  // namespace proplab
