// bench_train: the engine benchmark. Trains the reference model (transformer, 4 layers, width 256, 4 heads,
// seq 128, batch 8, vocab 256, fp32, AdamW; ~21 GFLOP per step) and reports ms/step, tokens/s and achieved
// GFLOP/s next to the sgemm rate measured at the model's own matrix shapes in the same run, then runs the
// identical model in PyTorch (bench/torch_reference.py, when torch is importable) and prints the ratio.
//
//   bench_train [--steps N] [--warmup N] [--threads N] [--no-torch] [--torch-steps N] [--layers/--width/...]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "data/dataset.h"
#include "models/model.h"
#include "ops/ops.h"
#include "sgemm_rate.h"
#include "train/optimizer.h"

#ifndef PROPLAB_SOURCE_DIR
#define PROPLAB_SOURCE_DIR "."
#endif

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

struct StepTiming {
  double median_s = 0.0;
  double best_s = 0.0;
};

}  // namespace

int main(int argc, char** argv) {
  using namespace proplab;
  CLI::App app{"proplab engine benchmark: the reference transformer, side by side with sgemm and PyTorch"};
  int steps = 20, warmup = 3, threads_arg = 0, torch_steps = 10;
  bool no_torch = false;
  TransformerConfig m;
  m.layers = 4;
  m.width = 256;
  m.heads = 4;
  m.ffn_mult = 4;
  m.vocab = 256;
  m.seq_len = 128;
  int batch = 8;
  app.add_option("--steps", steps, "timed steps (median reported)");
  app.add_option("--warmup", warmup, "untimed steps first");
  app.add_option("--threads", threads_arg, "threads (0: all cores)");
  app.add_flag("--no-torch", no_torch, "skip the PyTorch reference");
  app.add_option("--torch-steps", torch_steps, "timed steps per PyTorch thread setup");
  app.add_option("--layers", m.layers);
  app.add_option("--width", m.width);
  app.add_option("--heads", m.heads);
  app.add_option("--seq-len", m.seq_len);
  app.add_option("--batch", batch);
  CLI11_PARSE(app, argc, argv);

  set_threads(threads_arg);
  ModelConfig config;
  config.type = "transformer";
  config.transformer = m;
  std::unique_ptr<Model> model = make_model(config, ScalingConfig{}, 1);
  DataConfig data_config;
  data_config.kind = "uniform";
  auto data = make_token_dataset(data_config, m.vocab, m.seq_len, 1);
  TrainConfig train;
  train.lr = 1e-3;
  Optimizer optimizer(train, model->params());
  std::vector<Tensor*> grads;
  for (auto& p : model->params().all()) grads.push_back(&p->grad);
  Batch b;
  b.inputs = Tensor::empty({batch, m.seq_len}, DType::i32);
  b.targets = Tensor::empty({batch, m.seq_len}, DType::i32);

  std::vector<double> times;
  for (int s = 0; s < warmup + steps; ++s) {
    data->batch(Split::train, s, b.inputs, b.targets);
    const auto start = std::chrono::steady_clock::now();
    model->params().zero_grads();
    model->forward_backward(b, 1.0f, StepContext{1, static_cast<std::uint64_t>(s), true});
    ops::clip_grad_norm(grads, 1.0);
    optimizer.step(1e-3);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (s >= warmup) times.push_back(seconds);
  }
  const double step_s = median(times);
  const double flops = model->train_flops(batch);
  const double tokens = static_cast<double>(batch) * m.seq_len;

  bench::SgemmModelDims dims;
  dims.layers = m.layers;
  dims.width = m.width;
  dims.heads = m.heads;
  dims.ffn = m.ffn_mult * m.width;
  dims.vocab = m.vocab;
  dims.seq_len = m.seq_len;
  dims.batch = batch;
  const bench::SgemmStepRate sgemm = bench::measure_sgemm_rates(bench::step_sgemm_shapes(dims), threads());

  std::printf("proplab engine benchmark (%d threads)\n", threads());
  std::printf("  model: transformer layers=%d width=%d heads=%d seq=%d batch=%d vocab=%d, %.2f GFLOP/step\n",
              m.layers, m.width, m.heads, m.seq_len, batch, m.vocab, flops / 1e9);
  std::printf("  proplab   : %8.1f ms/step  %9.0f tokens/s  %6.1f GFLOP/s (median of %d steps, best %.1f ms)\n",
              step_s * 1e3, tokens / step_s, flops / step_s / 1e9, steps,
              *std::min_element(times.begin(), times.end()) * 1e3);
  std::printf("  sgemm     : %6.1f GFLOP/s at the model's shapes -> proplab reaches %.0f%% of it\n",
              sgemm.step_gflops, 100.0 * flops / step_s / 1e9 / sgemm.step_gflops);

  if (!no_torch) {
    std::ostringstream command;
    command << "/usr/bin/python3 " << PROPLAB_SOURCE_DIR << "/bench/torch_reference.py --json --steps " << torch_steps
            << " --layers " << m.layers << " --width " << m.width << " --heads " << m.heads << " --seq-len "
            << m.seq_len << " --batch " << batch << " 2>/dev/null";
    FILE* pipe = popen(command.str().c_str(), "r");
    std::string output;
    if (pipe) {
      char buffer[4096];
      while (std::fgets(buffer, sizeof buffer, pipe)) output += buffer;
      const int status = pclose(pipe);
      if (status != 0) output.clear();
    }
    const auto key = output.find("\"best_ms_per_step\"");
    if (key == std::string::npos) {
      std::printf("  pytorch   : not available (python3 with torch not importable)\n");
    } else {
      const double torch_ms = std::stod(output.substr(output.find(':', key) + 1));
      std::printf("  pytorch   : %8.1f ms/step  %9.0f tokens/s  (best thread setup)\n", torch_ms,
                  tokens / (torch_ms / 1e3));
      std::printf("  ratio     : proplab is %.2fx PyTorch's tokens/s\n", torch_ms / 1e3 / step_s);
    }
  }
  return 0;
}
