// Xavier/Glorot: every weight matrix and embedding N(0, 2/(fan_in + fan_out)), biases 0, norm gains 1,
// λ = β = 1.
#include <cmath>

#include "scaling/rule.h"

namespace proplab {

namespace {

class XavierRule final : public ScalingRule {
 public:
  std::string name() const override { return "xavier"; }
  InitSpec init(const ParamInfo& param) const override {
    switch (param.role) {
      case ParamRole::bias:
      case ParamRole::norm_bias:
        return InitSpec::constant(0.0);
      case ParamRole::norm_gain:
      case ParamRole::residual_scale:
        return InitSpec::constant(1.0);
      default:
        return InitSpec::normal_std(std::sqrt(2.0 / static_cast<double>(param.fan_in + param.fan_out)));
    }
  }
  ResidualSpec residual(int, Branch) const override { return {}; }
};

const RuleInfo kXavier{"xavier",
                       "Glorot: Var = 2/(fan_in + fan_out) for every matrix, λ = β = 1",
                       {},
                       [](const ScalingConfig&, const ModelShape&) -> std::unique_ptr<ScalingRule> {
                         return std::make_unique<XavierRule>();
                       }};
PROPLAB_REGISTER_RULE(kXavier);

}  // namespace

}  // namespace proplab
