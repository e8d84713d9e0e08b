// kernels/batchnorm: the CUDA side of BatchNorm (proplab::ops::batchnorm_forward/backward in src/ops/ops.h, whose
// CPU implementation in src/ops/batchnorm.cpp is the reference): per channel c of x [N, C, spatial] over the
// N·spatial values (b, p), training (batch statistics, running statistics updated) and eval (running statistics).
//
// Invariants:
// - Pointers are device pointers; x, y, d_y, d_x hold N·C·spatial floats, the per-channel arrays C floats. gamma,
//   beta, d_gamma and d_beta may be null (gamma = 1, beta = 0; gradients skipped).
// - Every per-channel sum is in double, as on the CPU: a channel's values (b, p) in flat order b·spatial + p are cut
//   into fixed chunks of kBatchnormChunk, each chunk summed by one block in a fixed tree, and the chunk partials
//   combined in chunk order by one thread per channel. Mean and variance are two-pass. Geometry depends only on the
//   shape (no atomics), so results repeat bit for bit; they differ from the CPU's only by summation order.
// - Elementwise arithmetic is float, rounded operation by operation as the CPU's C++ expressions read; the
//   per-channel scalars (mean, rstd, running statistics, the backward means) are formed in double and rounded to
//   float exactly where the CPU rounds them.
// - Gradient rules as in ops.h: d_x OVERWRITES; d_gamma, d_beta ACCUMULATE (+= the float-rounded double sum).
// - Every launch is on context().stream; nothing synchronises. Host-compilable.
#pragma once

#include <cstdint>

namespace proplab::kernels {

// Values of one channel summed by one block before the partials are combined.
constexpr std::int64_t kBatchnormChunk = 16384;

void batchnorm_forward(const float* x, const float* gamma, const float* beta, float eps, bool training, float momentum,
                       float* running_mean, float* running_var, float* y, float* mean, float* rstd, std::int64_t n,
                       std::int64_t channels, std::int64_t spatial);

void batchnorm_backward(const float* x, const float* gamma, const float* mean, const float* rstd, const float* d_y,
                        bool training, float* d_x, float* d_gamma, float* d_beta, std::int64_t n, std::int64_t channels,
                        std::int64_t spatial);

}  // namespace proplab::kernels
