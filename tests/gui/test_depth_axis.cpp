// Depth axes and the residual stream first (gui/data/depth_axis, the plot specs of gui/app/plot_specs): transformer
// probes by block (sublayers at fractions, labelled with their block), by l/L (a 2-layer and a 24-layer run span the
// same [0, 1]) and by probe index; the default axis (block; l/L when depths differ); the kind multi-select and its
// default (the residual stream); point read-outs and heatmap rows by block; the backward prediction drawn dashed; and
// the layout maths that keeps the legend off the data and sizes the window to the work area (plot_math).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "gui/data/block_axis.h"
#include "gui/data/depth_axis.h"
#include "gui/plot/plot_math.h"

#ifdef PROPLAB_GUI_BINARY
#include "gui/app/app_state.h"
#include "gui/app/plot_specs.h"
#endif

namespace proplab::gui {
namespace {

// The probes of a Pre-LN transformer of `layers` blocks, in forward order, named as src/models/transformer.cpp names
// them (docs/run-format.md): 10 per block, embed.out before, final_norm.out and head.logits after.
std::vector<ProbeInfo> transformer_probes(std::int64_t layers) {
  std::vector<ProbeInfo> probes;
  const auto add = [&](const std::string& name, const std::string& kind, std::int64_t block) {
    probes.push_back(ProbeInfo{name, static_cast<std::int64_t>(probes.size()), block, kind});
  };
  add("embed.out", "embed", -1);
  for (std::int64_t l = 0; l < layers; ++l) {
    const std::string b = "blocks." + std::to_string(l) + ".";
    add(b + "in", "residual", l);
    add(b + "attn.norm", "norm", l);
    add(b + "attn.logits", "logits", l);
    add(b + "attn.out", "branch", l);
    add(b + "mid", "residual", l);
    add(b + "ffn.norm", "norm", l);
    add(b + "ffn.preact", "preact", l);
    add(b + "ffn.postact", "postact", l);
    add(b + "ffn.out", "branch", l);
    add(b + "out", "residual", l);
  }
  add("final_norm.out", "norm", -1);
  add("head.logits", "logits", -1);
  return probes;
}

// A loaded run with those probes, `records` records, forward and backward var = 1 + probe + record and a backward
// (and forward) prediction of 2 at every residual probe.
std::shared_ptr<RunSnapshot> transformer_run(const std::string& name, std::int64_t layers, std::int64_t records = 2) {
  auto run = std::make_shared<RunSnapshot>();
  run->name = name;
  run->path = name + ".h5";
  run->probes = transformer_probes(layers);
  const auto probes = static_cast<std::int64_t>(run->probes.size());
  for (std::int64_t r = 0; r < records; ++r) run->record_steps.push_back(10 * r);
  Dataset2D var{records, probes, {}};
  for (std::int64_t r = 0; r < records; ++r) {
    for (std::int64_t p = 0; p < probes; ++p) var.values.push_back(1.0 + static_cast<double>(p + r));
  }
  run->forward["var"] = var;
  run->backward["var"] = var;
  std::vector<double> theory(run->probes.size(), std::nan(""));
  for (std::size_t p = 0; p < run->probes.size(); ++p) {
    if (run->probes[p].kind == "residual") theory[p] = 2.0;
  }
  run->theory_forward["var"] = theory;
  run->theory_backward["var"] = theory;
  return run;
}

TEST(GuiDepthAxis, BlockPositionsAreBlockIndicesWithSublayersAtFractions) {
  const auto probes = transformer_probes(3);
  const auto x = depth_axis_positions(probes, DepthAxis::block);
  ASSERT_EQ(x.size(), probes.size());
  for (std::size_t p = 0; p < probes.size(); ++p) {
    const ProbeInfo& probe = probes[p];
    if (probe.block < 0) continue;
    const auto l = static_cast<double>(probe.block);
    // Inside its block: [l, l + 1], the k-th of the block's 10 probes at l + k/9.
    EXPECT_GE(x[p], l) << probe.name;
    EXPECT_LE(x[p], l + 1.0) << probe.name;
    const auto k = static_cast<double>((p - 1) % 10);
    EXPECT_NEAR(x[p], l + k / 9.0, 1e-12) << probe.name;
  }
  EXPECT_DOUBLE_EQ(x[1], 0.0);          // blocks.0.in
  EXPECT_DOUBLE_EQ(x[10], 1.0);         // blocks.0.out, where blocks.1.in is
  EXPECT_DOUBLE_EQ(x[11], 1.0);         // blocks.1.in
  EXPECT_NEAR(x[5], 4.0 / 9.0, 1e-12);  // blocks.0.mid, between the sublayers
  EXPECT_LT(x.front(), 0.0);            // embed.out before the first block
  EXPECT_GT(x.back(), 3.0);             // head.logits after the last
  for (std::size_t p = 1; p < x.size(); ++p) EXPECT_GE(x[p], x[p - 1]) << "forward order";
  // Labelled with the block's name.
  EXPECT_EQ(block_name(probes[4]), "blocks.0");
  EXPECT_EQ(block_name(probes[27]), "blocks.2");
  EXPECT_EQ(block_name(probes.front()), "");
  EXPECT_EQ(block_name(ProbeInfo{"layers.12.preact", 0, 12, "preact"}), "layers.12");
  EXPECT_EQ(block_name(ProbeInfo{"stem.conv", 0, 4, "branch"}), "block 4");
}

TEST(GuiDepthAxis, BlocksAreNamedAsTheirProbesNameThem) {
  EXPECT_EQ(block_names({transformer_run("a", 3)}), (std::vector<std::string>{"blocks.0", "blocks.1", "blocks.2"}));
  // Runs of different depth: the deepest sets the count; the names agree.
  EXPECT_EQ(block_names({transformer_run("a", 1), transformer_run("b", 2)}),
            (std::vector<std::string>{"blocks.0", "blocks.1"}));
  // Runs that name a block differently (an MLP's layers.1 beside a transformer's blocks.1) get its number.
  auto mlp = std::make_shared<RunSnapshot>();
  mlp->probes = {ProbeInfo{"layers.0.preact", 0, 0, "preact"}, ProbeInfo{"layers.1.preact", 1, 1, "preact"},
                 ProbeInfo{"layers.2.preact", 2, 2, "preact"}};
  EXPECT_EQ(block_names({mlp}), (std::vector<std::string>{"layers.0", "layers.1", "layers.2"}));
  EXPECT_EQ(block_names({transformer_run("a", 2), mlp}), (std::vector<std::string>{"0", "1", "layers.2"}));
  EXPECT_TRUE(block_names({}).empty());
}

TEST(GuiDepthAxis, NormalisedDepthOverlaysRunsOfDifferentDepth) {
  for (const std::int64_t layers : {2, 24}) {
    SCOPED_TRACE(layers);
    const auto probes = transformer_probes(layers);
    EXPECT_EQ(block_count(probes), layers);
    const auto x = depth_axis_positions(probes, DepthAxis::depth);
    const auto residual = probes_of_kinds(probes, {"residual"});
    double low = 1e9, high = -1e9;
    for (const auto p : residual) {
      low = std::min(low, x[p]);
      high = std::max(high, x[p]);
    }
    // The residual stream spans [0, 1] whatever the depth: blocks.0.in at 0, blocks.<L-1>.out at 1.
    EXPECT_DOUBLE_EQ(low, 0.0);
    EXPECT_DOUBLE_EQ(high, 1.0);
    // The middle of the stack is at 1/2 in both.
    EXPECT_DOUBLE_EQ(x[1 + 10 * static_cast<std::size_t>(layers / 2)], 0.5);
    // The probe axis is the probe index.
    const auto index = depth_axis_positions(probes, DepthAxis::probe);
    for (std::size_t p = 0; p < probes.size(); ++p) EXPECT_EQ(index[p], static_cast<double>(p));
  }
  // A run without blocks is by probe index on every axis.
  const std::vector<ProbeInfo> flat = {{"a", 0, -1, "embed"}, {"b", 1, -1, "logits"}};
  EXPECT_EQ(depth_axis_positions(flat, DepthAxis::depth), (std::vector<double>{0.0, 1.0}));
  EXPECT_EQ(block_count(flat), 0);
  // Stage markers move with the axis.
  EXPECT_DOUBLE_EQ(block_position_on(6.0, 24, DepthAxis::depth), 0.25);
  EXPECT_DOUBLE_EQ(block_position_on(6.0, 24, DepthAxis::block), 6.0);
}

TEST(GuiDepthAxis, DefaultIsByBlockAndByLOverLWhenDepthsDiffer) {
  const RunList same = {transformer_run("a", 24), transformer_run("b", 24)};
  EXPECT_EQ(default_depth_axis(same), DepthAxis::block);
  const RunList one = {transformer_run("a", 2)};
  EXPECT_EQ(default_depth_axis(one), DepthAxis::block);
  const RunList differ = {transformer_run("quickstart", 2), transformer_run("deep", 24)};
  EXPECT_EQ(default_depth_axis(differ), DepthAxis::depth);
  // Runs without blocks do not count.
  auto flat = std::make_shared<RunSnapshot>();
  flat->probes = {{"a", 0, -1, "embed"}};
  EXPECT_EQ(default_depth_axis({flat, transformer_run("a", 2)}), DepthAxis::block);
  EXPECT_EQ(default_depth_axis({}), DepthAxis::block);

  EXPECT_EQ(parse_depth_axis("block"), DepthAxis::block);
  EXPECT_EQ(parse_depth_axis("depth"), DepthAxis::depth);
  EXPECT_EQ(parse_depth_axis("probe"), DepthAxis::probe);
  EXPECT_FALSE(parse_depth_axis("sideways"));
  for (const DepthAxis axis : {DepthAxis::block, DepthAxis::depth, DepthAxis::probe})
    EXPECT_EQ(parse_depth_axis(depth_axis_name(axis)), axis);
  EXPECT_STREQ(depth_axis_title(DepthAxis::depth), "depth l/L");
}

TEST(GuiDepthAxis, KindFilterIsAMultiSelectThatOpensOnTheResidualStream) {
  const auto probes = transformer_probes(2);
  EXPECT_EQ(default_kinds(RunList{transformer_run("a", 2)}), (std::vector<std::string>{"residual"}));
  auto flat = std::make_shared<RunSnapshot>();
  flat->probes = {{"a", 0, -1, "embed"}, {"b", 1, -1, "logits"}};
  EXPECT_TRUE(default_kinds(RunList{flat}).empty()) << "no residual stream: every probe";
  EXPECT_EQ(default_kinds(RunList{flat, transformer_run("a", 2)}), (std::vector<std::string>{"residual"}));

  EXPECT_EQ(probes_of_kinds(probes, {}).size(), probes.size());
  const auto residual = probes_of_kinds(probes, {"residual"});
  EXPECT_EQ(residual.size(), 6u);  // in, mid, out of each block
  const auto two = probes_of_kinds(probes, {"residual", "branch"});
  EXPECT_EQ(two.size(), 10u);
  for (std::size_t i = 1; i < two.size(); ++i) EXPECT_LT(two[i - 1], two[i]) << "forward order";

  EXPECT_EQ(parse_kinds("residual"), (std::vector<std::string>{"residual"}));
  EXPECT_EQ(parse_kinds("residual, branch,residual"), (std::vector<std::string>{"residual", "branch"}));
  EXPECT_THROW(parse_kinds("residual,,branch"), UserError);
  EXPECT_THROW(parse_kinds("resid"), UserError);
  EXPECT_EQ(kinds_summary({}), "all probes");
  EXPECT_EQ(kinds_summary({"residual", "branch"}), "residual + branch");
}

TEST(GuiDepthAxis, PointReadOutNamesProbeBlockStepAndValue) {
  const auto probes = transformer_probes(4);
  const ProbeInfo& attn = probes[1 + 10 * 3 + 3];  // blocks.3.attn.out
  ASSERT_EQ(attn.name, "blocks.3.attn.out");
  EXPECT_EQ(probe_point_text(attn, 120, "forward var", 1.23456e-5),
            "blocks.3.attn.out (branch)\nblock 3 (blocks.3)\nstep 120\nforward var = 1.235e-05");
  EXPECT_EQ(probe_point_text(probes.back(), 0, "backward var", 2.0), "head.logits (logits)\nstep 0\nbackward var = 2");
  EXPECT_EQ(probe_description(attn), "blocks.3.attn.out (branch)\nblock 3 (blocks.3)");
}

TEST(GuiDepthAxis, LegendGoesBesideTheDataNeverOverIt) {
  const PixelRect area{64, 20, 1000, 600};
  // Room on the right: the data area narrows, the legend sits right of it.
  const auto right = place_legend(area, 200, 80, 34, 8, 0.6);
  EXPECT_TRUE(right.right);
  EXPECT_FALSE(overlaps(right.area, right.legend));
  EXPECT_DOUBLE_EQ(right.area.x1, 1000 - 200 - 8);
  EXPECT_DOUBLE_EQ(right.legend.x1, 1000);
  EXPECT_DOUBLE_EQ(right.legend.y0, 20);
  EXPECT_DOUBLE_EQ(right.legend.height(), 80);
  // A narrow panel (small multiples): below the x axis' labels instead.
  const PixelRect narrow{64, 20, 364, 600};
  const auto below = place_legend(narrow, 200, 80, 34, 8, 0.6);
  EXPECT_FALSE(below.right);
  EXPECT_FALSE(overlaps(below.area, below.legend));
  EXPECT_DOUBLE_EQ(below.area.y1, 600 - 80 - 34 - 8);
  EXPECT_GE(below.legend.y0, below.area.y1 + 34) << "the x axis' labels stay under the data";
  EXPECT_DOUBLE_EQ(below.legend.y1, 600);
  // Neither fits: right of a data area that keeps 60% of the width, the legend cut to the rest.
  const PixelRect small{0, 0, 300, 200};
  const auto squeezed = place_legend(small, 400, 190, 34, 8, 0.6);
  EXPECT_TRUE(squeezed.right);
  EXPECT_FALSE(overlaps(squeezed.area, squeezed.legend));
  EXPECT_NEAR(squeezed.area.width(), 180, 1e-9);
  EXPECT_LE(squeezed.legend.x1, 300);
  // A legend taller than the plot is cut to its height.
  const auto tall = place_legend(area, 200, 2000, 34, 8, 0.6);
  EXPECT_DOUBLE_EQ(tall.legend.y1, 600);
  EXPECT_TRUE(overlaps(PixelRect{0, 0, 10, 10}, PixelRect{5, 5, 20, 20}));
  EXPECT_FALSE(overlaps(PixelRect{0, 0, 10, 10}, PixelRect{10, 0, 20, 10})) << "touching is not overlapping";
}

TEST(GuiDepthAxis, WindowFillsTheWorkArea) {
  const auto full = initial_window_rect(PixelRect{0, 27, 2560, 1440}, 1280, 800);
  EXPECT_DOUBLE_EQ(full.x0, 0);
  EXPECT_DOUBLE_EQ(full.y0, 27);
  EXPECT_DOUBLE_EQ(full.width(), 2560);
  EXPECT_DOUBLE_EQ(full.height(), 1413);
  // A second monitor's work area keeps its offset.
  const auto second = initial_window_rect(PixelRect{1920, 0, 3200, 1024}, 1280, 800);
  EXPECT_DOUBLE_EQ(second.x0, 1920);
  EXPECT_DOUBLE_EQ(second.width(), 1280);
  // Unknown (empty) or tiny work areas: the fallback size.
  const auto unknown = initial_window_rect(PixelRect{}, 1280, 800);
  EXPECT_DOUBLE_EQ(unknown.width(), 1280);
  EXPECT_DOUBLE_EQ(unknown.height(), 800);
  EXPECT_DOUBLE_EQ(initial_window_rect(PixelRect{0, 0, 200, 100}, 1280, 800).width(), 1280);
}

#ifdef PROPLAB_GUI_BINARY

// A state that selects `runs` in order (colours follow it).
AppState state_with(const RunList& runs) {
  AppState state;
  for (const auto& run : runs) state.selection.push_back(run->path);
  state.library_state.runs = runs;
  sync_selection(state);
  return state;
}

TEST(GuiDepthPlotSpec, OpensOnTheResidualStreamByBlockAndOverlaysDepthsByLOverL) {
  const RunList same = {transformer_run("a", 4), transformer_run("b", 4)};
  AppState state = state_with(same);
  PlotSpec spec = depth_plot_spec(state, same);
  EXPECT_EQ(spec.x_label, "block");
  ASSERT_EQ(spec.series.size(), 4u);  // each run measured and predicted
  EXPECT_EQ(spec.series[0].x.size(), 12u) << "the residual stream only: in, mid, out of 4 blocks";
  EXPECT_DOUBLE_EQ(spec.series[0].x.front(), 0.0);
  EXPECT_DOUBLE_EQ(spec.series[0].x.back(), 4.0);
  // Every point carries its read-out.
  ASSERT_EQ(spec.series[0].point_labels.size(), spec.series[0].x.size());
  EXPECT_EQ(spec.series[0].point_labels[1], "blocks.0.mid (residual)\nblock 0 (blocks.0)\nstep 10\nforward var = 7");
  EXPECT_TRUE(spec.x_markers.empty()) << "transformers have no stages";
  // The block axis is labelled with the blocks' names, at each block's start.
  ASSERT_EQ(spec.x_names.size(), 4u);
  EXPECT_DOUBLE_EQ(spec.x_names[2].value, 2.0);
  EXPECT_EQ(spec.x_names[2].label, "blocks.2");
  const auto ticks = plot_x_ticks(spec, AxisRange{0.0, 4.0}, 600.0, [](const std::string& t) { return 7.0 * t.size(); });
  ASSERT_EQ(ticks.size(), 4u);
  EXPECT_EQ(ticks[3].label, "blocks.3");
  // Too narrow for four names: every other one; zoomed inside one block: numbers.
  EXPECT_EQ(plot_x_ticks(spec, AxisRange{0.0, 4.0}, 200.0, [](const std::string& t) { return 7.0 * t.size(); })[1].label,
            "");
  EXPECT_EQ(plot_x_ticks(spec, AxisRange{1.2, 1.8}, 600.0, [](const std::string& t) { return 7.0 * t.size(); })[0].label,
            "1.2");

  const RunList differ = {transformer_run("quickstart", 2), transformer_run("deep", 24)};
  state = state_with(differ);
  spec = depth_plot_spec(state, differ);
  EXPECT_EQ(spec.x_label, "depth l/L");
  EXPECT_TRUE(spec.x_names.empty()) << "l/L is labelled with numbers";
  for (const std::size_t s : {0u, 2u}) {
    ASSERT_FALSE(spec.series[s].x.empty());
    EXPECT_DOUBLE_EQ(spec.series[s].x.front(), 0.0) << spec.series[s].label;
    EXPECT_DOUBLE_EQ(spec.series[s].x.back(), 1.0) << spec.series[s].label;
  }
  // The user's choices win: the probe index, and several kinds.
  state.depth_axis = DepthAxis::probe;
  state.kind_filter = std::vector<std::string>{"residual", "branch"};
  spec = depth_plot_spec(state, differ);
  EXPECT_EQ(spec.x_label, "probe index");
  EXPECT_EQ(spec.series[0].x.size(), 10u);
  EXPECT_DOUBLE_EQ(spec.series[0].x.front(), 1.0);
  state.kind_filter = std::vector<std::string>{};
  EXPECT_EQ(depth_plot_spec(state, differ).series[0].x.size(), transformer_probes(2).size());
}

TEST(GuiDepthPlotSpec, BackwardPredictionIsDrawnDashedLikeTheForwardOne) {
  const RunList runs = {transformer_run("a", 3)};
  AppState state = state_with(runs);
  for (const Direction direction : {Direction::forward, Direction::backward}) {
    SCOPED_TRACE(direction_name(direction));
    state.direction = direction;
    const PlotSpec spec = depth_plot_spec(state, runs);
    ASSERT_EQ(spec.series.size(), 2u);
    const PlotSeries& predicted = spec.series[1];
    EXPECT_TRUE(predicted.dashed);
    EXPECT_EQ(predicted.colour, spec.series[0].colour);
    EXPECT_EQ(predicted.label, "a (theory, init)");
    EXPECT_EQ(predicted.x, spec.series[0].x);
    for (const double y : predicted.y) EXPECT_DOUBLE_EQ(y, 2.0);
    EXPECT_NE(predicted.point_labels.front().find("predicted " + std::string(direction_name(direction)) + " var = 2"),
              std::string::npos)
        << predicted.point_labels.front();
  }
  // No prediction in the file: no dashed line.
  auto bare = transformer_run("b", 3);
  bare->theory_backward.clear();
  state.direction = Direction::backward;
  EXPECT_EQ(depth_plot_spec(state, {bare}).series.size(), 1u);
}

TEST(GuiDepthPlotSpec, FiniteWidthBandIsDrawnWithThePrediction) {
  auto run = transformer_run("mlp", 2);
  std::vector<double> sd(run->probes.size(), std::nan(""));
  for (std::size_t p = 0; p < sd.size(); ++p) {
    if (run->probes[p].kind == "residual") sd[p] = 0.5;
  }
  run->theory_forward["var_log_sd"] = sd;
  const RunList runs = {run};
  AppState state = state_with(runs);
  PlotSpec spec = depth_plot_spec(state, runs);
  // Measured, the band's low and high lines, then the prediction (whose legend entry they share).
  ASSERT_EQ(spec.series.size(), 4u);
  const PlotSeries& low = spec.series[1];
  const PlotSeries& high = spec.series[2];
  EXPECT_EQ(low.label, "mlp (theory, 95% low)");
  EXPECT_EQ(high.label, "mlp (theory, 95% high)");
  for (const PlotSeries* band : {&low, &high}) {
    EXPECT_EQ(band->legend_name, "mlp (theory, init)");
    EXPECT_FALSE(band->in_legend);
    EXPECT_TRUE(band->dashed);
    EXPECT_EQ(band->x, spec.series[0].x);
  }
  // var · exp(−sd²/2 ∓ 1.96 sd) around the prediction of 2.
  EXPECT_DOUBLE_EQ(low.y.front(), 2.0 * std::exp(-0.125 - 0.98));
  EXPECT_DOUBLE_EQ(high.y.front(), 2.0 * std::exp(-0.125 + 0.98));
  EXPECT_EQ(legend_entries(spec).size(), 2u) << "the band has no entry of its own";
  // Only forward var has a band; without a prediction drawn, no band either.
  state.direction = Direction::backward;
  EXPECT_EQ(depth_plot_spec(state, runs).series.size(), 2u);
  state.direction = Direction::forward;
  state.show_theory = false;
  EXPECT_EQ(depth_plot_spec(state, runs).series.size(), 1u);
}

TEST(GuiHeatmapPlotSpec, RowsAreLabelledByBlock) {
  const auto run = transformer_run("a", 12);
  AppState state = state_with({run});
  HeatmapSpec spec = heatmap_plot_spec(state, *run);
  EXPECT_EQ(spec.y_label, "block");
  EXPECT_EQ(spec.rows, static_cast<std::int64_t>(run->probes.size())) << "every probe until kinds are chosen";
  ASSERT_EQ(spec.row_ticks.size(), 12u);
  for (std::size_t b = 0; b < 12; ++b) {
    EXPECT_EQ(spec.row_ticks[b].label, std::to_string(b));
    // Block b's 10 rows follow embed.out's: the middle of rows [1 + 10b, 11 + 10b).
    EXPECT_DOUBLE_EQ(spec.row_ticks[b].value, 6.0 + 10.0 * static_cast<double>(b));
  }
  EXPECT_EQ(spec.row_labels[1], "blocks.0.in (residual)\nblock 0 (blocks.0)");
  EXPECT_TRUE(spec.row_markers.empty()) << "transformers have no stages";
  // The residual stream only: 3 rows per block.
  state.kind_filter = std::vector<std::string>{"residual"};
  spec = heatmap_plot_spec(state, *run);
  EXPECT_EQ(spec.rows, 36);
  EXPECT_DOUBLE_EQ(spec.row_ticks[2].value, 7.5);
  // With stages (a ResNet-like layout): the stage starts are marked too.
  auto staged = transformer_run("s", 4);
  staged->blocks = {{0, false}, {0, false}, {1, true}, {1, false}};
  state.kind_filter.reset();
  spec = heatmap_plot_spec(state, *staged);
  ASSERT_EQ(spec.row_markers.size(), 2u);
  EXPECT_EQ(spec.row_markers[1].label, "stage 2");
}

#endif

}  // namespace
}  // namespace proplab::gui
