// ops/conv_direct: the packed direct convolution behind conv2d_forward (and the stride-1 d_x, itself a
// convolution) on CPUs with AVX-512F. Internal to ops/conv.cpp; conv_kernel() (ops.h) selects it.
//
// The output pixels of all samples, in NCHW order, are cut into blocks of 16. For each block the 16 pixels'
// input patches are gathered straight into a packed panel [C_in·KH·KW][16] (zero where a tap reads padding, or
// past the last pixel), and a 16 × 16 register tile per 16 output channels multiplies the weights, packed
// [C_out / 16][C_in·KH·KW][16], into it: one broadcast FMA per channel per patch element. The tile is stored
// straight into the NCHW output. No column matrix, no separate packing, no scatter copy.
//
// Every output element is one sum over the patch in a fixed order, whatever the thread count or the block a
// pixel falls in: results are bitwise independent of the threads. They differ in the last bits from the im2col
// path (OpenBLAS sums in another order).
#pragma once

#include <cstdint>
#include <vector>

namespace proplab::ops::detail {

struct DirectConvShape {
  std::int64_t n = 0, c_in = 0, h = 0, w = 0;
  std::int64_t c_out = 0, kh = 0, kw = 0, h_out = 0, w_out = 0;
  int stride = 1, padding = 0;
};

// Whether this CPU runs the kernel (AVX-512F) and the shape fits it (offsets within one 16-pixel block fit 32
// bits).
bool direct_conv_fits(const DirectConvShape& s);

// y [N, C_out, H_out, W_out] = conv(x [N, C_in, H, W], weight [C_out, C_in, KH, KW]) (+ bias [C_out]), one group.
void direct_conv_forward(const float* x, const float* weight, const float* bias, float* y, const DirectConvShape& s);

// d_weight [C_out, C_in, KH, KW] += Σ over samples and output pixels of d_y ⊗ the input patches, one group. The
// same blocks and panels as the forward, transposed (16 × 16 in registers) to [pixel][patch element]; a 16 × 16
// register tile of (output channel, patch element) runs over a chunk's pixels with one broadcast FMA per d_y
// value. Chunks are summed in a fixed order into at most 16 partials, added in order: bitwise independent of the
// threads.
void direct_conv_weight_grad(const float* x, const float* d_y, float* d_weight, const DirectConvShape& s);

// A 64-byte aligned pointer into `buffer` (a caller's buffer, reused across calls), grown to hold `floats` floats.
float* aligned_buffer(std::vector<float>& buffer, std::int64_t floats);

}  // namespace proplab::ops::detail
