// The run-side windows of proplab-gui: the runs table (selection, grouping, config differences), a run's details,
// and the open-folder dialog. The plot windows are in gui/app/views.cpp.
#include <imgui.h>
#include <imgui_stdlib.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "gui/app/app_state.h"
#include "gui/app/plot_specs.h"
#include "gui/app/widgets.h"

namespace proplab::gui {

namespace {

namespace fs = std::filesystem;

constexpr std::size_t table_config_columns = 6;  // differing config keys shown as columns
constexpr std::size_t problem_lines = 4;         // bad-input messages shown under the runs table

}  // namespace

void draw_runs_window(AppState& state) {
  const ImGuiIO& io = ImGui::GetIO();
  const float top = ImGui::GetFrameHeight();
  const float left = std::max(380.0f, io.DisplaySize.x * 0.32f);
  ImGui::SetNextWindowPos(ImVec2(0, top), ImGuiCond_Always);
  ImGui::SetNextWindowSize(ImVec2(left, (io.DisplaySize.y - top) * 0.6f), ImGuiCond_Always);
  if (!ImGui::Begin("Runs", nullptr, tiled_window)) {
    ImGui::End();
    return;
  }
  const RunList& runs = state.library_state.runs;
  ImGui::SetNextItemWidth(-200);
  ImGui::InputTextWithHint("##filter", "filter (name, status, key=value)", &state.filter);
  ImGui::SameLine();
  ImGui::SetNextItemWidth(-1);
  combo_strings("##group", state.group_key, state.config_keys, "no grouping");

  std::vector<std::size_t> visible;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    if (run_matches_filter(*runs[i], state.filter)) visible.push_back(i);
  }
  if (ImGui::SmallButton("select shown")) {
    state.selection_touched = true;
    for (const auto i : visible) {
      if (runs[i]->ok() && !is_selected(state, runs[i]->path)) {
        state.selection.push_back(runs[i]->path);
        state.selection_position.emplace(runs[i]->path.string(), state.selection.size() - 1);
      }
    }
    sync_selection(state);
  }
  ImGui::SameLine();
  if (ImGui::SmallButton("clear selection")) {
    state.selection_touched = true;
    state.selection.clear();
    sync_selection(state);
  }
  ImGui::SameLine();
  ImGui::TextDisabled("%zu runs, %zu shown, %zu selected%s", runs.size(), visible.size(), state.selection.size(),
                      state.library_state.initial_scan_done ? "" : " (loading...)");

  // Bad input under the table: paths that hold no runs, then files that could not be read.
  std::vector<std::string> messages = state.library_state.problems;
  for (const auto& run : runs) {
    if (!run->ok()) messages.push_back(run->path.filename().string() + ": " + run->error);
  }
  const std::size_t shown_messages = std::min(messages.size(), problem_lines);
  const std::size_t extra = std::min(state.differing_keys.size(), table_config_columns);
  const int columns = 4 + static_cast<int>(extra);
  const float table_height = ImGui::GetContentRegionAvail().y -
                             ImGui::GetTextLineHeightWithSpacing() * (1.0f + static_cast<float>(shown_messages));
  if (ImGui::BeginTable("runs", columns,
                        ImGuiTableFlags_ScrollY | ImGuiTableFlags_ScrollX | ImGuiTableFlags_RowBg |
                            ImGuiTableFlags_BordersInnerV | ImGuiTableFlags_Resizable,
                        ImVec2(0, std::max(80.0f, table_height)))) {
    ImGui::TableSetupScrollFreeze(1, 1);
    ImGui::TableSetupColumn("run", ImGuiTableColumnFlags_WidthFixed, 170.0f);
    ImGui::TableSetupColumn("status");
    ImGui::TableSetupColumn("steps");
    ImGui::TableSetupColumn("loss");
    for (std::size_t k = 0; k < extra; ++k) ImGui::TableSetupColumn(state.differing_keys[k].c_str());
    ImGui::TableHeadersRow();
    auto row = [&](const RunSnapshot& run) {
      ImGui::TableNextRow();
      ImGui::TableSetColumnIndex(0);
      const bool selected = is_selected(state, run.path);
      ImGui::PushID(run.path.c_str());
      if (selected) {
        const auto rgb = series_rgb(colour_index(state, run));
        ImGui::PushStyleColor(ImGuiCol_Text, IM_COL32(rgb[0], rgb[1], rgb[2], 255));
      }
      if (ImGui::Selectable(run.name.c_str(), selected, ImGuiSelectableFlags_SpanAllColumns) && run.ok()) {
        toggle_selection(state, run.path);
      }
      if (selected) ImGui::PopStyleColor();
      if (ImGui::IsItemHovered()) {
        ImGui::SetTooltip("%s%s%s", run.path.c_str(), run.ok() ? "" : "\n", run.error.c_str());
      }
      ImGui::PopID();
      ImGui::TableSetColumnIndex(1);
      ImGui::TextColored(status_colour(run), "%s", run.status_text().c_str());
      ImGui::TableSetColumnIndex(2);
      if (run.ok()) ImGui::Text("%zu", run.train.size());
      ImGui::TableSetColumnIndex(3);
      if (run.ok() && run.train.size() > 0) ImGui::TextUnformatted(format_value(run.final_loss()).c_str());
      for (std::size_t k = 0; k < extra; ++k) {
        ImGui::TableSetColumnIndex(4 + static_cast<int>(k));
        ImGui::TextUnformatted(run.config_value(state.differing_keys[k]).c_str());
      }
    };
    if (state.group_key.empty()) {
      ImGuiListClipper clipper;
      clipper.Begin(static_cast<int>(visible.size()));
      while (clipper.Step()) {
        for (int i = clipper.DisplayStart; i < clipper.DisplayEnd; ++i) row(*runs[visible[i]]);
      }
    } else {
      for (const auto& group : group_runs(runs, visible, state.group_key)) {
        ImGui::TableNextRow();
        ImGui::TableSetColumnIndex(0);
        ImGui::TextDisabled("%s = %s (%zu)", state.group_key.c_str(), group.value.c_str(), group.members.size());
        for (const auto index : group.members) row(*runs[index]);
      }
    }
    ImGui::EndTable();
  }
  for (std::size_t i = 0; i < shown_messages; ++i) {
    const bool last = i + 1 == shown_messages && messages.size() > shown_messages;
    if (last) {
      ImGui::TextColored(ImVec4(1.0f, 0.5f, 0.4f, 1.0f), "... and %zu more problems (stderr lists them all)",
                         messages.size() - shown_messages + 1);
    } else {
      ImGui::TextColored(ImVec4(1.0f, 0.5f, 0.4f, 1.0f), "%s", messages[i].c_str());
    }
    if (ImGui::IsItemHovered()) ImGui::SetTooltip("%s", messages[i].c_str());
  }
  ImGui::End();
}

void draw_details_window(AppState& state) {
  const ImGuiIO& io = ImGui::GetIO();
  const float top = ImGui::GetFrameHeight();
  const float left = std::max(380.0f, io.DisplaySize.x * 0.32f);
  const float runs_height = (io.DisplaySize.y - top) * 0.6f;
  ImGui::SetNextWindowPos(ImVec2(0, top + runs_height), ImGuiCond_Always);
  ImGui::SetNextWindowSize(ImVec2(left, io.DisplaySize.y - top - runs_height), ImGuiCond_Always);
  if (!ImGui::Begin("Run details", nullptr, tiled_window)) {
    ImGui::End();
    return;
  }
  const RunList runs = selected_runs(state);  // a copy: a click may change the selection
  if (runs.empty()) {
    ImGui::TextDisabled("Select a run to see its details.");
    ImGui::End();
    return;
  }
  if (ImGui::BeginTabBar("details")) {
    if (ImGui::BeginTabItem("run")) {
      const RunSnapshot& run = *runs.front();
      ImGui::Text("%s", run.path.c_str());
      ImGui::TextColored(status_colour(run), "%s", run.status_text().c_str());
      if (!run.status_detail.empty()) {
        ImGui::SameLine();
        ImGui::TextWrapped("%s", run.status_detail.c_str());
      }
      ImGui::Text("started %s   ended %s", run.start_time.c_str(), run.end_time.empty() ? "-" : run.end_time.c_str());
      if (!run.train.wall_time.empty()) {
        ImGui::Text("wall time %.1f s, %s tokens/s at the end", run.train.wall_time.back(),
                    format_value(run.train.tokens_per_s.back()).c_str());
      }
      ImGui::Text("%s, %s, %lld threads, %s", run.host.c_str(), run.device.c_str(), static_cast<long long>(run.threads),
                  run.layout.c_str());
      ImGui::Text("%zu steps, %zu records, %zu probes%s", run.train.size(), run.records(), run.probes.size(),
                  run.swmr ? " (read live, SWMR)" : "");
      ImGui::Separator();
      ImGui::BeginChild("config", ImVec2(0, 0), false, ImGuiWindowFlags_HorizontalScrollbar);
      ImGui::TextUnformatted(run.config_text.c_str());
      ImGui::EndChild();
      ImGui::EndTabItem();
    }
    if (ImGui::BeginTabItem("config diff")) {
      auto pick = [&](const char* label, fs::path& path, std::size_t fallback) {
        const RunSnapshot* chosen = nullptr;
        for (const auto& run : runs) {
          if (run->path == path) chosen = run.get();
        }
        if (chosen == nullptr) chosen = runs[std::min(fallback, runs.size() - 1)].get();
        ImGui::SetNextItemWidth(160);
        if (ImGui::BeginCombo(label, chosen->name.c_str())) {
          for (const auto& run : runs) {
            if (ImGui::Selectable(run->name.c_str(), run.get() == chosen)) path = run->path;
          }
          ImGui::EndCombo();
        }
        return chosen;
      };
      const RunSnapshot* a = pick("##left", state.diff_left, 0);
      ImGui::SameLine();
      ImGui::TextUnformatted("vs");
      ImGui::SameLine();
      const RunSnapshot* b = pick("##right", state.diff_right, 1);
      const auto diff = config_diff(a->config, b->config);
      if (diff.empty()) ImGui::TextDisabled("identical configs");
      if (!diff.empty() && ImGui::BeginTable("diff", 3, ImGuiTableFlags_RowBg | ImGuiTableFlags_ScrollY)) {
        ImGui::TableSetupColumn("key");
        ImGui::TableSetupColumn(a->name.c_str());
        ImGui::TableSetupColumn(b->name.c_str());
        ImGui::TableHeadersRow();
        for (const auto& difference : diff) {
          ImGui::TableNextRow();
          ImGui::TableSetColumnIndex(0);
          ImGui::TextUnformatted(difference.key.c_str());
          ImGui::TableSetColumnIndex(1);
          ImGui::TextUnformatted(difference.left ? difference.left->c_str() : "(missing)");
          ImGui::TableSetColumnIndex(2);
          ImGui::TextUnformatted(difference.right ? difference.right->c_str() : "(missing)");
        }
        ImGui::EndTable();
      }
      ImGui::EndTabItem();
    }
    ImGui::EndTabBar();
  }
  ImGui::End();
}

void draw_open_folder_window(AppState& state) {
  if (state.open_folder_requested) {
    ImGui::OpenPopup("Open run file or folder");
    state.open_folder_requested = false;
  }
  if (ImGui::BeginPopupModal("Open run file or folder", nullptr, ImGuiWindowFlags_AlwaysAutoResize)) {
    ImGui::SetNextItemWidth(420);
    if (ImGui::IsWindowAppearing()) ImGui::SetKeyboardFocusHere();
    const bool entered = ImGui::InputText("##path", &state.open_folder_path, ImGuiInputTextFlags_EnterReturnsTrue);
    if ((ImGui::Button("Open") || entered) && !state.open_folder_path.empty()) {
      // The library checks the path on its worker; a bad one shows up as a problem in the Runs panel.
      state.library->add_root(state.open_folder_path);
      state.status_message = "opening " + state.open_folder_path;
      ImGui::CloseCurrentPopup();
    }
    ImGui::SameLine();
    if (ImGui::Button("Cancel")) ImGui::CloseCurrentPopup();
    ImGui::EndPopup();
  }
}

}  // namespace proplab::gui
