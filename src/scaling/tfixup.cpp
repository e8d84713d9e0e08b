// tfixup: T-Fixup (Huang et al. 2020, "Improving Transformer Optimization Through Better Initialization"), decoder
// form, for transformers without normalisation (model.norm = "none"). With s = (9N)^{-1/4}, N = model.layers:
// Xavier N(0, 2/(fan_in + fan_out)) for every matrix; the V rows of the packed QKV matrix, the attention output
// projection and both FFN matrices Xavier × s (Q and K rows plain Xavier); token and position embeddings
// N(0, d^{-1/2}) in the paper's notation, i.e. std d^{-1/2} as in its code, times s; an untied readout Xavier;
// biases 0; λ = β = 1. The paper's decoder layers have three sublayers (self-attention, cross-attention, FFN),
// ours two; the constant is the paper's decoder constant all the same.
#include <cmath>

#include "scaling/rule_util.h"

namespace proplab {

namespace {

class TFixupRule final : public ScalingRule {
 public:
  TFixupRule(double scale, int width) : scale_(scale), width_(width) {}
  std::string name() const override { return "tfixup"; }
  InitSpec init(const ParamInfo& param) const override {
    if (const auto constant = rule_util::constant_init(param.role)) return *constant;
    const double xavier = rule_util::xavier_std(param);
    switch (param.role) {
      case ParamRole::token_embedding:
      case ParamRole::position_embedding:
        return InitSpec::normal_std(scale_ / std::sqrt(static_cast<double>(width_)));
      case ParamRole::attn_qkv:
        return InitSpec::normal_row_blocks({xavier, xavier, xavier * scale_});  // Q, K, V
      case ParamRole::attn_out:
      case ParamRole::ffn_in:
      case ParamRole::ffn_out:
        return InitSpec::normal_std(xavier * scale_);
      default:
        return InitSpec::normal_std(xavier);
    }
  }
  ResidualSpec residual(int, Branch) const override { return {}; }

 private:
  double scale_;
  int width_;
};

const RuleInfo kTFixup{
    "tfixup",
    "T-Fixup (no norms): V, output, FFN and embedding init × (9N)^{-1/4} from Xavier / N(0, d^{-1/2}); λ = β = 1",
    {},
    [](const ScalingConfig&, const ModelConfig& shape) -> std::unique_ptr<ScalingRule> {
      rule_util::require_transformer(shape, "tfixup", "transformers");
      rule_util::require_norm(shape, "tfixup", NormPlacement::none, "T-Fixup's initialisation replaces LayerNorm");
      return std::make_unique<TFixupRule>(std::pow(9.0 * shape.transformer().layers, -0.25), shape.transformer().width);
    }};
PROPLAB_REGISTER_RULE(kTFixup);

}  // namespace

}  // namespace proplab
