#include "io/run_lock.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>
#include <vector>

#include "core/error.h"
#include "io/run_file.h"

namespace proplab {

namespace fs = std::filesystem;

namespace {

// A whole-file write lock description for fcntl.
struct flock whole_file_lock() {
  struct flock lock {};
  lock.l_type = F_WRLCK;
  lock.l_whence = SEEK_SET;
  lock.l_start = 0;
  lock.l_len = 0;
  lock.l_pid = 0;  // required for open-file-description locks
  return lock;
}

// The holder lines of an open lock file (empty fields when it has not written them yet).
RunLockHolder read_holder(int descriptor) {
  std::string text(4096, '\0');
  const ssize_t length = ::pread(descriptor, text.data(), text.size(), 0);
  text.resize(length > 0 ? static_cast<std::size_t>(length) : 0);
  RunLockHolder holder;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    const auto space = line.find(' ');
    if (space == std::string::npos) continue;
    const std::string key = line.substr(0, space), value = line.substr(space + 1);
    if (key == "pid")
      holder.pid = std::strtol(value.c_str(), nullptr, 10);
    else if (key == "host")
      holder.host = value;
    else if (key == "since")
      holder.since = value;
  }
  return holder;
}

bool same_file(int descriptor, const fs::path& path) {
  struct stat opened {};
  struct stat named {};
  if (::fstat(descriptor, &opened) != 0 || ::stat(path.c_str(), &named) != 0) return false;
  return opened.st_dev == named.st_dev && opened.st_ino == named.st_ino;
}

std::string lock_error(const fs::path& lock_file, const char* what, int error_number) {
  return detail::concat("cannot ", what, " the lock file '", lock_file.string(), "': ", std::strerror(error_number),
                        error_number == ENOLCK || error_number == EINVAL
                            ? " (this file system does not support locks; write the run to a local or lock-capable "
                              "file system with --out)"
                            : "");
}

}  // namespace

fs::path run_lock_path(const fs::path& run_file) {
  fs::path lock = run_file;
  lock.replace_extension(".lock");
  return lock;
}

std::string RunLockHolder::describe() const {
  if (pid == 0) return "another process (it has not written its id into the lock file yet)";
  std::string text = "process " + std::to_string(pid) + " on host " + (host.empty() ? "?" : host);
  if (!since.empty()) text += " (since " + since + ")";
  return text;
}

RunLock RunLock::acquire(const fs::path& run_file) {
  const fs::path lock_file = run_lock_path(run_file);
  std::vector<fs::path> created;  // the directories this creates, innermost first
  if (lock_file.has_parent_path()) {
    std::error_code error;
    for (fs::path missing = lock_file.parent_path(); !missing.empty() && !fs::exists(missing, error);
         missing = missing.parent_path()) {
      created.push_back(missing);
      if (!missing.has_relative_path() || missing.parent_path() == missing) break;
    }
    fs::create_directories(lock_file.parent_path(), error);
    if (error)
      throw UserError(detail::concat("cannot create directory '", lock_file.parent_path().string(), "' for run file '",
                                     run_file.string(), "': ", error.message()));
  }
  // A releasing holder removes its lock file after we opened it: then lock the new one.
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int descriptor = ::open(lock_file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (descriptor < 0) throw UserError(lock_error(lock_file, "create", errno));
    struct flock lock = whole_file_lock();
    if (::fcntl(descriptor, F_OFD_SETLK, &lock) != 0) {
      const int error_number = errno;
      if (error_number != EAGAIN && error_number != EACCES) {
        ::close(descriptor);
        throw UserError(lock_error(lock_file, "lock", error_number));
      }
      const RunLockHolder holder = read_holder(descriptor);
      ::close(descriptor);
      throw UserError(detail::concat(
          "run file '", run_file.string(), "' is being written by another proplab run: ", holder.describe(),
          ", holding '", lock_file.string(), "'; allowed: one writer per run file: wait for that run to end, stop it ",
          "(Ctrl-C, then continue it with --resume), or write this run elsewhere with --out"));
    }
    if (!same_file(descriptor, lock_file)) {
      ::close(descriptor);
      continue;
    }
    const std::string text =
        detail::concat("pid ", ::getpid(), "\nhost ", this_host_name(), "\nsince ", iso8601_utc_now(), "\n");
    if (::ftruncate(descriptor, 0) != 0 ||
        ::pwrite(descriptor, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
      const int error_number = errno;
      ::unlink(lock_file.c_str());
      ::close(descriptor);
      throw UserError(lock_error(lock_file, "write", error_number));
    }
    return RunLock(lock_file, descriptor, std::move(created));
  }
  throw InternalError(
      detail::concat("the lock file '", lock_file.string(), "' was replaced 100 times while it was being locked"));
}

RunLock::RunLock(RunLock&& other) noexcept
    : path_(std::move(other.path_)),
      descriptor_(other.descriptor_),
      created_directories_(std::move(other.created_directories_)) {
  other.descriptor_ = -1;
}

RunLock& RunLock::operator=(RunLock&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    descriptor_ = other.descriptor_;
    created_directories_ = std::move(other.created_directories_);
    other.descriptor_ = -1;
  }
  return *this;
}

RunLock::~RunLock() { release(); }

void RunLock::release() noexcept {
  if (descriptor_ < 0) return;
  // Removed while still held, so no other process can have locked the file being removed.
  if (same_file(descriptor_, path_)) ::unlink(path_.c_str());
  ::close(descriptor_);
  descriptor_ = -1;
  // Directories it created that nothing else filled (rmdir refuses a non-empty one).
  for (const fs::path& directory : created_directories_)
    if (::rmdir(directory.c_str()) != 0) break;
  created_directories_.clear();
}

std::optional<RunLockHolder> lock_holder(const fs::path& run_file) {
  const fs::path lock_file = run_lock_path(run_file);
  const int descriptor = ::open(lock_file.c_str(), O_RDONLY | O_CLOEXEC);
  if (descriptor < 0) return std::nullopt;
  struct flock lock = whole_file_lock();
  std::optional<RunLockHolder> holder;
  if (::fcntl(descriptor, F_OFD_GETLK, &lock) == 0 && lock.l_type != F_UNLCK) holder = read_holder(descriptor);
  ::close(descriptor);
  return holder;
}

}  // namespace proplab
