// Helpers shared by the CUDA-vs-CPU kernel tests: moving inputs to the GPU, random integer ids, and elementwise
// comparisons with a stated tolerance.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"

namespace proplab::testing {

#define SKIP_WITHOUT_GPU() \
  if (!proplab::cuda_available()) GTEST_SKIP() << "no CUDA GPU: skipping CUDA-vs-CPU comparison"

inline Tensor to_cuda(const Tensor& host) {
  Tensor device = Tensor::empty(host.shape(), host.dtype(), Device::cuda);
  device.copy_from(host);
  return device;
}

// A CUDA f32 tensor of `shape` holding `value` everywhere (NaN: outputs that must be overwritten).
inline Tensor cuda_filled(const Shape& shape, float value) {
  Tensor host = Tensor::empty(shape);
  host.fill(value);
  return to_cuda(host);
}

// An i32 CPU tensor of `shape` with ids uniform in [lo, hi), drawn from (seed, stream 0).
inline Tensor random_ids(const Shape& shape, std::uint64_t seed, std::int64_t lo, std::int64_t hi) {
  Tensor ids = Tensor::empty(shape, DType::i32);
  const CounterRng rng(seed, 0);
  std::int32_t* data = ids.i32();
  for (std::int64_t i = 0; i < ids.numel(); ++i)
    data[i] = static_cast<std::int32_t>(
        lo + static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(i), static_cast<std::uint64_t>(hi - lo))));
  return ids;
}

inline double rms(const std::vector<float>& values) {
  double sum = 0.0;
  for (float v : values) sum += double(v) * v;
  return values.empty() ? 0.0 : std::sqrt(sum / double(values.size()));
}

// Elementwise |actual − expected| <= rtol·|expected| + atol; reports the first few failures and their count.
inline void expect_close(const std::vector<float>& actual, const std::vector<float>& expected, double rtol, double atol,
                         const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  std::int64_t failures = 0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const double error = std::abs(static_cast<double>(actual[i]) - expected[i]);
    if (!(error <= rtol * std::abs(double(expected[i])) + atol)) {
      if (++failures <= 5)
        ADD_FAILURE() << what << "[" << i << "]: cuda " << actual[i] << " vs cpu " << expected[i] << " (rtol " << rtol
                      << ", atol " << atol << ")";
    }
  }
  EXPECT_EQ(failures, 0) << what << ": " << failures << " of " << actual.size() << " elements differ";
}

// Bitwise equality of two float vectors (NaN patterns included).
inline void expect_bitwise(const std::vector<float>& actual, const std::vector<float>& expected,
                           const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  std::int64_t failures = 0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    if (std::memcmp(&actual[i], &expected[i], sizeof(float)) != 0 && ++failures <= 5)
      ADD_FAILURE() << what << "[" << i << "]: " << actual[i] << " vs " << expected[i] << " (bitwise)";
  }
  EXPECT_EQ(failures, 0) << what << ": " << failures << " of " << actual.size() << " elements differ bitwise";
}

inline void expect_close_scalar(double actual, double expected, double rtol, const std::string& what) {
  EXPECT_LE(std::abs(actual - expected), rtol * std::abs(expected))
      << what << ": cuda " << actual << " vs cpu " << expected;
}

}  // namespace proplab::testing
