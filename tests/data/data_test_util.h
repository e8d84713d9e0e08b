// Helpers shared by the data module's tests: token batches, scratch files, the repository's data/ folder.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/tensor.h"
#include "data/dataset.h"

namespace proplab::testing {

struct TokenBatch {
  Tensor inputs;
  Tensor targets;
  std::vector<std::int32_t> input_ids() const { return {inputs.i32(), inputs.i32() + inputs.numel()}; }
  std::vector<std::int32_t> target_ids() const { return {targets.i32(), targets.i32() + targets.numel()}; }
};

inline TokenBatch token_batch(const TokenDataset& data, Split split, std::int64_t index, std::int64_t rows) {
  TokenBatch batch{Tensor::empty({rows, data.seq_len()}, DType::i32),
                   Tensor::empty({rows, data.seq_len()}, DType::i32)};
  data.batch(split, index, batch.inputs, batch.targets);
  return batch;
}

// The repository root: PROPLAB_SOURCE_DIR (set by ctest), else found from this file's path.
inline std::filesystem::path source_dir() {
  if (const char* dir = std::getenv("PROPLAB_SOURCE_DIR")) return dir;
  return std::filesystem::path(__FILE__).parent_path().parent_path().parent_path();
}

// A scratch folder removed at the end of the test.
class ScratchDir {
 public:
  ScratchDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() / (std::string("proplab_data_") + info->test_suite_name() + "_" +
                                                      info->name() + "_" + std::to_string(::getpid()));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  // Writes `bytes` to a file named `name` in the folder and returns its path.
  std::string write(const std::string& name, const std::string& bytes) const {
    const auto file = path_ / name;
    std::ofstream out(file, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return file.string();
  }
  std::string path(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// Little-endian bytes of uint16 ids.
inline std::string uint16_bytes(const std::vector<std::uint32_t>& ids) {
  std::string out;
  for (std::uint32_t id : ids) {
    out.push_back(static_cast<char>(id & 0xff));
    out.push_back(static_cast<char>((id >> 8) & 0xff));
  }
  return out;
}

// llm.c's header: 256 little-endian int32 (magic, version, token count, zeros).
inline std::string llmc_header(std::uint32_t magic, std::uint32_t version, std::uint32_t count) {
  std::string out(1024, '\0');
  const std::uint32_t words[3] = {magic, version, count};
  for (int w = 0; w < 3; ++w)
    for (int b = 0; b < 4; ++b) out[w * 4 + b] = static_cast<char>((words[w] >> (8 * b)) & 0xff);
  return out;
}

}  // namespace proplab::testing
