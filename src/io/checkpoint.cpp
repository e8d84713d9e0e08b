#include "io/checkpoint.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>
#include <system_error>

#include "core/error.h"
#include "io/hdf5_util.h"

namespace proplab {

using io_detail::ErrorKind;
using io_detail::h5_check;
using io_detail::H5Guard;
using io_detail::H5Handle;

namespace {

constexpr const char* group_tensors = "/tensors";
constexpr const char* group_ints = "/int64";
constexpr const char* group_floats = "/float64";
constexpr const char* group_strings = "/strings";

template <typename Value>
const Value& lookup(const std::map<std::string, Value>& entries, const std::string& name, const char* kind) {
  const auto found = entries.find(name);
  if (found == entries.end()) {
    throw UserError(detail::concat("checkpoint has no ", kind, " '", name, "'"));
  }
  return found->second;
}

// Entry names become HDF5 paths below their group: non-empty, no empty or "."/".." components.
void check_entry_name(const std::string& name, const char* kind) {
  bool valid = !name.empty() && name.front() != '/' && name.back() != '/' && name.find("//") == std::string::npos;
  std::size_t start = 0;
  while (valid && start <= name.size()) {
    std::size_t end = name.find('/', start);
    if (end == std::string::npos) end = name.size();
    const std::string component = name.substr(start, end - start);
    valid = component != "." && component != "..";
    start = end + 1;
  }
  PROPLAB_CHECK(valid, "checkpoint ", kind, " name '", name, "' is a valid HDF5 path (non-empty components, ",
                "no leading or trailing '/', no '.' or '..')");
}

std::string join_names(const std::vector<std::string>& names) {
  if (names.empty()) return "none";
  std::string joined;
  const std::size_t shown = std::min<std::size_t>(names.size(), 12);
  for (std::size_t i = 0; i < shown; ++i) joined += (i == 0 ? "" : ", ") + names[i];
  if (shown < names.size()) joined += detail::concat(", ... (", names.size(), " in all)");
  return joined;
}

class CheckpointFileWriter {
 public:
  CheckpointFileWriter(hid_t file, std::string file_name) : file_(file), file_name_(std::move(file_name)) {
    link_properties_ = H5Handle(h5_check(H5Pcreate(H5P_LINK_CREATE), "H5Pcreate", file_name_));
    h5_check(H5Pset_create_intermediate_group(link_properties_.get(), 1), "H5Pset_create_intermediate_group",
             file_name_);
  }

  void group(const char* path) {
    H5Handle created(
        h5_check(H5Gcreate2(file_, path, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), "H5Gcreate2", file_name_, path));
    created.close(file_name_);
  }

  // A dataset of `file_type` with dataspace `space` holding `data` (as `memory_type`).
  void dataset(const std::string& path, hid_t file_type, hid_t memory_type, hid_t space, const void* data) {
    H5Handle created(
        h5_check(H5Dcreate2(file_, path.c_str(), file_type, space, link_properties_.get(), H5P_DEFAULT, H5P_DEFAULT),
                 "H5Dcreate2", file_name_, path));
    h5_check(H5Dwrite(created.get(), memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), "H5Dwrite", file_name_, path);
    created.close(file_name_);
  }

  void scalar(const std::string& path, hid_t file_type, hid_t memory_type, const void* data) {
    H5Handle space(h5_check(H5Screate(H5S_SCALAR), "H5Screate", file_name_, path));
    dataset(path, file_type, memory_type, space.get(), data);
  }

  void close() { link_properties_.close(file_name_); }

 private:
  hid_t file_;
  std::string file_name_;
  H5Handle link_properties_;
};

herr_t collect_dataset_name(hid_t /*object*/, const char* name, const H5O_info_t* info, void* client) {
  if (info->type == H5O_TYPE_DATASET) static_cast<std::vector<std::string>*>(client)->emplace_back(name);
  return 0;
}

// The checkpoint file open for reading, with its format checked.
struct CheckpointFileReader {
  std::string file_name;
  H5Handle file;

  explicit CheckpointFileReader(const std::filesystem::path& path) : file_name(path.string()) {
    std::error_code error;
    if (!std::filesystem::is_regular_file(path, error)) {
      throw UserError(detail::concat("checkpoint '", file_name, "' does not exist or is not a regular file"));
    }
    if (H5Fis_hdf5(file_name.c_str()) <= 0) {
      H5Eclear2(H5E_DEFAULT);
      throw UserError(detail::concat("'", file_name, "' is not an HDF5 file, so not a proplab checkpoint"));
    }
    file = H5Handle(
        h5_check(H5Fopen(file_name.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), "H5Fopen", file_name, "", ErrorKind::user));
    const std::string not_a_checkpoint = detail::concat("'", file_name, "' is not a proplab checkpoint (its root ",
                                                        "attribute 'format' is not \"", checkpoint_format_name, "\")");
    if (!io_detail::h5_has_attribute(file.get(), "format", file_name)) throw UserError(not_a_checkpoint);
    if (io_detail::h5_read_string_attribute(file.get(), "format", file_name) != checkpoint_format_name) {
      throw UserError(not_a_checkpoint);
    }
    const std::int64_t version = io_detail::h5_read_int_attribute(file.get(), "format_version", file_name);
    if (version != checkpoint_format_version) {
      throw UserError(detail::concat("checkpoint '", file_name, "' has format_version ", version,
                                     "; this build of proplab reads format_version ", checkpoint_format_version));
    }
  }

  // Names (relative to `group`) of every dataset below it; empty when the group is missing.
  std::vector<std::string> dataset_names(const char* group) const {
    std::vector<std::string> names;
    if (!io_detail::h5_path_exists(file.get(), group, file_name)) return names;
    H5Handle opened(h5_check(H5Gopen2(file.get(), group, H5P_DEFAULT), "H5Gopen2", file_name, group));
    h5_check(H5Ovisit2(opened.get(), H5_INDEX_NAME, H5_ITER_INC, collect_dataset_name, &names, H5O_INFO_BASIC),
             "H5Ovisit2", file_name, group);
    return names;
  }

  H5Handle open(const std::string& path) const {
    return H5Handle(h5_check(H5Dopen2(file.get(), path.c_str(), H5P_DEFAULT), "H5Dopen2", file_name, path));
  }

  H5T_class_t type_class(hid_t dataset, const std::string& path) const {
    H5Handle type(h5_check(H5Dget_type(dataset), "H5Dget_type", file_name, path));
    return h5_check(H5Tget_class(type.get()), "H5Tget_class", file_name, path);
  }

  Shape shape(hid_t dataset, const std::string& path) const {
    H5Handle space(h5_check(H5Dget_space(dataset), "H5Dget_space", file_name, path));
    const int rank = h5_check(H5Sget_simple_extent_ndims(space.get()), "H5Sget_simple_extent_ndims", file_name, path);
    std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
    if (rank > 0) {
      h5_check(H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr), "H5Sget_simple_extent_dims", file_name,
               path);
    }
    return Shape(dims.begin(), dims.end());
  }

  // Reads the float32 tensor at /tensors/<name> into a fresh CPU tensor, checking its shape if `expected`.
  Tensor tensor(const std::string& name, const Shape* expected) const {
    const std::string path = std::string(group_tensors) + "/" + name;
    H5Handle dataset = open(path);
    H5Handle type(h5_check(H5Dget_type(dataset.get()), "H5Dget_type", file_name, path));
    if (type_class(dataset.get(), path) != H5T_FLOAT || H5Tget_size(type.get()) != 4) {
      throw UserError(detail::concat("tensor '", name, "' in checkpoint '", file_name, "' is not float32"));
    }
    const Shape stored = shape(dataset.get(), path);
    if (expected != nullptr && stored != *expected) {
      throw UserError(detail::concat("tensor '", name, "' in checkpoint '", file_name, "' has shape ",
                                     shape_string(stored), " but the model expects ", shape_string(*expected)));
    }
    Tensor result = Tensor::empty(stored, DType::f32, Device::cpu);
    if (result.numel() > 0) {
      h5_check(H5Dread(dataset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, result.f32()), "H5Dread",
               file_name, path);
    }
    return result;
  }

  void scalars(Checkpoint& checkpoint) const {
    for (const std::string& name : dataset_names(group_ints)) {
      const std::string path = std::string(group_ints) + "/" + name;
      H5Handle dataset = open(path);
      if (type_class(dataset.get(), path) != H5T_INTEGER) {
        throw UserError(detail::concat("'", path, "' in checkpoint '", file_name, "' is not an integer"));
      }
      std::int64_t value = 0;
      h5_check(H5Dread(dataset.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, &value), "H5Dread", file_name,
               path);
      checkpoint.ints[name] = value;
    }
    for (const std::string& name : dataset_names(group_floats)) {
      const std::string path = std::string(group_floats) + "/" + name;
      H5Handle dataset = open(path);
      if (type_class(dataset.get(), path) != H5T_FLOAT) {
        throw UserError(detail::concat("'", path, "' in checkpoint '", file_name, "' is not a float"));
      }
      double value = 0;
      h5_check(H5Dread(dataset.get(), H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, &value), "H5Dread", file_name,
               path);
      checkpoint.floats[name] = value;
    }
    for (const std::string& name : dataset_names(group_strings)) {
      const std::string path = std::string(group_strings) + "/" + name;
      H5Handle dataset = open(path);
      const auto values = io_detail::h5_read_string_dataset(dataset.get(), file_name, path);
      if (values.size() != 1) {
        throw UserError(detail::concat("'", path, "' in checkpoint '", file_name, "' is not a single string"));
      }
      checkpoint.strings[name] = values[0];
    }
  }
};

}  // namespace

std::int64_t Checkpoint::int_value(const std::string& name) const { return lookup(ints, name, "int64 scalar"); }
double Checkpoint::float_value(const std::string& name) const { return lookup(floats, name, "float64 scalar"); }
const std::string& Checkpoint::string_value(const std::string& name) const { return lookup(strings, name, "string"); }

void save_checkpoint(const std::filesystem::path& path, const Checkpoint& checkpoint) {
  const std::string file_name = path.string();
  for (const auto& [name, tensor] : checkpoint.tensors) {
    check_entry_name(name, "tensor");
    PROPLAB_CHECK(tensor.defined() && tensor.dtype() == DType::f32, "checkpoint tensor '", name,
                  "' is a defined f32 tensor");
    PROPLAB_CHECK(tensor.is_contiguous(), "checkpoint tensor '", name, "' is contiguous");
  }
  for (const auto& entry : checkpoint.ints) check_entry_name(entry.first, "int64");
  for (const auto& entry : checkpoint.floats) check_entry_name(entry.first, "float64");
  for (const auto& entry : checkpoint.strings) check_entry_name(entry.first, "string");

  // (the folder is not made again when it is missing: a run whose folder vanished must notice)
  std::error_code error;
  const std::string temporary = file_name + ".tmp";
  H5Guard guard;
  try {
    H5Handle file(h5_check(H5Fcreate(temporary.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), "H5Fcreate",
                           temporary, "", ErrorKind::write));
    io_detail::h5_write_string_attribute(file.get(), "format", checkpoint_format_name,
                                         std::char_traits<char>::length(checkpoint_format_name), temporary);
    io_detail::h5_write_int_attribute(file.get(), "format_version", checkpoint_format_version, temporary);
    CheckpointFileWriter writer(file.get(), temporary);
    for (const char* group : {group_tensors, group_ints, group_floats, group_strings}) writer.group(group);
    for (const auto& [name, tensor] : checkpoint.tensors) {
      const Tensor host = tensor.device() == Device::cpu ? tensor : tensor.to(Device::cpu);
      const Shape& shape = host.shape();
      H5Handle space;
      if (shape.empty()) {
        space = H5Handle(h5_check(H5Screate(H5S_SCALAR), "H5Screate", temporary, name));
      } else {
        const std::vector<hsize_t> dims(shape.begin(), shape.end());
        space = H5Handle(h5_check(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                                  "H5Screate_simple", temporary, name));
      }
      writer.dataset(std::string(group_tensors) + "/" + name, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, space.get(),
                     host.f32());
    }
    for (const auto& [name, value] : checkpoint.ints) {
      writer.scalar(std::string(group_ints) + "/" + name, H5T_STD_I64LE, H5T_NATIVE_INT64, &value);
    }
    for (const auto& [name, value] : checkpoint.floats) {
      writer.scalar(std::string(group_floats) + "/" + name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &value);
    }
    for (const auto& [name, value] : checkpoint.strings) {
      H5Handle type = io_detail::h5_string_type(value.size(), temporary);
      std::string padded = value;
      padded.resize(std::max<std::size_t>(value.size(), 1), '\0');
      writer.scalar(std::string(group_strings) + "/" + name, type.get(), type.get(), padded.data());
    }
    writer.close();
    file.close(temporary);
    io_detail::fsync_path(temporary, false);
    if (std::rename(temporary.c_str(), file_name.c_str()) != 0) throw IoError(file_name, errno);
    const std::filesystem::path directory = path.has_parent_path() ? path.parent_path() : ".";
    io_detail::fsync_path(directory.string(), true);
  } catch (...) {
    std::filesystem::remove(temporary, error);
    throw;
  }
}

Checkpoint read_checkpoint(const std::filesystem::path& path) {
  H5Guard guard;
  CheckpointFileReader reader(path);
  Checkpoint checkpoint;
  for (const std::string& name : reader.dataset_names(group_tensors)) {
    checkpoint.tensors.emplace(name, reader.tensor(name, nullptr));
  }
  reader.scalars(checkpoint);
  return checkpoint;
}

Checkpoint load_checkpoint(const std::filesystem::path& path, const std::map<std::string, Tensor>& targets,
                           const std::map<std::string, Tensor>& optional,
                           const std::vector<std::string>& skipped_prefixes) {
  H5Guard guard;
  CheckpointFileReader reader(path);
  const std::vector<std::string> stored = reader.dataset_names(group_tensors);
  const std::set<std::string> stored_set(stored.begin(), stored.end());
  for (const auto& [name, target] : targets) {
    if (stored_set.count(name) == 0) {
      throw UserError(detail::concat("checkpoint '", reader.file_name, "' has no tensor '", name,
                                     "' (it holds: ", join_names(stored), ")"));
    }
  }
  auto skipped = [&](const std::string& name) {
    for (const std::string& prefix : skipped_prefixes)
      if (name.rfind(prefix, 0) == 0) return true;
    return false;
  };
  for (const std::string& name : stored) {
    if (targets.count(name) == 0 && optional.count(name) == 0 && !skipped(name)) {
      throw UserError(detail::concat("checkpoint '", reader.file_name, "' holds tensor '", name,
                                     "', which the model does not have (was it saved from another model?)"));
    }
  }
  // Every shape is checked before any target is written, so a mismatch leaves the targets untouched.
  for (const auto& [name, target] : targets) {
    const std::string dataset_path = std::string(group_tensors) + "/" + name;
    H5Handle dataset = reader.open(dataset_path);
    const Shape shape = reader.shape(dataset.get(), dataset_path);
    if (shape != target.shape()) {
      throw UserError(detail::concat("tensor '", name, "' in checkpoint '", reader.file_name, "' has shape ",
                                     shape_string(shape), " but the model expects ", shape_string(target.shape())));
    }
  }
  Checkpoint checkpoint;
  for (const auto& [name, target] : targets) {
    PROPLAB_CHECK(target.dtype() == DType::f32 && target.is_contiguous(), "checkpoint target '", name,
                  "' is a contiguous f32 tensor");
    const Tensor host = reader.tensor(name, &target.shape());
    Tensor filled = target;  // shares the caller's storage
    filled.copy_from(host);
    checkpoint.tensors.emplace(name, filled);
  }
  for (const auto& [name, target] : optional) {
    if (stored_set.count(name) == 0 || targets.count(name) != 0) continue;
    const std::string dataset_path = std::string(group_tensors) + "/" + name;
    H5Handle dataset = reader.open(dataset_path);
    if (reader.shape(dataset.get(), dataset_path) != target.shape()) continue;
    PROPLAB_CHECK(target.dtype() == DType::f32 && target.is_contiguous(), "checkpoint target '", name,
                  "' is a contiguous f32 tensor");
    const Tensor host = reader.tensor(name, &target.shape());
    Tensor filled = target;
    filled.copy_from(host);
    checkpoint.tensors.emplace(name, filled);
  }
  reader.scalars(checkpoint);
  return checkpoint;
}

}  // namespace proplab
