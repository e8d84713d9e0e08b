// Shared by the GUI tests: scratch directories, small files that are not proplab runs, and a child process that
// writes a run file while the test reads it.
#pragma once

#include <gtest/gtest.h>
#include <hdf5.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "io/hdf5_util.h"
#include "io/io_test_support.h"

namespace proplab::gui_test {

namespace fs = std::filesystem;
using io_test::ScratchDirectory;

inline void write_text_file(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

// An HDF5 file with the given root attributes (format / format_version may be left out with empty / 0). Under the
// process-wide HDF5 lock (io/hdf5_util.h): a RunLibrary worker thread may be reading other files meanwhile.
inline void write_hdf5_with_attributes(const fs::path& path, const std::string& format, long long format_version) {
  const io_detail::H5Guard guard;
  const hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(file, 0) << "H5Fcreate " << path;
  const hid_t scalar = H5Screate(H5S_SCALAR);
  if (!format.empty()) {
    const hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, format.size());
    const hid_t attribute = H5Acreate2(file, "format", type, scalar, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(attribute, type, format.data());
    H5Aclose(attribute);
    H5Tclose(type);
  }
  if (format_version != 0) {
    const hid_t attribute = H5Acreate2(file, "format_version", H5T_STD_I64LE, scalar, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(attribute, H5T_NATIVE_LLONG, &format_version);
    H5Aclose(attribute);
  }
  H5Sclose(scalar);
  H5Fclose(file);
}

}  // namespace proplab::gui_test
