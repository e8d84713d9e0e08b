// models/resnet: CIFAR-style residual networks on NCHW images with explicit forward and backward.
//
// Graph (spec/model.h ResnetConfig; stage layout in scaling/resnet_util.h; per block b the rule gives λ_b, β_b
// (ResidualSpec) and the input scale s_b (ResnetBlockSpec); m = 2 convs per basic branch, 3 per bottleneck):
//   stem:  h = conv3x3(image)            then, post-activation only, h = act(norm(h))
//   pre-activation block:   u = s·x; p = act(norm(u)); a_0 = conv_0(p); ...; a_j = conv_j(act(norm(a_{j-1})))
//                           out = λ·shortcut + β·a_{m-1},  shortcut = x, or conv1x1_stride(p) at a projection
//   post-activation block:  u = s·x; a_0 = conv_0(u); n_j = norm(a_j); a_{j+1} = conv_{j+1}(act(n_j))
//                           out = act(λ·shortcut + β·n_{m-1}), shortcut = x, or norm(conv1x1_stride(u))
//   head:  pre-activation: act(norm(h)); then global average pooling, linear classifier, softmax cross-entropy.
// norm = "none" removes every norm (identity). A transition block (opening stages 1 and 2) has stride 2 in its
// first 3x3 conv and a projection shortcut; so does the first bottleneck block (stride 1, channels ×4).
// With the rule's weight standardisation (NF-Nets) each conv uses its standardised weight with a learnable
// per-channel gain, scaled by the activation gain γ when it reads an activation's output. With the rule's scalar
// biases (Fixup) a learnable scalar is added before every conv and after every branch conv.
//
// Layouts: images and every activation [N, C, H, W]; inputs f32 [N, in_channels, image_size, image_size], targets
// i32 [N] (class indices). BatchNorm uses batch statistics (and updates its running statistics) in training
// forward_backward() and the running statistics in evaluate(). Probes see an image activation channels-last,
// [N, H·W, C] (tokens = pixels, features = channels), so chan_mean_sq / chan_var are per-channel statistics.
#pragma once

#include <vector>

#include "models/model.h"
#include "models/residual_site.h"
#include "nn/layers.h"
#include "scaling/resnet_util.h"

namespace proplab {

class Resnet final : public Model {
 public:
  Resnet(const ResnetConfig& config, const ScalingConfig& scaling, std::uint64_t seed);
  // Initialised by an already-built rule (the rule is not kept).
  Resnet(const ResnetConfig& config, const ScalingRule& rule, std::uint64_t seed);

  ParameterStore& params() override { return params_; }
  const std::vector<ProbeInfo>& probes() const override { return probes_; }
  std::vector<BlockInfo> block_layout() const override;
  double forward_backward(const Batch& batch, float grad_scale, const StepContext& context) override;
  double evaluate(const Batch& batch) override;
  double train_flops(std::int64_t samples) const override;
  std::int64_t tokens_per_sample() const override { return 1; }

  const ResnetConfig& config() const { return config_; }
  int blocks() const { return layout_.blocks(); }
  // True for a block that opens stage 1 or 2 (stride 2, projection shortcut).
  bool transition(int block) const { return layout_.transition(block); }
  // The probe indices of block b's stream in, branch out and stream out.
  int probe_block_in(int block) const { return blocks_[block].probe_in; }
  int probe_block_branch(int block) const { return blocks_[block].probe_branch; }
  int probe_block_out(int block) const { return blocks_[block].probe_out; }
  // The logits [N, classes] of the last forward pass (accuracy, tests).
  const Tensor& logits() const { return logits_; }
  // BatchNorm running statistics, in creation order (mean, var per norm): for tests and checkpoints.
  std::vector<Tensor*> running_statistics();
  // The running statistics by name: "<norm>.running_mean", "<norm>.running_var" (e.g. "blocks.3.norm0.running_var").
  std::vector<std::pair<std::string, Tensor*>> buffers() override;
  // Refuses a device other than the CPU for Fixup (its scalar biases are host code); otherwise moves parameters,
  // BatchNorm running statistics and the weight-standardisation buffers.
  void to_device(Device device) override;

 private:
  struct Conv {
    Parameter* weight = nullptr;
    Parameter* ws_gain = nullptr;  // set with weight standardisation
    ops::Conv2dParams params;
    float ws_scale = 1.0f;
    Tensor w_hat, ws_mean, ws_rstd, d_w_hat;
    const Tensor& used_weight() const { return ws_gain ? w_hat : weight->value; }
  };
  struct Norm {
    std::string name;
    Parameter* gamma = nullptr;  // null: no norm (identity)
    Parameter* beta = nullptr;
    Tensor running_mean, running_var, mean, rstd;
  };
  struct Block {
    int stage = 0;
    bool projection = false;
    float input_scale = 1.0f;
    std::vector<Conv> convs;
    std::vector<Norm> norms;                    // one per conv (pre: before it; post: after it)
    std::vector<Parameter*> bias_in, bias_out;  // scalar biases per conv (empty without)
    Conv shortcut;                              // projection only
    Norm shortcut_norm;                         // post-activation projection with batchnorm only
    ResidualSite residual;
    int probe_in = -1, probe_branch = -1, probe_out = -1;
    // Saved activations (see the graph in the header comment).
    Tensor scaled;                  // u = s·x (aliases x when s = 1)
    std::vector<Tensor> conv_in;    // what conv j reads
    std::vector<Tensor> conv_out;   // a_j (+ scalar bias)
    std::vector<Tensor> normed;     // norm(·) output (aliases its input without norm; unwritten when fused)
    std::vector<Tensor> activated;  // act(normed)
    Tensor shortcut_out, shortcut_normed;
    Tensor sum;  // post-activation: λ·shortcut + β·branch (unwritten with ReLU: fused into `out`)
    Tensor out;
  };

  void build(const ScalingRule& rule, std::uint64_t seed);
  Conv make_conv(const std::string& name, std::int64_t in, std::int64_t out, int kernel, int stride, ParamRole role,
                 int block, bool reads_activation);
  Norm make_norm(const std::string& name, std::int64_t channels, int block);
  void ensure_buffers(std::int64_t batch);
  void conv_forward(Conv& conv, const Tensor& x, Tensor& y) const;
  void conv_backward(Conv& conv, const Tensor& x, const Tensor& d_y, Tensor* d_x) const;
  void norm_forward(Norm& norm, const Tensor& x, Tensor& y, bool training) const;
  void norm_backward(Norm& norm, const Tensor& x, const Tensor& d_y, Tensor& d_x, bool training) const;
  bool fuses_norm_act(const Norm& norm) const;
  // activated = act(norm(x)); with BatchNorm and ReLU one fused pass that leaves `normed` unwritten (the ReLU's
  // backward reads its mask from `activated`), else the two ops through `normed`.
  void norm_act_forward(Norm& norm, const Tensor& x, Tensor& normed, Tensor& activated, bool training) const;
  // d (dL/d activated on entry) becomes dL/d x, in place; the same choice as norm_act_forward.
  void norm_act_backward(Norm& norm, const Tensor& x, const Tensor& normed, const Tensor& activated, Tensor& d,
                         bool training) const;
  void block_forward(Block& block, const Tensor& x, bool training, ProbeSink* sink);
  // d_out: dL/d(block output) (consumed); d_x: dL/d(block input) (overwritten).
  void block_backward(Block& block, const Tensor& x, Tensor& d_out, Tensor& d_x, bool training, ProbeSink* sink);
  void record(ProbeSink* sink, int probe, const Tensor& x, bool backward);
  int add_probe(const std::string& name, int block, ProbeKind kind);
  Tensor scratch(int which, const Shape& shape) const;

  ResnetConfig config_;
  resnet_util::Layout layout_;
  ResnetRuleSpec spec_;
  ParameterStore params_;
  std::vector<ProbeInfo> probes_;
  Conv stem_;
  Norm stem_norm_;                  // post-activation only
  Parameter* stem_bias_ = nullptr;  // scalar bias after the stem conv (Fixup)
  std::vector<Block> blocks_;
  Norm final_norm_;  // pre-activation only
  nn::Linear classifier_;
  std::int64_t final_channels_ = 0;
  double forward_flops_per_sample_ = 0.0;
  int probe_stem_ = -1, probe_logits_ = -1;

  std::int64_t batch_ = 0;
  std::int64_t max_numel_ = 0;
  Tensor stem_out_, stem_normed_, stem_act_;
  Tensor final_normed_, final_act_, pooled_, logits_, d_logits_, d_pooled_;
  std::vector<Tensor> scratch_;  // flat gradient buffers of max_numel_ floats
  Tensor probe_buffer_;
};

}  // namespace proplab
