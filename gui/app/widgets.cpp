#include "gui/app/widgets.h"

#include <algorithm>

namespace proplab::gui {

namespace fs = std::filesystem;

ImVec4 status_colour(const RunSnapshot& run) {
  if (!run.ok()) return ImVec4(0.85f, 0.35f, 0.35f, 1.0f);
  switch (run.status.value_or(RunStatus::failed)) {
    case RunStatus::running:
      return ImVec4(0.40f, 0.70f, 1.00f, 1.0f);
    case RunStatus::completed:
      return ImVec4(0.40f, 0.82f, 0.40f, 1.0f);
    case RunStatus::diverged:
      return ImVec4(1.00f, 0.62f, 0.20f, 1.0f);
    case RunStatus::failed:
      return ImVec4(0.95f, 0.30f, 0.30f, 1.0f);
  }
  return ImVec4(1, 1, 1, 1);
}

bool is_selected(const AppState& state, const fs::path& path) {
  return state.selection_position.count(path.string()) > 0;
}

void toggle_selection(AppState& state, const fs::path& path) {
  state.selection_touched = true;
  const auto found = std::find(state.selection.begin(), state.selection.end(), path);
  if (found == state.selection.end()) {
    state.selection.push_back(path);
  } else {
    state.selection.erase(found);
  }
  sync_selection(state);
}

bool combo_strings(const char* label, std::string& value, const std::vector<std::string>& options,
                   const char* none_label) {
  bool changed = false;
  const std::string preview = value.empty() && none_label ? none_label : value;
  if (ImGui::BeginCombo(label, preview.c_str())) {
    if (none_label && ImGui::Selectable(none_label, value.empty())) {
      value.clear();
      changed = true;
    }
    for (const auto& option : options) {
      if (ImGui::Selectable(option.c_str(), option == value)) {
        value = option;
        changed = true;
      }
    }
    ImGui::EndCombo();
  }
  return changed;
}

}  // namespace proplab::gui
