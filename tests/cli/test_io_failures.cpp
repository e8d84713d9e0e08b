// I/O failures end to end: writes to the run file or the checkpoint fail (injected under the real `proplab` and the
// real HDF5 library by tests/support/write_fault.c, as a full disk, a quota or a read-only file system would make
// them fail) during a record, during a checkpoint, during the run file's finalisation and while a run resumes. Each
// time the run stops with exit status 6 and one line on stderr that says what failed, the step, what the run file
// holds, the last good checkpoint and the command that continues; the run file says failed when it could still be
// written (running otherwise, until `proplab recover`); every record written before reads back bit for bit as an
// undisturbed run wrote it; and `--resume` continues to exactly the undisturbed run file.
//
// One test also fills a real 1 MiB tmpfs; it is skipped where this process may not mount one.
#include <gtest/gtest.h>
#include <sys/mount.h>

#include <bit>
#include <chrono>
#include <thread>
#include <map>

#include "cli/cli_test_support.h"
#include "io/checkpoint.h"
#include "io/run_file.h"
#include "io/run_reader.h"

namespace proplab {
namespace {

namespace fs = std::filesystem;
using cli_test::CliResult;
using cli_test::ScopedEnv;
using cli_test::write_fault;

// The tiny study for 40 steps, every step recorded, evaluation and a checkpoint every 10 steps.
const std::string kStudy = cli_test::replaced(cli_test::kTinyStudy, "steps = 20", "steps = 40\ncheckpoint_every = 10") +
                           "\n[record]\nevery = 1\n";

// A series of a run file as bit patterns, row-major.
struct Series {
  std::int64_t rows = 0;
  std::vector<std::uint64_t> bits;
};

// Every series a run writes but the timing columns (wall time, speed): /steps, /train, /eval and the statistics.
std::map<std::string, Series> read_series(const fs::path& path) {
  const RunReader reader = RunReader::open(path);
  std::map<std::string, Series> all;
  auto add = [&](const std::string& name, std::int64_t rows, const std::vector<double>& values) {
    Series& series = all[name];
    series.rows = rows;
    for (const double value : values) series.bits.push_back(std::bit_cast<std::uint64_t>(value));
  };
  for (const std::string name :
       {"/steps", "/train/step", "/train/loss", "/train/lr", "/train/grad_norm", "/eval/step", "/eval/loss"}) {
    const std::vector<double> values = reader.read_doubles(name);
    add(name, static_cast<std::int64_t>(values.size()), values);
  }
  for (const std::string group : {"/forward", "/backward", "/params"})
    for (const std::string& name : reader.list(group)) {
      const std::string path = group + "/" + name;
      if (reader.dataset_shape(path).size() != 2) continue;
      const Dataset2D data = reader.read_2d(path);
      add(path, data.rows, data.values);
    }
  return all;
}

class IoFailureTest : public cli_test::CliTest {
 protected:
  void SetUp() override {
    CliTest::SetUp();
    write_file("tiny.toml", kStudy);
    const CliResult reference = run({"run", "tiny.toml", "--out", "reference"});
    ASSERT_EQ(reference.exit_code, 0) << describe(reference);
    reference_ = read_series(work_ / "reference" / "tiny.h5");
    ASSERT_EQ(reference_.at("/steps").rows, 40);
  }

  // Runs `proplab run tiny.toml --out out [extra]` under `fault`; expects exit 6 and one line on stderr.
  CliResult run_failing(const std::vector<std::pair<std::string, std::string>>& fault,
                        const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {"run", "tiny.toml", "--out", "out"};
    args.insert(args.end(), extra.begin(), extra.end());
    CliResult result;
    {
      const ScopedEnv environment(fault);
      result = run(args);
    }
    EXPECT_EQ(result.exit_code, 6) << describe(result);
    EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1) << "not one line:\n" << result.err;
    EXPECT_EQ(result.err.rfind("proplab: error: ", 0), 0u) << result.err;
    return result;
  }

  void expect_says(const std::string& text, const std::string& expected) {
    EXPECT_NE(text.find(expected), std::string::npos) << "`" << expected << "` is not in:\n" << text;
  }

  // Every series in the file at `path` is a prefix of the undisturbed run's, of at least `at_least` rows for the
  // records (/steps and the statistics) and the training columns.
  void expect_prefix_of_reference(const fs::path& path, std::int64_t records, std::int64_t train_rows) {
    const std::map<std::string, Series> written = read_series(path);
    ASSERT_EQ(written.size(), reference_.size());
    for (const auto& [name, series] : written) {
      SCOPED_TRACE(name);
      const Series& reference = reference_.at(name);
      ASSERT_LE(series.rows, reference.rows);
      if (name.rfind("/train/", 0) == 0) {
        EXPECT_GE(series.rows, train_rows);
      } else if (name.rfind("/eval/", 0) != 0) {
        EXPECT_GE(series.rows, records);
      }
      EXPECT_TRUE(std::equal(series.bits.begin(), series.bits.end(), reference.bits.begin()))
          << "a row differs from the undisturbed run's";
    }
  }

  // `--resume` (without a fault) completes, and the run file is the undisturbed run's, bit for bit.
  void expect_resume_completes_the_run() {
    const CliResult resumed = run({"run", "tiny.toml", "--out", "out", "--resume"});
    ASSERT_EQ(resumed.exit_code, 0) << describe(resumed);
    EXPECT_EQ(RunReader::open(work_ / "out" / "tiny.h5").status(), RunStatus::completed);
    const std::map<std::string, Series> written = read_series(work_ / "out" / "tiny.h5");
    for (const auto& [name, series] : reference_) {
      SCOPED_TRACE(name);
      ASSERT_TRUE(written.count(name));
      EXPECT_EQ(written.at(name).rows, series.rows);
      EXPECT_TRUE(written.at(name).bits == series.bits) << "the resumed run file differs from the undisturbed one";
    }
  }

  RunStatus status_of(const fs::path& path) { return RunReader::open(path).status(); }

  std::map<std::string, Series> reference_;
};

TEST_F(IoFailureTest, DiskFullDuringARecordStopsWithOneLineAndResumes) {
  // The disk fills right after the checkpoint of step 10 and stays full: step 10's record is refused.
  const CliResult failed = run_failing(write_fault("/out/tiny.h5", 1));
  expect_says(failed.err,
              "proplab: error: tiny: I/O failure after 10 steps: No space left on device while writing "
              "the run file 'out/tiny.h5'. ");
  expect_says(failed.err, "holds at least 10 training rows (steps 0-9) and 10 records (the last at step 9)");
  expect_says(failed.err, "its status could not be written, so it says running until `proplab recover out/tiny.h5`");
  expect_says(failed.err, "Last good checkpoint: step 10 ('out/tiny.ckpt.h5')");
  expect_says(failed.err, "continue with: proplab run tiny.toml --out out --resume\n");
  EXPECT_EQ(failed.out.find("completed"), std::string::npos) << failed.out;
  EXPECT_FALSE(fs::exists(work_ / "out" / "tiny.lock"));

  EXPECT_EQ(status_of(work_ / "out" / "tiny.h5"), RunStatus::running);  // (read through SWMR)
  expect_prefix_of_reference(work_ / "out" / "tiny.h5", 10, 10);
  EXPECT_EQ(read_checkpoint(work_ / "out" / "tiny.ckpt.h5").int_value("step"), 10);

  const CliResult recovered = run({"recover", "out/tiny.h5"});
  ASSERT_EQ(recovered.exit_code, 0) << describe(recovered);
  EXPECT_EQ(status_of(work_ / "out" / "tiny.h5"), RunStatus::failed);
  expect_prefix_of_reference(work_ / "out" / "tiny.h5", 10, 10);
  expect_resume_completes_the_run();
}

TEST_F(IoFailureTest, WriteRefusedOnceMarksTheRunFileFailed) {
  // One write of step 20's record is refused (a quota that frees up at once): the status can still be written.
  const CliResult failed = run_failing(write_fault("/out/tiny.h5", 2, 1, EDQUOT));
  expect_says(failed.err, "I/O failure after 20 steps: Disk quota exceeded while writing the run file 'out/tiny.h5'");
  expect_says(failed.err,
              "holds at least 20 training rows (steps 0-19) and 20 records (the last at step 19) and says "
              "failed. Last good checkpoint: step 20");
  const RunReader reader = RunReader::open(work_ / "out" / "tiny.h5", RunOpenMode::normal);
  EXPECT_EQ(reader.status(), RunStatus::failed);
  const std::string detail = reader.attribute_string("status_detail");
  EXPECT_EQ(detail.rfind("I/O failure after 20 steps: Disk quota exceeded while writing the run file", 0), 0u)
      << detail;
  expect_says(detail, "last good checkpoint: step 20, continue with --resume");
  expect_prefix_of_reference(work_ / "out" / "tiny.h5", 20, 20);
  expect_resume_completes_the_run();
}

TEST_F(IoFailureTest, CheckpointThatCannotBeWrittenLeavesThePreviousOne) {
  // The second checkpoint (step 20) cannot be written; the run file still takes its rows and its status.
  const CliResult failed = run_failing(write_fault(".ckpt.h5.tmp", 1));
  expect_says(failed.err,
              "I/O failure after 20 steps: No space left on device while writing the checkpoint "
              "'out/tiny.ckpt.h5'");
  expect_says(failed.err,
              "holds at least 20 training rows (steps 0-19) and 20 records (the last at step 19) and says "
              "failed. Last good checkpoint: step 10");
  EXPECT_FALSE(fs::exists(work_ / "out" / "tiny.ckpt.h5.tmp")) << "the half-written checkpoint was left behind";
  EXPECT_EQ(read_checkpoint(work_ / "out" / "tiny.ckpt.h5").int_value("step"), 10);
  EXPECT_EQ(status_of(work_ / "out" / "tiny.h5"), RunStatus::failed);
  expect_prefix_of_reference(work_ / "out" / "tiny.h5", 20, 20);
  expect_resume_completes_the_run();
}

TEST_F(IoFailureTest, ReadOnlyFolderDuringACheckpoint) {
  const CliResult failed = run_failing(write_fault(".ckpt.h5.tmp", 2, -1, EROFS));
  expect_says(failed.err, "I/O failure after 30 steps: Read-only file system while writing the checkpoint");
  expect_says(failed.err, "Last good checkpoint: step 20");
  EXPECT_EQ(read_checkpoint(work_ / "out" / "tiny.ckpt.h5").int_value("step"), 20);
  expect_prefix_of_reference(work_ / "out" / "tiny.h5", 30, 30);
}

TEST_F(IoFailureTest, RunFolderMovedAwayStopsTheRunAtItsNextCheckpoint) {
  std::string study = kStudy;
  study.replace(study.find("steps = 40"), 10, "steps = 100000000");
  study.replace(study.find("every = 1\n"), 10, "every = 1000\n");
  write_file("tiny.toml", study);
  const pid_t pid = spawn({"run", "tiny.toml", "--out", "out"});
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!fs::exists(work_ / "out" / "tiny.ckpt.h5") && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(fs::exists(work_ / "out" / "tiny.ckpt.h5")) << "no first checkpoint within 60 s";
  fs::rename(work_ / "out", work_ / "moved");
  const CliResult failed = finish(pid);
  EXPECT_EQ(failed.exit_code, 6) << describe(failed);
  EXPECT_EQ(std::count(failed.err.begin(), failed.err.end(), '\n'), 1) << failed.err;
  // (found at the next checkpoint: before it, the run file is checked; or by the checkpoint itself, when the folder
  // went while it was being written)
  expect_says(failed.err, ": No such file or directory while writing the ");
  expect_says(failed.err,
              "The run file 'out/tiny.h5' is gone (its folder was removed or moved). No checkpoint of "
              "this run was written.");
  EXPECT_FALSE(fs::exists(work_ / "out" / "tiny.h5"));
  // What was written before reads back where the folder went.
  EXPECT_GT(RunReader::open(work_ / "moved" / "tiny.h5").read_train().size(), 0u);
}

TEST_F(IoFailureTest, FailureWhileFinishingTheRunFileKeepsEveryRecord) {
  // Without periodic checkpoints the final one is the first: the disk fills right after it, as the run file is
  // being finished (its last rows, its close and its status).
  std::string study = kStudy;
  study.replace(study.find("checkpoint_every = 10"), 21, "checkpoint_every = 0");
  write_file("tiny.toml", study);
  const CliResult failed = run_failing(write_fault("/out/tiny.h5", 1));
  expect_says(failed.err, "I/O failure after 40 steps: No space left on device while writing the run file");
  expect_says(failed.err, "and 40 records (the last at step 39)");
  expect_says(failed.err, "Last good checkpoint: step 40");
  EXPECT_EQ(status_of(work_ / "out" / "tiny.h5"), RunStatus::running);
  expect_prefix_of_reference(work_ / "out" / "tiny.h5", 40, 39);
  expect_resume_completes_the_run();
}

TEST_F(IoFailureTest, NoCheckpointYetSaysStartAgain) {
  std::string study = kStudy;
  study.replace(study.find("checkpoint_every = 10"), 21, "checkpoint_every = 0");
  write_file("tiny.toml", study);
  // (the first 400 writes to the run file go through: its creation and the first few steps)
  const CliResult failed = run_failing(write_fault("/out/tiny.h5", 0, -1, ENOSPC, 400), {"--set", "train.steps=40"});
  expect_says(failed.err, "tiny: I/O failure after ");
  expect_says(failed.err,
              "No checkpoint of this run was written. Free space (or make the folder writable again), "
              "then start again with: proplab run tiny.toml --set train.steps=40 --out out --force\n");
}

TEST_F(IoFailureTest, ResumeThatCannotWriteKeepsThePreviousRunFile) {
  const CliResult stopped = run({"run", "tiny.toml", "--out", "out", "--stop-after", "10"});
  ASSERT_EQ(stopped.exit_code, 4) << describe(stopped);
  const std::map<std::string, Series> before = read_series(work_ / "out" / "tiny.h5");
  // Every write to the new run file is refused, from its creation on.
  const CliResult failed = run_failing(write_fault("/out/tiny.h5", 0), {"--resume"});
  expect_says(failed.err, "No space left on device while writing 'out/tiny.h5'; nothing was lost");
  const RunReader reader = RunReader::open(work_ / "out" / "tiny.h5", RunOpenMode::normal);
  EXPECT_EQ(reader.status(), RunStatus::failed);
  EXPECT_EQ(reader.attribute_string("status_detail").rfind("stopped at step 10 (--stop-after)", 0), 0u);
  const std::map<std::string, Series> after = read_series(work_ / "out" / "tiny.h5");
  for (const auto& [name, series] : before) {
    SCOPED_TRACE(name);
    EXPECT_EQ(after.at(name).rows, series.rows);
    EXPECT_TRUE(after.at(name).bits == series.bits);
  }
  EXPECT_FALSE(fs::exists(work_ / "out" / "tiny.h5.resume"));
  expect_resume_completes_the_run();
}

TEST_F(IoFailureTest, FullTmpfsStopsTheRunWithOneLine) {
  const fs::path mount_point = base_ / "small";
  fs::create_directories(mount_point);
  if (::mount("tmpfs", mount_point.c_str(), "tmpfs", 0, "size=1m") != 0)
    GTEST_SKIP() << "this process may not mount a tmpfs (" << std::strerror(errno)
                 << "); the injected failures above cover the same paths";
  struct Unmount {
    fs::path path;
    ~Unmount() { ::umount2(path.c_str(), MNT_DETACH); }
  } unmount{mount_point};
  std::string study = kStudy;
  study.replace(study.find("steps = 40"), 10, "steps = 100000");
  write_file("tiny.toml", study);
  const std::string out = (mount_point / "out").string();
  const CliResult failed = run({"run", "tiny.toml", "--out", out});
  EXPECT_EQ(failed.exit_code, 6) << describe(failed);
  EXPECT_EQ(std::count(failed.err.begin(), failed.err.end(), '\n'), 1) << failed.err;
  expect_says(failed.err, ": No space left on device while writing the ");
  expect_says(failed.err, "continue with: proplab run tiny.toml --out " + out + " --resume");
  const RunReader reader = RunReader::open(mount_point / "out" / "tiny.h5");
  EXPECT_GT(reader.read_ints("/steps").size(), 10u);
}

}  // namespace
}  // namespace proplab
