// scaling/theory_numbers: the plain-number model descriptions theory/model_theory predicts from, built by asking
// a scaling rule for every parameter's InitSpec and every residual weight, exactly as the models do (same
// ParamInfo roles, fans and blocks; the packed QKV has fan_out = width per projection and three row blocks).
//
// Invariant: a zero-initialised tensor (InitSpec constant 0) has std 0; any other constant initialisation of a
// weight matrix has no Gaussian description and is a UserError naming the parameter.
#pragma once

#include "spec/model.h"
#include "scaling/config.h"
#include "scaling/rule.h"
#include "theory/model_theory.h"

namespace proplab {

theory::TransformerNumbers transformer_numbers(const ScalingRule& rule, const TransformerConfig& config);
theory::MlpNumbers mlp_numbers(const ScalingRule& rule, const MlpConfig& config);

// The same, building the rule from a study's [scaling] table (make_rule's checks apply).
theory::TransformerNumbers transformer_numbers(const ScalingConfig& scaling, const TransformerConfig& config);
theory::MlpNumbers mlp_numbers(const ScalingConfig& scaling, const MlpConfig& config);

}  // namespace proplab
