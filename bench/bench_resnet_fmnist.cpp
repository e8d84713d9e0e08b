// bench_resnet_fmnist: a CIFAR-style ResNet (BatchNorm, He init) trained on Fashion-MNIST within a wall-clock
// budget, then its test accuracy (issue 7: ResNet-20 to >= 88% within 15 minutes on 2 CPU cores).
//
//   build/bench/bench_resnet_fmnist [threads=2] [minutes=15] [batch=128] [lr=0.1] [depth=20]
//
// SGD with Nesterov momentum 0.9, weight decay 5e-4, 50 warm-up steps, then a cosine decay over the steps that fit
// in the budget (planned from the measured step time after 20 steps and again after 100); random crops (padding 2)
// and flips. The budget covers training and the test evaluation (10,000 images, running statistics). Needs Debian's
// dataset-fashion-mnist. Under shared cores run it with OMP_WAIT_POLICY=passive (docs/perf.md).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numbers>
#include <vector>

#include "core/parallel.h"
#include "data/images.h"
#include "models/resnet.h"
#include "ops/ops.h"

using namespace proplab;

int main(int argc, char** argv) {
  auto arg = [&](int i, double fallback) { return argc > i ? std::atof(argv[i]) : fallback; };
  const int threads = static_cast<int>(arg(1, 2));
  const double minutes = arg(2, 15);
  const int batch = static_cast<int>(arg(3, 128));
  const float peak_lr = static_cast<float>(arg(4, 0.1));
  const int depth = static_cast<int>(arg(5, 20));
  try {
    set_threads(threads);
    DataConfig data_config;
    data_config.kind = "idx";
    data_config.path = "/usr/share/datasets/fashion-mnist";
    data_config.crop_padding = 2;
    const auto data = make_image_dataset(data_config, 1, 28, 10, 1);
    ResnetConfig config;
    config.depth = depth;
    config.in_channels = 1;
    config.image_size = 28;
    config.classes = 10;
    Resnet model(config, ScalingConfig{}, 1);
    Batch b{Tensor::empty({batch, 1, 28, 28}), Tensor::empty({batch}, DType::i32)};
    auto& params = model.params().all();
    std::vector<Tensor> momentum;
    for (auto& p : params) momentum.push_back(Tensor::zeros(p->value.shape()));

    const auto start = std::chrono::steady_clock::now();
    auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
    // The test evaluation costs about a third of a training step per image: keep its share of the budget.
    const double budget = minutes * 60.0;
    auto plan = [&](long done) {
      const double per_image = elapsed() / static_cast<double>(done * batch);
      return static_cast<long>((budget - 10000 * per_image / 3.0 - 5.0) / (per_image * batch));
    };
    long total = 1L << 40, step = 0;
    double smoothed = 0.0;
    for (; step < total; ++step) {
      if (step == 20 || step == 100) total = std::max(step + 1, plan(step));
      data->batch(Split::train, step, b.inputs, b.targets);
      model.params().zero_grads();
      const double loss = model.forward_backward(b, 1.0f, StepContext{});
      smoothed = 0.98 * smoothed + 0.02 * loss;
      const double warm = std::min(1.0, (step + 1) / 50.0);
      const double progress = std::min(1.0, static_cast<double>(step) / static_cast<double>(total));
      const float lr = static_cast<float>(peak_lr * warm * 0.5 * (1 + std::cos(std::numbers::pi * progress)));
      for (std::size_t i = 0; i < params.size(); ++i) {
        ops::SgdHyper hyper;
        hyper.lr = lr;
        hyper.momentum = 0.9f;
        hyper.nesterov = true;
        hyper.weight_decay = params[i]->weight_decay ? 5e-4f : 0.0f;
        ops::sgd_update(params[i]->value, params[i]->grad, momentum[i], hyper);
      }
      if (step % 100 == 0)
        std::printf("step %ld/%ld  loss %.4f  lr %.4f  %.0f s  %.1f images/s\n", step, total,
                    smoothed / (1 - std::pow(0.98, static_cast<double>(step + 1))), lr, elapsed(),
                    static_cast<double>((step + 1) * batch) / elapsed());
      std::fflush(stdout);
    }
    const double train_seconds = elapsed();
    long correct = 0;
    Batch test{Tensor::empty({500, 1, 28, 28}), Tensor::empty({500}, DType::i32)};
    for (int i = 0; i < 20; ++i) {
      data->batch(Split::validation, i, test.inputs, test.targets);
      model.evaluate(test);
      const float* logits = model.logits().f32();
      for (int r = 0; r < 500; ++r) {
        int best = 0;
        for (int k = 1; k < 10; ++k)
          if (logits[r * 10 + k] > logits[r * 10 + best]) best = k;
        correct += best == test.targets.i32()[r];
      }
    }
    std::printf(
        "ResNet-%d, %d threads: %ld steps of %d in %.0f s (%.1f images/s, %.2f epochs); test accuracy %.4f; "
        "total %.0f s of a %.0f s budget\n",
        depth, threads, step, batch, train_seconds, static_cast<double>(step * batch) / train_seconds,
        static_cast<double>(step * batch) / 60000.0, static_cast<double>(correct) / 10000.0, elapsed(), budget);
  } catch (const UserError& error) {
    std::fprintf(stderr, "bench_resnet_fmnist: %s\n", error.what());
    return 2;
  }
  return 0;
}
