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

TEST(ClipGradNorm, NormOfKnownValues) {
  Tensor a = Tensor::from_vector({2}, {3.0f, 4.0f});
  Tensor b = Tensor::from_vector({1, 1}, {12.0f});
  EXPECT_DOUBLE_EQ(ops::clip_grad_norm({&a, &b}, 0.0), 13.0);  // max_norm 0: report only
  EXPECT_EQ(a.to_vector(), (std::vector<float>{3.0f, 4.0f}));
  EXPECT_EQ(b.to_vector(), (std::vector<float>{12.0f}));
  EXPECT_DOUBLE_EQ(ops::clip_grad_norm({}, 1.0), 0.0);
}

TEST(ClipGradNorm, ScalesOnlyAboveTheThreshold) {
  Tensor a = Tensor::from_vector({2}, {3.0f, 4.0f});
  Tensor b = Tensor::from_vector({1}, {12.0f});
  EXPECT_DOUBLE_EQ(ops::clip_grad_norm({&a, &b}, 20.0), 13.0);
  EXPECT_DOUBLE_EQ(ops::clip_grad_norm({&a, &b}, 13.0), 13.0);  // equal is not above
  EXPECT_EQ(a.to_vector(), (std::vector<float>{3.0f, 4.0f}));
  EXPECT_EQ(b.to_vector(), (std::vector<float>{12.0f}));
  // Above: every tensor scaled by max_norm / norm = 0.5; the pre-clip norm is returned.
  EXPECT_DOUBLE_EQ(ops::clip_grad_norm({&a, &b}, 6.5), 13.0);
  EXPECT_EQ(a.to_vector(), (std::vector<float>{1.5f, 2.0f}));
  EXPECT_EQ(b.to_vector(), (std::vector<float>{6.0f}));
  EXPECT_DOUBLE_EQ(ops::clip_grad_norm({&a, &b}, 0.0), 6.5);
}

TEST(ClipGradNorm, MatchesNaiveNormAndClipsToMaxNorm) {
  Tensor a = testing::random_tensor({300, 70}, 1);
  Tensor b = testing::random_tensor({17}, 2, 3.0);
  Tensor c = testing::random_tensor({5000}, 3, 0.1);
  double naive = 0.0;
  for (const Tensor* t : {&a, &b, &c})
    for (float x : t->to_vector()) naive += double(x) * x;
  naive = std::sqrt(naive);
  const std::vector<float> b_before = b.to_vector();
  const double max_norm = 0.25 * naive;
  EXPECT_NEAR(ops::clip_grad_norm({&a, &b, &c}, max_norm), naive, 1e-12 * naive);
  EXPECT_NEAR(ops::clip_grad_norm({&a, &b, &c}, 0.0), max_norm, 1e-6 * max_norm);
  const std::vector<float> b_after = b.to_vector();
  for (std::size_t i = 0; i < b_after.size(); ++i) EXPECT_FLOAT_EQ(b_after[i], b_before[i] * 0.25f);
}

TEST(ClipGradNorm, BitwiseIdenticalForAnyThreadCount) {
  const int saved = threads();
  double norms[2];
  std::vector<float> clipped[2];
  for (int run = 0; run < 2; ++run) {
    set_threads(run + 1);
    // Sizes spanning many reduction chunks, a ragged one, and a tiny one.
    Tensor a = testing::random_tensor({100000}, 4);
    Tensor b = testing::random_tensor({70001}, 5, 2.0);
    Tensor c = testing::random_tensor({3}, 6);
    norms[run] = ops::clip_grad_norm({&a, &b, &c}, 10.0);
    for (const Tensor* t : {&a, &b, &c}) {
      std::vector<float> v = t->to_vector();
      clipped[run].insert(clipped[run].end(), v.begin(), v.end());
    }
  }
  set_threads(saved);
  EXPECT_GT(norms[0], 10.0);  // the clipping branch ran
  EXPECT_EQ(std::memcmp(&norms[0], &norms[1], sizeof(double)), 0);
  EXPECT_EQ(std::memcmp(clipped[0].data(), clipped[1].data(), clipped[0].size() * sizeof(float)), 0);
}

TEST(ClipGradNorm, RejectsMissingGradients) {
  Tensor a = testing::random_tensor({4}, 7);
  Tensor undefined;
  EXPECT_THROW(ops::clip_grad_norm({&a, nullptr}, 1.0), InternalError);
  EXPECT_THROW(ops::clip_grad_norm({&a, &undefined}, 1.0), InternalError);
}

}  // namespace
}  // namespace proplab
