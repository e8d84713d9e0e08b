#include "cli/inspect.h"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <sstream>
#include <toml++/toml.h>
#include <vector>

#include "core/error.h"
#include "io/recover.h"
#include "io/run_reader.h"

namespace proplab {

namespace {

constexpr const char* default_stat = "var";
constexpr int label_width = 10;

std::string format_number(const char* format, double value) {
  char text[64];
  std::snprintf(text, sizeof(text), format, value);
  return text;
}

// "label:" padded to label_width, then the value.
void line(std::ostream& out, const std::string& label, const std::string& value) {
  std::string head = label + ":";
  head.resize(std::max<std::size_t>(head.size() + 1, label_width), ' ');
  out << head << value << "\n";
}

// What compressed communication did (docs/run-format.md, /compression): the scheme, and the last record's total
// error and residual and each pipeline boundary's errors.
void write_compression(std::ostream& report, const RunReader& reader) {
  const std::string layout = reader.has_attribute("layout") ? reader.attribute_string("layout") : std::string();
  // The value of " key=value" in the layout attribute ("?" when absent).
  auto scheme_of = [&](const std::string& key) {
    const std::size_t at = layout.find(" " + key + "=");
    if (at == std::string::npos) return std::string("?");
    const std::size_t begin = at + key.size() + 2;
    return layout.substr(begin, layout.find(' ', begin) - begin);
  };
  if (reader.exists("/compression/steps")) {
    const std::vector<std::int64_t> steps = reader.read_ints("/compression/steps");
    const Dataset2D error = reader.read_2d("/compression/error_total");
    const Dataset2D residual = reader.read_2d("/compression/residual_total");
    const std::size_t rows =
        std::min({steps.size(), static_cast<std::size_t>(error.rows), static_cast<std::size_t>(residual.rows)});
    const std::string scheme = scheme_of("compress");
    line(report, "compression",
         rows == 0 ? scheme + ", no records"
                   : detail::concat(scheme, ": relative error ", format_number("%.4g", error.values[rows - 1]),
                                    ", residual norm ", format_number("%.4g", residual.values[rows - 1]), " at step ",
                                    steps[rows - 1], " (", rows, " records)"));
  }
  if (reader.exists("/compression/boundaries/steps")) {
    const std::vector<std::int64_t> steps = reader.read_ints("/compression/boundaries/steps");
    const Dataset2D activations = reader.read_2d("/compression/boundaries/activation_error");
    const Dataset2D gradients = reader.read_2d("/compression/boundaries/gradient_error");
    const std::size_t rows =
        std::min({steps.size(), static_cast<std::size_t>(activations.rows), static_cast<std::size_t>(gradients.rows)});
    std::string text = scheme_of("pp_compress");
    if (rows == 0) text += ", no records";
    for (std::int64_t b = 0; rows > 0 && b < activations.columns; ++b)
      text +=
          detail::concat(b == 0 ? ": " : "; ", "boundary ", b, " activations ",
                         format_number("%.4g", activations.at(static_cast<std::int64_t>(rows) - 1, b)), ", gradients ",
                         format_number("%.4g", gradients.at(static_cast<std::int64_t>(rows) - 1, b)));
    if (rows > 0) text += detail::concat(" at step ", steps[rows - 1]);
    line(report, "pp_compress", text);
  }
}

std::string or_dash(const std::string& text) { return text.empty() ? "-" : text; }

std::string join(const std::vector<std::string>& items, const char* separator) {
  std::string joined;
  for (const auto& item : items) joined += (joined.empty() ? "" : separator) + item;
  return joined;
}

// The config summary lines from the resolved study TOML (keys that are missing are left out).
void write_config_summary(std::ostream& out, const std::string& config, std::string& name) {
  toml::table table;
  try {
    table = toml::parse(config);
  } catch (const toml::parse_error& error) {
    line(out, "config", detail::concat("(not readable as TOML: ", error.description(), ")"));
    return;
  }
  if (auto value = table["name"].value<std::string>()) name = *value;
  std::vector<std::string> model;
  if (auto type = table["model"]["type"].value<std::string>()) model.push_back(*type);
  for (const char* key : {"layers", "width", "heads"}) {
    if (auto value = table["model"][key].value<std::int64_t>()) model.push_back(detail::concat(key, " ", *value));
  }
  if (auto norm = table["model"]["norm"].value<std::string>()) {
    std::string text = "norm " + *norm;
    if (auto kind = table["model"]["norm_kind"].value<std::string>()) text += " " + *kind;
    model.push_back(text);
  }
  line(out, "model", model.empty() ? "-" : join(model, ", "));
  line(out, "scaling", or_dash(table["scaling"]["rule"].value_or(std::string())));
  line(out, "data", or_dash(table["data"]["kind"].value_or(std::string())));
  if (auto steps = table["train"]["steps"].value<std::int64_t>()) {
    line(out, "steps", std::to_string(*steps));
  } else {
    line(out, "steps", "-");
  }
}

std::string describe_steps(const std::vector<std::int64_t>& steps) {
  if (steps.empty()) return "0";
  return detail::concat(steps.size(), " (steps ", steps.front(), "..", steps.back(), ")");
}

// The record index of `step` among the first `records` entries of `steps`; UserError naming the nearest
// recorded steps when it was not recorded.
std::size_t record_of_step(const std::vector<std::int64_t>& steps, std::size_t records, std::int64_t step,
                           const std::string& file_name) {
  if (records == 0) {
    throw UserError(detail::concat("--step ", step, ": run file '", file_name, "' holds no records yet"));
  }
  std::optional<std::int64_t> below, above;
  for (std::size_t i = 0; i < records; ++i) {
    if (steps[i] == step) return i;
    if (steps[i] < step && (!below || steps[i] > *below)) below = steps[i];
    if (steps[i] > step && (!above || steps[i] < *above)) above = steps[i];
  }
  std::vector<std::string> nearest;
  if (below) nearest.push_back(std::to_string(*below));
  if (above) nearest.push_back(std::to_string(*above));
  throw UserError(detail::concat("--step ", step, ": step ", step, " was not recorded in '", file_name,
                                 "'; the nearest recorded step", nearest.size() > 1 ? "s are " : " is ",
                                 join(nearest, " and "), " (", records, " records, steps ", steps.front(), "..",
                                 steps[records - 1], ")"));
}

// The depth table of the statistics (the file has /steps).
void write_depth_table(std::ostream& out, const RunReader& reader, const InspectOptions& options) {
  const std::string file_name = reader.path().string();
  const std::vector<std::int64_t> steps = reader.read_ints("/steps");
  if (!reader.exists("/probes/name")) {
    if (!options.stat.empty() || options.has_step || options.backward) {
      throw UserError(detail::concat("run file '", file_name, "' records no probes (/probes/name), so there is no ",
                                     "depth table for --stat/--step/--backward"));
    }
    return;
  }
  const std::vector<std::string> names = reader.read_strings("/probes/name");
  const std::vector<std::int64_t> depths = reader.read_ints("/probes/depth");
  const std::vector<std::int64_t> blocks = reader.read_ints("/probes/block");
  const std::vector<std::string> kinds = reader.read_strings("/probes/kind");
  const std::size_t probes = names.size();
  if (depths.size() != probes || blocks.size() != probes || kinds.size() != probes) {
    throw UserError(detail::concat("run file '", file_name, "' is malformed: /probes/name, depth, block and kind ",
                                   "have different lengths (", probes, ", ", depths.size(), ", ", blocks.size(), ", ",
                                   kinds.size(), ")"));
  }

  const std::string direction = options.backward ? "backward" : "forward";
  const std::string group = "/" + direction;
  const std::vector<std::string> recorded = reader.exists(group) ? reader.list(group) : std::vector<std::string>{};
  if (recorded.empty()) {
    throw UserError(detail::concat("run file '", file_name, "' records no ", direction, " statistics (", group,
                                   " is empty)", options.backward ? "" : "; try --backward"));
  }
  std::string stat = options.stat;
  if (stat.empty()) {
    stat =
        std::find(recorded.begin(), recorded.end(), default_stat) != recorded.end() ? default_stat : recorded.front();
  }
  if (std::find(recorded.begin(), recorded.end(), stat) == recorded.end()) {
    throw UserError(detail::concat("--stat ", stat, ": statistic '", stat, "' is not recorded in ", group, " of '",
                                   file_name, "' (recorded: ", join(recorded, ", "), ")"));
  }
  const std::string path = group + "/" + stat;
  const Dataset2D values = reader.read_2d(path);
  if (values.columns != static_cast<std::int64_t>(probes)) {
    throw UserError(detail::concat("run file '", file_name, "' is malformed: ", path, " has ", values.columns,
                                   " columns for ", probes, " probes"));
  }
  // An SWMR reader may see /steps and the series at different lengths for a moment: use the shorter.
  const std::size_t records = std::min(steps.size(), static_cast<std::size_t>(values.rows));
  if (!options.has_step && records == 0) {
    out << "\n" << direction << " " << stat << ": no records yet\n";
    return;
  }
  const std::size_t record = options.has_step ? record_of_step(steps, records, options.step, file_name) : records - 1;

  out << "\n"
      << direction << " " << stat << " at step " << steps[record] << " (record " << record + 1 << " of " << records
      << "):\n";
  std::size_t name_width = 4;
  std::size_t kind_width = 4;
  for (std::size_t p = 0; p < probes; ++p) {
    name_width = std::max(name_width, names[p].size());
    kind_width = std::max(kind_width, kinds[p].size());
  }
  auto pad = [](const std::string& text, std::size_t width) {
    return text + std::string(width > text.size() ? width - text.size() : 0, ' ');
  };
  auto right = [](const std::string& text, std::size_t width) {
    return std::string(width > text.size() ? width - text.size() : 0, ' ') + text;
  };
  out << right("depth", 5) << "  " << right("block", 5) << "  " << pad("kind", kind_width) << "  "
      << pad("name", name_width) << "  " << right(stat, 13) << "\n";
  for (std::size_t p = 0; p < probes; ++p) {
    const std::string block = blocks[p] < 0 ? "-" : std::to_string(blocks[p]);
    out << right(std::to_string(depths[p]), 5) << "  " << right(block, 5) << "  " << pad(kinds[p], kind_width) << "  "
        << pad(names[p], name_width) << "  "
        << right(format_number("%.6e", values.at(static_cast<std::int64_t>(record), static_cast<std::int64_t>(p))), 13)
        << "\n";
  }
}

}  // namespace

void inspect_run_file(const InspectOptions& options, std::ostream& out) {
  const RunReader reader = RunReader::open(options.run_file, RunOpenMode::automatic);
  const std::string file_name = reader.path().string();
  std::ostringstream report;
  line(report, "run file", file_name);
  if (reader.swmr()) {
    line(report, "note",
         detail::concat("opened in SWMR-read mode: the file is still marked open for write, so ",
                        "its run is still going or its writer was killed; after a kill, `proplab ", "recover ",
                        file_name, "` makes it readable by every HDF5 tool"));
  }
  auto attribute = [&](const char* key) {
    return reader.has_attribute(key) ? reader.attribute_string(key) : std::string();
  };
  const std::string status = attribute("status");
  const std::string status_detail = attribute("status_detail");
  line(report, "status", or_dash(status) + (status_detail.empty() ? "" : " (" + status_detail + ")"));

  std::string name = options.run_file.stem().string();
  std::ostringstream config_lines;
  write_config_summary(config_lines, attribute("config"), name);
  line(report, "name", name);
  line(report, "started", or_dash(attribute("start_time")));
  line(report, "ended", or_dash(attribute("end_time")));
  line(report, "host", or_dash(attribute("host")));
  line(report, "device", or_dash(attribute("device")));
  line(report, "threads", reader.has_attribute("threads") ? std::to_string(reader.attribute_int("threads")) : "-");
  line(report, "layout", or_dash(attribute("layout")));
  report << config_lines.str();

  const bool has_statistics = reader.exists("/steps");
  const std::size_t probes = reader.exists("/probes/name") ? reader.read_strings("/probes/name").size() : 0;
  line(report, "probes", std::to_string(probes));
  if (reader.exists("/params/name")) line(report, "params", std::to_string(reader.read_strings("/params/name").size()));
  line(report, "records", has_statistics ? describe_steps(reader.read_ints("/steps")) : "0");

  write_compression(report, reader);
  const TrainCurves train = reader.read_train();
  line(report, "train",
       train.size() == 0 ? "0 rows"
                         : detail::concat(train.size(), " rows, last loss ", format_number("%.6g", train.loss.back()),
                                          " at step ", train.step.back()));
  const EvalCurves eval = reader.read_eval();
  line(report, "eval",
       eval.size() == 0 ? "0 rows"
                        : detail::concat(eval.size(), " rows, last loss ", format_number("%.6g", eval.loss.back()),
                                         " at step ", eval.step.back()));

  if (has_statistics) {
    write_depth_table(report, reader, options);
  } else if (!options.stat.empty() || options.has_step || options.backward) {
    throw UserError(detail::concat("run file '", file_name, "' records no statistics (no /steps), so there is no ",
                                   "depth table for --stat/--step/--backward"));
  }
  out << report.str();
}

void recover_run_file_command(const std::filesystem::path& run_file, std::ostream& out) {
  const RecoverResult result = recover_run_file(run_file);
  const std::string file_name = run_file.string();
  if (result.outcome == RecoverOutcome::status_written) {
    out << "proplab: recovered " << file_name << ": it was closed but its run never recorded how it ended; status "
        << result.status_before << " -> " << result.status_after << " (" << recover_killed_detail << ")\n";
    return;
  }
  if (result.outcome == RecoverOutcome::not_marked_open) {
    out << "proplab: " << file_name << " is not marked open for write (status " << or_dash(result.status_before)
        << "): nothing to recover; left unchanged\n";
    return;
  }
  // The plain open proves the file is readable by every tool again.
  const RunReader reader = RunReader::open(run_file, RunOpenMode::normal);
  const std::size_t train_rows = reader.read_train().size();
  const std::size_t eval_rows = reader.read_eval().size();
  out << "proplab: recovered " << file_name << ": cleared its open-for-write mark; status "
      << or_dash(result.status_before);
  if (result.status_after != result.status_before) {
    out << " -> " << result.status_after << " (" << recover_killed_detail << ")";
  }
  out << "; " << train_rows << " train rows, " << eval_rows << " eval rows";
  if (reader.exists("/steps")) out << ", " << reader.dataset_shape("/steps").at(0) << " records";
  for (const RecoverCut& cut : result.cuts) {
    out << "; cut the series of " << cut.family << " to their " << cut.rows_kept << " whole rows ("
        << cut.series_cut.size() << " series had up to " << cut.most_rows_cut
        << " more, from the write the kill interrupted)";
  }
  out << "\n";
}

}  // namespace proplab
