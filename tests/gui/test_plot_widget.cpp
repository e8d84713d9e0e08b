// The plot widget's interaction, driven through ImGui with simulated mouse input and no renderer (ImGui builds
// its draw lists without one): fitting, wheel zoom, double-click fit, drag pan, box zoom, legend toggles, the
// export rectangle, and heatmap_rgba / write_png. Built when the GUI app is (it needs imgui).
#include <gtest/gtest.h>

#ifdef PROPLAB_GUI_BINARY

#include <stb/stb_image.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "gui/app/app_state.h"
#include "gui/app/headless.h"
#include "gui/data/synthetic_run.h"
#include "gui/plot/plot.h"
#include "gui_test_support.h"

namespace proplab::gui {
namespace {

constexpr float plot_width = 600.0f, plot_height = 400.0f;

class PlotWidgetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    context_ = ImGui::CreateContext();
    ImGuiIO& io = ImGui::GetIO();
    io.IniFilename = nullptr;
    io.DisplaySize = ImVec2(800, 600);
    io.DeltaTime = 1.0f / 60.0f;
    unsigned char* pixels = nullptr;
    int width = 0, height = 0;
    io.Fonts->GetTexDataAsRGBA32(&pixels, &width, &height);  // builds the font atlas NewFrame needs
    spec_.title = "test";
    spec_.x_label = "x";
    spec_.y_label = "y";
    PlotSeries line;
    line.label = "line";
    line.colour = series_colour(0);
    PlotSeries other = line;
    other.label = "other";
    other.dashed = true;
    for (int i = 0; i <= 100; ++i) {
      line.x.push_back(i);
      line.y.push_back(2.0 * i);
      other.x.push_back(i);
      other.y.push_back(100.0);
    }
    spec_.series = {line, other};
  }
  void TearDown() override { ImGui::DestroyContext(context_); }

  // One frame with the mouse at (x, y) and the given buttons and wheel.
  void frame(float x, float y, bool left = false, bool right = false, float wheel = 0.0f) {
    ImGuiIO& io = ImGui::GetIO();
    io.MousePos = ImVec2(x, y);
    io.MouseDown[0] = left;
    io.MouseDown[1] = right;
    io.MouseWheel = wheel;
    ImGui::NewFrame();
    ImGui::SetNextWindowPos(ImVec2(0, 0));
    ImGui::SetNextWindowSize(ImVec2(800, 600));
    ImGui::Begin("window", nullptr, ImGuiWindowFlags_NoTitleBar | ImGuiWindowFlags_NoMove | ImGuiWindowFlags_NoResize);
    draw_plot("plot", state_, spec_, ImVec2(plot_width, plot_height));
    ImGui::End();
    ImGui::Render();
  }
  // Clicks the legend's first entry. The legend sits right of the data area, level with its top; its first entry
  // is the first line of text in it.
  void click_first_legend_entry() {
    const float area_right = state_.export_request.x1 - 10.0f;
    const float area_top = state_.export_request.y0 + ImGui::GetTextLineHeight() + 6.0f;
    const float first_entry = area_top + 4.0f + ImGui::GetTextLineHeight() / 2.0f;
    frame(area_right - 12.0f, first_entry, true);
    frame(area_right - 12.0f, first_entry, false);
  }
  // The centre of the data area (the widget starts at the window padding).
  ImVec2 centre() const {
    return ImVec2((state_.export_request.x0 + state_.export_request.x1) / 2.0f,
                  (state_.export_request.y0 + state_.export_request.y1) / 2.0f);
  }

  ImGuiContext* context_ = nullptr;
  PlotSpec spec_;
  PlotState state_;
};

TEST_F(PlotWidgetTest, FitsTheDataAndRemembersItsRectangle) {
  frame(-100, -100);
  EXPECT_FALSE(state_.user_view);
  EXPECT_LT(state_.x.min, 0.0);
  EXPECT_GT(state_.x.max, 100.0);
  EXPECT_LT(state_.y.min, 0.0);
  EXPECT_GT(state_.y.max, 200.0);
  EXPECT_FLOAT_EQ(state_.export_request.x1 - state_.export_request.x0, plot_width);
  EXPECT_FLOAT_EQ(state_.export_request.y1 - state_.export_request.y0, plot_height);
  EXPECT_EQ(state_.export_request.name, "test");
  EXPECT_FALSE(state_.export_request.requested);
  // A fixed range (shared axes) wins over the data.
  spec_.y_range = AxisRange{-5.0, 5.0};
  frame(-100, -100);
  EXPECT_EQ(state_.y.min, -5.0);
  EXPECT_EQ(state_.y.max, 5.0);
}

TEST_F(PlotWidgetTest, WheelZoomsAndDoubleClickFitsAgain) {
  frame(-100, -100);
  const AxisRange fitted_x = state_.x, fitted_y = state_.y;
  const ImVec2 c = centre();
  frame(c.x, c.y, false, false, 1.0f);
  EXPECT_TRUE(state_.user_view);
  EXPECT_NEAR(state_.x.max - state_.x.min, 0.85 * (fitted_x.max - fitted_x.min), 1e-6 * fitted_x.max);
  EXPECT_NEAR(state_.y.max - state_.y.min, 0.85 * (fitted_y.max - fitted_y.min), 1e-6 * fitted_y.max);
  // The view stays where the user put it...
  frame(c.x, c.y);
  EXPECT_TRUE(state_.user_view);
  // ...until a double-click.
  frame(c.x, c.y, true);
  frame(c.x, c.y, false);
  frame(c.x, c.y, true);
  frame(c.x, c.y, false);
  EXPECT_FALSE(state_.user_view);
  EXPECT_DOUBLE_EQ(state_.x.min, fitted_x.min);
  EXPECT_DOUBLE_EQ(state_.x.max, fitted_x.max);
}

TEST_F(PlotWidgetTest, LeftDragPansAndRightDragZoomsToABox) {
  frame(-100, -100);
  const AxisRange fitted_x = state_.x;
  const ImVec2 c = centre();
  frame(c.x, c.y, true);
  for (int i = 1; i <= 10; ++i) frame(c.x + 6.0f * i, c.y, true);
  frame(c.x + 60.0f, c.y, false);
  EXPECT_TRUE(state_.user_view);
  // Dragging right brings smaller values into view, keeping the span.
  EXPECT_LT(state_.x.min, fitted_x.min);
  EXPECT_NEAR(state_.x.max - state_.x.min, fitted_x.max - fitted_x.min, 1e-9 * fitted_x.max);

  const AxisRange before_x = state_.x, before_y = state_.y;
  frame(c.x - 50, c.y - 50, false, true);
  frame(c.x, c.y, false, true);
  frame(c.x + 50, c.y + 50, false, true);
  frame(c.x + 50, c.y + 50, false, false);
  EXPECT_FALSE(state_.box_active);
  EXPECT_GT(state_.x.min, before_x.min);
  EXPECT_LT(state_.x.max, before_x.max);
  EXPECT_GT(state_.y.min, before_y.min);
  EXPECT_LT(state_.y.max, before_y.max);
}

TEST_F(PlotWidgetTest, TheLegendNeverCoversTheData) {
  frame(-100, -100);
  EXPECT_GT(state_.legend.width(), 0.0);
  EXPECT_GT(state_.legend.height(), 0.0);
  EXPECT_FALSE(overlaps(state_.legend, state_.area));
  EXPECT_GE(state_.legend.x0, state_.area.x1) << "beside the data, on its right";
  EXPECT_LE(state_.legend.x1, state_.export_request.x1);
  // Every point of the data lies inside the data area, which the legend leaves alone.
  const AxisTransform x(state_.x, AxisScale::linear, state_.area.x0, state_.area.x1);
  const AxisTransform y(state_.y, AxisScale::linear, state_.area.y1, state_.area.y0);
  for (const auto& series : spec_.series) {
    for (std::size_t i = 0; i < series.x.size(); ++i) {
      const double px = x.to_pixel(series.x[i]), py = y.to_pixel(series.y[i]);
      EXPECT_FALSE(px >= state_.legend.x0 && px <= state_.legend.x1 && py >= state_.legend.y0 && py <= state_.legend.y1)
          << series.label << " point " << i << " under the legend";
    }
  }
  // Without a legend the data area takes the room.
  const double with_legend = state_.area.width();
  spec_.legend = false;
  frame(-100, -100);
  EXPECT_GT(state_.area.width(), with_legend);
  EXPECT_EQ(state_.legend.width(), 0.0);
}

TEST_F(PlotWidgetTest, ClickingALegendEntryHidesAndShowsItsSeries) {
  frame(-100, -100);
  click_first_legend_entry();
  EXPECT_EQ(state_.hidden, (std::set<std::string>{"line"}));
  EXPECT_FALSE(state_.user_view) << "a legend click is not a pan";
  // Hidden series do not count when fitting: only the flat line at 100 is left.
  frame(-100, -100);
  EXPECT_GT(state_.y.min, 50.0);
  click_first_legend_entry();
  EXPECT_TRUE(state_.hidden.empty());
}

TEST_F(PlotWidgetTest, SeriesOfOneLegendNameShareAnEntryAndHideTogether) {
  for (auto& series : spec_.series) series.legend_name = "run";
  spec_.series[1].in_legend = false;  // e.g. the grid's profile at initialisation
  ASSERT_EQ(legend_entries(spec_).size(), 1u);
  EXPECT_EQ(legend_key(*legend_entries(spec_)[0]), "run");
  frame(-100, -100);
  click_first_legend_entry();
  EXPECT_EQ(state_.hidden, (std::set<std::string>{"run"}));
  // Both are hidden: nothing is left to fit, so the view falls back to the default range.
  frame(-100, -100);
  EXPECT_DOUBLE_EQ(state_.y.min, 0.0);
  EXPECT_DOUBLE_EQ(state_.y.max, 1.0);
}

TEST_F(PlotWidgetTest, PanelsSharingALegendSizeGetTheSameDataArea) {
  PlotSpec wide = spec_;
  wide.series[0].label = "a much longer label than any other";
  std::vector<PlotSpec*> panels = {&spec_, &wide};
  share_legend_size(panels);
  PlotState wide_state;
  frame(-100, -100);
  const PixelRect narrow_area = state_.area;
  std::swap(spec_, wide);
  std::swap(state_, wide_state);
  frame(-100, -100);
  EXPECT_DOUBLE_EQ(state_.area.width(), narrow_area.width());
  EXPECT_DOUBLE_EQ(state_.area.height(), narrow_area.height());
  // Without sharing, the panel with the short labels is laid out differently (its legend is narrower).
  std::swap(spec_, wide);
  std::swap(state_, wide_state);
  spec_.legend_peer_labels.clear();
  spec_.legend_peer_lines = 0;
  frame(-100, -100);
  EXPECT_FALSE(state_.area.width() == narrow_area.width() && state_.area.height() == narrow_area.height());
}

TEST(PlotImage, HeatmapPixelsAndPng) {
  HeatmapSpec spec;
  spec.rows = 2;
  spec.columns = 3;
  spec.values = {1, 2, 3, 4, 5, 6};  // row 0 (bottom) = 1 2 3, row 1 (top) = 4 5 6
  const auto rgba = heatmap_rgba(spec);
  ASSERT_EQ(rgba.size(), 2u * 3u * 4u);
  const auto low = viridis(0.0), high = viridis(1.0);
  // Image row 0 is the top row (spec row 1): its last pixel is the largest value.
  EXPECT_EQ(rgba[(0 * 3 + 2) * 4 + 0], static_cast<unsigned char>(std::lround(high[0] * 255)));
  // Image row 1, first pixel: the smallest.
  EXPECT_EQ(rgba[(1 * 3 + 0) * 4 + 1], static_cast<unsigned char>(std::lround(low[1] * 255)));
  EXPECT_EQ(rgba[3], 255);
  spec.values.pop_back();
  EXPECT_TRUE(heatmap_rgba(spec).empty());

  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("proplab_plot_" + std::to_string(getpid()) + ".png");
  ASSERT_TRUE(write_png(path.string(), 3, 2, rgba));
  int width = 0, height = 0, channels = 0;
  unsigned char* read = stbi_load(path.c_str(), &width, &height, &channels, 4);
  ASSERT_NE(read, nullptr);
  EXPECT_EQ(width, 3);
  EXPECT_EQ(height, 2);
  EXPECT_TRUE(std::equal(rgba.begin(), rgba.end(), read));
  stbi_image_free(read);
  std::filesystem::remove(path);
  EXPECT_FALSE(write_png((path.parent_path() / "no" / "such" / "dir.png").string(), 3, 2, rgba));
  EXPECT_FALSE(write_png(path.string(), 4, 2, rgba)) << "size mismatch";
}

// "Save as PNG" in a plot's menu: the app reads the plot back from the framebuffer a frame later and writes it
// off the frame thread (here through the headless renderer, as the windowed app does with its back buffer).
TEST(PlotExport, WritesTheRequestedPlotAsAPng) {
  gui_test::ScratchDirectory dir;
  SyntheticRunSpec spec;
  write_synthetic_run(dir / "runs" / "a.h5", spec);
  AppState state;
  state.library = std::make_unique<RunLibrary>(std::vector<std::filesystem::path>{dir / "runs"},
                                               RunLibraryOptions{1.0, 1.0, false});
  state.library->update_now();
  state.single_view = true;
  state.export_directory = dir.path();
  HeadlessRenderer renderer(640, 400);
  renderer.render_frame(state);
  ExportRequest& request = state.plots["depth"].export_request;
  request.requested = true;
  process_exports(state, 640, 400);  // the asking frame: only arms
  EXPECT_TRUE(state.exports.empty());
  renderer.render_frame(state);
  process_exports(state, 640, 400);
  ASSERT_EQ(state.exports.size(), 1u);
  state.exports.front().wait();
  process_exports(state, 640, 400);  // collects the finished write
  EXPECT_TRUE(state.exports.empty());
  EXPECT_EQ(state.status_message.rfind("saved ", 0), 0u) << state.status_message;
  const std::filesystem::path written = state.status_message.substr(6);
  int width = 0, height = 0, channels = 0;
  unsigned char* pixels = stbi_load(written.c_str(), &width, &height, &channels, 3);
  ASSERT_NE(pixels, nullptr) << written;
  EXPECT_EQ(width, static_cast<int>(std::lround(request.x1 - request.x0)));
  EXPECT_EQ(height, static_cast<int>(std::lround(request.y1 - request.y0)));
  // The first run's colour is in the exported plot.
  const auto colour = series_rgb(0);
  int matches = 0;
  for (int i = 0; i < width * height; ++i) {
    matches += std::abs(pixels[3 * i] - colour[0]) < 8 && std::abs(pixels[3 * i + 1] - colour[1]) < 8 &&
               std::abs(pixels[3 * i + 2] - colour[2]) < 8;
  }
  stbi_image_free(pixels);
  EXPECT_GT(matches, 100);
  release_gpu_resources(state);
}

}  // namespace
}  // namespace proplab::gui

#endif
