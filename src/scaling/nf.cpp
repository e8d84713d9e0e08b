// nf: Normalizer-Free ResNets (Brock, De & Smith 2021, "Characterizing signal propagation to close the
// performance gap in unnormalized ResNets"). Pre-activation ResNets without normalisation whose blocks compute
// x_{b+1} = x_b + α·f_b(x_b / β_b): β_b = √(expected Var(x_b)) from the variance bookkeeping v_{b+1} = v_b + α²,
// reset to 1 + α² after a transition (scaling/resnet_util.h nf_expected_variances), so every branch reads a
// unit-variance input; every conv uses scaled weight standardisation with a learnable gain (1 at init), and a
// conv reading an activation's output is scaled by the activation gain γ = 1/std φ(z), z ~ N(0, 1), so each
// branch keeps unit variance. Conv weights are drawn He-normal before standardisation (any scale gives the same
// standardised weight); classifier N(0, 1/fan_in), bias 0.
#include <cmath>

#include "scaling/resnet_util.h"
#include "scaling/rule.h"

namespace proplab {

namespace {

class NfRule final : public ScalingRule {
 public:
  NfRule(double alpha, const ModelConfig& shape)
      : alpha_(alpha),
        gain_(resnet_util::activation_gain(shape.resnet().activation)),
        variances_(resnet_util::nf_expected_variances(resnet_util::layout(shape.resnet()), alpha)) {}
  std::string name() const override { return "nf"; }
  InitSpec init(const ParamInfo& param) const override { return resnet_util::he_init(param); }
  ResidualSpec residual(int, Branch) const override { return {1.0, alpha_, false, false}; }
  ResnetRuleSpec resnet() const override { return {true, gain_, false}; }
  ResnetBlockSpec resnet_block(int block) const override {
    return {1.0 / std::sqrt(variances_.at(static_cast<std::size_t>(block)))};
  }

 private:
  double alpha_;
  double gain_;
  std::vector<double> variances_;
};

const RuleInfo kNf{
    "nf",
    "NF-ResNets: x ← x + α·f(x/β), β from the expected-variance bookkeeping, scaled weight standardisation",
    {{"alpha", 0.2, 0.0, 10.0, "branch multiplier α: each block adds α² to the expected stream variance"}},
    [](const ScalingConfig& config, const ModelConfig& shape) -> std::unique_ptr<ScalingRule> {
      if (shape.kind() != ModelKind::resnet)
        throw UserError("model.type = \"" + std::string(model_kind_name(shape.kind())) +
                        "\": scaling rule \"nf\" is defined for ResNets only; allowed: model.type = \"resnet\"");
      resnet_util::require_resnet_norm(shape, "nf", ResnetNorm::none,
                                       "NF-ResNets replace normalisation by the variance bookkeeping");
      if (!shape.resnet().preact)
        throw UserError(
            "model.preact = false conflicts with scaling rule \"nf\", which requires pre-activation blocks (its "
            "branches read x/β); allowed: model.preact = true");
      return std::make_unique<NfRule>(config.params.at("alpha"), shape);
    }};
PROPLAB_REGISTER_RULE(kNf);

}  // namespace

}  // namespace proplab
