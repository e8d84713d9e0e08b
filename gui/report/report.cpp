// `proplab report`: which runs, how they group, their summary values and report.md (no GL here; the figures are
// drawn in report_figures.cpp).
#include "gui/report/report.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "core/error.h"
#include "gui/data/block_axis.h"
#include "gui/data/run_groups.h"
#include "gui/data/run_library.h"
#include "io/csv.h"

namespace proplab::gui {

namespace {

namespace fs = std::filesystem;

// Columns of index.csv that are not swept values (sweep/index.h).
const std::set<std::string> index_tail_columns = {"status",  "final_loss", "final_val_loss", "steps",
                                                  "seconds", "file",       "detail"};

bool is_seed_key(const std::string& key) {
  return key == "seed" || (key.size() > 5 && key.compare(key.size() - 5, 5, ".seed") == 0);
}

std::string read_whole_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(path.string() + ": cannot be read");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Fills a run's status from its readable file, or records why the file is bad.
void attach_snapshot(ReportRun& run, std::vector<std::string>& bad_files) {
  run.snapshot = load_run_snapshot(run.file);
  if (run.snapshot->ok()) {
    run.status = run.snapshot->status_text();
    run.detail = run.snapshot->status_detail;
    if (run.name.empty()) run.name = run.snapshot->name;
    return;
  }
  if (run.name.empty()) run.name = run.file.stem().string();
  bad_files.push_back(run.file.string() + ": " + run.snapshot->error);
  run.detail = run.snapshot->error;
  run.status = "unreadable";
  run.snapshot = nullptr;
}

// Groups runs by their values of `keys` (one value vector per run), in order of first appearance.
void group_by_values(ReportPlan& plan, const std::vector<std::vector<std::string>>& values) {
  std::map<std::vector<std::string>, std::size_t> found;
  for (std::size_t r = 0; r < plan.runs.size(); ++r) {
    const auto [it, inserted] = found.emplace(values[r], plan.groups.size());
    if (inserted) {
      ReportGroup group;
      std::string slug;
      for (std::size_t k = 0; k < plan.group_keys.size(); ++k) {
        group.label += (k ? ", " : "") + plan.group_keys[k] + "=" + values[r][k];
        slug += (k ? "," : "") + plan.group_keys[k] + "=" + values[r][k];
      }
      if (plan.group_keys.empty()) {
        group.label = "all runs";
        slug = "all";
      }
      group.slug = report_slug(slug);
      plan.groups.push_back(std::move(group));
    }
    plan.runs[r].group = it->second;
    plan.runs[r].key_values = values[r];
    plan.groups[it->second].members.push_back(r);
  }
}

void plan_from_index(ReportPlan& plan, const fs::path& index_file) {
  const auto records = parse_csv(read_whole_file(index_file));
  if (records.empty()) throw UserError(index_file.string() + ": empty (expected a header row: run, ..., status, ...)");
  const std::vector<std::string>& header = records.front();
  auto column = [&](const std::string& name) -> std::optional<std::size_t> {
    const auto it = std::find(header.begin(), header.end(), name);
    return it == header.end() ? std::nullopt : std::optional<std::size_t>(it - header.begin());
  };
  const auto run_column = column("run"), status_column = column("status"), file_column = column("file"),
             detail_column = column("detail");
  if (!run_column || !status_column) {
    throw UserError(index_file.string() + ": the header lacks the `run` or `status` column (not a sweep index)");
  }
  std::vector<std::size_t> key_columns;
  for (std::size_t c = 0; c < header.size(); ++c) {
    if (c == *run_column || index_tail_columns.count(header[c]) || is_seed_key(header[c])) continue;
    key_columns.push_back(c);
    plan.group_keys.push_back(header[c]);
  }
  std::vector<std::vector<std::string>> values;
  for (std::size_t r = 1; r < records.size(); ++r) {
    const auto& fields = records[r];
    auto field = [&](std::optional<std::size_t> c) { return c && *c < fields.size() ? fields[*c] : std::string(); };
    ReportRun run;
    run.name = field(run_column);
    if (run.name.empty()) continue;
    const std::string file = field(file_column);
    run.file = plan.dir / (file.empty() ? run.name + ".h5" : file);
    run.status = field(status_column);
    run.detail = field(detail_column);
    if (fs::exists(run.file)) attach_snapshot(run, plan.bad_files);
    std::vector<std::string> run_values;
    for (const auto c : key_columns) run_values.push_back(field(c));
    values.push_back(std::move(run_values));
    plan.runs.push_back(std::move(run));
  }
  group_by_values(plan, values);
}

void plan_from_files(ReportPlan& plan) {
  std::vector<std::string> problems;
  const auto files = discover_run_files({plan.dir}, problems);
  RunList readable;
  for (const auto& file : files) {
    ReportRun run;
    run.file = file;
    attach_snapshot(run, plan.bad_files);
    if (run.snapshot) readable.push_back(run.snapshot);
    plan.runs.push_back(std::move(run));
  }
  std::vector<std::string> keys;
  for (const auto& key : differing_config_keys(readable)) {
    if (key != "name" && !is_seed_key(key)) keys.push_back(key);
  }
  auto value_of = [](const ReportRun& run, const std::string& key) {
    const std::string value = run.snapshot ? run.snapshot->config_value(key) : std::string();
    return value.empty() ? std::string(unset_value) : value;
  };
  auto values_of = [&](const std::vector<std::string>& of) {
    std::vector<std::vector<std::string>> values;
    for (const auto& run : plan.runs) {
      std::vector<std::string> run_values;
      for (const auto& key : of) run_values.push_back(value_of(run, key));
      values.push_back(std::move(run_values));
    }
    return values;
  };
  auto group_count = [&](const std::vector<std::string>& of) {
    const auto values = values_of(of);
    return std::set<std::vector<std::string>>(values.begin(), values.end()).size();
  };
  // Keys that the others already determine are left out of the labels (a rule's own parameters follow the
  // rule): first those some run leaves unset, then the rest from the last.
  const std::size_t groups = group_count(keys);
  std::vector<std::string> candidates;
  for (const bool unset_somewhere : {true, false}) {
    for (auto key = keys.rbegin(); key != keys.rend(); ++key) {
      const bool unset = std::any_of(plan.runs.begin(), plan.runs.end(), [&](const ReportRun& run) {
        return run.snapshot && value_of(run, *key) == unset_value;
      });
      if (unset == unset_somewhere) candidates.push_back(*key);
    }
  }
  for (const auto& candidate : candidates) {
    std::vector<std::string> fewer;
    for (const auto& key : keys) {
      if (key != candidate) fewer.push_back(key);
    }
    if (group_count(fewer) == groups) keys = std::move(fewer);
  }
  plan.group_keys = keys;
  group_by_values(plan, values_of(keys));
}

double ratio_at(const Dataset2D& matrix, std::int64_t record, std::size_t last, std::size_t first) {
  if (record < 0 || record >= matrix.rows) return std::nan("");
  return matrix.at(record, static_cast<std::int64_t>(last)) / matrix.at(record, static_cast<std::int64_t>(first));
}

double relative_error(double measured, double predicted) {
  if (std::isnan(measured) || std::isnan(predicted)) return std::nan("");
  const double difference = std::abs(measured - predicted);
  if (predicted == 0.0) return difference == 0.0 ? 0.0 : std::numeric_limits<double>::infinity();
  return difference / std::abs(predicted);
}

// Median of the defined relative errors of `var` at record 0 over the residual-stream probes.
double median_theory_error(const RunSnapshot& run, Direction direction) {
  const Dataset2D* measured = run.stat(direction, "var");
  const std::vector<double>* predicted = run.theory(direction, "var");
  if (measured == nullptr || predicted == nullptr || measured->rows < 1) return std::nan("");
  std::vector<double> errors;
  for (std::size_t p = 0; p < run.probes.size(); ++p) {
    if (run.probes[p].kind != "residual") continue;
    const double error = relative_error(measured->at(0, static_cast<std::int64_t>(p)), (*predicted)[p]);
    if (!std::isnan(error)) errors.push_back(error);
  }
  if (errors.empty()) return std::nan("");
  std::sort(errors.begin(), errors.end());
  const std::size_t n = errors.size();
  return n % 2 == 1 ? errors[n / 2] : 0.5 * (errors[n / 2 - 1] + errors[n / 2]);
}

std::string table_cell(const std::string& text) {
  std::string cell;
  for (const char c : text) {
    if (c == '|') {
      cell += "\\|";
    } else if (c == '\n' || c == '\r') {
      cell += ' ';
    } else {
      cell += c;
    }
  }
  return cell;
}

// `text` as a number when all of it reads as a finite one.
std::optional<double> parse_number(const std::string& text) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text.front()))) return std::nullopt;
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() || !std::isfinite(value)) return std::nullopt;
  return value;
}

double mean_of(std::vector<double>::const_iterator begin, std::vector<double>::const_iterator end) {
  if (begin == end) return std::nan("");
  double sum = 0.0;
  for (auto it = begin; it != end; ++it) sum += *it;
  return sum / static_cast<double>(end - begin);
}

// The run's value of `key`: its index (or grouping) value when `key` is a group key, else its config's.
std::string run_value(const ReportPlan& plan, const ReportRun& run, const std::string& key) {
  const auto found = std::find(plan.group_keys.begin(), plan.group_keys.end(), key);
  if (found != plan.group_keys.end()) {
    const auto k = static_cast<std::size_t>(found - plan.group_keys.begin());
    if (k < run.key_values.size()) return run.key_values[k];
  }
  const std::string value = run.snapshot ? run.snapshot->config_value(key) : std::string();
  return value.empty() ? std::string(unset_value) : value;
}

// True when, over `runs` ((run, lr) pairs), `from`'s value of a run determines `to`'s (each value of `from` meets one
// value of `to`).
template <typename From, typename To>
bool determines(const std::vector<std::pair<std::size_t, double>>& runs, From from, To to) {
  using Key = decltype(from(runs.front()));
  std::map<Key, std::set<decltype(to(runs.front()))>> seen;
  for (const auto& run : runs) seen[from(run)].insert(to(run));
  return std::all_of(seen.begin(), seen.end(), [](const auto& entry) { return entry.second.size() == 1; });
}

// True when `key`'s values and the lrs determine each other over `runs` (a key zipped with train.lr).
bool follows_lr(const ReportPlan& plan, const std::vector<std::pair<std::size_t, double>>& runs,
                const std::string& key) {
  const auto value = [&](const std::pair<std::size_t, double>& run) {
    return run_value(plan, plan.runs[run.first], key);
  };
  const auto lr = [](const std::pair<std::size_t, double>& run) { return run.second; };
  return determines(runs, lr, value) && determines(runs, value, lr);
}

std::string lr_list(const std::vector<double>& lrs) {
  std::string text;
  for (std::size_t i = 0; i < lrs.size(); ++i) text += (i ? ", " : "") + report_number(lrs[i]);
  return text;
}

// report.md's "Learning-rate sweeps" section (see the invariants of report.h).
void lr_markdown(std::ostringstream& md, const ReportPlan& plan, const ReportFigures& figures) {
  const LrSweeps& sweeps = plan.lr;
  if (sweeps.families.empty()) return;
  const std::string series_key = sweeps.series_key;
  md << "\n## Learning-rate sweeps\n\n";
  md << "Final loss against `" << lr_key << "` (log scale), one figure per family of runs that share every "
     << (plan.from_index ? "swept" : "differing") << " value except `" << lr_key << "`, the seed";
  if (!series_key.empty()) {
    md << " and `" << series_key << "`; one line per `" << series_key << "` value";
  } else {
    md << "; one line";
  }
  md << ". A large dot marks the best learning rate of a line, an × a diverged point (drawn at the top, its loss "
        "off the scale).\n\n";
  md << "*final loss*: the last evaluation loss when a run records one, else its mean training loss over the last "
     << lr_final_steps << " steps; a point's is the mean over its seeds. *diverged*: the run's status is diverged "
     << "or failed, or its final loss is not finite or exceeds its initial loss (the mean training loss over its "
        "first "
     << lr_initial_steps << " steps); a point is diverged when any of its runs is, and is never the best. "
     << "*best lr*: the lr of the lowest final loss among the points not diverged (ties: the smaller lr). n/a: no "
        "loss recorded.\n";
  for (std::size_t f = 0; f < sweeps.families.size(); ++f) {
    const LrFamily& family = sweeps.families[f];
    md << "\n### " << family.label << "\n\n";
    md << "![learning-rate sweep: " << family.label << "](" << figures.lr[f] << ")\n\n";
    md << "| " << (series_key.empty() ? "runs" : table_cell(series_key))
       << " | best lr | final loss | lrs tried | diverged lrs |\n";
    md << "|---|---:|---:|---|---|\n";
    for (const LrSeries& series : family.series) {
      std::vector<double> diverged;
      std::string tried;
      bool all_diverged = !series.points.empty();
      for (std::size_t p = 0; p < series.points.size(); ++p) {
        const LrPoint& point = series.points[p];
        tried += (p ? ", " : "") + report_number(point.lr) + (point.has_loss || point.diverged ? "" : " (n/a)");
        if (point.diverged) diverged.push_back(point.lr);
        all_diverged = all_diverged && point.diverged;
      }
      md << "| " << (series_key.empty() ? std::string("all") : table_cell(series.value)) << " | ";
      if (series.best) {
        md << report_number(series.points[*series.best].lr) << " | "
           << report_number(series.points[*series.best].final_loss);
      } else {
        md << (all_diverged ? "all diverged" : "n/a") << " | n/a";
      }
      md << " | " << tried << " | " << (diverged.empty() ? std::string("none") : lr_list(diverged)) << " |\n";
    }
    md << "\n";
    if (series_key.empty()) {
      md << "Transfer: n/a (one line).\n";
    } else if (std::isnan(family.transfer)) {
      md << "Transfer over `" << series_key << "`: n/a (fewer than two values with a best lr).\n";
    } else {
      md << "Transfer over `" << series_key << "`: max / min best lr = " << report_number(family.transfer)
         << " (1: the best lr did not move).\n";
    }
  }
}

}  // namespace

LrRunLoss lr_run_loss(const ReportRun& run) {
  LrRunLoss loss;
  if (run.snapshot) {
    const std::vector<double>& train = run.snapshot->train.loss;
    const std::vector<double>& eval = run.snapshot->eval.loss;
    if (!train.empty()) {
      loss.initial_loss =
          mean_of(train.begin(), train.begin() + static_cast<std::ptrdiff_t>(std::min(lr_initial_steps, train.size())));
    }
    if (!eval.empty()) {
      loss.final_loss = eval.back();
      loss.from_eval = true;
    } else if (!train.empty()) {
      loss.final_loss =
          mean_of(train.end() - static_cast<std::ptrdiff_t>(std::min(lr_final_steps, train.size())), train.end());
    }
    loss.has_loss = !train.empty() || !eval.empty();
  }
  // A final loss above the initial one is a run that got worse: too large a learning rate, even when it stayed
  // finite (NaN comparisons are false, so a run without training rows is judged by its status alone).
  loss.diverged = run.status == "diverged" || run.status == "failed" ||
                  (loss.has_loss && (!std::isfinite(loss.final_loss) || loss.final_loss > loss.initial_loss));
  return loss;
}

LrSweeps lr_sweeps(const ReportPlan& plan) {
  LrSweeps sweeps;
  std::vector<std::pair<std::size_t, double>> runs;  // (run, lr) of the runs with an lr
  std::set<double> lrs;
  for (std::size_t r = 0; r < plan.runs.size(); ++r) {
    const auto lr = parse_number(run_value(plan, plan.runs[r], lr_key));
    if (!lr || *lr <= 0.0) continue;
    runs.emplace_back(r, *lr);
    lrs.insert(*lr);
  }
  if (lrs.size() < 2) return sweeps;

  std::vector<std::string> keys;
  for (const auto& key : plan.group_keys) {
    if (key != lr_key && !follows_lr(plan, runs, key)) keys.push_back(key);
  }
  auto numeric_key = [&](const std::string& key) {
    return std::all_of(runs.begin(), runs.end(),
                       [&](const auto& run) { return parse_number(run_value(plan, plan.runs[run.first], key)); });
  };
  const auto series_key = std::find_if(keys.begin(), keys.end(), numeric_key);
  sweeps.series_key = series_key != keys.end() ? *series_key : keys.empty() ? std::string() : keys.front();
  // A key the series key determines (model.width zipped with model.layers at equal parameters, scaling.rule zipped
  // with model.norm) only names the lines again: it fixes no family.
  const auto follows_series = [&](const std::string& key) {
    const auto value_of = [&](const std::string& of) {
      return
          [&plan, of](const std::pair<std::size_t, double>& run) { return run_value(plan, plan.runs[run.first], of); };
    };
    return determines(runs, value_of(sweeps.series_key), value_of(key));
  };
  for (const auto& key : keys) {
    if (key != sweeps.series_key && !follows_series(key)) sweeps.fixed_keys.push_back(key);
  }

  std::vector<LrRunLoss> losses(plan.runs.size());
  for (const auto& [r, lr] : runs) losses[r] = lr_run_loss(plan.runs[r]);
  // Families, series values and lrs, in order of first appearance; points are sorted by lr below.
  std::map<std::vector<std::string>, std::size_t> family_of;
  std::vector<std::map<std::string, std::map<double, LrPoint>>> points;
  std::vector<std::vector<std::string>> series_values;
  for (const auto& [r, lr] : runs) {
    std::vector<std::string> fixed;
    for (const auto& key : sweeps.fixed_keys) fixed.push_back(run_value(plan, plan.runs[r], key));
    const auto [found, inserted] = family_of.emplace(fixed, sweeps.families.size());
    if (inserted) {
      LrFamily family;
      std::string slug;
      for (std::size_t k = 0; k < fixed.size(); ++k) {
        family.label += (k ? ", " : "") + sweeps.fixed_keys[k] + "=" + fixed[k];
        slug += (k ? "," : "") + sweeps.fixed_keys[k] + "=" + fixed[k];
      }
      family.label = fixed.empty() ? "all runs" : family.label;
      family.slug = report_slug(fixed.empty() ? "all" : slug);
      sweeps.families.push_back(std::move(family));
      points.emplace_back();
      series_values.emplace_back();
    }
    const std::size_t f = found->second;
    const std::string value = sweeps.series_key.empty() ? "" : run_value(plan, plan.runs[r], sweeps.series_key);
    if (!points[f].count(value)) series_values[f].push_back(value);
    LrPoint& point = points[f][value][lr];
    point.lr = lr;
    point.runs.push_back(r);
  }
  for (std::size_t f = 0; f < sweeps.families.size(); ++f) {
    LrFamily& family = sweeps.families[f];
    std::vector<std::string> values = series_values[f];
    if (std::all_of(values.begin(), values.end(), [](const std::string& v) { return parse_number(v).has_value(); })) {
      std::stable_sort(values.begin(), values.end(),
                       [](const std::string& a, const std::string& b) { return *parse_number(a) < *parse_number(b); });
    }
    double best_min = std::numeric_limits<double>::infinity(), best_max = 0.0;
    std::size_t bests = 0;
    for (const auto& value : values) {
      LrSeries series;
      series.value = value;
      for (auto& [lr, point] : points[f][value]) {
        std::vector<double> finals;
        for (const auto r : point.runs) {
          point.diverged = point.diverged || losses[r].diverged;
          if (losses[r].has_loss) finals.push_back(losses[r].final_loss);
        }
        point.has_loss = !finals.empty();
        point.final_loss = mean_of(finals.begin(), finals.end());
        const bool candidate = point.has_loss && !point.diverged && std::isfinite(point.final_loss);
        // Strictly lower: of equal losses the smaller lr (points go by increasing lr) stays the best.
        if (candidate && (!series.best || point.final_loss < series.points[*series.best].final_loss))
          series.best = series.points.size();
        series.points.push_back(std::move(point));
      }
      if (series.best) {
        best_min = std::min(best_min, series.points[*series.best].lr);
        best_max = std::max(best_max, series.points[*series.best].lr);
        ++bests;
      }
      family.series.push_back(std::move(series));
    }
    if (bests >= 2) family.transfer = best_max / best_min;
  }
  return sweeps;
}

ReportPlan plan_report(const fs::path& dir) {
  if (!fs::is_directory(dir))
    throw UserError(dir.string() + ": not a folder (expected a sweep folder or a folder of run files)");
  ReportPlan plan;
  plan.dir = dir;
  const fs::path index_file = dir / "index.csv";
  plan.from_index = fs::is_regular_file(index_file);
  if (plan.from_index) {
    plan_from_index(plan, index_file);
  } else {
    plan_from_files(plan);
  }
  const bool any_readable =
      std::any_of(plan.runs.begin(), plan.runs.end(), [](const ReportRun& run) { return run.snapshot != nullptr; });
  if (!any_readable) {
    std::string message = dir.string() + ": no readable runs";
    message += plan.from_index
                   ? " (index.csv lists " + std::to_string(plan.runs.size()) + " points, none with a readable run file)"
                   : " (no run files *.h5 under it that could be read)";
    for (const auto& bad : plan.bad_files) message += "\n  unreadable: " + bad;
    throw UserError(message);
  }
  plan.lr = lr_sweeps(plan);
  return plan;
}

std::optional<std::pair<std::size_t, std::size_t>> growth_probe_pair(const std::vector<ProbeInfo>& probes) {
  auto find = [&](const std::string& name) -> std::optional<std::size_t> {
    for (std::size_t p = 0; p < probes.size(); ++p) {
      if (probes[p].name == name) return p;
    }
    return std::nullopt;
  };
  std::int64_t last_block = -1;
  for (const auto& probe : probes) last_block = std::max(last_block, probe.block);
  if (last_block >= 0) {
    const std::string last = std::to_string(last_block);
    const auto block_in = find("blocks.0.in"), block_out = find("blocks." + last + ".out");
    if (block_in && block_out) return std::make_pair(*block_in, *block_out);
    const auto layer_in = find("layers.0.preact"), layer_out = find("layers." + last + ".preact");
    if (layer_in && layer_out) return std::make_pair(*layer_in, *layer_out);
  }
  const auto residual = probes_of_kind(probes, "residual");
  if (residual.size() >= 2) return std::make_pair(residual.front(), residual.back());
  return std::nullopt;
}

RunMetrics report_metrics(const RunSnapshot& run) {
  RunMetrics metrics;
  metrics.final_loss = run.final_loss();
  const auto pair = growth_probe_pair(run.probes);
  if (pair) {
    metrics.growth_first = run.probes[pair->first].name;
    metrics.growth_last = run.probes[pair->second].name;
    const std::int64_t last_record = static_cast<std::int64_t>(run.records()) - 1;
    if (const Dataset2D* forward = run.stat(Direction::forward, "var")) {
      metrics.growth_forward_init = ratio_at(*forward, 0, pair->second, pair->first);
      metrics.growth_forward_end = ratio_at(*forward, last_record, pair->second, pair->first);
    }
    if (const Dataset2D* backward = run.stat(Direction::backward, "var")) {
      metrics.growth_backward_init = ratio_at(*backward, 0, pair->second, pair->first);
      metrics.growth_backward_end = ratio_at(*backward, last_record, pair->second, pair->first);
    }
  }
  // The prediction is for the network at initialisation: only a record at step 0 compares with it.
  if (run.records() > 0 && run.record_steps.front() == 0) {
    metrics.theory_error_forward = median_theory_error(run, Direction::forward);
    metrics.theory_error_backward = median_theory_error(run, Direction::backward);
  }
  return metrics;
}

std::string report_number(double value) {
  if (std::isnan(value)) return "n/a";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char text[64];
  std::snprintf(text, sizeof(text), "%.6g", value);
  return text;
}

std::string report_slug(const std::string& text) {
  std::string slug;
  for (const char c : text) {
    const bool keep = std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '=' || c == ',' ||
                      c == '+' || c == '-';
    slug += keep ? c : '_';
  }
  return slug.empty() ? "_" : slug;
}

ReportFigures report_figure_names(const ReportPlan& plan) {
  ReportFigures figures;
  for (const auto& group : plan.groups) {
    const bool readable = std::any_of(group.members.begin(), group.members.end(),
                                      [&](std::size_t r) { return plan.runs[r].snapshot != nullptr; });
    figures.depth.push_back(readable ? "figures/depth_" + group.slug + ".png" : "");
    figures.loss.push_back(readable ? "figures/loss_" + group.slug + ".png" : "");
  }
  const auto readable_runs = static_cast<std::size_t>(
      std::count_if(plan.runs.begin(), plan.runs.end(), [](const ReportRun& run) { return run.snapshot != nullptr; }));
  if (plan.groups.size() >= 2 && readable_runs >= 2 && readable_runs <= report_compare_runs) {
    figures.depth_all = "figures/depth_all.png";
    figures.loss_all = "figures/loss_all.png";
  }
  std::set<std::string> taken{"figures/depth_all", "figures/loss_all"};
  for (const auto& run : plan.runs) {
    if (!run.snapshot) {
      figures.heatmap.emplace_back();
      continue;
    }
    // Two runs of a plain folder may share a name (in different subfolders): the later ones get a number.
    std::string name = "figures/heatmap_" + report_slug(run.name);
    for (int n = 2; taken.count(name); ++n) name = "figures/heatmap_" + report_slug(run.name) + "_" + std::to_string(n);
    taken.insert(name);
    figures.heatmap.push_back(name + ".png");
  }
  for (const auto& family : plan.lr.families) {
    std::string name = "figures/lr_" + family.slug;
    for (int n = 2; taken.count(name); ++n) name = "figures/lr_" + family.slug + "_" + std::to_string(n);
    taken.insert(name);
    figures.lr.push_back(name + ".png");
  }
  return figures;
}

std::string report_markdown(const ReportPlan& plan, const ReportFigures& figures,
                            const std::vector<RunMetrics>& metrics) {
  std::ostringstream md;
  const std::string folder = fs::absolute(plan.dir).lexically_normal().filename().string();
  md << "# proplab report: " << (folder.empty() ? plan.dir.string() : folder) << "\n\n";
  md << plan.runs.size() << " runs from `" << plan.dir.string() << "` ("
     << (plan.from_index ? "a sweep folder: index.csv" : "a folder of run files") << "), in " << plan.groups.size()
     << (plan.groups.size() == 1 ? " group" : " groups");
  if (!plan.group_keys.empty()) {
    md << " by ";
    for (std::size_t k = 0; k < plan.group_keys.size(); ++k) md << (k ? ", " : "") << "`" << plan.group_keys[k] << "`";
  }
  md << ".\n\n## Summary\n\n";
  md << "| run | group | status | final loss | growth fwd init | growth fwd end | growth bwd init | growth bwd end | "
        "theory error fwd | theory error bwd |\n";
  md << "|---|---|---|---:|---:|---:|---:|---:|---:|---:|\n";
  std::set<std::string> growth_definitions;
  for (std::size_t r = 0; r < plan.runs.size(); ++r) {
    const ReportRun& run = plan.runs[r];
    const RunMetrics& m = metrics[r];
    md << "| " << table_cell(run.name) << " | " << table_cell(plan.groups[run.group].label) << " | "
       << table_cell(run.status) << " | " << report_number(m.final_loss) << " | "
       << report_number(m.growth_forward_init) << " | " << report_number(m.growth_forward_end) << " | "
       << report_number(m.growth_backward_init) << " | " << report_number(m.growth_backward_end) << " | "
       << report_number(m.theory_error_forward) << " | " << report_number(m.theory_error_backward) << " |\n";
    if (!m.growth_first.empty()) growth_definitions.insert("`" + m.growth_last + "` / `" + m.growth_first + "`");
  }
  md << "\n*final loss*: the last training loss. *growth*: `var` of the activations (fwd) or of their gradients "
        "(bwd) at the last block's output over the first block's input";
  if (!growth_definitions.empty()) {
    md << " (";
    std::size_t k = 0;
    for (const auto& definition : growth_definitions) md << (k++ ? "; " : "") << definition;
    md << ")";
  }
  md << ", at initialisation (record 0) and at the end (last record). *theory error*: the median over the "
        "residual-stream probes of |measured − predicted| / |predicted| of `var` at initialisation (step 0). "
        "n/a: the run file does not have what the value needs.\n";

  bool any_detail = false;
  for (const auto& run : plan.runs) any_detail = any_detail || (!run.detail.empty() && run.status != "completed");
  if (any_detail) {
    md << "\nNot completed:\n\n";
    for (const auto& run : plan.runs) {
      if (run.detail.empty() || run.status == "completed") continue;
      md << "- " << run.name << " (" << run.status << "): " << table_cell(run.detail) << "\n";
    }
  }
  if (!figures.depth_all.empty()) {
    md << "\n## All runs\n\nEvery run of the folder side by side, one colour per run (the groups below show each "
          "group alone).\n\n";
    md << "![depth profiles: all runs](" << figures.depth_all << ")\n\n";
    md << "![loss: all runs](" << figures.loss_all << ")\n";
  }
  lr_markdown(md, plan, figures);

  for (std::size_t g = 0; g < plan.groups.size(); ++g) {
    const ReportGroup& group = plan.groups[g];
    md << "\n## " << group.label << "\n\n";
    if (figures.depth[g].empty()) {
      md << "No readable run file in this group.\n";
      continue;
    }
    md << "Depth profiles of `var`, forward (top) and backward (bottom), at initialisation (left) and at the end "
          "(right); one colour per run, the theory's prediction at initialisation dashed.";
    // As the figures: by block when every readable run of the group has a stage layout (ResNets).
    bool staged = false, unstaged = false;
    for (const auto r : group.members) {
      if (!plan.runs[r].snapshot) continue;
      (has_block_axis(*plan.runs[r].snapshot) ? staged : unstaged) = true;
    }
    if (staged && !unstaged) {
      md << " The x axis is the block (ResNet stages: vertical dashed lines at the transitions, labelled by stage; "
            "the heatmaps mark them likewise).";
    }
    md << "\n\n";
    md << "![depth profiles: " << group.label << "](" << figures.depth[g] << ")\n\n";
    md << "Training loss (evaluation loss dashed).\n\n";
    md << "![loss: " << group.label << "](" << figures.loss[g] << ")\n\n";
    md << "Heatmaps of `var` (probes by depth × records), forward and backward:\n";
    for (const auto r : group.members) {
      if (figures.heatmap[r].empty()) continue;
      md << "\n### " << plan.runs[r].name << "\n\n![heatmap: " << plan.runs[r].name << "](" << figures.heatmap[r]
         << ")\n";
    }
  }
  if (!plan.bad_files.empty()) {
    md << "\n## Unreadable files\n\n";
    for (const auto& bad : plan.bad_files) md << "- " << table_cell(bad) << "\n";
  }
  return md.str();
}

int report_command(const ReportOptions& options, std::ostream& out, std::ostream& err, bool terminal) {
  const ReportPlan plan = plan_report(options.dir);
  const fs::path report_dir = options.out.empty() ? options.dir / "report" : options.out;
  const ReportFigures figures = report_figure_names(plan);
  std::vector<RunMetrics> metrics;
  for (const auto& run : plan.runs) metrics.push_back(run.snapshot ? report_metrics(*run.snapshot) : RunMetrics{});
  std::error_code error;
  fs::create_directories(report_dir / "figures", error);
  if (error)
    throw UserError(detail::concat((report_dir / "figures").string(), ": cannot be created (", error.message(), ")"));
  std::size_t shown_width = 0;
  render_report_figures(plan, figures, report_dir, [&](std::size_t index, std::size_t count, const std::string& what) {
    const std::string line = detail::concat("proplab report: figure ", index + 1, "/", count, ": ", what);
    if (terminal) {
      err << "\r" << line << std::string(shown_width > line.size() ? shown_width - line.size() : 0, ' ') << std::flush;
      shown_width = line.size();
    } else {
      err << line << "\n";
    }
  });
  if (terminal && shown_width > 0) err << "\n";
  const fs::path markdown = report_dir / "report.md";
  {
    std::ofstream file(markdown, std::ios::binary);
    file << report_markdown(plan, figures, metrics);
    if (!file) throw UserError(markdown.string() + ": could not be written");
  }
  std::size_t written = 0;
  for (const auto& group : figures.depth) written += group.empty() ? 0 : 1;
  for (const auto& group : figures.loss) written += group.empty() ? 0 : 1;
  written += figures.depth_all.empty() ? 0 : 2;
  for (const auto& heatmap : figures.heatmap) written += heatmap.empty() ? 0 : 1;
  written += figures.lr.size();
  out << "proplab report: wrote " << markdown.string() << " (" << plan.runs.size() << " runs, " << plan.groups.size()
      << " groups, " << written << " figures)\n";
  if (plan.bad_files.empty()) return 0;
  err << "proplab report: " << plan.bad_files.size() << " run file" << (plan.bad_files.size() == 1 ? "" : "s")
      << " could not be read (left out of the report):\n";
  for (const auto& bad : plan.bad_files) err << "  " << bad << "\n";
  return 2;
}

}  // namespace proplab::gui
