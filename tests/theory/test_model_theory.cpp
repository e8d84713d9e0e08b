// Whole-model predictions (theory/model_theory) against measured step-0 statistics of real models.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/rng.h"
#include "models/model.h"
#include "models/profile.h"
#include "probe/moments.h"
#include "scaling/theory_numbers.h"
#include "theory/model_theory.h"

namespace proplab {
namespace {

// Collects forward mean/var/corr and backward var of every probe of one forward_backward call.
class CaptureSink final : public ProbeSink {
 public:
  explicit CaptureSink(std::size_t probes) : forward_(probes), backward_(probes) {}
  void forward(int probe, const Tensor& x, std::int64_t sequences) override {
    probe::accumulate(x, sequences, forward_[probe], which());
  }
  void backward(int probe, const Tensor& d_x, std::int64_t sequences) override {
    probe::accumulate(d_x, sequences, backward_[probe], which());
  }
  void attention_logits(int probe, const probe::LogitSums& sums, const Tensor&, int, float) override {
    forward_[probe].merge(probe::moment_sums(sums, which()));
  }
  probe::Moments forward_moments(int probe) const { return probe::finalize(forward_[probe]); }
  probe::Moments backward_moments(int probe) const { return probe::finalize(backward_[probe]); }

 private:
  static probe::StatSelection which() {
    return probe::StatSelection().add(probe::Stat::mean).add(probe::Stat::var).add(probe::Stat::corr);
  }
  std::vector<probe::MomentSums> forward_, backward_;
};

struct Measured {
  std::vector<std::string> names;
  std::vector<double> var, mean, corr, backward_var, backward_corr;
  std::vector<std::int32_t> inputs, targets;  // the batch's token ids
  std::uint64_t seed = 0;                      // the model's
  double find(const std::vector<double>& column, const std::string& name) const {
    const auto it = std::find(names.begin(), names.end(), name);
    EXPECT_NE(it, names.end()) << name;
    return column[static_cast<std::size_t>(it - names.begin())];
  }
};

struct Case {
  TransformerConfig config;
  ScalingConfig scaling;
  std::int64_t sequences = 2;
  std::int64_t target_classes = 0;  // targets uniform over the first this many tokens (0: the whole vocabulary)
  bool next_token = false;          // targets are the next input token (the last one of a sequence drawn)
};

TransformerConfig small_config(int layers, int width, NormPlacement norm) {
  TransformerConfig c;
  c.layers = layers;
  c.width = width;
  c.heads = 8;
  c.norm = norm;
  c.vocab = 256;
  c.seq_len = 64;
  return c;
}

Measured measure(const Case& run, std::uint64_t seed = 7) {
  const ModelConfig model(run.config);
  std::unique_ptr<Model> m = make_model(model, run.scaling, seed);
  const std::int64_t t = run.config.seq_len;
  Batch batch{Tensor::empty({run.sequences, t}, DType::i32), Tensor::empty({run.sequences, t}, DType::i32)};
  const CounterRng rng(seed, stream_id("test_tokens"));
  for (std::int64_t i = 0; i < run.sequences * t; ++i) {
    batch.inputs.i32()[i] = static_cast<std::int32_t>(rng.below(2 * i, run.config.vocab));
    batch.targets.i32()[i] =
        static_cast<std::int32_t>(rng.below(2 * i + 1, run.target_classes > 0 ? run.target_classes : run.config.vocab));
  }
  if (run.next_token)
    for (std::int64_t i = 0; i < run.sequences * t; ++i)
      if ((i + 1) % t != 0) batch.targets.i32()[i] = batch.inputs.i32()[i + 1];
  CaptureSink sink(m->probes().size());
  StepContext context;
  context.sink = &sink;
  m->forward_backward(batch, 1.0f, context);
  Measured out;
  out.seed = seed;
  out.inputs.assign(batch.inputs.i32(), batch.inputs.i32() + batch.inputs.numel());
  out.targets.assign(batch.targets.i32(), batch.targets.i32() + batch.targets.numel());
  for (const ProbeInfo& p : m->probes()) {
    out.names.push_back(p.name);
    const probe::Moments f = sink.forward_moments(p.depth);
    out.var.push_back(f.var);
    out.mean.push_back(f.mean);
    out.corr.push_back(f.corr);
    out.backward_var.push_back(p.has_backward ? sink.backward_moments(p.depth).var : std::nan(""));
    out.backward_corr.push_back(p.has_backward ? sink.backward_moments(p.depth).corr : std::nan(""));
  }
  return out;
}

// `tokens`: whether the prediction reads the batch's token ids (as a run's does) or assumes independent uniform
// tokens; `common_part`: TheoryInputs::common_part_gradient; `norm_removal`: TheoryInputs::norm_removes_part.
theory::ProbePrediction predict(const Case& run, const Measured& measured, bool tokens = true, bool common_part = true,
                                bool norm_removal = true) {
  theory::TheoryInputs inputs;
  inputs.input_corr = measured.find(measured.corr, "embed.out");
  inputs.sequences = run.sequences;
  inputs.common_part_gradient = common_part;
  inputs.norm_removes_part = norm_removal;
  if (tokens) {
    inputs.batch_inputs = measured.inputs;
    inputs.batch_targets = measured.targets;
  }
  // make_model_rule, as `proplab theory` does: Admin's residual weights come from the measured model's profiling pass.
  const std::unique_ptr<ScalingRule> rule = make_model_rule(ModelConfig(run.config), run.scaling, measured.seed);
  return theory::predict_transformer(transformer_numbers(*rule, run.config), inputs);
}

// `deepscalelm` with its (tied) head and next-token targets.
Case tied_deepscalelm(int layers, int width, NormPlacement norm) {
  Case run;
  run.config = small_config(layers, width, norm);
  run.scaling.rule = "deepscalelm";
  run.next_token = true;
  return run;
}

double rel_error(double measured, double predicted) { return std::abs(measured - predicted) / std::abs(predicted); }

// Relative errors of the residual stream (blocks.l.in / .mid / .out) forward var and backward var.
struct StreamErrors {
  std::vector<double> forward, backward;
  double median(std::vector<double> v) const {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  }
};

bool is_stream(const std::string& name) {
  auto ends = [&](const std::string& suffix) {
    return name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  return name.rfind("blocks.", 0) == 0 &&
         (ends(".in") || ends(".mid") ||
          (ends(".out") && name.find(".attn.") == std::string::npos && name.find(".ffn.") == std::string::npos));
}

StreamErrors stream_errors(const Measured& m, const theory::ProbePrediction& p, const char* label) {
  StreamErrors e;
  for (std::size_t i = 0; i < m.names.size(); ++i) {
    if (!is_stream(m.names[i])) continue;
    const theory::ProbeTheory* t = p.find(m.names[i]);
    EXPECT_NE(t, nullptr) << m.names[i];
    if (!t) continue;
    e.forward.push_back(rel_error(m.var[i], t->var));
    e.backward.push_back(rel_error(m.backward_var[i], t->backward_var));
  }
  std::printf("%s: residual stream forward var rel. error median %.3f worst %.3f; backward median %.3f worst %.3f\n",
              label, e.median(e.forward), *std::max_element(e.forward.begin(), e.forward.end()), e.median(e.backward),
              *std::max_element(e.backward.begin(), e.backward.end()));
  return e;
}

// Checks the tolerances and returns the measurement.
Measured expect_accuracy(const Case& run, const char* label) {
  const Measured m = measure(run);
  const theory::ProbePrediction p = predict(run, m);
  EXPECT_EQ(p.probes.size(), m.names.size());
  for (std::size_t i = 0; i < m.names.size() && i < p.probes.size(); ++i) EXPECT_EQ(p.probes[i].name, m.names[i]);
  const StreamErrors e = stream_errors(m, p, label);
  EXPECT_LT(*std::max_element(e.forward.begin(), e.forward.end()), 0.10) << label;
  EXPECT_LT(e.median(e.backward), 0.25) << label;
  EXPECT_LT(*std::max_element(e.backward.begin(), e.backward.end()), 0.50) << label;
  return m;
}

// A DeepScaleLM-like custom setting: λ² + β² = 1 with β² = 2/N_adds, unit-variance embeddings, Q/K/V/FFN-in
// N(0, 1/d), and the output projections' std chosen (by the theory) so that the branches have unit variance on
// average.
Case deepscale_like(int layers, int width) {
  Case run;
  run.config = small_config(layers, width, NormPlacement::pre);
  run.config.bias = false;
  const double adds = 2.0 * layers, beta_sq = 2.0 / adds;
  run.scaling.rule = "custom";
  run.scaling.params = {{"lambda", std::sqrt(1.0 - beta_sq)},
                        {"beta", std::sqrt(beta_sq)},
                        {"embed_std", std::sqrt(0.5)},
                        {"hidden_std", 1.0 / std::sqrt(width)},
                        {"out_proj_std", 1.0 / std::sqrt(width)}};
  for (int round = 0; round < 2; ++round) {
    const theory::ProbePrediction p = theory::predict_transformer(transformer_numbers(run.scaling, run.config), {});
    double branch = 0.0;
    int count = 0;
    for (const theory::ProbeTheory& t : p.probes)
      if (t.kind == "branch") branch += t.var, ++count;
    run.scaling.params["out_proj_std"] /= std::sqrt(branch / count);
  }
  return run;
}

TEST(ModelTheory, ProbeNamesMatchTheModels) {
  for (NormPlacement norm : {NormPlacement::pre, NormPlacement::post, NormPlacement::both, NormPlacement::none}) {
    ModelConfig model;
    model.transformer() = small_config(3, 32, norm);
    const std::unique_ptr<Model> m = make_model(model, ScalingConfig{}, 1);
    const std::vector<std::string> names = theory::transformer_probe_names(model.transformer());
    const theory::ProbePrediction p =
        theory::predict_transformer(transformer_numbers(ScalingConfig{}, model.transformer()), {});
    ASSERT_EQ(names.size(), m->probes().size());
    ASSERT_EQ(p.probes.size(), m->probes().size());
    for (std::size_t i = 0; i < names.size(); ++i) {
      EXPECT_EQ(names[i], m->probes()[i].name);
      EXPECT_EQ(p.probes[i].name, m->probes()[i].name);
      EXPECT_EQ(p.probes[i].kind, probe_kind_name(m->probes()[i].kind));
    }
  }
  MlpConfig mlp;
  mlp.layers = 4;
  mlp.residual = true;
  const ModelConfig model(mlp);
  const std::unique_ptr<Model> m = make_model(model, ScalingConfig{}, 1);
  const theory::ProbePrediction p = theory::predict_mlp(mlp_numbers(ScalingConfig{}, mlp), {});
  ASSERT_EQ(p.probes.size(), m->probes().size());
  for (std::size_t i = 0; i < p.probes.size(); ++i) EXPECT_EQ(p.probes[i].name, m->probes()[i].name);
}

TEST(ModelTheory, CrossEntropyGradientOfUniformPredictions) {
  // Exactly uniform predictions: Var = (C - 1)/(C² R²).
  EXPECT_NEAR(theory::cross_entropy_grad_var({0.0, 0.0, 0.0}, 10, 4, 1.0), 9.0 / (100.0 * 16.0), 1e-15);
}

// E[Σ p²] of a softmax of independent Gaussian logits against a Monte Carlo estimate (20000 rows; its standard error
// is below 0.4% at these spreads), from near-uniform to nearly one-hot; the log-normal estimate e^D/(e^D + C − 1)
// it replaced is 16% high at D = 1, 2.2× at D = 4 (C = 10).
TEST(ModelTheory, SoftmaxSumOfSquaredProbabilitiesMatchesMonteCarlo) {
  for (const std::int64_t classes : {10, 100}) {
    for (const double spread : {0.1, 1.0, 4.0, 16.0, 64.0}) {
      const CounterRng rng(11, static_cast<std::uint64_t>(classes));
      constexpr int kRows = 20000;
      double sum = 0.0;
      std::vector<double> z(static_cast<std::size_t>(classes));
      for (int row = 0; row < kRows; ++row) {
        double top = -1e300;
        for (std::int64_t v = 0; v < classes; ++v) {
          z[v] = std::sqrt(spread) * rng.normal(static_cast<std::uint64_t>(row * classes + v));
          top = std::max(top, z[v]);
        }
        double total = 0.0, squares = 0.0;
        for (double& e : z) {
          e = std::exp(e - top);
          total += e;
          squares += e * e;
        }
        sum += squares / (total * total);
      }
      const double monte_carlo = sum / kRows;
      EXPECT_NEAR(theory::softmax_sum_p_sq(spread, classes), monte_carlo, 0.015 * monte_carlo)
          << classes << " classes, spread " << spread;
    }
  }
  EXPECT_DOUBLE_EQ(theory::softmax_sum_p_sq(0.0, 10), 0.1);
  EXPECT_NEAR(theory::softmax_sum_p_sq(1e4, 10), 1.0, 0.05);  // one-hot on the maximum
}

// E[(ℓ̂·p)²] (the standardised logits' projection on their softmax, squared) against Monte Carlo; at spread 0 it is
// the mean of C standard normals squared, 1/C, and a saturated softmax gives E[max of C normals²] (C = 10: 2.71).
TEST(ModelTheory, SoftmaxLogitProjectionMatchesMonteCarlo) {
  for (const std::int64_t classes : {10, 100}) {
    for (const double spread : {0.1, 1.0, 4.0, 16.0, 64.0, 1000.0}) {
      const CounterRng rng(13, static_cast<std::uint64_t>(classes));
      constexpr int kRows = 20000;
      double sum = 0.0;
      std::vector<double> l(static_cast<std::size_t>(classes)), e(static_cast<std::size_t>(classes));
      for (int row = 0; row < kRows; ++row) {
        double top = -1e300;
        for (std::int64_t v = 0; v < classes; ++v) {
          l[v] = rng.normal(static_cast<std::uint64_t>(row * classes + v));
          top = std::max(top, std::sqrt(spread) * l[v]);
        }
        double total = 0.0, projection = 0.0;
        for (std::int64_t v = 0; v < classes; ++v) {
          e[v] = std::exp(std::sqrt(spread) * l[v] - top);
          total += e[v];
          projection += l[v] * e[v];
        }
        sum += (projection / total) * (projection / total);
      }
      const double monte_carlo = sum / kRows;
      EXPECT_NEAR(theory::softmax_logit_projection_sq(spread, classes), monte_carlo, 0.02 * monte_carlo)
          << classes << " classes, spread " << spread;
    }
  }
  EXPECT_DOUBLE_EQ(theory::softmax_logit_projection_sq(0.0, 10), 0.1);
}

// Two rows' share of the softmax's excess, E[Σ p_i·p_j] − 1/C over E[Σ p²] − 1/C, for logits a shared N(0, rD) plus
// each row's own N(0, (1 − r)D), against Monte Carlo: the blurred form within 0.06 where the log-normal form is far
// off once D ≳ 2 (D = 8, r = 0.9: 0.45 against 0.82).
TEST(ModelTheory, SoftmaxSharedExcessBlurredMatchesMonteCarlo) {
  constexpr std::int64_t kClasses = 10;
  const auto softmax = [](const std::vector<double>& z, std::vector<double>& p) {
    const double top = *std::max_element(z.begin(), z.end());
    double total = 0.0;
    for (std::size_t v = 0; v < z.size(); ++v) total += (p[v] = std::exp(z[v] - top));
    for (double& x : p) x /= total;
  };
  for (const double spread : {0.5, 8.0, 50.0, 1000.0}) {
    for (const double r : {0.5, 0.9, 0.99}) {
      const CounterRng rng(17, static_cast<std::uint64_t>(spread * 100 + r * 1000));
      constexpr int kRows = 20000;
      double cross = 0.0, self = 0.0;
      std::vector<double> zi(kClasses), zj(kClasses), pi(kClasses), pj(kClasses);
      for (int row = 0; row < kRows; ++row) {
        for (std::int64_t v = 0; v < kClasses; ++v) {
          const std::uint64_t k = static_cast<std::uint64_t>((row * kClasses + v) * 3);
          const double shared = std::sqrt(r * spread) * rng.normal(k);
          zi[v] = shared + std::sqrt((1 - r) * spread) * rng.normal(k + 1);
          zj[v] = shared + std::sqrt((1 - r) * spread) * rng.normal(k + 2);
        }
        softmax(zi, pi);
        softmax(zj, pj);
        for (std::int64_t v = 0; v < kClasses; ++v) {
          cross += pi[v] * pj[v];
          self += pi[v] * pi[v];
        }
      }
      const double c = static_cast<double>(kClasses);
      const double measured = (cross / kRows - 1 / c) / (self / kRows - 1 / c);
      EXPECT_NEAR(theory::softmax_shared_excess_blurred(r, spread, kClasses), measured, 0.06)
          << "spread " << spread << ", r " << r;
    }
  }
  EXPECT_NEAR(theory::softmax_shared_excess_blurred(1.0, 50.0, kClasses), 1.0, 1e-12);
  EXPECT_DOUBLE_EQ(theory::softmax_shared_excess_blurred(-0.3, 2.0, kClasses),
                   theory::softmax_shared_excess(-0.3, 2.0));
}

TEST(ModelTheory, CrossEntropyGradientWithSelfLogit) {
  // A self logit that is just one more zero logit: exactly uniform predictions again.
  EXPECT_NEAR(theory::cross_entropy_grad_var_with_self(0.0, 0.0, 0.0, 10, 4, 1.0), 9.0 / (100.0 * 16.0), 1e-15);
  // A dominant self logit (p_self → 1, target elsewhere with probability 1 - 1/C): Σ(p - y)² → 2 - 2/C.
  EXPECT_NEAR(theory::cross_entropy_grad_var_with_self(0.2, 60.0, 1.0, 10, 4, 2.0), (2.0 - 0.2) / 10.0 / 16.0 * 4.0,
              1e-12);
  // Small spread, no self term beyond the others: agrees with the near-uniform formula to O(e^D/C²).
  const double spread = 0.3;
  const double uniform = theory::cross_entropy_grad_var({0.0, spread, 0.0}, 256, 8, 1.0);
  EXPECT_NEAR(theory::cross_entropy_grad_var_with_self(spread, 0.0, spread, 256, 8, 1.0), uniform, 1e-3 * uniform);
  // Huge spread (the others one-hot on their maximum) stays bounded: Σ p² ≤ 1.
  EXPECT_LE(theory::cross_entropy_grad_var_with_self(300.0, 10.0, 300.0, 256, 1, 1.0), 2.0 / 256.0);
}

TEST(ModelTheory, PreLnStandardMatchesMeasurement) {
  Case run;
  run.config = small_config(48, 512, NormPlacement::pre);
  expect_accuracy(run, "pre standard");
}

TEST(ModelTheory, PostLnStandardMatchesMeasurement) {
  Case run;
  run.config = small_config(48, 512, NormPlacement::post);
  run.config.tie_embeddings = false;
  const Measured m = expect_accuracy(run, "post standard");
  // Every Post-LN stream probe after the first is a norm's output; the norm's ε (1e-5 against the embedding's
  // 2·0.02² at blocks.0) keeps blocks.0.mid at 0.988, 1.2% under the ε-free 1.
  const StreamErrors e = stream_errors(m, predict(run, m), "post standard (ε)");
  EXPECT_LT(*std::max_element(e.forward.begin(), e.forward.end()), 0.002);
}

// Tied head (the default): Post-LN's head input keeps the input token's own embedding (a share ≈ 0.48 of the
// stream at the top), so its own logit is ≈ 7.1 and the loss gradient is ≈ 1.65× the near-uniform one.
TEST(ModelTheory, PostLnTiedStandardMatchesMeasurement) {
  Case run;
  run.config = small_config(48, 512, NormPlacement::post);
  ASSERT_TRUE(run.config.tie_embeddings);
  const Measured m = expect_accuracy(run, "post standard tied");
  const theory::ProbePrediction p = predict(run, m);
  std::printf(
      "post standard tied: head.logits var measured %.4g predicted %.4g; blocks.47.out backward var measured "
      "%.4g predicted %.4g\n",
      m.find(m.var, "head.logits"), p.find("head.logits")->var, m.find(m.backward_var, "blocks.47.out"),
      p.find("blocks.47.out")->backward_var);
  // The self logit doubles the logits' variance and raises the top gradient ≈ 1.65× over the near-uniform values.
  EXPECT_NEAR(p.find("head.logits")->var, m.find(m.var, "head.logits"), 0.05 * m.find(m.var, "head.logits"));
  const double top = m.find(m.backward_var, "blocks.47.out");
  EXPECT_NEAR(p.find("blocks.47.out")->backward_var, top, 0.05 * top);
}

TEST(ModelTheory, DeepScaleLikeMatchesMeasurementAndKeepsUnitVariance) {
  const Case run = deepscale_like(48, 512);
  const Measured m = expect_accuracy(run, "deepscale-like");
  for (std::size_t i = 0; i < m.names.size(); ++i) {
    if (is_stream(m.names[i])) {
      EXPECT_NEAR(m.var[i], 1.0, 0.10) << m.names[i];
    }
  }
}

// Rows of one sequence that share a target have correlated loss gradients, and causal attention's value path sums
// the gradients of every later query coherently at the early keys, so the first blocks' gradient grows with that
// correlation (docs/theory.md, "Rows of one sequence"). Targets drawn from 4 classes make every fourth pair share one.
TEST(ModelTheory, SharedTargetsCorrelateTheLossGradient) {
  Case run;
  run.config = small_config(8, 256, NormPlacement::pre);
  run.sequences = 4;
  run.target_classes = 4;
  const Measured m = measure(run);
  const StreamErrors with_tokens = stream_errors(m, predict(run, m), "pre-LN, targets from 4 classes");
  const StreamErrors uniform = stream_errors(m, predict(run, m, false), "the same, tokens assumed uniform");
  // Measured (seed 7): backward median / worst 5.4% / 13.7% with the batch's tokens, 18.4% / 210% without.
  const double worst = *std::max_element(with_tokens.backward.begin(), with_tokens.backward.end());
  EXPECT_LT(with_tokens.median(with_tokens.backward), 0.08);
  EXPECT_LT(worst, 0.20);
  EXPECT_GT(*std::max_element(uniform.backward.begin(), uniform.backward.end()), 5.0 * worst);
}

// With a tied head and next-token targets, row i's target is row i + 1's input token, whose self logit is large:
// the loss gradients of neighbouring rows are anti-correlated at the head, and the final norm's removal of each
// row's own direction (along which the self logit's part points) adds a positive covariance that brings the rows'
// correlation below it back to about zero (docs/theory.md, "Tied head").
TEST(ModelTheory, TiedHeadNextTokenRowsThroughTheFinalNorm) {
  const Case run = tied_deepscalelm(12, 256, NormPlacement::pre);
  const Measured m = measure(run);
  const theory::ProbePrediction p = predict(run, m), uniform = predict(run, m, false);
  const StreamErrors e = stream_errors(m, p, "pre-LN deepscalelm, tied, next-token targets");
  for (const char* name : {"final_norm.out", "blocks.11.out", "blocks.6.in", "blocks.0.in"})
    std::printf("%s backward corr: measured %.5f, predicted %.5f (tokens assumed uniform: %.5f)\n", name,
                m.find(m.backward_corr, name), p.find(name)->backward_corr, uniform.find(name)->backward_corr);
  // Measured (seed 7): the gradient's token correlation is −0.0132 at the head's input (predicted −0.0119; 0 with
  // tokens assumed uniform) and +0.0012 below the final norm (predicted −0.0015; +0.0099 uniform). Down the stack
  // it grows faster than gradient independence allows (0.026 measured at blocks.6.in, 0.014 predicted by
  // independence alone), which the gradient along the stream's common part accounts for (predicted 0.025;
  // docs/theory.md, "The gradient along the stream's common part"). Backward var median / worst 10.4% / 20.4%;
  // 12.7% / 45.9% without the common part, 16.6% / 95.6% without the removal's covariance either.
  for (const auto& [name, tolerance] :
       {std::pair{"final_norm.out", 0.003}, std::pair{"blocks.11.out", 0.004}, std::pair{"blocks.6.in", 0.005}}) {
    EXPECT_NEAR(p.find(name)->backward_corr, m.find(m.backward_corr, name), tolerance) << name;
    EXPECT_GT(std::abs(uniform.find(name)->backward_corr - m.find(m.backward_corr, name)), 2.0 * tolerance) << name;
  }
  const double independent = predict(run, m, true, false).find("blocks.6.in")->backward_corr;
  EXPECT_GT(std::abs(independent - m.find(m.backward_corr, "blocks.6.in")), 0.01);
  EXPECT_LT(e.median(e.backward), 0.12);
  EXPECT_LT(*std::max_element(e.backward.begin(), e.backward.end()), 0.30);
}

// Post-LN DeepScaleLM with a tied head: the gradient grows several-fold from the top block to the input, which
// gradient independence misses. The first norm's removal of each row's self direction leaves the rows a shared part
// along the stream's common direction, and since that direction holds every branch's own mean output, the skip and
// the branch return it in phase (docs/theory.md, "The gradient along the stream's common part").
TEST(ModelTheory, PostLnDeepScaleLmGradientFollowsTheCommonPart) {
  const Case run = tied_deepscalelm(24, 256, NormPlacement::post);
  const Measured m = measure(run);
  const theory::ProbePrediction p = predict(run, m), q = predict(run, m, true, false);
  const StreamErrors e = stream_errors(m, p, "post-LN deepscalelm, tied");
  const StreamErrors without = stream_errors(m, q, "the same, gradient independence only");
  const double growth = m.find(m.backward_var, "blocks.0.in") / m.find(m.backward_var, "blocks.23.out");
  const double predicted = p.find("blocks.0.in")->backward_var / p.find("blocks.23.out")->backward_var;
  const double independent_growth = q.find("blocks.0.in")->backward_var / q.find("blocks.23.out")->backward_var;
  std::printf("gradient growth blocks.23.out -> blocks.0.in: measured %.3f, predicted %.3f (independence: %.3f)\n",
              growth, predicted, independent_growth);
  for (const char* name :
       {"blocks.23.out", "blocks.23.ffn.sum", "blocks.23.mid", "blocks.23.in", "blocks.12.in", "blocks.0.in"})
    std::printf("%s backward corr: measured %.4f, predicted %.4f (independence: %.4f)\n", name,
                m.find(m.backward_corr, name), p.find(name)->backward_corr, q.find(name)->backward_corr);
  // Measured (seed 7): growth 3.32, predicted 2.45 (2.35 without the stream norms' finite-width factor, docs/theory.md
  // "A stream norm's scale fluctuates"; 1.09 by gradient independence alone; 2.70 without the norms' removal,
  // PostLnNormsRemoveALittleOfTheCommonPart; these measured 3.34 before 2026-12-07's attention terms, through which
  // DeepScaleLM calibrates); backward median / worst 5.3% / 42% (11.0% / 217% without the
  // term). Over seeds 1-6 the growth is 3.1-4.2 against about 2.35 predicted, while blocks.12.in over blocks.23.out is
  // 0.82 ± 0.02 against 0.79: what the bookkeeping misses at this shape is in the lowest blocks (at width 512 and 48
  // blocks the input is 6.0% over the prediction with seeds 1-4, 7.4% with the accuracy table's 16, docs/theory.md).
  // The seed is short here too: just below the first norm the measured correlation is +0.0047 against −0.0012
  // predicted (blocks.23.ffn.sum; the removal's covariance, "Tied head"), and 0.0097 against 0.0022 at blocks.23.in.
  EXPECT_GT(predicted, 0.65 * growth);
  EXPECT_LT(independent_growth, 0.4 * growth);
  EXPECT_GT(p.find("blocks.0.in")->backward_corr, 1.5 * q.find("blocks.0.in")->backward_corr);
  EXPECT_LT(e.median(e.backward), 0.07);
  EXPECT_LT(*std::max_element(e.backward.begin(), e.backward.end()), 0.45);
  EXPECT_GT(*std::max_element(without.backward.begin(), without.backward.end()), 1.5);
}

// Keel (model.norm = "both", rule keel; width 256, 24 blocks, 64 tokens): with the skip weight α = 48 every sum is
// ≈ 48·x, whose norm maps it back to the (already normalised) stream, so the stream is a norm output of variance ≈ 1
// from blocks.0.mid up, and its gradient passes each sublayer almost unchanged (the sum's norm divides by ≈ 48, the
// skip multiplies by 48; GPT-2's small branches add little). Measured, seeds 1-3 (uniform tokens and targets): forward
// worst 1.8% / 0.7% / 0.0%, backward median 2.2% / 0.9% / 0.6%, worst 2.2% / 3.1% / 0.7%. (Four `proplab run` seeds
// on Markov data, averaged as bench/theory_accuracy.py does: forward 0.0% / 0.2%, backward 0.8% / 0.8%;
// docs/theory.md, "Both norms".)
TEST(ModelTheory, KeelBothNormsMatchesMeasurement) {
  Case run;
  run.config = small_config(24, 256, NormPlacement::both);
  run.scaling.rule = "keel";
  for (std::uint64_t seed : {1, 2, 3}) {
    const Measured m = measure(run, seed);
    const theory::ProbePrediction p = predict(run, m);
    ASSERT_EQ(p.probes.size(), m.names.size());
    for (std::size_t i = 0; i < m.names.size(); ++i) EXPECT_EQ(p.probes[i].name, m.names[i]);
    const std::string label = "keel, both norms, seed " + std::to_string(seed);
    const StreamErrors e = stream_errors(m, p, label.c_str());
    EXPECT_LT(*std::max_element(e.forward.begin(), e.forward.end()), 0.05) << label;
    EXPECT_LT(e.median(e.backward), 0.04) << label;
    EXPECT_LT(*std::max_element(e.backward.begin(), e.backward.end()), 0.06) << label;
    // Every stream probe above the embedding is the output of a sum's norm.
    EXPECT_NEAR(m.find(m.var, "blocks.12.in"), 1.0, 1e-3) << label;
    EXPECT_NEAR(p.find("blocks.12.in")->var, 1.0, 1e-3) << label;
  }
}

// Above its first sublayer a "both" model at initialisation computes what the Post-LN model computes (the branch norm
// maps the normalised stream to itself), and below each stream norm its gradient is Post-LN's, so the common-part
// terms are Post-LN's there (common_part_without_branch_norm in theory/model_theory.cpp). With DeepScaleLM's unit
// branches, where those terms carry most of the backward, the two placements' gradients grow alike (seed 7: from
// blocks.23.out to blocks.0.in 3.41× with both norms, 3.32× Post-LN), and so must their predictions (2.49× and 2.45×;
// 2.38× and 2.36× before the stream norms' finite-width factor, the worst probe 44% and 42% off then; composed through
// the branch norm, the terms had predicted 1.83×, the worst probe 87% off). What both miss at this shape is Post-LN's
// known shortfall in the lowest blocks (docs/theory.md).
TEST(ModelTheory, BothNormsCommonPartFollowsPostLn) {
  double measured[2] = {}, predicted[2] = {}, worst[2] = {};
  const NormPlacement placements[2] = {NormPlacement::both, NormPlacement::post};
  for (int k = 0; k < 2; ++k) {
    const Case run = tied_deepscalelm(24, 256, placements[k]);
    const Measured m = measure(run);
    const theory::ProbePrediction p = predict(run, m);
    const StreamErrors e = stream_errors(m, p, norm_placement_name(placements[k]));
    measured[k] = m.find(m.backward_var, "blocks.0.in") / m.find(m.backward_var, "blocks.23.out");
    predicted[k] = p.find("blocks.0.in")->backward_var / p.find("blocks.23.out")->backward_var;
    worst[k] = *std::max_element(e.backward.begin(), e.backward.end());
    std::printf("%s deepscalelm: gradient growth blocks.23.out -> blocks.0.in measured %.3f, predicted %.3f\n",
                norm_placement_name(placements[k]), measured[k], predicted[k]);
  }
  EXPECT_LT(rel_error(measured[0], measured[1]), 0.05);
  EXPECT_LT(rel_error(predicted[0], predicted[1]), 0.03);
  EXPECT_LT(worst[0], worst[1] + 0.05);
}

// Each Post-LN stream norm's backward removes a little of the gradient's part along the common part, because the
// sublayer above it is not homogeneous of degree 1 (GELU's mean grows with the square of its input's scale; the
// softmax sharpens): 0.25% per norm below an FFN and 0.02% below an attention at DeepScaleLM's branches, which 96
// norms compound into the 11-14% by which the gradient of the accuracy table's Post-LN deepscalelm row was predicted
// high at its lower blocks (docs/theory.md, "The norm below removes a little"). The table's shape (width 512, 48
// blocks, 64 tokens), seeds 1-4: the gradient at blocks.36/24/12.in over blocks.47.out is measured 0.826 / 0.868 /
// 1.225 against 0.847 / 0.858 / 1.207 predicted (0.850 / 0.890 / 1.365 without the removal); at blocks.0.in 3.69
// against 3.59 (4.30 without). (Before the stream norms' finite-width factor the predictions were 0.844 / 0.852 /
// 1.194 and 3.51.)
// A Post-LN stack passes its token correlation through 2L norms, so the norm's finite-width correction to it
// compounds: Admin's stream at width 128 climbs to a token correlation of 0.94 at the top (4 seeds), which the
// reference's r·(1 − 1/d) per norm had predicted falling back to 0.77 after 0.82 at block 6. Each norm's output
// correlation is the tokens' expected cosine (NormMaps.LayerNormCorrelationIsTheExpectedCosine), and with it the
// prediction follows: 0.854, 0.903, 0.918, 0.923 against 0.873, 0.920, 0.934, 0.940 measured (at width 512 the
// top is within 0.002, blocks 2-10 up to 0.012 high). The gradient over the top block's, which reads the correlation
// through attention, went from 8.7%, 6.6% and 0.9% off to 0.9%, 0.2% and 2.4% at blocks 6, 12 and 18 (docs/theory.md,
// "LayerNorm"; at the accuracy table's shape the admin row's backward went from 5.0% / 6.9% to 1.6% / 5.1%).
// One network's gradient at block 6 over the top's scatters by about 9%, so four seeds left ±4.5% there; eight
// seeds (and with the stream norms' finite-width factor, "A stream norm's scale fluctuates", which moves block 6's
// prediction by +4.8% at this width): 2.9%, 1.2% and 1.2% off at blocks 6, 12 and 18 (24 seeds: 2.3%, 2.3%, 0.2%).
TEST(ModelTheory, PostLnStreamKeepsItsTokenCorrelation) {
  const char* names[] = {"blocks.6.out", "blocks.12.out", "blocks.18.out", "blocks.23.out"};
  double measured[4] = {}, predicted[4] = {}, gradient[4] = {}, gradient_predicted[4] = {};
  const int seeds = 8;
  for (std::uint64_t seed = 1; seed <= static_cast<std::uint64_t>(seeds); ++seed) {
    Case run;
    run.config = small_config(24, 128, NormPlacement::post);
    run.scaling.rule = "admin";
    const Measured m = measure(run, seed);
    const theory::ProbePrediction p = predict(run, m);
    const double top = m.find(m.backward_var, "blocks.23.out");
    for (int i = 0; i < 4; ++i) {
      measured[i] += m.find(m.corr, names[i]) / seeds;
      predicted[i] += p.find(names[i])->corr / seeds;
      gradient[i] += m.find(m.backward_var, names[i]) / top / seeds;
      gradient_predicted[i] += p.find(names[i])->backward_var / p.find("blocks.23.out")->backward_var / seeds;
    }
  }
  for (int i = 0; i < 4; ++i) {
    std::printf("%s: token corr measured %.4f, predicted %.4f; gradient over the top %.4f, predicted %.4f\n",
                names[i], measured[i], predicted[i], gradient[i], gradient_predicted[i]);
    EXPECT_NEAR(measured[i], predicted[i], 0.025) << names[i];
    EXPECT_LT(rel_error(gradient[i], gradient_predicted[i]), 0.035) << names[i];
  }
  EXPECT_GT(measured[3], 0.9);
}

TEST(ModelTheory, PostLnNormsRemoveALittleOfTheCommonPart) {
  const char* names[] = {"blocks.36.in", "blocks.24.in", "blocks.12.in", "blocks.0.in"};
  double measured[4] = {}, predicted[4] = {}, without[4] = {};
  const int seeds = 4;
  for (std::uint64_t seed = 1; seed <= static_cast<std::uint64_t>(seeds); ++seed) {
    const Case run = tied_deepscalelm(48, 512, NormPlacement::post);
    const Measured m = measure(run, seed);
    const theory::ProbePrediction p = predict(run, m), q = predict(run, m, true, true, false);
    const double top = m.find(m.backward_var, "blocks.47.out");
    for (int i = 0; i < 4; ++i) {
      measured[i] += m.find(m.backward_var, names[i]) / top / seeds;
      predicted[i] += p.find(names[i])->backward_var / p.find("blocks.47.out")->backward_var / seeds;
      without[i] += q.find(names[i])->backward_var / q.find("blocks.47.out")->backward_var / seeds;
    }
  }
  for (int i = 0; i < 4; ++i)
    std::printf("%s over blocks.47.out: measured %.3f, predicted %.3f (without the removal %.3f)\n", names[i],
                measured[i], predicted[i], without[i]);
  for (int i = 0; i < 3; ++i) EXPECT_LT(rel_error(measured[i], predicted[i]), 0.04) << names[i];
  EXPECT_GT(rel_error(measured[2], without[2]), 0.08);
  EXPECT_LT(rel_error(measured[3], predicted[3]), 0.12);
}

TEST(ModelTheory, PreLnStandardVarianceGrowsLinearly) {
  Case run;
  run.config = small_config(24, 256, NormPlacement::pre);
  const Measured m = measure(run);
  std::vector<double> xs, ys;
  for (int l = 0; l < run.config.layers; ++l) {
    xs.push_back(l);
    ys.push_back(m.find(m.var, "blocks." + std::to_string(l) + ".out"));
  }
  const double n = static_cast<double>(xs.size());
  double sx = 0, sy = 0, sxx = 0, sxy = 0, syy = 0;
  for (std::size_t i = 0; i < xs.size(); ++i)
    sx += xs[i], sy += ys[i], sxx += xs[i] * xs[i], sxy += xs[i] * ys[i], syy += ys[i] * ys[i];
  const double cov = sxy - sx * sy / n, vx = sxx - sx * sx / n, vy = syy - sy * sy / n;
  const double r2 = cov * cov / (vx * vy);
  std::printf("pre standard: linear fit of residual var against depth: slope %.3g, R² %.4f\n", cov / vx, r2);
  EXPECT_GT(r2, 0.95);
  EXPECT_GT(cov / vx, 0.0);
}

// The Post-LN law: with Xavier init the gradient variance at the residual stream changes geometrically with
// depth. Theory predicts, for 64 blocks of width 256, a constant factor per block over the lower half (1.025: each
// block's gradient a little larger than the one above) and a steeper one over the top blocks (1.161 over blocks
// 47-59, where the stream's token correlation and the norms' gains are still settling). The measured factors
// (geometric means of the per-block ratios over each range) must match the predicted ones (seed 7: 1.020 and 1.160
// measured; the top range 1.114-1.160 over seeds 1-3 and 7). Before the stream norms' finite-width factor
// (docs/theory.md, "A stream norm's scale fluctuates": +0.8% a block at this width) the predictions were 1.014 and
// 1.149.
TEST(ModelTheory, PostLnXavierGradientChangesGeometrically) {
  Case run;
  run.config = small_config(64, 256, NormPlacement::post);
  run.scaling.rule = "xavier";
  run.sequences = 8;
  const Measured m = measure(run);
  const theory::ProbePrediction p = predict(run, m);
  auto stream = [](int l) { return "blocks." + std::to_string(l) + ".in"; };
  auto measured = [&](int l) { return m.find(m.backward_var, stream(l)); };
  auto predicted = [&](int l) { return p.find(stream(l))->backward_var; };
  // The mean factor per block from block `lo` up to block `hi`.
  auto factor = [](const auto& var, int lo, int hi) { return std::pow(var(lo) / var(hi), 1.0 / (hi - lo)); };
  const int half = run.config.layers / 2;
  double low_mean = factor(predicted, 1, half), spread = 0.0;
  for (int l = 1; l < half; ++l) spread = std::max(spread, std::abs(predicted(l) / predicted(l + 1) - low_mean));
  const double top_predicted = factor(predicted, 47, 59), top_measured = factor(measured, 47, 59);
  const double low_measured = factor(measured, 1, half);
  std::printf(
      "post xavier 64x256: factor per block, blocks 1-%d: measured %.4f predicted %.4f (predicted per-block "
      "spread %.4f); blocks 47-59: measured %.4f predicted %.4f\n",
      half, low_measured, low_mean, spread, top_measured, top_predicted);
  EXPECT_LT(spread, 0.005);  // theory: a near-constant factor
  // The lower half's measured factor scatters between seeds by about ±0.02 (0.974, 1.000, 1.016, 1.020 for seeds
  // 2, 1, 3, 7 against the predicted 1.025): a slow geometric change is hard to resolve from one network.
  EXPECT_NEAR(low_measured, low_mean, 0.05);
  EXPECT_NEAR(top_measured, top_predicted, 0.05);
  EXPECT_GT(top_predicted, 1.1);  // the top range is a genuinely steeper geometric change
}

// An unnormalised Xavier transformer's stream grows geometrically, and 24 blocks of width 64 reach an attention
// logit spread √D ≈ 9·10⁵ at the top: one-hot softmax rows, whose expected query/key gradient is carried by
// near-ties one network almost never has. Upstream of the topmost such attention the backward is not predicted
// (NaN, with the reason); above it, and everywhere in a shallower copy (6 blocks), it is.
TEST(ModelTheory, SaturatedAttentionStopsTheBackwardPrediction) {
  Case run;
  run.config = small_config(24, 64, NormPlacement::none);
  run.scaling.rule = "xavier";
  const theory::ProbePrediction p =
      theory::predict_transformer(transformer_numbers(run.scaling, run.config), theory::TheoryInputs{});
  std::size_t cut = p.probes.size();
  for (std::size_t i = 0; i < p.probes.size(); ++i)
    if (p.probes[i].name == "blocks.23.attn.out") cut = i;
  ASSERT_LT(cut, p.probes.size());
  for (std::size_t i = 0; i < p.probes.size(); ++i) {
    const theory::ProbeTheory& t = p.probes[i];
    if (t.kind == std::string("logits") && t.name != "head.logits") continue;  // never has a backward prediction
    if (i < cut) {
      EXPECT_TRUE(std::isnan(t.backward_var)) << t.name;
      EXPECT_NE(t.no_backward.find("below block 23's saturated attention"), std::string::npos) << t.name;
    } else {
      EXPECT_TRUE(std::isfinite(t.backward_var) && t.backward_var > 0.0) << t.name;
      EXPECT_TRUE(t.no_backward.empty()) << t.name;
    }
    EXPECT_TRUE(std::isfinite(t.var)) << t.name;  // the forward is still predicted
  }
  run.config.layers = 6;
  const theory::ProbePrediction shallow =
      theory::predict_transformer(transformer_numbers(run.scaling, run.config), theory::TheoryInputs{});
  for (const theory::ProbeTheory& t : shallow.probes) {
    if (t.kind != std::string("logits") || t.name == "head.logits") {
      EXPECT_TRUE(std::isfinite(t.backward_var) && t.backward_var > 0.0) << t.name;
    }
  }
}

TEST(ModelTheory, ReZeroAndSkipInitStartAsTheIdentity) {
  for (const char* rule : {"rezero", "skipinit"}) {
    Case run;
    run.config = small_config(6, 64, NormPlacement::none);
    run.scaling.rule = rule;
    const Measured m = measure(run);
    const theory::ProbePrediction p = predict(run, m);
    const double embed = m.find(m.var, "embed.out");
    for (std::size_t i = 0; i < m.names.size(); ++i) {
      if (!is_stream(m.names[i])) continue;
      EXPECT_EQ(m.var[i], embed) << rule << " " << m.names[i];
      EXPECT_DOUBLE_EQ(p.find(m.names[i])->var, p.find("embed.out")->var) << rule << " " << m.names[i];
      EXPECT_DOUBLE_EQ(p.find(m.names[i])->backward_var, p.find("blocks.5.out")->backward_var)
          << rule << " " << m.names[i];
    }
  }
}

// The worst differences of the bucketed prediction from the exact positions' one (`label` printed): relative in the
// forward and backward variances, absolute in the token correlation, each within the bounds below.
theory::ProbePrediction expect_buckets_follow_positions(const TransformerConfig& config, const char* rule,
                                                        const std::string& label) {
  ScalingConfig scaling;
  scaling.rule = rule;
  const theory::TransformerNumbers numbers = transformer_numbers(scaling, config);
  theory::TheoryInputs exact_inputs, bucketed_inputs;
  exact_inputs.exact_positions = true;
  const theory::ProbePrediction exact = theory::predict_transformer(numbers, exact_inputs);
  const theory::ProbePrediction bucketed = theory::predict_transformer(numbers, bucketed_inputs);
  double worst_var = 0.0, worst_corr = 0.0, worst_backward = 0.0;
  for (std::size_t i = 0; i < exact.probes.size(); ++i) {
    const theory::ProbeTheory &e = exact.probes[i], &b = bucketed.probes[i];
    if (std::isfinite(e.var)) worst_var = std::max(worst_var, std::abs(b.var / e.var - 1.0));
    if (std::isfinite(e.corr)) worst_corr = std::max(worst_corr, std::abs(b.corr - e.corr));
    if (std::isfinite(e.backward_var))
      worst_backward = std::max(worst_backward, std::abs(b.backward_var / e.backward_var - 1.0));
  }
  std::printf("%s, %d tokens: bucketed vs exact: var %.2e, corr %.2e, backward var %.2e (worst)\n", label.c_str(),
              static_cast<int>(config.seq_len), worst_var, worst_corr, worst_backward);
  EXPECT_LT(worst_var, 0.005) << label;
  EXPECT_LT(worst_corr, 0.002) << label;
  EXPECT_LT(worst_backward, 0.01) << label;
  EXPECT_EQ(bucketed.formulae.find("leading own mode") == std::string::npos,
            exact.formulae.find("leading own mode") == std::string::npos)
      << label;
  return bucketed;
}

// Long sequences group later positions into buckets (theory/token_field); the bucketed prediction must match the
// one that tracks every position. At 128 tokens (42 buckets), the accuracy table's longer length: the exact
// positions' O(L³) pair products made it the longest theory test of CI at 192 tokens (3 minutes) and at 160 (2; the
// worst errors there 1.4e-3 / 4.0e-4 / 1.6e-3, here 1.2e-3 / 3.6e-4 / 1.6e-3).
TEST(ModelTheory, BucketedPositionsMatchExactPositions) {
  for (const NormPlacement norm : {NormPlacement::pre, NormPlacement::post}) {
    for (const char* rule : {"standard", "xavier", "deepscalelm"}) {
      TransformerConfig config = small_config(12, 128, norm);
      config.seq_len = 128;
      expect_buckets_follow_positions(config, rule, std::string(norm_placement_name(norm)) + " " + rule);
    }
  }
  // The keys' leading own mode on buckets (theory/token_field, CausalWeights::Mode): no-norm `xavier` carries it from
  // block 8, where its stream's first positions' excess starts to saturate the attention. Measured at 10 blocks:
  // worst 3.8e-3 / 5.8e-4 / 2.2e-3.
  TransformerConfig config = small_config(10, 512, NormPlacement::none);
  config.seq_len = 128;
  const theory::ProbePrediction bucketed =
      expect_buckets_follow_positions(config, "xavier", "none xavier (correlated logits)");
  EXPECT_NE(bucketed.formulae.find("leading own mode"), std::string::npos);
}

TEST(ModelTheory, ThousandLayerPredictionIsFast) {
  TransformerConfig config = small_config(1000, 1024, NormPlacement::pre);
  const auto start = std::chrono::steady_clock::now();
  const theory::ProbePrediction p = theory::predict_transformer(transformer_numbers(ScalingConfig{}, config), {});
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("1000-layer prediction: %zu probes in %.3f s\n", p.probes.size(), seconds);
  EXPECT_TRUE(std::isfinite(p.find("blocks.999.out")->var));
  EXPECT_TRUE(std::isfinite(p.find("embed.out")->backward_var));
}

// Finite-width bands (docs/theory.md, "Finite-width bands", transformers): over 48 initialisations and token
// batches of an 8-block transformer (width 64, 4 heads, 2 × 32 tokens), the z-scores
// (log var − (log predicted − sd²/2))/sd of every probe with a band are about standard normal: within 1 sd about
// 68%, within 2 sd about 95%, mean about 0, standard deviation about 1. z's of one network are correlated along its
// depth, so the tolerances allow for effectively fewer samples. Measured: within 2 sd 91.6% / 94.6% / 92.2%, sd of z
// 1.13 / 1.05 / 1.12. Without the input Gram's sampling (each fresh map sees rows that span at most the stream's d
// dimensions) and the sequences' shared position embeddings, the bands of the branches and the FFN were 25–40% too
// narrow; without the skip–branch term's shared sampling, Pre-LN standard was at 90.3% and 1.17.
struct BandCoverage {
  double inside1 = 0, inside2 = 0, mean = 0, sd = 0;
  std::size_t count = 0;
};

BandCoverage band_coverage(const Case& run, const char* label, int networks = 48) {
  std::vector<double> z;
  theory::TheoryInputs inputs;
  inputs.sequences = run.sequences;
  const theory::ProbePrediction p = theory::predict_transformer(transformer_numbers(run.scaling, run.config), inputs);
  for (int n = 0; n < networks; ++n) {
    const Measured m = measure(run, 300 + n);
    for (std::size_t i = 0; i < m.names.size(); ++i) {
      const theory::ProbeTheory* t = p.find(m.names[i]);
      if (!t || !std::isfinite(t->var_log_sd) || t->var_log_sd <= 0) continue;
      z.push_back((std::log(m.var[i]) - (std::log(t->var) - 0.5 * t->var_log_sd * t->var_log_sd)) / t->var_log_sd);
    }
  }
  BandCoverage c;
  double sum = 0, sum_sq = 0;
  for (const double v : z) {
    c.inside1 += std::fabs(v) < 1 ? 1 : 0;
    c.inside2 += std::fabs(v) < 2 ? 1 : 0;
    sum += v;
    sum_sq += v * v;
  }
  c.count = z.size();
  const double count = static_cast<double>(z.size());
  c.inside1 /= count;
  c.inside2 /= count;
  c.mean = sum / count;
  c.sd = std::sqrt(sum_sq / count - c.mean * c.mean);
  std::printf("%s: %zu z-scores: within 1 sd %.3f, within 2 sd %.3f, mean %.3f, sd %.3f\n", label, c.count, c.inside1,
              c.inside2, c.mean, c.sd);
  return c;
}

void expect_band_holds(const Case& run, const char* label) {
  const BandCoverage c = band_coverage(run, label);
  EXPECT_GT(c.inside1, 0.55) << label;
  EXPECT_LT(c.inside1, 0.80) << label;
  EXPECT_GT(c.inside2, 0.90) << label;
  EXPECT_NEAR(c.mean, 0.0, 0.3) << label;
  EXPECT_GT(c.sd, 0.8) << label;
  EXPECT_LT(c.sd, 1.25) << label;
}

Case band_case(NormPlacement norm, const char* rule) {
  Case run;
  run.config = small_config(8, 64, norm);
  run.config.seq_len = 32;
  run.config.heads = 4;
  run.scaling.rule = rule;
  return run;
}

TEST(ModelTheory, FiniteWidthBandsHoldOverInitialisations) {
  expect_band_holds(band_case(NormPlacement::pre, "standard"), "pre standard");
  Case post = band_case(NormPlacement::post, "standard");
  post.config.tie_embeddings = false;  // the untied head's logits have a band too
  expect_band_holds(post, "post standard, untied");
  expect_band_holds(band_case(NormPlacement::pre, "deepscalelm"), "pre deepscalelm");
}

TEST(ModelTheory, MlpMeanField) {
  MlpConfig mlp;
  mlp.layers = 6;
  mlp.activation = Activation::tanh;
  mlp.sigma_w2 = 1.0;
  mlp.sigma_b2 = 0.0;
  const theory::ProbePrediction p = theory::predict_mlp(mlp_numbers(ScalingConfig{}, mlp), {});
  ASSERT_TRUE(p.mean_field);
  EXPECT_NEAR(p.mean_field->chi1, 1.0, 1e-3);
  mlp.sigma_w2 = 4.0;
  const theory::ProbePrediction chaotic = theory::predict_mlp(mlp_numbers(ScalingConfig{}, mlp), {});
  EXPECT_EQ(chaotic.mean_field->phase, theory::Phase::chaotic);
  EXPECT_LT(chaotic.mean_field->c_star, 0.9);
}

}  // namespace
}  // namespace proplab
