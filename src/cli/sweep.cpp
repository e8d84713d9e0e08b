// cli/sweep: the `proplab sweep` command (see sweep.h).
#include "cli/sweep.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "sweep/runner.h"
#include "sweep/slurm.h"
#include "sweep/sweep.h"

namespace proplab {

namespace {

namespace fs = std::filesystem;

std::atomic<int> g_stop_requests{0};

extern "C" void on_sweep_stop_signal(int) { g_stop_requests.fetch_add(1); }

fs::path this_executable() {
  std::error_code error;
  const fs::path path = fs::read_symlink("/proc/self/exe", error);
  if (error) throw std::runtime_error("cannot find the proplab executable (/proc/self/exe): " + error.message());
  return path;
}

void print_plan(const SweepPlan& plan, const SweepOptions& options, std::ostream& out) {
  const std::vector<PointPlan> decided = plan_points(plan, options);
  out << plan.study_path << ": " << plan.points.size() << " points";
  if (!plan.columns.empty()) {
    out << " over";
    for (const auto& column : plan.columns) out << " " << column;
  }
  out << "; shard " << options.shard.index << "/" << options.shard.count << ": " << decided.size() << " points; folder "
      << options.out_dir.string() << "\n";
  for (const PointPlan& point : decided) {
    const SweepPoint& p = plan.points[point.point];
    out << "  " << point.point << "  " << p.name << "  [" << point_status_name(point.row.status) << " -> "
        << point_action_name(point.action) << "]";
    for (const auto& text : p.overrides) out << "  --set " << text;
    out << "\n";
  }
  out << "dry run: every point is valid; nothing was started or written\n";
}

}  // namespace

int sweep_command(const SweepCommandOptions& command, std::ostream& out) {
  if (command.jobs < 1) throw UserError("--jobs " + std::to_string(command.jobs) + ": allowed: an integer >= 1");
  if (!command.emit.empty() && command.emit != "slurm")
    throw UserError("--emit " + command.emit + ": not a script kind; allowed: slurm");
  const Shard shard = command.shard.empty() ? Shard{} : parse_shard(command.shard);
  const SweepPlan plan = load_sweep(command.study_path, command.overrides);

  SweepOptions options;
  options.out_dir = command.out_dir.empty() ? fs::path("runs") / plan.study_name : fs::path(command.out_dir);
  options.jobs = command.jobs;
  options.shard = shard;
  options.retry_failed = command.retry_failed;
  options.log = &out;
  options.terminal = isatty(STDOUT_FILENO) != 0;
  options.stop_requests = &g_stop_requests;
  {
    std::istringstream words(command.mpirun);
    for (std::string word; words >> word;) options.mpirun.push_back(word);
  }
  // (a dry run shows the plan whatever the launcher; it says when one is needed)
  if (!command.dry_run) check_launcher(plan, options.mpirun);

  if (command.emit == "slurm") {
    SlurmOptions slurm;
    slurm.executable = this_executable();
    slurm.study = fs::absolute(command.study_path).lexically_normal();
    slurm.out_dir = fs::absolute(options.out_dir).lexically_normal();
    slurm.overrides = command.overrides;
    slurm.tasks = command.tasks;
    slurm.jobs = command.jobs;
    slurm.cpus_per_task = command.cpus_per_task;
    slurm.retry_failed = command.retry_failed;
    slurm.mpirun = command.mpirun;
    const fs::path script = slurm.out_dir / (plan.study_name + ".sbatch");
    fs::create_directories(slurm.out_dir / "logs");
    std::ofstream(script, std::ios::binary | std::ios::trunc) << slurm_script(plan, slurm);
    fs::permissions(script, fs::perms::owner_exec | fs::perms::group_exec, fs::perm_options::add);
    out << "wrote " << script.string() << " (" << plan.points.size() << " points); submit it with: sbatch "
        << shell_quote(script.string()) << "\n";
    return 0;
  }
  if (command.dry_run) {
    print_plan(plan, options, out);
    int most = 1;
    for (const SweepPoint& point : plan.points) most = std::max(most, point.ranks);
    if (most > 1)
      out << "points need up to " << most << " processes each: "
          << (options.mpirun.empty() ? "run with --mpirun CMD (e.g. --mpirun 'mpirun --oversubscribe')"
                                     : "each runs as " + command.mpirun + " -np N proplab run ...")
          << "\n";
    return 0;
  }
  options.executable = this_executable();
  std::signal(SIGINT, on_sweep_stop_signal);
  std::signal(SIGTERM, on_sweep_stop_signal);
  const SweepResult result = run_sweep(plan, options);
  if (result.stopped) return 4;
  if (result.counts.failed > 0) return 5;
  return result.counts.busy > 0 ? 4 : 0;  // (another process is writing some point: rerun once it has ended)
}

}  // namespace proplab
