#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "ops/dispatch.h"
#include "ops/ops.h"
#include "ops_testing.h"
#include "support/gradcheck.h"

namespace proplab {
namespace {

using testing::random_tensor;

TEST(Elementwise, AxpyScaleZeroMatchNaive) {
  // Large enough to take the parallel path.
  const Shape shape{100003};
  Tensor x = random_tensor(shape, 1), y = random_tensor(shape, 2);
  const std::vector<float> x0 = x.to_vector(), y0 = y.to_vector();

  ops::axpy(-0.75f, x, y);
  std::vector<double> expected(x0.size());
  for (std::size_t i = 0; i < x0.size(); ++i) expected[i] = y0[i] + -0.75 * x0[i];
  testing::expect_all_close(y, expected, 1e-6, 1e-6, "axpy");
  EXPECT_EQ(x.to_vector(), x0) << "axpy must not modify x";

  ops::scale(x, 3.0f);
  for (std::size_t i = 0; i < x0.size(); ++i) expected[i] = 3.0 * x0[i];
  testing::expect_all_close(x, expected, 0.0, 1e-7, "scale");

  ops::zero(x);
  for (float v : x.to_vector()) ASSERT_EQ(v, 0.0f);
}

TEST(Elementwise, DotAndSumSquaresMatchNaiveDouble) {
  const Shape shape{3, 5001};
  Tensor x = random_tensor(shape, 3), y = random_tensor(shape, 4);
  const std::vector<float> xv = x.to_vector(), yv = y.to_vector();
  double dot = 0.0, squares = 0.0;
  for (std::size_t i = 0; i < xv.size(); ++i) {
    dot += static_cast<double>(xv[i]) * yv[i];
    squares += static_cast<double>(xv[i]) * xv[i];
  }
  EXPECT_NEAR(ops::dot(x, y), dot, 1e-9 * std::fabs(squares));
  EXPECT_NEAR(ops::sum_squares(x), squares, 1e-12 * squares);
}

TEST(Elementwise, ReductionsIndependentOfThreadCount) {
  Tensor x = random_tensor({70001}, 5), y = random_tensor({70001}, 6);
  double dot1, sq1, dot2, sq2;
  {
    testing::ScopedThreads one(1);
    dot1 = ops::dot(x, y);
    sq1 = ops::sum_squares(x);
  }
  {
    testing::ScopedThreads two(2);
    dot2 = ops::dot(x, y);
    sq2 = ops::sum_squares(x);
  }
  EXPECT_EQ(dot1, dot2);
  EXPECT_EQ(sq1, sq2);
}

TEST(Elementwise, SumSquaresEachIsBitwiseOneCallEach) {
  // Empty, one element, one chunk, a chunk and a bit, many chunks: each sum as sum_squares gives it alone, on 1
  // and 2 threads.
  std::vector<Tensor> tensors;
  std::uint64_t seed = 80;
  for (std::int64_t n : {0, 1, 4096, 4097, 70001, 13}) tensors.push_back(testing::random_tensor({n}, ++seed, 1.7, 0.3));
  std::vector<const Tensor*> xs;
  for (const Tensor& t : tensors) xs.push_back(&t);
  for (int threads : {1, 2}) {
    testing::ScopedThreads scoped(threads);
    const std::vector<double> each = ops::sum_squares_each(xs);
    ASSERT_EQ(each.size(), xs.size());
    for (std::size_t i = 0; i < xs.size(); ++i) {
      const double alone = ops::sum_squares(*xs[i]);
      EXPECT_EQ(std::memcmp(&each[i], &alone, sizeof(double)), 0) << "tensor " << i << ", " << threads << " threads";
    }
  }
  EXPECT_TRUE(ops::sum_squares_each({}).empty());
}

TEST(Elementwise, GradientsOfReductions) {
  // d(x·y)/dx = y and d(Σx²)/dx = 2x, checked by finite differences.
  Tensor x = random_tensor({37}, 7), y = random_tensor({37}, 8);
  EXPECT_GRAD_OK(testing::check_gradient([&] { return ops::dot(x, y); }, x, y));
  EXPECT_GRAD_OK(testing::check_gradient([&] { return ops::dot(x, y); }, y, x));
  Tensor twice_x = x.clone();
  ops::scale(twice_x, 2.0f);
  EXPECT_GRAD_OK(testing::check_gradient([&] { return ops::sum_squares(x); }, x, twice_x));
}

TEST(Elementwise, ShapeMismatchIsAnInternalError) {
  Tensor x = random_tensor({4, 3}, 9), y = random_tensor({3, 4}, 10);
  EXPECT_THROW(ops::axpy(1.0f, x, y), InternalError);
  EXPECT_THROW(ops::dot(x, y), InternalError);
  Tensor ids = Tensor::zeros({12}, DType::i32);
  EXPECT_THROW(ops::scale(ids, 2.0f), InternalError);
}

TEST(Dispatch, MissingDeviceImplNamesTheOpAndDevice) {
  for (const char* op : {"axpy", "linear_forward", "layernorm_backward", "embedding_backward", "dropout_forward"}) {
    try {
      ops::missing_device_impl(op, Device::cuda);
      FAIL() << "missing_device_impl must throw";
    } catch (const UserError& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(std::string("'") + op + "'"), std::string::npos) << message;
      EXPECT_NE(message.find("cuda"), std::string::npos) << message;
    }
  }
}

TEST(Dispatch, MixedDevicesAreAnErrorNamingTheOp) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU: cuda tensors cannot be created";
  Tensor x = Tensor::zeros({4, 8}, DType::f32, Device::cuda);
  Tensor y = Tensor::zeros({4, 8});
  try {
    ops::activation_forward(Activation::gelu_erf, x, y);
    FAIL() << "tensors on different devices must be rejected";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("activation_forward"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace proplab
