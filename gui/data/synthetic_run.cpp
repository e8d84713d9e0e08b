#include "gui/data/synthetic_run.h"

#include <sstream>

#include "core/error.h"

namespace proplab::gui {

namespace {

struct SyntheticProbe {
  std::string name;
  std::int64_t block;
  std::string kind;
};

std::vector<SyntheticProbe> synthetic_probes(const SyntheticRunSpec& spec) {
  std::vector<SyntheticProbe> probes;
  probes.push_back({"embed.out", -1, "embed"});
  for (std::int64_t l = 0; l < spec.layers; ++l) {
    const std::string block = "blocks." + std::to_string(l);
    probes.push_back({block + ".attn.out", l, "branch"});
    probes.push_back({block + ".mid", l, "residual"});
    probes.push_back({block + ".ffn.out", l, "branch"});
    probes.push_back({block + ".out", l, "residual"});
  }
  probes.push_back({"head.logits", -1, "logits"});
  return probes;
}

double synthetic_loss(std::int64_t step) { return 1.0 + 4.0 * std::exp(-static_cast<double>(step) / 50.0); }

}  // namespace

std::int64_t synthetic_probe_count(const SyntheticRunSpec& spec) { return 4 * spec.layers + 2; }

double synthetic_forward_value(const SyntheticRunSpec& spec, std::int64_t probe, std::int64_t record) {
  return spec.forward_scale * (1.0 + spec.depth_slope * static_cast<double>(probe)) *
         (1.0 + 0.1 * static_cast<double>(record));
}

double synthetic_backward_value(const SyntheticRunSpec& spec, std::int64_t probe, std::int64_t record) {
  const double from_end = static_cast<double>(synthetic_probe_count(spec) - 1 - probe);
  return spec.backward_scale * (1.0 + spec.depth_slope * from_end) * (1.0 + 0.05 * static_cast<double>(record));
}

std::string synthetic_config(const SyntheticRunSpec& spec) {
  std::ostringstream config;
  config << "name = \"" << spec.name << "\"\nseed = 1\n\n[model]\ntype = \"transformer\"\nlayers = " << spec.layers
         << "\nwidth = 64\nheads = 4\nnorm = \"" << spec.norm << "\"\n\n[scaling]\nrule = \"" << spec.rule
         << "\"\n\n[train]\nsteps = " << std::max<std::int64_t>(1, (spec.records - 1) * spec.steps_per_record + 1)
         << "\nlr = 0.001\n\n[record]\nevery = " << spec.steps_per_record << "\n";
  return config.str();
}

SyntheticRunWriter::SyntheticRunWriter(const std::filesystem::path& path, SyntheticRunSpec spec)
    : spec_(std::move(spec)) {
  RunHeader header;
  header.proplab_version = "synthetic";
  header.config = synthetic_config(spec_);
  header.device = "cpu";
  header.threads = 1;
  header.layout = "dp=1 tp=1 pp=1";
  writer_ = std::make_unique<RunWriter>(
      RunWriter::create(path, header, true, spec_.write_through ? RunWriterOptions{1, 0.0} : RunWriterOptions{}));
  const auto probes = synthetic_probes(spec_);
  std::vector<std::string> names, kinds;
  std::vector<std::int64_t> depths, blocks;
  for (std::size_t p = 0; p < probes.size(); ++p) {
    names.push_back(probes[p].name);
    kinds.push_back(probes[p].kind);
    blocks.push_back(probes[p].block);
    depths.push_back(static_cast<std::int64_t>(p));
  }
  writer_->write_strings("/probes/name", names);
  writer_->write_ints("/probes/depth", depths);
  writer_->write_ints("/probes/block", blocks);
  writer_->write_strings("/probes/kind", kinds);
  steps_series_ = writer_->create_series_1d_int("/steps");
  const auto columns = static_cast<std::int64_t>(probes.size());
  for (const auto& stat : spec_.forward_stats) writer_->create_series_2d("/forward/" + stat, columns);
  for (const auto& stat : spec_.backward_stats) writer_->create_series_2d("/backward/" + stat, columns);
  std::vector<double> theory_forward(probes.size()), theory_backward(probes.size());
  for (std::int64_t p = 0; p < columns; ++p) {
    const bool constant = !std::isnan(spec_.theory_constant);
    theory_forward[p] = constant ? spec_.theory_constant : synthetic_forward_value(spec_, p, 0);
    theory_backward[p] = constant ? spec_.theory_constant : synthetic_backward_value(spec_, p, 0);
  }
  if (spec_.compression) {
    compression_steps_ = writer_->create_series_1d_int("/compression/steps");
    compression_error_ = writer_->create_series_2d("/compression/error_total", 1);
    compression_residual_ = writer_->create_series_2d("/compression/residual_total", 1);
  }
  writer_->write_doubles("/theory/forward/var", theory_forward);
  writer_->write_doubles("/theory/backward/var", theory_backward);
  writer_->start();
}

SyntheticRunWriter::~SyntheticRunWriter() = default;

bool SyntheticRunWriter::append_record() {
  if (records_written_ >= spec_.records) return false;
  const std::int64_t step = records_written_ * spec_.steps_per_record;
  const std::int64_t first_step = records_written_ == 0 ? 0 : step - spec_.steps_per_record + 1;
  for (std::int64_t s = first_step; s <= step; ++s) {
    writer_->append_train(TrainRow{s, synthetic_loss(s), 1e-3, 1.0 / (1.0 + 0.01 * static_cast<double>(s)), 1000.0,
                                   0.01 * static_cast<double>(s)});
  }
  writer_->append_int(steps_series_, step);
  const std::int64_t columns = synthetic_probe_count(spec_);
  std::vector<double> row(static_cast<std::size_t>(columns));
  for (const auto& stat : spec_.forward_stats) {
    for (std::int64_t p = 0; p < columns; ++p) row[p] = synthetic_forward_value(spec_, p, records_written_);
    writer_->append_row("/forward/" + stat, row.data());
  }
  for (const auto& stat : spec_.backward_stats) {
    for (std::int64_t p = 0; p < columns; ++p) row[p] = synthetic_backward_value(spec_, p, records_written_);
    writer_->append_row("/backward/" + stat, row.data());
  }
  if (spec_.compression) {
    const double error = synthetic_compression_error(records_written_);
    const auto residual = static_cast<double>(records_written_);
    writer_->append_int(compression_steps_, step);
    writer_->append_row(compression_error_, &error);
    writer_->append_row(compression_residual_, &residual);
  }
  ++records_written_;
  return true;
}

double synthetic_compression_error(std::int64_t record) { return 0.5 / (1.0 + static_cast<double>(record)); }

void SyntheticRunWriter::flush() { writer_->flush_and_wait(); }

void SyntheticRunWriter::finish() {
  PROPLAB_CHECK(spec_.status != RunStatus::running, "a synthetic run is finished with a final status");
  writer_->finish(spec_.status, spec_.status_detail);
}

void write_synthetic_run(const std::filesystem::path& path, const SyntheticRunSpec& spec) {
  SyntheticRunWriter writer(path, spec);
  while (writer.append_record()) {
  }
  writer.finish();
}

}  // namespace proplab::gui
