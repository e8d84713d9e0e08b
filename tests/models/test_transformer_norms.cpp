// Norm placement "both" (Keel's residual): a norm on every branch's input and one after every residual sum, no
// final norm. Its forward must be exactly the two placements composed: checked against a hand-written double
// precision forward of each sublayer from the probed tensors, with distinct random gains and shifts in the two norms
// so that a swapped norm would show.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/rng.h"
#include "models/transformer.h"
#include "support/model_testing.h"

namespace proplab {
namespace {

using testing::CapturingSink;
using testing::token_batch;

// A parameter's values as doubles (a failure when there is no such parameter).
std::vector<double> values_of(Transformer& model, const std::string& name) {
  Parameter* p = model.params().find(name);
  EXPECT_NE(p, nullptr) << name;
  if (!p) return {};
  const std::vector<float> v = p->value.to_vector();
  return std::vector<double>(v.begin(), v.end());
}

// LayerNorm or RMSNorm of each row of x [rows, d] with gain and (LayerNorm) shift, in double precision.
std::vector<double> norm_rows(NormKind kind, const std::vector<double>& x, std::int64_t d, double eps,
                              const std::vector<double>& gain, const std::vector<double>& shift) {
  std::vector<double> y(x.size());
  for (std::size_t r = 0; r < x.size() / static_cast<std::size_t>(d); ++r) {
    const double* row = x.data() + r * static_cast<std::size_t>(d);
    double mean = 0.0, square = 0.0;
    for (std::int64_t j = 0; j < d; ++j) mean += row[j] / static_cast<double>(d);
    const double centre = kind == NormKind::layernorm ? mean : 0.0;
    for (std::int64_t j = 0; j < d; ++j) square += (row[j] - centre) * (row[j] - centre) / static_cast<double>(d);
    const double rstd = 1.0 / std::sqrt(square + eps);
    for (std::int64_t j = 0; j < d; ++j)
      y[r * static_cast<std::size_t>(d) + static_cast<std::size_t>(j)] =
          (row[j] - centre) * rstd * gain[static_cast<std::size_t>(j)] +
          (shift.empty() ? 0.0 : shift[static_cast<std::size_t>(j)]);
  }
  return y;
}

// y = x Wᵀ + b for x [rows, in], W [out, in].
std::vector<double> linear_rows(const std::vector<double>& x, std::int64_t in, const std::vector<double>& w,
                                const std::vector<double>& b) {
  const std::size_t out = b.size(), rows = x.size() / static_cast<std::size_t>(in);
  std::vector<double> y(rows * out);
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t o = 0; o < out; ++o) {
      double acc = b[o];
      for (std::int64_t i = 0; i < in; ++i)
        acc += x[r * static_cast<std::size_t>(in) + static_cast<std::size_t>(i)] *
               w[o * static_cast<std::size_t>(in) + static_cast<std::size_t>(i)];
      y[r * out + o] = acc;
    }
  return y;
}

double gelu_tanh(double x) { return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }

void expect_near_all(const std::vector<float>& got, const std::vector<double>& expected, double tolerance,
                     const std::string& what) {
  ASSERT_EQ(got.size(), expected.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], expected[i], tolerance * (1.0 + std::fabs(expected[i]))) << what << " element " << i;
}

std::vector<double> doubles(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

class BothNorms : public ::testing::TestWithParam<NormKind> {};

TEST_P(BothNorms, ForwardIsTheBranchNormAndTheSumNormComposed) {
  const NormKind kind = GetParam();
  TransformerConfig config = testing::tiny_transformer(NormPlacement::both);
  config.layers = 2;
  config.norm_kind = kind;
  const double lambda = 1.7, beta = 0.6;
  ScalingConfig scaling;
  scaling.rule = "custom";
  scaling.params = {{"lambda", lambda},  {"beta", beta},        {"embed_std", 0.5},
                    {"hidden_std", 0.4}, {"out_proj_std", 0.3}, {"bias_std", 0.1}};
  Transformer model(config, scaling, 7);

  // The parameters: two norms per sublayer under their names, no final norm.
  for (const char* site : {"blocks.0.attn", "blocks.1.ffn"}) {
    EXPECT_NE(model.params().find(std::string(site) + ".in_norm.weight"), nullptr) << site;
    EXPECT_NE(model.params().find(std::string(site) + ".norm.weight"), nullptr) << site;
  }
  EXPECT_EQ(model.params().find("final_norm.weight"), nullptr);
  // The probes of block 0, in forward order: the branch norm's output as .norm, the sum as .sum.
  const std::vector<std::string> block0 = {"blocks.0.in",       "blocks.0.attn.norm",  "blocks.0.attn.logits",
                                           "blocks.0.attn.out", "blocks.0.attn.sum",   "blocks.0.mid",
                                           "blocks.0.ffn.norm", "blocks.0.ffn.preact", "blocks.0.ffn.postact",
                                           "blocks.0.ffn.out",  "blocks.0.ffn.sum",    "blocks.0.out"};
  ASSERT_GT(model.probes().size(), block0.size() + 1);
  for (std::size_t i = 0; i < block0.size(); ++i) EXPECT_EQ(model.probes()[i + 1].name, block0[i]);
  EXPECT_EQ(model.probes().back().name, "head.logits");
  EXPECT_EQ(model.probes()[model.probes().size() - 2].name, "blocks.1.out");  // no final_norm.out

  // Distinct random gains and shifts in every norm (the rule starts them all at 1 and 0).
  const CounterRng rng(3, stream_id("test.norm_params"));
  std::uint64_t counter = 0;
  for (auto& p : model.params().all()) {
    if (p->info.role != ParamRole::norm_gain && p->info.role != ParamRole::norm_bias) continue;
    const double base = p->info.role == ParamRole::norm_gain ? 1.0 : 0.0;
    for (std::int64_t i = 0; i < p->value.numel(); ++i)
      p->value.f32()[i] = static_cast<float>(base + 0.5 * rng.normal(counter++));
  }

  const Batch batch = token_batch(2, 5, 11, 3);
  CapturingSink sink(model.probes());
  StepContext context;
  context.sink = &sink;
  model.forward_backward(batch, 0.0f, context);
  const std::int64_t d = config.width, f = static_cast<std::int64_t>(config.ffn_mult) * d;
  const double eps = config.norm_eps, tolerance = 2e-5;
  auto norm_params = [&](const std::string& name) {
    const std::vector<double> gain = values_of(model, name + ".weight");
    const std::vector<double> shift =
        kind == NormKind::layernorm ? values_of(model, name + ".bias") : std::vector<double>();
    return std::make_pair(gain, shift);
  };
  for (int l = 0; l < config.layers; ++l) {
    const std::string block = "blocks." + std::to_string(l);
    for (const char* which : {"attn", "ffn"}) {
      const std::string prefix = block + "." + which;
      SCOPED_TRACE(prefix);
      const bool attention = std::string(which) == "attn";
      const std::vector<double> x = doubles(sink.values.at(attention ? block + ".in" : block + ".mid"));
      // The branch reads its own norm of the input (in_norm), as Pre-LN.
      const auto [in_gain, in_shift] = norm_params(prefix + ".in_norm");
      const std::vector<double> normed = norm_rows(kind, x, d, eps, in_gain, in_shift);
      expect_near_all(sink.values.at(prefix + ".norm"), normed, tolerance, "branch norm");
      if (!attention) {
        // The whole FFN branch by hand from the branch norm's output.
        const std::vector<double> preact =
            linear_rows(normed, d, values_of(model, prefix + ".fc.weight"), values_of(model, prefix + ".fc.bias"));
        expect_near_all(sink.values.at(prefix + ".preact"), preact, tolerance, "preact");
        std::vector<double> postact(preact.size());
        for (std::size_t i = 0; i < preact.size(); ++i) postact[i] = gelu_tanh(preact[i]);
        const std::vector<double> branch =
            linear_rows(postact, f, values_of(model, prefix + ".proj.weight"), values_of(model, prefix + ".proj.bias"));
        expect_near_all(sink.values.at(prefix + ".out"), branch, tolerance, "FFN branch");
      }
      // The sum λ·x + β·branch, then the sum's own norm, as Post-LN.
      const std::vector<double> branch = doubles(sink.values.at(prefix + ".out"));
      std::vector<double> sum(x.size());
      for (std::size_t i = 0; i < x.size(); ++i) sum[i] = lambda * x[i] + beta * branch[i];
      expect_near_all(sink.values.at(prefix + ".sum"), sum, tolerance, "sum");
      const auto [sum_gain, sum_shift] = norm_params(prefix + ".norm");
      expect_near_all(sink.values.at(attention ? block + ".mid" : block + ".out"),
                      norm_rows(kind, sum, d, eps, sum_gain, sum_shift), tolerance, "sum norm");
    }
  }
  // No final norm: the tied head reads the last sum's norm output.
  const std::vector<double> top = doubles(sink.values.at("blocks.1.out"));
  const std::vector<double> embedding = values_of(model, "embed.token.weight");
  expect_near_all(sink.values.at("head.logits"),
                  linear_rows(top, d, embedding, std::vector<double>(static_cast<std::size_t>(config.vocab), 0.0)),
                  tolerance, "head logits");
}

INSTANTIATE_TEST_SUITE_P(Kinds, BothNorms, ::testing::Values(NormKind::layernorm, NormKind::rmsnorm),
                         [](const auto& info) { return std::string(norm_kind_name(info.param)); });

}  // namespace
}  // namespace proplab
