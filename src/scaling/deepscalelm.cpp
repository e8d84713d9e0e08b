// deepscalelm: DeepScaleLM (Kedia et al. 2024, "Transformers get stable: an end-to-end signal propagation theory
// for language models"). Every residual add is x ← λ·x + β·block(x) with λ² + β² = 1 and β² = k/N_adds
// (N_adds = 2·layers for the transformer, layers − 1 for a residual MLP), and every block starts with unit output
// variance, so the residual stream keeps variance 1 at every add (Pre-LN, Post-LN, both norms and no norm alike).
//
// Transformer initialisation (d = width, f = ffn_mult·d, p = model.dropout, on the branch output):
// - token and position embeddings Var (1−p)/2 each (their sum has unit variance after the embedding dropout's
//   1/(1−p)); an untied head Var 1/d;
// - Q and K rows of the packed QKV Var 1/d (unit-variance queries and keys from a unit-variance input);
// - FFN in and out, the same Var s with f·s·E[φ(z)²] = 1 − p for z ~ N(0, d·s): ReLU s = √(2(1−p)/(d·f)),
//   which is the paper's √((1−p)/2)/d at f = 4d; any other activation solves it with theory's moment maps
//   (theory::activation_forward: GELU's closed-form mean and variance);
// - V rows and the attention output projection of block l, the same Var √((1−p)/r_l)/d, where r_l is the
//   variance the causal attention mixing keeps, Var(P·V)/Var(V), as theory/model_theory predicts it for this
//   model (position-resolved: theory/token_field). Kedia et al.'s r_l (the input correlation c_l) is its
//   long-sequence limit; at finite causal length with weakly correlated tokens the prefix averages keep much more
//   and the limit formula would make the branch far from unit variance. r_l is found in one forward pass of the
//   theory (theory::walk_attention_branches): each block's V and output stds are rescaled by the predicted
//   attention branch variance before the pass continues to the next block.
// - biases 0, norm gains 1.
// The rule cannot see the data: the embeddings' token correlation r_0 is the `input_corr` parameter (negative:
// the estimate for independent uniform tokens the theory uses without data, Var_tok/(V·Var_embed) = 1/(2V)).
// MLP: residual weights only; weights and biases keep the mean-field init from [model] (σ_w² = 2 with ReLU gives
// unit-variance blocks).
#include <algorithm>
#include <cmath>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "scaling/rule_util.h"
#include "scaling/theory_numbers.h"
#include "theory/model_theory.h"
#include "theory/moments.h"

namespace proplab {

namespace {

// The common Var s of both FFN matrices that gives a unit-variance FFN branch from a unit-variance, zero-mean
// input: f·s·E[φ(z)²] = 1 − p, z ~ N(0, d·s).
double ffn_weight_var(const TransformerConfig& config) {
  const double d = config.width, f = static_cast<double>(config.ffn_mult) * config.width;
  const double keep = 1.0 - config.dropout;
  if (config.activation == Activation::relu) return std::sqrt(2.0 * keep / (d * f));
  if (config.activation == Activation::identity) return std::sqrt(keep / (d * f));
  const theory::GaussHermite rule(64);
  const Activation phi = config.activation;
  auto branch_var = [&](double s) {
    const theory::Signal y = theory::activation_forward(phi, theory::Signal{0.0, d * s, 0.0}, rule);
    return f * s * (y.var + y.mean * y.mean);
  };
  // Bisection in log s; branch_var is increasing in s for every activation here.
  double lo = 1e-12, hi = 1e6;
  for (int i = 0; i < 200; ++i) {
    const double mid = std::sqrt(lo * hi);
    (branch_var(mid) < keep ? lo : hi) = mid;
  }
  return std::sqrt(lo * hi);
}

class DeepScaleLmRule final : public ScalingRule {
 public:
  DeepScaleLmRule(const ModelConfig& shape, double beta_sq) : shape_(shape), beta_sq_(beta_sq) {}

  std::string name() const override { return "deepscalelm"; }

  InitSpec init(const ParamInfo& param) const override {
    if (param.role == ParamRole::residual_scale) return InitSpec::constant(1.0);
    if (shape_.kind() == ModelKind::mlp) return mlp_mean_field_init(param, shape_.mlp());
    const double d = shape_.transformer().width;
    switch (param.role) {
      case ParamRole::bias:
      case ParamRole::norm_bias:
        return InitSpec::constant(0.0);
      case ParamRole::norm_gain:
        return InitSpec::constant(1.0);
      case ParamRole::token_embedding:
      case ParamRole::position_embedding:
        return InitSpec::normal_std(std::sqrt(0.5 * (1.0 - shape_.transformer().dropout)));
      case ParamRole::attn_qkv: {
        const double qk = 1.0 / std::sqrt(d);
        return InitSpec::normal_row_blocks({qk, qk, value_std(param.block)});
      }
      case ParamRole::attn_out:
        return InitSpec::normal_std(value_std(param.block));
      case ParamRole::ffn_in:
      case ParamRole::ffn_out:
        return InitSpec::normal_std(std::sqrt(ffn_var_));
      default:
        return InitSpec::normal_std(1.0 / std::sqrt(d));  // readout (untied head)
    }
  }

  ResidualSpec residual(int, Branch) const override {
    return {std::sqrt(1.0 - beta_sq_), std::sqrt(beta_sq_), false, false};
  }

  // Transformer: finds r_l for every block (see the file comment).
  void solve_attention(std::optional<double> input_corr) {
    const TransformerConfig& c = shape_.transformer();
    ffn_var_ = ffn_weight_var(c);
    const double d = c.width;
    value_var_.assign(c.layers, 1.0 / d);
    theory::TheoryInputs inputs;
    inputs.input_corr = input_corr;
    // Block by block: the attention branch variance is proportional to Var(V)·Var(out) (no biases), so rescaling
    // both by 1/√(predicted branch variance) makes the branch exactly unit-variance; later blocks then see the
    // stream as it will be.
    theory::TransformerNumbers numbers = transformer_numbers(*this, c);
    theory::walk_attention_branches(numbers, inputs, [&](int block, double branch_var) {
      PROPLAB_CHECK(std::isfinite(branch_var) && branch_var > 0, "deepscalelm: predicted attention branch variance ",
                    branch_var, " at block ", block);
      value_var_[block] /= std::sqrt(branch_var);
      theory::TransformerBlockNumbers& bn = numbers.blocks[static_cast<std::size_t>(block)];
      bn.v_std = bn.attn_out_std = std::sqrt(value_var_[block]);
    });
  }

 private:
  double value_std(int block) const {
    PROPLAB_CHECK(block >= 0 && block < static_cast<int>(value_var_.size()), "deepscalelm: block ", block,
                  " outside the model's ", value_var_.size(), " blocks");
    return std::sqrt(value_var_[block]);
  }

  ModelConfig shape_;
  double beta_sq_;
  double ffn_var_ = 0.0;
  // Per block: Var of the V rows and of the attention output projection, √((1−p)/r_l)/d.
  std::vector<double> value_var_;
};

// The rule's checks (kDeepScaleLm.check): a model with residual adds, and 0 < k ≤ N_adds.
void check_deepscalelm(const ScalingConfig& config, const ModelConfig& shape) {
  rule_util::require_residual_mlp(shape, "deepscalelm");
  const int adds = residual_adds(shape);
  const double k = config.params.at("k");
  if (!(k > 0.0) || k > adds) {
    std::ostringstream message;
    message << "scaling.k: " << k << " with " << adds << " residual adds gives β² = k/N_adds outside (0, 1]; "
            << "allowed: 0 < k <= " << adds;
    throw UserError(message.str());
  }
}

const RuleInfo kDeepScaleLm{
    "deepscalelm",
    "DeepScaleLM: x ← λx + β·block(x), λ² + β² = 1, β² = k/N_adds; unit-variance blocks from theory-predicted r_l",
    {
        {"k", 2.0, 0.0, 1e6, "β² = k/N_adds (N_adds: 2·layers, or layers − 1 for a residual MLP); 0 < k ≤ N_adds"},
        {"input_corr", -1.0, -1.0, 1.0,
         "token correlation r_0 of the embeddings the rule assumes (it cannot see the data); negative: the "
         "independent-uniform-tokens estimate 1/(2·vocab)"},
    },
    [](const ScalingConfig& config, const ModelConfig& shape) -> std::unique_ptr<ScalingRule> {
      check_deepscalelm(config, shape);
      auto rule = std::make_unique<DeepScaleLmRule>(shape, config.params.at("k") / residual_adds(shape));
      if (shape.kind() == ModelKind::transformer) {
        const double r0 = config.params.at("input_corr");
        rule->solve_attention(r0 < 0 ? std::nullopt : std::optional<double>(r0));
      }
      return rule;
    },
    check_deepscalelm};
PROPLAB_REGISTER_RULE(kDeepScaleLm);

}  // namespace

}  // namespace proplab
