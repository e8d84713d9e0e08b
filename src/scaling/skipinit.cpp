// skipinit: SkipInit (De & Smith 2020, "Batch Normalization Biases Residual Blocks Towards the Identity
// Function in Deep Networks"): a learnable scalar multiplier at the end of each residual branch, initialised to
// alpha0 (0, or small), with normalisation removed (model.norm = "none"). In proplab's x ← λ·x + β·f this is
// λ = 1 fixed and β learnable, exactly what rezero builds: the two rules differ in their source and intent
// (SkipInit: a per-branch multiplier replacing BatchNorm in ResNets; ReZero: a residual weight, which its
// reference transformer shares between a layer's attention and FFN sublayers, whereas proplab has one per
// residual add for both). Transformer weights and embeddings Xavier, biases 0; a residual MLP keeps its
// mean-field init; a ResNet He init (norm = "none", every block's branch multiplier starts at alpha0).
#include "scaling/rule_util.h"

namespace proplab {

namespace {

const RuleInfo kSkipInit{
    "skipinit",
    "SkipInit: learnable scalar at the end of each residual branch, initialised to alpha0 (0); no normalisation",
    {{"alpha0", 0.0, -10.0, 10.0, "initial value of every branch multiplier"}},
    [](const ScalingConfig& config, const ModelConfig& shape) -> std::unique_ptr<ScalingRule> {
      rule_util::require_norm(shape, "skipinit", NormPlacement::none,
                              "SkipInit removes normalisation and relies on its branch multipliers");
      rule_util::require_residual_mlp(shape, "skipinit");
      resnet_util::require_resnet_norm(shape, "skipinit", ResnetNorm::none,
                                       "SkipInit replaces BatchNorm by its branch multipliers");
      return std::make_unique<rule_util::LearnableBranchRule>("skipinit", config.params.at("alpha0"), shape);
    }};
PROPLAB_REGISTER_RULE(kSkipInit);

}  // namespace

}  // namespace proplab
