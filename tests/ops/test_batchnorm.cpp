#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "ops/ops.h"
#include "ops_testing.h"
#include "support/gradcheck.h"

namespace proplab {
namespace {

using testing::check_gradient;
using testing::project;
using testing::projection_weights;
using testing::random_tensor;

constexpr float kEps = 1e-5f;

struct BatchNormBuffers {
  Tensor y, mean, rstd, running_mean, running_var;
  explicit BatchNormBuffers(const Tensor& x)
      : y(Tensor::empty(x.shape())),
        mean(Tensor::empty({x.dim(1)})),
        rstd(Tensor::empty({x.dim(1)})),
        running_mean(Tensor::zeros({x.dim(1)})),
        running_var(Tensor::zeros({x.dim(1)})) {
    running_var.fill(1.0f);
  }
};

TEST(BatchNorm, TrainingNormalisesEachChannelAndUpdatesRunningStatistics) {
  // Channel means far from 0 check the two-pass variance.
  Tensor x = random_tensor({4, 3, 5, 6}, 1, 2.0, 20.0);
  Tensor gamma = random_tensor({3}, 2, 0.3, 1.0), beta = random_tensor({3}, 3);
  BatchNormBuffers b(x);
  ops::batchnorm_forward(x, &gamma, &beta, kEps, true, 0.1f, b.running_mean, b.running_var, b.y, b.mean, b.rstd);
  const std::vector<float> xv = x.to_vector(), yv = b.y.to_vector();
  const std::int64_t spatial = 30, count = 4 * spatial;
  for (int c = 0; c < 3; ++c) {
    double mean = 0, var = 0, y_mean = 0, y_var = 0;
    for (int n = 0; n < 4; ++n)
      for (int p = 0; p < spatial; ++p) mean += xv[(n * 3 + c) * spatial + p];
    mean /= count;
    for (int n = 0; n < 4; ++n)
      for (int p = 0; p < spatial; ++p) var += std::pow(xv[(n * 3 + c) * spatial + p] - mean, 2);
    var /= count;
    for (int n = 0; n < 4; ++n)
      for (int p = 0; p < spatial; ++p) y_mean += yv[(n * 3 + c) * spatial + p];
    y_mean /= count;
    for (int n = 0; n < 4; ++n)
      for (int p = 0; p < spatial; ++p) y_var += std::pow(yv[(n * 3 + c) * spatial + p] - y_mean, 2);
    y_var /= count;
    EXPECT_NEAR(y_mean, beta.f32()[c], 1e-4);
    EXPECT_NEAR(std::sqrt(y_var), std::fabs(gamma.f32()[c]), 1e-4);
    EXPECT_NEAR(b.mean.f32()[c], mean, 1e-4);
    EXPECT_NEAR(b.rstd.f32()[c], 1.0 / std::sqrt(var + kEps), 1e-5);
    EXPECT_NEAR(b.running_mean.f32()[c], 0.1 * mean, 1e-4);
    EXPECT_NEAR(b.running_var.f32()[c], 0.9 + 0.1 * var * count / (count - 1), 1e-4);
  }
}

TEST(BatchNorm, EvalUsesRunningStatisticsAndLeavesThemUnchanged) {
  Tensor x = random_tensor({3, 2, 4, 4}, 4, 1.5, 0.5);
  BatchNormBuffers b(x);
  b.running_mean = Tensor::from_vector({2}, {0.25f, -1.0f});
  b.running_var = Tensor::from_vector({2}, {4.0f, 0.5f});
  Tensor gamma = Tensor::from_vector({2}, {2.0f, 0.5f}), beta = Tensor::from_vector({2}, {0.1f, -0.2f});
  ops::batchnorm_forward(x, &gamma, &beta, kEps, false, 0.1f, b.running_mean, b.running_var, b.y, b.mean, b.rstd);
  EXPECT_EQ(b.running_mean.to_vector(), (std::vector<float>{0.25f, -1.0f}));
  EXPECT_EQ(b.running_var.to_vector(), (std::vector<float>{4.0f, 0.5f}));
  std::vector<double> expected;
  const std::vector<float> xv = x.to_vector();
  const double mean[2] = {0.25, -1.0}, var[2] = {4.0, 0.5}, g[2] = {2.0, 0.5}, be[2] = {0.1, -0.2};
  for (int n = 0; n < 3; ++n)
    for (int c = 0; c < 2; ++c)
      for (int p = 0; p < 16; ++p)
        expected.push_back((xv[(n * 2 + c) * 16 + p] - mean[c]) / std::sqrt(var[c] + kEps) * g[c] + be[c]);
  testing::expect_all_close(b.y, expected, 1e-5, 1e-5, "eval y");

  // Switching: a training step moves the running statistics and then eval output changes with them.
  ops::batchnorm_forward(x, &gamma, &beta, kEps, true, 0.5f, b.running_mean, b.running_var, b.y, b.mean, b.rstd);
  const Tensor y_train = b.y.clone();
  EXPECT_NE(b.running_mean.f32()[0], 0.25f);
  ops::batchnorm_forward(x, &gamma, &beta, kEps, false, 0.5f, b.running_mean, b.running_var, b.y, b.mean, b.rstd);
  EXPECT_FALSE(testing::bitwise_equal(b.y, y_train)) << "eval must not use the batch statistics";
}

TEST(BatchNorm, TrainingGradients) {
  Tensor x = random_tensor({3, 4, 3, 3}, 5, 1.0, 0.5);
  Tensor gamma = random_tensor({4}, 6, 0.5, 1.0), beta = random_tensor({4}, 7);
  BatchNormBuffers b(x);
  auto loss = [&] {
    ops::batchnorm_forward(x, &gamma, &beta, kEps, true, 0.1f, b.running_mean, b.running_var, b.y, b.mean, b.rstd);
    return project(b.y, 8);
  };
  loss();
  Tensor d_y = projection_weights(x.shape(), 8);
  Tensor d_x = Tensor::empty(x.shape()), d_gamma = Tensor::zeros({4}), d_beta = Tensor::zeros({4});
  ops::batchnorm_backward(x, &gamma, b.mean, b.rstd, d_y, true, d_x, &d_gamma, &d_beta);
  EXPECT_GRAD_OK(check_gradient(loss, x, d_x));
  EXPECT_GRAD_OK(check_gradient(loss, gamma, d_gamma));
  EXPECT_GRAD_OK(check_gradient(loss, beta, d_beta));
}

TEST(BatchNorm, EvalGradientsAndFeatureLayout) {
  // [N, C] features (the classifier-side form) in eval mode.
  Tensor x = random_tensor({6, 5}, 9);
  Tensor gamma = random_tensor({5}, 10, 0.5, 1.0);
  BatchNormBuffers b(x);
  b.running_mean = random_tensor({5}, 11);
  b.running_var = random_tensor({5}, 12, 0.2, 1.0);
  auto loss = [&] {
    ops::batchnorm_forward(x, &gamma, nullptr, kEps, false, 0.1f, b.running_mean, b.running_var, b.y, b.mean, b.rstd);
    return project(b.y, 13);
  };
  loss();
  Tensor d_y = projection_weights(x.shape(), 13);
  Tensor d_x = Tensor::empty(x.shape()), d_gamma = Tensor::zeros({5});
  ops::batchnorm_backward(x, &gamma, b.mean, b.rstd, d_y, false, d_x, &d_gamma, nullptr);
  EXPECT_GRAD_OK(check_gradient(loss, x, d_x));
  EXPECT_GRAD_OK(check_gradient(loss, gamma, d_gamma));
}

// The fused op against the two ops it replaces, bitwise: forward (z, statistics, running statistics) and backward
// (d_x, also in place over d_z, and the parameter gradients), training and eval, images and [N, C] features, with
// and without gamma/beta.
TEST(BatchNorm, ReluFusedIsBitwiseBatchNormThenRelu) {
  std::uint64_t seed = 40;
  for (const Shape& shape : {Shape{4, 3, 5, 6}, Shape{7, 5}, Shape{16, 8, 7, 7}}) {
    for (const bool training : {true, false}) {
      for (const bool affine : {true, false}) {
        SCOPED_TRACE(shape_string(shape) + (training ? " training" : " eval") + (affine ? " affine" : " plain"));
        const std::int64_t c = shape[1];
        const Tensor x = random_tensor(shape, ++seed, 1.5, 0.3), d_z = random_tensor(shape, ++seed);
        const Tensor gamma = random_tensor({c}, ++seed, 0.5, 0.8), beta = random_tensor({c}, ++seed, 0.5);
        const Tensor* g = affine ? &gamma : nullptr;
        const Tensor* b = affine ? &beta : nullptr;

        BatchNormBuffers two(x);
        ops::batchnorm_forward(x, g, b, kEps, training, 0.1f, two.running_mean, two.running_var, two.y, two.mean,
                               two.rstd);
        Tensor z_two = Tensor::empty(shape);
        ops::activation_forward(Activation::relu, two.y, z_two);
        BatchNormBuffers fused(x);
        ops::batchnorm_relu_forward(x, g, b, kEps, training, 0.1f, fused.running_mean, fused.running_var, fused.y,
                                    fused.mean, fused.rstd);
        EXPECT_TRUE(testing::bitwise_equal(fused.y, z_two)) << "z";
        EXPECT_TRUE(testing::bitwise_equal(fused.mean, two.mean)) << "mean";
        EXPECT_TRUE(testing::bitwise_equal(fused.rstd, two.rstd)) << "rstd";
        EXPECT_TRUE(testing::bitwise_equal(fused.running_mean, two.running_mean)) << "running_mean";
        EXPECT_TRUE(testing::bitwise_equal(fused.running_var, two.running_var)) << "running_var";
        std::int64_t zeros = 0;
        for (float v : z_two.to_vector()) zeros += v == 0.0f;
        EXPECT_GT(zeros, 0) << "the ReLU's mask is exercised";

        Tensor d_y = Tensor::empty(shape), d_x_two = Tensor::empty(shape);
        Tensor d_gamma_two = random_tensor({c}, seed + 100), d_beta_two = d_gamma_two.clone();
        ops::activation_backward(Activation::relu, two.y, d_z, d_y);
        ops::batchnorm_backward(x, g, two.mean, two.rstd, d_y, training, d_x_two, &d_gamma_two, &d_beta_two);
        Tensor d_x = Tensor::empty(shape);
        Tensor d_gamma = random_tensor({c}, seed + 100), d_beta = d_gamma.clone();
        ops::batchnorm_relu_backward(x, g, fused.mean, fused.rstd, fused.y, d_z, training, d_x, &d_gamma, &d_beta);
        EXPECT_TRUE(testing::bitwise_equal(d_x, d_x_two)) << "d_x";
        EXPECT_TRUE(testing::bitwise_equal(d_gamma, d_gamma_two)) << "d_gamma";
        EXPECT_TRUE(testing::bitwise_equal(d_beta, d_beta_two)) << "d_beta";
        Tensor in_place = d_z.clone();
        ops::batchnorm_relu_backward(x, g, fused.mean, fused.rstd, fused.y, in_place, training, in_place, nullptr,
                                     nullptr);
        EXPECT_TRUE(testing::bitwise_equal(in_place, d_x_two)) << "d_x over d_z";
      }
    }
  }
}

// The post-activation block's end, relu(λ·shortcut + β·batchnorm(x)), in one pass: bitwise batchnorm_forward then
// residual_relu_forward, with its mean, rstd and running statistics, on 1 and 2 threads.
TEST(BatchNorm, ResidualReluFusedIsBitwiseTheTwoOps) {
  std::uint64_t seed = 140;
  for (const Shape& shape : {Shape{4, 3, 5, 6}, Shape{7, 5}, Shape{16, 8, 7, 7}}) {
    for (const bool training : {true, false}) {
      for (const bool affine : {true, false}) {
        for (const auto& [lambda, scale] : {std::pair{1.0f, 1.0f}, std::pair{0.7f, 1.3f}, std::pair{1.0f, 0.0f}}) {
          for (const int threads_used : {1, 2}) {
            SCOPED_TRACE(shape_string(shape) + (training ? " training" : " eval") + (affine ? " affine" : " plain") +
                         " lambda " + std::to_string(lambda) + " beta " + std::to_string(scale) + " threads " +
                         std::to_string(threads_used));
            testing::ScopedThreads scoped(threads_used);
            const std::int64_t c = shape[1];
            const Tensor x = random_tensor(shape, ++seed, 1.5, 0.3), shortcut = random_tensor(shape, ++seed, 1.0);
            const Tensor gamma = random_tensor({c}, ++seed, 0.5, 0.8), beta = random_tensor({c}, ++seed, 0.5);
            const Tensor* g = affine ? &gamma : nullptr;
            const Tensor* b = affine ? &beta : nullptr;

            BatchNormBuffers two(x);
            ops::batchnorm_forward(x, g, b, kEps, training, 0.1f, two.running_mean, two.running_var, two.y, two.mean,
                                   two.rstd);
            Tensor out_two = Tensor::empty(shape);
            ops::residual_relu_forward(shortcut, two.y, lambda, scale, out_two);
            BatchNormBuffers fused(x);
            ops::batchnorm_residual_relu_forward(x, g, b, kEps, training, 0.1f, fused.running_mean, fused.running_var,
                                                 shortcut, lambda, scale, fused.y, fused.mean, fused.rstd);
            EXPECT_TRUE(testing::bitwise_equal(fused.y, out_two)) << "out";
            EXPECT_TRUE(testing::bitwise_equal(fused.mean, two.mean)) << "mean";
            EXPECT_TRUE(testing::bitwise_equal(fused.rstd, two.rstd)) << "rstd";
            EXPECT_TRUE(testing::bitwise_equal(fused.running_mean, two.running_mean)) << "running_mean";
            EXPECT_TRUE(testing::bitwise_equal(fused.running_var, two.running_var)) << "running_var";
            std::int64_t zeros = 0;
            for (float v : out_two.to_vector()) zeros += v == 0.0f;
            EXPECT_GT(zeros, 0) << "the ReLU's mask is exercised";
          }
        }
      }
    }
  }
  const Tensor x = random_tensor({2, 3, 4, 4}, 1), shortcut = random_tensor({2, 3, 4, 4}, 2);
  BatchNormBuffers buffers(x);
  Tensor aliased = x.clone();
  EXPECT_THROW(ops::batchnorm_residual_relu_forward(aliased, nullptr, nullptr, kEps, true, 0.1f, buffers.running_mean,
                                                    buffers.running_var, shortcut, 1.0f, 1.0f, aliased, buffers.mean,
                                                    buffers.rstd),
               InternalError);
}

TEST(BatchNorm, ReluFusedGradients) {
  Tensor x = random_tensor({3, 4, 3, 3}, 60, 1.0, 0.5);
  Tensor gamma = random_tensor({4}, 61, 0.5, 1.0), beta = random_tensor({4}, 62, 0.3);
  BatchNormBuffers b(x);
  auto loss = [&] {
    ops::batchnorm_relu_forward(x, &gamma, &beta, kEps, true, 0.1f, b.running_mean, b.running_var, b.y, b.mean, b.rstd);
    return project(b.y, 63);
  };
  loss();
  Tensor d_z = projection_weights(x.shape(), 63);
  Tensor d_x = Tensor::empty(x.shape()), d_gamma = Tensor::zeros({4}), d_beta = Tensor::zeros({4});
  ops::batchnorm_relu_backward(x, &gamma, b.mean, b.rstd, b.y, d_z, true, d_x, &d_gamma, &d_beta);
  EXPECT_GRAD_OK(check_gradient(loss, x, d_x));
  EXPECT_GRAD_OK(check_gradient(loss, gamma, d_gamma));
  EXPECT_GRAD_OK(check_gradient(loss, beta, d_beta));
}

TEST(BatchNorm, ResultsIndependentOfThreadCount) {
  Tensor x = random_tensor({32, 16, 16, 16}, 14), d_y = random_tensor(x.shape(), 15);
  Tensor gamma = random_tensor({16}, 16);
  Tensor y[2], d_x[2], d_gamma[2], z_fused[2], d_x_relu[2];
  for (int run = 0; run < 2; ++run) {
    testing::ScopedThreads scoped(run == 0 ? 1 : 2);
    BatchNormBuffers b(x);
    ops::batchnorm_forward(x, &gamma, nullptr, kEps, true, 0.1f, b.running_mean, b.running_var, b.y, b.mean, b.rstd);
    y[run] = b.y;
    d_x[run] = Tensor::empty(x.shape());
    d_gamma[run] = Tensor::zeros({16});
    ops::batchnorm_backward(x, &gamma, b.mean, b.rstd, d_y, true, d_x[run], &d_gamma[run], nullptr);
    Tensor z = Tensor::empty(x.shape()), d_x_fused = Tensor::empty(x.shape());
    ops::batchnorm_relu_forward(x, &gamma, nullptr, kEps, true, 0.1f, b.running_mean, b.running_var, z, b.mean, b.rstd);
    ops::batchnorm_relu_backward(x, &gamma, b.mean, b.rstd, z, d_y, true, d_x_fused, nullptr, nullptr);
    z_fused[run] = z;
    d_x_relu[run] = d_x_fused;
  }
  EXPECT_TRUE(testing::bitwise_equal(z_fused[0], z_fused[1]));
  EXPECT_TRUE(testing::bitwise_equal(d_x_relu[0], d_x_relu[1]));
  EXPECT_TRUE(testing::bitwise_equal(y[0], y[1]));
  EXPECT_TRUE(testing::bitwise_equal(d_x[0], d_x[1]));
  EXPECT_TRUE(testing::bitwise_equal(d_gamma[0], d_gamma[1]));
}

}  // namespace
}  // namespace proplab
