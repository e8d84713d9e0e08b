// io/run_reader: reads a run file written by RunWriter (io/run_file.h), finished or still being written.
//
// Invariants:
// - Opens read-only. RunOpenMode::automatic tries a plain open first and falls back to SWMR-read when that
//   fails (a writer has the file open, or a killed writer left it marked open for write).
// - Only proplab run files are accepted: the root attribute format must be "proplab-run" and format_version
//   one this build reads (run_format_version); anything else is a UserError saying which.
// - In SWMR mode every dataset read refreshes the dataset first (H5Drefresh), so each read sees what the
//   writer has flushed up to then. read_train()/read_eval() cut the columns to their common length.
// - A RunReader is used from one thread at a time.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "io/run_file.h"

namespace proplab {

enum class RunOpenMode { automatic, normal, swmr };

// A float64 [rows, columns] dataset, row-major.
struct Dataset2D {
  std::int64_t rows = 0;
  std::int64_t columns = 0;
  std::vector<double> values;
  double at(std::int64_t row, std::int64_t column) const { return values[row * columns + column]; }
};

struct TrainCurves {
  std::vector<std::int64_t> step;
  std::vector<double> loss, lr, grad_norm, tokens_per_s, wall_time;
  std::size_t size() const { return step.size(); }
};

struct EvalCurves {
  std::vector<std::int64_t> step;
  std::vector<double> loss;
  std::size_t size() const { return step.size(); }
};

// One block of a model whose blocks form stages (/blocks, docs/run-format.md): its stage (0-based) and whether it is
// a transition (the block that opens a stage ≥ 1 by changing the resolution).
struct RunBlock {
  std::int64_t stage = 0;
  bool transition = false;
};

class RunReader {
 public:
  // UserError when the file is missing, not HDF5, not a proplab run file or of an unsupported version.
  static RunReader open(const std::filesystem::path& path, RunOpenMode mode = RunOpenMode::automatic);

  RunReader(RunReader&& other) noexcept;
  RunReader& operator=(RunReader&& other) noexcept;
  RunReader(const RunReader&) = delete;
  RunReader& operator=(const RunReader&) = delete;
  ~RunReader();

  const std::filesystem::path& path() const;
  // True when opened in SWMR-read mode.
  bool swmr() const;

  // Root attributes. UserError naming the attribute when it is missing or of another type.
  std::string attribute_string(const std::string& name) const;
  std::int64_t attribute_int(const std::string& name) const;
  bool has_attribute(const std::string& name) const;
  std::vector<std::string> attribute_names() const;
  // A string attribute of the group or dataset at `object_path`.
  std::string attribute_string(const std::string& object_path, const std::string& name) const;
  RunStatus status() const;

  // Objects: `path` is absolute ("/train/loss").
  bool exists(const std::string& path) const;
  // Names of the members of a group, sorted.
  std::vector<std::string> list(const std::string& group_path) const;
  std::vector<std::int64_t> dataset_shape(const std::string& path) const;

  // Whole datasets. UserError when missing or of the wrong rank or kind (read_ints needs an integer dataset;
  // read_doubles accepts integers and floats).
  std::vector<double> read_doubles(const std::string& path) const;
  std::vector<std::int64_t> read_ints(const std::string& path) const;
  Dataset2D read_2d(const std::string& path) const;
  std::vector<std::string> read_strings(const std::string& path) const;

  TrainCurves read_train() const;
  EvalCurves read_eval() const;
  // The stage layout, one entry per block (index = /probes/block); empty when the file has no /blocks (models
  // without stages, files written before it existed). UserError when /blocks/stage or /blocks/transition is
  // missing, their lengths differ, a stage is negative or smaller than the one before, or a transition is not 0/1.
  std::vector<RunBlock> read_block_layout() const;

 private:
  struct Impl;
  explicit RunReader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace proplab
