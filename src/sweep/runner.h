// sweep/runner: runs a sweep's points as separate `proplab run` processes, N at a time, keeping DIR/index.csv
// true (layout of DIR: sweep/index.h).
//
// Invariants:
// - Every point of the shard is decided before any starts (decide_action): finished runs are skipped, failed ones
//   skipped unless retry_failed, interrupted ones resumed from their checkpoint (or restarted when there is none
//   or it cannot be used). A finished run made from a different study than its point now describes is an error
//   (UserError, nothing started): the folder would otherwise mix two studies.
// - Each point runs as `<executable> run DIR/points/<run>.toml --out DIR [--resume | --force]`, its output
//   appended to DIR/logs/<run>.log. Job slot k of N is pinned to its own share of this process's CPUs (cores / N
//   each), so a study with device.threads = 0 (all available cores) uses its share; results do not depend on it.
// - A point that fails (any exit other than 0 completed, 3 diverged, 4 stopped) is recorded as failed with the
//   reason; the other points go on. A resume that the run refuses (exit 2) is retried once as a restart.
// - On a stop request (stop_requests > 0: SIGINT/SIGTERM), no point starts; running points get SIGTERM and stop
//   at their next step with a checkpoint; a second request SIGKILLs them. Their rows become interrupted. On Linux
//   a point also gets SIGTERM when the sweep process dies (PR_SET_PDEATHSIG), so no run outlives its sweep.
// - A point whose run another process is writing (its lock is held, io/run_lock.h: a `proplab run` started by hand
//   into DIR, say) is not started: its row says running, by whom, and the sweep ends with exit status 4 (rerun to
//   continue). A point whose run is refused because such a process took it after the plan was made is treated the same.
// - The index is rewritten (temp + rename) whenever a point starts or ends.
#pragma once

#include <atomic>
#include <filesystem>
#include <ostream>
#include <string>
#include <vector>

#include "sweep/index.h"
#include "sweep/sweep.h"

namespace proplab {

struct SweepOptions {
  std::filesystem::path out_dir;                    // DIR
  int jobs = 1;                                     // points run at once
  Shard shard;                                      // the slice of points this process runs
  bool retry_failed = false;                        // rerun points that failed before
  std::filesystem::path executable;                 // the proplab binary that runs a point
  // The MPI launcher's command words ("mpirun --oversubscribe"): a point whose layout needs N > 1 processes runs as
  // <launcher words> -np N <executable> run …; empty: every point is one process (run_sweep refuses a point that
  // needs more).
  std::vector<std::string> mpirun;
  std::ostream* log = nullptr;                      // progress and events (null: silent)
  bool terminal = false;                            // live status block (else plain lines)
  double progress_interval_s = 30.0;                // plain overall line at most this often
  const std::atomic<int>* stop_requests = nullptr;  // SIGINT/SIGTERM count
};

struct SweepCounts {
  int total = 0;     // points in this shard
  int finished = 0;  // completed or diverged (this run or before)
  int diverged = 0;
  int failed = 0;
  int running = 0;
  int interrupted = 0;
  int pending = 0;
  int busy = 0;  // being written by another process (not started by this sweep)
};

struct SweepResult {
  SweepCounts counts;
  bool stopped = false;  // a stop request ended it early
};

// One point's plan: what a sweep would do with it now.
struct PointPlan {
  std::size_t point = 0;  // index into SweepPlan::points
  PointAction action = PointAction::start;
  IndexRow row;  // its index row before anything runs
};
// Decides every point of the shard (see the invariants); UserError for stale finished runs.
std::vector<PointPlan> plan_points(const SweepPlan& plan, const SweepOptions& options);

// Runs the shard's points. UserError for problems found before anything starts.
SweepResult run_sweep(const SweepPlan& plan, const SweepOptions& options);
// UserError when a point needs more than one process and no launcher is given (run_sweep checks it first).
void check_launcher(const SweepPlan& plan, const std::vector<std::string>& mpirun);

// "sweep: 3/12 done, 2 running, 1 failed, ETA 4m10s" (eta_s < 0: unknown).
std::string sweep_status_line(const SweepCounts& counts, double eta_s);

}  // namespace proplab
