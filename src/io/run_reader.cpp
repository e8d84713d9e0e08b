#include "io/run_reader.h"

#include <algorithm>
#include <system_error>

#include "core/error.h"
#include "io/hdf5_util.h"

namespace proplab {

using io_detail::ErrorKind;
using io_detail::h5_check;
using io_detail::H5Guard;
using io_detail::H5Handle;

struct RunReader::Impl {
  std::filesystem::path path;
  std::string file_name;
  H5Handle file;
  bool swmr = false;

  // The root group, refreshed in SWMR mode so its attributes are re-read from the file (finish() rewrites
  // status, status_detail and end_time while a reader may be open).
  H5Handle root() const {
    H5Handle group(h5_check(H5Gopen2(file.get(), "/", H5P_DEFAULT), "H5Gopen2", file_name, "/"));
    if (swmr) h5_check(H5Grefresh(group.get()), "H5Grefresh", file_name, "/");
    return group;
  }

  // Opens a dataset (refreshed in SWMR mode); UserError when it is missing or not a dataset.
  H5Handle open_dataset(const std::string& dataset_path) const {
    if (!io_detail::h5_path_exists(file.get(), dataset_path, file_name)) {
      throw UserError(detail::concat("run file '", file_name, "' has no dataset '", dataset_path, "'"));
    }
    H5O_info_t info;
    h5_check(H5Oget_info_by_name2(file.get(), dataset_path.c_str(), &info, H5O_INFO_BASIC, H5P_DEFAULT),
             "H5Oget_info_by_name2", file_name, dataset_path);
    if (info.type != H5O_TYPE_DATASET) {
      throw UserError(detail::concat("'", dataset_path, "' in run file '", file_name, "' is not a dataset"));
    }
    H5Handle dataset(
        h5_check(H5Dopen2(file.get(), dataset_path.c_str(), H5P_DEFAULT), "H5Dopen2", file_name, dataset_path));
    if (swmr) h5_check(H5Drefresh(dataset.get()), "H5Drefresh", file_name, dataset_path);
    return dataset;
  }

  std::vector<hsize_t> shape_of(hid_t dataset, const std::string& dataset_path) const {
    H5Handle space(h5_check(H5Dget_space(dataset), "H5Dget_space", file_name, dataset_path));
    const int rank =
        h5_check(H5Sget_simple_extent_ndims(space.get()), "H5Sget_simple_extent_ndims", file_name, dataset_path);
    std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
    if (rank > 0) {
      h5_check(H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr), "H5Sget_simple_extent_dims", file_name,
               dataset_path);
    }
    return dims;
  }

  H5T_class_t type_class(hid_t dataset, const std::string& dataset_path) const {
    H5Handle type(h5_check(H5Dget_type(dataset), "H5Dget_type", file_name, dataset_path));
    return h5_check(H5Tget_class(type.get()), "H5Tget_class", file_name, dataset_path);
  }

  void require_rank(const std::vector<hsize_t>& dims, std::size_t rank, const std::string& dataset_path) const {
    if (dims.size() != rank) {
      throw UserError(detail::concat("dataset '", dataset_path, "' in run file '", file_name, "' has rank ",
                                     dims.size(), ", expected ", rank));
    }
  }

  // Reads all of a numeric dataset into `buffer` (sized by the caller) as `memory_type`.
  void read_all(hid_t dataset, hid_t memory_type, void* buffer, const std::string& dataset_path) const {
    h5_check(H5Dread(dataset, memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buffer), "H5Dread", file_name, dataset_path);
  }

  std::vector<double> read_doubles(const std::string& dataset_path) const {
    H5Handle dataset = open_dataset(dataset_path);
    const auto dims = shape_of(dataset.get(), dataset_path);
    require_rank(dims, 1, dataset_path);
    const H5T_class_t kind = type_class(dataset.get(), dataset_path);
    if (kind != H5T_FLOAT && kind != H5T_INTEGER) {
      throw UserError(detail::concat("dataset '", dataset_path, "' in run file '", file_name, "' is not numeric"));
    }
    std::vector<double> values(dims[0]);
    if (!values.empty()) read_all(dataset.get(), H5T_NATIVE_DOUBLE, values.data(), dataset_path);
    return values;
  }

  std::vector<std::int64_t> read_ints(const std::string& dataset_path) const {
    H5Handle dataset = open_dataset(dataset_path);
    const auto dims = shape_of(dataset.get(), dataset_path);
    require_rank(dims, 1, dataset_path);
    if (type_class(dataset.get(), dataset_path) != H5T_INTEGER) {
      throw UserError(
          detail::concat("dataset '", dataset_path, "' in run file '", file_name, "' is not an integer dataset"));
    }
    std::vector<std::int64_t> values(dims[0]);
    if (!values.empty()) read_all(dataset.get(), H5T_NATIVE_INT64, values.data(), dataset_path);
    return values;
  }
};

RunReader::RunReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RunReader::RunReader(RunReader&& other) noexcept = default;
RunReader& RunReader::operator=(RunReader&& other) noexcept = default;
RunReader::~RunReader() = default;

namespace {

hid_t open_file(const std::string& file_name, bool swmr) {
  const unsigned flags = swmr ? (H5F_ACC_RDONLY | H5F_ACC_SWMR_READ) : H5F_ACC_RDONLY;
  return h5_check(H5Fopen(file_name.c_str(), flags, H5P_DEFAULT), swmr ? "H5Fopen (SWMR read)" : "H5Fopen", file_name,
                  "", ErrorKind::user);
}

}  // namespace

RunReader RunReader::open(const std::filesystem::path& path, RunOpenMode mode) {
  const std::string file_name = path.string();
  std::error_code error;
  if (!std::filesystem::exists(path, error)) {
    throw UserError(detail::concat("run file '", file_name, "' does not exist"));
  }
  if (!std::filesystem::is_regular_file(path, error)) {
    throw UserError(detail::concat("run file '", file_name, "' is not a regular file"));
  }
  H5Guard guard;
  const htri_t is_hdf5 = H5Fis_hdf5(file_name.c_str());
  if (is_hdf5 == 0) {
    throw UserError(detail::concat("'", file_name, "' is not an HDF5 file, so not a proplab run file"));
  }
  // A negative answer (e.g. the file is locked by a writer) is left to the open below to report.
  H5Eclear2(H5E_DEFAULT);

  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->file_name = file_name;
  switch (mode) {
    case RunOpenMode::normal:
      impl->file = H5Handle(open_file(file_name, false));
      break;
    case RunOpenMode::swmr:
      impl->file = H5Handle(open_file(file_name, true));
      impl->swmr = true;
      break;
    case RunOpenMode::automatic:
      try {
        impl->file = H5Handle(open_file(file_name, false));
      } catch (const UserError& plain_failure) {
        // Still open for write (or left so by a killed writer): SWMR-read sees every flushed record.
        try {
          impl->file = H5Handle(open_file(file_name, true));
          impl->swmr = true;
        } catch (const UserError&) {
          throw plain_failure;
        }
      }
      break;
  }

  const hid_t root = impl->file.get();
  io_detail::require_run_format(root, file_name);
  return RunReader(std::move(impl));
}

const std::filesystem::path& RunReader::path() const { return impl_->path; }
bool RunReader::swmr() const { return impl_->swmr; }

std::string RunReader::attribute_string(const std::string& name) const {
  H5Guard guard;
  return io_detail::h5_read_string_attribute(impl_->root().get(), name, impl_->file_name);
}

std::int64_t RunReader::attribute_int(const std::string& name) const {
  H5Guard guard;
  return io_detail::h5_read_int_attribute(impl_->root().get(), name, impl_->file_name);
}

bool RunReader::has_attribute(const std::string& name) const {
  H5Guard guard;
  return io_detail::h5_has_attribute(impl_->root().get(), name, impl_->file_name);
}

std::vector<std::string> RunReader::attribute_names() const {
  H5Guard guard;
  return io_detail::h5_attribute_names(impl_->root().get(), impl_->file_name);
}

std::string RunReader::attribute_string(const std::string& object_path, const std::string& name) const {
  H5Guard guard;
  const std::string& file_name = impl_->file_name;
  if (!io_detail::h5_path_exists(impl_->file.get(), object_path, file_name)) {
    throw UserError(detail::concat("run file '", file_name, "' has no object '", object_path, "'"));
  }
  H5Handle object(
      h5_check(H5Oopen(impl_->file.get(), object_path.c_str(), H5P_DEFAULT), "H5Oopen", file_name, object_path));
  if (impl_->swmr) h5_check(H5Orefresh(object.get()), "H5Orefresh", file_name, object_path);
  return io_detail::h5_read_string_attribute(object.get(), name, file_name);
}

RunStatus RunReader::status() const { return parse_run_status(attribute_string("status")); }

bool RunReader::exists(const std::string& path) const {
  H5Guard guard;
  return io_detail::h5_path_exists(impl_->file.get(), path, impl_->file_name);
}

namespace {
herr_t collect_link_name(hid_t /*group*/, const char* name, const H5L_info_t* /*info*/, void* client) {
  static_cast<std::vector<std::string>*>(client)->emplace_back(name);
  return 0;
}
}  // namespace

std::vector<std::string> RunReader::list(const std::string& group_path) const {
  H5Guard guard;
  const std::string& file_name = impl_->file_name;
  if (!io_detail::h5_path_exists(impl_->file.get(), group_path, file_name)) {
    throw UserError(detail::concat("run file '", file_name, "' has no group '", group_path, "'"));
  }
  H5Handle group(h5_check(H5Gopen2(impl_->file.get(), group_path.c_str(), H5P_DEFAULT), "H5Gopen2", file_name,
                          group_path, ErrorKind::user));
  std::vector<std::string> names;
  hsize_t index = 0;
  h5_check(H5Literate(group.get(), H5_INDEX_NAME, H5_ITER_INC, &index, collect_link_name, &names), "H5Literate",
           file_name, group_path);
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<std::int64_t> RunReader::dataset_shape(const std::string& path) const {
  H5Guard guard;
  H5Handle dataset = impl_->open_dataset(path);
  const auto dims = impl_->shape_of(dataset.get(), path);
  return std::vector<std::int64_t>(dims.begin(), dims.end());
}

std::vector<double> RunReader::read_doubles(const std::string& path) const {
  H5Guard guard;
  return impl_->read_doubles(path);
}

std::vector<std::int64_t> RunReader::read_ints(const std::string& path) const {
  H5Guard guard;
  return impl_->read_ints(path);
}

Dataset2D RunReader::read_2d(const std::string& path) const {
  H5Guard guard;
  H5Handle dataset = impl_->open_dataset(path);
  const auto dims = impl_->shape_of(dataset.get(), path);
  impl_->require_rank(dims, 2, path);
  const H5T_class_t kind = impl_->type_class(dataset.get(), path);
  if (kind != H5T_FLOAT && kind != H5T_INTEGER) {
    throw UserError(detail::concat("dataset '", path, "' in run file '", impl_->file_name, "' is not numeric"));
  }
  Dataset2D result;
  result.rows = static_cast<std::int64_t>(dims[0]);
  result.columns = static_cast<std::int64_t>(dims[1]);
  result.values.resize(dims[0] * dims[1]);
  if (!result.values.empty()) impl_->read_all(dataset.get(), H5T_NATIVE_DOUBLE, result.values.data(), path);
  return result;
}

std::vector<std::string> RunReader::read_strings(const std::string& path) const {
  H5Guard guard;
  H5Handle dataset = impl_->open_dataset(path);
  impl_->require_rank(impl_->shape_of(dataset.get(), path), 1, path);
  return io_detail::h5_read_string_dataset(dataset.get(), impl_->file_name, path);
}

TrainCurves RunReader::read_train() const {
  H5Guard guard;
  TrainCurves curves;
  curves.step = impl_->read_ints("/train/step");
  curves.loss = impl_->read_doubles("/train/loss");
  curves.lr = impl_->read_doubles("/train/lr");
  curves.grad_norm = impl_->read_doubles("/train/grad_norm");
  curves.tokens_per_s = impl_->read_doubles("/train/tokens_per_s");
  curves.wall_time = impl_->read_doubles("/train/wall_time");
  const std::size_t rows = std::min({curves.step.size(), curves.loss.size(), curves.lr.size(), curves.grad_norm.size(),
                                     curves.tokens_per_s.size(), curves.wall_time.size()});
  curves.step.resize(rows);
  for (auto* column : {&curves.loss, &curves.lr, &curves.grad_norm, &curves.tokens_per_s, &curves.wall_time}) {
    column->resize(rows);
  }
  return curves;
}

EvalCurves RunReader::read_eval() const {
  H5Guard guard;
  EvalCurves curves;
  curves.step = impl_->read_ints("/eval/step");
  curves.loss = impl_->read_doubles("/eval/loss");
  const std::size_t rows = std::min(curves.step.size(), curves.loss.size());
  curves.step.resize(rows);
  curves.loss.resize(rows);
  return curves;
}

std::vector<RunBlock> RunReader::read_block_layout() const {
  H5Guard guard;
  const std::string& file_name = impl_->file_name;
  if (!io_detail::h5_path_exists(impl_->file.get(), "/blocks", file_name)) return {};
  for (const char* path : {"/blocks/stage", "/blocks/transition"}) {
    if (!io_detail::h5_path_exists(impl_->file.get(), path, file_name))
      throw UserError(detail::concat("run file '", file_name, "' has /blocks but no '", path,
                                     "'; a stage layout needs both /blocks/stage and /blocks/transition"));
  }
  const std::vector<std::int64_t> stages = impl_->read_ints("/blocks/stage");
  const std::vector<std::int64_t> transitions = impl_->read_ints("/blocks/transition");
  if (stages.size() != transitions.size())
    throw UserError(detail::concat("run file '", file_name, "': /blocks/stage has ", stages.size(),
                                   " entries but /blocks/transition has ", transitions.size(),
                                   "; both need one entry per block"));
  std::vector<RunBlock> blocks(stages.size());
  for (std::size_t b = 0; b < stages.size(); ++b) {
    if (stages[b] < 0 || (b > 0 && stages[b] < stages[b - 1]))
      throw UserError(detail::concat("run file '", file_name, "': /blocks/stage[", b, "] = ", stages[b],
                                     "; allowed: stages >= 0 that never decrease along the blocks"));
    if (transitions[b] != 0 && transitions[b] != 1)
      throw UserError(detail::concat("run file '", file_name, "': /blocks/transition[", b, "] = ", transitions[b],
                                     "; allowed: 0 or 1"));
    blocks[b] = RunBlock{stages[b], transitions[b] == 1};
  }
  return blocks;
}

}  // namespace proplab
