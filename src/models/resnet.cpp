#include "models/resnet.h"

#include <algorithm>

#include "core/device.h"
#include "core/parallel.h"
#include "models/gather.h"

namespace proplab {

namespace {

// A view of the first numel(shape) elements of a flat scratch tensor, with the given shape.
Tensor view_of(const Tensor& flat, const Shape& shape) { return flat.slice(0, 0, shape_numel(shape)).reshape(shape); }

ModelConfig resnet_shape(const ResnetConfig& config) {
  const ModelConfig shape(config);
  return shape;
}

// x += b (a learnable scalar bias).
void add_scalar(Tensor& x, const Parameter& bias) {
  const float b = bias.value.f32()[0];
  float* data = x.f32();
  const std::int64_t n = x.numel();
#pragma omp parallel for simd schedule(static) if (n > (1 << 15))
  for (std::int64_t i = 0; i < n; ++i) data[i] += b;
}

// bias.grad += Σ d_y (fixed chunks combined in order: thread-count independent).
void add_scalar_grad(const Tensor& d_y, Parameter& bias) {
  const float* d = d_y.f32();
  const double sum = chunked_sum(d_y.numel(), [d](std::int64_t begin, std::int64_t end) {
    double s = 0.0;
    for (std::int64_t i = begin; i < end; ++i) s += d[i];
    return s;
  });
  bias.grad.f32()[0] += static_cast<float>(sum);
}

}  // namespace

Resnet::Resnet(const ResnetConfig& config, const ScalingConfig& scaling, std::uint64_t seed)
    : Resnet(config, *make_rule(scaling, resnet_shape(config)), seed) {}

Resnet::Resnet(const ResnetConfig& config, const ScalingRule& rule, std::uint64_t seed)
    : config_(config), layout_(resnet_util::layout(config)) {
  build(rule, seed);
}

Resnet::Conv Resnet::make_conv(const std::string& name, std::int64_t in, std::int64_t out, int kernel, int stride,
                               ParamRole role, int block, bool reads_activation) {
  Conv conv;
  conv.weight = &params_.add(name + ".weight", {out, in, kernel, kernel}, role, in * kernel * kernel,
                             out * kernel * kernel, block);
  conv.params = ops::Conv2dParams{stride, kernel / 2, 1};
  if (spec_.weight_standardization) {
    conv.ws_gain = &params_.add(name + ".ws_gain", {out}, ParamRole::norm_gain, in * kernel * kernel, out, block);
    conv.ws_scale = reads_activation ? static_cast<float>(spec_.activation_gain) : 1.0f;
    conv.w_hat = Tensor::empty(conv.weight->value.shape());
    conv.d_w_hat = Tensor::empty(conv.weight->value.shape());
    conv.ws_mean = Tensor::empty({out});
    conv.ws_rstd = Tensor::empty({out});
  }
  return conv;
}

Resnet::Norm Resnet::make_norm(const std::string& name, std::int64_t channels, int block) {
  Norm norm;
  norm.name = name;
  if (config_.norm == ResnetNorm::none) return norm;
  norm.gamma = &params_.add(name + ".weight", {channels}, ParamRole::norm_gain, channels, channels, block);
  norm.beta = &params_.add(name + ".bias", {channels}, ParamRole::norm_bias, channels, channels, block);
  norm.running_mean = Tensor::zeros({channels});
  norm.running_var = Tensor::zeros({channels});
  norm.running_var.fill(1.0f);
  norm.mean = Tensor::empty({channels});
  norm.rstd = Tensor::empty({channels});
  return norm;
}

void Resnet::build(const ScalingRule& rule, std::uint64_t seed) {
  PROPLAB_CHECK(config_.width >= 1 && config_.in_channels >= 1 && config_.classes >= 1 && config_.image_size >= 1,
                "resnet config: width, in_channels, classes and image_size must be >= 1");
  spec_ = rule.resnet();
  const bool preact = config_.preact;
  const std::int64_t base = 16 * static_cast<std::int64_t>(config_.width);
  const bool basic = config_.block == ResnetBlock::basic;
  const std::int64_t expansion = basic ? 1 : 4;
  std::int64_t size = config_.image_size;
  double flops = 0.0;
  auto count_conv = [&](std::int64_t in, std::int64_t out, int kernel, std::int64_t out_size) {
    flops += 2.0 * static_cast<double>(in * kernel * kernel * out * out_size * out_size);
  };

  stem_ = make_conv("stem.conv", config_.in_channels, base, 3, 1, ParamRole::conv_stem, -1, false);
  count_conv(config_.in_channels, base, 3, size);
  if (spec_.scalar_biases) stem_bias_ = &params_.add("stem.bias", {1}, ParamRole::bias, 1, 1, -1);
  if (!preact) stem_norm_ = make_norm("stem.norm", base, -1);
  auto add_scalar_bias = [&](const std::string& name, int block) {
    return &params_.add(name, {1}, ParamRole::bias, 1, 1, block);
  };

  std::int64_t channels = base;
  for (int b = 0; b < layout_.blocks(); ++b) {
    Block k;
    k.stage = layout_.stage(b);
    const std::string prefix = "blocks." + std::to_string(b);
    const std::int64_t width = base << k.stage;  // the branch's inner width
    const std::int64_t out = width * expansion;
    const int stride = layout_.transition(b) ? 2 : 1;
    k.projection = layout_.projection(b);
    PROPLAB_CHECK(k.projection == (stride != 1 || channels != out), "resnet block ", b,
                  ": a projection shortcut exactly where the shape changes");
    k.input_scale = static_cast<float>(rule.resnet_block(b).input_scale);
    const std::int64_t out_size = ops::conv2d_out_size(size, 3, stride, 1);
    struct ConvShape {
      std::int64_t in, out;
      int kernel, stride;
    };
    std::vector<ConvShape> shapes;
    if (basic)
      shapes = {{channels, width, 3, stride}, {width, width, 3, 1}};
    else
      shapes = {{channels, width, 1, 1}, {width, width, 3, stride}, {width, out, 1, 1}};
    const int m = static_cast<int>(shapes.size());
    std::int64_t conv_size = size;
    for (int j = 0; j < m; ++j) {
      const std::string name = prefix + ".conv" + std::to_string(j);
      // Pre-activation: norm j normalises conv j's input; post-activation: conv j's output.
      if (preact) k.norms.push_back(make_norm(prefix + ".norm" + std::to_string(j), shapes[j].in, b));
      // Every branch conv reads an activation's output (pre-activation: act(norm(·)); post-activation: the
      // stream, itself an activation's output, or act(n_{j-1})): weight standardisation scales it by the gain.
      k.convs.push_back(make_conv(name, shapes[j].in, shapes[j].out, shapes[j].kernel, shapes[j].stride,
                                  j == m - 1 ? ParamRole::conv_branch_out : ParamRole::conv_branch, b, true));
      if (!preact) k.norms.push_back(make_norm(prefix + ".norm" + std::to_string(j), shapes[j].out, b));
      if (spec_.scalar_biases) {
        k.bias_in.push_back(add_scalar_bias(name + ".bias_in", b));
        k.bias_out.push_back(add_scalar_bias(name + ".bias_out", b));
      }
      conv_size = ops::conv2d_out_size(conv_size, shapes[j].kernel, shapes[j].stride, shapes[j].kernel / 2);
      count_conv(shapes[j].in, shapes[j].out, shapes[j].kernel, conv_size);
    }
    if (k.projection) {
      k.shortcut = make_conv(prefix + ".shortcut.conv", channels, out, 1, stride, ParamRole::conv_shortcut, b, true);
      if (!preact) k.shortcut_norm = make_norm(prefix + ".shortcut.norm", out, b);
      count_conv(channels, out, 1, out_size);
    }
    k.residual = ResidualSite::create(params_, prefix, rule.residual(b, Branch::ffn), b);
    blocks_.push_back(std::move(k));
    channels = out;
    size = out_size;
  }
  final_channels_ = channels;
  if (preact) final_norm_ = make_norm("final_norm", channels, -1);
  classifier_ = nn::Linear::create(params_, "head", channels, config_.classes, ParamRole::readout, true, -1);
  flops += 2.0 * static_cast<double>(channels * config_.classes);
  forward_flops_per_sample_ = flops;

  probe_stem_ = add_probe("stem.out", -1, ProbeKind::embed);
  for (int b = 0; b < layout_.blocks(); ++b) {
    const std::string prefix = "blocks." + std::to_string(b);
    blocks_[b].probe_in = add_probe(prefix + ".in", b, ProbeKind::residual);
    blocks_[b].probe_branch = add_probe(prefix + ".branch", b, ProbeKind::branch);
    blocks_[b].probe_out = add_probe(prefix + ".out", b, ProbeKind::residual);
  }
  probe_logits_ = add_probe("head.logits", -1, ProbeKind::logits);

  params_.init(rule, seed);
  for (const Block& k : blocks_) k.residual.init_values();
}

std::vector<BlockInfo> Resnet::block_layout() const {
  std::vector<BlockInfo> out;
  for (int b = 0; b < layout_.blocks(); ++b) out.push_back(BlockInfo{layout_.stage(b), layout_.transition(b)});
  return out;
}

int Resnet::add_probe(const std::string& name, int block, ProbeKind kind) {
  const int depth = static_cast<int>(probes_.size());
  probes_.push_back(ProbeInfo{name, depth, block, kind, true});
  return depth;
}

std::vector<Tensor*> Resnet::running_statistics() {
  std::vector<Tensor*> out;
  for (auto& [name, tensor] : buffers()) out.push_back(tensor);
  return out;
}

std::vector<std::pair<std::string, Tensor*>> Resnet::buffers() {
  std::vector<std::pair<std::string, Tensor*>> out;
  auto add = [&](Norm& norm) {
    if (!norm.gamma) return;
    out.emplace_back(norm.name + ".running_mean", &norm.running_mean);
    out.emplace_back(norm.name + ".running_var", &norm.running_var);
  };
  add(stem_norm_);
  for (Block& k : blocks_) {
    for (Norm& norm : k.norms) add(norm);
    add(k.shortcut_norm);
  }
  add(final_norm_);
  return out;
}

void Resnet::to_device(Device device) {
  if (device != Device::cpu &&
      (stem_bias_ != nullptr || std::any_of(blocks_.begin(), blocks_.end(),
                                            [](const Block& k) { return !k.bias_in.empty() || !k.bias_out.empty(); })))
    throw UserError(std::string("device.type = \"") + device_name(device) +
                    "\": the scalar biases of scaling.rule = \"fixup\" do not train on it in this version; "
                    "allowed with fixup: \"cpu\"");
  params_.to_device(device);
  auto move_conv = [&](Conv& conv) {
    if (!conv.ws_gain) return;
    conv.w_hat = Tensor::empty(conv.w_hat.shape(), DType::f32, device);
    conv.d_w_hat = Tensor::empty(conv.d_w_hat.shape(), DType::f32, device);
    conv.ws_mean = Tensor::empty(conv.ws_mean.shape(), DType::f32, device);
    conv.ws_rstd = Tensor::empty(conv.ws_rstd.shape(), DType::f32, device);
  };
  auto move_norm = [&](Norm& norm) {
    if (!norm.gamma) return;
    norm.running_mean = norm.running_mean.to(device);
    norm.running_var = norm.running_var.to(device);
    norm.mean = Tensor::empty(norm.mean.shape(), DType::f32, device);
    norm.rstd = Tensor::empty(norm.rstd.shape(), DType::f32, device);
  };
  move_conv(stem_);
  move_norm(stem_norm_);
  for (Block& k : blocks_) {
    for (Conv& conv : k.convs) move_conv(conv);
    for (Norm& norm : k.norms) move_norm(norm);
    if (k.projection) move_conv(k.shortcut);
    move_norm(k.shortcut_norm);
  }
  move_norm(final_norm_);
  batch_ = 0;  // activations are reallocated on the device
}

Tensor Resnet::scratch(int which, const Shape& shape) const { return view_of(scratch_[which], shape); }

void Resnet::ensure_buffers(std::int64_t batch) {
  if (batch == batch_) return;
  batch_ = batch;
  const bool preact = config_.preact;
  const std::int64_t n = batch;
  const Device device = params_.device();
  AllocationLabel label("the activations of a micro-batch of " + std::to_string(batch) + " images");
  max_numel_ = 0;
  auto image = [&](std::int64_t channels, std::int64_t size) {
    max_numel_ = std::max(max_numel_, n * channels * size * size);
    return Tensor::empty({n, channels, size, size}, DType::f32, device);
  };
  auto normed_of = [&](const Norm& norm, const Tensor& input) {
    return norm.gamma ? Tensor::empty(input.shape(), DType::f32, device) : input;
  };
  std::int64_t size = config_.image_size;
  stem_out_ = image(stem_.weight->value.dim(0), size);
  Tensor stream = stem_out_;
  if (!preact) {
    stem_normed_ = normed_of(stem_norm_, stem_out_);
    stem_act_ = Tensor::empty(stem_out_.shape(), DType::f32, device);
    stream = stem_act_;
  }
  for (Block& k : blocks_) {
    const int m = static_cast<int>(k.convs.size());
    const bool biased = !k.bias_in.empty();
    k.scaled = k.input_scale != 1.0f ? Tensor::empty(stream.shape(), DType::f32, device) : stream;
    k.conv_in.assign(m, Tensor());
    k.conv_out.assign(m, Tensor());
    k.normed.assign(m, Tensor());
    k.activated.assign(m, Tensor());
    Tensor cur = k.scaled;
    for (int j = 0; j < m; ++j) {
      Tensor input = cur;
      if (preact) {
        k.normed[j] = normed_of(k.norms[j], cur);
        k.activated[j] = Tensor::empty(cur.shape(), DType::f32, device);
        input = k.activated[j];
      }
      k.conv_in[j] = biased ? Tensor::empty(input.shape(), DType::f32, device) : input;
      const Conv& conv = k.convs[j];
      size = ops::conv2d_out_size(input.dim(2), conv.weight->value.dim(2), conv.params.stride, conv.params.padding);
      k.conv_out[j] = image(conv.weight->value.dim(0), size);
      if (preact) {
        cur = k.conv_out[j];
      } else {
        k.normed[j] = normed_of(k.norms[j], k.conv_out[j]);
        if (j < m - 1) {
          k.activated[j] = Tensor::empty(k.conv_out[j].shape(), DType::f32, device);
          cur = k.activated[j];
        }
      }
    }
    const Tensor& branch = preact ? k.conv_out[m - 1] : k.normed[m - 1];
    if (k.projection) {
      k.shortcut_out = Tensor::empty(branch.shape(), DType::f32, device);
      k.shortcut_normed = normed_of(k.shortcut_norm, k.shortcut_out);
    }
    if (!preact) k.sum = Tensor::empty(branch.shape(), DType::f32, device);
    k.out = Tensor::empty(branch.shape(), DType::f32, device);
    stream = k.out;
  }
  if (preact) {
    final_normed_ = normed_of(final_norm_, stream);
    final_act_ = Tensor::empty(stream.shape(), DType::f32, device);
  }
  pooled_ = Tensor::empty({n, final_channels_}, DType::f32, device);
  d_pooled_ = Tensor::empty({n, final_channels_}, DType::f32, device);
  logits_ = Tensor::empty({n, config_.classes}, DType::f32, device);
  d_logits_ = Tensor::empty({n, config_.classes}, DType::f32, device);
  scratch_.assign(6, Tensor());
  for (Tensor& t : scratch_) t = Tensor::empty({max_numel_}, DType::f32, device);
  probe_buffer_ = Tensor::empty({max_numel_}, DType::f32, device);
}

void Resnet::conv_forward(Conv& conv, const Tensor& x, Tensor& y) const {
  if (conv.ws_gain)
    ops::weight_standardize_forward(conv.weight->value, &conv.ws_gain->value, conv.ws_scale, 1e-4f, conv.w_hat,
                                    conv.ws_mean, conv.ws_rstd);
  ops::conv2d_forward(x, conv.used_weight(), nullptr, conv.params, y);
}

void Resnet::conv_backward(Conv& conv, const Tensor& x, const Tensor& d_y, Tensor* d_x) const {
  if (!conv.ws_gain) {
    ops::conv2d_backward(x, conv.weight->value, d_y, conv.params, d_x, conv.weight->grad, nullptr);
    return;
  }
  ops::zero(conv.d_w_hat);
  ops::conv2d_backward(x, conv.w_hat, d_y, conv.params, d_x, conv.d_w_hat, nullptr);
  ops::weight_standardize_backward(conv.weight->value, &conv.ws_gain->value, conv.ws_scale, conv.ws_mean, conv.ws_rstd,
                                   conv.d_w_hat, conv.weight->grad, &conv.ws_gain->grad);
}

void Resnet::norm_forward(Norm& norm, const Tensor& x, Tensor& y, bool training) const {
  if (!norm.gamma) return;  // y aliases x
  ops::batchnorm_forward(x, &norm.gamma->value, &norm.beta->value, config_.norm_eps, training, config_.bn_momentum,
                         norm.running_mean, norm.running_var, y, norm.mean, norm.rstd);
}

void Resnet::norm_backward(Norm& norm, const Tensor& x, const Tensor& d_y, Tensor& d_x, bool training) const {
  if (!norm.gamma) {
    if (d_x.raw() != d_y.raw()) d_x.copy_from(d_y);
    return;
  }
  ops::batchnorm_backward(x, &norm.gamma->value, norm.mean, norm.rstd, d_y, training, d_x, &norm.gamma->grad,
                          &norm.beta->grad);
}

bool Resnet::fuses_norm_act(const Norm& norm) const {
  return norm.gamma != nullptr && config_.activation == Activation::relu;
}

void Resnet::norm_act_forward(Norm& norm, const Tensor& x, Tensor& normed, Tensor& activated, bool training) const {
  if (fuses_norm_act(norm)) {
    ops::batchnorm_relu_forward(x, &norm.gamma->value, &norm.beta->value, config_.norm_eps, training,
                                config_.bn_momentum, norm.running_mean, norm.running_var, activated, norm.mean,
                                norm.rstd);
    return;
  }
  norm_forward(norm, x, normed, training);
  ops::activation_forward(config_.activation, normed, activated);
}

void Resnet::norm_act_backward(Norm& norm, const Tensor& x, const Tensor& normed, const Tensor& activated, Tensor& d,
                               bool training) const {
  if (fuses_norm_act(norm)) {
    ops::batchnorm_relu_backward(x, &norm.gamma->value, norm.mean, norm.rstd, activated, d, training, d,
                                 &norm.gamma->grad, &norm.beta->grad);
    return;
  }
  ops::activation_backward(config_.activation, normed, d, d);
  norm_backward(norm, x, d, d, training);
}

namespace {

// gathered_moments for an op on NCHW images shaped like `like`, one sequence per image: taken on the CPU only (a GPU
// image probe goes through Resnet::record()).
ops::OpMoments gathered_images(ProbeSink* sink, int input_probe, int output_probe, bool backward, const Tensor& like) {
  if (like.device() != Device::cpu || like.ndim() != 4) return ops::OpMoments{};
  return gathered_moments(sink, input_probe, output_probe, backward, like.dim(0));
}

}  // namespace

void Resnet::record(ProbeSink* sink, int probe, const Tensor& x, bool backward) {
  if (!sink) return;
  if (x.ndim() == 4 && sink->image(probe, x, backward)) return;
  Tensor view = x;
  if (x.ndim() == 4) {
    view = view_of(probe_buffer_, {x.dim(0), x.dim(2) * x.dim(3), x.dim(1)});
    ops::nchw_to_nhwc(x, view);
  }
  if (backward)
    sink->backward(probe, view, batch_);
  else
    sink->forward(probe, view, batch_);
}

void Resnet::block_forward(Block& k, const Tensor& x, bool training, ProbeSink* sink) {
  const bool preact = config_.preact;
  const Activation act = config_.activation;
  const int m = static_cast<int>(k.convs.size());
  // Post-activation BatchNorm + ReLU blocks off the recorded steps: the branch's BatchNorm, the sum and the ReLU in
  // one pass (ops::batchnorm_residual_relu_forward), k.normed[m − 1] unwritten. The backward reads the branch only
  // for a learnable λ or β, so those keep the separate ops, as a recorded step does for the branch's probe; the
  // results are bitwise the same either way.
  const bool fused_end = !preact && act == Activation::relu && sink == nullptr && fuses_norm_act(k.norms[m - 1]) &&
                         k.residual.lambda_param == nullptr && k.residual.beta_param == nullptr;
  record(sink, k.probe_in, x, false);
  if (k.input_scale != 1.0f) {
    k.scaled.copy_from(x);
    ops::scale(k.scaled, k.input_scale);
  }
  Tensor cur = k.scaled;
  for (int j = 0; j < m; ++j) {
    Tensor input = cur;
    if (preact) {
      norm_act_forward(k.norms[j], cur, k.normed[j], k.activated[j], training);
      input = k.activated[j];
    }
    if (!k.bias_in.empty()) {
      k.conv_in[j].copy_from(input);
      add_scalar(k.conv_in[j], *k.bias_in[j]);
    }
    conv_forward(k.convs[j], k.conv_in[j], k.conv_out[j]);
    if (!k.bias_out.empty()) add_scalar(k.conv_out[j], *k.bias_out[j]);
    if (preact) {
      cur = k.conv_out[j];
    } else if (j < m - 1) {
      norm_act_forward(k.norms[j], k.conv_out[j], k.normed[j], k.activated[j], training);
      cur = k.activated[j];
    } else if (!fused_end) {
      norm_forward(k.norms[j], k.conv_out[j], k.normed[j], training);  // the branch: no activation
    }
  }
  const Tensor& branch = preact ? k.conv_out[m - 1] : k.normed[m - 1];
  // The branch and the block's output summed inside the residual combine where it is one op (on the CPU).
  const bool gather = preact || act == Activation::relu;
  const ops::OpMoments sums =
      gather ? gathered_images(sink, k.probe_branch, k.probe_out, false, branch) : ops::OpMoments{};
  if (!sums.input) record(sink, k.probe_branch, branch, false);
  if (k.projection) {
    conv_forward(k.shortcut, preact ? k.conv_in[0] : k.scaled, k.shortcut_out);
    norm_forward(k.shortcut_norm, k.shortcut_out, k.shortcut_normed, training);
  }
  const Tensor& shortcut = k.projection ? k.shortcut_normed : x;
  if (fused_end) {
    Norm& norm = k.norms[m - 1];
    ops::batchnorm_residual_relu_forward(k.conv_out[m - 1], &norm.gamma->value, &norm.beta->value, config_.norm_eps,
                                         training, config_.bn_momentum, norm.running_mean, norm.running_var, shortcut,
                                         k.residual.current_lambda(), k.residual.current_beta(), k.out, norm.mean,
                                         norm.rstd);
  } else if (preact) {
    k.residual.forward(shortcut, branch, k.out, &sums);
  } else if (act == Activation::relu) {
    k.residual.forward_relu(shortcut, branch, k.out, &sums);  // one pass; k.sum stays unwritten
  } else {
    k.residual.forward(shortcut, branch, k.sum);
    ops::activation_forward(act, k.sum, k.out);
  }
  if (!sums.output) record(sink, k.probe_out, k.out, false);
}

void Resnet::block_backward(Block& k, const Tensor& x, Tensor& d_out, Tensor& d_x, bool training, ProbeSink* sink) {
  const bool preact = config_.preact;
  const Activation act = config_.activation;
  const int m = static_cast<int>(k.convs.size());
  // The gradients of the block's output and of the branch summed inside the residual combine's backward where it is
  // one op (on the CPU).
  const bool gather = preact || act == Activation::relu;
  const ops::OpMoments sums =
      gather ? gathered_images(sink, k.probe_out, k.probe_branch, true, d_out) : ops::OpMoments{};
  if (!sums.input) record(sink, k.probe_out, d_out, true);
  Tensor d_shortcut = scratch(2, k.out.shape());
  Tensor d = scratch(3, k.out.shape());
  const Tensor& branch = preact ? k.conv_out[m - 1] : k.normed[m - 1];
  const Tensor& shortcut = k.projection ? k.shortcut_normed : x;
  if (!preact && act == Activation::relu) {
    k.residual.backward_relu(shortcut, branch, k.out, d_out, d_shortcut, d, &sums);  // d_out becomes dL/d sum
  } else {
    if (!preact) ops::activation_backward(act, k.sum, d_out, d_out);  // now dL/d sum
    k.residual.backward(shortcut, branch, d_out, d_shortcut, d, &sums);
  }
  if (!sums.output) record(sink, k.probe_branch, d, true);
  int buffer = 3;  // which scratch buffer holds d
  for (int j = m - 1; j >= 0; --j) {
    if (!preact) {
      // d: dL/d normed[j] (the branch output for j = m − 1, else dL/d activated[j] until the activation below).
      if (j < m - 1)
        norm_act_backward(k.norms[j], k.conv_out[j], k.normed[j], k.activated[j], d, training);
      else
        norm_backward(k.norms[j], k.conv_out[j], d, d, training);
    }
    // d: dL/d conv_out[j].
    if (!k.bias_out.empty()) add_scalar_grad(d, *k.bias_out[j]);
    buffer = buffer == 3 ? 4 : 3;
    Tensor d_in = scratch(buffer, k.conv_in[j].shape());
    conv_backward(k.convs[j], k.conv_in[j], d, &d_in);
    if (preact && j == 0 && k.projection) {
      // The pre-activation shortcut reads conv 0's input too.
      Tensor d_from_shortcut = scratch(5, k.conv_in[0].shape());
      ops::zero(d_from_shortcut);
      norm_backward(k.shortcut_norm, k.shortcut_out, d_shortcut, d_shortcut, training);
      conv_backward(k.shortcut, k.conv_in[0], d_shortcut, &d_from_shortcut);
      ops::axpy(1.0f, d_from_shortcut, d_in);
    }
    if (!k.bias_in.empty()) add_scalar_grad(d_in, *k.bias_in[j]);
    d = d_in;
    if (preact)
      norm_act_backward(k.norms[j], j == 0 ? k.scaled : k.conv_out[j - 1], k.normed[j], k.activated[j], d, training);
  }
  // d: dL/d scaled (from the branch).
  if (!preact && k.projection) {
    norm_backward(k.shortcut_norm, k.shortcut_out, d_shortcut, d_shortcut, training);
    Tensor d_from_shortcut = scratch(5, k.scaled.shape());
    conv_backward(k.shortcut, k.scaled, d_shortcut, &d_from_shortcut);
    ops::axpy(1.0f, d_from_shortcut, d);
  }
  if (k.input_scale == 1.0f && !k.projection) {
    ops::residual_forward(d, d_shortcut, 1.0f, 1.0f, d_x);  // d + d_shortcut in one pass (bitwise copy then axpy)
  } else {
    d_x.copy_from(d);
    if (k.input_scale != 1.0f) ops::scale(d_x, k.input_scale);
    if (!k.projection) ops::axpy(1.0f, d_shortcut, d_x);
  }
  record(sink, k.probe_in, d_x, true);
}

double Resnet::forward_backward(const Batch& batch, float grad_scale, const StepContext& context) {
  const Tensor& x = batch.inputs;
  PROPLAB_CHECK(x.ndim() == 4 && x.dim(1) == config_.in_channels && x.dim(2) == config_.image_size &&
                    x.dim(3) == config_.image_size,
                "resnet input must be [N, ", config_.in_channels, ", ", config_.image_size, ", ", config_.image_size,
                "], got ", shape_string(x.shape()));
  ensure_buffers(x.dim(0));
  const bool preact = config_.preact;
  const bool training = context.training;
  ProbeSink* sink = context.sink;

  conv_forward(stem_, x, stem_out_);
  if (stem_bias_) add_scalar(stem_out_, *stem_bias_);
  if (!preact) norm_act_forward(stem_norm_, stem_out_, stem_normed_, stem_act_, training);
  const Tensor& stem = preact ? stem_out_ : stem_act_;
  record(sink, probe_stem_, stem, false);
  for (std::size_t b = 0; b < blocks_.size(); ++b)
    block_forward(blocks_[b], b == 0 ? stem : blocks_[b - 1].out, training, sink);
  const Tensor& last = blocks_.back().out;
  if (preact) norm_act_forward(final_norm_, last, final_normed_, final_act_, training);
  const Tensor& features = preact ? final_act_ : last;
  ops::global_avg_pool_forward(features, pooled_);
  classifier_.forward(pooled_, logits_);
  record(sink, probe_logits_, logits_, false);
  const bool backward = grad_scale != 0.0f;
  const double loss = ops::softmax_cross_entropy(logits_, batch.targets.reshape({x.dim(0)}),
                                                 backward ? &d_logits_ : nullptr, grad_scale);
  if (!backward) return loss;

  record(sink, probe_logits_, d_logits_, true);
  classifier_.backward(pooled_, d_logits_, &d_pooled_);
  int current = 0;
  Tensor d_stream = scratch(current, features.shape());
  ops::global_avg_pool_backward(d_pooled_, d_stream);
  if (preact) norm_act_backward(final_norm_, last, final_normed_, final_act_, d_stream, training);
  for (int b = static_cast<int>(blocks_.size()) - 1; b >= 0; --b) {
    const Tensor& input = b == 0 ? stem : blocks_[b - 1].out;
    Tensor d_input = scratch(1 - current, input.shape());
    block_backward(blocks_[b], input, d_stream, d_input, training, sink);
    current = 1 - current;
    d_stream = d_input;
  }
  record(sink, probe_stem_, d_stream, true);
  if (!preact) norm_act_backward(stem_norm_, stem_out_, stem_normed_, stem_act_, d_stream, training);
  if (stem_bias_) add_scalar_grad(d_stream, *stem_bias_);
  conv_backward(stem_, x, d_stream, nullptr);
  return loss;
}

double Resnet::evaluate(const Batch& batch) {
  StepContext context;
  context.training = false;
  return forward_backward(batch, 0.0f, context);
}

double Resnet::train_flops(std::int64_t samples) const {
  return 3.0 * forward_flops_per_sample_ * static_cast<double>(samples);
}

}  // namespace proplab
