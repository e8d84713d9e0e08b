// The optimizers' optional update measurement (recording's weight_rms and update_ratio) against a direct
// computation from copies of the tensor before and after, and its independence from the thread count.
#include <gtest/gtest.h>

#include <cstring>

#include "core/parallel.h"
#include "ops/ops.h"
#include "support/gradcheck.h"

namespace proplab {

namespace {

void expect_norms_match(const std::vector<float>& before, const Tensor& after, const ops::UpdateNorms& norms) {
  const std::vector<float> now = after.to_vector();
  double w = 0, u = 0;
  for (std::size_t i = 0; i < now.size(); ++i) {
    w += static_cast<double>(before[i]) * before[i];
    const double d = static_cast<double>(now[i]) - before[i];
    u += d * d;
  }
  EXPECT_NEAR(norms.weight_sq, w, 1e-12 * w);
  EXPECT_NEAR(norms.update_sq, u, 1e-12 * u);
  EXPECT_GT(norms.update_sq, 0.0);
}

}  // namespace

TEST(UpdateNorms, AdamWAndSgdMeasureTheirOwnUpdate) {
  const Shape shape{70001};  // several blocks and a ragged tail
  for (int optimizer = 0; optimizer < 2; ++optimizer) {
    Tensor param = testing::random_tensor(shape, 1), grad = testing::random_tensor(shape, 2);
    Tensor m = Tensor::zeros(shape), v = Tensor::zeros(shape);
    Tensor plain = param.clone(), plain_m = Tensor::zeros(shape), plain_v = Tensor::zeros(shape);
    const std::vector<float> before = param.to_vector();
    ops::UpdateNorms norms;
    if (optimizer == 0) {
      ops::AdamWHyper h;
      h.weight_decay = 0.1f;
      ops::adamw_update(param, grad, m, v, h, &norms);
      ops::adamw_update(plain, grad, plain_m, plain_v, h);
    } else {
      ops::SgdHyper h;
      ops::sgd_update(param, grad, m, h, &norms);
      ops::sgd_update(plain, grad, plain_m, h);
    }
    expect_norms_match(before, param, norms);
    EXPECT_EQ(param.to_vector(), plain.to_vector()) << "measuring must not change the update";
  }
}

TEST(UpdateNorms, BitwiseIndependentOfThreads) {
  const Shape shape{100003};
  ops::UpdateNorms one, two;
  for (int threads : {1, 2}) {
    set_threads(threads);
    Tensor param = testing::random_tensor(shape, 3), grad = testing::random_tensor(shape, 4);
    Tensor m = Tensor::zeros(shape), v = Tensor::zeros(shape);
    ops::adamw_update(param, grad, m, v, ops::AdamWHyper{}, threads == 1 ? &one : &two);
  }
  set_threads(0);
  EXPECT_EQ(std::memcmp(&one, &two, sizeof(one)), 0);
}

}  // namespace proplab
