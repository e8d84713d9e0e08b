// io/hdf5_util: the io module's private layer over the HDF5 C API (not included outside src/io and tests/io).
//
// Invariants:
// - Every HDF5 call goes through h5_check(), which turns a negative return into an exception naming the call,
//   the file and the object, with HDF5's own error-stack messages appended. Calls that fail because of the
//   user's file (open, create, missing object) raise UserError; everything else raises InternalError.
// - Every HDF5 call proplab makes, on any thread and for any file, is made while holding the process-wide HDF5
//   lock: an H5Guard, held by every public io entry point (and by a run file's writer thread for each write,
//   io/run_file.h), takes it. HDF5's state is global to the process (identifiers, caches, free lists, and in a
//   build without thread safety the error stacks too), so calls for two different files must not overlap either.
//   Debian's serial build is built thread-safe (H5_HAVE_THREADSAFE, one global lock inside the library), but
//   nothing here relies on it: the lock serialises every call whichever build is linked. It is recursive (entry
//   points nest), and no thread waits for another thread's HDF5 work while holding it (a run file's writer thread
//   is waited for only outside it).
// - HDF5's automatic error printing is switched off (per thread in a thread-safe build, for the whole library
//   otherwise: either way only while the lock is held) by the same H5Guard, so failures surface only as exceptions.
// - The helpers below expect their caller to hold an H5Guard; H5Handle's close() and destructor take their own.
// - Every identifier is owned by an H5Handle that closes it exactly once; explicit close() is checked,
//   the destructor's best-effort close is not (it may run during unwinding).
// - Strings are stored as fixed-length, NUL-padded UTF-8 (one type size per attribute or dataset).
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "core/error.h"

namespace proplab::io_detail {

// user: a file the user named (open, create, a missing object); internal: a bug; write: writing a file proplab
// produces, where any operating-system error is an I/O failure (a vanished directory, a lost permission).
enum class ErrorKind { user, internal, write };

// Throws (UserError, InternalError or IoError) with `call`, `file` and `object` and the HDF5 error stack. When
// the stack carries an operating-system error (HDF5's file driver reports "errno = N") that says the disk or the
// file system refused the write (ENOSPC, EDQUOT, EROFS, EIO, EFBIG, ESTALE; any errno for ErrorKind::write), it
// is an IoError naming `file` instead. (For ErrorKind::write, a stack without an errno falls back to the errno the
// failed call left.)
[[noreturn]] void h5_fail(const char* call, const std::string& file, const std::string& object, ErrorKind kind);

// The errno in an HDF5 error stack's text ("..., errno = 28, ..."), 0 when there is none.
int h5_stack_errno(const std::string& stack);

// Returns `value` when it is non-negative; otherwise throws via h5_fail.
template <typename Value>
Value h5_check(Value value, const char* call, const std::string& file, const std::string& object = "",
               ErrorKind kind = ErrorKind::internal) {
  if (value < 0) h5_fail(call, file, object, kind);
  return value;
}

// Holds the process-wide HDF5 lock and switches HDF5's automatic error printing off for the guard's lifetime.
class H5Guard {
 public:
  H5Guard();
  ~H5Guard();
  H5Guard(const H5Guard&) = delete;
  H5Guard& operator=(const H5Guard&) = delete;

 private:
  std::unique_lock<std::recursive_mutex> lock_;
  H5E_auto2_t saved_function_ = nullptr;
  void* saved_data_ = nullptr;
};

// Owns one HDF5 identifier (file, group, dataset, dataspace, datatype, attribute or property list).
class H5Handle {
 public:
  H5Handle() = default;
  explicit H5Handle(hid_t id) : id_(id) {}
  ~H5Handle() { close_quietly(); }
  H5Handle(H5Handle&& other) noexcept : id_(other.id_) { other.id_ = H5I_INVALID_HID; }
  H5Handle& operator=(H5Handle&& other) noexcept;
  H5Handle(const H5Handle&) = delete;
  H5Handle& operator=(const H5Handle&) = delete;

  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  // Closes the identifier, throwing InternalError (naming `file`) when HDF5 reports a failure.
  void close(const std::string& file);
  void close_quietly() noexcept;

 private:
  hid_t id_ = H5I_INVALID_HID;
};

// True when every component of `path` ("/a/b/c") exists in `file` (a link check per level).
bool h5_path_exists(hid_t file, const std::string& path, const std::string& file_name);

// Fixed-length string type of `size` bytes (at least 1), NUL-padded, UTF-8.
H5Handle h5_string_type(std::size_t size, const std::string& file_name);

// Attributes on object `object` (a file or group id).
void h5_write_string_attribute(hid_t object, const std::string& name, const std::string& value, std::size_t size,
                               const std::string& file_name);
void h5_write_int_attribute(hid_t object, const std::string& name, std::int64_t value, const std::string& file_name);
// Overwrites an existing fixed-length string attribute; the value must fit its size.
void h5_overwrite_string_attribute(hid_t object, const std::string& name, const std::string& value,
                                   const std::string& file_name);
bool h5_has_attribute(hid_t object, const std::string& name, const std::string& file_name);
// Reads a string attribute (fixed or variable length), trailing NULs removed. UserError if it is not a string.
std::string h5_read_string_attribute(hid_t object, const std::string& name, const std::string& file_name);
// Reads an integer attribute as int64. UserError if it is not an integer.
std::int64_t h5_read_int_attribute(hid_t object, const std::string& name, const std::string& file_name);
std::vector<std::string> h5_attribute_names(hid_t object, const std::string& file_name);

// Reads a whole 1-D string dataset (fixed or variable length).
std::vector<std::string> h5_read_string_dataset(hid_t dataset, const std::string& file_name, const std::string& object);

// fsync(2) a file or directory so a rename that follows is durable; IoError on failure.
void fsync_path(const std::string& path, bool directory);

// UserError unless the file whose root group is `root` is a proplab run file of the format_version this build
// reads (RunReader and recover give the same messages).
void require_run_format(hid_t root, const std::string& file_name);

}  // namespace proplab::io_detail
