// kernels/convert: f32 → bf16 conversion of the matrix products' operands (MatmulPrecision::bf16 in core/device.h):
// the linear layers and the convolution round their GEMM inputs to bf16 into scratch and multiply them with f32
// accumulation (kernels/matmul).
//
// Invariants:
// - Round to nearest, ties to even (__float2bfloat16_rn): every finite f32 maps to the nearest bf16, a tie to the
//   one with an even last mantissa bit; values past the largest bf16 round to ±Inf; f32 denormals round to bf16
//   denormals or ±0 (no flush to zero); ±Inf stay ±Inf; a NaN stays a NaN (its payload is the hardware's).
// - bf16 values are stored as their 16-bit patterns (the upper half of the f32 they round to), so host code handles
//   them as std::uint16_t without CUDA's bf16 headers.
// - One element per thread in a grid-stride loop whose geometry depends only on the count; on context().stream;
//   never synchronises. Host-compilable.
#pragma once

#include <cstdint>

#include "kernels/context.cuh"

namespace proplab::kernels {

// dst[i] = bf16(src[i]) for i < count (device pointers; dst holds `count` 16-bit values).
void convert_f32_to_bf16(const float* src, std::uint16_t* dst, std::int64_t count);

// A bf16 copy of `count` floats in a Scratch buffer of its own, converted on construction (enqueued) and released
// with it (safe while the products reading it are still queued: see kernels/context.cuh on Scratch).
class Bf16Copy {
 public:
  Bf16Copy(const float* src, std::int64_t count);
  const std::uint16_t* data() const { return scratch_.as<std::uint16_t>(); }

 private:
  Scratch scratch_;
};

}  // namespace proplab::kernels
