// sweep end to end: `proplab sweep` runs tiny points as separate processes, is killed mid-way (SIGKILL to its
// process group, or Ctrl-C as SIGINT to the group), and a rerun skips what finished, completes what was
// interrupted, records the point that fails at run time as failed, and leaves an index that matches the run files.
//
// The failing point is honest: its model.vocab (50) passes validation, which checks the token file's size but not
// its contents, and the run refuses it at start because the file holds token ids up to 99.
#include <sys/stat.h>

#include <map>

#include "cli/cli_test_support.h"
#include "io/checkpoint.h"
#include "io/run_file.h"
#include "io/run_lock.h"
#include "io/run_reader.h"
#include "study/study.h"
#include "sweep/index.h"

namespace proplab::cli_test {
namespace {

constexpr const char* kStudy = R"(name = "ci"
seed = 1

[model]
type = "transformer"
layers = 1
width = 16
heads = 2
vocab = 100
seq_len = 8

[data]
kind = "tokens"
path = "tokens.bin"

[train]
steps = 30
batch = 4

[device]
type = "cpu"
threads = 1

)";

// Point 0 finishes at once; point 1 is long enough to be cut; point 2 fails at run time; point 3 is short.
constexpr const char* kFourPoints =
    "[sweep]\nzip = { \"model.layers\" = [1, 2, 1, 2], \"model.vocab\" = [100, 100, 50, 128], "
    "\"train.steps\" = [30, 2500, 30, 300] }\n";
const char* const kFirst = "layers=1,vocab=100,steps=30";
const char* const kLong = "layers=2,vocab=100,steps=2500";
const char* const kFailing = "layers=1,vocab=50,steps=30";
const char* const kShort = "layers=2,vocab=128,steps=300";

struct Row {
  std::map<std::string, std::string> fields;
  const std::string& operator[](const std::string& column) const { return fields.at(column); }
};

std::map<std::string, Row> read_rows(const fs::path& index) {
  std::map<std::string, Row> rows;
  const auto records = parse_csv(read_text(index));
  if (records.empty()) return rows;
  for (std::size_t r = 1; r < records.size(); ++r) {
    Row row;
    for (std::size_t c = 0; c < records[0].size() && c < records[r].size(); ++c)
      row.fields[records[0][c]] = records[r][c];
    rows[row["run"]] = row;
  }
  return rows;
}

std::pair<ino_t, std::int64_t> identity(const fs::path& path) {
  struct stat info {};
  EXPECT_EQ(::stat(path.c_str(), &info), 0) << path;
  return {info.st_ino, static_cast<std::int64_t>(info.st_mtim.tv_sec) * 1000000000 + info.st_mtim.tv_nsec};
}

class SweepRunTest : public CliTest {
 protected:
  void SetUp() override {
    CliTest::SetUp();
    // Token ids 0..99 (little-endian uint16).
    std::string tokens;
    for (int i = 0; i < 4000; ++i) {
      const int id = (i * 37) % 100;
      tokens += static_cast<char>(id & 0xff);
      tokens += static_cast<char>(id >> 8);
    }
    write_file("tokens.bin", tokens);
  }

  // Starts `proplab args...` as the leader of a new process group (so the test can signal the whole sweep).
  pid_t spawn_group(const std::vector<std::string>& args) {
    ++runs_;
    out_path_ = capture_ / ("out" + std::to_string(runs_) + ".txt");
    err_path_ = capture_ / ("err" + std::to_string(runs_) + ".txt");
    const std::string executable = binary_.string(), work = work_.string();
    const std::string out = out_path_.string(), err = err_path_.string();
    std::vector<char*> argv{const_cast<char*>(executable.c_str())};
    for (const auto& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
    argv.push_back(nullptr);
    const pid_t pid = fork();
    if (pid == 0) {
      setpgid(0, 0);
      const int out_fd = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int err_fd = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int null_fd = open("/dev/null", O_RDONLY);
      if (out_fd < 0 || err_fd < 0 || null_fd < 0 || chdir(work.c_str()) != 0) _exit(126);
      dup2(null_fd, STDIN_FILENO);
      dup2(out_fd, STDOUT_FILENO);
      dup2(err_fd, STDERR_FILENO);
      execv(argv[0], argv.data());
      _exit(127);
    }
    setpgid(pid, pid);  // also from here, so the group exists before the test signals it
    captures_[pid] = {out_path_, err_path_};
    return pid;
  }

  // Waits (polling, at most 90 s) until the index says `run` completed.
  bool wait_until_completed(const fs::path& index, const std::string& run, pid_t sweep) {
    const auto deadline = std::chrono::steady_clock::now() + 90s;
    while (std::chrono::steady_clock::now() < deadline) {
      const auto rows = read_rows(index);
      if (const auto it = rows.find(run); it != rows.end() && it->second["status"] == "completed") return true;
      int status = 0;
      if (waitpid(sweep, &status, WNOHANG) == sweep) {
        ADD_FAILURE() << "the sweep ended before " << run << " completed:\n"
                      << read_text(out_path_) << read_text(err_path_);
        return false;
      }
      std::this_thread::sleep_for(10ms);
    }
    ADD_FAILURE() << run << " did not complete within 90 s";
    return false;
  }

  // Waits (polling, at most 90 s) until the run file being written holds at least `steps` training rows.
  bool wait_until_steps(const fs::path& run_file, std::size_t steps) {
    const auto deadline = std::chrono::steady_clock::now() + 90s;
    while (std::chrono::steady_clock::now() < deadline) {
      try {
        if (fs::exists(run_file) && RunReader::open(run_file).read_train().size() >= steps) return true;
      } catch (const std::exception&) {
        // Not readable yet (being created): try again.
      }
      std::this_thread::sleep_for(10ms);
    }
    ADD_FAILURE() << run_file << " did not reach " << steps << " steps within 90 s";
    return false;
  }

  // Every row of the index says what its run file says.
  void expect_index_matches_files(const fs::path& dir) {
    const auto rows = read_rows(dir / "index.csv");
    for (const auto& [name, row] : rows) {
      SCOPED_TRACE(name);
      const fs::path file = dir / row["file"];
      EXPECT_EQ(row["file"], name + ".h5");
      const std::string& status = row["status"];
      if (status == "pending") {
        EXPECT_FALSE(fs::exists(file));
        continue;
      }
      if (status == "failed" && !fs::exists(file)) continue;
      ASSERT_TRUE(fs::exists(file)) << status;
      const RunReader reader = RunReader::open(file);
      const TrainCurves train = reader.read_train();
      EXPECT_EQ(row["final_loss"], train.size() ? exact_text(train.loss.back()) : std::string());
      EXPECT_EQ(row["steps"], train.size() ? std::to_string(train.step.back() + 1) : std::string("0"));
      const EvalCurves eval = reader.read_eval();
      EXPECT_EQ(row["final_val_loss"], eval.size() ? exact_text(eval.loss.back()) : std::string());
      if (status == "completed") {
        EXPECT_EQ(reader.attribute_string("status"), "completed");
      }
      if (status == "interrupted") {
        EXPECT_EQ(reader.attribute_string("status"), "failed");
        EXPECT_EQ(reader.attribute_string("status_detail").rfind("interrupted", 0), 0u);
        EXPECT_EQ(row["detail"], reader.attribute_string("status_detail"));
      }
    }
  }
};

TEST_F(SweepRunTest, KilledSweepRerunSkipsFinishedCompletesInterruptedAndRecordsTheFailure) {
  write_file("ci.toml", std::string(kStudy) + kFourPoints);
  const fs::path dir = work_ / "out";
  const std::vector<std::string> args{"sweep", "ci.toml", "--out", "out", "--jobs", "2"};

  const pid_t sweep = spawn_group(args);
  ASSERT_TRUE(wait_until_completed(dir / "index.csv", kFirst, sweep));
  ASSERT_TRUE(wait_until_steps(dir / (std::string(kLong) + ".h5"), 5));  // mid-way through the long point
  ASSERT_EQ(kill(-sweep, SIGKILL), 0);
  const CliResult killed = finish(sweep);
  ASSERT_EQ(killed.exit_code, 128 + SIGKILL) << describe(killed);
  const auto first = identity(dir / (std::string(kFirst) + ".h5"));
  {
    const auto rows = read_rows(dir / "index.csv");
    ASSERT_EQ(rows.size(), 4u);
    EXPECT_EQ(rows.at(kLong)["status"], "running") << "the long point was cut mid-way";
  }

  const CliResult rerun = run(args);
  EXPECT_EQ(rerun.exit_code, 5) << "a point failed: " << describe(rerun);
  EXPECT_NE(rerun.out.find("sweep: skip " + std::string(kFirst) + " (completed)"), std::string::npos) << rerun.out;
  EXPECT_NE(rerun.out.find("restart " + std::string(kLong)), std::string::npos) << rerun.out;
  EXPECT_EQ(identity(dir / (std::string(kFirst) + ".h5")), first) << "a finished run was rewritten";

  const auto rows = read_rows(dir / "index.csv");
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows.at(kFirst)["status"], "completed");
  EXPECT_EQ(rows.at(kLong)["status"], "completed");
  EXPECT_EQ(rows.at(kLong)["steps"], "2500");
  EXPECT_EQ(rows.at(kShort)["status"], "completed");
  EXPECT_EQ(rows.at(kFailing)["status"], "failed");
  EXPECT_NE(rows.at(kFailing)["detail"].find("is >= the model's vocab 50"), std::string::npos)
      << rows.at(kFailing)["detail"];
  EXPECT_EQ(rows.at(kFailing)["model.vocab"], "50");
  EXPECT_EQ(rows.at(kLong)["train.steps"], "2500");
  expect_index_matches_files(dir);
  EXPECT_EQ(read_text(dir / "index.csv").find(".index"), std::string::npos);
  EXPECT_FALSE(fs::exists(dir / (std::string(kLong) + ".h5.resume")));

  // The failure is left alone unless asked; --retry-failed runs it again (and it fails again, alone).
  const CliResult again = run(args);
  EXPECT_EQ(again.exit_code, 5) << describe(again);
  EXPECT_NE(again.out.find("skip " + std::string(kFailing) + " (failed before; --retry-failed reruns it)"),
            std::string::npos)
      << again.out;
  EXPECT_EQ(again.out.find("start "), std::string::npos) << again.out;
  std::vector<std::string> retry = args;
  retry.push_back("--retry-failed");
  const CliResult retried = run(retry);
  EXPECT_EQ(retried.exit_code, 5) << describe(retried);
  EXPECT_NE(retried.out.find("start " + std::string(kFailing)), std::string::npos) << retried.out;
  EXPECT_NE(retried.out.find("sweep: 3/4 done, 0 running, 1 failed"), std::string::npos) << retried.out;
  EXPECT_EQ(identity(dir / (std::string(kFirst) + ".h5")), first);
}

TEST_F(SweepRunTest, CtrlCStopsCleanlyLeavesTheIndexTrueAndTheRerunResumes) {
  write_file("ci.toml",
             std::string(kStudy) + "[sweep]\nzip = { \"model.layers\" = [1, 2], \"train.steps\" = [30, 2500] }\n");
  const fs::path dir = work_ / "out";
  const std::vector<std::string> args{"sweep", "ci.toml", "--out", "out", "--jobs", "2"};
  const std::string first = "layers=1,steps=30", cut = "layers=2,steps=2500";

  const pid_t sweep = spawn_group(args);
  ASSERT_TRUE(wait_until_completed(dir / "index.csv", first, sweep));
  // Mid-way: the long point has trained a little (so the rerun resumes past step 0).
  ASSERT_TRUE(wait_until_steps(dir / (cut + ".h5"), 5));
  ASSERT_EQ(kill(-sweep, SIGINT), 0);  // what a terminal's Ctrl-C does: the whole foreground group
  const CliResult stopped = finish(sweep);
  ASSERT_EQ(stopped.exit_code, 4) << describe(stopped);
  EXPECT_NE(stopped.out.find("stopped; rerun to continue"), std::string::npos) << stopped.out;
  auto rows = read_rows(dir / "index.csv");
  EXPECT_EQ(rows.at(first)["status"], "completed");
  ASSERT_EQ(rows.at(cut)["status"], "interrupted");
  const std::string cut_at = rows.at(cut)["steps"];
  expect_index_matches_files(dir);
  EXPECT_TRUE(fs::exists(dir / (cut + ".ckpt.h5"))) << "a clean stop leaves a checkpoint";

  // Rerun with train.final_checkpoint = false (say, after the disk filled): not a different study, so the finished
  // point is skipped and the stopped one resumes from its checkpoint, which then stays at its step.
  std::vector<std::string> no_final = args;
  no_final.insert(no_final.end(), {"--set", "train.final_checkpoint=false"});
  const CliResult rerun = run(no_final);
  EXPECT_EQ(rerun.exit_code, 0) << describe(rerun);
  EXPECT_NE(rerun.out.find("resume " + cut), std::string::npos) << rerun.out;
  EXPECT_NE(read_text(dir / "logs" / (cut + ".log")).find("resuming at step " + cut_at), std::string::npos);
  rows = read_rows(dir / "index.csv");
  EXPECT_EQ(rows.at(cut)["status"], "completed");
  EXPECT_EQ(rows.at(cut)["steps"], "2500");
  expect_index_matches_files(dir);
  EXPECT_EQ(read_checkpoint(dir / (cut + ".ckpt.h5")).int_value("step"), std::stoll(cut_at));
  // And again without it: both points finished, nothing to do.
  const CliResult again = run(args);
  EXPECT_EQ(again.exit_code, 0) << describe(again);
  EXPECT_EQ(read_rows(dir / "index.csv").at(cut)["steps"], "2500");

  // The same folder with a changed study would mix two studies: refused before anything starts.
  const std::string index_before = read_text(dir / "index.csv");
  std::string changed = read_text(work_ / "ci.toml");
  changed.replace(changed.find("batch = 4"), 9, "batch = 4\nlr = 0.002");
  write_file("ci.toml", changed);
  const CliResult stale = run(args);
  EXPECT_EQ(stale.exit_code, 2) << describe(stale);
  EXPECT_NE(stale.err.find("2 finished run(s) were made from a different study than this sweep now describes"),
            std::string::npos)
      << stale.err;
  EXPECT_EQ(read_text(dir / "index.csv"), index_before);
}

TEST_F(SweepRunTest, APointAnotherProcessIsWritingIsLeftToIt) {
  write_file("ci.toml",
             std::string(kStudy) + "[sweep]\nzip = { \"model.layers\" = [1, 2], \"train.steps\" = [30, 100000000] }\n");
  const fs::path dir = work_ / "out";
  const std::vector<std::string> args{"sweep", "ci.toml", "--out", "out", "--jobs", "2"};
  const std::string first = "layers=1,steps=30", endless = "layers=2,steps=100000000";
  const pid_t sweep = spawn_group(args);
  ASSERT_TRUE(wait_until_completed(dir / "index.csv", first, sweep));
  ASSERT_TRUE(wait_until_steps(dir / (endless + ".h5"), 5));
  ASSERT_EQ(kill(-sweep, SIGINT), 0);
  ASSERT_EQ(finish(sweep).exit_code, 4);

  // The endless point continued by hand, into the sweep's folder, from the point file the sweep wrote.
  const pid_t by_hand = spawn({"run", "out/points/" + endless + ".toml", "--out", "out", "--resume"});
  const fs::path run_file = dir / (endless + ".h5");
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (!(lock_holder(run_file) && lock_holder(run_file)->pid == by_hand) &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(5ms);
  ASSERT_TRUE(lock_holder(run_file).has_value()) << "the run started by hand did not take its lock";

  const CliResult rerun = run(args);
  EXPECT_EQ(rerun.exit_code, 4) << describe(rerun);
  const std::string holder = "being written by process " + std::to_string(by_hand) + " on host " + this_host_name();
  EXPECT_NE(rerun.out.find("sweep: skip " + endless + " (" + holder), std::string::npos) << rerun.out;
  EXPECT_NE(rerun.out.find("1 being written by another process"), std::string::npos) << rerun.out;
  const auto rows = read_rows(dir / "index.csv");
  EXPECT_EQ(rows.at(first)["status"], "completed");
  EXPECT_EQ(rows.at(endless)["status"], "running");
  EXPECT_NE(rows.at(endless)["detail"].find(holder), std::string::npos) << rows.at(endless)["detail"];
  // The run by hand went on undisturbed.
  ASSERT_EQ(kill(by_hand, SIGINT), 0);
  const CliResult stopped = finish(by_hand);
  EXPECT_EQ(stopped.exit_code, 4) << describe(stopped);
  EXPECT_EQ(RunReader::open(run_file).attribute_string("status_detail").rfind("interrupted", 0), 0u);
}

TEST_F(SweepRunTest, AnIoFailureIsRecordedWithItsMessageAndRetryResumesThePoint) {
  write_file("ci.toml", std::string(kStudy) + "[sweep]\nzip = { \"model.layers\" = [1, 2] }\n");
  std::string study = read_text(work_ / "ci.toml");
  study.replace(study.find("batch = 4"), 9, "batch = 4\ncheckpoint_every = 10");
  write_file("ci.toml", study);
  const fs::path dir = work_ / "out";
  const std::vector<std::string> args{"sweep", "ci.toml", "--out", "out"};
  CliResult failed;
  {
    // The second point's disk fills after its first checkpoint.
    const cli_test::ScopedEnv fault(cli_test::write_fault("/out/layers=2.h5", 1));
    failed = run(args);
  }
  EXPECT_EQ(failed.exit_code, 5) << describe(failed);
  auto rows = read_rows(dir / "index.csv");
  EXPECT_EQ(rows.at("layers=1")["status"], "completed");
  EXPECT_EQ(rows.at("layers=2")["status"], "failed");
  const std::string detail = rows.at("layers=2")["detail"];
  EXPECT_NE(detail.find("proplab: error: layers=2: I/O failure after 10 steps: No space left on device while "
                        "writing the run file"),
            std::string::npos)
      << detail;
  EXPECT_NE(detail.find("Last good checkpoint: step 10"), std::string::npos) << detail;
  EXPECT_NE(detail.find("(exit 6)"), std::string::npos) << detail;

  std::vector<std::string> retry = args;
  retry.push_back("--retry-failed");
  const CliResult retried = run(retry);
  EXPECT_EQ(retried.exit_code, 0) << describe(retried);
  EXPECT_NE(retried.out.find("resume layers=2"), std::string::npos) << retried.out;
  rows = read_rows(dir / "index.csv");
  EXPECT_EQ(rows.at("layers=2")["status"], "completed");
  EXPECT_EQ(rows.at("layers=2")["steps"], "30");
  expect_index_matches_files(dir);
}

TEST_F(SweepRunTest, DryRunValidatesEveryPointAndWritesNothing) {
  write_file("ci.toml", std::string(kStudy) + kFourPoints);
  const std::vector<std::string> before = list_tree(work_);
  const CliResult dry = run({"sweep", "ci.toml", "--dry-run", "--shard", "1/2"});
  EXPECT_EQ(dry.exit_code, 0) << describe(dry);
  EXPECT_NE(dry.out.find("4 points over model.layers model.vocab train.steps; shard 1/2: 2 points"), std::string::npos)
      << dry.out;
  EXPECT_NE(dry.out.find("1  " + std::string(kLong) + "  [pending -> start]"), std::string::npos) << dry.out;
  EXPECT_NE(dry.out.find("3  " + std::string(kShort)), std::string::npos) << dry.out;
  EXPECT_EQ(dry.out.find(kFirst), std::string::npos) << "point 0 is in shard 0/2";
  EXPECT_EQ(list_tree(work_), before);

  write_file("bad.toml",
             std::string(kStudy) + "[sweep]\ngrid = { \"model.layers\" = [1, 0], \"model.heads\" = [3] }\n");
  expect_bad_input({"sweep", "bad.toml", "--dry-run"},
                   {"bad.toml:25: sweep.grid.\"model.layers\"[1] = 0: model.layers: 0 is out of range",
                    "bad.toml:25: sweep.grid.\"model.heads\"[0] = 3: model.heads: model.width = 16 is not divisible"});
  expect_bad_input({"sweep", "bad.toml"}, {"model.layers: 0 is out of range"});
  expect_bad_input({"sweep", "ci.toml", "--shard", "2/2"}, {"--shard 2/2: not a shard"});
  expect_bad_input({"run", "ci.toml"}, {"has a [sweep] table"});
}

TEST_F(SweepRunTest, EmitSlurmWritesTheArrayScript) {
  write_file("ci.toml", std::string(kStudy) + kFourPoints);
  const CliResult emitted = run({"sweep", "ci.toml", "--emit", "slurm", "--out", "out", "--tasks", "2", "--jobs", "2"});
  EXPECT_EQ(emitted.exit_code, 0) << describe(emitted);
  const fs::path script = work_ / "out" / "ci.sbatch";
  ASSERT_TRUE(fs::exists(script)) << describe(emitted);
  const std::string text = read_text(script);
  EXPECT_NE(text.find("#SBATCH --array=0-1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("exec '" + fs::canonical(binary_).string() + "' sweep '" + (work_ / "ci.toml").string() + "'"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("--out '" + (work_ / "out").string() + "' --jobs 2"), std::string::npos) << text;
  EXPECT_NE(text.find("--shard \"${SLURM_ARRAY_TASK_ID}/${SLURM_ARRAY_TASK_COUNT}\""), std::string::npos) << text;
  // The script is valid shell.
  const CliResult syntax = run_program("/bin/bash", {"-n", script.string()});
  EXPECT_EQ(syntax.exit_code, 0) << describe(syntax);
}

}  // namespace
}  // namespace proplab::cli_test

namespace proplab::cli_test {
namespace {

// Every shipped study validates: a sweep study passes `proplab sweep --dry-run` (every point checked), a single
// study (quickstart.toml) loads; studies/README.md lists each one.
TEST_F(SweepRunTest, EveryShippedStudyPassesDryRun) {
  const char* source = std::getenv("PROPLAB_SOURCE_DIR");
  ASSERT_TRUE(source != nullptr && *source != '\0') << "PROPLAB_SOURCE_DIR is not set: run through ctest";
  const fs::path studies = fs::path(source) / "studies";
  const std::string readme = read_text(studies / "README.md");
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(studies))
    if (entry.path().extension() == ".toml") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  ASSERT_GE(files.size(), 7u) << "quickstart plus the six studies of issue 6";
  int sweeps = 0;
  for (const fs::path& file : files) {
    SCOPED_TRACE(file.filename().string());
    const std::string text = read_text(file);
    EXPECT_EQ(text.rfind("# ", 0), 0u) << "a study opens with a header comment";
    EXPECT_NE(readme.find("`" + file.filename().string() + "`"), std::string::npos) << "listed in studies/README.md";
    if (text.find("\n[sweep]") == std::string::npos) {
      EXPECT_NO_THROW(load_study(file.string())) << file;
      continue;
    }
    ++sweeps;
    EXPECT_NE(text.find("# Time:"), std::string::npos) << "the header states the time it takes";
    const CliResult dry = run({"sweep", file.string(), "--dry-run", "--out", (work_ / "out").string()});
    EXPECT_EQ(dry.exit_code, 0) << describe(dry);
    EXPECT_NE(dry.out.find("dry run: every point is valid"), std::string::npos) << dry.out;
  }
  EXPECT_GE(sweeps, 6);
  EXPECT_FALSE(fs::exists(work_ / "out")) << "a dry run writes nothing";
}

}  // namespace
}  // namespace proplab::cli_test
