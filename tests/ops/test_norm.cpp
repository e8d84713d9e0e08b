#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "ops/ops.h"
#include "ops_testing.h"
#include "support/gradcheck.h"
#include "support/moments_equal.h"

namespace proplab {
namespace {

using testing::check_gradient;
using testing::project;
using testing::projection_weights;
using testing::random_tensor;

constexpr float kEps = 1e-5f;

struct NaiveNorm {
  std::vector<double> y, mean, rstd;
};

// LayerNorm (rms = false) or RMSNorm (rms = true) over the last dimension, in double.
NaiveNorm naive_norm(const Tensor& x, const Tensor* gamma, const Tensor* beta, bool rms) {
  const std::int64_t d = x.dim(-1), rows = x.numel() / d;
  const std::vector<float> xv = x.to_vector();
  NaiveNorm out;
  for (std::int64_t r = 0; r < rows; ++r) {
    double mean = 0.0, var = 0.0;
    for (std::int64_t j = 0; j < d; ++j) mean += xv[r * d + j];
    mean = rms ? 0.0 : mean / d;
    for (std::int64_t j = 0; j < d; ++j) var += (xv[r * d + j] - mean) * (xv[r * d + j] - mean);
    const double rstd = 1.0 / std::sqrt(var / d + kEps);
    out.mean.push_back(mean);
    out.rstd.push_back(rstd);
    for (std::int64_t j = 0; j < d; ++j) {
      double v = (xv[r * d + j] - mean) * rstd;
      if (gamma) v *= gamma->f32()[j];
      if (beta) v += beta->f32()[j];
      out.y.push_back(v);
    }
  }
  return out;
}

TEST(LayerNorm, ForwardMatchesNaiveForEveryAffineCombination) {
  // Rows with a large mean check the two-pass variance.
  Tensor x = random_tensor({3, 4, 24}, 1, 2.0, 30.0);
  Tensor gamma = random_tensor({24}, 2), beta = random_tensor({24}, 3);
  Tensor y = Tensor::empty(x.shape()), mean = Tensor::empty({3, 4}), rstd = Tensor::empty({12});
  for (int variant = 0; variant < 4; ++variant) {
    const Tensor* g = (variant & 1) ? &gamma : nullptr;
    const Tensor* b = (variant & 2) ? &beta : nullptr;
    ops::layernorm_forward(x, g, b, kEps, y, mean, rstd);
    const NaiveNorm expected = naive_norm(x, g, b, false);
    testing::expect_all_close(y, expected.y, 2e-5, 2e-5, "layernorm y, variant " + std::to_string(variant));
    testing::expect_all_close(mean, expected.mean, 1e-5, 1e-6, "layernorm mean");
    testing::expect_all_close(rstd, expected.rstd, 0.0, 2e-5, "layernorm rstd");
  }
}

TEST(LayerNorm, GradientsAffine) {
  Tensor x = random_tensor({5, 8}, 4), gamma = random_tensor({8}, 5, 0.5, 1.0), beta = random_tensor({8}, 6);
  Tensor y = Tensor::empty(x.shape()), mean = Tensor::empty({5}), rstd = Tensor::empty({5});
  auto loss = [&] {
    ops::layernorm_forward(x, &gamma, &beta, kEps, y, mean, rstd);
    return project(y, 7);
  };
  loss();
  Tensor d_y = projection_weights(y.shape(), 7);
  Tensor d_x = Tensor::empty(x.shape()), d_gamma = Tensor::zeros({8}), d_beta = Tensor::zeros({8});
  ops::layernorm_backward(x, &gamma, mean, rstd, d_y, d_x, &d_gamma, &d_beta);
  EXPECT_GRAD_OK(check_gradient(loss, x, d_x));
  EXPECT_GRAD_OK(check_gradient(loss, gamma, d_gamma));
  EXPECT_GRAD_OK(check_gradient(loss, beta, d_beta));
}

TEST(LayerNorm, GradientsWithoutAffine) {
  Tensor x = random_tensor({2, 3, 7}, 8);
  Tensor y = Tensor::empty(x.shape()), mean = Tensor::empty({6}), rstd = Tensor::empty({6});
  auto loss = [&] {
    ops::layernorm_forward(x, nullptr, nullptr, kEps, y, mean, rstd);
    return project(y, 9);
  };
  loss();
  Tensor d_y = projection_weights(y.shape(), 9);
  Tensor d_x = Tensor::empty(x.shape());
  ops::layernorm_backward(x, nullptr, mean, rstd, d_y, d_x, nullptr, nullptr);
  EXPECT_GRAD_OK(check_gradient(loss, x, d_x));
}

TEST(LayerNorm, ParameterGradsAccumulateActivationGradsOverwrite) {
  Tensor x = random_tensor({6, 5}, 10), gamma = random_tensor({5}, 11), d_y = random_tensor({6, 5}, 12);
  Tensor y = Tensor::empty(x.shape()), mean = Tensor::empty({6}), rstd = Tensor::empty({6});
  ops::layernorm_forward(x, &gamma, nullptr, kEps, y, mean, rstd);
  Tensor d_x = random_tensor(x.shape(), 13), d_gamma = Tensor::zeros({5}), d_beta = Tensor::zeros({5});
  ops::layernorm_backward(x, &gamma, mean, rstd, d_y, d_x, &d_gamma, &d_beta);
  const Tensor d_x_once = d_x.clone(), d_gamma_once = d_gamma.clone(), d_beta_once = d_beta.clone();
  ops::layernorm_backward(x, &gamma, mean, rstd, d_y, d_x, &d_gamma, &d_beta);
  EXPECT_TRUE(testing::bitwise_equal(d_x, d_x_once)) << "d_x must be overwritten";
  std::vector<double> twice_gamma, twice_beta;
  for (float v : d_gamma_once.to_vector()) twice_gamma.push_back(2.0 * v);
  for (float v : d_beta_once.to_vector()) twice_beta.push_back(2.0 * v);
  testing::expect_all_close(d_gamma, twice_gamma, 1e-6, 1e-6, "d_gamma after two calls");
  testing::expect_all_close(d_beta, twice_beta, 1e-6, 1e-6, "d_beta after two calls");

  // d_x may alias d_y.
  Tensor shared = d_y.clone();
  Tensor d_gamma_alias = Tensor::zeros({5});
  ops::layernorm_backward(x, &gamma, mean, rstd, shared, shared, &d_gamma_alias, nullptr);
  EXPECT_TRUE(testing::bitwise_equal(shared, d_x_once));
  EXPECT_TRUE(testing::bitwise_equal(d_gamma_alias, d_gamma_once));
}

TEST(LayerNorm, ParameterGradientsIndependentOfThreadCount) {
  // 400 rows: many row chunks and the parallel path.
  Tensor x = random_tensor({400, 96}, 14), gamma = random_tensor({96}, 15), d_y = random_tensor({400, 96}, 16);
  Tensor y = Tensor::empty(x.shape()), mean = Tensor::empty({400}), rstd = Tensor::empty({400});
  ops::layernorm_forward(x, &gamma, nullptr, kEps, y, mean, rstd);
  Tensor d_x1 = Tensor::empty(x.shape()), d_gamma1 = Tensor::zeros({96}), d_beta1 = Tensor::zeros({96});
  Tensor d_x2 = Tensor::empty(x.shape()), d_gamma2 = Tensor::zeros({96}), d_beta2 = Tensor::zeros({96});
  {
    testing::ScopedThreads one(1);
    ops::layernorm_backward(x, &gamma, mean, rstd, d_y, d_x1, &d_gamma1, &d_beta1);
  }
  {
    testing::ScopedThreads two(2);
    ops::layernorm_backward(x, &gamma, mean, rstd, d_y, d_x2, &d_gamma2, &d_beta2);
  }
  EXPECT_TRUE(testing::bitwise_equal(d_gamma1, d_gamma2));
  EXPECT_TRUE(testing::bitwise_equal(d_beta1, d_beta2));
  EXPECT_TRUE(testing::bitwise_equal(d_x1, d_x2));
  // And the chunked sums agree with a direct double sum.
  std::vector<double> beta_sums(96, 0.0);
  const std::vector<float> gv = d_y.to_vector();
  for (int r = 0; r < 400; ++r)
    for (int j = 0; j < 96; ++j) beta_sums[j] += gv[r * 96 + j];
  testing::expect_all_close(d_beta1, beta_sums, 1e-5, 1e-6, "d_beta");
}

TEST(RmsNorm, ForwardMatchesNaive) {
  Tensor x = random_tensor({7, 20}, 17, 1.5, 0.3), gamma = random_tensor({20}, 18);
  Tensor y = Tensor::empty(x.shape()), rstd = Tensor::empty({7});
  for (bool affine : {true, false}) {
    ops::rmsnorm_forward(x, affine ? &gamma : nullptr, kEps, y, rstd);
    const NaiveNorm expected = naive_norm(x, affine ? &gamma : nullptr, nullptr, true);
    testing::expect_all_close(y, expected.y, 1e-5, 1e-5, affine ? "rmsnorm y (gamma)" : "rmsnorm y");
    testing::expect_all_close(rstd, expected.rstd, 0.0, 1e-5, "rmsnorm rstd");
  }
}

TEST(RmsNorm, Gradients) {
  Tensor x = random_tensor({4, 9}, 19), gamma = random_tensor({9}, 20, 0.5, 1.0);
  Tensor y = Tensor::empty(x.shape()), rstd = Tensor::empty({4});
  for (bool affine : {true, false}) {
    const Tensor* g = affine ? &gamma : nullptr;
    auto loss = [&] {
      ops::rmsnorm_forward(x, g, kEps, y, rstd);
      return project(y, 21);
    };
    loss();
    Tensor d_y = projection_weights(y.shape(), 21);
    Tensor d_x = Tensor::empty(x.shape()), d_gamma = Tensor::zeros({9});
    ops::rmsnorm_backward(x, g, rstd, d_y, d_x, affine ? &d_gamma : nullptr);
    EXPECT_GRAD_OK(check_gradient(loss, x, d_x));
    if (affine) {
      EXPECT_GRAD_OK(check_gradient(loss, gamma, d_gamma));
    }
  }
}

TEST(RmsNorm, ParameterGradsAccumulateActivationGradsOverwrite) {
  Tensor x = random_tensor({300, 40}, 22), gamma = random_tensor({40}, 23), d_y = random_tensor({300, 40}, 24);
  Tensor y = Tensor::empty(x.shape()), rstd = Tensor::empty({300});
  ops::rmsnorm_forward(x, &gamma, kEps, y, rstd);
  Tensor d_x = random_tensor(x.shape(), 25), d_gamma = Tensor::zeros({40});
  ops::rmsnorm_backward(x, &gamma, rstd, d_y, d_x, &d_gamma);
  const Tensor d_x_once = d_x.clone(), d_gamma_once = d_gamma.clone();
  ops::rmsnorm_backward(x, &gamma, rstd, d_y, d_x, &d_gamma);
  EXPECT_TRUE(testing::bitwise_equal(d_x, d_x_once));
  std::vector<double> twice;
  for (float v : d_gamma_once.to_vector()) twice.push_back(2.0 * v);
  testing::expect_all_close(d_gamma, twice, 1e-6, 1e-6, "rmsnorm d_gamma after two calls");
  Tensor d_gamma1 = Tensor::zeros({40}), d_gamma2 = Tensor::zeros({40});
  {
    testing::ScopedThreads one(1);
    ops::rmsnorm_backward(x, &gamma, rstd, d_y, d_x, &d_gamma1);
  }
  {
    testing::ScopedThreads two(2);
    ops::rmsnorm_backward(x, &gamma, rstd, d_y, d_x, &d_gamma2);
  }
  EXPECT_TRUE(testing::bitwise_equal(d_gamma1, d_gamma2));
}

// The output's statistics gathered inside the norm (ops::OpMoments) are bitwise probe::accumulate of y, and y, the
// saved mean and rstd are bitwise the same with and without them: LayerNorm with and without gain and shift, RMSNorm
// with and without gain, 1 and 2 threads, rows split into whole sequences, into pieces of sequences and under the
// parallel threshold, and 2000-feature rows with layout-free statistics (not taken in chunks: the rows are then
// computed in whole-row ranges and y summed after).
TEST(Norm, GatheredMomentsAreBitwiseAccumulateOfTheOutput) {
  const probe::StatSelection all = probe::StatSelection::all();
  const probe::StatSelection layout_free = probe::StatSelection::parse({"mean", "kurtosis", "max_abs"});
  struct Case {
    std::int64_t sequences, tokens, features;
    probe::StatSelection stats;
  };
  std::uint64_t seed = 80;
  for (const Case& c :
       {Case{8, 128, 256, all}, Case{4, 128, 1024, all}, Case{3, 5, 7, all}, Case{2, 16, 2000, layout_free}}) {
    const Shape shape{c.sequences * c.tokens, c.features};
    const Tensor x = random_tensor(shape, seed++, 1.5, 0.3);
    const Tensor gain = random_tensor({c.features}, seed++, 0.2, 1.0), shift = random_tensor({c.features}, seed++);
    for (int threads : {1, 2}) {
      testing::ScopedThreads scoped(threads);
      for (int variant = 0; variant < 6; ++variant) {  // LayerNorm: none, gain, shift, both; RMSNorm: none, gain
        const bool rms = variant >= 4;
        const Tensor* g = (variant == 1 || variant == 3 || variant == 5) ? &gain : nullptr;
        const Tensor* b = (variant == 2 || variant == 3) ? &shift : nullptr;
        const std::string what = "[" + std::to_string(c.sequences) + ", " + std::to_string(c.tokens) + ", " +
                                 std::to_string(c.features) + "] threads " + std::to_string(threads) + " variant " +
                                 std::to_string(variant);
        Tensor y = Tensor::empty(shape, DType::f32), y_plain = Tensor::empty(shape, DType::f32);
        Tensor mean = Tensor::empty({shape[0]}, DType::f32), mean_plain = Tensor::empty({shape[0]}, DType::f32);
        Tensor rstd = Tensor::empty({shape[0]}, DType::f32), rstd_plain = Tensor::empty({shape[0]}, DType::f32);
        probe::MomentSums sums, expected;
        ops::OpMoments moments{nullptr, {}, &sums, c.stats, c.sequences};
        if (rms) {
          ops::rmsnorm_forward(x, g, 1e-5f, y, rstd, &moments);
          ops::rmsnorm_forward(x, g, 1e-5f, y_plain, rstd_plain);
        } else {
          ops::layernorm_forward(x, g, b, 1e-5f, y, mean, rstd, &moments);
          ops::layernorm_forward(x, g, b, 1e-5f, y_plain, mean_plain, rstd_plain);
          EXPECT_TRUE(testing::bitwise_equal(mean, mean_plain)) << what << ": mean";
        }
        EXPECT_TRUE(testing::bitwise_equal(y, y_plain)) << what << ": y";
        EXPECT_TRUE(testing::bitwise_equal(rstd, rstd_plain)) << what << ": rstd";
        probe::accumulate(y_plain, c.sequences, expected, c.stats);
        probe::expect_bitwise_equal(sums, expected, what);
      }
    }
  }
}

TEST(Norm, BadShapesAreInternalErrors) {
  Tensor x = random_tensor({4, 6}, 26), gamma = random_tensor({5}, 27);
  Tensor y = Tensor::empty(x.shape()), mean = Tensor::empty({4}), rstd = Tensor::empty({4});
  EXPECT_THROW(ops::layernorm_forward(x, &gamma, nullptr, kEps, y, mean, rstd), InternalError);
  Tensor rstd_bad = Tensor::empty({5});
  EXPECT_THROW(ops::rmsnorm_forward(x, nullptr, kEps, y, rstd_bad), InternalError);
  Tensor d_gamma = Tensor::zeros({6});
  EXPECT_THROW(ops::rmsnorm_backward(x, nullptr, rstd, y, y, &d_gamma), InternalError);
}

}  // namespace
}  // namespace proplab
