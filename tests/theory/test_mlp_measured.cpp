// theory/mlp_measured: a real deep MLP built by make_model, measured through a capturing ProbeSink at
// initialisation, against the mean-field theory (theory::predict_mlp, theory::MeanField).
//
// The network: ReLU, He init (σ_w² = 2, σ_b² = 0: the biases exist but mlp_mean_field_init sets them to 0), width
// 1024 (512 for the averaged correlations), 50 layers, input_dim = width, on a batch of independent N(0, 1) inputs
// (input correlation c₀ ≈ 0). Checked: (1) the pre-activation variance of one 50-layer network: layer 0 within 3% of
// the prediction, deeper layers within the finite-width drift band around layer 0 and the predicted q_l (see the test
// for why 3% cannot hold for one network); (2) the uncentred correlation c_l = E[u_a·u_b]/E[u²] between the
// pre-activations of distinct samples after layers 1–3, averaged over networks, follows the correlation map from c₀ = 0
// (1/π, 0.4937, 0.6048) within 0.02.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <numbers>
#include <string>
#include <vector>

#include "core/rng.h"
#include "models/model.h"
#include "scaling/theory_numbers.h"
#include "theory/mean_field.h"
#include "theory/model_theory.h"

namespace proplab {
namespace {

// Keeps a copy of every forward probe tensor (backward is not run: grad_scale = 0).
class CapturingSink final : public ProbeSink {
 public:
  struct Capture {
    std::vector<float> values;
    std::int64_t rows = 0, features = 0;
  };
  std::map<int, Capture> forward_;

  void forward(int probe, const Tensor& x, std::int64_t) override {
    Capture& c = forward_[probe];
    c.values = x.to_vector();
    c.rows = x.dim(0);
    c.features = x.numel() / x.dim(0);
  }
  void backward(int, const Tensor&, std::int64_t) override { ADD_FAILURE() << "backward probe on a forward-only pass"; }
  void attention_logits(int, const probe::LogitSums&, const Tensor&, int, float) override {
    ADD_FAILURE() << "an MLP has no attention logits";
  }
};

// Population variance over all elements (as probe/moments records it) and the uncentred second moment.
struct ElementMoments {
  double var = 0.0;
  double second_moment = 0.0;
};

ElementMoments element_moments(const std::vector<float>& x) {
  const double n = static_cast<double>(x.size());
  double mean = 0.0, second = 0.0;
  for (float v : x) {
    mean += v;
    second += static_cast<double>(v) * v;
  }
  mean /= n;
  second /= n;
  return {second - mean * mean, second};
}

// c = E[u_a·u_b] / E[u_a·u_a] over all pairs a ≠ b of rows (the mean-field, uncentred correlation).
double pair_correlation(const CapturingSink::Capture& c) {
  double cross = 0.0, self = 0.0;
  std::int64_t pairs = 0;
  for (std::int64_t a = 0; a < c.rows; ++a) {
    const float* ua = c.values.data() + a * c.features;
    double self_a = 0.0;
    for (std::int64_t f = 0; f < c.features; ++f) self_a += static_cast<double>(ua[f]) * ua[f];
    self += self_a;
    for (std::int64_t b = a + 1; b < c.rows; ++b) {
      const float* ub = c.values.data() + b * c.features;
      double dot = 0.0;
      for (std::int64_t f = 0; f < c.features; ++f) dot += static_cast<double>(ua[f]) * ub[f];
      cross += dot;
      ++pairs;
    }
  }
  return (cross / static_cast<double>(pairs)) / (self / static_cast<double>(c.rows));
}

ModelConfig relu_he_config(int layers, int width) {
  ModelConfig config;
  config.set_kind(ModelKind::mlp);
  config.mlp().layers = layers;
  config.mlp().width = width;
  config.mlp().input_dim = width;
  config.mlp().outputs = 1;
  config.mlp().activation = Activation::relu;
  config.mlp().sigma_w2 = 2.0;
  config.mlp().sigma_b2 = 0.0;
  config.mlp().head = MlpHead::regression;
  return config;
}

// One forward pass of a freshly initialised network (seed) on independent N(0, 1) inputs (input variance 1,
// correlation between samples ≈ 0), every probe captured into `sink`; returns the network.
std::unique_ptr<Model> forward_pass(const ModelConfig& config, std::int64_t rows, std::uint64_t seed,
                                    CapturingSink& sink, const ScalingConfig& scaling = ScalingConfig{}) {
  std::unique_ptr<Model> model = make_model(config, scaling, seed);
  const CounterRng rng(seed, 1);
  std::vector<float> inputs(static_cast<std::size_t>(rows * config.mlp().input_dim));
  for (std::size_t i = 0; i < inputs.size(); ++i) inputs[i] = rng.normal(i);
  Batch batch{Tensor::from_vector({rows, config.mlp().input_dim}, inputs), Tensor::zeros({rows, 1})};
  StepContext context;
  context.training = false;
  context.sink = &sink;
  model->forward_backward(batch, 0.0f, context);
  return model;
}

// Each layer's captured pre-activations of forward_pass, l = 0..layers-1.
std::vector<CapturingSink::Capture> measure_preacts(const ModelConfig& config, std::int64_t rows, std::uint64_t seed) {
  CapturingSink sink;
  const std::unique_ptr<Model> model = forward_pass(config, rows, seed, sink);
  std::vector<CapturingSink::Capture> preacts;
  for (const ProbeInfo& info : model->probes())
    if (info.name == "layers." + std::to_string(preacts.size()) + ".preact") {
      EXPECT_TRUE(sink.forward_.count(info.depth)) << info.name << " was not handed to the sink";
      preacts.push_back(sink.forward_[info.depth]);
    }
  EXPECT_EQ(static_cast<int>(preacts.size()), config.mlp().layers);
  return preacts;
}

theory::ProbePrediction predict(const ModelConfig& config, std::int64_t rows,
                                const ScalingConfig& scaling = ScalingConfig{}) {
  theory::TheoryInputs inputs;
  inputs.input_mean = 0.0;
  inputs.input_var = 1.0;
  inputs.input_corr = 0.0;
  inputs.input_norm_spread = 2.0 / static_cast<double>(config.mlp().input_dim);
  inputs.sequences = rows;
  return theory::predict_mlp(mlp_numbers(scaling, config.mlp()), inputs);
}

TEST(MlpMeasured, ReluHePreactivationVarianceThroughFiftyLayers) {
  // One network, 50 layers of width 1024. The mean-field q_l = 2 is exact for the average over networks, but a
  // single finite-width ReLU network's log q_l drifts like a random walk with Var[log q_l] ≈ 5·l/width (Hanin &
  // Nica 2019): after 50 layers its std is ≈ 0.5, and networks with other seeds measured q_49/q_0 = 0.52, 0.77,
  // 0.92, 1.21, 1.51. So only layer 0 (an average over 1024 fan-in weights and 64·1024 elements) is held to 3%;
  // deeper layers to the finite-width band exp(±3·√(5·l/width)) around layer 0 and around q_l. That band still
  // rejects a mis-scaled init: σ_w² = 2.2 moves log q by 0.095 per layer, 4.7 after 49 layers against a band of 1.5.
  constexpr int kLayers = 50;
  constexpr int kWidth = 1024;
  constexpr std::int64_t kRows = 64;
  const ModelConfig config = relu_he_config(kLayers, kWidth);
  const std::vector<CapturingSink::Capture> preacts = measure_preacts(config, kRows, 20240611);
  ASSERT_EQ(static_cast<int>(preacts.size()), kLayers);
  const theory::ProbePrediction prediction = predict(config, kRows);
  ASSERT_TRUE(prediction.mean_field.has_value());
  const std::vector<theory::MeanFieldLayer>& field = prediction.mean_field->layers;
  ASSERT_EQ(static_cast<int>(field.size()), kLayers);
  for (int l = 0; l < kLayers; ++l) EXPECT_NEAR(field[l].q, 2.0, 1e-12) << "He init preserves q = σ_w²·E[x²]";

  const ElementMoments first = element_moments(preacts[0].values);
  for (int l = 0; l < kLayers; ++l) {
    SCOPED_TRACE("layer " + std::to_string(l));
    const ElementMoments m = element_moments(preacts[l].values);
    const theory::ProbeTheory* predicted = prediction.find("layers." + std::to_string(l) + ".preact");
    ASSERT_NE(predicted, nullptr);
    std::printf("layer %2d  var %.4f  var/var_0 %.4f  E[u^2] %.4f  predicted var %.4f  q_l %.4f\n", l, m.var,
                m.var / first.var, m.second_moment, predicted->var, field[l].q);
    const double band = l == 0 ? std::log(1.03) : 3.0 * std::sqrt(5.0 * l / kWidth);
    EXPECT_LE(std::fabs(std::log(m.var / first.var)), band);
    EXPECT_LE(std::fabs(std::log(m.var / predicted->var)), band);
    EXPECT_LE(std::fabs(std::log(m.second_moment / field[l].q)), band);
  }
}

TEST(MlpMeasured, ReluHeCorrelationOfIndependentInputs) {
  // The correlation map from c₀ = 0 (the documented ReLU/He values), taken from theory::MeanField and predict_mlp.
  const theory::MeanField he(theory::Activation::relu, 2.0, 0.0);
  const std::vector<theory::MeanFieldLayer> from_zero = he.propagate(2.0, 0.0, 3);
  EXPECT_NEAR(from_zero[1].c, 1.0 / std::numbers::pi, 1e-12);
  EXPECT_NEAR(from_zero[1].c, 0.3183, 1e-4);
  EXPECT_NEAR(from_zero[2].c, 0.4937, 1e-4);
  EXPECT_NEAR(from_zero[3].c, 0.6048, 1e-4);

  // A single width-1024 network's pair correlation scatters by about 0.025 around the map (measured on 50-layer
  // networks: c_3 = 0.568, 0.637, 0.596, 0.601, 0.584), so c_l is averaged over 16 networks of 4 layers, each on
  // 64 independent inputs (all 2016 pairs). Width 512 keeps the test fast (initialising the weights dominates
  // its time); the scatter of the average, about 0.035/√16 ≈ 0.009, stays well inside 0.02.
  constexpr int kLayers = 4;
  constexpr int kWidth = 512;
  constexpr std::int64_t kRows = 64;
  constexpr int kNetworks = 16;
  const ModelConfig config = relu_he_config(kLayers, kWidth);
  const theory::ProbePrediction prediction = predict(config, kRows);
  ASSERT_TRUE(prediction.mean_field.has_value());
  const std::vector<theory::MeanFieldLayer>& field = prediction.mean_field->layers;
  ASSERT_EQ(static_cast<int>(field.size()), kLayers);
  std::vector<double> measured(kLayers, 0.0);
  for (int n = 0; n < kNetworks; ++n) {
    const std::vector<CapturingSink::Capture> preacts = measure_preacts(config, kRows, 1000 + n);
    ASSERT_EQ(static_cast<int>(preacts.size()), kLayers);
    for (int l = 0; l < kLayers; ++l) measured[l] += pair_correlation(preacts[l]) / kNetworks;
  }
  for (int l = 0; l < kLayers; ++l) {
    SCOPED_TRACE("layer " + std::to_string(l));
    EXPECT_NEAR(field[l].c, from_zero[l].c, 1e-12);
    std::printf("layer %d  measured c %.4f  predicted %.4f\n", l, measured[l], field[l].c);
    EXPECT_NEAR(measured[l], field[l].c, 0.02);
  }
}

// The population variance of every probe of one freshly initialised network (seed) on independent N(0, 1) inputs.
std::map<std::string, double> measure_vars(const ModelConfig& config, std::int64_t rows, std::uint64_t seed,
                                          const ScalingConfig& scaling = ScalingConfig{}) {
  CapturingSink sink;
  const std::unique_ptr<Model> model = forward_pass(config, rows, seed, sink, scaling);
  std::map<std::string, double> vars;
  for (const ProbeInfo& info : model->probes()) {
    if (sink.forward_.count(info.depth)) vars[info.name] = element_moments(sink.forward_[info.depth].values).var;
  }
  return vars;
}

TEST(MlpMeasured, OneReluInputFollowsHaninAndNicasRandomWalk) {
  // One input (B = 1), ReLU/He: the scale's log-variance grows by exactly 5/width a layer (Var[2·relu(g)²] = 5),
  // and a pre-activation's own mean of squares adds 2/width.
  constexpr int kWidth = 128;
  const ModelConfig config = relu_he_config(12, kWidth);
  const theory::ProbePrediction prediction = predict(config, 1);
  for (int l = 0; l < 12; ++l) {
    const theory::ProbeTheory* pre = prediction.find("layers." + std::to_string(l) + ".preact");
    ASSERT_NE(pre, nullptr);
    EXPECT_NEAR(pre->var_log_sd * pre->var_log_sd, (5.0 * l + 2.0) / kWidth, 0.01 * (5.0 * l + 2.0) / kWidth) << l;
  }
}

// The finite-width band over initialisations: for 64 networks, z = (log var − (log predicted − sd²/2)) / sd of
// every preact and postact probe should be about standard normal: within ±1 about 68% of the time, within ±2
// about 95%, standard deviation about 1. (z's of one network are correlated along its depth, so the tolerances
// allow for the effectively fewer samples.)
void expect_band_holds(const ModelConfig& config, std::int64_t rows, const char* label,
                       const ScalingConfig& scaling = ScalingConfig{},
                       const std::vector<std::string>& kinds = {"preact", "postact"}) {
  constexpr int kNetworks = 64;
  const theory::ProbePrediction prediction = predict(config, rows, scaling);
  std::vector<double> z;
  for (int n = 0; n < kNetworks; ++n) {
    for (const auto& [name, var] : measure_vars(config, rows, 5000 + n, scaling)) {
      const theory::ProbeTheory* p = prediction.find(name);
      ASSERT_NE(p, nullptr) << name;
      if (std::find(kinds.begin(), kinds.end(), p->kind) == kinds.end()) continue;
      ASSERT_TRUE(std::isfinite(p->var_log_sd) && p->var_log_sd > 0) << name;
      z.push_back((std::log(var) - (std::log(p->var) - 0.5 * p->var_log_sd * p->var_log_sd)) / p->var_log_sd);
    }
  }
  double inside1 = 0, inside2 = 0, sum = 0, sum_sq = 0;
  for (const double v : z) {
    inside1 += std::fabs(v) < 1 ? 1 : 0;
    inside2 += std::fabs(v) < 2 ? 1 : 0;
    sum += v;
    sum_sq += v * v;
  }
  const double count = static_cast<double>(z.size());
  const double mean = sum / count, sd = std::sqrt(sum_sq / count - mean * mean);
  std::printf("%s: %zu z-scores: within 1 sd %.3f, within 2 sd %.3f, mean %.3f, sd %.3f\n", label, z.size(),
              inside1 / count, inside2 / count, mean, sd);
  EXPECT_GT(inside1 / count, 0.55) << label;
  EXPECT_LT(inside1 / count, 0.80) << label;
  EXPECT_GT(inside2 / count, 0.90) << label;
  EXPECT_NEAR(mean, 0.0, 0.3) << label;
  EXPECT_GT(sd, 0.8) << label;
  EXPECT_LT(sd, 1.25) << label;
}

TEST(MlpMeasured, FiniteWidthBandHoldsOverInitialisations) {
  // ReLU at He init (the random walk), 24 layers of width 128 on 16 samples.
  expect_band_holds(relu_he_config(24, 128), 16, "relu he");
  // tanh in the ordered phase (σ_w² = 1.5, σ_b² = 0.05): the length map's slope < 1 damps the walk, so the band
  // saturates instead of growing.
  ModelConfig tanh = relu_he_config(24, 128);
  tanh.mlp().activation = Activation::tanh;
  tanh.mlp().sigma_w2 = 1.5;
  tanh.mlp().sigma_b2 = 0.05;
  expect_band_holds(tanh, 16, "tanh ordered");
  // GELU near its critical point (σ_w² = 2.3, σ_b² = 0.05).
  ModelConfig gelu = tanh;
  gelu.mlp().activation = Activation::gelu_erf;
  gelu.mlp().sigma_w2 = 2.3;
  expect_band_holds(gelu, 16, "gelu");
}

// Residual MLPs, h_l = λ·h_{l-1} + β·φ(W h_{l-1} + b): the stream's band and the O(1/width) shift of its centre
// (docs/theory.md, "Finite-width bands", residual streams) over 64 networks, the residual probes alone and then
// every probe. Without the shift the ReLU streams' z-scores averaged +0.48 (deepscalelm) and +0.69 (depth-μP, 88.7%
// within 2 sd): each sample's stream mean follows its own random scale.
TEST(MlpMeasured, FiniteWidthBandHoldsForResidualStreams) {
  ModelConfig relu = relu_he_config(24, 128);
  relu.mlp().residual = true;
  ScalingConfig deepscalelm;
  deepscalelm.rule = "deepscalelm";  // β² = 2/N_adds, λ² = 1 − β²
  expect_band_holds(relu, 16, "residual relu deepscalelm: stream", deepscalelm, {"residual"});
  expect_band_holds(relu, 16, "residual relu deepscalelm: all", deepscalelm, {"preact", "postact", "residual"});
  ScalingConfig depth_mup;
  depth_mup.rule = "depth_mup";  // λ = 1, β = 1/√L
  expect_band_holds(relu, 16, "residual relu depth-muP: stream", depth_mup, {"residual"});
  ModelConfig tanh = relu;
  tanh.mlp().activation = Activation::tanh;
  tanh.mlp().sigma_w2 = 1.5;
  tanh.mlp().sigma_b2 = 0.05;
  expect_band_holds(tanh, 16, "residual tanh deepscalelm: stream", deepscalelm, {"residual"});
}

// Keeps the population variance of every backward probe tensor (the gradient), as probe/moments records it.
class GradientSink final : public ProbeSink {
 public:
  std::map<int, double> grad_var_;
  void forward(int, const Tensor&, std::int64_t) override {}
  void backward(int probe, const Tensor& g, std::int64_t) override {
    grad_var_[probe] = element_moments(g.to_vector()).var;
  }
  void attention_logits(int, const probe::LogitSums&, const Tensor&, int, float) override {
    ADD_FAILURE() << "an MLP has no attention logits";
  }
};

// Labels (7·i + seed) mod C: every seed has the same count per class, which is what the prediction reads.
std::vector<std::int32_t> step_labels(int classes, int seed, std::int64_t rows) {
  std::vector<std::int32_t> labels(static_cast<std::size_t>(rows));
  for (std::int64_t i = 0; i < rows; ++i)
    labels[static_cast<std::size_t>(i)] = static_cast<std::int32_t>((7 * i + seed) % classes);
  return labels;
}

// Each probe's gradient variance averaged over `seeds` networks with a classification head, one forward-backward
// step of the mean cross-entropy on independent N(0, 1) inputs labelled by step_labels.
std::map<std::string, double> seed_average_backward(const ModelConfig& config, const ScalingConfig& scaling,
                                                    std::int64_t rows, int seeds) {
  std::map<std::string, double> average;
  for (int seed = 1; seed <= seeds; ++seed) {
    std::unique_ptr<Model> model = make_model(config, scaling, static_cast<std::uint64_t>(seed));
    const CounterRng rng(static_cast<std::uint64_t>(seed), 7);
    std::vector<float> inputs(static_cast<std::size_t>(rows * config.mlp().input_dim));
    for (std::size_t i = 0; i < inputs.size(); ++i) inputs[i] = rng.normal(i);
    Tensor targets = Tensor::empty({rows}, DType::i32);
    const std::vector<std::int32_t> labels = step_labels(config.mlp().outputs, seed, rows);
    std::copy(labels.begin(), labels.end(), targets.i32());
    Batch batch{Tensor::from_vector({rows, config.mlp().input_dim}, inputs), targets};
    GradientSink sink;
    StepContext context;
    context.sink = &sink;
    model->forward_backward(batch, 1.0f, context);
    for (const ProbeInfo& info : model->probes())
      if (sink.grad_var_.count(info.depth)) average[info.name] += sink.grad_var_[info.depth] / seeds;
  }
  return average;
}

// The gradient's part along the forward signal (docs/theory.md, "The gradient's mean over units"). A residual ReLU
// MLP's stream keeps a mean over units, and through it the gradient's mean over units grows by (λ + β·c)² a layer
// (c = σ_w²·m·E[φ''] ≈ 0.53): here the measured gradient at the first layer is several times the top's, where
// the independent-gradient bookkeeping kept it flat (at width 512, 48 layers the residual deepscalelm row of
// bench/theory_accuracy.py went from 24% / 4853% to 2.4% / 9.3%). Width 256, 32 layers, 32 samples, 10 classes, 48
// networks. Measured: median 2.1%, worst 8.5%, growth 128× (predicted 117×). A plain ReLU MLP has the same drift
// without the feedback: its gradient grows 1.39× to the input, predicted 1.30× (median 5.2%, worst 10.9%; flat, as
// before the term, the input would be 28% off); the rest is the 1/width means of each layer's fresh gradient, which
// the bookkeeping leaves out (docs/theory.md says why).
TEST(MlpMeasured, GradientMeanOverUnitsFollowsTheStreamMean) {
  constexpr std::int64_t kRows = 32;
  constexpr int kSeeds = 48;
  ModelConfig config = relu_he_config(32, 256);
  config.mlp().outputs = 10;
  config.mlp().head = MlpHead::classification;
  const auto check = [&](const ModelConfig& model, const ScalingConfig& scaling, const char* label, double median_limit,
                         double worst_limit, double min_growth) {
    theory::TheoryInputs inputs;
    inputs.input_var = 1.0;
    inputs.input_norm_spread = 2.0 / static_cast<double>(model.mlp().input_dim);
    inputs.sequences = kRows;
    inputs.batch_targets = step_labels(model.mlp().outputs, 1, kRows);
    const theory::ProbePrediction prediction = theory::predict_mlp(mlp_numbers(scaling, model.mlp()), inputs);
    const std::map<std::string, double> measured = seed_average_backward(model, scaling, kRows, kSeeds);
    std::vector<double> errors;
    for (const auto& [name, var] : measured) {
      const theory::ProbeTheory* p = prediction.find(name);
      ASSERT_NE(p, nullptr) << name;
      if (p->kind == "logits") continue;
      errors.push_back(std::abs(var / p->backward_var - 1.0));
    }
    std::sort(errors.begin(), errors.end());
    const double median = errors[errors.size() / 2], worst = errors.back();
    const std::string top = "layers." + std::to_string(model.mlp().layers - 1) + ".postact";
    const double growth = measured.at("layers.0.postact") / measured.at(top);
    const double predicted_growth =
        prediction.find("layers.0.postact")->backward_var / prediction.find(top)->backward_var;
    std::printf("%s: backward median %.3f, worst %.3f over %zu probes; growth to the input %.2f (predicted %.2f)\n",
                label, median, worst, errors.size(), growth, predicted_growth);
    EXPECT_LT(median, median_limit) << label;
    EXPECT_LT(worst, worst_limit) << label;
    EXPECT_GT(growth, min_growth) << label << ": the effect the test is about should show";
  };
  ModelConfig residual = config;
  residual.mlp().residual = true;
  ScalingConfig deepscalelm;
  deepscalelm.rule = "deepscalelm";
  check(residual, deepscalelm, "residual relu deepscalelm", 0.05, 0.15, 3.0);
  check(config, ScalingConfig{}, "plain relu", 0.08, 0.15, 1.2);
}

}  // namespace
}  // namespace proplab
