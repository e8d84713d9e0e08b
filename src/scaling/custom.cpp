// custom: every number given in the study. Residual x ← λ·x + β·f with λ, β fixed or learnable; per-kind init
// stds; optional attention logit scale. Biases 0, norm gains 1.
#include <cmath>
#include <map>

#include "scaling/rule.h"

namespace proplab {

namespace {

class CustomRule final : public ScalingRule {
 public:
  CustomRule(const ScalingConfig& config, const ModelConfig& shape) : p_(config.params), shape_(shape) {}
  std::string name() const override { return "custom"; }
  InitSpec init(const ParamInfo& param) const override {
    switch (param.role) {
      case ParamRole::token_embedding:
      case ParamRole::position_embedding:
        return InitSpec::normal_std(p_.at("embed_std"));
      case ParamRole::attn_qkv:
      case ParamRole::ffn_in:
      case ParamRole::mlp_input:
      case ParamRole::mlp_hidden:
      case ParamRole::conv_stem:
      case ParamRole::conv_branch:
      case ParamRole::conv_shortcut:
        return InitSpec::normal_std(p_.at("hidden_std"));
      case ParamRole::attn_out:
      case ParamRole::ffn_out:
      case ParamRole::conv_branch_out:
        return InitSpec::normal_std(p_.at("out_proj_std"));
      case ParamRole::readout:
        return InitSpec::normal_std(p_.at("readout_std"));
      case ParamRole::bias:
        return p_.at("bias_std") > 0 ? InitSpec::normal_std(p_.at("bias_std")) : InitSpec::constant(0);
      case ParamRole::norm_bias:
        return InitSpec::constant(0.0);
      case ParamRole::norm_gain:
        return InitSpec::constant(1.0);
      case ParamRole::residual_scale:
        return InitSpec::constant(1.0);  // the model sets λ/β values itself
    }
    return InitSpec::constant(0.0);
  }
  ResidualSpec residual(int, Branch) const override {
    return {p_.at("lambda"), p_.at("beta"), p_.at("learnable_lambda") != 0, p_.at("learnable_beta") != 0};
  }
  double logit_scale(int d_head) const override {
    double s = p_.at("logit_scale");
    return s > 0 ? s : ScalingRule::logit_scale(d_head);
  }

 private:
  std::map<std::string, double> p_;
  ModelConfig shape_;
};

const RuleInfo kCustom{"custom",
                       "everything from the study: λ, β (fixed or learnable) and per-kind init stds",
                       {
                           {"lambda", 1.0, -100.0, 100.0, "weight of the skip path in x ← λ·x + β·f"},
                           {"beta", 1.0, -100.0, 100.0, "weight of the residual branch"},
                           {"learnable_lambda", 0, 0, 1, "1 (true): λ is a trained scalar per residual add"},
                           {"learnable_beta", 0, 0, 1, "1 (true): β is a trained scalar per residual add"},
                           {"embed_std", 0.02, 0.0, 100.0, "std of token and position embeddings"},
                           {"hidden_std", 0.02, 0.0, 100.0, "std of QKV, FFN input and MLP input/hidden matrices"},
                           {"out_proj_std", 0.02, 0.0, 100.0, "std of attention-output and FFN-output projections"},
                           {"readout_std", 0.02, 0.0, 100.0, "std of an untied LM head or MLP readout"},
                           {"bias_std", 0.0, 0.0, 100.0, "std of biases (0: zeros)"},
                           {"logit_scale", 0.0, 0.0, 100.0, "attention logit scale (0: 1/√d_head)"},
                       },
                       [](const ScalingConfig& config, const ModelConfig& shape) -> std::unique_ptr<ScalingRule> {
                         return std::make_unique<CustomRule>(config, shape);
                       }};
PROPLAB_REGISTER_RULE(kCustom);

}  // namespace

}  // namespace proplab
