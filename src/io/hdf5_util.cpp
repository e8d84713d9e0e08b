#include "io/hdf5_util.h"
#include "io/run_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace proplab::io_detail {

namespace {

// HDF5 closes what is still open when the program exits. A file whose last writes the disk refused cannot be
// closed: HDF5 1.10 keeps its half-closed identifier, and closing it again at exit crashes (or loops). Every file
// proplab writes is closed explicitly before exit, so the library's exit handler is switched off before HDF5 is
// first used.
const bool hdf5_exit_handler_off = [] {
  H5dont_atexit();
  return true;
}();

herr_t collect_error(unsigned /*index*/, const H5E_error2_t* entry, void* client) {
  auto* messages = static_cast<std::string*>(client);
  if (entry->desc != nullptr && entry->desc[0] != '\0') {
    if (!messages->empty()) *messages += "; ";
    *messages += entry->desc;
  }
  return 0;
}

// The HDF5 error stack of this thread as one line (then cleared).
std::string take_error_stack() {
  std::string messages;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect_error, &messages);
  H5Eclear2(H5E_DEFAULT);
  return messages;
}

}  // namespace

int h5_stack_errno(const std::string& stack) {
  const std::string key = "errno = ";
  const std::size_t at = stack.find(key);
  if (at == std::string::npos) return 0;
  return std::atoi(stack.c_str() + at + key.size());
}

void h5_fail(const char* call, const std::string& file, const std::string& object, ErrorKind kind) {
  // The operating system's errno of the failed call, before anything here can change it: some HDF5 paths (e.g.
  // H5Fcreate's stat of a file's folder) fail on a system call without putting its errno on the error stack.
  const int call_errno = errno;
  std::string message = detail::concat("HDF5 call ", call, " failed on file '", file, "'");
  if (!object.empty()) message += detail::concat(" (object '", object, "')");
  const std::string stack = take_error_stack();
  const int stack_errno = h5_stack_errno(stack);
  const int error_number = stack_errno != 0 ? stack_errno : kind == ErrorKind::write ? call_errno : 0;
  const bool refused_write = error_number == ENOSPC || error_number == EDQUOT || error_number == EROFS ||
                             error_number == EIO || error_number == EFBIG || error_number == ESTALE;
  if (refused_write || (kind == ErrorKind::write && error_number != 0)) throw IoError(file, error_number);
  if (!stack.empty()) message += ": " + stack;
  if (kind == ErrorKind::user) throw UserError(message);
  throw InternalError(message);
}

namespace {
// The process-wide HDF5 lock (function-local, so that it exists before any static initialiser could use HDF5).
std::recursive_mutex& hdf5_lock() {
  static std::recursive_mutex lock;
  return lock;
}
}  // namespace

H5Guard::H5Guard() : lock_(hdf5_lock()) {
  // Only failures of these two calls are possible if the library cannot initialise; then every later call
  // fails too and is reported there, so they are not fatal here.
  if (H5Eget_auto2(H5E_DEFAULT, &saved_function_, &saved_data_) < 0) {
    saved_function_ = nullptr;
    saved_data_ = nullptr;
  }
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

H5Guard::~H5Guard() { H5Eset_auto2(H5E_DEFAULT, saved_function_, saved_data_); }

H5Handle& H5Handle::operator=(H5Handle&& other) noexcept {
  if (this != &other) {
    close_quietly();
    id_ = other.id_;
    other.id_ = H5I_INVALID_HID;
  }
  return *this;
}

namespace {
herr_t close_id(hid_t id) {
  switch (H5Iget_type(id)) {
    case H5I_FILE:
      return H5Fclose(id);
    case H5I_GROUP:
      return H5Gclose(id);
    case H5I_DATASET:
      return H5Dclose(id);
    case H5I_DATASPACE:
      return H5Sclose(id);
    case H5I_DATATYPE:
      return H5Tclose(id);
    case H5I_ATTR:
      return H5Aclose(id);
    case H5I_GENPROP_LST:
      return H5Pclose(id);
    default:
      return H5Idec_ref(id) < 0 ? -1 : 0;
  }
}
}  // namespace

void H5Handle::close(const std::string& file) {
  if (id_ < 0) return;
  H5Guard guard;
  const hid_t id = id_;
  id_ = H5I_INVALID_HID;
  h5_check(close_id(id), "H5Xclose", file);
}

void H5Handle::close_quietly() noexcept {
  if (id_ < 0) return;
  H5Guard guard;
  close_id(id_);
  H5Eclear2(H5E_DEFAULT);
  id_ = H5I_INVALID_HID;
}

bool h5_path_exists(hid_t file, const std::string& path, const std::string& file_name) {
  std::size_t position = 0;
  while (position < path.size()) {
    std::size_t next = path.find('/', position + 1);
    if (next == std::string::npos) next = path.size();
    const std::string prefix = path.substr(0, next);
    if (prefix != "/" && !prefix.empty()) {
      if (h5_check(H5Lexists(file, prefix.c_str(), H5P_DEFAULT), "H5Lexists", file_name, prefix) == 0) return false;
      if (next < path.size()) {
        // Only a group can have members: "/train/loss/x" does not exist when /train/loss is a dataset.
        H5O_info_t info;
        h5_check(H5Oget_info_by_name2(file, prefix.c_str(), &info, H5O_INFO_BASIC, H5P_DEFAULT), "H5Oget_info_by_name2",
                 file_name, prefix);
        if (info.type != H5O_TYPE_GROUP) return false;
      }
    }
    position = next;
  }
  return true;
}

H5Handle h5_string_type(std::size_t size, const std::string& file_name) {
  H5Handle type(h5_check(H5Tcopy(H5T_C_S1), "H5Tcopy", file_name));
  h5_check(H5Tset_size(type.get(), size == 0 ? 1 : size), "H5Tset_size", file_name);
  h5_check(H5Tset_strpad(type.get(), H5T_STR_NULLPAD), "H5Tset_strpad", file_name);
  h5_check(H5Tset_cset(type.get(), H5T_CSET_UTF8), "H5Tset_cset", file_name);
  return type;
}

void h5_write_string_attribute(hid_t object, const std::string& name, const std::string& value, std::size_t size,
                               const std::string& file_name) {
  PROPLAB_CHECK(value.size() <= size, "string attribute '", name, "' (", value.size(), " bytes) exceeds its size ",
                size);
  H5Handle type = h5_string_type(size, file_name);
  H5Handle space(h5_check(H5Screate(H5S_SCALAR), "H5Screate", file_name, name));
  H5Handle attribute(h5_check(H5Acreate2(object, name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT),
                              "H5Acreate2", file_name, name));
  std::string padded = value;
  padded.resize(size == 0 ? 1 : size, '\0');
  h5_check(H5Awrite(attribute.get(), type.get(), padded.data()), "H5Awrite", file_name, name);
  attribute.close(file_name);
}

void h5_write_int_attribute(hid_t object, const std::string& name, std::int64_t value, const std::string& file_name) {
  H5Handle space(h5_check(H5Screate(H5S_SCALAR), "H5Screate", file_name, name));
  H5Handle attribute(h5_check(H5Acreate2(object, name.c_str(), H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT),
                              "H5Acreate2", file_name, name));
  h5_check(H5Awrite(attribute.get(), H5T_NATIVE_INT64, &value), "H5Awrite", file_name, name);
  attribute.close(file_name);
}

void h5_overwrite_string_attribute(hid_t object, const std::string& name, const std::string& value,
                                   const std::string& file_name) {
  H5Handle attribute(h5_check(H5Aopen(object, name.c_str(), H5P_DEFAULT), "H5Aopen", file_name, name));
  H5Handle type(h5_check(H5Aget_type(attribute.get()), "H5Aget_type", file_name, name));
  PROPLAB_CHECK(H5Tget_class(type.get()) == H5T_STRING &&
                    h5_check(H5Tis_variable_str(type.get()), "H5Tis_variable_str", file_name, name) == 0,
                "attribute '", name, "' is a fixed-length string");
  const std::size_t size = H5Tget_size(type.get());
  if (size == 0) h5_fail("H5Tget_size", file_name, name, ErrorKind::internal);
  PROPLAB_CHECK(value.size() <= size, "value for attribute '", name, "' (", value.size(),
                " bytes) fits its fixed size ", size);
  std::string padded = value;
  padded.resize(size, '\0');
  h5_check(H5Awrite(attribute.get(), type.get(), padded.data()), "H5Awrite", file_name, name);
  attribute.close(file_name);
}

bool h5_has_attribute(hid_t object, const std::string& name, const std::string& file_name) {
  return h5_check(H5Aexists(object, name.c_str()), "H5Aexists", file_name, name) > 0;
}

namespace {

// Reads a string-typed attribute or dataset element set of `count` strings. `read` performs H5Aread/H5Dread
// with the given memory type into the given buffer.
template <typename Read>
std::vector<std::string> read_strings(hid_t file_type, std::size_t count, const std::string& file_name,
                                      const std::string& object, Read read) {
  if (h5_check(H5Tget_class(file_type), "H5Tget_class", file_name, object) != H5T_STRING) {
    throw UserError(detail::concat("'", object, "' in '", file_name, "' is not a string"));
  }
  std::vector<std::string> values(count);
  if (h5_check(H5Tis_variable_str(file_type), "H5Tis_variable_str", file_name, object) > 0) {
    H5Handle memory_type(h5_check(H5Tcopy(H5T_C_S1), "H5Tcopy", file_name, object));
    h5_check(H5Tset_size(memory_type.get(), H5T_VARIABLE), "H5Tset_size", file_name, object);
    const H5T_cset_t cset = h5_check(H5Tget_cset(file_type), "H5Tget_cset", file_name, object);
    h5_check(H5Tset_cset(memory_type.get(), cset), "H5Tset_cset", file_name, object);
    std::vector<char*> pointers(count, nullptr);
    read(memory_type.get(), static_cast<void*>(pointers.data()));
    for (std::size_t i = 0; i < count; ++i) {
      if (pointers[i] != nullptr) {
        values[i] = pointers[i];
        H5free_memory(pointers[i]);
      }
    }
    return values;
  }
  const std::size_t size = H5Tget_size(file_type);
  if (size == 0) h5_fail("H5Tget_size", file_name, object, ErrorKind::internal);
  H5Handle memory_type(h5_check(H5Tcopy(file_type), "H5Tcopy", file_name, object));
  std::vector<char> buffer(size * count, '\0');
  read(memory_type.get(), static_cast<void*>(buffer.data()));
  for (std::size_t i = 0; i < count; ++i) {
    const char* begin = buffer.data() + i * size;
    values[i].assign(begin, strnlen(begin, size));
  }
  return values;
}

std::size_t element_count(hid_t space, const std::string& file_name, const std::string& object) {
  const hssize_t count =
      h5_check(H5Sget_simple_extent_npoints(space), "H5Sget_simple_extent_npoints", file_name, object);
  return static_cast<std::size_t>(count);
}

}  // namespace

std::string h5_read_string_attribute(hid_t object, const std::string& name, const std::string& file_name) {
  H5Handle attribute(h5_check(H5Aopen(object, name.c_str(), H5P_DEFAULT), "H5Aopen", file_name, name, ErrorKind::user));
  H5Handle type(h5_check(H5Aget_type(attribute.get()), "H5Aget_type", file_name, name));
  H5Handle space(h5_check(H5Aget_space(attribute.get()), "H5Aget_space", file_name, name));
  if (element_count(space.get(), file_name, name) != 1) {
    throw UserError(detail::concat("attribute '", name, "' in '", file_name, "' is not a single string"));
  }
  auto values = read_strings(type.get(), 1, file_name, "attribute " + name, [&](hid_t memory_type, void* buffer) {
    h5_check(H5Aread(attribute.get(), memory_type, buffer), "H5Aread", file_name, name);
  });
  return values[0];
}

std::int64_t h5_read_int_attribute(hid_t object, const std::string& name, const std::string& file_name) {
  H5Handle attribute(h5_check(H5Aopen(object, name.c_str(), H5P_DEFAULT), "H5Aopen", file_name, name, ErrorKind::user));
  H5Handle type(h5_check(H5Aget_type(attribute.get()), "H5Aget_type", file_name, name));
  H5Handle space(h5_check(H5Aget_space(attribute.get()), "H5Aget_space", file_name, name));
  if (H5Tget_class(type.get()) != H5T_INTEGER || element_count(space.get(), file_name, name) != 1) {
    throw UserError(detail::concat("attribute '", name, "' in '", file_name, "' is not a single integer"));
  }
  std::int64_t value = 0;
  h5_check(H5Aread(attribute.get(), H5T_NATIVE_INT64, &value), "H5Aread", file_name, name);
  return value;
}

namespace {
herr_t collect_attribute_name(hid_t /*location*/, const char* name, const H5A_info_t* /*info*/, void* client) {
  static_cast<std::vector<std::string>*>(client)->emplace_back(name);
  return 0;
}
}  // namespace

std::vector<std::string> h5_attribute_names(hid_t object, const std::string& file_name) {
  std::vector<std::string> names;
  hsize_t index = 0;
  h5_check(H5Aiterate2(object, H5_INDEX_NAME, H5_ITER_INC, &index, collect_attribute_name, &names), "H5Aiterate2",
           file_name);
  return names;
}

std::vector<std::string> h5_read_string_dataset(hid_t dataset, const std::string& file_name,
                                                const std::string& object) {
  H5Handle type(h5_check(H5Dget_type(dataset), "H5Dget_type", file_name, object));
  H5Handle space(h5_check(H5Dget_space(dataset), "H5Dget_space", file_name, object));
  const std::size_t count = element_count(space.get(), file_name, object);
  if (count == 0) return {};
  return read_strings(type.get(), count, file_name, object, [&](hid_t memory_type, void* buffer) {
    h5_check(H5Dread(dataset, memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buffer), "H5Dread", file_name, object);
  });
}

void fsync_path(const std::string& path, bool directory) {
  const int descriptor = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (descriptor < 0) throw IoError(path, errno);
  const int result = ::fsync(descriptor);
  const int saved_errno = errno;
  ::close(descriptor);
  if (result != 0) throw IoError(path, saved_errno);
}

void require_run_format(hid_t root, const std::string& file_name) {
  const std::string not_a_run = detail::concat("'", file_name, "' is not a proplab run file (its root attribute ",
                                               "'format' is not \"", run_format_name, "\")");
  if (!h5_has_attribute(root, "format", file_name)) throw UserError(not_a_run);
  std::string format;
  try {
    format = h5_read_string_attribute(root, "format", file_name);
  } catch (const UserError&) {
    throw UserError(not_a_run);
  }
  if (format != run_format_name) throw UserError(not_a_run);
  if (!h5_has_attribute(root, "format_version", file_name)) {
    throw UserError(detail::concat("run file '", file_name, "' has no 'format_version' attribute"));
  }
  const std::int64_t version = h5_read_int_attribute(root, "format_version", file_name);
  if (version != run_format_version) {
    throw UserError(detail::concat(
        "run file '", file_name, "' has format_version ", version, "; this build of proplab reads format_version ",
        run_format_version,
        version > run_format_version ? " (the file is from a newer proplab)" : " (the file is from an older proplab)"));
  }
}

}  // namespace proplab::io_detail
