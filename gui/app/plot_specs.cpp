// The GL-free plot specs of proplab-gui's views (what to draw: series, axes, markers, heatmap cells), shared by the
// windows (gui/app/views.cpp) and `proplab report` (gui/report). Nothing here draws or touches OpenGL.
#include "gui/app/plot_specs.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "gui/data/block_axis.h"
#include "gui/data/depth_axis.h"
#include "theory/model_theory.h"

namespace proplab::gui {

namespace {

// Above this many runs in one plot, lines are drawn 1 px wide, so that many overlaid profiles stay apart.
constexpr std::size_t thin_line_runs = 16;

}  // namespace

std::size_t colour_index(const AppState& state, const RunSnapshot& run) {
  const auto found = state.selection_position.find(run.path.string());
  return found == state.selection_position.end() ? 0 : found->second;
}

std::int64_t max_records(const RunList& runs) {
  std::int64_t records = 0;
  for (const auto& run : runs) records = std::max<std::int64_t>(records, static_cast<std::int64_t>(run->records()));
  return records;
}

// The record of `run` shown for the state's record index (clamped to the run's last); -1 without records.
std::int64_t record_of(const RunSnapshot& run, std::int64_t record) {
  const auto records = static_cast<std::int64_t>(run.records());
  if (records == 0) return -1;
  return record < 0 ? records - 1 : std::min(record, records - 1);
}

std::vector<std::string> shown_kinds(const AppState& state, const RunList& runs) {
  return state.kind_filter ? *state.kind_filter : default_kinds(runs);
}

DepthAxis shown_depth_axis(const AppState& state, const RunList& runs) {
  return state.depth_axis ? *state.depth_axis : default_depth_axis(runs);
}

namespace {

std::string stat_title(const AppState& state) {
  return std::string(direction_name(state.direction)) + " " + state.stat;
}

// True when every run of `runs` (at least one) has a stage layout: their depth profiles are then drawn by block.
bool by_block(const RunList& runs) {
  return !runs.empty() && std::all_of(runs.begin(), runs.end(), [](const auto& run) { return has_block_axis(*run); });
}

// Where the stages of `runs` begin on the block or l/L axis: a dashed line at each transition and a "stage s" label
// for every stage. One set in the marker colour when every run has the same layout; else one per run, in its
// colour, on its own label row.
std::vector<AxisMarker> stage_markers(const AppState& state, const RunList& runs, DepthAxis axis) {
  const auto same_layout = [&](const RunSnapshot& run) {
    const auto& first = runs.front()->blocks;
    return std::equal(
        run.blocks.begin(), run.blocks.end(), first.begin(), first.end(),
        [](const RunBlock& a, const RunBlock& b) { return a.stage == b.stage && a.transition == b.transition; });
  };
  const bool shared = std::all_of(runs.begin(), runs.end(), [&](const auto& run) { return same_layout(*run); });
  std::vector<AxisMarker> markers;
  for (std::size_t i = 0; i < (shared ? std::min<std::size_t>(1, runs.size()) : runs.size()); ++i) {
    for (const auto& start : stage_starts(runs[i]->blocks)) {
      AxisMarker marker;
      marker.value = block_position_on(start.position, block_count(runs[i]->probes), axis);
      marker.label = stage_label(start.stage);
      marker.line = start.transition;
      if (!shared) {
        marker.colour = series_colour(colour_index(state, *runs[i]));
        marker.label_row = static_cast<int>(i);
      }
      markers.push_back(std::move(marker));
    }
  }
  return markers;
}

// The block axis' named ticks: each block's name at its start (block b at b).
std::vector<Tick> block_ticks(const RunList& runs, DepthAxis axis) {
  std::vector<Tick> ticks;
  if (axis != DepthAxis::block) return ticks;
  const auto names = block_names(runs);
  for (std::size_t b = 0; b < names.size(); ++b) ticks.push_back(Tick{static_cast<double>(b), names[b], true});
  return ticks;
}

}  // namespace

const std::vector<double>* var_band(const RunSnapshot& run) {
  const std::vector<double>* log_sd = run.theory(Direction::forward, "var_log_sd");
  if (log_sd == nullptr || std::none_of(log_sd->begin(), log_sd->end(), [](double v) { return std::isfinite(v); }))
    return nullptr;
  return log_sd;
}

// The depth profile of `runs` (a subset of the selection) at the state's record, on the chosen or default depth
// axis (depth_axis.h), the stages marked when every run has a stage layout (ResNets) and the axis is by block or
// l/L. Every point carries its read-out (probe, block, step, value).
PlotSpec depth_plot_spec(const AppState& state, const RunList& runs) {
  PlotSpec spec;
  const DepthAxis axis = shown_depth_axis(state, runs);
  const std::vector<std::string> kinds = shown_kinds(state, runs);
  spec.x_label = depth_axis_title(axis);
  spec.x_names = block_ticks(runs, axis);
  if (axis != DepthAxis::probe && by_block(runs)) spec.x_markers = stage_markers(state, runs, axis);
  spec.y_label = stat_title(state);
  spec.y_scale = state.depth_log_y ? AxisScale::log : AxisScale::linear;
  for (const auto& run : runs) {
    const Dataset2D* matrix = run->stat(state.direction, state.stat);
    const std::int64_t record = record_of(*run, state.record);
    if (matrix == nullptr || record < 0) continue;
    const std::int64_t step = run->record_steps[static_cast<std::size_t>(record)];
    const ImU32 colour = series_colour(colour_index(state, *run));
    const float thickness = runs.size() > thin_line_runs ? 1.0f : 2.0f;
    PlotSeries measured;
    measured.label = run->name;
    measured.run = run->name;
    measured.colour = colour;
    measured.thickness = thickness;
    const auto probes = probes_of_kinds(run->probes, kinds);
    const std::vector<double> x_of = depth_axis_positions(run->probes, axis);
    for (const std::size_t p : probes) {
      const double value = matrix->at(record, static_cast<std::int64_t>(p));
      measured.x.push_back(x_of[p]);
      measured.y.push_back(value);
      measured.point_labels.push_back(probe_point_text(run->probes[p], step, spec.y_label, value));
      measured.point_probes.push_back(run->probes[p].name);
    }
    spec.series.push_back(std::move(measured));
    // The prediction at initialisation, in either direction: dashed in the run's colour wherever the file has one.
    const std::vector<double>* theory = run->theory(state.direction, state.stat);
    if (state.show_theory && theory != nullptr) {
      PlotSeries predicted;
      predicted.label = run->name + " (theory, init)";
      predicted.run = run->name;
      predicted.colour = colour;
      predicted.dashed = true;
      predicted.thickness = thickness;
      const std::int64_t first_step = run->record_steps.front();
      for (const std::size_t p : probes) {
        predicted.x.push_back(x_of[p]);
        predicted.y.push_back((*theory)[p]);
        predicted.point_probes.push_back(run->probes[p].name);
        predicted.point_labels.push_back(
            probe_point_text(run->probes[p], first_step, "predicted " + spec.y_label, (*theory)[p]));
      }
      if (std::any_of(predicted.y.begin(), predicted.y.end(), [](double v) { return std::isfinite(v); })) {
        // The finite-width band (/theory/forward/var_log_sd: MLPs, normed transformers, some ResNets): where one
        // network's var falls 95% of the time, two thin faded dashed lines that the prediction's legend entry hides and
        // shows with it.
        const std::vector<double>* log_sd =
            state.direction == Direction::forward && state.stat == "var" ? var_band(*run) : nullptr;
        if (log_sd != nullptr) {
          for (const double side : {-1.0, 1.0}) {
            PlotSeries band;
            band.label = run->name + (side < 0 ? " (theory, 95% low)" : " (theory, 95% high)");
            band.legend_name = predicted.label;
            band.in_legend = false;
            band.run = run->name;
            band.colour = series_colour(colour_index(state, *run), 0.45f);
            band.dashed = true;
            band.thickness = 1.0f;
            for (const std::size_t p : probes) {
              const theory::VarRange range = theory::one_network_range((*theory)[p], (*log_sd)[p]);
              const double value = side < 0 ? range.low : range.high;
              band.x.push_back(x_of[p]);
              band.y.push_back(value);
              band.point_probes.push_back(run->probes[p].name);
              band.point_labels.push_back(probe_point_text(
                  run->probes[p], first_step,
                  std::string("one network's ") + (side < 0 ? "95% low" : "95% high") + " " + spec.y_label, value));
            }
            spec.series.push_back(std::move(band));
          }
        }
        spec.series.push_back(std::move(predicted));
      }
    }
  }
  if (!runs.empty()) {
    const std::int64_t record = record_of(*runs.front(), state.record);
    if (record >= 0) spec.title = "step " + std::to_string(runs.front()->record_steps[record]);
  }
  return spec;
}

namespace {

// The probes the dynamics view follows in `run`: the chosen names it has, else the defaults.
std::vector<std::size_t> dynamics_probes_of(const AppState& state, const RunSnapshot& run) {
  std::vector<std::size_t> chosen;
  for (const auto& name : state.dynamics_probes) {
    for (std::size_t p = 0; p < run.probes.size(); ++p) {
      if (run.probes[p].name == name) chosen.push_back(p);
    }
  }
  return chosen.empty() ? default_dynamics_probes(run.probes) : chosen;
}

}  // namespace

PlotSpec dynamics_plot_spec(const AppState& state, const RunList& runs) {
  PlotSpec spec;
  spec.x_label = "step";
  spec.y_label = stat_title(state);
  spec.x_scale = state.dynamics_log_x ? AxisScale::log : AxisScale::linear;
  spec.y_scale = state.dynamics_log_y ? AxisScale::log : AxisScale::linear;
  for (const auto& run : runs) {
    const Dataset2D* matrix = run->stat(state.direction, state.stat);
    if (matrix == nullptr || run->records() == 0) continue;
    const std::size_t colour = colour_index(state, *run);
    const auto probes = dynamics_probes_of(state, *run);
    for (std::size_t k = 0; k < probes.size(); ++k) {
      PlotSeries series;
      series.label = run->name + " · " + run->probes[probes[k]].name;
      series.run = run->name;
      series.probe = run->probes[probes[k]].name;
      // The first probe in the run's own colour, later ones fainter.
      series.colour = series_colour(colour, std::max(0.35f, 1.0f - 0.3f * static_cast<float>(k)));
      series.thickness = runs.size() > thin_line_runs ? 1.0f : 2.0f;
      for (std::size_t r = 0; r < run->records(); ++r) {
        series.x.push_back(static_cast<double>(run->record_steps[r]));
        series.y.push_back(matrix->at(static_cast<std::int64_t>(r), static_cast<std::int64_t>(probes[k])));
      }
      spec.series.push_back(std::move(series));
    }
  }
  if (!runs.empty()) {
    const std::int64_t record = record_of(*runs.front(), state.record);
    if (record >= 0) spec.x_marker = static_cast<double>(runs.front()->record_steps[record]);
  }
  return spec;
}

bool any_compression(const RunList& runs) {
  return std::any_of(runs.begin(), runs.end(), [](const auto& run) { return !run->compression_steps.empty(); });
}

// One training curve per run: loss, lr or grad_norm; or compression_error (the gradient exchange's total relative
// error at each recorded step, runs that compress only).
PlotSpec train_plot_spec(const AppState& state, const RunList& runs, const char* which) {
  PlotSpec spec;
  spec.title = std::string(which) == "compression_error" ? "compression error" : which;
  spec.x_label = "step";
  spec.x_scale = state.dynamics_log_x ? AxisScale::log : AxisScale::linear;
  spec.y_scale = std::string(which) == "lr" ? AxisScale::linear : AxisScale::log;
  spec.legend = false;
  for (const auto& run : runs) {
    if (std::string(which) == "compression_error") {
      if (run->compression_steps.empty()) continue;
      PlotSeries series;
      series.label = run->name;
      series.run = run->name;
      series.colour = series_colour(colour_index(state, *run));
      series.thickness = 1.5f;
      series.x.assign(run->compression_steps.begin(), run->compression_steps.end());
      series.y = run->compression_error;
      spec.series.push_back(std::move(series));
      continue;
    }
    const std::vector<double>& values = std::string(which) == "loss" ? run->train.loss
                                        : std::string(which) == "lr" ? run->train.lr
                                                                     : run->train.grad_norm;
    const ImU32 colour = series_colour(colour_index(state, *run));
    PlotSeries series;
    series.label = run->name;
    series.run = run->name;
    series.colour = colour;
    series.thickness = 1.5f;
    series.x.assign(run->train.step.begin(), run->train.step.end());
    series.y = values;
    spec.series.push_back(std::move(series));
    if (std::string(which) == "loss" && run->eval.size() > 0) {
      PlotSeries eval;
      eval.label = run->name + " (eval)";
      eval.run = run->name;
      eval.colour = colour;
      eval.dashed = true;
      eval.x.assign(run->eval.step.begin(), run->eval.step.end());
      eval.y = run->eval.loss;
      spec.series.push_back(std::move(eval));
    }
  }
  return spec;
}

std::string grid_key(const AppState& state, const RunList& runs) {
  if (state.compare_key_chosen && !state.compare_key.empty()) return state.compare_key;
  std::vector<std::string> differing = differing_config_keys(runs);
  std::erase(differing, std::string("name"));
  if (std::find(differing.begin(), differing.end(), state.compare_key) != differing.end()) return state.compare_key;
  return differing.empty() ? std::string() : differing.front();
}

namespace {

// The `var` profile of `run` in `direction` at `record` over `probes` (at `x_of`), as one series of the grid: at
// initialisation thin, dashed and faded, else solid in the run's colour. The legend lists the run once.
PlotSeries grid_profile(const AppState& state, const RunSnapshot& run, Direction direction, std::int64_t record,
                        const std::vector<std::size_t>& probes, const std::vector<double>& x_of) {
  const Dataset2D& matrix = *run.stat(direction, "var");
  const bool init = record == 0;
  const std::int64_t step = run.record_steps[static_cast<std::size_t>(record)];
  const std::string title = std::string(direction_name(direction)) + " var";
  PlotSeries series;
  series.label = run.name + (init ? " (init)" : " (step " + std::to_string(step) + ")");
  // One legend entry per run, its solid line (the header says which line is which); the pair hides together.
  series.legend_name = run.name;
  series.in_legend = !init || run.records() == 1;
  series.run = run.name;
  series.colour = series_colour(colour_index(state, run), init ? 0.6f : 1.0f);
  series.dashed = init;
  series.thickness = init ? 1.0f : 2.0f;
  for (const std::size_t p : probes) {
    const double value = matrix.at(record, static_cast<std::int64_t>(p));
    series.x.push_back(x_of[p]);
    series.y.push_back(value);
    series.point_labels.push_back(probe_point_text(run.probes[p], step, title, value));
    series.point_probes.push_back(run.probes[p].name);
  }
  return series;
}

}  // namespace

std::string grid_panel_name(int row, const std::string& value) {
  return std::string("grid/") + (row == 0 ? "forward/" : "backward/") + value;
}

GridPanels grid_panels(const AppState& state, const RunList& runs) {
  GridPanels grid;
  grid.key = grid_key(state, runs);
  std::vector<std::size_t> all(runs.size());
  for (std::size_t i = 0; i < runs.size(); ++i) all[i] = i;
  const auto groups = group_runs(runs, all, grid.key);
  if (groups.empty()) return grid;
  const DepthAxis axis = shown_depth_axis(state, runs);
  const std::vector<std::string> kinds = shown_kinds(state, runs);
  const std::vector<Tick> names = block_ticks(runs, axis);
  const Direction directions[GridPanels::rows] = {Direction::forward, Direction::backward};
  for (const Direction direction : directions)
    grid.row_titles.push_back(std::string(direction_name(direction)) + " var");
  for (const auto& group : groups) {
    grid.values.push_back(group.value);
    grid.column_titles.push_back(grid.key.empty() ? "all runs" : grid.key + " = " + group.value);
  }
  grid.plots.resize(GridPanels::rows * groups.size());
  for (int row = 0; row < GridPanels::rows; ++row) {
    for (std::size_t column = 0; column < groups.size(); ++column) {
      PlotSpec& spec = grid.plots[static_cast<std::size_t>(row) * groups.size() + column];
      RunList members;
      for (const auto index : groups[column].members) members.push_back(runs[index]);
      spec.title = row == 0 ? grid.column_titles[column] : "";
      spec.x_label = depth_axis_title(axis);
      spec.x_names = names;
      spec.y_label = grid.row_titles[row];
      spec.y_scale = state.depth_log_y ? AxisScale::log : AxisScale::linear;
      if (axis != DepthAxis::probe && by_block(members)) spec.x_markers = stage_markers(state, members, axis);
      for (const auto& run : members) {
        if (run->stat(directions[row], "var") == nullptr || run->records() == 0) continue;
        const auto probes = probes_of_kinds(run->probes, kinds);
        const std::vector<double> x_of = depth_axis_positions(run->probes, axis);
        spec.series.push_back(grid_profile(state, *run, directions[row], 0, probes, x_of));
        const auto last = static_cast<std::int64_t>(run->records()) - 1;
        if (last > 0) spec.series.push_back(grid_profile(state, *run, directions[row], last, probes, x_of));
      }
    }
  }
  // One x range for every panel, one y range per row.
  std::vector<ValueSpan> xs;
  for (const auto& spec : grid.plots) {
    for (const auto& series : spec.series) xs.push_back({series.x.data(), series.x.size()});
  }
  const AxisRange x_range = fit_range(xs, AxisScale::linear, 0.02);
  for (int row = 0; row < GridPanels::rows; ++row) {
    std::vector<ValueSpan> ys;
    for (std::size_t column = 0; column < groups.size(); ++column) {
      for (const auto& series : grid.plots[static_cast<std::size_t>(row) * groups.size() + column].series) {
        ys.push_back({series.y.data(), series.y.size()});
      }
    }
    const AxisRange y_range = fit_range(ys, state.depth_log_y ? AxisScale::log : AxisScale::linear, 0.05);
    for (std::size_t column = 0; column < groups.size(); ++column) {
      PlotSpec& spec = grid.plots[static_cast<std::size_t>(row) * groups.size() + column];
      spec.x_range = x_range;
      spec.y_range = y_range;
    }
  }
  // Every panel's legend as large as the largest, so that their data areas line up.
  std::vector<PlotSpec*> panels;
  for (auto& spec : grid.plots) panels.push_back(&spec);
  share_legend_size(panels);
  return grid;
}

HeatmapSpec heatmap_plot_spec(const AppState& state, const RunSnapshot& run) {
  HeatmapSpec spec;
  spec.title = run.name;
  spec.run = run.name;
  spec.x_label = "step";
  spec.y_label = "probe depth";
  spec.value_label = stat_title(state);
  spec.colour_scale = state.heatmap_log ? AxisScale::log : AxisScale::linear;
  const Dataset2D* matrix = run.stat(state.direction, state.stat);
  if (matrix == nullptr || run.records() == 0) return spec;
  // Every probe until kinds are chosen (the depth and compare views open on the residual stream instead).
  const auto probes = probes_of_kinds(run.probes, state.kind_filter.value_or(std::vector<std::string>{}));
  spec.rows = static_cast<std::int64_t>(probes.size());
  spec.columns = static_cast<std::int64_t>(run.records());
  spec.values.resize(static_cast<std::size_t>(spec.rows * spec.columns));
  for (std::size_t i = 0; i < probes.size(); ++i) {
    spec.row_labels.push_back(probe_description(run.probes[probes[i]]));
    spec.row_probes.push_back(run.probes[probes[i]].name);
    for (std::int64_t r = 0; r < spec.columns; ++r) {
      spec.values[i * static_cast<std::size_t>(spec.columns) + static_cast<std::size_t>(r)] =
          matrix->at(r, static_cast<std::int64_t>(probes[i]));
    }
  }
  for (const auto step : run.record_steps) spec.column_values.push_back(static_cast<double>(step));
  // By block, for every model with blocks: block numbers at the middle of their rows; a ResNet's stages' starts
  // dashed and labelled.
  const auto rows_of_blocks = block_rows(run.probes, probes);
  if (!rows_of_blocks.empty()) {
    spec.y_label = "block";
    for (const auto& rows : rows_of_blocks) {
      spec.row_ticks.push_back(
          Tick{0.5 * static_cast<double>(rows.first + rows.end), std::to_string(rows.block), true});
    }
  }
  if (has_block_axis(run)) {
    for (const auto& start : stage_starts_in_rows(run.probes, run.blocks, probes)) {
      AxisMarker marker;
      marker.value = start.position;
      marker.label = stage_label(start.stage);
      marker.line = start.transition;
      spec.row_markers.push_back(std::move(marker));
    }
  }
  return spec;
}

// Uploads the heatmap of `spec` into the panel's texture when what it shows changed; sets spec.texture.

}  // namespace proplab::gui
