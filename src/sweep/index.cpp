// sweep/index: index.csv, run-file state and the per-point decision (see index.h).
#include "sweep/index.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>

#include "core/error.h"
#include "io/run_reader.h"

namespace proplab {

namespace fs = std::filesystem;

namespace {

constexpr const char* kStatusNames[] = {"pending", "running", "completed", "diverged", "failed", "interrupted"};
const std::vector<std::string> kTailColumns = {"status",  "final_loss", "final_val_loss", "steps",
                                               "seconds", "file",       "detail"};

// Holds an exclusive flock on a file for its lifetime.
class FileLock {
 public:
  explicit FileLock(const fs::path& path) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) throw UserError(path.string() + ": cannot create the sweep's lock file");
    while (::flock(fd_, LOCK_EX) != 0)
      if (errno != EINTR) throw UserError(path.string() + ": cannot lock the sweep index");
  }
  ~FileLock() { ::close(fd_); }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_ = -1;
};

bool is_stop_detail(const std::string& detail) {
  return detail.rfind("interrupted", 0) == 0 || detail.rfind("stopped", 0) == 0 || detail == "killed";
}

}  // namespace

const char* point_status_name(PointStatus status) { return kStatusNames[static_cast<int>(status)]; }

PointStatus parse_point_status(const std::string& text) {
  for (int i = 0; i < 6; ++i)
    if (text == kStatusNames[i]) return static_cast<PointStatus>(i);
  throw UserError("index.csv: status \"" + text +
                  "\" is not a point status; allowed: pending, running, completed, diverged, failed, interrupted");
}

const char* point_action_name(PointAction action) {
  switch (action) {
    case PointAction::skip_finished:
      return "skip (finished)";
    case PointAction::skip_failed:
      return "skip (failed; --retry-failed reruns it)";
    case PointAction::start:
      return "start";
    case PointAction::restart:
      return "restart";
    case PointAction::resume:
      return "resume";
    case PointAction::skip_busy:
      return "skip (being written by another process)";
  }
  return "?";
}

std::string exact_text(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
  return std::string(buffer, result.ptr);
}

RunFileState read_run_state(const fs::path& run_file) {
  RunFileState state;
  std::error_code error;
  state.exists = fs::exists(run_file, error);
  if (!state.exists) return state;
  try {
    const RunReader reader = RunReader::open(run_file);
    state.status = reader.attribute_string("status");
    state.detail = reader.attribute_string("status_detail");
    state.config = reader.attribute_string("config");
    const TrainCurves train = reader.read_train();
    const EvalCurves eval = reader.read_eval();
    state.readable = true;
    IndexRow& row = state.row;
    if (state.status == "completed")
      row.status = PointStatus::completed;
    else if (state.status == "diverged")
      row.status = PointStatus::diverged;
    else if (state.status == "failed")
      row.status = is_stop_detail(state.detail) ? PointStatus::interrupted : PointStatus::failed;
    else
      row.status = PointStatus::running;
    row.detail = state.detail;
    if (train.size() > 0) {
      row.final_loss = exact_text(train.loss.back());
      row.steps = std::to_string(train.step.back() + 1);
      row.seconds = exact_text(std::round(train.wall_time.back() * 1000.0) / 1000.0);
    } else {
      row.steps = "0";
    }
    if (eval.size() > 0) row.final_val_loss = exact_text(eval.loss.back());
  } catch (const std::exception& e) {
    state.readable = false;
    state.detail = e.what();
  }
  return state;
}

std::string index_csv(const SweepPlan& plan, const std::map<std::string, IndexRow>& rows) {
  std::vector<std::string> header{"run"};
  header.insert(header.end(), plan.columns.begin(), plan.columns.end());
  header.insert(header.end(), kTailColumns.begin(), kTailColumns.end());
  std::string text = csv_line(header);
  for (const SweepPoint& point : plan.points) {
    const auto it = rows.find(point.name);
    const IndexRow row = it == rows.end() ? IndexRow{} : it->second;
    std::vector<std::string> fields{point.name};
    fields.insert(fields.end(), point.values.begin(), point.values.end());
    for (const std::string& column : kTailColumns) {
      if (column == "status") fields.push_back(point_status_name(row.status));
      if (column == "seconds") fields.push_back(row.seconds);
      if (column == "final_loss") fields.push_back(row.final_loss);
      if (column == "final_val_loss") fields.push_back(row.final_val_loss);
      if (column == "steps") fields.push_back(row.steps);
      if (column == "file") fields.push_back(point.name + ".h5");
      if (column == "detail") fields.push_back(row.detail);
    }
    text += csv_line(fields);
  }
  return text;
}

std::map<std::string, IndexRow> read_index(const fs::path& index_file) {
  std::map<std::string, IndexRow> rows;
  std::ifstream in(index_file, std::ios::binary);
  if (!in) return rows;
  const auto records = parse_csv(std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()));
  if (records.empty()) return rows;
  std::map<std::string, std::size_t> column;
  for (std::size_t i = 0; i < records[0].size(); ++i) column.emplace(records[0][i], i);
  const auto field = [&](const std::vector<std::string>& record, const std::string& name) -> std::string {
    const auto it = column.find(name);
    return it != column.end() && it->second < record.size() ? record[it->second] : std::string();
  };
  if (!column.count("run") || !column.count("status"))
    throw UserError(index_file.string() +
                    ": not a sweep index (no run and status columns); allowed: an index.csv "
                    "written by proplab sweep, or none");
  for (std::size_t r = 1; r < records.size(); ++r) {
    IndexRow row;
    row.status = parse_point_status(field(records[r], "status"));
    row.final_loss = field(records[r], "final_loss");
    row.final_val_loss = field(records[r], "final_val_loss");
    row.steps = field(records[r], "steps");
    row.seconds = field(records[r], "seconds");
    row.detail = field(records[r], "detail");
    rows[field(records[r], "run")] = row;
  }
  return rows;
}

void update_index(const fs::path& dir, const SweepPlan& plan, const std::map<std::string, IndexRow>& mine) {
  const FileLock lock(dir / ".index.lock");
  std::map<std::string, IndexRow> rows = read_index(dir / "index.csv");
  for (const auto& [name, row] : mine) rows[name] = row;
  const fs::path temporary = dir / (".index.csv." + std::to_string(::getpid()));
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    out << index_csv(plan, rows);
    out.flush();
    if (!out) throw UserError(temporary.string() + ": cannot write the sweep index");
  }
  fs::rename(temporary, dir / "index.csv");
}

PointAction decide_action(const IndexRow* previous, const RunFileState& file, bool checkpoint_exists,
                          bool retry_failed) {
  if (file.readable && (file.row.status == PointStatus::completed || file.row.status == PointStatus::diverged))
    return PointAction::skip_finished;
  const bool failed = (previous && previous->status == PointStatus::failed) ||
                      (file.readable && file.row.status == PointStatus::failed);
  if (failed) {
    if (!retry_failed) return PointAction::skip_failed;
    // Stopped by an I/O failure (its file says so, or could not even be told so and still says running): its
    // checkpoint continues it exactly.
    if (file.readable && checkpoint_exists &&
        (file.detail.rfind(io_failure_detail_prefix, 0) == 0 || file.status == run_status_name(RunStatus::running)))
      return PointAction::resume;
    return file.exists || checkpoint_exists ? PointAction::restart : PointAction::start;
  }
  // Interrupted (cleanly, or killed while "running"): its checkpoint continues it when its file can be read.
  if (checkpoint_exists && file.readable) return PointAction::resume;
  return file.exists || checkpoint_exists ? PointAction::restart : PointAction::start;
}

}  // namespace proplab
