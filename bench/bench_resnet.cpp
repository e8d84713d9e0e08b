// bench_resnet: ResNet-20 training throughput on the CPU beside the same model in PyTorch (issue 7, Speed).
//
// The model is bench_resnet_fmnist's: the default ResnetConfig (post-activation basic blocks, BatchNorm, ReLU,
// widths 16/32/64) on Fashion-MNIST-shaped input (1 × 28 × 28, 10 classes), batch 128, SGD with Nesterov momentum
// 0.9 and weight decay 5e-4, no clipping, one fixed batch of N(0, 1) images and random labels. Side by side in
// one run:
//   - proplab with recording off, recording every 10 steps (the study default: every statistic of every probe and
//     parameter, written to a real run file), every step, every step with every probe summed in a pass of its
//     own rather than inside the ops that take it ("every, ops apart"), and (on CPUs that run ops/conv_direct)
//     recording off with the next slower convolution setting (the direct kernel where Winograd runs by default,
//     im2col under PROPLAB_CONV=direct), interleaved step by step so machine noise hits all alike;
//   - PyTorch (bench/torch_reference.py --model resnet20) under PyTorch 2.x from the bench virtual environment
//     (bench/make-torch-venv.sh; PROPLAB_TORCH_PYTHON names another interpreter) and under Debian's 1.13: each
//     searches its thread setups and (2.x) eager against torch.compile once, then the fastest runs once per
//     round between proplab's rounds.
// A setup's ms/step is the median of its unrecorded steps plus its recorded steps' median excess spread over
// `every` steps (a plain median would hide a cost paid one step in ten). Each round prints its ratio (PyTorch
// ms/step / proplab ms/step of the same round); the summary is the median over rounds.
//
//   bench_resnet [--steps N] [--rounds N] [--threads N] [--batch N] [--no-torch] [--torch-steps N]
//                [--torch-setup intra,blas]
// Run it with OMP_WAIT_POLICY=passive on shared cores (docs/perf.md).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "bench_util.h"
#include "core/rng.h"
#include "models/resnet.h"
#include "ops/ops.h"
#include "train/optimizer.h"
#include "train/recorder.h"

#ifndef PROPLAB_SOURCE_DIR
#define PROPLAB_SOURCE_DIR "."
#endif

namespace {

using namespace proplab;

// The median (the mean of the two middle values for an even count).
double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const std::size_t mid = v.size() / 2;
  return v.size() % 2 == 1 ? v[mid] : 0.5 * (v[mid - 1] + v[mid]);
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

struct Setup {
  std::string label;
  std::int64_t every = 0;  // 0: recording off
  bool gather = true;      // probes summed inside the ops that take them (ProbeSink::gathered)
  ops::ConvKernel kernel = ops::ConvKernel::direct;
  std::unique_ptr<Resnet> model;
  std::unique_ptr<Optimizer> optimizer;
  std::unique_ptr<Recorder> recorder;
  std::optional<RunWriter> writer;
  std::vector<double> plain_seconds, recorded_seconds;  // timed steps without / with a record
  std::vector<std::vector<double>> round_plain, round_recorded;
  std::int64_t step = 0;
};

// ms/step with a recorded step's excess spread over `every` steps (see the header).
double amortised_seconds(const std::vector<double>& plain, const std::vector<double>& recorded, std::int64_t every) {
  const double base = median(plain);
  if (every == 0 || recorded.empty()) return base;
  return base + (median(recorded) - base) / static_cast<double>(every);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ResNet-20 training throughput: proplab (recording off / every 10 / every step) beside PyTorch"};
  int steps = 10, rounds = 3, warmup = 2, threads_arg = 0, batch = 128, torch_steps = 6;
  bool no_torch = false;
  std::string torch_setup;
  app.add_option("--steps", steps, "timed steps per setup per round (a multiple of 10 keeps rounds alike)")
      ->check(CLI::PositiveNumber);
  app.add_option("--rounds", rounds, "rounds: proplab's setups interleaved step by step, then PyTorch")
      ->check(CLI::PositiveNumber);
  app.add_option("--threads", threads_arg, "threads (0: all cores)")->check(CLI::NonNegativeNumber);
  app.add_option("--batch", batch, "images per step")->check(CLI::PositiveNumber);
  app.add_flag("--no-torch", no_torch, "skip the PyTorch reference");
  app.add_option("--torch-steps", torch_steps, "timed PyTorch steps per round")->check(CLI::PositiveNumber);
  app.add_option("--torch-setup", torch_setup,
                 "PyTorch thread setup 'intra,blas', eager (default: search the setups and eager/compiled)");
  CLI11_PARSE(app, argc, argv);

  set_threads(threads_arg);
  ResnetConfig config;
  config.depth = 20;
  config.in_channels = 1;
  config.image_size = 28;
  config.classes = 10;
  TrainConfig train;
  train.optimizer = OptimizerKind::sgd;
  train.momentum = 0.9;
  train.nesterov = true;
  train.weight_decay = 5e-4;
  const std::int64_t total_steps = 1000000;
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("proplab-bench-resnet-" + std::to_string(::getpid()));

  std::vector<Setup> setups;
  // The last: every step with every probe summed in a pass of its own, none inside the ops (bench::ApartSink).
  for (std::int64_t every : {0, 10, 1, -1}) {
    Setup s;
    s.every = every < 0 ? 1 : every;
    s.gather = every >= 0;
    s.label = bench::recording_label(every);
    s.model = std::make_unique<Resnet>(config, ScalingConfig{}, 1);
    s.optimizer = std::make_unique<Optimizer>(train, s.model->params());
    if (s.every > 0)
      bench::start_recording(*s.model, s.every, total_steps, dir, s.recorder, s.writer, s.gather ? "" : "-apart");
    setups.push_back(std::move(s));
  }
  for (Setup& s : setups) s.kernel = ops::conv_kernel();
  if (ops::conv_direct_supported() && ops::conv_kernel() != ops::ConvKernel::im2col) {
    // The same step with the next slower convolution setting (winograd → direct, direct → im2col), interleaved
    // with the others: the setting's gain.
    Setup s;
    const bool winograd = ops::conv_kernel() == ops::ConvKernel::winograd;
    s.label = winograd ? "off, direct convs" : "off, im2col convs";
    s.kernel = winograd ? ops::ConvKernel::direct : ops::ConvKernel::im2col;
    s.model = std::make_unique<Resnet>(config, ScalingConfig{}, 1);
    s.optimizer = std::make_unique<Optimizer>(train, s.model->params());
    setups.push_back(std::move(s));
  }
  Batch b{Tensor::empty({batch, 1, 28, 28}), Tensor::empty({batch}, DType::i32)};
  const CounterRng image_rng(1, 0), label_rng(1, 1);
  for (std::int64_t i = 0; i < b.inputs.numel(); ++i)
    b.inputs.f32()[i] = image_rng.normal(static_cast<std::uint64_t>(i));
  for (int i = 0; i < batch; ++i) b.targets.i32()[i] = static_cast<std::int32_t>(label_rng.below(i, 10));

  auto run_step = [&](Setup& s, bool timed) {
    ops::set_conv_kernel(s.kernel);
    const auto start = std::chrono::steady_clock::now();
    const bool record = s.recorder && s.recorder->records(s.step);
    if (record) s.recorder->begin_step();
    s.model->params().zero_grads();
    std::optional<bench::ApartSink> apart;
    if (record && !s.gather) apart.emplace(*s.recorder);
    ProbeSink* sink = !record ? nullptr : s.gather ? static_cast<ProbeSink*>(s.recorder.get()) : &*apart;
    StepContext context{1, static_cast<std::uint64_t>(s.step), true, sink};
    s.model->forward_backward(b, 1.0f, context);
    if (record) s.recorder->before_update();
    s.optimizer->step(0.1, record ? &s.recorder->update_norms() : nullptr);
    if (record) {
      s.recorder->after_update();
      s.recorder->write_record(*s.writer, s.step);
    }
    const double seconds = seconds_since(start);
    if (timed) {
      (record ? s.recorded_seconds : s.plain_seconds).push_back(seconds);
      (record ? s.round_recorded : s.round_plain).back().push_back(seconds);
    }
    ++s.step;
  };

  const char* wait_policy = std::getenv("OMP_WAIT_POLICY");
  std::printf("bench_resnet: ResNet-%d, %lld parameters, batch %d, %d threads, OMP_WAIT_POLICY=%s\n", config.depth,
              static_cast<long long>(setups[0].model->params().count_elements()), batch, threads(),
              wait_policy ? wait_policy : "(unset)");
  std::fflush(stdout);
  for (Setup& s : setups) {
    s.round_plain.emplace_back();
    s.round_recorded.emplace_back();
    for (int i = 0; i < warmup; ++i) run_step(s, false);
  }

  std::vector<bench::TorchYardstick> yardsticks;
  if (!no_torch) yardsticks = bench::find_yardsticks(PROPLAB_SOURCE_DIR, "resnet20", torch_steps, "", torch_setup);
  std::vector<double> off_rounds, every10_rounds;
  for (int r = 0; r < rounds; ++r) {
    for (Setup& s : setups) {
      if (r > 0) {
        s.round_plain.emplace_back();
        s.round_recorded.emplace_back();
      }
    }
    for (int i = 0; i < steps; ++i)
      for (Setup& s : setups) run_step(s, true);
    const double off = amortised_seconds(setups[0].round_plain.back(), setups[0].round_recorded.back(), 0);
    const double every10 = amortised_seconds(setups[1].round_plain.back(), setups[1].round_recorded.back(), 10);
    off_rounds.push_back(off);
    every10_rounds.push_back(every10);
    std::printf("round %d: proplab %.1f ms/step recording off, %.1f every 10", r + 1, off * 1e3, every10 * 1e3);
    for (bench::TorchYardstick& y : yardsticks) {
      if (const auto ms = y.round(torch_steps)) {
        y.round_ms.push_back(*ms);
        y.ratio.push_back(*ms / 1e3 / off);
        std::printf("; %s %.1f ms/step -> %.2fx", y.label.c_str(), *ms, y.ratio.back());
      }
    }
    std::printf("\n");
    std::fflush(stdout);
  }
  for (Setup& s : setups)
    if (s.writer) s.writer->finish(RunStatus::completed, "benchmark");
  std::filesystem::remove_all(dir);

  const double flops = setups[0].model->train_flops(batch);
  const double off = amortised_seconds(setups[0].plain_seconds, setups[0].recorded_seconds, 0);
  std::printf("ResNet-%d on 1x28x28, batch %d, %.2f GFLOP/step (convs + classifier, fwd+bwd); %d rounds x %d steps\n",
              config.depth, batch, flops / 1e9, rounds, steps);
  for (const Setup& s : setups) {
    const double t = amortised_seconds(s.plain_seconds, s.recorded_seconds, s.every);
    std::printf("  proplab %-18s: %7.1f ms/step  %7.1f images/s  %6.1f GFLOP/s", s.label.c_str(), t * 1e3, batch / t,
                flops / t / 1e9);
    if (s.every > 0)
      std::printf("  overhead %+5.1f%% (recorded steps: median %.1f ms)", 100.0 * (t / off - 1.0),
                  median(s.recorded_seconds) * 1e3);
    std::printf("\n");
  }
  for (const bench::TorchYardstick& y : yardsticks) {
    if (y.round_ms.empty()) continue;
    const double t = median(y.round_ms) / 1e3;
    std::vector<double> ratio_every10;
    for (std::size_t r = 0; r < y.round_ms.size() && r < every10_rounds.size(); ++r)
      ratio_every10.push_back(y.round_ms[r] / 1e3 / every10_rounds[r]);
    std::printf("  %-20s torch %s, intra,blas = %s %s: %7.1f ms/step  %7.1f images/s  %6.1f GFLOP/s\n", y.label.c_str(),
                y.version.empty() ? "?" : y.version.c_str(), y.setup.c_str(), y.variant.c_str(), t * 1e3, batch / t,
                flops / t / 1e9);
    std::printf(
        "  ratio to %s (median of rounds): proplab %.2fx its images/s recording off, %.2fx recording every 10\n",
        y.label.c_str(), median(y.ratio), median(ratio_every10));
  }
  return 0;
}
