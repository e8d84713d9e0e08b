// rezero: ReZero (Bachlechner et al. 2021, "ReZero is All You Need: Fast Convergence at Large Depth"):
// x ← x + α·F(x) with a learnable scalar α per residual add, initialised to alpha0 (0: every block starts as the
// identity), and no normalisation (model.norm = "none"). λ = 1 fixed, β = α learnable. Transformer weights and
// embeddings Xavier, biases 0; a residual MLP keeps its mean-field init from [model].
#include "scaling/rule_util.h"

namespace proplab {

namespace {

const RuleInfo kReZero{
    "rezero",
    "ReZero: x ← x + α·F(x), α learnable per residual add, initialised to alpha0 (0); no normalisation",
    {{"alpha0", 0.0, -10.0, 10.0, "initial value of every learnable residual weight α"}},
    [](const ScalingConfig& config, const ModelConfig& shape) -> std::unique_ptr<ScalingRule> {
      rule_util::require_norm(shape, "rezero", NormPlacement::none,
                              "ReZero replaces normalisation by a learnable residual weight");
      rule_util::require_residual_mlp(shape, "rezero");
      return std::make_unique<rule_util::LearnableBranchRule>("rezero", config.params.at("alpha0"), shape);
    }};
PROPLAB_REGISTER_RULE(kReZero);

}  // namespace

}  // namespace proplab
