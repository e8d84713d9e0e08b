#include <gtest/gtest.h>

#include <vector>

#include "core/rng.h"
#include "ops/ops.h"
#include "ops_testing.h"
#include "support/gradcheck.h"

namespace proplab {
namespace {

using testing::random_tensor;

constexpr std::uint64_t kSeed = 1234;
const std::uint64_t kStream = stream_id("test.dropout", 3, 7);

TEST(Dropout, MaskFollowsTheCounterRngRateAndScale) {
  const float p = 0.3f;
  const std::int64_t n = 100000;
  Tensor x = random_tensor({n}, 1), y = Tensor::empty({n});
  // The second seed uses all 64 bits of the Philox key.
  for (std::uint64_t seed : {kSeed, std::uint64_t{0xF00DFACE12345678ull}}) {
    ops::dropout_forward(x, p, seed, kStream, y);
    const CounterRng rng(seed, kStream);
    std::int64_t dropped = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const bool drop = rng.uniform(static_cast<std::uint64_t>(i)) < p;
      dropped += drop;
      ASSERT_EQ(y.f32()[i], drop ? 0.0f : x.f32()[i] * (1.0f / (1.0f - p))) << "element " << i;
    }
    // Binomial(n, p): standard deviation ~145 drops, so 0.01 * n is ~7 sigma.
    EXPECT_NEAR(static_cast<double>(dropped) / n, p, 0.01);
  }
}

TEST(Dropout, BackwardReusesTheForwardMask) {
  const float p = 0.5f;
  Tensor x = random_tensor({3, 1000}, 2), y = Tensor::empty(x.shape());
  ops::dropout_forward(x, p, kSeed, kStream, y);
  Tensor d_y = random_tensor(x.shape(), 3), d_x = Tensor::empty(x.shape());
  ops::dropout_backward(d_y, p, kSeed, kStream, d_x);
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    const bool dropped = y.f32()[i] == 0.0f;
    ASSERT_EQ(d_x.f32()[i], dropped ? 0.0f : d_y.f32()[i] * 2.0f) << "element " << i;
  }
  // Another stream (the next step or another site) gives another mask.
  Tensor y_other = Tensor::empty(x.shape());
  ops::dropout_forward(x, p, kSeed, stream_id("test.dropout", 3, 8), y_other);
  EXPECT_FALSE(testing::bitwise_equal(y, y_other));
}

TEST(Dropout, GradientByFiniteDifferences) {
  const float p = 0.25f;
  Tensor x = random_tensor({6, 9}, 4), y = Tensor::empty(x.shape());
  auto loss = [&] {
    ops::dropout_forward(x, p, kSeed, kStream, y);
    return testing::project(y, 5);
  };
  Tensor d_y = testing::projection_weights(x.shape(), 5), d_x = Tensor::empty(x.shape());
  ops::dropout_backward(d_y, p, kSeed, kStream, d_x);
  EXPECT_GRAD_OK(testing::check_gradient(loss, x, d_x));
}

TEST(Dropout, ZeroRateIsIdentity) {
  Tensor x = random_tensor({7, 11}, 6), y = random_tensor({7, 11}, 7);
  ops::dropout_forward(x, 0.0f, kSeed, kStream, y);
  EXPECT_TRUE(testing::bitwise_equal(x, y));
  Tensor d_x = random_tensor({7, 11}, 8);
  ops::dropout_backward(x, 0.0f, kSeed, kStream, d_x);
  EXPECT_TRUE(testing::bitwise_equal(x, d_x));
}

TEST(Dropout, SameMaskForAnyThreadCount) {
  Tensor x = random_tensor({50000}, 9), y1 = Tensor::empty({50000}), y2 = Tensor::empty({50000});
  {
    testing::ScopedThreads one(1);
    ops::dropout_forward(x, 0.1f, kSeed, kStream, y1);
  }
  {
    testing::ScopedThreads two(2);
    ops::dropout_forward(x, 0.1f, kSeed, kStream, y2);
  }
  EXPECT_TRUE(testing::bitwise_equal(y1, y2));
}

TEST(Dropout, RateOutsideUnitIntervalIsAnInternalError) {
  Tensor x = random_tensor({10}, 10), y = Tensor::empty({10});
  EXPECT_THROW(ops::dropout_forward(x, 1.0f, kSeed, kStream, y), InternalError);
  EXPECT_THROW(ops::dropout_forward(x, -0.1f, kSeed, kStream, y), InternalError);
}

}  // namespace
}  // namespace proplab
