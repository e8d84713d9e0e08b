// kernels/weight_standardization: the CUDA side of scaled weight standardisation (proplab::ops::
// weight_standardize_forward/backward in src/ops/ops.h, whose CPU implementation in
// src/ops/weight_standardization.cpp is the reference), per output row o of weight [rows, fan_in].
//
// Invariants:
// - Pointers are device pointers; weight, w_hat, d_w_hat, d_weight hold rows·fan_in floats, gain, mean, rstd,
//   d_gain `rows` floats. gain (= 1) and d_gain (skipped) may be null. fan_in >= 1.
// - One block per row: the row's sums are in double (as on the CPU) in a fixed tree over the block's threads,
//   so results repeat bit for bit and differ from the CPU's only by summation order. Mean and variance are
//   two-pass. Elementwise arithmetic is float, rounded operation by operation as the CPU's C++ expressions read,
//   and the per-row scalars are rounded to float where the CPU rounds them.
// - Gradient rules as in ops.h: d_weight and d_gain ACCUMULATE (both are parameter gradients).
// - Every launch is on context().stream; nothing synchronises. Host-compilable.
#pragma once

#include <cstdint>

namespace proplab::kernels {

void weight_standardize_forward(const float* weight, const float* gain, float scale, float eps, float* w_hat,
                                float* mean, float* rstd, std::int64_t rows, std::int64_t fan_in);

void weight_standardize_backward(const float* weight, const float* gain, float scale, const float* mean,
                                 const float* rstd, const float* d_w_hat, float* d_weight, float* d_gain,
                                 std::int64_t rows, std::int64_t fan_in);

}  // namespace proplab::kernels
