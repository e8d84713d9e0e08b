// The grid view's panels (gui/app/plot_specs: grid_key, grid_panels), GL-free: two rows (forward and backward var)
// by one column per value of the grouping key, every run at initialisation and at its last record, shared y ranges
// per row. The exported grid (SVG, CSV) is checked in test_export.cpp.
#include <gtest/gtest.h>

#ifdef PROPLAB_GUI_BINARY

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "gui/app/app_state.h"
#include "gui/app/plot_specs.h"
#include "gui/data/synthetic_run.h"

namespace proplab::gui {
namespace {

namespace fs = std::filesystem;

class GuiGridTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("proplab_grid_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A synthetic 3-layer transformer run of 3 records (steps 0, 10, 20).
  std::shared_ptr<const RunSnapshot> run(const std::string& name, const std::string& rule, const std::string& norm) {
    SyntheticRunSpec spec;
    spec.name = name;
    spec.rule = rule;
    spec.norm = norm;
    spec.layers = 3;
    spec.records = 3;
    specs_.push_back(spec);
    write_synthetic_run(dir_ / (name + ".h5"), spec);
    auto loaded = load_run_snapshot(dir_ / (name + ".h5"));
    EXPECT_TRUE(loaded->ok()) << loaded->error;
    return loaded;
  }

  // Pre-LN standard, Post-LN standard and Pre-LN deepscalelm: two scaling rules, two norms.
  RunList sweep() {
    return {run("pre_standard", "standard", "pre"), run("post_standard", "standard", "post"),
            run("pre_deepscalelm", "deepscalelm", "pre")};
  }

  static AppState state_with(const RunList& runs) {
    AppState state;
    for (const auto& r : runs) state.selection.push_back(r->path);
    state.library_state.runs = runs;
    sync_selection(state);
    return state;
  }

  fs::path dir_;
  std::vector<SyntheticRunSpec> specs_;
};

TEST_F(GuiGridTest, TwoRowsByTheScalingRulesWithInitAndLastRecordOfEveryRun) {
  const RunList runs = sweep();
  const AppState state = state_with(runs);
  EXPECT_EQ(grid_key(state, runs), "scaling.rule");
  const GridPanels grid = grid_panels(state, runs);
  EXPECT_EQ(grid.key, "scaling.rule");
  ASSERT_EQ(grid.values, (std::vector<std::string>{"deepscalelm", "standard"}));
  ASSERT_EQ(grid.columns(), 2);
  ASSERT_EQ(grid.plots.size(), 4u);
  EXPECT_EQ(grid.row_titles, (std::vector<std::string>{"forward var", "backward var"}));
  EXPECT_EQ(grid.column_titles, (std::vector<std::string>{"scaling.rule = deepscalelm", "scaling.rule = standard"}));
  // Column titles on the top row; the row's statistic as every panel's y title.
  EXPECT_EQ(grid.plots[0].title, "scaling.rule = deepscalelm");
  EXPECT_EQ(grid.plots[1].title, "scaling.rule = standard");
  for (int row = 0; row < 2; ++row) {
    for (int column = 0; column < 2; ++column) {
      const PlotSpec& spec = grid.plots[static_cast<std::size_t>(row * 2 + column)];
      SCOPED_TRACE(grid_panel_name(row, grid.values[static_cast<std::size_t>(column)]));
      EXPECT_EQ(spec.y_label, row == 0 ? "forward var" : "backward var");
      EXPECT_EQ(spec.x_label, "block");
      EXPECT_EQ(spec.y_scale, AxisScale::log);
      // Two series per run of the column: init (dashed, thin) and the last record (solid).
      ASSERT_EQ(spec.series.size(), column == 0 ? 2u : 4u);
      for (std::size_t s = 0; s < spec.series.size(); s += 2) {
        const PlotSeries& init = spec.series[s];
        const PlotSeries& last = spec.series[s + 1];
        EXPECT_EQ(init.run, last.run);
        EXPECT_EQ(init.label, init.run + " (init)");
        EXPECT_EQ(last.label, last.run + " (step 20)");
        EXPECT_TRUE(init.dashed);
        EXPECT_FALSE(last.dashed);
        EXPECT_LT(init.thickness, last.thickness);
        // The residual stream (each block's mid and out), the values the synthetic run wrote.
        const SyntheticRunSpec& spec_of_run =
            *std::find_if(specs_.begin(), specs_.end(), [&](const auto& s) { return s.name == init.run; });
        ASSERT_EQ(init.x.size(), last.x.size());
        ASSERT_FALSE(init.x.empty());
        const RunSnapshot& file =
            **std::find_if(runs.begin(), runs.end(), [&](const auto& r) { return r->name == init.run; });
        for (std::size_t i = 0; i < init.x.size(); ++i) {
          const auto p = static_cast<std::int64_t>(
              std::find_if(file.probes.begin(), file.probes.end(),
                           [&](const ProbeInfo& probe) { return probe.name == init.point_probes[i]; }) -
              file.probes.begin());
          const double at_init =
              row == 0 ? synthetic_forward_value(spec_of_run, p, 0) : synthetic_backward_value(spec_of_run, p, 0);
          const double at_last =
              row == 0 ? synthetic_forward_value(spec_of_run, p, 2) : synthetic_backward_value(spec_of_run, p, 2);
          EXPECT_DOUBLE_EQ(init.y[i], at_init) << init.point_probes[i];
          EXPECT_DOUBLE_EQ(last.y[i], at_last) << init.point_probes[i];
        }
      }
    }
  }
  // The post_standard run, the deepscalelm one: their colours follow the selection (1 and 2), in either row.
  EXPECT_EQ(grid.plots[0].series[1].colour, series_colour(2));
  EXPECT_EQ(grid.plots[3].series[3].colour, series_colour(1));
  // One y range per row, one x range for all.
  ASSERT_TRUE(grid.plots[0].y_range && grid.plots[1].y_range && grid.plots[2].y_range);
  EXPECT_EQ(grid.plots[0].y_range->min, grid.plots[1].y_range->min);
  EXPECT_EQ(grid.plots[0].y_range->max, grid.plots[1].y_range->max);
  EXPECT_EQ(grid.plots[2].y_range->max, grid.plots[3].y_range->max);
  EXPECT_EQ(grid.plots[0].x_range->max, grid.plots[3].x_range->max);
}

TEST_F(GuiGridTest, ColumnsFollowTheChosenKeyElseAKeyThatDiffers) {
  RunList runs = sweep();
  AppState state = state_with(runs);
  state.compare_key = "model.norm";
  state.compare_key_chosen = true;
  GridPanels grid = grid_panels(state, runs);
  EXPECT_EQ(grid.values, (std::vector<std::string>{"post", "pre"}));
  EXPECT_EQ(grid.plots.size(), 4u);

  // The same rule everywhere: the norm, which differs, makes the columns.
  runs = {run("a", "standard", "pre"), run("b", "standard", "post")};
  state = state_with(runs);
  EXPECT_EQ(grid_key(state, runs), "model.norm");
  EXPECT_EQ(grid_panels(state, runs).column_titles,
            (std::vector<std::string>{"model.norm = post", "model.norm = pre"}));

  // One run: one column of it.
  runs = {run("c", "standard", "pre")};
  state = state_with(runs);
  EXPECT_EQ(grid_key(state, runs), "");
  grid = grid_panels(state, runs);
  ASSERT_EQ(grid.columns(), 1);
  EXPECT_EQ(grid.column_titles.front(), "all runs");
  EXPECT_EQ(grid.plots.size(), 2u);
  EXPECT_EQ(grid.plots[1].series.size(), 2u);
}

}  // namespace
}  // namespace proplab::gui

#else

TEST(GuiGridTest, SkippedWithoutTheGuiApp) { GTEST_SKIP() << "proplab-gui is not built (PROPLAB_GUI off)"; }

#endif
