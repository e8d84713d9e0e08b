// proplab-gui [RUN.h5 | DIR]...: view, compare and follow propagation plots (docs/gui.md).
//   --screenshot OUT.png renders one frame offscreen (EGL, no display server) and exits.
//   --export OUT.svg|OUT.png|OUT.csv writes the focused view (--view) as SVG, PNG or CSV of its data and exits.
//   --frames N quits after N frames once the first scan has loaded (tests).
#include <GLFW/glfw3.h>
#include <backends/imgui_impl_glfw.h>
#include <backends/imgui_impl_opengl3.h>
#include <imgui.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>

#include "core/error.h"
#include "gui/app/app_state.h"
#include "gui/app/headless.h"
#include "gui/app/plot_specs.h"
#include "gui/data/depth_axis.h"
#include "gui/plot/plot_math.h"

namespace {

using namespace proplab;
using namespace proplab::gui;

struct Options {
  std::vector<std::string> paths;
  std::string screenshot;
  std::string export_path;
  std::string view = "depth";
  std::string stat;
  bool backward = false;
  std::string kind, kinds, x_axis;
  long long record = -1;
  std::string group;
  std::string compare_plot = "depth";
  bool linear = false;
  bool full = false;
  std::string size = "1280x800";
  bool size_given = false;  // else the window fills the screen's work area
  long long frames = 0;
};

void parse_size(const std::string& text, int& width, int& height) {
  char separator = 0;
  char rest = 0;
  if (std::sscanf(text.c_str(), "%d%c%d%c", &width, &separator, &height, &rest) != 3 || separator != 'x') {
    throw UserError("--size " + text + ": expected WIDTHxHEIGHT, e.g. 1280x800");
  }
}

// The command line's choices, applied to a fresh state.
void apply_options(const Options& options, AppState& state) {
  const auto view = parse_view(options.view);
  if (!view) throw UserError("--view " + options.view + ": expected depth, dynamics, heatmap, compare or grid");
  state.view = *view;
  const auto compare_plot = parse_view(options.compare_plot);
  if (!compare_plot || *compare_plot == View::compare || *compare_plot == View::grid) {
    throw UserError("--compare-plot " + options.compare_plot + ": expected depth, dynamics or heatmap");
  }
  state.compare_plot = *compare_plot;
  if (!options.stat.empty()) state.stat = options.stat;
  state.direction = options.backward ? Direction::backward : Direction::forward;
  if (!options.kind.empty() && !options.kinds.empty()) throw UserError("--kind and --kinds: give one of them");
  if (!options.kind.empty()) state.kind_filter = parse_kinds(options.kind);
  if (!options.kinds.empty())
    state.kind_filter = options.kinds == "all" ? std::vector<std::string>{} : parse_kinds(options.kinds);
  if (!options.x_axis.empty()) {
    const auto axis = parse_depth_axis(options.x_axis);
    if (!axis) throw UserError("--x " + options.x_axis + ": expected block, depth (l/L) or probe");
    state.depth_axis = *axis;
  }
  state.record = options.record;
  if (!options.group.empty()) {
    state.compare_key = options.group;
    state.compare_key_chosen = true;
  }
  if (options.linear) {
    state.depth_log_y = false;
    state.dynamics_log_y = false;
    state.heatmap_log = false;
  }
}

// A --stat that none of the shown runs records is a command-line error (nothing is written).
void check_stat(const Options& options, const AppState& state) {
  if (options.stat.empty()) return;
  const RunList runs = selected_runs(state);
  std::set<std::string> recorded;
  for (const auto& run : runs) {
    for (const auto& [name, matrix] : run->stats(state.direction)) recorded.insert(name);
  }
  if (runs.empty() || recorded.count(options.stat)) return;
  std::string names;
  for (const auto& name : recorded) names += (names.empty() ? "" : ", ") + name;
  throw UserError(detail::concat("--stat ", options.stat, ": no shown run records ", direction_name(state.direction),
                                 " statistic '", options.stat, "' (recorded: ", names.empty() ? "none" : names, ")"));
}

int run_screenshot(const Options& options, AppState& state) {
  int width = 0, height = 0;
  parse_size(options.size, width, height);
  HeadlessRenderer renderer(width, height);
  if (!state.library->wait_for_initial_scan(300.0)) throw UserError("the runs did not load within 300 s");
  refresh_from_library(state);
  check_stat(options, state);
  state.single_view = !options.full;
  // ImGui settles window and table sizes over the first frames.
  for (int frame = 0; frame < 3; ++frame) renderer.render_frame(state);
  const std::vector<unsigned char> pixels = renderer.read_rgba();
  release_gpu_resources(state);
  if (!write_png(options.screenshot, width, height, pixels)) {
    throw UserError("--screenshot " + options.screenshot + ": could not write the PNG (does its folder exist?)");
  }
  std::cout << "proplab-gui: wrote " << options.screenshot << " (" << width << "x" << height << ", "
            << view_name(state.view) << ", " << selected_runs(state).size() << " runs; " << renderer.description()
            << ")\n";
  return 0;
}

enum class ExportFormat { svg, png, csv };

// The format named by OUT's extension; UserError for any other, or when OUT's folder does not exist.
ExportFormat export_format(const std::string& path) {
  const std::filesystem::path out(path);
  std::string extension = out.extension().string();
  for (char& c : extension) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  ExportFormat format;
  if (extension == ".svg") {
    format = ExportFormat::svg;
  } else if (extension == ".png") {
    format = ExportFormat::png;
  } else if (extension == ".csv") {
    format = ExportFormat::csv;
  } else {
    throw UserError("--export " + path + ": expected a file ending in .svg, .png or .csv");
  }
  const std::filesystem::path folder = out.parent_path().empty() ? std::filesystem::path(".") : out.parent_path();
  if (!std::filesystem::is_directory(folder)) {
    throw UserError("--export " + path + ": folder '" + folder.string() + "' does not exist");
  }
  return format;
}

// An export shows exactly the runs it was given: a path that is missing, holds no run, or a run file that cannot
// be read is an error naming it (the first one), before anything is written.
void check_export_runs(const AppState& state) {
  const LibrarySnapshot snapshot = state.library->snapshot();
  if (!snapshot.problems.empty()) throw UserError(snapshot.problems.front());
  for (const auto& run : snapshot.runs) {
    if (!run->ok()) throw UserError(run->path.string() + ": cannot be read: " + run->error);
  }
  if (snapshot.runs.empty()) throw UserError("no run files to export");
}

int run_export(const Options& options, AppState& state) {
  const ExportFormat format = export_format(options.export_path);
  int width = 0, height = 0;
  parse_size(options.size, width, height);
  if (width < 16 || height < 16 || width > 16384 || height > 16384) {
    throw UserError(detail::concat("--size ", options.size, ": width and height must be 16..16384"));
  }
  if (!state.library->wait_for_initial_scan(300.0)) throw UserError("the runs did not load within 300 s");
  check_export_runs(state);
  // Every given run is shown (the window selects the first few automatically), in the library's order.
  for (const auto& run : state.library->snapshot().runs) state.selection.push_back(run->path);
  state.selection_touched = true;
  refresh_from_library(state);
  sync_selection(state);
  check_stat(options, state);
  std::string contents;
  if (format == ExportFormat::png) {
    HeadlessRenderer renderer(width, height);
    state.single_view = true;
    // ImGui settles window and table sizes over the first frames.
    for (int frame = 0; frame < 3; ++frame) renderer.render_frame(state);
    contents = encode_png(width, height, renderer.read_rgba());
    release_gpu_resources(state);
  } else {
    const Figure figure = view_figure(state, width, height);
    contents = format == ExportFormat::svg ? figure_svg(figure) : figure_csv(figure);
  }
  if (contents.empty()) throw UserError("--export " + options.export_path + ": nothing to write");
  const std::string error = write_file_atomically(options.export_path, contents);
  if (!error.empty()) throw UserError("--export " + options.export_path + ": " + error);
  std::cout << "proplab-gui: wrote " << options.export_path << " (" << width << "x" << height << ", "
            << view_name(state.view) << ", " << selected_runs(state).size() << " runs)\n";
  return 0;
}

void glfw_error(int code, const char* description) {
  std::cerr << "proplab-gui: GLFW error " << code << ": " << description << "\n";
}

int run_window(const Options& options, AppState& state) {
  int width = 0, height = 0;
  parse_size(options.size, width, height);
  glfwSetErrorCallback(glfw_error);
  if (!glfwInit()) {
    std::cerr << "proplab-gui: no display to open a window on (is DISPLAY or WAYLAND_DISPLAY set?); "
                 "--screenshot OUT.png renders a frame without one\n";
    return 1;
  }
  glfwWindowHint(GLFW_CONTEXT_VERSION_MAJOR, 3);
  glfwWindowHint(GLFW_CONTEXT_VERSION_MINOR, 3);
  glfwWindowHint(GLFW_OPENGL_PROFILE, GLFW_OPENGL_CORE_PROFILE);
  // Without --size the window fills the primary monitor's work area (maximised, so that a window manager fits its
  // decorations in too).
  PixelRect placed{0.0, 0.0, static_cast<double>(width), static_cast<double>(height)};
  if (!options.size_given) {
    PixelRect work_area;
    if (GLFWmonitor* monitor = glfwGetPrimaryMonitor()) {
      int x = 0, y = 0, w = 0, h = 0;
      glfwGetMonitorWorkarea(monitor, &x, &y, &w, &h);
      work_area = PixelRect{static_cast<double>(x), static_cast<double>(y), static_cast<double>(x + w),
                            static_cast<double>(y + h)};
    }
    placed = initial_window_rect(work_area, width, height);
    width = static_cast<int>(placed.width());
    height = static_cast<int>(placed.height());
    glfwWindowHint(GLFW_MAXIMIZED, GLFW_TRUE);
  }
  GLFWwindow* window = glfwCreateWindow(width, height, "proplab-gui", nullptr, nullptr);
  if (window == nullptr) {
    std::cerr << "proplab-gui: could not open an OpenGL 3.3 window\n";
    glfwTerminate();
    return 1;
  }
  if (!options.size_given) glfwSetWindowPos(window, static_cast<int>(placed.x0), static_cast<int>(placed.y0));
  glfwMakeContextCurrent(window);
  glfwSwapInterval(1);
  IMGUI_CHECKVERSION();
  ImGui::CreateContext();
  ImGuiIO& io = ImGui::GetIO();
  io.IniFilename = nullptr;  // the layout is fixed; nothing to save
  ImGui::StyleColorsDark();
  ImGui_ImplGlfw_InitForOpenGL(window, true);
  ImGui_ImplOpenGL3_Init("#version 330");

  long long frames_after_load = 0;
  while (!glfwWindowShouldClose(window) && !state.quit_requested) {
    // Idle: sleep until an event, or a tenth of a second so that live runs and finished loads still show.
    if (state.playing || !state.exports.empty() || !state.library_state.initial_scan_done) {
      glfwPollEvents();
    } else {
      glfwWaitEventsTimeout(0.1);
    }
    ImGui_ImplOpenGL3_NewFrame();
    ImGui_ImplGlfw_NewFrame();
    ImGui::NewFrame();
    draw_frame(state);
    ImGui::Render();
    int framebuffer_width = 0, framebuffer_height = 0;
    glfwGetFramebufferSize(window, &framebuffer_width, &framebuffer_height);
    glViewport(0, 0, framebuffer_width, framebuffer_height);
    const ImVec4 background = background_colour();
    glClearColor(background.x, background.y, background.z, background.w);
    glClear(GL_COLOR_BUFFER_BIT);
    ImGui_ImplOpenGL3_RenderDrawData(ImGui::GetDrawData());
    process_exports(state, framebuffer_width, framebuffer_height);
    glfwSwapBuffers(window);
    if (options.frames > 0 && state.library_state.initial_scan_done && ++frames_after_load >= options.frames) break;
  }
  const std::size_t shown = selected_runs(state).size();
  int window_width = 0, window_height = 0;
  glfwGetWindowSize(window, &window_width, &window_height);
  for (auto& pending : state.exports) pending.wait();
  release_gpu_resources(state);
  ImGui_ImplOpenGL3_Shutdown();
  ImGui_ImplGlfw_Shutdown();
  ImGui::DestroyContext();
  glfwDestroyWindow(window);
  glfwTerminate();
  std::cout << "proplab-gui: closed after " << frames_after_load << " frames with " << state.library_state.runs.size()
            << " runs, " << shown << " shown; window " << window_width << "x" << window_height << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"proplab-gui: view, compare and follow propagation plots of proplab run files"};
  Options options;
  app.add_option("paths", options.paths, "run files (.h5) and folders (searched recursively)");
  app.add_option("--screenshot", options.screenshot, "render one frame offscreen to this PNG and exit");
  app.add_option("--export", options.export_path,
                 "write the view to OUT.svg (vector), OUT.png or OUT.csv (the plotted data) and exit");
  app.add_option("--view", options.view, "depth | dynamics | heatmap | compare | grid")->capture_default_str();
  app.add_option("--stat", options.stat, "statistic to show (default var)");
  app.add_flag("--backward", options.backward, "show the gradients' statistics");
  app.add_option("--kind", options.kind, "only probes of this kind (e.g. residual)");
  app.add_option("--kinds", options.kinds,
                 "only probes of these kinds, e.g. residual,branch, or all (default: the residual stream in the depth "
                 "and compare views, every probe in the heatmap)");
  app.add_option("--x", options.x_axis,
                 "depth axis: block | depth (l/L) | probe (default: block, l/L when depths differ)");
  app.add_option("--record", options.record, "record index (default: the last)");
  app.add_option("--group", options.group,
                 "compare and grid: config key to group by (default scaling.rule; grid: else a key that differs)");
  app.add_option("--compare-plot", options.compare_plot, "compare: depth | dynamics | heatmap")->capture_default_str();
  app.add_flag("--linear", options.linear, "linear y axes and colour scale");
  app.add_flag("--full", options.full, "--screenshot of the whole window (runs panel, details and the view)");
  CLI::Option* size_option =
      app.add_option("--size", options.size, "WIDTHxHEIGHT (default: the screen's work area; --screenshot 1280x800)");
  app.add_option("--frames", options.frames, "quit after N frames once the runs are loaded (tests)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    // Bad command lines exit 2, as the proplab CLI's do (--help exits 0).
    return app.exit(error) == 0 ? 0 : 2;
  }
  options.size_given = size_option->count() > 0;

  try {
    std::vector<std::filesystem::path> roots(options.paths.begin(), options.paths.end());
    if (roots.empty()) roots.push_back(".");
    AppState state;
    apply_options(options, state);
    state.library = std::make_unique<RunLibrary>(roots);
    if (!options.export_path.empty() && !options.screenshot.empty()) {
      throw UserError("--export and --screenshot: give one of them");
    }
    if (!options.export_path.empty()) {
      export_format(options.export_path);  // a bad OUT is said before any run is read
      return run_export(options, state);
    }
    return options.screenshot.empty() ? run_window(options, state) : run_screenshot(options, state);
  } catch (const UserError& error) {
    std::cerr << "proplab-gui: " << error.what() << "\n";
    return 2;
  }
}
