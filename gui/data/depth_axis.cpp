#include "gui/data/depth_axis.h"

#include <algorithm>
#include <array>
#include <cstdio>

#include "core/error.h"
#include "gui/data/block_axis.h"

namespace proplab::gui {

namespace {

constexpr std::array<const char*, 3> axis_names = {"block", "depth", "probe"};
constexpr std::array<const char*, 3> axis_titles = {"block", "depth l/L", "probe index"};
constexpr std::array<const char*, 7> known_kinds = {"residual", "branch", "norm", "preact",
                                                    "postact",  "logits", "embed"};

bool has_blocks(const std::vector<ProbeInfo>& probes) {
  return std::any_of(probes.begin(), probes.end(), [](const ProbeInfo& probe) { return probe.block >= 0; });
}

std::string trim(const std::string& text) {
  const auto first = text.find_first_not_of(" \t");
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(" \t") - first + 1);
}

}  // namespace

const char* depth_axis_name(DepthAxis axis) { return axis_names[static_cast<std::size_t>(axis)]; }

std::optional<DepthAxis> parse_depth_axis(const std::string& text) {
  for (std::size_t i = 0; i < axis_names.size(); ++i) {
    if (text == axis_names[i]) return static_cast<DepthAxis>(i);
  }
  return std::nullopt;
}

const char* depth_axis_title(DepthAxis axis) { return axis_titles[static_cast<std::size_t>(axis)]; }

std::int64_t block_count(const std::vector<ProbeInfo>& probes) {
  std::int64_t count = 0;
  for (const auto& probe : probes) count = std::max(count, probe.block + 1);
  return count;
}

DepthAxis default_depth_axis(const RunList& runs) {
  std::optional<std::int64_t> depth;
  for (const auto& run : runs) {
    const std::int64_t blocks = block_count(run->probes);
    if (blocks == 0) continue;
    if (depth && *depth != blocks) return DepthAxis::depth;
    depth = blocks;
  }
  return DepthAxis::block;
}

std::vector<double> depth_axis_positions(const std::vector<ProbeInfo>& probes, DepthAxis axis) {
  std::vector<double> positions(probes.size());
  if (axis == DepthAxis::probe || !has_blocks(probes)) {
    for (std::size_t p = 0; p < probes.size(); ++p) positions[p] = static_cast<double>(probes[p].depth);
    return positions;
  }
  positions = block_axis_positions(probes);
  if (axis == DepthAxis::depth) {
    const double blocks = static_cast<double>(block_count(probes));
    for (double& x : positions) x /= blocks;
  }
  return positions;
}

double block_position_on(double block_position, std::int64_t blocks, DepthAxis axis) {
  return axis == DepthAxis::depth && blocks > 0 ? block_position / static_cast<double>(blocks) : block_position;
}

std::string block_name(const ProbeInfo& probe) {
  if (probe.block < 0) return "";
  const std::string number = std::to_string(probe.block);
  std::size_t start = 0;
  while (start <= probe.name.size()) {
    const std::size_t end = std::min(probe.name.find('.', start), probe.name.size());
    if (probe.name.compare(start, end - start, number) == 0 && end - start == number.size())
      return probe.name.substr(0, end);
    start = end + 1;
  }
  return "block " + number;
}

std::vector<std::string> block_names(const RunList& runs) {
  std::vector<std::string> names;
  std::vector<bool> differ;
  for (const auto& run : runs) {
    for (const auto& probe : run->probes) {
      if (probe.block < 0) continue;
      const auto b = static_cast<std::size_t>(probe.block);
      if (b >= names.size()) {
        names.resize(b + 1);
        differ.resize(b + 1, false);
      }
      const std::string name = block_name(probe);
      if (names[b].empty()) {
        names[b] = name;
      } else if (names[b] != name) {
        differ[b] = true;
      }
    }
  }
  for (std::size_t b = 0; b < names.size(); ++b) {
    if (names[b].empty() || differ[b]) names[b] = std::to_string(b);
  }
  return names;
}

std::vector<std::size_t> probes_of_kinds(const std::vector<ProbeInfo>& probes, const std::vector<std::string>& kinds) {
  std::vector<std::size_t> indices;
  for (std::size_t p = 0; p < probes.size(); ++p) {
    if (kinds.empty() || std::find(kinds.begin(), kinds.end(), probes[p].kind) != kinds.end()) indices.push_back(p);
  }
  return indices;
}

std::vector<std::string> default_kinds(const std::vector<ProbeInfo>& probes) {
  for (const auto& probe : probes) {
    if (probe.kind == "residual") return {"residual"};
  }
  return {};
}

std::vector<std::string> default_kinds(const RunList& runs) {
  for (const auto& run : runs) {
    if (!default_kinds(run->probes).empty()) return {"residual"};
  }
  return {};
}

std::vector<std::string> parse_kinds(const std::string& text) {
  std::vector<std::string> kinds;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t end = std::min(text.find(',', start), text.size());
    const std::string kind = trim(text.substr(start, end - start));
    std::string valid;
    for (const char* known : known_kinds) valid += (valid.empty() ? "" : ", ") + std::string(known);
    if (kind.empty())
      throw UserError("kinds '" + text + "': an empty kind (expected a comma-separated list of " + valid + ")");
    if (std::find(known_kinds.begin(), known_kinds.end(), kind) == known_kinds.end())
      throw UserError("kinds '" + text + "': unknown probe kind '" + kind + "' (expected " + valid + ")");
    if (std::find(kinds.begin(), kinds.end(), kind) == kinds.end()) kinds.push_back(kind);
    start = end + 1;
  }
  return kinds;
}

std::string kinds_summary(const std::vector<std::string>& kinds) {
  if (kinds.empty()) return "all probes";
  std::string summary;
  for (const auto& kind : kinds) summary += (summary.empty() ? "" : " + ") + kind;
  return summary;
}

std::string probe_description(const ProbeInfo& probe) {
  std::string text = probe.name + " (" + probe.kind + ")";
  if (probe.block >= 0) {
    const std::string block = "block " + std::to_string(probe.block);
    const std::string name = block_name(probe);
    text += "\n" + block + (name != block ? " (" + name + ")" : "");
  }
  return text;
}

std::string probe_point_text(const ProbeInfo& probe, std::int64_t step, const std::string& value_title, double value) {
  std::string text = probe_description(probe) + "\n";
  text += "step " + std::to_string(step) + "\n";
  char number[32];
  std::snprintf(number, sizeof(number), "%.4g", value);
  text += value_title + " = " + number;
  return text;
}

}  // namespace proplab::gui
