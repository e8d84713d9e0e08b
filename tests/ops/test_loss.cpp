#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/parallel.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "ops/ops.h"
#include "support/gradcheck.h"

namespace proplab {
namespace {

Tensor random_targets(const Shape& shape, std::int64_t classes, std::uint64_t seed) {
  Tensor targets = Tensor::empty(shape, DType::i32);
  CounterRng rng(seed, stream_id("test.targets"));
  for (std::int64_t i = 0; i < targets.numel(); ++i)
    targets.i32()[i] = static_cast<std::int32_t>(rng.below(i, static_cast<std::uint64_t>(classes)));
  return targets;
}

struct NaiveCrossEntropy {
  double loss = 0.0;
  std::vector<double> d_logits;
};

// Mean over rows of -log softmax(row)[target], and grad_scale * (softmax - onehot) / rows, in double.
NaiveCrossEntropy naive_cross_entropy(const Tensor& logits, const Tensor& targets, double grad_scale) {
  const std::int64_t V = logits.dim(-1), rows = logits.numel() / V;
  const std::vector<float> x = logits.to_vector();
  NaiveCrossEntropy result;
  result.d_logits.resize(x.size());
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = &x[r * V];
    double max_logit = row[0];
    for (std::int64_t j = 1; j < V; ++j) max_logit = std::max(max_logit, double(row[j]));
    double total = 0.0;
    for (std::int64_t j = 0; j < V; ++j) total += std::exp(row[j] - max_logit);
    const std::int32_t target = targets.i32()[r];
    result.loss += std::log(total) + max_logit - row[target];
    for (std::int64_t j = 0; j < V; ++j)
      result.d_logits[r * V + j] = grad_scale * (std::exp(row[j] - max_logit) / total - (j == target)) / rows;
  }
  result.loss /= rows;
  return result;
}

void expect_cross_entropy_matches(const Shape& logits_shape, std::uint64_t seed, double std, double mean,
                                  float grad_scale) {
  SCOPED_TRACE(::testing::Message() << "logits " << shape_string(logits_shape) << " mean " << mean);
  Tensor logits = testing::random_tensor(logits_shape, seed, std, mean);
  const Shape row_shape(logits_shape.begin(), logits_shape.end() - 1);
  Tensor targets = random_targets(row_shape, logits_shape.back(), seed);
  Tensor d_logits = Tensor::empty(logits_shape);
  const double loss = ops::softmax_cross_entropy(logits, targets, &d_logits, grad_scale);
  const NaiveCrossEntropy naive = naive_cross_entropy(logits, targets, grad_scale);
  EXPECT_NEAR(loss, naive.loss, 1e-5 * std::max(1.0, std::fabs(naive.loss)));
  const std::vector<float> d = d_logits.to_vector();
  for (std::size_t i = 0; i < d.size(); ++i)
    ASSERT_NEAR(d[i], naive.d_logits[i], 1e-7 + 1e-5 * std::fabs(naive.d_logits[i])) << "d_logits element " << i;
  // Without d_logits the same loss comes back.
  EXPECT_EQ(ops::softmax_cross_entropy(logits, targets, nullptr, grad_scale), loss);
}

TEST(CrossEntropy, MatchesNaiveComputation) {
  expect_cross_entropy_matches({6, 37}, 1, 1.0, 0.0, 1.0f);    // class count not a multiple of the vector width
  expect_cross_entropy_matches({5, 80}, 2, 2.0, 0.0, 1.0f);    // a multiple of it
  expect_cross_entropy_matches({3, 4, 9}, 3, 1.0, 0.0, 2.5f);  // [B, T, V] logits, grad_scale
  expect_cross_entropy_matches({4, 5000}, 4, 3.0, 0.0, 1.0f);  // many classes
  expect_cross_entropy_matches({7, 1}, 5, 1.0, 0.0, 1.0f);     // one class: loss 0
}

TEST(CrossEntropy, StableForLargeLogits) {
  // exp(100) overflows float: only the max subtraction keeps this finite.
  expect_cross_entropy_matches({6, 50}, 6, 20.0, 100.0, 1.0f);
  expect_cross_entropy_matches({6, 50}, 7, 20.0, -100.0, 1.0f);
}

TEST(CrossEntropy, UniformLogitsGiveLogV) {
  const std::int64_t rows = 4, V = 50;
  Tensor logits = Tensor::empty({rows, V});
  logits.fill(3.7f);
  Tensor targets = random_targets({rows}, V, 9);
  Tensor d_logits = Tensor::empty({rows, V});
  EXPECT_NEAR(ops::softmax_cross_entropy(logits, targets, &d_logits), std::log(double(V)), 1e-6);
  const std::vector<float> d = d_logits.to_vector();
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = 0; j < V; ++j) EXPECT_NEAR(d[r * V + j], (1.0 / V - (j == targets.i32()[r])) / rows, 1e-7);
}

TEST(CrossEntropy, GradientMatchesFiniteDifferences) {
  Tensor logits = testing::random_tensor({5, 23}, 10, 2.0);
  Tensor targets = random_targets({5}, 23, 10);
  const float grad_scale = 1.7f;
  Tensor d_logits = Tensor::empty(logits.shape());
  ops::softmax_cross_entropy(logits, targets, &d_logits, grad_scale);
  auto loss = [&] { return grad_scale * ops::softmax_cross_entropy(logits, targets, nullptr); };
  testing::GradCheckOptions options;
  options.step = 1e-3;
  options.atol = 1e-5;
  EXPECT_GRAD_OK(testing::check_gradient(loss, logits, d_logits, options));
}

TEST(CrossEntropy, BitwiseIdenticalForAnyThreadCount) {
  const int saved = threads();
  Tensor logits = testing::random_tensor({300, 70}, 11, 2.0);
  Tensor targets = random_targets({300}, 70, 11);
  double losses[2];
  std::vector<float> grads[2];
  for (int run = 0; run < 2; ++run) {
    set_threads(run + 1);
    Tensor d_logits = Tensor::empty(logits.shape());
    losses[run] = ops::softmax_cross_entropy(logits, targets, &d_logits);
    grads[run] = d_logits.to_vector();
  }
  set_threads(saved);
  EXPECT_EQ(std::memcmp(&losses[0], &losses[1], sizeof(double)), 0);
  EXPECT_EQ(std::memcmp(grads[0].data(), grads[1].data(), grads[0].size() * sizeof(float)), 0);
}

TEST(CrossEntropy, RejectsBadTargets) {
  Tensor logits = testing::random_tensor({3, 5}, 12);
  Tensor targets = random_targets({3}, 5, 12);
  targets.i32()[1] = 5;
  EXPECT_THROW(ops::softmax_cross_entropy(logits, targets, nullptr), InternalError);
  targets.i32()[1] = -1;
  EXPECT_THROW(ops::softmax_cross_entropy(logits, targets, nullptr), InternalError);
  Tensor wrong_rows = random_targets({4}, 5, 12);
  EXPECT_THROW(ops::softmax_cross_entropy(logits, wrong_rows, nullptr), InternalError);
  Tensor float_targets = testing::random_tensor({3}, 12);
  EXPECT_THROW(ops::softmax_cross_entropy(logits, float_targets, nullptr), InternalError);
}

TEST(MseLoss, MatchesNaiveComputation) {
  Tensor pred = testing::random_tensor({7, 13}, 20);
  Tensor target = testing::random_tensor({7, 13}, 21);
  Tensor d_pred = Tensor::empty(pred.shape());
  const float grad_scale = 3.0f;
  const double loss = ops::mse_loss(pred, target, &d_pred, grad_scale);
  const std::vector<float> p = pred.to_vector(), t = target.to_vector(), d = d_pred.to_vector();
  double naive = 0.0;
  for (std::size_t i = 0; i < p.size(); ++i) naive += 0.5 * (double(p[i]) - t[i]) * (double(p[i]) - t[i]);
  naive /= double(p.size());
  EXPECT_NEAR(loss, naive, 1e-12 * std::max(1.0, naive));  // differences taken in double
  for (std::size_t i = 0; i < p.size(); ++i)
    EXPECT_NEAR(d[i], grad_scale * (double(p[i]) - t[i]) / double(p.size()), 1e-7);
  EXPECT_EQ(ops::mse_loss(pred, target, nullptr, grad_scale), loss);
}

TEST(MseLoss, GradientMatchesFiniteDifferences) {
  Tensor pred = testing::random_tensor({4, 9}, 22);
  Tensor target = testing::random_tensor({4, 9}, 23);
  const float grad_scale = 0.8f;
  Tensor d_pred = Tensor::empty(pred.shape());
  ops::mse_loss(pred, target, &d_pred, grad_scale);
  auto loss = [&] { return grad_scale * ops::mse_loss(pred, target, nullptr); };
  EXPECT_GRAD_OK(testing::check_gradient(loss, pred, d_pred));
}

TEST(MseLoss, RejectsMismatchedShapes) {
  Tensor pred = testing::random_tensor({4, 9}, 24);
  Tensor target = testing::random_tensor({9, 4}, 25);
  EXPECT_THROW(ops::mse_loss(pred, target, nullptr), InternalError);
}

}  // namespace
}  // namespace proplab
