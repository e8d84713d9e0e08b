// mup: width μP (Yang et al. 2021, "Tensor Programs V: Tuning Large Neural Networks via Zero-Shot Hyperparameter
// Transfer"), in the multiplier form of the `mup` package. width_mult = width / base_width.
// - Hidden ("matrix-like") weights — QKV, attention output, FFN in/out, MLP hidden — N(0, 1/fan_in) (MLP:
//   σ_w²/fan_in from [model]); their Adam learning rate × 1/width_mult.
// - Embeddings N(0, embed_std²): Θ(1) in width as μP prescribes (the constant is a base-model hyperparameter);
//   MLP input layer σ_w²/fan_in (fan-in fixed); learning rate unscaled.
// - Readout: N(0, 1/fan_in) (MLP: σ_w²/fan_in), or zeros with zero_readout = 1; the model output is multiplied by
//   1/width_mult either way (as MuReadout does, so that Adam updates of the readout stay μP). A tied head is the
//   token embedding times the same multiplier and cannot be zero-initialised.
// - Attention logits scaled by 1/d_head instead of 1/√d_head.
// - Biases 0 (MLP: N(0, σ_b²)), norm gains 1, λ = β = 1. Any norm placement.
#include <cmath>

#include "scaling/rule_util.h"

namespace proplab {

namespace {

class MupRule final : public ScalingRule {
 public:
  MupRule(double width_mult, bool zero_readout, double embed_std, const ModelConfig& shape)
      : width_mult_(width_mult), zero_readout_(zero_readout), embed_std_(embed_std), shape_(shape) {}
  std::string name() const override { return "mup"; }
  InitSpec init(const ParamInfo& param) const override {
    if (param.role == ParamRole::residual_scale) return InitSpec::constant(1.0);
    if (param.role == ParamRole::readout && zero_readout_) return InitSpec::constant(0.0);
    if (shape_.kind() == ModelKind::mlp) return mlp_mean_field_init(param, shape_.mlp());
    return rule_util::fan_in_init(param, embed_std_);
  }
  ResidualSpec residual(int, Branch) const override { return {}; }
  double logit_scale(int d_head) const override { return 1.0 / static_cast<double>(d_head); }
  double lr_multiplier(const ParamInfo& param) const override {
    switch (param.role) {
      case ParamRole::attn_qkv:
      case ParamRole::attn_out:
      case ParamRole::ffn_in:
      case ParamRole::ffn_out:
      case ParamRole::mlp_hidden:
        return 1.0 / width_mult_;
      default:
        return 1.0;
    }
  }
  double output_multiplier() const override { return 1.0 / width_mult_; }

 private:
  double width_mult_;
  bool zero_readout_;
  double embed_std_;
  ModelConfig shape_;
};

const RuleInfo kMup{
    "mup",
    "width μP: hidden Var 1/fan_in with Adam LR / width_mult, readout output / width_mult, logits / d_head",
    {
        {"base_width", 256, 1, 1048576, "width at which μP equals the base model: width_mult = width / base_width"},
        {"zero_readout", 0, 0, 1, "1 (true): the readout starts at zero (needs an untied head)"},
        {"embed_std", 1.0, 0.0, 100.0, "std of token and position embeddings (transformer)"},
    },
    [](const ScalingConfig& config, const ModelConfig& shape) -> std::unique_ptr<ScalingRule> {
      const bool zero_readout = rule_util::whole_param(config, "zero_readout", 1) != 0;
      if (zero_readout && shape.kind() == ModelKind::transformer && shape.transformer().tie_embeddings)
        throw UserError(
            "model.tie_embeddings = true conflicts with scaling.zero_readout = true: the tied readout "
            "is the token embedding, which cannot start at zero; allowed: model.tie_embeddings = false "
            "or scaling.zero_readout = false");
      const int width = shape.kind() == ModelKind::mlp ? shape.mlp().width : shape.transformer().width;
      return std::make_unique<MupRule>(width / config.params.at("base_width"), zero_readout,
                                       config.params.at("embed_std"), shape);
    }};
PROPLAB_REGISTER_RULE(kMup);

}  // namespace

}  // namespace proplab
