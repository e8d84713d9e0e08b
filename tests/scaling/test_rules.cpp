#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "core/error.h"
#include "scaling/rule.h"
#include "support/model_testing.h"

namespace proplab {

namespace {
ModelConfig transformer_shape(int layers) {
  ModelConfig shape;
  shape.set_kind(ModelKind::transformer);
  shape.transformer().layers = layers;
  return shape;
}
}  // namespace

TEST(ScalingRegistry, ListsTheRules) {
  for (const char* name : {"standard", "xavier", "custom"}) EXPECT_NE(find_rule(name), nullptr) << name;
  EXPECT_EQ(find_rule("no-such-rule"), nullptr);
}

TEST(ScalingRegistry, UnknownRuleAndBadParamsAreUserErrors) {
  ScalingConfig config;
  config.rule = "nope";
  try {
    make_rule(config, transformer_shape(2));
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("allowed: "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("standard"), std::string::npos) << e.what();
  }
  config.rule = "standard";
  config.params["bogus"] = 1;
  EXPECT_THROW(make_rule(config, transformer_shape(2)), UserError);
  config.params.clear();
  config.params["std"] = -1;
  EXPECT_THROW(make_rule(config, transformer_shape(2)), UserError);
}

// Validation runs check_rule in place of make_rule (a rule's own `check` where it has one, DeepScaleLM's, which skips
// its calibration): for every rule, on models of every kind and norm placement and with each parameter at its
// default, at either end of its documented range and (DeepScaleLM's k) past what the model allows, check_rule must
// reject exactly what make_rule rejects, with the same message.
TEST(ScalingRegistry, CheckRuleRejectsExactlyWhatMakeRuleRejects) {
  auto error_of = [](auto&& call) -> std::string {
    try {
      call();
      return "";
    } catch (const UserError& e) {
      return std::string("UserError: ") + e.what();
    } catch (const std::exception& e) {  // (a shape the study's validation rejects before any rule sees it)
      return std::string("other: ") + e.what();
    }
  };
  std::vector<ModelConfig> shapes;
  for (const NormPlacement norm : {NormPlacement::pre, NormPlacement::post, NormPlacement::both, NormPlacement::none})
    shapes.emplace_back(testing::tiny_transformer(norm));
  for (const bool residual : {false, true}) {
    MlpConfig config;
    config.layers = 4;
    config.residual = residual;
    shapes.emplace_back(config);
  }
  for (const ResnetNorm norm : {ResnetNorm::batchnorm, ResnetNorm::none}) {
    ResnetConfig config;
    config.norm = norm;
    shapes.emplace_back(config);
  }
  int rejected = 0, accepted = 0, other = 0;
  for (const RuleInfo* info : all_rules()) {
    std::vector<ScalingConfig> configs(1);
    configs[0].rule = info->name;
    for (const RuleParamDoc& doc : info->params)
      for (const double value : {doc.min_value, doc.max_value, doc.default_value, 3.0, 5.0}) {
        ScalingConfig config;
        config.rule = info->name;
        config.params[doc.key] = value;
        configs.push_back(config);
      }
    for (const ScalingConfig& config : configs)
      for (const ModelConfig& shape : shapes) {
        const std::string made = error_of([&] { make_rule(config, shape); });
        const std::string checked = error_of([&] { check_rule(config, shape); });
        EXPECT_EQ(checked, made) << info->name << " on a " << model_kind_name(shape.kind());
        ++(made.empty() ? accepted : made.starts_with("UserError") ? rejected : other);
      }
  }
  // Both outcomes are exercised (DeepScaleLM's k = 5 on a 2-block transformer's 4 adds, a ResNet rule on an MLP...).
  EXPECT_GT(rejected, 20);
  EXPECT_GT(accepted, 20);
  std::printf("%d accepted, %d rejected with a UserError, %d with another error\n", accepted, rejected, other);
}

TEST(StandardRule, Gpt2Init) {
  ScalingConfig config;
  auto rule = make_rule(config, transformer_shape(6));
  EXPECT_DOUBLE_EQ(rule->init(ParamInfo{ParamRole::attn_qkv, 256, 768, -1, ""}).std, 0.02);
  EXPECT_DOUBLE_EQ(rule->init(ParamInfo{ParamRole::token_embedding, 256, 256, -1, ""}).std, 0.02);
  EXPECT_DOUBLE_EQ(rule->init(ParamInfo{ParamRole::ffn_out, 1024, 256, -1, ""}).std, 0.02 / std::sqrt(12.0));
  EXPECT_EQ(rule->init(ParamInfo{ParamRole::bias, 0, 256, -1, ""}).kind, InitSpec::Kind::constant);
  EXPECT_DOUBLE_EQ(rule->init(ParamInfo{ParamRole::norm_gain, 0, 256, -1, ""}).value, 1.0);
  ResidualSpec r = rule->residual(3, Branch::ffn);
  EXPECT_EQ(r.lambda, 1.0);
  EXPECT_EQ(r.beta, 1.0);
  EXPECT_DOUBLE_EQ(rule->logit_scale(64), 0.125);
}

TEST(StandardRule, MlpMeanField) {
  ModelConfig shape;
  shape.set_kind(ModelKind::mlp);
  shape.mlp().sigma_w2 = 2.0;
  shape.mlp().sigma_b2 = 0.05;
  auto rule = make_rule(ScalingConfig{}, shape);
  EXPECT_DOUBLE_EQ(rule->init(ParamInfo{ParamRole::mlp_hidden, 128, 128, -1, ""}).std, std::sqrt(2.0 / 128));
  EXPECT_DOUBLE_EQ(rule->init(ParamInfo{ParamRole::bias, 0, 128, -1, ""}).std, std::sqrt(0.05));
}

TEST(XavierRule, Glorot) {
  ScalingConfig config;
  config.rule = "xavier";
  auto rule = make_rule(config, transformer_shape(2));
  EXPECT_DOUBLE_EQ(rule->init(ParamInfo{ParamRole::ffn_in, 256, 1024, -1, ""}).std, std::sqrt(2.0 / 1280));
}

TEST(CustomRule, TakesEveryNumberFromTheStudy) {
  ScalingConfig config;
  config.rule = "custom";
  config.params = {
      {"lambda", 0.9}, {"beta", 0.3}, {"learnable_beta", 1}, {"out_proj_std", 0.001}, {"logit_scale", 0.5}};
  auto rule = make_rule(config, transformer_shape(2));
  ResidualSpec r = rule->residual(0, Branch::attention);
  EXPECT_DOUBLE_EQ(r.lambda, 0.9);
  EXPECT_DOUBLE_EQ(r.beta, 0.3);
  EXPECT_FALSE(r.learnable_lambda);
  EXPECT_TRUE(r.learnable_beta);
  EXPECT_DOUBLE_EQ(rule->init(ParamInfo{ParamRole::attn_out, 256, 256, -1, ""}).std, 0.001);
  EXPECT_DOUBLE_EQ(rule->init(ParamInfo{ParamRole::attn_qkv, 256, 768, -1, ""}).std, 0.02);  // default filled in
  EXPECT_DOUBLE_EQ(rule->logit_scale(64), 0.5);
}

}  // namespace proplab
