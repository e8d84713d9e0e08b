// sweep/slurm: the sbatch job-array script (see slurm.h).
#include "sweep/slurm.h"

#include <algorithm>
#include <sstream>

#include "core/error.h"

namespace proplab {

std::string shell_quote(const std::string& text) {
  std::string out = "'";
  for (const char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string shell_word(const std::string& text) {
  const bool plain = !text.empty() && text.find_first_not_of(
                                          "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                          "0123456789_-./=+,:@%") == std::string::npos;
  return plain ? text : shell_quote(text);
}

std::string slurm_script(const SweepPlan& plan, const SlurmOptions& options) {
  PROPLAB_CHECK(options.jobs >= 1, "a task runs at least one point at a time");
  const auto points = static_cast<std::int64_t>(plan.points.size());
  const std::int64_t tasks = std::clamp<std::int64_t>(options.tasks > 0 ? options.tasks : points, 1, points);
  const int cpus = options.cpus_per_task > 0 ? options.cpus_per_task : 2 * options.jobs;
  const std::int64_t most = (points + tasks - 1) / tasks;
  std::ostringstream out;
  out << "#!/bin/bash\n"
      << "# proplab sweep " << plan.study_name << " as a Slurm job array: " << points << " points in " << tasks
      << " array tasks (at most " << most << " point" << (most == 1 ? "" : "s") << " each).\n"
      << "# Written by `proplab sweep --emit slurm` from " << options.study.string() << "\n"
      << "# Submit: sbatch " << shell_quote((options.out_dir / (plan.study_name + ".sbatch")).string()) << "\n"
      << "# Task i of n runs the points whose index % n == i (`--shard i/n`); all tasks share the sweep folder and\n"
      << "# its index.csv. Resubmitting (or a requeued task) skips finished points and resumes interrupted ones.\n"
      << "# Add --time, --partition, --mem, --account as your cluster needs (docs/clusters.md).\n"
      << "#SBATCH --job-name=" << plan.study_name << "\n"
      << "#SBATCH --array=0-" << tasks - 1 << "\n"
      << "#SBATCH --ntasks=1\n"
      << "#SBATCH --cpus-per-task=" << cpus << "\n"
      << "#SBATCH --output=" << (options.out_dir / "logs" / "slurm-%A_%a.out").string() << "\n"
      << "# SIGTERM to the sweep 120 s before the time limit: its runs stop at the next step with a checkpoint.\n"
      << "#SBATCH --signal=B:TERM@120\n"
      << "set -euo pipefail\n"
      << "exec " << shell_quote(options.executable.string()) << " sweep " << shell_quote(options.study.string())
      << " \\\n  --out " << shell_quote(options.out_dir.string()) << " --jobs " << options.jobs;
  for (const std::string& text : options.overrides) out << " \\\n  --set " << shell_quote(text);
  if (options.retry_failed) out << " \\\n  --retry-failed";
  if (!options.mpirun.empty()) out << " \\\n  --mpirun " << shell_quote(options.mpirun);
  out << " \\\n  --shard \"${SLURM_ARRAY_TASK_ID}/${SLURM_ARRAY_TASK_COUNT}\"\n";
  return out.str();
}

}  // namespace proplab
