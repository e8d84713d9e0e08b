// gui/data/synthetic_run: writes run files with made-up but well-defined statistics, through the real RunWriter,
// for the GUI's tests, its frame-time benchmark and demos. Real runs come from `proplab run`; these exist so that
// a test can choose every value (and know which pixel colour or number to expect) and so that a benchmark can
// write 200 runs of 400 probes in seconds.
//
// Layout of a synthetic transformer run with L layers (docs/run-format.md): probes embed.out (embed), then per
// block l: blocks.l.attn.out (branch), blocks.l.mid (residual), blocks.l.ffn.out (branch), blocks.l.out
// (residual), then head.logits (logits): P = 4·L + 2. Values:
//   forward <stat> at probe p, record r = forward_scale · (1 + depth_slope · p) · (1 + 0.1 · r)
//   backward <stat>                     = backward_scale · (1 + depth_slope · (P - 1 - p)) · (1 + 0.05 · r)
//   theory forward var / backward var   = theory_constant when set, else the record-0 values
// Record r is taken at step r · steps_per_record; one train row per step.
#pragma once

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "io/run_file.h"

namespace proplab::gui {

struct SyntheticRunSpec {
  std::string name = "synthetic";
  std::string rule = "standard";  // scaling.rule in the config
  std::string norm = "pre";       // model.norm in the config
  std::int64_t layers = 4;
  std::int64_t records = 5;
  std::int64_t steps_per_record = 10;
  std::vector<std::string> forward_stats = {"var", "rms"};
  std::vector<std::string> backward_stats = {"var"};
  double forward_scale = 1.0;
  double backward_scale = 1.0;
  double depth_slope = 0.5;
  double theory_constant = std::nan("");  // NaN: the record-0 values
  bool write_through = true;              // every append handed to the writer thread at once, which writes and flushes
                                          // it promptly (readers see each record); false: RunWriter's default
                                          // buffering (much faster for big files)
  RunStatus status = RunStatus::completed;
  std::string status_detail;
  bool compression = false;  // also /compression's totals at every record (synthetic_compression_error)
};

// The statistic the spec defines, for checks.
std::int64_t synthetic_probe_count(const SyntheticRunSpec& spec);
double synthetic_forward_value(const SyntheticRunSpec& spec, std::int64_t probe, std::int64_t record);
double synthetic_backward_value(const SyntheticRunSpec& spec, std::int64_t probe, std::int64_t record);
// /compression/error_total at a record (residual_total is the record's index).
double synthetic_compression_error(std::int64_t record);
// The resolved-config TOML the run file carries.
std::string synthetic_config(const SyntheticRunSpec& spec);

// Writes a run file step by step, so that a test can let a reader follow it while it grows.
class SyntheticRunWriter {
 public:
  // Creates the file (overwriting), its layout and theory, and starts SWMR writing.
  SyntheticRunWriter(const std::filesystem::path& path, SyntheticRunSpec spec);
  ~SyntheticRunWriter();
  SyntheticRunWriter(const SyntheticRunWriter&) = delete;
  SyntheticRunWriter& operator=(const SyntheticRunWriter&) = delete;

  // Appends the training rows up to the next record's step and that record; false when all records are written.
  bool append_record();
  std::int64_t records_written() const { return records_written_; }
  // Makes everything appended so far visible to SWMR readers (returns once it is written and flushed).
  void flush();
  // Writes the spec's status (must not be running).
  void finish();

 private:
  SyntheticRunSpec spec_;
  std::unique_ptr<RunWriter> writer_;
  SeriesId steps_series_, compression_steps_, compression_error_, compression_residual_;
  std::int64_t records_written_ = 0;
};

// Writes a whole run and finishes it with the spec's status (which must not be running: a running run is one whose
// writer is still open, see SyntheticRunWriter).
void write_synthetic_run(const std::filesystem::path& path, const SyntheticRunSpec& spec);

}  // namespace proplab::gui
