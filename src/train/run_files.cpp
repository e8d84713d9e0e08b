#include "train/run_files.h"

#include <filesystem>

#include "core/error.h"

namespace proplab {

namespace {

// "88 training rows (steps 0-87) and 9 records (the last at step 80)": what a reader is sure to find in the run
// file (rows of a flush that failed half-way may be there too).
std::string run_file_contents(const RunWriter& writer) {
  const RunWriter::FlushedExtent train = writer.flushed("/train/step");
  const RunWriter::FlushedExtent records = writer.flushed("/steps");
  std::string text = std::to_string(train.rows) + " training row" + (train.rows == 1 ? "" : "s");
  if (train.rows > 0) text += " (steps 0-" + std::to_string(train.last_int) + ")";
  text += " and " + std::to_string(records.rows) + " record" + (records.rows == 1 ? "" : "s");
  if (records.rows > 0) text += " (the last at step " + std::to_string(records.last_int) + ")";
  return text;
}

// "after 1 step", "after 20 steps".
std::string after_steps(std::int64_t steps) {
  return "after " + std::to_string(steps) + (steps == 1 ? " step" : " steps");
}

}  // namespace

std::optional<RunLock> lock_run(const RunOptions& options, bool root, const std::filesystem::path& run_file) {
  std::optional<RunLock> lock;
  std::string refusal;
  if (root) {
    try {
      lock.emplace(RunLock::acquire(run_file));
    } catch (const UserError& error) {
      refusal = error.what();
    }
  }
  if (options.world) {
    std::int64_t length = static_cast<std::int64_t>(refusal.size());
    options.world->broadcast(&length, sizeof length, 0);
    refusal.resize(static_cast<std::size_t>(length));
    if (length > 0) options.world->broadcast(refusal.data(), length, 0);
  }
  if (!refusal.empty()) throw UserError(refusal);
  return lock;
}

void end_after_io_failure(const IoFailure& failure, RunWriter& writer, const std::string& name,
                          const std::optional<std::int64_t>& last_checkpoint, const RunOptions& options,
                          RunSummary& summary) {
  const std::string run_file = writer.path().string();
  const bool run_file_exists = std::filesystem::exists(writer.path());
  // (gone with its folder, when that was removed or moved)
  const std::int64_t checkpoint_step = std::filesystem::exists(summary.checkpoint) ? last_checkpoint.value_or(-1) : -1;
  bool run_file_writable = failure.checkpoint && !writer.finished();
  if (run_file_writable) {  // the checkpoint failed: the run file may still take its last rows
    try {
      writer.flush_and_wait();  // (written, so that what it holds is counted below)
    } catch (const IoError&) {
      run_file_writable = false;
    }
  }
  // "I/O failure after 10 steps: No space left on device while writing the run file 'out/q.h5'"
  const std::string what = std::string(io_failure_detail_prefix) + " " + after_steps(failure.step) + ": " +
                           failure.reason + " while writing " +
                           (failure.checkpoint ? "the checkpoint" : "the run file") + " '" + failure.path + "'";
  // (what a reader is sure to find; finishing or abandoning the file below adds no row)
  const std::string contents = run_file_contents(writer);
  std::string detail = what + "; the run file holds at least " + contents + "; ";
  detail += checkpoint_step >= 0
                ? "last good checkpoint: step " + std::to_string(checkpoint_step) + ", continue with --resume"
                : "no checkpoint of this run, start again with --force";
  bool marked = false;
  if (run_file_writable) {
    try {
      writer.finish(RunStatus::failed, detail);
      marked = true;
    } catch (const IoError&) {
    }
  }
  if (!marked) marked = writer.abandon(RunStatus::failed, detail);

  const std::string command = options.command.empty() ? std::string("proplab run ...") : options.command;
  std::string message = name + ": " + what + ". ";
  if (!run_file_exists)
    message += "The run file '" + run_file + "' is gone (its folder was removed or moved). ";
  else
    message += "The run file '" + run_file + "' holds at least " + contents +
               (marked ? " and says failed. "
                       : "; its status could not be written, so it says running until `proplab recover " + run_file +
                             "` or a resumed run rewrites it. ");
  const std::string remedy = "Free space (or make the folder writable again), then ";
  if (checkpoint_step >= 0)
    message += "Last good checkpoint: step " + std::to_string(checkpoint_step) + " ('" + summary.checkpoint.string() +
               "'). " + remedy + "continue with: " + command + " --resume";
  else
    message += "No checkpoint of this run was written. " + remedy + "start again with: " + command + " --force";
  summary.status = RunStatus::failed;
  summary.detail = detail;
  summary.io_failure = true;
  summary.message = message;
}

}  // namespace proplab
