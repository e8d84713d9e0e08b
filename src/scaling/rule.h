// scaling/rule: a scaling rule decides every residual weight (lambda, beta) and every initial distribution.
//
// Layers never hard-code an init std or a residual weight: models ask the rule, passing a ParamInfo that says
// what the parameter is (its role), its fan-in/fan-out and its block. Each rule lives in one file in this folder
// and registers itself with PROPLAB_REGISTER_RULE; the registry lists every rule with its parameters, which
// the study validator uses to check [scaling] keys.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "scaling/config.h"
#include "spec/model.h"
#include "spec/param.h"

namespace proplab {

// ResNets (models/resnet.h): model-wide choices a rule makes.
struct ResnetRuleSpec {
  // Scaled weight standardisation (NF-Nets) of every conv, with a learnable per-channel gain (role norm_gain);
  // a conv that reads an activation's output standardises with scale activation_gain (γ = 1/std of φ(z),
  // z ~ N(0, 1)), the stem with scale 1.
  bool weight_standardization = false;
  double activation_gain = 1.0;
  // Fixup: a learnable scalar bias (role bias, init 0) before every conv and after every branch conv.
  bool scalar_biases = false;
};
// ResNets: per residual block b (0-based over all blocks).
struct ResnetBlockSpec {
  double input_scale = 1.0;  // the branch (and a transition's shortcut) reads input_scale·x (NF-ResNets: 1/β_b)
};

// What a profiling pass measured on the initialised model (models/profile.h), for rules whose residual weights
// depend on it (Admin). Population variances over the whole profiling batch, with every λ = β = 1.
struct RuleProfile {
  double embed_var = 0.0;           // the embedding output (probe embed.out)
  std::vector<double> branch_vars;  // per residual add in forward order (transformer: 2l attention, 2l+1 FFN)
};

// What a rule asks the profiling pass for.
struct ProfileRequest {
  int sequences = 1;  // sequences of model.seq_len uniform random tokens in the profiling batch
};

// init() and lr_multiplier() come from ParamInitializer (spec/param.h).
class ScalingRule : public ParamInitializer {
 public:
  virtual std::string name() const = 0;
  virtual ResidualSpec residual(int block, Branch branch) const = 0;
  // Attention logit scale for head dimension d_head (1/sqrt(d_head) unless a rule says otherwise).
  virtual double logit_scale(int d_head) const;
  // Multiplier on the model's output logits (1 unless a rule says otherwise).
  virtual double output_multiplier() const;
  // Set while the rule still needs a profiling pass over the initialised model (none unless a rule says
  // otherwise). The scaling module cannot build a model: models/profile.h (make_model_rule) runs the pass and
  // hands the result to set_profile(); until then such a rule's residual() is not valid.
  virtual std::optional<ProfileRequest> profile_request() const;
  // Takes the profiling pass's measurement (only called on a rule that asked for it).
  virtual void set_profile(const RuleProfile& profile);
  // ResNets: what the rule fixes beyond init and (λ, β) (defaults: nothing).
  virtual ResnetRuleSpec resnet() const;
  virtual ResnetBlockSpec resnet_block(int block) const;
};

struct RuleParamDoc {
  std::string key;
  double default_value;
  double min_value;
  double max_value;
  std::string doc;
};

struct RuleInfo {
  std::string name;
  std::string summary;
  std::vector<RuleParamDoc> params;
  // Builds the rule; parameters are already range-checked against `params`. May throw UserError for a
  // combination the rule rejects (e.g. a norm placement it fixes).
  std::unique_ptr<ScalingRule> (*make)(const ScalingConfig& config, const ModelConfig& shape);
  // Optional, for a rule whose `make` does costly work past its checks (DeepScaleLM's theory calibration, seconds
  // at a thousand blocks): throws exactly the UserErrors `make` would and builds nothing. nullptr: check_rule
  // builds the rule.
  void (*check)(const ScalingConfig& config, const ModelConfig& shape) = nullptr;
};

// All registered rules, sorted by name.
std::vector<const RuleInfo*> all_rules();
// nullptr when unknown.
const RuleInfo* find_rule(const std::string& name);
// Checks config.params against the rule's documented keys and ranges (UserError naming the key and what is
// allowed), fills defaults, and builds the rule.
std::unique_ptr<ScalingRule> make_rule(const ScalingConfig& config, const ModelConfig& shape);
// make_rule's checks alone (the same UserErrors; the rule's own `check` where it has one), without building the
// rule: what a study's validation runs, so that `proplab sweep --dry-run` and each run's validation do not pay for a
// calibration that the run then repeats.
void check_rule(const ScalingConfig& config, const ModelConfig& shape);

// The MLP's mean-field initialisation from [model]: weights N(0, sigma_w2/fan_in), biases N(0, sigma_b2).
InitSpec mlp_mean_field_init(const ParamInfo& param, const MlpConfig& mlp);

namespace detail {
struct RuleRegistrar {
  explicit RuleRegistrar(const RuleInfo* info);
};
}  // namespace detail

}  // namespace proplab

#define PROPLAB_REGISTER_RULE(info_variable) \
  static ::proplab::detail::RuleRegistrar proplab_rule_registrar_##info_variable(&info_variable)
