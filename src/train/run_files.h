// train/run_files: a run's hold on its files — the one-writer lock (io/run_lock.h), taken by rank 0 and agreed on by
// every rank — and how a run ends when the operating system refuses a write to them (an IoError: no space, quota,
// a read-only or vanished folder).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "io/run_file.h"
#include "io/run_lock.h"
#include "train/trainer.h"

namespace proplab {

// Rank 0 takes the run's lock before anything is written. Under mpirun every rank learns whether it got it, so that
// all of them stop with its message (UserError) when it did not. Collective over options.world.
std::optional<RunLock> lock_run(const RunOptions& options, bool root, const std::filesystem::path& run_file);

// What the ranks other than 0 say after rank 0's I/O failure.
inline constexpr const char* kRootCouldNotWrite = "rank 0 could not write the run file or the checkpoint";

// A write the operating system refused: to which file, at which step.
struct IoFailure {
  bool checkpoint = false;  // the checkpoint (else the run file)
  std::string path;
  std::string reason;     // e.g. "No space left on device"
  std::int64_t step = 0;  // the step being written (a checkpoint: the step it would resume at)
};

// Ends a run that rank 0 could not write: marks the run file failed as far as the file system lets it and says in
// one line (summary.message) what failed, what the run file holds, the last good checkpoint and the command that
// continues; summary.status, detail and io_failure are set.
void end_after_io_failure(const IoFailure& failure, RunWriter& writer, const std::string& name,
                          const std::optional<std::int64_t>& last_checkpoint, const RunOptions& options,
                          RunSummary& summary);

}  // namespace proplab
