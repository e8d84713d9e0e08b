#include "gui/data/run_data.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <exception>
#include <limits>
#include <set>
#include <sstream>
#include <toml++/toml.h>

#include "core/error.h"

namespace proplab::gui {

namespace fs = std::filesystem;

const char* direction_name(Direction direction) { return direction == Direction::forward ? "forward" : "backward"; }

std::string RunSnapshot::status_text() const {
  if (!ok()) return "unreadable";
  return status ? run_status_name(*status) : "unknown";
}

const std::map<std::string, Dataset2D>& RunSnapshot::stats(Direction direction) const {
  return direction == Direction::forward ? forward : backward;
}

const Dataset2D* RunSnapshot::stat(Direction direction, const std::string& name) const {
  const auto& table = stats(direction);
  const auto found = table.find(name);
  return found == table.end() ? nullptr : &found->second;
}

const std::vector<double>* RunSnapshot::theory(Direction direction, const std::string& name) const {
  const auto& table = direction == Direction::forward ? theory_forward : theory_backward;
  const auto found = table.find(name);
  return found == table.end() ? nullptr : &found->second;
}

double RunSnapshot::final_loss() const {
  return train.loss.empty() ? std::numeric_limits<double>::quiet_NaN() : train.loss.back();
}

std::string RunSnapshot::config_value(const std::string& key) const {
  const auto found = config.find(key);
  return found == config.end() ? std::string() : found->second;
}

namespace {

// A value as the GUI shows it: strings bare at the top level and quoted inside arrays, floats in their shortest
// round-trip form ("0.1", not toml++'s "0.10000000000000001").
std::string format_toml_value(const toml::node& node, bool quote_strings) {
  if (const auto* text = node.as_string()) return quote_strings ? "\"" + text->get() + "\"" : text->get();
  if (const auto* number = node.as_floating_point()) {
    char buffer[64];
    const auto result = std::to_chars(buffer, buffer + sizeof(buffer), number->get());
    return std::string(buffer, result.ptr);
  }
  if (const auto* array = node.as_array()) {
    std::string joined = "[";
    for (std::size_t i = 0; i < array->size(); ++i) {
      joined += (i ? ", " : "") + format_toml_value(*array->get(i), true);
    }
    return joined + "]";
  }
  if (const auto* table = node.as_table()) {
    std::string joined = "{";
    bool first = true;
    for (const auto& [key, child] : *table) {
      joined += (first ? "" : ", ") + std::string(key.str()) + " = " + format_toml_value(child, true);
      first = false;
    }
    return joined + "}";
  }
  std::ostringstream value;
  node.visit([&](const auto& typed) { value << typed; });
  return value.str();
}

void flatten_node(const toml::node& node, const std::string& prefix, std::map<std::string, std::string>& out) {
  if (const auto* table = node.as_table()) {
    for (const auto& [key, child] : *table) {
      flatten_node(child, prefix.empty() ? std::string(key.str()) : prefix + "." + std::string(key.str()), out);
    }
    return;
  }
  if (const auto* array = node.as_array(); array && !array->empty() && array->is_array_of_tables()) {
    for (std::size_t i = 0; i < array->size(); ++i) {
      flatten_node(*array->get(i), detail::concat(prefix, "[", i, "]"), out);
    }
    return;
  }
  out[prefix] = format_toml_value(node, false);
}

// Reads every member statistic of `group` ("/forward") as [rows, columns] matrices.
std::map<std::string, Dataset2D> read_stat_group(const RunReader& reader, const std::string& group) {
  std::map<std::string, Dataset2D> stats;
  if (!reader.exists(group)) return stats;
  for (const auto& name : reader.list(group)) {
    const std::string path = group + "/" + name;
    if (reader.dataset_shape(path).size() != 2) continue;
    stats.emplace(name, reader.read_2d(path));
  }
  return stats;
}

std::map<std::string, std::vector<double>> read_theory_group(const RunReader& reader, const std::string& group,
                                                             std::size_t probes) {
  std::map<std::string, std::vector<double>> theory;
  if (!reader.exists(group)) return theory;
  for (const auto& name : reader.list(group)) {
    const std::string path = group + "/" + name;
    if (reader.dataset_shape(path).size() != 1) continue;
    std::vector<double> values = reader.read_doubles(path);
    if (values.size() == probes) theory.emplace(name, std::move(values));
  }
  return theory;
}

// Keeps the first `rows` rows.
void cut_rows(Dataset2D& matrix, std::size_t rows) {
  matrix.rows = static_cast<std::int64_t>(rows);
  matrix.values.resize(rows * static_cast<std::size_t>(matrix.columns));
}

void fill_snapshot(RunSnapshot& run, const RunReader& reader) {
  auto attribute = [&](const char* key) {
    return reader.has_attribute(key) ? reader.attribute_string(key) : std::string();
  };
  run.swmr = reader.swmr();
  run.status = reader.status();
  run.status_detail = attribute("status_detail");
  run.config_text = attribute("config");
  run.start_time = attribute("start_time");
  run.end_time = attribute("end_time");
  run.host = attribute("host");
  run.device = attribute("device");
  run.layout = attribute("layout");
  run.proplab_version = attribute("proplab_version");
  run.threads = reader.has_attribute("threads") ? reader.attribute_int("threads") : 0;
  run.name = run.path.stem().string();
  try {
    run.config = flatten_config(run.config_text);
    const auto name = run.config.find("name");
    if (name != run.config.end() && !name->second.empty()) run.name = name->second;
  } catch (const UserError&) {
    run.config.clear();  // a run is still worth showing without its config
  }

  run.train = reader.read_train();
  run.eval = reader.read_eval();
  if (reader.exists("/probes/name")) {
    const auto names = reader.read_strings("/probes/name");
    const auto depths =
        reader.exists("/probes/depth") ? reader.read_ints("/probes/depth") : std::vector<std::int64_t>{};
    const auto blocks =
        reader.exists("/probes/block") ? reader.read_ints("/probes/block") : std::vector<std::int64_t>{};
    const auto kinds = reader.exists("/probes/kind") ? reader.read_strings("/probes/kind") : std::vector<std::string>{};
    run.probes.resize(names.size());
    for (std::size_t p = 0; p < names.size(); ++p) {
      run.probes[p].name = names[p];
      run.probes[p].depth = p < depths.size() ? depths[p] : static_cast<std::int64_t>(p);
      run.probes[p].block = p < blocks.size() ? blocks[p] : -1;
      run.probes[p].kind = p < kinds.size() ? kinds[p] : std::string();
    }
  }
  try {
    run.blocks = reader.read_block_layout();
  } catch (const UserError&) {
    run.blocks.clear();  // a malformed layout is left out: the run is still shown, by probe depth
  }
  for (const auto& probe : run.probes) {
    if (probe.block >= static_cast<std::int64_t>(run.blocks.size())) run.blocks.clear();
  }
  if (reader.exists("/params/name")) run.param_names = reader.read_strings("/params/name");
  if (reader.exists("/compression/steps")) {
    run.compression_steps = reader.read_ints("/compression/steps");
    run.compression_error = reader.read_2d("/compression/error_total").values;
    run.compression_residual = reader.read_2d("/compression/residual_total").values;
    // whole records only (a file still being written may hold one series a row ahead)
    const std::size_t rows =
        std::min({run.compression_steps.size(), run.compression_error.size(), run.compression_residual.size()});
    run.compression_steps.resize(rows);
    run.compression_error.resize(rows);
    run.compression_residual.resize(rows);
  }
  if (!reader.exists("/steps")) return;

  run.record_steps = reader.read_ints("/steps");
  run.forward = read_stat_group(reader, "/forward");
  run.backward = read_stat_group(reader, "/backward");
  run.params.clear();
  for (auto& [name, matrix] : read_stat_group(reader, "/params")) {
    if (matrix.columns == static_cast<std::int64_t>(run.param_names.size()))
      run.params.emplace(name, std::move(matrix));
  }
  // A statistic whose width does not match its labels is malformed: leave it out rather than misplot it.
  for (auto* table : {&run.forward, &run.backward}) {
    std::erase_if(
        *table, [&](const auto& item) { return item.second.columns != static_cast<std::int64_t>(run.probes.size()); });
  }
  std::size_t records = run.record_steps.size();
  for (const auto* table : {&run.forward, &run.backward, &run.params}) {
    for (const auto& [name, matrix] : *table) records = std::min(records, static_cast<std::size_t>(matrix.rows));
  }
  run.record_steps.resize(records);
  for (auto* table : {&run.forward, &run.backward, &run.params}) {
    for (auto& [name, matrix] : *table) cut_rows(matrix, records);
  }
  run.theory_forward = read_theory_group(reader, "/theory/forward", run.probes.size());
  run.theory_backward = read_theory_group(reader, "/theory/backward", run.probes.size());
}

}  // namespace

std::map<std::string, std::string> flatten_config(const std::string& toml_text) {
  toml::table table;
  try {
    table = toml::parse(toml_text);
  } catch (const toml::parse_error& error) {
    throw UserError(detail::concat("config is not TOML: ", error.description()));
  }
  std::map<std::string, std::string> flat;
  flatten_node(table, "", flat);
  return flat;
}

std::shared_ptr<const RunSnapshot> load_run_snapshot(const fs::path& path) {
  auto run = std::make_shared<RunSnapshot>();
  run->path = path;
  run->name = path.stem().string();
  std::error_code error_code;
  run->modified = fs::last_write_time(path, error_code);
  run->file_size = fs::file_size(path, error_code);
  if (error_code) run->file_size = 0;
  try {
    const RunReader reader = RunReader::open(path, RunOpenMode::automatic);
    fill_snapshot(*run, reader);
  } catch (const std::exception& error) {
    RunSnapshot failed;
    failed.path = path;
    failed.name = path.stem().string();
    failed.modified = run->modified;
    failed.file_size = run->file_size;
    failed.error = error.what();
    if (failed.error.empty()) failed.error = "unreadable run file";
    *run = std::move(failed);
  }
  return run;
}

std::vector<std::size_t> probes_of_kind(const std::vector<ProbeInfo>& probes, const std::string& kind) {
  std::vector<std::size_t> indices;
  for (std::size_t p = 0; p < probes.size(); ++p) {
    if (kind.empty() || probes[p].kind == kind) indices.push_back(p);
  }
  return indices;
}

std::vector<std::string> probe_kinds(const std::vector<ProbeInfo>& probes) {
  std::vector<std::string> kinds;
  for (const auto& probe : probes) {
    if (std::find(kinds.begin(), kinds.end(), probe.kind) == kinds.end()) kinds.push_back(probe.kind);
  }
  return kinds;
}

std::vector<std::size_t> default_dynamics_probes(const std::vector<ProbeInfo>& probes) {
  std::set<std::int64_t> block_set;
  for (const auto& probe : probes) {
    if (probe.block >= 0) block_set.insert(probe.block);
  }
  std::vector<std::size_t> chosen;
  auto add = [&](std::size_t index) {
    if (std::find(chosen.begin(), chosen.end(), index) == chosen.end()) chosen.push_back(index);
  };
  if (block_set.empty()) {
    if (probes.empty()) return chosen;
    add(0);
    add(probes.size() / 2);
    add(probes.size() - 1);
    return chosen;
  }
  const std::vector<std::int64_t> blocks(block_set.begin(), block_set.end());
  for (const std::int64_t block : {blocks.front(), blocks[blocks.size() / 2], blocks.back()}) {
    std::optional<std::size_t> last_residual, last_any;
    for (std::size_t p = 0; p < probes.size(); ++p) {
      if (probes[p].block != block) continue;
      last_any = p;
      if (probes[p].kind == "residual") last_residual = p;
    }
    add(last_residual ? *last_residual : *last_any);
  }
  return chosen;
}

}  // namespace proplab::gui
