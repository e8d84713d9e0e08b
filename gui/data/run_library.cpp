#include "gui/data/run_library.h"

#include <algorithm>
#include <chrono>
#include <set>

#include "core/error.h"

namespace proplab::gui {

namespace fs = std::filesystem;

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_run_file_name(const fs::path& path) {
  const std::string name = path.filename().string();
  return ends_with(name, ".h5") && !ends_with(name, ".ckpt.h5");
}

}  // namespace

std::vector<fs::path> discover_run_files(const std::vector<fs::path>& roots, std::vector<std::string>& problems) {
  std::set<fs::path> found;
  for (const auto& root : roots) {
    std::error_code error;
    const auto status = fs::status(root, error);
    if (error || !fs::exists(status)) {
      problems.push_back(detail::concat("'", root.string(), "': no such file or folder"));
      continue;
    }
    if (!fs::is_directory(status)) {
      found.insert(root.lexically_normal());
      continue;
    }
    std::size_t in_folder = 0;
    fs::recursive_directory_iterator it(root, fs::directory_options::skip_permission_denied, error);
    if (error) {
      problems.push_back(detail::concat("folder '", root.string(), "' cannot be listed: ", error.message()));
      continue;
    }
    for (const fs::recursive_directory_iterator end; it != end; it.increment(error)) {
      if (error) {
        problems.push_back(detail::concat("folder '", root.string(), "': ", error.message()));
        break;
      }
      std::error_code entry_error;
      if (!it->is_regular_file(entry_error) || !is_run_file_name(it->path())) continue;
      found.insert(it->path().lexically_normal());
      ++in_folder;
    }
    if (in_folder == 0 && !error) {
      problems.push_back(detail::concat("folder '", root.string(), "' holds no run files (*.h5)"));
    }
  }
  return {found.begin(), found.end()};
}

RunLibrary::RunLibrary(std::vector<fs::path> roots, RunLibraryOptions options)
    : options_(options), roots_(std::move(roots)) {
  if (options_.start_worker) worker_ = std::thread([this] { worker_loop(); });
}

RunLibrary::~RunLibrary() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void RunLibrary::add_root(const fs::path& root) {
  {
    std::lock_guard lock(mutex_);
    roots_.push_back(root);
    roots_changed_ = true;
  }
  changed_.notify_all();
}

std::vector<fs::path> RunLibrary::roots() const {
  std::lock_guard lock(mutex_);
  return roots_;
}

LibrarySnapshot RunLibrary::snapshot() const {
  std::lock_guard lock(mutex_);
  LibrarySnapshot state;
  state.runs.reserve(published_.size());
  for (const auto& [path, run] : published_) state.runs.push_back(run);
  state.problems = problems_;
  state.generation = generation_;
  state.initial_scan_done = initial_scan_done_;
  return state;
}

std::uint64_t RunLibrary::generation() const {
  std::lock_guard lock(mutex_);
  return generation_;
}

bool RunLibrary::wait_for_initial_scan(double timeout_s) const {
  std::unique_lock lock(mutex_);
  return changed_.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] { return initial_scan_done_; });
}

bool RunLibrary::wait_for_change(std::uint64_t generation, double timeout_s) const {
  std::unique_lock lock(mutex_);
  return changed_.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] { return generation_ > generation; });
}

void RunLibrary::update_now() {
  PROPLAB_CHECK(!worker_.joinable(), "update_now() is only for a library without a worker thread");
  pass(true);
}

void RunLibrary::publish(const fs::path& path, std::shared_ptr<const RunSnapshot> run) {
  {
    std::lock_guard lock(mutex_);
    if (run) {
      published_[path] = std::move(run);
    } else {
      published_.erase(path);
    }
    ++generation_;
  }
  changed_.notify_all();
}

void RunLibrary::pass(bool force_scan) {
  std::vector<fs::path> roots;
  bool roots_changed = false;
  {
    std::lock_guard lock(mutex_);
    roots = roots_;
    roots_changed = roots_changed_;
    roots_changed_ = false;
  }
  const double start = now_s();
  if (force_scan || roots_changed || start - last_scan_s_ >= options_.rescan_interval_s) {
    std::vector<std::string> problems;
    discovered_ = discover_run_files(roots, problems);
    last_scan_s_ = start;
    bool problems_changed = false;
    {
      std::lock_guard lock(mutex_);
      problems_changed = problems != problems_;
      problems_ = std::move(problems);
    }
    if (problems_changed) publish({}, nullptr);  // bumps the generation (the empty path is never a run)
    // Runs whose file went away.
    for (auto it = known_.begin(); it != known_.end();) {
      if (std::binary_search(discovered_.begin(), discovered_.end(), it->first)) {
        ++it;
      } else {
        publish(it->first, nullptr);
        it = known_.erase(it);
      }
    }
  }
  for (const auto& path : discovered_) {
    {
      std::lock_guard lock(mutex_);
      if (stop_) return;
    }
    std::error_code error;
    const auto modified = fs::last_write_time(path, error);
    const auto size = error ? 0 : fs::file_size(path, error);
    auto known = known_.find(path);
    bool read = known == known_.end();
    if (!read) {
      const RunSnapshot& run = *known->second.run;
      const bool file_changed = run.modified != modified || run.file_size != size;
      const bool live = run.ok() && run.status == RunStatus::running &&
                        now_s() - known->second.last_read_s >= options_.live_interval_s;
      read = file_changed || live;
    }
    if (!read) continue;
    auto run = load_run_snapshot(path);
    if (!run->ok() && known != known_.end() && known->second.run->ok() &&
        known->second.run->status == RunStatus::running) {
      // A read that races the writer can fail for a moment: keep the last good one and try again next time.
      known->second.last_read_s = now_s();
      continue;
    }
    known_[path] = Known{run, now_s()};
    publish(path, std::move(run));
  }
  std::lock_guard lock(mutex_);
  if (!initial_scan_done_) {
    initial_scan_done_ = true;
    ++generation_;
    changed_.notify_all();
  }
}

void RunLibrary::worker_loop() {
  // Short enough that a live run's new records show within about live_interval_s.
  const auto tick = std::chrono::milliseconds(100);
  bool first = true;
  for (;;) {
    pass(first);
    first = false;
    std::unique_lock lock(mutex_);
    changed_.wait_for(lock, tick, [&] { return stop_ || roots_changed_; });
    if (stop_) return;
  }
}

}  // namespace proplab::gui
