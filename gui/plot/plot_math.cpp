#include "gui/plot/plot_math.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace proplab::gui {

namespace {

constexpr double tick_tolerance = 1e-9;

// Tableau's 10 categorical colours.
constexpr unsigned char tableau[10][3] = {{31, 119, 180},  {255, 127, 14}, {44, 160, 44},   {214, 39, 40},
                                          {148, 103, 189}, {140, 86, 75},  {227, 119, 194}, {127, 127, 127},
                                          {188, 189, 34},  {23, 190, 207}};
// matplotlib's viridis sampled at t = 0, 0.1, ..., 1.
constexpr float viridis_table[11][3] = {
    {0.267004f, 0.004874f, 0.329415f}, {0.282623f, 0.140926f, 0.457517f}, {0.253935f, 0.265254f, 0.529983f},
    {0.206756f, 0.371758f, 0.553117f}, {0.163625f, 0.471133f, 0.558148f}, {0.127568f, 0.566949f, 0.550556f},
    {0.134692f, 0.658636f, 0.517649f}, {0.266941f, 0.748751f, 0.440573f}, {0.477504f, 0.821444f, 0.318195f},
    {0.741388f, 0.873449f, 0.149561f}, {0.993248f, 0.906157f, 0.143936f}};

std::string printf_string(const char* format, int precision, double value) {
  char text[64];
  std::snprintf(text, sizeof(text), format, precision, value);
  return text;
}

double to_linear_space(double value, AxisScale scale) { return scale == AxisScale::log ? std::log10(value) : value; }
double from_linear_space(double value, AxisScale scale) {
  return scale == AxisScale::log ? std::pow(10.0, value) : value;
}

}  // namespace

double nice_step(double span, int target) {
  if (!(span > 0.0) || !std::isfinite(span)) return 1.0;
  const double raw = span / std::max(target, 1);
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double normalised = raw / magnitude;
  double nice = 10.0;
  if (normalised < 1.5) {
    nice = 1.0;
  } else if (normalised < 3.5) {
    nice = 2.0;
  } else if (normalised < 7.5) {
    nice = 5.0;
  }
  return nice * magnitude;
}

std::string format_tick(double value, double step) {
  if (value == 0.0) return "0";
  const double magnitude = std::fabs(value);
  if (step <= 0.0) return format_value(value);
  if (magnitude >= 1e5 || magnitude < 1e-4) {
    // Scientific, with the mantissa digits the step needs relative to the value.
    const int digits =
        std::clamp(static_cast<int>(std::floor(std::log10(magnitude)) - std::floor(std::log10(step))), 0, 6);
    return printf_string("%.*e", digits, value);
  }
  const int decimals = std::clamp(static_cast<int>(-std::floor(std::log10(step) + tick_tolerance)), 0, 9);
  return printf_string("%.*f", decimals, value);
}

std::string format_value(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  return printf_string("%.*g", 4, value);
}

std::vector<Tick> linear_ticks(AxisRange range, int target) {
  std::vector<Tick> ticks;
  const double span = range.max - range.min;
  if (!(span > 0.0) || !std::isfinite(span)) return ticks;
  const double step = nice_step(span, target);
  const double tolerance = tick_tolerance * span;
  const double first = std::ceil((range.min - tolerance) / step);
  const double last = std::floor((range.max + tolerance) / step);
  for (double k = first; k <= last; k += 1.0) {
    double value = k * step;
    if (std::fabs(value) < step * 1e-9) value = 0.0;
    ticks.push_back(Tick{value, format_tick(value, step), true});
  }
  return ticks;
}

std::vector<Tick> log_ticks(AxisRange range, int target) {
  std::vector<Tick> ticks;
  if (!(range.min > 0.0) || !(range.max > range.min) || !std::isfinite(range.max)) return ticks;
  const double low = std::log10(range.min), high = std::log10(range.max);
  const double decades = high - low;
  const int first_decade = static_cast<int>(std::floor(low + tick_tolerance));
  const int last_decade = static_cast<int>(std::floor(high - tick_tolerance));
  // Inside one decade there is no power of ten to label: linear ticks read better.
  if (first_decade == last_decade && std::fmod(low, 1.0) != 0.0) return linear_ticks(range, target);
  auto inside = [&](double value) {
    const double l = std::log10(value);
    return l >= low - tick_tolerance * std::max(decades, 1.0) && l <= high + tick_tolerance * std::max(decades, 1.0);
  };
  const int every = std::max(1, static_cast<int>(std::ceil(decades / std::max(target, 1))));
  for (int decade = first_decade; decade <= last_decade + 1; ++decade) {
    const double power = std::pow(10.0, decade);
    if (decades <= 2.0) {
      // Few decades: 1, 2, 5 labelled, the other integers as minor ticks.
      for (int m = 1; m <= 9; ++m) {
        const double value = m * power;
        if (!inside(value)) continue;
        const bool major = m == 1 || m == 2 || m == 5;
        ticks.push_back(Tick{value, major ? format_tick(value, 0.0) : std::string(), major});
      }
    } else if (decades <= 6.0) {
      for (int m = 1; m <= 9; ++m) {
        const double value = m * power;
        if (!inside(value)) continue;
        ticks.push_back(Tick{value, m == 1 ? format_tick(value, 0.0) : std::string(), m == 1});
      }
    } else if (inside(power)) {
      const bool major = ((decade % every) + every) % every == 0;
      ticks.push_back(Tick{power, major ? format_tick(power, 0.0) : std::string(), major});
    }
  }
  return ticks;
}

std::vector<Tick> axis_ticks(AxisRange range, AxisScale scale, int target) {
  return scale == AxisScale::log ? log_ticks(range, target) : linear_ticks(range, target);
}

bool plottable(double value, AxisScale scale) {
  return std::isfinite(value) && (scale == AxisScale::linear || value > 0.0);
}

AxisRange make_valid_range(AxisRange range, AxisScale scale) {
  if (scale == AxisScale::log) {
    if (!plottable(range.max, scale)) range.max = 10.0;
    if (!plottable(range.min, scale)) range.min = range.max / 100.0;
    if (range.min >= range.max) range = {range.min / 2.0, range.min * 2.0};
    return range;
  }
  if (!std::isfinite(range.min) || !std::isfinite(range.max)) return {0.0, 1.0};
  if (range.min > range.max) std::swap(range.min, range.max);
  if (range.min == range.max) {
    const double half = range.min == 0.0 ? 1.0 : std::fabs(range.min) * 0.1;
    range = {range.min - half, range.max + half};
  }
  return range;
}

AxisTransform::AxisTransform(AxisRange range, AxisScale scale, double pixel_min, double pixel_max)
    : range_(make_valid_range(range, scale)), scale_(scale), pixel_min_(pixel_min), pixel_max_(pixel_max) {
  low_ = forward(range_.min);
  high_ = forward(range_.max);
}

double AxisTransform::forward(double value) const { return to_linear_space(value, scale_); }

double AxisTransform::to_pixel(double value) const {
  return pixel_min_ + (forward(value) - low_) / (high_ - low_) * (pixel_max_ - pixel_min_);
}

double AxisTransform::from_pixel(double pixel) const {
  return from_linear_space(low_ + (pixel - pixel_min_) / (pixel_max_ - pixel_min_) * (high_ - low_), scale_);
}

AxisRange fit_range(const std::vector<ValueSpan>& series, AxisScale scale, double padding) {
  double low = std::numeric_limits<double>::infinity(), high = -low;
  for (const auto& span : series) {
    for (std::size_t i = 0; i < span.size; ++i) {
      const double value = span.values[i];
      if (!plottable(value, scale)) continue;
      const double linear = to_linear_space(value, scale);
      low = std::min(low, linear);
      high = std::max(high, linear);
    }
  }
  if (low > high) return scale == AxisScale::log ? AxisRange{0.1, 10.0} : AxisRange{0.0, 1.0};
  if (low == high) {
    const double half = scale == AxisScale::log ? 0.5 : (low == 0.0 ? 1.0 : std::fabs(low) * 0.1);
    low -= half;
    high += half;
  } else {
    const double pad = (high - low) * padding;
    low -= pad;
    high += pad;
  }
  return {from_linear_space(low, scale), from_linear_space(high, scale)};
}

AxisRange zoom_range(AxisRange range, AxisScale scale, double anchor, double factor) {
  range = make_valid_range(range, scale);
  const double low = to_linear_space(range.min, scale), high = to_linear_space(range.max, scale);
  const double a = plottable(anchor, scale) ? to_linear_space(anchor, scale) : (low + high) / 2.0;
  return make_valid_range(
      {from_linear_space(a - (a - low) * factor, scale), from_linear_space(a + (high - a) * factor, scale)}, scale);
}

AxisRange pan_range(AxisRange range, AxisScale scale, double pixels, double pixel_span) {
  range = make_valid_range(range, scale);
  if (!(pixel_span > 0.0)) return range;
  const double low = to_linear_space(range.min, scale), high = to_linear_space(range.max, scale);
  const double shift = pixels / pixel_span * (high - low);
  return {from_linear_space(low + shift, scale), from_linear_space(high + shift, scale)};
}

AxisRange range_between(double a, double b, AxisScale scale) {
  return make_valid_range({std::min(a, b), std::max(a, b)}, scale);
}

long nearest_point(const std::vector<PixelPoint>& points, double px, double py, double max_distance) {
  long best = -1;
  double best_distance = max_distance * max_distance;
  for (std::size_t i = 0; i < points.size(); ++i) {
    const double dx = points[i].x - px, dy = points[i].y - py;
    const double distance = dx * dx + dy * dy;
    if (!std::isfinite(distance)) continue;
    if (distance <= best_distance) {
      best_distance = distance;
      best = static_cast<long>(i);
    }
  }
  return best;
}

std::array<unsigned char, 3> series_rgb(std::size_t index) {
  const unsigned char* base = tableau[index % 10];
  const std::size_t round = index / 10;
  std::array<unsigned char, 3> colour{};
  for (int c = 0; c < 3; ++c) {
    double value = base[c];
    if (round % 2 == 1) {
      value *= 0.8;  // darker
    } else if (round > 0) {
      value += (255.0 - value) * 0.35;  // lighter
    }
    colour[c] = static_cast<unsigned char>(std::lround(std::clamp(value, 0.0, 255.0)));
  }
  return colour;
}

std::size_t tick_stride(std::size_t count, int target) {
  const std::size_t most = static_cast<std::size_t>(std::max(1, target));
  for (std::size_t decade = 1;; decade *= 10) {
    for (const std::size_t multiple : {1, 2, 5}) {
      const std::size_t stride = multiple * decade;
      if ((count + stride - 1) / stride <= most) return stride;
    }
  }
}

std::vector<Tick> named_ticks(const std::vector<Tick>& candidates, AxisRange range, double length, double label_size,
                              double gap) {
  const double tolerance = 1e-9 * std::abs(range.max - range.min);
  std::vector<std::size_t> inside;
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    if (candidates[i].value >= range.min - tolerance && candidates[i].value <= range.max + tolerance) inside.push_back(i);
  }
  if (inside.size() < 2) return {};
  // Candidates are evenly spaced (blocks): the smallest 1, 2, 5 × 10^k stride whose labels are a label and a gap
  // apart.
  const double spacing =
      std::abs(length / (range.max - range.min) * (candidates[inside[1]].value - candidates[inside[0]].value));
  std::size_t stride = 1;
  for (std::size_t decade = 1; stride * spacing < label_size + gap && decade < candidates.size() * 10; decade *= 10) {
    for (const std::size_t multiple : {1, 2, 5}) {
      stride = multiple * decade;
      if (stride * spacing >= label_size + gap) break;
    }
  }
  std::vector<Tick> ticks;
  for (const std::size_t i : inside) {
    Tick tick = candidates[i];
    if (i % stride != 0) {
      tick.label.clear();
      tick.major = false;
    }
    ticks.push_back(std::move(tick));
  }
  return ticks;
}

std::array<unsigned char, 3> marker_rgb() { return {200, 200, 200}; }

std::vector<MarkerPlacement> place_markers(const std::vector<double>& values, const std::vector<int>& label_rows,
                                           const std::vector<double>& label_sizes, AxisRange range, AxisScale scale,
                                           double length, double gap) {
  const AxisTransform axis(make_valid_range(range, scale), scale, 0.0, length);
  std::vector<MarkerPlacement> out(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (!plottable(values[i], scale)) continue;
    const double at = axis.to_pixel(values[i]);
    out[i].line_at = at;
    out[i].line = at >= 0.0 && at <= length;
    // The next marker of this label row bounds the label (its stage ends there).
    const int row = i < label_rows.size() ? label_rows[i] : 0;
    double next = std::numeric_limits<double>::infinity();
    for (std::size_t j = 0; j < values.size(); ++j) {
      const int other_row = j < label_rows.size() ? label_rows[j] : 0;
      if (j == i || other_row != row || !plottable(values[j], scale) || values[j] <= values[i]) continue;
      next = std::min(next, axis.to_pixel(values[j]));
    }
    out[i].label_at = std::max(at, 0.0) + gap;
    const double size = i < label_sizes.size() ? label_sizes[i] : 0.0;
    const double end = out[i].label_at + size;
    out[i].label = at <= length && next > 0.0 && end <= std::min(next - gap, length);
  }
  return out;
}

std::array<float, 3> viridis(double t) {
  if (std::isnan(t)) return {0.5f, 0.5f, 0.5f};
  const double position = std::clamp(t, 0.0, 1.0) * 10.0;
  const int index = std::min(static_cast<int>(position), 9);
  const float fraction = static_cast<float>(position - index);
  std::array<float, 3> colour{};
  for (int c = 0; c < 3; ++c)
    colour[c] = viridis_table[index][c] + (viridis_table[index + 1][c] - viridis_table[index][c]) * fraction;
  return colour;
}

double colour_position(double value, double min, double max, AxisScale scale) {
  if (!plottable(value, scale) || !plottable(min, scale) || !plottable(max, scale)) {
    return std::numeric_limits<double>::quiet_NaN();
  }
  const double low = to_linear_space(min, scale), high = to_linear_space(max, scale);
  if (high <= low) return 0.5;
  return std::clamp((to_linear_space(value, scale) - low) / (high - low), 0.0, 1.0);
}

std::vector<DashPiece> dash_pieces(const std::vector<double>& segment_lengths, double on, double off) {
  std::vector<DashPiece> pieces;
  if (!(on > 0.0) || !(off > 0.0)) {
    for (std::size_t i = 0; i < segment_lengths.size(); ++i) pieces.push_back({i, 0.0, 1.0});
    return pieces;
  }
  bool drawing = true;
  double remaining = on;
  for (std::size_t i = 0; i < segment_lengths.size(); ++i) {
    const double length = segment_lengths[i];
    if (!(length > 0.0) || !std::isfinite(length)) continue;
    double position = 0.0;
    while (position < length) {
      const double take = std::min(remaining, length - position);
      if (drawing) pieces.push_back({i, position / length, (position + take) / length});
      position += take;
      remaining -= take;
      if (remaining <= 1e-12) {
        drawing = !drawing;
        remaining = drawing ? on : off;
      }
    }
  }
  return pieces;
}

bool overlaps(const PixelRect& a, const PixelRect& b) {
  return a.x0 < b.x1 && b.x0 < a.x1 && a.y0 < b.y1 && b.y0 < a.y1;
}

LegendPlacement place_legend(PixelRect area, double legend_width, double legend_height, double below, double gap,
                             double min_share) {
  LegendPlacement placement;
  const double width = area.width(), height = area.height();
  const auto right_of = [&](double legend_w) {
    placement.right = true;
    placement.area = area;
    placement.area.x1 = area.x1 - legend_w - gap;
    placement.legend = PixelRect{placement.area.x1 + gap, area.y0, area.x1, area.y0 + std::min(legend_height, height)};
    return placement;
  };
  if (width - legend_width - gap >= min_share * width) return right_of(legend_width);
  if (height - legend_height - below - gap >= min_share * height) {
    placement.right = false;
    placement.area = area;
    placement.area.y1 = area.y1 - legend_height - below - gap;
    const double top = placement.area.y1 + below + gap;
    placement.legend = PixelRect{area.x0, top, area.x0 + std::min(legend_width, width), top + legend_height};
    return placement;
  }
  return right_of(std::max(0.0, (1.0 - min_share) * width - gap));
}

PixelRect initial_window_rect(PixelRect work_area, int fallback_width, int fallback_height) {
  if (work_area.width() < 320.0 || work_area.height() < 240.0)
    return PixelRect{0.0, 0.0, static_cast<double>(fallback_width), static_cast<double>(fallback_height)};
  return work_area;
}

PixelRect plot_data_area(PixelRect frame, double line_height, bool has_title, double right_margin) {
  PixelRect area{frame.x0 + 64.0, frame.y0 + (has_title ? line_height + 6.0 : 4.0), frame.x1 - right_margin,
                 frame.y1 - 2.0 * line_height - 8.0};
  area.x1 = std::max(area.x1, area.x0 + 10.0);
  area.y1 = std::max(area.y1, area.y0 + 10.0);
  return area;
}

}  // namespace proplab::gui
