// text and tokens data: loading good files, the splits, and every kind of bad file (the message names the path).
#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include "core/error.h"
#include "data/dataset.h"
#include "data_test_util.h"

namespace proplab {
namespace {

using testing::llmc_header;
using testing::ScratchDir;
using testing::source_dir;
using testing::token_batch;
using testing::uint16_bytes;

DataConfig file_config(const std::string& kind, const std::string& path, double val_fraction = 0.1) {
  DataConfig config;
  config.kind = kind;
  config.path = path;
  config.val_fraction = val_fraction;
  return config;
}

// The UserError message from building the dataset; fails the test when it builds.
std::string load_error(const DataConfig& config, int vocab = 256, int seq_len = 8) {
  try {
    make_token_dataset(config, vocab, seq_len, 1);
  } catch (const UserError& e) {
    return e.what();
  }
  ADD_FAILURE() << "loading '" << config.path << "' should have failed";
  return "";
}

void expect_mentions(const std::string& message, const std::string& part) {
  EXPECT_NE(message.find(part), std::string::npos) << "'" << message << "' should mention '" << part << "'";
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

TEST(TextData, WindowsAreSubstringsOfTheirSplit) {
  ScratchDir dir;
  std::string text;
  for (int i = 0; i < 200; ++i) text += "line " + std::to_string(i) + " of a small text file\n";
  const auto path = dir.write("small.txt", text);
  auto data = make_token_dataset(file_config("text", path, 0.25), 0, 16, 3);
  EXPECT_EQ(data->vocab(), 256);
  EXPECT_FALSE(data->entropy_rate().has_value());
  const auto train_end = static_cast<std::size_t>(std::floor(0.75 * text.size()));
  for (Split split : {Split::train, Split::validation}) {
    const std::string region = split == Split::train ? text.substr(0, train_end) : text.substr(train_end);
    std::set<std::string> windows;
    for (std::int64_t index = 0; index < 4; ++index) {
      const auto batch = token_batch(*data, split, index, 8);
      for (int b = 0; b < 8; ++b) {
        std::string window;
        for (int t = 0; t < 16; ++t) window.push_back(static_cast<char>(batch.inputs.i32()[b * 16 + t]));
        window.push_back(static_cast<char>(batch.targets.i32()[b * 16 + 15]));
        EXPECT_NE(region.find(window), std::string::npos)
            << split_name(split) << " window '" << window << "' is not inside its split";
        windows.insert(window);
      }
    }
    EXPECT_GT(windows.size(), 20u) << "windows should start at many positions";
  }
}

// The file gzip-compressed, as zlib writes it (a .gz; dictd's .dz is the same stream with an index in its header).
std::string gzip_file(const ScratchDir& dir, const std::string& name, const std::string& bytes) {
  const std::string path = dir.path(name);
  gzFile file = gzopen(path.c_str(), "wb");
  EXPECT_NE(file, nullptr);
  EXPECT_EQ(gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  EXPECT_EQ(gzclose(file), Z_OK);
  return path;
}

TEST(TextData, GzipFilesAreReadDecompressed) {
  ScratchDir dir;
  std::string text;
  for (int i = 0; i < 300; ++i) text += "sentence " + std::to_string(i) + " of a text read through zlib\n";
  const auto plain = make_token_dataset(file_config("text", dir.write("t.txt", text)), 0, 16, 7);
  const auto packed = make_token_dataset(file_config("text", gzip_file(dir, "t.txt.gz", text)), 0, 16, 7);
  ASSERT_LT(read_file(dir.path("t.txt.gz")).size(), text.size() / 2) << "the test file should be compressed";
  EXPECT_EQ(packed->vocab(), 256);
  expect_mentions(packed->describe(), "(gzip)");
  expect_mentions(packed->describe(), std::to_string(text.size()) + " tokens");
  // The same tokens, so the same batches as the plain file, in both splits.
  for (Split split : {Split::train, Split::validation}) {
    for (std::int64_t index = 0; index < 5; ++index) {
      EXPECT_EQ(token_batch(*packed, split, index, 8).input_ids(), token_batch(*plain, split, index, 8).input_ids());
      EXPECT_EQ(token_batch(*packed, split, index, 8).target_ids(), token_batch(*plain, split, index, 8).target_ids());
    }
  }
  // A truncated stream is an error naming the file, not a shorter text.
  const std::string whole = read_file(dir.path("t.txt.gz"));
  const auto cut = dir.write("cut.txt.gz", whole.substr(0, whole.size() / 2));
  const auto message = load_error(file_config("text", cut));
  expect_mentions(message, cut);
  expect_mentions(message, "gzip");
}

TEST(TextData, ValidationSplitIsDisjointFromTrain) {
  ScratchDir dir;
  const auto path = dir.write("ab.txt", std::string(900, 'a') + std::string(100, 'b'));
  auto data = make_token_dataset(file_config("text", path, 0.1), 256, 32, 5);
  for (std::int64_t index = 0; index < 50; ++index) {
    for (std::int32_t id : token_batch(*data, Split::train, index, 16).input_ids()) ASSERT_EQ(id, 'a');
    const auto validation = token_batch(*data, Split::validation, index, 16);
    for (std::int32_t id : validation.input_ids()) ASSERT_EQ(id, 'b');
    for (std::int32_t id : validation.target_ids()) ASSERT_EQ(id, 'b');
  }
}

TEST(TextData, BytesAboveTheModelVocabAreUserErrors) {
  ScratchDir dir;
  const auto path = dir.write("z.txt", std::string(300, 'a') + "z" + std::string(300, 'a'));
  const auto message = load_error(file_config("text", path), 100);
  expect_mentions(message, path);
  expect_mentions(message, "122");  // 'z'
  expect_mentions(message, "position 300");
  EXPECT_EQ(make_token_dataset(file_config("text", path), 123, 8, 1)->vocab(), 123);
}

TEST(TokenData, VocabComesFromTheModelOrTheData) {
  ScratchDir dir;
  std::vector<std::uint32_t> ids;
  for (int i = 0; i < 500; ++i) ids.push_back(static_cast<std::uint32_t>((i * 37) % 1000));
  ids[123] = 1000;
  const auto path = dir.write("ids.bin", uint16_bytes(ids));
  auto from_data = make_token_dataset(file_config("tokens", path), 0, 8, 1);
  EXPECT_EQ(from_data->vocab(), 1001);
  EXPECT_EQ(make_token_dataset(file_config("tokens", path), 4096, 8, 1)->vocab(), 4096);

  const auto message = load_error(file_config("tokens", path), 512);
  expect_mentions(message, path);
  expect_mentions(message, "token id 518");  // the first id >= 512: (14 * 37) % 1000
  expect_mentions(message, "uint16");

  // Windows read the ids back in order (little-endian decoding).
  const auto batch = token_batch(*from_data, Split::train, 0, 4);
  for (int b = 0; b < 4; ++b) {
    const std::int32_t* row = batch.inputs.i32() + b * 8;
    const auto start = std::find(ids.begin(), ids.end(), static_cast<std::uint32_t>(row[0])) - ids.begin();
    for (int t = 0; t < 8; ++t) EXPECT_EQ(static_cast<std::uint32_t>(row[t]), ids[start + t]);
  }
}

TEST(TokenData, ReadsLlmcHeaderedFiles) {
  ScratchDir dir;
  std::vector<std::uint32_t> ids;
  for (int i = 0; i < 400; ++i) ids.push_back(static_cast<std::uint32_t>(50000 + i % 257));
  const auto path = dir.write("llmc.bin", llmc_header(20240520, 1, 400) + uint16_bytes(ids));
  auto data = make_token_dataset(file_config("tokens", path), 0, 8, 1);
  EXPECT_EQ(data->vocab(), 50257);  // the header's ints are not read as tokens
  expect_mentions(data->describe(), "llm.c header");
  for (std::int32_t id : token_batch(*data, Split::validation, 0, 16).input_ids()) EXPECT_GE(id, 50000);

  std::string wide = llmc_header(20240520, 2, 300);
  for (int i = 0; i < 300; ++i) {
    const std::uint32_t id = 100000 + i;
    for (int b = 0; b < 4; ++b) wide.push_back(static_cast<char>((id >> (8 * b)) & 0xff));
  }
  EXPECT_EQ(make_token_dataset(file_config("tokens", dir.write("wide.bin", wide)), 0, 8, 1)->vocab(), 100300);

  const auto truncated = dir.write("truncated.bin", llmc_header(20240520, 1, 401) + uint16_bytes(ids));
  expect_mentions(load_error(file_config("tokens", truncated), 0), truncated);
  const auto version = dir.write("version.bin", llmc_header(20240520, 7, 400) + uint16_bytes(ids));
  expect_mentions(load_error(file_config("tokens", version), 0), "version 7");
}

TEST(TokenFiles, BadFilesNameThePathAndFormat) {
  ScratchDir dir;
  const auto missing = dir.path("missing.bin");
  auto message = load_error(file_config("tokens", missing));
  expect_mentions(message, missing);
  expect_mentions(message, "not found");
  expect_mentions(message, "uint16");
  expect_mentions(load_error(file_config("text", missing)), "text");

  const auto odd = dir.write("odd.bin", std::string(1001, '\x01'));
  message = load_error(file_config("tokens", odd));
  expect_mentions(message, odd);
  expect_mentions(message, "odd");

  const auto empty = dir.write("empty.txt", "");
  message = load_error(file_config("text", empty));
  expect_mentions(message, empty);
  expect_mentions(message, "empty");

  // 100 bytes, val_fraction 0.1: validation holds 10 tokens, fewer than seq_len + 1 = 17.
  const auto short_file = dir.write("short.txt", std::string(100, 'x'));
  message = load_error(file_config("text", short_file), 256, 16);
  expect_mentions(message, short_file);
  expect_mentions(message, "too short");
  EXPECT_NO_THROW(make_token_dataset(file_config("text", short_file, 0.5), 256, 16, 1));

  expect_mentions(load_error(file_config("text", dir.path(""))), "directory");
  expect_mentions(load_error(file_config("text", "")), "data.path");
  expect_mentions(load_error(file_config("text", short_file, 0.0)), "val_fraction");
  expect_mentions(load_error(file_config("text", short_file, 1.0)), "val_fraction");
}

TEST(SampleData, TokenFileHoldsTheSampleTextsBytes) {
  const auto text_path = source_dir() / "data" / "sample.txt";
  const auto tokens_path = source_dir() / "data" / "sample_tokens.bin";
  const std::string text = read_file(text_path);
  const std::string tokens = read_file(tokens_path);
  ASSERT_GT(text.size(), 2000u);
  ASSERT_EQ(tokens.size(), 2 * text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    ASSERT_EQ(tokens[2 * i], text[i]) << "token " << i;
    ASSERT_EQ(tokens[2 * i + 1], '\0') << "token " << i;
  }
  // Same ids, same split sizes, same seed: the two kinds give the same batches.
  auto as_text = make_token_dataset(file_config("text", text_path.string()), 256, 64, 9);
  auto as_tokens = make_token_dataset(file_config("tokens", tokens_path.string()), 256, 64, 9);
  for (Split split : {Split::train, Split::validation}) {
    EXPECT_EQ(token_batch(*as_text, split, 4, 8).input_ids(), token_batch(*as_tokens, split, 4, 8).input_ids());
  }
  EXPECT_EQ(make_token_dataset(file_config("tokens", tokens_path.string()), 0, 64, 9)->vocab(), 'z' + 1);
}

}  // namespace
}  // namespace proplab
