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
//   buffered per series on the calling thread and handed over to be written (a hand-off) when a series has
//   flush_every rows buffered or flush_interval_s has passed since the last hand-off (both checked at each append,
//   on the calling thread), on flush() / flush_and_wait() and on finish(). A hand-off is written as one: its series
//   extended and written one after another, then H5Fflush, so a reader sees whole hand-offs (whole records, when
//   the caller flushes after each). A concurrent reader may see the columns of /train at different lengths for a
//   moment (they are extended one after another): use the shortest.
// - Threads. Before start() every HDF5 call runs on the calling thread, hand-offs included. start() starts the
//   writer thread this RunWriter owns (unless RunWriterOptions::write_on_thread is false): from then on it makes
//   every HDF5 call for the file, writing the hand-offs in order, each at once (no batching across hand-offs, so a
//   SWMR reader sees a flushed record shortly after flush()). An append or flush() on the calling thread only copies
//   rows (flush() does not wait for the write; flush_and_wait() does). finish(), abandon() and the destructor first
//   let the writer thread write what was handed over and join it, then close the file and write the status on the
//   calling thread. No HDF5 call of this file overlaps another HDF5 call of the process: both threads make them
//   under the process-wide HDF5 lock (io/hdf5_util.h), the writer thread for one hand-off at a time, and the
//   calling thread never waits for the writer thread while holding it.
// - Back-pressure: the hand-offs not yet written hold at most max(queue_bytes, one hand-off) bytes of rows
//   (queued_bytes()); a hand-off that does not fit waits until the writer thread has made room.
// - The writer thread blocks asynchronous signals: SIGINT/SIGTERM handlers run on the other threads as before, and
//   a handler that only sets a flag lets the run end through finish(), which drains and joins the thread.
// - A RunWriter is used from one thread at a time (besides its own writer thread); a moved-from RunWriter may only
//   be destroyed or assigned to.
// - finish() writes the remaining rows, closes, reopens the file normally (not SWMR) and writes status,
//   status_detail and end_time. A writer destroyed without finish() records status "failed" (through abandon()
//   when finishing fails). A process killed while writing leaves status "running" and the file marked open for
//   write (RunReader falls back to SWMR-read); what was handed over but not yet written is lost with it.
// - A write the operating system refuses (no space, quota, read-only file system) is an IoError (core/error.h).
//   On the calling thread it is thrown at once; on the writer thread it is kept, the writer thread writes nothing
//   more (the hand-offs queued behind it are dropped) and the next append, flush, flush_and_wait or finish
//   rethrows it, as does every one after (failed_write_last_train_step() says which rows it was writing). What was
//   flushed before it stays readable (flushed()), and abandon() closes the file as well as it still can.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
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
  std::int64_t flush_every = 64;  // rows buffered per series before a hand-off
  double flush_interval_s = 1.0;  // or this much time since the last hand-off (checked at appends)
  // Bytes of rows handed over but not yet written, at most (beyond one hand-off): a hand-off waits for room.
  std::size_t queue_bytes = std::size_t{64} << 20;
  // After start(): false writes every hand-off on the calling thread, as before start().
  bool write_on_thread = true;
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

  // Switches the file to SWMR writing and starts the writer thread; from here on only appends, flushes and finish().
  void start();
  bool started() const;

  // --- Appends (before or after start(), until finish()).
  void append_train(const TrainRow& row);
  void append_eval(const EvalRow& row);
  // `values` holds the series' `columns` doubles.
  void append_row(SeriesId series, const double* values);
  void append_row(const std::string& path, const double* values);
  void append_int(SeriesId series, std::int64_t value);

  // Hands every buffered row over to be written and flushed, so SWMR readers see it; after start() it does not wait
  // for the write (only for room in the queue).
  void flush();
  // flush(), then waits until everything handed over is written and flushed (rethrowing a failed write).
  void flush_and_wait();
  // Writes what is buffered and handed over, closes, reopens normally and records status, detail (truncated to fit)
  // and end_time. `status` must not be running.
  void finish(RunStatus status, const std::string& detail);
  bool finished() const;
  // After a write failed (IoError from an append, flush or finish): lets the writer thread write what was handed
  // over (nothing after its own write failed), drops the rows still buffered, closes the file and records status
  // and detail when the file system still lets it. Returns false when the status could
  // not be written (the file then says running, and `proplab recover` marks it once the disk takes writes again).
  // Callable once, also after a finish() that threw. Never throws.
  bool abandon(RunStatus status, const std::string& detail) noexcept;

  // What a reader is sure to find of a series: the rows of the last hand-off written and flushed (not those buffered,
  // queued or lost to a failed write) and, for an int64 series, the last of them (-1 when none).
  struct FlushedExtent {
    std::int64_t rows = 0;
    std::int64_t last_int = -1;
  };
  FlushedExtent flushed(const std::string& series_path) const;

  const std::filesystem::path& path() const;
  // Rows appended so far (buffered or written).
  std::int64_t train_rows() const;
  std::int64_t eval_rows() const;
  // Bytes of rows handed over to the writer thread and not yet written.
  std::size_t queued_bytes() const;
  // When a write on the writer thread failed: the /train/step of the last training row appended before the call
  // that handed the refused rows over (-1: none), so that a caller can tell which of its steps the failure belongs
  // to. Empty when no write on the writer thread failed.
  std::optional<std::int64_t> failed_write_last_train_step() const;

 private:
  struct Impl;
  explicit RunWriter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace proplab
