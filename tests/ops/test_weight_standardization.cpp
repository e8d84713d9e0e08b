#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "ops/ops.h"
#include "ops_testing.h"
#include "support/gradcheck.h"

namespace proplab {
namespace {

using testing::check_gradient;
using testing::project;
using testing::projection_weights;
using testing::random_tensor;

TEST(WeightStandardization, RowsHaveZeroMeanAndSquaredNormGainTimesScaleSquared) {
  Tensor weight = random_tensor({5, 3, 3, 3}, 1, 0.7, 0.3);
  Tensor gain = random_tensor({5}, 2, 0.2, 1.0);
  Tensor w_hat = Tensor::empty(weight.shape()), mean = Tensor::empty({5}), rstd = Tensor::empty({5});
  const float scale = 1.7f;
  ops::weight_standardize_forward(weight, &gain, scale, 0.0f, w_hat, mean, rstd);
  const std::vector<float> v = w_hat.to_vector();
  for (int o = 0; o < 5; ++o) {
    double sum = 0, sum_sq = 0;
    for (int j = 0; j < 27; ++j) {
      sum += v[o * 27 + j];
      sum_sq += v[o * 27 + j] * v[o * 27 + j];
    }
    EXPECT_NEAR(sum, 0.0, 1e-5);
    EXPECT_NEAR(sum_sq, std::pow(gain.f32()[o] * scale, 2), 1e-4);
  }
}

TEST(WeightStandardization, Gradients) {
  Tensor weight = random_tensor({4, 2, 3, 3}, 3, 0.5, 0.1);
  Tensor gain = random_tensor({4}, 4, 0.3, 1.0);
  Tensor w_hat = Tensor::empty(weight.shape()), mean = Tensor::empty({4}), rstd = Tensor::empty({4});
  auto loss = [&] {
    ops::weight_standardize_forward(weight, &gain, 1.3f, 1e-4f, w_hat, mean, rstd);
    return project(w_hat, 5);
  };
  loss();
  Tensor d_w_hat = projection_weights(weight.shape(), 5);
  Tensor d_weight = Tensor::zeros(weight.shape()), d_gain = Tensor::zeros({4});
  ops::weight_standardize_backward(weight, &gain, 1.3f, mean, rstd, d_w_hat, d_weight, &d_gain);
  testing::GradCheckOptions options;
  options.step = 1e-3;
  EXPECT_GRAD_OK(check_gradient(loss, weight, d_weight, options));
  EXPECT_GRAD_OK(check_gradient(loss, gain, d_gain, options));
}

TEST(WeightStandardization, GradientsAccumulate) {
  Tensor weight = random_tensor({3, 8}, 6), d_w_hat = random_tensor({3, 8}, 7);
  Tensor w_hat = Tensor::empty(weight.shape()), mean = Tensor::empty({3}), rstd = Tensor::empty({3});
  ops::weight_standardize_forward(weight, nullptr, 1.0f, 0.0f, w_hat, mean, rstd);
  Tensor d_weight = Tensor::zeros(weight.shape());
  ops::weight_standardize_backward(weight, nullptr, 1.0f, mean, rstd, d_w_hat, d_weight, nullptr);
  const Tensor once = d_weight.clone();
  ops::weight_standardize_backward(weight, nullptr, 1.0f, mean, rstd, d_w_hat, d_weight, nullptr);
  std::vector<double> twice;
  for (float v : once.to_vector()) twice.push_back(2.0 * v);
  testing::expect_all_close(d_weight, twice, 1e-6, 1e-6, "d_weight after two calls");
}

}  // namespace
}  // namespace proplab
