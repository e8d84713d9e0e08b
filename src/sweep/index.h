// sweep/index: the sweep folder's index.csv, what a run file on disk says about a point, and what a sweep does
// with each point when it starts (skip, start, restart, resume).
//
// The sweep folder DIR holds, per point: <run>.h5 (the run file), <run>.ckpt.h5 (its checkpoint),
// points/<run>.toml (the point as a study, what `proplab run` was given) and logs/<run>.log (the run's output).
// DIR/index.csv has one row per point of the whole sweep, in point order:
//   run, <one column per varied key path>, [seed], status, final_loss, final_val_loss, steps, seconds, file, detail
// status: pending | running | completed | diverged | failed | interrupted. final_loss is the last training loss
// and final_val_loss the last validation loss in the run file (shortest text that reads back exactly; empty when
// there is none); steps is the number of steps done; seconds the run's wall time; file the run file's name
// relative to DIR. Fields are RFC 4180 CSV (quoted when they hold ',', '"' or a newline).
//
// Invariants:
// - The index is replaced whole (written to a temporary file, then renamed), so a reader sees an old or a new
//   index, never half of one. Writers merge under an flock on DIR/.index.lock: each sweep process (one per
//   shard) rewrites only its own points' rows and keeps the others as it finds them.
// - A run file whose status is completed or diverged is the truth for its row (status, losses, steps).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "io/csv.h"
#include "sweep/sweep.h"

namespace proplab {

enum class PointStatus { pending, running, completed, diverged, failed, interrupted };
const char* point_status_name(PointStatus status);
// UserError naming the valid values when `text` is none of them.
PointStatus parse_point_status(const std::string& text);

struct IndexRow {
  PointStatus status = PointStatus::pending;
  std::string final_loss, final_val_loss, steps, seconds, detail;
};

// What DIR/<run>.h5 says (read-only, works on a run that is still being written or was killed).
struct RunFileState {
  bool exists = false;
  bool readable = false;
  std::string status;  // "running", "completed", "diverged", "failed" ("" when unreadable)
  std::string detail;
  std::string config;  // the resolved study the run was made from
  IndexRow row;        // status, losses, steps and seconds as the index shows them
};
RunFileState read_run_state(const std::filesystem::path& run_file);

// The shortest text that reads back as exactly `value` ("nan", "inf" for non-finite values).
std::string exact_text(double value);

// The index as text for `plan`, rows looked up by run name (a point without a row is pending).
std::string index_csv(const SweepPlan& plan, const std::map<std::string, IndexRow>& rows);
// The rows of an index file by run name (missing file: none). Columns are found by their header names.
std::map<std::string, IndexRow> read_index(const std::filesystem::path& index_file);
// Under DIR/.index.lock: reads DIR/index.csv, replaces the rows of `mine`, writes it back (temp + rename).
void update_index(const std::filesystem::path& dir, const SweepPlan& plan, const std::map<std::string, IndexRow>& mine);

enum class PointAction {
  skip_finished,  // completed or diverged (a deterministic outcome: rerunning gives the same)
  skip_failed,    // failed before and --retry-failed was not given
  start,          // nothing on disk
  restart,        // a run file or checkpoint that cannot be continued: start over (--force)
  resume,         // an interrupted run with its checkpoint: continue (--resume)
  skip_busy,      // another process is writing the run (its lock is held, io/run_lock.h): left alone
};
const char* point_action_name(PointAction action);
// What to do with a point, from its previous index row (if any), its run file and whether its checkpoint exists.
// (A failed point retried with retry_failed restarts, except one that an I/O failure stopped, or whose file still
// says running: it resumes from its checkpoint, bit for bit the run it would have been.)
PointAction decide_action(const IndexRow* previous, const RunFileState& file, bool checkpoint_exists,
                          bool retry_failed);

}  // namespace proplab
