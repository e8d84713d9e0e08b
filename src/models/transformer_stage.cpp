// The transformer as a pipeline stage: a contiguous range of blocks run on a given input, with the activations of
// several micro-batches kept between their forward and backward (docs/distributed.md, "Pipeline parallelism").
//
// The stage reuses the whole model's sublayer_forward/sublayer_backward, which read the activation members; a
// micro-batch in slot k > 0 has its own set of those tensors, swapped into the members (handles only, no copies)
// for the duration of the call. The embedding and head code mirrors Transformer::forward_backward op for op, so a
// stage chain computes what the whole model computes. A stage may itself be split over a tensor-parallel group
// (tp × pp): the embedding, head and loss then go through the same TensorParallel calls as the whole model, and
// the stage's input and output (the residual stream) are replicated over the group.
#include <functional>
#include <utility>

#include "models/transformer.h"

namespace proplab {

namespace {

// Swaps a slot's activations in for the lifetime of the guard.
class SlotGuard {
 public:
  SlotGuard(std::function<void(int)> swap, int slot) : swap_(std::move(swap)), slot_(slot) { swap_(slot_); }
  ~SlotGuard() { swap_(slot_); }
  SlotGuard(const SlotGuard&) = delete;
  SlotGuard& operator=(const SlotGuard&) = delete;

 private:
  std::function<void(int)> swap_;
  int slot_;
};

}  // namespace

void Transformer::set_stage(int first_block, int last_block, int slots) {
  PROPLAB_CHECK(first_block >= 0 && first_block < last_block && last_block <= config_.layers && slots >= 1,
                "set_stage: blocks [", first_block, ", ", last_block, ") of ", config_.layers, " with ", slots,
                " slots");
  stage_first_ = 2 * first_block;
  stage_last_ = 2 * last_block;
  stage_slot_count_ = slots;
  stage_slots_.clear();
  batch_ = tokens_ = 0;  // reallocate for the stage's sublayers only
  slots_batch_ = slots_tokens_ = 0;
}

std::vector<Tensor*> Transformer::stage_activations() {
  std::vector<Tensor*> out;
  for (int i = stage_first_; i < stage_last_; ++i) {
    Sublayer& s = sublayers_[static_cast<std::size_t>(i)];
    for (Tensor* t :
         {&s.normed, &s.norm_saved.mean, &s.norm_saved.rstd, &s.hidden, &s.probs, &s.mixed, &s.branch, &s.combined})
      out.push_back(t);
  }
  for (int i = stage_first_; i <= stage_last_; ++i) out.push_back(&stream_[static_cast<std::size_t>(i)]);
  if (stage_first_ == 0) out.push_back(&embedded_);
  if (stage_last_ == static_cast<int>(sublayers_.size()))
    for (Tensor* t : {&final_, &final_saved_.mean, &final_saved_.rstd, &logits_, &d_logits_}) out.push_back(t);
  return out;
}

void Transformer::swap_slot(int slot) {
  if (slot == 0) return;
  std::vector<Tensor*> members = stage_activations();
  std::vector<Tensor>& mine = stage_slots_[static_cast<std::size_t>(slot - 1)];
  for (std::size_t j = 0; j < members.size(); ++j) std::swap(*members[j], mine[j]);
}

double Transformer::stage_forward(int slot, const Batch& batch, const Tensor& x_in, Tensor& x_out, float grad_scale,
                                  const StepContext& context) {
  PROPLAB_CHECK(stage_last_ >= 0, "stage_forward before set_stage");
  PROPLAB_CHECK(slot >= 0 && slot < stage_slot_count_, "stage_forward: slot ", slot, " of ", stage_slot_count_);
  const Tensor& tokens = batch.inputs;
  PROPLAB_CHECK(tokens.ndim() == 2 && tokens.dim(1) <= config_.seq_len, "transformer input shape ",
                shape_string(tokens.shape()));
  ensure_buffers(tokens.dim(0), tokens.dim(1));
  if (slots_batch_ != batch_ || slots_tokens_ != tokens_) {
    stage_slots_.assign(static_cast<std::size_t>(stage_slot_count_ - 1), {});
    for (std::vector<Tensor>& set : stage_slots_)
      for (Tensor* t : stage_activations())
        set.push_back(t->defined() ? Tensor::empty(t->shape(), t->dtype()) : Tensor());
    slots_batch_ = batch_;
    slots_tokens_ = tokens_;
  }
  SlotGuard guard([this](int k) { swap_slot(k); }, slot);
  const std::int64_t r = batch_ * tokens_, d = config_.width;
  const bool drop = dropout_active(context);
  const bool first = stage_first_ == 0, last = stage_last_ == static_cast<int>(sublayers_.size());
  ProbeSink* sink = context.sink;

  Tensor& x0 = stream_[static_cast<std::size_t>(stage_first_)];
  if (first) {
    Tensor target = (drop ? embedded_ : x0).reshape({batch_, tokens_, d});
    tp_.embedding_forward(tokens, *token_embedding_, *position_embedding_, config_.vocab, target);
    if (drop) ops::dropout_forward(embedded_, config_.dropout, context.seed, dropout_stream(context, -1), x0);
    if (sink) sink->forward(probe_embed_, x0, batch_);
  } else {
    PROPLAB_CHECK(x_in.shape() == x0.shape(), "stage_forward: input ", shape_string(x_in.shape()), ", expected ",
                  shape_string(x0.shape()));
    x0.copy_from(x_in);
  }
  for (int i = stage_first_; i < stage_last_; ++i)
    sublayer_forward(sublayers_[static_cast<std::size_t>(i)], stream_[static_cast<std::size_t>(i)],
                     stream_[static_cast<std::size_t>(i) + 1], context, i);
  if (!last) {
    x_out = stream_[static_cast<std::size_t>(stage_last_)];
    return 0.0;
  }
  const Tensor* head_in = &stream_.back();
  if (has_final_norm_) {
    final_norm_.forward(stream_.back(), final_, final_saved_);
    head_in = &final_;
    if (sink) sink->forward(probe_final_, final_, batch_);
  }
  const Tensor& head_weight = config_.tie_embeddings ? token_embedding_->value : readout_.weight->value;
  ops::linear_forward(*head_in, head_weight, nullptr, logits_);
  if (output_multiplier_ != 1.0f) ops::scale(logits_, output_multiplier_);
  if (sink) sink->forward(probe_logits_, logits_, batch_);
  const Tensor targets = batch.targets.reshape({r});
  return tp_.cross_entropy(logits_, targets, grad_scale != 0.0f ? &d_logits_ : nullptr, grad_scale);
}

void Transformer::stage_backward(int slot, const Batch& batch, const Tensor& d_out, Tensor& d_in,
                                 const StepContext& context) {
  PROPLAB_CHECK(stage_last_ >= 0 && slots_batch_ == batch_ && slots_tokens_ == tokens_,
                "stage_backward before a stage_forward of this shape");
  PROPLAB_CHECK(slot >= 0 && slot < stage_slot_count_, "stage_backward: slot ", slot, " of ", stage_slot_count_);
  SlotGuard guard([this](int k) { swap_slot(k); }, slot);
  const std::int64_t d = config_.width;
  const bool first = stage_first_ == 0, last = stage_last_ == static_cast<int>(sublayers_.size());
  ProbeSink* sink = context.sink;

  if (last) {
    if (sink) sink->backward(probe_logits_, d_logits_, batch_);
    if (output_multiplier_ != 1.0f) ops::scale(d_logits_, output_multiplier_);
    const Tensor* head_in = has_final_norm_ ? &final_ : &stream_.back();
    const Tensor& head_weight = config_.tie_embeddings ? token_embedding_->value : readout_.weight->value;
    Tensor& head_grad = config_.tie_embeddings ? token_embedding_->grad : readout_.weight->grad;
    if (has_final_norm_) {
      ops::linear_backward(*head_in, head_weight, d_logits_, &d_tmp_, head_grad, nullptr);
      tp_.all_reduce(d_tmp_);  // f: every rank's vocabulary columns
      if (sink) sink->backward(probe_final_, d_tmp_, batch_);
      final_norm_.backward(stream_.back(), final_saved_, d_tmp_, d_stream_);
    } else {
      ops::linear_backward(*head_in, head_weight, d_logits_, &d_stream_, head_grad, nullptr);
      tp_.all_reduce(d_stream_);
    }
  } else {
    PROPLAB_CHECK(d_out.shape() == d_stream_.shape(), "stage_backward: gradient ", shape_string(d_out.shape()),
                  ", expected ", shape_string(d_stream_.shape()));
    d_stream_.copy_from(d_out);
  }
  for (int i = stage_last_; i-- > stage_first_;)
    sublayer_backward(sublayers_[static_cast<std::size_t>(i)], stream_[static_cast<std::size_t>(i)], d_stream_,
                      d_stream_, context, i);
  if (!first) {
    d_in = d_stream_;
    return;
  }
  if (sink) sink->backward(probe_embed_, d_stream_, batch_);
  const Tensor* d_embedded = &d_stream_;
  if (dropout_active(context)) {
    ops::dropout_backward(d_stream_, config_.dropout, context.seed, dropout_stream(context, -1), d_tmp_);
    d_embedded = &d_tmp_;
  }
  tp_.embedding_backward(batch.inputs, d_embedded->reshape({batch_, tokens_, d}), *token_embedding_,
                         *position_embedding_);
  d_in = Tensor();
}

}  // namespace proplab
