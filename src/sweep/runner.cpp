// sweep/runner: the process pool behind `proplab sweep` (see runner.h).
#include "sweep/runner.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "io/run_lock.h"
#include "train/progress.h"
#include "train/trainer.h"

namespace proplab {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Writes `text` to `path` through a temporary file and a rename (unchanged content leaves the file alone).
void write_atomically(const fs::path& path, const std::string& text) {
  std::error_code error;
  if (fs::exists(path, error) && read_text(path) == text) return;
  const fs::path temporary = path.parent_path() / ("." + path.filename().string() + "." + std::to_string(::getpid()));
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) throw UserError(temporary.string() + ": cannot write");
  }
  fs::rename(temporary, path);
}

// The index row of a point another process is writing.
IndexRow busy_row(IndexRow row, const RunLockHolder& holder) {
  row.status = PointStatus::running;
  row.detail = "being written by " + holder.describe() + ", not by this sweep; rerun the sweep after it has ended";
  return row;
}

// The CPUs this process may run on.
std::vector<int> available_cpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0)
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
      if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  if (cpus.empty()) cpus.push_back(0);
  return cpus;
}

// The last "step X/Y" a run printed to its log.
std::string last_step(const fs::path& log) {
  std::ifstream in(log, std::ios::binary | std::ios::ate);
  if (!in) return {};
  const std::streamoff size = in.tellg();
  const std::streamoff from = std::max<std::streamoff>(0, size - 4096);
  in.seekg(from);
  std::string tail(static_cast<std::size_t>(size - from), '\0');
  in.read(tail.data(), static_cast<std::streamsize>(tail.size()));
  const auto at = tail.rfind("step ");
  if (at == std::string::npos) return {};
  const auto end = tail.find_first_of(" \r\n", at + 5);
  return tail.substr(at, end == std::string::npos ? std::string::npos : end - at);
}

// Why a point failed, from its log: the last error line, else the exit status.
std::string failure_reason(const fs::path& log, int status) {
  std::string reason;
  std::istringstream lines(read_text(log));
  for (std::string line; std::getline(lines, line);)
    if (line.rfind("proplab: error:", 0) == 0 || line.rfind("proplab: internal error:", 0) == 0) reason = line;
  std::string exit;
  if (WIFEXITED(status))
    exit = "exit " + std::to_string(WEXITSTATUS(status));
  else if (WIFSIGNALED(status))
    exit = std::string("killed by signal ") + std::to_string(WTERMSIG(status));
  return (reason.empty() ? exit : reason + " (" + exit + ")") + "; log: logs/" + log.filename().string();
}

struct Job {
  std::size_t point = 0;
  PointAction action = PointAction::start;
  int slot = 0;
  Clock::time_point start;
};

class Runner {
 public:
  Runner(const SweepPlan& plan, const SweepOptions& options) : plan_(plan), options_(options) {}
  SweepResult run();

 private:
  void launch(std::size_t point, PointAction action);
  void reap(pid_t pid, int status);
  void set_row(std::size_t point, const IndexRow& row) {
    rows_[plan_.points[point].name] = row;
    update_index(options_.out_dir, plan_, rows_);
  }
  SweepCounts counts() const;
  void event(const std::string& text);
  void show_progress(bool force);
  double eta() const;
  int stop_requests() const { return options_.stop_requests ? options_.stop_requests->load() : 0; }

  const SweepPlan& plan_;
  const SweepOptions& options_;
  std::map<std::string, IndexRow> rows_;  // this shard's rows
  std::set<std::string> busy_;            // points another process is writing (io/run_lock.h)
  std::deque<std::pair<std::size_t, PointAction>> queue_;
  std::map<pid_t, Job> jobs_;
  std::vector<bool> slot_busy_;
  std::vector<int> cpus_;
  int cpus_per_job_ = 1;
  int stops_sent_ = 0;
  std::vector<double> durations_;
  Clock::time_point last_progress_ = Clock::now();
  int live_lines_ = 0;  // lines of the terminal status block now on screen
};

SweepCounts Runner::counts() const {
  SweepCounts c;
  for (const auto& [name, row] : rows_) {
    ++c.total;
    switch (row.status) {
      case PointStatus::completed:
        ++c.finished;
        break;
      case PointStatus::diverged:
        ++c.finished, ++c.diverged;
        break;
      case PointStatus::failed:
        ++c.failed;
        break;
      case PointStatus::running:
        ++(busy_.count(name) ? c.busy : c.running);
        break;
      case PointStatus::interrupted:
        ++c.interrupted;
        break;
      case PointStatus::pending:
        ++c.pending;
        break;
    }
  }
  return c;
}

double Runner::eta() const {
  if (durations_.empty()) return -1;
  double mean = 0;
  for (const double d : durations_) mean += d / static_cast<double>(durations_.size());
  double remaining = static_cast<double>(queue_.size()) * mean;
  for (const auto& [pid, job] : jobs_)
    remaining += std::max(0.0, mean - std::chrono::duration<double>(Clock::now() - job.start).count());
  return remaining / options_.jobs;
}

void Runner::event(const std::string& text) {
  if (!options_.log) return;
  std::ostream& out = *options_.log;
  if (options_.terminal && live_lines_ > 0) {
    // Clear the status block, print the event above it; show_progress redraws the block.
    out << "\r\033[K";
    for (int i = 1; i < live_lines_; ++i) out << "\033[1A\033[K";
    live_lines_ = 0;
  }
  out << "sweep: " << text << "\n" << std::flush;
  if (options_.terminal) show_progress(true);
}

void Runner::show_progress(bool force) {
  if (!options_.log) return;
  const auto now = Clock::now();
  const double since = std::chrono::duration<double>(now - last_progress_).count();
  std::ostream& out = *options_.log;
  if (options_.terminal) {
    if (!force && since < 0.5) return;
    out << "\r\033[K";
    for (int i = 1; i < live_lines_; ++i) out << "\033[1A\033[K";
    out << sweep_status_line(counts(), eta());
    live_lines_ = 1;
    for (const auto& [pid, job] : jobs_) {
      const std::string& name = plan_.points[job.point].name;
      const double seconds = std::chrono::duration<double>(now - job.start).count();
      out << "\n\033[K  " << name << "  " << last_step(options_.out_dir / "logs" / (name + ".log")) << "  "
          << Progress::format_duration(seconds);
      ++live_lines_;
    }
    out << std::flush;
  } else {
    if (!force && since < options_.progress_interval_s) return;
    out << sweep_status_line(counts(), eta()) << "\n" << std::flush;
  }
  last_progress_ = now;
}

void Runner::launch(std::size_t point_index, PointAction action) {
  const SweepPoint& point = plan_.points[point_index];
  const fs::path dir = options_.out_dir;
  const fs::path study = dir / "points" / (point.name + ".toml");
  const fs::path log = dir / "logs" / (point.name + ".log");
  write_atomically(study, point.study_toml);
  int slot = 0;
  while (slot_busy_[static_cast<std::size_t>(slot)]) ++slot;

  std::vector<std::string> args{options_.executable.string(), "run", study.string(), "--out", dir.string()};
  if (action == PointAction::resume) args.push_back("--resume");
  if (action == PointAction::restart) args.push_back("--force");
  const std::string banner =
      "== proplab sweep: " + std::string(point_action_name(action)) + ": " + args[0] + " " + args[1] + " " + args[2] +
      " --out " + args[4] + (args.size() > 5 ? " " + args[5] : std::string()) +
      (point.ranks > 1 ? " (" + std::to_string(point.ranks) + " processes)" : std::string()) + "\n";
  if (point.ranks > 1) {  // (checked in run_sweep: a launcher is given)
    std::vector<std::string> launched = options_.mpirun;
    launched.insert(launched.end(), {"-np", std::to_string(point.ranks)});
    args.insert(args.begin(), launched.begin(), launched.end());
  }
  std::vector<char*> argv;
  for (auto& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  for (int i = 0; i < cpus_per_job_; ++i)
    CPU_SET(cpus_[static_cast<std::size_t>(slot * cpus_per_job_ + i) % cpus_.size()], &cpus);

  const int log_fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) throw UserError(log.string() + ": cannot open the run's log");
  if (::write(log_fd, banner.data(), banner.size()) < 0) {
    ::close(log_fd);
    throw UserError(log.string() + ": cannot write the run's log");
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(log_fd);
    throw std::runtime_error(std::string("fork failed: ") + std::strerror(errno));
  }
  if (pid == 0) {
    // Only async-signal-safe calls between fork and exec.
#ifdef __linux__
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(125);
#endif
    ::sched_setaffinity(0, sizeof cpus, &cpus);
    const int null_fd = ::open("/dev/null", O_RDONLY);
    if (null_fd >= 0) ::dup2(null_fd, STDIN_FILENO);
    ::dup2(log_fd, STDOUT_FILENO);
    ::dup2(log_fd, STDERR_FILENO);
    ::execvp(argv[0], argv.data());  // (the launcher may be a name on PATH; proplab's path is absolute)
    ::_exit(127);
  }
  ::close(log_fd);
  slot_busy_[static_cast<std::size_t>(slot)] = true;
  jobs_[pid] = Job{point_index, action, slot, Clock::now()};
  IndexRow row = rows_[point.name];
  row.status = PointStatus::running;
  row.detail = point_action_name(action);
  set_row(point_index, row);
  event((action == PointAction::start ? std::string("start ") : std::string(point_action_name(action)) + " ") +
        point.name);
}

void Runner::reap(pid_t pid, int status) {
  const auto it = jobs_.find(pid);
  if (it == jobs_.end()) return;
  const Job job = it->second;
  jobs_.erase(it);
  slot_busy_[static_cast<std::size_t>(job.slot)] = false;
  const SweepPoint& point = plan_.points[job.point];
  const fs::path log = options_.out_dir / "logs" / (point.name + ".log");
  const double seconds = std::chrono::duration<double>(Clock::now() - job.start).count();
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  const RunFileState file = read_run_state(options_.out_dir / (point.name + ".h5"));
  IndexRow row = file.readable ? file.row : IndexRow{};
  if (code == 2) {
    // Refused because another process started writing the run after the plan was made: leave it to that one.
    if (const auto holder = lock_holder(options_.out_dir / (point.name + ".h5"))) {
      busy_.insert(point.name);
      const IndexRow busy = busy_row(row, *holder);
      set_row(job.point, busy);
      event("skip " + point.name + " (" + busy.detail + ")");
      return;
    }
  }
  if (code == 2 && job.action == PointAction::resume && stops_sent_ == 0) {
    event("resume " + point.name + " refused (" + failure_reason(log, status) + "); restarting it");
    queue_.emplace_front(job.point, PointAction::restart);
    row.status = PointStatus::interrupted;
    set_row(job.point, row);
    return;
  }
  if ((code == 0 || code == 3) && file.readable) {
    // The run file is the truth for a finished run.
    durations_.push_back(seconds);
    set_row(job.point, row);
    std::string text = point.name + " " + point_status_name(row.status);
    if (!row.final_loss.empty()) text += ", final loss " + row.final_loss;
    event(text + " (" + Progress::format_duration(seconds) + ")");
    return;
  }
  if (code == 4 || (stops_sent_ > 0 && WIFSIGNALED(status))) {
    row.status = PointStatus::interrupted;
    if (!file.readable) row.detail = "interrupted before its run file was written";
    set_row(job.point, row);
    event(point.name + " interrupted" + (row.steps.empty() ? "" : " at step " + row.steps));
    return;
  }
  durations_.push_back(seconds);
  row.status = PointStatus::failed;
  row.detail = failure_reason(log, status);
  set_row(job.point, row);
  event(point.name + " failed: " + row.detail);
}

SweepResult Runner::run() {
  const std::vector<PointPlan> decided = plan_points(plan_, options_);
  std::error_code error;
  fs::create_directories(options_.out_dir / "points", error);
  fs::create_directories(options_.out_dir / "logs", error);
  if (error) throw UserError(options_.out_dir.string() + ": cannot create the sweep folder: " + error.message());
  // One process per shard and folder: a second one would run the same points twice.
  const fs::path lock_path = options_.out_dir / (".shard-" + std::to_string(options_.shard.index) + "-of-" +
                                                 std::to_string(options_.shard.count) + ".lock");
  const int lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd < 0 || ::flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    if (lock_fd >= 0) ::close(lock_fd);
    throw UserError(options_.out_dir.string() + ": another proplab sweep is running shard " +
                    std::to_string(options_.shard.index) + "/" + std::to_string(options_.shard.count) +
                    " in this folder; allowed: one sweep per shard and folder");
  }
  struct CloseLock {
    int fd;
    ~CloseLock() { ::close(fd); }
  } close_lock{lock_fd};

  cpus_ = available_cpus();
  cpus_per_job_ = std::max(1, static_cast<int>(cpus_.size()) / options_.jobs);
  slot_busy_.assign(static_cast<std::size_t>(options_.jobs), false);
  for (const PointPlan& decided_point : decided) rows_[plan_.points[decided_point.point].name] = decided_point.row;
  update_index(options_.out_dir, plan_, rows_);

  int skipped_finished = 0, skipped_failed = 0;
  for (const PointPlan& decided_point : decided) {
    if (decided_point.action == PointAction::skip_finished)
      ++skipped_finished;
    else if (decided_point.action == PointAction::skip_failed)
      ++skipped_failed;
    else if (decided_point.action == PointAction::skip_busy)
      busy_.insert(plan_.points[decided_point.point].name);
    else
      queue_.emplace_back(decided_point.point, decided_point.action);
  }
  event(std::to_string(plan_.points.size()) + " points, " + std::to_string(decided.size()) + " in shard " +
        std::to_string(options_.shard.index) + "/" + std::to_string(options_.shard.count) + ": " +
        std::to_string(queue_.size()) + " to run, " + std::to_string(skipped_finished) + " finished, " +
        std::to_string(skipped_failed) + " failed before" +
        (busy_.empty() ? std::string() : ", " + std::to_string(busy_.size()) + " being written by another process") +
        "; " + std::to_string(options_.jobs) + " at a time, " + std::to_string(cpus_per_job_) + " CPU" +
        (cpus_per_job_ == 1 ? "" : "s") + " each");
  for (const PointPlan& decided_point : decided) {
    const std::string& name = plan_.points[decided_point.point].name;
    if (decided_point.action == PointAction::skip_finished)
      event("skip " + name + " (" + point_status_name(decided_point.row.status) + ")");
    if (decided_point.action == PointAction::skip_failed)
      event("skip " + name + " (failed before; --retry-failed reruns it)");
    if (decided_point.action == PointAction::skip_busy) event("skip " + name + " (" + decided_point.row.detail + ")");
  }

  SweepResult result;
  while (!queue_.empty() || !jobs_.empty()) {
    const int stops = stop_requests();
    if (stops > stops_sent_) {
      const int sig = stops >= 2 ? SIGKILL : SIGTERM;
      if (stops_sent_ == 0)
        event("stopping: " + std::to_string(jobs_.size()) +
              " running points stop at their next step (stop again to kill them)");
      for (const auto& [pid, job] : jobs_) ::kill(pid, sig);
      stops_sent_ = stops;
      result.stopped = true;
    }
    while (stops_sent_ == 0 && !queue_.empty() && static_cast<int>(jobs_.size()) < options_.jobs) {
      const auto [point, action] = queue_.front();
      queue_.pop_front();
      launch(point, action);
    }
    if (stops_sent_ > 0) queue_.clear();
    int status = 0;
    pid_t pid;
    bool reaped = false;
    while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) reap(pid, status), reaped = true;
    show_progress(false);
    if (!reaped) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  result.counts = counts();
  if (options_.log) {
    if (options_.terminal && live_lines_ > 0) {
      *options_.log << "\r\033[K";
      for (int i = 1; i < live_lines_; ++i) *options_.log << "\033[1A\033[K";
      live_lines_ = 0;
    }
    *options_.log << sweep_status_line(result.counts, 0) << (result.stopped ? " (stopped; rerun to continue)" : "")
                  << "; index: " << (options_.out_dir / "index.csv").string() << "\n"
                  << std::flush;
  }
  return result;
}

}  // namespace

std::vector<PointPlan> plan_points(const SweepPlan& plan, const SweepOptions& options) {
  const std::map<std::string, IndexRow> previous = read_index(options.out_dir / "index.csv");
  std::vector<PointPlan> decided;
  std::vector<std::string> stale;
  for (const std::size_t index : shard_points(plan.points.size(), options.shard)) {
    const SweepPoint& point = plan.points[index];
    const fs::path run_file = options.out_dir / (point.name + ".h5");
    const fs::path checkpoint = checkpoint_path(options.out_dir, point.name);
    const fs::path point_file = options.out_dir / "points" / (point.name + ".toml");
    std::error_code error;
    const RunFileState file = read_run_state(run_file);
    const bool has_checkpoint = fs::exists(checkpoint, error);
    const auto it = previous.find(point.name);
    const IndexRow* before = it == previous.end() ? nullptr : &it->second;
    // A point whose study changed since it last ran: its failure or checkpoint says nothing about it now. (Studies
    // are compared on what their runs compute: train.final_checkpoint may change.)
    const std::string outcome = outcome_config(point.study_toml);
    const bool changed = fs::exists(point_file, error) && outcome_config(read_text(point_file)) != outcome;
    PointPlan decision;
    decision.point = index;
    decision.action = decide_action(changed ? nullptr : before, file, has_checkpoint && !changed, options.retry_failed);
    if (decision.action == PointAction::skip_finished && outcome_config(file.config) != outcome)
      stale.push_back(run_file.string());
    if (decision.action == PointAction::skip_finished) {
      decision.row = file.row;
    } else if (decision.action == PointAction::skip_failed) {
      decision.row = before && before->status == PointStatus::failed ? *before : file.row;
    } else if (file.readable) {
      decision.row = file.row;
      if (decision.row.status == PointStatus::running) {
        decision.row.status = PointStatus::interrupted;
        decision.row.detail = "killed (its run file was left open)";
      }
      if (decision.row.status == PointStatus::failed && !options.retry_failed)
        decision.row.status = PointStatus::interrupted;
    } else if (before && before->status != PointStatus::running) {
      decision.row = *before;
    } else if (before) {
      decision.row.status = PointStatus::interrupted;
      decision.row.detail = "killed before its run file was written";
    }
    // A point whose run another process is writing (a `proplab run` started by hand into the folder, another
    // sweep over it) is not started twice.
    if (decision.action == PointAction::start || decision.action == PointAction::restart ||
        decision.action == PointAction::resume)
      if (const auto holder = lock_holder(run_file)) {
        decision.action = PointAction::skip_busy;
        decision.row = busy_row(file.readable ? file.row : IndexRow{}, *holder);
      }
    decided.push_back(decision);
  }
  if (!stale.empty()) {
    std::string list;
    for (const auto& path : stale) list += "\n  " + path;
    throw UserError(options.out_dir.string() + ": " + std::to_string(stale.size()) +
                    " finished run(s) were made from a different study than this sweep now describes:" + list +
                    "\nallowed: the same study and --set options, another --out folder, or delete those runs "
                    "(<run>.h5, <run>.ckpt.h5) to rerun them");
  }
  return decided;
}

void check_launcher(const SweepPlan& plan, const std::vector<std::string>& mpirun) {
  if (!mpirun.empty()) return;
  for (const SweepPoint& point : plan.points)
    if (point.ranks > 1)
      throw UserError(
          "point " + point.name + " needs " + std::to_string(point.ranks) +
          " processes (parallel.dp * tp * pp * sp); proplab sweep starts a point under an MPI launcher only when "
          "given one: add --mpirun 'mpirun --oversubscribe' (a launcher that takes -np N)");
}

SweepResult run_sweep(const SweepPlan& plan, const SweepOptions& options) {
  PROPLAB_CHECK(options.jobs >= 1, "a sweep runs at least one point at a time");
  check_launcher(plan, options.mpirun);
  return Runner(plan, options).run();
}

std::string sweep_status_line(const SweepCounts& counts, double eta_s) {
  std::string line = "sweep: " + std::to_string(counts.finished) + "/" + std::to_string(counts.total) + " done";
  if (counts.diverged) line += " (" + std::to_string(counts.diverged) + " diverged)";
  line += ", " + std::to_string(counts.running) + " running, " + std::to_string(counts.failed) + " failed";
  if (counts.interrupted) line += ", " + std::to_string(counts.interrupted) + " interrupted";
  if (counts.busy) line += ", " + std::to_string(counts.busy) + " being written by another process";
  if (eta_s != 0) line += ", ETA " + (eta_s < 0 ? std::string("?") : Progress::format_duration(eta_s));
  return line;
}

}  // namespace proplab
