// The views as GL-free figures (plot_specs.h): the compare view's panels, shared with its window, and the focused
// view laid out for exports. Nothing here draws or touches OpenGL.
#include <algorithm>
#include <cmath>

#include "gui/app/plot_specs.h"

namespace proplab::gui {

namespace {

// The padding and gap between panels of the views' windows (ImGui's window padding; the views' SameLine gap).
constexpr double window_padding = 8.0;
constexpr double panel_gap = 6.0;

FigurePanel plot_panel(std::string name, PixelRect frame, PlotSpec spec) {
  FigurePanel panel;
  panel.name = std::move(name);
  panel.frame = frame;
  panel.plot = std::move(spec);
  return panel;
}

FigurePanel heatmap_panel(std::string name, PixelRect frame, HeatmapSpec spec) {
  FigurePanel panel;
  panel.name = std::move(name);
  panel.frame = frame;
  panel.heatmap = true;
  panel.cells = std::move(spec);
  return panel;
}

}  // namespace

const RunSnapshot* heatmap_run_of(const AppState& state, const RunList& runs) {
  for (const auto& candidate : runs) {
    if (candidate->path == state.heatmap_run) return candidate.get();
  }
  return runs.empty() ? nullptr : runs.front().get();
}

ComparePanels compare_panels(const AppState& state, const RunList& runs) {
  ComparePanels panels;
  std::vector<std::size_t> all(runs.size());
  for (std::size_t i = 0; i < runs.size(); ++i) all[i] = i;
  const auto groups = group_runs(runs, all, state.compare_key);
  if (groups.empty()) return panels;
  panels.columns = std::max(1, static_cast<int>(std::ceil(std::sqrt(static_cast<double>(groups.size())))));
  for (const auto& group : groups) panels.values.push_back(group.value);
  if (state.compare_plot == View::heatmap) {
    std::vector<ValueSpan> values;
    for (const auto& group : groups) {
      const RunSnapshot& run = *runs[group.members.front()];
      panels.heatmap_runs.push_back(&run);
      panels.heatmaps.push_back(heatmap_plot_spec(state, run));
    }
    for (const auto& spec : panels.heatmaps) values.push_back({spec.values.data(), spec.values.size()});
    const AxisRange shared = fit_range(values, state.heatmap_log ? AxisScale::log : AxisScale::linear, 0.0);
    for (std::size_t g = 0; g < groups.size(); ++g) {
      HeatmapSpec& spec = panels.heatmaps[g];
      spec.value_range = shared;
      spec.title = state.compare_key + " = " + groups[g].value + " (" + spec.title + ")";
    }
    return panels;
  }
  std::vector<ValueSpan> xs, ys;
  for (const auto& group : groups) {
    RunList members;
    for (const auto index : group.members) members.push_back(runs[index]);
    PlotSpec spec =
        state.compare_plot == View::dynamics ? dynamics_plot_spec(state, members) : depth_plot_spec(state, members);
    spec.title = state.compare_key + " = " + group.value + (spec.title.empty() ? "" : ", " + spec.title);
    panels.plots.push_back(std::move(spec));
  }
  for (const auto& spec : panels.plots) {
    for (const auto& series : spec.series) {
      xs.push_back({series.x.data(), series.x.size()});
      ys.push_back({series.y.data(), series.y.size()});
    }
  }
  const AxisRange x_range = fit_range(xs, panels.plots.front().x_scale, 0.02);
  const AxisRange y_range = fit_range(ys, panels.plots.front().y_scale, 0.05);
  std::vector<PlotSpec*> shared;
  for (auto& spec : panels.plots) {
    spec.x_range = x_range;
    spec.y_range = y_range;
    spec.legend = true;
    shared.push_back(&spec);
  }
  // Every panel's legend as large as the largest, so that their data areas line up.
  share_legend_size(shared);
  return panels;
}

Figure view_figure(const AppState& state, double width, double height) {
  Figure figure;
  figure.width = width;
  figure.height = height;
  const RunList& runs = selected_runs(state);
  const double x0 = window_padding, y0 = window_padding;
  const double w = std::max(1.0, width - 2.0 * window_padding), h = std::max(1.0, height - 2.0 * window_padding);
  switch (state.view) {
    case View::depth:
      figure.panels.push_back(plot_panel("depth", {x0, y0, x0 + w, y0 + h}, depth_plot_spec(state, runs)));
      break;
    case View::dynamics: {
      // As draw_dynamics_window: the probes' curves above, loss, lr and gradient norm below (and the compression
      // error when a run compressed).
      const double lower = std::max(140.0, h * 0.34);
      figure.panels.push_back(
          plot_panel("dynamics", {x0, y0, x0 + w, y0 + h - lower - panel_gap}, dynamics_plot_spec(state, runs)));
      const int panels = any_compression(runs) ? 4 : 3;
      const double panel = (w - (panels - 1) * panel_gap) / panels;
      const char* curves[] = {"loss", "lr", "grad_norm", "compression_error"};
      for (int i = 0; i < panels; ++i) {
        const double left = x0 + i * (panel + panel_gap);
        figure.panels.push_back(plot_panel(std::string("train/") + curves[i],
                                           {left, y0 + h - lower, left + panel, y0 + h},
                                           train_plot_spec(state, runs, curves[i])));
      }
      break;
    }
    case View::heatmap:
      if (const RunSnapshot* run = heatmap_run_of(state, runs)) {
        figure.panels.push_back(heatmap_panel("heatmap", {x0, y0, x0 + w, y0 + h}, heatmap_plot_spec(state, *run)));
      }
      break;
    case View::compare: {
      ComparePanels panels = compare_panels(state, runs);
      const std::size_t count = panels.values.size();
      if (count == 0) break;
      const int rows = static_cast<int>((count + panels.columns - 1) / panels.columns);
      const double panel_w = (w - (panels.columns - 1) * panel_gap) / panels.columns;
      const double panel_h = std::max(120.0, (h - (rows - 1) * panel_gap) / rows);
      for (std::size_t g = 0; g < count; ++g) {
        const double left = x0 + static_cast<double>(g % panels.columns) * (panel_w + panel_gap);
        const double top = y0 + static_cast<double>(g / panels.columns) * (panel_h + panel_gap);
        const PixelRect frame{left, top, left + panel_w, top + panel_h};
        const std::string name = "compare/" + panels.values[g];
        if (panels.heatmaps.empty()) {
          figure.panels.push_back(plot_panel(name, frame, std::move(panels.plots[g])));
        } else {
          figure.panels.push_back(heatmap_panel(name, frame, std::move(panels.heatmaps[g])));
        }
      }
      break;
    }
    case View::grid: {
      // As draw_grid_window: forward var above, backward var below, one column per group.
      GridPanels grid = grid_panels(state, runs);
      const int columns = grid.columns();
      if (columns == 0) break;
      const double panel_w = (w - (columns - 1) * panel_gap) / columns;
      const double panel_h = std::max(120.0, (h - (GridPanels::rows - 1) * panel_gap) / GridPanels::rows);
      for (int row = 0; row < GridPanels::rows; ++row) {
        for (int column = 0; column < columns; ++column) {
          const double left = x0 + column * (panel_w + panel_gap);
          const double top = y0 + row * (panel_h + panel_gap);
          figure.panels.push_back(plot_panel(grid_panel_name(row, grid.values[column]),
                                             {left, top, left + panel_w, top + panel_h},
                                             std::move(grid.plots[static_cast<std::size_t>(row * columns + column)])));
        }
      }
      break;
    }
  }
  return figure;
}

}  // namespace proplab::gui
