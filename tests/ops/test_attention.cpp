#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/parallel.h"
#include "core/tensor.h"
#include "ops/ops.h"
#include "support/gradcheck.h"

namespace proplab {
namespace {

struct AttentionCase {
  std::int64_t batch, tokens, model_dim;
  int heads;
};

struct Reference {
  std::vector<double> probs;  // [B, H, T, T]
  std::vector<double> out;    // [B, T, D]
};

// Straightforward double-precision causal attention, written independently of the kernel's tiling.
Reference reference_attention(const Tensor& qkv, int heads, double scale) {
  const std::int64_t B = qkv.dim(0), T = qkv.dim(1), D = qkv.dim(2) / 3, Dh = D / heads;
  const std::vector<float> x = qkv.to_vector();
  auto at = [&](std::int64_t b, std::int64_t t, std::int64_t feature) {
    return double(x[(b * T + t) * 3 * D + feature]);
  };
  Reference ref{std::vector<double>(B * heads * T * T, 0.0), std::vector<double>(B * T * D, 0.0)};
  for (std::int64_t b = 0; b < B; ++b)
    for (int h = 0; h < heads; ++h)
      for (std::int64_t i = 0; i < T; ++i) {
        std::vector<double> logits(i + 1);
        double max_logit = -std::numeric_limits<double>::infinity();
        for (std::int64_t j = 0; j <= i; ++j) {
          double dot = 0.0;
          for (std::int64_t d = 0; d < Dh; ++d) dot += at(b, i, h * Dh + d) * at(b, j, D + h * Dh + d);
          logits[j] = dot * scale;
          max_logit = std::max(max_logit, logits[j]);
        }
        double total = 0.0;
        for (double& l : logits) total += (l = std::exp(l - max_logit));
        double* p = &ref.probs[((b * heads + h) * T + i) * T];
        for (std::int64_t j = 0; j <= i; ++j) p[j] = logits[j] / total;
        for (std::int64_t e = 0; e < Dh; ++e) {
          double sum = 0.0;
          for (std::int64_t j = 0; j <= i; ++j) sum += p[j] * at(b, j, 2 * D + h * Dh + e);
          ref.out[(b * T + i) * D + h * Dh + e] = sum;
        }
      }
  return ref;
}

// `tolerance` scales the allowed error: large logits are ill-conditioned in float (a relative error of 1e-7 in a
// logit of 300 moves its probability by 3e-5), whatever the kernel does.
void expect_matches_reference(const AttentionCase& c, float scale, std::uint64_t seed, double tolerance = 1.0) {
  SCOPED_TRACE(::testing::Message() << "B=" << c.batch << " T=" << c.tokens << " D=" << c.model_dim
                                    << " heads=" << c.heads << " scale=" << scale);
  Tensor qkv = testing::random_tensor({c.batch, c.tokens, 3 * c.model_dim}, seed);
  Tensor probs = Tensor::empty({c.batch, c.heads, c.tokens, c.tokens});
  Tensor out = Tensor::empty({c.batch, c.tokens, c.model_dim});
  ops::attention_forward(qkv, c.heads, scale, probs, out);
  const Reference ref = reference_attention(qkv, c.heads, scale);
  const std::vector<float> p = probs.to_vector(), o = out.to_vector();
  const std::int64_t T = c.tokens;
  for (std::size_t n = 0; n < p.size(); ++n) {
    const std::int64_t i = (n / T) % T, j = n % T;
    if (j > i) {
      ASSERT_EQ(p[n], 0.0f) << "probability above the diagonal at " << n;
    } else {
      ASSERT_NEAR(p[n], ref.probs[n], tolerance * (2e-6 + 1e-5 * ref.probs[n])) << "probs element " << n;
    }
  }
  for (std::size_t n = 0; n < o.size(); ++n)
    ASSERT_NEAR(o[n], ref.out[n], tolerance * (2e-5 + 1e-5 * std::fabs(ref.out[n]))) << "out element " << n;
}

TEST(Attention, ForwardMatchesDoubleReference) {
  const std::vector<AttentionCase> cases = {{2, 5, 12, 3},  {1, 1, 8, 1},   {2, 37, 64, 2},
                                            {1, 20, 20, 1}, {3, 17, 48, 4}, {1, 70, 96, 1}};
  std::uint64_t seed = 11;
  for (const AttentionCase& c : cases) {
    const double head_dim = double(c.model_dim / c.heads);
    expect_matches_reference(c, float(1.0 / std::sqrt(head_dim)), seed++);
    expect_matches_reference(c, float(1.0 / head_dim), seed++);
    expect_matches_reference(c, 0.7f, seed++);
  }
}

TEST(Attention, ForwardIsStableForLargeLogits) {
  // Logits in the hundreds: exp would overflow without the max subtraction.
  expect_matches_reference({2, 23, 16, 2}, 40.0f, 5, 20.0);
}

TEST(Attention, FutureTokensDoNotChangeEarlierOutputs) {
  const std::int64_t B = 2, T = 19, D = 24, last_kept = 7;
  const int heads = 2;
  Tensor qkv = testing::random_tensor({B, T, 3 * D}, 3);
  Tensor probs = Tensor::empty({B, heads, T, T}), out = Tensor::empty({B, T, D});
  ops::attention_forward(qkv, heads, 0.4f, probs, out);
  const std::vector<float> out_before = out.to_vector(), probs_before = probs.to_vector();

  // Replace q, k and v of every token after last_kept.
  const std::vector<float> fresh = testing::random_tensor(qkv.shape(), 4).to_vector();
  float* x = qkv.f32();
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = last_kept + 1; t < T; ++t)
      for (std::int64_t f = 0; f < 3 * D; ++f) x[(b * T + t) * 3 * D + f] = fresh[(b * T + t) * 3 * D + f];
  ops::attention_forward(qkv, heads, 0.4f, probs, out);
  const std::vector<float> out_after = out.to_vector(), probs_after = probs.to_vector();

  int changed_later = 0;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t f = 0; f < D; ++f) {
        const std::int64_t n = (b * T + t) * D + f;
        if (t <= last_kept)
          ASSERT_EQ(out_before[n], out_after[n]) << "token " << t << " saw a future token";
        else
          changed_later += out_before[n] != out_after[n];
      }
  EXPECT_GT(changed_later, 0) << "the later tokens should see their new values";
  for (std::int64_t bh = 0; bh < B * heads; ++bh)
    for (std::int64_t i = 0; i <= last_kept; ++i)
      for (std::int64_t j = 0; j < T; ++j)
        ASSERT_EQ(probs_before[(bh * T + i) * T + j], probs_after[(bh * T + i) * T + j]);
}

void expect_attention_gradient(const AttentionCase& c, float scale, std::uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "B=" << c.batch << " T=" << c.tokens << " D=" << c.model_dim
                                    << " heads=" << c.heads << " scale=" << scale);
  Tensor qkv = testing::random_tensor({c.batch, c.tokens, 3 * c.model_dim}, seed);
  Tensor probs = Tensor::empty({c.batch, c.heads, c.tokens, c.tokens});
  Tensor out = Tensor::empty({c.batch, c.tokens, c.model_dim});
  const std::uint64_t projection_seed = seed + 1000;
  auto loss = [&] {
    ops::attention_forward(qkv, c.heads, scale, probs, out);
    return testing::project(out, projection_seed);
  };
  loss();
  Tensor d_out = testing::projection_weights(out.shape(), projection_seed);
  Tensor d_qkv = Tensor::empty(qkv.shape());
  d_qkv.fill(std::numeric_limits<float>::quiet_NaN());  // d_qkv is overwritten: no NaN may survive
  ops::attention_backward(qkv, probs, d_out, c.heads, scale, d_qkv);
  testing::GradCheckOptions options;
  options.max_elements = 300;
  options.atol = 5e-4;
  EXPECT_GRAD_OK(testing::check_gradient(loss, qkv, d_qkv, options));
}

TEST(Attention, GradientMatchesFiniteDifferences) {
  expect_attention_gradient({2, 3, 8, 2}, 1.0f / std::sqrt(4.0f), 21);  // heads > 1
  expect_attention_gradient({1, 6, 5, 1}, 1.0f / std::sqrt(5.0f), 22);  // one head
  expect_attention_gradient({2, 1, 6, 2}, 1.0f / std::sqrt(3.0f), 23);  // one token
  expect_attention_gradient({1, 19, 40, 2}, 0.37f, 24);                 // non-default scale, partial tiles
  expect_attention_gradient({1, 7, 12, 3}, 1.0f / 4.0f, 25);            // muP-style 1/Dh
}

TEST(Attention, BitwiseIdenticalForAnyThreadCount) {
  const int saved = threads();
  const std::int64_t B = 3, T = 33, D = 32;
  const int heads = 2;
  Tensor qkv = testing::random_tensor({B, T, 3 * D}, 7);
  Tensor d_out = testing::random_tensor({B, T, D}, 8);
  std::vector<float> results[2];
  for (int run = 0; run < 2; ++run) {
    set_threads(run + 1);
    Tensor probs = Tensor::empty({B, heads, T, T}), out = Tensor::empty({B, T, D}), d_qkv = Tensor::empty(qkv.shape());
    ops::attention_forward(qkv, heads, 0.25f, probs, out);
    ops::attention_backward(qkv, probs, d_out, heads, 0.25f, d_qkv);
    for (const Tensor* t : {&probs, &out, &d_qkv}) {
      std::vector<float> v = t->to_vector();
      results[run].insert(results[run].end(), v.begin(), v.end());
    }
  }
  set_threads(saved);
  ASSERT_EQ(results[0].size(), results[1].size());
  EXPECT_EQ(std::memcmp(results[0].data(), results[1].data(), results[0].size() * sizeof(float)), 0);
}

TEST(Attention, RejectsBadShapes) {
  Tensor qkv = testing::random_tensor({2, 4, 12}, 1);  // D = 4
  Tensor probs = Tensor::empty({2, 2, 4, 4}), out = Tensor::empty({2, 4, 4});
  Tensor wrong_probs = Tensor::empty({2, 1, 4, 4});
  EXPECT_THROW(ops::attention_forward(qkv, 2, 0.5f, wrong_probs, out), InternalError);
  EXPECT_THROW(ops::attention_forward(qkv, 3, 0.5f, probs, out), InternalError);  // 4 % 3 != 0
  Tensor not_packed = testing::random_tensor({2, 4, 13}, 1);
  EXPECT_THROW(ops::attention_forward(not_packed, 1, 0.5f, probs, out), InternalError);
  Tensor d_qkv_wrong = Tensor::empty({2, 4, 4});
  ops::attention_forward(qkv, 2, 0.5f, probs, out);
  EXPECT_THROW(ops::attention_backward(qkv, probs, out, 2, 0.5f, d_qkv_wrong), InternalError);
}

}  // namespace
}  // namespace proplab
