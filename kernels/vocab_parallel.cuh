// kernels/vocab_parallel: the CUDA side of the vocab-parallel cross-entropy pieces (proplab::ops::
// cross_entropy_shard_max / _sums / _finish in src/ops/vocab_parallel.h, whose CPU implementation in
// src/ops/vocab_parallel.cpp is the reference). The vocab-parallel embedding uses kernels/embedding.cuh.
//
// logits [rows, classes] are this shard's columns [first, first + classes) of the vocabulary; targets i32 [rows]
// hold global ids. row_max and sums are device arrays here (the ops copy them from and to their host vectors).
//
// Invariants:
// - One block per row; row maxima ignore NaN exactly as the CPU's std::max loop does (a maximum is independent of
//   the order it is taken in, so it is bitwise the CPU's); Σ exp(l − max) takes exp in float and sums in double
//   over a fixed tree. No atomics; the same inputs give the same bits.
// - d_logits is OVERWRITTEN (and may alias logits: each element is read before the same thread writes it).
// - Enqueued on context().stream; nothing here synchronises. Host-compilable.
#pragma once

#include <cstdint>

namespace proplab::kernels {

// row_max[r] = max_j logits[r, j] (NaN ignored; −inf for a row of NaN), as a double.
void cross_entropy_shard_max(const float* logits, std::int64_t rows, std::int64_t classes, double* row_max);

// sums[2r] = Σ_j exp(logits[r, j] − float(row_max[r])), sums[2r + 1] = logits[r, targets[r] − first] when that
// column is in this shard, else 0.
void cross_entropy_shard_sums(const float* logits, const double* row_max, const std::int32_t* targets,
                              std::int64_t rows, std::int64_t classes, std::int64_t first, double* sums);

// d_logits[r, j] = float(grad_coef / sums[2r]) · exp(logits[r, j] − float(row_max[r])), minus float(grad_coef) in
// the target's column when it is in this shard.
void cross_entropy_shard_grad(const float* logits, const double* row_max, const double* sums,
                              const std::int32_t* targets, std::int64_t rows, std::int64_t classes, std::int64_t first,
                              double grad_coef, float* d_logits);

}  // namespace proplab::kernels
