// Test support: two probe::MomentSums bitwise equal (every sum, count, shift and per-feature sum).
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "probe/moments.h"

namespace proplab::probe {

inline void expect_bitwise_equal(const MomentSums& a, const MomentSums& b, const std::string& what) {
  auto same = [](double u, double v) { return std::memcmp(&u, &v, sizeof u) == 0; };
  EXPECT_EQ(a.count, b.count) << what;
  EXPECT_EQ(a.sequences, b.sequences) << what;
  EXPECT_EQ(a.nonfinite, b.nonfinite) << what;
  EXPECT_TRUE(same(a.shift, b.shift)) << what;
  EXPECT_TRUE(same(a.sum, b.sum)) << what << " sum";
  EXPECT_TRUE(same(a.sum_sq, b.sum_sq)) << what << " sum_sq";
  EXPECT_TRUE(same(a.sum_cube, b.sum_cube)) << what << " sum_cube";
  EXPECT_TRUE(same(a.sum_quad, b.sum_quad)) << what << " sum_quad";
  EXPECT_TRUE(same(a.max_abs, b.max_abs)) << what << " max_abs";
  EXPECT_TRUE(same(a.seq_sum_norm_sq, b.seq_sum_norm_sq)) << what << " seq_sum_norm_sq";
  ASSERT_EQ(a.feature_sum.size(), b.feature_sum.size()) << what;
  if (a.feature_sum.empty()) return;
  EXPECT_EQ(std::memcmp(a.feature_sum.data(), b.feature_sum.data(), a.feature_sum.size() * sizeof(double)), 0)
      << what << " feature_sum";
  EXPECT_EQ(std::memcmp(a.feature_sum_sq.data(), b.feature_sum_sq.data(), a.feature_sum.size() * sizeof(double)), 0)
      << what << " feature_sum_sq";
}

}  // namespace proplab::probe
