// A run's /theory predictions (predict_for_run, also behind `proplab theory`) for the admin rule use the ω the
// run's model is built with: the same profiling pass, keyed by the run's seed, not the training data.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "data/dataset.h"
#include "models/model.h"
#include "scaling/theory_numbers.h"
#include "train/theory_run.h"

namespace proplab {

TEST(TheoryRunAdmin, PredictionsUseTheModelsProfiledOmega) {
  RunSpec spec;
  spec.seed = 17;
  spec.model.transformer().layers = 3;
  spec.model.transformer().width = 32;
  spec.model.transformer().heads = 4;
  spec.model.transformer().vocab = 64;
  spec.model.transformer().seq_len = 16;
  spec.model.transformer().norm = NormPlacement::post;
  spec.scaling.rule = "admin";
  spec.scaling.params = {{"learnable", 1}};
  spec.train.batch = 4;
  spec.train.grad_accum = 1;
  spec.theory.input_corr = 0.02;
  const theory::ProbePrediction prediction = predict_for_run(spec);

  // The same model description built by hand: admin's init is the `xavier` rule's, and λ is read from the model's
  // learnable ω parameters.
  auto model = make_model(spec.model, spec.scaling, spec.seed);
  ScalingConfig xavier;
  xavier.rule = "xavier";
  const theory::TransformerNumbers unit = transformer_numbers(xavier, spec.model.transformer());
  theory::TransformerNumbers numbers = unit;
  for (int l = 0; l < 3; ++l) {
    const std::string block = "blocks." + std::to_string(l);
    numbers.blocks[l].attn_residual.lambda = model->params().find(block + ".attn.lambda")->value.item();
    numbers.blocks[l].ffn_residual.lambda = model->params().find(block + ".ffn.lambda")->value.item();
  }
  theory::TheoryInputs inputs;
  inputs.input_corr = 0.02;
  inputs.sequences = 4;
  inputs.tokens = 16;
  // A run's prediction also reads its first batch's tokens (the loss gradient's row covariance).
  auto data = make_token_dataset(spec.data, 64, 16, spec.seed);
  Tensor tokens = Tensor::empty({4, 16}, DType::i32), targets = Tensor::empty({4, 16}, DType::i32);
  data->batch(Split::train, 0, tokens, targets);
  inputs.batch_inputs.assign(tokens.i32(), tokens.i32() + tokens.numel());
  inputs.batch_targets.assign(targets.i32(), targets.i32() + targets.numel());
  const theory::ProbePrediction expected = theory::predict_transformer(numbers, inputs);
  const theory::ProbePrediction with_unit_omega = theory::predict_transformer(unit, inputs);

  ASSERT_EQ(prediction.probes.size(), expected.probes.size());
  int differs_from_unit = 0;
  for (std::size_t i = 0; i < expected.probes.size(); ++i) {
    const theory::ProbeTheory& p = prediction.probes[i];
    const theory::ProbeTheory& e = expected.probes[i];
    ASSERT_EQ(p.name, e.name);
    // λ in the model is a float, the rule's ω a double: equal to float precision, or both without a prediction.
    const auto same = [&](double got, double want, const char* stat) {
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << p.name << " " << stat;
      } else {
        EXPECT_NEAR(got, want, 1e-6 * std::abs(want) + 1e-12) << p.name << " " << stat;
      }
    };
    same(p.var, e.var, "var");
    same(p.corr, e.corr, "corr");
    same(p.backward_var, e.backward_var, "backward var");
    if (!std::isnan(e.var) && std::abs(with_unit_omega.probes[i].var - e.var) > 0.01 * std::abs(e.var))
      ++differs_from_unit;
  }
  // ω matters to the predictions (the check above could fail).
  EXPECT_GT(differs_from_unit, 0);
}

}  // namespace proplab
