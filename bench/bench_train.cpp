// bench_train: the engine benchmark. Trains the reference model (transformer, 4 layers, width 256, 4 heads,
// seq 128, batch 8, vocab 256, fp32, AdamW; ~21 GFLOP per step) and reports, side by side in one run:
//   - ms/step, tokens/s and achieved GFLOP/s with recording off, every 10 steps and every step (all statistics,
//     written to a real run file; the ops that can sum their tensors inside their own loops do, ops::OpMoments),
//     every step with every probe summed in a pass of its own ("every, ops apart"), and, where ops::sgemm runs on
//     oneDNN, recording off on OpenBLAS, interleaved step by step so machine noise hits all alike (medians);
//   - the sgemm rate measured at the model's own matrix shapes (bench/sgemm_rate.h), as the ceiling;
//   - the identical model in PyTorch (bench/torch_reference.py) under PyTorch 2.x from the bench virtual
//     environment (bench/make-torch-venv.sh; PROPLAB_TORCH_PYTHON names another interpreter) and under Debian's
//     1.13: each searches its thread setups and (2.x) eager against torch.compile once, with and without hooks
//     computing mean/var/max on every module, then its fastest runs once per round; each round prints its ratio
//     (PyTorch ms/step over proplab's, recording off), the summary is the median over rounds.
//
//   bench_train [--steps N] [--rounds N] [--threads N] [--no-torch] [--torch-steps N]
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "bench_util.h"
#include "core/parallel.h"
#include "data/dataset.h"
#include "models/model.h"
#include "ops/gemm.h"
#include "ops/ops.h"
#include "sgemm_rate.h"
#include "train/optimizer.h"
#include "train/recorder.h"

#ifndef PROPLAB_SOURCE_DIR
#define PROPLAB_SOURCE_DIR "."
#endif

namespace {

using namespace proplab;

using bench::median;

// One training setup: a model, its optimizer and (when recording) a recorder writing a real run file.
struct Setup {
  std::string label;
  std::int64_t every = 0;  // 0: recording off
  bool gather = true;      // probes summed inside the ops that take them (ProbeSink::gathered)
  ops::GemmBackend gemm = ops::GemmBackend::openblas;
  std::unique_ptr<Model> model;
  std::unique_ptr<Optimizer> optimizer;
  std::unique_ptr<Recorder> recorder;
  std::optional<RunWriter> writer;
  std::vector<Tensor*> grads;
  std::vector<double> seconds;
  std::vector<double> sink_seconds, record_seconds;  // recorded steps: moments, and parameter stats + file
  std::vector<double> pass_seconds, update_seconds;  // every timed step: forward + backward, and the update
  std::int64_t step = 0;
};

// Times every call into the recorder (the probe sink) so the recording cost can be split into its parts.
class TimedSink final : public ProbeSink {
 public:
  TimedSink(Recorder& recorder, bool gather) : recorder_(recorder), gather_(gather) {}
  void forward(int probe, const Tensor& x, std::int64_t sequences) override {
    const auto start = std::chrono::steady_clock::now();
    recorder_.forward(probe, x, sequences);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  void backward(int probe, const Tensor& d_x, std::int64_t sequences) override {
    const auto start = std::chrono::steady_clock::now();
    recorder_.backward(probe, d_x, sequences);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  void attention_logits(int probe, const probe::LogitSums& sums, const Tensor& qkv, int heads, float scale) override {
    recorder_.attention_logits(probe, sums, qkv, heads, scale);
  }
  // Sums the ops gather inside their own loops (when `gather`): their time is the ops', not counted in `seconds`.
  probe::MomentSums* gathered(int probe, bool backward, probe::StatSelection& which) override {
    return gather_ ? recorder_.gathered(probe, backward, which) : nullptr;
  }
  double seconds = 0.0;  // inside the recorder's moment accumulation, summed over calls

 private:
  Recorder& recorder_;
  bool gather_;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"proplab engine benchmark: the reference transformer beside sgemm and PyTorch"};
  int steps = 10, rounds = 3, warmup = 2, threads_arg = 0, torch_steps = 10;
  bool no_torch = false;
  app.add_option("--steps", steps, "timed steps per setup per round");
  app.add_option("--rounds", rounds, "rounds (each: --steps steps of every setup, interleaved; an sgemm measurement)");
  app.add_option("--threads", threads_arg, "threads (0: all cores)");
  app.add_flag("--no-torch", no_torch, "skip the PyTorch reference");
  app.add_option("--torch-steps", torch_steps, "timed steps per PyTorch thread setup and per round");
  CLI11_PARSE(app, argc, argv);

  set_threads(threads_arg);
  ModelConfig config;
  config.set_kind(ModelKind::transformer);
  TransformerConfig& m = config.transformer();
  m.layers = 4;
  m.width = 256;
  m.heads = 4;
  m.ffn_mult = 4;
  m.vocab = 256;
  m.seq_len = 128;
  const int batch = 8;
  DataConfig data_config;
  data_config.kind = "uniform";
  auto data = make_token_dataset(data_config, m.vocab, m.seq_len, 1);
  TrainConfig train;
  const std::int64_t total_steps = 1000000;
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("proplab-bench-" + std::to_string(::getpid()));

  std::vector<Setup> setups;
  // The last: every step with every probe summed in a pass of its own, none inside the ops (ops::OpMoments).
  for (std::int64_t every : {0, 10, 1, -1}) {
    Setup s;
    s.every = every < 0 ? 1 : every;
    s.gather = every >= 0;
    s.label = bench::recording_label(every);
    s.model = make_model(config, ScalingConfig{}, 1);
    s.optimizer = std::make_unique<Optimizer>(train, s.model->params());
    for (auto& p : s.model->params().all()) s.grads.push_back(&p->grad);
    if (s.every > 0)
      bench::start_recording(*s.model, s.every, total_steps, dir, s.recorder, s.writer, s.gather ? "" : "-apart");
    setups.push_back(std::move(s));
  }
  for (Setup& s : setups) s.gemm = ops::gemm_backend();
  if (ops::gemm_backend() != ops::GemmBackend::openblas) {
    // The same step on OpenBLAS, interleaved with the others: what the faster GEMM library buys.
    Setup s;
    s.label = "off, OpenBLAS";
    s.gemm = ops::GemmBackend::openblas;
    s.model = make_model(config, ScalingConfig{}, 1);
    s.optimizer = std::make_unique<Optimizer>(train, s.model->params());
    for (auto& p : s.model->params().all()) s.grads.push_back(&p->grad);
    setups.push_back(std::move(s));
  }
  Batch b;
  b.inputs = Tensor::empty({batch, m.seq_len}, DType::i32);
  b.targets = Tensor::empty({batch, m.seq_len}, DType::i32);
  auto run_steps = [&](Setup& s, int count, bool timed) {
    ops::set_gemm_backend(s.gemm);
    for (int i = 0; i < count; ++i, ++s.step) {
      data->batch(Split::train, s.step, b.inputs, b.targets);
      const auto start = std::chrono::steady_clock::now();
      const bool record = s.recorder && s.recorder->records(s.step);
      if (record) s.recorder->begin_step();
      s.model->params().zero_grads();
      std::optional<TimedSink> sink;
      if (record) sink.emplace(*s.recorder, s.gather);
      StepContext context{1, static_cast<std::uint64_t>(s.step), true, record ? &*sink : nullptr};
      s.model->forward_backward(b, 1.0f, context);
      const auto pass_end = std::chrono::steady_clock::now();
      ops::clip_grad_norm(s.grads, 1.0);
      const auto update_start = std::chrono::steady_clock::now();
      if (record) s.recorder->before_update();
      s.optimizer->step(1e-3, record ? &s.recorder->update_norms() : nullptr);
      const auto update_end = std::chrono::steady_clock::now();
      double record_seconds = 0.0;
      if (record) {
        const auto write_start = std::chrono::steady_clock::now();
        s.recorder->after_update();
        s.recorder->write_record(*s.writer, s.step);
        record_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - write_start).count();
      }
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (timed) {
        s.seconds.push_back(seconds);
        s.pass_seconds.push_back(std::chrono::duration<double>(pass_end - start).count());
        s.update_seconds.push_back(std::chrono::duration<double>(update_end - update_start).count());
        if (record) {
          s.sink_seconds.push_back(sink->seconds);
          s.record_seconds.push_back(record_seconds);
        }
      }
    }
  };
  for (Setup& s : setups) run_steps(s, warmup, false);
  bench::SgemmModelDims dims;
  dims.layers = m.layers;
  dims.width = m.width;
  dims.heads = m.heads;
  dims.ffn = m.ffn_mult * m.width;
  dims.vocab = m.vocab;
  dims.seq_len = m.seq_len;
  dims.batch = batch;
  std::vector<bench::TorchYardstick> yardsticks;
  if (!no_torch) yardsticks = bench::find_yardsticks(PROPLAB_SOURCE_DIR, "transformer", torch_steps, "--hooks");
  std::vector<double> sgemm_rates, sgemm_linear_rates;
  for (int r = 0; r < rounds; ++r) {
    // One step of each setup in turn, so bursts of machine noise hit all three alike.
    const std::size_t first = setups[0].seconds.size();
    for (int i = 0; i < steps; ++i)
      for (Setup& s : setups) run_steps(s, 1, true);
    ops::set_gemm_backend(setups[0].gemm);  // the ceiling of the library the main setups use
    const bench::SgemmStepRate sgemm = bench::measure_sgemm_rates(bench::step_sgemm_shapes(dims), threads(), 5);
    sgemm_rates.push_back(sgemm.step_gflops);
    sgemm_linear_rates.push_back(sgemm.group_gflops(bench::SgemmGroup::linear));
    const double round_off = median(
        std::vector<double>(setups[0].seconds.begin() + static_cast<std::ptrdiff_t>(first), setups[0].seconds.end()));
    std::printf("round %d: proplab %.1f ms/step recording off", r + 1, round_off * 1e3);
    for (bench::TorchYardstick& y : yardsticks) {
      if (const auto ms = y.round(torch_steps)) {
        y.round_ms.push_back(*ms);
        y.ratio.push_back(*ms / 1e3 / round_off);
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
  const double tokens = static_cast<double>(batch) * m.seq_len;
  const double off = median(setups[0].seconds);
  const double sgemm_rate = median(sgemm_rates), sgemm_linear = median(sgemm_linear_rates);
  ops::set_gemm_backend(setups[0].gemm);
  std::printf("proplab engine benchmark: %d threads, %d rounds x %d steps per setup, sgemm: %s\n", threads(), rounds,
              steps, ops::gemm_backend_name().c_str());
  std::printf(
      "  model: transformer layers=%d width=%d heads=%d seq=%d batch=%d vocab=%d, %.2f GFLOP/step "
      "(attention counted as full T x T)\n",
      m.layers, m.width, m.heads, m.seq_len, batch, m.vocab, flops / 1e9);
  for (const Setup& s : setups) {
    const double t = median(s.seconds);
    std::printf("  %-18s: %7.1f ms/step  %7.0f tokens/s  %6.1f GFLOP/s", s.label.c_str(), t * 1e3, tokens / t,
                flops / t / 1e9);
    if (s.every > 0) std::printf("  overhead %+5.1f%%", 100.0 * (t / off - 1.0));
    std::printf("\n");
    if (s.every == 1) {
      std::printf("    (per recorded step: %.1f ms accumulating moments, %.1f ms parameter statistics + writing)\n",
                  median(s.sink_seconds) * 1e3, median(s.record_seconds) * 1e3);
      // Where the rest goes: forward + backward beyond the moments (the attention's logit sums, caches the
      // moments' passes evicted) and the update (gradient statistics, the optimizer's update norms).
      const Setup& o = setups.front();
      std::printf("    (against recording off: forward + backward %+.1f ms, of which moments %.1f; update %+.1f ms)\n",
                  (median(s.pass_seconds) - median(o.pass_seconds)) * 1e3, median(s.sink_seconds) * 1e3,
                  (median(s.update_seconds) - median(o.update_seconds)) * 1e3);
    }
  }
  std::printf(
      "  sgemm at the model's shapes: %.1f GFLOP/s (linear-layer shapes only: %.1f) -> proplab reaches "
      "%.0f%% (%.0f%%)\n",
      sgemm_rate, sgemm_linear, 100.0 * flops / off / 1e9 / sgemm_rate, 100.0 * flops / off / 1e9 / sgemm_linear);

  for (const bench::TorchYardstick& y : yardsticks) {
    if (y.round_ms.empty()) continue;
    const double t = median(y.round_ms) / 1e3;
    std::printf("  %s, torch %s, intra,blas = %s %s: %7.1f ms/step  %7.0f tokens/s\n", y.label.c_str(),
                y.version.c_str(), y.setup.c_str(), y.variant.c_str(), t * 1e3, tokens / t);
    std::printf(
        "  ratio to %s (median of rounds): proplab %.2fx its tokens/s (recording off), %.2fx (recording "
        "every step)\n",
        y.label.c_str(), median(y.ratio), t / median(setups[2].seconds));
    if (const auto hooks = bench::json_number(y.search_output, "overhead_percent"))
      std::printf(
          "  %s mean/var/max hooks on every module (eager): overhead %+.1f%% (proplab, all statistics every "
          "step: %+.1f%%)\n",
          y.label.c_str(), *hooks, 100.0 * (median(setups[2].seconds) / off - 1.0));
  }
  return 0;
}
