// Tests for the rules from the literature (deepnorm, keel, rezero, skipinit, tfixup, depth_mup, mup): λ, β and init
// stds against each paper's formula at two depths and two widths, the errors for a model a rule cannot scale, the
// learnable scalars and row-block stds in built models, finite-difference gradients of a tiny model under each
// rule, and ReZero/SkipInit starting as the identity map.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/rng.h"
#include "models/model.h"
#include "models/transformer.h"
#include "nn/parameter.h"
#include "support/gradcheck.h"
#include "support/model_testing.h"

namespace proplab {

using testing::check_all_parameters;
using testing::tiny_transformer;
using testing::token_batch;

namespace {

using testing::CapturingSink;

using Params = std::map<std::string, double>;

ModelConfig transformer_shape(int layers, int width, NormPlacement norm = NormPlacement::pre) {
  ModelConfig shape;
  shape.set_kind(ModelKind::transformer);
  shape.transformer().layers = layers;
  shape.transformer().width = width;
  shape.transformer().norm = norm;
  return shape;
}

ModelConfig mlp_shape(int layers, int width, bool residual) {
  ModelConfig shape;
  shape.set_kind(ModelKind::mlp);
  shape.mlp().layers = layers;
  shape.mlp().width = width;
  shape.mlp().residual = residual;
  return shape;
}

std::unique_ptr<ScalingRule> rule_for(const std::string& name, const ModelConfig& shape, const Params& params = {}) {
  ScalingConfig config;
  config.rule = name;
  config.params = params;
  return make_rule(config, shape);
}

ParamInfo info(ParamRole role, std::int64_t fan_in, std::int64_t fan_out) {
  return ParamInfo{role, fan_in, fan_out, 0, ""};
}

double xavier(double fan_in, double fan_out) { return std::sqrt(2.0 / (fan_in + fan_out)); }

// The std of a normal InitSpec without row blocks (a failure otherwise).
double std_of(const ScalingRule& rule, ParamRole role, std::int64_t fan_in, std::int64_t fan_out) {
  const InitSpec spec = rule.init(info(role, fan_in, fan_out));
  EXPECT_EQ(spec.kind, InitSpec::Kind::normal) << param_role_name(role);
  EXPECT_TRUE(spec.row_block_stds.empty()) << param_role_name(role);
  return spec.std;
}

// The row-block stds of the packed QKV matrix of width d (fan-out per projection d, as the transformer sets it).
std::vector<double> qkv_stds(const ScalingRule& rule, int d) {
  const InitSpec spec = rule.init(info(ParamRole::attn_qkv, d, d));
  EXPECT_EQ(spec.kind, InitSpec::Kind::normal);
  return spec.row_block_stds;
}

void expect_zero_biases_and_unit_gains(const ScalingRule& rule) {
  for (ParamRole role : {ParamRole::bias, ParamRole::norm_bias}) {
    const InitSpec spec = rule.init(info(role, 16, 16));
    EXPECT_EQ(spec.kind, InitSpec::Kind::constant) << rule.name();
    EXPECT_EQ(spec.value, 0.0) << rule.name();
  }
  const InitSpec gain = rule.init(info(ParamRole::norm_gain, 16, 16));
  EXPECT_EQ(gain.kind, InitSpec::Kind::constant) << rule.name();
  EXPECT_EQ(gain.value, 1.0) << rule.name();
}

// The message of the UserError `action` throws (a test failure when it throws nothing).
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

}  // namespace

TEST(LiteratureRules, AreRegistered) {
  for (const char* name : {"deepnorm", "keel", "rezero", "skipinit", "tfixup", "depth_mup", "mup"})
    EXPECT_NE(find_rule(name), nullptr) << name;
}

TEST(DeepNormRule, AlphaAndBetaInitFollowTheDecoderAndEncoderFormulas) {
  for (int layers : {3, 48}) {
    for (int d : {64, 512}) {
      SCOPED_TRACE("layers " + std::to_string(layers) + ", width " + std::to_string(d));
      const double alpha = std::pow(2.0 * layers, 0.25), beta = std::pow(8.0 * layers, -0.25);
      for (double form : {0.0, 1.0}) {
        auto rule = rule_for("deepnorm", transformer_shape(layers, d, NormPlacement::post), {{"form", form}});
        for (int block : {0, layers - 1}) {
          for (Branch branch : {Branch::attention, Branch::ffn}) {
            const ResidualSpec r = rule->residual(block, branch);
            EXPECT_DOUBLE_EQ(r.lambda, alpha);
            EXPECT_DOUBLE_EQ(r.beta, 1.0);
            EXPECT_FALSE(r.learnable_lambda || r.learnable_beta);
          }
        }
        const double x_dd = xavier(d, d);
        const std::vector<double> qkv = qkv_stds(*rule, d);
        ASSERT_EQ(qkv.size(), 3u);
        EXPECT_DOUBLE_EQ(qkv[0], x_dd);  // Q untouched
        EXPECT_DOUBLE_EQ(qkv[1], x_dd);  // K untouched
        EXPECT_DOUBLE_EQ(qkv[2], x_dd * beta);
        EXPECT_DOUBLE_EQ(std_of(*rule, ParamRole::attn_out, d, d), x_dd * beta);
        EXPECT_DOUBLE_EQ(std_of(*rule, ParamRole::ffn_in, d, 4 * d), xavier(d, 4 * d) * beta);
        EXPECT_DOUBLE_EQ(std_of(*rule, ParamRole::ffn_out, 4 * d, d), xavier(4 * d, d) * beta);
        EXPECT_DOUBLE_EQ(std_of(*rule, ParamRole::token_embedding, 256, d), xavier(256, d));
        EXPECT_DOUBLE_EQ(std_of(*rule, ParamRole::position_embedding, 128, d), xavier(128, d));
        EXPECT_DOUBLE_EQ(std_of(*rule, ParamRole::readout, d, 256), xavier(d, 256));
        expect_zero_biases_and_unit_gains(*rule);
        EXPECT_DOUBLE_EQ(rule->logit_scale(64), 0.125);
      }
      auto fixed = rule_for("deepnorm", transformer_shape(layers, d, NormPlacement::post), {{"base_std", 0.05}});
      const std::vector<double> qkv = qkv_stds(*fixed, d);
      ASSERT_EQ(qkv.size(), 3u);
      EXPECT_DOUBLE_EQ(qkv[0], 0.05);
      EXPECT_DOUBLE_EQ(qkv[2], 0.05 * beta);
      EXPECT_DOUBLE_EQ(std_of(*fixed, ParamRole::ffn_out, 4 * d, d), 0.05 * beta);
      EXPECT_DOUBLE_EQ(std_of(*fixed, ParamRole::token_embedding, 256, d), 0.05);
    }
  }
  const std::string form = error_of([] {
    rule_for("deepnorm", transformer_shape(2, 8, NormPlacement::post), {{"form", 0.5}});
  });
  EXPECT_TRUE(contains(form, "scaling.form: 0.5 is not a whole number")) << form;
  EXPECT_TRUE(contains(form, "allowed: 0, 1")) << form;
}

// Keel: λ = α = L = 2N residual sublayers on every add, β = 1, fixed; GPT-2's init with base_std.
TEST(KeelRule, AlphaIsTheNumberOfResidualSublayersAndInitIsGpt2) {
  for (int layers : {3, 48}) {
    for (int d : {64, 512}) {
      SCOPED_TRACE("layers " + std::to_string(layers) + ", width " + std::to_string(d));
      auto rule = rule_for("keel", transformer_shape(layers, d, NormPlacement::both));
      for (int block : {0, layers - 1}) {
        for (Branch branch : {Branch::attention, Branch::ffn}) {
          const ResidualSpec r = rule->residual(block, branch);
          EXPECT_DOUBLE_EQ(r.lambda, 2.0 * layers);
          EXPECT_DOUBLE_EQ(r.beta, 1.0);
          EXPECT_FALSE(r.learnable_lambda || r.learnable_beta);
        }
      }
      const double out_std = 0.02 / std::sqrt(2.0 * layers);
      EXPECT_DOUBLE_EQ(std_of(*rule, ParamRole::attn_qkv, d, d), 0.02);
      EXPECT_DOUBLE_EQ(std_of(*rule, ParamRole::attn_out, d, d), out_std);
      EXPECT_DOUBLE_EQ(std_of(*rule, ParamRole::ffn_in, d, 4 * d), 0.02);
      EXPECT_DOUBLE_EQ(std_of(*rule, ParamRole::ffn_out, 4 * d, d), out_std);
      EXPECT_DOUBLE_EQ(std_of(*rule, ParamRole::token_embedding, 256, d), 0.02);
      EXPECT_DOUBLE_EQ(std_of(*rule, ParamRole::position_embedding, 128, d), 0.02);
      EXPECT_DOUBLE_EQ(std_of(*rule, ParamRole::readout, d, 256), 0.02);
      expect_zero_biases_and_unit_gains(*rule);
      EXPECT_DOUBLE_EQ(rule->logit_scale(64), 0.125);
      EXPECT_DOUBLE_EQ(rule->output_multiplier(), 1.0);
      // The same init as the standard rule at std = base_std.
      auto standard = rule_for("standard", transformer_shape(layers, d, NormPlacement::both), {{"std", 0.05}});
      auto scaled = rule_for("keel", transformer_shape(layers, d, NormPlacement::both), {{"base_std", 0.05}});
      for (ParamRole role : {ParamRole::attn_qkv, ParamRole::attn_out, ParamRole::ffn_in, ParamRole::ffn_out,
                             ParamRole::token_embedding, ParamRole::readout})
        EXPECT_DOUBLE_EQ(std_of(*scaled, role, d, d), std_of(*standard, role, d, d)) << param_role_name(role);
      // alpha > 0 replaces L.
      auto fixed = rule_for("keel", transformer_shape(layers, d, NormPlacement::both), {{"alpha", 3.5}});
      EXPECT_DOUBLE_EQ(fixed->residual(0, Branch::attention).lambda, 3.5);
      EXPECT_DOUBLE_EQ(fixed->residual(layers - 1, Branch::ffn).beta, 1.0);
    }
  }
}

TEST(ReZeroAndSkipInit, LearnableBranchWeightFromAlpha0AndXavierInit) {
  for (const char* name : {"rezero", "skipinit"}) {
    for (double alpha0 : {0.0, 0.3}) {
      for (int layers : {2, 64}) {
        for (int d : {32, 256}) {
          SCOPED_TRACE(std::string(name) + ", alpha0 " + std::to_string(alpha0) + ", layers " + std::to_string(layers) +
                       ", width " + std::to_string(d));
          Params params;
          if (alpha0 != 0) params["alpha0"] = alpha0;  // 0 is the default
          auto rule = rule_for(name, transformer_shape(layers, d, NormPlacement::none), params);
          for (int block : {0, layers - 1}) {
            for (Branch branch : {Branch::attention, Branch::ffn}) {
              const ResidualSpec r = rule->residual(block, branch);
              EXPECT_EQ(r.lambda, 1.0);
              EXPECT_FALSE(r.learnable_lambda);
              EXPECT_EQ(r.beta, alpha0);
              EXPECT_TRUE(r.learnable_beta);
            }
          }
          EXPECT_EQ(rule->init(info(ParamRole::residual_scale, 1, 1)).value, alpha0);
          const std::vector<double> qkv = qkv_stds(*rule, d);
          EXPECT_TRUE(qkv.empty());
          EXPECT_DOUBLE_EQ(rule->init(info(ParamRole::attn_qkv, d, d)).std, xavier(d, d));
          EXPECT_DOUBLE_EQ(std_of(*rule, ParamRole::ffn_in, d, 4 * d), xavier(d, 4 * d));
          EXPECT_DOUBLE_EQ(std_of(*rule, ParamRole::attn_out, d, d), xavier(d, d));
          EXPECT_DOUBLE_EQ(std_of(*rule, ParamRole::token_embedding, 256, d), xavier(256, d));
          expect_zero_biases_and_unit_gains(*rule);
        }
      }
    }
    // A residual MLP keeps its mean-field init from [model].
    ModelConfig mlp = mlp_shape(6, 64, true);
    mlp.mlp().sigma_w2 = 2.0;
    auto rule = rule_for(name, mlp, {{"alpha0", 0.1}});
    EXPECT_DOUBLE_EQ(std_of(*rule, ParamRole::mlp_hidden, 64, 64), std::sqrt(2.0 / 64));
    EXPECT_EQ(rule->residual(3, Branch::mlp).beta, 0.1);
    EXPECT_TRUE(rule->residual(3, Branch::mlp).learnable_beta);
  }
}

TEST(TFixupRule, DecoderScaleNineNToTheMinusQuarter) {
  for (int layers : {2, 96}) {
    for (int d : {64, 768}) {
      SCOPED_TRACE("layers " + std::to_string(layers) + ", width " + std::to_string(d));
      const double s = std::pow(9.0 * layers, -0.25);
      auto rule = rule_for("tfixup", transformer_shape(layers, d, NormPlacement::none));
      const ResidualSpec r = rule->residual(layers - 1, Branch::ffn);
      EXPECT_EQ(r.lambda, 1.0);
      EXPECT_EQ(r.beta, 1.0);
      EXPECT_FALSE(r.learnable_lambda || r.learnable_beta);
      const std::vector<double> qkv = qkv_stds(*rule, d);
      ASSERT_EQ(qkv.size(), 3u);
      EXPECT_DOUBLE_EQ(qkv[0], xavier(d, d));
      EXPECT_DOUBLE_EQ(qkv[1], xavier(d, d));
      EXPECT_DOUBLE_EQ(qkv[2], xavier(d, d) * s);
      EXPECT_DOUBLE_EQ(std_of(*rule, ParamRole::attn_out, d, d), xavier(d, d) * s);
      EXPECT_DOUBLE_EQ(std_of(*rule, ParamRole::ffn_in, d, 4 * d), xavier(d, 4 * d) * s);
      EXPECT_DOUBLE_EQ(std_of(*rule, ParamRole::ffn_out, 4 * d, d), xavier(4 * d, d) * s);
      EXPECT_DOUBLE_EQ(std_of(*rule, ParamRole::token_embedding, 50257, d), s / std::sqrt(d));
      EXPECT_DOUBLE_EQ(std_of(*rule, ParamRole::position_embedding, 128, d), s / std::sqrt(d));
      EXPECT_DOUBLE_EQ(std_of(*rule, ParamRole::readout, d, 50257), xavier(d, 50257));
      expect_zero_biases_and_unit_gains(*rule);
    }
  }
}

TEST(DepthMupRule, BranchMultiplierAOverRootNAndFanInInit) {
  for (int layers : {4, 64}) {
    for (int d : {128, 1024}) {
      for (double a : {1.0, 2.5}) {
        SCOPED_TRACE("layers " + std::to_string(layers) + ", width " + std::to_string(d) + ", a " + std::to_string(a));
        Params params;
        if (a != 1.0) params["a"] = a;
        auto rule = rule_for("depth_mup", transformer_shape(layers, d), params);
        for (int block : {0, layers - 1}) {
          for (Branch branch : {Branch::attention, Branch::ffn}) {
            const ResidualSpec r = rule->residual(block, branch);
            EXPECT_EQ(r.lambda, 1.0);
            EXPECT_DOUBLE_EQ(r.beta, a / std::sqrt(layers));
            EXPECT_FALSE(r.learnable_lambda || r.learnable_beta);
          }
        }
        EXPECT_DOUBLE_EQ(rule->init(info(ParamRole::attn_qkv, d, d)).std, 1.0 / std::sqrt(d));
        EXPECT_DOUBLE_EQ(std_of(*rule, ParamRole::ffn_in, d, 4 * d), 1.0 / std::sqrt(d));
        EXPECT_DOUBLE_EQ(std_of(*rule, ParamRole::ffn_out, 4 * d, d), 1.0 / std::sqrt(4 * d));
        EXPECT_DOUBLE_EQ(std_of(*rule, ParamRole::attn_out, d, d), 1.0 / std::sqrt(d));
        EXPECT_DOUBLE_EQ(std_of(*rule, ParamRole::readout, d, 256), 1.0 / std::sqrt(d));
        EXPECT_DOUBLE_EQ(std_of(*rule, ParamRole::token_embedding, 256, d), 1.0);
        expect_zero_biases_and_unit_gains(*rule);
      }
    }
  }
  auto embed = rule_for("depth_mup", transformer_shape(4, 64), {{"embed_std", 0.02}});
  EXPECT_DOUBLE_EQ(std_of(*embed, ParamRole::position_embedding, 128, 64), 0.02);
  // A residual MLP of L layers has L - 1 residual blocks.
  auto mlp = rule_for("depth_mup", mlp_shape(17, 64, true), {{"a", 2.0}});
  EXPECT_DOUBLE_EQ(mlp->residual(5, Branch::mlp).beta, 2.0 / 4.0);
}

TEST(MupRule, WidthMultiplierSetsLrOutputAndLogitScale) {
  for (int d : {256, 1024}) {
    for (int layers : {2, 24}) {
      SCOPED_TRACE("layers " + std::to_string(layers) + ", width " + std::to_string(d));
      const double width_mult = d / 256.0;
      ModelConfig shape = transformer_shape(layers, d);
      auto rule = rule_for("mup", shape);
      const ResidualSpec r = rule->residual(layers - 1, Branch::attention);
      EXPECT_EQ(r.lambda, 1.0);
      EXPECT_EQ(r.beta, 1.0);
      EXPECT_DOUBLE_EQ(rule->init(info(ParamRole::attn_qkv, d, d)).std, 1.0 / std::sqrt(d));
      EXPECT_DOUBLE_EQ(std_of(*rule, ParamRole::attn_out, d, d), 1.0 / std::sqrt(d));
      EXPECT_DOUBLE_EQ(std_of(*rule, ParamRole::ffn_in, d, 4 * d), 1.0 / std::sqrt(d));
      EXPECT_DOUBLE_EQ(std_of(*rule, ParamRole::ffn_out, 4 * d, d), 1.0 / std::sqrt(4 * d));
      EXPECT_DOUBLE_EQ(std_of(*rule, ParamRole::token_embedding, 256, d), 1.0);
      EXPECT_DOUBLE_EQ(std_of(*rule, ParamRole::readout, d, 256), 1.0 / std::sqrt(d));
      expect_zero_biases_and_unit_gains(*rule);
      for (ParamRole role : {ParamRole::attn_qkv, ParamRole::attn_out, ParamRole::ffn_in, ParamRole::ffn_out})
        EXPECT_DOUBLE_EQ(rule->lr_multiplier(info(role, d, d)), 1.0 / width_mult) << param_role_name(role);
      for (ParamRole role : {ParamRole::token_embedding, ParamRole::position_embedding, ParamRole::readout,
                             ParamRole::bias, ParamRole::norm_gain})
        EXPECT_EQ(rule->lr_multiplier(info(role, d, d)), 1.0) << param_role_name(role);
      EXPECT_DOUBLE_EQ(rule->output_multiplier(), 1.0 / width_mult);
      EXPECT_DOUBLE_EQ(rule->logit_scale(64), 1.0 / 64);
      EXPECT_DOUBLE_EQ(rule->logit_scale(128), 1.0 / 128);

      shape.transformer().tie_embeddings = false;
      auto zero = rule_for("mup", shape, {{"zero_readout", 1}, {"base_width", 128}, {"embed_std", 0.5}});
      const InitSpec readout = zero->init(info(ParamRole::readout, d, 256));
      EXPECT_EQ(readout.kind, InitSpec::Kind::constant);
      EXPECT_EQ(readout.value, 0.0);
      EXPECT_DOUBLE_EQ(zero->output_multiplier(), 128.0 / d);
      EXPECT_DOUBLE_EQ(zero->lr_multiplier(info(ParamRole::ffn_out, 4 * d, d)), 128.0 / d);
      EXPECT_DOUBLE_EQ(std_of(*zero, ParamRole::token_embedding, 256, d), 0.5);
    }
  }
  // MLP: hidden layers are matrix-like, the input layer is not.
  ModelConfig mlp = mlp_shape(4, 512, false);
  mlp.mlp().sigma_w2 = 2.0;
  auto rule = rule_for("mup", mlp, {{"base_width", 64}});
  EXPECT_DOUBLE_EQ(rule->lr_multiplier(info(ParamRole::mlp_hidden, 512, 512)), 1.0 / 8);
  EXPECT_EQ(rule->lr_multiplier(info(ParamRole::mlp_input, 64, 512)), 1.0);
  EXPECT_DOUBLE_EQ(std_of(*rule, ParamRole::mlp_hidden, 512, 512), std::sqrt(2.0 / 512));
  EXPECT_DOUBLE_EQ(rule->output_multiplier(), 1.0 / 8);
}

TEST(LiteratureRules, NormConflictsAreUserErrorsNamingModelNorm) {
  struct Case {
    const char* rule;
    NormPlacement wrong;
    const char* required;
  };
  for (const Case& c : {Case{"rezero", NormPlacement::pre, "none"}, Case{"rezero", NormPlacement::post, "none"},
                        Case{"skipinit", NormPlacement::pre, "none"}, Case{"tfixup", NormPlacement::post, "none"},
                        Case{"deepnorm", NormPlacement::pre, "post"}, Case{"deepnorm", NormPlacement::none, "post"},
                        Case{"deepnorm", NormPlacement::both, "post"}, Case{"rezero", NormPlacement::both, "none"},
                        Case{"keel", NormPlacement::pre, "both"}, Case{"keel", NormPlacement::post, "both"},
                        Case{"keel", NormPlacement::none, "both"}}) {
    const std::string message = error_of([&] { rule_for(c.rule, transformer_shape(4, 64, c.wrong)); });
    const std::string wrong = norm_placement_name(c.wrong);
    EXPECT_TRUE(contains(message, "model.norm = \"" + wrong + "\" conflicts with scaling rule \"" + c.rule +
                                      "\", which requires model.norm = \"" + c.required + "\""))
        << message;
    EXPECT_TRUE(contains(message, std::string("; allowed: model.norm = \"") + c.required + "\"")) << message;
  }
  // Rules that fix no norm placement accept all four.
  for (const char* rule : {"standard", "depth_mup", "mup"})
    for (NormPlacement norm : {NormPlacement::pre, NormPlacement::post, NormPlacement::both, NormPlacement::none})
      EXPECT_NO_THROW(rule_for(rule, transformer_shape(4, 64, norm))) << rule;
}

TEST(LiteratureRules, MlpModelsAreScaledOrRejectedClearly) {
  for (const char* rule : {"deepnorm", "tfixup", "keel"}) {
    const std::string message = error_of([&] { rule_for(rule, mlp_shape(4, 32, true)); });
    EXPECT_TRUE(contains(message, "model.type = \"mlp\": scaling rule \"" + std::string(rule) + "\" is defined for"))
        << message;
    EXPECT_TRUE(contains(message, "allowed: model.type = \"transformer\"")) << message;
  }
  for (const char* rule : {"rezero", "skipinit", "depth_mup"}) {
    const std::string message = error_of([&] { rule_for(rule, mlp_shape(4, 32, false)); });
    EXPECT_TRUE(contains(message, "model.residual = false: scaling rule \"" + std::string(rule) + "\"")) << message;
    EXPECT_TRUE(contains(message, "allowed: model.residual = true")) << message;
    EXPECT_NO_THROW(rule_for(rule, mlp_shape(4, 32, true))) << rule;
  }
  EXPECT_NO_THROW(rule_for("mup", mlp_shape(4, 32, false)));
  // A tied head cannot start at zero.
  const std::string tied = error_of([] { rule_for("mup", transformer_shape(2, 64), {{"zero_readout", 1}}); });
  EXPECT_TRUE(contains(tied, "model.tie_embeddings = true conflicts with scaling.zero_readout = true")) << tied;
}

TEST(LiteratureRules, LearnableScalarsExistInABuiltModel) {
  for (const char* name : {"rezero", "skipinit"}) {
    SCOPED_TRACE(name);
    ModelConfig config;
    config.transformer() = tiny_transformer(NormPlacement::none);
    ScalingConfig scaling;
    scaling.rule = name;
    scaling.params = {{"alpha0", 0.25}};
    auto model = make_model(config, scaling, 3);
    for (int l = 0; l < 2; ++l) {
      for (const char* branch : {"attn", "ffn"}) {
        const std::string prefix = "blocks." + std::to_string(l) + "." + branch;
        Parameter* beta = model->params().find(prefix + ".beta");
        ASSERT_NE(beta, nullptr) << prefix;
        ASSERT_EQ(beta->value.numel(), 1);
        EXPECT_EQ(beta->value.f32()[0], 0.25f);
        EXPECT_EQ(beta->info.role, ParamRole::residual_scale);
        EXPECT_EQ(model->params().find(prefix + ".lambda"), nullptr) << prefix;
      }
    }
    // The residual MLP gets one per residual layer.
    ModelConfig mlp;
    mlp.set_kind(ModelKind::mlp);
    mlp.mlp().layers = 3;
    mlp.mlp().width = 8;
    mlp.mlp().input_dim = 4;
    mlp.mlp().residual = true;
    auto mlp_model = make_model(mlp, scaling, 3);
    for (const char* site : {"layers.1.beta", "layers.2.beta"}) {
      Parameter* beta = mlp_model->params().find(site);
      ASSERT_NE(beta, nullptr) << site;
      EXPECT_EQ(beta->value.f32()[0], 0.25f);
    }
    EXPECT_EQ(mlp_model->params().find("layers.0.beta"), nullptr);
  }
}

TEST(LiteratureRules, BuiltModelsCarryRowBlockStdsAndLrMultipliers) {
  ModelConfig config;
  config.transformer() = tiny_transformer(NormPlacement::post);
  config.transformer().width = 64;
  config.transformer().heads = 4;
  config.transformer().layers = 8;
  ScalingConfig scaling;
  scaling.rule = "deepnorm";
  auto model = make_model(config, scaling, 5);
  Parameter* qkv = model->params().find("blocks.3.attn.qkv.weight");
  ASSERT_NE(qkv, nullptr);
  const std::vector<float> values = qkv->value.to_vector();
  const std::int64_t block = 64 * 64;
  const double beta = std::pow(64.0, -0.25);
  for (int b = 0; b < 3; ++b) {
    double s2 = 0;
    for (std::int64_t i = b * block; i < (b + 1) * block; ++i) s2 += static_cast<double>(values[i]) * values[i];
    const double expected = (b == 2 ? beta : 1.0) / 8.0;  // Xavier for D→D is 1/√D
    EXPECT_NEAR(std::sqrt(s2 / block), expected, 0.05 * expected) << "row block " << b;
  }

  ModelConfig mlp;
  mlp.set_kind(ModelKind::mlp);
  mlp.mlp().width = 32;
  mlp.mlp().layers = 3;
  scaling.rule = "mup";
  scaling.params = {{"base_width", 8}};
  auto mup = make_model(mlp, scaling, 5);
  EXPECT_DOUBLE_EQ(mup->params().find("layers.1.weight")->lr_multiplier, 0.25);
  EXPECT_DOUBLE_EQ(mup->params().find("layers.0.weight")->lr_multiplier, 1.0);
  EXPECT_DOUBLE_EQ(mup->params().find("readout.weight")->lr_multiplier, 1.0);
}

TEST(InitTensor, RowBlocksScaleTheSameElementIndexedDraws) {
  Tensor plain = Tensor::zeros({6, 5});
  Tensor blocked = Tensor::zeros({6, 5});
  init_tensor(plain, InitSpec::normal_std(1.0), 17, "w");
  init_tensor(blocked, InitSpec::normal_row_blocks({0.5, 2.0, 0.0}), 17, "w");
  const std::vector<float> a = plain.to_vector(), b = blocked.to_vector();
  for (int i = 0; i < 30; ++i) {
    const double scale = i < 10 ? 0.5 : i < 20 ? 2.0 : 0.0;
    EXPECT_NEAR(b[i], scale * a[i], 1e-6 * std::fabs(a[i]) + 1e-12) << i;
  }
  EXPECT_NE(a[0], 0.0f);
  Tensor odd = Tensor::zeros({5, 2});
  EXPECT_THROW(init_tensor(odd, InitSpec::normal_row_blocks({1.0, 1.0}), 17, "w"), InternalError);
}

struct GradientCase {
  std::string rule;
  NormPlacement norm;
  Params params;
};

class LiteratureRuleGradient : public ::testing::TestWithParam<GradientCase> {};

TEST_P(LiteratureRuleGradient, MatchesFiniteDifferences) {
  const GradientCase& c = GetParam();
  ModelConfig config;
  config.transformer() = tiny_transformer(c.norm);
  config.transformer().tie_embeddings = c.rule != "tfixup";  // exercise an untied head under one rule
  ScalingConfig scaling;
  scaling.rule = c.rule;
  scaling.params = c.params;
  auto model = make_model(config, scaling, 7);
  const Batch batch = token_batch(2, 5, 11, 3);
  model->params().zero_grads();
  model->forward_backward(batch, 1.0f, StepContext{});
  testing::GradCheckOptions options;
  options.step = 1e-2;
  options.rtol = 3e-2;
  options.atol = 2e-4;
  options.max_elements = 40;
  for (auto& p : model->params().all()) {
    SCOPED_TRACE(p->name);
    const testing::GradCheckResult result =
        testing::check_gradient([&] { return model->evaluate(batch); }, p->value, p->grad, options);
    EXPECT_GRAD_OK(result);
  }
}

INSTANTIATE_TEST_SUITE_P(EachRule, LiteratureRuleGradient,
                         ::testing::Values(GradientCase{"deepnorm", NormPlacement::post, {}},
                                           GradientCase{"keel", NormPlacement::both, {{"base_std", 0.3}}},
                                           GradientCase{"rezero", NormPlacement::none, {{"alpha0", 0.5}}},
                                           GradientCase{"skipinit", NormPlacement::none, {{"alpha0", 0.5}}},
                                           GradientCase{"tfixup", NormPlacement::none, {}},
                                           GradientCase{
                                               "depth_mup", NormPlacement::pre, {{"a", 1.5}, {"embed_std", 0.5}}},
                                           GradientCase{"depth_mup", NormPlacement::none, {{"embed_std", 0.5}}},
                                           GradientCase{"mup", NormPlacement::pre, {{"base_width", 4}}}),
                         [](const auto& info) { return info.param.rule + "_" + norm_placement_name(info.param.norm); });

TEST(LiteratureRules, ReZeroAndSkipInitAtZeroStartAsTheIdentity) {
  for (const char* name : {"rezero", "skipinit"}) {
    SCOPED_TRACE(name);
    ModelConfig config;
    config.transformer() = tiny_transformer(NormPlacement::none);
    config.transformer().layers = 3;
    ScalingConfig scaling;
    scaling.rule = name;  // alpha0 defaults to 0
    auto model = make_model(config, scaling, 9);
    CapturingSink sink(model->probes());
    StepContext context;
    context.sink = &sink;
    model->forward_backward(token_batch(2, 5, 11, 4), 1.0f, context);
    const std::vector<float>& embedded = sink.values.at("embed.out");
    bool any_nonzero = false;
    for (float v : embedded) any_nonzero = any_nonzero || v != 0.0f;
    EXPECT_TRUE(any_nonzero);
    for (int l = 0; l < 3; ++l) {
      for (const char* point : {".mid", ".out"}) {
        const std::string probe = "blocks." + std::to_string(l) + point;
        ASSERT_TRUE(sink.values.count(probe)) << probe;
        EXPECT_EQ(sink.values.at(probe), embedded) << probe;
      }
      // The branches themselves are not zero: only their weight is.
      const std::vector<float>& branch = sink.values.at("blocks." + std::to_string(l) + ".ffn.out");
      bool branch_nonzero = false;
      for (float v : branch) branch_nonzero = branch_nonzero || v != 0.0f;
      EXPECT_TRUE(branch_nonzero) << l;
    }
    // The learnable weights get a gradient, so training moves them off zero.
    EXPECT_NE(model->params().find("blocks.0.attn.beta")->grad.f32()[0], 0.0f);
  }
}

}  // namespace proplab
