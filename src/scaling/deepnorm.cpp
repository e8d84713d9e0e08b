// deepnorm: DeepNet (Wang et al. 2022, "DeepNet: Scaling Transformers to 1,000 Layers"), Post-LN transformers
// only. Every residual add is x ← LN(α·x + G(x)): λ = α, β = 1 (fixed). Initialisation: Xavier
// N(0, 2/(fan_in + fan_out)) for every matrix and embedding (the paper's xavier_normal), times β_init for both
// FFN matrices, the V rows of the packed QKV matrix and the attention output projection (Q and K rows keep
// plain Xavier); biases 0, norm gains 1. With `base_std` > 0 a fixed std replaces Xavier as the base.
// Constants (M = N = model.layers): decoder-only (form = 1) α = (2M)^{1/4}, β_init = (8M)^{-1/4}; encoder-only
// (form = 0) α = (2N)^{1/4}, β_init = (8N)^{-1/4}.
#include <cmath>

#include "scaling/rule_util.h"

namespace proplab {

namespace {

class DeepNormRule final : public ScalingRule {
 public:
  DeepNormRule(double alpha, double beta_init, double base_std)
      : alpha_(alpha), beta_init_(beta_init), base_std_(base_std) {}
  std::string name() const override { return "deepnorm"; }
  InitSpec init(const ParamInfo& param) const override {
    if (const auto constant = rule_util::constant_init(param.role)) return *constant;
    switch (param.role) {
      case ParamRole::attn_qkv: {
        const double base = base_of(param);
        return InitSpec::normal_row_blocks({base, base, base * beta_init_});  // Q, K, V
      }
      case ParamRole::attn_out:
      case ParamRole::ffn_in:
      case ParamRole::ffn_out:
        return InitSpec::normal_std(base_of(param) * beta_init_);
      default:
        return InitSpec::normal_std(base_of(param));
    }
  }
  ResidualSpec residual(int, Branch) const override { return {alpha_, 1.0, false, false}; }

 private:
  double base_of(const ParamInfo& param) const { return base_std_ > 0 ? base_std_ : rule_util::xavier_std(param); }

  double alpha_;
  double beta_init_;
  double base_std_;
};

const RuleInfo kDeepNorm{
    "deepnorm",
    "DeepNet (Post-LN): x ← LN(α·x + G(x)), α = (2N)^{1/4}; FFN, V, output projection init × (8N)^{-1/4}",
    {
        {"form", 1, 0, 1, "0: encoder-only constants (N layers), 1: decoder-only (M layers); N = M = model.layers"},
        {"base_std", 0.0, 0.0, 10.0, "base std of every matrix and embedding before β_init (0: Xavier)"},
    },
    [](const ScalingConfig& config, const ModelConfig& shape) -> std::unique_ptr<ScalingRule> {
      rule_util::require_transformer(shape, "deepnorm", "Post-LN transformers");
      rule_util::require_norm(shape, "deepnorm", NormPlacement::post,
                              "DeepNorm is x ← LN(α·x + G(x)), a Post-LN residual");
      // Encoder-only and decoder-only constants have the same form in the number of layers of the stack; the
      // key records which variant a study means.
      rule_util::whole_param(config, "form", 1);
      const double layers = shape.transformer().layers;
      return std::make_unique<DeepNormRule>(std::pow(2.0 * layers, 0.25), std::pow(8.0 * layers, -0.25),
                                            config.params.at("base_std"));
    }};
PROPLAB_REGISTER_RULE(kDeepNorm);

}  // namespace

}  // namespace proplab
