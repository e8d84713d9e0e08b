// keel: Keel (Chen & Wei 2026, "Post-LayerNorm Is Back: Stable, ExpressivE, and Deep", arXiv 2601.19895),
// transformers with model.norm = "both" only. Every residual sublayer is x ← Norm(α·x + F(Norm_in(x))): a norm on
// the branch's input and one after the sum, the skip scaled by α = L, the number of residual sublayers (2 per block:
// attention and FFN), so λ = α and β = 1 (fixed) at every add; `alpha` > 0 replaces L.
// Initialisation: the paper claims none special is needed, and we could not find its exact init (nor whether the
// first sublayer or the embedding is treated differently), so this rule takes GPT-2's (the `standard` rule's):
// every weight matrix and embedding N(0, base_std²), the attention-output and FFN-output projections
// N(0, (base_std/√(2N))²) with N = model.layers; biases 0, norm gains 1; every add the same α. The paper's norms are
// RMSNorm with a learnable gain and no bias: set model.norm_kind = "rmsnorm" and model.bias = false for that; the
// rule does not impose it.
#include <cmath>

#include "scaling/rule_util.h"

namespace proplab {

namespace {

class KeelRule final : public ScalingRule {
 public:
  KeelRule(double alpha, double base_std, int layers) : alpha_(alpha), base_std_(base_std), layers_(layers) {}
  std::string name() const override { return "keel"; }
  InitSpec init(const ParamInfo& param) const override {
    if (const auto constant = rule_util::constant_init(param.role)) return *constant;
    switch (param.role) {
      case ParamRole::attn_out:
      case ParamRole::ffn_out:
        return InitSpec::normal_std(base_std_ / std::sqrt(2.0 * layers_));
      default:
        return InitSpec::normal_std(base_std_);
    }
  }
  ResidualSpec residual(int, Branch) const override { return {alpha_, 1.0, false, false}; }

 private:
  double alpha_;
  double base_std_;
  int layers_;
};

const RuleInfo kKeel{
    "keel",
    "Keel (norm = both): x ← Norm(α·x + F(Norm_in(x))), α = L = 2N residual sublayers; GPT-2 init",
    {
        {"alpha", 0.0, 0.0, 1e6,
         "skip weight α on every add (0: L = 2·model.layers, the number of residual sublayers)"},
        {"base_std", 0.02, 1e-8, 10.0,
         "std of every weight matrix and embedding; output projections base_std/√(2N) (GPT-2's init)"},
    },
    [](const ScalingConfig& config, const ModelConfig& shape) -> std::unique_ptr<ScalingRule> {
      rule_util::require_transformer(shape, "keel", "transformers with a norm on each branch input and after each sum");
      rule_util::require_norm(shape, "keel", NormPlacement::both,
                              "Keel is x ← Norm(α·x + F(Norm_in(x))), a norm on each branch input and after each sum");
      const int layers = shape.transformer().layers;
      const double alpha = config.params.at("alpha");
      return std::make_unique<KeelRule>(alpha > 0 ? alpha : 2.0 * layers, config.params.at("base_std"), layers);
    }};
PROPLAB_REGISTER_RULE(kKeel);

}  // namespace

}  // namespace proplab
