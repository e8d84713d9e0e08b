// sweep: expansion, naming, validation and sharding of [sweep] (see sweep.h).
#include "sweep/sweep.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "core/error.h"
#include "study/study.h"

namespace proplab {

namespace {

namespace fs = std::filesystem;

constexpr std::size_t kMaxNameLength = 128;
constexpr std::int64_t kMaxSeeds = 10000;
constexpr std::size_t kMaxPoints = 100000;

std::string join(const std::vector<std::string>& parts, const std::string& separator) {
  std::string out;
  for (std::size_t i = 0; i < parts.size(); ++i) out += (i ? separator : "") + parts[i];
  return out;
}

std::string shortest(double value) {
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
  return std::string(buffer, result.ptr);
}

// A value node as TOML text (what a --set override carries).
std::string toml_text(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string:
      return toml_basic_string(node.as_string()->get());
    case toml::node_type::integer:
      return std::to_string(node.as_integer()->get());
    case toml::node_type::floating_point: {
      std::string text = shortest(node.as_floating_point()->get());
      if (text.find_first_of(".eEn") == std::string::npos) text += ".0";
      return text;
    }
    case toml::node_type::boolean:
      return node.as_boolean()->get() ? "true" : "false";
    case toml::node_type::array: {
      std::vector<std::string> items;
      for (const toml::node& item : *node.as_array()) items.push_back(toml_text(item));
      return "[" + join(items, ", ") + "]";
    }
    case toml::node_type::table: {
      std::vector<std::string> items;
      for (auto&& [key, value] : *node.as_table())
        items.push_back(toml_basic_string(std::string(key.str())) + " = " + toml_text(value));
      return "{ " + join(items, ", ") + " }";
    }
    default:
      return "<a date or time>";
  }
}

// A value as shown in run names and index.csv (strings without quotes).
std::string display_text(const toml::node& node) {
  if (const auto* text = node.as_string()) return text->get();
  if (const auto* array = node.as_array()) {
    std::vector<std::string> items;
    for (const toml::node& item : *array) items.push_back(display_text(item));
    return join(items, "_");
  }
  if (!node.is_floating_point()) return toml_text(node);
  // The shortest text, its exponent without '+' (not a run-name character) or leading zeros: 1e+20 -> 1e20,
  // 1e-04 -> 1e-4.
  std::string text = shortest(node.as_floating_point()->get());
  if (const auto e = text.find('e'); e != std::string::npos) {
    std::string exponent = text.substr(e + 1);
    const bool negative = !exponent.empty() && exponent[0] == '-';
    if (!exponent.empty() && (exponent[0] == '+' || exponent[0] == '-')) exponent.erase(0, 1);
    exponent.erase(0, std::min(exponent.find_first_not_of('0'), exponent.size() - 1));
    text = text.substr(0, e + 1) + (negative ? "-" : "") + exponent;
  }
  return text;
}

std::uint64_t fnv1a(const std::string& text) {
  std::uint64_t hash = 1469598103934665603ull;
  for (const char c : text) hash = (hash ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return hash;
}

struct Value {
  std::string toml;     // TOML text of the value
  std::string display;  // index.csv text
  std::uint32_t line = 0;
};

struct Axis {
  std::string kind;  // "grid" or "zip"
  std::string key;   // the key path it sets
  std::string label;
  std::vector<Value> values;
  std::uint32_t line = 0, column = 0;
};

// "<file>:<line>" or the file alone when the line is unknown.
std::string at(const std::string& source, std::uint32_t line) {
  return source + ":" + std::to_string(line == 0 ? 1 : line);
}

std::string axis_path(const Axis& axis) { return "sweep." + axis.kind + "." + toml_basic_string(axis.key); }

// The leading "<file>:<line>" number of a problem line, for sorting (overrides and unknown lines last).
std::uint64_t problem_order(const std::string& line, const std::string& source) {
  if (line.rfind(source + ":", 0) != 0) return std::numeric_limits<std::uint64_t>::max();
  std::uint64_t number = 0;
  const char* begin = line.data() + source.size() + 1;
  const auto result = std::from_chars(begin, line.data() + line.size(), number);
  return result.ec == std::errc() ? number : std::numeric_limits<std::uint64_t>::max();
}

class SweepReader {
 public:
  SweepReader(std::string source, std::string base_dir, std::vector<std::string> overrides)
      : source_(std::move(source)), base_dir_(std::move(base_dir)), user_overrides_(std::move(overrides)) {}

  SweepPlan read(const std::string& text);

 private:
  void problem(std::uint32_t line, const std::string& path, const std::string& what, const std::string& allowed) {
    add(at(source_, line) + ": " + path + ": " + what + "; allowed: " + allowed);
  }
  void add(const std::string& line) {
    if (seen_.insert(line).second) problems_.push_back(line);
  }
  void read_axes(const toml::table& sweep);
  void collect(const std::string& kind, const std::string& prefix, const toml::node& node, std::uint32_t table_line);
  // Validates one point's overrides; returns the point's resolved study, or "" after recording its problems.
  std::string validate(const std::string& text, const std::vector<std::string>& overrides);
  [[noreturn]] void fail() const;
  // Every point of the sweep, in point order, each validated as the study it becomes (into plan.points).
  void expand_points(const std::string& text, SweepPlan& plan, const std::vector<const Axis*>& grid,
                     std::size_t zip_length, std::size_t count, std::int64_t base_seed);

  std::string source_, base_dir_;
  std::vector<std::string> user_overrides_;
  std::vector<Axis> axes_;
  std::int64_t seeds_ = 1;
  std::uint32_t sweep_line_ = 0, seeds_line_ = 0;
  std::map<std::string, std::string> locations_;  // "--set <override>" -> where the swept value is
  std::vector<std::string> problems_;
  std::set<std::string> seen_;
};

void SweepReader::collect(const std::string& kind, const std::string& prefix, const toml::node& node,
                          std::uint32_t table_line) {
  if (const toml::table* table = node.as_table()) {
    for (auto&& [key, value] : *table)
      collect(kind, prefix.empty() ? std::string(key.str()) : prefix + "." + std::string(key.str()), value,
              value.source().begin.line ? value.source().begin.line : table_line);
    return;
  }
  const std::string path = "sweep." + kind + "." + toml_basic_string(prefix);
  const toml::array* array = node.as_array();
  if (!array) {
    problem(table_line, path, "expected an array of values, got a single value " + toml_text(node),
            "an array of the values to sweep, e.g. [12, 48]");
    return;
  }
  if (array->empty()) {
    problem(table_line, path, "is empty", "an array of at least one value");
    return;
  }
  Axis axis;
  axis.kind = kind;
  axis.key = prefix;
  axis.line = node.source().begin.line ? node.source().begin.line : table_line;
  axis.column = node.source().begin.column;
  std::set<std::string> distinct;
  for (const toml::node& item : *array) {
    if (item.is_date() || item.is_time() || item.is_date_time()) {
      problem(item.source().begin.line, path, "holds a date or time", "strings, numbers, booleans or arrays of them");
      return;
    }
    Value value{toml_text(item), display_text(item), item.source().begin.line ? item.source().begin.line : axis.line};
    if (kind == "grid" && !distinct.insert(value.toml).second)
      problem(value.line, path, value.toml + " is listed twice", "distinct values (each names its own runs)");
    axis.values.push_back(std::move(value));
  }
  if (prefix == "name" || prefix == "sweep" || prefix.rfind("sweep.", 0) == 0) {
    problem(axis.line, path, "`" + prefix + "` cannot be swept", "a study key path such as model.layers");
    return;
  }
  axes_.push_back(std::move(axis));
}

void SweepReader::read_axes(const toml::table& sweep) {
  for (auto&& [key, value] : sweep) {
    const std::string name(key.str());
    const std::uint32_t line = value.source().begin.line ? value.source().begin.line : sweep_line_;
    if (name == "grid" || name == "zip") {
      if (!value.is_table()) {
        problem(line, "sweep." + name, "expected a table of key paths to arrays, got " + toml_text(value),
                name + " = { \"model.layers\" = [12, 48] }");
        continue;
      }
      collect(name, "", value, line);
    } else if (name == "seeds") {
      seeds_line_ = line;
      if (!value.is_integer() || value.as_integer()->get() < 1 || value.as_integer()->get() > kMaxSeeds)
        problem(line, "sweep.seeds",
                "expected an integer in 1.." + std::to_string(kMaxSeeds) + ", got " + toml_text(value),
                "an integer in 1.." + std::to_string(kMaxSeeds));
      else
        seeds_ = value.as_integer()->get();
    } else {
      problem(line, "sweep." + name, "unknown key", "grid, zip, seeds");
    }
  }
  for (const Axis& axis : axes_)
    if (axis.key == "seed" && seeds_ > 1)
      problem(axis.line, axis_path(axis), "sweeps the seed and so does sweep.seeds", "either a seed axis or seeds = n");
  // File order: toml++ keeps keys sorted, the run names follow the file.
  std::stable_sort(axes_.begin(), axes_.end(), [](const Axis& a, const Axis& b) {
    return std::tie(a.line, a.column) < std::tie(b.line, b.column);
  });
  std::map<std::string, const Axis*> by_key;
  for (const Axis& axis : axes_) {
    const auto [it, inserted] = by_key.emplace(axis.key, &axis);
    if (!inserted)
      problem(axis.line, axis_path(axis), "is also swept as " + axis_path(*it->second), "each key swept once");
  }
  for (const Axis& axis : axes_)
    for (const Axis& other : axes_)
      if (other.key.rfind(axis.key + ".", 0) == 0)
        problem(other.line, axis_path(other), "lies inside " + axis_path(axis) + ", which is swept too",
                "keys that do not contain each other");
  std::size_t zip_length = 0;
  const Axis* first_zip = nullptr;
  for (const Axis& axis : axes_) {
    if (axis.kind != "zip") continue;
    if (!first_zip) {
      first_zip = &axis, zip_length = axis.values.size();
    } else if (axis.values.size() != zip_length) {
      problem(axis.line, axis_path(axis),
              "has " + std::to_string(axis.values.size()) + " values but " + axis_path(*first_zip) + " has " +
                  std::to_string(zip_length),
              "zip arrays of one length (their values go together)");
    }
  }
  if (axes_.empty() && seeds_ == 1 && problems_.empty())
    problem(sweep_line_, "sweep", "varies nothing", "grid, zip or seeds > 1 (or drop [sweep] and use proplab run)");
  for (const std::string& text : user_overrides_) {
    const std::string key = text.substr(0, text.find('='));
    if (key == "sweep" || key.rfind("sweep.", 0) == 0)
      add("--set " + text + ": " + key +
          ": the sweep's own table is read from the file, not from --set; allowed: "
          "--set of study keys (edit [sweep] in " +
          source_ + " to change the points)");
    for (const Axis& axis : axes_)
      if (key == axis.key || key.rfind(axis.key + ".", 0) == 0 || axis.key.rfind(key + ".", 0) == 0)
        add("--set " + text + ": " + key + ": is swept by " + axis_path(axis) + " (" + at(source_, axis.line) +
            "); allowed: --set of keys the sweep does not vary");
  }
  // Labels: the last key segment, the whole path when two axes share it.
  std::map<std::string, int> last_counts;
  const auto last = [](const std::string& key) { return key.substr(key.rfind('.') + 1); };
  for (const Axis& axis : axes_) ++last_counts[last(axis.key)];
  for (Axis& axis : axes_)
    axis.label = name_safe(last_counts[last(axis.key)] > 1 || last(axis.key) == "seed" ? axis.key : last(axis.key));
}

std::string SweepReader::validate(const std::string& text, const std::vector<std::string>& overrides) {
  try {
    return parse_study(text, source_, base_dir_, overrides).config_toml;
  } catch (const UserError& error) {
    std::istringstream lines(error.what());
    for (std::string line; std::getline(lines, line);) {
      // Relocate problems caused by a swept value to that value in [sweep] (the longest matching override).
      std::string best;
      for (const auto& [prefix, where] : locations_)
        if (line.rfind(prefix + ": ", 0) == 0 && prefix.size() > best.size()) best = prefix;
      add(best.empty() ? line : locations_[best] + line.substr(best.size()));
    }
    return {};
  }
}

void SweepReader::fail() const {
  std::vector<std::string> sorted = problems_;
  std::stable_sort(sorted.begin(), sorted.end(), [&](const std::string& a, const std::string& b) {
    return problem_order(a, source_) < problem_order(b, source_);
  });
  throw UserError(join(sorted, "\n"));
}

void SweepReader::expand_points(const std::string& text, SweepPlan& plan, const std::vector<const Axis*>& grid,
                                std::size_t zip_length, std::size_t count, std::int64_t base_seed) {
  std::map<std::string, std::size_t> names;
  std::vector<std::size_t> digits(grid.size(), 0);
  for (std::size_t index = 0; index < count; ++index) {
    // index = ((grid digits...) * zip_length + z) * seeds + s, the first grid axis slowest.
    std::size_t rest = index;
    const std::size_t s = rest % static_cast<std::size_t>(seeds_);
    rest /= static_cast<std::size_t>(seeds_);
    const std::size_t z = rest % zip_length;
    rest /= zip_length;
    for (std::size_t g = grid.size(); g-- > 0;) {
      digits[g] = rest % grid[g]->values.size();
      rest /= grid[g]->values.size();
    }
    SweepPoint point;
    point.index = index;
    std::vector<std::pair<std::string, std::string>> parts;
    std::size_t g = 0;
    for (const Axis& axis : axes_) {
      const Value& value = axis.kind == "grid" ? axis.values[digits[g++]] : axis.values[z];
      point.overrides.push_back(axis.key + "=" + value.toml);
      point.values.push_back(value.display);
      parts.emplace_back(axis.label, name_safe(value.display));
    }
    if (seeds_ > 1) {
      const std::string seed = std::to_string(base_seed + static_cast<std::int64_t>(s));
      point.overrides.push_back("seed=" + seed);
      point.values.push_back(seed);
      parts.emplace_back("seed", seed);
    }
    point.name = make_run_name(parts);
    const auto [it, inserted] = names.emplace(point.name, index);
    if (!inserted)
      add(at(source_, sweep_line_) + ": sweep: points " + join(plan.points[it->second].overrides, " ") + " and " +
          join(point.overrides, " ") + " both get the run name " + toml_basic_string(point.name) +
          "; allowed: values that differ after unsafe characters become '_'");
    std::vector<std::string> all = user_overrides_;
    all.insert(all.end(), point.overrides.begin(), point.overrides.end());
    all.push_back("name=" + toml_basic_string(point.name));
    const std::string resolved = validate(text, all);
    if (!resolved.empty()) {
      // The point without [sweep] (written last in the resolved text), checked again as `proplab run` will.
      const auto sweep_at = resolved.find("\n[sweep");
      PROPLAB_CHECK(sweep_at != std::string::npos, "the resolved study of a sweep point holds its [sweep] table");
      const Study study = parse_study(resolved.substr(0, sweep_at + 1), source_, base_dir_);
      point.study_toml = study.config_toml;
      point.ranks = study.parallel.world();
    }
    plan.points.push_back(std::move(point));
  }
}

SweepPlan SweepReader::read(const std::string& text) {
  toml::table root;
  try {
    root = toml::parse(std::string_view(text), std::string_view(source_));
  } catch (const toml::parse_error&) {
    parse_study(text, source_, base_dir_, user_overrides_);  // reports the syntax error as the study loader does
    throw;
  }
  const toml::node* sweep_node = root.get("sweep");
  if (!sweep_node) {
    // The study's own problems first: a broken study without [sweep] needs those more than this one.
    parse_study(text, source_, base_dir_, user_overrides_);
    throw UserError(source_ + ": has no [sweep] table; run a single study with `proplab run " + source_ +
                    "`, or add [sweep] (see docs/studies.md)");
  }
  sweep_line_ = sweep_node->source().begin.line;
  if (const toml::table* sweep = sweep_node->as_table()) read_axes(*sweep);
  // Where a swept value's override is reported: at the value in [sweep].
  for (const Axis& axis : axes_)
    for (std::size_t i = 0; i < axis.values.size(); ++i)
      locations_["--set " + axis.key + "=" + axis.values[i].toml] = at(source_, axis.values[i].line) + ": " +
                                                                    axis_path(axis) + "[" + std::to_string(i) +
                                                                    "] = " + axis.values[i].toml;
  if (!problems_.empty() || !sweep_node->is_table()) {
    // The sweep cannot be expanded: report its problems with the study's own and those of each value alone.
    validate(text, user_overrides_);
    for (const Axis& axis : axes_) {
      for (const Value& value : axis.values) {
        std::vector<std::string> one = user_overrides_;
        one.push_back(axis.key + "=" + value.toml);
        validate(text, one);
      }
    }
    fail();
  }

  std::size_t zip_length = 1;
  std::vector<const Axis*> grid, zip;
  for (const Axis& axis : axes_) {
    if (axis.kind == "grid")
      grid.push_back(&axis);
    else
      zip.push_back(&axis), zip_length = axis.values.size();
  }
  std::size_t count = zip_length * static_cast<std::size_t>(seeds_);
  for (const Axis* axis : grid) {
    count *= axis->values.size();
    if (count > kMaxPoints)
      throw UserError(at(source_, sweep_line_) + ": sweep: more than " + std::to_string(kMaxPoints) +
                      " points; allowed: at most " + std::to_string(kMaxPoints) + " points per sweep");
  }
  std::int64_t base_seed = 0;
  if (const toml::node* seed = root.get("seed"); seed && seed->is_integer()) base_seed = seed->as_integer()->get();
  for (const std::string& text_override : user_overrides_)
    if (text_override.rfind("seed=", 0) == 0) {
      const std::string value = text_override.substr(5);
      std::from_chars(value.data(), value.data() + value.size(), base_seed);
    }

  SweepPlan plan;
  plan.study_path = source_;
  if (const toml::node* name = root.get("name"); name && name->is_string()) plan.study_name = name->as_string()->get();
  for (const std::string& text_override : user_overrides_)
    if (text_override.rfind("name=", 0) == 0) plan.study_name = text_override.substr(5);
  if (plan.study_name.size() >= 2 && plan.study_name.front() == '"')
    plan.study_name = plan.study_name.substr(1, plan.study_name.size() - 2);
  plan.seeds = seeds_;
  for (const Axis& axis : axes_) plan.columns.push_back(axis.key);
  if (seeds_ > 1) plan.columns.push_back("seed");

  for (std::int64_t s = 0; s < seeds_; ++s)
    locations_["--set seed=" + std::to_string(base_seed + s)] = at(source_, seeds_line_ ? seeds_line_ : sweep_line_) +
                                                                ": sweep.seeds (seed " + std::to_string(base_seed + s) +
                                                                ")";

  expand_points(text, plan, grid, zip_length, count, base_seed);
  if (!problems_.empty()) fail();
  return plan;
}

}  // namespace

std::string name_safe(const std::string& text) {
  std::string out = text;
  for (char& c : out)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-')) c = '_';
  return out.empty() ? "_" : out;
}

std::string make_run_name(const std::vector<std::pair<std::string, std::string>>& parts) {
  std::string name;
  for (const auto& [label, value] : parts) name += (name.empty() ? "" : ",") + label + "=" + value;
  if (name.size() <= kMaxNameLength) return name;
  char hash[16];
  std::snprintf(hash, sizeof hash, "%08x", static_cast<unsigned>(fnv1a(name) & 0xffffffffu));
  return name.substr(0, kMaxNameLength - 9) + "-" + hash;
}

SweepPlan parse_sweep(const std::string& toml_text, const std::string& source_name, const std::string& base_dir,
                      const std::vector<std::string>& overrides) {
  return SweepReader(source_name, base_dir.empty() ? "." : base_dir, overrides).read(toml_text);
}

SweepPlan load_sweep(const std::string& path, const std::vector<std::string>& overrides) {
  std::error_code error;
  std::ifstream in(path, std::ios::binary);
  if (!in || fs::is_directory(path, error)) throw UserError(path + ": cannot read the study file");
  std::ostringstream text;
  text << in.rdbuf();
  const std::string base_dir = fs::path(path).parent_path().string();
  return parse_sweep(text.str(), path, base_dir, overrides);
}

Shard parse_shard(const std::string& text) {
  const auto fail = [&]() -> Shard {
    throw UserError("--shard " + text + ": not a shard; allowed: i/n with 0 <= i < n, e.g. 0/4 (Slurm: " +
                    "$SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT with --array=0-(n-1))");
  };
  const auto slash = text.find('/');
  if (slash == std::string::npos) return fail();
  Shard shard;
  const auto parse = [](const std::string& part, std::int64_t& value) {
    if (part.empty() || part.find_first_not_of("0123456789") != std::string::npos) return false;
    const auto result = std::from_chars(part.data(), part.data() + part.size(), value);
    return result.ec == std::errc() && result.ptr == part.data() + part.size();
  };
  if (!parse(text.substr(0, slash), shard.index) || !parse(text.substr(slash + 1), shard.count) || shard.count < 1 ||
      shard.index >= shard.count)
    return fail();
  return shard;
}

std::vector<std::size_t> shard_points(std::size_t point_count, Shard shard) {
  PROPLAB_CHECK(shard.count >= 1 && shard.index >= 0 && shard.index < shard.count, "shard ", shard.index, "/",
                shard.count, " is not a shard");
  std::vector<std::size_t> points;
  for (std::size_t i = static_cast<std::size_t>(shard.index); i < point_count;
       i += static_cast<std::size_t>(shard.count))
    points.push_back(i);
  return points;
}

}  // namespace proplab
