// odestep: the ResNet as an Euler discretisation of an ODE: x ← x + f(x)/N with N the number of residual
// blocks (branch multiplier β = 1/N, fixed; λ = 1), so the stream's change over the whole network stays O(1)
// as depth grows. Weights He-normal (scaling/resnet_util.h), with or without BatchNorm.
#include "scaling/resnet_util.h"
#include "scaling/rule.h"

namespace proplab {

namespace {

class OdeStepRule final : public ScalingRule {
 public:
  explicit OdeStepRule(const ModelConfig& shape) : step_(1.0 / resnet_util::layout(shape.resnet()).blocks()) {}
  std::string name() const override { return "odestep"; }
  InitSpec init(const ParamInfo& param) const override { return resnet_util::he_init(param); }
  ResidualSpec residual(int, Branch) const override { return {1.0, step_, false, false}; }

 private:
  double step_;
};

const RuleInfo kOdeStep{"odestep",
                        "ODE step: x ← x + f(x)/N over N residual blocks, He init",
                        {},
                        [](const ScalingConfig&, const ModelConfig& shape) -> std::unique_ptr<ScalingRule> {
                          if (shape.kind() != ModelKind::resnet)
                            throw UserError("model.type = \"" + std::string(model_kind_name(shape.kind())) +
                                            "\": scaling rule \"odestep\" is defined for ResNets only; allowed: "
                                            "model.type = \"resnet\"");
                          return std::make_unique<OdeStepRule>(shape);
                        }};
PROPLAB_REGISTER_RULE(kOdeStep);

}  // namespace

}  // namespace proplab
