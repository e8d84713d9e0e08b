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

#include "models/config.h"
#include "scaling/config.h"

namespace proplab {

enum class ParamRole {
  token_embedding,
  position_embedding,
  attn_qkv,
  attn_out,  // attention output projection (a residual branch's last matrix)
  ffn_in,
  ffn_out,     // FFN output projection (a residual branch's last matrix)
  readout,     // untied LM head or MLP readout
  mlp_input,   // MLP first layer (input_dim -> width)
  mlp_hidden,  // MLP hidden layers
  bias,        // every bias vector
  norm_gain,
  norm_bias,
  residual_scale,  // learnable lambda / beta scalars
  // ResNets (fan_in = input channels per group · kernel area):
  conv_stem,        // the first conv (image channels -> stage 0)
  conv_branch,      // a residual branch's conv other than its last
  conv_branch_out,  // a residual branch's last conv
  conv_shortcut,    // a transition block's projection shortcut
};
const char* param_role_name(ParamRole role);

enum class Branch { attention, ffn, mlp };

struct ParamInfo {
  ParamRole role;
  std::int64_t fan_in = 0;
  std::int64_t fan_out = 0;
  int block = -1;  // -1 outside blocks
  std::string name;
};

struct InitSpec {
  enum class Kind { normal, constant } kind = Kind::normal;
  double std = 0.0;    // normal: N(0, std^2)
  double value = 0.0;  // constant
  // normal, optional: when not empty, the tensor's dim 0 (rows) is split into row_block_stds.size() equal
  // blocks (dim 0 must divide evenly) and block b is drawn N(0, row_block_stds[b]^2); `std` is then unused.
  // Packed QKV [3D, D] uses three blocks: Q, K, V.
  std::vector<double> row_block_stds;
  static InitSpec normal_std(double s) { return {Kind::normal, s, 0.0, {}}; }
  static InitSpec normal_row_blocks(std::vector<double> stds) { return {Kind::normal, 0.0, 0.0, std::move(stds)}; }
  static InitSpec constant(double v) { return {Kind::constant, 0.0, v, {}}; }
  // The std of row block `block` (the single std when there are no row blocks).
  double block_std(std::size_t block) const { return row_block_stds.empty() ? std : row_block_stds.at(block); }
};

struct ResidualSpec {
  double lambda = 1.0;  // weight of the skip path
  double beta = 1.0;    // weight of the branch
  bool learnable_lambda = false;
  bool learnable_beta = false;
};

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

// What a rule may look at: the model as configured.
struct ModelShape {
  std::string type;  // transformer | mlp | resnet
  TransformerConfig transformer;
  MlpConfig mlp;
  ResnetConfig resnet;
  int residual_adds() const;  // number of residual combines in the model
};

class ScalingRule {
 public:
  virtual ~ScalingRule() = default;
  virtual std::string name() const = 0;
  virtual InitSpec init(const ParamInfo& param) const = 0;
  virtual ResidualSpec residual(int block, Branch branch) const = 0;
  // Attention logit scale for head dimension d_head (1/sqrt(d_head) unless a rule says otherwise).
  virtual double logit_scale(int d_head) const;
  // Multiplier on the learning rate of this parameter (1 unless a rule says otherwise).
  virtual double lr_multiplier(const ParamInfo& param) const;
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
  std::unique_ptr<ScalingRule> (*make)(const ScalingConfig& config, const ModelShape& shape);
};

// All registered rules, sorted by name.
std::vector<const RuleInfo*> all_rules();
// nullptr when unknown.
const RuleInfo* find_rule(const std::string& name);
// Checks config.params against the rule's documented keys and ranges (UserError naming the key and what is
// allowed), fills defaults, and builds the rule.
std::unique_ptr<ScalingRule> make_rule(const ScalingConfig& config, const ModelShape& shape);

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
