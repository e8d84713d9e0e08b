// Shared by the command-line tests: the built `proplab` executable (or another program) is run as a child
// process, each test in a fresh temporary working directory, and its exit status, stdout, stderr and the files
// it leaves are checked.
//
// The environment names the executable (PROPLAB_BINARY) and the source tree (PROPLAB_SOURCE_DIR); ctest sets
// both (cmake/ProplabHelpers.cmake, add_proplab_test).
#pragma once

#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace proplab::cli_test {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// The tiny transformer most run tests train: 20 steps take a few milliseconds.
inline constexpr const char* kTinyStudy = R"(name = "tiny"
seed = 3

[model]
type = "transformer"
layers = 1
width = 16
heads = 2
vocab = 16
seq_len = 8

[data]
kind = "markov"

[train]
steps = 20
batch = 4
eval_every = 10

[device]
type = "cpu"
threads = 1
)";

// `text` with its first `from` replaced by `to` (std::logic_error when `from` is not there).
inline std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const std::size_t at = text.find(from);
  if (at == std::string::npos) throw std::logic_error("`" + from + "` is not in:\n" + text);
  return text.replace(at, from.size(), to);
}

inline constexpr auto kChildTimeout = 120s;

// Sets environment variables (inherited by the children spawned meanwhile) and restores them when it goes away.
class ScopedEnv {
 public:
  explicit ScopedEnv(const std::vector<std::pair<std::string, std::string>>& values) {
    for (const auto& [name, value] : values) {
      const char* before = std::getenv(name.c_str());
      saved_.emplace_back(name, before ? std::optional<std::string>(before) : std::nullopt);
      ::setenv(name.c_str(), value.c_str(), 1);
    }
  }
  ~ScopedEnv() {
    for (const auto& [name, value] : saved_) {
      if (value)
        ::setenv(name.c_str(), value->c_str(), 1);
      else
        ::unsetenv(name.c_str());
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

#ifdef PROPLAB_WRITE_FAULT_LIBRARY
// The environment that makes the children's writes to files ending in `file` fail with `error_number` (ENOSPC by
// default) once `arm_after_checkpoints` checkpoints were committed and `skip` more writes to it went through,
// `writes` times (-1: from then on, as a disk that stays full). tests/support/write_fault.c says how.
inline std::vector<std::pair<std::string, std::string>> write_fault(const std::string& file, int arm_after_checkpoints,
                                                                    int writes = -1, int error_number = ENOSPC,
                                                                    int skip = 0) {
  return {{"LD_PRELOAD", PROPLAB_WRITE_FAULT_LIBRARY},
          {"PROPLAB_FAULT_FILE", file},
          {"PROPLAB_FAULT_ARM_RENAME", std::to_string(arm_after_checkpoints)},
          {"PROPLAB_FAULT_ARM_SUFFIX", ".ckpt.h5"},
          {"PROPLAB_FAULT_WRITES", std::to_string(writes)},
          {"PROPLAB_FAULT_SKIP", std::to_string(skip)},
          {"PROPLAB_FAULT_ERRNO", std::to_string(error_number)}};
}
#endif

struct CliResult {
  int exit_code = -1;  // the exit status; 128 + signal when the child was killed by a signal
  std::string out, err;
};

inline std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Every regular file under `root`, relative to it, sorted.
inline std::vector<std::string> list_tree(const fs::path& root) {
  std::vector<std::string> files;
  for (const auto& entry : fs::recursive_directory_iterator(root))
    files.push_back(fs::relative(entry.path(), root).generic_string() + (entry.is_directory() ? "/" : ""));
  std::sort(files.begin(), files.end());
  return files;
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* binary = std::getenv("PROPLAB_BINARY");
    ASSERT_TRUE(binary != nullptr && *binary != '\0')
        << "PROPLAB_BINARY is not set: run through ctest, or set it to the built proplab executable";
    binary_ = fs::absolute(binary);
    ASSERT_TRUE(fs::is_regular_file(binary_)) << "PROPLAB_BINARY = " << binary_ << " is not a file";
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    static std::atomic<int> counter{0};
    base_ = fs::temp_directory_path() /
            ("proplab_cli_" + std::to_string(getpid()) + "_" + info->name() + "_" + std::to_string(counter++));
    fs::remove_all(base_);
    work_ = base_ / "work";
    capture_ = base_ / "capture";
    fs::create_directories(work_);
    fs::create_directories(capture_);
  }

  void TearDown() override {
    if (!base_.empty()) {
      std::error_code error;
      fs::remove_all(base_, error);
    }
  }

  fs::path write_file(const std::string& name, const std::string& text) {
    const fs::path path = work_ / name;
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }

  // Starts `program args...` in the working directory, stdout and stderr going to files (so not a terminal).
  pid_t spawn_program(const fs::path& program, const std::vector<std::string>& args) {
    ++runs_;
    out_path_ = capture_ / ("out" + std::to_string(runs_) + ".txt");
    err_path_ = capture_ / ("err" + std::to_string(runs_) + ".txt");
    // Everything the child needs is prepared before fork: after it only async-signal-safe calls.
    const std::string executable = program.string(), work = work_.string();
    const std::string out = out_path_.string(), err = err_path_.string();
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(executable.c_str()));
    for (const auto& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
    argv.push_back(nullptr);
    const pid_t pid = fork();
    if (pid == 0) {
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
    EXPECT_GT(pid, 0) << "fork failed: " << std::strerror(errno);
    captures_[pid] = {out_path_, err_path_};
    return pid;
  }

  // Starts `proplab args...` (see spawn_program).
  pid_t spawn(const std::vector<std::string>& args) { return spawn_program(binary_, args); }

  // Waits for the child `pid` (killing it after kChildTimeout) and collects its output.
  CliResult finish(pid_t pid) {
    CliResult result;
    const auto deadline = std::chrono::steady_clock::now() + kChildTimeout;
    int status = 0;
    while (true) {
      const pid_t done = waitpid(pid, &status, WNOHANG);
      if (done == pid) break;
      if (done < 0) {
        ADD_FAILURE() << "waitpid failed: " << std::strerror(errno);
        return result;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        ADD_FAILURE() << "the child did not finish within " << kChildTimeout.count() << " s; killed";
        break;
      }
      std::this_thread::sleep_for(5ms);
    }
    if (WIFEXITED(status))
      result.exit_code = WEXITSTATUS(status);
    else if (WIFSIGNALED(status))
      result.exit_code = 128 + WTERMSIG(status);
    const auto capture = captures_.find(pid);
    result.out = read_text(capture != captures_.end() ? capture->second.first : out_path_);
    result.err = read_text(capture != captures_.end() ? capture->second.second : err_path_);
    EXPECT_NE(result.exit_code, 127) << "could not execute the child program";
    return result;
  }

  CliResult run(const std::vector<std::string>& args) { return finish(spawn(args)); }
  CliResult run_program(const fs::path& program, const std::vector<std::string>& args) {
    return finish(spawn_program(program, args));
  }

  // Runs a study that must be refused as bad input: exit 2, every expected text in stderr, and nothing written
  // (the working directory holds exactly what it held before).
  CliResult expect_bad_input(const std::vector<std::string>& args, const std::vector<std::string>& expected) {
    const std::vector<std::string> before = list_tree(work_);
    CliResult result = run(args);
    EXPECT_EQ(result.exit_code, 2) << "stderr:\n" << result.err << "stdout:\n" << result.out;
    EXPECT_FALSE(result.err.empty()) << "bad input must be explained on stderr";
    for (const auto& text : expected)
      EXPECT_NE(result.err.find(text), std::string::npos) << "stderr lacks `" << text << "`:\n" << result.err;
    EXPECT_EQ(list_tree(work_), before) << "bad input left files behind";
    return result;
  }

  std::string describe(const CliResult& result) const {
    return "exit " + std::to_string(result.exit_code) + "\nstdout:\n" + result.out + "stderr:\n" + result.err;
  }

  fs::path binary_, base_, work_, capture_, out_path_, err_path_;
  std::map<pid_t, std::pair<fs::path, fs::path>> captures_;  // each child's stdout and stderr files
  int runs_ = 0;
};

}  // namespace proplab::cli_test
