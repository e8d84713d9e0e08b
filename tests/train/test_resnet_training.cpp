// ResNet training smoke tests (the CI half of issue 7's "trains on Fashion-MNIST"): a few hundred SGD steps of a
// small ResNet make the loss fall, on synthetic Gaussian images (memorising a fixed set) and on Debian's
// Fashion-MNIST (skipped when it is not installed).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "data/images.h"
#include "io/checkpoint.h"
#include "io/run_reader.h"
#include "models/resnet.h"
#include "ops/ops.h"
#include "support/temp_dir.h"
#include "train/trainer.h"

namespace proplab {
namespace {

struct SgdState {
  std::vector<Tensor> momentum;
};

void sgd_step(Model& model, SgdState& state, float lr) {
  auto& params = model.params().all();
  if (state.momentum.empty())
    for (auto& p : params) state.momentum.push_back(Tensor::zeros(p->value.shape()));
  for (std::size_t i = 0; i < params.size(); ++i) {
    ops::SgdHyper hyper;
    hyper.lr = lr * static_cast<float>(params[i]->lr_multiplier);
    hyper.momentum = 0.9f;
    hyper.weight_decay = params[i]->weight_decay ? 5e-4f : 0.0f;
    ops::sgd_update(params[i]->value, params[i]->grad, state.momentum[i], hyper);
  }
}

// Mean loss over `steps` training steps on batches from `data`, and the accuracy on `eval_batches` validation
// batches at the end.
struct TrainResult {
  double first_loss = 0, last_loss = 0, accuracy = 0, images_per_second = 0;
};

TrainResult train(Model& model, const ImageDataset& data, int steps, int batch, float lr, int eval_batches,
                  bool fixed_batch) {
  const int c = data.channels(), s = data.image_size();
  Batch b{Tensor::empty({batch, c, s, s}), Tensor::empty({batch}, DType::i32)};
  SgdState state;
  TrainResult result;
  double window = 0;
  const int window_size = std::max(1, steps / 10);
  const auto start = std::chrono::steady_clock::now();
  for (int step = 0; step < steps; ++step) {
    data.batch(Split::train, fixed_batch ? 0 : step, b.inputs, b.targets);
    model.params().zero_grads();
    const double loss = model.forward_backward(b, 1.0f, StepContext{});
    sgd_step(model, state, lr);
    if (step < window_size) result.first_loss += loss / window_size;
    if (step >= steps - window_size) window += loss / window_size;
  }
  result.images_per_second =
      steps * batch / std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.last_loss = window;
  if (eval_batches > 0) {
    std::int64_t correct = 0, total = 0;
    for (int i = 0; i < eval_batches; ++i) {
      data.batch(Split::validation, i, b.inputs, b.targets);
      // Logits are not exposed: count a sample correct when its own loss is below log 2 (p(label) > 1/2) — a
      // lower bound on accuracy.
      for (int k = 0; k < batch; ++k) {
        Batch one{b.inputs.slice(0, k, 1).clone(), b.targets.slice(0, k, 1).clone()};
        correct += model.evaluate(one) < std::log(2.0);
        ++total;
      }
    }
    result.accuracy = static_cast<double>(correct) / static_cast<double>(total);
  }
  return result;
}

TEST(ResnetTraining, MemorisesAFixedBatchOfGaussianImages) {
  DataConfig config;
  config.kind = "images";
  const auto data = make_image_dataset(config, 3, 8, 4, 1);
  for (const std::string rule : {"standard", "fixup", "nf", "skipinit"}) {
    SCOPED_TRACE(rule);
    ResnetConfig resnet;
    resnet.depth = 8;
    resnet.in_channels = 3;
    resnet.image_size = 8;
    resnet.classes = 4;
    resnet.norm = rule == "standard" ? ResnetNorm::batchnorm : ResnetNorm::none;
    resnet.preact = rule == "nf" || rule == "skipinit";
    ScalingConfig scaling;
    scaling.rule = rule;
    Resnet model(resnet, scaling, 2);
    const TrainResult result = train(model, *data, 60, 16, 0.05f, 0, true);
    EXPECT_LT(result.last_loss, 0.3 * result.first_loss)
        << "first " << result.first_loss << " last " << result.last_loss;
  }
}

TEST(ResnetTraining, LossFallsOnFashionMnist) {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  if (!std::filesystem::exists(dir + "/train-images-idx3-ubyte.gz"))
    GTEST_SKIP() << dir << " is missing: install Debian's dataset-fashion-mnist (scripts/setup-debian.sh)";
  DataConfig config;
  config.kind = "idx";
  config.path = dir;
  config.crop_padding = 2;
  const auto data = make_image_dataset(config, 1, 28, 10, 3);
  ResnetConfig resnet;
  resnet.depth = 8;
  resnet.in_channels = 1;
  resnet.image_size = 28;
  resnet.classes = 10;
  Resnet model(resnet, ScalingConfig{}, 4);
  const TrainResult result = train(model, *data, 150, 16, 0.05f, 8, false);
  std::printf(
      "ResNet-8 (BatchNorm), 150 steps of 16 Fashion-MNIST images: loss %.3f -> %.3f, confident-correct "
      "%.3f, %.0f images/s\n",
      result.first_loss, result.last_loss, result.accuracy, result.images_per_second);
  EXPECT_LT(result.last_loss, 0.75 * result.first_loss);
  EXPECT_GT(result.accuracy, 0.4);  // chance: 0.1
}

TEST(ResnetTraining, RunsThroughTheTrainerAndResumesWithItsRunningStatistics) {
  // A BatchNorm ResNet through run_training: recorded probes with the rule's theory beside them, and a resume whose
  // evaluation (running statistics) and losses repeat bit for bit because the checkpoint holds the running
  // statistics as buffer/<norm>.running_{mean,var}.
  RunSpec spec;
  spec.name = "resnet";
  spec.seed = 3;
  spec.model.set_kind(ModelKind::resnet);
  spec.model.resnet().depth = 8;
  spec.model.resnet().image_size = 8;
  spec.data.kind = "images";
  spec.train.optimizer = OptimizerKind::sgd;
  spec.train.steps = 6;
  spec.train.batch = 8;
  spec.train.lr = 0.05f;
  spec.train.eval_every = 6;
  spec.train.eval_batches = 2;
  spec.record.every = 2;
  spec.config_toml = "name = \"resnet\"  # test";
  testing::TempDir straight, halves;
  RunOptions options;
  options.out_dir = straight.path();
  const RunSummary a = run_training(spec, options);
  ASSERT_EQ(a.status, RunStatus::completed);
  options.out_dir = halves.path();
  options.stop_after = 3;
  run_training(spec, options);
  options.stop_after = -1;
  options.resume = true;
  const RunSummary b = run_training(spec, options);
  ASSERT_EQ(b.status, RunStatus::completed);
  ASSERT_TRUE(a.last_eval_loss && b.last_eval_loss);
  EXPECT_EQ(*a.last_eval_loss, *b.last_eval_loss);
  EXPECT_EQ(a.last_loss, b.last_loss);
  const Checkpoint checkpoint = read_checkpoint(checkpoint_path(straight.path(), "resnet"));
  EXPECT_EQ(checkpoint.tensors.count("buffer/stem.norm.running_var"), 1u);
  // Every probe recorded, and the rule's bookkeeping stored beside it: predictions for the stem and every block
  // probe (within 50% of the step-0 record of this tiny 8x8 model, whose 2x2 last stage is all border), none for
  // the logits.
  RunReader reader = RunReader::open(run_file_path(straight.path(), "resnet"));
  const Dataset2D measured = reader.read_2d("/forward/var");
  const std::vector<double> predicted = reader.read_doubles("/theory/forward/var");
  ASSERT_EQ(measured.columns, 11);  // stem.out, 3 blocks × (in, branch, out), head.logits
  ASSERT_EQ(predicted.size(), 11u);
  for (int probe = 0; probe < 10; ++probe) {
    EXPECT_TRUE(std::isfinite(predicted[probe])) << probe;
    EXPECT_NEAR(measured.at(0, probe), predicted[probe], 0.5 * predicted[probe]) << probe;
  }
  EXPECT_TRUE(std::isnan(predicted[10]));
}

}  // namespace
}  // namespace proplab
