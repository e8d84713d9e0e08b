// scaling/rule_util: helpers shared by the rule files (no rule lives here): the Xavier std, the checks a rule
// makes on the model it is asked to scale, and the learnable-branch-weight rule that ReZero and SkipInit share.
//
// Invariant: every rejection is a UserError whose text names the conflicting key with its value, what the rule
// requires and ends with "; allowed: ..." (the study validator reports it at scaling.rule as is).
#pragma once

#include <cmath>
#include <optional>
#include <sstream>
#include <string>
#include <utility>

#include "core/error.h"
#include "scaling/resnet_util.h"
#include "scaling/rule.h"

namespace proplab::rule_util {

// Glorot: sqrt(2 / (fan_in + fan_out)).
inline double xavier_std(const ParamInfo& param) {
  return std::sqrt(2.0 / static_cast<double>(param.fan_in + param.fan_out));
}

// The usual constants: biases and norm shifts 0, norm gains and learnable residual scalars 1 (a rule with its own
// residual values writes them over the scalars); nothing for the matrices and embeddings a rule draws.
inline std::optional<InitSpec> constant_init(ParamRole role) {
  switch (role) {
    case ParamRole::bias:
    case ParamRole::norm_bias:
      return InitSpec::constant(0.0);
    case ParamRole::norm_gain:
    case ParamRole::residual_scale:
      return InitSpec::constant(1.0);
    default:
      return std::nullopt;
  }
}

// The `xavier` rule's init (also Admin's): Glorot for every matrix and embedding, constant_init for the rest.
inline InitSpec xavier_init(const ParamInfo& param) {
  if (const auto constant = constant_init(param.role)) return *constant;
  return InitSpec::normal_std(xavier_std(param));
}

// Throws unless the model is a transformer (`what` says what the rule is defined for).
inline void require_transformer(const ModelConfig& shape, const std::string& rule, const std::string& what) {
  if (shape.kind() != ModelKind::transformer)
    throw UserError("model.type = \"" + std::string(model_kind_name(shape.kind())) + "\": scaling rule \"" + rule +
                    "\" is defined for " + what + " only; allowed: model.type = \"transformer\"");
}

// Throws unless a transformer's norm placement is `required`; `why` says why the rule fixes it.
inline void require_norm(const ModelConfig& shape, const std::string& rule, NormPlacement required,
                         const std::string& why) {
  if (shape.kind() != ModelKind::transformer || shape.transformer().norm == required) return;
  const std::string wanted = norm_placement_name(required);
  throw UserError("model.norm = \"" + std::string(norm_placement_name(shape.transformer().norm)) +
                  "\" conflicts with scaling rule \"" + rule + "\", which requires model.norm = \"" + wanted + "\" (" +
                  why + "); allowed: model.norm = \"" + wanted + "\"");
}

// Throws for an MLP without residual connections (a rule that weights residual branches has nothing to weight).
inline void require_residual_mlp(const ModelConfig& shape, const std::string& rule) {
  if (shape.kind() == ModelKind::mlp && !shape.mlp().residual)
    throw UserError("model.residual = false: scaling rule \"" + rule +
                    "\" sets the weights of residual branches and this MLP has none; allowed: model.residual = true");
}

// A parameter that must be a whole number in [0, max] (a choice or a flag); returns it.
inline int whole_param(const ScalingConfig& config, const std::string& key, int max) {
  const double value = config.params.at(key);
  if (value != std::floor(value) || value < 0 || value > max) {
    std::ostringstream message;
    message << "scaling." << key << ": " << value << " is not a whole number in [0, " << max << "]; allowed: ";
    for (int choice = 0; choice <= max; ++choice) message << (choice ? ", " : "") << choice;
    throw UserError(message.str());
  }
  return static_cast<int>(value);
}

// ReZero / SkipInit: x ← x + α·f with one learnable scalar α per residual add, initialised to alpha0; no
// normalisation. Transformer weights and embeddings Xavier; MLP weights and biases mean-field from [model];
// ResNets He (scaling/resnet_util.h).
class LearnableBranchRule final : public ScalingRule {
 public:
  LearnableBranchRule(std::string name, double alpha0, const ModelConfig& shape)
      : name_(std::move(name)), alpha0_(alpha0), shape_(shape) {}
  std::string name() const override { return name_; }
  InitSpec init(const ParamInfo& param) const override {
    if (param.role == ParamRole::residual_scale) return InitSpec::constant(alpha0_);
    if (shape_.kind() == ModelKind::mlp) return mlp_mean_field_init(param, shape_.mlp());
    if (shape_.kind() == ModelKind::resnet) return resnet_util::he_init(param);
    switch (param.role) {
      case ParamRole::bias:
      case ParamRole::norm_bias:
        return InitSpec::constant(0.0);
      case ParamRole::norm_gain:
        return InitSpec::constant(1.0);
      default:
        return InitSpec::normal_std(xavier_std(param));
    }
  }
  ResidualSpec residual(int, Branch) const override { return {1.0, alpha0_, false, true}; }

 private:
  std::string name_;
  double alpha0_;
  ModelConfig shape_;
};

// Transformer init with Var = 1/fan_in for every matrix (μP-style), embeddings N(0, embed_std²), biases 0 and
// norm gains 1 (depth_mup and mup).
inline InitSpec fan_in_init(const ParamInfo& param, double embed_std) {
  switch (param.role) {
    case ParamRole::token_embedding:
    case ParamRole::position_embedding:
      return InitSpec::normal_std(embed_std);
    case ParamRole::bias:
    case ParamRole::norm_bias:
      return InitSpec::constant(0.0);
    case ParamRole::norm_gain:
      return InitSpec::constant(1.0);
    default:
      return InitSpec::normal_std(1.0 / std::sqrt(static_cast<double>(param.fan_in)));
  }
}

}  // namespace proplab::rule_util
