#include "io/run_file.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <ctime>
#include <deque>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <unordered_map>

#include "core/error.h"
#include "io/hdf5_util.h"

namespace proplab {

using io_detail::ErrorKind;
using io_detail::h5_check;
using io_detail::H5Guard;
using io_detail::H5Handle;

const char* run_status_name(RunStatus status) {
  switch (status) {
    case RunStatus::running:
      return "running";
    case RunStatus::completed:
      return "completed";
    case RunStatus::diverged:
      return "diverged";
    case RunStatus::failed:
      return "failed";
  }
  return "unknown";
}

RunStatus parse_run_status(const std::string& text) {
  for (RunStatus status : {RunStatus::running, RunStatus::completed, RunStatus::diverged, RunStatus::failed}) {
    if (text == run_status_name(status)) return status;
  }
  throw UserError(detail::concat("unknown run status '", text, "' (valid: running, completed, diverged, failed)"));
}

std::string iso8601_utc_now() {
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm utc{};
  gmtime_r(&now, &utc);
  std::array<char, 32> text{};
  const std::size_t length = std::strftime(text.data(), text.size(), "%Y-%m-%dT%H:%M:%SZ", &utc);
  PROPLAB_CHECK(length > 0, "strftime fits an ISO 8601 time in 32 bytes");
  return std::string(text.data(), length);
}

std::string this_host_name() {
  std::array<char, 256> name{};
  if (gethostname(name.data(), name.size() - 1) != 0 || name[0] == '\0') return "unknown";
  return std::string(name.data());
}

std::filesystem::path run_file_path(const std::filesystem::path& directory, const std::string& name) {
  return directory / (name + ".h5");
}

namespace {

constexpr const char* train_columns[] = {"step", "loss", "lr", "grad_norm", "tokens_per_s", "wall_time"};
constexpr const char* eval_columns[] = {"step", "loss"};
constexpr const char* statistics_groups[] = {"/probes", "/params", "/forward", "/backward", "/theory"};
constexpr int deflate_level = 1;  // fast: every record is flushed, so chunks are compressed often
// Statistics series are flushed after every record, and a flush re-compresses the chunk being filled: small 2-D
// chunks keep that cost per record small (measured: 64 KiB chunks cost ~8 ms per record of the reference model,
// over 5% of its step).
constexpr hsize_t chunk_bytes_2d = 4 * 1024;
constexpr hsize_t chunk_rows_1d = 1024;

// Cuts `text` to at most `size` bytes, ending in "..." when cut, without splitting a UTF-8 sequence.
std::string fit_to(const std::string& text, std::size_t size) {
  if (text.size() <= size) return text;
  std::size_t length = size - 3;
  while (length > 0 && (static_cast<unsigned char>(text[length]) & 0xC0) == 0x80) --length;
  return text.substr(0, length) + "...";
}

// One extendible dataset: int64 [n] or float64 [n] / [n, columns]. The rows being buffered belong to the calling
// thread; the dataset and what was written of it to the thread that writes (the writer thread from start() until it
// is joined); the flushed extent is shared, under RunWriter::Impl::state_mutex.
struct Series {
  std::string path;
  H5Handle dataset;
  int rank = 1;
  std::int64_t columns = 1;
  bool is_int = false;
  std::vector<double> pending_doubles;  // row-major, `columns` per row
  std::vector<std::int64_t> pending_ints;
  std::int64_t rows_written = 0;
  std::int64_t last_int_written = -1;
  std::int64_t rows_flushed = 0;  // as of the last successful H5Fflush
  std::int64_t last_int_flushed = -1;

  std::int64_t pending_rows() const {
    return is_int ? static_cast<std::int64_t>(pending_ints.size())
                  : static_cast<std::int64_t>(pending_doubles.size()) / columns;
  }
};

// The rows of one series in a hand-off.
struct SeriesRows {
  std::size_t series = 0;
  std::vector<double> doubles;  // row-major (a float64 series)
  std::vector<std::int64_t> ints;
};

// What one hand-off gives the writer thread: the buffered rows of every series that had some, in series order,
// written and flushed as one.
struct HandOff {
  std::vector<SeriesRows> rows;
  std::size_t bytes = 0;
  std::int64_t last_train_step = -1;  // of the last training row appended before the call that handed it over
};

}  // namespace

struct RunWriter::Impl {
  std::filesystem::path path;
  std::string file_name;  // path as a string, for messages
  RunWriterOptions options;
  H5Handle file;
  H5Handle link_properties;  // creates intermediate groups
  std::vector<Series> series;
  std::unordered_map<std::string, std::size_t> series_by_path;
  std::size_t train_first = 0;  // index of /train/step; the other train columns follow in train_columns order
  std::size_t eval_first = 0;
  std::int64_t train_rows = 0;
  std::int64_t eval_rows = 0;
  std::int64_t last_train_step = -1;  // /train/step of the last training row appended
  std::int64_t most_pending = 0;      // largest pending_rows() over all series since the last hand-off
  std::chrono::steady_clock::time_point last_hand_off = std::chrono::steady_clock::now();
  bool started = false;
  bool finished = false;
  bool abandoned = false;

  // Shared by the calling thread and the writer thread, under state_mutex (never held while waiting for HDF5).
  mutable std::mutex state_mutex;
  std::condition_variable hand_off_queued;  // the writer thread waits: a hand-off queued, or stop_requested
  std::condition_variable hand_off_done;    // the calling thread waits: room in the queue, all written, a failure
  std::deque<HandOff> queue;
  std::size_t queued_bytes = 0;  // of the hand-offs queued or being written
  bool writing = false;
  bool stop_requested = false;
  std::exception_ptr failure;  // the writer thread's failed write, rethrown on the calling thread
  std::int64_t failure_last_train_step = -1;
  std::thread writer_thread;

  Impl() = default;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  // The writer thread writes what is queued and ends before the handles it uses close.
  ~Impl() { stop_writer_thread(); }

  void require_layout_phase(const char* what) const {
    PROPLAB_CHECK(!finished, what, " on run file '", file_name, "' after finish()");
    PROPLAB_CHECK(!started, what, " on run file '", file_name, "' after start(): in SWMR mode only appends are ",
                  "possible, so create every dataset and attribute before start()");
  }

  void require_open(const char* what) const {
    PROPLAB_CHECK(!finished, what, " on run file '", file_name, "' after finish()");
  }

  void require_new_path(const std::string& path_in_file) const {
    PROPLAB_CHECK(!path_in_file.empty() && path_in_file[0] == '/' && path_in_file.back() != '/', "dataset path '",
                  path_in_file, "' is absolute and names an object");
    PROPLAB_CHECK(!io_detail::h5_path_exists(file.get(), path_in_file, file_name), "dataset '", path_in_file,
                  "' does not exist yet in '", file_name, "'");
  }

  std::size_t add_series(const std::string& path_in_file, int rank, std::int64_t columns, bool is_int) {
    require_new_path(path_in_file);
    PROPLAB_CHECK(rank == 1 || columns >= 1, "series '", path_in_file, "' has at least one column, not ", columns);
    const hsize_t dims[2] = {0, static_cast<hsize_t>(columns)};
    const hsize_t max_dims[2] = {H5S_UNLIMITED, static_cast<hsize_t>(columns)};
    hsize_t chunk[2] = {chunk_rows_1d, static_cast<hsize_t>(columns)};
    if (rank == 2) chunk[0] = std::clamp<hsize_t>(chunk_bytes_2d / (8 * chunk[1]), 1, chunk_rows_1d);
    H5Handle space(h5_check(H5Screate_simple(rank, dims, max_dims), "H5Screate_simple", file_name, path_in_file));
    H5Handle create_properties(h5_check(H5Pcreate(H5P_DATASET_CREATE), "H5Pcreate", file_name, path_in_file));
    h5_check(H5Pset_chunk(create_properties.get(), rank, chunk), "H5Pset_chunk", file_name, path_in_file);
    h5_check(H5Pset_shuffle(create_properties.get()), "H5Pset_shuffle", file_name, path_in_file);
    h5_check(H5Pset_deflate(create_properties.get(), deflate_level), "H5Pset_deflate", file_name, path_in_file);
    const hid_t file_type = is_int ? H5T_STD_I64LE : H5T_IEEE_F64LE;
    Series entry;
    entry.path = path_in_file;
    entry.rank = rank;
    entry.columns = rank == 1 ? 1 : columns;
    entry.is_int = is_int;
    entry.dataset = H5Handle(h5_check(H5Dcreate2(file.get(), path_in_file.c_str(), file_type, space.get(),
                                                 link_properties.get(), create_properties.get(), H5P_DEFAULT),
                                      "H5Dcreate2", file_name, path_in_file));
    series.push_back(std::move(entry));
    series_by_path.emplace(path_in_file, series.size() - 1);
    return series.size() - 1;
  }

  // Writes a fixed (non-extendible) 1-D dataset of `count` elements of `file_type` from `data`.
  void write_fixed(const std::string& path_in_file, hid_t file_type, hid_t memory_type, hsize_t count,
                   const void* data) {
    require_new_path(path_in_file);
    H5Handle space(h5_check(H5Screate_simple(1, &count, nullptr), "H5Screate_simple", file_name, path_in_file));
    H5Handle dataset(h5_check(H5Dcreate2(file.get(), path_in_file.c_str(), file_type, space.get(),
                                         link_properties.get(), H5P_DEFAULT, H5P_DEFAULT),
                              "H5Dcreate2", file_name, path_in_file));
    if (count > 0) {
      h5_check(H5Dwrite(dataset.get(), memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), "H5Dwrite", file_name,
               path_in_file);
    }
    dataset.close(file_name);
  }

  // Extends `entry` by `rows` rows and writes them from `data` (int64 or float64 as the series, row-major); `last_int`
  // is the last of them for an int64 series. Under the HDF5 lock, on the thread that writes.
  void write_rows(Series& entry, std::int64_t rows, const void* data, std::int64_t last_int) {
    if (rows == 0) return;
    const hsize_t extent[2] = {static_cast<hsize_t>(entry.rows_written + rows), static_cast<hsize_t>(entry.columns)};
    h5_check(H5Dset_extent(entry.dataset.get(), extent), "H5Dset_extent", file_name, entry.path);
    H5Handle file_space(h5_check(H5Dget_space(entry.dataset.get()), "H5Dget_space", file_name, entry.path));
    const hsize_t start[2] = {static_cast<hsize_t>(entry.rows_written), 0};
    const hsize_t count[2] = {static_cast<hsize_t>(rows), static_cast<hsize_t>(entry.columns)};
    h5_check(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start, nullptr, count, nullptr),
             "H5Sselect_hyperslab", file_name, entry.path);
    H5Handle memory_space(
        h5_check(H5Screate_simple(entry.rank, count, nullptr), "H5Screate_simple", file_name, entry.path));
    h5_check(H5Dwrite(entry.dataset.get(), entry.is_int ? H5T_NATIVE_INT64 : H5T_NATIVE_DOUBLE, memory_space.get(),
                      file_space.get(), H5P_DEFAULT, data),
             "H5Dwrite", file_name, entry.path);
    entry.rows_written += rows;
    if (entry.is_int) entry.last_int_written = last_int;
  }

  // H5Fflush, then what is written counts as flushed. Under the HDF5 lock, on the thread that writes.
  void flush_file() {
    // In SWMR mode H5Fflush pushes raw data and metadata in the order a concurrent reader relies on.
    h5_check(H5Fflush(file.get(), H5F_SCOPE_LOCAL), "H5Fflush", file_name);
    const std::lock_guard<std::mutex> lock(state_mutex);
    for (Series& entry : series) {
      entry.rows_flushed = entry.rows_written;
      entry.last_int_flushed = entry.last_int_written;
    }
  }

  // Writes the buffered rows on the calling thread (before start(), or with write_on_thread false).
  void write_all() {
    H5Guard guard;
    for (Series& entry : series) {
      const std::int64_t rows = entry.pending_rows();
      if (rows == 0) continue;
      if (entry.is_int) {
        write_rows(entry, rows, entry.pending_ints.data(), entry.pending_ints.back());
      } else {
        write_rows(entry, rows, entry.pending_doubles.data(), -1);
      }
      entry.pending_ints.clear();
      entry.pending_doubles.clear();
    }
    flush_file();
    most_pending = 0;
    last_hand_off = std::chrono::steady_clock::now();
  }

  // Writes one hand-off on the writer thread.
  void write_hand_off(const HandOff& hand_off) {
    H5Guard guard;
    for (const SeriesRows& part : hand_off.rows) {
      Series& entry = series[part.series];
      if (entry.is_int) {
        write_rows(entry, static_cast<std::int64_t>(part.ints.size()), part.ints.data(), part.ints.back());
      } else {
        write_rows(entry, static_cast<std::int64_t>(part.doubles.size()) / entry.columns, part.doubles.data(), -1);
      }
    }
    flush_file();
  }

  // The writer thread: writes the queued hand-offs in order until stop_requested and the queue is empty, or until a
  // write fails (kept in `failure`; what is queued behind it is dropped).
  void write_queue() {
    for (;;) {
      HandOff hand_off;
      {
        std::unique_lock<std::mutex> lock(state_mutex);
        hand_off_queued.wait(lock, [&] { return stop_requested || !queue.empty(); });
        if (queue.empty()) return;
        hand_off = std::move(queue.front());
        queue.pop_front();
        writing = true;
      }
      std::exception_ptr error;
      try {
        write_hand_off(hand_off);
      } catch (...) {
        error = std::current_exception();
      }
      {
        const std::lock_guard<std::mutex> lock(state_mutex);
        writing = false;
        queued_bytes -= hand_off.bytes;
        if (error) {
          failure = error;
          failure_last_train_step = hand_off.last_train_step;
          for (const HandOff& dropped : queue) queued_bytes -= dropped.bytes;
          queue.clear();
        }
      }
      hand_off_done.notify_all();
      if (error) return;
    }
  }

  void start_writer_thread() {
    // Asynchronous signals (SIGINT, SIGTERM, ...) stay with the other threads: their handlers run where they did
    // before, and none interrupts HDF5 here. The new thread inherits the mask in force while it is created.
    sigset_t blocked;
    sigset_t previous;
    sigfillset(&blocked);
    for (const int synchronous : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS}) sigdelset(&blocked, synchronous);
    const int masked = pthread_sigmask(SIG_BLOCK, &blocked, &previous);
    PROPLAB_CHECK(masked == 0, "pthread_sigmask blocks signals for run file '", file_name,
                  "''s writer thread: ", std::strerror(masked));
    try {
      writer_thread = std::thread([this] { write_queue(); });
    } catch (...) {
      pthread_sigmask(SIG_SETMASK, &previous, nullptr);
      throw;
    }
    pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  }

  // Lets the writer thread write what is queued (nothing after a failed write), then joins it. Never throws.
  void stop_writer_thread() noexcept {
    if (!writer_thread.joinable()) return;
    {
      const std::lock_guard<std::mutex> lock(state_mutex);
      stop_requested = true;
    }
    hand_off_queued.notify_one();
    writer_thread.join();
  }

  void rethrow_failure() const {
    const std::lock_guard<std::mutex> lock(state_mutex);
    if (failure) std::rethrow_exception(failure);
  }

  // Hands every buffered row to the writer thread (waiting for room in the queue), or writes them here when there
  // is none. `last_train_step`: of the last training row appended before the calling RunWriter function.
  void hand_off(std::int64_t last_train_step_before) {
    if (!writer_thread.joinable()) {
      write_all();
      return;
    }
    most_pending = 0;
    last_hand_off = std::chrono::steady_clock::now();
    HandOff rows;
    rows.last_train_step = last_train_step_before;
    for (std::size_t index = 0; index < series.size(); ++index) {
      Series& entry = series[index];
      if (entry.pending_rows() == 0) continue;
      rows.bytes += entry.pending_doubles.size() * sizeof(double) + entry.pending_ints.size() * sizeof(std::int64_t);
      rows.rows.push_back(SeriesRows{index, std::move(entry.pending_doubles), std::move(entry.pending_ints)});
      entry.pending_doubles.clear();  // (moved from: valid, and now surely empty)
      entry.pending_ints.clear();
    }
    std::unique_lock<std::mutex> lock(state_mutex);
    hand_off_done.wait(
        lock, [&] { return failure || queued_bytes == 0 || queued_bytes + rows.bytes <= options.queue_bytes; });
    if (failure) std::rethrow_exception(failure);
    queued_bytes += rows.bytes;
    queue.push_back(std::move(rows));
    lock.unlock();
    hand_off_queued.notify_one();
  }

  // Waits until the writer thread has written everything handed over (rethrowing its failure).
  void wait_until_written() {
    std::unique_lock<std::mutex> lock(state_mutex);
    hand_off_done.wait(lock, [&] { return failure || (queue.empty() && !writing); });
    if (failure) std::rethrow_exception(failure);
  }

  void note_append(const Series& entry, std::int64_t last_train_step_before) {
    most_pending = std::max(most_pending, entry.pending_rows());
    if (most_pending >= options.flush_every) {
      hand_off(last_train_step_before);
      return;
    }
    const std::chrono::duration<double> since = std::chrono::steady_clock::now() - last_hand_off;
    if (since.count() >= options.flush_interval_s) hand_off(last_train_step_before);
  }

  Series& series_at(SeriesId id) {
    PROPLAB_CHECK(id.index < series.size(), "series id ", id.index, " belongs to run file '", file_name, "'");
    return series[id.index];
  }

  void close_all() {
    for (Series& entry : series) entry.dataset.close(file_name);
    link_properties.close(file_name);
    file.close(file_name);
  }

  // Reopens the closed file normally and records how the run ended.
  void write_status(RunStatus status, const std::string& detail) {
    H5Handle access(h5_check(H5Pcreate(H5P_FILE_ACCESS), "H5Pcreate", file_name));
    h5_check(H5Pset_libver_bounds(access.get(), H5F_LIBVER_LATEST, H5F_LIBVER_LATEST), "H5Pset_libver_bounds",
             file_name);
    // SWMR readers (a GUI, h5py with swmr=True) hold a shared lock for as long as they have the file open, which
    // would make this read-write open fail. This process is the run's only writer (io/run_lock.h), and a SWMR
    // reader retries metadata whose checksum does not match, so it sees either the old or the new values.
    h5_check(H5Pset_file_locking(access.get(), false, true), "H5Pset_file_locking", file_name);
    H5Handle reopened(
        h5_check(H5Fopen(file_name.c_str(), H5F_ACC_RDWR, access.get()), "H5Fopen", file_name, "", ErrorKind::write));
    io_detail::h5_overwrite_string_attribute(reopened.get(), "status", run_status_name(status), file_name);
    io_detail::h5_overwrite_string_attribute(reopened.get(), "status_detail", fit_to(detail, run_status_detail_size),
                                             file_name);
    io_detail::h5_overwrite_string_attribute(reopened.get(), "end_time", iso8601_utc_now(), file_name);
    reopened.close(file_name);
  }
};

RunWriter::RunWriter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RunWriter::RunWriter(RunWriter&& other) noexcept = default;

RunWriter& RunWriter::operator=(RunWriter&& other) noexcept {
  if (this != &other) {
    RunWriter previous(std::move(*this));  // finished (as failed) when it goes out of scope, if still open
    impl_ = std::move(other.impl_);
  }
  return *this;
}

RunWriter::~RunWriter() {
  if (!impl_ || impl_->finished) return;
  const std::string detail = "the run's writer was destroyed before finish() (the program stopped early)";
  try {
    finish(RunStatus::failed, detail);
  } catch (...) {
    // A write failed (now, or earlier on the writer thread): the status is recorded as far as the file system lets.
    abandon(RunStatus::failed, detail);
  }
}

RunWriter RunWriter::create(const std::filesystem::path& path, const RunHeader& header, bool overwrite,
                            RunWriterOptions options) {
  const std::string file_name = path.string();
  // Validate everything before touching the file system.
  if (path.empty() || !path.has_filename()) throw UserError("run file path is empty or names a directory");
  if (header.proplab_version.empty()) throw InternalError("RunHeader.proplab_version must be set");
  if (header.threads < 0) throw InternalError(detail::concat("RunHeader.threads is ", header.threads, " (< 0)"));
  if (header.precision != "fp32" && header.precision != "bf16")
    throw InternalError(detail::concat("RunHeader.precision is '", header.precision, "' (not fp32 or bf16)"));
  if (options.flush_every < 1 || !(options.flush_interval_s >= 0.0) || options.queue_bytes < 1) {
    throw InternalError(detail::concat("RunWriterOptions: flush_every (", options.flush_every,
                                       ") must be >= 1, flush_interval_s (", options.flush_interval_s,
                                       ") >= 0 and queue_bytes (", options.queue_bytes, ") >= 1"));
  }
  std::error_code error;
  const bool exists = std::filesystem::exists(path, error);
  if (exists && std::filesystem::is_directory(path, error)) {
    throw UserError(detail::concat("run file '", file_name, "' is a directory"));
  }
  if (exists && !overwrite) {
    throw UserError(detail::concat("run file '", file_name,
                                   "' already exists; pass --force to overwrite it, or choose another run name"));
  }

  if (path.has_parent_path()) {
    std::filesystem::create_directories(path.parent_path(), error);
    if (error) {
      throw UserError(detail::concat("cannot create directory '", path.parent_path().string(),
                                     "' for run file: ", error.message()));
    }
  }

  H5Guard guard;
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->file_name = file_name;
  impl->options = options;
  {
    H5Handle access(h5_check(H5Pcreate(H5P_FILE_ACCESS), "H5Pcreate", file_name));
    h5_check(H5Pset_libver_bounds(access.get(), H5F_LIBVER_LATEST, H5F_LIBVER_LATEST), "H5Pset_libver_bounds",
             file_name);
    impl->file = H5Handle(
        h5_check(H5Fcreate(file_name.c_str(), overwrite ? H5F_ACC_TRUNC : H5F_ACC_EXCL, H5P_DEFAULT, access.get()),
                 "H5Fcreate", file_name, "", ErrorKind::user));
  }
  try {
    impl->link_properties = H5Handle(h5_check(H5Pcreate(H5P_LINK_CREATE), "H5Pcreate", file_name));
    h5_check(H5Pset_create_intermediate_group(impl->link_properties.get(), 1), "H5Pset_create_intermediate_group",
             file_name);
    const hid_t root = impl->file.get();
    const std::string host = header.host.empty() ? this_host_name() : header.host;
    const std::string start_time = header.start_time.empty() ? iso8601_utc_now() : header.start_time;
    auto fixed = [&](const char* name, const std::string& value) {
      io_detail::h5_write_string_attribute(root, name, value, value.size(), file_name);
    };
    fixed("format", run_format_name);
    io_detail::h5_write_int_attribute(root, "format_version", run_format_version, file_name);
    fixed("proplab_version", header.proplab_version);
    fixed("config", header.config);
    io_detail::h5_write_string_attribute(root, "status", run_status_name(RunStatus::running), run_status_size,
                                         file_name);
    io_detail::h5_write_string_attribute(root, "status_detail", "", run_status_detail_size, file_name);
    io_detail::h5_write_string_attribute(root, "start_time", fit_to(start_time, run_time_size), run_time_size,
                                         file_name);
    io_detail::h5_write_string_attribute(root, "end_time", "", run_time_size, file_name);
    fixed("host", host);
    fixed("device", header.device);
    io_detail::h5_write_int_attribute(root, "threads", header.threads, file_name);
    fixed("layout", header.layout);
    fixed("precision", header.precision);
    if (!header.kernels.empty()) fixed("kernels", header.kernels);

    for (const char* group_path : statistics_groups) {
      H5Handle group(h5_check(H5Gcreate2(root, group_path, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), "H5Gcreate2",
                              file_name, group_path));
      group.close(file_name);
    }
    impl->train_first = impl->series.size();
    for (const char* column : train_columns) {
      const std::string column_path = std::string("/train/") + column;
      impl->add_series(column_path, 1, 1, column_path == "/train/step");
    }
    impl->eval_first = impl->series.size();
    for (const char* column : eval_columns) {
      const std::string column_path = std::string("/eval/") + column;
      impl->add_series(column_path, 1, 1, column_path == "/eval/step");
    }
    h5_check(H5Fflush(root, H5F_SCOPE_LOCAL), "H5Fflush", file_name);
  } catch (...) {
    impl->series.clear();
    impl->link_properties.close_quietly();
    impl->file.close_quietly();
    std::filesystem::remove(path, error);
    throw;
  }
  return RunWriter(std::move(impl));
}

SeriesId RunWriter::create_series_2d(const std::string& path, std::int64_t columns) {
  impl_->require_layout_phase("create_series_2d");
  H5Guard guard;
  return SeriesId{impl_->add_series(path, 2, columns, false)};
}

SeriesId RunWriter::create_series_1d_int(const std::string& path) {
  impl_->require_layout_phase("create_series_1d_int");
  H5Guard guard;
  return SeriesId{impl_->add_series(path, 1, 1, true)};
}

void RunWriter::write_strings(const std::string& path, const std::vector<std::string>& values) {
  impl_->require_layout_phase("write_strings");
  H5Guard guard;
  std::size_t size = 1;
  for (const std::string& value : values) size = std::max(size, value.size());
  std::vector<char> buffer(size * values.size(), '\0');
  for (std::size_t i = 0; i < values.size(); ++i) std::copy(values[i].begin(), values[i].end(), &buffer[i * size]);
  H5Handle type = io_detail::h5_string_type(size, impl_->file_name);
  impl_->write_fixed(path, type.get(), type.get(), values.size(), buffer.data());
}

void RunWriter::write_ints(const std::string& path, const std::vector<std::int64_t>& values) {
  impl_->require_layout_phase("write_ints");
  H5Guard guard;
  impl_->write_fixed(path, H5T_STD_I64LE, H5T_NATIVE_INT64, values.size(), values.data());
}

void RunWriter::write_doubles(const std::string& path, const std::vector<double>& values) {
  impl_->require_layout_phase("write_doubles");
  H5Guard guard;
  impl_->write_fixed(path, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, values.size(), values.data());
}

void RunWriter::write_attribute(const std::string& object_path, const std::string& name, const std::string& value) {
  impl_->require_layout_phase("write_attribute");
  H5Guard guard;
  const std::string& file_name = impl_->file_name;
  H5Handle object(
      h5_check(H5Oopen(impl_->file.get(), object_path.c_str(), H5P_DEFAULT), "H5Oopen", file_name, object_path));
  io_detail::h5_write_string_attribute(object.get(), name, value, value.size(), file_name);
  object.close(file_name);
}

void RunWriter::start() {
  impl_->require_layout_phase("start");
  {
    H5Guard guard;
    impl_->write_all();
    h5_check(H5Fstart_swmr_write(impl_->file.get()), "H5Fstart_swmr_write", impl_->file_name);
  }
  impl_->started = true;
  if (impl_->options.write_on_thread) impl_->start_writer_thread();
}

bool RunWriter::started() const { return impl_->started; }
bool RunWriter::finished() const { return impl_->finished; }
const std::filesystem::path& RunWriter::path() const { return impl_->path; }
std::int64_t RunWriter::train_rows() const { return impl_->train_rows; }
std::int64_t RunWriter::eval_rows() const { return impl_->eval_rows; }

std::size_t RunWriter::queued_bytes() const {
  const std::lock_guard<std::mutex> lock(impl_->state_mutex);
  return impl_->queued_bytes;
}

std::optional<std::int64_t> RunWriter::failed_write_last_train_step() const {
  const std::lock_guard<std::mutex> lock(impl_->state_mutex);
  if (!impl_->failure) return std::nullopt;
  return impl_->failure_last_train_step;
}

void RunWriter::append_train(const TrainRow& row) {
  impl_->require_open("append_train");
  impl_->rethrow_failure();
  const std::int64_t last_train_step_before = impl_->last_train_step;
  Series* columns = &impl_->series[impl_->train_first];
  columns[0].pending_ints.push_back(row.step);
  columns[1].pending_doubles.push_back(row.loss);
  columns[2].pending_doubles.push_back(row.lr);
  columns[3].pending_doubles.push_back(row.grad_norm);
  columns[4].pending_doubles.push_back(row.tokens_per_s);
  columns[5].pending_doubles.push_back(row.wall_time);
  ++impl_->train_rows;
  impl_->last_train_step = row.step;
  impl_->note_append(columns[0], last_train_step_before);
}

void RunWriter::append_eval(const EvalRow& row) {
  impl_->require_open("append_eval");
  impl_->rethrow_failure();
  Series* columns = &impl_->series[impl_->eval_first];
  columns[0].pending_ints.push_back(row.step);
  columns[1].pending_doubles.push_back(row.loss);
  ++impl_->eval_rows;
  impl_->note_append(columns[0], impl_->last_train_step);
}

void RunWriter::append_row(SeriesId series, const double* values) {
  impl_->require_open("append_row");
  Series& entry = impl_->series_at(series);
  PROPLAB_CHECK(!entry.is_int, "append_row on the int64 series '", entry.path, "' (use append_int)");
  impl_->rethrow_failure();
  entry.pending_doubles.insert(entry.pending_doubles.end(), values, values + entry.columns);
  impl_->note_append(entry, impl_->last_train_step);
}

void RunWriter::append_row(const std::string& path, const double* values) {
  const auto found = impl_->series_by_path.find(path);
  PROPLAB_CHECK(found != impl_->series_by_path.end(), "series '", path, "' was created in run file '", impl_->file_name,
                "'");
  append_row(SeriesId{found->second}, values);
}

void RunWriter::append_int(SeriesId series, std::int64_t value) {
  impl_->require_open("append_int");
  Series& entry = impl_->series_at(series);
  PROPLAB_CHECK(entry.is_int, "append_int on the float64 series '", entry.path, "' (use append_row)");
  impl_->rethrow_failure();
  entry.pending_ints.push_back(value);
  impl_->note_append(entry, impl_->last_train_step);
}

void RunWriter::flush() {
  impl_->require_open("flush");
  impl_->rethrow_failure();
  impl_->hand_off(impl_->last_train_step);
}

void RunWriter::flush_and_wait() {
  flush();
  impl_->wait_until_written();
}

void RunWriter::finish(RunStatus status, const std::string& detail) {
  impl_->require_open("finish");
  PROPLAB_CHECK(status != RunStatus::running, "finish() records a final status, not running");
  // Marked first: whatever happens below, the writer does not try again from its destructor.
  impl_->finished = true;
  if (impl_->writer_thread.joinable()) {
    // The last rows go to the writer thread, which writes the queue out and ends; the file is then this thread's.
    std::exception_ptr hand_off_failed;
    try {
      impl_->hand_off(impl_->last_train_step);
    } catch (...) {
      hand_off_failed = std::current_exception();
    }
    impl_->stop_writer_thread();
    impl_->rethrow_failure();
    if (hand_off_failed) std::rethrow_exception(hand_off_failed);
  } else {
    impl_->write_all();
  }
  H5Guard guard;
  impl_->close_all();
  impl_->write_status(status, detail);
}

bool RunWriter::abandon(RunStatus status, const std::string& detail) noexcept {
  if (!impl_ || impl_->abandoned) return false;
  impl_->abandoned = true;
  impl_->finished = true;
  // What was handed over is written first (unless a write on the writer thread failed); buffered rows are dropped.
  impl_->stop_writer_thread();
  H5Guard guard;
  try {
    for (Series& entry : impl_->series) {
      entry.pending_doubles.clear();
      entry.pending_ints.clear();
      // A write that failed after extending its dataset would leave a row of fill values: cut it off again.
      const hsize_t extent[2] = {static_cast<hsize_t>(entry.rows_written), static_cast<hsize_t>(entry.columns)};
      if (entry.dataset.valid()) H5Dset_extent(entry.dataset.get(), extent);
    }
    impl_->close_all();
    impl_->write_status(status, detail);
    return true;
  } catch (...) {
    for (Series& entry : impl_->series) entry.dataset.close_quietly();
    impl_->link_properties.close_quietly();
    impl_->file.close_quietly();
    return false;
  }
}

RunWriter::FlushedExtent RunWriter::flushed(const std::string& series_path) const {
  const auto found = impl_->series_by_path.find(series_path);
  PROPLAB_CHECK(found != impl_->series_by_path.end(), "series '", series_path, "' was created in run file '",
                impl_->file_name, "'");
  const std::lock_guard<std::mutex> lock(impl_->state_mutex);
  const Series& entry = impl_->series[found->second];
  return FlushedExtent{entry.rows_flushed, entry.last_int_flushed};
}

}  // namespace proplab
