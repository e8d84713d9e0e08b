// models/tensor_parallel: Megatron-style tensor parallelism for the transformer.
//
// A TensorParallel names the group of ranks that share one model replica (null or one rank: no split) and holds
// the pieces of the model that talk to it. What is split (rank r of tp holds piece r; every piece initialises to
// exactly the unsplit values, nn/parameter.h):
//   - column-parallel linears (attention qkv by heads: q, k and v each by heads; FFN fc by hidden units): the
//     weight's output rows and the bias; the input is replicated and the output is this rank's features;
//   - row-parallel linears (attention output, FFN projection): the weight's input columns; the bias is
//     replicated; the output is a partial sum, all-reduced (operator g) and then complete on every rank;
//   - the token embedding (and an untied head) by vocabulary rows: the lookup is all-reduced, the logits are this
//     rank's vocabulary columns, and the softmax cross-entropy all-reduces the row maxima and sums.
// Conjugate operators: f (identity forward, all-reduce backward) sits where a replicated activation enters a
// column-parallel linear or the head: its backward is all_reduce() of the input gradient. g (all-reduce forward,
// identity backward) is row_linear_forward(). Everything else (norms, residuals, dropout, position embedding) runs
// replicated on identical values, so the gradients of replicated parameters come out identical on every rank
// without communication.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dist/communicator.h"
#include "spec/model.h"
#include "nn/layers.h"
#include "nn/parameter.h"

namespace proplab {

// UserError unless a model of this config can be split over `tp` ranks (tp = 1 always can): the transformer
// only, with heads, the FFN width and the vocabulary divisible by tp. Messages name parallel.tp and the key.
void check_tensor_parallel(const ModelConfig& config, int tp);

class TensorParallel {
 public:
  TensorParallel() = default;
  // `group`: the tensor-parallel ranks of this replica (null or size 1: one process, every call is local).
  explicit TensorParallel(dist::Communicator* group);

  int size() const { return size_; }
  int rank() const { return rank_; }
  bool split() const { return size_ > 1; }
  // This rank's piece of a split dimension of `extent`.
  std::int64_t local(std::int64_t extent) const { return extent / size_; }

  // Column-parallel Linear in → out (`groups` packed blocks of the output split separately, as qkv's 3):
  // weight [out/tp, in], bias [out/tp]. fan_in/fan_out are the full layer's.
  nn::Linear column_linear(ParameterStore& store, const std::string& name, std::int64_t in, std::int64_t out,
                           ParamRole role, bool with_bias, int block, int groups = 1) const;
  // Row-parallel Linear in → out: weight [out, in/tp], bias [out] (replicated).
  nn::Linear row_linear(ParameterStore& store, const std::string& name, std::int64_t in, std::int64_t out,
                        ParamRole role, bool with_bias, int block) const;
  // A [rows, columns] table split by rows (vocabulary): [rows/tp, columns].
  Parameter& row_split_table(ParameterStore& store, const std::string& name, std::int64_t rows, std::int64_t columns,
                             ParamRole role, std::int64_t fan_in, std::int64_t fan_out, int block) const;

  // g: y = x·W^T over this rank's input features, all-reduced, plus the bias (added once: by rank 0 before the
  // sum). Backward is the plain Linear::backward (d_x is this rank's features, the bias gradient is complete).
  void row_linear_forward(const nn::Linear& layer, const Tensor& x, Tensor& y) const;
  // In-place sum over the group (f's backward, g's forward); nothing for one process.
  void all_reduce(Tensor& x) const;

  // Vocab-parallel token embedding plus the position embedding: y [B, T, D], token t adding row t of `positions`
  // (the position table, or the rows of a sequence-parallel rank's tokens).
  void embedding_forward(const Tensor& tokens, const Parameter& token_table, const Tensor& positions,
                         std::int64_t vocab, Tensor& y) const;
  // Gradients of the token table and of `d_positions` (rows as `positions`'s) (+=) from d_y [B, T, D] (replicated).
  void embedding_backward(const Tensor& tokens, const Tensor& d_y, Parameter& token_table, Tensor& d_positions) const;
  // Vocab-parallel softmax cross-entropy of this rank's logits [rows, V/tp] against targets i32 [rows]: the mean
  // loss over rows (equal on every rank); d_logits (when given) = grad_scale·(softmax − onehot)/rows here.
  double cross_entropy(const Tensor& logits, const Tensor& targets, Tensor* d_logits, float grad_scale) const;

 private:
  ParamShard shard_of(const Shape& full, int dim, int groups) const;

  dist::Communicator* group_ = nullptr;
  int size_ = 1, rank_ = 0;
  // Cross-entropy scratch (per row).
  mutable std::vector<double> row_max_, sums_;
};

}  // namespace proplab
