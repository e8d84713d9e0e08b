// gui/app/plot_specs: the GL-free plot specs of the views (gui/app/plot_specs.cpp), shared by the windows and by
// `proplab report`; depth_plot_spec, train_plot_spec and heatmap_plot_spec are declared in app_state.h.
#pragma once

#include <cstddef>
#include <cstdint>

#include "gui/app/app_state.h"
#include "gui/plot/figure_export.h"

namespace proplab::gui {

// The palette index of `run`: its position in the selection (0 when not selected).
std::size_t colour_index(const AppState& state, const RunSnapshot& run);
// The most records any of `runs` has.
std::int64_t max_records(const RunList& runs);
// The record of `run` shown for the state's record index (clamped to the run's last); -1 without records.
std::int64_t record_of(const RunSnapshot& run, std::int64_t record);
// The kinds the views show for `runs`: the chosen ones, else default_kinds (the residual stream).
std::vector<std::string> shown_kinds(const AppState& state, const RunList& runs);
// The depth profile's x axis for `runs`: the chosen one, else default_depth_axis (block; l/L when depths differ).
DepthAxis shown_depth_axis(const AppState& state, const RunList& runs);
// The run's finite-width band (/theory/forward/var_log_sd, the sd of log var per probe) when it has one for some
// probe, else null. The depth profile of forward var draws one network's 95% range from it.
const std::vector<double>* var_band(const RunSnapshot& run);
// The chosen probes' statistic against the training step, one series per run and probe.
PlotSpec dynamics_plot_spec(const AppState& state, const RunList& runs);
// The run the heatmap view shows: state.heatmap_run when selected, else the first of `runs`; null without runs.
const RunSnapshot* heatmap_run_of(const AppState& state, const RunList& runs);

// The compare view's small multiples: one panel per group of `runs` by state.compare_key (in group order), titled
// "key = value", in `columns` columns; line plots share both axes' ranges, heatmaps (of each group's first run)
// one colour range.
struct ComparePanels {
  int columns = 1;
  std::vector<std::string> values;               // each panel's group value
  std::vector<PlotSpec> plots;                   // when state.compare_plot is not the heatmap
  std::vector<HeatmapSpec> heatmaps;             // when it is
  std::vector<const RunSnapshot*> heatmap_runs;  // the run of each heatmap
};
ComparePanels compare_panels(const AppState& state, const RunList& runs);

// The grid view's config key for `runs`: state.compare_key when chosen (--group, the compare or grid window) or when
// its value differs between the runs, else the first key whose value differs (the run's name aside), else "" (one
// column of every run).
std::string grid_key(const AppState& state, const RunList& runs);

// The grid view, a paper figure of small multiples (DeepScaleLM's layout): two rows, the forward `var` and the
// backward `var` (gradient variance) against depth on the shown depth axis for the shown kinds, by one column per
// group of `runs` by grid_key (in group order). Each panel overlays every run of its column at initialisation
// (record 0: thin, dashed and faded, "<run> (init)") and at its last record ("<run> (step N)"), in the run's
// colour. The panels of one row share the y range (log unless state.depth_log_y is off), all share the x range.
struct GridPanels {
  static constexpr int rows = 2;
  std::string key;                         // the grouping key; empty: one column of every run
  std::vector<std::string> values;         // each column's group value
  std::vector<std::string> column_titles;  // "key = value" ("all runs" without a key)
  std::vector<std::string> row_titles;     // "forward var", "backward var"
  std::vector<PlotSpec> plots;             // row-major: plots[row * columns() + column]
  int columns() const { return static_cast<int>(values.size()); }
};
GridPanels grid_panels(const AppState& state, const RunList& runs);
// The name of a grid panel (exports' panel column, the window's plot state): "grid/forward/<value>" for row 0,
// "grid/backward/<value>" for row 1.
std::string grid_panel_name(int row, const std::string& value);

// The focused view (state.view) of the selected runs as a figure of `width` × `height` pixels laid out as the
// view's window lays out its plots (without its controls), for SVG, PNG and CSV exports (figure_export.h).
Figure view_figure(const AppState& state, double width, double height);

}  // namespace proplab::gui
