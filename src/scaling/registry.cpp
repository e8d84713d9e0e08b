#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>
#include <utility>

#include "core/error.h"
#include "scaling/rule.h"

namespace proplab {

double ScalingRule::logit_scale(int d_head) const { return 1.0 / std::sqrt(static_cast<double>(d_head)); }
double ScalingRule::output_multiplier() const { return 1.0; }
std::optional<ProfileRequest> ScalingRule::profile_request() const { return std::nullopt; }
ResnetRuleSpec ScalingRule::resnet() const { return {}; }
ResnetBlockSpec ScalingRule::resnet_block(int) const { return {}; }
void ScalingRule::set_profile(const RuleProfile&) {
  PROPLAB_CHECK(false, "scaling rule \"", name(), "\" was given a profile it did not ask for");
}

InitSpec mlp_mean_field_init(const ParamInfo& param, const MlpConfig& mlp) {
  switch (param.role) {
    case ParamRole::mlp_input:
    case ParamRole::mlp_hidden:
    case ParamRole::readout:
      return InitSpec::normal_std(std::sqrt(mlp.sigma_w2 / static_cast<double>(param.fan_in)));
    case ParamRole::bias:
      return mlp.sigma_b2 > 0 ? InitSpec::normal_std(std::sqrt(mlp.sigma_b2)) : InitSpec::constant(0);
    case ParamRole::residual_scale:
      return InitSpec::constant(1.0);
    default:
      return InitSpec::constant(0);
  }
}

namespace {
std::map<std::string, const RuleInfo*>& registry() {
  static std::map<std::string, const RuleInfo*> rules;
  return rules;
}
}  // namespace

detail::RuleRegistrar::RuleRegistrar(const RuleInfo* info) { registry()[info->name] = info; }

std::vector<const RuleInfo*> all_rules() {
  std::vector<const RuleInfo*> out;
  for (const auto& [name, info] : registry()) out.push_back(info);
  return out;
}

const RuleInfo* find_rule(const std::string& name) {
  auto it = registry().find(name);
  return it == registry().end() ? nullptr : it->second;
}

namespace {
// The rule of config.rule, and config with its parameters range-checked and their defaults filled.
std::pair<const RuleInfo*, ScalingConfig> checked_params(const ScalingConfig& config) {
  const RuleInfo* info = find_rule(config.rule);
  if (!info) {
    std::ostringstream names;
    for (const RuleInfo* r : all_rules()) names << (names.tellp() ? ", " : "") << r->name;
    throw UserError("scaling.rule: unknown rule \"" + config.rule + "\"; allowed: " + names.str());
  }
  ScalingConfig filled = config;
  for (const auto& [key, value] : config.params) {
    auto doc =
        std::find_if(info->params.begin(), info->params.end(), [&](const RuleParamDoc& d) { return d.key == key; });
    if (doc == info->params.end())
      throw UserError("scaling." + key + ": not a parameter of rule \"" + info->name + "\"");
    if (!(value >= doc->min_value && value <= doc->max_value)) {
      std::ostringstream msg;
      msg << "scaling." << key << ": " << value << " is out of range; allowed: [" << doc->min_value << ", "
          << doc->max_value << "]";
      throw UserError(msg.str());
    }
  }
  for (const RuleParamDoc& doc : info->params) filled.params.emplace(doc.key, doc.default_value);
  return {info, std::move(filled)};
}
}  // namespace

std::unique_ptr<ScalingRule> make_rule(const ScalingConfig& config, const ModelConfig& shape) {
  const auto [info, filled] = checked_params(config);
  return info->make(filled, shape);
}

void check_rule(const ScalingConfig& config, const ModelConfig& shape) {
  const auto [info, filled] = checked_params(config);
  if (info->check)
    info->check(filled, shape);
  else
    info->make(filled, shape);
}

}  // namespace proplab
