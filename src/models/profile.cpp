#include "models/profile.h"

#include "core/rng.h"
#include "models/transformer.h"
#include "probe/moments.h"

namespace proplab {

namespace {

// The rule being profiled with every residual weight 1: same initialisation, logit scale and output multiplier.
class UnitResidualRule final : public ScalingRule {
 public:
  explicit UnitResidualRule(const ScalingRule& base) : base_(base) {}
  std::string name() const override { return base_.name(); }
  InitSpec init(const ParamInfo& param) const override { return base_.init(param); }
  ResidualSpec residual(int, Branch) const override { return {}; }
  double logit_scale(int d_head) const override { return base_.logit_scale(d_head); }
  double lr_multiplier(const ParamInfo& param) const override { return base_.lr_multiplier(param); }
  double output_multiplier() const override { return base_.output_multiplier(); }

 private:
  const ScalingRule& base_;
};

// Accumulates the variance of the embedding output and of every branch output, in forward order.
class ProfileSink final : public ProbeSink {
 public:
  explicit ProfileSink(const std::vector<ProbeInfo>& probes) : probes_(probes), sums_(probes.size()) {}
  void forward(int probe, const Tensor& x, std::int64_t sequences) override {
    const ProbeKind kind = probes_.at(probe).kind;
    if (kind != ProbeKind::embed && kind != ProbeKind::branch) return;
    probe::accumulate(x, sequences, sums_.at(probe), probe::StatSelection().add(probe::Stat::var));
  }
  void backward(int, const Tensor&, std::int64_t) override {}
  void attention_logits(int, const probe::LogitSums&, const Tensor&, int, float) override {}

  RuleProfile profile() const {
    RuleProfile result;
    bool have_embed = false;
    for (std::size_t i = 0; i < probes_.size(); ++i) {
      const ProbeKind kind = probes_[i].kind;
      if (kind != ProbeKind::embed && kind != ProbeKind::branch) continue;
      PROPLAB_CHECK(!sums_[i].empty(), "profile: probe ", probes_[i].name, " was not seen in the forward pass");
      const double var = probe::finalize(sums_[i]).var;
      if (kind == ProbeKind::embed) {
        result.embed_var = var;
        have_embed = true;
      } else {
        result.branch_vars.push_back(var);
      }
    }
    PROPLAB_CHECK(have_embed, "profile: the model has no embed probe");
    return result;
  }

 private:
  const std::vector<ProbeInfo>& probes_;
  std::vector<probe::MomentSums> sums_;
};

}  // namespace

RuleProfile profile_transformer(const TransformerConfig& config, const ScalingRule& rule, std::uint64_t seed,
                                int sequences) {
  PROPLAB_CHECK(sequences >= 1, "profile: ", sequences, " sequences");
  const UnitResidualRule unit(rule);
  Transformer model(config, unit, seed);
  Batch batch;
  batch.inputs = Tensor::empty({sequences, config.seq_len}, DType::i32);
  const CounterRng rng(seed, stream_id("admin_profile"));
  std::int32_t* tokens = batch.inputs.i32();
  for (std::int64_t k = 0; k < batch.inputs.numel(); ++k)
    tokens[k] = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(k), config.vocab));
  batch.targets = batch.inputs;  // the loss is not used
  ProfileSink sink(model.probes());
  StepContext context;
  context.seed = seed;
  context.micro_step = kProfileMicroStep;
  context.training = config.dropout > 0;
  context.sink = &sink;
  model.forward_backward(batch, 0.0f, context);  // grad_scale 0: forward and loss only
  return sink.profile();
}

std::unique_ptr<ScalingRule> make_model_rule(const ModelConfig& config, const ScalingConfig& scaling,
                                             std::uint64_t seed) {
  std::unique_ptr<ScalingRule> rule = make_rule(scaling, config);
  if (const std::optional<ProfileRequest> request = rule->profile_request()) {
    PROPLAB_CHECK(config.kind() == ModelKind::transformer, "scaling rule \"", rule->name(),
                  "\" asks for a profiling pass, which exists for transformers only");
    rule->set_profile(profile_transformer(config.transformer(), *rule, seed, request->sequences));
    PROPLAB_CHECK(!rule->profile_request(), "scaling rule \"", rule->name(), "\" still asks for a profile");
  }
  return rule;
}

}  // namespace proplab
