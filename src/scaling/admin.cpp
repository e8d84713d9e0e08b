// admin: Admin, adaptive model initialisation (Liu, Liu, Gao, Chen & Han 2020, "Understanding the Difficulty of
// Training Transformers"), Post-LN transformers only. Sublayer i (i = 0..2N−1: block l's attention is 2l, its FFN
// 2l+1) computes x_{i+1} = LN(ω_i·x_i + f_i(x_i)): λ = ω_i, β = 1. ω comes from one profiling forward pass over
// the initialised model with every ω = 1 (models/profile.h runs it: scaling cannot build a model), which measures
// the embedding output's variance Var[x_0] and every branch output's variance Var[f_j]; then
//   ω_0 = 1,   ω_i = √(Var[x_0] + Σ_{j<i} Var[f_j])   (i ≥ 1),
// the std the residual stream of the same model would have at sublayer i without the Post-LN norms (the reference
// code's "ratio w.r.t. the un-adjusted output from PreLN"; its first sublayer keeps ratio 1): ω_i·x_i has the
// variance of the pre-norm sum before it, so ω_1 < ω_0 = 1 when the embedding output is small.
// Initialisation: Xavier N(0, 2/(fan_in + fan_out)) for every matrix and embedding (the paper keeps fairseq's
// default Xavier init; the `xavier` rule's numbers), biases 0, norm gains 1. ω is fixed, or with `learnable` a
// trained scalar per residual add initialised to the profiled value.
#include <cmath>
#include <optional>
#include <vector>

#include "scaling/rule_util.h"

namespace proplab {

namespace {

class AdminRule final : public ScalingRule {
 public:
  AdminRule(int layers, int sequences, bool learnable)
      : layers_(layers), sequences_(sequences), learnable_(learnable) {}
  std::string name() const override { return "admin"; }
  // A learnable ω starts at 1 here; ResidualSite writes the profiled value over it.
  InitSpec init(const ParamInfo& param) const override { return rule_util::xavier_init(param); }
  ResidualSpec residual(int block, Branch branch) const override {
    PROPLAB_CHECK(!omega_.empty(),
                  "admin: residual weights asked for before the profiling pass (build the rule with "
                  "models/profile.h make_model_rule)");
    const int site = 2 * block + (branch == Branch::ffn ? 1 : 0);
    PROPLAB_CHECK(site >= 0 && site < static_cast<int>(omega_.size()), "admin: block ", block, " outside the model's ",
                  layers_, " blocks");
    return {omega_[site], 1.0, learnable_, false};
  }
  std::optional<ProfileRequest> profile_request() const override {
    if (!omega_.empty()) return std::nullopt;
    return ProfileRequest{sequences_};
  }
  void set_profile(const RuleProfile& profile) override {
    PROPLAB_CHECK(static_cast<int>(profile.branch_vars.size()) == 2 * layers_, "admin: profile has ",
                  profile.branch_vars.size(), " branch variances for ", 2 * layers_, " residual adds");
    PROPLAB_CHECK(std::isfinite(profile.embed_var) && profile.embed_var >= 0, "admin: embedding variance ",
                  profile.embed_var);
    omega_.assign(profile.branch_vars.size(), 1.0);
    double stream_var = profile.embed_var;
    for (std::size_t i = 1; i < omega_.size(); ++i) {
      const double branch_var = profile.branch_vars[i - 1];
      PROPLAB_CHECK(std::isfinite(branch_var) && branch_var >= 0, "admin: branch ", i - 1, " variance ", branch_var);
      stream_var += branch_var;
      omega_[i] = std::sqrt(stream_var);
    }
  }

 private:
  int layers_;
  int sequences_;
  bool learnable_;
  std::vector<double> omega_;  // per residual add; empty until profiled
};

const RuleInfo kAdmin{
    "admin",
    "Admin (Post-LN): x ← LN(ω_i·x + f_i(x)), ω_i = √(Var[x_0] + Σ_{j<i} Var[f_j]) from a profiling pass; Xavier",
    {
        {"profile_sequences", 8, 1, 4096,
         "sequences of model.seq_len uniform random tokens in the profiling forward pass"},
        {"learnable", 0, 0, 1, "0: ω fixed; 1: ω a trained scalar per residual add, initialised to the profiled value"},
    },
    [](const ScalingConfig& config, const ModelConfig& shape) -> std::unique_ptr<ScalingRule> {
      rule_util::require_transformer(shape, "admin", "Post-LN transformers");
      rule_util::require_norm(shape, "admin", NormPlacement::post,
                              "Admin rescales the skip path of x ← LN(ω·x + f(x)), a Post-LN residual");
      // The registry has checked the range [1, 4096]; whole_param rejects fractions.
      const int sequences = rule_util::whole_param(config, "profile_sequences", 4096);
      const bool learnable = rule_util::whole_param(config, "learnable", 1) == 1;
      return std::make_unique<AdminRule>(shape.transformer().layers, sequences, learnable);
    }};
PROPLAB_REGISTER_RULE(kAdmin);

}  // namespace

}  // namespace proplab
