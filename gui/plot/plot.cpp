#include "gui/plot/plot.h"

#include <stb/stb_image_write.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace proplab::gui {

namespace {

constexpr float hover_radius_px = 24.0f;
constexpr float marker_dash_on_px = 6.0f;
constexpr float marker_dash_off_px = 4.0f;
constexpr float marker_thickness_px = 2.0f;
constexpr float marker_label_gap_px = 4.0f;

double screen_text_width(const std::string& text) { return ImGui::CalcTextSize(text.c_str()).x; }

struct PlotLayout {
  ImVec2 frame_min, frame_max;  // the whole widget
  ImVec2 area_min, area_max;    // the data area
};

PlotLayout make_layout(ImVec2 size, bool has_title, float right_margin) {
  const ImVec2 origin = ImGui::GetCursorScreenPos();
  const float line = ImGui::GetTextLineHeight();
  PlotLayout layout;
  layout.frame_min = origin;
  layout.frame_max = ImVec2(origin.x + size.x, origin.y + size.y);
  const PixelRect area = plot_data_area(PixelRect{origin.x, origin.y, origin.x + size.x, origin.y + size.y}, line,
                                        has_title, right_margin);
  layout.area_min = ImVec2(static_cast<float>(area.x0), static_cast<float>(area.y0));
  layout.area_max = ImVec2(static_cast<float>(area.x1), static_cast<float>(area.y1));
  return layout;
}

void draw_title(ImDrawList* draw, const PlotLayout& layout, const std::string& title, const std::string& y_label) {
  const ImU32 text = ImGui::GetColorU32(ImGuiCol_Text);
  if (!y_label.empty())
    draw->AddText(ImVec2(layout.frame_min.x + 4.0f, layout.frame_min.y + 2.0f), text, y_label.c_str());
  if (!title.empty()) {
    const float width = ImGui::CalcTextSize(title.c_str()).x;
    const float centre = (layout.area_min.x + layout.area_max.x) / 2.0f;
    draw->AddText(ImVec2(std::max(centre - width / 2.0f,
                                  layout.frame_min.x + 4.0f + ImGui::CalcTextSize(y_label.c_str()).x + 12.0f),
                         layout.frame_min.y + 2.0f),
                  text, title.c_str());
  }
}

// Grid lines and tick labels for both axes.
void draw_axes(ImDrawList* draw, const PlotLayout& layout, const AxisTransform& x, const AxisTransform& y,
               const std::vector<Tick>& x_ticks, const std::vector<Tick>& y_ticks, const std::string& x_label) {
  const ImU32 major_grid = ImGui::GetColorU32(ImGuiCol_Border, 0.9f);
  const ImU32 minor_grid = ImGui::GetColorU32(ImGuiCol_Border, 0.35f);
  const ImU32 text = ImGui::GetColorU32(ImGuiCol_Text);
  const float line = ImGui::GetTextLineHeight();
  for (const auto& tick : x_ticks) {
    const float px = static_cast<float>(x.to_pixel(tick.value));
    if (px < layout.area_min.x - 0.5f || px > layout.area_max.x + 0.5f) continue;
    draw->AddLine(ImVec2(px, layout.area_min.y), ImVec2(px, layout.area_max.y), tick.major ? major_grid : minor_grid);
    if (!tick.label.empty()) {
      const float width = ImGui::CalcTextSize(tick.label.c_str()).x;
      draw->AddText(ImVec2(px - width / 2.0f, layout.area_max.y + 3.0f), text, tick.label.c_str());
    }
  }
  for (const auto& tick : y_ticks) {
    const float py = static_cast<float>(y.to_pixel(tick.value));
    if (py < layout.area_min.y - 0.5f || py > layout.area_max.y + 0.5f) continue;
    draw->AddLine(ImVec2(layout.area_min.x, py), ImVec2(layout.area_max.x, py), tick.major ? major_grid : minor_grid);
    if (!tick.label.empty()) {
      const ImVec2 extent = ImGui::CalcTextSize(tick.label.c_str());
      draw->AddText(ImVec2(layout.area_min.x - extent.x - 4.0f, py - extent.y / 2.0f), text, tick.label.c_str());
    }
  }
  if (!x_label.empty()) {
    const float width = ImGui::CalcTextSize(x_label.c_str()).x;
    draw->AddText(ImVec2((layout.area_min.x + layout.area_max.x - width) / 2.0f, layout.area_max.y + line + 5.0f), text,
                  x_label.c_str());
  }
  draw->AddRect(layout.area_min, layout.area_max, ImGui::GetColorU32(ImGuiCol_Border));
}

// One of a series' point markers centred at `at`.
void draw_point_marker(ImDrawList* draw, PointMarker marker, float size, float thickness, ImU32 colour, ImVec2 at) {
  if (marker == PointMarker::circle) {
    draw->AddCircleFilled(at, size, colour);
  } else if (marker == PointMarker::cross) {
    const float half = size / std::sqrt(2.0f);
    draw->AddLine(ImVec2(at.x - half, at.y - half), ImVec2(at.x + half, at.y + half), colour, thickness);
    draw->AddLine(ImVec2(at.x - half, at.y + half), ImVec2(at.x + half, at.y - half), colour, thickness);
  }
}

// Draws one series as polylines broken at unplottable points (dashed series follow one dash pattern throughout),
// and its point markers.
void draw_series(ImDrawList* draw, const PlotSeries& series, const AxisTransform& x, const AxisTransform& y,
                 std::vector<ImVec2>& scratch) {
  const std::size_t n = std::min(series.x.size(), series.y.size());
  auto flush = [&] {
    if (scratch.size() >= 2) {
      if (!series.dashed) {
        draw->AddPolyline(scratch.data(), static_cast<int>(scratch.size()), series.colour, ImDrawFlags_None,
                          series.thickness);
      } else {
        std::vector<double> lengths(scratch.size() - 1);
        for (std::size_t i = 0; i + 1 < scratch.size(); ++i) {
          lengths[i] = std::hypot(scratch[i + 1].x - scratch[i].x, scratch[i + 1].y - scratch[i].y);
        }
        // Every dash is one plain quad, all reserved at once: a stroke per dash (AddLine) cost ~10 ms a frame
        // for 200 dashed theory lines (docs/perf.md).
        const auto pieces = dash_pieces(lengths, plot_dash_on_px, plot_dash_off_px);
        draw->PrimReserve(static_cast<int>(pieces.size()) * 6, static_cast<int>(pieces.size()) * 4);
        const ImVec2 uv = ImGui::GetFontTexUvWhitePixel();
        const float half = series.thickness / 2.0f;
        for (const auto& piece : pieces) {
          const ImVec2 a = scratch[piece.segment], b = scratch[piece.segment + 1];
          const auto at = [&](double t) {
            return ImVec2(a.x + static_cast<float>(t) * (b.x - a.x), a.y + static_cast<float>(t) * (b.y - a.y));
          };
          const ImVec2 from = at(piece.from), to = at(piece.to);
          const float length = std::hypot(to.x - from.x, to.y - from.y);
          const float nx = length > 0.0f ? -(to.y - from.y) / length * half : 0.0f;
          const float ny = length > 0.0f ? (to.x - from.x) / length * half : 0.0f;
          draw->PrimQuadUV(ImVec2(from.x + nx, from.y + ny), ImVec2(to.x + nx, to.y + ny), ImVec2(to.x - nx, to.y - ny),
                           ImVec2(from.x - nx, from.y - ny), uv, uv, uv, uv, series.colour);
        }
      }
    } else if (scratch.size() == 1) {
      draw->AddCircleFilled(scratch[0], series.thickness + 1.0f, series.colour);
    }
    scratch.clear();
  };
  scratch.clear();
  for (std::size_t i = 0; i < n; ++i) {
    if (!plottable(series.x[i], x.scale()) || !plottable(series.y[i], y.scale())) {
      if (series.line) flush();
      continue;
    }
    scratch.emplace_back(static_cast<float>(x.to_pixel(series.x[i])), static_cast<float>(y.to_pixel(series.y[i])));
    draw_point_marker(draw, series.marker, series.marker_size, series.thickness, series.colour, scratch.back());
  }
  if (series.line) flush();
  scratch.clear();
}

// The legend in its box beside the data area (place_legend); a click on an entry toggles its series. Lists as many
// entries as the box holds, then "+n more".
void draw_legend(ImDrawList* draw, const PixelRect& box, const std::vector<const PlotSeries*>& entries,
                 PlotState& state, bool hovered, bool& legend_under_mouse) {
  legend_under_mouse = false;
  if (entries.empty() || box.width() <= 0.0 || box.height() <= 0.0) return;
  const float line = ImGui::GetTextLineHeight();
  const auto room = static_cast<std::size_t>(std::max(0.0, (box.height() - 8.0) / line));
  std::size_t shown = std::min({entries.size(), legend_max_entries, room});
  if (shown < entries.size() && shown == room && shown > 0) --shown;  // a line for "+n more"
  char more_text[48] = "";
  if (entries.size() > shown) std::snprintf(more_text, sizeof(more_text), "+%zu more", entries.size() - shown);
  const std::string more = more_text;
  const ImVec2 box_min(static_cast<float>(box.x0), static_cast<float>(box.y0));
  const ImVec2 box_max(static_cast<float>(box.x1), static_cast<float>(box.y1));
  draw->AddRectFilled(box_min, box_max, ImGui::GetColorU32(ImGuiCol_PopupBg, 0.85f));
  draw->AddRect(box_min, box_max, ImGui::GetColorU32(ImGuiCol_Border));
  draw->PushClipRect(box_min, box_max, true);
  const ImVec2 mouse = ImGui::GetIO().MousePos;
  legend_under_mouse =
      hovered && mouse.x >= box_min.x && mouse.x <= box_max.x && mouse.y >= box_min.y && mouse.y <= box_max.y;
  for (std::size_t i = 0; i < shown; ++i) {
    const PlotSeries& series = *entries[i];
    const float top = box_min.y + 4.0f + static_cast<float>(i) * line;
    const std::string& key = legend_key(series);
    const bool hidden = state.hidden.count(key) > 0;
    const float mid = top + line / 2.0f;
    const ImU32 colour = hidden ? ImGui::GetColorU32(ImGuiCol_TextDisabled) : series.colour;
    if (series.line && series.dashed) {
      draw->AddLine(ImVec2(box_min.x + 5.0f, mid), ImVec2(box_min.x + 11.0f, mid), colour, 2.0f);
      draw->AddLine(ImVec2(box_min.x + 15.0f, mid), ImVec2(box_min.x + 21.0f, mid), colour, 2.0f);
    } else if (series.line) {
      draw->AddLine(ImVec2(box_min.x + 5.0f, mid), ImVec2(box_min.x + 21.0f, mid), colour, 2.0f);
    }
    draw_point_marker(draw, series.marker, std::min(series.marker_size, legend_marker_px), 2.0f, colour,
                      ImVec2(box_min.x + 13.0f, mid));
    draw->AddText(ImVec2(box_min.x + static_cast<float>(legend_swatch_px) + 6.0f, top),
                  ImGui::GetColorU32(hidden ? ImGuiCol_TextDisabled : ImGuiCol_Text), key.c_str());
    if (legend_under_mouse && ImGui::IsMouseClicked(ImGuiMouseButton_Left) && mouse.y >= top && mouse.y < top + line) {
      if (hidden) {
        state.hidden.erase(key);
      } else {
        state.hidden.insert(key);
      }
    }
  }
  if (!more.empty()) {
    draw->AddText(ImVec2(box_min.x + static_cast<float>(legend_swatch_px) + 6.0f,
                         box_min.y + 4.0f + static_cast<float>(shown) * line),
                  ImGui::GetColorU32(ImGuiCol_TextDisabled), more.c_str());
  }
  draw->PopClipRect();
}

// A dashed straight line. Ends are put on pixel centres (ImGui adds half a pixel) so that the line's core is crisp.
void draw_dashed_line(ImDrawList* draw, ImVec2 a, ImVec2 b, ImU32 colour) {
  a = ImVec2(std::floor(a.x), std::floor(a.y));
  b = ImVec2(std::floor(b.x), std::floor(b.y));
  for (const auto& piece :
       dash_pieces({static_cast<double>(std::hypot(b.x - a.x, b.y - a.y))}, marker_dash_on_px, marker_dash_off_px)) {
    const auto at = [&](double t) {
      return ImVec2(a.x + static_cast<float>(t) * (b.x - a.x), a.y + static_cast<float>(t) * (b.y - a.y));
    };
    draw->AddLine(at(piece.from), at(piece.to), colour, marker_thickness_px);
  }
}

// Where `markers` and their labels go along an axis of `length` pixels (labels `label_size` pixels long, or their
// text widths when label_size is 0).
std::vector<MarkerPlacement> marker_places(const std::vector<AxisMarker>& markers, AxisRange range, AxisScale scale,
                                           double length, float label_size) {
  return place_axis_markers(markers, range, scale, length, label_size, screen_text_width);
}

void remember_rect(ExportRequest& request, const PlotLayout& layout, const std::string& name) {
  request.x0 = layout.frame_min.x;
  request.y0 = layout.frame_min.y;
  request.x1 = layout.frame_max.x;
  request.y1 = layout.frame_max.y;
  request.name = name;
}

// The right-click menu shared by both widgets.
void context_menu(const char* popup, ExportRequest& request, PlotState* plot_state) {
  if (!ImGui::BeginPopup(popup)) return;
  if (plot_state != nullptr && ImGui::MenuItem("Fit to data", "double-click")) plot_state->user_view = false;
  if (plot_state != nullptr && !plot_state->hidden.empty() && ImGui::MenuItem("Show every series")) {
    plot_state->hidden.clear();
  }
  if (ImGui::MenuItem("Save as PNG")) request.requested = true;
  ImGui::EndPopup();
}

}  // namespace

ImU32 marker_colour(float alpha) {
  const auto rgb = marker_rgb();
  return IM_COL32(rgb[0], rgb[1], rgb[2], static_cast<int>(std::lround(std::clamp(alpha, 0.0f, 1.0f) * 255.0f)));
}

ImU32 series_colour(std::size_t index, float alpha) {
  const auto rgb = series_rgb(index);
  return IM_COL32(rgb[0], rgb[1], rgb[2], static_cast<int>(std::lround(std::clamp(alpha, 0.0f, 1.0f) * 255.0f)));
}

namespace {

// The view: the data (or the spec's fixed ranges) unless the user moved it.
void fit_view(PlotState& state, const PlotSpec& spec) {
  if (state.x_scale != spec.x_scale || state.y_scale != spec.y_scale) {
    state.user_view = false;
    state.x_scale = spec.x_scale;
    state.y_scale = spec.y_scale;
  }
  if (!state.user_view) {
    std::vector<ValueSpan> xs, ys;
    for (const auto& series : spec.series) {
      if (state.hidden.count(legend_key(series))) continue;
      xs.push_back({series.x.data(), series.x.size()});
      ys.push_back({series.y.data(), series.y.size()});
    }
    state.x = spec.x_range ? *spec.x_range : fit_range(xs, spec.x_scale, 0.02);
    state.y = spec.y_range ? *spec.y_range : fit_range(ys, spec.y_scale, 0.05);
  }
  state.x = make_valid_range(state.x, spec.x_scale);
  state.y = make_valid_range(state.y, spec.y_scale);
}

// Wheel zoom, drag pan, right-drag box zoom (or the menu on a right click), double-click reset: before drawing,
// so the frame shows their result.
void handle_input(PlotState& state, const PlotSpec& spec, const PlotLayout& layout, bool in_area, bool active) {
  ImGuiIO& io = ImGui::GetIO();
  const ImVec2 mouse = io.MousePos;
  const float width = layout.area_max.x - layout.area_min.x, height = layout.area_max.y - layout.area_min.y;
  const AxisTransform x(state.x, spec.x_scale, layout.area_min.x, layout.area_max.x);
  const AxisTransform y(state.y, spec.y_scale, layout.area_max.y, layout.area_min.y);
  if (in_area && io.MouseWheel != 0.0f) {
    const double factor = std::pow(0.85, io.MouseWheel);
    if (!io.KeyCtrl) state.x = zoom_range(state.x, spec.x_scale, x.from_pixel(mouse.x), factor);
    if (!io.KeyShift) state.y = zoom_range(state.y, spec.y_scale, y.from_pixel(mouse.y), factor);
    state.user_view = true;
  }
  if (active && ImGui::IsMouseDragging(ImGuiMouseButton_Left) && (io.MouseDelta.x != 0 || io.MouseDelta.y != 0)) {
    state.x = pan_range(state.x, spec.x_scale, -io.MouseDelta.x, width);
    state.y = pan_range(state.y, spec.y_scale, io.MouseDelta.y, height);
    state.user_view = true;
  }
  if (in_area && ImGui::IsMouseClicked(ImGuiMouseButton_Right)) {
    state.box_active = true;
    state.box_x = mouse.x;
    state.box_y = mouse.y;
  }
  if (state.box_active && ImGui::IsMouseReleased(ImGuiMouseButton_Right)) {
    state.box_active = false;
    const float dx = std::fabs(mouse.x - state.box_x), dy = std::fabs(mouse.y - state.box_y);
    if (dx > 4.0f && dy > 4.0f) {
      state.x = range_between(x.from_pixel(state.box_x), x.from_pixel(mouse.x), spec.x_scale);
      state.y = range_between(y.from_pixel(state.box_y), y.from_pixel(mouse.y), spec.y_scale);
      state.user_view = true;
    } else {
      ImGui::OpenPopup("menu");
    }
  }
  if (in_area && ImGui::IsMouseDoubleClicked(ImGuiMouseButton_Left)) state.user_view = false;
}

// The crosshair and the nearest point's values, in a tooltip.
void draw_hover(ImDrawList* draw, const PlotLayout& layout, const PlotSpec& spec, const PlotState& state,
                const AxisTransform& x, const AxisTransform& y, ImVec2 mouse) {
  const ImU32 cross = ImGui::GetColorU32(ImGuiCol_Text, 0.35f);
  draw->AddLine(ImVec2(mouse.x, layout.area_min.y), ImVec2(mouse.x, layout.area_max.y), cross);
  draw->AddLine(ImVec2(layout.area_min.x, mouse.y), ImVec2(layout.area_max.x, mouse.y), cross);
  const PlotSeries* best_series = nullptr;
  std::size_t best_index = 0;
  double best_distance = hover_radius_px;
  std::vector<PixelPoint> points;
  for (const auto& series : spec.series) {
    if (state.hidden.count(legend_key(series))) continue;
    const std::size_t n = std::min(series.x.size(), series.y.size());
    points.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      const bool ok = plottable(series.x[i], spec.x_scale) && plottable(series.y[i], spec.y_scale);
      points[i] =
          ok ? PixelPoint{x.to_pixel(series.x[i]), y.to_pixel(series.y[i])} : PixelPoint{std::nan(""), std::nan("")};
    }
    const long index = nearest_point(points, mouse.x, mouse.y, best_distance);
    if (index < 0) continue;
    best_distance = std::hypot(points[index].x - mouse.x, points[index].y - mouse.y);
    best_series = &series;
    best_index = static_cast<std::size_t>(index);
  }
  ImGui::BeginTooltip();
  if (best_series != nullptr) {
    const ImVec2 at(static_cast<float>(x.to_pixel(best_series->x[best_index])),
                    static_cast<float>(y.to_pixel(best_series->y[best_index])));
    draw->AddCircle(at, 5.0f, best_series->colour, 12, 2.0f);
    ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(best_series->colour), "%s", best_series->label.c_str());
    if (best_index < best_series->point_labels.size()) {
      ImGui::TextUnformatted(best_series->point_labels[best_index].c_str());
      ImGui::EndTooltip();
      return;
    }
    ImGui::Text("%s = %s", spec.x_label.empty() ? "x" : spec.x_label.c_str(),
                format_value(best_series->x[best_index]).c_str());
    ImGui::Text("%s = %s", spec.y_label.empty() ? "y" : spec.y_label.c_str(),
                format_value(best_series->y[best_index]).c_str());
  } else {
    ImGui::Text("%s, %s", format_value(x.from_pixel(mouse.x)).c_str(), format_value(y.from_pixel(mouse.y)).c_str());
  }
  ImGui::EndTooltip();
}

}  // namespace

void draw_plot(const char* id, PlotState& state, const PlotSpec& spec, ImVec2 size) {
  ImGui::PushID(id);
  PlotLayout layout = make_layout(size, !spec.title.empty() || !spec.y_label.empty(), 10.0f);
  // The legend goes beside the data area (right, else below), never over it.
  const auto entries = legend_entries(spec);
  PixelRect legend_box;
  if (!entries.empty()) {
    const float line = ImGui::GetTextLineHeight();
    const LegendSize legend = legend_box_size(spec, line, screen_text_width);
    const LegendPlacement placement =
        place_legend(PixelRect{layout.area_min.x, layout.area_min.y, layout.area_max.x, layout.area_max.y},
                     legend.width, legend.height, 2.0 * line + 8.0, 8.0, legend_min_area_share);
    layout.area_max = ImVec2(static_cast<float>(placement.area.x1), static_cast<float>(placement.area.y1));
    legend_box = placement.legend;
  }
  remember_rect(state.export_request, layout, spec.title.empty() ? id : spec.title);
  state.area = PixelRect{layout.area_min.x, layout.area_min.y, layout.area_max.x, layout.area_max.y};
  state.legend = legend_box;
  ImGui::InvisibleButton("plot", size, ImGuiButtonFlags_MouseButtonLeft | ImGuiButtonFlags_MouseButtonRight);
  const bool hovered = ImGui::IsItemHovered();
  const bool active = ImGui::IsItemActive();
  ImDrawList* draw = ImGui::GetWindowDrawList();
  ImGuiIO& io = ImGui::GetIO();

  fit_view(state, spec);
  const float width = layout.area_max.x - layout.area_min.x, height = layout.area_max.y - layout.area_min.y;
  const ImVec2 mouse = io.MousePos;
  const bool in_area = hovered && mouse.x >= layout.area_min.x && mouse.x <= layout.area_max.x &&
                       mouse.y >= layout.area_min.y && mouse.y <= layout.area_max.y;

  // No filled background: the data area shows the window's colour, framed and gridded. A filled rectangle this
  // size is a blended full-area fill, 40% of a frame under a software renderer (llvmpipe, docs/perf.md).
  draw_title(draw, layout, spec.title, spec.y_label);
  bool legend_under_mouse = false;

  handle_input(state, spec, layout, in_area, active);

  const AxisTransform x(state.x, spec.x_scale, layout.area_min.x, layout.area_max.x);
  const AxisTransform y(state.y, spec.y_scale, layout.area_max.y, layout.area_min.y);
  const int y_target = std::max(2, static_cast<int>(height / 45.0f));
  draw_axes(draw, layout, x, y, plot_x_ticks(spec, state.x, width, screen_text_width),
            axis_ticks(state.y, spec.y_scale, y_target), spec.x_label);

  draw->PushClipRect(layout.area_min, layout.area_max, true);
  const auto marker_placements = marker_places(spec.x_markers, state.x, spec.x_scale, width, 0.0f);
  for (std::size_t m = 0; m < spec.x_markers.size(); ++m) {
    if (!spec.x_markers[m].line || !marker_placements[m].line) continue;
    const float px = layout.area_min.x + static_cast<float>(marker_placements[m].line_at);
    draw_dashed_line(draw, ImVec2(px, layout.area_min.y), ImVec2(px, layout.area_max.y), spec.x_markers[m].colour);
  }
  std::vector<ImVec2> scratch;
  for (const auto& series : spec.series) {
    if (!state.hidden.count(legend_key(series))) draw_series(draw, series, x, y, scratch);
  }
  // Labels along the bottom of the data area, on a backing that dims the lines
  // beneath them.
  for (std::size_t m = 0; m < spec.x_markers.size(); ++m) {
    if (!marker_placements[m].label) continue;
    const AxisMarker& marker = spec.x_markers[m];
    const ImVec2 extent = ImGui::CalcTextSize(marker.label.c_str());
    const ImVec2 at(layout.area_min.x + static_cast<float>(marker_placements[m].label_at),
                    layout.area_max.y - 3.0f - static_cast<float>(marker.label_row + 1) * extent.y);
    draw->AddRectFilled(ImVec2(at.x - 2.0f, at.y), ImVec2(at.x + extent.x + 2.0f, at.y + extent.y),
                        ImGui::GetColorU32(ImGuiCol_WindowBg, 0.8f));
    draw->AddText(at, marker.colour, marker.label.c_str());
  }
  if (spec.x_marker && plottable(*spec.x_marker, spec.x_scale)) {
    const float px = static_cast<float>(x.to_pixel(*spec.x_marker));
    draw->AddLine(ImVec2(px, layout.area_min.y), ImVec2(px, layout.area_max.y), ImGui::GetColorU32(ImGuiCol_Text, 0.5f),
                  1.0f);
  }
  if (state.box_active) {
    draw->AddRectFilled(ImVec2(std::min(state.box_x, mouse.x), std::min(state.box_y, mouse.y)),
                        ImVec2(std::max(state.box_x, mouse.x), std::max(state.box_y, mouse.y)),
                        ImGui::GetColorU32(ImGuiCol_TextSelectedBg, 0.5f));
  }
  draw->PopClipRect();
  draw_legend(draw, legend_box, entries, state, hovered, legend_under_mouse);

  if (in_area && !legend_under_mouse && !state.box_active) draw_hover(draw, layout, spec, state, x, y, mouse);
  context_menu("menu", state.export_request, &state);
  ImGui::PopID();
}

namespace {

// Row markers (stage starts): dashed lines along row boundaries, labels at the left above them on a dark backing
// (the cells beneath may be any colour).
void draw_row_markers(ImDrawList* draw, const PlotLayout& layout, const HeatmapSpec& spec) {
  const float height = layout.area_max.y - layout.area_min.y;
  const auto row_places = marker_places(spec.row_markers, {0.0, static_cast<double>(spec.rows)}, AxisScale::linear,
                                        height, ImGui::GetTextLineHeight());
  for (std::size_t m = 0; m < spec.row_markers.size(); ++m) {
    const AxisMarker& marker = spec.row_markers[m];
    const float py = layout.area_max.y - static_cast<float>(row_places[m].line_at);
    if (marker.line && row_places[m].line) {
      draw_dashed_line(draw, ImVec2(layout.area_min.x, py), ImVec2(layout.area_max.x, py), marker.colour);
    }
    if (!row_places[m].label) continue;
    const ImVec2 extent = ImGui::CalcTextSize(marker.label.c_str());
    const ImVec2 at(layout.area_min.x + marker_label_gap_px +
                        static_cast<float>(marker.label_row) * (extent.x + 2.0f * marker_label_gap_px),
                    layout.area_max.y - static_cast<float>(row_places[m].label_at) - extent.y);
    draw->AddRectFilled(ImVec2(at.x - 2.0f, at.y), ImVec2(at.x + extent.x + 2.0f, at.y + extent.y),
                        IM_COL32(0, 0, 0, 170));
    draw->AddText(at, marker.colour, marker.label.c_str());
  }
}

// The colour bar beside the cells, with its own ticks and the value label above it.
void draw_colour_bar(ImDrawList* draw, const PlotLayout& layout, const HeatmapSpec& spec,
                     const AxisRange& value_range) {
  const float height = layout.area_max.y - layout.area_min.y;
  const ImU32 text = ImGui::GetColorU32(ImGuiCol_Text);
  const ImVec2 bar_min(layout.area_max.x + 12.0f, layout.area_min.y);
  const ImVec2 bar_max(bar_min.x + 16.0f, layout.area_max.y);
  constexpr int bar_steps = 64;
  for (int i = 0; i < bar_steps; ++i) {
    const float t0 = static_cast<float>(i) / bar_steps, t1 = static_cast<float>(i + 1) / bar_steps;
    const auto rgb = viridis((t0 + t1) / 2.0f);
    draw->AddRectFilled(ImVec2(bar_min.x, bar_max.y - t1 * (bar_max.y - bar_min.y) - 0.5f),
                        ImVec2(bar_max.x, bar_max.y - t0 * (bar_max.y - bar_min.y)),
                        ImGui::ColorConvertFloat4ToU32(ImVec4(rgb[0], rgb[1], rgb[2], 1.0f)));
  }
  draw->AddRect(bar_min, bar_max, ImGui::GetColorU32(ImGuiCol_Border));
  const AxisTransform bar(value_range, spec.colour_scale, bar_max.y, bar_min.y);
  for (const auto& tick : axis_ticks(value_range, spec.colour_scale, std::max(2, static_cast<int>(height / 45.0f)))) {
    if (!tick.major) continue;
    const float py = static_cast<float>(bar.to_pixel(tick.value));
    draw->AddLine(ImVec2(bar_max.x, py), ImVec2(bar_max.x + 4.0f, py), text);
    draw->AddText(ImVec2(bar_max.x + 6.0f, py - ImGui::GetTextLineHeight() / 2.0f), text, tick.label.c_str());
  }
  if (!spec.value_label.empty()) {
    draw->AddText(ImVec2(bar_min.x, layout.frame_min.y + 2.0f), text, spec.value_label.c_str());
  }
}

}  // namespace

void draw_heatmap(const char* id, HeatmapState& state, const HeatmapSpec& spec, ImVec2 size) {
  ImGui::PushID(id);
  const PlotLayout layout = make_layout(size, true, 96.0f);
  remember_rect(state.export_request, layout, spec.title.empty() ? id : spec.title);
  ImGui::InvisibleButton("heatmap", size, ImGuiButtonFlags_MouseButtonLeft | ImGuiButtonFlags_MouseButtonRight);
  const bool hovered = ImGui::IsItemHovered();
  ImDrawList* draw = ImGui::GetWindowDrawList();
  draw_title(draw, layout, spec.title, spec.y_label);
  const bool has_data =
      spec.rows > 0 && spec.columns > 0 && spec.values.size() == static_cast<std::size_t>(spec.rows * spec.columns);
  if (!has_data) {
    draw->AddText(ImVec2(layout.area_min.x + 8.0f, layout.area_min.y + 8.0f), ImGui::GetColorU32(ImGuiCol_TextDisabled),
                  "no records");
    ImGui::PopID();
    return;
  }
  const AxisRange value_range = heatmap_value_range(spec);
  const float width = layout.area_max.x - layout.area_min.x, height = layout.area_max.y - layout.area_min.y;
  const float cell_w = width / static_cast<float>(spec.columns), cell_h = height / static_cast<float>(spec.rows);
  if (spec.texture != nullptr) {
    draw->AddImage(spec.texture, layout.area_min, layout.area_max);
  } else {
    for (std::int64_t r = 0; r < spec.rows; ++r) {
      const float y1 = layout.area_max.y - static_cast<float>(r) * cell_h;
      const float y0 = y1 - cell_h;
      for (std::int64_t c = 0; c < spec.columns; ++c) {
        const double value = spec.values[static_cast<std::size_t>(r * spec.columns + c)];
        const auto rgb = viridis(colour_position(value, value_range.min, value_range.max, spec.colour_scale));
        const float x0 = layout.area_min.x + static_cast<float>(c) * cell_w;
        // Cells overlap by a fraction of a pixel so no background shows through rounding gaps.
        draw->AddRectFilled(ImVec2(x0, y0), ImVec2(x0 + cell_w + 0.5f, y1 + 0.5f),
                            ImGui::ColorConvertFloat4ToU32(ImVec4(rgb[0], rgb[1], rgb[2], 1.0f)));
      }
    }
  }
  // Axes: x on record index (labelled with the record's step), y on row (probe depth).
  std::vector<Tick> x_ticks, y_ticks;
  for (const auto& tick : linear_ticks({0.0, static_cast<double>(spec.columns - 1) + 1e-9},
                                       std::max(2, static_cast<int>(width / 90.0f)))) {
    if (tick.value != std::floor(tick.value)) continue;
    const auto column = static_cast<std::size_t>(tick.value);
    x_ticks.push_back(Tick{tick.value + 0.5,
                           column < spec.column_values.size() ? format_value(spec.column_values[column]) : tick.label,
                           true});
  }
  if (!spec.row_ticks.empty()) {
    const std::size_t stride = tick_stride(spec.row_ticks.size(), std::max(2, static_cast<int>(height / 30.0f)));
    for (std::size_t t = 0; t < spec.row_ticks.size(); t += stride) y_ticks.push_back(spec.row_ticks[t]);
  } else {
    for (const auto& tick : linear_ticks({0.0, static_cast<double>(spec.rows - 1) + 1e-9},
                                         std::max(2, static_cast<int>(height / 45.0f)))) {
      if (tick.value == std::floor(tick.value)) y_ticks.push_back(Tick{tick.value + 0.5, tick.label, true});
    }
  }
  const AxisTransform x({0.0, static_cast<double>(spec.columns)}, AxisScale::linear, layout.area_min.x,
                        layout.area_max.x);
  const AxisTransform y({0.0, static_cast<double>(spec.rows)}, AxisScale::linear, layout.area_max.y, layout.area_min.y);
  draw_axes(draw, layout, x, y, x_ticks, {}, spec.x_label);
  const ImU32 text = ImGui::GetColorU32(ImGuiCol_Text);
  for (const auto& tick : y_ticks) {
    const float py = static_cast<float>(y.to_pixel(tick.value));
    const ImVec2 extent = ImGui::CalcTextSize(tick.label.c_str());
    draw->AddText(ImVec2(layout.area_min.x - extent.x - 4.0f, py - extent.y / 2.0f), text, tick.label.c_str());
  }

  draw_row_markers(draw, layout, spec);
  draw_colour_bar(draw, layout, spec, value_range);

  // Hover read-out.
  const ImVec2 mouse = ImGui::GetIO().MousePos;
  if (hovered && mouse.x >= layout.area_min.x && mouse.x < layout.area_max.x && mouse.y >= layout.area_min.y &&
      mouse.y < layout.area_max.y) {
    const auto column = std::clamp<std::int64_t>(static_cast<std::int64_t>((mouse.x - layout.area_min.x) / cell_w), 0,
                                                 spec.columns - 1);
    const auto row =
        std::clamp<std::int64_t>(static_cast<std::int64_t>((layout.area_max.y - mouse.y) / cell_h), 0, spec.rows - 1);
    const float x0 = layout.area_min.x + static_cast<float>(column) * cell_w;
    const float y1 = layout.area_max.y - static_cast<float>(row) * cell_h;
    draw->AddRect(ImVec2(x0, y1 - cell_h), ImVec2(x0 + cell_w, y1), IM_COL32_WHITE, 0.0f, 0, 1.5f);
    ImGui::BeginTooltip();
    if (static_cast<std::size_t>(row) < spec.row_labels.size()) ImGui::TextUnformatted(spec.row_labels[row].c_str());
    if (static_cast<std::size_t>(column) < spec.column_values.size()) {
      ImGui::Text("%s %s", spec.x_label.c_str(), format_value(spec.column_values[column]).c_str());
    }
    ImGui::Text("%s = %s", spec.value_label.c_str(),
                format_value(spec.values[static_cast<std::size_t>(row * spec.columns + column)]).c_str());
    ImGui::EndTooltip();
  }
  if (hovered && ImGui::IsMouseReleased(ImGuiMouseButton_Right)) ImGui::OpenPopup("menu");
  context_menu("menu", state.export_request, nullptr);
  ImGui::PopID();
}

AxisRange heatmap_value_range(const HeatmapSpec& spec) {
  if (spec.value_range) return make_valid_range(*spec.value_range, spec.colour_scale);
  return fit_range({{spec.values.data(), spec.values.size()}}, spec.colour_scale, 0.0);
}

std::vector<unsigned char> heatmap_rgba(const HeatmapSpec& spec) {
  std::vector<unsigned char> rgba(static_cast<std::size_t>(std::max<std::int64_t>(0, spec.rows * spec.columns)) * 4);
  if (rgba.empty() || spec.values.size() != static_cast<std::size_t>(spec.rows * spec.columns)) return {};
  const AxisRange range = heatmap_value_range(spec);
  for (std::int64_t r = 0; r < spec.rows; ++r) {
    const std::int64_t image_row = spec.rows - 1 - r;
    for (std::int64_t c = 0; c < spec.columns; ++c) {
      const auto rgb = viridis(colour_position(spec.values[static_cast<std::size_t>(r * spec.columns + c)], range.min,
                                               range.max, spec.colour_scale));
      unsigned char* pixel = &rgba[static_cast<std::size_t>(image_row * spec.columns + c) * 4];
      for (int k = 0; k < 3; ++k) pixel[k] = static_cast<unsigned char>(std::lround(rgb[k] * 255.0f));
      pixel[3] = 255;
    }
  }
  return rgba;
}

bool write_png(const std::string& path, int width, int height, const std::vector<unsigned char>& rgba) {
  if (width <= 0 || height <= 0 || rgba.size() != static_cast<std::size_t>(width) * height * 4) return false;
  return stbi_write_png(path.c_str(), width, height, 4, rgba.data(), width * 4) != 0;
}

std::string encode_png(int width, int height, const std::vector<unsigned char>& rgba) {
  if (width <= 0 || height <= 0 || rgba.size() != static_cast<std::size_t>(width) * height * 4) return {};
  std::string bytes;
  const auto append = [](void* context, void* data, int size) {
    static_cast<std::string*>(context)->append(static_cast<const char*>(data), static_cast<std::size_t>(size));
  };
  if (stbi_write_png_to_func(append, &bytes, width, height, 4, rgba.data(), width * 4) == 0) return {};
  return bytes;
}

const std::string& legend_key(const PlotSeries& series) {
  return series.legend_name.empty() ? series.label : series.legend_name;
}

std::vector<const PlotSeries*> legend_entries(const PlotSpec& spec) {
  std::vector<const PlotSeries*> entries;
  if (!spec.legend) return entries;
  std::set<std::string> listed;
  for (const auto& series : spec.series) {
    if (series.in_legend && listed.insert(legend_key(series)).second) entries.push_back(&series);
  }
  return entries;
}

namespace {
// Appends the labels a legend box shows to `labels` (at most legend_max_entries entries, then "+999 more", the
// widest such line a legend needs) and returns its lines.
std::size_t legend_lines(const std::vector<const PlotSeries*>& entries, std::vector<std::string>& labels) {
  const std::size_t shown = std::min(entries.size(), legend_max_entries);
  for (std::size_t i = 0; i < shown; ++i) labels.push_back(legend_key(*entries[i]));
  if (entries.size() > shown) labels.push_back("+999 more");
  return shown + (entries.size() > shown ? 1 : 0);
}
}  // namespace

LegendSize legend_box_size(const PlotSpec& spec, double line_height,
                           const std::function<double(const std::string&)>& text_width) {
  const auto entries = legend_entries(spec);
  if (entries.empty()) return {};
  std::vector<std::string> labels = spec.legend_peer_labels;
  const std::size_t lines = std::max(legend_lines(entries, labels), spec.legend_peer_lines);
  double width = 0.0;
  for (const auto& label : labels) width = std::max(width, text_width(label));
  return LegendSize{width + legend_swatch_px + 14.0, static_cast<double>(lines) * line_height + 8.0};
}

void share_legend_size(std::vector<PlotSpec*> specs) {
  std::vector<std::string> labels;
  std::size_t lines = 0;
  for (const PlotSpec* spec : specs) lines = std::max(lines, legend_lines(legend_entries(*spec), labels));
  std::sort(labels.begin(), labels.end());
  labels.erase(std::unique(labels.begin(), labels.end()), labels.end());
  for (PlotSpec* spec : specs) {
    spec->legend_peer_labels = labels;
    spec->legend_peer_lines = lines;
  }
}

std::vector<Tick> plot_x_ticks(const PlotSpec& spec, AxisRange range, double length,
                               const std::function<double(const std::string&)>& text_width) {
  if (!spec.x_names.empty() && spec.x_scale == AxisScale::linear) {
    // The longest name is the widest in the monospace fonts both renderers use: measure that one, not a thousand.
    const auto longest = std::max_element(spec.x_names.begin(), spec.x_names.end(), [](const Tick& a, const Tick& b) {
      return a.label.size() < b.label.size();
    });
    auto named = named_ticks(spec.x_names, range, length, text_width(longest->label), 12.0);
    if (!named.empty()) return named;
  }
  return axis_ticks(range, spec.x_scale, std::max(2, static_cast<int>(length / 90.0)));
}

std::vector<MarkerPlacement> place_axis_markers(const std::vector<AxisMarker>& markers, AxisRange range,
                                                AxisScale scale, double length, double label_size,
                                                const std::function<double(const std::string&)>& text_width) {
  std::vector<double> values, sizes;
  std::vector<int> rows;
  for (const auto& marker : markers) {
    values.push_back(marker.value);
    rows.push_back(marker.label_row);
    sizes.push_back(marker.label.empty() ? 0.0 : label_size > 0.0 ? label_size : text_width(marker.label));
  }
  return place_markers(values, rows, sizes, range, scale, length, marker_label_gap_px);
}

}  // namespace proplab::gui
