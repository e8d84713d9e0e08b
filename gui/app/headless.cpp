#include "gui/app/headless.h"

#include <EGL/egl.h>
#include <EGL/eglext.h>
#include <GL/gl.h>
#include <GL/glext.h>
#include <backends/imgui_impl_opengl3.h>
#include <imgui.h>

#include <algorithm>
#include <chrono>

#include "core/error.h"

namespace proplab::gui {

struct HeadlessRenderer::Impl {
  EGLDisplay display = EGL_NO_DISPLAY;
  EGLContext context = EGL_NO_CONTEXT;
  EGLSurface surface = EGL_NO_SURFACE;  // a 1×1 pbuffer only where surfaceless contexts are not supported
  GLuint framebuffer = 0, colour = 0;
  ImGuiContext* imgui = nullptr;
  bool backend = false;
  PFNGLDELETEFRAMEBUFFERSPROC delete_framebuffers = nullptr;
  PFNGLDELETERENDERBUFFERSPROC delete_renderbuffers = nullptr;
};

namespace {

template <typename Function>
Function gl_function(const char* name) {
  auto function = reinterpret_cast<Function>(eglGetProcAddress(name));
  if (function == nullptr) throw UserError(detail::concat("headless rendering: OpenGL function ", name, " is missing"));
  return function;
}

std::string egl_error() { return detail::concat("EGL error 0x", std::hex, eglGetError()); }

// Mesa's surfaceless platform first, then the first EGL device (NVIDIA), then the default display.
EGLDisplay open_display(std::string& platform) {
  auto get_platform_display =
      reinterpret_cast<PFNEGLGETPLATFORMDISPLAYEXTPROC>(eglGetProcAddress("eglGetPlatformDisplayEXT"));
  EGLint major = 0, minor = 0;
  if (get_platform_display != nullptr) {
    EGLDisplay display = get_platform_display(EGL_PLATFORM_SURFACELESS_MESA, EGL_DEFAULT_DISPLAY, nullptr);
    if (display != EGL_NO_DISPLAY && eglInitialize(display, &major, &minor)) {
      platform = "EGL surfaceless";
      return display;
    }
    auto query_devices = reinterpret_cast<PFNEGLQUERYDEVICESEXTPROC>(eglGetProcAddress("eglQueryDevicesEXT"));
    EGLDeviceEXT devices[4];
    EGLint count = 0;
    if (query_devices != nullptr && query_devices(4, devices, &count) && count > 0) {
      for (EGLint i = 0; i < count; ++i) {
        display = get_platform_display(EGL_PLATFORM_DEVICE_EXT, devices[i], nullptr);
        if (display != EGL_NO_DISPLAY && eglInitialize(display, &major, &minor)) {
          platform = "EGL device";
          return display;
        }
      }
    }
  }
  EGLDisplay display = eglGetDisplay(EGL_DEFAULT_DISPLAY);
  if (display != EGL_NO_DISPLAY && eglInitialize(display, &major, &minor)) {
    platform = "EGL default display";
    return display;
  }
  throw UserError(
      "headless rendering: no EGL display (tried Mesa's surfaceless platform, EGL devices and the "
      "default display; install libegl-mesa0 and libgl1-mesa-dri): " +
      egl_error());
}

}  // namespace

HeadlessRenderer::HeadlessRenderer(int width, int height)
    : impl_(std::make_unique<Impl>()), width_(width), height_(height) {
  if (width < 16 || height < 16 || width > 16384 || height > 16384) {
    throw UserError(detail::concat("--size ", width, "x", height, ": width and height must be 16..16384"));
  }
  Impl& impl = *impl_;
  std::string platform;
  impl.display = open_display(platform);
  if (!eglBindAPI(EGL_OPENGL_API)) throw UserError("headless rendering: EGL has no desktop OpenGL: " + egl_error());
  const EGLint config_attributes[] = {EGL_SURFACE_TYPE,
                                      EGL_PBUFFER_BIT,
                                      EGL_RENDERABLE_TYPE,
                                      EGL_OPENGL_BIT,
                                      EGL_RED_SIZE,
                                      8,
                                      EGL_GREEN_SIZE,
                                      8,
                                      EGL_BLUE_SIZE,
                                      8,
                                      EGL_NONE};
  EGLConfig config = nullptr;
  EGLint configs = 0;
  eglChooseConfig(impl.display, config_attributes, &config, 1, &configs);
  const EGLint context_attributes[] = {
      EGL_CONTEXT_MAJOR_VERSION,           3,       EGL_CONTEXT_MINOR_VERSION, 3, EGL_CONTEXT_OPENGL_PROFILE_MASK,
      EGL_CONTEXT_OPENGL_CORE_PROFILE_BIT, EGL_NONE};
  // Surfaceless contexts need no config (EGL_KHR_no_config_context); otherwise use the pbuffer config.
  impl.context =
      eglCreateContext(impl.display, configs > 0 ? config : EGL_NO_CONFIG_KHR, EGL_NO_CONTEXT, context_attributes);
  if (impl.context == EGL_NO_CONTEXT) {
    throw UserError("headless rendering: could not create an OpenGL 3.3 core context: " + egl_error());
  }
  if (!eglMakeCurrent(impl.display, EGL_NO_SURFACE, EGL_NO_SURFACE, impl.context)) {
    const EGLint pbuffer_attributes[] = {EGL_WIDTH, 1, EGL_HEIGHT, 1, EGL_NONE};
    if (configs > 0) impl.surface = eglCreatePbufferSurface(impl.display, config, pbuffer_attributes);
    if (impl.surface == EGL_NO_SURFACE || !eglMakeCurrent(impl.display, impl.surface, impl.surface, impl.context)) {
      throw UserError("headless rendering: could not make the OpenGL context current: " + egl_error());
    }
  }
  auto gen_framebuffers = gl_function<PFNGLGENFRAMEBUFFERSPROC>("glGenFramebuffers");
  auto bind_framebuffer = gl_function<PFNGLBINDFRAMEBUFFERPROC>("glBindFramebuffer");
  auto gen_renderbuffers = gl_function<PFNGLGENRENDERBUFFERSPROC>("glGenRenderbuffers");
  auto bind_renderbuffer = gl_function<PFNGLBINDRENDERBUFFERPROC>("glBindRenderbuffer");
  auto renderbuffer_storage = gl_function<PFNGLRENDERBUFFERSTORAGEPROC>("glRenderbufferStorage");
  auto framebuffer_renderbuffer = gl_function<PFNGLFRAMEBUFFERRENDERBUFFERPROC>("glFramebufferRenderbuffer");
  auto check_framebuffer = gl_function<PFNGLCHECKFRAMEBUFFERSTATUSPROC>("glCheckFramebufferStatus");
  impl.delete_framebuffers = gl_function<PFNGLDELETEFRAMEBUFFERSPROC>("glDeleteFramebuffers");
  impl.delete_renderbuffers = gl_function<PFNGLDELETERENDERBUFFERSPROC>("glDeleteRenderbuffers");
  gen_framebuffers(1, &impl.framebuffer);
  bind_framebuffer(GL_FRAMEBUFFER, impl.framebuffer);
  gen_renderbuffers(1, &impl.colour);
  bind_renderbuffer(GL_RENDERBUFFER, impl.colour);
  renderbuffer_storage(GL_RENDERBUFFER, GL_RGBA8, width, height);
  framebuffer_renderbuffer(GL_FRAMEBUFFER, GL_COLOR_ATTACHMENT0, GL_RENDERBUFFER, impl.colour);
  const GLenum status = check_framebuffer(GL_FRAMEBUFFER);
  if (status != GL_FRAMEBUFFER_COMPLETE) {
    throw UserError(detail::concat("headless rendering: framebuffer of ", width, "x", height, " incomplete (0x",
                                   std::hex, status, ")"));
  }
  description_ = detail::concat(platform, ", ", reinterpret_cast<const char*>(glGetString(GL_RENDERER)), ", OpenGL ",
                                reinterpret_cast<const char*>(glGetString(GL_VERSION)));

  IMGUI_CHECKVERSION();
  impl.imgui = ImGui::CreateContext();
  ImGuiIO& io = ImGui::GetIO();
  io.IniFilename = nullptr;  // no imgui.ini: a headless frame reads and writes no settings
  io.DisplaySize = ImVec2(static_cast<float>(width), static_cast<float>(height));
  ImGui::StyleColorsDark();
  if (!ImGui_ImplOpenGL3_Init("#version 330")) throw UserError("headless rendering: ImGui's OpenGL3 backend failed");
  impl.backend = true;
}

HeadlessRenderer::~HeadlessRenderer() {
  Impl& impl = *impl_;
  if (impl.backend) ImGui_ImplOpenGL3_Shutdown();
  if (impl.imgui != nullptr) ImGui::DestroyContext(impl.imgui);
  if (impl.framebuffer != 0) impl.delete_framebuffers(1, &impl.framebuffer);
  if (impl.colour != 0) impl.delete_renderbuffers(1, &impl.colour);
  if (impl.display != EGL_NO_DISPLAY) {
    eglMakeCurrent(impl.display, EGL_NO_SURFACE, EGL_NO_SURFACE, EGL_NO_CONTEXT);
    if (impl.surface != EGL_NO_SURFACE) eglDestroySurface(impl.display, impl.surface);
    if (impl.context != EGL_NO_CONTEXT) eglDestroyContext(impl.display, impl.context);
    eglTerminate(impl.display);
  }
}

HeadlessRenderer::FrameTime HeadlessRenderer::render_frame(AppState& state, float delta_s) {
  return render_frame([&state] { draw_frame(state); }, delta_s);
}

HeadlessRenderer::FrameTime HeadlessRenderer::render_frame(const std::function<void()>& draw, float delta_s) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  ImGuiIO& io = ImGui::GetIO();
  io.DisplaySize = ImVec2(static_cast<float>(width_), static_cast<float>(height_));
  io.DeltaTime = delta_s;
  ImGui_ImplOpenGL3_NewFrame();
  ImGui::NewFrame();
  draw();
  ImGui::Render();
  const auto built = clock::now();
  glViewport(0, 0, width_, height_);
  const ImVec4 background = background_colour();
  glClearColor(background.x, background.y, background.z, background.w);
  glClear(GL_COLOR_BUFFER_BIT);
  ImGui_ImplOpenGL3_RenderDrawData(ImGui::GetDrawData());
  glFinish();
  return {std::chrono::duration<double>(built - start).count(),
          std::chrono::duration<double>(clock::now() - built).count()};
}

std::vector<unsigned char> HeadlessRenderer::read_rgba() const {
  std::vector<unsigned char> bottom_up(static_cast<std::size_t>(width_) * height_ * 4);
  glPixelStorei(GL_PACK_ALIGNMENT, 1);
  glReadPixels(0, 0, width_, height_, GL_RGBA, GL_UNSIGNED_BYTE, bottom_up.data());
  std::vector<unsigned char> top_down(bottom_up.size());
  const std::size_t row = static_cast<std::size_t>(width_) * 4;
  for (int y = 0; y < height_; ++y) {
    std::copy_n(bottom_up.begin() + static_cast<std::ptrdiff_t>((height_ - 1 - y) * row), row,
                top_down.begin() + static_cast<std::ptrdiff_t>(y * row));
  }
  // The framebuffer's alpha is whatever blending left: a PNG should be opaque.
  for (std::size_t i = 3; i < top_down.size(); i += 4) top_down[i] = 255;
  return top_down;
}

}  // namespace proplab::gui
