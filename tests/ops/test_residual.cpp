#include <gtest/gtest.h>

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

TEST(Residual, ForwardMatchesNaive) {
  Tensor x = random_tensor({3, 7, 5}, 1), f = random_tensor({3, 7, 5}, 2), y = Tensor::empty({3, 7, 5});
  ops::residual_forward(x, f, 0.8f, -0.3f, y);
  std::vector<double> expected;
  const std::vector<float> xv = x.to_vector(), fv = f.to_vector();
  for (std::size_t i = 0; i < xv.size(); ++i) expected.push_back(0.8 * xv[i] + -0.3 * fv[i]);
  testing::expect_all_close(y, expected, 1e-6, 1e-6, "residual");
}

TEST(Residual, GradientsForInputsAndScalars) {
  Tensor x = random_tensor({4, 6}, 3), f = random_tensor({4, 6}, 4), y = Tensor::empty({4, 6});
  // The scalars live in 1-element tensors so the checker can perturb them.
  Tensor lambda = Tensor::from_vector({1}, {0.9f}), beta = Tensor::from_vector({1}, {0.4f});
  auto loss = [&] {
    ops::residual_forward(x, f, lambda.item(), beta.item(), y);
    return project(y, 5);
  };
  Tensor d_y = projection_weights(y.shape(), 5);
  Tensor d_x = Tensor::empty(x.shape()), d_f = Tensor::empty(f.shape());
  double d_lambda = 0.0, d_beta = 0.0;
  ops::residual_backward(x, f, d_y, lambda.item(), beta.item(), &d_x, &d_f, &d_lambda, &d_beta);
  EXPECT_GRAD_OK(check_gradient(loss, x, d_x));
  EXPECT_GRAD_OK(check_gradient(loss, f, d_f));
  EXPECT_GRAD_OK(check_gradient(loss, lambda, Tensor::from_vector({1}, {static_cast<float>(d_lambda)})));
  EXPECT_GRAD_OK(check_gradient(loss, beta, Tensor::from_vector({1}, {static_cast<float>(d_beta)})));
}

TEST(Residual, ScalarGradsAccumulateActivationGradsOverwrite) {
  Tensor x = random_tensor({20000}, 6), f = random_tensor({20000}, 7), d_y = random_tensor({20000}, 8);
  Tensor d_x = random_tensor({20000}, 9), d_f = random_tensor({20000}, 10);
  double d_lambda = 0.25, d_beta = -0.5;  // accumulated onto
  ops::residual_backward(x, f, d_y, 0.7f, 0.2f, &d_x, &d_f, &d_lambda, &d_beta);
  const double once_lambda = d_lambda - 0.25, once_beta = d_beta + 0.5;
  const Tensor d_x_once = d_x.clone(), d_f_once = d_f.clone();
  ops::residual_backward(x, f, d_y, 0.7f, 0.2f, &d_x, &d_f, &d_lambda, &d_beta);
  EXPECT_NEAR(d_lambda, 0.25 + 2.0 * once_lambda, 1e-9 * std::fabs(once_lambda) + 1e-12);
  EXPECT_NEAR(d_beta, -0.5 + 2.0 * once_beta, 1e-9 * std::fabs(once_beta) + 1e-12);
  EXPECT_TRUE(testing::bitwise_equal(d_x, d_x_once));
  EXPECT_TRUE(testing::bitwise_equal(d_f, d_f_once));

  double expect_lambda = 0.0, expect_beta = 0.0;
  std::vector<double> expect_d_x, expect_d_f;
  const std::vector<float> xv = x.to_vector(), fv = f.to_vector(), gv = d_y.to_vector();
  for (std::size_t i = 0; i < xv.size(); ++i) {
    expect_lambda += static_cast<double>(gv[i]) * xv[i];
    expect_beta += static_cast<double>(gv[i]) * fv[i];
    expect_d_x.push_back(0.7f * gv[i]);
    expect_d_f.push_back(0.2f * gv[i]);
  }
  EXPECT_NEAR(once_lambda, expect_lambda, 1e-9 * std::fabs(expect_lambda) + 1e-9);
  EXPECT_NEAR(once_beta, expect_beta, 1e-9 * std::fabs(expect_beta) + 1e-9);
  testing::expect_all_close(d_x, expect_d_x, 0.0, 1e-6, "d_x");
  testing::expect_all_close(d_f, expect_d_f, 0.0, 1e-6, "d_f");

  // Null outputs are skipped, and d_x may alias d_y.
  Tensor shared = d_y.clone();
  ops::residual_backward(x, f, shared, 0.7f, 0.2f, &shared, nullptr, nullptr, nullptr);
  EXPECT_TRUE(testing::bitwise_equal(shared, d_x_once));
}

TEST(Residual, ScalarGradsIndependentOfThreadCount) {
  Tensor x = random_tensor({90001}, 11), f = random_tensor({90001}, 12), d_y = random_tensor({90001}, 13);
  double lambda1 = 0.0, beta1 = 0.0, lambda2 = 0.0, beta2 = 0.0;
  {
    testing::ScopedThreads one(1);
    ops::residual_backward(x, f, d_y, 1.0f, 0.5f, nullptr, nullptr, &lambda1, &beta1);
  }
  {
    testing::ScopedThreads two(2);
    ops::residual_backward(x, f, d_y, 1.0f, 0.5f, nullptr, nullptr, &lambda2, &beta2);
  }
  EXPECT_EQ(lambda1, lambda2);
  EXPECT_EQ(beta1, beta2);
}

// The fused op against the two ops it replaces, bitwise: y, the masked gradient left in d_y, d_x, d_f and the scalar
// gradients (also with d_x over d_y, and with outputs skipped), on sizes of several reduction chunks.
TEST(Residual, ReluFusedIsBitwiseResidualThenRelu) {
  for (const Shape& shape : {Shape{5, 7}, Shape{3, 16, 28, 28}, Shape{90001}}) {
    SCOPED_TRACE(shape_string(shape));
    const Tensor x = random_tensor(shape, 20), f = random_tensor(shape, 21, 1.5), d_out = random_tensor(shape, 22);
    Tensor sum = Tensor::empty(shape), y_two = Tensor::empty(shape), y = Tensor::empty(shape);
    ops::residual_forward(x, f, 0.9f, 0.6f, sum);
    ops::activation_forward(Activation::relu, sum, y_two);
    ops::residual_relu_forward(x, f, 0.9f, 0.6f, y);
    EXPECT_TRUE(testing::bitwise_equal(y, y_two)) << "y";

    Tensor d_sum = Tensor::empty(shape), d_x_two = Tensor::empty(shape), d_f_two = Tensor::empty(shape);
    double d_lambda_two = 0.5, d_beta_two = -0.25;
    ops::activation_backward(Activation::relu, sum, d_out, d_sum);
    ops::residual_backward(x, f, d_sum, 0.9f, 0.6f, &d_x_two, &d_f_two, &d_lambda_two, &d_beta_two);
    Tensor d_y = d_out.clone(), d_x = Tensor::empty(shape), d_f = Tensor::empty(shape);
    double d_lambda = 0.5, d_beta = -0.25;
    ops::residual_relu_backward(x, f, y, d_y, 0.9f, 0.6f, &d_x, &d_f, &d_lambda, &d_beta);
    EXPECT_TRUE(testing::bitwise_equal(d_y, d_sum)) << "d_y becomes dL/d sum";
    EXPECT_TRUE(testing::bitwise_equal(d_x, d_x_two)) << "d_x";
    EXPECT_TRUE(testing::bitwise_equal(d_f, d_f_two)) << "d_f";
    EXPECT_EQ(d_lambda, d_lambda_two);
    EXPECT_EQ(d_beta, d_beta_two);

    Tensor shared = d_out.clone();
    ops::residual_relu_backward(x, f, y, shared, 0.9f, 0.6f, &shared, nullptr, nullptr, nullptr);
    EXPECT_TRUE(testing::bitwise_equal(shared, d_x_two)) << "d_x over d_y";
  }
}

TEST(Residual, ReluFusedGradients) {
  Tensor x = random_tensor({4, 6}, 30), f = random_tensor({4, 6}, 31), y = Tensor::empty({4, 6});
  Tensor lambda = Tensor::from_vector({1}, {0.9f}), beta = Tensor::from_vector({1}, {0.4f});
  auto loss = [&] {
    ops::residual_relu_forward(x, f, lambda.item(), beta.item(), y);
    return project(y, 32);
  };
  loss();
  Tensor d_y = projection_weights(y.shape(), 32);
  Tensor d_x = Tensor::empty(x.shape()), d_f = Tensor::empty(f.shape());
  double d_lambda = 0.0, d_beta = 0.0;
  ops::residual_relu_backward(x, f, y, d_y, lambda.item(), beta.item(), &d_x, &d_f, &d_lambda, &d_beta);
  EXPECT_GRAD_OK(check_gradient(loss, x, d_x));
  EXPECT_GRAD_OK(check_gradient(loss, f, d_f));
  EXPECT_GRAD_OK(check_gradient(loss, lambda, Tensor::from_vector({1}, {static_cast<float>(d_lambda)})));
  EXPECT_GRAD_OK(check_gradient(loss, beta, Tensor::from_vector({1}, {static_cast<float>(d_beta)})));
}

// Statistics gathered inside the combine (ops::OpMoments: f and y forward, d_y and d_f backward) are bitwise
// probe::accumulate of the tensors, and every result is bitwise the same with and without them: with 1 and 2
// threads, d_x apart from d_y and aliasing it, with and without the learnable scalars' sums (which keep their own
// chunks, the tensors then summed whole), on shapes split into whole sequences and into pieces of sequences.
TEST(Residual, GatheredMomentsAreBitwiseAccumulateOfTheTensors) {
  const probe::StatSelection all = probe::StatSelection::all();
  struct Case {
    std::int64_t sequences, tokens, features;
  };
  std::uint64_t seed = 60;
  for (const Case& c : {Case{8, 128, 256}, Case{4, 128, 1024}, Case{3, 5, 7}}) {
    const Shape shape{c.sequences * c.tokens, c.features};
    const Tensor x = random_tensor(shape, seed++), f = random_tensor(shape, seed++), d_y = random_tensor(shape, seed++);
    for (int threads : {1, 2}) {
      testing::ScopedThreads scoped(threads);
      const std::string what = "[" + std::to_string(c.sequences) + ", " + std::to_string(c.tokens) + ", " +
                               std::to_string(c.features) + "] threads " + std::to_string(threads);
      Tensor y = Tensor::empty(shape, DType::f32), y_plain = Tensor::empty(shape, DType::f32);
      probe::MomentSums f_sums, y_sums, f_expected, y_expected;
      ops::OpMoments moments{&f_sums, all, &y_sums, all, c.sequences};
      ops::residual_forward(x, f, 0.8f, 0.6f, y, &moments);
      ops::residual_forward(x, f, 0.8f, 0.6f, y_plain);
      EXPECT_TRUE(testing::bitwise_equal(y, y_plain)) << what << ": forward result";
      probe::accumulate(f, c.sequences, f_expected, all);
      probe::accumulate(y_plain, c.sequences, y_expected, all);
      probe::expect_bitwise_equal(f_sums, f_expected, what + " forward f");
      probe::expect_bitwise_equal(y_sums, y_expected, what + " forward y");
      for (bool aliased : {false, true}) {
        for (bool scalars : {false, true}) {
          const std::string case_what = what + (aliased ? " aliased" : "") + (scalars ? " scalars" : "");
          Tensor d_x_plain = Tensor::empty(shape, DType::f32), d_f_plain = Tensor::empty(shape, DType::f32);
          double d_lambda_plain = 0.0, d_beta_plain = 0.0;
          ops::residual_backward(x, f, d_y, 0.8f, 0.6f, &d_x_plain, &d_f_plain, scalars ? &d_lambda_plain : nullptr,
                                 scalars ? &d_beta_plain : nullptr);
          Tensor d_x = aliased ? d_y.clone() : Tensor::empty(shape, DType::f32);
          const Tensor d_in = aliased ? d_x : d_y;
          Tensor d_f = Tensor::empty(shape, DType::f32);
          double d_lambda = 0.0, d_beta = 0.0;
          probe::MomentSums d_y_sums, d_f_sums, d_y_expected, d_f_expected;
          ops::OpMoments back{&d_y_sums, all, &d_f_sums, all, c.sequences};
          ops::residual_backward(x, f, d_in, 0.8f, 0.6f, &d_x, &d_f, scalars ? &d_lambda : nullptr,
                                 scalars ? &d_beta : nullptr, &back);
          EXPECT_TRUE(testing::bitwise_equal(d_x, d_x_plain)) << case_what << ": d_x";
          EXPECT_TRUE(testing::bitwise_equal(d_f, d_f_plain)) << case_what << ": d_f";
          EXPECT_EQ(d_lambda, d_lambda_plain) << case_what;
          EXPECT_EQ(d_beta, d_beta_plain) << case_what;
          probe::accumulate(d_y, c.sequences, d_y_expected, all);
          probe::accumulate(d_f_plain, c.sequences, d_f_expected, all);
          probe::expect_bitwise_equal(d_y_sums, d_y_expected, case_what + " backward d_y");
          probe::expect_bitwise_equal(d_f_sums, d_f_expected, case_what + " backward d_f");
        }
      }
    }
  }
}

// The same for NCHW images, summed as their channels-last view (probe::accumulate_planes), through the combine and
// through its fused ReLU form (the ResNet's block ends): forward f and y, backward d_y as it enters (before the ReLU
// form masks it) and d_f; with 1 and 2 threads, with and without the learnable scalars' sums, on planes of 28×28 (a
// chunk of several planes) and 3×5 (under the parallel threshold).
TEST(Residual, GatheredImageMomentsAreBitwiseAccumulatePlanes) {
  const probe::StatSelection all = probe::StatSelection::all();
  auto planes = [&](const Tensor& t, probe::MomentSums& sums) {
    probe::accumulate_planes(t.f32(), t.dim(0), t.dim(1), t.dim(2) * t.dim(3), sums, all);
  };
  std::uint64_t seed = 90;
  for (const Shape& shape : {Shape{16, 8, 28, 28}, Shape{2, 3, 3, 5}}) {
    const Tensor x = random_tensor(shape, seed++), f = random_tensor(shape, seed++), d_y = random_tensor(shape, seed++);
    for (int threads : {1, 2}) {
      testing::ScopedThreads scoped(threads);
      for (bool relu : {false, true}) {
        const std::string what = shape_string(shape) + " threads " + std::to_string(threads) + (relu ? " relu" : "");
        Tensor y = Tensor::empty(shape, DType::f32), y_plain = Tensor::empty(shape, DType::f32);
        probe::MomentSums f_sums, y_sums, f_expected, y_expected;
        ops::OpMoments moments{&f_sums, all, &y_sums, all, shape[0]};
        if (relu) {
          ops::residual_relu_forward(x, f, 0.8f, 0.6f, y, &moments);
          ops::residual_relu_forward(x, f, 0.8f, 0.6f, y_plain);
        } else {
          ops::residual_forward(x, f, 0.8f, 0.6f, y, &moments);
          ops::residual_forward(x, f, 0.8f, 0.6f, y_plain);
        }
        EXPECT_TRUE(testing::bitwise_equal(y, y_plain)) << what << ": forward result";
        planes(f, f_expected);
        planes(y_plain, y_expected);
        probe::expect_bitwise_equal(f_sums, f_expected, what + " forward f");
        probe::expect_bitwise_equal(y_sums, y_expected, what + " forward y");
        for (bool scalars : {false, true}) {
          const std::string case_what = what + (scalars ? " scalars" : "");
          Tensor d_in_plain = d_y.clone(), d_x_plain = Tensor::empty(shape, DType::f32);
          Tensor d_f_plain = Tensor::empty(shape, DType::f32);
          Tensor d_in = d_y.clone(), d_x = Tensor::empty(shape, DType::f32), d_f = Tensor::empty(shape, DType::f32);
          double d_lambda_plain = 0.0, d_beta_plain = 0.0, d_lambda = 0.0, d_beta = 0.0;
          probe::MomentSums d_y_sums, d_f_sums, d_y_expected, d_f_expected;
          ops::OpMoments back{&d_y_sums, all, &d_f_sums, all, shape[0]};
          if (relu) {
            ops::residual_relu_backward(x, f, y_plain, d_in_plain, 0.8f, 0.6f, &d_x_plain, &d_f_plain,
                                        scalars ? &d_lambda_plain : nullptr, scalars ? &d_beta_plain : nullptr);
            ops::residual_relu_backward(x, f, y_plain, d_in, 0.8f, 0.6f, &d_x, &d_f, scalars ? &d_lambda : nullptr,
                                        scalars ? &d_beta : nullptr, &back);
            EXPECT_TRUE(testing::bitwise_equal(d_in, d_in_plain)) << case_what << ": masked d_y";
          } else {
            ops::residual_backward(x, f, d_y, 0.8f, 0.6f, &d_x_plain, &d_f_plain, scalars ? &d_lambda_plain : nullptr,
                                   scalars ? &d_beta_plain : nullptr);
            ops::residual_backward(x, f, d_y, 0.8f, 0.6f, &d_x, &d_f, scalars ? &d_lambda : nullptr,
                                   scalars ? &d_beta : nullptr, &back);
          }
          EXPECT_TRUE(testing::bitwise_equal(d_x, d_x_plain)) << case_what << ": d_x";
          EXPECT_TRUE(testing::bitwise_equal(d_f, d_f_plain)) << case_what << ": d_f";
          EXPECT_EQ(d_lambda, d_lambda_plain) << case_what;
          EXPECT_EQ(d_beta, d_beta_plain) << case_what;
          planes(d_y, d_y_expected);  // as it entered
          planes(d_f_plain, d_f_expected);
          probe::expect_bitwise_equal(d_y_sums, d_y_expected, case_what + " backward d_y");
          probe::expect_bitwise_equal(d_f_sums, d_f_expected, case_what + " backward d_f");
        }
      }
    }
  }
}

TEST(Residual, ShapeMismatchIsAnInternalError) {
  Tensor x = random_tensor({4, 5}, 14), f = random_tensor({5, 4}, 15), y = Tensor::empty({4, 5});
  EXPECT_THROW(ops::residual_forward(x, f, 1.0f, 1.0f, y), InternalError);
}

}  // namespace
}  // namespace proplab
