// Training end to end through run_training: learning a Markov chain to its entropy rate, determinism (same seed,
// thread counts), bit-for-bit resume, and the learning-rate schedules.
#include <gtest/gtest.h>

#include <cmath>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/parallel.h"
#include "io/checkpoint.h"
#include "io/run_reader.h"
#include "train/optimizer.h"
#include "support/temp_dir.h"
#include "train/trainer.h"

namespace proplab {

namespace {

using testing::TempDir;

RunSpec tiny_spec(const std::string& name) {
  RunSpec spec;
  spec.name = name;
  spec.seed = 5;
  spec.model.set_kind(ModelKind::transformer);
  TransformerConfig& m = spec.model.transformer();
  m.layers = 2;
  m.width = 16;
  m.heads = 2;
  m.ffn_mult = 2;
  m.vocab = 16;
  m.seq_len = 8;
  spec.data.kind = "markov";
  spec.data.markov_successors = 3;
  spec.train.steps = 16;
  spec.train.batch = 4;
  spec.train.lr = 3e-3;
  spec.train.eval_every = 5;
  spec.train.eval_batches = 2;
  spec.config_toml = "name = \"" + name + "\"  # test";
  return spec;
}

TrainCurves train_curves(const std::filesystem::path& file) { return RunReader::open(file).read_train(); }

void expect_same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i)
    EXPECT_EQ(std::memcmp(&a[i], &b[i], sizeof(double)), 0) << "entry " << i << ": " << a[i] << " vs " << b[i];
}

}  // namespace

TEST(Training, LearnsAMarkovChainToWithinFivePercentOfItsEntropyRate) {
  TempDir dir;
  RunSpec spec = tiny_spec("markov");
  TransformerConfig& m = spec.model.transformer();
  m.layers = 2;
  m.width = 64;
  m.heads = 4;
  m.ffn_mult = 4;
  m.vocab = 64;
  m.seq_len = 32;
  spec.train.steps = 600;
  spec.train.batch = 32;
  spec.train.lr = 3e-3;
  spec.train.schedule = ScheduleKind::cosine;
  spec.train.warmup = 20;
  spec.train.eval_every = 100;
  spec.train.eval_batches = 8;
  RunOptions options;
  options.out_dir = dir.path();
  RunSummary summary = run_training(spec, options);
  ASSERT_EQ(summary.status, RunStatus::completed);
  ASSERT_TRUE(summary.entropy_rate.has_value());
  ASSERT_TRUE(summary.last_eval_loss.has_value());
  // Uniform guessing would give log(64) = 4.16 nats; the chain's floor is its entropy rate.
  EXPECT_GT(*summary.last_eval_loss, *summary.entropy_rate * 0.97) << "below the entropy rate: a leak?";
  EXPECT_LT(*summary.last_eval_loss, *summary.entropy_rate * 1.05)
      << "validation loss " << *summary.last_eval_loss << " vs entropy rate " << *summary.entropy_rate;
}

TEST(Training, SameSeedGivesBitwiseIdenticalLossCurves) {
  TempDir a, b;
  RunSpec spec = tiny_spec("det");
  spec.model.transformer().dropout = 0.1f;
  RunOptions options;
  options.out_dir = a.path();
  run_training(spec, options);
  options.out_dir = b.path();
  run_training(spec, options);
  TrainCurves ca = train_curves(run_file_path(a.path(), "det")), cb = train_curves(run_file_path(b.path(), "det"));
  ASSERT_EQ(ca.size(), 16u);
  expect_same_bits(ca.loss, cb.loss);
  expect_same_bits(ca.grad_norm, cb.grad_norm);
  // A different seed gives a different run.
  TempDir c;
  spec.seed = 6;
  options.out_dir = c.path();
  run_training(spec, options);
  EXPECT_NE(train_curves(run_file_path(c.path(), "det")).loss, ca.loss);
}

TEST(Training, OneAndTwoThreadsGiveBitwiseIdenticalLossCurves) {
  TempDir one, two;
  RunSpec spec = tiny_spec("threads");
  // Wide enough that the matrix products and reductions really split across threads.
  spec.model.transformer().width = 64;
  spec.model.transformer().heads = 4;
  spec.model.transformer().seq_len = 32;
  spec.train.batch = 8;
  spec.train.grad_accum = 2;
  RunOptions options;
  spec.device.threads = 1;
  options.out_dir = one.path();
  run_training(spec, options);
  spec.device.threads = 2;
  options.out_dir = two.path();
  run_training(spec, options);
  TrainCurves c1 = train_curves(run_file_path(one.path(), "threads"));
  TrainCurves c2 = train_curves(run_file_path(two.path(), "threads"));
  expect_same_bits(c1.loss, c2.loss);
  expect_same_bits(c1.grad_norm, c2.grad_norm);
  set_threads(0);
}

TEST(Training, ResumeContinuesBitForBit) {
  for (OptimizerKind optimizer : {OptimizerKind::adamw, OptimizerKind::sgd}) {
    SCOPED_TRACE(optimizer == OptimizerKind::adamw ? "adamw" : "sgd");
    TempDir straight, halves;
    RunSpec spec = tiny_spec("resume");
    spec.train.optimizer = optimizer;
    spec.train.schedule = ScheduleKind::cosine;
    spec.train.warmup = 3;
    spec.train.grad_accum = 2;
    spec.model.transformer().dropout = 0.1f;
    spec.record.every = 4;
    RunOptions options;
    options.out_dir = straight.path();
    run_training(spec, options);

    options.out_dir = halves.path();
    options.stop_after = 7;
    RunSummary first = run_training(spec, options);
    EXPECT_EQ(first.status, RunStatus::failed);
    EXPECT_EQ(first.steps_done, 7);
    options.stop_after = -1;
    options.resume = true;
    RunSummary second = run_training(spec, options);
    EXPECT_EQ(second.status, RunStatus::completed);

    TrainCurves a = train_curves(run_file_path(straight.path(), "resume"));
    TrainCurves b = train_curves(run_file_path(halves.path(), "resume"));
    ASSERT_EQ(b.size(), 16u);
    EXPECT_EQ(a.step, b.step);
    expect_same_bits(a.loss, b.loss);
    expect_same_bits(a.lr, b.lr);
    expect_same_bits(a.grad_norm, b.grad_norm);
    EXPECT_EQ(RunReader::open(run_file_path(halves.path(), "resume")).read_eval().step,
              RunReader::open(run_file_path(straight.path(), "resume")).read_eval().step);
    // The recorded statistics continue too: same records, same values.
    RunReader ra = RunReader::open(run_file_path(straight.path(), "resume"));
    RunReader rb = RunReader::open(run_file_path(halves.path(), "resume"));
    EXPECT_EQ(ra.read_ints("/steps"), rb.read_ints("/steps"));
    expect_same_bits(ra.read_2d("/forward/var").values, rb.read_2d("/forward/var").values);
    expect_same_bits(ra.read_2d("/backward/kurtosis").values, rb.read_2d("/backward/kurtosis").values);
    expect_same_bits(ra.read_2d("/params/update_ratio").values, rb.read_2d("/params/update_ratio").values);
    Checkpoint ca = read_checkpoint(checkpoint_path(straight.path(), "resume"));
    Checkpoint cb = read_checkpoint(checkpoint_path(halves.path(), "resume"));
    ASSERT_EQ(ca.tensors.size(), cb.tensors.size());
    for (const auto& [name, tensor] : ca.tensors) {
      ASSERT_TRUE(cb.tensors.count(name)) << name;
      EXPECT_EQ(tensor.to_vector(), cb.tensors.at(name).to_vector()) << name;
    }
  }
}

TEST(Training, ResumeWithAnUnreadableRunFileLeavesItInPlace) {
  TempDir dir;
  RunSpec spec = tiny_spec("broken");
  RunOptions options;
  options.out_dir = dir.path();
  options.stop_after = 4;
  run_training(spec, options);
  const std::filesystem::path file = run_file_path(dir.path(), "broken");
  {
    std::ofstream junk(file, std::ios::trunc);
    junk << "not an HDF5 file";
  }
  options.stop_after = -1;
  options.resume = true;
  EXPECT_THROW(run_training(spec, options), UserError);
  EXPECT_TRUE(std::filesystem::exists(file)) << "the previous file must be back under its name";
  EXPECT_FALSE(std::filesystem::exists(file.string() + ".resume"));
}

TEST(Training, MlpOnGaussianDataLearnsTheTeacher) {
  TempDir dir;
  RunSpec spec;
  spec.name = "mlp";
  spec.seed = 3;
  spec.model.set_kind(ModelKind::mlp);
  spec.model.mlp().layers = 3;
  spec.model.mlp().width = 64;
  spec.model.mlp().input_dim = 16;
  spec.model.mlp().outputs = 4;
  spec.model.mlp().activation = Activation::tanh;
  spec.model.mlp().head = MlpHead::regression;
  spec.data.kind = "gaussian";
  spec.train.steps = 200;
  spec.train.batch = 32;
  spec.train.lr = 3e-3;
  spec.train.eval_every = 200;
  RunOptions options;
  options.out_dir = dir.path();
  RunSummary summary = run_training(spec, options);
  ASSERT_EQ(summary.status, RunStatus::completed);
  EvalCurves eval = RunReader::open(summary.run_file).read_eval();
  TrainCurves train = RunReader::open(summary.run_file).read_train();
  // The linear teacher's targets have variance ~1 per output: the initial loss is ~0.5; a trained MLP is far below.
  EXPECT_LT(eval.loss.back(), 0.2 * train.loss.front());
}

TEST(Training, DataParallelLayoutNeedsItsProcessesAndADivisibleBatch) {
  TempDir dir;
  RunSpec spec = tiny_spec("dp");
  spec.parallel.dp = 2;
  RunOptions options;
  options.out_dir = dir.path();
  try {
    run_training(spec, options);
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("mpirun -np 2"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(run_file_path(dir.path(), "dp")));
  // A group of one with dp = 1 is the single-process run.
  auto single = dist::make_single_process();
  spec.parallel.dp = 1;
  options.data_parallel = single.get();
  spec.train.steps = 2;
  EXPECT_EQ(run_training(spec, options).status, RunStatus::completed);
}

TEST(Schedule, WarmupThenCosineToTheFloor) {
  TrainConfig config;
  config.lr = 1.0;
  config.steps = 101;
  config.warmup = 10;
  config.schedule = ScheduleKind::cosine;
  config.min_lr_ratio = 0.1;
  EXPECT_DOUBLE_EQ(scheduled_lr(config, 0), 0.1);
  EXPECT_DOUBLE_EQ(scheduled_lr(config, 9), 1.0);
  EXPECT_DOUBLE_EQ(scheduled_lr(config, 10), 1.0);
  EXPECT_NEAR(scheduled_lr(config, 100), 0.1, 1e-12);
  EXPECT_NEAR(scheduled_lr(config, 55), 0.55, 1e-12);  // half way down the cosine
  config.schedule = ScheduleKind::constant;
  EXPECT_DOUBLE_EQ(scheduled_lr(config, 5), 0.6);
  EXPECT_DOUBLE_EQ(scheduled_lr(config, 50), 1.0);
}

}  // namespace proplab
