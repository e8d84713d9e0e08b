// gui/plot/plot_math: the pure maths behind the plot widget: tick placement, axis transforms, zoom and pan,
// data ranges, nearest-point search and the colour maps. No ImGui, no GL: unit-tested in tests/gui.
//
// Invariants:
// - An AxisRange has min < max and, on a log axis, min > 0 (make_valid_range repairs anything else).
// - Linear ticks are multiples of a "nice" step 1, 2 or 5 × 10^k; log ticks sit on powers of ten (with 2 and 5
//   between them when the range spans few decades). Every returned tick lies inside [min, max] (with a relative
//   tolerance of 1e-9 of the range).
// - AxisTransform maps data to pixels affinely in the value (linear) or in log10 of the value (log); pixel_min
//   corresponds to range.min (for a y axis pass pixel_min = bottom, pixel_max = top). from_pixel inverts to_pixel.
// - Values that a log axis cannot show (<= 0, NaN, inf) are "not plottable" and are skipped by fit_range.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <vector>

namespace proplab::gui {

enum class AxisScale { linear, log };

struct AxisRange {
  double min = 0.0;
  double max = 1.0;
};

struct Tick {
  double value = 0.0;
  std::string label;
  bool major = true;  // minor ticks get a grid line but no label
};

// A 1, 2 or 5 × 10^k step giving about `target` intervals over `span` (> 0).
double nice_step(double span, int target);
// Ticks on a linear axis, about `target` of them, labelled with as many decimals as the step needs.
std::vector<Tick> linear_ticks(AxisRange range, int target);
// Ticks on a log axis: labelled powers of ten (every k-th decade when there are too many); minor ticks at
// 2..9 × 10^k when the range spans few decades; for a range inside one decade, linear ticks instead.
std::vector<Tick> log_ticks(AxisRange range, int target);
std::vector<Tick> axis_ticks(AxisRange range, AxisScale scale, int target);
// The stride (1, 2, 5, 10, 20, 50, ...) that keeps at most `target` (>= 1) of `count` evenly spaced labels: e.g.
// every 5th block's label on a heatmap of 54 blocks with room for 12.
std::size_t tick_stride(std::size_t count, int target);
// Named ticks on a linear axis of `length` pixels showing `range`: `candidates` (e.g. one per block, labelled with
// the block's name, in increasing order) thinned so that labels `label_size` pixels wide keep `gap` pixels between
// them. Of the candidates inside the range, every stride-th (the smallest 1, 2, 5 × 10^k stride that fits, counted
// from the first candidate, so labels stay put while panning) keeps its label; the others become unlabelled minor ticks. Empty when fewer than
// two candidates lie inside the range (the caller then falls back to numbers).
std::vector<Tick> named_ticks(const std::vector<Tick>& candidates, AxisRange range, double length, double label_size,
                              double gap);
// A short label for a value on an axis whose ticks are `step` apart (linear) or any value (step 0).
std::string format_tick(double value, double step);
// A compact number for read-outs (hover, legends): 4 significant digits, scientific when large or small.
std::string format_value(double value);

bool plottable(double value, AxisScale scale);
// Fixes an empty, inverted, non-finite or (log) non-positive range.
AxisRange make_valid_range(AxisRange range, AxisScale scale);

class AxisTransform {
 public:
  AxisTransform(AxisRange range, AxisScale scale, double pixel_min, double pixel_max);
  double to_pixel(double value) const;
  double from_pixel(double pixel) const;
  AxisRange range() const { return range_; }
  AxisScale scale() const { return scale_; }

 private:
  double forward(double value) const;  // value -> linear space (log10 on a log axis)
  AxisRange range_;
  AxisScale scale_;
  double pixel_min_, pixel_max_;
  double low_, high_;  // range in linear space
};

// The range covering every plottable value of the given series, padded by `padding` of its span on each side
// (in linear space); nothing plottable: the default [0, 1] (linear) or [0.1, 10] (log).
struct ValueSpan {
  const double* values = nullptr;
  std::size_t size = 0;
};
AxisRange fit_range(const std::vector<ValueSpan>& series, AxisScale scale, double padding = 0.05);
// Zooms by `factor` (< 1 zooms in) keeping `anchor` (a data value) at the same place.
AxisRange zoom_range(AxisRange range, AxisScale scale, double anchor, double factor);
// Moves the range by `pixels` of a `pixel_span`-pixel axis (positive: towards larger values).
AxisRange pan_range(AxisRange range, AxisScale scale, double pixels, double pixel_span);
// The range between two data values (e.g. a zoom box), either order.
AxisRange range_between(double a, double b, AxisScale scale);

// Index of the point nearest to (px, py) in pixels within `max_distance`; -1 when none.
struct PixelPoint {
  double x = 0.0, y = 0.0;
};
long nearest_point(const std::vector<PixelPoint>& points, double px, double py, double max_distance);

// The colour of the i-th series (runs in selection order): Tableau's 10 categorical colours, then again
// darkened by a fifth, then lightened, and so on. RGB bytes.
std::array<unsigned char, 3> series_rgb(std::size_t index);

// The colour of axis markers (a ResNet's stage transitions and their labels): a light grey that no series colour and
// no viridis value comes near. RGB bytes.
std::array<unsigned char, 3> marker_rgb();

// Where markers (e.g. the starts of stages) and their labels go along an axis of `length` pixels showing `range`.
// A marker's line is drawn when its value lies inside the range. Its label (of `label_sizes[i]` pixels along the
// axis) starts `gap` pixels after the marker, or after the axis start when the marker lies before it but the next
// marker of the same label row does not (its stage continues into view); it is shown when it ends `gap` pixels
// before that next marker and inside the axis. Positions are pixels from the axis start (the range's min).
struct MarkerPlacement {
  bool line = false;
  double line_at = 0.0;
  bool label = false;
  double label_at = 0.0;
};
std::vector<MarkerPlacement> place_markers(const std::vector<double>& values, const std::vector<int>& label_rows,
                                           const std::vector<double>& label_sizes, AxisRange range, AxisScale scale,
                                           double length, double gap);

// Perceptual colour maps: t in [0, 1] (clamped; NaN gives grey) -> RGB in [0, 1].
std::array<float, 3> viridis(double t);
// Where `value` falls in [min, max] on a linear or log colour scale, clamped to [0, 1]; NaN when not plottable.
double colour_position(double value, double min, double max, AxisScale scale);

// A screen rectangle in pixels, top-left origin: [x0, x1) × [y0, y1).
struct PixelRect {
  double x0 = 0.0, y0 = 0.0, x1 = 0.0, y1 = 0.0;
  double width() const { return x1 - x0; }
  double height() const { return y1 - y0; }
};
// True when the rectangles share an interior point (touching edges do not overlap).
bool overlaps(const PixelRect& a, const PixelRect& b);

// Where a plot's legend of `legend_width` × `legend_height` pixels goes so that it never hides the data: outside the
// data area `area`, never over it. To its right (the area narrows by the legend and `gap`) when the area keeps at
// least `min_share` of its width; else below the `below` pixels of x-axis labels under it (the area shortens by the
// legend, `below` and `gap` are kept under it) when the area keeps `min_share` of its height; else to its right,
// narrowed so that the area keeps `min_share` of its width (the legend's text is clipped). A legend taller than the
// room beside the area is cut to that room (the widget then lists fewer entries).
struct LegendPlacement {
  PixelRect area;     // the data area that is left
  PixelRect legend;   // the legend's box
  bool right = true;  // beside the area (else below it)
};
LegendPlacement place_legend(PixelRect area, double legend_width, double legend_height, double below, double gap,
                             double min_share);

// The window's first rectangle on a monitor whose work area (the screen less panels and docks) is `work_area`: the
// whole work area. A work area smaller than 320 × 240 pixels (unknown, or a tiny virtual screen) gives
// `fallback_width` × `fallback_height` at the origin.
PixelRect initial_window_rect(PixelRect work_area, int fallback_width, int fallback_height);

// The look both renderers of a plot share (the ImDrawList widget, gui/plot/plot.cpp, and the SVG writer,
// gui/plot/figure_export.cpp), in pixels: the dash pattern of dashed series, the legend's limits.
inline constexpr double plot_dash_on_px = 7.0;
inline constexpr double plot_dash_off_px = 5.0;
inline constexpr std::size_t legend_max_entries = 14;
inline constexpr double legend_swatch_px = 22.0;
// A point marker in a legend swatch is at most this size (PlotSeries::marker_size), so that it fits the line.
inline constexpr float legend_marker_px = 4.0f;
// The share of the data area's width (or height) a legend beside it must leave to the data.
inline constexpr double legend_min_area_share = 0.6;

// The data area of a line plot or heatmap drawn in `frame` with text `line_height` pixels high: 64 pixels for the
// y tick labels at the left, a line for the title (when `has_title`) at the top, two lines for the x tick labels and
// the axis title at the bottom, `right_margin` at the right; at least 10 × 10 pixels.
PixelRect plot_data_area(PixelRect frame, double line_height, bool has_title, double right_margin);

// Alternating on/off lengths (pixels) along a polyline: the dashes of a dashed series. Returns the pieces
// as (start, end) fractions of each segment, for segment i of lengths[i].
struct DashPiece {
  std::size_t segment = 0;
  double from = 0.0, to = 1.0;  // fractions of the segment
};
std::vector<DashPiece> dash_pieces(const std::vector<double>& segment_lengths, double on, double off);

}  // namespace proplab::gui
