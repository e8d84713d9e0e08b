// probe/stat_selection: the statistic names (the one list: the study validates against it) and selections of them.
#include <algorithm>
#include <sstream>

#include "core/error.h"
#include "probe/moments.h"

namespace proplab::probe {

namespace {

constexpr std::array<std::string_view, kStatCount> kStatNames = {
    "mean", "var", "rms", "max_abs", "kurtosis", "nonfinite", "corr", "chan_mean_sq", "chan_var"};

}  // namespace

const std::array<std::string_view, kStatCount>& stat_names() { return kStatNames; }

std::string_view stat_name(Stat stat) { return kStatNames[static_cast<std::size_t>(stat)]; }

StatSelection StatSelection::all() {
  StatSelection selection;
  selection.bits_ = (1u << kStatCount) - 1u;
  return selection;
}

StatSelection StatSelection::parse(const std::vector<std::string>& names, std::string_view where) {
  StatSelection selection;
  for (const std::string& name : names) {
    const auto found = std::find(kStatNames.begin(), kStatNames.end(), name);
    if (found == kStatNames.end()) {
      std::ostringstream message;
      message << where << ": unknown statistic '" << name << "'; valid statistics are";
      for (std::size_t i = 0; i < kStatNames.size(); ++i) message << (i == 0 ? " " : ", ") << kStatNames[i];
      throw UserError(message.str());
    }
    selection.add(static_cast<Stat>(found - kStatNames.begin()));
  }
  return selection;
}

StatSelection& StatSelection::add(Stat stat) {
  bits_ |= 1u << static_cast<unsigned>(stat);
  return *this;
}

std::vector<std::string> StatSelection::names() const {
  std::vector<std::string> out;
  for (int i = 0; i < kStatCount; ++i)
    if (has(static_cast<Stat>(i))) out.emplace_back(kStatNames[static_cast<std::size_t>(i)]);
  return out;
}

}  // namespace proplab::probe
