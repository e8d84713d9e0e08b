// gui/app/headless: renders proplab-gui frames offscreen, without a display server: EGL on Mesa's surfaceless
// platform (llvmpipe on CI machines), else EGL's device platform (e.g. the NVIDIA driver on GPU nodes), an
// OpenGL 3.3 core context and a framebuffer object of the requested size. `--screenshot`, the screenshot tests,
// bench_gui and `proplab report` (gui/report) draw through it.
//
// Invariants:
// - One HeadlessRenderer per process at a time: it owns the EGL display/context, the FBO and the ImGui context,
//   and makes them current on the constructing thread; every call comes from that thread.
// - read_rgba() returns width × height × 4 bytes, top row first (PNG order).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gui/app/app_state.h"

namespace proplab::gui {

class HeadlessRenderer {
 public:
  // UserError saying which step failed (no EGL display, no OpenGL 3.3 context, incomplete framebuffer).
  HeadlessRenderer(int width, int height);
  ~HeadlessRenderer();
  HeadlessRenderer(const HeadlessRenderer&) = delete;
  HeadlessRenderer& operator=(const HeadlessRenderer&) = delete;

  // Seconds one frame took: building the UI (NewFrame .. Render: draw_frame, layout, tessellation) and rendering
  // it (the OpenGL3 backend's draw calls until glFinish returns).
  struct FrameTime {
    double build_s = 0.0, render_s = 0.0;
    double total_s() const { return build_s + render_s; }
  };
  // Draws one frame of `state` (delta time `delta_s`) and waits until it is rendered.
  FrameTime render_frame(AppState& state, float delta_s = 1.0f / 60.0f);
  // Draws one frame built by `draw` (called between ImGui::NewFrame and ImGui::Render instead of draw_frame) and
  // waits until it is rendered; `proplab report` lays out its figures this way.
  FrameTime render_frame(const std::function<void()>& draw, float delta_s = 1.0f / 60.0f);
  std::vector<unsigned char> read_rgba() const;
  int width() const { return width_; }
  int height() const { return height_; }
  // e.g. "EGL surfaceless, llvmpipe (LLVM 15.0.6, 256 bits), OpenGL 4.5 (Core Profile) Mesa 22.3.6"
  const std::string& description() const { return description_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int width_, height_;
  std::string description_;
};

}  // namespace proplab::gui
