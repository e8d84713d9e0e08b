// The text and tokens kinds: a token array read whole from a file, windows drawn at counter-random positions
// within each split.
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <sstream>

#include "core/error.h"
#include "data/dataset.h"
#include "data/images.h"
#include "data/internal.h"

namespace proplab::data_detail {

namespace {

constexpr const char* kTextFormat = "text: any file, one token per byte, ids 0..255";
constexpr const char* kTokensFormat =
    "tokens: little-endian uint16 token ids, the whole file, or an llm.c .bin with its 1024-byte header";
constexpr std::int32_t kLlmcMagic = 20240520;
constexpr std::size_t kLlmcHeaderBytes = 256 * 4;

std::string where(const std::string& path, const char* format) {
  return detail::concat("data file '", path, "' (", format, ")");
}

std::vector<unsigned char> read_whole_file(const std::string& path, const char* format) {
  if (path.empty()) throw UserError(detail::concat("data.path is empty; give the ", format));
  std::error_code error;
  const auto status = std::filesystem::status(path, error);
  if (!std::filesystem::exists(status)) throw UserError(where(path, format) + ": not found");
  if (std::filesystem::is_directory(status)) throw UserError(where(path, format) + ": is a directory, not a file");
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (!file) throw UserError(where(path, format) + ": cannot be opened: " + std::strerror(errno));
  std::vector<unsigned char> bytes;
  const auto expected_size = std::filesystem::file_size(path, error);
  if (!error) bytes.reserve(static_cast<std::size_t>(expected_size));
  unsigned char buffer[1 << 16];
  std::size_t got = 0;
  while ((got = std::fread(buffer, 1, sizeof buffer, file)) > 0) bytes.insert(bytes.end(), buffer, buffer + got);
  const bool failed = std::ferror(file) != 0;
  const int read_errno = errno;
  std::fclose(file);
  if (failed) throw UserError(where(path, format) + ": read failed: " + std::strerror(read_errno));
  if (bytes.empty()) throw UserError(where(path, format) + ": is empty");
  return bytes;
}

// True when `path` is a regular file whose first two bytes are gzip's magic 1f 8b (false when it cannot be read:
// read_whole_file then says why).
bool starts_as_gzip(const std::string& path) {
  std::error_code error;
  if (!std::filesystem::is_regular_file(path, error)) return false;
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (!file) return false;
  unsigned char magic[2] = {0, 0};
  const std::size_t got = std::fread(magic, 1, 2, file);
  std::fclose(file);
  return got == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
}

std::uint32_t read_le32(const unsigned char* p) {
  return static_cast<std::uint32_t>(p[0]) | static_cast<std::uint32_t>(p[1]) << 8 |
         static_cast<std::uint32_t>(p[2]) << 16 | static_cast<std::uint32_t>(p[3]) << 24;
}

class FileTokens final : public TokenDataset {
 public:
  FileTokens(const DataConfig& config, int vocab, int seq_len, std::uint64_t seed)
      : path_(config.path), seq_len_(seq_len), seed_(seed) {
    const bool text = config.kind == "text";
    format_ = text ? kTextFormat : kTokensFormat;
    kind_ = config.kind;
    if (!(config.val_fraction > 0.0 && config.val_fraction < 1.0))
      throw UserError(detail::concat("data.val_fraction = ", config.val_fraction, " must be in (0, 1)"));
    // A gzip stream (a .gz file, or dictd's dictzip .dz, which is gzip with an index in its header) is read
    // decompressed, in one pass: the tokens are its contents.
    gzip_ = starts_as_gzip(path_);
    if (gzip_) {
      const std::vector<std::uint8_t> contents = read_maybe_gzip(path_, std::string(format_) + ", gzip-compressed");
      bytes_.assign(contents.begin(), contents.end());
      if (bytes_.empty()) throw UserError(where(path_, format_) + ": is an empty gzip stream");
    } else {
      bytes_ = read_whole_file(path_, format_);
    }
    if (text) {
      width_ = 1;
    } else {
      parse_token_layout();
    }
    count_ = static_cast<std::int64_t>((bytes_.size() - offset_) / width_);
    check_vocab(vocab, text);

    train_count_ = static_cast<std::int64_t>(std::floor((1.0 - config.val_fraction) * static_cast<double>(count_)));
    const std::int64_t validation_count = count_ - train_count_;
    if (train_count_ < seq_len_ + 1 || validation_count < seq_len_ + 1)
      throw UserError(detail::concat(where(path_, format_), ": too short: its ", count_, " tokens split into train ",
                                     train_count_, " and validation ", validation_count,
                                     " (data.val_fraction = ", config.val_fraction,
                                     "), and each split needs at least seq_len + 1 = ", seq_len_ + 1, " tokens"));
  }

  int vocab() const override { return vocab_; }
  int seq_len() const override { return seq_len_; }

  void batch(Split split, std::int64_t index, Tensor& inputs, Tensor& targets) const override {
    const std::int64_t rows = check_token_batch(inputs, targets, seq_len_, index);
    const CounterRng rng(seed_, split_stream("data.windows", split));
    const std::int64_t begin = split == Split::train ? 0 : train_count_;
    const std::int64_t length = split == Split::train ? train_count_ : count_ - train_count_;
    // Window starts in [begin, begin + length - (seq_len + 1)]: the window stays inside its split.
    const auto start_choices = static_cast<std::uint64_t>(length - seq_len_);
    std::int32_t* in = inputs.i32();
    std::int32_t* out = targets.i32();
#pragma omp parallel for schedule(static) if (rows * seq_len_ >= kParallelElements)
    for (std::int64_t b = 0; b < rows; ++b) {
      const std::int64_t start =
          begin + static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(index * rows + b), start_choices));
      for (std::int64_t t = 0; t < seq_len_; ++t) {
        in[b * seq_len_ + t] = static_cast<std::int32_t>(token(start + t));
        out[b * seq_len_ + t] = static_cast<std::int32_t>(token(start + t + 1));
      }
    }
  }

  std::string describe() const override {
    std::ostringstream out;
    out << kind_ << ": '" << path_ << "'" << (gzip_ ? " (gzip)" : "") << ", " << count_ << " tokens";
    if (header_version_ > 0) out << " (llm.c header, version " << header_version_ << ")";
    out << ", vocab " << vocab_ << ", train " << train_count_ << " / validation " << count_ - train_count_
        << " tokens, seq_len " << seq_len_;
    return out.str();
  }

 private:
  // Headerless uint16, or llm.c's layout: 256 little-endian int32 (magic 20240520, version 1 = uint16 GPT-2 ids
  // or 2 = uint32 LLaMA-3 ids, token count, zeros) then the tokens.
  void parse_token_layout() {
    const std::size_t size = bytes_.size();
    if (size >= kLlmcHeaderBytes && read_le32(bytes_.data()) == static_cast<std::uint32_t>(kLlmcMagic)) {
      const std::uint32_t version = read_le32(bytes_.data() + 4);
      if (version != 1 && version != 2)
        throw UserError(detail::concat(where(path_, format_), ": llm.c header version ", version,
                                       " is not supported (1: uint16 tokens, 2: uint32 tokens)"));
      header_version_ = static_cast<int>(version);
      width_ = version == 1 ? 2 : 4;
      offset_ = kLlmcHeaderBytes;
      const std::uint64_t claimed = read_le32(bytes_.data() + 8);
      if (kLlmcHeaderBytes + claimed * width_ != size)
        throw UserError(detail::concat(where(path_, format_), ": its llm.c header claims ", claimed, " tokens of ",
                                       width_, " bytes, but ", size - kLlmcHeaderBytes,
                                       " bytes follow the header (truncated or not an llm.c file)"));
      if (claimed == 0) throw UserError(where(path_, format_) + ": its llm.c header says it holds no tokens");
      return;
    }
    width_ = 2;
    if (size % 2 != 0)
      throw UserError(detail::concat(where(path_, format_), ": size ", size,
                                     " bytes is odd, so it is not a whole number of uint16 tokens"));
  }

  // Scans every id once: vocab() = vocab when given (> 0, every id must be below it), else from the data.
  void check_vocab(int vocab, bool text) {
    std::int64_t max_id = 0;
    std::int64_t first_bad = -1;
    for (std::int64_t i = 0; i < count_; ++i) {
      const std::int64_t id = token(i);
      if (id > max_id) max_id = id;
      if (vocab > 0 && id >= vocab && first_bad < 0) first_bad = i;
    }
    if (first_bad >= 0)
      throw UserError(detail::concat(where(path_, format_), ": ", text ? "byte value " : "token id ", token(first_bad),
                                     " at position ", first_bad, " is >= the model's vocab ", vocab,
                                     " (largest id in the file: ", max_id, "); raise the vocab to at least ",
                                     max_id + 1));
    if (max_id >= std::numeric_limits<std::int32_t>::max())
      throw UserError(detail::concat(where(path_, format_), ": token id ", max_id, " does not fit an i32 token"));
    vocab_ = vocab > 0 ? vocab : text ? 256 : static_cast<int>(max_id + 1);
  }

  std::int64_t token(std::int64_t i) const {
    const unsigned char* p = bytes_.data() + offset_ + static_cast<std::size_t>(i) * width_;
    switch (width_) {
      case 1:
        return p[0];
      case 2:
        return p[0] | p[1] << 8;
      default:
        return read_le32(p);
    }
  }

  std::string path_;
  std::string kind_;
  const char* format_ = kTextFormat;
  int seq_len_;
  std::uint64_t seed_;
  std::vector<unsigned char> bytes_;
  std::size_t offset_ = 0;  // bytes before the first token (an llm.c header)
  std::size_t width_ = 1;   // bytes per token
  int header_version_ = 0;  // llm.c header version, 0 when headerless
  bool gzip_ = false;       // the file was a gzip stream, read decompressed
  std::int64_t count_ = 0;
  std::int64_t train_count_ = 0;
  int vocab_ = 0;
};

}  // namespace

std::unique_ptr<TokenDataset> make_file_tokens(const DataConfig& config, int vocab, int seq_len, std::uint64_t seed) {
  return std::make_unique<FileTokens>(config, vocab, seq_len, seed);
}

}  // namespace proplab::data_detail
