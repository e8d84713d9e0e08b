// The transformer split into pipeline stages: a chain of stage models with two micro-batches in flight computes
// the whole model's loss, parameter gradients and probe tensors, and its gradients match finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "models/transformer.h"
#include "support/gradcheck.h"
#include "support/model_testing.h"

namespace proplab {
namespace {

using testing::token_batch;

// Sums of every probed tensor (forward and backward), by probe name: a stage chain must hand the same tensors.
class SummingSink final : public ProbeSink {
 public:
  explicit SummingSink(const std::vector<ProbeInfo>& probes) : probes_(probes) {}
  void forward(int probe, const Tensor& x, std::int64_t) override { add("F " + probes_.at(probe).name, x); }
  void backward(int probe, const Tensor& x, std::int64_t) override { add("B " + probes_.at(probe).name, x); }
  void attention_logits(int probe, const probe::LogitSums& sums, const Tensor&, int, float) override {
    values["F " + probes_.at(probe).name] += sums.sum;
  }
  std::map<std::string, double> values;

 private:
  void add(const std::string& key, const Tensor& x) {
    double total = 0.0;
    for (float v : x.to_vector()) total += v;
    values[key] += total;
  }
  std::vector<ProbeInfo> probes_;
};

TransformerConfig tiny(NormPlacement placement, bool tied, float dropout) {
  TransformerConfig config = testing::tiny_transformer(placement);
  config.layers = 3;
  config.tie_embeddings = tied;
  config.dropout = dropout;
  return config;
}

ScalingConfig wide_init() {
  ScalingConfig scaling;
  scaling.params = {{"std", 0.3}};
  return scaling;
}

// Three stages (blocks [0,1), [1,2), [2,3)) run F0 F1 on every stage, then B0 B1 from the last stage down: both
// micro-batches are in flight at once, in slots 0 and 1. Returns the loss of each micro-batch.
std::vector<double> run_chain(std::vector<std::unique_ptr<Transformer>>& stages, const std::vector<Batch>& batches,
                              float grad_scale, const std::vector<StepContext>& contexts) {
  std::vector<double> losses(batches.size(), 0.0);
  for (std::size_t m = 0; m < batches.size(); ++m) {
    Tensor x;
    for (std::size_t s = 0; s < stages.size(); ++s) {
      Tensor out;
      const double loss = stages[s]->stage_forward(static_cast<int>(m), batches[m], x, out, grad_scale, contexts[m]);
      if (s + 1 == stages.size()) losses[m] = loss;
      x = out.defined() ? out.clone() : Tensor();
    }
  }
  if (grad_scale == 0.0f) return losses;
  for (std::size_t m = 0; m < batches.size(); ++m) {
    Tensor d;
    for (std::size_t s = stages.size(); s-- > 0;) {
      Tensor d_in;
      stages[s]->stage_backward(static_cast<int>(m), batches[m], d, d_in, contexts[m]);
      d = d_in.defined() ? d_in.clone() : Tensor();
    }
  }
  return losses;
}

class TransformerStages : public ::testing::TestWithParam<std::tuple<NormPlacement, bool, float>> {};

TEST_P(TransformerStages, ChainMatchesTheWholeModel) {
  const auto [placement, tied, dropout] = GetParam();
  const TransformerConfig config = tiny(placement, tied, dropout);
  Transformer whole(config, wide_init(), 7);
  std::vector<std::unique_ptr<Transformer>> stages;
  for (int s = 0; s < 3; ++s) {
    stages.push_back(std::make_unique<Transformer>(config, wide_init(), 7));
    stages.back()->set_stage(s, s + 1, 2);
  }
  const std::vector<Batch> batches = {token_batch(2, 5, 11, 3), token_batch(2, 5, 11, 4)};
  SummingSink whole_sink(whole.probes()), stage_sink(whole.probes());
  std::vector<StepContext> contexts(2);
  for (int m = 0; m < 2; ++m) {
    contexts[m].seed = 5;
    contexts[m].micro_step = static_cast<std::uint64_t>(10 + m);
    contexts[m].sink = &whole_sink;
  }
  whole.params().zero_grads();
  std::vector<double> whole_losses;
  for (int m = 0; m < 2; ++m) whole_losses.push_back(whole.forward_backward(batches[m], 0.5f, contexts[m]));
  for (StepContext& c : contexts) c.sink = &stage_sink;
  for (auto& stage : stages) stage->params().zero_grads();
  const std::vector<double> losses = run_chain(stages, batches, 0.5f, contexts);
  for (int m = 0; m < 2; ++m) EXPECT_EQ(losses[m], whole_losses[m]) << "micro-batch " << m;

  // Each parameter's gradient lives on the stage that owns it (the tied embedding on the first and last).
  auto& all = whole.params().all();
  for (std::size_t i = 0; i < all.size(); ++i) {
    SCOPED_TRACE(all[i]->name);
    const std::vector<float> expected = all[i]->grad.to_vector();
    std::vector<float> summed(expected.size(), 0.0f);
    for (auto& stage : stages) {
      const std::vector<float> part = stage->params().all()[i]->grad.to_vector();
      for (std::size_t j = 0; j < part.size(); ++j) summed[j] += part[j];
    }
    for (std::size_t j = 0; j < expected.size(); ++j)
      ASSERT_NEAR(summed[j], expected[j], 1e-6f * (1.0f + std::fabs(expected[j]))) << "element " << j;
  }
  // Every probe saw the same tensors, forward and backward.
  ASSERT_EQ(stage_sink.values.size(), whole_sink.values.size());
  for (const auto& [key, value] : whole_sink.values) {
    ASSERT_TRUE(stage_sink.values.count(key)) << key;
    EXPECT_NEAR(stage_sink.values[key], value, 1e-9 * (1.0 + std::fabs(value))) << key;
  }
}

INSTANTIATE_TEST_SUITE_P(Placements, TransformerStages,
                         ::testing::Values(std::make_tuple(NormPlacement::pre, true, 0.0f),
                                           std::make_tuple(NormPlacement::post, false, 0.0f),
                                           std::make_tuple(NormPlacement::none, true, 0.0f),
                                           std::make_tuple(NormPlacement::both, false, 0.2f),
                                           std::make_tuple(NormPlacement::pre, false, 0.2f)));

TEST(TransformerStageGradients, MatchFiniteDifferences) {
  const TransformerConfig config = tiny(NormPlacement::pre, true, 0.0f);
  std::vector<std::unique_ptr<Transformer>> stages;
  for (int s = 0; s < 3; ++s) {
    stages.push_back(std::make_unique<Transformer>(config, wide_init(), 9));
    stages.back()->set_stage(s, s + 1, 2);
  }
  const std::vector<Batch> batches = {token_batch(2, 5, 11, 6), token_batch(2, 5, 11, 7)};
  const std::vector<StepContext> contexts(2);
  for (auto& stage : stages) stage->params().zero_grads();
  run_chain(stages, batches, 0.5f, contexts);
  auto loss = [&] {
    const std::vector<double> losses = run_chain(stages, batches, 0.0f, contexts);
    return 0.5 * (losses[0] + losses[1]);
  };
  testing::GradCheckOptions options;
  options.step = 1e-2;
  options.rtol = 3e-2;
  options.atol = 2e-4;
  options.max_elements = 30;
  // The middle stage's block and the last stage's final norm; the first stage's position embedding.
  for (int s = 0; s < 3; ++s) {
    for (auto& p : stages[s]->params().all()) {
      const bool owned = (s == 1 && p->name.rfind("blocks.1.", 0) == 0) ||
                         (s == 2 && p->name.rfind("final_norm", 0) == 0) ||
                         (s == 0 && p->name == "embed.position.weight");
      if (!owned) continue;
      SCOPED_TRACE(p->name);
      EXPECT_GRAD_OK(testing::check_gradient(loss, p->value, p->grad, options));
    }
  }
}

}  // namespace
}  // namespace proplab
