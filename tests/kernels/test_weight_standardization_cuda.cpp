// CUDA-vs-CPU comparison of scaled weight standardisation (kernels/weight_standardization.cu against
// ops/weight_standardization.cpp) through the ops entry points: convolution and linear weights, a fan-in of one,
// rows longer than a block, gain present or absent, d_gain present or absent, both gradients accumulating into
// nonzero values. Skipped at run time when no GPU is present.
//
// Tolerances: the row sums are in double on both sides (only the order differs), so mean and rstd agree to the
// last bit except on a float rounding boundary: 1e-6 relative. w_hat = (w − m)·a is compared to 1e-6 relative to
// (|w| + |m|)·|a|; d_weight, which subtracts two row means from each term, to 1e-5 relative to the sum of the
// magnitudes of its terms; d_gain to 1e-6 relative to |start| + scale·Σ |d_w_hat·x̂|.
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
constexpr float kScale = 1.7f;
constexpr float kEps = 1e-4f;

const std::vector<Shape> kShapes = {{8, 3, 3, 3}, {5, 1}, {300, 7}, {64, 512, 3, 3}, {3, 1'000'003}, {1, 257}};

TEST(WeightStandardizationCuda, ForwardMatchesCpu) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 100;
  for (const Shape& shape : kShapes) {
    for (const bool with_gain : {true, false}) {
      SCOPED_TRACE("weight " + shape_string(shape) + (with_gain ? " gain" : " no gain"));
      const std::int64_t rows = shape[0], fan_in = shape_numel(shape) / rows;
      const Tensor w = random_tensor(shape, seed += 10, 0.3, 0.05), gain = random_tensor({rows}, seed + 1, 0.2, 1.0);
      Tensor w_hat_cpu = Tensor::empty(shape), mean_cpu = Tensor::empty({rows}), rstd_cpu = Tensor::empty({rows});
      ops::weight_standardize_forward(w, with_gain ? &gain : nullptr, kScale, kEps, w_hat_cpu, mean_cpu, rstd_cpu);
      const Tensor gain_gpu = to_cuda(gain);
      Tensor w_hat = Tensor::empty(shape, DType::f32, Device::cuda);
      Tensor mean = Tensor::empty({rows}, DType::f32, Device::cuda),
             rstd = Tensor::empty({rows}, DType::f32, Device::cuda);
      ops::weight_standardize_forward(to_cuda(w), with_gain ? &gain_gpu : nullptr, kScale, kEps, w_hat, mean, rstd);

      expect_close_rel(mean.to_vector(), mean_cpu.to_vector(), kValueTol, "mean");
      expect_close_rel(rstd.to_vector(), rstd_cpu.to_vector(), kValueTol, "rstd");
      const std::vector<float> ws = w.to_vector(), ms = mean_cpu.to_vector(), rs = rstd_cpu.to_vector();
      const std::vector<float> gs = gain.to_vector();
      std::vector<double> scale(ws.size());
      for (std::size_t i = 0; i < ws.size(); ++i) {
        const std::size_t o = i / static_cast<std::size_t>(fan_in);
        const double a = std::abs(double(rs[o]) * kScale * (with_gain ? gs[o] : 1.0f));
        scale[i] = (std::abs(double(ws[i])) + std::abs(double(ms[o]))) * a;
      }
      expect_close(w_hat.to_vector(), w_hat_cpu.to_vector(), scale, kValueTol, "w_hat");
    }
  }
}

TEST(WeightStandardizationCuda, BackwardMatchesCpuAndAccumulates) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 200;
  for (const Shape& shape : kShapes) {
    for (const bool with_gain : {true, false}) {
      for (const bool with_d_gain : {true, false}) {
        SCOPED_TRACE("weight " + shape_string(shape) + (with_gain ? " gain" : " no gain") +
                     (with_d_gain ? " d_gain" : " no d_gain"));
        const std::int64_t rows = shape[0], fan_in = shape_numel(shape) / rows;
        const Tensor w = random_tensor(shape, seed += 10, 0.3, 0.05), gain = random_tensor({rows}, seed + 1, 0.2, 1.0);
        const Tensor d_w_hat = random_tensor(shape, seed + 2);
        const Tensor d_w0 = random_tensor(shape, seed + 3, 0.1), d_gain0 = random_tensor({rows}, seed + 4, 0.1);
        Tensor w_hat = Tensor::empty(shape), mean = Tensor::empty({rows}), rstd = Tensor::empty({rows});
        ops::weight_standardize_forward(w, with_gain ? &gain : nullptr, kScale, kEps, w_hat, mean, rstd);

        Tensor d_w_cpu = d_w0.clone(), d_gain_cpu = d_gain0.clone();
        ops::weight_standardize_backward(w, with_gain ? &gain : nullptr, kScale, mean, rstd, d_w_hat, d_w_cpu,
                                         with_d_gain ? &d_gain_cpu : nullptr);
        const Tensor gain_gpu = to_cuda(gain);
        Tensor d_w = to_cuda(d_w0), d_gain = to_cuda(d_gain0);
        ops::weight_standardize_backward(to_cuda(w), with_gain ? &gain_gpu : nullptr, kScale, to_cuda(mean),
                                         to_cuda(rstd), to_cuda(d_w_hat), d_w, with_d_gain ? &d_gain : nullptr);

        // d_w += r·(a·d − mean(a·d) − x̂·Σ a·d·x̂): scale |start| + |r|·(|a·d| + mean |a·d| + |x̂|·Σ |a·d·x̂|).
        const std::vector<float> ws = w.to_vector(), ds = d_w_hat.to_vector(), ms = mean.to_vector();
        const std::vector<float> rs = rstd.to_vector(), gs = gain.to_vector(), d0 = d_w0.to_vector();
        std::vector<double> mean_abs_d(rows, 0.0), sum_abs_d_xhat(rows, 0.0);
        for (std::size_t i = 0; i < ws.size(); ++i) {
          const std::size_t o = i / static_cast<std::size_t>(fan_in);
          const double xhat = (double(ws[i]) - ms[o]) * rs[o];
          mean_abs_d[o] += std::abs(double(ds[i])) / double(fan_in);
          sum_abs_d_xhat[o] += std::abs(double(ds[i]) * xhat);
        }
        std::vector<double> scale(ws.size());
        for (std::size_t i = 0; i < ws.size(); ++i) {
          const std::size_t o = i / static_cast<std::size_t>(fan_in);
          const double a = std::abs(double(kScale) * (with_gain ? gs[o] : 1.0f));
          const double xhat = std::abs((double(ws[i]) - ms[o]) * rs[o]);
          scale[i] = std::abs(double(d0[i])) +
                     std::abs(double(rs[o])) * a * (std::abs(double(ds[i])) + mean_abs_d[o] + xhat * sum_abs_d_xhat[o]);
        }
        expect_close(d_w.to_vector(), d_w_cpu.to_vector(), scale, kGradTol, "d_weight");
        if (with_d_gain) {
          const std::vector<float> g0 = d_gain0.to_vector();
          std::vector<double> gain_scale(rows);
          for (std::int64_t o = 0; o < rows; ++o) gain_scale[o] = std::abs(double(g0[o])) + kScale * sum_abs_d_xhat[o];
          expect_close(d_gain.to_vector(), d_gain_cpu.to_vector(), gain_scale, kValueTol, "d_gain");
        } else {
          expect_bitwise(d_gain.to_vector(), d_gain0.to_vector(), "d_gain left alone");
        }
      }
    }
  }
}

TEST(WeightStandardizationCuda, ForwardAndBackwardAreBitwiseRepeatable) {
  SKIP_WITHOUT_GPU();
  const Shape shape = {64, 512, 3, 3};
  const Tensor w = to_cuda(random_tensor(shape, 300, 0.3)), gain = to_cuda(random_tensor({64}, 301, 0.2, 1.0));
  const Tensor d_w_hat = to_cuda(random_tensor(shape, 302));
  std::vector<float> out[2][5];
  for (int run = 0; run < 2; ++run) {
    Tensor w_hat = Tensor::empty(shape, DType::f32, Device::cuda);
    Tensor mean = Tensor::empty({64}, DType::f32, Device::cuda), rstd = Tensor::empty({64}, DType::f32, Device::cuda);
    ops::weight_standardize_forward(w, &gain, kScale, kEps, w_hat, mean, rstd);
    Tensor d_w = Tensor::zeros(shape, DType::f32, Device::cuda), d_gain = Tensor::zeros({64}, DType::f32, Device::cuda);
    ops::weight_standardize_backward(w, &gain, kScale, mean, rstd, d_w_hat, d_w, &d_gain);
    out[run][0] = w_hat.to_vector();
    out[run][1] = mean.to_vector();
    out[run][2] = rstd.to_vector();
    out[run][3] = d_w.to_vector();
    out[run][4] = d_gain.to_vector();
  }
  const char* names[5] = {"w_hat", "mean", "rstd", "d_weight", "d_gain"};
  for (int k = 0; k < 5; ++k) expect_bitwise(out[1][k], out[0][k], names[k]);
}

}  // namespace
}  // namespace proplab
