// `proplab report`'s figures: each is one headless frame of the GUI's plot widgets, built from the same plot specs
// as the views (depth_plot_spec, train_plot_spec, heatmap_plot_spec), read back and written as a PNG.
#include <imgui.h>

#include <algorithm>

#include "core/error.h"
#include "gui/app/app_state.h"
#include "gui/app/headless.h"
#include "gui/app/plot_specs.h"
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

// Begins the one full-size window of a figure, with its heading.
void begin_figure(const std::string& heading, const std::string& note) {
  ImGui::SetNextWindowPos(ImVec2(0, 0), ImGuiCond_Always);
  ImGui::SetNextWindowSize(ImGui::GetIO().DisplaySize, ImGuiCond_Always);
  ImGui::Begin("report figure", nullptr, figure_window);
  ImGui::TextUnformatted(heading.c_str());
  if (!note.empty()) ImGui::TextDisabled("%s", note.c_str());
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
void draw_depth_figure(AppState& state, const RunList& runs, const std::string& label) {
  state.kind_filter = depth_probe_kinds(runs);
  const bool by_block = std::all_of(runs.begin(), runs.end(), [](const auto& run) { return has_block_axis(*run); });
  begin_figure("Depth profiles of var: " + label,
               (state.kind_filter->empty() ? std::string("every probe") : "residual-stream probes") +
                   "; one colour per run, dashed: theory at initialisation; x: " +
                   depth_axis_title(shown_depth_axis(state, runs)) +
                   (by_block ? ", vertical dashed lines: stage transitions" : ""));
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  const ImVec2 panel((avail.x - panel_gap) / 2, (avail.y - panel_gap) / 2);
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
    for (int column = 0; column < 2; ++column) {
      if (column == 1) ImGui::SameLine(0, panel_gap);
      specs[column].y_range = y_range;
      const std::string id = std::string("depth/") + direction_name(direction) + (column == 0 ? "/init" : "/end");
      draw_plot(id.c_str(), state.plots[id], specs[column], panel);
    }
  }
  ImGui::End();
}

void draw_loss_figure(AppState& state, const RunList& runs, const std::string& label) {
  begin_figure("Training loss: " + label, "one colour per run (as in the depth profiles), dashed: evaluation loss");
  PlotSpec spec = train_plot_spec(state, runs, "loss");
  spec.title = "loss";
  spec.y_label = "loss";
  spec.legend = true;
  draw_plot("loss", state.plots["loss"], spec, ImGui::GetContentRegionAvail());
  ImGui::End();
}

// Forward and backward var of one run side by side.
void draw_heatmap_figure(AppState& state, const RunSnapshot& run) {
  state.kind_filter = std::vector<std::string>{};
  begin_figure("Heatmaps of var: " + run.name,
               has_block_axis(run) ? "every probe (y, by block; dashed: stage transitions) x records (x, by step); log "
                                     "colour scale"
                                   : "every probe (y, by depth) x records (x, by step); log colour scale");
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  const ImVec2 panel((avail.x - panel_gap) / 2, avail.y);
  for (const Direction direction : {Direction::forward, Direction::backward}) {
    if (direction == Direction::backward) ImGui::SameLine(0, panel_gap);
    state.direction = direction;
    HeatmapSpec spec = heatmap_plot_spec(state, run);
    spec.title = std::string(direction_name(direction)) + " var";
    const std::string id = std::string("heatmap/") + direction_name(direction);
    attach_heatmap_texture(state, id, run, spec);
    draw_heatmap(id.c_str(), state.heatmaps[id], spec, panel);
  }
  ImGui::End();
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
    std::function<void(AppState&)> draw;
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
                    [runs, label](AppState& state) { draw_depth_figure(state, runs, label); }});
    work.push_back({figures.loss[g], "loss curves, " + label, runs,
                    [runs, label](AppState& state) { draw_loss_figure(state, runs, label); }});
  }
  for (std::size_t r = 0; r < plan.runs.size(); ++r) {
    if (figures.heatmap[r].empty()) continue;
    const auto run = plan.runs[r].snapshot;
    work.push_back({figures.heatmap[r], "heatmap, " + plan.runs[r].name, {run}, [run](AppState& state) {
                      draw_heatmap_figure(state, *run);
                    }});
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
      for (int frame = 0; frame < settle_frames; ++frame) renderer.render_frame([&] { work[i].draw(state); });
      const fs::path path = out / work[i].file;
      if (!write_png(path.string(), renderer.width(), renderer.height(), renderer.read_rgba())) {
        throw UserError(path.string() + ": could not write the PNG");
      }
    }
  } catch (...) {
    release_gpu_resources(state);
    throw;
  }
  release_gpu_resources(state);
}

}  // namespace proplab::gui
