// gui/data/run_data: what the GUI knows about one run file, read at once into an immutable snapshot.
//
// Invariants:
// - load_run_snapshot never throws for a bad file: a missing, truncated or non-proplab file, or one of an
//   unsupported format_version, gives a snapshot whose `error` says what is wrong; every other field is then
//   empty. The GUI shows the message and keeps working with the other runs.
// - Statistics are cut to one common record count: records() = the shortest of /steps and every statistics
//   series (a reader running beside the writer may briefly see them at different lengths). Every matrix in
//   `forward`, `backward` and `params` has exactly records() rows; forward/backward have one column per probe.
// - Theory vectors have one entry per probe (NaN: no prediction); a theory vector of another length is dropped.
// - `blocks` is empty or has an entry for every probe's block (ProbeInfo::block < blocks.size()).
// - `config` is the resolved study TOML flattened to dotted keys ("model.layers" -> "48", strings unquoted).
// - Snapshots are shared read-only between the loader's worker thread and the UI (std::shared_ptr<const>).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/run_file.h"
#include "io/run_reader.h"

namespace proplab::gui {

enum class Direction { forward, backward };
const char* direction_name(Direction direction);

struct ProbeInfo {
  std::string name;  // e.g. "blocks.3.out"
  std::int64_t depth = 0;
  std::int64_t block = -1;  // -1 outside blocks
  std::string kind;         // residual, branch, norm, preact, postact, logits, embed
};

struct RunSnapshot {
  std::filesystem::path path;
  std::string name;   // the study's name, else the file stem
  std::string error;  // non-empty: the file could not be read (and nothing else is filled in)

  std::optional<RunStatus> status;
  std::string status_detail, config_text, start_time, end_time, host, device, layout, proplab_version;
  std::int64_t threads = 0;
  bool swmr = false;  // read in SWMR mode: its writer is still going (or was killed)
  std::map<std::string, std::string> config;

  TrainCurves train;
  EvalCurves eval;
  std::vector<std::int64_t> record_steps;
  std::vector<ProbeInfo> probes;
  // The stage layout of a model whose blocks form stages (ResNets: /blocks), one entry per block; empty for other
  // models, older files, and a layout that is malformed or does not cover every probe's block (then the run is
  // shown by probe depth).
  std::vector<RunBlock> blocks;
  std::map<std::string, Dataset2D> forward, backward;                          // [records, probes]
  std::map<std::string, std::vector<double>> theory_forward, theory_backward;  // [probes]
  std::vector<std::string> param_names;
  std::map<std::string, Dataset2D> params;  // [records, params]
  // Compressed communication (/compression, docs/run-format.md): the recorded steps and the total relative error
  // and residual norm of the gradient exchange at each; empty when the run did not compress.
  std::vector<std::int64_t> compression_steps;
  std::vector<double> compression_error, compression_residual;

  // What the file looked like when it was read (the loader re-reads it when these change).
  std::filesystem::file_time_type modified{};
  std::uintmax_t file_size = 0;

  bool ok() const { return error.empty(); }
  std::size_t records() const { return record_steps.size(); }
  // "running" | "completed" | "diverged" | "failed" | "unreadable".
  std::string status_text() const;
  const std::map<std::string, Dataset2D>& stats(Direction direction) const;
  // nullptr when the statistic is not recorded.
  const Dataset2D* stat(Direction direction, const std::string& name) const;
  // nullptr when there is no prediction for it.
  const std::vector<double>* theory(Direction direction, const std::string& name) const;
  // Last training loss; NaN without training rows.
  double final_loss() const;
  // Value of a flattened config key; empty when unset.
  std::string config_value(const std::string& key) const;
};

// Reads `path` (plain open, or SWMR-read while it is being written). Never throws: see `error`.
std::shared_ptr<const RunSnapshot> load_run_snapshot(const std::filesystem::path& path);

// The resolved study TOML flattened to dotted keys; UserError when it is not TOML.
std::map<std::string, std::string> flatten_config(const std::string& toml_text);

// The probes of `kind` (all probes when kind is empty), as indices in forward order.
std::vector<std::size_t> probes_of_kind(const std::vector<ProbeInfo>& probes, const std::string& kind);
// Distinct probe kinds in order of first appearance.
std::vector<std::string> probe_kinds(const std::vector<ProbeInfo>& probes);
// The default probes of the dynamics view: the residual stream leaving the first, middle and last block (the
// last probe of that block when it has no residual probe); the first, middle and last probe without blocks.
std::vector<std::size_t> default_dynamics_probes(const std::vector<ProbeInfo>& probes);

}  // namespace proplab::gui
