// gui/report/report: `proplab report DIR [--out OUT]`: the standard figures of a sweep folder (or of any folder of
// run files) as PNGs, drawn headless by the GUI's offscreen renderer and plot widgets (gui/app/headless.h,
// views' plot specs), and OUT/report.md embedding them with a summary table of every run.
//
// What a report holds (OUT defaults to DIR/report):
//   OUT/figures/depth_<group>.png    forward and backward `var` against probe depth at record 0 (initialisation)
//                                    and at the last record, one colour per run, theory dashed (2 × 2 panels)
//   OUT/figures/loss_<group>.png     training loss per run (evaluation loss dashed)
//   OUT/figures/heatmap_<run>.png    forward and backward `var`, probes × records, of one run
//   OUT/figures/lr_<family>.png      final loss against `train.lr` (log x), one line per series value, best lr of each
//                                    line a large dot, diverged points an × at the top (only when the runs differ in
//                                    train.lr: see lr_sweeps)
//   OUT/report.md                    the summary table, the learning-rate sweeps (when there are), then one section
//                                    per group embedding its figures
// Every figure is report_figure_width × report_figure_height pixels, and has an SVG of the same plots beside its PNG
// (figures/depth_<group>.svg, ...: the same plot specs and layout, drawn by figure_export.h).
//
// Invariants:
// - Runs come from DIR/index.csv when it exists (a sweep folder: its rows in point order, grouped by the swept
//   columns except `seed`); otherwise from every run file under DIR (recursive, checkpoints excluded), grouped by
//   the config keys whose values differ between the runs, except `name`, seeds and keys the other keys already
//   determine (a rule's own parameters follow the rule).
// - A run file is the truth for its status and values; an index row whose file does not exist (a point that
//   failed before writing one) is listed with the index's status and no values.
// - Summary values are computed from the run file alone (report_metrics), so that anyone reading the file with
//   RunReader gets the same numbers: variance growth = `var` at the last block's output over `var` at the first
//   block's input (growth_probe_pair), theory error = the median over residual-stream probes of
//   |measured − predicted| / |predicted| of `var` at record 0 (as `proplab theory --compare`). Numbers are written
//   with report_number ("%.6g"; "n/a" when there is none).
// - A file that cannot be read never stops the report: the others are reported and the bad ones listed; the
//   command then exits 2. A folder without any run is an error (exit 2) and writes nothing.
// - Learning-rate sweeps (lr_sweeps), only when the runs' train.lr values (the index's column, else the run file's
//   config) take at least two values; runs without a readable train.lr are left out of them:
//   * Families: the other keys the groups differ by (ReportPlan::group_keys without train.lr and without keys
//     one-to-one with it, as a key zipped with it) give the series key, the first of them whose values are all
//     numbers (a size: width, depth), else the first; the rest fix a family (in order of first appearance). No
//     other key: one family of one series.
//   * Final loss of a run (lr_run_loss): the last evaluation loss when the run has /eval, else the mean training
//     loss over its last lr_final_steps steps (all of them when fewer); initial loss: the mean training loss over
//     its first lr_initial_steps steps. A run is diverged when its status is diverged or failed, or it has a loss
//     and its final loss is not finite or exceeds its initial loss. A run without any loss (and not diverged by
//     its status) is n/a.
//   * A point (family, series value, lr) averages the final losses of its runs that have one (seeds); it is
//     diverged when any of its runs is, n/a when none has a loss. The best lr of a series is that of its lowest
//     final loss among the points neither diverged nor n/a (ties: the smaller lr); none when there is no such
//     point. Transfer: max / min of the best lrs over the series values that have one (NaN with fewer than two).
#pragma once

#include <cmath>
#include <cstddef>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "gui/data/run_data.h"

namespace proplab::gui {

inline constexpr int report_figure_width = 1200;
inline constexpr int report_figure_height = 800;

struct ReportRun {
  std::string name;                             // the index's run name, else the run's name
  std::filesystem::path file;                   // the run file (may not exist for an index row)
  std::string status;                           // the run file's status, else the index's
  std::string detail;                           // the status detail or the reason the file could not be read
  std::shared_ptr<const RunSnapshot> snapshot;  // null: no readable run file
  std::size_t group = 0;                        // index into ReportPlan::groups
  std::vector<std::string> key_values;          // the run's value of each of ReportPlan::group_keys
};

struct ReportGroup {
  std::string label;                 // e.g. "model.layers=2, scaling.rule=standard"; "all runs" when ungrouped
  std::string slug;                  // file-name part, e.g. "model.layers=2,scaling.rule=standard"
  std::vector<std::size_t> members;  // indices into ReportPlan::runs, in their order
};

inline constexpr const char* lr_key = "train.lr";
inline constexpr std::size_t lr_final_steps = 20;   // training steps averaged for a final loss without /eval
inline constexpr std::size_t lr_initial_steps = 5;  // training steps averaged for the initial loss

// One lr of one series: the runs at it (seeds) and their mean final loss.
struct LrPoint {
  double lr = 0.0;
  double final_loss = std::nan("");  // mean over the runs that have a final loss; NaN when none has
  bool diverged = false;             // some run diverged
  bool has_loss = false;             // some run has a loss (else the point is n/a)
  std::vector<std::size_t> runs;     // indices into ReportPlan::runs
};

struct LrSeries {
  std::string value;                // the series key's value ("" without a series key)
  std::vector<LrPoint> points;      // by increasing lr
  std::optional<std::size_t> best;  // index into points; none when every point is diverged or n/a
};

struct LrFamily {
  std::string label;               // e.g. "scaling.rule=mup"; "all runs" without fixed keys
  std::string slug;                // file-name part, e.g. "scaling.rule=mup"; "all" without fixed keys
  std::vector<LrSeries> series;    // numeric values ascending when every value is a number, else first appearance
  double transfer = std::nan("");  // max / min best lr over the series (NaN with fewer than two best lrs)
};

struct LrSweeps {
  std::vector<std::string> fixed_keys;  // the keys that fix a family, in group_keys order
  std::string series_key;               // "" : one series per family
  std::vector<LrFamily> families;       // empty: the runs do not differ in train.lr
};

struct ReportPlan {
  std::filesystem::path dir;
  bool from_index = false;              // DIR/index.csv named the runs
  std::vector<std::string> group_keys;  // the keys the groups differ by
  std::vector<ReportRun> runs;
  std::vector<ReportGroup> groups;
  std::vector<std::string> bad_files;  // "path: why" for each file that could not be read
  LrSweeps lr;                         // lr_sweeps(*this)
};

// Reads DIR (see the invariants). UserError when DIR is not a folder, its index.csv cannot be parsed, or it holds
// no run at all (the message lists the unreadable files, if any).
ReportPlan plan_report(const std::filesystem::path& dir);

// A run's final and initial loss for the learning-rate sweeps and whether it diverged (see the invariants).
struct LrRunLoss {
  double final_loss = std::nan(""), initial_loss = std::nan("");
  bool from_eval = false;  // the final loss is the last evaluation loss
  bool has_loss = false;   // the run recorded some training or evaluation loss
  bool diverged = false;
};
LrRunLoss lr_run_loss(const ReportRun& run);

// The plan's learning-rate sweeps (see the invariants); no families when the runs do not differ in train.lr.
LrSweeps lr_sweeps(const ReportPlan& plan);

// The probes whose `var` ratio is the variance growth: (blocks.0.in, blocks.<last>.out) in transformers and
// ResNets, (layers.0.preact, layers.<last>.preact) in MLPs, else the first and last residual-stream probes;
// nullopt when a run has none of these.
std::optional<std::pair<std::size_t, std::size_t>> growth_probe_pair(const std::vector<ProbeInfo>& probes);

struct RunMetrics {
  double final_loss = std::nan("");
  double growth_forward_init = std::nan(""), growth_forward_end = std::nan("");
  double growth_backward_init = std::nan(""), growth_backward_end = std::nan("");
  double theory_error_forward = std::nan(""), theory_error_backward = std::nan("");
  std::string growth_first, growth_last;  // the probe names of the ratio ("" without one)
};
// The summary values of one run (NaN where the file does not have what a value needs).
RunMetrics report_metrics(const RunSnapshot& run);

// "%.6g" of `value`; "n/a" for NaN, "inf" / "-inf" for infinities.
std::string report_number(double value);
// `text` with every character outside [A-Za-z0-9._=,+-] replaced by '_' (for file names and markdown links).
std::string report_slug(const std::string& text);

// The figure files of a plan, relative to the report folder, in the order report.md shows them.
// A folder of several groups also gets its runs side by side, one colour per run, when it has at most this many
// readable runs (more lines than the palette tells apart are not drawn together).
inline constexpr std::size_t report_compare_runs = 12;

struct ReportFigures {
  std::vector<std::string> depth, loss;  // one per group
  std::string depth_all, loss_all;       // every run in one figure; "" unless 2+ groups of 2..report_compare_runs runs
  std::vector<std::string> heatmap;      // one per run ("" for a run without a readable file)
  std::vector<std::string> lr;           // one per learning-rate family (ReportPlan::lr)
};
ReportFigures report_figure_names(const ReportPlan& plan);

// report.md for `plan` with `figures` (relative paths) and the runs' metrics.
std::string report_markdown(const ReportPlan& plan, const ReportFigures& figures,
                            const std::vector<RunMetrics>& metrics);

// Draws every figure of `figures` into `out` through one HeadlessRenderer; `progress` is called before each
// figure with (index, count, what). UserError when there is no offscreen OpenGL or a PNG cannot be written.
void render_report_figures(const ReportPlan& plan, const ReportFigures& figures, const std::filesystem::path& out,
                           const std::function<void(std::size_t, std::size_t, const std::string&)>& progress);

struct ReportOptions {
  std::filesystem::path dir;
  std::filesystem::path out;  // empty: DIR/report
};
// The whole command: plan, figures, report.md; progress on `err` (one rewritten line on a terminal, plain lines
// otherwise), the result on `out`. Returns 0, or 2 when some run file could not be read (the others are in the
// report). UserError for bad input (nothing written).
int report_command(const ReportOptions& options, std::ostream& out, std::ostream& err, bool terminal);

}  // namespace proplab::gui
