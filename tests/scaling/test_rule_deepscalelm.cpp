// Tests for the deepscalelm rule: λ² + β² = 1 with β² = k/N_adds at two depths and widths, the init stds against
// DeepScaleLM's formulas (and the GELU constant against an independent numerical integral), unit-variance
// branches as the theory predicts them, finite-difference gradients of a tiny model under each norm placement,
// and the law: a width-256, depth-24 Pre-LN transformer keeps its measured residual-stream variance at 1 ± 10%.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/rng.h"
#include "models/model.h"
#include "scaling/theory_numbers.h"
#include "support/gradcheck.h"
#include "support/model_testing.h"
#include "theory/model_theory.h"

namespace proplab {

namespace {

using testing::CapturingSink;
using testing::population_var;

using Params = std::map<std::string, double>;

TransformerConfig transformer(int layers, int width, NormPlacement norm = NormPlacement::pre) {
  TransformerConfig config;
  config.layers = layers;
  config.width = width;
  config.heads = 4;
  config.norm = norm;
  return config;
}

std::unique_ptr<ScalingRule> rule_for(const TransformerConfig& config, const Params& params = {}) {
  const ModelConfig shape(config);
  ScalingConfig scaling;
  scaling.rule = "deepscalelm";
  scaling.params = params;
  return make_rule(scaling, shape);
}

std::unique_ptr<ScalingRule> mlp_rule(int layers, bool residual, const Params& params = {}) {
  ModelConfig shape;
  shape.set_kind(ModelKind::mlp);
  shape.mlp().layers = layers;
  shape.mlp().residual = residual;
  ScalingConfig scaling;
  scaling.rule = "deepscalelm";
  scaling.params = params;
  return make_rule(scaling, shape);
}

InitSpec init_of(const ScalingRule& rule, ParamRole role, std::int64_t fan_in, std::int64_t fan_out, int block) {
  return rule.init(ParamInfo{role, fan_in, fan_out, block, ""});
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

// E[gelu(z)²], z ~ N(0, q), by the trapezoid rule on a fine grid (independent of theory's closed forms).
double gelu_second_moment(double q) {
  const double s = std::sqrt(q), h = 1e-3;
  double sum = 0.0;
  for (double z = -12.0; z <= 12.0; z += h) {
    const double x = s * z;
    const double g = 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    sum += g * g * std::exp(-0.5 * z * z);
  }
  return sum * h / std::sqrt(2.0 * M_PI);
}

using testing::token_batch;

}  // namespace

TEST(DeepScaleLmRule, ResidualWeightsAreUnitNormWithBetaSquaredKOverAdds) {
  ASSERT_NE(find_rule("deepscalelm"), nullptr);
  for (int layers : {3, 24}) {
    for (int d : {64, 256}) {
      for (double k : {2.0, 0.5}) {
        SCOPED_TRACE("layers " + std::to_string(layers) + ", width " + std::to_string(d) + ", k " + std::to_string(k));
        const auto rule = rule_for(transformer(layers, d), {{"k", k}});
        for (int block : {0, layers - 1}) {
          for (Branch branch : {Branch::attention, Branch::ffn}) {
            const ResidualSpec r = rule->residual(block, branch);
            EXPECT_NEAR(r.lambda * r.lambda + r.beta * r.beta, 1.0, 1e-14);
            EXPECT_NEAR(r.beta * r.beta, k / (2.0 * layers), 1e-14);
            EXPECT_FALSE(r.learnable_lambda || r.learnable_beta);
          }
        }
      }
    }
  }
  // Residual MLP: N_adds = layers - 1.
  const auto mlp = mlp_rule(9, true);
  const ResidualSpec r = mlp->residual(4, Branch::mlp);
  EXPECT_NEAR(r.beta * r.beta, 2.0 / 8.0, 1e-14);
  EXPECT_NEAR(r.lambda * r.lambda, 6.0 / 8.0, 1e-14);
}

TEST(DeepScaleLmRule, RejectsKOutsideTheAddsAndMlpsWithoutResiduals) {
  EXPECT_NE(error_of([] { rule_for(transformer(2, 32), {{"k", 5.0}}); }).find("scaling.k"), std::string::npos);
  EXPECT_NE(error_of([] {
              rule_for(transformer(2, 32), {{"k", 0.0}});
            }).find("allowed: 0 < k <= 4"),
            std::string::npos);
  EXPECT_NO_THROW(rule_for(transformer(2, 32), {{"k", 4.0}}));
  EXPECT_NE(error_of([] { mlp_rule(4, false); }).find("model.residual"), std::string::npos);
}

TEST(DeepScaleLmRule, InitStdsFollowTheFormulas) {
  for (int d : {64, 256}) {
    for (double p : {0.0, 0.1}) {
      SCOPED_TRACE("width " + std::to_string(d) + ", dropout " + std::to_string(p));
      // No norm: with r_0 = 1 every block's attention input keeps correlation 1 (a LayerNorm would lower it by
      // 1/d), so r_l = 1 exactly when there is no dropout.
      TransformerConfig config = transformer(4, d, NormPlacement::none);
      config.activation = Activation::relu;
      config.dropout = static_cast<float>(p);
      const double keep = 1.0 - config.dropout;  // the model's float dropout, as the rule reads it
      // r_0 = 1 (every token the same): attention keeps the whole variance, r_l = 1 in every block.
      const auto rule = rule_for(config, {{"input_corr", 1.0}});
      EXPECT_DOUBLE_EQ(init_of(*rule, ParamRole::token_embedding, 256, d, -1).std, std::sqrt(keep / 2));
      EXPECT_DOUBLE_EQ(init_of(*rule, ParamRole::position_embedding, 128, d, -1).std, std::sqrt(keep / 2));
      const double ffn_var = std::sqrt(keep / 2.0) / d;  // the paper's ReLU constant at ffn_mult = 4
      for (int block = 0; block < 4; ++block) {
        const InitSpec qkv = init_of(*rule, ParamRole::attn_qkv, d, d, block);
        ASSERT_EQ(qkv.row_block_stds.size(), 3u);
        EXPECT_NEAR(qkv.row_block_stds[0] * qkv.row_block_stds[0], 1.0 / d, 1e-15);
        EXPECT_NEAR(qkv.row_block_stds[1] * qkv.row_block_stds[1], 1.0 / d, 1e-15);
        // √((1-p)/r_l)/d with r_l = 1; with dropout the stream's token correlation falls below 1 (dropout masks
        // differ between tokens), so r_l < 1 and the Var is larger.
        const double v_var = qkv.row_block_stds[2] * qkv.row_block_stds[2];
        if (p == 0.0) {
          EXPECT_NEAR(v_var, 1.0 / d, 1e-9 / d);
        } else {
          EXPECT_GT(v_var, std::sqrt(keep) / d);
        }
        EXPECT_NEAR(init_of(*rule, ParamRole::attn_out, d, d, block).std, qkv.row_block_stds[2], 1e-15);
        EXPECT_NEAR(std::pow(init_of(*rule, ParamRole::ffn_in, d, 4 * d, block).std, 2), ffn_var, 1e-15);
        EXPECT_NEAR(std::pow(init_of(*rule, ParamRole::ffn_out, 4 * d, d, block).std, 2), ffn_var, 1e-15);
        EXPECT_EQ(init_of(*rule, ParamRole::bias, d, d, block).value, 0.0);
        EXPECT_EQ(init_of(*rule, ParamRole::norm_gain, d, d, block).value, 1.0);
      }
    }
  }
  // GELU: f·s·E[gelu(z)²] = 1 with z ~ N(0, d·s), checked by an independent integral.
  TransformerConfig gelu = transformer(2, 128);
  gelu.activation = Activation::gelu_erf;
  const auto rule = rule_for(gelu);
  const double s = std::pow(init_of(*rule, ParamRole::ffn_in, 128, 512, 0).std, 2);
  EXPECT_NEAR(512.0 * s * gelu_second_moment(128.0 * s), 1.0, 1e-6);
  std::printf("gelu FFN weight Var = %.6f/d (ReLU: %.6f/d)\n", s * 128, std::sqrt(0.5));
}

TEST(DeepScaleLmRule, TheoryPredictsUnitVarianceBranchesAndStream) {
  for (NormPlacement norm : {NormPlacement::pre, NormPlacement::post, NormPlacement::none}) {
    for (float dropout : {0.0f, 0.1f}) {
      SCOPED_TRACE(std::string(norm_placement_name(norm)) + ", dropout " + std::to_string(dropout));
      TransformerConfig config = transformer(12, 128, norm);
      config.dropout = dropout;
      const auto rule = rule_for(config);
      const theory::ProbePrediction p = theory::predict_transformer(transformer_numbers(*rule, config), {});
      // Without a norm the stream's variance differs between positions (the first tokens' attention averages fewer
      // values) while the FFN init assumes one unit-variance input; GELU's E[φ²] is convex in the input variance,
      // so the FFN branches come out slightly above 1 (≤ 2.6% here) and the stream ≤ 0.6%.
      const bool normed = norm != NormPlacement::none;
      int branches = 0;
      for (const theory::ProbeTheory& t : p.probes) {
        // The norms' ε (10⁻⁵ against unit variance) leaves a normed branch's input, and so the branch, that
        // much below 1; the rule's FFN init takes the norm's output at exactly 1.
        if (t.kind == "branch") {
          const bool exact = normed || t.name.find(".attn.") != std::string::npos;
          EXPECT_NEAR(t.var, 1.0, exact ? 1e-4 : 0.03) << t.name;
          ++branches;
        }
        if (t.kind == "residual") {
          EXPECT_NEAR(t.var, 1.0, normed ? 1e-4 : 0.01) << t.name;
        }
      }
      EXPECT_EQ(branches, 24);
      // r_l = (1-p)/(d²·Var_V·Var_out) lies between the input correlation and 1 and differs between blocks as the
      // stream's correlation grows.
      const InitSpec first = init_of(*rule, ParamRole::attn_qkv, 128, 128, 0);
      const InitSpec last = init_of(*rule, ParamRole::attn_qkv, 128, 128, 11);
      const double keep = 1.0 - dropout;
      const double r_first = keep / std::pow(128.0 * first.row_block_stds[2] * first.row_block_stds[2], 2);
      const double r_last = keep / std::pow(128.0 * last.row_block_stds[2] * last.row_block_stds[2], 2);
      EXPECT_GT(r_first, 1.0 / (2 * 256));
      EXPECT_LT(r_first, 1.0);
      EXPECT_NE(r_first, r_last);
    }
  }
}

class DeepScaleLmGradient : public ::testing::TestWithParam<NormPlacement> {};

TEST_P(DeepScaleLmGradient, MatchesFiniteDifferences) {
  ModelConfig config;
  config.transformer().layers = 2;
  config.transformer().width = 8;
  config.transformer().heads = 2;
  config.transformer().ffn_mult = 2;
  config.transformer().vocab = 11;
  config.transformer().seq_len = 5;
  config.transformer().norm = GetParam();
  config.transformer().tie_embeddings = GetParam() != NormPlacement::post;  // one untied head
  ScalingConfig scaling;
  scaling.rule = "deepscalelm";
  scaling.params = {{"k", 1.0}};
  auto model = make_model(config, scaling, 7);
  const Batch batch = token_batch(2, 5, 11, 3);
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

INSTANTIATE_TEST_SUITE_P(EachNorm, DeepScaleLmGradient,
                         ::testing::Values(NormPlacement::pre, NormPlacement::post, NormPlacement::none),
                         [](const auto& info) { return std::string(norm_placement_name(info.param)); });

// The law: at init the residual stream of a deep Pre-LN transformer stays at variance 1 (± 10%) at every block.
TEST(DeepScaleLmRule, PreLnResidualStreamKeepsUnitVarianceAtDepth24) {
  ModelConfig config;
  config.transformer() = transformer(24, 256, NormPlacement::pre);
  // The default 128 tokens per sequence. The rule normalises the attention branch with the position-resolved
  // theory (theory/token_field: causal attention gives short prefixes and nearby tokens more shared signal than
  // one exchangeable correlation would); with a single exchangeable r the measured stream drifted to 1.135 here.
  config.transformer().seq_len = 128;
  ScalingConfig scaling;
  scaling.rule = "deepscalelm";
  auto model = make_model(config, scaling, 11);
  CapturingSink sink(model->probes());
  StepContext context;
  context.sink = &sink;
  model->forward_backward(token_batch(2, config.transformer().seq_len, config.transformer().vocab, 5), 1.0f, context);
  double worst = 0.0;
  for (int l = 0; l < 24; ++l) {
    for (const char* point : {".in", ".mid", ".out"}) {
      const std::string probe = "blocks." + std::to_string(l) + point;
      ASSERT_TRUE(sink.values.count(probe)) << probe;
      const double var = population_var(sink.values.at(probe));
      worst = std::max(worst, std::abs(var - 1.0));
      EXPECT_NEAR(var, 1.0, 0.10) << probe;
    }
  }
  std::printf("deepscalelm pre-LN 24x256, 128 tokens: worst |residual var - 1| = %.4f\n", worst);
}

}  // namespace proplab
