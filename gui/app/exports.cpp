// PNG export of single plots: pixels are read back on the frame thread (GL), encoded and written by a task.
#include <GL/gl.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "gui/app/app_state.h"

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
    return write_png(path.string(), width, height, top_down) ? "saved " + path.string()
                                                             : "could not write " + path.string();
  }));
}

}  // namespace

void process_exports(AppState& state, int framebuffer_width, int framebuffer_height) {
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
