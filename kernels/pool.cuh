// kernels/pool: the CUDA side of the pooling ops and the channels-last views (proplab::ops::avg_pool2d_*,
// max_pool2d_*, global_avg_pool_*, nchw_to_nhwc, nhwc_to_nchw in src/ops/ops.h, whose CPU implementations in
// src/ops/pool.cpp are the reference). Images are NCHW; `planes` is N·C.
//
// Invariants:
// - Pointers are device pointers to contiguous tensors of the sizes given; argmax is i32 (the flat ih·W + iw
//   index of each window's maximum, first on ties; padding never wins).
// - Every output element is written by one thread that reads its inputs in the CPU's order with the CPU's
//   arithmetic (float sums in window order, the global average in double), so results are bitwise the CPU's.
// - Backward passes gather, no atomics: avg_pool2d_backward sums, for each input element, the windows covering it
//   in window order (the order the CPU adds them). max_pool2d_backward has no window geometry to gather with, so
//   d_x is cleared and then one thread owns each plane, adding d_y at the argmax positions in output order, as the
//   CPU does (no two threads touch one element). Every backward OVERWRITES d_x.
// - Launch geometry depends only on the sizes; every launch is on context().stream; nothing synchronises.
// - Host-compilable.
#pragma once

#include <cstdint>

namespace proplab::kernels {

void avg_pool2d_forward(const float* x, float* y, std::int64_t planes, std::int64_t h, std::int64_t w,
                        std::int64_t h_out, std::int64_t w_out, int kernel, int stride);
void avg_pool2d_backward(const float* d_y, float* d_x, std::int64_t planes, std::int64_t h, std::int64_t w,
                         std::int64_t h_out, std::int64_t w_out, int kernel, int stride);

void max_pool2d_forward(const float* x, float* y, std::int32_t* argmax, std::int64_t planes, std::int64_t h,
                        std::int64_t w, std::int64_t h_out, std::int64_t w_out, int kernel, int stride, int padding);
void max_pool2d_backward(const float* d_y, const std::int32_t* argmax, float* d_x, std::int64_t planes,
                         std::int64_t in_size, std::int64_t out_size);

void global_avg_pool_forward(const float* x, float* y, std::int64_t planes, std::int64_t size);
void global_avg_pool_backward(const float* d_y, float* d_x, std::int64_t planes, std::int64_t size);

// y [N, pixels, C] from x [N, C, pixels], and the inverse.
void nchw_to_nhwc(const float* x, float* y, std::int64_t n, std::int64_t channels, std::int64_t pixels);
void nhwc_to_nchw(const float* x, float* y, std::int64_t n, std::int64_t channels, std::int64_t pixels);

}  // namespace proplab::kernels
