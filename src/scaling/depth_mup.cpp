// depth_mup: Depth-μP (Yang, Yu, Zhu & Hayou 2023, "Tensor Programs VI: Feature Learning in Infinite-Depth Neural
// Networks"; Bordelon et al. 2023): every residual branch is multiplied by a/√N, x ← x + (a/√N)·f(x), with N the
// number of blocks (transformer: model.layers, each block's attention and FFN adds share the multiplier; residual
// MLP: its model.layers − 1 residual layers). λ = 1. Initialisation is the standard (fan-in) parametrisation the
// derivation assumes, so that each branch is Θ(1) before the multiplier: transformer matrices (QKV, attention
// output, FFN, untied readout) N(0, 1/fan_in), embeddings N(0, embed_std²), biases 0, norm gains 1; a residual MLP
// keeps its mean-field init N(0, σ_w²/fan_in) from [model]. Any norm placement.
#include <algorithm>
#include <cmath>

#include "scaling/rule_util.h"

namespace proplab {

namespace {

class DepthMupRule final : public ScalingRule {
 public:
  DepthMupRule(double branch_scale, double embed_std, const ModelConfig& shape)
      : branch_scale_(branch_scale), embed_std_(embed_std), shape_(shape) {}
  std::string name() const override { return "depth_mup"; }
  InitSpec init(const ParamInfo& param) const override {
    if (param.role == ParamRole::residual_scale) return InitSpec::constant(1.0);
    if (shape_.kind() == ModelKind::mlp) return mlp_mean_field_init(param, shape_.mlp());
    return rule_util::fan_in_init(param, embed_std_);
  }
  ResidualSpec residual(int, Branch) const override { return {1.0, branch_scale_, false, false}; }

 private:
  double branch_scale_;
  double embed_std_;
  ModelConfig shape_;
};

const RuleInfo kDepthMup{
    "depth_mup",
    "Depth-μP: x ← x + (a/√N)·f(x) with N blocks, λ = 1, fan-in init (Var 1/fan_in)",
    {
        {"a", 1.0, 0.0, 100.0, "branch multiplier constant: β = a/√N"},
        {"embed_std", 1.0, 0.0, 100.0, "std of token and position embeddings (transformer)"},
    },
    [](const ScalingConfig& config, const ModelConfig& shape) -> std::unique_ptr<ScalingRule> {
      rule_util::require_residual_mlp(shape, "depth_mup");
      const int blocks =
          shape.kind() == ModelKind::mlp ? std::max(shape.mlp().layers - 1, 1) : shape.transformer().layers;
      return std::make_unique<DepthMupRule>(config.params.at("a") / std::sqrt(static_cast<double>(blocks)),
                                            config.params.at("embed_std"), shape);
    }};
PROPLAB_REGISTER_RULE(kDepthMup);

}  // namespace

}  // namespace proplab
