// cli/sweep: `proplab sweep STUDY.toml` — expands the study's [sweep], validates every point, and runs them as
// separate `proplab run` processes into one folder (or prints the plan, or writes a Slurm array script).
//
// Exit status: 0 every point of the shard finished (completed or diverged); 2 bad input (nothing started);
// 4 stopped early by SIGINT/SIGTERM, or some point left to another process writing it (rerun the same command to
// continue); 5 some point failed (index.csv says which and why, an I/O failure's message included; the others ran).
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace proplab {

struct SweepCommandOptions {
  std::string study_path;
  std::vector<std::string> overrides;  // --set, applied to every point before the swept values
  std::string out_dir;                 // "" : runs/<study name>
  int jobs = 1;
  bool dry_run = false;
  std::string shard;  // "i/n" or ""
  bool retry_failed = false;
  std::string emit;        // "" or "slurm"
  std::int64_t tasks = 0;  // --emit slurm: array tasks (0: one per point)
  int cpus_per_task = 0;   // --emit slurm: 0: 2 per job
  std::string mpirun;      // the launcher's command for points of several processes ("" : none)
};

// Runs the command; returns the exit status. Throws UserError for bad input.
int sweep_command(const SweepCommandOptions& options, std::ostream& out);

}  // namespace proplab
