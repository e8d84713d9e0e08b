// Xavier/Glorot: every weight matrix and embedding N(0, 2/(fan_in + fan_out)), biases 0, norm gains 1,
// λ = β = 1.

#include "scaling/rule_util.h"

namespace proplab {

namespace {

class XavierRule final : public ScalingRule {
 public:
  std::string name() const override { return "xavier"; }
  InitSpec init(const ParamInfo& param) const override { return rule_util::xavier_init(param); }
  ResidualSpec residual(int, Branch) const override { return {}; }
};

const RuleInfo kXavier{"xavier",
                       "Glorot: Var = 2/(fan_in + fan_out) for every matrix, λ = β = 1",
                       {},
                       [](const ScalingConfig&, const ModelConfig&) -> std::unique_ptr<ScalingRule> {
                         return std::make_unique<XavierRule>();
                       }};
PROPLAB_REGISTER_RULE(kXavier);

}  // namespace

}  // namespace proplab
