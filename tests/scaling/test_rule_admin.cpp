// Tests for the admin rule: Xavier init and the rejection of pre/none norms and MLPs; ω against its formula from a
// given profile; ω against the branch variances measured independently on the λ = 1 model (the `xavier` rule's
// Post-LN model, which has the same parameters) for two depths and two widths; determinism of the profile (same
// seed → bitwise the same ω, whatever the thread count); the model's residual weight and the theory numbers'
// λ are the same profiled ω; finite-difference gradients of a tiny admin transformer (ω fixed and learnable); and
// the law Admin is built for: a small parameter perturbation changes a deep Post-LN model's output less than
// without it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "core/rng.h"
#include "models/model.h"
#include "models/profile.h"
#include "ops/ops.h"
#include "scaling/theory_numbers.h"
#include "support/gradcheck.h"
#include "support/model_testing.h"

namespace proplab {

namespace {

using testing::CapturingSink;
using testing::population_var;

using Params = std::map<std::string, double>;

ModelConfig post_ln(int layers, int width, int seq_len = 16) {
  ModelConfig config;
  config.transformer().layers = layers;
  config.transformer().width = width;
  config.transformer().heads = 4;
  config.transformer().vocab = 64;
  config.transformer().seq_len = seq_len;
  config.transformer().norm = NormPlacement::post;
  return config;
}

ScalingConfig admin(const Params& params = {}) {
  ScalingConfig scaling;
  scaling.rule = "admin";
  scaling.params = params;
  return scaling;
}

std::string error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const UserError& error) {
    return error.what();
  }
  ADD_FAILURE() << "expected a UserError";
  return {};
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// ω of every residual add in forward order (2l attention, 2l+1 FFN).
std::vector<double> omegas(const ScalingRule& rule, int layers) {
  std::vector<double> out;
  for (int l = 0; l < layers; ++l)
    for (Branch branch : {Branch::attention, Branch::ffn}) out.push_back(rule.residual(l, branch).lambda);
  return out;
}

// The profiling batch as models/profile.h documents it, rebuilt here: token k = below(k, vocab) of
// CounterRng(seed, stream_id("admin_profile")).
Batch profile_batch(const TransformerConfig& config, std::uint64_t seed, int sequences) {
  Batch batch;
  batch.inputs = Tensor::empty({sequences, config.seq_len}, DType::i32);
  const CounterRng rng(seed, stream_id("admin_profile"));
  for (std::int64_t k = 0; k < batch.inputs.numel(); ++k)
    batch.inputs.i32()[k] = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(k), config.vocab));
  batch.targets = batch.inputs;
  return batch;
}

}  // namespace

TEST(AdminRule, RejectsPreAndNoNormAndMlps) {
  ASSERT_NE(find_rule("admin"), nullptr);
  ModelConfig config = post_ln(2, 32);
  config.transformer().norm = NormPlacement::pre;
  const std::string pre = error_of([&] { make_rule(admin(), config); });
  EXPECT_TRUE(contains(pre,
                       "model.norm = \"pre\" conflicts with scaling rule \"admin\", which requires "
                       "model.norm = \"post\""))
      << pre;
  EXPECT_TRUE(contains(pre, "; allowed: model.norm = \"post\"")) << pre;
  config.transformer().norm = NormPlacement::none;
  EXPECT_TRUE(contains(error_of([&] { make_rule(admin(), config); }), "model.norm = \"none\" conflicts"));
  ModelConfig mlp;
  mlp.set_kind(ModelKind::mlp);
  mlp.mlp().residual = true;
  EXPECT_TRUE(contains(error_of([&] { make_rule(admin(), mlp); }),
                       "model.type = \"mlp\": scaling rule \"admin\" is defined for Post-LN transformers only"));
  EXPECT_TRUE(contains(error_of([&] {
                         make_rule(admin({{"profile_sequences", 2.5}}), (post_ln(2, 32)));
                       }),
                       "scaling.profile_sequences: 2.5 is not a whole number"));
  EXPECT_TRUE(contains(error_of([&] {
                         make_rule(admin({{"profile_sequences", 0}}), (post_ln(2, 32)));
                       }),
                       "scaling.profile_sequences: 0 is out of range"));
}

TEST(AdminRule, XavierInitAndAProfileRequestForTwoDepthsAndWidths) {
  for (int layers : {2, 12}) {
    for (int d : {32, 128}) {
      SCOPED_TRACE("layers " + std::to_string(layers) + ", width " + std::to_string(d));
      const auto rule = make_rule(admin({{"profile_sequences", 3}}), (post_ln(layers, d)));
      auto std_of = [&](ParamRole role, std::int64_t fan_in, std::int64_t fan_out) {
        return rule->init(ParamInfo{role, fan_in, fan_out, 0, ""}).std;
      };
      EXPECT_DOUBLE_EQ(std_of(ParamRole::attn_qkv, d, d), std::sqrt(2.0 / (2.0 * d)));
      EXPECT_DOUBLE_EQ(std_of(ParamRole::attn_out, d, d), std::sqrt(2.0 / (2.0 * d)));
      EXPECT_DOUBLE_EQ(std_of(ParamRole::ffn_in, d, 4 * d), std::sqrt(2.0 / (5.0 * d)));
      EXPECT_DOUBLE_EQ(std_of(ParamRole::ffn_out, 4 * d, d), std::sqrt(2.0 / (5.0 * d)));
      EXPECT_DOUBLE_EQ(std_of(ParamRole::token_embedding, 64, d), std::sqrt(2.0 / (64.0 + d)));
      EXPECT_DOUBLE_EQ(std_of(ParamRole::position_embedding, 16, d), std::sqrt(2.0 / (16.0 + d)));
      EXPECT_DOUBLE_EQ(std_of(ParamRole::readout, d, 64), std::sqrt(2.0 / (64.0 + d)));
      EXPECT_EQ(rule->init(ParamInfo{ParamRole::bias, d, d, 0, ""}).kind, InitSpec::Kind::constant);
      EXPECT_EQ(rule->init(ParamInfo{ParamRole::bias, d, d, 0, ""}).value, 0.0);
      EXPECT_EQ(rule->init(ParamInfo{ParamRole::norm_gain, d, d, 0, ""}).value, 1.0);
      EXPECT_DOUBLE_EQ(rule->logit_scale(d / 4), 1.0 / std::sqrt(d / 4.0));
      ASSERT_TRUE(rule->profile_request().has_value());
      EXPECT_EQ(rule->profile_request()->sequences, 3);
      // Residual weights do not exist before the profile.
      EXPECT_THROW(rule->residual(0, Branch::attention), InternalError);
    }
  }
  EXPECT_EQ(make_rule(admin(), (post_ln(2, 32)))->profile_request()->sequences, 8);  // the default
}

TEST(AdminRule, OmegaFollowsTheFormulaFromAGivenProfile) {
  for (int layers : {2, 5}) {
    for (double learnable : {0.0, 1.0}) {
      const auto rule = make_rule(admin({{"learnable", learnable}}), (post_ln(layers, 32)));
      RuleProfile profile;
      profile.embed_var = 0.37;
      for (int i = 0; i < 2 * layers; ++i) profile.branch_vars.push_back(0.1 + 0.05 * i * i);
      rule->set_profile(profile);
      EXPECT_FALSE(rule->profile_request().has_value());
      // ω_0 = 1, ω_i = √(Var[x_0] + Σ_{j<i} Var[f_j]).
      double sum = profile.embed_var;
      for (int i = 0; i < 2 * layers; ++i) {
        const ResidualSpec r = rule->residual(i / 2, i % 2 ? Branch::ffn : Branch::attention);
        EXPECT_DOUBLE_EQ(r.lambda, i == 0 ? 1.0 : std::sqrt(sum)) << "residual add " << i;
        EXPECT_EQ(r.beta, 1.0);
        EXPECT_EQ(r.learnable_lambda, learnable == 1.0);
        EXPECT_FALSE(r.learnable_beta);
        sum += profile.branch_vars[i];
      }
    }
  }
}

// The profiled ω against Var[x_0] and Var[f_j] measured here on the λ = 1 model: the `xavier` rule's Post-LN
// model has exactly admin's parameters (same init specs, values keyed by name) and λ = β = 1.
TEST(AdminProfile, OmegaIsTheRootOfTheSummedBranchVariancesOfTheUnitModel) {
  for (int layers : {2, 6}) {
    for (int d : {32, 64}) {
      SCOPED_TRACE("layers " + std::to_string(layers) + ", width " + std::to_string(d));
      const ModelConfig config = post_ln(layers, d);
      const std::uint64_t seed = 21;
      const auto rule = make_model_rule(config, admin({{"profile_sequences", 3}}), seed);
      const std::vector<double> omega = omegas(*rule, layers);

      ScalingConfig xavier;
      xavier.rule = "xavier";
      auto unit_model = make_model(config, xavier, seed);
      auto admin_model = make_model(config, admin({{"profile_sequences", 3}}), seed);
      ASSERT_EQ(unit_model->params().all().size(), admin_model->params().all().size());
      for (std::size_t i = 0; i < unit_model->params().all().size(); ++i)
        EXPECT_EQ(unit_model->params().all()[i]->value.to_vector(), admin_model->params().all()[i]->value.to_vector())
            << unit_model->params().all()[i]->name;

      CapturingSink sink(unit_model->probes());
      StepContext context;
      context.seed = seed;
      context.training = false;
      context.sink = &sink;
      unit_model->forward_backward(profile_batch(config.transformer(), seed, 3), 0.0f, context);
      double sum = population_var(sink.values.at("embed.out"));
      ASSERT_GT(sum, 0.0);
      for (int i = 0; i < 2 * layers; ++i) {
        const double expected = i == 0 ? 1.0 : std::sqrt(sum);
        EXPECT_NEAR(omega[i], expected, 1e-9 * expected) << "residual add " << i;
        const std::string branch = "blocks." + std::to_string(i / 2) + (i % 2 ? ".ffn.out" : ".attn.out");
        sum += population_var(sink.values.at(branch));
      }
      // From the second add on, ω grows with depth: every branch adds variance. (ω_0 = 1 passes the embedding
      // through unscaled; ω_1 = √(Var[x_0] + Var[f_0]) is below 1 with Xavier's small embedding variance.)
      for (int i = 2; i < 2 * layers; ++i) EXPECT_GT(omega[i], omega[i - 1]) << "residual add " << i;
      std::printf("admin %d x %d: omega_1 = %.4f, omega_last = %.4f\n", layers, d, omega[1], omega.back());
    }
  }
}

TEST(AdminProfile, SameSeedGivesBitwiseTheSameOmegaForAnyThreadCount) {
  const ModelConfig config = post_ln(4, 64, 32);
  const int before = threads();
  set_threads(1);
  const std::vector<double> one = omegas(*make_model_rule(config, admin(), 5), 4);
  set_threads(2);
  const std::vector<double> two = omegas(*make_model_rule(config, admin(), 5), 4);
  const std::vector<double> again = omegas(*make_model_rule(config, admin(), 5), 4);
  set_threads(before);
  EXPECT_EQ(one, two);
  EXPECT_EQ(two, again);
  const std::vector<double> other = omegas(*make_model_rule(config, admin(), 6), 4);
  EXPECT_NE(one, other);  // the profile depends on the seed
  // Dropout: the profiling pass runs in training mode with its own masks, and repeats exactly.
  ModelConfig dropped = config;
  dropped.transformer().dropout = 0.1f;
  const std::vector<double> with_dropout = omegas(*make_model_rule(dropped, admin(), 5), 4);
  EXPECT_EQ(with_dropout, omegas(*make_model_rule(dropped, admin(), 5), 4));
  EXPECT_NE(with_dropout, one);
}

// The model's residual weight is the profiled ω, and the theory numbers carry the same ω: with `learnable` the
// model's λ parameters hold it; with fixed ω it is measured from the Post-LN sums the model computes,
// λ = ⟨sum − f, x⟩/⟨x, x⟩.
TEST(AdminModel, ModelAndTheoryNumbersUseTheSameProfiledOmega) {
  const ModelConfig config = post_ln(3, 32);
  const std::uint64_t seed = 13;
  {
    const ScalingConfig scaling = admin({{"learnable", 1}});
    auto model = make_model(config, scaling, seed);
    const theory::TransformerNumbers numbers =
        transformer_numbers(*make_model_rule(config, scaling, seed), config.transformer());
    for (int l = 0; l < 3; ++l) {
      const std::string block = "blocks." + std::to_string(l);
      Parameter* attn = model->params().find(block + ".attn.lambda");
      Parameter* ffn = model->params().find(block + ".ffn.lambda");
      ASSERT_NE(attn, nullptr);
      ASSERT_NE(ffn, nullptr);
      EXPECT_EQ(attn->value.item(), static_cast<float>(numbers.blocks[l].attn_residual.lambda)) << block;
      EXPECT_EQ(ffn->value.item(), static_cast<float>(numbers.blocks[l].ffn_residual.lambda)) << block;
      EXPECT_EQ(numbers.blocks[l].attn_residual.beta, 1.0);
      EXPECT_EQ(model->params().find(block + ".attn.beta"), nullptr);
    }
    EXPECT_GT(numbers.blocks[2].ffn_residual.lambda, 1.0);
  }
  {
    const ScalingConfig scaling = admin();
    auto model = make_model(config, scaling, seed);
    EXPECT_EQ(model->params().find("blocks.0.attn.lambda"), nullptr);
    const theory::TransformerNumbers numbers =
        transformer_numbers(*make_model_rule(config, scaling, seed), config.transformer());
    CapturingSink sink(model->probes());
    StepContext context;
    context.sink = &sink;
    context.training = false;
    model->forward_backward(testing::token_batch(2, 16, 64, 4), 0.0f, context);
    for (int l = 0; l < 3; ++l) {
      const std::string block = "blocks." + std::to_string(l);
      const std::pair<const char*, const char*> sites[] = {{".in", ".attn"}, {".mid", ".ffn"}};
      for (const auto& [input, site] : sites) {
        const std::vector<float>& x = sink.values.at(block + input);
        const std::vector<float>& f = sink.values.at(block + site + ".out");
        const std::vector<float>& sum = sink.values.at(block + site + ".sum");
        double xx = 0.0, rx = 0.0;
        for (std::size_t i = 0; i < x.size(); ++i) {
          xx += static_cast<double>(x[i]) * x[i];
          rx += (static_cast<double>(sum[i]) - f[i]) * x[i];
        }
        const double predicted = std::string(site) == ".attn" ? numbers.blocks[l].attn_residual.lambda
                                                              : numbers.blocks[l].ffn_residual.lambda;
        EXPECT_NEAR(rx / xx, predicted, 1e-5 * predicted) << block << site;
      }
    }
  }
}

class AdminGradient : public ::testing::TestWithParam<bool> {};

TEST_P(AdminGradient, MatchesFiniteDifferences) {
  const bool learnable = GetParam();
  ModelConfig config;
  config.transformer().layers = 2;
  config.transformer().width = 8;
  config.transformer().heads = 2;
  config.transformer().ffn_mult = 2;
  config.transformer().vocab = 11;
  config.transformer().seq_len = 5;
  config.transformer().norm = NormPlacement::post;
  config.transformer().tie_embeddings = learnable;  // one untied head
  auto model = make_model(config, admin({{"learnable", learnable ? 1.0 : 0.0}, {"profile_sequences", 2}}), 7);
  EXPECT_EQ(model->params().find("blocks.1.ffn.lambda") != nullptr, learnable);
  const Batch batch = testing::token_batch(2, 5, 11, 3);
  model->params().zero_grads();
  model->forward_backward(batch, 1.0f, StepContext{});
  testing::GradCheckOptions options;
  options.step = 1e-2;
  options.rtol = 3e-2;
  options.atol = 2e-4;
  options.max_elements = 40;
  testing::check_all_parameters(
      *model, [&] { return model->evaluate(batch); }, options);
}

INSTANTIATE_TEST_SUITE_P(FixedAndLearnable, AdminGradient, ::testing::Values(false, true),
                         [](const auto& info) { return std::string(info.param ? "learnable" : "fixed"); });

// The law (Liu et al. 2020, Sec. 4-5): Post-LN depends heavily on its residual branches, so a small parameter
// perturbation changes its output by an amount that grows with depth; Admin's ω shrinks each branch's share and
// with it the output change. Measured: E|F(w + δ) − F(w)|² over the logits for δ = 1% of each weight's std.
TEST(AdminModel, SmallPerturbationChangesTheDeepPostLnOutputLessThanWithoutAdmin) {
  auto output_change = [](const ScalingConfig& scaling, int layers) {
    ModelConfig config = post_ln(layers, 64, 16);
    auto model = make_model(config, scaling, 3);
    const Batch batch = testing::token_batch(2, 16, 64, 8);
    CapturingSink before(model->probes());
    StepContext context;
    context.training = false;
    context.sink = &before;
    model->forward_backward(batch, 0.0f, context);
    int n = 0;
    for (auto& p : model->params().all()) {
      if (p->info.role == ParamRole::residual_scale || p->info.role == ParamRole::norm_gain ||
          p->info.role == ParamRole::norm_bias || p->info.role == ParamRole::bias)
        continue;
      const Tensor noise = testing::random_tensor(p->value.shape(), 100 + n++);
      const double std = std::sqrt(population_var(p->value.to_vector()));
      ops::axpy(static_cast<float>(0.01 * std), noise, p->value);
    }
    CapturingSink after(model->probes());
    context.sink = &after;
    model->forward_backward(batch, 0.0f, context);
    const std::vector<float>& a = before.values.at("head.logits");
    const std::vector<float>& b = after.values.at("head.logits");
    double change = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i) change += (static_cast<double>(b[i]) - a[i]) * (b[i] - a[i]);
    return change / static_cast<double>(a.size());
  };
  ScalingConfig xavier;
  xavier.rule = "xavier";
  const double post_ln_change = output_change(xavier, 24), admin_change = output_change(admin(), 24);
  std::printf("24-layer Post-LN output change: xavier %.4e, admin %.4e (ratio %.2f)\n", post_ln_change, admin_change,
              post_ln_change / admin_change);
  EXPECT_LT(admin_change, post_ln_change / 2);
}

}  // namespace proplab
