#include <gtest/gtest.h>

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

// y[r, o] = Σ_i x[r, i] W[o, i] + b[o] in double.
std::vector<double> naive_linear(const Tensor& x, const Tensor& w, const Tensor* b) {
  const std::int64_t out = w.dim(0), in = w.dim(1), rows = x.numel() / in;
  const std::vector<float> xv = x.to_vector(), wv = w.to_vector();
  const std::vector<float> bv = b ? b->to_vector() : std::vector<float>(out, 0.0f);
  std::vector<double> y(rows * out);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t o = 0; o < out; ++o) {
      double sum = bv[o];
      for (std::int64_t i = 0; i < in; ++i) sum += static_cast<double>(xv[r * in + i]) * wv[o * in + i];
      y[r * out + o] = sum;
    }
  return y;
}

TEST(Linear, ForwardMatchesNaive) {
  Tensor x = random_tensor({2, 5, 7}, 11), w = random_tensor({6, 7}, 12), b = random_tensor({6}, 13);
  Tensor y = Tensor::empty({2, 5, 6});
  ops::linear_forward(x, w, &b, y);
  testing::expect_all_close(y, naive_linear(x, w, &b), 1e-5, 1e-5, "linear with bias");
  ops::linear_forward(x, w, nullptr, y);
  testing::expect_all_close(y, naive_linear(x, w, nullptr), 1e-5, 1e-5, "linear without bias");
}

TEST(Linear, GradientsWithBias) {
  Tensor x = random_tensor({5, 7}, 14), w = random_tensor({4, 7}, 15), b = random_tensor({4}, 16);
  Tensor y = Tensor::empty({5, 4});
  auto loss = [&] {
    ops::linear_forward(x, w, &b, y);
    return project(y, 17);
  };
  Tensor d_y = projection_weights(y.shape(), 17);
  Tensor d_x = Tensor::empty(x.shape()), d_w = Tensor::zeros(w.shape()), d_b = Tensor::zeros(b.shape());
  ops::linear_backward(x, w, d_y, &d_x, d_w, &d_b);
  EXPECT_GRAD_OK(check_gradient(loss, x, d_x));
  EXPECT_GRAD_OK(check_gradient(loss, w, d_w));
  EXPECT_GRAD_OK(check_gradient(loss, b, d_b));
}

TEST(Linear, GradientsWithoutBiasAndLeadingDims) {
  Tensor x = random_tensor({2, 3, 6}, 18), w = random_tensor({5, 6}, 19);
  Tensor y = Tensor::empty({2, 3, 5});
  auto loss = [&] {
    ops::linear_forward(x, w, nullptr, y);
    return project(y, 20);
  };
  Tensor d_y = projection_weights(y.shape(), 20);
  Tensor d_x = Tensor::empty(x.shape()), d_w = Tensor::zeros(w.shape());
  ops::linear_backward(x, w, d_y, &d_x, d_w, nullptr);
  EXPECT_GRAD_OK(check_gradient(loss, x, d_x));
  EXPECT_GRAD_OK(check_gradient(loss, w, d_w));
}

TEST(Linear, ParameterGradsAccumulateActivationGradsOverwrite) {
  Tensor x = random_tensor({9, 8}, 21), w = random_tensor({3, 8}, 22), d_y = random_tensor({9, 3}, 23);
  Tensor d_x = random_tensor(x.shape(), 24);  // garbage that must be overwritten
  Tensor d_w = Tensor::zeros(w.shape()), d_b = Tensor::zeros({3});
  ops::linear_backward(x, w, d_y, &d_x, d_w, &d_b);
  const Tensor d_x_once = d_x.clone(), d_w_once = d_w.clone(), d_b_once = d_b.clone();
  ops::linear_backward(x, w, d_y, &d_x, d_w, &d_b);
  EXPECT_TRUE(testing::bitwise_equal(d_x, d_x_once)) << "d_x must be overwritten, not accumulated";
  std::vector<double> twice_w, twice_b;
  for (float v : d_w_once.to_vector()) twice_w.push_back(2.0 * v);
  for (float v : d_b_once.to_vector()) twice_b.push_back(2.0 * v);
  testing::expect_all_close(d_w, twice_w, 1e-6, 1e-6, "d_weight after two backward calls");
  testing::expect_all_close(d_b, twice_b, 1e-6, 1e-6, "d_bias after two backward calls");

  // d_b is the column sum of d_y; a null d_x is skipped.
  std::vector<double> column_sums(3, 0.0);
  const std::vector<float> gv = d_y.to_vector();
  for (int r = 0; r < 9; ++r)
    for (int o = 0; o < 3; ++o) column_sums[o] += gv[r * 3 + o];
  Tensor d_b_fresh = Tensor::zeros({3}), d_w_fresh = Tensor::zeros(w.shape());
  ops::linear_backward(x, w, d_y, nullptr, d_w_fresh, &d_b_fresh);
  testing::expect_all_close(d_b_fresh, column_sums, 1e-6, 1e-6, "d_bias");
}

TEST(Linear, BiasGradientIndependentOfThreadCount) {
  Tensor x = random_tensor({300, 16}, 25), w = random_tensor({130, 16}, 26), d_y = random_tensor({300, 130}, 27);
  Tensor d_w1 = Tensor::zeros(w.shape()), d_b1 = Tensor::zeros({130});
  Tensor d_w2 = Tensor::zeros(w.shape()), d_b2 = Tensor::zeros({130});
  {
    testing::ScopedThreads one(1);
    ops::linear_backward(x, w, d_y, nullptr, d_w1, &d_b1);
  }
  {
    testing::ScopedThreads two(2);
    ops::linear_backward(x, w, d_y, nullptr, d_w2, &d_b2);
  }
  EXPECT_TRUE(testing::bitwise_equal(d_b1, d_b2));
}

TEST(Linear, ShapeMismatchIsAnInternalError) {
  Tensor x = random_tensor({4, 7}, 28), w = random_tensor({3, 6}, 29), y = Tensor::empty({4, 3});
  EXPECT_THROW(ops::linear_forward(x, w, nullptr, y), InternalError);
  Tensor w_ok = random_tensor({3, 7}, 30), b_bad = random_tensor({4}, 31);
  EXPECT_THROW(ops::linear_forward(x, w_ok, &b_bad, y), InternalError);
  Tensor y_bad = Tensor::empty({4, 4});
  EXPECT_THROW(ops::linear_forward(x, w_ok, nullptr, y_bad), InternalError);
}

}  // namespace
}  // namespace proplab
