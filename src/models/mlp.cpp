#include "models/mlp.h"

#include "core/device.h"
#include "models/gather.h"

namespace proplab {

Mlp::Mlp(const MlpConfig& config, const ScalingConfig& scaling, std::uint64_t seed)
    : Mlp(config, *make_rule(scaling, ModelConfig(config)), seed) {}

Mlp::Mlp(const MlpConfig& config, const ScalingRule& rule, std::uint64_t seed) : config_(config) {
  for (int l = 0; l < config.layers; ++l) {
    const std::int64_t in = l == 0 ? config.input_dim : config.width;
    layers_.push_back(nn::Linear::create(params_, "layers." + std::to_string(l), in, config.width,
                                         l == 0 ? ParamRole::mlp_input : ParamRole::mlp_hidden, true, l));
    if (config.residual && l > 0)
      residuals_.push_back(
          ResidualSite::create(params_, "layers." + std::to_string(l), rule.residual(l, Branch::mlp), l));
  }
  readout_ = nn::Linear::create(params_, "readout", config.width, config.outputs, ParamRole::readout, true, -1);
  auto add_probe = [&](const std::string& name, int block, ProbeKind kind) {
    probes_.push_back(ProbeInfo{name, static_cast<int>(probes_.size()), block, kind, true});
    return static_cast<int>(probes_.size()) - 1;
  };
  for (int l = 0; l < config.layers; ++l) {
    const std::string prefix = "layers." + std::to_string(l);
    probe_pre_.push_back(add_probe(prefix + ".preact", l, ProbeKind::preact));
    probe_post_.push_back(add_probe(prefix + ".postact", l, ProbeKind::postact));
    probe_out_.push_back(config.residual && l > 0 ? add_probe(prefix + ".out", l, ProbeKind::residual) : -1);
  }
  probe_readout_ = add_probe("readout.out", -1, ProbeKind::logits);
  params_.init(rule, seed);
  for (const ResidualSite& site : residuals_) site.init_values();
  output_multiplier_ = static_cast<float>(rule.output_multiplier());
}

void Mlp::ensure_buffers(std::int64_t rows) {
  if (rows == rows_) return;
  rows_ = rows;
  const std::int64_t w = config_.width;
  const Device device = params_.device();
  AllocationLabel label("the activations of a micro-batch of " + std::to_string(rows) + " samples");
  pre_.assign(config_.layers, Tensor());
  post_.assign(config_.layers, Tensor());
  hidden_.assign(config_.layers, Tensor());
  for (int l = 0; l < config_.layers; ++l) {
    pre_[l] = Tensor::empty({rows, w}, DType::f32, device);
    post_[l] = Tensor::empty({rows, w}, DType::f32, device);
    hidden_[l] = config_.residual && l > 0 ? Tensor::empty({rows, w}, DType::f32, device) : post_[l];
  }
  output_ = Tensor::empty({rows, config_.outputs}, DType::f32, device);
  d_output_ = Tensor::empty({rows, config_.outputs}, DType::f32, device);
  d_hidden_ = Tensor::empty({rows, w}, DType::f32, device);
  d_post_ = Tensor::empty({rows, w}, DType::f32, device);
  d_pre_ = Tensor::empty({rows, w}, DType::f32, device);
}

double Mlp::forward_backward(const Batch& batch, float grad_scale, const StepContext& context) {
  const Tensor& x = batch.inputs;
  PROPLAB_CHECK(x.ndim() == 2 && x.dim(1) == config_.input_dim, "mlp input shape ", shape_string(x.shape()));
  ensure_buffers(x.dim(0));
  const int layers = config_.layers;
  // Samples are independent sequences of one token each.
  const std::int64_t rows = x.dim(0);
  ProbeSink* sink = context.sink;
  for (int l = 0; l < layers; ++l) {
    layers_[l].forward(l == 0 ? x : hidden_[l - 1], pre_[l]);
    const ops::OpMoments moments = gathered_moments(sink, probe_pre_[l], probe_post_[l], false, rows);
    if (sink && !moments.input) sink->forward(probe_pre_[l], pre_[l], rows);
    ops::activation_forward(config_.activation, pre_[l], post_[l], &moments);
    if (sink && !moments.output) sink->forward(probe_post_[l], post_[l], rows);
    if (config_.residual && l > 0) {
      const ops::OpMoments sums = gathered_moments(sink, -1, probe_out_[l], false, rows);
      residuals_[l - 1].forward(hidden_[l - 1], post_[l], hidden_[l], &sums);
      if (sink && !sums.output) sink->forward(probe_out_[l], hidden_[l], rows);
    }
  }
  readout_.forward(hidden_[layers - 1], output_);
  if (output_multiplier_ != 1.0f) ops::scale(output_, output_multiplier_);
  if (sink) sink->forward(probe_readout_, output_, rows);
  const bool backward = grad_scale != 0.0f;
  Tensor* d_output = backward ? &d_output_ : nullptr;
  const double loss =
      config_.head == MlpHead::regression
          ? ops::mse_loss(output_, batch.targets, d_output, grad_scale)
          : ops::softmax_cross_entropy(output_, batch.targets.reshape({x.dim(0)}), d_output, grad_scale);
  if (!backward) return loss;

  if (sink) sink->backward(probe_readout_, d_output_, rows);
  if (output_multiplier_ != 1.0f) ops::scale(d_output_, output_multiplier_);
  readout_.backward(hidden_[layers - 1], d_output_, &d_hidden_);
  for (int l = layers - 1; l >= 0; --l) {
    // d_hidden_ holds dL/dh_l.
    const Tensor* d_post = &d_hidden_;
    if (config_.residual && l > 0) {
      const ops::OpMoments sums = gathered_moments(sink, probe_out_[l], -1, true, rows);
      if (sink && !sums.input) sink->backward(probe_out_[l], d_hidden_, rows);
      residuals_[l - 1].backward(hidden_[l - 1], post_[l], d_hidden_, d_hidden_, d_post_, &sums);
      d_post = &d_post_;
    }
    const ops::OpMoments moments = gathered_moments(sink, probe_post_[l], probe_pre_[l], true, rows);
    if (sink && !moments.input) sink->backward(probe_post_[l], *d_post, rows);
    ops::activation_backward(config_.activation, pre_[l], *d_post, d_pre_, &moments);
    if (sink && !moments.output) sink->backward(probe_pre_[l], d_pre_, rows);
    if (l == 0) {
      layers_[0].backward(x, d_pre_, nullptr);
    } else if (config_.residual) {
      layers_[l].backward(hidden_[l - 1], d_pre_, &d_post_);
      ops::axpy(1.0f, d_post_, d_hidden_);
    } else {
      layers_[l].backward(hidden_[l - 1], d_pre_, &d_hidden_);
    }
  }
  return loss;
}

double Mlp::evaluate(const Batch& batch) { return forward_backward(batch, 0.0f, StepContext{}); }

double Mlp::train_flops(std::int64_t samples) const {
  const double w = config_.width;
  const double forward = 2.0 * (config_.input_dim * w + (config_.layers - 1) * w * w + w * config_.outputs);
  return 3.0 * forward * static_cast<double>(samples);
}

}  // namespace proplab
