// PNG figures as RGB pixels, and the straight lines of one colour in them: for the tests that check where the GUI
// and `proplab report` draw markers (tests/gui, tests/report). Needs stb (libstb-dev); only the GUI app's tests use it.
#pragma once

#include <stb/stb_image.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <vector>

namespace proplab::test_png {

using Rgb = std::array<unsigned char, 3>;

struct RgbImage {
  int width = 0, height = 0;
  std::vector<unsigned char> rgb;  // width × height × 3, top row first
  Rgb at(int x, int y) const {
    const std::size_t i = (static_cast<std::size_t>(y) * width + x) * 3;
    return {rgb[i], rgb[i + 1], rgb[i + 2]};
  }
};

// Empty (width 0) when the file cannot be read.
inline RgbImage load_rgb(const std::filesystem::path& path) {
  RgbImage image;
  int channels = 0;
  unsigned char* data = stbi_load(path.c_str(), &image.width, &image.height, &channels, 3);
  if (data == nullptr) return RgbImage{};
  image.rgb.assign(data, data + static_cast<std::size_t>(image.width) * image.height * 3);
  stbi_image_free(data);
  return image;
}

inline bool near(const Rgb& a, const Rgb& b, int tolerance = 6) {
  for (int c = 0; c < 3; ++c) {
    if (std::abs(static_cast<int>(a[c]) - static_cast<int>(b[c])) > tolerance) return false;
  }
  return true;
}

// Pixels of `colour` in the rectangle [x0, x1) × [y0, y1).
inline int count_in(const RgbImage& image, const Rgb& colour, int x0, int x1, int y0, int y1) {
  int count = 0;
  for (int y = std::max(0, y0); y < std::min(image.height, y1); ++y) {
    for (int x = std::max(0, x0); x < std::min(image.width, x1); ++x) count += near(image.at(x, y), colour) ? 1 : 0;
  }
  return count;
}

// Pixels of `colour` in the whole image (lines are antialiased: their centres keep the colour).
inline std::size_t count_colour(const RgbImage& image, const Rgb& colour) {
  return static_cast<std::size_t>(count_in(image, colour, 0, image.width, 0, image.height));
}

// How many different colours the image has (1 for a blank one).
inline std::size_t distinct_colours(const RgbImage& image) {
  std::set<unsigned> colours;
  for (std::size_t i = 0; i + 2 < image.rgb.size(); i += 3)
    colours.insert(image.rgb[i] << 16 | image.rgb[i + 1] << 8 | image.rgb[i + 2]);
  return colours.size();
}

// Groups adjacent indices whose count reaches `min_pixels` and returns each group's centre.
inline std::vector<double> centres_of(const std::vector<int>& counts, int first, int min_pixels) {
  std::vector<double> centres;
  int start = -1;
  for (int i = 0; i <= static_cast<int>(counts.size()); ++i) {
    const bool hit = i < static_cast<int>(counts.size()) && counts[i] >= min_pixels;
    if (hit && start < 0) start = i;
    if (!hit && start >= 0) {
      centres.push_back(first + 0.5 * (start + i - 1));
      start = -1;
    }
  }
  return centres;
}

// Vertical lines of `colour` in [x0, x1) × [y0, y1): the centres of groups of adjacent columns that hold at least
// `min_pixels` pixels of it (a dashed line holds about its dash fraction of the rows).
inline std::vector<double> column_lines(const RgbImage& image, const Rgb& colour, int x0, int x1, int y0, int y1,
                                        int min_pixels) {
  std::vector<int> counts;
  for (int x = x0; x < x1; ++x) counts.push_back(count_in(image, colour, x, x + 1, y0, y1));
  return centres_of(counts, x0, min_pixels);
}

// Horizontal lines, likewise.
inline std::vector<double> row_lines(const RgbImage& image, const Rgb& colour, int x0, int x1, int y0, int y1,
                                     int min_pixels) {
  std::vector<int> counts;
  for (int y = y0; y < y1; ++y) counts.push_back(count_in(image, colour, x0, x1, y, y + 1));
  return centres_of(counts, y0, min_pixels);
}

// The colour of a plot's frame and major grid lines: ImGui's dark-style border (110, 110, 128) at half opacity over
// the window background (15, 15, 15) that the GUI clears to.
inline constexpr Rgb frame_rgb = {62, 62, 71};

// A plot's data area within [x0, x1) × [y0, y1): the outermost columns and rows of the frame colour that reach
// `fraction` of the rectangle's height (columns) or width (rows); the frame's edges are those lines.
struct Frame {
  bool found = false;
  double left = 0, right = 0, top = 0, bottom = 0;
};
inline Frame find_frame(const RgbImage& image, int x0, int x1, int y0, int y1, double fraction = 0.4) {
  const auto columns = column_lines(image, frame_rgb, x0, x1, y0, y1, static_cast<int>(fraction * (y1 - y0)));
  const auto rows = row_lines(image, frame_rgb, x0, x1, y0, y1, static_cast<int>(fraction * (x1 - x0)));
  Frame frame;
  if (columns.size() < 2 || rows.size() < 2) return frame;
  frame.found = true;
  frame.left = columns.front();
  frame.right = columns.back();
  frame.top = rows.front();
  frame.bottom = rows.back();
  return frame;
}

// The window background the GUI clears to (ImGui's dark style).
inline constexpr Rgb background_rgb = {15, 15, 15};

// The filled rectangle around (x, y), e.g. a heatmap's cells (its frame is blended over them, so find_frame cannot
// see it): the run of non-background pixels up and down column x, then the widest run left and right over its rows.
inline Frame find_filled_area(const RgbImage& image, int x, int y) {
  const auto filled = [&](int px, int py) { return !near(image.at(px, py), background_rgb, 2); };
  Frame area;
  if (!filled(x, y)) return area;
  int top = y, bottom = y;
  while (top > 0 && filled(x, top - 1)) --top;
  while (bottom + 1 < image.height && filled(x, bottom + 1)) ++bottom;
  int left = x, right = x;
  for (int py = top; py <= bottom; ++py) {
    int l = x, r = x;
    while (l > 0 && filled(l - 1, py)) --l;
    while (r + 1 < image.width && filled(r + 1, py)) ++r;
    left = std::min(left, l);
    right = std::max(right, r);
  }
  area.found = true;
  area.left = left;
  area.right = right;
  area.top = top;
  area.bottom = bottom + 1;  // the bottom edge of the last row
  return area;
}

}  // namespace proplab::test_png
