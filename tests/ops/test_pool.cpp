#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
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

TEST(AvgPool2d, ForwardAndGradient) {
  Tensor x = random_tensor({2, 3, 6, 5}, 1);
  Tensor y = Tensor::empty({2, 3, 3, 2});
  ops::avg_pool2d_forward(x, 2, 2, y);
  const std::vector<float> xv = x.to_vector();
  std::vector<double> expected;
  for (int plane = 0; plane < 6; ++plane)
    for (int oh = 0; oh < 3; ++oh)
      for (int ow = 0; ow < 2; ++ow) {
        double sum = 0;
        for (int i = 0; i < 2; ++i)
          for (int j = 0; j < 2; ++j) sum += xv[plane * 30 + (2 * oh + i) * 5 + 2 * ow + j];
        expected.push_back(sum / 4);
      }
  testing::expect_all_close(y, expected, 1e-6, 1e-6, "avg pool y");
  auto loss = [&] {
    ops::avg_pool2d_forward(x, 2, 2, y);
    return project(y, 2);
  };
  Tensor d_x = Tensor::empty(x.shape());
  ops::avg_pool2d_backward(projection_weights(y.shape(), 2), 2, 2, d_x);
  EXPECT_GRAD_OK(check_gradient(loss, x, d_x));
  // Overlapping windows (kernel 3, stride 1) add up.
  Tensor y3 = Tensor::empty({2, 3, 4, 3});
  auto loss3 = [&] {
    ops::avg_pool2d_forward(x, 3, 1, y3);
    return project(y3, 3);
  };
  ops::avg_pool2d_backward(projection_weights(y3.shape(), 3), 3, 1, d_x);
  EXPECT_GRAD_OK(check_gradient(loss3, x, d_x));
}

TEST(MaxPool2d, ForwardPicksWindowMaximaAndPaddingNeverWins) {
  // All values negative: a zero padding would win if it were counted.
  Tensor x = random_tensor({1, 2, 5, 5}, 4, 1.0, -10.0);
  Tensor y = Tensor::empty({1, 2, 3, 3}), argmax = Tensor::empty({1, 2, 3, 3}, DType::i32);
  ops::max_pool2d_forward(x, 3, 2, 1, y, argmax);
  const std::vector<float> xv = x.to_vector();
  std::vector<double> expected;
  for (int plane = 0; plane < 2; ++plane)
    for (int oh = 0; oh < 3; ++oh)
      for (int ow = 0; ow < 3; ++ow) {
        float best = -std::numeric_limits<float>::infinity();
        for (int i = 0; i < 3; ++i)
          for (int j = 0; j < 3; ++j) {
            const int ih = 2 * oh - 1 + i, iw = 2 * ow - 1 + j;
            if (ih >= 0 && ih < 5 && iw >= 0 && iw < 5) best = std::max(best, xv[plane * 25 + ih * 5 + iw]);
          }
        expected.push_back(best);
      }
  testing::expect_all_close(y, expected, 0.0, 0.0, "max pool y");
}

TEST(MaxPool2d, Gradient) {
  Tensor x = random_tensor({2, 2, 6, 6}, 5);
  Tensor y = Tensor::empty({2, 2, 3, 3}), argmax = Tensor::empty({2, 2, 3, 3}, DType::i32);
  auto loss = [&] {
    ops::max_pool2d_forward(x, 3, 2, 1, y, argmax);
    return project(y, 6);
  };
  loss();
  Tensor d_x = random_tensor(x.shape(), 7);
  ops::max_pool2d_backward(projection_weights(y.shape(), 6), argmax, d_x);
  testing::GradCheckOptions options;
  options.step = 1e-3;  // random values are well separated: no window's maximum changes within ±step
  EXPECT_GRAD_OK(check_gradient(loss, x, d_x, options));
}

TEST(GlobalAvgPool, ForwardAndGradient) {
  Tensor x = random_tensor({3, 4, 5, 2}, 8);
  Tensor y = Tensor::empty({3, 4});
  ops::global_avg_pool_forward(x, y);
  const std::vector<float> xv = x.to_vector();
  std::vector<double> expected;
  for (int plane = 0; plane < 12; ++plane) {
    double sum = 0;
    for (int p = 0; p < 10; ++p) sum += xv[plane * 10 + p];
    expected.push_back(sum / 10);
  }
  testing::expect_all_close(y, expected, 1e-6, 1e-6, "global avg pool y");
  auto loss = [&] {
    ops::global_avg_pool_forward(x, y);
    return project(y, 9);
  };
  Tensor d_x = Tensor::empty(x.shape());
  ops::global_avg_pool_backward(projection_weights(y.shape(), 9), d_x);
  EXPECT_GRAD_OK(check_gradient(loss, x, d_x));
}

TEST(ChannelsLast, RoundTripsAndPutsChannelsLast) {
  Tensor x = random_tensor({2, 3, 4, 5}, 10);
  Tensor y = Tensor::empty({2, 20, 3}), back = Tensor::empty(x.shape());
  ops::nchw_to_nhwc(x, y);
  EXPECT_EQ(y.f32()[(1 * 20 + 7) * 3 + 2], x.f32()[(1 * 3 + 2) * 20 + 7]);
  ops::nhwc_to_nchw(y, back);
  EXPECT_TRUE(testing::bitwise_equal(back, x));
  // Several pixel blocks and a short last one (7 × 11 = 77 pixels), 16 channels: every element in its place.
  Tensor big = random_tensor({3, 16, 7, 11}, 11);
  Tensor last = Tensor::empty({3, 77, 16});
  ops::nchw_to_nhwc(big, last);
  for (std::int64_t b = 0; b < 3; ++b)
    for (std::int64_t ch = 0; ch < 16; ++ch)
      for (std::int64_t p = 0; p < 77; ++p)
        ASSERT_EQ(last.f32()[(b * 77 + p) * 16 + ch], big.f32()[(b * 16 + ch) * 77 + p]) << b << " " << ch << " " << p;
}

}  // namespace
}  // namespace proplab
