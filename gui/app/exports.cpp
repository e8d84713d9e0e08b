// Exports: PNGs of single plots and of the focused view (pixels read back on the frame thread, GL; encoded and
// written by a task), SVG and CSV of the focused view (its figure built on the frame thread, written by a task).
// Every file is written atomically (write_file_atomically).
#include <GL/gl.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "gui/app/app_state.h"
#include "gui/app/plot_specs.h"
#include "gui/plot/figure_export.h"

namespace proplab::gui {

namespace {

std::string file_stem(const std::string& title) {
  std::string stem;
  for (const char c : title) {
    stem += (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.') ? c : '_';
  }
  return stem.empty() ? "plot" : stem;
}

void export_rect(AppState& state, ExportRequest& request, int framebuffer_width, int framebuffer_height) {
  // The frame that made the request still shows the menu it was made in: read the next one.
  if (!request.armed) {
    request.armed = true;
    return;
  }
  request.requested = false;
  request.armed = false;
  const ImVec2 scale = ImGui::GetIO().DisplayFramebufferScale;
  const int x0 = std::clamp(static_cast<int>(std::floor(request.x0 * scale.x)), 0, framebuffer_width);
  const int x1 = std::clamp(static_cast<int>(std::ceil(request.x1 * scale.x)), 0, framebuffer_width);
  const int y0 = std::clamp(static_cast<int>(std::floor(request.y0 * scale.y)), 0, framebuffer_height);
  const int y1 = std::clamp(static_cast<int>(std::ceil(request.y1 * scale.y)), 0, framebuffer_height);
  const int width = x1 - x0, height = y1 - y0;
  if (width <= 0 || height <= 0) return;
  std::vector<unsigned char> bottom_up(static_cast<std::size_t>(width) * height * 4);
  glPixelStorei(GL_PACK_ALIGNMENT, 1);
  glReadPixels(x0, framebuffer_height - y1, width, height, GL_RGBA, GL_UNSIGNED_BYTE, bottom_up.data());
  const std::filesystem::path path =
      state.export_directory / (file_stem(request.name) + "_" + std::to_string(++state.export_count) + ".png");
  state.exports.push_back(std::async(std::launch::async, [path, width, height, pixels = std::move(bottom_up)] {
    std::vector<unsigned char> top_down(pixels.size());
    const std::size_t row = static_cast<std::size_t>(width) * 4;
    for (int y = 0; y < height; ++y) {
      std::copy_n(pixels.begin() + static_cast<std::ptrdiff_t>((height - 1 - y) * row), row,
                  top_down.begin() + static_cast<std::ptrdiff_t>(y * row));
    }
    const std::string error = write_file_atomically(path.string(), encode_png(width, height, top_down));
    return error.empty() ? "saved " + path.string() : "could not write " + path.string() + ": " + error;
  }));
}

}  // namespace

void request_view_export(AppState& state, const std::string& format) {
  if (format == "png") {
    state.view_export.requested = true;
    state.view_export.name = view_name(state.view);
    return;
  }
  const double width = std::max(320.0, static_cast<double>(state.view_export.x1 - state.view_export.x0));
  const double height = std::max(240.0, static_cast<double>(state.view_export.y1 - state.view_export.y0));
  Figure figure = view_figure(state, width, height);
  const std::filesystem::path path =
      state.export_directory / (std::string(view_name(state.view)) + "_" + std::to_string(++state.export_count) + "." +
                                (format == "csv" ? "csv" : "svg"));
  const bool csv = format == "csv";
  state.status_message = "writing " + path.string();
  state.exports.push_back(std::async(std::launch::async, [path, csv, figure = std::move(figure)] {
    const std::string error = write_file_atomically(path.string(), csv ? figure_csv(figure) : figure_svg(figure));
    return error.empty() ? "saved " + path.string() : "could not write " + path.string() + ": " + error;
  }));
}

void process_exports(AppState& state, int framebuffer_width, int framebuffer_height) {
  if (state.view_export.requested) export_rect(state, state.view_export, framebuffer_width, framebuffer_height);
  for (auto& [name, plot] : state.plots) {
    if (plot.export_request.requested) export_rect(state, plot.export_request, framebuffer_width, framebuffer_height);
  }
  for (auto& [name, heatmap] : state.heatmaps) {
    if (heatmap.export_request.requested) {
      export_rect(state, heatmap.export_request, framebuffer_width, framebuffer_height);
    }
  }
  for (auto it = state.exports.begin(); it != state.exports.end();) {
    if (it->wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
      state.status_message = it->get();
      it = state.exports.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace proplab::gui
