// io/run_lock: one writer per run. The process that writes a run's files (DIR/<name>.h5, its checkpoint
// DIR/<name>.ckpt.h5 and their temporary files) first takes an exclusive lock on DIR/<name>.lock and holds it
// until it has finished writing them.
//
// Invariants:
// - The lock is an open-file-description lock (fcntl F_OFD_SETLK, whole file, write lock) on DIR/<name>.lock: the
//   kernel drops it when its holder exits for any reason, SIGKILL included, so a lock file left by a dead process
//   never blocks. The holder writes "pid", "host" and "since" lines into the file for the messages of whoever is
//   refused; readers of the run file (RunReader, the GUI, h5py) never look at it and are never blocked.
// - Acquiring never waits: a lock held by another process is a UserError naming the run file, the holder's process
//   id and host, and what to do. The lock file is removed when the lock is released, and so are the directories
//   acquisition created when they are still empty (a run refused as bad input leaves nothing behind); acquisition
//   checks that the file it locked is still the one at DIR/<name>.lock (a releasing holder may have just removed it).
// - Checking who holds a lock (lock_holder) takes no lock, so it never makes a writer's acquisition fail.
// - Network file systems: the lock works across machines only where the file system passes fcntl locks to its
//   server (NFSv4, or NFSv3 with lockd; Lustre and GPFS mounted with locking). On a file system mounted without
//   locking (e.g. NFS with `nolock`, Lustre with `noflock`), two machines can each take "the" lock.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace proplab {

// DIR/<name>.lock for the run file DIR/<name>.h5.
std::filesystem::path run_lock_path(const std::filesystem::path& run_file);

// Who holds a run's lock, as its lock file says.
struct RunLockHolder {
  long pid = 0;                  // 0 when the holder has not written it yet
  std::string host;              // "" likewise
  std::string since;             // ISO 8601 UTC
  std::string describe() const;  // "process 1234 on host node7 (since 2026-12-02T10:00:00Z)"
};

class RunLock {
 public:
  // Takes the lock of `run_file` (creating its directory when missing). UserError when another process holds it
  // (naming the file, the holder's process id and host) or when the lock file cannot be created.
  static RunLock acquire(const std::filesystem::path& run_file);

  RunLock(RunLock&& other) noexcept;
  RunLock& operator=(RunLock&& other) noexcept;
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;
  // Releases the lock and removes the lock file.
  ~RunLock();

  const std::filesystem::path& path() const { return path_; }

 private:
  RunLock(std::filesystem::path path, int descriptor, std::vector<std::filesystem::path> created)
      : path_(std::move(path)), descriptor_(descriptor), created_directories_(std::move(created)) {}
  void release() noexcept;

  std::filesystem::path path_;
  int descriptor_ = -1;
  std::vector<std::filesystem::path> created_directories_;  // innermost first
};

// The live holder of the lock of `run_file`, or nothing when no process holds it (no lock file, or one left by a
// process that has died).
std::optional<RunLockHolder> lock_holder(const std::filesystem::path& run_file);

}  // namespace proplab
