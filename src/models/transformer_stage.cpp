// The transformer as a pipeline stage: a contiguous range of blocks run on a given input, with the activations of
// several micro-batches kept between their forward and backward (docs/distributed.md, "Pipeline parallelism").
//
// The stage reuses the whole model's sublayer_forward/sublayer_backward, which read the activation members; a
// micro-batch in slot k > 0 has its own set of those tensors, swapped into the members (handles only, no copies)
// for the duration of the call. The embedding and head are the whole model's own embed_forward/head_forward/
// head_backward/embed_backward, so a stage chain computes what the whole model computes. A stage may itself be split
// over a tensor-parallel group (tp × pp): the embedding, head and loss then go through the same TensorParallel calls as
// the whole model, and the stage's input and output (the residual stream) are replicated over the group.
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
    for (Tensor* t : {&s.normed, &s.branch_norm_saved.mean, &s.branch_norm_saved.rstd, &s.sum_norm_saved.mean,
                      &s.sum_norm_saved.rstd, &s.hidden, &s.probs, &s.lse, &s.mixed, &s.branch, &s.combined})
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
  check_tokens(tokens);
  ensure_buffers(tokens.dim(0), tokens.dim(1));
  if (slots_batch_ != batch_ || slots_tokens_ != tokens_) {
    stage_slots_.assign(static_cast<std::size_t>(stage_slot_count_ - 1), {});
    for (std::vector<Tensor>& set : stage_slots_)
      for (Tensor* t : stage_activations())
        set.push_back(t->defined() ? Tensor::empty(t->shape(), t->dtype(), t->device()) : Tensor());
    slots_batch_ = batch_;
    slots_tokens_ = tokens_;
  }
  SlotGuard guard([this](int k) { swap_slot(k); }, slot);
  const bool first = stage_first_ == 0, last = stage_last_ == static_cast<int>(sublayers_.size());

  Tensor& x0 = stream_[static_cast<std::size_t>(stage_first_)];
  if (first) {
    embed_forward(tokens, context);
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
  return head_forward(batch, grad_scale, context);
}

void Transformer::stage_backward(int slot, const Batch& batch, const Tensor& d_out, Tensor& d_in,
                                 const StepContext& context) {
  PROPLAB_CHECK(stage_last_ >= 0 && slots_batch_ == batch_ && slots_tokens_ == tokens_,
                "stage_backward before a stage_forward of this shape");
  PROPLAB_CHECK(slot >= 0 && slot < stage_slot_count_, "stage_backward: slot ", slot, " of ", stage_slot_count_);
  SlotGuard guard([this](int k) { swap_slot(k); }, slot);
  const bool first = stage_first_ == 0, last = stage_last_ == static_cast<int>(sublayers_.size());

  if (last) {
    head_backward(context);
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
  embed_backward(batch.inputs, context);
  d_in = Tensor();
}

}  // namespace proplab
