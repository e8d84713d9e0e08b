// ops/conv_winograd: Winograd F(2×2, 3×3) behind conv2d_forward and the stride-1 d_x of 3×3, stride-1, one-group
// convolutions on CPUs with AVX-512F. Internal to ops/conv.cpp; conv_kernel() (ops.h) selects it.
//
// Each 2 × 2 tile of output pixels is Y = Aᵀ [Σ_ci (G g G^T) ⊙ (Bᵀ d B)] A, with d the tile's 4 × 4 input patch
// and g the 3 × 3 kernel: 16 products per tile and channel pair where the direct sum has 36 (Lavin & Gray,
// "Fast Algorithms for Convolutional Neural Networks", 2016).
//
// The tiles of all samples, in (sample, tile row, tile column) order, are cut into blocks of 16 (one zmm, a lane
// per tile). A block's tiles lie on runs of consecutive tiles of one tile row (segments, at most 15 tiles each):
// each segment's four input lines per channel are loaded (masked: padding and the image's edges read zero) and
// permuted into the tiles' lanes, then transformed (Bᵀ d B) into 16 vectors per input channel. For each 16
// output channels and each of the 16 transform points, a 16 × 16 register tile sums the channels (one broadcast
// FMA per transformed weight), and the output transform (Aᵀ m A) plus the bias is stored straight into NCHW. No
// transformed tensor is ever written to memory beyond one block's.
//
// Every output element is one fixed sequence of operations, whatever the thread count or the block its tile falls
// in: results are bitwise independent of the threads. They differ from the direct kernel and im2col in the last
// bits (the transforms round differently; the error stays within a few units of the direct sum's).
#pragma once

#include "ops/conv_direct.h"

namespace proplab::ops::detail {

// Whether this CPU runs the kernel (AVX-512F) and the shape is one it computes: a 3 × 3 kernel, stride 1.
bool winograd_conv_fits(const DirectConvShape& s);

// y [N, C_out, H_out, W_out] = conv(x [N, C_in, H, W], weight [C_out, C_in, 3, 3]) (+ bias [C_out]), one group,
// stride 1, any padding.
void winograd_conv_forward(const float* x, const float* weight, const float* bias, float* y, const DirectConvShape& s);

}  // namespace proplab::ops::detail
