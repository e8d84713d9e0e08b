#include <gtest/gtest.h>

#include "core/parallel.h"
#include "core/rng.h"
#include "core/tensor.h"

namespace proplab {

TEST(Tensor, ShapeStridesAndViews) {
  Tensor t = Tensor::zeros({2, 3, 4});
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.strides(), (Shape{12, 4, 1}));
  EXPECT_TRUE(t.is_contiguous());
  Tensor flat = t.reshape({6, -1});
  EXPECT_EQ(flat.shape(), (Shape{6, 4}));
  EXPECT_EQ(t.use_count(), 2);  // the view shares storage
  flat.f32()[5] = 7.0f;
  EXPECT_EQ(t.f32()[5], 7.0f);
  Tensor rows = flat.slice(0, 2, 3);
  EXPECT_EQ(rows.shape(), (Shape{3, 4}));
  EXPECT_TRUE(rows.is_contiguous());
  EXPECT_EQ(rows.f32(), flat.f32() + 8);
  Tensor cols = flat.slice(1, 1, 2);
  EXPECT_FALSE(cols.is_contiguous());
  EXPECT_THROW(cols.reshape({-1}), InternalError);
}

TEST(Tensor, CloneIsDeep) {
  Tensor a = Tensor::from_vector({2, 2}, {1, 2, 3, 4});
  Tensor b = a.clone();
  b.f32()[0] = 9;
  EXPECT_EQ(a.to_vector(), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(b.to_vector()[0], 9.0f);
}

TEST(Tensor, CudaWithoutBackendIsAClearError) {
  if (cuda_available()) GTEST_SKIP() << "a GPU is present; this checks the no-GPU path";
  try {
    Tensor t = Tensor::empty({4}, DType::f32, Device::cuda);
    FAIL() << "allocating on cuda without a GPU should throw";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("CUDA"), std::string::npos) << e.what();
  }
}

TEST(Rng, CounterBasedAndOrderFree) {
  CounterRng a(42, stream_id("w", 3)), b(42, stream_id("w", 3)), c(43, stream_id("w", 3));
  EXPECT_EQ(a.normal(1000), b.normal(1000));
  EXPECT_NE(a.normal(1000), c.normal(1000));
  EXPECT_NE(a.normal(1000), a.normal(1001));
  // Moments of the normal stream.
  double s = 0, s2 = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    double x = a.normal(i);
    s += x;
    s2 += x * x;
  }
  EXPECT_NEAR(s / n, 0.0, 0.01);
  EXPECT_NEAR(s2 / n, 1.0, 0.01);
  double u = 0;
  for (int i = 0; i < n; ++i) {
    float x = a.uniform(i);
    ASSERT_GT(x, 0.0f);
    ASSERT_LT(x, 1.0f);
    u += x;
  }
  EXPECT_NEAR(u / n, 0.5, 0.005);
}

TEST(Rng, PhiloxKnownAnswer) {
  // Random123's published known-answer vector for philox4x32-10 with all-zero counter and key.
  std::uint32_t counter[4] = {0, 0, 0, 0};
  std::uint32_t key[2] = {0, 0};
  std::uint32_t out[4];
  Philox::block(counter, key, out);
  EXPECT_EQ(out[0], 0x6627e8d5u);
  EXPECT_EQ(out[1], 0xe169c58du);
  EXPECT_EQ(out[2], 0xbc57ac4cu);
  EXPECT_EQ(out[3], 0x9b00dbd8u);
}

TEST(Parallel, ChunkedSumIndependentOfThreads) {
  std::vector<double> v(100003);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = 1.0 / (1.0 + static_cast<double>(i) * 0.37);
  auto f = [&](std::int64_t b, std::int64_t e) {
    double s = 0;
    for (auto i = b; i < e; ++i) s += v[i];
    return s;
  };
  set_threads(1);
  double one = chunked_sum(static_cast<std::int64_t>(v.size()), f);
  set_threads(2);
  double two = chunked_sum(static_cast<std::int64_t>(v.size()), f);
  EXPECT_EQ(one, two);
}

}  // namespace proplab
