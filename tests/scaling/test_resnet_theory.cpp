// The ResNet rules' theory (scaling/resnet_theory.h): the bookkeeping's exact structure per rule (linear growth
// and resets with BatchNorm, doubling without, α² steps for NF, identity for SkipInit / Fixup, 1/N² steps for the
// ODE step) and its agreement with the variances measured on initialised models.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <numbers>

#include "models/resnet.h"
#include "scaling/resnet_theory.h"
#include "scaling/resnet_util.h"
#include "support/gradcheck.h"

namespace proplab {
namespace {

// The population mean and variance over all elements of a tensor.
StreamMoments population(const Tensor& x) {
  const std::vector<float> v = x.to_vector();
  double mean = 0, sq = 0;
  for (float e : v) mean += e;
  mean /= static_cast<double>(v.size());
  for (float e : v) sq += (e - mean) * (e - mean);
  return {mean, sq / static_cast<double>(v.size())};
}

class VarianceSink final : public ProbeSink {
 public:
  void forward(int probe, const Tensor& x, std::int64_t) override { moments[probe] = population(x); }
  void backward(int probe, const Tensor& g, std::int64_t) override { grad_var[probe] = population(g).var; }
  void attention_logits(int, const probe::LogitSums&, const Tensor&, int, float) override {}
  std::map<int, StreamMoments> moments;
  std::map<int, double> grad_var;
};

ResnetConfig config_of(int depth, bool preact, ResnetNorm norm) {
  ResnetConfig config;
  config.depth = depth;
  config.preact = preact;
  config.norm = norm;
  config.in_channels = 3;
  config.image_size = 32;
  return config;
}

ResnetBookkeeping bookkeeping(const ResnetConfig& config, const std::string& rule_name,
                              std::map<std::string, double> params = {}, bool borders = false) {
  ScalingConfig scaling;
  scaling.rule = rule_name;
  scaling.params = std::move(params);
  const ModelConfig shape(config);
  ResnetTheoryOptions interior;
  interior.borders = false;  // the structure of each rule: the wide interior, where the steps are exact
  return resnet_bookkeeping(config, *make_rule(scaling, shape), 1.0, borders ? ResnetTheoryOptions{} : interior);
}

TEST(ResnetTheory, StructureOfEachRule) {
  // BatchNorm pre-activation, He init: unit branches; +1 per block, a transition resets to 1 + 1.
  const ResnetBookkeeping bn = bookkeeping(config_of(20, true, ResnetNorm::batchnorm), "standard");
  EXPECT_NEAR(bn.stem.var, 2.0, 1e-9);  // He's factor 2 on a linear (un-rectified) input
  for (int b = 0; b < 9; ++b) {
    EXPECT_NEAR(bn.branch[b].var, 1.0, 1e-4) << b;
    const double expected = b < 3 ? 3.0 + b : 2.0 + b % 3;
    EXPECT_NEAR(bn.stream_out[b].var, expected, 1e-4) << b;
  }
  // No normalisation, He init: each block doubles the stream (the branch reproduces its input's variance).
  const ResnetBookkeeping plain = bookkeeping(config_of(20, true, ResnetNorm::none), "standard");
  for (int b = 0; b < 9; ++b)
    EXPECT_NEAR(plain.stream_out[b].var, 2.0 * plain.stream_in[b].var, 1e-4 * plain.stream_in[b].var);
  // NF: exactly the rule's bookkeeping, with unit branches.
  const ResnetConfig nf_config = config_of(20, true, ResnetNorm::none);
  const ResnetBookkeeping nf = bookkeeping(nf_config, "nf", {{"alpha", 0.2}});
  const std::vector<double> expected = resnet_util::nf_expected_variances(resnet_util::layout(nf_config), 0.2);
  for (int b = 0; b < 9; ++b) {
    EXPECT_NEAR(nf.branch[b].var, 1.0, 1e-4);
    EXPECT_NEAR(nf.stream_out[b].var, expected[b + 1], 1e-4);
  }
  // SkipInit: every non-projection block is the identity.
  const ResnetBookkeeping skip = bookkeeping(config_of(20, true, ResnetNorm::none), "skipinit");
  EXPECT_NEAR(skip.stream_out[1].var, skip.stream_in[1].var, 1e-12);
  EXPECT_EQ(skip.branch[4].var * 0.0, 0.0);
  // ODE step with BatchNorm: unit branches weighted 1/N.
  const ResnetBookkeeping ode = bookkeeping(config_of(20, true, ResnetNorm::batchnorm), "odestep");
  EXPECT_NEAR(ode.stream_out[1].var - ode.stream_in[1].var, 1.0 / 81.0, 1e-9);
  // Fixup: zero last convs, the stream passes unchanged through identity blocks.
  const ResnetBookkeeping fixup = bookkeeping(config_of(20, false, ResnetNorm::none), "fixup");
  EXPECT_EQ(fixup.branch[1].var, 0.0);
  EXPECT_NEAR(fixup.stream_out[1].var, fixup.stream_in[1].var, 1e-9);
}

// A ReLU after a plain conv of small fan-in (docs/theory.md, "A ReLU after a conv of small fan-in"): the conv's
// output is a Gaussian scale mixture, N(0, E[w²]·|patch|²) given the patch, and the ReLU's variance over the
// Gaussian closure's is (½ − E[√s]²/(2π))/(½ − 1/(2π)), s = |patch|²/E|patch|² a product of Gamma factors: the
// stem's 27 i.i.d. pixels (relative variance 2/27), then per 1×1 conv from C ReLU channels a fresh 5/C (E[a⁴] =
// 6·E[a²]² given the scale the channels share). Bottleneck Fixup at initialisation (zero branches, so each block's
// output is the ReLU of its shortcut), in the interior: the stem, the 16 → 64 projection and the 64 → 128 one.
// Measured (bench/resnet_scale_mixture.py, 2000 networks): 1.006 / 1.044 / 1.048 (± 0.003); these: 1.0086,
// 1.0429, 1.0511. The Gaussian closure of the same sums (one Gamma of the product's variance) would give 1.0452 and
// 1.0564 for the projections.
TEST(ResnetTheory, ReluAfterASmallFanInConvSeesAScaleMixture) {
  ResnetConfig config = config_of(29, false, ResnetNorm::none);
  config.block = ResnetBlock::bottleneck;
  ScalingConfig scaling;
  scaling.rule = "fixup";
  const auto rule = make_rule(scaling, ModelConfig(config));
  ResnetTheoryOptions mixed, closed;
  mixed.borders = closed.borders = false;
  closed.scale_mixture = false;
  const ResnetBookkeeping with = resnet_bookkeeping(config, *rule, 1.0, mixed);
  const ResnetBookkeeping without = resnet_bookkeeping(config, *rule, 1.0, closed);
  auto root = [](double cv2) {  // E[√s], s ~ Gamma of mean 1 and relative variance cv2
    const double k = 1.0 / cv2;
    return std::exp(std::lgamma(k + 0.5) - std::lgamma(k)) / std::sqrt(k);
  };
  auto factor = [](double r) {
    const double closure = 0.5 - 1.0 / (2.0 * std::numbers::pi);
    return (0.5 - r * r / (2.0 * std::numbers::pi)) / closure;
  };
  const resnet_util::Layout layout = resnet_util::layout(config);
  int second_stage = -1;
  for (int b = 0; b < layout.blocks() && second_stage < 0; ++b)
    if (layout.stage(b) == 1) second_stage = b;
  ASSERT_GT(second_stage, 0);
  EXPECT_NEAR(with.stem.var / without.stem.var, factor(root(2.0 / 27.0)), 1e-9);
  EXPECT_NEAR(with.stream_out[0].var / without.stream_out[0].var, factor(root(2.0 / 27.0) * root(5.0 / 16.0)), 1e-9);
  EXPECT_NEAR(with.stream_out[second_stage].var / without.stream_out[second_stage].var,
              factor(root(2.0 / 27.0) * root(5.0 / 16.0) * root(5.0 / 64.0)), 1e-9);
  // Its second moment (what the next conv reads) is the closure's: only the mean moves.
  for (int b = 0; b < layout.blocks(); ++b) {
    const double second = with.stream_out[b].var + with.stream_out[b].mean * with.stream_out[b].mean,
                 closed_second = without.stream_out[b].var + without.stream_out[b].mean * without.stream_out[b].mean;
    EXPECT_NEAR(second, closed_second, 1e-12 * closed_second) << "block " << b;
  }
  // BatchNorm divides each channel by its own deviation: without the scale spread the bookkeeping keeps none.
  ResnetConfig normed = config_of(20, false, ResnetNorm::batchnorm);
  scaling.rule = "standard";
  const auto standard = make_rule(scaling, ModelConfig(normed));
  EXPECT_EQ(resnet_bookkeeping(normed, *standard, 1.0, mixed).stream_out.back().var,
            resnet_bookkeeping(normed, *standard, 1.0, closed).stream_out.back().var);
}

struct MeasuredCase {
  std::string rule;
  bool preact;
  ResnetNorm norm;
  double tolerance;
};

class ResnetTheoryMeasured : public ::testing::TestWithParam<MeasuredCase> {};

TEST_P(ResnetTheoryMeasured, AgreesWithTheInitialisedModel) {
  const MeasuredCase c = GetParam();
  // Width 4 (64-256 channels): at width 1 a single block's gain fluctuates by tens of percent between seeds.
  ResnetConfig config = config_of(14, c.preact, c.norm);
  config.width = 4;
  ScalingConfig scaling;
  scaling.rule = c.rule;
  Resnet model(config, scaling, 3);
  VarianceSink sink;
  StepContext context;
  context.sink = &sink;
  Batch batch{testing::random_tensor({8, 3, 32, 32}, 4), Tensor::zeros({8}, DType::i32)};
  model.forward_backward(batch, 0.0f, context);
  const ResnetBookkeeping theory = bookkeeping(config, c.rule, {}, true);
  // Per block within `tolerance` (stream) and twice that (a single branch: its gain fluctuates between weight
  // draws — the stem's 64 channels span only 3·9 input dimensions); the branches on average within `tolerance`.
  double ratio_sum = 0;
  int branches = 0;
  for (int b = 0; b < model.blocks(); ++b) {
    SCOPED_TRACE("block " + std::to_string(b));
    const StreamMoments out = sink.moments.at(model.probe_block_out(b));
    const StreamMoments branch = sink.moments.at(model.probe_block_branch(b));
    EXPECT_NEAR(out.var, theory.stream_out[b].var, c.tolerance * theory.stream_out[b].var);
    EXPECT_NEAR(out.mean, theory.stream_out[b].mean, c.tolerance * std::sqrt(theory.stream_out[b].var));
    if (theory.branch[b].var > 0) {
      EXPECT_NEAR(branch.var, theory.branch[b].var, 2 * c.tolerance * theory.branch[b].var);
      ratio_sum += branch.var / theory.branch[b].var;
      ++branches;
    } else {
      EXPECT_EQ(branch.var, 0.0);
    }
  }
  if (branches > 0) {
    EXPECT_NEAR(ratio_sum / branches, 1.0, c.tolerance) << "mean measured/predicted branch variance";
  }
}

// Tolerances: one network at finite width (64-256 channels), not a seed average, on one batch of 8 images.
INSTANTIATE_TEST_SUITE_P(Rules, ResnetTheoryMeasured,
                         ::testing::Values(MeasuredCase{"standard", true, ResnetNorm::batchnorm, 0.15},
                                           MeasuredCase{"standard", false, ResnetNorm::batchnorm, 0.2},
                                           // Measured above the prediction by up to 36% (block 4: 66.6 vs 49.1):
                                           // zero padding lowers the prediction (the interior alone was within
                                           // 25%), the measured stream grows faster (not explained yet).
                                           MeasuredCase{"standard", true, ResnetNorm::none, 0.4},
                                           MeasuredCase{"fixup", false, ResnetNorm::none, 0.15},
                                           MeasuredCase{"nf", true, ResnetNorm::none, 0.15},
                                           MeasuredCase{"skipinit", true, ResnetNorm::none, 0.15},
                                           MeasuredCase{"odestep", true, ResnetNorm::batchnorm, 0.15}),
                         [](const auto& info) {
                           return info.param.rule + (info.param.preact ? "_pre" : "_post") +
                                  (info.param.norm == ResnetNorm::none ? "_nonorm" : "_bn");
                         });

// Forward and backward variance per probe, averaged over `seeds` initialisations (batch of `batch` 32×32 images, the
// targets as step_targets gives them); `model` is the last network, for its probe ids.
struct SeedAverage {
  std::map<int, double> forward, backward;
  std::unique_ptr<Resnet> model;
};
// The targets a step gives its batch: spread over the classes, offset by `seed` (every seed has the same count per
// class, which is what the bookkeeping reads), or with `one_class` all of class `seed` % classes.
std::vector<std::int32_t> step_targets(int classes, int seed, int batch_size, bool one_class = false) {
  std::vector<std::int32_t> targets(static_cast<std::size_t>(batch_size));
  for (int i = 0; i < batch_size; ++i)
    targets[static_cast<std::size_t>(i)] = ((one_class ? 0 : i * 7) + seed) % classes;
  return targets;
}

// One forward-backward step of `model` on `batch_size` random 32×32 images (drawn from `image_seed`) with
// step_targets, every probe's moments captured.
VarianceSink one_step(Resnet& model, int classes, int seed, int batch_size, std::uint64_t image_seed,
                      bool one_class = false) {
  VarianceSink sink;
  StepContext context;
  context.sink = &sink;
  Tensor targets = Tensor::empty({batch_size}, DType::i32);
  const std::vector<std::int32_t> chosen = step_targets(classes, seed, batch_size, one_class);
  std::copy(chosen.begin(), chosen.end(), targets.i32());
  Batch batch{testing::random_tensor({batch_size, 3, 32, 32}, image_seed), targets};
  model.forward_backward(batch, 1.0f, context);
  return sink;
}

SeedAverage seed_average(const ResnetConfig& config, const ScalingConfig& scaling, int seeds, int batch_size,
                         bool one_class = false) {
  SeedAverage out;
  for (int seed = 1; seed <= seeds; ++seed) {
    out.model = std::make_unique<Resnet>(config, scaling, static_cast<std::uint64_t>(seed));
    const VarianceSink sink = one_step(*out.model, config.classes, seed, batch_size, 100 + seed, one_class);
    for (const auto& [probe, m] : sink.moments) out.forward[probe] += m.var / seeds;
    for (const auto& [probe, v] : sink.grad_var) out.backward[probe] += v / seeds;
  }
  return out;
}

// The NF-ResNet at the 32x32 (docs/theory.md, "ResNets"): stream and branch variances forward and backward,
// seed-averaged over 16 initialisations of a width-1 ResNet-20 (basic) and ResNet-29 (bottleneck) with a batch of 16,
// median within 3% and worst within 8% per probe. Measured: basic 0.5% / 1.5% forward, 1.3% / 2.7% backward;
// bottleneck 2.0% / 2.9% forward, 0.3% / 4.8% backward. 16 seeds, not 4: the top gradient rests on one draw of the
// classifier per seed (all of a batch's rows share it), and 4 seeds scatter it by ±4%. Without the zero-padded
// borders (options.borders = false) it fails (4 seeds: basic forward 7.1% / 26.6%, backward 5.0% / 7.6%); with the
// logits' spread taken as E[a²] of the final map rather than of its average over positions, the top gradient is
// 3.5–4% high (24 seeds) and the backward medians miss.
TEST(ResnetTheoryAccuracy, NfResnetForwardAndBackwardWithinTargets) {
  for (const ResnetBlock block : {ResnetBlock::basic, ResnetBlock::bottleneck}) {
    SCOPED_TRACE(block == ResnetBlock::basic ? "basic" : "bottleneck");
    ResnetConfig config = config_of(block == ResnetBlock::basic ? 20 : 29, true, ResnetNorm::none);
    config.block = block;
    ScalingConfig scaling;
    scaling.rule = "nf";
    constexpr int kBatch = 16;
    const SeedAverage average = seed_average(config, scaling, 16, kBatch);
    const std::map<int, double>& forward = average.forward;
    const std::map<int, double>& backward = average.backward;
    const Resnet* shape = average.model.get();
    ResnetTheoryOptions options;
    options.batch = kBatch;
    options.batch_targets = step_targets(config.classes, 1, kBatch);
    const ResnetBookkeeping theory = resnet_bookkeeping(config, *make_rule(scaling, ModelConfig(config)), 1.0, options);
    std::vector<double> forward_errors, backward_errors;
    for (int b = 0; b < shape->blocks(); ++b) {
      const std::pair<int, std::pair<double, double>> probes[] = {
          {shape->probe_block_in(b), {theory.stream_in[b].var, theory.grad_in[b]}},
          {shape->probe_block_branch(b), {theory.branch[b].var, theory.grad_branch[b]}},
          {shape->probe_block_out(b), {theory.stream_out[b].var, theory.grad_out[b]}}};
      for (const auto& [probe, predicted] : probes) {
        forward_errors.push_back(std::abs(forward.at(probe) / predicted.first - 1.0));
        backward_errors.push_back(std::abs(backward.at(probe) / predicted.second - 1.0));
      }
    }
    const double median_target = 0.03;
    for (std::vector<double>* errors : {&forward_errors, &backward_errors}) {
      std::sort(errors->begin(), errors->end());
      const char* what = errors == &forward_errors ? "forward" : "backward";
      std::printf("NF-ResNet %s %s: median %.4f worst %.4f\n", block == ResnetBlock::basic ? "basic" : "bottleneck",
                  what, (*errors)[errors->size() / 2], errors->back());
      EXPECT_LE((*errors)[errors->size() / 2], median_target) << what << " median";
      EXPECT_LE(errors->back(), 0.08) << what << " worst";
    }
  }
}

// BatchNorm ResNets (pre-activation, He init, width 1, 32×32, batch 16, 16 seeds): near a zero-padded border a conv of
// ReLU outputs reads fewer taps, so a channel's own mean there is a smaller part of the batch mean BatchNorm removes,
// and more of the border's variance stays (docs/theory.md, "ResNets"). How much smaller also depends on the input's
// mean at each tap: a ReLU of a normalised map has a lower mean where its input's variance is lower, at the borders,
// so E[δ(p)·δ̄] sums m(p + t)·(the tap's average m), not the interior's mean squared. Its backward divides each
// channel's gradient by that channel's own batch variance, and E[1/σ_c²] = (1 + spread)/E[σ_c²] to second order (the
// channels' variances spread by 2·tr(G_c²)/tr(G_c)² of the conv's centred input Gram, about 2/fan_in, plus the
// batch's sampling, 2/(batch·HW), less 2/fan_in where the norm divides its own conv's output). Measured now: forward
// median 1.2%, worst 6.6%; the top block's gradient 1.0%; the blocks' backward gains (gradient in / out) median 1.0%,
// worst 1.5%; the input gradient 1.028× the prediction (2.0% and 1.055× before the images' means summed to zero after
// a norm; 2.7% and 1.073× before the image-mean part's borders). Before the input's mean followed the position (taken
// as the interior's at every tap) it failed: forward 2.7% / 7.0%, top gradient 8.3%, gains 1.7% / 8.4%, input gradient
// 1.39× (the border profile compounds over the 8×8 stage). Without the border term at all: forward 5.0% / 10.5%, top
// gradient 31%, worst gain 17.6%.
TEST(ResnetTheoryAccuracy, BatchNormBordersKeepTheirChannelMeans) {
  ResnetConfig config = config_of(20, true, ResnetNorm::batchnorm);
  ScalingConfig scaling;
  scaling.rule = "standard";
  constexpr int kBatch = 16;
  const SeedAverage average = seed_average(config, scaling, 16, kBatch);
  const std::map<int, double>& forward = average.forward;
  const std::map<int, double>& backward = average.backward;
  const Resnet* last = average.model.get();
  ResnetTheoryOptions options;
  options.batch = kBatch;
  options.batch_targets = step_targets(config.classes, 1, kBatch);
  const ResnetBookkeeping theory = resnet_bookkeeping(config, *make_rule(scaling, ModelConfig(config)), 1.0, options);
  std::vector<double> forward_errors, gain_errors;
  for (int b = 0; b < last->blocks(); ++b) {
    forward_errors.push_back(std::abs(forward.at(last->probe_block_out(b)) / theory.stream_out[b].var - 1.0));
    forward_errors.push_back(std::abs(forward.at(last->probe_block_branch(b)) / theory.branch[b].var - 1.0));
    const double measured_gain = backward.at(last->probe_block_in(b)) / backward.at(last->probe_block_out(b));
    gain_errors.push_back(std::abs(measured_gain / (theory.grad_in[b] / theory.grad_out[b]) - 1.0));
  }
  const int top = last->blocks() - 1;
  const double top_error = std::abs(backward.at(last->probe_block_out(top)) / theory.grad_out[top] - 1.0);
  std::sort(forward_errors.begin(), forward_errors.end());
  std::sort(gain_errors.begin(), gain_errors.end());
  const double input_ratio = backward.at(last->probe_block_in(0)) / theory.grad_in[0];
  std::printf(
      "BatchNorm ResNet-20: forward median %.4f worst %.4f; top gradient %.4f; block gains median %.4f worst "
      "%.4f; input gradient measured/predicted %.3f\n",
      forward_errors[forward_errors.size() / 2], forward_errors.back(), top_error, gain_errors[gain_errors.size() / 2],
      gain_errors.back(), input_ratio);
  EXPECT_LE(forward_errors[forward_errors.size() / 2], 0.03) << "forward median";
  EXPECT_LE(forward_errors.back(), 0.08) << "forward worst";
  EXPECT_LE(top_error, 0.06) << "top block's gradient";
  EXPECT_LE(gain_errors[gain_errors.size() / 2], 0.02) << "median block gain";
  EXPECT_LE(gain_errors.back(), 0.05) << "worst block gain";
  EXPECT_LE(input_ratio, 1.1) << "input gradient, measured over predicted";
  EXPECT_GE(input_ratio, 0.92) << "input gradient, measured over predicted";
}

// The images' loss gradients covary: with the classifier's rows independent of the softmax, E[g_i·g_j] ∝
// (S − 1/C)·s(r) − 1/C + [y_i = y_j] (docs/theory.md, "ResNets"), so a batch whose images share their class keeps
// much of its top gradient in the batch mean, which the final BatchNorm of a pre-activation net removes. Pre-activation
// BatchNorm ResNet-20, 16 seeds, the top block's output gradient with every image of one class against targets spread
// over the classes: measured ratio 0.203, predicted 0.190. The norm removes the shared part's projections on 1 and on
// x̂ (norm_act_backward); with only the batch mean removed the prediction was 0.507.
TEST(ResnetTheoryAccuracy, ImagesSharingAClassLoseTheirSharedGradientToTheBatchMean) {
  ResnetConfig config = config_of(20, true, ResnetNorm::batchnorm);
  ScalingConfig scaling;
  scaling.rule = "standard";
  constexpr int kBatch = 16;
  const SeedAverage spread = seed_average(config, scaling, 16, kBatch);
  const SeedAverage shared = seed_average(config, scaling, 16, kBatch, true);
  const int top = spread.model->blocks() - 1;
  const int probe = spread.model->probe_block_out(top);
  auto predicted = [&](bool one_class) {
    ResnetTheoryOptions options;
    options.batch = kBatch;
    options.batch_targets = step_targets(config.classes, 1, kBatch, one_class);
    return resnet_bookkeeping(config, *make_rule(scaling, ModelConfig(config)), 1.0, options).grad_out[top];
  };
  const double measured_ratio = shared.backward.at(probe) / spread.backward.at(probe);
  const double predicted_ratio = predicted(true) / predicted(false);
  std::printf("top gradient, one class over spread: measured %.4f, predicted %.4f\n", measured_ratio, predicted_ratio);
  EXPECT_LT(measured_ratio, 0.6) << "sharing a class should cost the top gradient much of its size";
  EXPECT_NEAR(predicted_ratio / measured_ratio, 1.0, 0.1);
}

// A SkipInit ResNet at initialisation is the identity but for its stem, its projections and its classifier, and
// the gradient below the pooled features leans on the classifier's own weights H: over H the loss gradient
// Hᵀ(p − y) has the mean σ²·tr S·f, and the gradient at a layer gains σ⁴·((tr S)² + tr S²)·E|Jᵀf|², f propagated
// backward through the weights that made it (docs/theory.md, "ResNets", "The classifier's coupling"). ResNet-8
// (one block a stage: the same stack as ResNet-56), width 1, batch 16, 400 seeds, at the stem's output: the
// independent-weights bookkeeping is 6–7% low there (a float64 replica, bench/resnet_head_coupling.py, 1600
// networks: +6.7% ± 0.8%), the coupling's prediction within the seeds' scatter.
TEST(ResnetTheoryAccuracy, TheClassifiersCouplingLiftsAnIdentityStacksGradient) {
  ResnetConfig config = config_of(8, true, ResnetNorm::none);
  ScalingConfig scaling;
  scaling.rule = "skipinit";
  constexpr int kBatch = 16, kSeeds = 400;
  std::vector<double> values;
  for (int seed = 1; seed <= kSeeds; ++seed) {
    Resnet model(config, scaling, static_cast<std::uint64_t>(seed));
    values.push_back(one_step(model, config.classes, seed, kBatch, 100 + seed).grad_var.at(model.probe_block_in(0)));
  }
  double mean = 0.0, sq = 0.0;
  for (double v : values) mean += v / kSeeds;
  for (double v : values) sq += (v - mean) * (v - mean);
  const double se = std::sqrt(sq / (kSeeds - 1) / kSeeds);
  auto predicted = [&](bool coupling) {
    ResnetTheoryOptions options;
    options.batch = kBatch;
    options.batch_targets = step_targets(config.classes, 1, kBatch);
    options.head_coupling = coupling;
    return resnet_bookkeeping(config, *make_rule(scaling, ModelConfig(config)), 1.0, options).grad_stem;
  };
  const double with = predicted(true), without = predicted(false);
  std::printf(
      "SkipInit ResNet-8 stem gradient over %d seeds: measured/predicted %.4f ± %.4f with the coupling, "
      "%.4f without (the coupling adds %.4f)\n",
      kSeeds, mean / with, se / with, mean / without, with / without - 1.0);
  EXPECT_NEAR(mean / with, 1.0, 2.5 * se / with);
  EXPECT_GT(with / without - 1.0, 0.04) << "the coupling should lift the stem's gradient by several percent";
  EXPECT_GT(mean / without - 1.0, 2.0 * se / without) << "the bookkeeping without it should be resolved low";
}

// Post-activation BatchNorm ResNets (He init, width 1, 32×32, batch 16, 16 seeds): each identity block's stream is
// ReLU(x + BatchNorm(branch)) with x = ReLU(the previous sum), half of whose mass is at 0, so the sum is not Gaussian
// and the Gaussian closure of its ReLU falls short of the stream's growth (7–15% per block in a float64 replica). The
// bookkeeping carries each position's distribution of the sum from block to block instead, and in the backward the
// gradient's dependence on it (consecutive blocks' masks agree more often than independent ones) (docs/theory.md,
// "ResNets"). Measured: forward median 0.7%, worst 2.5%; backward median 2.0%, worst 3.8%; the blocks' backward gains
// median 0.8%, worst 1.4% (4.1% / 5.5% before the images' means summed to zero after a norm, 5.8% / 7.4% and
// 1.0% / 1.5% before the image-mean part's borders). With the Gaussian closure
// (options.rectified_sums = false) it fails: forward 13.6% / 19.7%, backward 12.9% / 24.4%, gains 6.6% / 10.8%;
// carrying the sums without the masks' correlation, the gains were 4.2% / 7.5%.
TEST(ResnetTheoryAccuracy, PostActivationSumsCarryTheirDistribution) {
  ResnetConfig config = config_of(20, false, ResnetNorm::batchnorm);
  ScalingConfig scaling;
  scaling.rule = "standard";
  constexpr int kBatch = 16;
  const SeedAverage average = seed_average(config, scaling, 16, kBatch);
  const Resnet* last = average.model.get();
  struct Errors {
    std::vector<double> forward, backward, gains;
  };
  auto errors_of = [&](bool rectified_sums) {
    ResnetTheoryOptions options;
    options.batch = kBatch;
    options.batch_targets = step_targets(config.classes, 1, kBatch);
    options.rectified_sums = rectified_sums;
    const ResnetBookkeeping theory = resnet_bookkeeping(config, *make_rule(scaling, ModelConfig(config)), 1.0, options);
    Errors e;
    for (int b = 0; b < last->blocks(); ++b) {
      const int in = last->probe_block_in(b), out = last->probe_block_out(b);
      e.forward.push_back(std::abs(average.forward.at(out) / theory.stream_out[b].var - 1.0));
      e.backward.push_back(std::abs(average.backward.at(in) / theory.grad_in[b] - 1.0));
      e.backward.push_back(std::abs(average.backward.at(out) / theory.grad_out[b] - 1.0));
      const double measured_gain = average.backward.at(in) / average.backward.at(out);
      e.gains.push_back(std::abs(measured_gain / (theory.grad_in[b] / theory.grad_out[b]) - 1.0));
    }
    for (std::vector<double>* v : {&e.forward, &e.backward, &e.gains}) std::sort(v->begin(), v->end());
    std::printf(
        "post-activation BatchNorm ResNet-20, %s: forward median %.4f worst %.4f; backward median %.4f worst "
        "%.4f; gains median %.4f worst %.4f\n",
        rectified_sums ? "carried sums" : "Gaussian closure", e.forward[e.forward.size() / 2], e.forward.back(),
        e.backward[e.backward.size() / 2], e.backward.back(), e.gains[e.gains.size() / 2], e.gains.back());
    return e;
  };
  const Errors carried = errors_of(true), closure = errors_of(false);
  EXPECT_LE(carried.forward[carried.forward.size() / 2], 0.015) << "forward median";
  EXPECT_LE(carried.forward.back(), 0.04) << "forward worst";
  EXPECT_LE(carried.backward[carried.backward.size() / 2], 0.03) << "backward median";
  EXPECT_LE(carried.backward.back(), 0.05) << "backward worst";
  EXPECT_LE(carried.gains[carried.gains.size() / 2], 0.02) << "median block gain";
  EXPECT_LE(carried.gains.back(), 0.03) << "worst block gain";
  EXPECT_GT(closure.forward.back(), 0.1) << "the Gaussian closure should miss the stream's growth";
}

// BatchNorm divides a channel's gradient by its batch variance σ_c² = w_cᵀG·w_c, whose spread over the channels
// (2·tr(G²)/tr(G)², G the conv input's centred patch Gram) BatchNorm's E[1/σ_c²] pays. On a small map most outputs
// read a zero-padded tap, where every channel's patch entry drops its mean together: G gains C_in²·Σ_{t,s} K(t, s)²
// (docs/theory.md, "ResNets", "The zero padding spreads the channels' variances"). On a float64 replica of the
// pre-activation ResNet-20 (bench/resnet_positions.py, 8 seeds) the 8×8 stage's second norms measure 0.0084 and
// 0.0098 for the weights' part, predicted 0.0049 and 0.0043 with the interior's Gram and 0.0078 and 0.0074 with the
// padded one; the batch's sampling part is 2/(N·HW) within its noise. ResNet-56, 48 seeds, batch 16, the stream's
// gradient per block (median / worst, against seed 1's prediction), with the padded term against without:
// post-activation 1.2% / 6.5% against 2.1% / 5.6%, pre-activation 1.5% / 2.2% against 1.2% / 3.1%. Since a norm's
// backward leaves the images' means summing to zero (docs/theory.md, "ResNets": the next norm's batch mean removes
// nothing of them), the padded term's gain shows in the post-activation median and the pre-activation worst only;
// before that, 2.4% / 4.3% and 2.4% / 5.0% (against 4.4% / 8.1% and 3.7% / 6.0%), and before a 3×3 conv's transpose
// counted the zero padding in the gradient's image-mean part (ζ, 0.71 of the interior's on 8×8), 3.1% / 5.2% and
// 4.6% / 7.2% (the pre-activation 8×8 stage drifting 0.8% a block).
TEST(ResnetTheoryAccuracy, ZeroPaddingSpreadsTheChannelVariances) {
  ScalingConfig scaling;
  scaling.rule = "standard";
  constexpr int kBatch = 16;
  for (const bool preact : {false, true}) {
    const ResnetConfig config = config_of(56, preact, ResnetNorm::batchnorm);
    const SeedAverage average = seed_average(config, scaling, 48, kBatch);
    const Resnet* last = average.model.get();
    auto backward_errors = [&](bool padded_spread) {
      ResnetTheoryOptions options;
      options.batch = kBatch;
      options.batch_targets = step_targets(config.classes, 1, kBatch);
      options.padded_spread = padded_spread;
      const ResnetBookkeeping theory =
          resnet_bookkeeping(config, *make_rule(scaling, ModelConfig(config)), 1.0, options);
      std::vector<double> e;
      for (int b = 0; b < last->blocks(); ++b) {
        e.push_back(std::abs(average.backward.at(last->probe_block_in(b)) / theory.grad_in[b] - 1.0));
        e.push_back(std::abs(average.backward.at(last->probe_block_out(b)) / theory.grad_out[b] - 1.0));
      }
      std::sort(e.begin(), e.end());
      std::printf("%s-activation BatchNorm ResNet-56, %s: backward median %.4f worst %.4f\n", preact ? "pre" : "post",
                  padded_spread ? "padded Gram" : "interior Gram", e[e.size() / 2], e.back());
      return std::pair{e[e.size() / 2], e.back()};
    };
    const auto [median, worst] = backward_errors(true);
    const auto [interior_median, interior_worst] = backward_errors(false);
    if (preact) {
      EXPECT_LT(worst, interior_worst) << "pre-activation: worst";
      EXPECT_LE(median, 0.02) << "pre-activation: median";
      EXPECT_LE(worst, 0.035) << "pre-activation: worst";
    } else {
      EXPECT_LT(median, interior_median) << "post-activation: median";
      EXPECT_LE(median, 0.02) << "post-activation: median";
      EXPECT_LE(worst, 0.08) << "post-activation: worst";
    }
  }
}

// Finite-width bands (docs/theory.md, "Finite-width bands", ResNets): over 24 initialisations and image batches of a
// width-1 pre-activation ResNet-20 (32×32, batch 16), the z-scores (log var − (log predicted − sd²/2))/sd of every
// stream and branch probe. BatchNorm: measured within 1 sd 69.3%, within 2 sd 96.9%, mean −0.11, sd 0.96 (held to
// the MLP and transformer bands' tolerances). NF: 58.6%, 88.9%, +0.10, 1.20 — narrower than it claims, by the last
// stage (held to what it reaches). Without the realised channel correlations the NF branches' band was 0.006 against a
// measured 0.03–0.07, and without the stream–branch link its stream's 0.007 against 0.013–0.021 in the first stage.
struct BandCoverage {
  double inside1 = 0, inside2 = 0, mean = 0, sd = 0;
};

BandCoverage resnet_band_coverage(const ResnetConfig& config, const ScalingConfig& scaling, const char* label) {
  constexpr int kBatch = 16, kNetworks = 24;
  ResnetTheoryOptions options;
  options.batch = kBatch;
  options.batch_targets = step_targets(config.classes, 1, kBatch);
  const ResnetBookkeeping theory = resnet_bookkeeping(config, *make_rule(scaling, ModelConfig(config)), 1.0, options);
  std::vector<double> z;
  for (int seed = 1; seed <= kNetworks; ++seed) {
    Resnet model(config, scaling, static_cast<std::uint64_t>(500 + seed));
    const VarianceSink sink = one_step(model, config.classes, seed, kBatch, 900 + seed);
    for (int b = 0; b < model.blocks(); ++b) {
      const std::pair<int, std::pair<double, double>> probes[] = {
          {model.probe_block_in(b), {theory.stream_in[b].var, theory.stream_in_log_sd[b]}},
          {model.probe_block_branch(b), {theory.branch[b].var, theory.branch_log_sd[b]}},
          {model.probe_block_out(b), {theory.stream_out[b].var, theory.stream_out_log_sd[b]}}};
      for (const auto& [probe, predicted] : probes) {
        const auto [var, sd] = predicted;
        EXPECT_TRUE(std::isfinite(sd) && sd > 0) << label << " block " << b;
        if (!(sd > 0)) continue;
        z.push_back((std::log(sink.moments.at(probe).var) - (std::log(var) - 0.5 * sd * sd)) / sd);
      }
    }
  }
  BandCoverage c;
  double sum_sq = 0;
  for (const double v : z) {
    c.inside1 += std::fabs(v) < 1 ? 1 : 0;
    c.inside2 += std::fabs(v) < 2 ? 1 : 0;
    c.mean += v;
    sum_sq += v * v;
  }
  const double count = static_cast<double>(z.size());
  c.inside1 /= count;
  c.inside2 /= count;
  c.mean /= count;
  c.sd = std::sqrt(sum_sq / count - c.mean * c.mean);
  std::printf("%s: %zu z-scores: within 1 sd %.3f, within 2 sd %.3f, mean %.3f, sd %.3f\n", label, z.size(), c.inside1,
              c.inside2, c.mean, c.sd);
  return c;
}

TEST(ResnetTheoryAccuracy, FiniteWidthBandsHoldOverInitialisations) {
  ScalingConfig standard;
  const BandCoverage bn = resnet_band_coverage(config_of(20, true, ResnetNorm::batchnorm), standard, "batchnorm");
  EXPECT_GT(bn.inside1, 0.55);
  EXPECT_LT(bn.inside1, 0.80);
  EXPECT_GT(bn.inside2, 0.90);
  EXPECT_NEAR(bn.mean, 0.0, 0.3);
  EXPECT_GT(bn.sd, 0.8);
  EXPECT_LT(bn.sd, 1.25);
  ScalingConfig nf;
  nf.rule = "nf";
  const BandCoverage nf_cov = resnet_band_coverage(config_of(20, true, ResnetNorm::none), nf, "nf");
  EXPECT_GT(nf_cov.inside2, 0.85);
  EXPECT_NEAR(nf_cov.mean, 0.0, 0.3);
  EXPECT_LT(nf_cov.sd, 1.3);
  // Where no band is derived it is NaN, not a number that would mislead: post-activation and SkipInit.
  ScalingConfig skipinit;
  skipinit.rule = "skipinit";
  for (const auto& [config, scaling] : {std::pair{config_of(20, false, ResnetNorm::batchnorm), standard},
                                        std::pair{config_of(20, true, ResnetNorm::none), skipinit}}) {
    const ResnetBookkeeping t = resnet_bookkeeping(config, *make_rule(scaling, ModelConfig(config)), 1.0, {});
    EXPECT_TRUE(std::isnan(t.stem_log_sd));
    EXPECT_TRUE(std::isnan(t.stream_out_log_sd.back()));
  }
}

}  // namespace
}  // namespace proplab
