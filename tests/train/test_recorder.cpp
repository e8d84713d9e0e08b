// Recording: the schedule, the run-file layout, and every recorded statistic against a direct two-pass float64
// computation on the very tensors the model produced (captured by a test sink in a replay of step 0).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>

#include "data/dataset.h"
#include "io/run_reader.h"
#include "models/model.h"
#include "train/recorder.h"
#include "support/temp_dir.h"
#include "train/trainer.h"

namespace proplab {

namespace {

using testing::TempDir;

// Keeps a copy of every tensor a model hands to its sink.
class CaptureSink final : public ProbeSink {
 public:
  struct Capture {
    std::vector<double> values;
    std::int64_t sequences = 0, features = 0;
  };
  std::map<int, Capture> forward_, backward_;

  void forward(int probe, const Tensor& x, std::int64_t sequences) override { keep(forward_[probe], x, sequences); }
  void backward(int probe, const Tensor& d_x, std::int64_t sequences) override {
    keep(backward_[probe], d_x, sequences);
  }
  void attention_logits(int probe, const probe::LogitSums&, const Tensor& qkv, int heads, float scale) override {
    // The causal logits, computed naively in double from the captured qkv.
    Capture& c = forward_[probe];
    const std::int64_t b_count = qkv.dim(0), t_count = qkv.dim(1), d = qkv.dim(2) / 3, dh = d / heads;
    const std::vector<float> v = qkv.to_vector();
    for (std::int64_t b = 0; b < b_count; ++b)
      for (int h = 0; h < heads; ++h)
        for (std::int64_t i = 0; i < t_count; ++i)
          for (std::int64_t j = 0; j <= i; ++j) {
            double dot = 0;
            for (std::int64_t e = 0; e < dh; ++e)
              dot += static_cast<double>(v[(b * t_count + i) * 3 * d + h * dh + e]) *
                     static_cast<double>(v[(b * t_count + j) * 3 * d + d + h * dh + e]);
            c.values.push_back(static_cast<float>(dot) * static_cast<double>(scale));
          }
    c.sequences = 0;  // marks "no token structure"
  }

 private:
  static void keep(Capture& c, const Tensor& x, std::int64_t sequences) {
    std::vector<float> v = x.to_vector();
    c.values.assign(v.begin(), v.end());
    c.sequences = sequences;
    c.features = x.dim(-1);
  }
};

struct Direct {
  double mean, var, max_abs, kurtosis, corr, chan_mean_sq, chan_var;
};

// Two-pass float64 statistics straight from the definitions.
Direct direct_stats(const CaptureSink::Capture& c) {
  const std::vector<double>& x = c.values;
  const double n = static_cast<double>(x.size());
  Direct r{};
  for (double v : x) r.mean += v / n;
  double m2 = 0, m4 = 0;
  for (double v : x) {
    m2 += (v - r.mean) * (v - r.mean) / n;
    m4 += std::pow(v - r.mean, 4) / n;
    r.max_abs = std::max(r.max_abs, std::fabs(v));
  }
  r.var = m2;
  r.kurtosis = m4 / (m2 * m2);
  r.corr = r.chan_mean_sq = r.chan_var = std::nan("");
  if (c.sequences > 0) {
    const std::int64_t f_count = c.features, b_count = c.sequences;
    const std::int64_t t_count = static_cast<std::int64_t>(x.size()) / (f_count * b_count);
    double numerator = 0, total = 0;
    for (std::int64_t b = 0; b < b_count; ++b) {
      std::vector<double> seq(f_count, 0.0);
      for (std::int64_t t = 0; t < t_count; ++t)
        for (std::int64_t f = 0; f < f_count; ++f) {
          const double d = x[(b * t_count + t) * f_count + f] - r.mean;
          seq[f] += d;
          total += d * d;
          numerator -= d * d;
        }
      for (double s : seq) numerator += s * s;
    }
    if (t_count > 1) r.corr = numerator / ((t_count - 1) * total);
    r.chan_mean_sq = r.chan_var = 0;
    for (std::int64_t f = 0; f < f_count; ++f) {
      double m = 0, q = 0;
      const double rows = static_cast<double>(b_count * t_count);
      for (std::int64_t row = 0; row < b_count * t_count; ++row) m += x[row * f_count + f] / rows;
      for (std::int64_t row = 0; row < b_count * t_count; ++row) q += std::pow(x[row * f_count + f] - m, 2) / rows;
      r.chan_mean_sq += m * m / f_count;
      r.chan_var += q / f_count;
    }
  }
  return r;
}

void expect_close(double recorded, double expected, const std::string& what, double tolerance = 1e-9) {
  if (std::isnan(expected)) {
    EXPECT_TRUE(std::isnan(recorded)) << what << ": expected NaN, recorded " << recorded;
    return;
  }
  EXPECT_NEAR(recorded, expected, tolerance * std::max(1.0, std::fabs(expected))) << what;
}

RunSpec recorded_spec(NormPlacement norm) {
  RunSpec spec;
  spec.name = "rec";
  spec.seed = 9;
  spec.model.set_kind(ModelKind::transformer);
  TransformerConfig& m = spec.model.transformer();
  m.layers = 2;
  m.width = 16;
  m.heads = 2;
  m.ffn_mult = 2;
  m.vocab = 16;
  m.seq_len = 8;
  m.norm = norm;
  spec.data.kind = "markov";
  spec.train.steps = 7;
  spec.train.batch = 4;
  spec.train.eval_every = 0;
  spec.record.every = 3;
  spec.config_toml = "name = \"rec\"";
  return spec;
}

}  // namespace

TEST(RecordSchedule, FirstLastEveryAndLogSpaced) {
  RecordConfig config;
  config.every = 10;
  std::vector<std::int64_t> steps;
  for (std::int64_t s = 0; s < 35; ++s)
    if (is_recorded_step(config, s, 35)) steps.push_back(s);
  EXPECT_EQ(steps, (std::vector<std::int64_t>{0, 10, 20, 30, 34}));
  config.every = 100;
  config.log_spaced = true;
  steps.clear();
  for (std::int64_t s = 0; s < 30; ++s)
    if (is_recorded_step(config, s, 30)) steps.push_back(s);
  EXPECT_EQ(steps, (std::vector<std::int64_t>{0, 1, 2, 3, 5, 8, 13, 21, 29}));
}

class RecordedRun : public ::testing::TestWithParam<NormPlacement> {};

TEST_P(RecordedRun, EveryStatisticMatchesADirectComputationAtInitialisation) {
  TempDir dir;
  RunSpec spec = recorded_spec(GetParam());
  RunOptions options;
  options.out_dir = dir.path();
  RunSummary summary = run_training(spec, options);
  ASSERT_EQ(summary.status, RunStatus::completed);
  RunReader reader = RunReader::open(summary.run_file);

  // Layout.
  EXPECT_EQ(reader.read_ints("/steps"), (std::vector<std::int64_t>{0, 3, 6}));
  std::unique_ptr<Model> model = make_model(spec.model, spec.scaling, spec.seed);
  const std::vector<ProbeInfo>& probes = model->probes();
  const std::vector<std::string> names = reader.read_strings("/probes/name");
  ASSERT_EQ(names.size(), probes.size());
  for (std::size_t i = 0; i < probes.size(); ++i) EXPECT_EQ(names[i], probes[i].name);
  EXPECT_EQ(names.front(), "embed.out");
  EXPECT_EQ(names.back(), "head.logits");
  EXPECT_EQ(reader.read_strings("/probes/kind").front(), "embed");
  EXPECT_EQ(reader.read_ints("/probes/depth")[3], 3);
  EXPECT_EQ(reader.dataset_shape("/forward/var"),
            (std::vector<std::int64_t>{3, static_cast<std::int64_t>(probes.size())}));
  EXPECT_EQ(reader.dataset_shape("/backward/corr"),
            (std::vector<std::int64_t>{3, static_cast<std::int64_t>(probes.size())}));
  EXPECT_EQ(reader.dataset_shape("/params/update_ratio"),
            (std::vector<std::int64_t>{3, static_cast<std::int64_t>(model->params().all().size())}));
  EXPECT_TRUE(reader.exists("/theory"));

  // Replay step 0 on a fresh model (same seed, same batch, same dropout keys) and capture every probed tensor.
  auto data =
      make_token_dataset(spec.data, spec.model.transformer().vocab, spec.model.transformer().seq_len, spec.seed);
  Batch batch;
  batch.inputs = Tensor::empty({4, 8}, DType::i32);
  batch.targets = Tensor::empty({4, 8}, DType::i32);
  data->batch(Split::train, 0, batch.inputs, batch.targets);
  CaptureSink sink;
  StepContext context;
  context.seed = spec.seed;
  context.sink = &sink;
  model->params().zero_grads();
  model->forward_backward(batch, 1.0f, context);
  ASSERT_EQ(sink.forward_.size(), probes.size());

  const Dataset2D f_mean = reader.read_2d("/forward/mean"), f_var = reader.read_2d("/forward/var");
  const Dataset2D f_max = reader.read_2d("/forward/max_abs"), f_kurt = reader.read_2d("/forward/kurtosis");
  const Dataset2D f_corr = reader.read_2d("/forward/corr"), f_cms = reader.read_2d("/forward/chan_mean_sq");
  const Dataset2D f_cvar = reader.read_2d("/forward/chan_var"), f_rms = reader.read_2d("/forward/rms");
  const Dataset2D b_var = reader.read_2d("/backward/var"), b_corr = reader.read_2d("/backward/corr");
  const Dataset2D f_nonfinite = reader.read_2d("/forward/nonfinite");
  for (std::size_t p = 0; p < probes.size(); ++p) {
    SCOPED_TRACE(probes[p].name);
    const Direct d = direct_stats(sink.forward_.at(static_cast<int>(p)));
    // Attention logits come from the op's f32 tiles, and are recomputed in double here: 1e-6 apart at most.
    const double tol = probes[p].has_backward ? 1e-9 : 1e-6;
    expect_close(f_mean.at(0, p), d.mean, "forward mean", tol);
    expect_close(f_var.at(0, p), d.var, "forward var", tol);
    expect_close(f_rms.at(0, p), std::sqrt(d.var + d.mean * d.mean), "forward rms", tol);
    expect_close(f_max.at(0, p), d.max_abs, "forward max_abs", tol);
    expect_close(f_kurt.at(0, p), d.kurtosis, "forward kurtosis", tol);
    expect_close(f_corr.at(0, p), d.corr, "forward corr");
    expect_close(f_cms.at(0, p), d.chan_mean_sq, "forward chan_mean_sq");
    expect_close(f_cvar.at(0, p), d.chan_var, "forward chan_var");
    EXPECT_EQ(f_nonfinite.at(0, p), 0.0);
    if (probes[p].has_backward) {
      ASSERT_TRUE(sink.backward_.count(static_cast<int>(p)));
      const Direct g = direct_stats(sink.backward_.at(static_cast<int>(p)));
      expect_close(b_var.at(0, p), g.var, "backward var");
      expect_close(b_corr.at(0, p), g.corr, "backward corr");
    } else {
      EXPECT_TRUE(std::isnan(b_var.at(0, p))) << "no backward statistics where the gradient is internal";
    }
  }

  // Parameter statistics at step 0: weight and gradient RMS of the initial parameters.
  const Dataset2D w_rms = reader.read_2d("/params/weight_rms"), ratio = reader.read_2d("/params/update_ratio");
  for (std::size_t i = 0; i < model->params().all().size(); ++i) {
    const std::vector<float> w = model->params().all()[i]->value.to_vector();
    double s2 = 0;
    for (float v : w) s2 += static_cast<double>(v) * v;
    expect_close(w_rms.at(0, i), std::sqrt(s2 / w.size()), "weight_rms " + model->params().all()[i]->name);
    EXPECT_GT(ratio.at(0, i), 0.0) << model->params().all()[i]->name;
  }
}

INSTANTIATE_TEST_SUITE_P(Placements, RecordedRun,
                         ::testing::Values(NormPlacement::pre, NormPlacement::post, NormPlacement::both,
                                           NormPlacement::none),
                         [](const auto& info) { return std::string(norm_placement_name(info.param)); });

TEST(RecordedRun, TheoryPredictionsBesideTheMeasurement) {
  TempDir dir;
  RunSpec spec = recorded_spec(NormPlacement::pre);
  spec.model.transformer().width = 64;
  spec.model.transformer().heads = 4;
  RunOptions options;
  options.out_dir = dir.path();
  RunSummary summary = run_training(spec, options);
  RunReader reader = RunReader::open(summary.run_file);
  const std::vector<std::string> names = reader.read_strings("/probes/name");
  for (const char* path : {"/theory/forward/var", "/theory/forward/mean", "/theory/forward/corr",
                           "/theory/backward/var", "/theory/backward/corr"})
    EXPECT_EQ(reader.dataset_shape(path), (std::vector<std::int64_t>{static_cast<std::int64_t>(names.size())})) << path;
  EXPECT_FALSE(reader.attribute_string("/theory", "formulae").empty());
  EXPECT_NE(reader.attribute_string("/theory", "no_prediction").find("blocks.0.attn.logits"), std::string::npos);
  const std::vector<double> predicted = reader.read_doubles("/theory/forward/var");
  const std::vector<double> predicted_corr = reader.read_doubles("/theory/forward/corr");
  const std::vector<double> predicted_grad = reader.read_doubles("/theory/backward/var");
  const std::vector<double> predicted_grad_corr = reader.read_doubles("/theory/backward/corr");
  const Dataset2D measured = reader.read_2d("/forward/var"), measured_corr = reader.read_2d("/forward/corr");
  for (std::size_t p = 0; p < names.size(); ++p) {
    if (names[p] == "embed.out") {
      // The input correlation the formulae start from is measured on the same batch as the step-0 record.
      EXPECT_NEAR(predicted_corr[p], measured_corr.at(0, p), 1e-9) << names[p];
      EXPECT_NEAR(predicted[p], measured.at(0, p), 0.1 * measured.at(0, p)) << names[p];
    }
    if (names[p] == "blocks.0.attn.logits") {
      EXPECT_TRUE(std::isnan(predicted_grad[p]));
      EXPECT_TRUE(std::isnan(predicted_grad_corr[p]));
    }
    if (names[p] == "blocks.1.out") {
      EXPECT_GT(predicted[p], 0.0);
      // The gradient's token correlation: a correlation, predicted for every stream probe of a transformer.
      EXPECT_TRUE(std::isfinite(predicted_grad_corr[p]));
      EXPECT_LE(std::abs(predicted_grad_corr[p]), 1.0);
    }
  }
}

TEST(RecordedRun, SelectedStatisticsOnlyAndUnknownNamesRefused) {
  TempDir dir;
  RunSpec spec = recorded_spec(NormPlacement::pre);
  spec.record.forward = {"var", "corr"};
  spec.record.backward = {"rms"};
  spec.record.params = {"grad_rms"};
  RunOptions options;
  options.out_dir = dir.path();
  // Statistics that are not recorded are NaN by design and must not read as a divergence.
  EXPECT_EQ(run_training(spec, options).status, RunStatus::completed);
  RunReader reader = RunReader::open(run_file_path(dir.path(), "rec"));
  EXPECT_EQ(reader.status(), RunStatus::completed);
  EXPECT_EQ(reader.list("/forward"), (std::vector<std::string>{"corr", "var"}));
  EXPECT_EQ(reader.list("/backward"), (std::vector<std::string>{"rms"}));
  EXPECT_TRUE(reader.exists("/params/grad_rms"));
  EXPECT_FALSE(reader.exists("/params/weight_rms"));
  spec.record.forward = {"variance"};
  TempDir other;
  options.out_dir = other.path();
  EXPECT_THROW(run_training(spec, options), UserError);
  EXPECT_FALSE(std::filesystem::exists(run_file_path(other.path(), "rec")));
}

TEST(RecordedRun, DivergenceRecordsTheStepAndNamesTheFirstNonFiniteProbe) {
  TempDir dir;
  RunSpec spec = recorded_spec(NormPlacement::none);
  spec.scaling.rule = "custom";
  spec.scaling.params = {{"embed_std", 10}, {"hidden_std", 10}, {"out_proj_std", 10}, {"readout_std", 10}};
  spec.train.optimizer = OptimizerKind::sgd;
  spec.train.lr = 50;
  spec.train.grad_clip = 0;
  spec.train.steps = 200;
  spec.record.every = 1000;
  RunOptions options;
  options.out_dir = dir.path();
  RunSummary summary = run_training(spec, options);
  ASSERT_EQ(summary.status, RunStatus::diverged);
  RunReader reader = RunReader::open(summary.run_file);
  const std::vector<std::int64_t> steps = reader.read_ints("/steps");
  const std::int64_t last = summary.steps_done - 1;
  EXPECT_EQ(steps.back(), last) << "the step that went non-finite is recorded";
  EXPECT_NE(reader.attribute_string("status_detail").find("step " + std::to_string(last)), std::string::npos)
      << reader.attribute_string("status_detail");
  EXPECT_NE(reader.attribute_string("status_detail").find("first"), std::string::npos)
      << reader.attribute_string("status_detail");
  EXPECT_EQ(reader.attribute_string("status"), "diverged");
}

}  // namespace proplab
