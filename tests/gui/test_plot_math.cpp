// The plot widget's maths: tick placement, axis transforms, zoom/pan, data ranges, colour maps, dashes.
#include <gtest/gtest.h>

#include <cmath>

#include "gui/plot/plot_math.h"

namespace proplab::gui {
namespace {

std::vector<double> values_of(const std::vector<Tick>& ticks, bool major_only = false) {
  std::vector<double> values;
  for (const auto& tick : ticks) {
    if (!major_only || tick.major) values.push_back(tick.value);
  }
  return values;
}

TEST(PlotMath, NiceStepsAreOneTwoOrFiveTimesAPowerOfTen) {
  EXPECT_DOUBLE_EQ(nice_step(10.0, 5), 2.0);
  EXPECT_DOUBLE_EQ(nice_step(1.0, 5), 0.2);
  EXPECT_DOUBLE_EQ(nice_step(7.0, 10), 0.5);
  EXPECT_DOUBLE_EQ(nice_step(100.0, 10), 10.0);
  EXPECT_DOUBLE_EQ(nice_step(0.003, 3), 0.001);
  EXPECT_DOUBLE_EQ(nice_step(-1.0, 5), 1.0);  // degenerate spans give a usable step
  for (double span = 1e-6; span < 1e7; span *= 1.37) {
    const double step = nice_step(span, 6);
    const double mantissa = step / std::pow(10.0, std::floor(std::log10(step) + 1e-12));
    EXPECT_TRUE(std::fabs(mantissa - 1) < 1e-9 || std::fabs(mantissa - 2) < 1e-9 || std::fabs(mantissa - 5) < 1e-9 ||
                std::fabs(mantissa - 10) < 1e-9)
        << "span " << span << " step " << step;
    const double intervals = span / step;
    EXPECT_GE(intervals, 6 / 2.5) << span;
    EXPECT_LE(intervals, 6 * 2.0) << span;
  }
}

TEST(PlotMath, LinearTicks) {
  const auto ticks = linear_ticks({0.0, 10.0}, 5);
  EXPECT_EQ(values_of(ticks), (std::vector<double>{0, 2, 4, 6, 8, 10}));
  EXPECT_EQ(ticks[0].label, "0");
  EXPECT_EQ(ticks[3].label, "6");
  const auto fractional = linear_ticks({-1.0, 1.0}, 4);
  EXPECT_EQ(values_of(fractional), (std::vector<double>{-1, -0.5, 0, 0.5, 1}));
  EXPECT_EQ(fractional[0].label, "-1.0");
  EXPECT_EQ(fractional[2].label, "0");
  EXPECT_EQ(fractional[3].label, "0.5");
  // Ticks lie inside the range, are evenly spaced, and are neither too few nor too many.
  for (double low = -123.4; low < 1000; low += 97.3) {
    for (double span : {0.01, 1.7, 55.0, 3e4}) {
      const auto t = linear_ticks({low, low + span}, 6);
      ASSERT_GE(t.size(), 2u) << low << " " << span;
      EXPECT_LE(t.size(), 14u);
      for (const auto& tick : t) {
        EXPECT_GE(tick.value, low - 1e-9 * span);
        EXPECT_LE(tick.value, low + span + 1e-9 * span);
      }
      for (std::size_t i = 2; i < t.size(); ++i) {
        EXPECT_NEAR(t[i].value - t[i - 1].value, t[1].value - t[0].value, 1e-9 * span);
      }
    }
  }
  EXPECT_EQ(format_tick(250000.0, 50000.0), "2.5e+05");
  EXPECT_EQ(format_tick(0.000012, 0.000001), "1.2e-05");
  EXPECT_EQ(format_tick(0.00012, 0.00001), "0.00012");
  EXPECT_TRUE(linear_ticks({1.0, 1.0}, 5).empty());
}

TEST(PlotMath, LogTicksSitOnPowersOfTen) {
  const auto six = log_ticks({1e-3, 1e3}, 6);
  EXPECT_EQ(values_of(six, true), (std::vector<double>{1e-3, 1e-2, 1e-1, 1, 10, 100, 1000}));
  EXPECT_EQ(six.front().label, "0.001");
  EXPECT_EQ(six.back().label, "1000");
  // Minor ticks at 2..9 × 10^k, unlabelled.
  EXPECT_EQ(six.size(), 7u + 6u * 8u);
  for (const auto& tick : six) EXPECT_EQ(tick.label.empty(), !tick.major);

  // Many decades: every 4th decade labelled.
  const auto wide = log_ticks({1e-10, 1e10}, 5);
  EXPECT_EQ(values_of(wide, true), (std::vector<double>{1e-8, 1e-4, 1, 1e4, 1e8}));
  EXPECT_EQ(wide.size(), 21u);

  // Under two decades: 1, 2, 5 labelled.
  const auto narrow = log_ticks({0.5, 30.0}, 5);
  EXPECT_EQ(values_of(narrow, true), (std::vector<double>{0.5, 1, 2, 5, 10, 20}));

  // Inside one decade, no power of ten: linear ticks.
  const auto within = log_ticks({2.0, 8.0}, 6);
  EXPECT_EQ(values_of(within), (std::vector<double>{2, 3, 4, 5, 6, 7, 8}));
  EXPECT_TRUE(log_ticks({-1.0, 10.0}, 5).empty());
  EXPECT_EQ(axis_ticks({1, 1000}, AxisScale::log, 5).front().value, 1.0);
}

TEST(PlotMath, TransformsMapAndInvert) {
  const AxisTransform x({0.0, 10.0}, AxisScale::linear, 100.0, 200.0);
  EXPECT_DOUBLE_EQ(x.to_pixel(0.0), 100.0);
  EXPECT_DOUBLE_EQ(x.to_pixel(5.0), 150.0);
  EXPECT_DOUBLE_EQ(x.to_pixel(10.0), 200.0);
  EXPECT_DOUBLE_EQ(x.from_pixel(175.0), 7.5);
  // A y axis: larger values go up the screen (smaller pixel rows).
  const AxisTransform y({1.0, 100.0}, AxisScale::log, 300.0, 100.0);
  EXPECT_DOUBLE_EQ(y.to_pixel(1.0), 300.0);
  EXPECT_DOUBLE_EQ(y.to_pixel(10.0), 200.0);
  EXPECT_DOUBLE_EQ(y.to_pixel(100.0), 100.0);
  for (double v : {1.5, 3.0, 42.0, 99.0}) EXPECT_NEAR(y.from_pixel(y.to_pixel(v)), v, 1e-9 * v);
  // An invalid range is repaired rather than dividing by zero.
  const AxisTransform repaired({5.0, 5.0}, AxisScale::linear, 0.0, 10.0);
  EXPECT_TRUE(std::isfinite(repaired.to_pixel(5.0)));
  EXPECT_DOUBLE_EQ(repaired.to_pixel(5.0), 5.0);
}

TEST(PlotMath, ValidRanges) {
  const AxisRange inverted = make_valid_range({3.0, 1.0}, AxisScale::linear);
  EXPECT_EQ(inverted.min, 1.0);
  EXPECT_EQ(inverted.max, 3.0);
  const AxisRange zero = make_valid_range({0.0, 0.0}, AxisScale::linear);
  EXPECT_EQ(zero.min, -1.0);
  EXPECT_EQ(zero.max, 1.0);
  const AxisRange log_negative = make_valid_range({-5.0, 100.0}, AxisScale::log);
  EXPECT_GT(log_negative.min, 0.0);
  EXPECT_EQ(log_negative.max, 100.0);
  const AxisRange nan = make_valid_range({std::nan(""), 1.0}, AxisScale::linear);
  EXPECT_EQ(nan.min, 0.0);
  EXPECT_EQ(nan.max, 1.0);
}

TEST(PlotMath, FitRangeSkipsWhatTheAxisCannotShow) {
  const std::vector<double> a = {1.0, 2.0, std::nan(""), 5.0};
  const std::vector<double> b = {-3.0, 0.0, 9.0, INFINITY};
  const AxisRange linear = fit_range({{a.data(), a.size()}, {b.data(), b.size()}}, AxisScale::linear, 0.0);
  EXPECT_EQ(linear.min, -3.0);
  EXPECT_EQ(linear.max, 9.0);
  const AxisRange padded = fit_range({{a.data(), a.size()}}, AxisScale::linear, 0.25);
  EXPECT_DOUBLE_EQ(padded.min, 0.0);
  EXPECT_DOUBLE_EQ(padded.max, 6.0);
  const AxisRange log = fit_range({{a.data(), a.size()}, {b.data(), b.size()}}, AxisScale::log, 0.0);
  EXPECT_DOUBLE_EQ(log.min, 1.0);
  EXPECT_DOUBLE_EQ(log.max, 9.0);
  const std::vector<double> constant = {4.0, 4.0};
  const AxisRange flat = fit_range({{constant.data(), constant.size()}}, AxisScale::log);
  EXPECT_LT(flat.min, 4.0);
  EXPECT_GT(flat.max, 4.0);
  const AxisRange nothing = fit_range({}, AxisScale::log);
  EXPECT_EQ(nothing.min, 0.1);
  EXPECT_EQ(nothing.max, 10.0);
}

TEST(PlotMath, ZoomKeepsTheAnchorAndPanMovesByPixels) {
  for (AxisScale scale : {AxisScale::linear, AxisScale::log}) {
    const AxisRange range = {1.0, 1000.0};
    const double anchor = 30.0;
    const AxisTransform before(range, scale, 0.0, 600.0);
    const AxisRange zoomed = zoom_range(range, scale, anchor, 0.5);
    const AxisTransform after(zoomed, scale, 0.0, 600.0);
    EXPECT_NEAR(after.to_pixel(anchor), before.to_pixel(anchor), 1e-6);
    // Half the span in the axis's own space.
    const auto span = [&](AxisRange r) { return scale == AxisScale::log ? std::log10(r.max / r.min) : r.max - r.min; };
    EXPECT_NEAR(span(zoomed), span(range) / 2.0, 1e-9 * span(range));
    // Panning by the whole axis moves the range by its own width.
    const AxisRange panned = pan_range(range, scale, 600.0, 600.0);
    const AxisTransform moved(panned, scale, 0.0, 600.0);
    EXPECT_NEAR(moved.to_pixel(range.max), 0.0, 1e-6);
  }
  const AxisRange box = range_between(7.0, 2.0, AxisScale::linear);
  EXPECT_EQ(box.min, 2.0);
  EXPECT_EQ(box.max, 7.0);
}

TEST(PlotMath, NearestPoint) {
  const std::vector<PixelPoint> points = {{0, 0}, {10, 0}, {10, 10}, {std::nan(""), 3}};
  EXPECT_EQ(nearest_point(points, 9, 1, 5), 1);
  EXPECT_EQ(nearest_point(points, 9, 8, 5), 2);
  EXPECT_EQ(nearest_point(points, 50, 50, 5), -1);
  EXPECT_EQ(nearest_point({}, 0, 0, 5), -1);
}

TEST(PlotMath, ViridisAndColourPositions) {
  const auto low = viridis(0.0), high = viridis(1.0), mid = viridis(0.5);
  EXPECT_NEAR(low[0], 0.267, 1e-3);
  EXPECT_NEAR(low[2], 0.329, 1e-3);
  EXPECT_NEAR(high[0], 0.993, 1e-3);
  EXPECT_NEAR(high[1], 0.906, 1e-3);
  EXPECT_NEAR(mid[1], 0.567, 1e-3);
  EXPECT_EQ(viridis(-3.0), low);
  EXPECT_EQ(viridis(7.0), high);
  EXPECT_EQ(viridis(std::nan("")), (std::array<float, 3>{0.5f, 0.5f, 0.5f}));
  // Perceptual ordering: viridis's lightness (here the green channel) grows monotonically.
  for (double t = 0.0; t < 1.0; t += 0.01) EXPECT_LT(viridis(t)[1], viridis(t + 0.01)[1]) << t;

  EXPECT_DOUBLE_EQ(colour_position(5.0, 0.0, 10.0, AxisScale::linear), 0.5);
  EXPECT_DOUBLE_EQ(colour_position(10.0, 1.0, 100.0, AxisScale::log), 0.5);
  EXPECT_DOUBLE_EQ(colour_position(1000.0, 1.0, 100.0, AxisScale::log), 1.0);
  EXPECT_DOUBLE_EQ(colour_position(-1.0, 0.0, 10.0, AxisScale::linear), 0.0);
  EXPECT_TRUE(std::isnan(colour_position(0.0, 1.0, 100.0, AxisScale::log)));
  EXPECT_DOUBLE_EQ(colour_position(3.0, 3.0, 3.0, AxisScale::linear), 0.5);
}

TEST(PlotMath, SeriesColoursAreDistinct) {
  EXPECT_EQ(series_rgb(0), (std::array<unsigned char, 3>{31, 119, 180}));
  EXPECT_EQ(series_rgb(1), (std::array<unsigned char, 3>{255, 127, 14}));
  for (std::size_t a = 0; a < 30; ++a) {
    for (std::size_t b = a + 1; b < 30; ++b) EXPECT_NE(series_rgb(a), series_rgb(b)) << a << " " << b;
  }
}

TEST(PlotMath, DashesCarryTheirPhaseAcrossSegments) {
  const auto pieces = dash_pieces({10.0}, 2.0, 2.0);
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_DOUBLE_EQ(pieces[0].from, 0.0);
  EXPECT_DOUBLE_EQ(pieces[0].to, 0.2);
  EXPECT_DOUBLE_EQ(pieces[1].from, 0.4);
  EXPECT_DOUBLE_EQ(pieces[2].to, 1.0);
  // A dash that starts in one segment continues in the next.
  const auto split = dash_pieces({3.0, 3.0}, 4.0, 1.0);
  ASSERT_EQ(split.size(), 3u);
  EXPECT_EQ(split[0].segment, 0u);
  EXPECT_DOUBLE_EQ(split[0].to, 1.0);
  EXPECT_EQ(split[1].segment, 1u);
  EXPECT_DOUBLE_EQ(split[1].from, 0.0);
  EXPECT_NEAR(split[1].to, 1.0 / 3.0, 1e-12);
  EXPECT_NEAR(split[2].from, 2.0 / 3.0, 1e-12);
  // Without a dash pattern every segment is drawn whole; zero-length segments are skipped.
  EXPECT_EQ(dash_pieces({1.0, 2.0}, 0.0, 1.0).size(), 2u);
  EXPECT_TRUE(dash_pieces({0.0}, 2.0, 2.0).empty());
}

TEST(PlotMath, NamedTicksThinToFitAndStayPutWhilePanning) {
  std::vector<Tick> blocks;
  for (int b = 0; b < 48; ++b) blocks.push_back(Tick{static_cast<double>(b), "blocks." + std::to_string(b), true});
  // 48 blocks over 480 pixels: 10 pixels each; 63-pixel labels and a 12-pixel gap need 75 pixels: every 10th.
  auto ticks = named_ticks(blocks, AxisRange{0.0, 48.0}, 480.0, 63.0, 12.0);
  ASSERT_EQ(ticks.size(), 48u) << "every block keeps a grid line";
  std::vector<std::string> labels;
  for (const auto& tick : ticks) {
    if (!tick.label.empty()) labels.push_back(tick.label);
    EXPECT_EQ(tick.major, !tick.label.empty());
  }
  EXPECT_EQ(labels, (std::vector<std::string>{"blocks.0", "blocks.10", "blocks.20", "blocks.30", "blocks.40"}));
  // Wide enough for every label: stride 1. Labels never come closer than a label and the gap.
  ticks = named_ticks(blocks, AxisRange{0.0, 48.0}, 48.0 * 80.0, 63.0, 12.0);
  for (const auto& tick : ticks) EXPECT_FALSE(tick.label.empty()) << tick.value;
  for (const double length : {100.0, 300.0, 700.0, 2000.0}) {
    double last = -1e9;
    for (const auto& tick : named_ticks(blocks, AxisRange{0.0, 48.0}, length, 63.0, 12.0)) {
      if (tick.label.empty()) continue;
      const double px = tick.value / 48.0 * length;
      EXPECT_GE(px - last, 75.0 - 1e-9) << length;
      last = px;
    }
  }
  // Panned: the same blocks keep their labels (counted from block 0, not from the first in view).
  ticks = named_ticks(blocks, AxisRange{3.5, 27.5}, 240.0, 63.0, 12.0);
  ASSERT_EQ(ticks.front().value, 4.0);
  for (const auto& tick : ticks) EXPECT_EQ(!tick.label.empty(), static_cast<int>(tick.value) % 10 == 0) << tick.value;
  // Fewer than two in view: none (the plot falls back to numbers).
  EXPECT_TRUE(named_ticks(blocks, AxisRange{3.2, 3.9}, 240.0, 63.0, 12.0).empty());
  EXPECT_EQ(named_ticks(blocks, AxisRange{3.0, 4.0}, 240.0, 63.0, 12.0).size(), 2u);
}

}  // namespace
}  // namespace proplab::gui
