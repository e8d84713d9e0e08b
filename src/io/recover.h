// io/recover: makes the run file of a killed writer readable by every HDF5 tool again (`proplab recover`), and
// rewrites the status attributes of a closed run file.
//
// A writer that stops without closing its file (SIGKILL, out-of-memory, power loss) leaves the superblock's
// status flags marked "open for (SWMR) write": a plain open then fails, only an SWMR-read open works, and the
// end-of-allocation (EOA) stored in the superblock can lie below the rows written in SWMR mode.
//
// Invariants:
// - Only proplab run files are written (root attribute format = "proplab-run", a format_version this build
//   reads), and only while their superblock is marked open; everything is checked through read-only opens
//   before the first write. A file that is not marked open is never written.
// - A run whose lock is held (io/run_lock.h: its writer is alive, on this machine or another sharing the file
//   system) is refused, as is a file that a process on this machine has open for writing: clearing the mark under
//   a live writer would corrupt the file.
// - Clearing is what `h5clear -s --increment` does, through HDF5's own file-access properties
//   (clear_status_flags, skip_eof_check, null_fsm_addr) and H5Fincrement_filesize: the EOA becomes
//   max(EOA, end of file) + recover_eoa_margin, so nothing written is cut off. (Clearing the flags alone, like
//   plain `h5clear -s`, keeps the stale EOA and loses data.)
// - After clearing, every family of series (the series written together: /train's columns; /eval's; /steps with
//   /forward, /backward and /params; each other group holding a `steps` series with its series) is cut to its
//   shortest series, so the file holds whole rows only: a writer killed in the middle of a hand-off can leave some
//   series of it extended and others not. Nothing that a reader cutting to the shortest (RunReader, the Python
//   package) would show is lost.
// - After clearing, a status still "running" becomes "failed" with detail "killed" and end_time the file's
//   last modification time before recovery (when the writer last wrote). Any other status is kept.
// - A closed file that still says "running" (its writer closed it but could not record how the run ended, e.g.
//   its disk was full) gets the same "failed" / "killed" status; nothing else of a closed file is written.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "io/run_file.h"

namespace proplab {

// Bytes added past max(EOA, end of file) when clearing (h5clear's default increment); the file grows by at
// most this much (sparse, on file systems that support holes).
inline constexpr std::uint64_t recover_eoa_margin = 1024 * 1024;

// The detail a recovered run's status_detail says.
inline constexpr const char* recover_killed_detail = "killed";

enum class RecoverOutcome {
  recovered,        // the mark was cleared (and a "running" status rewritten)
  not_marked_open,  // a closed file: left unchanged
  status_written,   // a closed file that said running: its status rewritten
};

// One family of series (written together: docs/run-format.md) that a killed writer left with some series longer
// than others, and how recovery cut them to whole rows.
struct RecoverCut {
  std::string family;                   // "/train", "/eval", "/" (/steps with /forward, /backward, /params), ...
  std::uint64_t rows_kept = 0;          // the shortest series' rows, which every series of the family now has
  std::uint64_t most_rows_cut = 0;      // the most rows cut from one series
  std::vector<std::string> series_cut;  // the series that were longer, in name order
};

struct RecoverResult {
  RecoverOutcome outcome = RecoverOutcome::not_marked_open;
  std::string status_before;     // the status attribute as found
  std::string status_after;      // as left
  std::vector<RecoverCut> cuts;  // families cut to whole rows, in family name order (recovered files only)
};

// Clears a killed writer's open-for-write mark on the run file at `path` (see the invariants above).
// UserError when the file is missing, not HDF5, not a proplab run file, of an unsupported version, being written
// (its run's lock is held, or a process here has it open for writing), or cannot be opened for writing (e.g. an
// SWMR reader holds its lock).
RecoverResult recover_run_file(const std::filesystem::path& path);

// True when the superblock of the HDF5 file at `path` is marked open for write or SWMR write (superblock
// version >= 2 only: older superblocks carry no such mark). UserError when the file cannot be read or has no
// HDF5 signature.
bool run_file_marked_open(const std::filesystem::path& path);

// Overwrites status, status_detail (cut to run_status_detail_size, ending in "...") and end_time of a closed
// run file (a normal read-write open). `status` must not be running; end_time must fit run_time_size.
void rewrite_run_status(const std::filesystem::path& path, RunStatus status, const std::string& detail,
                        const std::string& end_time);

}  // namespace proplab
