#include "models/transformer.h"

#include <algorithm>
#include <cmath>

#include "core/device.h"
#include "core/rng.h"
#include "models/gather.h"
#include "models/profile.h"
#include "models/sequence_parallel.h"

namespace proplab {

namespace {

// A view of the first numel(shape) elements of a flat scratch tensor, with the given shape.
Tensor view_of(const Tensor& flat, const Shape& shape) { return flat.slice(0, 0, shape_numel(shape)).reshape(shape); }

// The study's rule, profiled when it asks for it (models/profile.h).
std::unique_ptr<ScalingRule> rule_for(const TransformerConfig& config, const ScalingConfig& scaling,
                                      std::uint64_t seed) {
  const ModelConfig model(config);
  return make_model_rule(model, scaling, seed);
}

}  // namespace

Transformer::Transformer(const TransformerConfig& config, const ScalingConfig& scaling, std::uint64_t seed,
                         TensorParallel tp, dist::Communicator* sequence)
    : Transformer(config, *rule_for(config, scaling, seed), seed, tp, sequence) {}

Transformer::Transformer(const TransformerConfig& config, const ScalingRule& rule, std::uint64_t seed,
                         TensorParallel tp, dist::Communicator* sequence)
    : config_(config),
      seed_(seed),
      tp_(tp),
      local_heads_(config.heads / tp.size()),
      sequence_(sequence != nullptr && sequence->size() > 1 ? sequence : nullptr) {
  const std::int64_t d = config.width, v = config.vocab, t = config.seq_len;
  const std::int64_t f = static_cast<std::int64_t>(config.ffn_mult) * d;
  PROPLAB_CHECK(d % config.heads == 0, "width ", d, " not divisible by heads ", config.heads);

  token_embedding_ = &tp_.row_split_table(params_, "embed.token.weight", v, d, ParamRole::token_embedding, v, d, -1);
  position_embedding_ = &params_.add("embed.position.weight", {t, d}, ParamRole::position_embedding, t, d);
  const bool branch_normed = norms_branch_input(config.norm), sum_normed = norms_residual_sum(config.norm);
  // The branch input's norm keeps Pre-LN's name alone; beside a norm after the sum (both) it is the in_norm.
  const std::string branch_norm_name = sum_normed ? ".in_norm" : ".norm";
  for (int l = 0; l < config.layers; ++l) {
    for (int which = 0; which < 2; ++which) {
      Sublayer s;
      s.is_attention = which == 0;
      s.first_param = params_.all().size();
      const std::string prefix = "blocks." + std::to_string(l) + (s.is_attention ? ".attn" : ".ffn");
      if (branch_normed)
        s.branch_norm = nn::Norm::create(params_, prefix + branch_norm_name, d, config.norm_kind, config.norm_affine,
                                         config.norm_eps, l);
      if (sum_normed)
        s.sum_norm =
            nn::Norm::create(params_, prefix + ".norm", d, config.norm_kind, config.norm_affine, config.norm_eps, l);
      if (s.is_attention) {
        // Q, K and V are each a D→D projection packed side by side: fan-out per projection is D.
        s.in_proj = tp_.column_linear(params_, prefix + ".qkv", d, 3 * d, ParamRole::attn_qkv, config.bias, l, 3);
        s.in_proj.weight->info.fan_out = d;
        s.out_proj = tp_.row_linear(params_, prefix + ".out", d, d, ParamRole::attn_out, config.bias, l);
      } else {
        s.in_proj = tp_.column_linear(params_, prefix + ".fc", d, f, ParamRole::ffn_in, config.bias, l);
        s.out_proj = tp_.row_linear(params_, prefix + ".proj", f, d, ParamRole::ffn_out, config.bias, l);
      }
      s.residual =
          ResidualSite::create(params_, prefix, rule.residual(l, s.is_attention ? Branch::attention : Branch::ffn), l);
      sublayers_.push_back(std::move(s));
    }
  }
  has_final_norm_ = config.norm == NormPlacement::pre;  // post, both: the last sum's norm feeds the head
  head_first_param_ = params_.all().size();
  if (has_final_norm_)
    final_norm_ = nn::Norm::create(params_, "final_norm", d, config.norm_kind, config.norm_affine, config.norm_eps, -1);
  if (!config.tie_embeddings) readout_ = tp_.column_linear(params_, "head", d, v, ParamRole::readout, false, -1);

  // Probes, in forward order.
  probe_embed_ = add_probe("embed.out", -1, ProbeKind::embed);
  for (std::size_t i = 0; i < sublayers_.size(); ++i) {
    Sublayer& s = sublayers_[i];
    const int l = static_cast<int>(i / 2);
    const std::string prefix = "blocks." + std::to_string(l) + (s.is_attention ? ".attn" : ".ffn");
    if (s.is_attention) s.probe_input = add_probe("blocks." + std::to_string(l) + ".in", l, ProbeKind::residual);
    if (branch_normed) s.probe_norm = add_probe(prefix + ".norm", l, ProbeKind::norm);
    if (s.is_attention) {
      s.probe_hidden = add_probe(prefix + ".logits", l, ProbeKind::logits, false);
    } else {
      s.probe_hidden = add_probe(prefix + ".preact", l, ProbeKind::preact);
      s.probe_mixed = add_probe(prefix + ".postact", l, ProbeKind::postact);
    }
    s.probe_branch = add_probe(prefix + ".out", l, ProbeKind::branch);
    if (sum_normed) s.probe_sum = add_probe(prefix + ".sum", l, ProbeKind::residual);
    s.probe_result =
        add_probe("blocks." + std::to_string(l) + (s.is_attention ? ".mid" : ".out"), l, ProbeKind::residual);
  }
  if (has_final_norm_) probe_final_ = add_probe("final_norm.out", -1, ProbeKind::norm);
  probe_logits_ = add_probe("head.logits", -1, ProbeKind::logits);
  if (tp_.split()) {  // heads, hidden units and vocabulary columns are split over the ranks
    probes_[probe_logits_].split_features = true;
    for (const Sublayer& s : sublayers_)
      for (int probe : {s.probe_hidden, s.probe_mixed})
        if (probe >= 0) probes_[probe].split_features = true;
  }

  params_.init(rule, seed);
  for (const Sublayer& s : sublayers_) s.residual.init_values();
  logit_scale_ = static_cast<float>(rule.logit_scale(static_cast<int>(d / config.heads)));
  output_multiplier_ = static_cast<float>(rule.output_multiplier());
}

int Transformer::add_probe(const std::string& name, int block, ProbeKind kind, bool has_backward) {
  const int depth = static_cast<int>(probes_.size());
  probes_.push_back(ProbeInfo{name, depth, block, kind, has_backward});
  return depth;
}

std::uint64_t Transformer::dropout_stream(const StepContext& context, int site) const {
  // (a sequence-parallel rank draws its own masks for its own tokens: the ring's are not copies of one another)
  const std::uint64_t ring_rank = sequence_ ? static_cast<std::uint64_t>(sequence_->rank()) << 32 : 0;
  return stream_id("dropout", context.micro_step, static_cast<std::uint64_t>(site + 1) + ring_rank);
}

void Transformer::ensure_buffers(std::int64_t batch, std::int64_t tokens) {
  if (batch == batch_ && tokens == tokens_) return;
  batch_ = batch;
  tokens_ = tokens;
  // This rank's widths: the attention's inner width, hidden units and vocabulary (all of them for one process).
  const std::int64_t r = batch * tokens, d = config_.width, v = tp_.local(config_.vocab), h = local_heads_;
  const std::int64_t f = tp_.local(static_cast<std::int64_t>(config_.ffn_mult) * d), inner = tp_.local(d);
  const bool branch_normed = norms_branch_input(config_.norm), sum_normed = norms_residual_sum(config_.norm);
  const Device device = params_.device();
  AllocationLabel label("the activations of a micro-batch of " + std::to_string(batch) + " x " +
                        std::to_string(tokens) + " tokens");
  stream_.assign(sublayers_.size() + 1, Tensor());
  for (Tensor& x : stream_) x = Tensor::empty({r, d}, DType::f32, device);
  for (std::size_t i = 0; i < sublayers_.size(); ++i) {
    if (!in_stage(i)) continue;  // a pipeline stage keeps only its own sublayers' activations
    Sublayer& s = sublayers_[i];
    const std::int64_t hidden = s.is_attention ? 3 * inner : f;
    s.normed = branch_normed ? Tensor::empty({r, d}, DType::f32, device) : Tensor();
    s.branch_norm_saved = branch_normed ? s.branch_norm.make_saved(r, device) : nn::Norm::Saved{};
    s.sum_norm_saved = sum_normed ? s.sum_norm.make_saved(r, device) : nn::Norm::Saved{};
    s.hidden = Tensor::empty({r, hidden}, DType::f32, device);
    s.probs = s.is_attention && !sequence_ ? Tensor::empty({batch, h, tokens, tokens}, DType::f32, device) : Tensor();
    s.lse = s.is_attention && sequence_ ? Tensor::empty({batch, h, tokens}, DType::f32, device) : Tensor();
    s.mixed = Tensor::empty({r, s.is_attention ? inner : f}, DType::f32, device);
    s.branch = Tensor::empty({r, d}, DType::f32, device);
    s.combined = sum_normed ? Tensor::empty({r, d}, DType::f32, device) : Tensor();
  }
  embedded_ = config_.dropout > 0 ? Tensor::empty({r, d}, DType::f32, device) : Tensor();
  final_ = has_final_norm_ ? Tensor::empty({r, d}, DType::f32, device) : Tensor();
  final_saved_ = has_final_norm_ ? final_norm_.make_saved(r, device) : nn::Norm::Saved{};
  logits_ = Tensor::empty({r, v}, DType::f32, device);
  d_logits_ = Tensor::empty({r, v}, DType::f32, device);
  d_stream_ = Tensor::empty({r, d}, DType::f32, device);
  d_branch_ = Tensor::empty({r, d}, DType::f32, device);
  d_dropped_ = Tensor::empty({r, d}, DType::f32, device);
  d_mixed_ = Tensor::empty({r * std::max(inner, f)}, DType::f32, device);
  d_hidden_ = Tensor::empty({r * std::max(3 * inner, f)}, DType::f32, device);
  d_normed_ = Tensor::empty({r, d}, DType::f32, device);
  d_tmp_ = Tensor::empty({r, d}, DType::f32, device);
}

void Transformer::sublayer_forward(Sublayer& s, const Tensor& x_in, Tensor& x_out, const StepContext& context,
                                   int site) {
  const std::int64_t d = tp_.local(config_.width);
  ProbeSink* sink = context.sink;
  if (sink && s.probe_input >= 0) sink->forward(s.probe_input, x_in, batch_);
  const Tensor* branch_in = &x_in;
  if (norms_branch_input(config_.norm)) {
    const ops::OpMoments normed = gathered_moments(sink, -1, s.probe_norm, false, batch_);
    s.branch_norm.forward(x_in, s.normed, s.branch_norm_saved, &normed);
    branch_in = &s.normed;
    if (sink && !normed.output) sink->forward(s.probe_norm, s.normed, batch_);
  }
  s.in_proj.forward(*branch_in, s.hidden);
  if (s.is_attention) {
    const Tensor qkv = s.hidden.reshape({batch_, tokens_, 3 * d});
    Tensor mixed = s.mixed.reshape({batch_, tokens_, d});
    probe::LogitSums logit_sums;
    if (sequence_)  // (the logits' sums are this rank's queries'; the sink sums them over the ring)
      ring_attention_forward(*sequence_, qkv, local_heads_, logit_scale_, mixed, s.lse, sink ? &logit_sums : nullptr);
    else
      ops::attention_forward(qkv, local_heads_, logit_scale_, s.probs, mixed, sink ? &logit_sums : nullptr);
    if (sink) sink->attention_logits(s.probe_hidden, logit_sums, qkv, local_heads_, logit_scale_);
  } else {
    const ops::OpMoments moments = gathered_moments(sink, s.probe_hidden, s.probe_mixed, false, batch_);
    if (sink && !moments.input) sink->forward(s.probe_hidden, s.hidden, batch_);
    ops::activation_forward(config_.activation, s.hidden, s.mixed, &moments);
    if (sink && !moments.output) sink->forward(s.probe_mixed, s.mixed, batch_);
  }
  if (dropout_active(context)) {
    Tensor projected = d_tmp_;  // free during forward
    tp_.row_linear_forward(s.out_proj, s.mixed, projected);
    ops::dropout_forward(projected, config_.dropout, context.seed, dropout_stream(context, site), s.branch);
  } else {
    tp_.row_linear_forward(s.out_proj, s.mixed, s.branch);
  }
  // The branch and the sum (a norm after it: post, both) or the result (pre, none) summed inside the residual combine.
  const bool post = norms_residual_sum(config_.norm);
  const ops::OpMoments sums =
      gathered_moments(sink, s.probe_branch, post ? s.probe_sum : s.probe_result, false, batch_);
  if (sink && !sums.input) sink->forward(s.probe_branch, s.branch, batch_);
  if (post) {
    s.residual.forward(x_in, s.branch, s.combined, &sums);
    if (sink && !sums.output) sink->forward(s.probe_sum, s.combined, batch_);
    const ops::OpMoments result = gathered_moments(sink, -1, s.probe_result, false, batch_);
    s.sum_norm.forward(s.combined, x_out, s.sum_norm_saved, &result);
    if (sink && !result.output) sink->forward(s.probe_result, x_out, batch_);
  } else {
    s.residual.forward(x_in, s.branch, x_out, &sums);
    if (sink && !sums.output) sink->forward(s.probe_result, x_out, batch_);
  }
}

void Transformer::sublayer_backward(Sublayer& s, const Tensor& x_in, const Tensor& d_out, Tensor& d_in,
                                    const StepContext& context, int site) {
  const std::int64_t r = x_in.dim(0), d = tp_.local(config_.width);
  const std::int64_t f = tp_.local(static_cast<std::int64_t>(config_.ffn_mult) * config_.width);
  ProbeSink* sink = context.sink;
  // The gradient entering the residual combine (the result's, or with a norm after the sum the sum's) and the
  // branch's summed inside its backward.
  const bool post = norms_residual_sum(config_.norm);
  const ops::OpMoments sums = gathered_moments(sink, post ? s.probe_sum : s.probe_result, s.probe_branch, true, batch_);
  const Tensor* d_combined = &d_out;
  if (post) {
    if (sink) sink->backward(s.probe_result, d_out, batch_);
    s.sum_norm.backward(s.combined, s.sum_norm_saved, d_out, d_tmp_);
    d_combined = &d_tmp_;
    if (sink && !sums.input) sink->backward(s.probe_sum, d_tmp_, batch_);
  } else if (sink && !sums.input) {
    sink->backward(s.probe_result, d_out, batch_);
  }
  s.residual.backward(x_in, s.branch, *d_combined, d_in, d_branch_, &sums);
  if (sink && !sums.output) sink->backward(s.probe_branch, d_branch_, batch_);
  const Tensor* d_projected = &d_branch_;
  if (dropout_active(context)) {
    ops::dropout_backward(d_branch_, config_.dropout, context.seed, dropout_stream(context, site), d_dropped_);
    d_projected = &d_dropped_;
  }
  Tensor d_mixed = view_of(d_mixed_, {r, s.is_attention ? d : f});
  Tensor d_hidden = view_of(d_hidden_, {r, s.is_attention ? 3 * d : f});
  s.out_proj.backward(s.mixed, *d_projected, &d_mixed);
  if (s.is_attention) {
    Tensor d_qkv = d_hidden.reshape({batch_, tokens_, 3 * d});
    const Tensor qkv = s.hidden.reshape({batch_, tokens_, 3 * d});
    if (sequence_)
      ring_attention_backward(*sequence_, qkv, s.mixed.reshape({batch_, tokens_, d}), s.lse,
                              d_mixed.reshape({batch_, tokens_, d}), local_heads_, logit_scale_, d_qkv);
    else
      ops::attention_backward(qkv, s.probs, d_mixed.reshape({batch_, tokens_, d}), local_heads_, logit_scale_, d_qkv);
  } else {
    const ops::OpMoments moments = gathered_moments(sink, s.probe_mixed, s.probe_hidden, true, batch_);
    if (sink && !moments.input) sink->backward(s.probe_mixed, d_mixed, batch_);
    ops::activation_backward(config_.activation, s.hidden, d_mixed, d_hidden, &moments);
    if (sink && !moments.output) sink->backward(s.probe_hidden, d_hidden, batch_);
  }
  if (norms_branch_input(config_.norm)) {
    s.in_proj.backward(s.normed, d_hidden, &d_normed_);
    tp_.all_reduce(d_normed_);  // f: the replicated input's gradient sums every rank's features
    if (sink) sink->backward(s.probe_norm, d_normed_, batch_);
    // (d_tmp_ held the sum's gradient under both; the residual's backward above has consumed it)
    s.branch_norm.backward(x_in, s.branch_norm_saved, d_normed_, d_tmp_);
    ops::axpy(1.0f, d_tmp_, d_in);
  } else {
    s.in_proj.backward(x_in, d_hidden, &d_normed_);
    tp_.all_reduce(d_normed_);
    ops::axpy(1.0f, d_normed_, d_in);
  }
  if (sink && s.probe_input >= 0) sink->backward(s.probe_input, d_in, batch_);
}

Tensor Transformer::local_positions() {
  const Tensor& table = position_embedding_->value;
  if (!sequence_) return table;
  const SequenceSplit split = sequence_split(tokens_ * sequence_->size(), sequence_->rank(), sequence_->size());
  if (!position_rows_.defined() || position_rows_.dim(0) != tokens_ || position_rows_.device() != table.device())
    position_rows_ = Tensor::empty({tokens_, table.dim(1)}, DType::f32, table.device());
  for (std::size_t j = 0; j < split.chunks.size(); ++j) {
    Tensor rows = position_rows_.slice(0, static_cast<std::int64_t>(j) * split.chunk, split.chunk);
    rows.copy_from(table.slice(0, split.chunks[j] * split.chunk, split.chunk));
  }
  return position_rows_;
}

void Transformer::embed_forward(const Tensor& tokens, const StepContext& context) {
  Tensor& x0 = stream_[0];
  const std::int64_t d = config_.width;
  const bool drop = dropout_active(context);
  Tensor target = (drop ? embedded_ : x0).reshape({batch_, tokens_, d});
  tp_.embedding_forward(tokens, *token_embedding_, local_positions(), config_.vocab, target);
  if (drop) ops::dropout_forward(embedded_, config_.dropout, context.seed, dropout_stream(context, -1), x0);
  if (context.sink) context.sink->forward(probe_embed_, x0, batch_);
}

double Transformer::head_forward(const Batch& batch, float grad_scale, const StepContext& context) {
  ProbeSink* sink = context.sink;
  const Tensor* head_in = &stream_.back();
  if (has_final_norm_) {
    const ops::OpMoments final_sums = gathered_moments(sink, -1, probe_final_, false, batch_);
    final_norm_.forward(stream_.back(), final_, final_saved_, &final_sums);
    head_in = &final_;
    if (sink && !final_sums.output) sink->forward(probe_final_, final_, batch_);
  }
  const Tensor& head_weight = config_.tie_embeddings ? token_embedding_->value : readout_.weight->value;
  ops::linear_forward(*head_in, head_weight, nullptr, logits_);
  if (output_multiplier_ != 1.0f) ops::scale(logits_, output_multiplier_);
  if (sink) sink->forward(probe_logits_, logits_, batch_);
  const Tensor targets = batch.targets.reshape({batch_ * tokens_});
  return tp_.cross_entropy(logits_, targets, grad_scale != 0.0f ? &d_logits_ : nullptr, grad_scale);
}

void Transformer::head_backward(const StepContext& context) {
  ProbeSink* sink = context.sink;
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
}

void Transformer::embed_backward(const Tensor& tokens, const StepContext& context) {
  if (context.sink) context.sink->backward(probe_embed_, d_stream_, batch_);
  const Tensor* d_embedded = &d_stream_;
  if (dropout_active(context)) {
    ops::dropout_backward(d_stream_, config_.dropout, context.seed, dropout_stream(context, -1), d_tmp_);
    d_embedded = &d_tmp_;
  }
  const std::int64_t d = config_.width;
  Tensor& table = position_embedding_->grad;
  if (!sequence_) {
    tp_.embedding_backward(tokens, d_embedded->reshape({batch_, tokens_, d}), *token_embedding_, table);
    return;
  }
  // A ring rank's tokens: their rows' gradient, added into the table's rows chunk by chunk.
  const SequenceSplit split = sequence_split(tokens_ * sequence_->size(), sequence_->rank(), sequence_->size());
  Tensor d_rows = Tensor::zeros({tokens_, d}, DType::f32, table.device());
  tp_.embedding_backward(tokens, d_embedded->reshape({batch_, tokens_, d}), *token_embedding_, d_rows);
  for (std::size_t j = 0; j < split.chunks.size(); ++j) {
    Tensor rows = table.slice(0, split.chunks[j] * split.chunk, split.chunk);
    ops::axpy(1.0f, d_rows.slice(0, static_cast<std::int64_t>(j) * split.chunk, split.chunk), rows);
  }
}

void Transformer::check_tokens(const Tensor& tokens) const {
  const std::int64_t ring = sequence_ ? sequence_->size() : 1;
  PROPLAB_CHECK(tokens.ndim() == 2 && tokens.dim(1) * ring <= config_.seq_len, "transformer input shape ",
                shape_string(tokens.shape()), " (", ring, " sequence-parallel ranks)");
}

double Transformer::forward_backward(const Batch& batch, float grad_scale, const StepContext& context) {
  const Tensor& tokens = batch.inputs;
  check_tokens(tokens);
  ensure_buffers(tokens.dim(0), tokens.dim(1));

  // Forward.
  embed_forward(tokens, context);
  for (std::size_t i = 0; i < sublayers_.size(); ++i)
    sublayer_forward(sublayers_[i], stream_[i], stream_[i + 1], context, static_cast<int>(i));
  const double loss = head_forward(batch, grad_scale, context);
  if (grad_scale == 0.0f) return loss;

  // Backward.
  head_backward(context);
  // (A tied head's gradient goes to the token embedding, parameter 0, which is final only at the end.)
  if (context.gradients) context.gradients->gradients_final_from(head_first_param_);
  for (std::size_t i = sublayers_.size(); i-- > 0;) {
    sublayer_backward(sublayers_[i], stream_[i], d_stream_, d_stream_, context, static_cast<int>(i));
    if (context.gradients) context.gradients->gradients_final_from(sublayers_[i].first_param);
  }
  embed_backward(tokens, context);
  return loss;
}

double Transformer::evaluate(const Batch& batch) {
  StepContext context;
  context.training = false;
  context.sink = nullptr;
  return forward_backward(batch, 0.0f, context);
}

double Transformer::train_flops(std::int64_t samples) const {
  const double d = config_.width, f = static_cast<double>(config_.ffn_mult) * d, t = config_.seq_len, v = config_.vocab;
  // Forward multiply-adds per token: QKV, output projection, FFN in/out, attention scores and mixing (full T per
  // query, the usual convention), and the head; backward costs twice the forward.
  const double per_layer = 3 * d * d + d * d + 2 * d * f + 2 * t * d;
  const double forward_per_token = 2.0 * (config_.layers * per_layer + d * v);
  return 3.0 * forward_per_token * t * static_cast<double>(samples);
}

}  // namespace proplab
