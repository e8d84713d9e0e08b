// Probe depth by block (gui/data/block_axis): the stage layout read back from a real ResNet run file that `proplab
// run` wrote, the probes' block-axis positions, where stages begin (by block and by heatmap row), runs without
// stages and malformed layouts; and the plot maths that places the markers and their labels (plot_math).
#include <gtest/gtest.h>

#include <cmath>

#include "cli/cli_test_support.h"
#include "gui/data/block_axis.h"
#include "gui/data/run_data.h"
#include "gui/data/synthetic_run.h"
#include "gui/plot/plot_math.h"
#include "gui_resnet_study.h"
#include "gui_test_support.h"
#include "io/run_file.h"

namespace proplab::gui {
namespace {

namespace fs = std::filesystem;

class BlockAxisRunTest : public cli_test::CliTest {};

TEST_F(BlockAxisRunTest, ResnetRunFileFromProplabRunShowsItsStages) {
  write_file("study.toml", gui_test::kTinyResnetStudy);
  const auto result = run({"run", "study.toml", "--out", "runs"});
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  const auto run = load_run_snapshot(work_ / "runs" / "stages.h5");
  ASSERT_TRUE(run->ok()) << run->error;
  ASSERT_TRUE(has_block_axis(*run));
  ASSERT_EQ(run->blocks.size(), 6u);
  const std::vector<std::int64_t> stages = {0, 0, 1, 1, 2, 2};
  const std::vector<bool> transitions = {false, false, true, false, true, false};
  for (std::size_t b = 0; b < 6; ++b) {
    EXPECT_EQ(run->blocks[b].stage, stages[b]) << b;
    EXPECT_EQ(run->blocks[b].transition, transitions[b]) << b;
  }

  // stem.out, 6 × (in, branch, out), head.logits: in at b, branch at b + 1/2, out at b + 1.
  ASSERT_EQ(run->probes.size(), 20u);
  const std::vector<double> x = block_axis_positions(run->probes);
  EXPECT_EQ(run->probes.front().name, "stem.out");
  EXPECT_DOUBLE_EQ(x.front(), -0.5);
  for (std::int64_t b = 0; b < 6; ++b) {
    const std::size_t in = 1 + 3 * static_cast<std::size_t>(b);
    EXPECT_EQ(run->probes[in].name, "blocks." + std::to_string(b) + ".in");
    EXPECT_DOUBLE_EQ(x[in], static_cast<double>(b));
    EXPECT_DOUBLE_EQ(x[in + 1], b + 0.5);
    EXPECT_DOUBLE_EQ(x[in + 2], b + 1.0);
  }
  EXPECT_EQ(run->probes.back().name, "head.logits");
  EXPECT_DOUBLE_EQ(x.back(), 6.5);

  const auto starts = stage_starts(run->blocks);
  ASSERT_EQ(starts.size(), 3u);
  for (std::size_t s = 0; s < 3; ++s) {
    EXPECT_EQ(starts[s].stage, static_cast<std::int64_t>(s));
    EXPECT_DOUBLE_EQ(starts[s].position, 2.0 * static_cast<double>(s));
    EXPECT_EQ(starts[s].transition, s > 0);
  }
  EXPECT_EQ(stage_label(starts[2].stage), "stage 3");

  // Heatmap rows, every probe: stage 1 begins at row 1 (blocks.0.in, after the stem), 2 at 7, 3 at 13.
  const auto every = probes_of_kind(run->probes, "");
  const auto row_starts = stage_starts_in_rows(run->probes, run->blocks, every);
  ASSERT_EQ(row_starts.size(), 3u);
  EXPECT_DOUBLE_EQ(row_starts[0].position, 1.0);
  EXPECT_DOUBLE_EQ(row_starts[1].position, 7.0);
  EXPECT_DOUBLE_EQ(row_starts[2].position, 13.0);
  EXPECT_FALSE(row_starts[0].transition);
  EXPECT_TRUE(row_starts[1].transition && row_starts[2].transition);
  // Only the residual stream (in, out per block): two rows per block.
  const auto residual = probes_of_kind(run->probes, "residual");
  ASSERT_EQ(residual.size(), 12u);
  const auto residual_starts = stage_starts_in_rows(run->probes, run->blocks, residual);
  ASSERT_EQ(residual_starts.size(), 3u);
  EXPECT_DOUBLE_EQ(residual_starts[1].position, 4.0);
  EXPECT_DOUBLE_EQ(residual_starts[2].position, 8.0);
  const auto rows = block_rows(run->probes, residual);
  ASSERT_EQ(rows.size(), 6u);
  EXPECT_EQ(rows[3].block, 3);
  EXPECT_EQ(rows[3].first, 6u);
  EXPECT_EQ(rows[3].end, 8u);
}

TEST(BlockAxis, RunsWithoutStagesKeepProbeDepth) {
  gui_test::ScratchDirectory dir;
  SyntheticRunSpec spec;
  spec.layers = 2;
  write_synthetic_run(dir / "lm.h5", spec);
  const auto run = load_run_snapshot(dir / "lm.h5");
  ASSERT_TRUE(run->ok()) << run->error;
  EXPECT_FALSE(has_block_axis(*run));
  EXPECT_TRUE(stage_starts(run->blocks).empty());
  // Without any probe in a block the positions are the probe indices.
  std::vector<ProbeInfo> loose(3);
  EXPECT_EQ(block_axis_positions(loose), (std::vector<double>{0.0, 1.0, 2.0}));
  // A block of one probe holds it in its middle; the probes after the last block keep its spacing.
  std::vector<ProbeInfo> single(4);
  single[0].block = 0;
  single[1].block = 1;
  single[2].block = -1;
  single[3].block = -1;
  EXPECT_EQ(block_axis_positions(single), (std::vector<double>{0.5, 1.5, 2.5, 3.0}));
}

// Writes a run file whose probes are in blocks 0..2 and whose /blocks is `stages` / `transitions`.
fs::path write_layout_file(const fs::path& path, const std::vector<std::int64_t>& stages,
                           const std::vector<std::int64_t>& transitions) {
  RunHeader header;
  header.proplab_version = "test";
  header.config = "name = \"layout\"\n";
  RunWriter writer = RunWriter::create(path, header, true);
  writer.write_strings("/probes/name", {"blocks.0.out", "blocks.1.out", "blocks.2.out"});
  writer.write_ints("/probes/depth", {0, 1, 2});
  writer.write_ints("/probes/block", {0, 1, 2});
  writer.write_strings("/probes/kind", {"residual", "residual", "residual"});
  writer.write_ints("/blocks/stage", stages);
  writer.write_ints("/blocks/transition", transitions);
  writer.start();
  writer.finish(RunStatus::completed, "");
  return path;
}

TEST(BlockAxis, AMalformedOrShortLayoutIsLeftOutAndTheRunStillShown) {
  gui_test::ScratchDirectory dir;
  const auto good = load_run_snapshot(write_layout_file(dir / "good.h5", {0, 1, 2}, {0, 1, 1}));
  ASSERT_TRUE(good->ok()) << good->error;
  EXPECT_EQ(good->blocks.size(), 3u);
  const auto lengths = load_run_snapshot(write_layout_file(dir / "lengths.h5", {0, 1, 2}, {0, 1}));
  ASSERT_TRUE(lengths->ok()) << lengths->error;
  EXPECT_TRUE(lengths->blocks.empty());
  EXPECT_EQ(lengths->probes.size(), 3u);
  // Probes in block 2 but a layout of two blocks.
  const auto short_layout = load_run_snapshot(write_layout_file(dir / "short.h5", {0, 1}, {0, 1}));
  ASSERT_TRUE(short_layout->ok()) << short_layout->error;
  EXPECT_TRUE(short_layout->blocks.empty());
}

TEST(PlotMath, MarkersAndLabelsArePlacedAlongTheAxis) {
  // Range [0, 10] over 100 px: markers at 0, 4, 8 are at 0, 40 and 80 px; labels 20 px long, 4 px gap.
  const std::vector<double> values = {0.0, 4.0, 8.0};
  const std::vector<int> rows = {0, 0, 0};
  const std::vector<double> sizes = {20.0, 20.0, 20.0};
  auto placed = place_markers(values, rows, sizes, {0.0, 10.0}, AxisScale::linear, 100.0, 4.0);
  ASSERT_EQ(placed.size(), 3u);
  EXPECT_TRUE(placed[0].line && placed[1].line && placed[2].line);
  EXPECT_DOUBLE_EQ(placed[0].line_at, 0.0);
  EXPECT_DOUBLE_EQ(placed[1].line_at, 40.0);
  EXPECT_DOUBLE_EQ(placed[2].line_at, 80.0);
  EXPECT_TRUE(placed[0].label);
  EXPECT_DOUBLE_EQ(placed[0].label_at, 4.0);
  EXPECT_TRUE(placed[1].label);
  EXPECT_DOUBLE_EQ(placed[1].label_at, 44.0);
  EXPECT_FALSE(placed[2].label) << "84 + 20 runs past the axis end";

  // A label longer than its stage is dropped; one on another row does not bound it.
  placed = place_markers(values, rows, {40.0, 20.0, 10.0}, {0.0, 10.0}, AxisScale::linear, 100.0, 4.0);
  EXPECT_FALSE(placed[0].label);
  EXPECT_TRUE(placed[2].label);
  placed = place_markers({0.0, 2.0}, {0, 1}, {40.0, 10.0}, {0.0, 10.0}, AxisScale::linear, 100.0, 4.0);
  EXPECT_TRUE(placed[0].label);

  // Zoomed to [5, 10]: the marker at 4 is off the left edge, but its stage runs into view, so its label sticks to
  // the left edge; the one at 0 is hidden behind it; the one at 8 is at 60 px.
  placed = place_markers(values, rows, {20.0, 20.0, 10.0}, {5.0, 10.0}, AxisScale::linear, 100.0, 4.0);
  EXPECT_FALSE(placed[0].line);
  EXPECT_FALSE(placed[0].label);
  EXPECT_FALSE(placed[1].line);
  EXPECT_TRUE(placed[1].label);
  EXPECT_DOUBLE_EQ(placed[1].label_at, 4.0);
  EXPECT_TRUE(placed[2].line);
  EXPECT_DOUBLE_EQ(placed[2].line_at, 60.0);
  EXPECT_TRUE(placed[2].label);

  // A log axis: 10 at the middle of [1, 100]; a value it cannot show has neither line nor label.
  placed = place_markers({0.0, 10.0}, {0, 0}, {5.0, 5.0}, {1.0, 100.0}, AxisScale::log, 200.0, 4.0);
  EXPECT_FALSE(placed[0].line || placed[0].label);
  EXPECT_TRUE(placed[1].line);
  EXPECT_NEAR(placed[1].line_at, 100.0, 1e-9);
}

TEST(PlotMath, TickStrideKeepsLabelsApart) {
  EXPECT_EQ(tick_stride(10, 12), 1u);
  EXPECT_EQ(tick_stride(13, 12), 2u);
  EXPECT_EQ(tick_stride(54, 12), 5u);
  EXPECT_EQ(tick_stride(54, 5), 20u);
  EXPECT_EQ(tick_stride(1000, 3), 500u);
  EXPECT_EQ(tick_stride(0, 4), 1u);
}

// The marker colour must stay findable: far from every series colour a plot uses and from the heatmap's colours.
TEST(PlotMath, MarkerColourIsDistinctFromSeriesAndViridis) {
  const auto marker = marker_rgb();
  auto distance = [&](double r, double g, double b) {
    return std::max({std::abs(marker[0] - r), std::abs(marker[1] - g), std::abs(marker[2] - b)});
  };
  for (std::size_t i = 0; i < 40; ++i) {
    const auto series = series_rgb(i);
    EXPECT_GT(distance(series[0], series[1], series[2]), 24.0) << "series colour " << i;
  }
  for (int i = 0; i <= 100; ++i) {
    const auto colour = viridis(i / 100.0);
    EXPECT_GT(distance(colour[0] * 255.0, colour[1] * 255.0, colour[2] * 255.0), 24.0) << "viridis " << i;
  }
}

}  // namespace
}  // namespace proplab::gui
