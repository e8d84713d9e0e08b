// proplab-gui run as a child process: headless screenshots of every view (EGL surfaceless, no display server),
// bad input, and the windowed app under Xvfb. Skipped, with a message, when the GUI app is not built.
#include <gtest/gtest.h>

#ifdef PROPLAB_GUI_BINARY

#include <array>
#include <cstdlib>
#include <set>

#include "cli/cli_test_support.h"
#include "gui/data/synthetic_run.h"
#include "gui/plot/plot_math.h"
#include "gui_resnet_study.h"
#include "support/png_lines.h"

namespace proplab::gui {
namespace {

namespace fs = std::filesystem;
using RGB = test_png::Rgb;
using Image = test_png::RgbImage;
using test_png::count_colour;
using test_png::distinct_colours;
using test_png::near;

// The most separate horizontal runs (>= 3 pixels each) of `colour` in any one row: a dashed horizontal line
// gives many, a solid curve crossing a row only one or two.
int most_dashes_in_a_row(const Image& image, const RGB& colour) {
  int best = 0;
  for (int y = 0; y < image.height; ++y) {
    int dashes = 0, run = 0;
    for (int x = 0; x <= image.width; ++x) {
      if (x < image.width && near(image.at(x, y), colour)) {
        ++run;
      } else {
        if (run >= 3) ++dashes;
        run = 0;
      }
    }
    best = std::max(best, dashes);
  }
  return best;
}

RGB colour_of(std::size_t index) { return series_rgb(index); }

class GuiScreenshotTest : public cli_test::CliTest {
 protected:
  // Not CliTest::SetUp: these tests run proplab-gui, not proplab (PROPLAB_BINARY).
  void SetUp() override {
    gui_ = PROPLAB_GUI_BINARY;
    ASSERT_TRUE(fs::is_regular_file(gui_)) << gui_ << " is not built";
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    base_ = fs::temp_directory_path() / ("proplab_gui_" + std::to_string(getpid()) + "_" + info->name());
    fs::remove_all(base_);
    work_ = base_ / "work";
    capture_ = base_ / "capture";
    fs::create_directories(work_);
    fs::create_directories(capture_);
  }

  // Two runs under different rules: "pre" grows with depth (theory: a flat line at 5), "dslm" stays flat
  // (theory: a flat line at 0.7). The GUI selects them in path order, so a.h5 gets colour 0 and b.h5 colour 1.
  void write_two_runs() {
    SyntheticRunSpec grows;
    grows.name = "a_pre_standard";
    grows.rule = "standard";
    grows.layers = 3;
    grows.records = 4;
    grows.depth_slope = 0.5;
    grows.theory_constant = 5.0;
    write_synthetic_run(work_ / "runs" / "a.h5", grows);
    SyntheticRunSpec flat = grows;
    flat.name = "b_deepscalelm";
    flat.rule = "deepscalelm";
    flat.depth_slope = 0.02;
    flat.theory_constant = 0.7;
    write_synthetic_run(work_ / "runs" / "nested" / "b.h5", flat);
  }

  cli_test::CliResult screenshot(const std::string& name, std::vector<std::string> extra) {
    std::vector<std::string> args = {"--screenshot", (work_ / name).string(), "--size", "640x400"};
    args.insert(args.end(), extra.begin(), extra.end());
    return run_program(gui_, args);
  }

  // Produced, of the requested size, and not blank.
  Image expect_image(const std::string& name, const cli_test::CliResult& result) {
    EXPECT_EQ(result.exit_code, 0) << describe(result);
    const Image image = test_png::load_rgb(work_ / name);
    EXPECT_EQ(image.width, 640) << name;
    EXPECT_EQ(image.height, 400) << name;
    if (image.rgb.empty()) return image;
    EXPECT_GT(distinct_colours(image), 30u) << name << " looks blank";
    return image;
  }

  fs::path gui_;
};

TEST_F(GuiScreenshotTest, DepthProfileShowsBothRulesAndTheDashedTheory) {
  write_two_runs();
  const auto result = screenshot("depth.png", {(work_ / "runs").string()});
  EXPECT_NE(result.out.find("2 runs"), std::string::npos) << describe(result);
  const Image image = expect_image("depth.png", result);
  ASSERT_FALSE(image.rgb.empty());
  EXPECT_GT(count_colour(image, colour_of(0)), 200u) << "the first run's colour is missing";
  EXPECT_GT(count_colour(image, colour_of(1)), 200u) << "the second run's colour is missing";
  EXPECT_FALSE(near(colour_of(0), colour_of(1), 40));
  // Each run's theory is a flat dashed line in its own colour.
  EXPECT_GE(most_dashes_in_a_row(image, colour_of(0)), 10);
  EXPECT_GE(most_dashes_in_a_row(image, colour_of(1)), 10);

  // Without the theory (forward rms has no prediction) there are no dashes.
  const auto rms = screenshot("rms.png", {"--stat", "rms", (work_ / "runs").string()});
  const Image plain = expect_image("rms.png", rms);
  ASSERT_FALSE(plain.rgb.empty());
  EXPECT_LT(most_dashes_in_a_row(plain, colour_of(0)), 4);
}

// The gradients' prediction is drawn as the forward one is: a dashed line in each run's colour.
TEST_F(GuiScreenshotTest, BackwardDepthProfileShowsTheDashedTheory) {
  write_two_runs();
  const auto result = screenshot("backward.png", {"--backward", (work_ / "runs").string()});
  const Image image = expect_image("backward.png", result);
  ASSERT_FALSE(image.rgb.empty());
  EXPECT_GE(most_dashes_in_a_row(image, colour_of(0)), 10);
  EXPECT_GE(most_dashes_in_a_row(image, colour_of(1)), 10);
}

// The depth axis and the kinds on the command line (`--x`, `--kinds`), and their mistakes.
TEST_F(GuiScreenshotTest, DepthAxisAndKindsOptions) {
  write_two_runs();
  for (const std::string axis : {"block", "depth", "probe"}) {
    SCOPED_TRACE(axis);
    const auto result =
        screenshot("x_" + axis + ".png", {"--x", axis, "--kinds", "residual,branch", (work_ / "runs").string()});
    const Image image = expect_image("x_" + axis + ".png", result);
    if (image.rgb.empty()) continue;
    EXPECT_GT(count_colour(image, colour_of(0)), 100u);
    EXPECT_GT(count_colour(image, colour_of(1)), 100u);
  }
  const auto all = screenshot("all.png", {"--kinds", "all", "--view", "compare", (work_ / "runs").string()});
  expect_image("all.png", all);
  const auto axis = screenshot("noaxis.png", {"--x", "sideways", (work_ / "runs").string()});
  EXPECT_EQ(axis.exit_code, 2) << describe(axis);
  EXPECT_NE(axis.err.find("block, depth (l/L) or probe"), std::string::npos) << describe(axis);
  EXPECT_FALSE(fs::exists(work_ / "noaxis.png"));
  const auto kinds = screenshot("nokinds.png", {"--kinds", "residual,resid", (work_ / "runs").string()});
  EXPECT_EQ(kinds.exit_code, 2) << describe(kinds);
  EXPECT_NE(kinds.err.find("unknown probe kind 'resid'"), std::string::npos) << describe(kinds);
  EXPECT_FALSE(fs::exists(work_ / "nokinds.png"));
}

TEST_F(GuiScreenshotTest, EveryViewRendersHeadless) {
  write_two_runs();
  for (const std::string view : {"dynamics", "compare", "grid"}) {
    SCOPED_TRACE(view);
    const auto result = screenshot(view + ".png", {"--view", view, (work_ / "runs").string()});
    const Image image = expect_image(view + ".png", result);
    if (image.rgb.empty()) continue;
    EXPECT_GT(count_colour(image, colour_of(0)), 100u);
    EXPECT_GT(count_colour(image, colour_of(1)), 100u);
  }
  const auto heatmap = screenshot("heatmap.png", {"--view", "heatmap", "--backward", (work_ / "runs").string()});
  const Image image = expect_image("heatmap.png", heatmap);
  ASSERT_FALSE(image.rgb.empty());
  // Both ends of the viridis map: the smallest and the largest value, in cells and in the colour bar.
  const auto low = viridis(0.0), high = viridis(1.0);
  const RGB low_rgb = {static_cast<unsigned char>(low[0] * 255), static_cast<unsigned char>(low[1] * 255),
                       static_cast<unsigned char>(low[2] * 255)};
  const RGB high_rgb = {static_cast<unsigned char>(high[0] * 255), static_cast<unsigned char>(high[1] * 255),
                        static_cast<unsigned char>(high[2] * 255)};
  EXPECT_GT(count_colour(image, low_rgb), 100u);
  EXPECT_GT(count_colour(image, high_rgb), 100u);
}

TEST_F(GuiScreenshotTest, BadInputIsAMessageNotACrash) {
  write_two_runs();
  std::ofstream(work_ / "runs" / "garbage.h5") << "not hdf5";
  fs::create_directories(work_ / "empty");
  const auto result = screenshot("mixed.png", {(work_ / "runs").string(), (work_ / "empty").string()});
  const Image image = expect_image("mixed.png", result);
  EXPECT_NE(result.err.find("garbage.h5"), std::string::npos) << describe(result);
  EXPECT_NE(result.err.find("holds no run files"), std::string::npos) << describe(result);
  EXPECT_GT(count_colour(image, colour_of(0)), 100u) << "the good runs must still be drawn";

  // Command-line mistakes: exit 2, a message, no PNG.
  const auto stat = screenshot("nostat.png", {"--stat", "nonsense", (work_ / "runs").string()});
  EXPECT_EQ(stat.exit_code, 2) << describe(stat);
  EXPECT_NE(stat.err.find("recorded: rms, var"), std::string::npos) << describe(stat);
  EXPECT_FALSE(fs::exists(work_ / "nostat.png"));
  const auto view = screenshot("noview.png", {"--view", "sideways", (work_ / "runs").string()});
  EXPECT_EQ(view.exit_code, 2) << describe(view);
  EXPECT_NE(view.err.find("depth, dynamics, heatmap, compare or grid"), std::string::npos) << describe(view);
  const auto frames = run_program(gui_, {"--frames", "many"});
  EXPECT_EQ(frames.exit_code, 2) << describe(frames);
  const auto size = run_program(gui_, {"--screenshot", (work_ / "size.png").string(), "--size", "huge"});
  EXPECT_EQ(size.exit_code, 2) << describe(size);
  EXPECT_FALSE(fs::exists(work_ / "size.png"));
}

// The example runs docs/gui.md shows (real `proplab run` output) stay readable and render, each in its colour.
TEST_F(GuiScreenshotTest, ShippedExampleRunsRender) {
  const char* source = std::getenv("PROPLAB_SOURCE_DIR");
  ASSERT_NE(source, nullptr) << "PROPLAB_SOURCE_DIR is not set: run through ctest";
  const fs::path runs = fs::path(source) / "docs" / "examples" / "gui-runs";
  for (const std::string view : {"depth", "heatmap"}) {
    SCOPED_TRACE(view);
    const auto result = screenshot(view + ".png", {"--view", view, "--kind", "residual", runs.string()});
    EXPECT_NE(result.out.find("3 runs"), std::string::npos) << describe(result);
    // No bad-input message (the graphics driver may print its own notes: those are not ours to judge).
    EXPECT_EQ(result.err.find("proplab-gui:"), std::string::npos) << describe(result);
    const Image image = expect_image(view + ".png", result);
    if (view == "depth" && !image.rgb.empty()) {
      for (std::size_t run = 0; run < 3; ++run) EXPECT_GT(count_colour(image, colour_of(run)), 100u) << run;
    }
  }
}

// A real ResNet run (`proplab run`, 6 blocks, transitions at blocks 2 and 4) is drawn by block: the depth profile has
// one dashed vertical line in the marker colour at each transition and the labels "stage 1/2/3" at the bottom of
// each stage; the heatmap a dashed horizontal line at the row where each of stages 2 and 3 begins. A transformer run
// has no markers.
TEST_F(GuiScreenshotTest, ResnetStagesAreMarkedByBlock) {
  const char* proplab = std::getenv("PROPLAB_BINARY");
  ASSERT_NE(proplab, nullptr) << "PROPLAB_BINARY is not set: run through ctest";
  std::ofstream(work_ / "resnet.toml") << gui_test::kTinyResnetStudy;
  const auto trained = run_program(proplab, {"run", "resnet.toml", "--out", "resnet"});
  ASSERT_EQ(trained.exit_code, 0) << describe(trained);
  const test_png::Rgb marker = marker_rgb();

  // Depth profile of the residual stream: blocks.0.in at x = 0 ... blocks.5.out at x = 6, fitted with 2% padding.
  const auto depth = screenshot("resnet_depth.png", {"--kind", "residual", (work_ / "resnet").string()});
  ASSERT_EQ(depth.exit_code, 0) << describe(depth);
  const auto image = test_png::load_rgb(work_ / "resnet_depth.png");
  ASSERT_EQ(image.width, 640);
  const auto frame = test_png::find_frame(image, 0, image.width, 0, image.height);
  ASSERT_TRUE(frame.found);
  const std::vector<double> ends = {0.0, 6.0};
  const AxisRange range = fit_range({{ends.data(), ends.size()}}, AxisScale::linear, 0.02);
  const auto x_of = [&](double block) {
    return frame.left + (block - range.min) / (range.max - range.min) * (frame.right - frame.left);
  };
  const int area_height = static_cast<int>(frame.bottom - frame.top);
  const auto lines =
      test_png::column_lines(image, marker, static_cast<int>(frame.left) + 2, static_cast<int>(frame.right) - 1,
                             static_cast<int>(frame.top), static_cast<int>(frame.bottom), area_height * 35 / 100);
  ASSERT_EQ(lines.size(), 2u) << "one dashed line per transition";
  EXPECT_NEAR(lines[0], x_of(2.0), 2.5);
  EXPECT_NEAR(lines[1], x_of(4.0), 2.5);
  // Each stage's label (text in the marker colour) in the bottom line of the plot, between its start and the next.
  const int label_bottom = static_cast<int>(frame.bottom), label_top = label_bottom - 20;
  const double starts[] = {x_of(0.0), x_of(2.0), x_of(4.0), frame.right};
  for (int s = 0; s < 3; ++s) {
    EXPECT_GT(test_png::count_in(image, marker, static_cast<int>(starts[s]) + 3, static_cast<int>(starts[s + 1]) - 1,
                                 label_top, label_bottom),
              10)
        << "no label for stage " << s + 1;
  }

  // Heatmap of every probe: 20 rows (stem, 6 × 3, logits); stage 2 begins at row 7 and stage 3 at row 13.
  const auto heatmap = screenshot("resnet_heatmap.png", {"--view", "heatmap", (work_ / "resnet").string()});
  ASSERT_EQ(heatmap.exit_code, 0) << describe(heatmap);
  const auto cells = test_png::load_rgb(work_ / "resnet_heatmap.png");
  ASSERT_EQ(cells.width, 640);
  const auto area = test_png::find_filled_area(cells, cells.width * 3 / 10, cells.height / 2);
  ASSERT_TRUE(area.found);
  const auto marker_rows = test_png::row_lines(
      cells, marker, static_cast<int>(area.left) + 2, static_cast<int>(area.right) - 1, static_cast<int>(area.top) + 2,
      static_cast<int>(area.bottom) - 1, static_cast<int>((area.right - area.left) * 0.35));
  const auto y_of = [&](double row) { return area.bottom - row / 20.0 * (area.bottom - area.top); };
  ASSERT_EQ(marker_rows.size(), 2u) << "one dashed line per transition";
  EXPECT_NEAR(marker_rows[0], y_of(13.0), 2.5);
  EXPECT_NEAR(marker_rows[1], y_of(7.0), 2.5);

  // A transformer run has no stages: no marker lines.
  write_two_runs();
  const auto plain = screenshot("plain.png", {(work_ / "runs" / "a.h5").string()});
  ASSERT_EQ(plain.exit_code, 0) << describe(plain);
  const auto lm = test_png::load_rgb(work_ / "plain.png");
  EXPECT_TRUE(test_png::column_lines(lm, marker, 0, lm.width, 0, lm.height, lm.height / 5).empty());
}

// Where xvfb-run is on PATH, or empty.
fs::path find_on_path(const std::string& program) {
  const char* path = std::getenv("PATH");
  std::string entries = path ? path : "/usr/bin:/bin";
  std::size_t start = 0;
  while (start <= entries.size()) {
    const std::size_t end = std::min(entries.find(':', start), entries.size());
    const fs::path candidate = fs::path(entries.substr(start, end - start)) / program;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return {};
}

TEST_F(GuiScreenshotTest, StartsShowsARunAndQuitsUnderXvfb) {
  const fs::path xvfb_run = find_on_path("xvfb-run");
  if (xvfb_run.empty()) GTEST_SKIP() << "xvfb-run is not installed (Debian: xvfb xauth)";
  write_two_runs();
  const auto result = run_program(xvfb_run, {"-a", "-s", "-screen 0 1024x768x24", gui_.string(), "--frames", "5",
                                             "--size", "1024x700", (work_ / "runs" / "a.h5").string()});
  EXPECT_EQ(result.exit_code, 0) << describe(result);
  EXPECT_NE(result.out.find("closed after 5 frames with 1 runs, 1 shown; window 1024x700"), std::string::npos)
      << describe(result);
}

// Without --size the window fills the screen's work area (under Xvfb without a window manager: the whole screen).
TEST_F(GuiScreenshotTest, WindowFillsTheWorkAreaUnderXvfb) {
  const fs::path xvfb_run = find_on_path("xvfb-run");
  if (xvfb_run.empty()) GTEST_SKIP() << "xvfb-run is not installed (Debian: xvfb xauth)";
  write_two_runs();
  const auto result = run_program(xvfb_run, {"-a", "-s", "-screen 0 1152x720x24", gui_.string(), "--frames", "3",
                                             (work_ / "runs" / "a.h5").string()});
  EXPECT_EQ(result.exit_code, 0) << describe(result);
  EXPECT_NE(result.out.find("window 1152x720"), std::string::npos) << describe(result);
}

}  // namespace
}  // namespace proplab::gui

#else

TEST(GuiScreenshot, NeedsTheGuiApp) {
  GTEST_SKIP() << "proplab-gui is not built (PROPLAB_GUI=OFF or imgui/glfw3/EGL missing): no screenshot tests";
}

#endif
