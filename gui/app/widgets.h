// gui/app/widgets: the pieces the windows of proplab-gui share (gui/app/views.cpp, gui/app/run_windows.cpp).
#pragma once

#include <imgui.h>

#include <filesystem>
#include <string>
#include <vector>

#include "gui/app/app_state.h"

namespace proplab::gui {

// The tiled windows cover the whole framebuffer without overlapping, so they draw no background of their own:
// the frame is cleared to the window colour (background_colour()). That saves a full-screen blended fill, a third
// of a frame's cost under a software renderer (llvmpipe, docs/perf.md).
inline constexpr ImGuiWindowFlags tiled_window = ImGuiWindowFlags_NoMove | ImGuiWindowFlags_NoResize |
                                                 ImGuiWindowFlags_NoCollapse | ImGuiWindowFlags_NoSavedSettings |
                                                 ImGuiWindowFlags_NoBackground;

// The colour of a run's status in the runs table (running, completed, diverged, failed).
ImVec4 status_colour(const RunSnapshot& run);
bool is_selected(const AppState& state, const std::filesystem::path& path);
// Adds `path` to the selection or takes it out.
void toggle_selection(AppState& state, const std::filesystem::path& path);
// A combo over `options`; `none_label` (when given) stands for the empty value. True when the value changed.
bool combo_strings(const char* label, std::string& value, const std::vector<std::string>& options,
                   const char* none_label = nullptr);

}  // namespace proplab::gui
