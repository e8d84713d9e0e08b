// The host reference for bf16 rounding in the CUDA tests (test_convert_cuda.cpp, test_matmul_bf16_cuda.cpp):
// f32 → bf16 round to nearest, ties to even, on the bit pattern, and tensors rounded that way.
//
// Invariants: a bf16 is the upper 16 bits of an f32. Rounding adds 0x7FFF plus the kept part's lowest bit to the
// pattern and drops the low half, which is round-to-nearest-even for every non-NaN value (denormals, the carry
// into the exponent, overflow to ±Inf included); a NaN maps to the quiet NaN of its sign (0x7FC0 | sign), since
// adding to a NaN's pattern could carry it into an Inf.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/tensor.h"

namespace proplab::testing {

inline std::uint32_t float_bits(float value) {
  std::uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

inline float bits_float(std::uint32_t bits) {
  float value = 0.0f;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

inline std::uint16_t bf16_bits_rne(float value) {
  const std::uint32_t bits = float_bits(value);
  if (std::isnan(value)) return static_cast<std::uint16_t>(((bits >> 16) & 0x8000u) | 0x7FC0u);
  const std::uint32_t lowest_kept = (bits >> 16) & 1u;
  return static_cast<std::uint16_t>((bits + 0x7FFFu + lowest_kept) >> 16);
}

inline float bf16_value(std::uint16_t bits) { return bits_float(static_cast<std::uint32_t>(bits) << 16); }

inline bool bf16_is_nan(std::uint16_t bits) { return (bits & 0x7F80u) == 0x7F80u && (bits & 0x007Fu) != 0; }

// A CPU copy of `tensor` with every value rounded to the nearest bf16 (ties to even), kept as f32.
inline Tensor round_to_bf16(const Tensor& tensor) {
  std::vector<float> values = tensor.to(Device::cpu).to_vector();
  for (float& v : values) v = bf16_value(bf16_bits_rne(v));
  return Tensor::from_vector(tensor.shape(), values);
}

}  // namespace proplab::testing
