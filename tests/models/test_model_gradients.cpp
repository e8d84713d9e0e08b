// Whole-model finite-difference gradient tests: a tiny transformer for every norm placement and every scaling
// rule (with dropout and learnable residual scalars too), and the MLP in plain and residual form.
#include <gtest/gtest.h>

#include <cmath>
#include <tuple>

#include "core/rng.h"
#include "models/mlp.h"
#include "models/transformer.h"
#include "support/gradcheck.h"
#include "support/model_testing.h"

namespace proplab {

using testing::check_all_parameters;
using testing::token_batch;

namespace {}  // namespace

class TransformerGradient : public ::testing::TestWithParam<std::tuple<NormPlacement, std::string>> {};

TEST_P(TransformerGradient, MatchesFiniteDifferences) {
  const auto [placement, rule] = GetParam();
  TransformerConfig config = testing::tiny_transformer(placement);
  config.tie_embeddings = rule != "xavier";  // exercise the untied head too
  ScalingConfig scaling;
  scaling.rule = rule;
  if (rule == "custom") {
    scaling.params = {{"lambda", 0.8},    {"beta", 0.6},       {"learnable_lambda", 1}, {"learnable_beta", 1},
                      {"embed_std", 0.5}, {"hidden_std", 0.4}, {"out_proj_std", 0.3},   {"bias_std", 0.1}};
  } else if (rule == "standard") {
    scaling.params = {{"std", 0.3}};  // larger than GPT-2's 0.02 so every gradient is well above f32 noise
  }
  Transformer model(config, scaling, 7);
  Batch batch = token_batch(2, 5, 11, 3);
  model.params().zero_grads();
  model.forward_backward(batch, 1.0f, StepContext{});
  testing::GradCheckOptions options;
  options.step = 1e-2;
  options.rtol = 3e-2;
  options.atol = 2e-4;
  options.max_elements = 40;
  check_all_parameters(
      model, [&] { return model.evaluate(batch); }, options);
}

INSTANTIATE_TEST_SUITE_P(AllPlacementsAndRules, TransformerGradient,
                         ::testing::Combine(::testing::Values(NormPlacement::pre, NormPlacement::post,
                                                              NormPlacement::both, NormPlacement::none),
                                            ::testing::Values(std::string("standard"), std::string("xavier"),
                                                              std::string("custom"))),
                         [](const auto& info) {
                           return std::string(norm_placement_name(std::get<0>(info.param))) + "_" +
                                  std::get<1>(info.param);
                         });

TEST(TransformerGradientVariants, RmsNormGeluErfDropoutAndAccumulation) {
  TransformerConfig config;
  config.layers = 2;
  config.width = 8;
  config.heads = 2;
  config.ffn_mult = 2;
  config.vocab = 9;
  config.seq_len = 4;
  config.norm_kind = NormKind::rmsnorm;
  config.activation = Activation::gelu_erf;
  config.dropout = 0.2f;
  ScalingConfig scaling;
  scaling.params = {{"std", 0.3}};
  Transformer model(config, scaling, 11);
  Batch batch = token_batch(3, 4, 9, 5);
  StepContext context;
  context.seed = 99;
  context.micro_step = 12;
  // The dropout masks are a pure function of (seed, micro_step, site): the loss with the same context is a
  // deterministic, differentiable function of the parameters.
  model.params().zero_grads();
  model.forward_backward(batch, 1.0f, context);
  testing::GradCheckOptions options;
  options.step = 1e-2;
  options.rtol = 3e-2;
  options.atol = 2e-4;
  options.max_elements = 40;
  check_all_parameters(
      model, [&] { return model.forward_backward(batch, 0.0f, context); }, options);

  // Parameter gradients accumulate across calls (micro-batches).
  std::vector<float> once = model.params().all()[0]->grad.to_vector();
  model.forward_backward(batch, 1.0f, context);
  std::vector<float> twice = model.params().all()[0]->grad.to_vector();
  for (std::size_t i = 0; i < once.size(); ++i) EXPECT_NEAR(twice[i], 2 * once[i], 1e-4 * std::fabs(once[i]) + 1e-9);
}

class MlpGradient : public ::testing::TestWithParam<std::tuple<bool, Activation, bool>> {};

TEST_P(MlpGradient, MatchesFiniteDifferences) {
  const auto [residual, activation, classification] = GetParam();
  MlpConfig config;
  config.layers = 4;
  config.width = 6;
  config.input_dim = 5;
  config.outputs = 3;
  config.activation = activation;
  config.sigma_w2 = 1.5;
  config.sigma_b2 = 0.1;
  config.residual = residual;
  config.head = classification ? MlpHead::classification : MlpHead::regression;
  ScalingConfig scaling;
  if (residual) {
    scaling.rule = "custom";
    scaling.params = {{"lambda", 0.9}, {"beta", 0.5}, {"learnable_beta", 1}, {"hidden_std", 0.5}, {"readout_std", 0.5}};
  }
  Mlp model(config, scaling, 5);
  Batch batch;
  batch.inputs = testing::random_tensor({4, 5}, 21);
  if (classification) {
    batch.targets = Tensor::empty({4}, DType::i32);
    for (int i = 0; i < 4; ++i) batch.targets.i32()[i] = i % 3;
  } else {
    batch.targets = testing::random_tensor({4, 3}, 22);
  }
  model.params().zero_grads();
  model.forward_backward(batch, 1.0f, StepContext{});
  testing::GradCheckOptions options;
  options.step = 1e-2;
  options.rtol = 3e-2;
  options.atol = 2e-4;
  options.max_elements = 40;
  check_all_parameters(
      model, [&] { return model.evaluate(batch); }, options);
}

INSTANTIATE_TEST_SUITE_P(Forms, MlpGradient,
                         ::testing::Combine(::testing::Bool(),
                                            ::testing::Values(Activation::tanh, Activation::relu, Activation::gelu_tanh,
                                                              Activation::identity),
                                            ::testing::Bool()));

TEST(ModelInit, IndependentOfThreadsAndIdenticalForTheSameSeed) {
  TransformerConfig config;
  config.layers = 1;
  config.width = 16;
  config.heads = 2;
  config.vocab = 13;
  config.seq_len = 6;
  Transformer a(config, ScalingConfig{}, 42), b(config, ScalingConfig{}, 42), c(config, ScalingConfig{}, 43);
  for (std::size_t i = 0; i < a.params().all().size(); ++i) {
    EXPECT_EQ(a.params().all()[i]->value.to_vector(), b.params().all()[i]->value.to_vector());
  }
  EXPECT_NE(a.params().all()[0]->value.to_vector(), c.params().all()[0]->value.to_vector());
  // Init std of a weight matrix follows the rule (GPT-2: 0.02; output projections 0.02/sqrt(2N)).
  Parameter* out = a.params().find("blocks.0.attn.out.weight");
  ASSERT_NE(out, nullptr);
  double s2 = 0;
  for (float v : out->value.to_vector()) s2 += v * v;
  EXPECT_NEAR(std::sqrt(s2 / out->value.numel()), 0.02 / std::sqrt(2.0), 0.004);
}

}  // namespace proplab
