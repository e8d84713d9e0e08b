// A fresh, empty temporary directory for one test, removed with everything in it when the object goes away.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

namespace proplab::testing {

class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "proplab-test") {
    path_ = std::filesystem::temp_directory_path() /
            (prefix + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter_++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  std::filesystem::path path_;
};

}  // namespace proplab::testing
