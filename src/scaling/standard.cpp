// The GPT-2 rule: weights N(0, std²) (std = 0.02), the two residual-branch output projections
// N(0, (std/√(2N))²) with N the number of blocks, biases 0, norm gains 1, λ = β = 1.
// For the MLP: weights N(0, σ_w²/fan_in), biases N(0, σ_b²) from [model], λ = β = 1 in the residual form.
// For ResNets: He init (convs N(0, 2/fan_in), classifier N(0, 1/fan_in)), BatchNorm γ = 1, β = 0, λ = β = 1.
#include <cmath>

#include "scaling/resnet_util.h"
#include "scaling/rule.h"
#include "scaling/rule_util.h"

namespace proplab {

namespace {

class StandardRule final : public ScalingRule {
 public:
  StandardRule(double std, const ModelConfig& shape) : std_(std), shape_(shape) {}
  std::string name() const override { return "standard"; }
  InitSpec init(const ParamInfo& param) const override {
    if (shape_.kind() == ModelKind::mlp) return mlp_mean_field_init(param, shape_.mlp());
    if (shape_.kind() == ModelKind::resnet) return resnet_util::he_init(param);
    if (const auto constant = rule_util::constant_init(param.role)) return *constant;
    switch (param.role) {
      case ParamRole::attn_out:
      case ParamRole::ffn_out:
        return InitSpec::normal_std(std_ / std::sqrt(2.0 * shape_.transformer().layers));
      default:
        return InitSpec::normal_std(std_);
    }
  }
  ResidualSpec residual(int, Branch) const override { return {}; }

 private:
  double std_;
  ModelConfig shape_;
};

const RuleInfo kStandard{"standard",
                         "GPT-2: N(0, 0.02²) weights, residual output projections 0.02/√(2N), λ = β = 1",
                         {{"std", 0.02, 1e-8, 10.0, "std of every weight matrix and embedding"}},
                         [](const ScalingConfig& config, const ModelConfig& shape) -> std::unique_ptr<ScalingRule> {
                           return std::make_unique<StandardRule>(config.params.at("std"), shape);
                         }};
PROPLAB_REGISTER_RULE(kStandard);

}  // namespace

}  // namespace proplab
