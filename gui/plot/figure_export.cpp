#include "gui/plot/figure_export.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace proplab::gui {

namespace {

// ImGui's dark style (ImGui::StyleColorsDark), as the screen draws: RGB bytes and opacity.
struct Paint {
  unsigned char r, g, b;
  double alpha;
};
constexpr Paint background_paint{15, 15, 15, 1.0};      // WindowBg, drawn opaque
constexpr Paint text_paint{255, 255, 255, 1.0};         // Text
constexpr Paint disabled_paint{128, 128, 128, 1.0};     // TextDisabled
constexpr Paint border_paint{110, 110, 128, 0.5};       // Border
constexpr Paint legend_paint{20, 20, 20, 0.94 * 0.85};  // PopupBg at 0.85
// As the widget draws axis markers (gui/plot/plot.cpp).
constexpr double marker_dash_on_px = 6.0;
constexpr double marker_dash_off_px = 4.0;
constexpr double marker_thickness_px = 2.0;
constexpr double marker_label_gap_px = 4.0;
// The font's ascent: SVG places text by its baseline, ImGui by its top.
constexpr double font_ascent = 10.0;

std::string number(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f", value);
  std::string out = text;
  while (!out.empty() && out.back() == '0') out.pop_back();
  if (!out.empty() && out.back() == '.') out.pop_back();
  return out == "-0" ? "0" : out;
}

std::string exact(double value) {
  char text[40];
  std::snprintf(text, sizeof(text), "%.17g", value);
  return text;
}

std::string escape_xml(const std::string& text) {
  std::string out;
  for (const char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\n':
        out += "&#10;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string rgb_text(unsigned char r, unsigned char g, unsigned char b) {
  char text[8];
  std::snprintf(text, sizeof(text), "#%02x%02x%02x", r, g, b);
  return text;
}

std::string fill(const Paint& paint, double alpha_scale = 1.0) {
  return "fill=\"" + rgb_text(paint.r, paint.g, paint.b) + "\" fill-opacity=\"" + number(paint.alpha * alpha_scale) +
         "\"";
}

std::string stroke(const Paint& paint, double alpha_scale = 1.0) {
  return "stroke=\"" + rgb_text(paint.r, paint.g, paint.b) + "\" stroke-opacity=\"" +
         number(paint.alpha * alpha_scale) + "\"";
}

Paint paint_of(ImU32 colour) {
  return Paint{static_cast<unsigned char>((colour >> IM_COL32_R_SHIFT) & 0xFF),
               static_cast<unsigned char>((colour >> IM_COL32_G_SHIFT) & 0xFF),
               static_cast<unsigned char>((colour >> IM_COL32_B_SHIFT) & 0xFF),
               static_cast<double>((colour >> IM_COL32_A_SHIFT) & 0xFF) / 255.0};
}

Paint paint_of(const std::array<float, 3>& rgb) {
  const auto byte = [](float v) { return static_cast<unsigned char>(std::lround(std::clamp(v, 0.0f, 1.0f) * 255.0f)); };
  return Paint{byte(rgb[0]), byte(rgb[1]), byte(rgb[2]), 1.0};
}

// The width of `text` in the default font: 7 pixels a character (UTF-8 continuation bytes take none).
double text_width(const std::string& text) {
  double characters = 0.0;
  for (const char c : text) {
    if ((static_cast<unsigned char>(c) & 0xC0) != 0x80) characters += 1.0;
  }
  return characters * figure_char_width;
}

enum class Anchor { start, middle, end };

// Text whose top-left (start), top-centre (middle) or top-right (end) is at (x, y).
void text(std::ostringstream& svg, double x, double y, const std::string& content, const Paint& paint,
          Anchor anchor = Anchor::start, const std::string& css_class = "") {
  if (content.empty()) return;
  svg << "<text x=\"" << number(x) << "\" y=\"" << number(y + font_ascent) << "\" " << fill(paint);
  if (anchor == Anchor::middle) svg << " text-anchor=\"middle\"";
  if (anchor == Anchor::end) svg << " text-anchor=\"end\"";
  if (!css_class.empty()) svg << " class=\"" << css_class << "\"";
  svg << ">" << escape_xml(content) << "</text>\n";
}

void line(std::ostringstream& svg, double x0, double y0, double x1, double y1, const Paint& paint, double width,
          double alpha_scale = 1.0, const std::string& dashes = "") {
  svg << "<line x1=\"" << number(x0) << "\" y1=\"" << number(y0) << "\" x2=\"" << number(x1) << "\" y2=\"" << number(y1)
      << "\" " << stroke(paint, alpha_scale) << " stroke-width=\"" << number(width) << "\"";
  if (!dashes.empty()) svg << " stroke-dasharray=\"" << dashes << "\"";
  svg << "/>\n";
}

void rect(std::ostringstream& svg, const PixelRect& box, const std::string& paint_attributes,
          const std::string& extra = "") {
  svg << "<rect x=\"" << number(box.x0) << "\" y=\"" << number(box.y0) << "\" width=\"" << number(box.width())
      << "\" height=\"" << number(box.height()) << "\" " << paint_attributes;
  if (!extra.empty()) svg << " " << extra;
  svg << "/>\n";
}

// The title (centred over the area, clear of the y label) and the y axis' title at the top-left.
void title(std::ostringstream& svg, const PixelRect& frame, const PixelRect& area, const std::string& title_text,
           const std::string& y_label) {
  text(svg, frame.x0 + 4.0, frame.y0 + 2.0, y_label, text_paint, Anchor::start, "axis-label y-label");
  if (title_text.empty()) return;
  const double width = text_width(title_text);
  const double left = std::max((area.x0 + area.x1) / 2.0 - width / 2.0, frame.x0 + 4.0 + text_width(y_label) + 12.0);
  text(svg, left, frame.y0 + 2.0, title_text, text_paint, Anchor::start, "title");
}

// Grid lines, tick labels, the x axis' title and the frame of the data area, as the widget's draw_axes.
void axes(std::ostringstream& svg, const PixelRect& area, const AxisTransform& x, const AxisTransform& y,
          const std::vector<Tick>& x_ticks, const std::vector<Tick>& y_ticks, const std::string& x_label) {
  svg << "<g class=\"axes\">\n";
  for (const auto& tick : x_ticks) {
    const double px = x.to_pixel(tick.value);
    if (px < area.x0 - 0.5 || px > area.x1 + 0.5) continue;
    // Major grid lines in the border colour at 0.9 of its opacity, minor ones at 0.35 (as on screen).
    line(svg, px, area.y0, px, area.y1, border_paint, 1.0, tick.major ? 0.9 : 0.35);
    text(svg, px, area.y1 + 3.0, tick.label, text_paint, Anchor::middle, "tick x-tick");
  }
  for (const auto& tick : y_ticks) {
    const double py = y.to_pixel(tick.value);
    if (py < area.y0 - 0.5 || py > area.y1 + 0.5) continue;
    line(svg, area.x0, py, area.x1, py, border_paint, 1.0, tick.major ? 0.9 : 0.35);
    text(svg, area.x0 - 4.0, py - figure_line_height / 2.0, tick.label, text_paint, Anchor::end, "tick y-tick");
  }
  text(svg, (area.x0 + area.x1) / 2.0, area.y1 + figure_line_height + 5.0, x_label, text_paint, Anchor::middle,
       "axis-label x-label");
  rect(svg, area, "fill=\"none\" " + stroke(border_paint));
  svg << "</g>\n";
}

std::string attribute(const char* name, const std::string& value) {
  return std::string(" ") + name + "=\"" + escape_xml(value) + "\"";
}

// One point marker centred at (x, y), as the widget's draw_point_marker.
void point_marker(std::ostringstream& svg, PointMarker marker, double size, double thickness, const Paint& paint,
                  double x, double y) {
  if (marker == PointMarker::circle) {
    svg << "<circle class=\"marker marker-circle\" cx=\"" << number(x) << "\" cy=\"" << number(y) << "\" r=\""
        << number(size) << "\" " << fill(paint) << " stroke=\"none\"/>\n";
  } else if (marker == PointMarker::cross) {
    const double half = size / std::sqrt(2.0);
    svg << "<path class=\"marker marker-cross\" data-x=\"" << number(x) << "\" data-y=\"" << number(y) << "\" d=\"M"
        << number(x - half) << "," << number(y - half) << " L" << number(x + half) << "," << number(y + half) << " M"
        << number(x - half) << "," << number(y + half) << " L" << number(x + half) << "," << number(y - half)
        << "\" stroke-width=\"" << number(thickness) << "\"/>\n";
  }
}

void series_element(std::ostringstream& svg, const std::string& panel, const PlotSeries& series, const AxisTransform& x,
                    const AxisTransform& y) {
  const Paint paint = paint_of(series.colour);
  svg << "<g class=\"series\"" << attribute("data-panel", panel) << attribute("data-run", series.run)
      << attribute("data-probe", series.probe) << attribute("data-label", series.label)
      << attribute("data-dashed", series.dashed ? "true" : "false") << " fill=\"none\" " << stroke(paint)
      << " stroke-width=\"" << number(series.thickness) << "\" stroke-linejoin=\"round\"";
  if (series.dashed)
    svg << " stroke-dasharray=\"" << number(plot_dash_on_px) << " " << number(plot_dash_off_px) << "\"";
  svg << ">\n";
  std::vector<std::pair<double, double>> stretch, marks;
  const auto flush = [&] {
    if (!series.line) {
      stretch.clear();
      return;
    }
    if (stretch.size() >= 2) {
      svg << "<polyline points=\"";
      for (std::size_t i = 0; i < stretch.size(); ++i) {
        svg << (i ? " " : "") << number(stretch[i].first) << "," << number(stretch[i].second);
      }
      svg << "\"/>\n";
    } else if (stretch.size() == 1) {
      svg << "<circle cx=\"" << number(stretch[0].first) << "\" cy=\"" << number(stretch[0].second) << "\" r=\""
          << number(series.thickness + 1.0) << "\" " << fill(paint) << " stroke=\"none\"/>\n";
    }
    stretch.clear();
  };
  const std::size_t n = std::min(series.x.size(), series.y.size());
  for (std::size_t i = 0; i < n; ++i) {
    if (!plottable(series.x[i], x.scale()) || !plottable(series.y[i], y.scale())) {
      flush();
      continue;
    }
    stretch.emplace_back(x.to_pixel(series.x[i]), y.to_pixel(series.y[i]));
    marks.push_back(stretch.back());
  }
  flush();
  for (const auto& [mark_x, mark_y] : marks)
    point_marker(svg, series.marker, series.marker_size, series.thickness, paint, mark_x, mark_y);
  svg << "</g>\n";
}

void legend(std::ostringstream& svg, const PixelRect& box, const std::vector<const PlotSeries*>& entries) {
  if (entries.empty() || box.width() <= 0.0 || box.height() <= 0.0) return;
  const auto room = static_cast<std::size_t>(std::max(0.0, (box.height() - 8.0) / figure_line_height));
  std::size_t shown = std::min({entries.size(), legend_max_entries, room});
  if (shown < entries.size() && shown == room && shown > 0) --shown;  // a line for "+n more"
  svg << "<g class=\"legend\">\n";
  rect(svg, box, fill(legend_paint) + " " + stroke(border_paint));
  for (std::size_t i = 0; i < shown; ++i) {
    const PlotSeries& series = *entries[i];
    const double top = box.y0 + 4.0 + static_cast<double>(i) * figure_line_height;
    const double mid = top + figure_line_height / 2.0;
    const Paint paint = paint_of(series.colour);
    if (series.line && series.dashed) {
      line(svg, box.x0 + 5.0, mid, box.x0 + 11.0, mid, paint, 2.0);
      line(svg, box.x0 + 15.0, mid, box.x0 + 21.0, mid, paint, 2.0);
    } else if (series.line) {
      line(svg, box.x0 + 5.0, mid, box.x0 + 21.0, mid, paint, 2.0);
    }
    if (series.marker != PointMarker::none) {
      svg << "<g " << stroke(paint) << ">\n";
      point_marker(svg, series.marker, std::min<double>(series.marker_size, legend_marker_px), 2.0, paint,
                   box.x0 + 13.0, mid);
      svg << "</g>\n";
    }
    text(svg, box.x0 + legend_swatch_px + 6.0, top, legend_key(series), text_paint, Anchor::start, "legend-entry");
  }
  if (entries.size() > shown) {
    text(svg, box.x0 + legend_swatch_px + 6.0, box.y0 + 4.0 + static_cast<double>(shown) * figure_line_height,
         "+" + std::to_string(entries.size() - shown) + " more", disabled_paint);
  }
  svg << "</g>\n";
}

std::vector<MarkerPlacement> marker_places(const std::vector<AxisMarker>& markers, AxisRange range, AxisScale scale,
                                           double length, double label_size) {
  return place_axis_markers(markers, range, scale, length, label_size,
                            [](const std::string& label) { return text_width(label); });
}

std::string marker_dashes() { return number(marker_dash_on_px) + " " + number(marker_dash_off_px); }

void plot_panel(std::ostringstream& svg, const FigurePanel& panel, int index) {
  const PlotSpec& spec = panel.plot;
  PixelRect area = plot_data_area(panel.frame, figure_line_height, !spec.title.empty() || !spec.y_label.empty(), 10.0);
  const std::vector<const PlotSeries*> entries = legend_entries(spec);
  PixelRect legend_box;
  if (!entries.empty()) {
    const LegendSize size = legend_box_size(spec, figure_line_height, text_width);
    const LegendPlacement placement = place_legend(area, size.width, size.height, 2.0 * figure_line_height + 8.0, 8.0,
                                                   legend_min_area_share);
    area = placement.area;
    legend_box = placement.legend;
  }
  // The view the widget fits before the user zooms.
  std::vector<ValueSpan> xs, ys;
  for (const auto& series : spec.series) {
    xs.push_back({series.x.data(), series.x.size()});
    ys.push_back({series.y.data(), series.y.size()});
  }
  const AxisRange x_range =
      make_valid_range(spec.x_range ? *spec.x_range : fit_range(xs, spec.x_scale, 0.02), spec.x_scale);
  const AxisRange y_range =
      make_valid_range(spec.y_range ? *spec.y_range : fit_range(ys, spec.y_scale, 0.05), spec.y_scale);
  const AxisTransform x(x_range, spec.x_scale, area.x0, area.x1);
  const AxisTransform y(y_range, spec.y_scale, area.y1, area.y0);

  svg << "<g class=\"plot\"" << attribute("data-panel", panel.name) << " data-x-min=\"" << exact(x_range.min)
      << "\" data-x-max=\"" << exact(x_range.max) << "\" data-y-min=\"" << exact(y_range.min) << "\" data-y-max=\""
      << exact(y_range.max) << "\" data-x-scale=\"" << (spec.x_scale == AxisScale::log ? "log" : "linear")
      << "\" data-y-scale=\"" << (spec.y_scale == AxisScale::log ? "log" : "linear") << "\" data-area=\""
      << number(area.x0) << " " << number(area.y0) << " " << number(area.x1) << " " << number(area.y1) << "\">\n";
  title(svg, panel.frame, area, spec.title, spec.y_label);
  const int y_target = std::max(2, static_cast<int>(area.height() / 45.0));
  axes(svg, area, x, y, plot_x_ticks(spec, x_range, area.width(), text_width),
       axis_ticks(y_range, spec.y_scale, y_target), spec.x_label);

  const std::string clip = "clip" + std::to_string(index);
  svg << "<clipPath id=\"" << clip << "\">";
  rect(svg, area, "");
  svg << "</clipPath>\n<g clip-path=\"url(#" << clip << ")\">\n";
  const auto places = marker_places(spec.x_markers, x_range, spec.x_scale, area.width(), 0.0);
  for (std::size_t m = 0; m < spec.x_markers.size(); ++m) {
    if (!spec.x_markers[m].line || !places[m].line) continue;
    const double px = area.x0 + places[m].line_at;
    line(svg, px, area.y0, px, area.y1, paint_of(spec.x_markers[m].colour), marker_thickness_px, 1.0, marker_dashes());
  }
  for (const auto& series : spec.series) series_element(svg, panel.name, series, x, y);
  for (std::size_t m = 0; m < spec.x_markers.size(); ++m) {
    if (!places[m].label) continue;
    const AxisMarker& marker = spec.x_markers[m];
    const double left = area.x0 + places[m].label_at;
    const double top = area.y1 - 3.0 - static_cast<double>(marker.label_row + 1) * figure_line_height;
    rect(svg, PixelRect{left - 2.0, top, left + text_width(marker.label) + 2.0, top + figure_line_height},
         fill(background_paint, 0.8));
    text(svg, left, top, marker.label, paint_of(marker.colour), Anchor::start, "marker-label");
  }
  if (spec.x_marker && plottable(*spec.x_marker, spec.x_scale)) {
    const double px = x.to_pixel(*spec.x_marker);
    line(svg, px, area.y0, px, area.y1, text_paint, 1.0, 0.5);
  }
  svg << "</g>\n";
  legend(svg, legend_box, entries);
  svg << "</g>\n";
}

void heatmap_panel(std::ostringstream& svg, const FigurePanel& panel) {
  const HeatmapSpec& spec = panel.cells;
  const PixelRect area = plot_data_area(panel.frame, figure_line_height, true, 96.0);
  svg << "<g class=\"heatmap\"" << attribute("data-panel", panel.name) << attribute("data-run", spec.run)
      << " data-rows=\"" << spec.rows << "\" data-columns=\"" << spec.columns << "\">\n";
  title(svg, panel.frame, area, spec.title, spec.y_label);
  const bool has_data =
      spec.rows > 0 && spec.columns > 0 && spec.values.size() == static_cast<std::size_t>(spec.rows * spec.columns);
  if (!has_data) {
    text(svg, area.x0 + 8.0, area.y0 + 8.0, "no records", disabled_paint);
    svg << "</g>\n";
    return;
  }
  const AxisRange value_range = heatmap_value_range(spec);
  const double cell_w = area.width() / static_cast<double>(spec.columns);
  const double cell_h = area.height() / static_cast<double>(spec.rows);
  svg << "<g class=\"cells\" shape-rendering=\"crispEdges\">\n";
  for (std::int64_t r = 0; r < spec.rows; ++r) {
    const double y1 = area.y1 - static_cast<double>(r) * cell_h;
    for (std::int64_t c = 0; c < spec.columns; ++c) {
      const double value = spec.values[static_cast<std::size_t>(r * spec.columns + c)];
      const Paint paint =
          paint_of(viridis(colour_position(value, value_range.min, value_range.max, spec.colour_scale)));
      // Cells overlap by a fraction of a pixel so that no background shows through rounding gaps (as on screen).
      const double x0 = area.x0 + static_cast<double>(c) * cell_w;
      svg << "<rect class=\"cell\" data-row=\"" << r << "\" data-column=\"" << c << "\" x=\"" << number(x0) << "\" y=\""
          << number(y1 - cell_h) << "\" width=\"" << number(cell_w + 0.5) << "\" height=\"" << number(cell_h + 0.5)
          << "\" fill=\"" << rgb_text(paint.r, paint.g, paint.b) << "\"/>\n";
    }
  }
  svg << "</g>\n";
  std::vector<Tick> x_ticks, y_ticks;
  for (const auto& tick : linear_ticks({0.0, static_cast<double>(spec.columns - 1) + 1e-9},
                                       std::max(2, static_cast<int>(area.width() / 90.0)))) {
    if (tick.value != std::floor(tick.value)) continue;
    const auto column = static_cast<std::size_t>(tick.value);
    x_ticks.push_back(Tick{tick.value + 0.5,
                           column < spec.column_values.size() ? format_value(spec.column_values[column]) : tick.label,
                           true});
  }
  if (!spec.row_ticks.empty()) {
    const std::size_t stride = tick_stride(spec.row_ticks.size(), std::max(2, static_cast<int>(area.height() / 30.0)));
    for (std::size_t t = 0; t < spec.row_ticks.size(); t += stride) y_ticks.push_back(spec.row_ticks[t]);
  } else {
    for (const auto& tick : linear_ticks({0.0, static_cast<double>(spec.rows - 1) + 1e-9},
                                         std::max(2, static_cast<int>(area.height() / 45.0)))) {
      if (tick.value == std::floor(tick.value)) y_ticks.push_back(Tick{tick.value + 0.5, tick.label, true});
    }
  }
  const AxisTransform x({0.0, static_cast<double>(spec.columns)}, AxisScale::linear, area.x0, area.x1);
  const AxisTransform y({0.0, static_cast<double>(spec.rows)}, AxisScale::linear, area.y1, area.y0);
  axes(svg, area, x, y, x_ticks, {}, spec.x_label);
  for (const auto& tick : y_ticks) {
    text(svg, area.x0 - 4.0, y.to_pixel(tick.value) - figure_line_height / 2.0, tick.label, text_paint, Anchor::end,
         "tick y-tick");
  }
  // Row markers (stage starts), as the widget's draw_row_markers.
  const auto row_places = marker_places(spec.row_markers, {0.0, static_cast<double>(spec.rows)}, AxisScale::linear,
                                        area.height(), figure_line_height);
  for (std::size_t m = 0; m < spec.row_markers.size(); ++m) {
    const AxisMarker& marker = spec.row_markers[m];
    const double py = area.y1 - row_places[m].line_at;
    if (marker.line && row_places[m].line) {
      line(svg, area.x0, py, area.x1, py, paint_of(marker.colour), marker_thickness_px, 1.0, marker_dashes());
    }
    if (!row_places[m].label) continue;
    const double width = text_width(marker.label);
    const double left =
        area.x0 + marker_label_gap_px + static_cast<double>(marker.label_row) * (width + 2.0 * marker_label_gap_px);
    const double top = area.y1 - row_places[m].label_at - figure_line_height;
    rect(svg, PixelRect{left - 2.0, top, left + width + 2.0, top + figure_line_height},
         "fill=\"#000000\" fill-opacity=\"" + number(170.0 / 255.0) + "\"");
    text(svg, left, top, marker.label, paint_of(marker.colour), Anchor::start, "marker-label");
  }
  // The colour bar with its ticks and the value's title above it.
  const PixelRect bar{area.x1 + 12.0, area.y0, area.x1 + 28.0, area.y1};
  constexpr int bar_steps = 64;
  svg << "<g class=\"colour-bar\" shape-rendering=\"crispEdges\">\n";
  for (int i = 0; i < bar_steps; ++i) {
    const double t0 = static_cast<double>(i) / bar_steps, t1 = static_cast<double>(i + 1) / bar_steps;
    const Paint paint = paint_of(viridis((t0 + t1) / 2.0));
    rect(svg, PixelRect{bar.x0, bar.y1 - t1 * bar.height() - 0.5, bar.x1, bar.y1 - t0 * bar.height()},
         "fill=\"" + rgb_text(paint.r, paint.g, paint.b) + "\"");
  }
  rect(svg, bar, "fill=\"none\" " + stroke(border_paint));
  const AxisTransform bar_axis(value_range, spec.colour_scale, bar.y1, bar.y0);
  for (const auto& tick :
       axis_ticks(value_range, spec.colour_scale, std::max(2, static_cast<int>(area.height() / 45.0)))) {
    if (!tick.major) continue;
    const double py = bar_axis.to_pixel(tick.value);
    line(svg, bar.x1, py, bar.x1 + 4.0, py, text_paint, 1.0);
    text(svg, bar.x1 + 6.0, py - figure_line_height / 2.0, tick.label, text_paint, Anchor::start, "tick");
  }
  text(svg, bar.x0, panel.frame.y0 + 2.0, spec.value_label, text_paint, Anchor::start, "axis-label value-label");
  svg << "</g>\n</g>\n";
}

std::string csv_field(const std::string& value) {
  if (value.find_first_of(",\"\n") == std::string::npos) return value;
  std::string out = "\"";
  for (const char c : value) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

}  // namespace

std::string figure_svg(const Figure& figure) {
  std::ostringstream svg;
  svg << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << number(figure.width) << "\" height=\""
      << number(figure.height) << "\" viewBox=\"0 0 " << number(figure.width) << " " << number(figure.height)
      << "\" font-family=\"ProggyClean, 'DejaVu Sans Mono', monospace\" font-size=\"" << number(figure_line_height)
      << "px\">\n";
  rect(svg, PixelRect{0.0, 0.0, figure.width, figure.height}, fill(background_paint), "class=\"background\"");
  for (const auto& heading : figure.texts) {
    text(svg, heading.x, heading.y, heading.text, heading.disabled ? disabled_paint : text_paint, Anchor::start,
         "heading");
  }
  int index = 0;
  for (const auto& panel : figure.panels) {
    if (panel.heatmap) {
      heatmap_panel(svg, panel);
    } else {
      plot_panel(svg, panel, index++);
    }
  }
  svg << "</svg>\n";
  return svg.str();
}

std::string figure_csv(const Figure& figure) {
  const bool cells_only = !figure.panels.empty() && std::all_of(figure.panels.begin(), figure.panels.end(),
                                                                [](const FigurePanel& panel) { return panel.heatmap; });
  std::ostringstream csv;
  if (cells_only) {
    csv << "panel,run,row,column,probe,step,value\n";
    for (const auto& panel : figure.panels) {
      const HeatmapSpec& spec = panel.cells;
      if (spec.values.size() != static_cast<std::size_t>(std::max<std::int64_t>(0, spec.rows * spec.columns))) continue;
      for (std::int64_t r = 0; r < spec.rows; ++r) {
        const std::string probe =
            static_cast<std::size_t>(r) < spec.row_probes.size() ? spec.row_probes[static_cast<std::size_t>(r)] : "";
        for (std::int64_t c = 0; c < spec.columns; ++c) {
          csv << csv_field(panel.name) << "," << csv_field(spec.run) << "," << r << "," << c << "," << csv_field(probe)
              << ","
              << (static_cast<std::size_t>(c) < spec.column_values.size()
                      ? exact(spec.column_values[static_cast<std::size_t>(c)])
                      : "")
              << "," << exact(spec.values[static_cast<std::size_t>(r * spec.columns + c)]) << "\n";
        }
      }
    }
    return csv.str();
  }
  csv << "panel,series,run,probe,x,y\n";
  for (const auto& panel : figure.panels) {
    if (panel.heatmap) continue;
    for (const auto& series : panel.plot.series) {
      const std::size_t n = std::min(series.x.size(), series.y.size());
      for (std::size_t i = 0; i < n; ++i) {
        const std::string& probe = i < series.point_probes.size() ? series.point_probes[i] : series.probe;
        csv << csv_field(panel.name) << "," << csv_field(series.label) << "," << csv_field(series.run) << ","
            << csv_field(probe) << "," << exact(series.x[i]) << "," << exact(series.y[i]) << "\n";
      }
    }
  }
  return csv.str();
}

std::string write_file_atomically(const std::string& path, const std::string& contents) {
  const std::string partial = path + ".partial";
  {
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    if (!out) return "cannot create " + partial + ": " + std::strerror(errno) + " (does its folder exist?)";
    out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
    out.flush();
    if (!out) {
      std::error_code ignored;
      std::filesystem::remove(partial, ignored);
      return "cannot write " + partial;
    }
  }
  std::error_code error;
  std::filesystem::rename(partial, path, error);
  if (error) {
    std::error_code ignored;
    std::filesystem::remove(partial, ignored);
    return "cannot rename " + partial + " to " + path + ": " + error.message();
  }
  return "";
}

}  // namespace proplab::gui
