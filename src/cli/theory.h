// cli/theory: `proplab theory STUDY.toml [--set key=value]... [--compare RUN.h5]`, the theoretical predictions
// for a study's model at initialisation (train/theory_run.h), optionally against a run's record at step 0.
//
// The study is loaded like `proplab run` loads it (a [sweep] study is refused the same way) and the model is
// never built, so very deep studies print at once. The report is built completely before anything is printed:
// an error (UserError, exit 2) prints nothing on stdout.
//
// Output: a depth table (one row per probe, in the model's probe order: predicted forward var, mean, corr and
// backward var; "-" where there is no prediction), the reasons for the missing predictions, and for MLPs the
// mean-field summary (q*, c*, χ₁, phase). With --compare, per probe the measured statistic of the run's record
// at step 0 beside the prediction with the relative error |measured - predicted| / |predicted|, then one summary
// line on the residual stream (probes of kind residual): the median and worst relative error of forward var and
// backward var.
#pragma once

#include <filesystem>
#include <ostream>
#include <string>
#include <vector>

namespace proplab {

struct TheoryOptions {
  std::string study_path;
  std::vector<std::string> overrides;  // --set key.path=value
  std::filesystem::path compare;       // a run file to compare with; empty: none
};

// Writes the report to `out`. UserError for a bad study, a [sweep] study, an unreadable run file, a run without
// a record at step 0, or a run whose probes are not those of the study's model.
void theory_command(const TheoryOptions& options, std::ostream& out);

}  // namespace proplab
