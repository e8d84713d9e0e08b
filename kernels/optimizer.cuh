// kernels/optimizer: the CUDA side of the optimizer steps (proplab::ops::adamw_update / sgd_update in
// src/ops/ops.h, whose CPU implementations in src/ops/optimizer.cpp are the reference) and of the scaling step of
// global gradient-norm clipping (ops::clip_grad_norm, src/ops/clip.cpp).
//
// Invariants:
// - All pointers are device pointers to n contiguous floats; the hyper-parameters arrive already combined on the
//   host exactly as the CPU reference combines them (in double, rounded to float once), so only the per-element
//   arithmetic runs here. It is float, rounded operation by operation as the C++ expressions are written (no fused
//   multiply-add: __fmul_rn/__fadd_rn/__fsub_rn/__fdiv_rn/__fsqrt_rn), so a CPU build that does not contract
//   gives bitwise the same parameters.
// - With `norms` given, Σ w² (before the step) and Σ (w_after − w_before)² (products and differences in double)
//   are summed on the device in double: one partial per block of a grid that depends only on n, the partials
//   combined in block order (kernels::sum_partials), then copied to the host and ADDED to norms->weight_sq and
//   norms->update_sq. Same inputs → same bits. Only then does the call wait for the GPU.
// - Elementwise otherwise: every launch is on context().stream and nothing synchronises.
// - Host-compilable.
#pragma once

#include <cstdint>

namespace proplab::kernels {

// Per-element coefficients of one AdamW step (see ops/optimizer.cpp for how they are formed).
struct AdamWCoefficients {
  float beta1 = 0.0f, beta2 = 0.0f, one_minus_beta1 = 0.0f, one_minus_beta2 = 0.0f;
  float step_size = 0.0f, inv_sqrt_bc2 = 0.0f, decay = 0.0f, eps = 0.0f;
};

// Host sums of the update measurements; the launchers add to them.
struct UpdateSums {
  double weight_sq = 0.0;
  double update_sq = 0.0;
};

// m = β1·m + (1−β1)·g; v = β2·v + (1−β2)·g·g; p = p·decay − step_size·m / (sqrt(v)·inv_sqrt_bc2 + eps).
void adamw_update(float* param, const float* grad, float* m, float* v, std::int64_t n,
                  const AdamWCoefficients& coefficients, UpdateSums* sums);

// g' = g + wd·p; with momentum: buf = momentum·buf + g', p −= lr·(nesterov ? g' + momentum·buf : buf);
// without (momentum == 0, buf may be null): p −= lr·g'.
void sgd_update(float* param, const float* grad, float* momentum_buffer, std::int64_t n, float lr, float momentum,
                float weight_decay, bool nesterov, UpdateSums* sums);

// data[i] *= factor over n floats.
void scale(float* data, std::int64_t n, float factor);

}  // namespace proplab::kernels
