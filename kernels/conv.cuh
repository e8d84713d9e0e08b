// kernels/conv: the CUDA side of 2-D convolution (proplab::ops::conv2d_forward/backward in src/ops/ops.h, whose
// CPU implementation in src/ops/conv.cpp is the reference): NCHW, stride, zero padding, groups, optional bias,
// through im2col and kernels::gemm (cuBLASLt, f32 accumulation) as the CPU goes through im2col and sgemm.
//
// Invariants:
// - Pointers are device pointers to contiguous NCHW tensors of the sizes in ConvShape (weight [C_out, C_in/groups,
//   KH, KW], bias and d_bias [C_out]); bias, d_x and d_bias may be null (skipped).
// - Samples are processed in chunks whose size is a function of the shape only (the column buffers stay below
//   kConvColumnBudget floats); per chunk and group: im2col into columns [C_in_g·KH·KW, chunk·H_out·W_out], one
//   gemm, then a scatter into NCHW adding the bias (x + b, b = 0 without bias, as the CPU).
// - Gradient rules as in ops.h: d_x OVERWRITES (each element gathers, in tap order (i, j), the column gradients
//   that read it — no atomics); d_weight ACCUMULATES (one gemm per chunk and group with beta = 1, chunks in
//   order); d_bias ACCUMULATES Σ over samples and pixels per channel, summed in double by one block per channel in
//   a fixed tree, rounded to float once and added.
// - Deterministic: launch geometry depends only on the shape, no floating-point atomics, and kernels::gemm picks
//   its algorithm once per shape without split-K, so the same inputs give the same bits on every call. Products
//   differ from OpenBLAS's only in summation order.
// - With GemmInput::bf16 each product's two operands (weights, columns, output gradients) are rounded to bf16 into
//   scratch (kernels/convert) and multiplied with f32 accumulation; im2col, col2im, the bias and every output and
//   gradient stay f32. GemmInput::f32 runs exactly the f32 path.
// - Every launch is on context().stream; nothing synchronises. Host-compilable.
#pragma once

#include <cstdint>

#include "kernels/matmul.cuh"

namespace proplab::kernels {

// Floats one chunk's column buffer may hold (128 MiB); at least one sample per chunk.
constexpr std::int64_t kConvColumnBudget = std::int64_t{1} << 25;

struct ConvShape {
  std::int64_t n = 0, c_in = 0, h = 0, w = 0;
  std::int64_t c_out = 0, kh = 0, kw = 0;
  std::int64_t h_out = 0, w_out = 0;
  std::int64_t groups = 1;
  std::int64_t stride = 1, padding = 0;
};

// y = conv(x, weight) (+ bias), y overwritten.
void conv2d_forward(const float* x, const float* weight, const float* bias, float* y, const ConvShape& shape,
                    GemmInput input = GemmInput::f32);

// d_x = conv^T(d_y, weight) (overwrite, skipped when null), d_weight += d_y ⋆ x, d_bias += Σ d_y (skipped when
// null).
void conv2d_backward(const float* x, const float* weight, const float* d_y, float* d_x, float* d_weight, float* d_bias,
                     const ConvShape& shape, GemmInput input = GemmInput::f32);

}  // namespace proplab::kernels
