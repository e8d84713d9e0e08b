// The attention op's optional logit power sums (used by recording) against a naive double computation, and
// their independence from the thread count.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/parallel.h"
#include "ops/ops.h"
#include "support/gradcheck.h"

namespace proplab {

TEST(AttentionLogitSums, MatchTheCausalLogitsAndRepeatAcrossThreads) {
  const int batch = 3, tokens = 11, heads = 2, width = 12, head_dim = width / heads;
  const float scale = 0.4f;
  Tensor qkv = testing::random_tensor({batch, tokens, 3 * width}, 17, 1.3, 0.2);
  Tensor probs = Tensor::empty({batch, heads, tokens, tokens}), out = Tensor::empty({batch, tokens, width});
  ops::LogitSums sums;
  ops::attention_forward(qkv, heads, scale, probs, out, &sums);

  const std::vector<float> v = qkv.to_vector();
  double s1 = 0, s2 = 0, s3 = 0, s4 = 0, largest = 0;
  std::int64_t count = 0;
  for (int b = 0; b < batch; ++b)
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < tokens; ++i)
        for (int j = 0; j <= i; ++j) {
          double dot = 0;
          for (int e = 0; e < head_dim; ++e)
            dot += static_cast<double>(v[(b * tokens + i) * 3 * width + h * head_dim + e]) *
                   v[(b * tokens + j) * 3 * width + width + h * head_dim + e];
          const double x = dot * scale;
          s1 += x;
          s2 += x * x;
          s3 += x * x * x;
          s4 += x * x * x * x;
          largest = std::max(largest, std::fabs(x));
          ++count;
        }
  EXPECT_EQ(sums.count, count);
  EXPECT_EQ(sums.nonfinite, 0);
  EXPECT_NEAR(sums.sum, s1, 1e-5 * std::fabs(s1) + 1e-4);
  EXPECT_NEAR(sums.sum_sq, s2, 1e-5 * s2);
  EXPECT_NEAR(sums.sum_cube, s3, 1e-5 * std::fabs(s3) + 1e-3);
  EXPECT_NEAR(sums.sum_quad, s4, 1e-5 * s4);
  EXPECT_NEAR(sums.max_abs, largest, 1e-5 * largest);

  // Without the sums the op's outputs are the same; with 1 or 2 threads the sums are bitwise the same.
  Tensor out_plain = Tensor::empty(out.shape());
  ops::attention_forward(qkv, heads, scale, probs, out_plain);
  EXPECT_EQ(out.to_vector(), out_plain.to_vector());
  set_threads(1);
  ops::LogitSums one;
  ops::attention_forward(qkv, heads, scale, probs, out, &one);
  set_threads(2);
  ops::LogitSums two;
  ops::attention_forward(qkv, heads, scale, probs, out, &two);
  set_threads(0);
  EXPECT_EQ(std::memcmp(&one.sum_quad, &two.sum_quad, sizeof(double)), 0);
  EXPECT_EQ(std::memcmp(&one.sum, &two.sum, sizeof(double)), 0);
}

TEST(AttentionLogitSums, NonFiniteLogitsAreCountedAndLeftOutOfTheSums) {
  const int batch = 2, tokens = 9, heads = 2, width = 8, head_dim = width / heads;
  Tensor qkv = testing::random_tensor({batch, tokens, 3 * width}, 23, 1.0, 0.0);
  // A NaN in the query of (sequence 1, token 4, head 0): that row's 5 causal logits are NaN, nothing else is.
  qkv.f32()[(1 * tokens + 4) * 3 * width + 0] = std::nanf("");
  Tensor probs = Tensor::empty({batch, heads, tokens, tokens}), out = Tensor::empty({batch, tokens, width});
  ops::LogitSums with_nan;
  ops::attention_forward(qkv, heads, 0.5f, probs, out, &with_nan);
  EXPECT_EQ(with_nan.count, batch * heads * tokens * (tokens + 1) / 2);
  EXPECT_EQ(with_nan.nonfinite, 5);
  EXPECT_TRUE(std::isfinite(with_nan.sum) && std::isfinite(with_nan.sum_quad) && std::isfinite(with_nan.max_abs));

  // The finite logits' sums against a naive double sum over every row but the NaN one.
  const std::vector<float> v = qkv.to_vector();
  double s1 = 0, s2 = 0, largest = 0;
  for (int b = 0; b < batch; ++b)
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < tokens; ++i) {
        if (b == 1 && h == 0 && i == 4) continue;
        for (int j = 0; j <= i; ++j) {
          double dot = 0;
          for (int e = 0; e < head_dim; ++e)
            dot += static_cast<double>(v[(b * tokens + i) * 3 * width + h * head_dim + e]) *
                   v[(b * tokens + j) * 3 * width + width + h * head_dim + e];
          const double x = dot * 0.5;
          s1 += x;
          s2 += x * x;
          largest = std::max(largest, std::fabs(x));
        }
      }
  EXPECT_NEAR(with_nan.sum, s1, 1e-5 * std::fabs(s1) + 1e-4);
  EXPECT_NEAR(with_nan.sum_sq, s2, 1e-5 * s2);
  EXPECT_NEAR(with_nan.max_abs, largest, 1e-5 * largest);
}

}  // namespace proplab
