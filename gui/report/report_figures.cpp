// `proplab report`'s figures: each is one headless frame of the GUI's plot widgets, built from the same plot specs
// as the views (depth_plot_spec, train_plot_spec, heatmap_plot_spec), read back and written as a PNG, and the same
// layout written as an SVG beside it (figure_export.h).
#include <imgui.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "gui/app/app_state.h"
#include "gui/app/headless.h"
#include "gui/app/plot_specs.h"
#include "gui/plot/figure_export.h"
#include "gui/data/block_axis.h"
#include "gui/report/report.h"

namespace proplab::gui {

namespace {

namespace fs = std::filesystem;

// ImGui settles window and table sizes over the first frames (as `proplab-gui --screenshot` does).
constexpr int settle_frames = 3;
constexpr float panel_gap = 8.0f;
constexpr ImGuiWindowFlags figure_window = ImGuiWindowFlags_NoDecoration | ImGuiWindowFlags_NoMove |
                                           ImGuiWindowFlags_NoSavedSettings | ImGuiWindowFlags_NoBackground;

// A figure's heading and note, and its panels laid out in the area below them (frames relative to that area's
// top-left). One layout is drawn twice: by the plot widgets into the PNG, and by figure_svg into the SVG beside it.
struct FigureLayout {
  std::string heading, note;
  std::vector<FigurePanel> panels;
  std::vector<const RunSnapshot*> heatmap_runs;  // per panel: the run of a heatmap (its texture), else null
};

// The room below the heading of a figure of `width` × `height` pixels, and where it starts: ImGui's window padding
// (8 pixels) around it and one text line plus item spacing (13 + 4 pixels) per line of text above it.
constexpr double window_padding = 8.0;
constexpr double text_line_step = 17.0;
double content_top(const FigureLayout& layout) {
  return window_padding + text_line_step * (layout.note.empty() ? 1.0 : 2.0);
}
PixelRect content_area(const FigureLayout& layout, double width, double height) {
  return PixelRect{0.0, 0.0, width - 2.0 * window_padding, height - content_top(layout) - window_padding};
}

FigurePanel plot_panel(const std::string& name, PixelRect frame, PlotSpec spec) {
  FigurePanel panel;
  panel.name = name;
  panel.frame = frame;
  panel.plot = std::move(spec);
  return panel;
}

// Only the residual stream when every run has one (the curves the theory describes), else every probe.
std::vector<std::string> depth_probe_kinds(const RunList& runs) {
  for (const auto& run : runs) {
    if (probes_of_kind(run->probes, "residual").size() < 2) return {};
  }
  return {"residual"};
}

std::string step_text(const RunList& runs, bool last) {
  const RunSnapshot& run = *runs.front();
  if (run.records() == 0) return "no records";
  return "step " + std::to_string(last ? run.record_steps.back() : run.record_steps.front());
}

// 2 × 2 depth profiles: forward (top) and backward (bottom), record 0 (left) and last (right), each row on one
// y range so that the change during training shows.
FigureLayout depth_figure(AppState& state, const RunList& runs, const std::string& label, PixelRect area) {
  state.kind_filter = depth_probe_kinds(runs);
  const bool by_block = std::all_of(runs.begin(), runs.end(), [](const auto& run) { return has_block_axis(*run); });
  FigureLayout layout;
  layout.heading = "Depth profiles of var: " + label;
  layout.note =
      (state.kind_filter->empty() ? std::string("every probe") : "residual-stream probes") +
      "; one colour per run, dashed: theory at initialisation" +
      (std::any_of(runs.begin(), runs.end(), [](const auto& run) { return var_band(*run) != nullptr; })
           ? " (thin, faded: where one network's var falls 95% of the time at its width)"
           : "") +
      "; x: " + depth_axis_title(shown_depth_axis(state, runs)) +
      (by_block ? ", vertical dashed lines: stage transitions" : "");
  const double panel_w = (area.width() - panel_gap) / 2, panel_h = (area.height() - panel_gap) / 2;
  for (const Direction direction : {Direction::forward, Direction::backward}) {
    state.direction = direction;
    PlotSpec specs[2];
    std::vector<ValueSpan> ys;
    for (int column = 0; column < 2; ++column) {
      state.record = column == 0 ? 0 : -1;
      specs[column] = depth_plot_spec(state, runs);
      specs[column].title =
          std::string(direction_name(direction)) + " var, " +
          (column == 0 ? "initialisation (" + step_text(runs, false) + ")" : "end (" + step_text(runs, true) + ")");
      for (const auto& series : specs[column].series) ys.push_back({series.y.data(), series.y.size()});
    }
    const AxisRange y_range = fit_range(ys, specs[0].y_scale, 0.05);
    const double top = direction == Direction::forward ? 0.0 : panel_h + panel_gap;
    for (int column = 0; column < 2; ++column) {
      specs[column].y_range = y_range;
      const double left = column == 0 ? 0.0 : panel_w + panel_gap;
      layout.panels.push_back(
          plot_panel(std::string("depth/") + direction_name(direction) + (column == 0 ? "/init" : "/end"),
                     PixelRect{left, top, left + panel_w, top + panel_h}, std::move(specs[column])));
      layout.heatmap_runs.push_back(nullptr);
    }
  }
  return layout;
}

FigureLayout loss_figure(AppState& state, const RunList& runs, const std::string& label, PixelRect area) {
  FigureLayout layout;
  layout.heading = "Training loss: " + label;
  layout.note = "one colour per run (as in the depth profiles), dashed: evaluation loss";
  PlotSpec spec = train_plot_spec(state, runs, "loss");
  spec.title = "loss";
  spec.y_label = "loss";
  spec.legend = true;
  layout.panels.push_back(plot_panel("loss", area, std::move(spec)));
  layout.heatmap_runs.push_back(nullptr);
  return layout;
}

// Forward and backward var of one run side by side.
FigureLayout heatmap_figure(AppState& state, const RunSnapshot& run, PixelRect area) {
  state.kind_filter = std::vector<std::string>{};
  FigureLayout layout;
  layout.heading = "Heatmaps of var: " + run.name;
  layout.note = has_block_axis(run) ? "every probe (y, by block; dashed: stage transitions) x records (x, by step); "
                                      "log colour scale"
                                    : "every probe (y, by depth) x records (x, by step); log colour scale";
  const double panel_w = (area.width() - panel_gap) / 2;
  for (const Direction direction : {Direction::forward, Direction::backward}) {
    state.direction = direction;
    FigurePanel panel;
    panel.name = std::string("heatmap/") + direction_name(direction);
    const double left = direction == Direction::forward ? 0.0 : panel_w + panel_gap;
    panel.frame = PixelRect{left, 0.0, left + panel_w, area.height()};
    panel.heatmap = true;
    panel.cells = heatmap_plot_spec(state, run);
    panel.cells.title = std::string(direction_name(direction)) + " var";
    layout.panels.push_back(std::move(panel));
    layout.heatmap_runs.push_back(&run);
  }
  return layout;
}

// Final loss against lr, one line per series value: small dots at the points (the line broken at diverged and n/a
// points), a large dot at the best lr, and an × for each diverged point in a band at the top of the plot whatever
// its loss (the y range is fitted to the points that did not diverge), one row of the band per line so that the
// lines' × at one lr do not hide each other.
FigureLayout lr_figure(const LrSweeps& sweeps, const LrFamily& family, PixelRect area) {
  FigureLayout layout;
  layout.heading = "Learning-rate sweep: " + family.label;
  layout.note = "final loss: the last evaluation loss, else the mean training loss of the last " +
                std::to_string(lr_final_steps) +
                " steps, mean over seeds; large dot: the best lr; x at the top: diverged";
  std::vector<double> lrs, losses;
  for (const auto& series : family.series) {
    for (const auto& point : series.points) {
      lrs.push_back(point.lr);
      if (point.has_loss && !point.diverged && std::isfinite(point.final_loss)) losses.push_back(point.final_loss);
    }
  }
  // The band of diverged points takes the top band_share of the plot, one row per line.
  const double rows = static_cast<double>(std::max<std::size_t>(family.series.size(), 1));
  const double band_share = std::min(0.3, 0.04 * (rows + 1.0));
  AxisRange y_range{0.0, 1.0};
  if (!losses.empty()) {
    const auto [low, high] = std::minmax_element(losses.begin(), losses.end());
    const double span = *high > *low ? *high - *low : std::max(std::abs(*high) * 0.1, 1e-3);
    const double data_max = *high + 0.05 * span;
    y_range = AxisRange{*low - 0.05 * span, *low - 0.05 * span + (data_max - *low + 0.05 * span) / (1.0 - band_share)};
  }
  auto diverged_y = [&](std::size_t line) {
    return y_range.max - (y_range.max - y_range.min) * band_share * (static_cast<double>(line) + 1.0) / (rows + 1.0);
  };

  PlotSpec spec;
  spec.title = "final loss against " + std::string(lr_key) + ", " + family.label;
  spec.x_label = std::string(lr_key) + " (log scale)";
  spec.y_label = "final loss";
  spec.x_scale = AxisScale::log;
  spec.x_range = fit_range({{lrs.data(), lrs.size()}}, AxisScale::log, 0.06);
  spec.y_range = y_range;
  spec.legend = true;
  for (std::size_t i = 0; i < family.series.size(); ++i) {
    const LrSeries& series = family.series[i];
    const std::string name = sweeps.series_key.empty() ? "final loss" : sweeps.series_key + " = " + series.value;
    PlotSeries line;
    line.label = name;
    line.colour = series_colour(i);
    line.marker = PointMarker::circle;
    line.marker_size = 3.5f;
    PlotSeries diverged = line;
    diverged.label = name + ": diverged";
    diverged.legend_name = name;
    diverged.in_legend = false;
    diverged.line = false;
    diverged.marker = PointMarker::cross;
    diverged.marker_size = 7.0f;
    for (const auto& point : series.points) {
      const bool shown = point.has_loss && !point.diverged;
      line.x.push_back(point.lr);
      line.y.push_back(shown ? point.final_loss : std::nan(""));
      if (point.diverged) {
        diverged.x.push_back(point.lr);
        diverged.y.push_back(diverged_y(i));
      }
    }
    spec.series.push_back(std::move(line));
    if (!diverged.x.empty()) spec.series.push_back(std::move(diverged));
    if (series.best) {
      PlotSeries best;
      best.label = name + ": best lr";
      best.legend_name = name;
      best.in_legend = false;
      best.line = false;
      best.colour = series_colour(i);
      best.marker = PointMarker::circle;
      best.marker_size = 8.0f;
      best.x = {series.points[*series.best].lr};
      best.y = {series.points[*series.best].final_loss};
      spec.series.push_back(std::move(best));
    }
  }
  layout.panels.push_back(plot_panel("lr", area, std::move(spec)));
  layout.heatmap_runs.push_back(nullptr);
  return layout;
}

// Draws `layout` as one full-size window: the heading, the note, then each panel at its place.
void draw_layout(AppState& state, FigureLayout& layout) {
  ImGui::SetNextWindowPos(ImVec2(0, 0), ImGuiCond_Always);
  ImGui::SetNextWindowSize(ImGui::GetIO().DisplaySize, ImGuiCond_Always);
  ImGui::Begin("report figure", nullptr, figure_window);
  ImGui::TextUnformatted(layout.heading.c_str());
  if (!layout.note.empty()) ImGui::TextDisabled("%s", layout.note.c_str());
  const ImVec2 origin = ImGui::GetCursorScreenPos();
  for (std::size_t i = 0; i < layout.panels.size(); ++i) {
    FigurePanel& panel = layout.panels[i];
    ImGui::SetCursorScreenPos(
        ImVec2(origin.x + static_cast<float>(panel.frame.x0), origin.y + static_cast<float>(panel.frame.y0)));
    const ImVec2 size(static_cast<float>(panel.frame.width()), static_cast<float>(panel.frame.height()));
    if (panel.heatmap) {
      attach_heatmap_texture(state, panel.name, *layout.heatmap_runs[i], panel.cells);
      draw_heatmap(panel.name.c_str(), state.heatmaps[panel.name], panel.cells, size);
    } else {
      draw_plot(panel.name.c_str(), state.plots[panel.name], panel.plot, size);
    }
  }
  ImGui::End();
}

// `layout` as a figure of `width` × `height` pixels, for the SVG.
Figure layout_figure(const FigureLayout& layout, double width, double height) {
  Figure figure;
  figure.width = width;
  figure.height = height;
  figure.texts.push_back({window_padding, window_padding, layout.heading, false});
  if (!layout.note.empty())
    figure.texts.push_back({window_padding, window_padding + text_line_step, layout.note, true});
  const double top = content_top(layout);
  for (FigurePanel panel : layout.panels) {
    panel.frame = PixelRect{panel.frame.x0 + window_padding, panel.frame.y0 + top, panel.frame.x1 + window_padding,
                            panel.frame.y1 + top};
    figure.panels.push_back(std::move(panel));
  }
  return figure;
}

// Selects `runs` (their colours follow this order) and forgets what earlier figures' plots remembered.
void select(AppState& state, const RunList& runs) {
  state.selection.clear();
  for (const auto& run : runs) state.selection.push_back(run->path);
  state.selection_touched = true;
  sync_selection(state);
  state.plots.clear();
  state.heatmaps.clear();
}

}  // namespace

void render_report_figures(const ReportPlan& plan, const ReportFigures& figures, const fs::path& out,
                           const std::function<void(std::size_t, std::size_t, const std::string&)>& progress) {
  struct Figure {
    std::string file, what;
    RunList runs;
    std::function<FigureLayout(AppState&, PixelRect)> layout;
  };
  std::vector<Figure> work;
  for (std::size_t g = 0; g < plan.groups.size(); ++g) {
    if (figures.depth[g].empty()) continue;
    RunList runs;
    for (const auto r : plan.groups[g].members) {
      if (plan.runs[r].snapshot) runs.push_back(plan.runs[r].snapshot);
    }
    const std::string label = plan.groups[g].label;
    work.push_back({figures.depth[g], "depth profiles, " + label, runs,
                    [runs, label](AppState& state, PixelRect area) { return depth_figure(state, runs, label, area); }});
    work.push_back({figures.loss[g], "loss curves, " + label, runs,
                    [runs, label](AppState& state, PixelRect area) { return loss_figure(state, runs, label, area); }});
  }
  if (!figures.depth_all.empty()) {
    RunList runs;
    for (const auto& run : plan.runs) {
      if (run.snapshot) runs.push_back(run.snapshot);
    }
    const std::string label = "all runs";
    work.push_back({figures.depth_all, "depth profiles, " + label, runs,
                    [runs, label](AppState& state, PixelRect area) { return depth_figure(state, runs, label, area); }});
    work.push_back({figures.loss_all, "loss curves, " + label, runs,
                    [runs, label](AppState& state, PixelRect area) { return loss_figure(state, runs, label, area); }});
  }
  for (std::size_t r = 0; r < plan.runs.size(); ++r) {
    if (figures.heatmap[r].empty()) continue;
    const auto run = plan.runs[r].snapshot;
    work.push_back({figures.heatmap[r], "heatmap, " + plan.runs[r].name, {run}, [run](AppState& state, PixelRect area) {
                      return heatmap_figure(state, *run, area);
                    }});
  }
  for (std::size_t f = 0; f < plan.lr.families.size(); ++f) {
    const LrSweeps* sweeps = &plan.lr;
    work.push_back({figures.lr[f],
                    "learning-rate sweep, " + plan.lr.families[f].label,
                    {},
                    [sweeps, f](AppState&, PixelRect area) { return lr_figure(*sweeps, sweeps->families[f], area); }});
  }
  if (work.empty()) return;

  AppState state;
  for (const auto& run : plan.runs) {
    if (run.snapshot) state.library_state.runs.push_back(run.snapshot);
  }
  state.library_state.initial_scan_done = true;
  HeadlessRenderer renderer(report_figure_width, report_figure_height);
  try {
    for (std::size_t i = 0; i < work.size(); ++i) {
      progress(i, work.size(), work[i].what);
      select(state, work[i].runs);
      // The heading's text decides the room below it: lay out once for the text, then for the room.
      FigureLayout layout = work[i].layout(state, PixelRect{});
      layout = work[i].layout(state, content_area(layout, renderer.width(), renderer.height()));
      for (int frame = 0; frame < settle_frames; ++frame) renderer.render_frame([&] { draw_layout(state, layout); });
      const fs::path path = out / work[i].file;
      std::string error =
          write_file_atomically(path.string(), encode_png(renderer.width(), renderer.height(), renderer.read_rgba()));
      if (!error.empty()) throw UserError(path.string() + ": could not write the PNG: " + error);
      // The same figure as vector graphics beside it.
      const fs::path svg = fs::path(path).replace_extension(".svg");
      error =
          write_file_atomically(svg.string(), figure_svg(layout_figure(layout, renderer.width(), renderer.height())));
      if (!error.empty()) throw UserError(svg.string() + ": could not write the SVG: " + error);
    }
  } catch (...) {
    release_gpu_resources(state);
    throw;
  }
  release_gpu_resources(state);
}

}  // namespace proplab::gui
