// Shared helpers for the io tests: a scratch directory per test.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "core/error.h"

namespace proplab::io_test {

// A fresh, empty directory named after the running test; removed when the object goes away.
class ScratchDirectory {
 public:
  ScratchDirectory() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() /
            ("proplab_io_" + std::to_string(::getpid()) + "_" + info->test_suite_name() + "_" + info->name());
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDirectory() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ScratchDirectory(const ScratchDirectory&) = delete;
  ScratchDirectory& operator=(const ScratchDirectory&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

// Runs `body` and returns the UserError's message; fails the test if no UserError is thrown.
template <typename Body>
std::string user_error_message(Body body) {
  try {
    body();
  } catch (const UserError& error) {
    return error.what();
  }
  ADD_FAILURE() << "expected a UserError";
  return "";
}

}  // namespace proplab::io_test
