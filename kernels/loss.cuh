// kernels/loss: the CUDA side of the losses (proplab::ops::softmax_cross_entropy and mse_loss in src/ops/ops.h,
// whose CPU implementations in src/ops/loss.cpp are the reference), and the ordered sum of per-row values they
// and the vocab-parallel cross-entropy share.
//
// Invariants:
// - Per-row (cross-entropy) or per-element (squared error) losses are formed in double and summed as the CPU's
//   chunked_sum does: chunks of a fixed size (kCrossEntropyChunk rows, kSquaredErrorChunk elements) summed in
//   index order by one thread each, the chunk sums added in chunk order (kernels::sum_partials). No atomics; the
//   same inputs give the same bits.
// - Gradients OVERWRITE d_logits / d_pred (skipped when null); each may alias its input (every element is read
//   before the same thread writes it; a row's target logit is read before any of the row is written).
// - The functions return the loss sum to the host (one copy, which waits for the GPU); targets must already be
//   checked to lie in [0, classes). Enqueued on context().stream; temporaries from kernels::Scratch.
// - Host-compilable.
#pragma once

#include <cstdint>

namespace proplab::kernels {

// The chunk sizes of the CPU's chunked_sum calls in src/ops/loss.cpp (kRowsPerChunk, kReduceChunk).
constexpr std::int64_t kCrossEntropyChunk = 8;
constexpr std::int64_t kSquaredErrorChunk = 4096;

// *out = Σ over chunks of `chunk` consecutive values of (Σ values in the chunk, in order), chunks in order: the
// CPU's chunked_sum over values[0, n) (device pointers; n >= 0, *out = 0 when n = 0).
void chunked_sum(const double* values, std::int64_t n, std::int64_t chunk, double* out);

// Σ_r (log Σ_j exp(l_rj − max_r) + max_r − l_r,target_r) over rows of logits [rows, classes]; when d_logits is given
// it is overwritten with grad_coef · softmax − grad_coef · onehot (each rounded to float as on the CPU).
double softmax_cross_entropy_sum(const float* logits, const std::int32_t* targets, std::int64_t rows,
                                 std::int64_t classes, float* d_logits, double grad_coef);

// Σ_i (pred_i − target_i)² in double over n elements; d_pred (when given) = grad_coef · (pred − target) in float.
double squared_error_sum(const float* pred, const float* target, std::int64_t n, float* d_pred, float grad_coef);

}  // namespace proplab::kernels
