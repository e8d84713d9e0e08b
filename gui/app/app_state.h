// gui/app/app_state: the one state of proplab-gui, and the windows that draw it (one draw_<name>_window each).
//
// Invariants:
// - Everything the UI remembers between frames is in AppState (no function-local statics anywhere in the app).
// - The frame thread does no file I/O and no heavy work: it reads the RunLibrary's snapshots (loaded on the
//   library's worker) and builds plot specs from them. PNG exports are read back from the framebuffer on the frame
//   thread (GL must) and encoded and written by std::async tasks.
// - Run colours follow the selection order: the i-th selected run is drawn in series_colour(i) in every view,
//   its theory prediction as a dashed line of the same colour.
// - A record index past a run's last record shows that run's last record (runs may have different lengths).
#pragma once

#include <cstdint>
#include <filesystem>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "gui/data/depth_axis.h"
#include "gui/data/run_groups.h"
#include "gui/data/run_library.h"
#include "gui/plot/plot.h"

namespace proplab::gui {

enum class View { depth, dynamics, heatmap, compare, grid };
const char* view_name(View view);
// "depth" | "dynamics" | "heatmap" | "compare" | "grid"; nullopt otherwise.
std::optional<View> parse_view(const std::string& text);

struct AppState {
  std::unique_ptr<RunLibrary> library;
  LibrarySnapshot library_state;
  std::uint64_t seen_generation = static_cast<std::uint64_t>(-1);

  // Derived from library_state when it changes.
  std::vector<std::string> config_keys;     // of every run
  std::vector<std::string> differing_keys;  // between the runs: the runs table's extra columns
  std::set<std::string> reported;           // problems already written to stderr

  // Runs panel.
  std::vector<std::filesystem::path> selection;  // in selection order (colours follow it)
  bool selection_touched = false;                // the user chose: no more automatic selection
  // Derived from `selection` and the library by sync_selection(), so that a frame never searches lists of paths
  // (with 200 runs selected that cost milliseconds per frame): each selected path's position, and the selected
  // readable runs in selection order.
  std::unordered_map<std::string, std::size_t> selection_position;
  RunList selected;
  std::string filter;
  std::string group_key;

  // Which view fills the main area; headless screenshots draw only it, full size.
  View view = View::depth;
  bool single_view = false;

  // Depth profile.
  Direction direction = Direction::forward;
  std::string stat = "var";
  std::int64_t record = -1;  // -1: the last record
  bool playing = false;
  double play_clock_s = 0.0;
  float play_rate = 4.0f;  // records per second
  // The probe kinds the depth, heatmap and compare views show; empty: every probe. nullopt until chosen: then the
  // depth and compare views show default_kinds (the residual stream) and the heatmap every probe.
  std::optional<std::vector<std::string>> kind_filter;
  // The depth profile's x axis: nullopt until chosen (then default_depth_axis: by block, l/L when depths differ).
  std::optional<DepthAxis> depth_axis;
  bool depth_log_y = true;
  bool show_theory = true;

  // Dynamics.
  std::vector<std::string> dynamics_probes;  // probe names; empty: default_dynamics_probes
  bool dynamics_log_x = false;
  bool dynamics_log_y = true;

  // Heatmap.
  std::filesystem::path heatmap_run;  // empty: the first selected run
  bool heatmap_log = true;

  // Compare: small multiples, one panel per value of compare_key.
  std::string compare_key = "scaling.rule";
  // Chosen by --group or a window's key combo: the grid view then groups by it too (else by a key that differs).
  bool compare_key_chosen = false;
  View compare_plot = View::depth;

  // Details: the config diff of two runs.
  std::filesystem::path diff_left, diff_right;

  // Overlays and messages.
  bool show_help = false;
  bool open_folder_requested = false;
  std::string open_folder_path;
  std::string status_message;

  std::map<std::string, PlotState> plots;
  std::map<std::string, HeatmapState> heatmaps;
  // One OpenGL texture per heatmap panel, re-uploaded when `key` (run file, records, statistic, scale) changes.
  struct HeatmapTexture {
    unsigned int texture = 0;
    std::string key;
  };
  std::map<std::string, HeatmapTexture> heatmap_textures;
  std::vector<std::future<std::string>> exports;  // each yields a message
  // The focused view's window as last drawn, and a pending PNG of it (Export menu, request_view_export).
  ExportRequest view_export;
  std::filesystem::path export_directory = ".";
  int export_count = 0;
  bool quit_requested = false;
};

// Takes the library's latest snapshot when it changed: derived lists, automatic selection, stderr messages.
void refresh_from_library(AppState& state);
// Rebuilds selection_position and selected; call after changing `selection` or the library snapshot.
void sync_selection(AppState& state);
// The selected runs that are loaded and readable, in selection order (as of the last sync_selection).
const RunList& selected_runs(const AppState& state);

// The colour to clear each frame to (the tiled windows draw no background of their own).
ImVec4 background_colour();

// The whole UI for one frame (between ImGui::NewFrame and ImGui::Render).
void draw_frame(AppState& state);
void draw_runs_window(AppState& state);
void draw_depth_window(AppState& state);
void draw_dynamics_window(AppState& state);
void draw_heatmap_window(AppState& state);
void draw_compare_window(AppState& state);
void draw_grid_window(AppState& state);
void draw_details_window(AppState& state);
void draw_help_window(AppState& state);
void draw_open_folder_window(AppState& state);
// Arrow keys step records, space plays, Ctrl+O opens a folder, F1 or ? shows the help.
void handle_keyboard(AppState& state);

// The plot specs the views draw, for other renderers of the same figures (`proplab report`, gui/report): the
// depth profile of `runs` at state.record (theory dashed), one training curve per run ("loss" with evaluation
// dashed, "lr", "grad_norm"), and the heatmap of one run. Colours follow the selection order, as in the views.
PlotSpec depth_plot_spec(const AppState& state, const RunList& runs);
PlotSpec train_plot_spec(const AppState& state, const RunList& runs, const char* which);
// Whether any of the runs compressed its gradient exchange (the dynamics view then adds a "compression error" panel).
bool any_compression(const RunList& runs);
HeatmapSpec heatmap_plot_spec(const AppState& state, const RunSnapshot& run);
// Uploads `spec`'s cells into the texture of heatmap panel `panel` when they changed and sets spec.texture.
void attach_heatmap_texture(AppState& state, const std::string& panel, const RunSnapshot& run, HeatmapSpec& spec);

// Deletes the heatmap textures; call while the OpenGL context is still current.
void release_gpu_resources(AppState& state);

// Exports the focused view into export_directory under a generated name: "svg" and "csv" (its figure, view_figure,
// written off the frame thread), "png" (the view's window, read back after the next frame). The status line says
// where it went. Ctrl+E and the Export menu call it.
void request_view_export(AppState& state, const std::string& format);

// After rendering a frame into the current framebuffer (of `framebuffer_height` pixels): reads back the plots
// whose export was requested and writes them as PNGs off the frame thread; collects finished exports.
void process_exports(AppState& state, int framebuffer_width, int framebuffer_height);

}  // namespace proplab::gui
