// gui/plot/figure_export: a figure (plot and heatmap panels at fixed places) written as SVG or as CSV of its data,
// without ImGui's drawing or OpenGL: the SVG is drawn from the same PlotSpec / HeatmapSpec and the same layout maths
// (plot_math: data area, ticks, transforms, legend placement, dash pattern, colour maps) as the screen's widgets
// (plot.h), in the colours of ImGui's dark style and its default font's metrics (13 px lines, 7 px per character).
//
// Invariants:
// - Every series of a plot panel is one <g class="series"> with data-panel, data-run, data-probe (empty for a depth
//   profile, whose points are probes), data-label and data-dashed attributes, holding one <polyline> per stretch of
//   plottable points (a lone point is a <circle>; neither when the series has no line), then one point marker per
//   plottable point when it has them: <circle class="marker marker-circle"> or <path class="marker marker-cross">
//   with its centre in data-x, data-y; a heatmap cell is a <rect class="cell"> with data-row and data-column. Axis
//   titles are <text class="axis-label">, the panel's x range is on its <g class="plot"> as data-x-min / data-x-max
//   (the y range likewise) and its data area's pixels as data-area="x0 y0 x1 y1".
// - Ranges are the spec's fixed ones, else fitted to every series as the widget fits them (2 % x, 5 % y padding).
// - CSV: a figure with a line plot writes one row per point (panel,series,run,probe,x,y); a figure of heatmaps only
//   writes one row per cell (panel,run,row,column,probe,step,value). Numbers are "%.17g" (so "nan" and "inf" stay).
// - Files are written atomically: into PATH.partial beside PATH, then renamed; on any failure nothing is left.
#pragma once

#include <string>
#include <vector>

#include "gui/plot/plot.h"
#include "gui/plot/plot_math.h"

namespace proplab::gui {

struct FigurePanel {
  std::string name;  // e.g. "depth", "compare/pre_ln" (CSV's panel column, SVG's data-panel)
  PixelRect frame;   // the widget's whole rectangle in the figure
  bool heatmap = false;
  PlotSpec plot;      // when !heatmap
  HeatmapSpec cells;  // when heatmap
};

struct FigureText {
  double x = 0.0, y = 0.0;  // top-left of the text
  std::string text;
  bool disabled = false;  // drawn in the dimmed text colour
};

struct Figure {
  double width = 1280.0, height = 800.0;
  std::vector<FigureText> texts;  // headings
  std::vector<FigurePanel> panels;
};

// The text height and the advance of one character of ImGui's default font (ProggyClean, 13 px).
inline constexpr double figure_line_height = 13.0;
inline constexpr double figure_char_width = 7.0;

// The SVG document of `figure`.
std::string figure_svg(const Figure& figure);
// The CSV of the data `figure` plots (see the invariants).
std::string figure_csv(const Figure& figure);

// Writes `contents` to `path` atomically; returns "" on success, else why it failed (nothing is left behind).
std::string write_file_atomically(const std::string& path, const std::string& contents);

}  // namespace proplab::gui
