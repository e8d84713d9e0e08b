// End-to-end tests of the `proplab` command line (the process helper is in cli_test_support.h). Every study
// here is tiny and single-threaded so the whole binary runs in seconds.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli/cli_test_support.h"
#include "io/checkpoint.h"
#include "io/run_file.h"
#include "io/run_reader.h"
#include "study/study.h"

namespace proplab {

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using cli_test::CliResult;
using cli_test::CliTest;
using cli_test::kTinyStudy;
using cli_test::list_tree;
using cli_test::read_text;

// The tiny transformer every run test trains: 20 steps take a few milliseconds.
// Diverges at step 12 for every seed tried (1..5): huge initial weights, SGD at lr 50, no gradient clipping.
constexpr const char* kDivergingStudy = R"(name = "boom"

[model]
type = "transformer"
layers = 1
width = 16
heads = 2
vocab = 16
seq_len = 8

[scaling]
rule = "custom"
embed_std = 10.0
hidden_std = 10.0
out_proj_std = 10.0
readout_std = 10.0

[train]
optimizer = "sgd"
lr = 50
grad_clip = 0
steps = 50
batch = 4
eval_every = 10

[device]
type = "cpu"
threads = 1
)";

// Long enough (about 0.6 ms a step unloaded, so seconds) to be interrupted part way.
constexpr const char* kLongStudy = R"(name = "long"

[model]
type = "transformer"
layers = 2
width = 32
heads = 2
vocab = 16
seq_len = 16

[train]
steps = 4000
batch = 4
eval_every = 500

[device]
type = "cpu"
threads = 1
)";

// Bit patterns, so that -0.0 != 0.0 and NaN payloads count.
std::vector<std::uint64_t> bits_of(const std::vector<double>& values) {
  std::vector<std::uint64_t> bits;
  for (double v : values) bits.push_back(std::bit_cast<std::uint64_t>(v));
  return bits;
}

// The step N in "... at step N ..." of a status detail, or -1.
std::int64_t step_in(const std::string& detail) {
  const std::size_t at = detail.find("at step ");
  if (at == std::string::npos) return -1;
  return std::strtoll(detail.c_str() + at + 8, nullptr, 10);
}

// ---- Bad input: exit 2, a located message, nothing written ----

TEST_F(CliTest, UnknownKeySuggestsTheClosestAndListsAllowedKeys) {
  write_file("bad.toml", "name = \"x\"\n[model]\nlayer = 2\n");
  expect_bad_input({"run", "bad.toml"}, {"bad.toml:3: model.layer: unknown key", "did you mean `layers`?",
                                         "allowed: type, layers, width, heads"});
}

TEST_F(CliTest, WrongTypeNamesTheTypeAndTheAllowedRange) {
  write_file("bad.toml", "name = \"x\"\n\n[train]\nsteps = 10\nlr = \"1e-3\"\n");
  expect_bad_input({"run", "bad.toml", "--out", "out"},
                   {"bad.toml:5: train.lr: expected a number, got string", "allowed: a number in (0, 100]"});
  EXPECT_FALSE(fs::exists(work_ / "out"));
}

TEST_F(CliTest, IntegerKeyRefusesAFloat) {
  write_file("bad.toml", "name = \"x\"\n[model]\nlayers = 8.0\n");
  expect_bad_input({"run", "bad.toml"},
                   {"bad.toml:3: model.layers: expected an integer", "allowed: an integer in 1..100000"});
}

TEST_F(CliTest, OutOfRangeValueNamesTheRange) {
  // The study is named by its absolute path here; the message locates it by that path.
  const fs::path study = write_file("bad.toml", "name = \"x\"\n[model]\nlayers = 2\ndropout = 1.5\n");
  expect_bad_input({"run", study.string()},
                   {study.string() + ":4: model.dropout: 1.5 is out of range", "allowed: a number in [0, 1)"});
}

TEST_F(CliTest, WidthNotDivisibleByHeads) {
  write_file("bad.toml", "name = \"x\"\n[model]\nwidth = 10\nheads = 4\n");
  expect_bad_input({"run", "bad.toml"},
                   {"bad.toml:4: model.heads:", "not divisible by 4 heads", "allowed: a divisor of model.width"});
}

TEST_F(CliTest, MissingDataFileIsNamed) {
  write_file("bad.toml", "name = \"x\"\n\n[data]\nkind = \"text\"\npath = \"missing.txt\"\n");
  expect_bad_input({"run", "bad.toml"},
                   {"bad.toml:5: data.path:", "missing.txt", "does not exist", "allowed: a readable, non-empty file"});
}

TEST_F(CliTest, TomlSyntaxErrorHasLineAndColumn) {
  write_file("bad.toml", "name = \"x\"\n[model]\nlayers = = 3\n");
  expect_bad_input({"run", "bad.toml"}, {"bad.toml:3:10: TOML syntax error"});
}

TEST_F(CliTest, BadOverridesAreLocatedAtTheOverride) {
  write_file("ok.toml", kTinyStudy);
  expect_bad_input({"run", "ok.toml", "--set", "model.layers=0"},
                   {"--set model.layers=0: model.layers: 0 is out of range", "allowed: an integer in 1..100000"});
  expect_bad_input({"run", "ok.toml", "--set", "model.layers="},
                   {"--set model.layers=: model.layers: malformed override: no value", "allowed: key.path=value"});
  expect_bad_input({"run", "ok.toml", "--set", "model.layerz=3"},
                   {"--set model.layerz=3: model.layerz: unknown key", "did you mean `layers`?"});
  expect_bad_input({"run", "ok.toml", "--set", "nolayers"}, {"--set nolayers: malformed override: no '='"});
}

TEST_F(CliTest, EveryProblemIsReportedAtOnceInLineOrderOverridesLast) {
  write_file("bad.toml", "name = \"x\"\n[model]\nlayer = 2\n[train]\nlr = \"fast\"\n");
  const CliResult result =
      expect_bad_input({"run", "bad.toml", "--set", "train.steps=0"},
                       {"bad.toml:3: model.layer:", "bad.toml:5: train.lr:", "--set train.steps=0: train.steps:"});
  const std::size_t first = result.err.find("bad.toml:3:"), second = result.err.find("bad.toml:5:"),
                    third = result.err.find("--set train.steps=0");
  EXPECT_LT(first, second);
  EXPECT_LT(second, third);
}

TEST_F(CliTest, StudyWithSweepIsSentToProplabSweep) {
  write_file("sweep.toml", std::string(kTinyStudy) + "\n[sweep]\n\"model.layers\" = [1, 2]\n");
  expect_bad_input({"run", "sweep.toml"}, {"sweep.toml", "[sweep]", "proplab sweep sweep.toml"});
}

TEST_F(CliTest, MissingStudyFileIsNamed) { expect_bad_input({"run", "nowhere.toml"}, {"nowhere.toml"}); }

// ---- Command line ----

TEST_F(CliTest, HelpListsTheRunCommandAndItsOptions) {
  const CliResult top = run({"--help"});
  EXPECT_EQ(top.exit_code, 0) << describe(top);
  EXPECT_NE(top.out.find("run"), std::string::npos) << top.out;
  EXPECT_NE(top.out.find("Exit status"), std::string::npos) << top.out;

  const CliResult help = run({"run", "--help"});
  EXPECT_EQ(help.exit_code, 0) << describe(help);
  for (const char* option : {"--set", "--out", "--resume", "--force", "--stop-after", "study"})
    EXPECT_NE(help.out.find(option), std::string::npos) << "`proplab run --help` does not mention " << option << ":\n"
                                                        << help.out;
  EXPECT_TRUE(list_tree(work_).empty());
}

TEST_F(CliTest, VersionPrintsTheVersion) {
  const CliResult result = run({"--version"});
  EXPECT_EQ(result.exit_code, 0) << describe(result);
  EXPECT_NE(result.out.find("0.1.0"), std::string::npos) << result.out;
}

TEST_F(CliTest, CommandLineErrorsExitWithTwo) {
  write_file("tiny.toml", kTinyStudy);
  const std::vector<std::vector<std::string>> bad = {
      {"run", "tiny.toml", "--bogus"},  // unknown option
      {},                               // no subcommand
      {"frobnicate"},                   // unknown subcommand
      {"run"},                          // no study
      {"run", "tiny.toml", "--stop-after", "-1"},
      {"run", "tiny.toml", "--stop-after", "ten"},
  };
  for (const auto& args : bad) {
    std::string joined;
    for (const auto& arg : args) joined += " " + arg;
    SCOPED_TRACE("proplab" + joined);
    expect_bad_input(args, {});
  }
}

// ---- Runs ----

TEST_F(CliTest, TinyRunCompletesAndWritesTheRunFile) {
  const fs::path study = write_file("tiny.toml", kTinyStudy);
  const CliResult result = run({"run", "tiny.toml", "--out", "out"});
  ASSERT_EQ(result.exit_code, 0) << describe(result);

  // Not a terminal: plain lines, no carriage returns or escape sequences.
  EXPECT_EQ(result.out.find('\r'), std::string::npos) << result.out;
  EXPECT_EQ(result.out.find('\033'), std::string::npos) << result.out;
  EXPECT_NE(result.out.find("step 20/20"), std::string::npos) << result.out;
  EXPECT_NE(result.out.find("completed"), std::string::npos) << result.out;
  EXPECT_FALSE(result.out.empty());
  EXPECT_EQ(result.out.back(), '\n');

  const fs::path run_file = work_ / "out" / "tiny.h5";
  ASSERT_TRUE(fs::exists(run_file));
  EXPECT_TRUE(fs::exists(work_ / "out" / "tiny.ckpt.h5"));
  RunReader reader = RunReader::open(run_file);
  EXPECT_EQ(reader.status(), RunStatus::completed);
  EXPECT_EQ(reader.attribute_string("status"), "completed");
  const TrainCurves train = reader.read_train();
  ASSERT_EQ(train.size(), 20u);
  for (std::int64_t i = 0; i < 20; ++i) {
    EXPECT_EQ(train.step[i], i);
    EXPECT_TRUE(std::isfinite(train.loss[i])) << "step " << i;
  }
  const EvalCurves eval = reader.read_eval();
  EXPECT_EQ(eval.step, (std::vector<std::int64_t>{10, 20}));
  for (double loss : eval.loss) EXPECT_TRUE(std::isfinite(loss));

  const std::string config = reader.attribute_string("config");
  EXPECT_EQ(config, load_study(study.string()).config_toml);
  EXPECT_NE(config.find("layers = 1"), std::string::npos) << config;
  EXPECT_NE(config.find("width = 16"), std::string::npos) << config;
}

TEST_F(CliTest, ExistingRunFileNeedsForce) {
  write_file("tiny.toml", kTinyStudy);
  // Default output directory: runs/<name>/ under the working directory.
  const CliResult first = run({"run", "tiny.toml"});
  ASSERT_EQ(first.exit_code, 0) << describe(first);
  const fs::path run_file = work_ / "runs" / "tiny" / "tiny.h5";
  const fs::path checkpoint = work_ / "runs" / "tiny" / "tiny.ckpt.h5";
  ASSERT_TRUE(fs::exists(run_file));
  const std::string run_bytes = read_text(run_file), checkpoint_bytes = read_text(checkpoint);
  const auto run_time = fs::last_write_time(run_file);
  const std::vector<double> first_loss = RunReader::open(run_file).read_train().loss;

  expect_bad_input({"run", "tiny.toml"}, {"runs/tiny/tiny.h5", "--force"});
  EXPECT_EQ(read_text(run_file), run_bytes) << "the existing run file was modified";
  EXPECT_EQ(read_text(checkpoint), checkpoint_bytes) << "the existing checkpoint was modified";
  EXPECT_EQ(fs::last_write_time(run_file), run_time);

  const CliResult forced = run({"run", "tiny.toml", "--force"});
  ASSERT_EQ(forced.exit_code, 0) << describe(forced);
  RunReader reader = RunReader::open(run_file);
  EXPECT_EQ(reader.status(), RunStatus::completed);
  const TrainCurves train = reader.read_train();
  ASSERT_EQ(train.size(), 20u) << "--force must replace the file, not append to it";
  // Same study, so the same losses, bit for bit.
  EXPECT_EQ(bits_of(train.loss), bits_of(first_loss));
}

TEST_F(CliTest, StopAfterThenResumeMatchesAnUninterruptedRunBitForBit) {
  write_file("tiny.toml", kTinyStudy);
  const CliResult full = run({"run", "tiny.toml", "--out", "full"});
  ASSERT_EQ(full.exit_code, 0) << describe(full);

  const CliResult stopped = run({"run", "tiny.toml", "--out", "split", "--stop-after", "10"});
  ASSERT_EQ(stopped.exit_code, 4) << describe(stopped);
  const fs::path split_run = work_ / "split" / "tiny.h5", split_checkpoint = work_ / "split" / "tiny.ckpt.h5";
  {
    RunReader reader = RunReader::open(split_run);
    EXPECT_EQ(reader.status(), RunStatus::failed);
    const std::string detail = reader.attribute_string("status_detail");
    EXPECT_NE(detail.find("--stop-after"), std::string::npos) << detail;
    EXPECT_NE(detail.find("--resume"), std::string::npos) << detail;
    EXPECT_EQ(step_in(detail), 10) << detail;
    EXPECT_EQ(reader.read_train().size(), 10u);
    EXPECT_EQ(reader.read_eval().step, (std::vector<std::int64_t>{10}));
    EXPECT_EQ(read_checkpoint(split_checkpoint).int_value("step"), 10);
  }

  const CliResult resumed = run({"run", "tiny.toml", "--out", "split", "--resume"});
  ASSERT_EQ(resumed.exit_code, 0) << describe(resumed);

  RunReader a = RunReader::open(work_ / "full" / "tiny.h5");
  RunReader b = RunReader::open(split_run);
  EXPECT_EQ(b.status(), RunStatus::completed);
  const TrainCurves train_a = a.read_train(), train_b = b.read_train();
  ASSERT_EQ(train_a.size(), 20u);
  EXPECT_EQ(train_b.step, train_a.step);
  EXPECT_EQ(bits_of(train_b.loss), bits_of(train_a.loss)) << "resumed losses differ from the uninterrupted run";
  EXPECT_EQ(bits_of(train_b.grad_norm), bits_of(train_a.grad_norm));
  EXPECT_EQ(bits_of(train_b.lr), bits_of(train_a.lr));
  const EvalCurves eval_a = a.read_eval(), eval_b = b.read_eval();
  EXPECT_EQ(eval_b.step, (std::vector<std::int64_t>{10, 20}));
  EXPECT_EQ(eval_b.step, eval_a.step);
  EXPECT_EQ(bits_of(eval_b.loss), bits_of(eval_a.loss));
  EXPECT_EQ(b.attribute_string("config"), a.attribute_string("config"));

  // The final checkpoints hold the same parameters and optimizer state, bit for bit.
  const Checkpoint ca = read_checkpoint(work_ / "full" / "tiny.ckpt.h5");
  const Checkpoint cb = read_checkpoint(split_checkpoint);
  EXPECT_EQ(ca.ints, cb.ints);
  EXPECT_EQ(ca.strings, cb.strings);
  ASSERT_EQ(ca.tensors.size(), cb.tensors.size());
  bool any_param = false;
  for (const auto& [name, tensor_a] : ca.tensors) {
    SCOPED_TRACE(name);
    any_param = any_param || name.rfind("param/", 0) == 0;
    auto it = cb.tensors.find(name);
    ASSERT_NE(it, cb.tensors.end());
    const Tensor& tensor_b = it->second;
    ASSERT_EQ(tensor_a.shape(), tensor_b.shape());
    EXPECT_EQ(std::memcmp(tensor_a.f32(), tensor_b.f32(), sizeof(float) * tensor_a.numel()), 0);
  }
  EXPECT_TRUE(any_param) << "the checkpoint holds no param/ tensors";
}

TEST_F(CliTest, ResumeWithoutCheckpointNamesIt) {
  write_file("tiny.toml", kTinyStudy);
  expect_bad_input({"run", "tiny.toml", "--out", "out", "--resume"}, {"--resume", "out/tiny.ckpt.h5"});
  EXPECT_FALSE(fs::exists(work_ / "out"));
}

TEST_F(CliTest, ResumeWithADifferentStudyIsRefused) {
  write_file("tiny.toml", kTinyStudy);
  const CliResult stopped = run({"run", "tiny.toml", "--out", "out", "--stop-after", "10"});
  ASSERT_EQ(stopped.exit_code, 4) << describe(stopped);
  const fs::path run_file = work_ / "out" / "tiny.h5", checkpoint = work_ / "out" / "tiny.ckpt.h5";
  const std::string run_bytes = read_text(run_file), checkpoint_bytes = read_text(checkpoint);

  expect_bad_input({"run", "tiny.toml", "--out", "out", "--resume", "--set", "train.lr=2e-3"},
                   {"--resume", "out/tiny.ckpt.h5", "differs"});
  EXPECT_EQ(read_text(run_file), run_bytes) << "a refused resume modified the run file";
  EXPECT_EQ(read_text(checkpoint), checkpoint_bytes) << "a refused resume modified the checkpoint";

  // The same study still resumes.
  const CliResult resumed = run({"run", "tiny.toml", "--out", "out", "--resume"});
  EXPECT_EQ(resumed.exit_code, 0) << describe(resumed);
}

TEST_F(CliTest, FinalCheckpointFalseLeavesACompletedRunWithoutOne) {
  write_file("tiny.toml", kTinyStudy);
  const CliResult plain = run({"run", "tiny.toml", "--out", "none", "--set", "train.final_checkpoint=false"});
  ASSERT_EQ(plain.exit_code, 0) << describe(plain);
  EXPECT_FALSE(fs::exists(work_ / "none" / "tiny.ckpt.h5")) << "a completed run with final_checkpoint = false";
  RunReader none = RunReader::open(work_ / "none" / "tiny.h5");
  EXPECT_EQ(none.status(), RunStatus::completed);
  EXPECT_NE(none.attribute_string("config").find("\nfinal_checkpoint = false\n"), std::string::npos);

  // Stopped early it still writes one, and the run resumes from it under the default (true): the key is not part
  // of the experiment. The resumed run then ends with its checkpoint, and computed what the first one did.
  const CliResult stopped =
      run({"run", "tiny.toml", "--out", "split", "--stop-after", "10", "--set", "train.final_checkpoint=false"});
  ASSERT_EQ(stopped.exit_code, 4) << describe(stopped);
  const fs::path checkpoint = work_ / "split" / "tiny.ckpt.h5";
  ASSERT_TRUE(fs::exists(checkpoint));
  EXPECT_EQ(read_checkpoint(checkpoint).int_value("step"), 10);
  const CliResult resumed = run({"run", "tiny.toml", "--out", "split", "--resume"});
  ASSERT_EQ(resumed.exit_code, 0) << describe(resumed);
  EXPECT_EQ(read_checkpoint(checkpoint).int_value("step"), 20);
  RunReader split = RunReader::open(work_ / "split" / "tiny.h5");
  EXPECT_EQ(split.status(), RunStatus::completed);
  EXPECT_EQ(bits_of(split.read_train().loss), bits_of(none.read_train().loss));
}

TEST_F(CliTest, DivergingRunExitsWithThreeAndRecordsTheStep) {
  write_file("boom.toml", kDivergingStudy);
  const CliResult result = run({"run", "boom.toml", "--out", "out"});
  ASSERT_EQ(result.exit_code, 3) << describe(result);
  EXPECT_NE(result.out.find("diverged"), std::string::npos) << result.out;

  RunReader reader = RunReader::open(work_ / "out" / "boom.h5");
  EXPECT_EQ(reader.status(), RunStatus::diverged);
  const std::string detail = reader.attribute_string("status_detail");
  EXPECT_NE(detail.find("non-finite"), std::string::npos) << detail;
  const std::int64_t step = step_in(detail);
  ASSERT_GE(step, 0) << "status_detail does not name the step: " << detail;
  EXPECT_LT(step, 50);
  // Every step up to and including the diverging one is recorded; only the last is non-finite.
  const TrainCurves train = reader.read_train();
  ASSERT_EQ(static_cast<std::int64_t>(train.size()), step + 1);
  EXPECT_EQ(train.step.back(), step);
  EXPECT_FALSE(std::isfinite(train.loss.back()) && std::isfinite(train.grad_norm.back()));
  for (std::int64_t i = 0; i < step; ++i) EXPECT_TRUE(std::isfinite(train.loss[i])) << "step " << i;
}

TEST_F(CliTest, SigintStopsCleanlyAndTheRunResumes) {
  write_file("long.toml", kLongStudy);
  const fs::path run_file = work_ / "out" / "long.h5";
  const pid_t pid = spawn({"run", "long.toml", "--out", "out"});
  ASSERT_GT(pid, 0);
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (!fs::exists(run_file) && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(5ms);
  std::this_thread::sleep_for(200ms);
  kill(pid, SIGINT);
  const CliResult interrupted = finish(pid);
  ASSERT_EQ(interrupted.exit_code, 4) << "(a 0 means the run ended before SIGINT arrived) " << describe(interrupted);

  std::int64_t stopped_at = -1;
  {
    RunReader reader = RunReader::open(run_file);
    EXPECT_EQ(reader.status(), RunStatus::failed);
    const std::string detail = reader.attribute_string("status_detail");
    EXPECT_NE(detail.find("interrupted"), std::string::npos) << detail;
    EXPECT_NE(detail.find("--resume"), std::string::npos) << detail;
    stopped_at = step_in(detail);
    RecordProperty("interrupted_at_step", std::to_string(stopped_at));
    EXPECT_GE(stopped_at, 0) << detail;
    EXPECT_LT(stopped_at, 4000) << detail;
    EXPECT_EQ(static_cast<std::int64_t>(reader.read_train().size()), stopped_at);
    EXPECT_EQ(read_checkpoint(work_ / "out" / "long.ckpt.h5").int_value("step"), stopped_at);
  }

  const CliResult resumed = run({"run", "long.toml", "--out", "out", "--resume"});
  ASSERT_EQ(resumed.exit_code, 0) << describe(resumed);
  RunReader reader = RunReader::open(run_file);
  EXPECT_EQ(reader.status(), RunStatus::completed);
  const TrainCurves train = reader.read_train();
  ASSERT_EQ(train.size(), 4000u);
  for (std::int64_t i = 0; i < 4000; ++i) ASSERT_EQ(train.step[i], i);
  for (double loss : train.loss) ASSERT_TRUE(std::isfinite(loss));
}

}  // namespace

}  // namespace proplab
