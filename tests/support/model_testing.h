// Helpers for tests that build whole models (header-only: only test binaries that link the models include it).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/rng.h"
#include "models/model.h"
#include "probe/probe.h"
#include "support/gradcheck.h"

namespace proplab::testing {

// A token batch [batch, tokens] of inputs and targets drawn uniformly from [0, vocab) under `seed`.
inline Batch token_batch(int batch, int tokens, int vocab, std::uint64_t seed) {
  Batch b;
  b.inputs = Tensor::empty({batch, tokens}, DType::i32);
  b.targets = Tensor::empty({batch, tokens}, DType::i32);
  CounterRng rng(seed, stream_id("test.tokens"));
  for (int i = 0; i < batch * tokens; ++i) {
    b.inputs.i32()[i] = static_cast<std::int32_t>(rng.below(2 * i, vocab));
    b.targets.i32()[i] = static_cast<std::int32_t>(rng.below(2 * i + 1, vocab));
  }
  return b;
}

// The tiny transformer of the whole-model gradient tests: 2 blocks of width 8 (2 heads, FFN 16), vocabulary 11,
// 5 tokens, with the given norm placement; the other keys at their defaults.
inline TransformerConfig tiny_transformer(NormPlacement norm) {
  TransformerConfig config;
  config.layers = 2;
  config.width = 8;
  config.heads = 2;
  config.ffn_mult = 2;
  config.vocab = 11;
  config.seq_len = 5;
  config.norm = norm;
  return config;
}

// Checks d(loss)/d(param) — the gradients the model last accumulated — for every parameter against finite
// differences of `loss`.
inline void check_all_parameters(Model& model, const std::function<double()>& loss, const GradCheckOptions& options) {
  for (auto& p : model.params().all()) {
    SCOPED_TRACE(p->name);
    GradCheckResult result = check_gradient(loss, p->value, p->grad, options);
    EXPECT_GRAD_OK(result);
  }
}

// Keeps a copy of every forward probe tensor, by probe name.
class CapturingSink final : public ProbeSink {
 public:
  explicit CapturingSink(const std::vector<ProbeInfo>& probes) : probes_(probes) {}
  void forward(int probe, const Tensor& x, std::int64_t) override { values[probes_.at(probe).name] = x.to_vector(); }
  void backward(int, const Tensor&, std::int64_t) override {}
  void attention_logits(int, const probe::LogitSums&, const Tensor&, int, float) override {}
  std::map<std::string, std::vector<float>> values;

 private:
  std::vector<ProbeInfo> probes_;
};

// The population variance of the values, in double precision.
inline double population_var(const std::vector<float>& v) {
  double mean = 0.0;
  for (float x : v) mean += x;
  mean /= static_cast<double>(v.size());
  double var = 0.0;
  for (float x : v) var += (x - mean) * (x - mean);
  return var / static_cast<double>(v.size());
}

}  // namespace proplab::testing
