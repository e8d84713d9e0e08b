// gui/data/run_library: the runs under the files and folders the user opened, kept up to date on a worker thread.
//
// Invariants:
// - All file I/O (directory scans, HDF5 reads) happens on the library's worker thread, or in update_now() for
//   callers without one (tests, tools). The UI thread only calls snapshot(), which copies shared pointers under a
//   lock and never waits for a read in progress.
// - Discovery is recursive: every regular file ending in ".h5" under a folder, except checkpoints ("*.ckpt.h5");
//   a file named directly is always taken. Folders are rescanned every `rescan_interval_s`, so new runs appear
//   and removed ones disappear.
// - A run is re-read when its file's size or modification time changes, and every `live_interval_s` while its
//   status is "running" (HDF5 SWMR: new records appear while the writer goes on).
// - A file that cannot be read becomes a snapshot with an `error`, listed like the others; it never stops the
//   library. Problems that are not about one file (a missing path, an empty folder) go to `problems`.
// - Runs are listed sorted by path. `generation` grows by one at each published change.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gui/data/run_data.h"

namespace proplab::gui {

struct RunLibraryOptions {
  double rescan_interval_s = 2.0;  // folders are listed again this often
  double live_interval_s = 1.0;    // running runs are re-read this often
  bool start_worker = true;        // false: nothing happens until update_now()
};

struct LibrarySnapshot {
  std::vector<std::shared_ptr<const RunSnapshot>> runs;  // sorted by path
  std::vector<std::string> problems;                     // e.g. "folder 'x' holds no run files (*.h5)"
  std::uint64_t generation = 0;
  bool initial_scan_done = false;  // every file found by the first scan has been read once
};

// Every run file under `roots` (recursive for folders), sorted; problems such as a missing path or a folder
// without run files are appended to `problems`.
std::vector<std::filesystem::path> discover_run_files(const std::vector<std::filesystem::path>& roots,
                                                      std::vector<std::string>& problems);

class RunLibrary {
 public:
  explicit RunLibrary(std::vector<std::filesystem::path> roots, RunLibraryOptions options = {});
  ~RunLibrary();
  RunLibrary(const RunLibrary&) = delete;
  RunLibrary& operator=(const RunLibrary&) = delete;

  // Adds a file or folder (e.g. from Ctrl+O); the worker scans it at once.
  void add_root(const std::filesystem::path& root);
  std::vector<std::filesystem::path> roots() const;

  // The current state; cheap (copies pointers under a lock).
  LibrarySnapshot snapshot() const;
  std::uint64_t generation() const;

  // Blocks until the first scan has read every file it found, or `timeout_s` passes; true when done.
  // For the headless renderer and tests, never for the frame loop.
  bool wait_for_initial_scan(double timeout_s) const;
  // Blocks until generation() > `generation` or `timeout_s` passes; true on a change.
  bool wait_for_change(std::uint64_t generation, double timeout_s) const;

  // One full pass on the calling thread: scan every root, read new and changed files, re-read running ones.
  // Only for a library made with start_worker = false.
  void update_now();

 private:
  struct Known {
    std::shared_ptr<const RunSnapshot> run;
    double last_read_s = 0.0;  // steady clock seconds
  };
  void worker_loop();
  // One pass; `force_scan` lists the folders even if the rescan interval has not passed.
  void pass(bool force_scan);
  void publish(const std::filesystem::path& path, std::shared_ptr<const RunSnapshot> run);

  RunLibraryOptions options_;
  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;  // generation_ moved or roots_ changed or stop_
  std::vector<std::filesystem::path> roots_;
  bool roots_changed_ = true;
  std::map<std::filesystem::path, std::shared_ptr<const RunSnapshot>> published_;
  std::vector<std::string> problems_;
  std::uint64_t generation_ = 0;
  bool initial_scan_done_ = false;
  bool stop_ = false;

  // Only touched by the thread doing passes.
  std::map<std::filesystem::path, Known> known_;
  std::vector<std::filesystem::path> discovered_;
  double last_scan_s_ = -1e30;

  std::thread worker_;
};

}  // namespace proplab::gui
