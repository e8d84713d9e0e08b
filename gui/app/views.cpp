// The windows of proplab-gui: one draw_<name>_window(AppState&) per window, built from the library's snapshots.
#include <GL/gl.h>
#include <imgui.h>
#include <imgui_stdlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <iostream>
#include <iterator>
#include <unordered_map>

#include "core/error.h"

#include "gui/app/app_state.h"
#include "gui/app/plot_specs.h"
#include "gui/app/widgets.h"
#include "gui/data/block_axis.h"

namespace proplab::gui {

namespace {

namespace fs = std::filesystem;

constexpr std::size_t auto_select_limit = 8;  // runs selected automatically when nothing is chosen yet
// Above this many runs in one plot, lines are drawn 1 px wide, so that many overlaid profiles stay apart.
constexpr std::size_t thin_line_runs = 16;
// ImGui 1.86 indexes io.KeysDown by the backend's key codes: GLFW's (GLFW_KEY_O, GLFW_KEY_E, GLFW_KEY_F1).
constexpr int key_o = 79;
constexpr int key_e = 69;
constexpr int key_f1 = 290;
constexpr const char* view_names[] = {"depth", "dynamics", "heatmap", "compare", "grid"};
constexpr int view_count = static_cast<int>(std::size(view_names));

std::vector<std::string> stat_names(const RunList& runs, Direction direction) {
  std::set<std::string> names;
  for (const auto& run : runs) {
    for (const auto& [name, matrix] : run->stats(direction)) names.insert(name);
  }
  return {names.begin(), names.end()};
}

void direction_combo(Direction& direction) {
  int index = direction == Direction::forward ? 0 : 1;
  ImGui::SetNextItemWidth(110);
  if (ImGui::Combo("##direction", &index, "forward\0backward\0")) {
    direction = index == 0 ? Direction::forward : Direction::backward;
  }
}

// The statistic combo, falling back to a recorded statistic when the chosen one is not recorded by any run.
void stat_combo(AppState& state, const RunList& runs) {
  const auto names = stat_names(runs, state.direction);
  if (!names.empty() && std::find(names.begin(), names.end(), state.stat) == names.end()) {
    state.stat = std::find(names.begin(), names.end(), "var") != names.end() ? "var" : names.front();
  }
  ImGui::SetNextItemWidth(130);
  combo_strings("##stat", state.stat, names);
}

void record_controls(AppState& state, const RunList& runs) {
  const std::int64_t records = max_records(runs);
  if (records == 0) return;
  int record = static_cast<int>(state.record < 0 ? records - 1 : std::min(state.record, records - 1));
  ImGui::SameLine();
  if (ImGui::Button(state.playing ? "Pause" : "Play")) {
    state.playing = !state.playing;
    if (state.playing && record >= records - 1) state.record = 0;
  }
  ImGui::SameLine();
  ImGui::SetNextItemWidth(220);
  const std::int64_t step =
      runs.front()->records() > 0 ? runs.front()->record_steps[record_of(*runs.front(), record)] : 0;
  char format[64];
  std::snprintf(format, sizeof(format), "record %%d (step %lld)", static_cast<long long>(step));
  if (ImGui::SliderInt("##record", &record, 0, static_cast<int>(records - 1), format)) state.record = record;
}

void attach_texture(AppState& state, const std::string& panel, const RunSnapshot& run, HeatmapSpec& spec) {
  if (spec.rows <= 0 || spec.columns <= 0) return;
  const std::string key = detail::concat(
      run.path.string(), "|", run.modified.time_since_epoch().count(), "|", run.file_size, "|", run.records(), "|",
      direction_name(state.direction), "|", state.stat, "|",
      state.kind_filter ? kinds_summary(*state.kind_filter) : "default", "|", state.heatmap_log, "|",
      spec.value_range ? spec.value_range->min : 0.0, "|", spec.value_range ? spec.value_range->max : 0.0);
  AppState::HeatmapTexture& texture = state.heatmap_textures[panel];
  if (texture.key != key) {
    const std::vector<unsigned char> rgba = heatmap_rgba(spec);
    if (rgba.empty()) return;
    if (texture.texture == 0) glGenTextures(1, &texture.texture);
    glBindTexture(GL_TEXTURE_2D, texture.texture);
    glTexParameteri(GL_TEXTURE_2D, GL_TEXTURE_MIN_FILTER, GL_NEAREST);
    glTexParameteri(GL_TEXTURE_2D, GL_TEXTURE_MAG_FILTER, GL_NEAREST);
    glTexParameteri(GL_TEXTURE_2D, GL_TEXTURE_WRAP_S, GL_CLAMP_TO_EDGE);
    glTexParameteri(GL_TEXTURE_2D, GL_TEXTURE_WRAP_T, GL_CLAMP_TO_EDGE);
    glPixelStorei(GL_UNPACK_ALIGNMENT, 1);
    glTexImage2D(GL_TEXTURE_2D, 0, GL_RGBA8, static_cast<GLsizei>(spec.columns), static_cast<GLsizei>(spec.rows), 0,
                 GL_RGBA, GL_UNSIGNED_BYTE, rgba.data());
    texture.key = key;
  }
  spec.texture = reinterpret_cast<ImTextureID>(static_cast<std::uintptr_t>(texture.texture));
}

// The kind filter: a multi-select over the kinds the runs have, "all probes" clearing it.
void probe_kinds_combo(AppState& state, const RunList& runs, const std::vector<std::string>& shown) {
  std::vector<std::string> kinds;
  for (const auto& run : runs) {
    for (const auto& kind : probe_kinds(run->probes)) {
      if (std::find(kinds.begin(), kinds.end(), kind) == kinds.end()) kinds.push_back(kind);
    }
  }
  ImGui::SetNextItemWidth(150);
  if (!ImGui::BeginCombo("##kinds", kinds_summary(shown).c_str())) return;
  if (ImGui::Selectable("all probes", shown.empty(), ImGuiSelectableFlags_DontClosePopups))
    state.kind_filter = std::vector<std::string>{};
  for (const auto& kind : kinds) {
    bool chosen = std::find(shown.begin(), shown.end(), kind) != shown.end();
    if (ImGui::Checkbox(kind.c_str(), &chosen)) {
      std::vector<std::string> next;
      // In the runs' order of kinds, so that the summary reads the same whatever the clicks' order.
      for (const auto& other : kinds) {
        const bool keep = other == kind ? chosen : std::find(shown.begin(), shown.end(), other) != shown.end();
        if (keep) next.push_back(other);
      }
      state.kind_filter = next;
    }
  }
  ImGui::EndCombo();
}

// The depth profile's x axis: block, l/L or probe index ("auto" follows default_depth_axis).
void depth_axis_combo(AppState& state, const RunList& runs) {
  const DepthAxis shown = shown_depth_axis(state, runs);
  const std::string preview = std::string("x: ") + depth_axis_title(shown) + (state.depth_axis ? "" : " (auto)");
  ImGui::SetNextItemWidth(170);
  if (!ImGui::BeginCombo("##x_axis", preview.c_str())) return;
  if (ImGui::Selectable("auto: block, l/L when depths differ", !state.depth_axis)) state.depth_axis.reset();
  for (const DepthAxis axis : {DepthAxis::block, DepthAxis::depth, DepthAxis::probe}) {
    if (ImGui::Selectable(depth_axis_title(axis), state.depth_axis == axis)) state.depth_axis = axis;
  }
  ImGui::EndCombo();
}

// Begins a tiled window at a fixed place, or the only window, full size, for a headless frame.
// The focused view's window is the one an Export of the view reads back (PNG) or sizes its figure by (SVG, CSV).
bool begin_view_window(AppState& state, const char* title) {
  const ImGuiIO& io = ImGui::GetIO();
  ImVec2 position(0, 0), size = io.DisplaySize;
  if (!state.single_view) {
    const float top = ImGui::GetFrameHeight();
    const float left = std::max(380.0f, io.DisplaySize.x * 0.32f);
    position = ImVec2(left, top);
    size = ImVec2(io.DisplaySize.x - left, io.DisplaySize.y - top);
  }
  state.view_export.x0 = position.x;
  state.view_export.y0 = position.y;
  state.view_export.x1 = position.x + size.x;
  state.view_export.y1 = position.y + size.y;
  ImGui::SetNextWindowPos(position, ImGuiCond_Always);
  ImGui::SetNextWindowSize(size, ImGuiCond_Always);
  return ImGui::Begin(title, nullptr, state.single_view ? tiled_window | ImGuiWindowFlags_NoTitleBar : tiled_window);
}

void empty_hint(const RunList& runs) {
  if (runs.empty()) ImGui::TextDisabled("No run selected: pick runs in the Runs panel (or open a folder, Ctrl+O).");
}

// Small multiples over the groups of `runs` by the compare key, with shared axes (compare_panels).
void draw_compare_panels(AppState& state, const RunList& runs) {
  ComparePanels panels = compare_panels(state, runs);
  if (panels.values.empty()) return;
  const int columns = panels.columns;
  const int rows = static_cast<int>((panels.values.size() + columns - 1) / columns);
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  const ImVec2 panel((avail.x - (columns - 1) * 6.0f) / columns,
                     std::max(120.0f, (avail.y - (rows - 1) * 6.0f) / rows));
  for (std::size_t g = 0; g < panels.values.size(); ++g) {
    if (g % columns != 0) ImGui::SameLine(0, 6.0f);
    const std::string& value = panels.values[g];
    if (!panels.heatmaps.empty()) {
      attach_texture(state, "compare/" + value, *panels.heatmap_runs[g], panels.heatmaps[g]);
      draw_heatmap(("compare_heatmap_" + value).c_str(), state.heatmaps["compare/" + value], panels.heatmaps[g], panel);
    } else {
      draw_plot(("compare_" + value).c_str(), state.plots["compare/" + value], panels.plots[g], panel);
    }
  }
}

// The grid's panels: forward var above, backward var below, one column per group (grid_panels).
void draw_grid_panels(AppState& state, const RunList& runs) {
  GridPanels grid = grid_panels(state, runs);
  const int columns = grid.columns();
  if (columns == 0) return;
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  const ImVec2 panel((avail.x - (columns - 1) * 6.0f) / columns,
                     std::max(120.0f, (avail.y - (GridPanels::rows - 1) * 6.0f) / GridPanels::rows));
  for (int row = 0; row < GridPanels::rows; ++row) {
    for (int column = 0; column < columns; ++column) {
      if (column != 0) ImGui::SameLine(0, 6.0f);
      const std::string name = grid_panel_name(row, grid.values[static_cast<std::size_t>(column)]);
      draw_plot(name.c_str(), state.plots[name], grid.plots[static_cast<std::size_t>(row * columns + column)], panel);
    }
  }
}

}  // namespace

void attach_heatmap_texture(AppState& state, const std::string& panel, const RunSnapshot& run, HeatmapSpec& spec) {
  attach_texture(state, panel, run, spec);
}

ImVec4 background_colour() {
  ImVec4 colour = ImGui::GetStyle().Colors[ImGuiCol_WindowBg];
  colour.w = 1.0f;
  return colour;
}

const char* view_name(View view) { return view_names[static_cast<int>(view)]; }

std::optional<View> parse_view(const std::string& text) {
  for (int i = 0; i < view_count; ++i) {
    if (text == view_names[i]) return static_cast<View>(i);
  }
  return std::nullopt;
}

void refresh_from_library(AppState& state) {
  if (!state.library) return;
  if (state.library->generation() == state.seen_generation) return;
  state.library_state = state.library->snapshot();
  state.seen_generation = state.library_state.generation;
  const RunList& runs = state.library_state.runs;
  state.config_keys = config_keys(runs);
  state.differing_keys = differing_config_keys(runs);
  // The name is already the first column.
  std::erase(state.differing_keys, std::string("name"));
  // Selected runs that went away leave the selection.
  std::unordered_map<std::string, bool> present;
  for (const auto& run : runs) present.emplace(run->path.string(), run->ok());
  std::erase_if(state.selection, [&](const fs::path& path) { return present.count(path.string()) == 0; });
  if (!state.selection_touched) {
    sync_selection(state);
    for (const auto& run : runs) {
      if (state.selection.size() >= auto_select_limit) break;
      if (run->ok() && !is_selected(state, run->path)) state.selection.push_back(run->path);
    }
  }
  sync_selection(state);
  if (state.compare_key.empty() ||
      std::find(state.config_keys.begin(), state.config_keys.end(), state.compare_key) == state.config_keys.end()) {
    if (!state.differing_keys.empty()) state.compare_key = state.differing_keys.front();
  }
  // Bad input is said on stderr too, once per message.
  for (const auto& problem : state.library_state.problems) {
    if (state.reported.insert(problem).second) std::cerr << "proplab-gui: " << problem << "\n";
  }
  for (const auto& run : runs) {
    if (run->ok()) continue;
    const std::string message = run->path.string() + ": " + run->error;
    if (state.reported.insert(message).second) std::cerr << "proplab-gui: " << message << "\n";
  }
}

void release_gpu_resources(AppState& state) {
  for (auto& [panel, texture] : state.heatmap_textures) {
    if (texture.texture != 0) glDeleteTextures(1, &texture.texture);
  }
  state.heatmap_textures.clear();
}

void sync_selection(AppState& state) {
  state.selection_position.clear();
  for (std::size_t i = 0; i < state.selection.size(); ++i)
    state.selection_position.emplace(state.selection[i].string(), i);
  state.selected.assign(state.selection.size(), nullptr);
  for (const auto& run : state.library_state.runs) {
    const auto found = state.selection_position.find(run->path.string());
    if (found != state.selection_position.end() && run->ok()) state.selected[found->second] = run;
  }
  std::erase(state.selected, nullptr);
}

const RunList& selected_runs(const AppState& state) { return state.selected; }

void draw_depth_window(AppState& state) {
  if (!begin_view_window(state, "Depth profile")) {
    ImGui::End();
    return;
  }
  const RunList runs = selected_runs(state);  // a copy: a click may change the selection
  direction_combo(state.direction);
  ImGui::SameLine();
  stat_combo(state, runs);
  ImGui::SameLine();
  probe_kinds_combo(state, runs, shown_kinds(state, runs));
  ImGui::SameLine();
  depth_axis_combo(state, runs);
  record_controls(state, runs);
  ImGui::SameLine();
  ImGui::Checkbox("log y", &state.depth_log_y);
  ImGui::SameLine();
  ImGui::Checkbox("theory", &state.show_theory);
  empty_hint(runs);
  draw_plot("depth", state.plots["depth"], depth_plot_spec(state, runs), ImGui::GetContentRegionAvail());
  ImGui::End();
}

void draw_dynamics_window(AppState& state) {
  if (!begin_view_window(state, "Dynamics")) {
    ImGui::End();
    return;
  }
  const RunList runs = selected_runs(state);  // a copy: a click may change the selection
  direction_combo(state.direction);
  ImGui::SameLine();
  stat_combo(state, runs);
  ImGui::SameLine();
  const std::string probes_preview = state.dynamics_probes.empty()
                                         ? "first, middle, last block"
                                         : std::to_string(state.dynamics_probes.size()) + " probes";
  ImGui::SetNextItemWidth(200);
  if (ImGui::BeginCombo("##probes", probes_preview.c_str())) {
    if (ImGui::Selectable("first, middle, last block", state.dynamics_probes.empty())) state.dynamics_probes.clear();
    if (!runs.empty()) {
      for (const auto& probe : runs.front()->probes) {
        const auto found = std::find(state.dynamics_probes.begin(), state.dynamics_probes.end(), probe.name);
        bool chosen = found != state.dynamics_probes.end();
        if (ImGui::Checkbox(probe.name.c_str(), &chosen)) {
          if (chosen) {
            state.dynamics_probes.push_back(probe.name);
          } else {
            state.dynamics_probes.erase(found);
          }
        }
      }
    }
    ImGui::EndCombo();
  }
  ImGui::SameLine();
  ImGui::Checkbox("log x", &state.dynamics_log_x);
  ImGui::SameLine();
  ImGui::Checkbox("log y", &state.dynamics_log_y);
  empty_hint(runs);
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  const float lower = std::max(140.0f, avail.y * 0.34f);
  draw_plot("dynamics", state.plots["dynamics"], dynamics_plot_spec(state, runs),
            ImVec2(avail.x, avail.y - lower - 6.0f));
  // (a fourth panel when a run compressed its gradient exchange)
  const int panels = any_compression(runs) ? 4 : 3;
  const float panel = (avail.x - 6.0f * static_cast<float>(panels - 1)) / static_cast<float>(panels);
  const char* curves[] = {"loss", "lr", "grad_norm", "compression_error"};
  for (int i = 0; i < panels; ++i) {
    if (i > 0) ImGui::SameLine(0, 6.0f);
    draw_plot(curves[i], state.plots[std::string("train/") + curves[i]], train_plot_spec(state, runs, curves[i]),
              ImVec2(panel, lower));
  }
  ImGui::End();
}

void draw_heatmap_window(AppState& state) {
  if (!begin_view_window(state, "Heatmap")) {
    ImGui::End();
    return;
  }
  const RunList runs = selected_runs(state);  // a copy: a click may change the selection
  const RunSnapshot* run = heatmap_run_of(state, runs);
  ImGui::SetNextItemWidth(200);
  if (ImGui::BeginCombo("##run", run ? run->name.c_str() : "(no run)")) {
    for (const auto& candidate : runs) {
      if (ImGui::Selectable(candidate->name.c_str(), candidate.get() == run)) state.heatmap_run = candidate->path;
    }
    ImGui::EndCombo();
  }
  ImGui::SameLine();
  direction_combo(state.direction);
  ImGui::SameLine();
  stat_combo(state, runs);
  ImGui::SameLine();
  probe_kinds_combo(state, runs, state.kind_filter.value_or(std::vector<std::string>{}));
  ImGui::SameLine();
  ImGui::Checkbox("log colour", &state.heatmap_log);
  empty_hint(runs);
  if (run != nullptr) {
    HeatmapSpec spec = heatmap_plot_spec(state, *run);
    attach_texture(state, "heatmap", *run, spec);
    draw_heatmap("heatmap", state.heatmaps["heatmap"], spec, ImGui::GetContentRegionAvail());
  }
  ImGui::End();
}

void draw_compare_window(AppState& state) {
  if (!begin_view_window(state, "Compare")) {
    ImGui::End();
    return;
  }
  const RunList runs = selected_runs(state);  // a copy: a click may change the selection
  ImGui::SetNextItemWidth(180);
  if (combo_strings("##key", state.compare_key, state.config_keys)) state.compare_key_chosen = true;
  ImGui::SameLine();
  int plot = state.compare_plot == View::dynamics ? 1 : state.compare_plot == View::heatmap ? 2 : 0;
  ImGui::SetNextItemWidth(120);
  if (ImGui::Combo("##plot", &plot, "depth\0dynamics\0heatmap\0")) {
    state.compare_plot = plot == 1 ? View::dynamics : plot == 2 ? View::heatmap : View::depth;
  }
  ImGui::SameLine();
  direction_combo(state.direction);
  ImGui::SameLine();
  stat_combo(state, runs);
  ImGui::SameLine();
  probe_kinds_combo(state, runs,
                    state.compare_plot == View::heatmap ? state.kind_filter.value_or(std::vector<std::string>{})
                                                        : shown_kinds(state, runs));
  if (state.compare_plot == View::depth) {
    ImGui::SameLine();
    depth_axis_combo(state, runs);
  }
  record_controls(state, runs);
  empty_hint(runs);
  if (!runs.empty()) draw_compare_panels(state, runs);
  ImGui::End();
}

void draw_grid_window(AppState& state) {
  if (!begin_view_window(state, "Grid")) {
    ImGui::End();
    return;
  }
  const RunList runs = selected_runs(state);  // a copy: a click may change the selection
  // The key the columns group by: the compare key when chosen, else one whose value differs (grid_key).
  std::string key = grid_key(state, runs);
  ImGui::SetNextItemWidth(180);
  if (combo_strings("##key", key, state.config_keys)) {
    state.compare_key = key;
    state.compare_key_chosen = true;
  }
  ImGui::SameLine();
  probe_kinds_combo(state, runs, shown_kinds(state, runs));
  ImGui::SameLine();
  depth_axis_combo(state, runs);
  ImGui::SameLine();
  ImGui::Checkbox("log y", &state.depth_log_y);
  ImGui::SameLine();
  ImGui::TextDisabled("var: init dashed, last record solid");
  empty_hint(runs);
  if (!runs.empty()) draw_grid_panels(state, runs);
  ImGui::End();
}

void draw_help_window(AppState& state) {
  if (!state.show_help) return;
  const ImGuiIO& io = ImGui::GetIO();
  ImGui::SetNextWindowPos(ImVec2(io.DisplaySize.x / 2, io.DisplaySize.y / 2), ImGuiCond_Always, ImVec2(0.5f, 0.5f));
  ImGui::SetNextWindowBgAlpha(0.95f);
  if (ImGui::Begin("Help", &state.show_help, ImGuiWindowFlags_AlwaysAutoResize | ImGuiWindowFlags_NoSavedSettings)) {
    ImGui::TextUnformatted(
        "Left / Right     previous / next record\n"
        "Space            play / pause through the records\n"
        "Ctrl+O           open a run file or folder\n"
        "Ctrl+E           export the view as SVG (Export menu: PNG, CSV)\n"
        "F1 or ?          this help\n"
        "\n"
        "In a plot: wheel zooms (Shift: x only, Ctrl: y only), left drag pans,\n"
        "right drag zooms to a box, double-click fits, right click: menu (save PNG),\n"
        "click a legend entry to hide or show its series.\n"
        "Runs panel: click a run to select it; colours follow the selection order.");
  }
  ImGui::End();
}

void handle_keyboard(AppState& state) {
  const ImGuiIO& io = ImGui::GetIO();
  if (io.WantTextInput) return;
  const std::int64_t records = max_records(selected_runs(state));
  const std::int64_t current = state.record < 0 ? records - 1 : std::min(state.record, records - 1);
  if (records > 0 && ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_LeftArrow))) {
    state.record = std::max<std::int64_t>(0, current - 1);
    state.playing = false;
  }
  if (records > 0 && ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_RightArrow))) {
    state.record = std::min(records - 1, current + 1);
    state.playing = false;
  }
  if (ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_Space), false)) {
    state.playing = !state.playing;
    if (state.playing && current >= records - 1) state.record = 0;
  }
  if (io.KeyCtrl && ImGui::IsKeyPressed(key_o, false)) state.open_folder_requested = true;
  if (io.KeyCtrl && ImGui::IsKeyPressed(key_e, false)) request_view_export(state, "svg");
  if (ImGui::IsKeyPressed(key_f1, false)) state.show_help = !state.show_help;
  for (const ImWchar c : io.InputQueueCharacters) {
    if (c == '?') state.show_help = !state.show_help;
  }
}

void draw_frame(AppState& state) {
  refresh_from_library(state);
  sync_selection(state);
  handle_keyboard(state);
  const ImGuiIO& io = ImGui::GetIO();
  if (state.playing) {
    const std::int64_t records = max_records(selected_runs(state));
    state.play_clock_s += io.DeltaTime;
    const double period = 1.0 / std::max(0.1f, state.play_rate);
    while (state.play_clock_s >= period && records > 0) {
      state.play_clock_s -= period;
      const std::int64_t current = state.record < 0 ? records - 1 : state.record;
      state.record = current + 1 >= records ? 0 : current + 1;
    }
  }
  if (state.single_view) {
    switch (state.view) {
      case View::depth:
        draw_depth_window(state);
        break;
      case View::dynamics:
        draw_dynamics_window(state);
        break;
      case View::heatmap:
        draw_heatmap_window(state);
        break;
      case View::compare:
        draw_compare_window(state);
        break;
      case View::grid:
        draw_grid_window(state);
        break;
    }
    return;
  }
  if (ImGui::BeginMainMenuBar()) {
    if (ImGui::BeginMenu("File")) {
      if (ImGui::MenuItem("Open file or folder...", "Ctrl+O")) state.open_folder_requested = true;
      ImGui::EndMenu();
    }
    if (ImGui::BeginMenu("Export")) {
      if (ImGui::MenuItem("View as SVG", "Ctrl+E")) request_view_export(state, "svg");
      if (ImGui::MenuItem("View as PNG")) request_view_export(state, "png");
      if (ImGui::MenuItem("View's data as CSV")) request_view_export(state, "csv");
      ImGui::EndMenu();
    }
    for (int i = 0; i < view_count; ++i) {
      const View view = static_cast<View>(i);
      if (ImGui::MenuItem(view_names[i], nullptr, state.view == view)) state.view = view;
    }
    if (ImGui::MenuItem("help", "F1")) state.show_help = !state.show_help;
    if (!state.status_message.empty()) ImGui::TextDisabled("  %s", state.status_message.c_str());
    ImGui::EndMainMenuBar();
  }
  draw_runs_window(state);
  draw_details_window(state);
  switch (state.view) {
    case View::depth:
      draw_depth_window(state);
      break;
    case View::dynamics:
      draw_dynamics_window(state);
      break;
    case View::heatmap:
      draw_heatmap_window(state);
      break;
    case View::compare:
      draw_compare_window(state);
      break;
    case View::grid:
      draw_grid_window(state);
      break;
  }
  draw_help_window(state);
  draw_open_folder_window(state);
}

}  // namespace proplab::gui
