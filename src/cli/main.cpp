// proplab: the command line. `proplab run STUDY.toml` trains a study and writes its run file; `proplab inspect
// RUN.h5` summarises a run file; `proplab recover RUN.h5` repairs the run file of a killed run; `proplab theory
// STUDY.toml` prints the theoretical predictions at initialisation (and compares them with a run); `proplab sweep
// STUDY.toml` runs the points of the study's [sweep] into one folder (exit statuses: cli/sweep.h); `proplab report
// DIR` draws a sweep folder's figures and report.md headless (exit statuses: cli/report.h).
//
// Exit status: 0 completed; 1 internal error; 2 bad input (study, data, run file, command line; nothing was
// written); 3 diverged (loss became non-finite); 4 stopped early (interrupted or --stop-after), resumable with
// --resume; 5 a collective timed out under mpirun (a rank died or stalled; the run file says failed); 6 an I/O
// failure (disk full, quota, read-only or vanished folder) stopped the run: one line says what the run file holds
// and the command that continues it (--resume from the last good checkpoint).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <iostream>
#include <optional>

#include "cli/inspect.h"
#include "core/error.h"
#include "core/stop_signals.h"
#include "core/device.h"
#include "cli/report.h"
#include "dist/communicator.h"
#include "cli/sweep.h"
#include "cli/theory.h"
#include "study/run_spec.h"
#include "study/study.h"
#include "sweep/slurm.h"
#include "train/trainer.h"

namespace {

constexpr const char* kVersion = "0.1.0";

constexpr const char* kDescription =
    "proplab: a lab for signal propagation in very deep networks.\n"
    "Trains deep transformers and MLPs described by a study file (TOML, see docs/studies.md) and records\n"
    "what happens to the signal in a run file (HDF5, see docs/run-format.md).\n\n"
    "Exit status: 0 completed, 1 internal error, 2 bad input (nothing written), 3 diverged,\n"
    "4 stopped early (interrupted or --stop-after; continue with --resume), 5 a collective timed out under\n"
    "mpirun (a rank died or stalled; the run file says failed), 6 an I/O failure (disk full, quota, read-only\n"
    "or vanished folder) stopped the run (the message says what was kept and how to continue with --resume).\n"
    "One process writes a run at a time: a second `proplab run` into the same run file is refused (exit 2).";

int run_command(const std::string& study_path, const std::vector<std::string>& overrides, const std::string& out,
                bool resume, bool force, std::int64_t stop_after) {
  // Before any thread starts (MPI's, OpenMP's, the run file's writer), so that none of them takes the signals
  // (core/stop_signals.h says why).
  const proplab::StopSignals stop_signals;
  proplab::Study study = proplab::load_study(study_path, overrides);
  if (study.has_sweep)
    throw proplab::UserError(study_path + ": this study has a [sweep] table; run it with `proplab sweep " + study_path +
                             "` (or remove [sweep] to run a single point)");
  proplab::RunOptions options;
  options.out_dir = out.empty() ? std::filesystem::path("runs") / study.name : std::filesystem::path(out);
  options.resume = resume;
  options.force = force;
  options.stop_after = stop_after;
  options.log = &std::cout;
  options.terminal = isatty(STDOUT_FILENO) != 0;
  options.interrupt = &stop_signals.requested();
  options.proplab_version = kVersion;
  options.command = "proplab run " + proplab::shell_word(study_path);
  for (const std::string& entry : overrides) options.command += " --set " + proplab::shell_word(entry);
  options.command += " --out " + proplab::shell_word(options.out_dir.string());
  // Under an MPI launcher (mpirun/srun) the processes form the [parallel] layout (on GPUs with device.type = "cuda");
  // rank 0 prints and writes.
  std::optional<proplab::dist::ProcessGroups> groups;
  if (proplab::dist::launched_by_mpi()) {
    groups.emplace(proplab::make_run_process_groups(proplab::to_run_spec(study), options));
    if (groups->world->rank() != 0) options.log = nullptr;
    options.command = "mpirun -np " + std::to_string(groups->world->size()) + " " + options.command;
  }
  proplab::RunSummary summary = proplab::run_training(proplab::to_run_spec(study), options);
  if (summary.collective_timeout) {
    std::cerr << "proplab: " << study.name << ": " << summary.detail << "\n";
    std::cerr.flush();
    proplab::dist::abort_all(5);  // ends every rank, the stalled one included
  }
  if (summary.out_of_memory && options.log)
    std::cerr << "proplab: error: " << study.name << ": " << summary.detail
              << "; the run file holds every record before it (status failed); resume from the last checkpoint with "
                 "a smaller train.batch (and train.grad_accum to keep the batch) or a smaller model\n";
  if (summary.io_failure) {
    if (options.log) std::cerr << "proplab: error: " << summary.message << "\n";
    return 6;
  }
  switch (summary.status) {
    case proplab::RunStatus::completed:
      return 0;
    case proplab::RunStatus::diverged:
      return 3;
    default:
      return 4;
  }
}

// The command line: every subcommand's options and which subcommand was given.
struct Commands {
  CLI::App* run = nullptr;
  std::string study_path, out_dir;
  std::vector<std::string> overrides;
  bool resume = false, force = false;
  std::int64_t stop_after = -1;
  CLI::App* inspect = nullptr;
  proplab::InspectOptions inspect_options;
  std::string inspect_path, inspect_step;
  CLI::App* recover = nullptr;
  std::string recover_path;
  CLI::App* theory = nullptr;
  proplab::TheoryOptions theory_options;
  std::string compare_path;
  CLI::App* sweep = nullptr;
  proplab::SweepCommandOptions sweep_options;
  CLI::App* report = nullptr;
  proplab::ReportCommandOptions report_options;
};

void add_run_command(CLI::App& app, Commands& c) {
  c.run = app.add_subcommand("run", "Train one study and write its run file (DIR/<name>.h5).");
  c.run->add_option("study", c.study_path, "The study file (TOML; see docs/studies.md)")->required();
  c.run->add_option("--set", c.overrides,
                    "Override a study key, e.g. --set model.layers=48 --set scaling.rule=xavier (value in TOML "
                    "syntax; bare words are strings). Repeatable.");
  c.run->add_option("--out", c.out_dir, "Directory for the run file and checkpoint (default: runs/<name>/)");
  c.run->add_flag("--resume", c.resume, "Continue from the checkpoint in the output directory, bit for bit");
  c.run->add_flag("--force", c.force, "Overwrite an existing run file");
  c.run
      ->add_option("--stop-after", c.stop_after,
                   "Stop cleanly after this many steps, with a checkpoint (continue later with --resume)")
      ->check(CLI::Validator(
          [](const std::string& text) {
            return !text.empty() && text.find_first_not_of("0123456789") == std::string::npos
                       ? std::string()
                       : "must be a step count (a whole number >= 0), got " + text;
          },
          "STEPS"));
}

void add_file_commands(CLI::App& app, Commands& c) {
  c.inspect = app.add_subcommand(
      "inspect", "Summarise a run file (finished, still going or killed) and print a depth table of a statistic.");
  c.inspect->add_option("run_file", c.inspect_path, "The run file (DIR/<name>.h5)")->required();
  c.inspect->add_option("--stat", c.inspect_options.stat,
                        "Statistic for the depth table, e.g. mean, var, rms, max_abs, kurtosis (default: var)");
  c.inspect->add_flag("--backward", c.inspect_options.backward,
                      "Show the backward (gradient) statistic, not the forward");
  c.inspect->add_option("--step", c.inspect_step, "Show the record of this training step (default: the last record)")
      ->check(CLI::Validator(
          [](const std::string& text) {
            return !text.empty() && text.size() < 19 && text.find_first_not_of("0123456789") == std::string::npos
                       ? std::string()
                       : "must be a training step (a whole number >= 0), got " + text;
          },
          "STEP"));

  c.recover =
      app.add_subcommand("recover",
                         "Make the run file of a killed run readable by every HDF5 tool again (status becomes failed, "
                         "detail killed). A finished run's file is left unchanged.");
  c.recover->add_option("run_file", c.recover_path, "The run file (DIR/<name>.h5)")->required();

  c.theory = app.add_subcommand(
      "theory",
      "Print the predicted statistics of every probe at initialisation (without building the model), "
      "optionally measured against a run's record at step 0.");
  c.theory->add_option("study", c.theory_options.study_path, "The study file (TOML; see docs/studies.md)")->required();
  c.theory->add_option("--set", c.theory_options.overrides,
                       "Override a study key, as for `proplab run` (value in TOML syntax). Repeatable.");
  c.theory->add_option("--compare", c.compare_path,
                       "A run file of this study (with a record at step 0): print measured vs predicted per probe and "
                       "the residual stream's median and worst relative error");
}

void add_sweep_commands(CLI::App& app, Commands& c) {
  c.sweep = app.add_subcommand(
      "sweep",
      "Run every point of a study's [sweep] as its own `proplab run`, N at a time, into DIR/<run>.h5 with "
      "DIR/index.csv. Rerunning continues: finished points are skipped, interrupted ones resumed. Exit status: 0 "
      "all finished, 2 bad input, 4 stopped or some point left to another process writing it (rerun to continue), 5 "
      "some point failed (see index.csv).");
  c.sweep->add_option("study", c.sweep_options.study_path, "The study file with a [sweep] table (docs/studies.md)")
      ->required();
  c.sweep->add_option("--set", c.sweep_options.overrides,
                      "Override a study key for every point, as for `proplab run`. Repeatable.");
  c.sweep->add_option("--jobs", c.sweep_options.jobs, "Points run at once (each gets cores/N CPUs; default 1)")
      ->check(CLI::Range(1, 4096));
  c.sweep->add_option("--out", c.sweep_options.out_dir, "The sweep folder (default: runs/<name>/)");
  c.sweep->add_flag("--dry-run", c.sweep_options.dry_run,
                    "Validate every point and print the plan (what would run, skip or resume); write nothing");
  c.sweep->add_option("--shard", c.sweep_options.shard,
                      "Run only shard i of n (0-based): the points whose index % n == i, e.g. --shard 0/4");
  c.sweep->add_flag("--retry-failed", c.sweep_options.retry_failed, "Rerun points that failed before");
  c.sweep->add_option("--mpirun", c.sweep_options.mpirun,
                      "The MPI launcher for points whose [parallel] layout needs N > 1 processes: each runs as "
                      "CMD -np N proplab run ..., e.g. --mpirun 'mpirun --oversubscribe'");
  c.sweep->add_option("--emit", c.sweep_options.emit,
                      "Write a job script instead of running: slurm (DIR/<name>.sbatch, an sbatch job array with one "
                      "shard per task; docs/clusters.md)");
  c.sweep->add_option("--tasks", c.sweep_options.tasks, "--emit slurm: array tasks (default: one per point)")
      ->check(CLI::Range(1, 1000000));
  c.sweep
      ->add_option("--cpus-per-task", c.sweep_options.cpus_per_task,
                   "--emit slurm: CPUs per array task (default: 2 per job)")
      ->check(CLI::Range(1, 4096));

  c.report = app.add_subcommand(
      "report",
      "Draw the standard figures of a sweep folder (or any folder of run files) as PNGs, headless, and write "
      "report.md with a summary table of every run (and, when the runs differ in train.lr, the final loss against "
      "the learning rate with each line's best lr). Exit status: 0 written, 1 this build has no renderer, 2 no "
      "runs in DIR or some run file unreadable (the others are reported).");
  c.report->add_option("dir", c.report_options.dir, "The sweep folder (with index.csv) or a folder of run files")
      ->required();
  c.report->add_option("--out", c.report_options.out, "The report folder (default: DIR/report)");
}

// Runs the subcommand that was given; its exit status.
int dispatch(Commands& c) {
  try {
    if (*c.run) return run_command(c.study_path, c.overrides, c.out_dir, c.resume, c.force, c.stop_after);
    if (*c.inspect) {
      c.inspect_options.run_file = c.inspect_path;
      if (!c.inspect_step.empty()) {
        c.inspect_options.has_step = true;
        c.inspect_options.step = std::stoll(c.inspect_step);
      }
      proplab::inspect_run_file(c.inspect_options, std::cout);
      return 0;
    }
    if (*c.sweep) return proplab::sweep_command(c.sweep_options, std::cout);
    if (*c.report) return proplab::report_command(c.report_options, std::cout, std::cerr);
    if (*c.theory) {
      c.theory_options.compare = c.compare_path;
      proplab::theory_command(c.theory_options, std::cout);
      return 0;
    }
    if (*c.recover) {
      proplab::recover_run_file_command(c.recover_path, std::cout);
      return 0;
    }
  } catch (const proplab::UserError& e) {
    std::cerr << "proplab: error: " << e.what() << "\n";
    return 2;
  } catch (const proplab::IoError& e) {
    std::cerr << "proplab: error: " << e.what() << "; nothing was lost: free space (or make the folder writable "
              << "again), then run the same command again\n";
    return 6;
  } catch (const proplab::DeviceMemoryError& e) {
    std::cerr << "proplab: error: " << e.what() << "\n";
    return 4;
  } catch (const std::exception& e) {
    std::cerr << "proplab: internal error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{kDescription, "proplab"};
  app.set_version_flag("--version", kVersion);
  app.require_subcommand(1);
  app.footer(
      "Commands:\n  proplab run STUDY.toml [--set key.path=value]... [--out DIR] [--resume] [--force] "
      "[--stop-after N]\n  proplab inspect RUN.h5 [--stat NAME] [--backward] [--step STEP]\n"
      "  proplab recover RUN.h5\n"
      "  proplab sweep STUDY.toml [--jobs N] [--out DIR] [--dry-run] [--shard i/n] [--retry-failed] [--emit slurm] "
      "[--mpirun CMD]\n"
      "  proplab theory STUDY.toml [--set key.path=value]... [--compare RUN.h5]\n"
      "  proplab report DIR [--out DIR/report]\n"
      "Run `proplab <command> --help` for a command's options. Study keys: "
      "docs/studies.md; run files: docs/run-format.md.");
  Commands commands;
  add_run_command(app, commands);
  add_file_commands(app, commands);
  add_sweep_commands(app, commands);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  return dispatch(commands);
}
