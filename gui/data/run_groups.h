// gui/data/run_groups: filtering, grouping and comparing runs by their flattened configs (no I/O).
//
// Invariants:
// - Runs are referred to by their index in the vector passed in; results never reorder that vector.
// - A key missing from a run's config has the value unset_value ("(unset)") for grouping and is shown as
//   missing (std::nullopt) in a diff. Unreadable runs have no config: every key is unset for them.
// - Group values are ordered numerically when every value parses as a number, else lexicographically, with
//   "(unset)" last.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gui/data/run_data.h"

namespace proplab::gui {

inline constexpr const char* unset_value = "(unset)";

using RunList = std::vector<std::shared_ptr<const RunSnapshot>>;

// True when `filter` is empty or appears, case-insensitively, in the run's name, path, status or any
// "key=value" of its config.
bool run_matches_filter(const RunSnapshot& run, std::string_view filter);

// Every config key of any run, sorted.
std::vector<std::string> config_keys(const RunList& runs);
// The keys whose value is not the same in every run (missing counts as a value), sorted. Fewer than two runs:
// none.
std::vector<std::string> differing_config_keys(const RunList& runs);

struct RunGroup {
  std::string value;                 // the key's value shared by the members
  std::vector<std::size_t> members;  // indices into the runs passed in, in their order
};
// The runs grouped by the value of config key `key` (`indices` selects which runs take part; empty key: one
// group "all" with every index).
std::vector<RunGroup> group_runs(const RunList& runs, const std::vector<std::size_t>& indices, const std::string& key);

struct ConfigDifference {
  std::string key;
  std::optional<std::string> left, right;  // nullopt: the key is missing on that side
};
// Keys whose values differ between two flattened configs, sorted by key.
std::vector<ConfigDifference> config_diff(const std::map<std::string, std::string>& left,
                                          const std::map<std::string, std::string>& right);

}  // namespace proplab::gui
