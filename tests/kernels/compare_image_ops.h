// Shared utilities of the CUDA-vs-CPU tests of the optimizer, clipping and image ops (test_optimizer_cuda.cpp,
// test_clip_cuda.cpp, test_conv_cuda.cpp, test_batchnorm_cuda.cpp, test_pool_cuda.cpp,
// test_weight_standardization_cuda.cpp): host/device copies and elementwise comparisons that name the first
// failing elements.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace proplab::testing::cuda_compare {

#define SKIP_WITHOUT_GPU() \
  if (!proplab::cuda_available()) GTEST_SKIP() << "no CUDA GPU: skipping CUDA-vs-CPU comparison"

inline Tensor to_cuda(const Tensor& host) {
  Tensor device = Tensor::empty(host.shape(), host.dtype(), Device::cuda);
  device.copy_from(host);
  return device;
}

inline std::vector<std::int32_t> to_host_i32(const Tensor& t) {
  Tensor host = t.to(Device::cpu);
  const std::int32_t* p = host.i32();
  return std::vector<std::int32_t>(p, p + host.numel());
}

inline std::vector<double> magnitudes(const std::vector<float>& values) {
  std::vector<double> out(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) out[i] = std::abs(static_cast<double>(values[i]));
  return out;
}

// |x| elementwise, as a new CPU tensor (for error scales: an op applied to absolute values bounds Σ |terms|).
inline Tensor absolute(const Tensor& t) {
  std::vector<float> values = t.to_vector();
  for (float& v : values) v = std::abs(v);
  return Tensor::from_vector(t.shape(), values);
}

// Elementwise |actual − expected| <= rel_tol · scale[i] (scale: the magnitude the value is relative to; NaN and
// infinities must match exactly).
inline void expect_close(const std::vector<float>& actual, const std::vector<float>& expected,
                         const std::vector<double>& scale, double rel_tol, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  ASSERT_EQ(scale.size(), expected.size()) << what;
  std::int64_t failures = 0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const double a = actual[i], e = expected[i];
    const bool ok = std::isfinite(e) ? std::abs(a - e) <= rel_tol * scale[i] : (std::isnan(e) ? std::isnan(a) : a == e);
    if (!ok && ++failures <= 5)
      ADD_FAILURE() << what << "[" << i << "]: cuda " << a << " vs cpu " << e << " (scale " << scale[i] << ", tol "
                    << rel_tol << ")";
  }
  EXPECT_EQ(failures, 0) << what << ": " << failures << " of " << actual.size() << " elements differ";
}

// Relative to each expected value's own magnitude.
inline void expect_close_rel(const std::vector<float>& actual, const std::vector<float>& expected, double rel_tol,
                             const std::string& what) {
  expect_close(actual, expected, magnitudes(expected), rel_tol, what);
}

inline void expect_close_scalar(double actual, double expected, double rel_tol, const std::string& what) {
  EXPECT_LE(std::abs(actual - expected), rel_tol * std::abs(expected))
      << what << ": cuda " << actual << " vs cpu " << expected;
}

// Same bits (so −0 ≠ +0 and equal NaNs compare equal).
template <typename T>
void expect_bitwise(const std::vector<T>& actual, const std::vector<T>& expected, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  std::int64_t failures = 0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    if (std::memcmp(&actual[i], &expected[i], sizeof(T)) != 0 && ++failures <= 5)
      ADD_FAILURE() << what << "[" << i << "]: " << actual[i] << " vs " << expected[i];
  }
  EXPECT_EQ(failures, 0) << what << ": " << failures << " of " << actual.size() << " elements differ in bits";
}

}  // namespace proplab::testing::cuda_compare
