// models/transformer: decoder-only transformer language model with explicit forward and backward.
//
// Graph (per block l, for norm placement pre | post | both | none; λ, β from the scaling rule per residual add):
//   pre:  x ← λ·x + β·Drop(Attn(Norm1(x)));  x ← λ·x + β·Drop(FFN(Norm2(x)));  final Norm before the head
//   post: x ← Norm1(λ·x + β·Drop(Attn(x)));  x ← Norm2(λ·x + β·Drop(FFN(x)));   no final Norm
//   both: x ← Norm1(λ·x + β·Drop(Attn(In1(x))));  x ← Norm2(λ·x + β·Drop(FFN(In2(x))));  no final Norm (Keel)
//   none: x ← λ·x + β·Drop(Attn(x));         x ← λ·x + β·Drop(FFN(x));         no final Norm
// Norm parameters: blocks.l.{attn,ffn}.norm is the sublayer's one norm under pre (on the branch input) and post
// (after the sum); under both it is the norm after the sum and blocks.l.{attn,ffn}.in_norm the one on the branch
// input. Probes: blocks.l.{attn,ffn}.norm is the branch input's norm output (pre, both), .sum the sum before its
// norm (post, both).
// Attn = causal multi-head self-attention with packed QKV projection and an output projection; FFN = Linear(D→F),
// activation, Linear(F→D). Embeddings: token + learned position (then dropout). Head: logits = x·E^T with the
// token embedding E when tied, else a separate readout matrix; times the rule's output multiplier.
// Activations are [rows, features] with rows = batch·tokens.
// Tensor parallelism (models/tensor_parallel.h): with a group of tp ranks, each holds heads/tp heads, F/tp hidden
// units and V/tp vocabulary rows; the residual stream, norms and branch outputs are replicated.
// Sequence parallelism (models/sequence_parallel.h): with a ring of sp ranks, rank r holds T/sp tokens of every
// sequence (sequence_split's chunks, with their positions); the attention is ring attention and every other op is
// per token, so it runs on the local tokens alone. The loss is this rank's tokens' mean; the trainer averages it and
// sums the parameter gradients over the ring.
#pragma once

#include <vector>

#include "models/model.h"
#include "models/residual_site.h"
#include "models/tensor_parallel.h"
#include "nn/layers.h"

namespace proplab {

class Transformer final : public Model {
 public:
  // Builds the rule from `scaling` with make_model_rule (models/profile.h: profiled when the rule asks for it).
  // `sequence`: the sequence-parallel ring (null or one rank: whole sequences).
  Transformer(const TransformerConfig& config, const ScalingConfig& scaling, std::uint64_t seed,
              TensorParallel tp = TensorParallel(), dist::Communicator* sequence = nullptr);
  // Initialised by an already-built rule (the rule is not kept).
  Transformer(const TransformerConfig& config, const ScalingRule& rule, std::uint64_t seed,
              TensorParallel tp = TensorParallel(), dist::Communicator* sequence = nullptr);

  ParameterStore& params() override { return params_; }
  const std::vector<ProbeInfo>& probes() const override { return probes_; }
  double forward_backward(const Batch& batch, float grad_scale, const StepContext& context) override;
  double evaluate(const Batch& batch) override;
  double train_flops(std::int64_t samples) const override;
  std::int64_t tokens_per_sample() const override { return config_.seq_len; }
  void to_device(Device device) override {
    params_.to_device(device);
    batch_ = tokens_ = 0;  // activations are reallocated on the device
  }

  const TransformerConfig& config() const { return config_; }

  // Pipeline stage (models/transformer_stage.cpp). After set_stage the model runs only blocks
  // [first_block, last_block), with the embedding when first_block = 0 and the final norm, head and loss when
  // last_block = layers, through stage_forward/stage_backward (not forward_backward or evaluate); it keeps the
  // activations of `slots` micro-batches between their forward and backward. Every parameter still exists here;
  // the stage reads and accumulates gradients into its own (and the tied token embedding on the last stage). A
  // tensor-parallel model runs as a stage the same way (tp × pp): its pieces, with the residual stream replicated.
  void set_stage(int first_block, int last_block, int slots);
  // Forward of one micro-batch into `slot`. The first stage embeds batch.inputs, the others start from `x_in`
  // [R, D]. The last stage returns the mean loss over batch.targets and, when grad_scale != 0, keeps its gradient
  // (scaled by grad_scale) for stage_backward; the others return 0 and set `x_out` to the stage output [R, D] (a
  // view of the slot's activations, valid until the slot's next forward).
  double stage_forward(int slot, const Batch& batch, const Tensor& x_in, Tensor& x_out, float grad_scale,
                       const StepContext& context);
  // Backward of the micro-batch in `slot`, from `d_out` (the gradient of the stage output; unused on the last
  // stage). Parameter gradients accumulate; `d_in` is set to the gradient of the stage input (a view of scratch,
  // valid until the next stage call; undefined on the first stage).
  void stage_backward(int slot, const Batch& batch, const Tensor& d_out, Tensor& d_in, const StepContext& context);

 private:
  // One residual sublayer (attention or FFN) with its saved activations.
  struct Sublayer {
    bool is_attention = false;
    nn::Norm branch_norm;  // on the branch input (pre: named <prefix>.norm; both: <prefix>.in_norm)
    nn::Norm sum_norm;     // after the residual sum (post, both: named <prefix>.norm)
    nn::Linear in_proj;   // qkv (D→3D) or fc (D→F)
    nn::Linear out_proj;  // attention output (D→D) or FFN projection (F→D)
    ResidualSite residual;
    std::size_t first_param = 0;  // index of its first parameter (they are contiguous in creation order)
    // Probe indices (-1: not probed here).
    int probe_input = -1;   // blocks.l.in (attention sublayer only)
    int probe_norm = -1;    // pre, both: the normalised branch input
    int probe_sum = -1;     // post, both: λ·x + β·f before the norm
    int probe_hidden = -1;  // attention logits or FFN pre-activation
    int probe_mixed = -1;   // FFN post-activation
    int probe_branch = -1;  // branch output (after dropout)
    int probe_result = -1;  // the sublayer's output: blocks.l.mid or blocks.l.out
    // Saved activations.
    Tensor normed;  // pre, both: the branch norm's output [R, D]
    nn::Norm::Saved branch_norm_saved;
    nn::Norm::Saved sum_norm_saved;
    Tensor hidden;    // qkv [R, 3D] or FFN pre-activation u [R, F]
    Tensor probs;     // attention probabilities [B, H, T, T] (whole sequences)
    Tensor lse;       // sequence parallel: each query's log-sum-exp [B, H, T] (ring attention)
    Tensor mixed;     // attention output before the projection [R, D], or FFN post-activation g [R, F]
    Tensor branch;    // branch output after dropout [R, D]
    Tensor combined;  // post, both: λ·x + β·f before the norm [R, D]
  };

  void sublayer_forward(Sublayer& s, const Tensor& x_in, Tensor& x_out, const StepContext& context, int site);
  void sublayer_backward(Sublayer& s, const Tensor& x_in, const Tensor& d_out, Tensor& d_in, const StepContext& context,
                         int site);
  // The two ends of the model, shared by forward_backward and the pipeline stage calls. embed_forward fills
  // stream_[0]; head_forward reads stream_.back() and returns the loss (d_logits_ filled when grad_scale != 0);
  // head_backward sets d_stream_ to the gradient of stream_.back(); embed_backward consumes d_stream_.
  void embed_forward(const Tensor& tokens, const StepContext& context);
  double head_forward(const Batch& batch, float grad_scale, const StepContext& context);
  void head_backward(const StepContext& context);
  void embed_backward(const Tensor& tokens, const StepContext& context);
  void ensure_buffers(std::int64_t batch, std::int64_t tokens);
  // InternalError unless `tokens` is i32 [B, T] with T·sp <= seq_len (a ring rank's part of every sequence).
  void check_tokens(const Tensor& tokens) const;
  bool dropout_active(const StepContext& context) const { return context.training && config_.dropout > 0; }
  std::uint64_t dropout_stream(const StepContext& context, int site) const;

  int add_probe(const std::string& name, int block, ProbeKind kind, bool has_backward = true);
  bool in_stage(std::size_t sublayer) const {
    return stage_last_ < 0 || (static_cast<int>(sublayer) >= stage_first_ && static_cast<int>(sublayer) < stage_last_);
  }
  // The stage's saved activations (the members a slot swaps), in a fixed order.
  std::vector<Tensor*> stage_activations();
  void swap_slot(int slot);

  TransformerConfig config_;
  ParameterStore params_;
  std::vector<ProbeInfo> probes_;
  int probe_embed_ = -1, probe_final_ = -1, probe_logits_ = -1;
  Parameter* token_embedding_ = nullptr;
  Parameter* position_embedding_ = nullptr;
  std::vector<Sublayer> sublayers_;  // 2 per block: attention, FFN
  nn::Norm final_norm_;
  bool has_final_norm_ = false;
  std::size_t head_first_param_ = 0;  // the final norm's and untied head's parameters start here
  nn::Linear readout_;                // untied head only
  float logit_scale_ = 1.0f;
  float output_multiplier_ = 1.0f;
  std::uint64_t seed_ = 0;
  TensorParallel tp_;
  int local_heads_ = 0;  // heads on this rank (all of them without tensor parallelism)
  dist::Communicator* sequence_ = nullptr;  // the sequence-parallel ring (null: whole sequences)
  // The position embedding's rows of this rank's tokens (sequence_split's chunks: a copy), or the whole table without
  // a ring.
  Tensor local_positions();
  Tensor position_rows_;

  // Buffers for the current micro-batch shape.
  std::int64_t batch_ = 0, tokens_ = 0;
  Tensor embedded_;             // embeddings before dropout [R, D]
  std::vector<Tensor> stream_;  // residual stream: stream_[i] is the input of sublayer i; back() the last output
  Tensor final_;                // after the final norm [R, D]
  nn::Norm::Saved final_saved_;
  Tensor logits_, d_logits_;  // [R, V]
  Tensor targets_flat_;
  // Gradient scratch.
  Tensor d_stream_, d_branch_, d_dropped_, d_mixed_, d_hidden_, d_normed_, d_tmp_;

  // Pipeline stage: sublayers [stage_first_, stage_last_) (stage_last_ = -1: the whole model). Slot 0's
  // activations are the members above; slot k > 0 keeps its own in stage_slots_[k - 1], swapped in around calls.
  int stage_first_ = 0, stage_last_ = -1, stage_slot_count_ = 1;
  std::vector<std::vector<Tensor>> stage_slots_;
  std::int64_t slots_batch_ = 0, slots_tokens_ = 0;
};

}  // namespace proplab
