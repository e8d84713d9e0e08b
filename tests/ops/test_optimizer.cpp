#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/parallel.h"
#include "core/tensor.h"
#include "ops/ops.h"
#include "support/gradcheck.h"

namespace proplab {
namespace {

TEST(AdamW, FirstTwoStepsByHand) {
  // p = 1, lr = 0.1, beta1 = 0.9, beta2 = 0.95, no weight decay.
  // Step 1, g = 0.5: m = 0.05, v = 0.0125, m_hat = 0.5, v_hat = 0.25, p = 1 - 0.1 * 0.5 / 0.5 = 0.9.
  // Step 2, g = -0.5: m = -0.005, v = 0.024375, m_hat = -0.005 / 0.19, v_hat = 0.024375 / 0.0975 = 0.25,
  //   p = 0.9 + 0.1 * (0.005 / 0.19) / 0.5 = 0.905263158.
  Tensor param = Tensor::from_vector({1}, {1.0f});
  Tensor m = Tensor::zeros({1}), v = Tensor::zeros({1});
  ops::AdamWHyper hyper;
  hyper.lr = 0.1f;
  hyper.step = 1;
  ops::adamw_update(param, Tensor::from_vector({1}, {0.5f}), m, v, hyper);
  EXPECT_NEAR(m.item(), 0.05, 1e-7);
  EXPECT_NEAR(v.item(), 0.0125, 1e-7);
  EXPECT_NEAR(param.item(), 0.9, 1e-6);
  hyper.step = 2;
  ops::adamw_update(param, Tensor::from_vector({1}, {-0.5f}), m, v, hyper);
  EXPECT_NEAR(m.item(), -0.005, 1e-7);
  EXPECT_NEAR(v.item(), 0.024375, 1e-7);
  EXPECT_NEAR(param.item(), 0.905263158, 1e-6);
}

TEST(AdamW, DecoupledWeightDecayByHand) {
  // Step 1 with weight decay 0.5: p = 1 - 0.1 * 0.5 * 1 - 0.1 * 0.5 / 0.5 = 0.85; the decay does not enter m.
  Tensor param = Tensor::from_vector({2}, {1.0f, -2.0f});
  Tensor m = Tensor::zeros({2}), v = Tensor::zeros({2});
  ops::AdamWHyper hyper;
  hyper.lr = 0.1f;
  hyper.weight_decay = 0.5f;
  ops::adamw_update(param, Tensor::from_vector({2}, {0.5f, 0.25f}), m, v, hyper);
  EXPECT_NEAR(param.to_vector()[0], 0.85, 1e-6);
  EXPECT_NEAR(param.to_vector()[1], -2.0 + 0.1 * 0.5 * 2.0 - 0.1, 1e-6);
  EXPECT_NEAR(m.to_vector()[0], 0.05, 1e-7);
}

TEST(AdamW, SeveralStepsMatchScalarFormula) {
  const std::int64_t n = 5;
  Tensor param = testing::random_tensor({n}, 1);
  Tensor m = Tensor::zeros({n}), v = Tensor::zeros({n});
  const std::vector<float> initial = param.to_vector();
  std::vector<double> p_ref(initial.begin(), initial.end()), m_ref(n, 0.0), v_ref(n, 0.0);
  ops::AdamWHyper hyper;
  hyper.lr = 0.01f;
  hyper.beta1 = 0.8f;
  hyper.beta2 = 0.99f;
  hyper.eps = 1e-6f;
  hyper.weight_decay = 0.1f;
  for (std::int64_t step = 1; step <= 4; ++step) {
    Tensor grad = testing::random_tensor({n}, 100 + step);
    hyper.step = step;
    ops::adamw_update(param, grad, m, v, hyper);
    const std::vector<float> g = grad.to_vector();
    for (std::int64_t i = 0; i < n; ++i) {
      m_ref[i] = hyper.beta1 * m_ref[i] + (1.0 - hyper.beta1) * g[i];
      v_ref[i] = hyper.beta2 * v_ref[i] + (1.0 - hyper.beta2) * g[i] * g[i];
      const double m_hat = m_ref[i] / (1.0 - std::pow(double(hyper.beta1), double(step)));
      const double v_hat = v_ref[i] / (1.0 - std::pow(double(hyper.beta2), double(step)));
      p_ref[i] -= hyper.lr * hyper.weight_decay * p_ref[i] + hyper.lr * m_hat / (std::sqrt(v_hat) + hyper.eps);
    }
    const std::vector<float> p = param.to_vector(), m_now = m.to_vector(), v_now = v.to_vector();
    for (std::int64_t i = 0; i < n; ++i) {
      EXPECT_NEAR(p[i], p_ref[i], 2e-6) << "step " << step << " element " << i;
      EXPECT_NEAR(m_now[i], m_ref[i], 1e-6);
      EXPECT_NEAR(v_now[i], v_ref[i], 1e-6);
    }
  }
}

TEST(AdamW, BitwiseIdenticalForAnyThreadCount) {
  const int saved = threads();
  const std::int64_t n = 100003;  // several parallel blocks and a ragged end
  Tensor grad = testing::random_tensor({n}, 3);
  std::vector<float> results[2];
  for (int run = 0; run < 2; ++run) {
    set_threads(run + 1);
    Tensor param = testing::random_tensor({n}, 2);
    Tensor m = testing::random_tensor({n}, 4, 0.1), v = testing::random_tensor({n}, 5, 0.1, 1.0);
    ops::AdamWHyper hyper;
    hyper.weight_decay = 0.01f;
    hyper.step = 3;
    ops::adamw_update(param, grad, m, v, hyper);
    results[run] = param.to_vector();
  }
  set_threads(saved);
  EXPECT_EQ(std::memcmp(results[0].data(), results[1].data(), n * sizeof(float)), 0);
}

TEST(AdamW, RejectsBadArguments) {
  Tensor param = Tensor::zeros({3}), grad = Tensor::zeros({3}), m = Tensor::zeros({3}), v = Tensor::zeros({4});
  ops::AdamWHyper hyper;
  EXPECT_THROW(ops::adamw_update(param, grad, m, v, hyper), InternalError);
  Tensor v_ok = Tensor::zeros({3});
  hyper.step = 0;
  EXPECT_THROW(ops::adamw_update(param, grad, m, v_ok, hyper), InternalError);
}

TEST(Sgd, MomentumWithWeightDecayByHand) {
  // p = 2, g = 1 each step, lr = 0.1, momentum = 0.9, weight decay = 0.01 (added to the gradient).
  // Step 1: g' = 1.02, buf = 1.02, p = 2 - 0.102 = 1.898.
  // Step 2: g' = 1.01898, buf = 0.918 + 1.01898 = 1.93698, p = 1.898 - 0.193698 = 1.704302.
  Tensor param = Tensor::from_vector({1}, {2.0f});
  Tensor buffer = Tensor::zeros({1});
  Tensor grad = Tensor::from_vector({1}, {1.0f});
  ops::SgdHyper hyper;
  hyper.lr = 0.1f;
  hyper.momentum = 0.9f;
  hyper.weight_decay = 0.01f;
  ops::sgd_update(param, grad, buffer, hyper);
  EXPECT_NEAR(buffer.item(), 1.02, 1e-6);
  EXPECT_NEAR(param.item(), 1.898, 1e-6);
  ops::sgd_update(param, grad, buffer, hyper);
  EXPECT_NEAR(buffer.item(), 1.93698, 1e-6);
  EXPECT_NEAR(param.item(), 1.704302, 1e-6);
}

TEST(Sgd, NesterovByHand) {
  // As above with nesterov: the step is g' + momentum * buf.
  // Step 1: g' = 1.02, buf = 1.02, step 1.938, p = 1.8062.
  // Step 2: g' = 1.018062, buf = 1.936062, step 1.018062 + 1.7424558 = 2.7605178, p = 1.53014822.
  Tensor param = Tensor::from_vector({1}, {2.0f});
  Tensor buffer = Tensor::zeros({1});
  Tensor grad = Tensor::from_vector({1}, {1.0f});
  ops::SgdHyper hyper;
  hyper.lr = 0.1f;
  hyper.momentum = 0.9f;
  hyper.weight_decay = 0.01f;
  hyper.nesterov = true;
  ops::sgd_update(param, grad, buffer, hyper);
  EXPECT_NEAR(param.item(), 1.8062, 1e-6);
  ops::sgd_update(param, grad, buffer, hyper);
  EXPECT_NEAR(buffer.item(), 1.936062, 1e-6);
  EXPECT_NEAR(param.item(), 1.53014822, 1e-6);
}

TEST(Sgd, PlainStepWithoutMomentum) {
  Tensor param = Tensor::from_vector({3}, {1.0f, -1.0f, 0.5f});
  Tensor grad = Tensor::from_vector({3}, {0.5f, 0.25f, -2.0f});
  Tensor no_buffer;  // unused without momentum
  ops::SgdHyper hyper;
  hyper.lr = 0.2f;
  hyper.momentum = 0.0f;
  hyper.weight_decay = 0.1f;
  ops::sgd_update(param, grad, no_buffer, hyper);
  const std::vector<float> p = param.to_vector();
  EXPECT_NEAR(p[0], 1.0 - 0.2 * (0.5 + 0.1), 1e-7);
  EXPECT_NEAR(p[1], -1.0 - 0.2 * (0.25 - 0.1), 1e-7);
  EXPECT_NEAR(p[2], 0.5 - 0.2 * (-2.0 + 0.05), 1e-7);
}

TEST(Sgd, RejectsBadArguments) {
  Tensor param = Tensor::zeros({3}), grad = Tensor::zeros({3});
  Tensor no_buffer;
  ops::SgdHyper hyper;  // momentum 0.9 needs a buffer
  EXPECT_THROW(ops::sgd_update(param, grad, no_buffer, hyper), InternalError);
  Tensor buffer = Tensor::zeros({3});
  hyper.momentum = 0.0f;
  hyper.nesterov = true;
  EXPECT_THROW(ops::sgd_update(param, grad, buffer, hyper), InternalError);
}

}  // namespace
}  // namespace proplab
