// ops/vocab_parallel: the pieces of the token embedding and the softmax cross-entropy when the vocabulary is split
// over the ranks of a tensor-parallel group (Megatron-LM's vocab-parallel embedding and cross-entropy).
//
// A rank holds token ids [first, first + V_shard): the rows of the embedding table and the columns of the logits.
// The ops here are local; the caller combines ranks with all-reduces between them (models/tensor_parallel):
//   embedding:     y = embedding_shard_forward(...) on every rank, all-reduce (sum), then position_add_forward;
//   cross-entropy: cross_entropy_shard_max, all-reduce (max) of the row maxima, cross_entropy_shard_sums,
//                  all-reduce (sum) of [Σ exp, target logit] per row, cross_entropy_shard_finish.
// With one rank (first = 0, V_shard = V) they compute the same values as embedding_forward and
// softmax_cross_entropy, up to rounding. Gradients follow ops.h: d_x overwrites, parameter gradients accumulate.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace proplab::ops {

// y[b, t] = table_shard[tokens[b, t] − first] for ids in [first, first + V_shard), else 0. tokens i32 [B, T]
// (ids in [0, vocab)), table_shard [V_shard, D], y [B, T, D].
void embedding_shard_forward(const Tensor& tokens, const Tensor& table_shard, std::int64_t first, std::int64_t vocab,
                             Tensor& y);
// d_table_shard (+=) from d_y [B, T, D], for the ids of this shard only. Deterministic.
void embedding_shard_backward(const Tensor& tokens, const Tensor& d_y, std::int64_t first, Tensor& d_table_shard);
// y[b, t] += pos_table[t]; pos_table [T_max >= T, D], y [B, T, D].
void position_add_forward(const Tensor& pos_table, Tensor& y);
// d_pos_table[t] (+=) Σ_b d_y[b, t]. Deterministic.
void position_add_backward(const Tensor& d_y, Tensor& d_pos_table);

// Per row of logits_shard [rows, V_shard]: row_max[r] = max_j logits[r, j] (resized to rows).
void cross_entropy_shard_max(const Tensor& logits_shard, std::vector<double>& row_max);
// Per row, with the global row maxima: sums[2r] = Σ_j exp(logits[r, j] − row_max[r]), sums[2r + 1] = the target's
// logit when targets[r] falls in [first, first + V_shard), else 0 (resized to 2·rows).
void cross_entropy_shard_sums(const Tensor& logits_shard, const std::vector<double>& row_max, const Tensor& targets,
                              std::int64_t first, std::vector<double>& sums);
// With the sums over every shard: returns the mean loss over rows, mean_r (log S_r + max_r − target logit_r);
// d_logits_shard (overwritten, when given) = grad_scale · (softmax − onehot) / rows on this shard's columns.
double cross_entropy_shard_finish(const Tensor& logits_shard, const std::vector<double>& row_max,
                                  const std::vector<double>& sums, const Tensor& targets, std::int64_t first,
                                  Tensor* d_logits_shard, float grad_scale = 1.0f);

}  // namespace proplab::ops
