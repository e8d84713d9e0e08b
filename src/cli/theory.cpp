#include "cli/theory.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>
#include <sstream>

#include "core/error.h"
#include "io/run_reader.h"
#include "study/run_spec.h"
#include "study/study.h"
#include "train/theory_run.h"

namespace proplab {

namespace {

constexpr int label_width = 12;
constexpr std::size_t number_width = 13;

std::string format_number(const char* format, double value) {
  char text[64];
  std::snprintf(text, sizeof(text), format, value);
  return text;
}

// A statistic in the tables: "-" when there is none (NaN).
std::string stat_text(double value) { return std::isnan(value) ? "-" : format_number("%.6e", value); }

std::string pad(const std::string& text, std::size_t width) {
  return text + std::string(width > text.size() ? width - text.size() : 0, ' ');
}

std::string right(const std::string& text, std::size_t width) {
  return std::string(width > text.size() ? width - text.size() : 0, ' ') + text;
}

// Characters of UTF-8 text (continuation bytes are not counted), for alignment.
std::size_t display_width(const std::string& text) {
  return static_cast<std::size_t>(
      std::count_if(text.begin(), text.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }));
}

// "label:" padded to label_width, then the value.
void line(std::ostream& out, const std::string& label, const std::string& value) {
  const std::string head = label + ":";
  const std::size_t width = display_width(head);
  out << head << std::string(width + 1 > label_width ? 1 : label_width - width, ' ') << value << "\n";
}

// |measured - predicted| / |predicted|; NaN when either is missing.
double relative_error(double measured, double predicted) {
  if (std::isnan(measured) || std::isnan(predicted)) return std::nan("");
  const double difference = std::abs(measured - predicted);
  if (predicted == 0.0) return difference == 0.0 ? 0.0 : std::numeric_limits<double>::infinity();
  return difference / std::abs(predicted);
}

std::string error_text(double error) { return std::isnan(error) ? "-" : format_number("%.3g", error); }

std::string model_text(const Study& study) {
  if (study.model.kind() == ModelKind::transformer) {
    const TransformerConfig& m = study.model.transformer();
    return detail::concat("transformer, layers ", m.layers, ", width ", m.width, ", heads ", m.heads, ", seq_len ",
                          m.seq_len, ", vocab ", m.vocab);
  }
  if (study.model.kind() == ModelKind::resnet) {
    const ResnetConfig& m = study.model.resnet();
    return detail::concat("resnet, depth ", m.depth, ", width ", m.width, ", ",
                          m.block == ResnetBlock::basic ? "basic" : "bottleneck", " blocks, ",
                          m.preact ? "pre" : "post", "-activation, norm ",
                          m.norm == ResnetNorm::batchnorm ? "batchnorm" : "none");
  }
  const MlpConfig& m = study.model.mlp();
  return detail::concat("mlp, layers ", m.layers, ", width ", m.width, ", input_dim ", m.input_dim);
}

std::string phase_text(theory::Phase phase) {
  switch (phase) {
    case theory::Phase::ordered:
      return "ordered (χ₁ < 1: inputs become correlated with depth, gradients vanish)";
    case theory::Phase::critical:
      return "critical, at the edge of chaos (χ₁ = 1: gradients neither vanish nor explode)";
    case theory::Phase::chaotic:
      return "chaotic (χ₁ > 1: nearby inputs decorrelate with depth, gradients explode)";
  }
  PROPLAB_CHECK(false, "unknown phase ", static_cast<int>(phase));
  return "";
}

void write_predictions(std::ostream& out, const theory::ProbePrediction& prediction) {
  std::size_t name_width = 4, kind_width = 4;
  for (const theory::ProbeTheory& p : prediction.probes) {
    name_width = std::max(name_width, p.name.size());
    kind_width = std::max(kind_width, p.kind.size());
  }
  // The finite-width band's columns only when the model has one (MLPs, normed transformers, some ResNets).
  const bool banded = std::any_of(prediction.probes.begin(), prediction.probes.end(),
                                  [](const theory::ProbeTheory& p) { return std::isfinite(p.var_log_sd); });
  out << "\npredicted at initialisation:\n";
  out << right("depth", 5) << "  " << right("block", 5) << "  " << pad("kind", kind_width) << "  "
      << pad("name", name_width) << "  " << right("var", number_width) << "  " << right("mean", number_width) << "  "
      << right("corr", number_width) << "  " << right("backward var", number_width);
  if (banded)
    out << "  " << right("log-var sd", number_width) << "  " << right("var 95% low", number_width) << "  "
        << right("var 95% high", number_width);
  out << "\n";
  for (std::size_t i = 0; i < prediction.probes.size(); ++i) {
    const theory::ProbeTheory& p = prediction.probes[i];
    out << right(std::to_string(i), 5) << "  " << right(p.block < 0 ? "-" : std::to_string(p.block), 5) << "  "
        << pad(p.kind, kind_width) << "  " << pad(p.name, name_width) << "  " << right(stat_text(p.var), number_width)
        << "  " << right(stat_text(p.mean), number_width) << "  " << right(stat_text(p.corr), number_width) << "  "
        << right(stat_text(p.backward_var), number_width);
    if (banded) {
      const theory::VarRange range = theory::one_network_range(p.var, p.var_log_sd);
      out << "  " << right(stat_text(p.var_log_sd), number_width) << "  " << right(stat_text(range.low), number_width)
          << "  " << right(stat_text(range.high), number_width);
    }
    out << "\n";
  }
  if (banded)
    out << "\nfinite-width band: one network's log(var) is about normal with the sd above and mean log(var) - sd^2/2;"
           "\nthe 95% range is var * exp(-sd^2/2 -+ 1.96 sd) (docs/theory.md, \"Finite-width bands\").\n";
  const std::string missing = prediction.no_prediction_text();
  out << "\nno prediction:" << (missing.empty() ? " -\n" : "\n");
  std::istringstream lines(missing);
  for (std::string text; std::getline(lines, text);)
    if (!text.empty()) out << "  " << text << "\n";
}

void write_mean_field(std::ostream& out, const theory::MeanFieldSummary& summary) {
  out << "\nmean field of the hidden layers:\n";
  line(out, "  q*", std::isinf(summary.q_star) ? "inf (q grows without bound)" : format_number("%.6g", summary.q_star));
  line(out, "  c*", std::isnan(summary.c_star) ? "-" : format_number("%.6g", summary.c_star));
  line(out, "  χ₁", format_number("%.6g", summary.chi1));
  line(out, "  phase", phase_text(summary.phase));
}

// Row 0 of /<direction>/<stat>, or NaNs when the run did not record it.
std::vector<double> first_record(const RunReader& reader, const std::string& path, std::size_t probes) {
  if (!reader.exists(path)) return std::vector<double>(probes, std::nan(""));
  const Dataset2D data = reader.read_2d(path);
  if (data.rows < 1 || data.columns != static_cast<std::int64_t>(probes))
    throw UserError(detail::concat(reader.path().string(), ": ", path, " has shape [", data.rows, ", ", data.columns,
                                   "], expected [n_records, ", probes, "]"));
  return std::vector<double>(data.values.begin(), data.values.begin() + static_cast<std::ptrdiff_t>(probes));
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// "median M, worst W (name)" over the finite errors, or "-" when there are none.
std::string error_summary(const std::vector<std::pair<double, std::string>>& errors) {
  std::vector<double> values;
  const std::pair<double, std::string>* worst = nullptr;
  for (const auto& entry : errors) {
    if (std::isnan(entry.first)) continue;
    values.push_back(entry.first);
    if (!worst || entry.first > worst->first) worst = &entry;
  }
  if (values.empty()) return "-";
  return "median " + error_text(median(values)) + ", worst " + error_text(worst->first) + " (" + worst->second + ")";
}

void write_comparison(std::ostream& out, const std::filesystem::path& run_file,
                      const theory::ProbePrediction& prediction) {
  const RunReader reader = RunReader::open(run_file, RunOpenMode::automatic);
  const std::string file_name = reader.path().string();
  const std::vector<std::int64_t> steps =
      reader.exists("/steps") ? reader.read_ints("/steps") : std::vector<std::int64_t>();
  if (steps.empty() || steps[0] != 0)
    throw UserError(file_name + ": " +
                    (steps.empty() ? std::string("has no statistics records")
                                   : "its first record is at step " + std::to_string(steps[0])) +
                    "; the comparison needs the record at step 0 (the network at initialisation)");
  const std::vector<std::string> names = reader.read_strings("/probes/name");
  std::map<std::string, std::size_t> index;
  for (std::size_t i = 0; i < names.size(); ++i) index.emplace(names[i], i);
  std::vector<std::string> unmatched;
  for (const theory::ProbeTheory& p : prediction.probes)
    if (!index.count(p.name)) unmatched.push_back(p.name);
  if (!unmatched.empty() || names.size() != prediction.probes.size())
    throw UserError(
        detail::concat(file_name, ": its probes are not those of the study's model (the run has ", names.size(),
                       " probes, the model ", prediction.probes.size(),
                       unmatched.empty() ? std::string() : ", e.g. " + unmatched.front() + " is not in the run",
                       "); compare a run of this study (same model settings)"));

  const std::size_t probes = names.size();
  const std::vector<double> var = first_record(reader, "/forward/var", probes);
  const std::vector<double> corr = first_record(reader, "/forward/corr", probes);
  const std::vector<double> backward_var = first_record(reader, "/backward/var", probes);
  const std::vector<double> backward_corr = first_record(reader, "/backward/corr", probes);

  std::size_t name_width = 4;
  for (const auto& name : names) name_width = std::max(name_width, name.size());
  out << "\ncompared with " << file_name << ", record at step 0 (measured, predicted, relative error):\n";
  out << pad("name", name_width);
  for (const char* stat : {"var", "corr", "backward var", "backward corr"})
    out << "  " << right(std::string("measured ") + stat, number_width + 9) << "  " << right("predicted", number_width)
        << "  " << right("rel.err", 9);
  out << "\n";
  std::vector<std::pair<double, std::string>> residual_var_errors, residual_backward_errors;
  for (const theory::ProbeTheory& p : prediction.probes) {
    const std::size_t r = index.at(p.name);
    out << pad(p.name, name_width);
    const std::pair<double, double> pairs[] = {
        {var[r], p.var}, {corr[r], p.corr}, {backward_var[r], p.backward_var}, {backward_corr[r], p.backward_corr}};
    for (const auto& [measured, predicted] : pairs)
      out << "  " << right(stat_text(measured), number_width + 9) << "  " << right(stat_text(predicted), number_width)
          << "  " << right(error_text(relative_error(measured, predicted)), 9);
    out << "\n";
    if (p.kind == "residual") {
      residual_var_errors.emplace_back(relative_error(var[r], p.var), p.name);
      residual_backward_errors.emplace_back(relative_error(backward_var[r], p.backward_var), p.name);
    }
  }
  out << "\nresidual stream (" << residual_var_errors.size() << " probes), relative error: forward var "
      << error_summary(residual_var_errors) << "; backward var " << error_summary(residual_backward_errors) << "\n";
  std::size_t banded = 0, inside = 0;
  for (const theory::ProbeTheory& p : prediction.probes) {
    const theory::VarRange range = theory::one_network_range(p.var, p.var_log_sd);
    const double measured = var[index.at(p.name)];
    if (!std::isfinite(range.low) || !std::isfinite(measured)) continue;
    ++banded;
    inside += measured >= range.low && measured <= range.high ? 1 : 0;
  }
  if (banded > 0)
    out << "finite-width band: " << inside << " of " << banded
        << " probes' var inside its 95% range (one network: expect about 95%, the probes of one network move "
           "together)\n";
}

}  // namespace

void theory_command(const TheoryOptions& options, std::ostream& out) {
  const Study study = load_study(options.study_path, options.overrides);
  if (study.has_sweep)
    throw UserError(options.study_path + ": this study has a [sweep] table; run it with `proplab sweep " +
                    options.study_path + "` (or remove [sweep] to run a single point)");
  const theory::ProbePrediction prediction = predict_for_run(to_run_spec(study));

  std::ostringstream report;
  line(report, "study", options.study_path + " (" + study.name + ")");
  line(report, "model", model_text(study));
  line(report, "scaling", study.scaling.rule);
  if (study.model.kind() == ModelKind::transformer)
    line(report, "input corr",
         study.theory.input_corr ? format_number("%.6g", *study.theory.input_corr) + " (theory.input_corr)"
                                 : "measured on the first training batch");
  line(report, "formulae", prediction.formulae);
  write_predictions(report, prediction);
  if (prediction.mean_field) write_mean_field(report, *prediction.mean_field);
  if (!options.compare.empty()) write_comparison(report, options.compare, prediction);
  out << report.str();
}

}  // namespace proplab
