// gui/plot/plot: a focused line-plot and heatmap widget drawn with ImGui's ImDrawList (ImPlot is not packaged
// for Debian). The maths (ticks, transforms, zoom, colour maps) is in plot_math.h and unit-tested.
//
// Interaction (when the mouse is over the plot): wheel zooms about the mouse (Shift: x only, Ctrl: y only),
// left drag pans, right drag draws a zoom box, double-click fits the data again, a right click (no drag) opens a
// menu (fit, save PNG), clicking a legend entry hides or shows that series; the crosshair follows the mouse and
// the nearest point's series and its read-out (PlotSeries::point_labels, else x and y) are shown. The legend sits
// beside the data area, never over it (place_legend).
//
// Invariants:
// - Everything a plot remembers between frames lives in its PlotState / HeatmapState, owned by the caller (the
//   app's AppState): the widget keeps no statics. Ranges follow the data (or the spec's fixed ranges) until the
//   user zooms or pans; double-click returns to following.
// - Values an axis cannot show (NaN, inf, <= 0 on a log axis) break the line instead of being drawn.
// - A PNG export only records a request (ExportRequest: the plot's screen rectangle); the app reads the pixels
//   back after rendering the next frame (the one without the menu that asked) and writes the file off the frame
//   thread.
#pragma once

#include <imgui.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "gui/plot/plot_math.h"

namespace proplab::gui {

ImU32 series_colour(std::size_t index, float alpha = 1.0f);

// A mark drawn at every plottable point of a series: a filled disc or an × (two crossed strokes).
enum class PointMarker { none, circle, cross };

struct PlotSeries {
  std::string label;
  std::vector<double> x, y;
  ImU32 colour = IM_COL32_WHITE;
  bool dashed = false;
  float thickness = 2.0f;
  // Marks at the points, `marker_size` pixels from their centre to their edge (a disc's radius, half an ×'s
  // diagonal); with `line` off only the marks are drawn (a lone point then has no dot of its own either).
  PointMarker marker = PointMarker::none;
  float marker_size = 4.0f;
  bool line = true;
  bool in_legend = true;
  // The legend entry's text and the key that hides the series: series of one legend_name share one entry (the first
  // of them in_legend) and are hidden and shown together. Empty: the label.
  std::string legend_name;
  // When non-empty, one read-out per point (e.g. probe_point_text: probe, block, step, value): the hover shows it
  // under the series' label instead of the point's x and y.
  std::vector<std::string> point_labels;
  // What the series shows, for exports (SVG data attributes, CSV columns): its run's name, the probe it follows
  // (one probe against the step), or one probe name per point (a depth profile).
  std::string run, probe;
  std::vector<std::string> point_probes;
};

// The series' legend entry and hiding key: its legend_name, else its label.
const std::string& legend_key(const PlotSeries& series);

ImU32 marker_colour(float alpha = 1.0f);

// A labelled place on an axis, e.g. where a ResNet stage begins: a dashed line across the plot (when `line`) and
// `label` beside it, both in `colour`. Labels of one `label_row` never overlap (place_markers); plots whose runs have
// different stage layouts give each run its own row.
struct AxisMarker {
  double value = 0.0;
  std::string label;
  bool line = true;
  ImU32 colour = marker_colour();
  int label_row = 0;
};
// Where `markers` and their labels go along an axis of `length` pixels (place_markers): labels `label_size` pixels
// long, or as wide as `text_width` measures them when label_size is 0 (the screen's font, or an SVG's estimate).
std::vector<MarkerPlacement> place_axis_markers(const std::vector<AxisMarker>& markers, AxisRange range,
                                                AxisScale scale, double length, double label_size,
                                                const std::function<double(const std::string&)>& text_width);

struct PlotSpec {
  std::string title, x_label, y_label;
  AxisScale x_scale = AxisScale::linear;
  AxisScale y_scale = AxisScale::linear;
  std::vector<PlotSeries> series;
  std::optional<AxisRange> x_range, y_range;  // fixed ranges (e.g. shared axes); else fitted to the data
  std::optional<double> x_marker;             // a vertical line, e.g. the current record's step
  std::vector<AxisMarker> x_markers;          // dashed vertical lines, labelled at the bottom (stage starts)
  // Named x ticks (e.g. each block's name at its start on the block axis), shown instead of numbers, thinned to fit
  // (plot_x_ticks); numbers where fewer than two are in view.
  std::vector<Tick> x_names;
  bool legend = true;
  // Panels drawn side by side (compare, grid): the legend is sized for these labels and lines too (the widest and
  // longest legend of the panels), so every panel's data area is the same size and their axes line up.
  std::vector<std::string> legend_peer_labels;
  std::size_t legend_peer_lines = 0;
};

// The series a plot's legend lists: those in_legend, one per legend_key, none when spec.legend is off.
std::vector<const PlotSeries*> legend_entries(const PlotSpec& spec);
// The size of a plot's legend box for text `line_height` pixels high (width measured by `text_width`): its entries
// (at most legend_max_entries, then a "+n more" line) and the spec's peer labels and lines; 0 × 0 without entries.
struct LegendSize {
  double width = 0.0, height = 0.0;
};
LegendSize legend_box_size(const PlotSpec& spec, double line_height,
                           const std::function<double(const std::string&)>& text_width);
// Sets the legend peers of `specs` (panels drawn side by side) to the union of their legends' labels and the most
// lines any of them has.
void share_legend_size(std::vector<PlotSpec*> specs);
// The x ticks of a plot whose x axis is `length` pixels and shows `range`: spec.x_names thinned to fit (named_ticks,
// labels measured by `text_width`) on a linear axis, else numbers (axis_ticks).
std::vector<Tick> plot_x_ticks(const PlotSpec& spec, AxisRange range, double length,
                               const std::function<double(const std::string&)>& text_width);

// The screen rectangle a widget last drew, and a pending PNG export of it.
struct ExportRequest {
  bool requested = false;
  bool armed = false;                    // the request has waited one frame (for the menu that made it to close)
  float x0 = 0, y0 = 0, x1 = 0, y1 = 0;  // screen pixels, top-left origin
  std::string name;                      // suggested file stem (the plot's title)
};

struct PlotState {
  bool user_view = false;  // zoomed or panned: keep x/y instead of fitting
  AxisRange x, y;
  AxisScale x_scale = AxisScale::linear, y_scale = AxisScale::linear;  // scales the view was made for
  std::set<std::string> hidden;                                        // labels of hidden series
  bool box_active = false;
  float box_x = 0, box_y = 0;  // where the zoom box started
  ExportRequest export_request;
  PixelRect area, legend;  // the data area and the legend's box as last drawn (screen pixels; no legend: empty)
};

// Draws a line plot of `size` pixels at the cursor of the current window.
void draw_plot(const char* id, PlotState& state, const PlotSpec& spec, ImVec2 size);

struct HeatmapSpec {
  std::string title, x_label, y_label, value_label;
  std::int64_t rows = 0, columns = 0;   // rows along y (probes, bottom = row 0), columns along x (records)
  std::vector<double> values;           // [rows, columns] row-major
  std::vector<std::string> row_labels;  // one per row (probe descriptions)
  std::vector<std::string> row_probes;  // one per row: the probe's name (exports)
  std::string run;                      // the run shown (exports)
  std::vector<double> column_values;    // one per column (record steps), for labels
  // When non-empty: the y axis' labels instead of row numbers (value = a row coordinate: row r spans [r, r + 1]).
  std::vector<Tick> row_ticks;
  std::vector<AxisMarker> row_markers;  // dashed horizontal lines at row boundaries, labelled at the left (stages)
  AxisScale colour_scale = AxisScale::linear;
  std::optional<AxisRange> value_range;  // a fixed colour range (e.g. shared by small multiples); else the data's
  // When set: a texture holding heatmap_rgba(spec) (nearest filtering), drawn as one image instead of one
  // rectangle per cell (the app uploads it when the data changes; 40k cells cost ~5 ms of tessellation a frame).
  ImTextureID texture = nullptr;
};

struct HeatmapState {
  ExportRequest export_request;
};

// The colour range of a heatmap: spec.value_range, else that of every plottable value (on its colour scale).
AxisRange heatmap_value_range(const HeatmapSpec& spec);
// The cells as an RGBA image, columns × rows, top image row = the last spec row (drawn at the top).
std::vector<unsigned char> heatmap_rgba(const HeatmapSpec& spec);

// Draws a heatmap with a viridis colour bar and a hover read-out.
void draw_heatmap(const char* id, HeatmapState& state, const HeatmapSpec& spec, ImVec2 size);

// Writes `rgba` (width × height × 4 bytes, top row first) as a PNG; false when the file could not be written.
bool write_png(const std::string& path, int width, int height, const std::vector<unsigned char>& rgba);
// `rgba` (as write_png) encoded as a PNG file's bytes; empty when the size does not match.
std::string encode_png(int width, int height, const std::vector<unsigned char>& rgba);

}  // namespace proplab::gui
