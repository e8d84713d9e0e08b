#include "models/tensor_parallel.h"

#include "ops/ops.h"
#include "ops/vocab_parallel.h"

namespace proplab {

void check_tensor_parallel(const ModelConfig& config, int tp) {
  if (tp == 1) return;
  const std::string at = "parallel.tp = " + std::to_string(tp);
  if (config.kind() != ModelKind::transformer)
    throw UserError(at + ": tensor parallelism splits the transformer only; allowed for model.type = \"" +
                    std::string(model_kind_name(config.kind())) + "\": tp = 1");
  const TransformerConfig& m = config.transformer();
  auto require = [&](std::int64_t value, const char* key) {
    if (value % tp != 0)
      throw UserError(at + " must divide " + key + " = " + std::to_string(value) + "; allowed: a tp that divides " +
                      key);
  };
  require(m.heads, "model.heads");
  require(static_cast<std::int64_t>(m.ffn_mult) * m.width, "the FFN width model.ffn_mult * model.width");
  require(m.vocab, "model.vocab");
}

TensorParallel::TensorParallel(dist::Communicator* group) : group_(group) {
  if (group_ != nullptr) {
    size_ = group_->size();
    rank_ = group_->rank();
  }
}

ParamShard TensorParallel::shard_of(const Shape& full, int dim, int groups) const {
  ParamShard shard;
  shard.full_shape = full;
  shard.dim = dim;
  shard.groups = groups;
  shard.parts = size_;
  shard.part = rank_;
  return shard;
}

nn::Linear TensorParallel::column_linear(ParameterStore& store, const std::string& name, std::int64_t in,
                                         std::int64_t out, ParamRole role, bool with_bias, int block,
                                         int groups) const {
  if (!split()) return nn::Linear::create(store, name, in, out, role, with_bias, block);
  PROPLAB_CHECK(out % (static_cast<std::int64_t>(groups) * size_) == 0, name, ": ", out, " outputs in ", groups,
                " blocks do not split over ", size_, " ranks");
  nn::Linear layer;
  layer.weight = &store.add(name + ".weight", {out / size_, in}, role, in, out, block);
  layer.weight->shard = shard_of({out, in}, 0, groups);
  if (with_bias) {
    layer.bias = &store.add(name + ".bias", {out / size_}, ParamRole::bias, in, out, block);
    layer.bias->shard = shard_of({out}, 0, groups);
  }
  return layer;
}

nn::Linear TensorParallel::row_linear(ParameterStore& store, const std::string& name, std::int64_t in, std::int64_t out,
                                      ParamRole role, bool with_bias, int block) const {
  if (!split()) return nn::Linear::create(store, name, in, out, role, with_bias, block);
  PROPLAB_CHECK(in % size_ == 0, name, ": ", in, " inputs do not split over ", size_, " ranks");
  nn::Linear layer;
  layer.weight = &store.add(name + ".weight", {out, in / size_}, role, in, out, block);
  layer.weight->shard = shard_of({out, in}, 1, 1);
  if (with_bias) layer.bias = &store.add(name + ".bias", {out}, ParamRole::bias, in, out, block);
  return layer;
}

Parameter& TensorParallel::row_split_table(ParameterStore& store, const std::string& name, std::int64_t rows,
                                           std::int64_t columns, ParamRole role, std::int64_t fan_in,
                                           std::int64_t fan_out, int block) const {
  if (!split()) return store.add(name, {rows, columns}, role, fan_in, fan_out, block);
  PROPLAB_CHECK(rows % size_ == 0, name, ": ", rows, " rows do not split over ", size_, " ranks");
  Parameter& p = store.add(name, {rows / size_, columns}, role, fan_in, fan_out, block);
  p.shard = shard_of({rows, columns}, 0, 1);
  return p;
}

void TensorParallel::row_linear_forward(const nn::Linear& layer, const Tensor& x, Tensor& y) const {
  if (!split()) {
    layer.forward(x, y);
    return;
  }
  const Tensor* bias = layer.bias != nullptr && rank_ == 0 ? &layer.bias->value : nullptr;
  ops::linear_forward(x, layer.weight->value, bias, y);
  all_reduce(y);
}

void TensorParallel::all_reduce(Tensor& x) const {
  if (!split()) return;
  PROPLAB_CHECK(x.is_contiguous() && x.dtype() == DType::f32,
                "tensor-parallel all-reduce needs a contiguous f32 tensor");
  group_->all_reduce(x.f32(), x.numel());
}

void TensorParallel::embedding_forward(const Tensor& tokens, const Parameter& token_table, const Tensor& positions,
                                       std::int64_t vocab, Tensor& y) const {
  if (!split()) {
    ops::embedding_forward(tokens, token_table.value, &positions, y);
    return;
  }
  const std::int64_t first = rank_ * token_table.value.dim(0);
  ops::embedding_shard_forward(tokens, token_table.value, first, vocab, y);
  all_reduce(y);
  ops::position_add_forward(positions, y);
}

void TensorParallel::embedding_backward(const Tensor& tokens, const Tensor& d_y, Parameter& token_table,
                                        Tensor& d_positions) const {
  if (!split()) {
    ops::embedding_backward(tokens, d_y, token_table.grad, &d_positions);
    return;
  }
  ops::embedding_shard_backward(tokens, d_y, rank_ * token_table.grad.dim(0), token_table.grad);
  ops::position_add_backward(d_y, d_positions);
}

double TensorParallel::cross_entropy(const Tensor& logits, const Tensor& targets, Tensor* d_logits,
                                     float grad_scale) const {
  if (!split()) return ops::softmax_cross_entropy(logits, targets, d_logits, grad_scale);
  const std::int64_t first = rank_ * logits.dim(-1);
  ops::cross_entropy_shard_max(logits, row_max_);
  group_->all_reduce(row_max_.data(), static_cast<std::int64_t>(row_max_.size()), dist::ReduceOp::max);
  ops::cross_entropy_shard_sums(logits, row_max_, targets, first, sums_);
  group_->all_reduce(sums_.data(), static_cast<std::int64_t>(sums_.size()), dist::ReduceOp::sum);
  return ops::cross_entropy_shard_finish(logits, row_max_, sums_, targets, first, d_logits, grad_scale);
}

}  // namespace proplab
