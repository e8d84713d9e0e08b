// io/run_file: writes one training run's HDF5 file (DIR/<name>.h5), readable while it is being written.
//
// Layout (docs/run-format.md is the full reference):
//   /            attributes: format = "proplab-run", format_version = 1, proplab_version, config, status,
//                status_detail, start_time, end_time, host, device, threads, layout
//   /train/      step (int64), loss, lr, grad_norm, tokens_per_s, wall_time (float64): one entry per step
//   /eval/       step (int64), loss (float64): one entry per evaluation
//   /probes /params /forward /backward /theory: groups the recording module fills with series
//   /blocks      the stage layout of ResNets (stage, transition per block), written by the recording module
//
// Invariants:
// - All strings (attributes and string datasets) are fixed-length, NUL-padded UTF-8. status, status_detail
//   and end_time are created at their maximum sizes (run_status_size, run_status_detail_size, run_time_size)
//   so finish() can overwrite them in place.
// - The file is created with libver bounds "latest" (needed for SWMR). Every group, dataset and attribute is
//   created between create() and start(); start() switches to SWMR writing, after which the writer only
//   appends to series and overwrites; a concurrent SWMR reader sees everything flushed so far.
// - Series are chunked, extendible along dimension 0 (H5S_UNLIMITED), shuffle+deflate compressed. Rows are
//   buffered in memory and written when a series has flush_every rows buffered or flush_interval_s has passed
//   since the last write (checked at each append), on flush() and on finish(). A concurrent reader may see the
//   columns of /train at different lengths for a moment (they are extended one after another): use the
//   shortest.
// - A RunWriter is used from one thread at a time; a moved-from RunWriter may only be destroyed or assigned to.
// - finish() flushes, closes, reopens the file normally (not SWMR) and writes status, status_detail and
//   end_time. A writer destroyed without finish() records status "failed". A process killed while writing
//   leaves status "running" and the file marked open for write (RunReader falls back to SWMR-read).
// - A write the operating system refuses (no space, quota, read-only file system) is an IoError (core/error.h);
//   what was flushed before it stays readable (flushed()), and abandon() closes the file as well as it still can.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace proplab {

inline constexpr const char* run_format_name = "proplab-run";
inline constexpr std::int64_t run_format_version = 1;
// Fixed sizes (bytes) of the attributes finish() rewrites.
inline constexpr std::size_t run_status_size = 32;
inline constexpr std::size_t run_status_detail_size = 1024;
inline constexpr std::size_t run_time_size = 32;

enum class RunStatus { running, completed, diverged, failed };
// The status_detail of a run that an I/O failure stopped (status failed) begins with this.
inline constexpr const char* io_failure_detail_prefix = "I/O failure";
const char* run_status_name(RunStatus status);
// Parses "running" | "completed" | "diverged" | "failed"; UserError naming the valid values otherwise.
RunStatus parse_run_status(const std::string& text);

// What the root attributes record about a run. Empty host/start_time are filled in by create().
struct RunHeader {
  std::string proplab_version;     // required
  std::string config;              // the resolved study TOML text
  std::string host;                // empty: this machine's host name
  std::string device;              // e.g. "cpu" or "cuda:0 NVIDIA H200"
  int threads = 0;                 // CPU threads used
  std::string layout;              // parallel layout, e.g. "dp=1 tp=1 pp=1"
  std::string precision = "fp32";  // inputs of the matrix products: "fp32" or "bf16"
  std::string kernels;             // the CPU kernels that ran, e.g. "sgemm: oneDNN 2.6.3; conv: direct (AVX-512)";
                                   // empty: not written
  std::string start_time;          // ISO 8601 UTC; empty: now
};

// One optimizer step. Units: lr per step, wall_time seconds since the run started, tokens_per_s tokens/second.
struct TrainRow {
  std::int64_t step = 0;
  double loss = 0.0;
  double lr = 0.0;
  double grad_norm = 0.0;
  double tokens_per_s = 0.0;
  double wall_time = 0.0;
};

struct EvalRow {
  std::int64_t step = 0;
  double loss = 0.0;
};

struct RunWriterOptions {
  std::int64_t flush_every = 64;  // rows buffered per series before a write
  double flush_interval_s = 1.0;  // or this much time since the last write (checked at appends)
};

// Identifies a series created by create_series_2d / create_series_1d_int (index into the writer's table).
struct SeriesId {
  std::size_t index = static_cast<std::size_t>(-1);
};

// Current UTC time as "YYYY-MM-DDTHH:MM:SSZ".
std::string iso8601_utc_now();
// This machine's host name (gethostname), or "unknown".
std::string this_host_name();
// DIR/<name>.h5
std::filesystem::path run_file_path(const std::filesystem::path& directory, const std::string& name);

class RunWriter {
 public:
  // Creates the file (and missing parent directories) with its root attributes, /train, /eval and the
  // statistics groups. Refuses an existing file unless `overwrite` (UserError naming the path and --force).
  // Everything is validated before anything is created; a failure while creating removes the file.
  static RunWriter create(const std::filesystem::path& path, const RunHeader& header, bool overwrite,
                          RunWriterOptions options = {});

  RunWriter(RunWriter&& other) noexcept;
  RunWriter& operator=(RunWriter&& other) noexcept;
  RunWriter(const RunWriter&) = delete;
  RunWriter& operator=(const RunWriter&) = delete;
  // Without finish(): best-effort finish(failed, ...). Never throws.
  ~RunWriter();

  // --- Layout: only before start(). Paths are absolute ("/forward/act_mean"); missing groups are created.
  // A float64 [n_records, columns] series, columns >= 1.
  SeriesId create_series_2d(const std::string& path, std::int64_t columns);
  // An int64 [n_records] series (e.g. the step of each record).
  SeriesId create_series_1d_int(const std::string& path);
  // Fixed 1-D datasets written at once (labels, site names, layer indices).
  void write_strings(const std::string& path, const std::vector<std::string>& values);
  void write_ints(const std::string& path, const std::vector<std::int64_t>& values);
  void write_doubles(const std::string& path, const std::vector<double>& values);
  // A string attribute on an existing group or dataset (e.g. a series' unit or description).
  void write_attribute(const std::string& object_path, const std::string& name, const std::string& value);

  // Switches the file to SWMR writing; from here on only appends, flush() and finish().
  void start();
  bool started() const;

  // --- Appends (before or after start(), until finish()).
  void append_train(const TrainRow& row);
  void append_eval(const EvalRow& row);
  // `values` holds the series' `columns` doubles.
  void append_row(SeriesId series, const double* values);
  void append_row(const std::string& path, const double* values);
  void append_int(SeriesId series, std::int64_t value);

  // Writes every buffered row and flushes the file so SWMR readers see it.
  void flush();
  // Flushes, closes, reopens normally and records status, detail (truncated to fit) and end_time.
  // `status` must not be running.
  void finish(RunStatus status, const std::string& detail);
  bool finished() const;
  // After a write failed (IoError from an append, flush or finish): drops the rows not yet written, closes the
  // file and records status and detail when the file system still lets it. Returns false when the status could
  // not be written (the file then says running, and `proplab recover` marks it once the disk takes writes again).
  // Callable once, also after a finish() that threw. Never throws.
  bool abandon(RunStatus status, const std::string& detail) noexcept;

  // What a reader is sure to find of a series: the rows of the last successful flush (not those buffered or lost
  // to a failed write) and, for an int64 series, the last of them (-1 when none).
  struct FlushedExtent {
    std::int64_t rows = 0;
    std::int64_t last_int = -1;
  };
  FlushedExtent flushed(const std::string& series_path) const;

  const std::filesystem::path& path() const;
  // Rows appended so far (buffered or written).
  std::int64_t train_rows() const;
  std::int64_t eval_rows() const;

 private:
  struct Impl;
  explicit RunWriter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace proplab
