// io/run_lock: one writer per run file. The lock names its holder, refuses a second one, disappears with its
// holder (a SIGKILLed process included) and is seen by lock_holder without being taken.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <thread>

#include "core/error.h"
#include "io/run_file.h"
#include "io/run_lock.h"
#include "support/temp_dir.h"

namespace proplab {
namespace {

namespace fs = std::filesystem;

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

TEST(RunLock, LockFileSitsBesideTheRunFile) {
  EXPECT_EQ(run_lock_path("runs/q/quickstart.h5"), fs::path("runs/q/quickstart.lock"));
  EXPECT_EQ(run_lock_path("a.b.h5"), fs::path("a.b.lock"));
}

TEST(RunLock, HolderIsWrittenAndTheFileGoesWithTheLock) {
  testing::TempDir dir("run_lock_holder");
  const fs::path run_file = dir.path() / "sub" / "run.h5";
  EXPECT_FALSE(lock_holder(run_file).has_value());
  {
    RunLock lock = RunLock::acquire(run_file);  // creates the missing directory
    EXPECT_TRUE(fs::exists(dir.path() / "sub" / "run.lock"));
    const std::string text = read_text(lock.path());
    EXPECT_NE(text.find("pid " + std::to_string(::getpid()) + "\n"), std::string::npos) << text;
    EXPECT_NE(text.find("host " + this_host_name() + "\n"), std::string::npos) << text;
    const std::optional<RunLockHolder> holder = lock_holder(run_file);
    ASSERT_TRUE(holder.has_value());
    EXPECT_EQ(holder->pid, ::getpid());
    EXPECT_EQ(holder->host, this_host_name());
    EXPECT_FALSE(holder->since.empty());
    // Moving keeps the one lock.
    RunLock moved = std::move(lock);
    EXPECT_TRUE(lock_holder(run_file).has_value());
  }
  EXPECT_FALSE(fs::exists(dir.path() / "sub")) << "the directory the lock created (and nothing filled) stays";
  EXPECT_FALSE(lock_holder(run_file).has_value());
  RunLock again = RunLock::acquire(run_file);  // free again
}

TEST(RunLock, DirectoriesItCreatedStayWhenTheyHoldFiles) {
  testing::TempDir dir("run_lock_directories");
  {
    const RunLock lock = RunLock::acquire(dir.path() / "a" / "b" / "run.h5");
    std::ofstream(dir.path() / "a" / "b" / "run.h5") << "written";
  }
  EXPECT_TRUE(fs::exists(dir.path() / "a" / "b" / "run.h5"));
  { const RunLock lock = RunLock::acquire(dir.path() / "c" / "d" / "run.h5"); }
  EXPECT_FALSE(fs::exists(dir.path() / "c"));
  EXPECT_TRUE(fs::exists(dir.path()));
}

TEST(RunLock, SecondWriterIsRefusedNamingTheFileTheProcessAndTheHost) {
  testing::TempDir dir("run_lock_second");
  const fs::path run_file = dir.path() / "run.h5";
  const RunLock first = RunLock::acquire(run_file);
  try {
    RunLock second = RunLock::acquire(run_file);
    FAIL() << "a second lock on one run file was granted";
  } catch (const UserError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find(run_file.string()), std::string::npos) << message;
    EXPECT_NE(message.find("process " + std::to_string(::getpid())), std::string::npos) << message;
    EXPECT_NE(message.find("on host " + this_host_name()), std::string::npos) << message;
    EXPECT_NE(message.find("--resume"), std::string::npos) << message;
  }
  // The refusal neither removed nor rewrote the holder's file.
  EXPECT_EQ(lock_holder(run_file)->pid, ::getpid());
}

TEST(RunLock, LockOfAKilledProcessDoesNotBlock) {
  testing::TempDir dir("run_lock_stale");
  const fs::path run_file = dir.path() / "run.h5";
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    try {
      RunLock lock = RunLock::acquire(run_file);
      const char byte = 1;
      if (::write(ready[1], &byte, 1) != 1) ::_exit(3);
      while (true) ::pause();
    } catch (...) {
      ::_exit(2);
    }
  }
  char byte = 0;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1);
  ::close(ready[0]);
  ::close(ready[1]);
  const std::optional<RunLockHolder> held = lock_holder(run_file);
  ASSERT_TRUE(held.has_value());
  EXPECT_EQ(held->pid, child);
  EXPECT_THROW(RunLock::acquire(run_file), UserError);

  ASSERT_EQ(::kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status));
  // Its lock file stays behind, naming the dead process, and blocks nobody.
  EXPECT_NE(read_text(run_lock_path(run_file)).find("pid " + std::to_string(child)), std::string::npos);
  EXPECT_FALSE(lock_holder(run_file).has_value());
  const RunLock taken = RunLock::acquire(run_file);
  EXPECT_EQ(lock_holder(run_file)->pid, ::getpid());
}

}  // namespace
}  // namespace proplab
