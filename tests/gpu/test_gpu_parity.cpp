// Whole runs on the GPU against the same runs on the CPU (the reference): for a Pre-LN, a Post-LN and a no-norm
// transformer, the MLP and a BatchNorm ResNet-20, 20 steps recording every statistic every step must agree — loss
// within 1e-4 relative, every recorded statistic within 1e-3 relative or 1e-6 absolute, the final parameters within
// 1e-4 (max |gpu − cpu| over a tensor, relative to its max |cpu| when that exceeds 1, absolute otherwise: AdamW
// normalises every update, so an entry whose gradient is little more than rounding noise — the key bias, whose
// gradient the softmax's shift invariance makes zero — moves by up to lr a step whichever way the device rounds
// it, and a relative test of a tensor of such small entries measures that noise). The same study twice on the GPU
// gives bitwise
// identical run files and checkpoints; a checkpoint taken on the GPU resumes on the CPU and back; running out of GPU
// memory ends the run failed, naming the allocation. The Pre-LN transformer with bf16 matrix products
// (device.precision = "bf16") follows the CPU's fp32 run within a looser loss tolerance (kBf16LossTolerance) and
// says so in its run file. Every test skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/checkpoint.h"
#include "io/run_reader.h"
#include "support/temp_dir.h"
#include "train/trainer.h"

namespace proplab {
namespace {

using testing::TempDir;

#define SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU: the GPU-against-CPU runs need one"

RunSpec transformer_spec(const std::string& name, NormPlacement norm, float dropout) {
  RunSpec spec;
  spec.name = name;
  spec.seed = 11;
  spec.model.set_kind(ModelKind::transformer);
  TransformerConfig& m = spec.model.transformer();
  m.layers = 4;
  m.width = 64;
  m.heads = 4;
  m.ffn_mult = 4;
  m.vocab = 96;
  m.seq_len = 32;
  m.norm = norm;
  m.dropout = dropout;
  spec.data.kind = "markov";
  spec.train.steps = 20;
  spec.train.batch = 8;
  spec.train.lr = 1e-3;
  spec.train.eval_every = 10;
  spec.train.eval_batches = 2;
  spec.record.every = 1;
  spec.config_toml = "name = \"" + name + "\"";
  return spec;
}

RunSpec mlp_spec() {
  RunSpec spec;
  spec.name = "mlp";
  spec.seed = 12;
  spec.model.set_kind(ModelKind::mlp);
  MlpConfig& m = spec.model.mlp();
  m.layers = 6;
  m.width = 128;
  m.input_dim = 32;
  m.outputs = 10;
  m.residual = true;
  spec.data.kind = "gaussian";
  spec.train.steps = 20;
  spec.train.batch = 64;
  spec.train.lr = 1e-3;
  spec.train.eval_every = 10;
  spec.train.eval_batches = 2;
  spec.record.every = 1;
  spec.config_toml = "name = \"mlp\"";
  return spec;
}

RunSpec resnet_spec() {
  RunSpec spec;
  spec.name = "resnet20";
  spec.seed = 13;
  spec.model.set_kind(ModelKind::resnet);
  ResnetConfig& m = spec.model.resnet();
  m.depth = 20;
  m.image_size = 32;
  spec.data.kind = "images";
  spec.train.optimizer = OptimizerKind::sgd;
  spec.train.steps = 20;
  spec.train.batch = 32;
  // (a gentle rate: at 0.05 this small-batch run is chaotic enough that float rounding alone grows past 1e-4
  // in the loss within 20 steps, which would test the dynamics, not the device)
  spec.train.lr = 0.01;
  spec.train.eval_every = 10;
  spec.train.eval_batches = 1;
  spec.record.every = 1;
  spec.config_toml = "name = \"resnet20\"";
  return spec;
}

RunSummary run_on(RunSpec spec, const char* device, const std::filesystem::path& out, std::int64_t stop_after = -1,
                  bool resume = false) {
  spec.device.type = device;
  RunOptions options;
  options.out_dir = out;
  options.stop_after = stop_after;
  options.resume = resume;
  options.force = !resume;
  return run_training(spec, options);
}

// A dataset's values, row-major (/train/loss is one-dimensional, the statistics [records, columns]).
std::vector<double> flat(const RunReader& reader, const std::string& path) {
  if (reader.dataset_shape(path).size() == 1) return reader.read_doubles(path);
  return reader.read_2d(path).values;
}

bool close(double gpu, double cpu, double rel, double abs) {
  if (std::isnan(gpu) || std::isnan(cpu)) return std::isnan(gpu) && std::isnan(cpu);
  if (std::isinf(gpu) || std::isinf(cpu)) return gpu == cpu;
  return std::abs(gpu - cpu) <= std::max(rel * std::abs(cpu), abs);
}

// Every dataset under /forward, /backward and /params, and /train/loss, of two run files.
std::vector<std::string> compared_datasets(const RunReader& reader) {
  std::vector<std::string> out = {"/train/loss"};
  for (const char* group : {"/forward", "/backward", "/params"})
    if (reader.exists(group))
      for (const std::string& name : reader.list(group))
        if (name != "name") out.push_back(std::string(group) + "/" + name);
  return out;
}

void expect_runs_agree(const std::filesystem::path& gpu_file, const std::filesystem::path& cpu_file) {
  const RunReader gpu = RunReader::open(gpu_file), cpu = RunReader::open(cpu_file);
  EXPECT_EQ(gpu.status(), RunStatus::completed);
  for (const std::string& path : compared_datasets(cpu)) {
    const bool loss = path == "/train/loss";
    const std::vector<double> a = flat(gpu, path), b = flat(cpu, path);
    ASSERT_EQ(a.size(), b.size()) << path;
    std::int64_t failures = 0;
    double worst = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      if (close(a[i], b[i], loss ? 1e-4 : 1e-3, loss ? 0.0 : 1e-6)) continue;
      worst = std::max(worst, std::abs(a[i] - b[i]) / std::max(std::abs(b[i]), 1e-300));
      if (++failures <= 3) ADD_FAILURE() << path << "[" << i << "]: gpu " << a[i] << " vs cpu " << b[i];
    }
    EXPECT_EQ(failures, 0) << path << ": " << failures << " of " << a.size() << " differ; worst relative " << worst;
  }
}

void expect_parameters_agree(const std::filesystem::path& gpu_ckpt, const std::filesystem::path& cpu_ckpt) {
  const Checkpoint gpu = read_checkpoint(gpu_ckpt), cpu = read_checkpoint(cpu_ckpt);
  for (const auto& [key, tensor] : cpu.tensors) {
    if (key.rfind("param/", 0) != 0) continue;
    ASSERT_TRUE(gpu.tensors.count(key)) << key;
    const std::vector<float> a = gpu.tensors.at(key).to_vector(), b = tensor.to_vector();
    ASSERT_EQ(a.size(), b.size()) << key;
    double max_b = 0.0, max_diff = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      max_b = std::max(max_b, std::abs(static_cast<double>(b[i])));
      max_diff = std::max(max_diff, std::abs(static_cast<double>(a[i]) - b[i]));
    }
    EXPECT_LE(max_diff, 1e-4 * std::max(max_b, 1.0))
        << key << ": max |gpu - cpu| " << max_diff << ", max |cpu| " << max_b;
  }
}

void expect_parity(const RunSpec& spec) {
  TempDir gpu_dir, cpu_dir;
  const RunSummary gpu = run_on(spec, "cuda", gpu_dir.path());
  const RunSummary cpu = run_on(spec, "cpu", cpu_dir.path());
  ASSERT_EQ(gpu.status, RunStatus::completed) << gpu.detail;
  ASSERT_EQ(cpu.status, RunStatus::completed) << cpu.detail;
  expect_runs_agree(run_file_path(gpu_dir.path(), spec.name), run_file_path(cpu_dir.path(), spec.name));
  expect_parameters_agree(checkpoint_path(gpu_dir.path(), spec.name), checkpoint_path(cpu_dir.path(), spec.name));
}

TEST(GpuParity, PreLnTransformerMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  expect_parity(transformer_spec("preln", NormPlacement::pre, 0.1f));
}

TEST(GpuParity, PostLnTransformerMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  expect_parity(transformer_spec("postln", NormPlacement::post, 0.0f));
}

TEST(GpuParity, NoNormTransformerMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  expect_parity(transformer_spec("nonorm", NormPlacement::none, 0.0f));
}

TEST(GpuParity, MlpMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  expect_parity(mlp_spec());
}

TEST(GpuParity, BatchNormResnet20MatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  expect_parity(resnet_spec());
}

// bf16 keeps 8 significant bits, so every linear layer's operands move by up to 2^-9 relative (≈ 2e-3); over 20
// AdamW steps of the small Pre-LN transformer the loss is expected to stay within a few 1e-3 of the fp32 run. 2e-2
// relative per step is the stated bound; it is to be confirmed (and tightened if the margin is wide) on the first
// GPU run.
constexpr double kBf16LossTolerance = 2e-2;

TEST(GpuParity, Bf16PreLnTransformerFollowsTheCpuFp32Run) {
  SKIP_WITHOUT_GPU();
  RunSpec spec = transformer_spec("preln_bf16", NormPlacement::pre, 0.1f);
  TempDir gpu_dir, cpu_dir;
  spec.device.precision = "bf16";
  const RunSummary gpu = run_on(spec, "cuda", gpu_dir.path());
  spec.device.precision = "fp32";
  const RunSummary cpu = run_on(spec, "cpu", cpu_dir.path());
  ASSERT_EQ(gpu.status, RunStatus::completed) << gpu.detail;
  ASSERT_EQ(cpu.status, RunStatus::completed) << cpu.detail;
  const RunReader gpu_file = RunReader::open(run_file_path(gpu_dir.path(), spec.name));
  const RunReader cpu_file = RunReader::open(run_file_path(cpu_dir.path(), spec.name));
  EXPECT_EQ(gpu_file.attribute_string("precision"), "bf16");
  EXPECT_EQ(cpu_file.attribute_string("precision"), "fp32");
  const TrainCurves a = gpu_file.read_train(), b = cpu_file.read_train();
  ASSERT_EQ(a.size(), b.size());
  ASSERT_EQ(a.size(), 20u);
  double worst = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(std::isfinite(a.loss[i])) << "step " << a.step[i];
    worst = std::max(worst, std::abs(a.loss[i] - b.loss[i]) / std::abs(b.loss[i]));
    EXPECT_TRUE(close(a.loss[i], b.loss[i], kBf16LossTolerance, 0.0))
        << "step " << a.step[i] << ": bf16 gpu " << a.loss[i] << " vs fp32 cpu " << b.loss[i];
  }
  // The measured margin, for confirming the bound.
  RecordProperty("worst_relative_loss_difference", std::to_string(worst));
  std::cout << "bf16 vs fp32: worst relative loss difference over 20 steps " << worst << "\n";
}

TEST(GpuParity, SameSeedOnTheGpuIsBitwiseIdentical) {
  SKIP_WITHOUT_GPU();
  const RunSpec spec = transformer_spec("det", NormPlacement::pre, 0.1f);
  TempDir a, b;
  ASSERT_EQ(run_on(spec, "cuda", a.path()).status, RunStatus::completed);
  ASSERT_EQ(run_on(spec, "cuda", b.path()).status, RunStatus::completed);
  const RunReader ra = RunReader::open(run_file_path(a.path(), "det")),
                  rb = RunReader::open(run_file_path(b.path(), "det"));
  for (const std::string& path : compared_datasets(ra)) {
    const std::vector<double> x = flat(ra, path), y = flat(rb, path);
    ASSERT_EQ(x.size(), y.size()) << path;
    EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * sizeof(double)), 0) << path << " differs between runs";
  }
  const Checkpoint ca = read_checkpoint(checkpoint_path(a.path(), "det"));
  const Checkpoint cb = read_checkpoint(checkpoint_path(b.path(), "det"));
  for (const auto& [key, tensor] : ca.tensors) {
    const std::vector<float> x = tensor.to_vector(), y = cb.tensors.at(key).to_vector();
    EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)), 0) << key << " differs between runs";
  }
}

TEST(GpuParity, CheckpointsMoveBetweenGpuAndCpu) {
  SKIP_WITHOUT_GPU();
  const RunSpec spec = transformer_spec("move", NormPlacement::pre, 0.0f);
  TempDir straight, gpu_then_cpu, cpu_then_gpu;
  ASSERT_EQ(run_on(spec, "cuda", straight.path()).status, RunStatus::completed);
  // (--stop-after ends a run "failed", resumable, with a checkpoint at the step)
  const RunSummary first_gpu = run_on(spec, "cuda", gpu_then_cpu.path(), 10);
  ASSERT_NE(first_gpu.detail.find("(--stop-after)"), std::string::npos) << first_gpu.detail;
  const RunSummary on_cpu = run_on(spec, "cpu", gpu_then_cpu.path(), -1, true);
  ASSERT_EQ(on_cpu.status, RunStatus::completed) << on_cpu.detail;
  const RunSummary first_cpu = run_on(spec, "cpu", cpu_then_gpu.path(), 10);
  ASSERT_NE(first_cpu.detail.find("(--stop-after)"), std::string::npos) << first_cpu.detail;
  const RunSummary on_gpu = run_on(spec, "cuda", cpu_then_gpu.path(), -1, true);
  ASSERT_EQ(on_gpu.status, RunStatus::completed) << on_gpu.detail;
  const TrainCurves reference = RunReader::open(run_file_path(straight.path(), "move")).read_train();
  for (const auto* dir : {&gpu_then_cpu, &cpu_then_gpu}) {
    const TrainCurves moved = RunReader::open(run_file_path(dir->path(), "move")).read_train();
    ASSERT_EQ(moved.size(), reference.size());
    for (std::size_t i = 0; i < moved.size(); ++i)
      EXPECT_TRUE(close(moved.loss[i], reference.loss[i], 1e-4, 0.0))
          << "step " << moved.step[i] << ": " << moved.loss[i] << " vs " << reference.loss[i];
  }
}

TEST(GpuParity, OutOfMemoryEndsTheRunFailedNamingTheAllocation) {
  SKIP_WITHOUT_GPU();
  // The logits alone are 4096·1024 rows × 50257 × 4 bytes ≈ 840 GB: more than any GPU holds.
  RunSpec spec = transformer_spec("oom", NormPlacement::pre, 0.0f);
  TransformerConfig& m = spec.model.transformer();
  m.layers = 1;
  m.vocab = 50257;
  m.seq_len = 1024;
  spec.data.kind = "uniform";
  spec.train.batch = 4096;
  spec.theory.input_corr = 0.0;  // (not measured: that would embed the huge first batch on the host)
  TempDir dir;
  const RunSummary summary = run_on(spec, "cuda", dir.path());
  EXPECT_EQ(summary.status, RunStatus::failed);
  EXPECT_TRUE(summary.out_of_memory);
  EXPECT_NE(summary.detail.find("out of GPU memory allocating"), std::string::npos) << summary.detail;
  EXPECT_NE(summary.detail.find("free of"), std::string::npos) << summary.detail;
  EXPECT_EQ(RunReader::open(run_file_path(dir.path(), "oom")).status(), RunStatus::failed);
}

}  // namespace
}  // namespace proplab
