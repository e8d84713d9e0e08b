// bench_gpu: a study trained on the GPU, timed with recording off, every 10 steps and every step (every statistic,
// into a real run file), one after another on the same card. For each: the median step time after the warm-up
// steps, tokens (samples) per second, achieved TFLOP/s and the model FLOP utilisation against --peak-tflops, and
// the peak GPU memory the run held. Prints a table and one JSON line per setting (for scripts/gpu-check.sh).
//
//   bench_gpu STUDY [--steps N] [--warmup N] [--batch B] [--peak-tflops T] [--modes off,10,1] [--out DIR]
//
// --peak-tflops is the card's dense peak for the precision the run computes in (H200: 67 fp32 without tensor cores,
// 989 bf16 tensor-core dense). Needs a GPU; exits 2 naming what is missing otherwise.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "bench_util.h"
#include "core/device.h"
#include "core/error.h"
#include "io/run_reader.h"
#include "models/model.h"
#include "study/run_spec.h"
#include "study/study.h"
#include "train/trainer.h"

namespace {

using namespace proplab;

struct Timing {
  std::string mode;
  double step_ms = 0.0, tokens_per_s = 0.0, tflops = 0.0, mfu = 0.0;
  std::size_t peak_bytes = 0;
  std::string status;
};

using bench::median;

Timing time_mode(RunSpec spec, const std::string& mode, std::int64_t warmup, std::int64_t steps, double flops_per_step,
                 double peak_tflops, const std::filesystem::path& out) {
  Timing t;
  t.mode = mode;
  spec.name = "bench_" + mode;
  spec.device.type = "cuda";
  spec.train.steps = warmup + steps;
  spec.train.warmup = 0;
  spec.train.eval_every = spec.train.steps;
  spec.train.eval_batches = 1;
  spec.train.checkpoint_every = 0;
  spec.record.every = mode == "off" ? spec.train.steps + 1 : std::stoll(mode);
  spec.record.forward.clear();
  spec.record.backward.clear();
  spec.record.params.clear();
  RunOptions options;
  options.out_dir = out;
  options.force = true;
  reset_peak_device_memory();
  const RunSummary summary = run_training(spec, options);
  t.peak_bytes = device_memory_stats().peak_in_use;
  t.status = run_status_name(summary.status);
  const TrainCurves curves = RunReader::open(summary.run_file).read_train();
  std::vector<double> seconds;
  for (std::size_t i = 1; i < curves.size(); ++i)
    if (curves.step[i] > warmup) seconds.push_back(curves.wall_time[i] - curves.wall_time[i - 1]);
  const double step_s = median(seconds);
  t.step_ms = step_s * 1e3;
  const double tokens = static_cast<double>(spec.train.batch) *
                        (spec.model.kind() == ModelKind::transformer ? spec.model.transformer().seq_len : 1);
  t.tokens_per_s = step_s > 0 ? tokens / step_s : 0.0;
  t.tflops = step_s > 0 ? flops_per_step / step_s / 1e12 : 0.0;
  t.mfu = peak_tflops > 0 ? t.tflops / peak_tflops : 0.0;
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_gpu: a study trained on the GPU with recording off, every 10 steps and every step"};
  std::string study_path, modes_text = "off,10,1", out = "bench-gpu-runs";
  std::int64_t steps = 20, warmup = 3, batch = 0;
  double peak_tflops = 67.0;
  app.add_option("study", study_path, "the study file")->required();
  app.add_option("--steps", steps, "timed steps per setting");
  app.add_option("--warmup", warmup, "untimed steps first (allocation, algorithm choice)");
  app.add_option("--batch", batch, "train.batch (0: the study's)");
  app.add_option("--peak-tflops", peak_tflops, "the card's dense peak for the run's precision, for MFU");
  app.add_option("--modes", modes_text, "recording settings: off, or every N steps");
  app.add_option("--out", out, "where the run files go");
  CLI11_PARSE(app, argc, argv);
  try {
    if (!cuda_available()) throw UserError("no CUDA GPU is present (or this build has no CUDA backend)");
    RunSpec spec = to_run_spec(load_study(study_path));
    if (batch > 0) spec.train.batch = batch;
    // FLOPs of one step from the model's own count (every matrix product, forward and backward).
    const double flops_per_step = make_model(spec.model, spec.scaling, spec.seed)->train_flops(spec.train.batch);
    const GpuInfo gpu = gpu_info();
    std::printf("bench_gpu: %s on %s, batch %lld, %.3g TFLOP a step, %lld timed steps after %lld\n", spec.name.c_str(),
                gpu.name.c_str(), static_cast<long long>(spec.train.batch), flops_per_step / 1e12,
                static_cast<long long>(steps), static_cast<long long>(warmup));
    std::vector<Timing> timings;
    std::stringstream modes(modes_text);
    for (std::string mode; std::getline(modes, mode, ',');)
      timings.push_back(time_mode(spec, mode, warmup, steps, flops_per_step, peak_tflops, out));
    std::printf("%-8s %10s %14s %9s %7s %12s %s\n", "record", "ms/step", "tokens/s", "TFLOP/s", "MFU", "peak mem",
                "status");
    for (const Timing& t : timings)
      std::printf("%-8s %10.2f %14.0f %9.2f %6.1f%% %12s %s\n", t.mode.c_str(), t.step_ms, t.tokens_per_s, t.tflops,
                  100 * t.mfu, format_bytes(t.peak_bytes).c_str(), t.status.c_str());
    const double base = timings.empty() ? 0.0 : timings.front().step_ms;
    for (const Timing& t : timings) {
      std::printf(
          "{\"bench\": \"bench_gpu\", \"study\": \"%s\", \"gpu\": \"%s\", \"batch\": %lld, \"record\": \"%s\", "
          "\"step_ms\": %.4f, \"tokens_per_s\": %.1f, \"tflops\": %.3f, \"mfu\": %.4f, \"peak_bytes\": %zu, "
          "\"overhead_vs_first\": %.4f, \"status\": \"%s\"}\n",
          spec.name.c_str(), gpu.name.c_str(), static_cast<long long>(spec.train.batch), t.mode.c_str(), t.step_ms,
          t.tokens_per_s, t.tflops, t.mfu, t.peak_bytes, base > 0 ? t.step_ms / base - 1.0 : 0.0, t.status.c_str());
    }
  } catch (const UserError& e) {
    std::fprintf(stderr, "bench_gpu: error: %s\n", e.what());
    return 2;
  }
  return 0;
}
