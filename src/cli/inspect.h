// cli/inspect: `proplab inspect RUN.h5` (a run file's summary and depth table) and `proplab recover RUN.h5`.
//
// inspect reads through RunReader in automatic mode, so it works on finished runs, runs still going and runs
// whose writer was killed (the last two in SWMR-read mode, which it notes). The report is built completely
// before anything is printed: an error (exit 2) prints nothing on stdout.
//
// The depth table follows the statistics layout of docs/run-format.md: one row per probe (/probes/*) with the
// chosen statistic of /forward/<stat> or /backward/<stat> at one record (a row of /steps).
#pragma once

#include <cstdint>
#include <filesystem>
#include <ostream>
#include <string>

namespace proplab {

struct InspectOptions {
  std::filesystem::path run_file;
  std::string stat;       // empty: var, or the first recorded statistic when var is not recorded
  bool backward = false;  // the table shows /backward/<stat> instead of /forward/<stat>
  bool has_step = false;  // false: the last record
  std::int64_t step = 0;  // the training step whose record the table shows
};

// Writes the report on `options.run_file` to `out`. UserError for a file that is not a readable proplab run
// file, a statistic that was not recorded, a step that was not recorded (naming the nearest recorded steps),
// or --stat/--step/--backward on a run without statistics.
void inspect_run_file(const InspectOptions& options, std::ostream& out);

// `proplab recover RUN.h5`: clears a killed writer's open-for-write mark (io/recover.h) and reports what it
// did to `out`. UserError as recover_run_file.
void recover_run_file_command(const std::filesystem::path& run_file, std::ostream& out);

}  // namespace proplab
