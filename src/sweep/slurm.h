// sweep/slurm: the sbatch job-array script `proplab sweep --emit slurm` writes (docs/clusters.md).
//
// Array task i of n runs `proplab sweep STUDY --out DIR --shard i/n`, so the tasks partition the points (shard
// rule in sweep/sweep.h) and share DIR and its index. The script execs proplab, so Slurm's SIGTERM (at the time
// limit, scancel, preemption) reaches the sweep directly and it stops its runs cleanly with checkpoints; a
// resubmitted or requeued task skips finished points and resumes interrupted ones.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "sweep/sweep.h"

namespace proplab {

struct SlurmOptions {
  std::filesystem::path executable;    // absolute path of proplab
  std::filesystem::path study;         // absolute path of the study file
  std::filesystem::path out_dir;       // absolute path of DIR
  std::vector<std::string> overrides;  // --set texts passed through
  std::int64_t tasks = 0;              // array size (0: one task per point)
  int jobs = 1;                        // points at once within a task
  int cpus_per_task = 0;               // 0: 2 per job
  bool retry_failed = false;
  std::string mpirun;  // passed through as --mpirun (points of several processes)
};

// Single-quotes `text` for a POSIX shell.
std::string shell_quote(const std::string& text);
// `text` as one shell word: as it is when it holds only characters no shell treats specially, else shell_quote'd.
std::string shell_word(const std::string& text);

// The script's text.
std::string slurm_script(const SweepPlan& plan, const SlurmOptions& options);

}  // namespace proplab
