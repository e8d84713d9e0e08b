// fixup: Fixup initialisation (Zhang, Dauphin & Ma 2019, "Fixup Initialization: Residual Learning Without
// Normalization") for ResNets without normalisation. With L residual branches of m convs each: the classifier's
// weights and bias and each branch's last conv are 0; the other branch convs are He-normal scaled by
// L^(−1/(2m−2)); the stem and projection shortcuts He-normal; each branch ends in a learnable scalar multiplier
// (β, initialised to 1) and a learnable scalar bias (0) sits before every conv and after every branch conv and the
// stem. At init every block is the identity on its stream (a post-activation block: act(x), the identity on the
// non-negative stream after the first activation).
#include <cmath>

#include "scaling/resnet_util.h"
#include "scaling/rule.h"

namespace proplab {

namespace {

class FixupRule final : public ScalingRule {
 public:
  explicit FixupRule(const ModelConfig& shape) {
    const resnet_util::Layout layout = resnet_util::layout(shape.resnet());
    branch_scale_ = std::pow(static_cast<double>(layout.blocks()), -1.0 / (2.0 * layout.convs_per_branch - 2.0));
  }
  std::string name() const override { return "fixup"; }
  InitSpec init(const ParamInfo& param) const override {
    switch (param.role) {
      case ParamRole::conv_branch:
        return InitSpec::normal_std(branch_scale_ * resnet_util::he_init(param).std);
      case ParamRole::conv_branch_out:
      case ParamRole::readout:
        return InitSpec::constant(0.0);
      default:
        return resnet_util::he_init(param);
    }
  }
  ResidualSpec residual(int, Branch) const override { return {1.0, 1.0, false, true}; }
  ResnetRuleSpec resnet() const override { return {false, 1.0, true}; }

 private:
  double branch_scale_ = 1.0;
};

const RuleInfo kFixup{"fixup",
                      "Fixup: zero last branch conv and classifier, inner convs He·L^(−1/(2m−2)), scalar "
                      "multipliers and biases; no normalisation",
                      {},
                      [](const ScalingConfig&, const ModelConfig& shape) -> std::unique_ptr<ScalingRule> {
                        if (shape.kind() != ModelKind::resnet)
                          throw UserError("model.type = \"" + std::string(model_kind_name(shape.kind())) +
                                          "\": scaling rule \"fixup\" is defined for ResNets only (tfixup is its "
                                          "transformer form); allowed: model.type = \"resnet\"");
                        resnet_util::require_resnet_norm(shape, "fixup", ResnetNorm::none,
                                                         "Fixup replaces normalisation by its initialisation");
                        return std::make_unique<FixupRule>(shape);
                      }};
PROPLAB_REGISTER_RULE(kFixup);

}  // namespace

}  // namespace proplab
