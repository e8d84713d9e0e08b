// spec: the model description. A ModelConfig is exactly one of the three configs; code asks it for its kind and
// its config, and asking for another kind's config is a broken invariant that names both kinds.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <type_traits>

#include "spec/model.h"
#include "spec/param.h"

namespace proplab {
namespace {

TEST(ModelConfig, DefaultIsTheDefaultTransformer) {
  const ModelConfig model;
  EXPECT_EQ(model.kind(), ModelKind::transformer);
  EXPECT_EQ(model.transformer().layers, TransformerConfig{}.layers);
  EXPECT_EQ(model.transformer().activation, Activation::gelu_tanh);
  EXPECT_STREQ(model_kind_name(model.kind()), "transformer");
}

TEST(ModelConfig, HoldsOneConfigAndSetKindResetsOnlyOnAChange) {
  MlpConfig mlp;
  mlp.layers = 12;
  ModelConfig model(mlp);
  EXPECT_EQ(model.kind(), ModelKind::mlp);
  EXPECT_EQ(model.mlp().layers, 12);
  model.set_kind(ModelKind::mlp);  // already an MLP: kept
  EXPECT_EQ(model.mlp().layers, 12);
  model.set_kind(ModelKind::resnet);  // another kind: that kind's defaults
  EXPECT_EQ(model.kind(), ModelKind::resnet);
  EXPECT_EQ(model.resnet().depth, ResnetConfig{}.depth);
  model.resnet().depth = 56;
  EXPECT_EQ(model.resnet().depth, 56);
  EXPECT_STREQ(model_kind_name(ModelKind::mlp), "mlp");
  EXPECT_STREQ(model_kind_name(ModelKind::resnet), "resnet");
}

TEST(ModelConfig, AnotherKindsConfigIsABrokenInvariantNamingBothKinds) {
  const ModelConfig model{ResnetConfig{}};
  try {
    (void)model.transformer();
    FAIL() << "a ResNet config was handed out as a transformer config";
  } catch (const std::logic_error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("the model config of a resnet was asked for as a transformer config"), std::string::npos)
        << message;
  }
  EXPECT_THROW((void)model.mlp(), std::logic_error);
}

TEST(ModelConfig, VisitSeesTheHeldConfig) {
  const ModelConfig model{MlpConfig{}};
  const int inputs = model.visit([](const auto& config) {
    if constexpr (std::is_same_v<std::decay_t<decltype(config)>, MlpConfig>) return config.input_dim;
    return -1;
  });
  EXPECT_EQ(inputs, MlpConfig{}.input_dim);
}

TEST(ModelConfig, ResidualAddsPerKind) {
  TransformerConfig transformer;
  transformer.layers = 6;
  EXPECT_EQ(residual_adds(ModelConfig(transformer)), 12);  // attention and FFN per layer
  MlpConfig mlp;
  mlp.layers = 5;
  EXPECT_EQ(residual_adds(ModelConfig(mlp)), 0);
  mlp.residual = true;
  EXPECT_EQ(residual_adds(ModelConfig(mlp)), 4);  // every hidden layer after the first
  ResnetConfig resnet;
  resnet.depth = 20;  // 6n + 2 basic: n = 3 blocks per stage
  EXPECT_EQ(residual_adds(ModelConfig(resnet)), 9);
  resnet.block = ResnetBlock::bottleneck;
  resnet.depth = 29;  // 9n + 2: n = 3
  EXPECT_EQ(residual_adds(ModelConfig(resnet)), 9);
}

TEST(Spec, NamesAreTheStudySpellings) {
  EXPECT_STREQ(activation_name(Activation::identity), "linear");
  EXPECT_STREQ(activation_name(Activation::gelu_tanh), "gelu");
  EXPECT_STREQ(norm_placement_name(NormPlacement::post), "post");
  EXPECT_STREQ(norm_placement_name(NormPlacement::both), "both");
  // "both" puts a norm on the branch input (as pre) and after the sum (as post).
  EXPECT_TRUE(norms_branch_input(NormPlacement::both) && norms_residual_sum(NormPlacement::both));
  EXPECT_TRUE(norms_branch_input(NormPlacement::pre) && !norms_residual_sum(NormPlacement::pre));
  EXPECT_TRUE(!norms_branch_input(NormPlacement::post) && norms_residual_sum(NormPlacement::post));
  EXPECT_TRUE(!norms_branch_input(NormPlacement::none) && !norms_residual_sum(NormPlacement::none));
  EXPECT_STREQ(norm_kind_name(NormKind::rmsnorm), "rmsnorm");
  EXPECT_STREQ(param_role_name(ParamRole::attn_qkv), "attn_qkv");
}

TEST(Spec, ParamInitializerDefaultsToLearningRateMultiplierOne) {
  struct Fixed : ParamInitializer {
    InitSpec init(const ParamInfo&) const override { return InitSpec::constant(1.0); }
  } fixed;
  EXPECT_EQ(fixed.lr_multiplier(ParamInfo{ParamRole::bias, 1, 1, -1, "b"}), 1.0);
  EXPECT_EQ(fixed.init(ParamInfo{ParamRole::bias, 1, 1, -1, "b"}).value, 1.0);
}

}  // namespace
}  // namespace proplab
