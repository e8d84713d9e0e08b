// ResNet tests: finite-difference gradients of a small ResNet per rule and block form, BatchNorm's train/eval
// switch, identity at init (SkipInit, Fixup), the NF-ResNet variance bookkeeping measured at init, thread-count
// independence and the config checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <tuple>

#include "core/parallel.h"
#include "core/rng.h"
#include "models/resnet.h"
#include "scaling/resnet_util.h"
#include "support/gradcheck.h"
#include "support/model_testing.h"

namespace proplab {
namespace {

using testing::check_all_parameters;

// An image batch [n, channels, size, size] of N(0, 1) pixels with labels i mod classes.
Batch image_batch(int n, int channels, int size, int classes, std::uint64_t seed) {
  Batch b;
  b.inputs = testing::random_tensor({n, channels, size, size}, seed);
  b.targets = Tensor::empty({n}, DType::i32);
  for (int i = 0; i < n; ++i) b.targets.i32()[i] = i % classes;
  return b;
}

// Keeps a copy of every probed activation (channels-last, as the sink receives it).
class CapturingSink final : public ProbeSink {
 public:
  void forward(int probe, const Tensor& x, std::int64_t) override { forward_[probe] = x.clone(); }
  void backward(int probe, const Tensor& d_x, std::int64_t) override { backward_[probe] = d_x.clone(); }
  void attention_logits(int, const probe::LogitSums&, const Tensor&, int, float) override {}
  const Tensor& forward_of(int probe) const { return forward_.at(probe); }
  bool has_backward(int probe) const { return backward_.count(probe) > 0; }
  static double variance(const Tensor& x) { return testing::population_var(x.to_vector()); }

 private:
  std::map<int, Tensor> forward_, backward_;
};

ResnetConfig small_config(bool preact, ResnetNorm norm, ResnetBlock block) {
  ResnetConfig config;
  config.block = block;
  config.depth = block == ResnetBlock::basic ? 8 : 11;  // one block per stage
  config.width = 1;
  config.norm = norm;
  config.preact = preact;
  config.in_channels = 2;
  config.image_size = 6;
  config.classes = 3;
  return config;
}

// Parameters a rule initialises to zero (Fixup's last convs and classifier, SkipInit's multipliers) are moved
// away from zero so every gradient is checked at a point where it is not trivially 0.
void perturb_zero_parameters(Model& model) {
  for (auto& p : model.params().all()) {
    const std::vector<float> v = p->value.to_vector();
    if (std::any_of(v.begin(), v.end(), [](float e) { return e != 0.0f; })) continue;
    const CounterRng rng(99, stream_id(p->name));
    for (std::int64_t i = 0; i < p->value.numel(); ++i)
      p->value.f32()[i] =
          p->value.numel() == 1 ? 0.5f + 0.3f * rng.normal(0) : 0.05f * rng.normal(static_cast<std::uint64_t>(i));
  }
}

using GradientCase = std::tuple<std::string, bool, ResnetNorm, ResnetBlock>;
class ResnetGradient : public ::testing::TestWithParam<GradientCase> {};

TEST_P(ResnetGradient, MatchesFiniteDifferences) {
  const auto [rule, preact, norm, block] = GetParam();
  ScalingConfig scaling;
  scaling.rule = rule;
  // A smooth activation: with ReLU, perturbing one weight moves hundreds of units across the kink (each too small
  // for the checker to flag, together well above its tolerance). ReLU's backward is checked op by op.
  ResnetConfig config = small_config(preact, norm, block);
  config.activation = Activation::gelu_erf;
  Resnet model(config, scaling, 11);
  perturb_zero_parameters(model);
  const Batch batch = image_batch(3, 2, 6, 3, 5);
  StepContext training;
  model.params().zero_grads();
  model.forward_backward(batch, 1.0f, training);
  testing::GradCheckOptions options;
  options.step = 1e-2;
  options.rtol = 3e-2;
  options.atol = 2e-4;
  options.max_elements = 30;
  // The training loss (batch statistics), without a backward pass.
  check_all_parameters(
      model, [&] { return model.forward_backward(batch, 0.0f, training); }, options);
}

INSTANTIATE_TEST_SUITE_P(RulesAndForms, ResnetGradient,
                         ::testing::Values(GradientCase{"standard", false, ResnetNorm::batchnorm, ResnetBlock::basic},
                                           GradientCase{"standard", true, ResnetNorm::batchnorm, ResnetBlock::basic},
                                           GradientCase{"standard", true, ResnetNorm::batchnorm,
                                                        ResnetBlock::bottleneck},
                                           GradientCase{"standard", false, ResnetNorm::none, ResnetBlock::bottleneck},
                                           GradientCase{"skipinit", true, ResnetNorm::none, ResnetBlock::basic},
                                           GradientCase{"fixup", false, ResnetNorm::none, ResnetBlock::basic},
                                           GradientCase{"nf", true, ResnetNorm::none, ResnetBlock::basic},
                                           GradientCase{"nf", true, ResnetNorm::none, ResnetBlock::bottleneck},
                                           GradientCase{"odestep", false, ResnetNorm::batchnorm, ResnetBlock::basic}),
                         [](const auto& info) {
                           return std::get<0>(info.param) + (std::get<1>(info.param) ? "_pre" : "_post") +
                                  (std::get<2>(info.param) == ResnetNorm::none ? "_nonorm" : "_bn") +
                                  (std::get<3>(info.param) == ResnetBlock::basic ? "_basic" : "_bottleneck");
                         });

TEST(Resnet, BatchNormEvalUsesRunningStatistics) {
  Resnet model(small_config(false, ResnetNorm::batchnorm, ResnetBlock::basic), ScalingConfig{}, 3);
  const Batch batch = image_batch(4, 2, 6, 3, 8);
  std::vector<Tensor*> running = model.running_statistics();
  ASSERT_FALSE(running.empty());
  // Named for checkpoints: one mean and one variance per BatchNorm, names unique.
  const auto buffers = model.buffers();
  ASSERT_EQ(buffers.size(), running.size());
  EXPECT_EQ(buffers[0].first, "stem.norm.running_mean");
  EXPECT_EQ(buffers[1].first, "stem.norm.running_var");
  std::set<std::string> names;
  for (const auto& [name, tensor] : buffers) names.insert(name);
  EXPECT_EQ(names.size(), buffers.size());
  std::vector<std::vector<float>> before;
  for (Tensor* t : running) before.push_back(t->to_vector());
  // Eval leaves the running statistics alone and repeats exactly.
  const double eval_a = model.evaluate(batch), eval_b = model.evaluate(batch);
  EXPECT_EQ(eval_a, eval_b);
  for (std::size_t i = 0; i < running.size(); ++i) EXPECT_EQ(running[i]->to_vector(), before[i]);
  // A training pass uses batch statistics (another loss) and moves the running statistics.
  StepContext training;
  const double train_loss = model.forward_backward(batch, 0.0f, training);
  EXPECT_NE(train_loss, eval_a);
  EXPECT_NE(running[0]->to_vector(), before[0]);
  // Eval now sees the moved statistics.
  EXPECT_NE(model.evaluate(batch), eval_a);
  // Many training passes on one batch converge the running mean to the batch mean (the running variance to
  // the unbiased batch variance, hence not exactly the training loss).
  for (int i = 0; i < 200; ++i) model.forward_backward(batch, 0.0f, training);
  const double converged = model.evaluate(batch), trained = model.forward_backward(batch, 0.0f, training);
  EXPECT_LT(std::fabs(converged - trained), 0.5 * std::fabs(eval_a - trained));
}

// Identity at init: every block without a projection shortcut hands on its input unchanged.
void expect_identity_blocks(const std::string& rule, bool preact) {
  ResnetConfig config = small_config(preact, ResnetNorm::none, ResnetBlock::basic);
  config.depth = 14;  // two blocks per stage
  ScalingConfig scaling;
  scaling.rule = rule;
  Resnet model(config, scaling, 4);
  CapturingSink sink;
  StepContext context;
  context.sink = &sink;
  model.forward_backward(image_batch(2, 2, 6, 3, 9), 1.0f, context);
  int checked = 0;
  for (int b = 0; b < model.blocks(); ++b) {
    const resnet_util::Layout layout = resnet_util::layout(config);
    if (layout.projection(b)) continue;
    EXPECT_EQ(sink.forward_of(model.probe_block_in(b)).to_vector(),
              sink.forward_of(model.probe_block_out(b)).to_vector())
        << rule << ": block " << b << " is not the identity at init";
    ++checked;
  }
  EXPECT_EQ(checked, 4);  // blocks 0, 1, 3, 5 (2 and 4 are transitions)
}

TEST(Resnet, SkipInitStartsAsTheIdentity) {
  expect_identity_blocks("skipinit", true);
  expect_identity_blocks("skipinit", false);
}

TEST(Resnet, FixupZeroInitialisesBranchEndsAndClassifierAndStartsAsTheIdentity) {
  ResnetConfig config = small_config(false, ResnetNorm::none, ResnetBlock::basic);
  config.depth = 14;
  ScalingConfig scaling;
  scaling.rule = "fixup";
  Resnet model(config, scaling, 4);
  int zero_ends = 0, inner = 0, scalar_biases = 0;
  const double branch_scale = std::pow(6.0, -0.5);  // L = 6 branches of m = 2 convs: L^(−1/(2m−2))
  for (auto& p : model.params().all()) {
    const std::vector<float> v = p->value.to_vector();
    const bool all_zero = std::all_of(v.begin(), v.end(), [](float e) { return e == 0.0f; });
    if (p->info.role == ParamRole::conv_branch_out || p->info.role == ParamRole::readout) {
      EXPECT_TRUE(all_zero) << p->name;
      zero_ends += p->info.role == ParamRole::conv_branch_out;
    } else if (p->info.role == ParamRole::conv_branch) {
      double sq = 0;
      for (float e : v) sq += e * e;
      const double expected = branch_scale * branch_scale * 2.0 / static_cast<double>(p->info.fan_in);
      EXPECT_NEAR(sq / v.size(), expected, 0.15 * expected) << p->name;
      ++inner;
    } else if (p->info.role == ParamRole::bias && v.size() == 1) {
      EXPECT_TRUE(all_zero) << p->name;
      ++scalar_biases;
    } else if (p->info.role == ParamRole::residual_scale) {
      EXPECT_EQ(v, std::vector<float>{1.0f}) << p->name;
    }
  }
  EXPECT_EQ(zero_ends, 6);
  EXPECT_EQ(inner, 6);
  EXPECT_EQ(scalar_biases, 1 + 6 * 2 * 2);  // stem + (before, after) each of 2 convs in 6 blocks
  expect_identity_blocks("fixup", false);
}

TEST(Resnet, NfBookkeepingFiftyBlockStageAndTransitionReset) {
  // The rule's bookkeeping with α = 0.2 and unit-variance branches: the stream variance grows by α² per block
  // over a 50-block stage, 1 + 50·0.04 = 3.0 at its end, and the next transition resets it to 1 + α² = 1.04.
  ResnetConfig config;
  config.depth = 6 * 50 + 2;
  config.width = 1;
  config.norm = ResnetNorm::none;
  config.preact = true;
  config.in_channels = 3;
  config.image_size = 16;
  const double alpha = 0.2;
  const std::vector<double> predicted = resnet_util::nf_expected_variances(resnet_util::layout(config), alpha);
  EXPECT_NEAR(predicted[50], 3.0, 1e-12);
  EXPECT_NEAR(predicted[51], 1.04, 1e-12);
  EXPECT_NEAR(predicted[100], 1.0 + 50 * 0.04, 1e-12);

  // Measured at init. Real 3x3 branches have variance below 1 (zero padding at the borders; ReLU-induced positive
  // correlations between a conv's inputs, which zero-mean standardised rows turn into a variance loss: 0.9 in the
  // first blocks, 0.7 by the end of the stage at 16x16), so the measured stream follows the bookkeeping with the
  // measured branch variances: Var(out_b) = Var(shortcut_b) + α²·Var(f_b), shortcut_b = x_b, or at a transition
  // the 1x1 projection of γ·φ(x_b/β_b), of variance Var(x_b)/β_b² (the reset).
  ScalingConfig scaling;
  scaling.rule = "nf";
  scaling.params = {{"alpha", alpha}};
  Resnet model(config, scaling, 21);
  CapturingSink sink;
  StepContext context;
  context.sink = &sink;
  model.forward_backward(image_batch(4, 3, 16, 10, 22), 0.0f, context);
  const Tensor& stem = sink.forward_of(0);
  double accumulated = CapturingSink::variance(stem);
  double min_branch = 1e9, max_branch = 0;
  for (int b = 0; b < 100; ++b) {
    SCOPED_TRACE("block " + std::to_string(b));
    const Tensor& in = sink.forward_of(model.probe_block_in(b));
    const Tensor& branch = sink.forward_of(model.probe_block_branch(b));
    const Tensor& out = sink.forward_of(model.probe_block_out(b));
    const double var_in = CapturingSink::variance(in), var_branch = CapturingSink::variance(branch);
    const double var_out = CapturingSink::variance(out);
    min_branch = std::min(min_branch, var_branch);
    max_branch = std::max(max_branch, var_branch);
    double var_shortcut = var_in;
    if (model.transition(b)) {
      Tensor shortcut = out.clone();
      for (std::int64_t i = 0; i < shortcut.numel(); ++i) shortcut.f32()[i] -= alpha * branch.f32()[i];
      var_shortcut = CapturingSink::variance(shortcut);
      // (10%: the stream is no longer exactly Gaussian, so Var γ·φ(x/β) is not exactly Var(x)/β².)
      EXPECT_NEAR(var_shortcut, var_in / predicted[b], 0.1 * var_in / predicted[b]) << "transition reset";
      accumulated = var_shortcut;
    }
    EXPECT_NEAR(var_out, var_shortcut + alpha * alpha * var_branch, 0.05 * var_out);
    accumulated += alpha * alpha * var_branch;
    if (b == 49) {
      // (10%: the 50 small stream-branch covariances, zero only on average, add up too.)
      EXPECT_NEAR(var_out, accumulated, 0.1 * accumulated) << "end of stage 0";
    }
  }
  // 1/β keeps every branch's input at unit variance: the branch variance stays put while the stream triples.
  EXPECT_GT(min_branch, 0.5);
  EXPECT_LT(max_branch, 1.1);
  const double end_of_stage = CapturingSink::variance(sink.forward_of(model.probe_block_out(49)));
  const double after_transition = CapturingSink::variance(sink.forward_of(model.probe_block_out(50)));
  EXPECT_GT(end_of_stage, 2.0);
  EXPECT_LT(after_transition, 1.1);
  std::printf(
      "NF bookkeeping at init (16x16): end of the 50-block stage %.4f (3.0 with unit branches), after the "
      "transition %.4f (1.04); branch variances in [%.3f, %.3f]\n",
      end_of_stage, after_transition, min_branch, max_branch);
}

// Keeps only the variance of every probed activation (deep models' probes would not fit in memory as copies).
class VarianceSink final : public ProbeSink {
 public:
  void forward(int probe, const Tensor& x, std::int64_t) override { variance_[probe] = CapturingSink::variance(x); }
  void backward(int, const Tensor&, std::int64_t) override {}
  void attention_logits(int, const probe::LogitSums&, const Tensor&, int, float) override {}
  double of(int probe) const { return variance_.at(probe); }

 private:
  std::map<int, double> variance_;
};

TEST(Resnet, NfBookkeepingMeasuredOnTheNfResnetArchitecture) {
  // The numbers measured at init, on the architecture the NF-ResNet paper measures: bottleneck blocks
  // (1x1, 3x3, 1x1) on 64x64 maps, where zero padding touches 6% of the 3x3 conv's outputs. The bookkeeping is an
  // expectation over initialisations, and one narrow network's branches scatter about unit variance (the mean
  // branch variance over a stage ranges 0.89-1.01 between seeds), so the measurement is the mean over four
  // networks, each on its own batch of N(0, 1) images: the stage ends at 1 + 50·α² = 3.0 and the transition block
  // resets the stream to 1 + α² = 1.04, both within 5%.
  ResnetConfig config;
  config.block = ResnetBlock::bottleneck;
  config.depth = 9 * 50 + 2;
  config.width = 1;
  config.norm = ResnetNorm::none;
  config.preact = true;
  config.in_channels = 3;
  config.image_size = 64;
  ScalingConfig scaling;
  scaling.rule = "nf";
  scaling.params = {{"alpha", 0.2}};
  const int networks = 4;
  double end_of_stage = 0, after_transition = 0;
  for (int seed = 1; seed <= networks; ++seed) {
    Resnet model(config, scaling, static_cast<std::uint64_t>(seed));
    ASSERT_FALSE(model.transition(49));
    ASSERT_TRUE(model.transition(50));
    VarianceSink sink;
    StepContext context;
    context.sink = &sink;
    model.forward_backward(image_batch(2, 3, 64, 10, 100 + static_cast<std::uint64_t>(seed)), 0.0f, context);
    const double end = sink.of(model.probe_block_out(49)), reset = sink.of(model.probe_block_out(50));
    std::printf("NF-ResNet seed %d: stream variance %.4f at the end of stage 1, %.4f after the transition\n", seed, end,
                reset);
    end_of_stage += end / networks;
    after_transition += reset / networks;
  }
  std::printf("mean of %d networks: %.4f (3.0), %.4f (1.04)\n", networks, end_of_stage, after_transition);
  EXPECT_NEAR(end_of_stage, 3.0, 0.05 * 3.0);
  EXPECT_NEAR(after_transition, 1.04, 0.05 * 1.04);
}

TEST(Resnet, ProbesPresentChannelsAsFeatures) {
  Resnet model(small_config(true, ResnetNorm::batchnorm, ResnetBlock::basic), ScalingConfig{}, 2);
  CapturingSink sink;
  StepContext context;
  context.sink = &sink;
  model.forward_backward(image_batch(2, 2, 6, 3, 1), 1.0f, context);
  // Stage 0 block out: [N, H·W, C] = [2, 36, 16]; stage 2: [2, 4, 64].
  EXPECT_EQ(sink.forward_of(model.probe_block_out(0)).shape(), (Shape{2, 36, 16}));
  EXPECT_EQ(sink.forward_of(model.probe_block_out(2)).shape(), (Shape{2, 4, 64}));
  for (const ProbeInfo& probe : model.probes()) EXPECT_TRUE(sink.has_backward(probe.depth)) << probe.name;
  EXPECT_TRUE(model.transition(1));
  EXPECT_FALSE(model.transition(0));
}

TEST(Resnet, GradientsIndependentOfThreadCount) {
  ResnetConfig config = small_config(false, ResnetNorm::batchnorm, ResnetBlock::basic);
  config.image_size = 16;
  std::vector<std::vector<float>> grads[2];
  for (int run = 0; run < 2; ++run) {
    const int saved = threads();
    set_threads(run == 0 ? 1 : 2);
    Resnet model(config, ScalingConfig{}, 6);
    model.params().zero_grads();
    model.forward_backward(image_batch(8, 2, 16, 3, 7), 1.0f, StepContext{});
    for (auto& p : model.params().all()) grads[run].push_back(p->grad.to_vector());
    set_threads(saved);
  }
  EXPECT_EQ(grads[0], grads[1]);
}

// A post-activation BatchNorm block ends in one fused op on unrecorded steps (ops::batchnorm_residual_relu_forward)
// and in the separate ops on recorded ones (the branch is probed): the two give bitwise the same loss, gradients
// and running statistics, over two steps, with and without projection shortcuts (every stage opens with one).
TEST(Resnet, FusedBlockEndIsBitwiseTheRecordedSteps) {
  class IgnoringSink final : public ProbeSink {
   public:
    void forward(int, const Tensor&, std::int64_t) override {}
    void backward(int, const Tensor&, std::int64_t) override {}
    void attention_logits(int, const probe::LogitSums&, const Tensor&, int, float) override {}
  };
  ResnetConfig config = small_config(false, ResnetNorm::batchnorm, ResnetBlock::basic);
  config.depth = 14;  // two blocks per stage
  config.image_size = 8;
  IgnoringSink ignoring;
  std::vector<std::vector<float>> state[2];
  double losses[2][2];
  for (int run = 0; run < 2; ++run) {
    Resnet model(config, ScalingConfig{}, 6);
    for (int step = 0; step < 2; ++step) {
      model.params().zero_grads();
      StepContext context;
      context.sink = run == 0 ? nullptr : &ignoring;
      losses[run][step] = model.forward_backward(image_batch(6, 2, 8, 3, 11 + step), 1.0f, context);
      for (auto& p : model.params().all()) p->value.f32()[0] -= 0.01f * p->grad.f32()[0];
    }
    for (auto& p : model.params().all()) state[run].push_back(p->grad.to_vector());
    for (auto& p : model.params().all()) state[run].push_back(p->value.to_vector());
    state[run].push_back({static_cast<float>(model.evaluate(image_batch(6, 2, 8, 3, 20)))});
  }
  EXPECT_EQ(losses[0][0], losses[1][0]);
  EXPECT_EQ(losses[0][1], losses[1][1]);
  EXPECT_EQ(state[0], state[1]);
}

TEST(Resnet, ConfigAndRuleChecks) {
  ResnetConfig config = small_config(false, ResnetNorm::batchnorm, ResnetBlock::basic);
  config.depth = 21;
  EXPECT_THROW(Resnet(config, ScalingConfig{}, 1), UserError);
  config.depth = 8;
  ScalingConfig nf;
  nf.rule = "nf";
  EXPECT_THROW(Resnet(config, nf, 1), UserError);  // nf needs norm = none and preact
  ScalingConfig fixup;
  fixup.rule = "fixup";
  EXPECT_THROW(Resnet(config, fixup, 1), UserError);  // fixup needs norm = none
  ModelConfig transformer;
  transformer.set_kind(ModelKind::transformer);
  EXPECT_THROW(make_rule(fixup, transformer), UserError);
  EXPECT_THROW(make_rule(nf, transformer), UserError);
  EXPECT_NEAR(resnet_util::activation_gain(Activation::relu), std::sqrt(2.0 / (1.0 - 1.0 / M_PI)), 1e-6);
}

}  // namespace
}  // namespace proplab
