// Helpers shared by the op tests in tests/ops: scoped thread counts, element-wise closeness against a double
// reference, and bitwise comparison (the determinism tests).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "core/tensor.h"

namespace proplab::testing {

// Sets the OpenMP/OpenBLAS thread count for a scope and restores the previous count.
class ScopedThreads {
 public:
  explicit ScopedThreads(int count) : saved_(threads()) { set_threads(count); }
  ~ScopedThreads() { set_threads(saved_); }
  ScopedThreads(const ScopedThreads&) = delete;
  ScopedThreads& operator=(const ScopedThreads&) = delete;

 private:
  int saved_;
};

// EXPECT |actual_i - expected_i| <= atol + rtol * |expected_i| for every element (reports the first few misses).
inline void expect_all_close(const Tensor& actual, const std::vector<double>& expected, double atol, double rtol,
                             const std::string& what) {
  const std::vector<float> values = actual.to_vector();
  ASSERT_EQ(values.size(), expected.size()) << what;
  int reported = 0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    const double error = std::fabs(static_cast<double>(values[i]) - expected[i]);
    if (!(error <= atol + rtol * std::fabs(expected[i])) && reported++ < 5)
      ADD_FAILURE() << what << "[" << i << "] = " << values[i] << ", expected " << expected[i] << " (error " << error
                    << ")";
  }
}

// True when both tensors hold bitwise the same floats.
inline bool bitwise_equal(const Tensor& a, const Tensor& b) {
  const std::vector<float> va = a.to_vector(), vb = b.to_vector();
  return va.size() == vb.size() && std::memcmp(va.data(), vb.data(), va.size() * sizeof(float)) == 0;
}

}  // namespace proplab::testing
