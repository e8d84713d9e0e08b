// io/checkpoint: saves and restores training state as one HDF5 file.
//
// Layout: root attributes format = "proplab-checkpoint", format_version = 1;
//   /tensors/<name>  float32 dataset with the tensor's shape (a name may contain '/': nested groups)
//   /int64/<name>    scalar int64 dataset (step, data position, RNG seed, ...)
//   /float64/<name>  scalar float64 dataset (learnable scalars, loss scale, ...)
//   /strings/<name>  scalar fixed-length UTF-8 string dataset (config text, ...)
//
// Invariants:
// - Round trips are exact: float32 tensors and float64/int64 scalars are stored in their own types, bit for bit.
// - save_checkpoint writes `<path>.tmp`, fsyncs it, renames it over `path` and fsyncs the directory, so a crash
//   leaves either the previous checkpoint or the new one, never half of one. A save the operating system refuses
//   (no space, quota, read-only or vanished directory) throws IoError after removing `<path>.tmp`: the previous
//   checkpoint stays as it was.
// - load_checkpoint checks the caller's expectations: every expected tensor must be present with the expected
//   shape, and the file may hold no tensor the caller did not expect (UserError naming the tensor and, for a
//   shape mismatch, both shapes) — except the optional ones and those under prefixes the caller says to skip.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace proplab {

inline constexpr const char* checkpoint_format_name = "proplab-checkpoint";
inline constexpr std::int64_t checkpoint_format_version = 1;

struct Checkpoint {
  std::map<std::string, Tensor> tensors;  // f32; any device and layout on save; contiguous CPU after read
  std::map<std::string, std::int64_t> ints;
  std::map<std::string, double> floats;
  std::map<std::string, std::string> strings;

  // Lookups that throw UserError naming the missing entry and the checkpoint it was looked for in.
  std::int64_t int_value(const std::string& name) const;
  double float_value(const std::string& name) const;
  const std::string& string_value(const std::string& name) const;
};

// Writes `checkpoint` atomically to `path`, whose folder must exist. IoError when a write is refused (a missing
// folder included).
void save_checkpoint(const std::filesystem::path& path, const Checkpoint& checkpoint);

// Reads everything in the checkpoint as is (for inspection); tensors come back as fresh CPU tensors.
Checkpoint read_checkpoint(const std::filesystem::path& path);

// Restores into the caller's tensors: `targets` names every tensor expected, each already allocated with the
// expected shape (f32, any device); they are filled in place. Returns the scalars and strings (its `tensors`
// map refers to the filled targets).
// `optional` tensors are filled only when the file holds them with the expected shape (they appear in the
// returned `tensors` map only then); stored tensors whose names start with one of `skipped_prefixes` and that are
// not targets are left unread instead of refused.
Checkpoint load_checkpoint(const std::filesystem::path& path, const std::map<std::string, Tensor>& targets,
                           const std::map<std::string, Tensor>& optional = {},
                           const std::vector<std::string>& skipped_prefixes = {});

}  // namespace proplab
