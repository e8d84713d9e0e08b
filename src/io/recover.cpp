#include "io/recover.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iterator>
#include <map>
#include <system_error>
#include <vector>

#include "core/error.h"
#include "io/hdf5_util.h"
#include "io/run_lock.h"

namespace proplab {

using io_detail::ErrorKind;
using io_detail::h5_check;
using io_detail::H5Guard;
using io_detail::H5Handle;

namespace {

namespace fs = std::filesystem;

// HDF5's private file-access properties that h5clear sets (H5Fprivate.h; registered in the default file-access
// class of every HDF5 >= 1.10.1).
constexpr const char* clear_status_flags_property = "clear_status_flags";
constexpr const char* skip_eof_check_property = "skip_eof_check";
constexpr const char* null_fsm_addr_property = "null_fsm_addr";

// Superblock status flags (HDF5 file format specification, superblock versions 2 and 3).
constexpr unsigned char superblock_write_access = 0x01;
constexpr unsigned char superblock_swmr_write_access = 0x04;

void require_regular_file(const fs::path& path) {
  std::error_code error;
  if (!fs::exists(path, error)) throw UserError(detail::concat("run file '", path.string(), "' does not exist"));
  if (!fs::is_regular_file(path, error)) {
    throw UserError(detail::concat("run file '", path.string(), "' is not a regular file"));
  }
}

// The status attribute, or "" when the file has none (recover still clears the mark).
std::string read_status(hid_t root, const std::string& file_name) {
  if (!io_detail::h5_has_attribute(root, "status", file_name)) return "";
  return io_detail::h5_read_string_attribute(root, "status", file_name);
}

// A file-access property list with h5clear's private properties set: clear the superblock's status flags on
// open (and, for `increment`, skip the end-of-file check and forget free-space managers, as h5clear does).
H5Handle clearing_access(const std::string& file_name, bool increment) {
  H5Handle access(h5_check(H5Pcreate(H5P_FILE_ACCESS), "H5Pcreate", file_name));
  hbool_t on = true;
  std::vector<const char*> properties = {clear_status_flags_property, skip_eof_check_property};
  if (increment) properties.push_back(null_fsm_addr_property);
  for (const char* name : properties) {
    if (h5_check(H5Pexist(access.get(), name), "H5Pexist", file_name, name) <= 0) {
      throw InternalError(detail::concat("this HDF5 library has no file-access property '", name,
                                         "' (h5clear's; HDF5 >= 1.10.1 has it): cannot recover '", file_name, "'"));
    }
    h5_check(H5Pset(access.get(), name, &on), "H5Pset", file_name, name);
  }
  return access;
}

// Process ids (on this machine, this one included) that have `path` open for writing, as far as /proc shows.
std::vector<long> local_writers(const fs::path& path) {
  std::vector<long> writers;
  struct stat target {};
  if (::stat(path.c_str(), &target) != 0) return writers;
  std::error_code error;
  fs::directory_iterator processes("/proc", error);
  if (error) return writers;
  for (const auto& process : processes) {
    const std::string pid_text = process.path().filename().string();
    if (pid_text.empty() || pid_text.find_first_not_of("0123456789") != std::string::npos) continue;
    std::error_code fd_error;
    fs::directory_iterator descriptors(process.path() / "fd", fd_error);
    if (fd_error) continue;  // another user's process, or gone
    for (const auto& descriptor : descriptors) {
      struct stat opened {};
      if (::stat(descriptor.path().c_str(), &opened) != 0) continue;
      if (opened.st_dev != target.st_dev || opened.st_ino != target.st_ino) continue;
      std::ifstream info(process.path() / "fdinfo" / descriptor.path().filename());
      std::string key;
      bool writing = false;
      while (info >> key) {
        if (key == "flags:") {
          std::string octal;
          info >> octal;
          const long flags = std::strtol(octal.c_str(), nullptr, 8);
          writing = (flags & O_ACCMODE) != O_RDONLY;
          break;
        }
      }
      if (writing) {
        writers.push_back(std::strtol(pid_text.c_str(), nullptr, 10));
        break;
      }
    }
  }
  return writers;
}

std::string utc_text(std::time_t time) {
  std::tm utc{};
  gmtime_r(&time, &utc);
  std::array<char, 32> text{};
  const std::size_t length = std::strftime(text.data(), text.size(), "%Y-%m-%dT%H:%M:%SZ", &utc);
  PROPLAB_CHECK(length > 0, "strftime fits an ISO 8601 time in 32 bytes");
  return std::string(text.data(), length);
}

// Last modification time of `path` as ISO 8601 UTC.
std::string modification_time(const fs::path& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) return iso8601_utc_now();
  return utc_text(info.st_mtime);
}

// Cuts `text` to at most `size` bytes, ending in "..." when cut, without splitting a UTF-8 sequence (the rule
// RunWriter::finish applies to status_detail).
std::string fit_to(const std::string& text, std::size_t size) {
  if (text.size() <= size) return text;
  std::size_t length = size - 3;
  while (length > 0 && (static_cast<unsigned char>(text[length]) & 0xC0) == 0x80) --length;
  return text.substr(0, length) + "...";
}

// Every series of the file (a dataset extendible along dimension 0): its path, rank and extent.
struct SeriesExtent {
  std::string path;
  int rank = 1;
  hsize_t dims[2] = {0, 0};
};

herr_t collect_series(hid_t group, const char* name, const H5L_info_t* info, void* data) {
  if (info->type != H5L_TYPE_HARD) return 0;
  const hid_t dataset = H5Oopen(group, name, H5P_DEFAULT);  // (H5Oopen and H5Iget_type: the same in HDF5 1.10 to 1.14)
  if (dataset < 0) return -1;
  const H5Handle owned(dataset);
  if (H5Iget_type(dataset) != H5I_DATASET) return 0;
  const H5Handle space(H5Dget_space(dataset));
  if (!space.valid()) return -1;
  SeriesExtent series{std::string("/") + name};
  series.rank = H5Sget_simple_extent_ndims(space.get());
  if (series.rank < 1 || series.rank > 2) return series.rank < 0 ? -1 : 0;
  hsize_t max_dims[2] = {0, 0};
  if (H5Sget_simple_extent_dims(space.get(), series.dims, max_dims) < 0) return -1;
  if (max_dims[0] == H5S_UNLIMITED) static_cast<std::vector<SeriesExtent>*>(data)->push_back(series);
  return 0;
}

// The family of a series: the series whose rows are written together (docs/run-format.md). /train's columns are
// one family and /eval's another; any other series belongs to the nearest enclosing group (its own included) that
// holds a `steps` series (/steps with /forward, /backward and /params; /replicas/steps with /replicas; ...).
std::string series_family(const std::string& path, const std::vector<SeriesExtent>& series) {
  std::string group = path.substr(0, path.rfind('/'));
  if (group == "/train" || group == "/eval") return group;
  const auto holds_steps = [&](const std::string& prefix) {
    const std::string steps = prefix + "/steps";
    return std::any_of(series.begin(), series.end(), [&](const SeriesExtent& s) { return s.path == steps; });
  };
  for (std::string prefix = group;; prefix = prefix.substr(0, prefix.rfind('/'))) {
    if (holds_steps(prefix)) return prefix.empty() ? "/" : prefix;
    if (prefix.empty()) break;
  }
  return group.empty() ? "/" : group;
}

// Cuts every series of the closed run file `file_name` to the shortest of its family, so that each family holds
// whole rows (a writer killed while writing a hand-off can leave some of its series one write longer than the
// others: they are extended one after another). Returns what was cut, family by family (in family name order).
std::vector<RecoverCut> cut_series_to_whole_rows(const std::string& file_name) {
  H5Handle access(h5_check(H5Pcreate(H5P_FILE_ACCESS), "H5Pcreate", file_name));
  h5_check(H5Pset_libver_bounds(access.get(), H5F_LIBVER_LATEST, H5F_LIBVER_LATEST), "H5Pset_libver_bounds", file_name);
  H5Handle file(h5_check(H5Fopen(file_name.c_str(), H5F_ACC_RDWR, access.get()), "H5Fopen (read-write)", file_name, "",
                         ErrorKind::user));
  std::vector<SeriesExtent> series;
  h5_check(H5Lvisit(file.get(), H5_INDEX_NAME, H5_ITER_INC, collect_series, &series), "H5Lvisit", file_name);
  std::vector<std::string> families;
  std::map<std::string, RecoverCut> by_family;
  for (const SeriesExtent& s : series) {
    families.push_back(series_family(s.path, series));
    RecoverCut& cut = by_family[families.back()];
    if (cut.family.empty()) {
      cut.family = families.back();
      cut.rows_kept = s.dims[0];
    }
    cut.rows_kept = std::min<std::uint64_t>(cut.rows_kept, s.dims[0]);
  }
  for (std::size_t i = 0; i < series.size(); ++i) {
    RecoverCut& cut = by_family.at(families[i]);
    SeriesExtent& s = series[i];
    if (s.dims[0] == cut.rows_kept) continue;
    H5Handle dataset(h5_check(H5Dopen2(file.get(), s.path.c_str(), H5P_DEFAULT), "H5Dopen2", file_name, s.path));
    cut.series_cut.push_back(s.path);
    cut.most_rows_cut = std::max<std::uint64_t>(cut.most_rows_cut, s.dims[0] - cut.rows_kept);
    s.dims[0] = cut.rows_kept;
    h5_check(H5Dset_extent(dataset.get(), s.dims), "H5Dset_extent", file_name, s.path, ErrorKind::write);
    dataset.close(file_name);
  }
  file.close(file_name);
  std::vector<RecoverCut> cuts;
  for (auto& [family, cut] : by_family)
    if (!cut.series_cut.empty()) cuts.push_back(std::move(cut));
  return cuts;
}

}  // namespace

bool run_file_marked_open(const fs::path& path) {
  static constexpr unsigned char signature[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
  const std::string file_name = path.string();
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(detail::concat("cannot read '", file_name, "'"));
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  // The superblock is at 0 or, after a user block, at 512, 1024, 2048, ... bytes.
  for (std::streamoff offset = 0; offset + 12 <= size; offset = offset == 0 ? 512 : offset * 2) {
    std::array<unsigned char, 12> head{};
    in.seekg(offset);
    if (!in.read(reinterpret_cast<char*>(head.data()), head.size())) break;
    if (!std::equal(std::begin(signature), std::end(signature), head.begin())) continue;
    const unsigned version = head[8];
    if (version < 2) return false;
    return (head[11] & (superblock_write_access | superblock_swmr_write_access)) != 0;
  }
  throw UserError(detail::concat("'", file_name, "' is not an HDF5 file, so not a proplab run file"));
}

RecoverResult recover_run_file(const fs::path& path) {
  const std::string file_name = path.string();
  require_regular_file(path);
  H5Guard guard;
  RecoverResult result;
  if (const std::optional<RunLockHolder> holder = lock_holder(path))
    throw UserError(detail::concat("run file '", file_name, "' is being written by ", holder->describe(),
                                   ": its run is still going, so there is nothing to recover (read it while it runs; ",
                                   "recover only after the writer has ended)"));

  if (!run_file_marked_open(path)) {
    // A closed file: checked, and written only when its writer closed it but could not record how it ended.
    H5Handle file(
        h5_check(H5Fopen(file_name.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), "H5Fopen", file_name, "", ErrorKind::user));
    io_detail::require_run_format(file.get(), file_name);
    result.status_before = result.status_after = read_status(file.get(), file_name);
    file.close(file_name);
    if (result.status_before == run_status_name(RunStatus::running) && local_writers(path).empty()) {
      rewrite_run_status(path, RunStatus::failed, recover_killed_detail, modification_time(path));
      result.status_after = run_status_name(RunStatus::failed);
      result.outcome = RecoverOutcome::status_written;
    }
    return result;
  }

  const std::vector<long> writers = local_writers(path);
  if (!writers.empty()) {
    std::string pids;
    for (long pid : writers) pids += (pids.empty() ? "" : ", ") + std::to_string(pid);
    throw UserError(detail::concat("run file '", file_name, "' is open for writing by process ", pids,
                                   ": its run is still going, so there is nothing to recover (read it while it runs; ",
                                   "recover only after the writer was killed)"));
  }
  const std::string last_written = modification_time(path);

  // Checked through a read-only open first: clearing the flags in memory lets it open, and nothing is written.
  {
    H5Handle access = clearing_access(file_name, false);
    H5Handle file(h5_check(H5Fopen(file_name.c_str(), H5F_ACC_RDONLY, access.get()), "H5Fopen (recovery check)",
                           file_name, "", ErrorKind::user));
    io_detail::require_run_format(file.get(), file_name);
    result.status_before = read_status(file.get(), file_name);
    file.close(file_name);
  }

  // h5clear -s --increment: the read-write open clears the flags; closing writes the superblock with the new EOA.
  // (Closing truncates the file to its EOA, so the increment must come between open and close, as here.)
  {
    H5Handle access = clearing_access(file_name, true);
    const hid_t opened = H5Fopen(file_name.c_str(), H5F_ACC_RDWR, access.get());
    if (opened < 0) {
      try {
        io_detail::h5_fail("H5Fopen (read-write)", file_name, "", ErrorKind::user);
      } catch (const UserError& error) {
        throw UserError(detail::concat(error.what(), " (is another program, e.g. an SWMR reader such as the GUI ",
                                       "or h5py, holding the file open? close it and retry)"));
      }
    }
    H5Handle file(opened);
    h5_check(H5Fincrement_filesize(file.get(), recover_eoa_margin), "H5Fincrement_filesize", file_name);
    file.close(file_name);
  }
  PROPLAB_CHECK(!run_file_marked_open(path), "clearing the status flags of '", file_name, "' cleared them");
  result.outcome = RecoverOutcome::recovered;
  result.cuts = cut_series_to_whole_rows(file_name);

  result.status_after = result.status_before;
  if (result.status_before == run_status_name(RunStatus::running)) {
    rewrite_run_status(path, RunStatus::failed, recover_killed_detail, last_written);
    result.status_after = run_status_name(RunStatus::failed);
  }
  return result;
}

void rewrite_run_status(const fs::path& path, RunStatus status, const std::string& detail,
                        const std::string& end_time) {
  const std::string file_name = path.string();
  PROPLAB_CHECK(status != RunStatus::running, "rewrite_run_status records how a run ended, not 'running'");
  PROPLAB_CHECK(end_time.size() <= run_time_size, "end_time '", end_time, "' fits ", run_time_size, " bytes");
  require_regular_file(path);
  H5Guard guard;
  H5Handle access(h5_check(H5Pcreate(H5P_FILE_ACCESS), "H5Pcreate", file_name));
  h5_check(H5Pset_libver_bounds(access.get(), H5F_LIBVER_LATEST, H5F_LIBVER_LATEST), "H5Pset_libver_bounds", file_name);
  H5Handle file(h5_check(H5Fopen(file_name.c_str(), H5F_ACC_RDWR, access.get()), "H5Fopen (read-write)", file_name, "",
                         ErrorKind::user));
  io_detail::require_run_format(file.get(), file_name);
  io_detail::h5_overwrite_string_attribute(file.get(), "status", run_status_name(status), file_name);
  io_detail::h5_overwrite_string_attribute(file.get(), "status_detail", fit_to(detail, run_status_detail_size),
                                           file_name);
  io_detail::h5_overwrite_string_attribute(file.get(), "end_time", end_time, file_name);
  file.close(file_name);
}

}  // namespace proplab
