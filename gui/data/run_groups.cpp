#include "gui/data/run_groups.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <map>
#include <set>

namespace proplab::gui {

namespace {

std::string lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool contains(const std::string& haystack_lower, const std::string& needle_lower) {
  return haystack_lower.find(needle_lower) != std::string::npos;
}

std::optional<double> as_number(const std::string& text) {
  double value = 0.0;
  const char* end = text.data() + text.size();
  const auto result = std::from_chars(text.data(), end, value);
  if (result.ec != std::errc() || result.ptr != end || text.empty()) return std::nullopt;
  return value;
}

}  // namespace

bool run_matches_filter(const RunSnapshot& run, std::string_view filter) {
  if (filter.empty()) return true;
  const std::string needle = lower(filter);
  if (contains(lower(run.name), needle) || contains(lower(run.path.string()), needle) ||
      contains(lower(run.status_text()), needle)) {
    return true;
  }
  for (const auto& [key, value] : run.config) {
    if (contains(lower(key + "=" + value), needle)) return true;
  }
  return false;
}

std::vector<std::string> config_keys(const RunList& runs) {
  std::set<std::string> keys;
  for (const auto& run : runs) {
    for (const auto& [key, value] : run->config) keys.insert(key);
  }
  return {keys.begin(), keys.end()};
}

std::vector<std::string> differing_config_keys(const RunList& runs) {
  std::vector<std::string> differing;
  if (runs.size() < 2) return differing;
  for (const auto& key : config_keys(runs)) {
    const auto first = runs.front()->config.find(key);
    const bool first_has = first != runs.front()->config.end();
    for (std::size_t i = 1; i < runs.size(); ++i) {
      const auto other = runs[i]->config.find(key);
      const bool other_has = other != runs[i]->config.end();
      if (first_has != other_has || (first_has && first->second != other->second)) {
        differing.push_back(key);
        break;
      }
    }
  }
  return differing;
}

std::vector<RunGroup> group_runs(const RunList& runs, const std::vector<std::size_t>& indices, const std::string& key) {
  std::vector<RunGroup> groups;
  if (key.empty()) {
    groups.push_back(RunGroup{"all", indices});
    return groups;
  }
  std::map<std::string, std::vector<std::size_t>> by_value;
  for (const std::size_t index : indices) {
    const auto found = runs[index]->config.find(key);
    by_value[found == runs[index]->config.end() ? std::string(unset_value) : found->second].push_back(index);
  }
  for (auto& [value, members] : by_value) groups.push_back(RunGroup{value, std::move(members)});
  const bool numeric = std::all_of(groups.begin(), groups.end(), [](const RunGroup& group) {
    return group.value == unset_value || as_number(group.value).has_value();
  });
  std::stable_sort(groups.begin(), groups.end(), [&](const RunGroup& a, const RunGroup& b) {
    const bool a_unset = a.value == unset_value, b_unset = b.value == unset_value;
    if (a_unset != b_unset) return b_unset;
    if (a_unset) return false;
    if (numeric) return *as_number(a.value) < *as_number(b.value);
    return a.value < b.value;
  });
  return groups;
}

std::vector<ConfigDifference> config_diff(const std::map<std::string, std::string>& left,
                                          const std::map<std::string, std::string>& right) {
  std::vector<ConfigDifference> differences;
  auto l = left.begin();
  auto r = right.begin();
  while (l != left.end() || r != right.end()) {
    if (r == right.end() || (l != left.end() && l->first < r->first)) {
      differences.push_back({l->first, l->second, std::nullopt});
      ++l;
    } else if (l == left.end() || r->first < l->first) {
      differences.push_back({r->first, std::nullopt, r->second});
      ++r;
    } else {
      if (l->second != r->second) differences.push_back({l->first, l->second, r->second});
      ++l;
      ++r;
    }
  }
  return differences;
}

}  // namespace proplab::gui
