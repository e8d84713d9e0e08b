// One writer per run file, end to end: while `proplab run` writes a run, a second `proplab run` into the same
// output is refused before any work (exit 2, naming the file, the holder's process id and host), whichever of plain,
// --force and --resume either of them uses; `proplab recover` is refused too; readers are not blocked; the first run
// goes on undisturbed. A lock left by a SIGKILLed run blocks nobody.
#include <gtest/gtest.h>

#include "cli/cli_test_support.h"
#include "io/checkpoint.h"
#include "io/run_file.h"
#include "io/run_lock.h"
#include "io/run_reader.h"

namespace proplab {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using cli_test::CliResult;

// The tiny study, run until it is stopped (a step takes well under a millisecond), with a checkpoint every 50 steps.
const std::string kEndless =
    cli_test::replaced(cli_test::replaced(cli_test::kTinyStudy, "name = \"tiny\"", "name = \"endless\""), "steps = 20",
                       "steps = 100000000\ncheckpoint_every = 50") +
    "\n[record]\nevery = 1000\n";

class OneWriterTest : public cli_test::CliTest {
 protected:
  fs::path run_file(const std::string& out) const { return work_ / out / "endless.h5"; }

  // Starts `proplab run endless.toml --out OUT [flag]` and waits until it holds the run's lock.
  pid_t start_writer(const std::string& out, const std::string& flag) {
    std::vector<std::string> args = {"run", "endless.toml", "--out", out};
    if (!flag.empty()) args.push_back(flag);
    const pid_t pid = spawn(args);
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    while (std::chrono::steady_clock::now() < deadline) {
      const auto holder = lock_holder(run_file(out));
      // (and the run file exists: the writer is past its start, so a refusal cannot come from anything else)
      if (holder && holder->pid == pid && fs::exists(run_file(out))) return pid;
      std::this_thread::sleep_for(5ms);
    }
    ADD_FAILURE() << "the writer did not take the lock within 60 s";
    return pid;
  }

  // Stops the writer with SIGINT and checks it ended as an interrupted run with a readable file.
  void stop_writer(pid_t pid, const std::string& out) {
    ASSERT_EQ(::kill(pid, SIGINT), 0);
    const CliResult stopped = finish(pid);
    EXPECT_EQ(stopped.exit_code, 4) << describe(stopped);
    RunReader reader = RunReader::open(run_file(out), RunOpenMode::normal);
    EXPECT_EQ(reader.status(), RunStatus::failed);
    EXPECT_EQ(reader.attribute_string("status_detail").rfind("interrupted at step", 0), 0u)
        << reader.attribute_string("status_detail");
    EXPECT_GT(reader.read_train().size(), 0u);
    EXPECT_FALSE(fs::exists(run_lock_path(run_file(out)))) << "a finished writer leaves its lock file behind";
  }
};

TEST_F(OneWriterTest, SecondWriterIsRefusedForEveryCombinationOfPlainForceAndResume) {
  write_file("endless.toml", kEndless);
  const std::vector<std::string> flags = {"", "--force", "--resume"};
  int index = 0;
  for (const std::string& first : flags) {
    for (const std::string& second : flags) {
      SCOPED_TRACE("first " + (first.empty() ? std::string("plain") : first) + ", second " +
                   (second.empty() ? std::string("plain") : second));
      const std::string out = "out" + std::to_string(index++);
      if (first == "--resume") {  // something to resume from
        const CliResult prepared = run({"run", "endless.toml", "--out", out, "--stop-after", "50"});
        ASSERT_EQ(prepared.exit_code, 4) << describe(prepared);
      }
      const pid_t writer = start_writer(out, first);
      std::vector<std::string> args = {"run", "endless.toml", "--out", out};
      if (!second.empty()) args.push_back(second);
      const CliResult refused = run(args);
      EXPECT_EQ(refused.exit_code, 2) << describe(refused);
      EXPECT_NE(refused.err.find("run file '" + out + "/endless.h5' is being written by another proplab run"),
                std::string::npos)
          << refused.err;
      EXPECT_NE(refused.err.find("process " + std::to_string(writer) + " on host " + this_host_name()),
                std::string::npos)
          << refused.err;
      EXPECT_EQ(refused.out, "") << "the refused run started work";
      EXPECT_EQ(std::count(refused.err.begin(), refused.err.end(), '\n'), 1) << refused.err;
      if (index == 1) {
        // Readers are never blocked; recover is refused while the run lives.
        const CliResult inspected = run({"inspect", out + "/endless.h5"});
        EXPECT_EQ(inspected.exit_code, 0) << describe(inspected);
        const CliResult recovered = run({"recover", out + "/endless.h5"});
        EXPECT_EQ(recovered.exit_code, 2) << describe(recovered);
        EXPECT_NE(recovered.err.find("is being written by process " + std::to_string(writer)), std::string::npos)
            << recovered.err;
      }
      stop_writer(writer, out);
    }
  }
}

TEST_F(OneWriterTest, LockOfAKilledRunBlocksNobody) {
  write_file("endless.toml", kEndless);
  const pid_t writer = start_writer("out", "");
  // Past its first checkpoint, so that there is something to resume.
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (!fs::exists(work_ / "out" / "endless.ckpt.h5") && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(5ms);
  ASSERT_EQ(::kill(writer, SIGKILL), 0);
  const CliResult killed = finish(writer);
  EXPECT_EQ(killed.exit_code, 128 + SIGKILL);
  ASSERT_TRUE(fs::exists(run_lock_path(run_file("out")))) << "the killed run's lock file is gone";
  EXPECT_FALSE(lock_holder(run_file("out")).has_value());

  const CliResult recovered = run({"recover", "out/endless.h5"});
  EXPECT_EQ(recovered.exit_code, 0) << describe(recovered);
  const std::int64_t checkpoint = read_checkpoint(work_ / "out" / "endless.ckpt.h5").int_value("step");
  const CliResult resumed =
      run({"run", "endless.toml", "--out", "out", "--resume", "--stop-after", std::to_string(checkpoint + 10)});
  EXPECT_EQ(resumed.exit_code, 4) << describe(resumed);
  EXPECT_NE(resumed.out.find("resuming at step " + std::to_string(checkpoint)), std::string::npos) << resumed.out;
  EXPECT_FALSE(fs::exists(run_lock_path(run_file("out"))));
  const CliResult forced = run({"run", "endless.toml", "--out", "out", "--force", "--stop-after", "5"});
  EXPECT_EQ(forced.exit_code, 4) << describe(forced);
}

}  // namespace
}  // namespace proplab
