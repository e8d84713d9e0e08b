#include "data/images.h"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <sstream>

#include "core/error.h"
#include "core/rng.h"
#include "data/internal.h"

namespace proplab {

namespace {

namespace fs = std::filesystem;

constexpr const char* kIdxImages = "an IDX image file (magic 0x00000803: u8 [count, rows, cols], big-endian sizes)";
constexpr const char* kIdxLabels = "an IDX label file (magic 0x00000801: u8 [count], big-endian size)";
constexpr const char* kCifar = "a CIFAR-10 binary batch (records of 1 label byte + 3072 pixel bytes, 3x32x32)";

[[noreturn]] void bad_file(const std::string& path, const std::string& what, const std::string& format) {
  throw UserError("data.path: " + path + ": " + what + "; expected " + format);
}

std::uint32_t big_endian(const std::vector<std::uint8_t>& bytes, std::size_t offset) {
  return (static_cast<std::uint32_t>(bytes[offset]) << 24) | (static_cast<std::uint32_t>(bytes[offset + 1]) << 16) |
         (static_cast<std::uint32_t>(bytes[offset + 2]) << 8) | static_cast<std::uint32_t>(bytes[offset + 3]);
}

// The IDX header's dimensions after checking its magic (0, 0, 0x08 = u8, ndims) and that the payload is exactly
// the product of the dimensions.
std::vector<std::uint32_t> idx_dims(const std::vector<std::uint8_t>& bytes, int ndims, const std::string& path,
                                    const char* format) {
  const std::size_t header = 4 + 4 * static_cast<std::size_t>(ndims);
  if (bytes.size() < 4) bad_file(path, "too short for an IDX header", format);
  if (bytes[0] != 0 || bytes[1] != 0 || bytes[2] != 0x08 || bytes[3] != ndims) {
    std::ostringstream magic;
    magic << "magic number 0x" << std::hex;
    for (int i = 0; i < 4; ++i) magic << (bytes[i] < 16 ? "0" : "") << static_cast<int>(bytes[i]);
    bad_file(path, magic.str() + " is not an unsigned-byte IDX file of " + std::to_string(ndims) + " dimensions",
             format);
  }
  if (bytes.size() < header) bad_file(path, "too short for an IDX header", format);
  std::vector<std::uint32_t> dims;
  std::uint64_t payload = 1;
  for (int d = 0; d < ndims; ++d) {
    dims.push_back(big_endian(bytes, 4 + 4 * static_cast<std::size_t>(d)));
    payload *= dims.back();
  }
  if (bytes.size() - header != payload)
    bad_file(path,
             "holds " + std::to_string(bytes.size() - header) + " data bytes, its header announces " +
                 std::to_string(payload),
             format);
  return dims;
}

// A keyed bijection of [0, n): a balanced Feistel network on the smallest even number of bits covering n, with
// cycle walking back into range.
std::int64_t permute(std::int64_t value, std::int64_t n, std::uint64_t seed, std::uint64_t epoch) {
  int bits = 2;
  while ((std::int64_t{1} << bits) < n) bits += 2;
  const int half = bits / 2;
  const std::uint64_t mask = (std::uint64_t{1} << half) - 1;
  const CounterRng rng(seed, stream_id("data.images.order", epoch));
  auto x = static_cast<std::uint64_t>(value);
  do {
    std::uint64_t left = x >> half, right = x & mask;
    for (std::uint64_t round = 0; round < 4; ++round) {
      std::uint32_t w[4];
      rng.words((round << 32) | right, w);
      const std::uint64_t next = left ^ (w[0] & mask);
      left = right;
      right = next;
    }
    x = (left << half) | right;
  } while (static_cast<std::int64_t>(x) >= n);
  return static_cast<std::int64_t>(x);
}

void check_image_batch(const Tensor& x, const Tensor& y, int channels, int size, std::int64_t index) {
  PROPLAB_CHECK(index >= 0, "batch index must be >= 0, got ", index);
  PROPLAB_CHECK(x.defined() && x.dtype() == DType::f32 && x.device() == Device::cpu && x.is_contiguous() &&
                    x.ndim() == 4 && x.dim(1) == channels && x.dim(2) == size && x.dim(3) == size,
                "image batch x must be contiguous f32 CPU [B, ", channels, ", ", size, ", ", size, "], got ",
                shape_string(x.shape()));
  PROPLAB_CHECK(
      y.defined() && y.dtype() == DType::i32 && y.device() == Device::cpu && y.is_contiguous() && y.numel() == x.dim(0),
      "image batch y must be contiguous i32 CPU [B]");
}

// Train and test sets of real images, normalised with the training set's per-channel statistics.
class FileImages final : public ImageDataset {
 public:
  FileImages(std::string description, ImageSet train, ImageSet test, const DataConfig& config, std::uint64_t seed)
      : description_(std::move(description)),
        train_(std::move(train)),
        test_(std::move(test)),
        augment_(config.augment),
        crop_padding_(config.augment ? config.crop_padding : 0),
        flip_(config.augment && config.flip),
        seed_(seed) {
    const int c = train_.channels;
    const std::int64_t plane = static_cast<std::int64_t>(train_.height) * train_.width;
    mean_.assign(c, 0.0);
    inv_std_.assign(c, 1.0);
    for (int ch = 0; ch < c; ++ch) {
      double sum = 0.0, sum_sq = 0.0;
      for (std::int64_t i = 0; i < train_.count; ++i) {
        const std::uint8_t* p = train_.pixels.data() + (i * c + ch) * plane;
        for (std::int64_t k = 0; k < plane; ++k) {
          sum += p[k];
          sum_sq += static_cast<double>(p[k]) * p[k];
        }
      }
      const double count = static_cast<double>(train_.count * plane);
      const double mean = sum / count, var = sum_sq / count - mean * mean;
      mean_[ch] = mean / 255.0;
      inv_std_[ch] = var > 0 ? 255.0 / std::sqrt(var) : 1.0;
    }
  }

  int channels() const override { return train_.channels; }
  int image_size() const override { return train_.height; }
  int classes() const override { return std::max(train_.classes, test_.classes); }
  std::int64_t examples(Split split) const override { return split == Split::train ? train_.count : test_.count; }

  void batch(Split split, std::int64_t index, Tensor& x, Tensor& y) const override {
    check_image_batch(x, y, channels(), image_size(), index);
    const ImageSet& set = split == Split::train ? train_ : test_;
    const bool augment = split == Split::train && augment_;
    const std::int64_t rows = x.dim(0);
    const int c = set.channels, h = set.height, w = set.width, pad = crop_padding_;
    const std::int64_t plane = static_cast<std::int64_t>(h) * w;
    const CounterRng augment_rng(seed_, stream_id("data.images.augment"));
    float* out = x.f32();
    std::int32_t* labels = y.i32();
#pragma omp parallel for schedule(static) if (rows * c * plane >= data_detail::kParallelElements)
    for (std::int64_t b = 0; b < rows; ++b) {
      const std::int64_t s = index * rows + b;
      const std::int64_t example =
          split == Split::train ? permute(s % set.count, set.count, seed_, static_cast<std::uint64_t>(s / set.count))
                                : s % set.count;
      int offset_y = pad, offset_x = pad;
      bool flip = false;
      if (augment) {
        std::uint32_t words[4];
        augment_rng.words(static_cast<std::uint64_t>(s), words);
        offset_y = static_cast<int>(words[0] % static_cast<std::uint32_t>(2 * pad + 1));
        offset_x = static_cast<int>(words[1] % static_cast<std::uint32_t>(2 * pad + 1));
        flip = flip_ && (words[2] & 1u);
      }
      labels[b] = set.labels[static_cast<std::size_t>(example)];
      for (int ch = 0; ch < c; ++ch) {
        const std::uint8_t* source = set.pixels.data() + (example * c + ch) * plane;
        float* target = out + (b * c + ch) * plane;
        const double mean = mean_[ch], inv_std = inv_std_[ch];
        for (int row = 0; row < h; ++row) {
          const int source_row = row + offset_y - pad;
          for (int col = 0; col < w; ++col) {
            int source_col = col + offset_x - pad;
            if (flip) source_col = w - 1 - source_col;
            const bool inside = source_row >= 0 && source_row < h && source_col >= 0 && source_col < w;
            target[row * w + col] =
                inside ? static_cast<float>((source[source_row * w + source_col] / 255.0 - mean) * inv_std) : 0.0f;
          }
        }
      }
    }
  }

  std::string describe() const override {
    std::ostringstream out;
    out << description_ << ": " << train_.count << " training and " << test_.count << " test images of "
        << train_.channels << "x" << train_.height << "x" << train_.width << ", " << classes() << " classes";
    if (augment_) out << ", augment: crop padding " << crop_padding_ << (flip_ ? ", flips" : "");
    return out.str();
  }

 private:
  std::string description_;
  ImageSet train_, test_;
  bool augment_;
  int crop_padding_;
  bool flip_;
  std::uint64_t seed_;
  std::vector<double> mean_, inv_std_;
};

// x ~ N(0, 1) per pixel; label = argmax_k Σ_i W[k][i] x_i with W[k][i] ~ N(0, 1/D), D = C·H·W.
class GaussianImages final : public ImageDataset {
 public:
  GaussianImages(int channels, int size, int classes, std::uint64_t seed)
      : channels_(channels), size_(size), classes_(classes), seed_(seed) {
    const std::int64_t d = static_cast<std::int64_t>(channels) * size * size;
    teacher_.resize(static_cast<std::size_t>(classes * d));
    const CounterRng rng(seed, stream_id("data.images.teacher"));
    const double std = 1.0 / std::sqrt(static_cast<double>(d));
    for (std::size_t i = 0; i < teacher_.size(); ++i) teacher_[i] = std * rng.normal(i);
  }

  int channels() const override { return channels_; }
  int image_size() const override { return size_; }
  int classes() const override { return classes_; }
  std::int64_t examples(Split) const override { return 0; }

  void batch(Split split, std::int64_t index, Tensor& x, Tensor& y) const override {
    check_image_batch(x, y, channels_, size_, index);
    const std::int64_t rows = x.dim(0);
    const std::int64_t d = static_cast<std::int64_t>(channels_) * size_ * size_;
    const CounterRng rng(seed_, data_detail::split_stream("data.images.pixels", split));
    float* out = x.f32();
    std::int32_t* labels = y.i32();
#pragma omp parallel for schedule(static) if (rows * d >= data_detail::kParallelElements)
    for (std::int64_t b = 0; b < rows; ++b) {
      const auto s = static_cast<std::uint64_t>(index * rows + b);
      float* image = out + b * d;
      for (std::int64_t i = 0; i < d; ++i) image[i] = rng.normal(s * static_cast<std::uint64_t>(d) + i);
      int best = 0;
      double best_score = -std::numeric_limits<double>::infinity();
      for (int k = 0; k < classes_; ++k) {
        double score = 0.0;
        for (std::int64_t i = 0; i < d; ++i) score += teacher_[static_cast<std::size_t>(k * d + i)] * image[i];
        if (score > best_score) {
          best_score = score;
          best = k;
        }
      }
      labels[b] = best;
    }
  }

  std::string describe() const override {
    std::ostringstream out;
    out << "images: N(0, 1) pixels " << channels_ << "x" << size_ << "x" << size_ << ", " << classes_
        << " classes from a random linear teacher";
    return out.str();
  }

 private:
  int channels_, size_, classes_;
  std::uint64_t seed_;
  std::vector<double> teacher_;
};

// `name` or `name.gz` in `directory` (the .gz first); the plain name when neither exists (for the error).
std::string find_file(const std::string& directory, const std::string& name) {
  const fs::path base = fs::path(directory) / name;
  if (fs::exists(base.string() + ".gz")) return base.string() + ".gz";
  return base.string();
}

void check_matches_model(const ImageSet& set, const std::string& what, int channels, int image_size, int classes) {
  if (set.channels != channels || set.height != image_size || set.width != image_size)
    throw UserError("data.path: " + what + " holds " + std::to_string(set.channels) + "x" + std::to_string(set.height) +
                    "x" + std::to_string(set.width) + " images, the model reads model.in_channels = " +
                    std::to_string(channels) + " x model.image_size = " + std::to_string(image_size) +
                    "; allowed: model.in_channels = " + std::to_string(set.channels) +
                    ", model.image_size = " + std::to_string(set.height));
  if (set.classes > classes)
    throw UserError("data.path: " + what + " has labels up to " + std::to_string(set.classes - 1) +
                    ", more than model.classes = " + std::to_string(classes) +
                    " classes; allowed: model.classes >= " + std::to_string(set.classes));
}

}  // namespace

std::vector<std::uint8_t> read_maybe_gzip(const std::string& path, const std::string& format) {
  if (!fs::is_regular_file(path)) bad_file(path, "no such file", format);
  gzFile file = gzopen(path.c_str(), "rb");
  if (!file) bad_file(path, "cannot be opened", format);
  std::vector<std::uint8_t> bytes;
  std::uint8_t buffer[1 << 16];
  while (true) {
    const int got = gzread(file, buffer, sizeof(buffer));
    if (got < 0) {
      int code = 0;
      const std::string message = gzerror(file, &code);
      gzclose(file);
      bad_file(path, "cannot be decompressed (" + message + ")", format);
    }
    if (got == 0) break;
    bytes.insert(bytes.end(), buffer, buffer + got);
  }
  // A truncated gzip stream ends without an error from gzread on some zlib versions: gzclose_r reports it.
  if (gzclose(file) != Z_OK) bad_file(path, "is a truncated or corrupt gzip stream", format);
  return bytes;
}

ImageSet read_idx(const std::string& images_path, const std::string& labels_path) {
  const std::vector<std::uint8_t> images = read_maybe_gzip(images_path, kIdxImages);
  const std::vector<std::uint32_t> dims = idx_dims(images, 3, images_path, kIdxImages);
  const std::vector<std::uint8_t> labels = read_maybe_gzip(labels_path, kIdxLabels);
  const std::vector<std::uint32_t> label_dims = idx_dims(labels, 1, labels_path, kIdxLabels);
  if (label_dims[0] != dims[0])
    bad_file(labels_path,
             "holds " + std::to_string(label_dims[0]) + " labels for the " + std::to_string(dims[0]) + " images of " +
                 images_path,
             kIdxLabels);
  if (dims[0] == 0 || dims[1] == 0 || dims[2] == 0) bad_file(images_path, "holds no images", kIdxImages);
  ImageSet set;
  set.count = dims[0];
  set.channels = 1;
  set.height = static_cast<int>(dims[1]);
  set.width = static_cast<int>(dims[2]);
  set.pixels.assign(images.begin() + 16, images.end());
  set.labels.assign(labels.begin() + 8, labels.end());
  set.classes = 1 + *std::max_element(set.labels.begin(), set.labels.end());
  return set;
}

ImageSet read_cifar10(const std::vector<std::string>& paths) {
  constexpr std::size_t kRecord = 1 + 3 * 32 * 32;
  ImageSet set;
  set.channels = 3;
  set.height = set.width = 32;
  for (const std::string& path : paths) {
    const std::vector<std::uint8_t> bytes = read_maybe_gzip(path, kCifar);
    if (bytes.empty() || bytes.size() % kRecord != 0)
      bad_file(path, "has " + std::to_string(bytes.size()) + " bytes, not a positive multiple of 3073", kCifar);
    for (std::size_t offset = 0; offset < bytes.size(); offset += kRecord) {
      if (bytes[offset] > 9)
        bad_file(path,
                 "record " + std::to_string(offset / kRecord) + " has label " + std::to_string(bytes[offset]) +
                     " (CIFAR-10 labels are 0..9)",
                 kCifar);
      set.labels.push_back(bytes[offset]);
      set.pixels.insert(set.pixels.end(), bytes.begin() + static_cast<std::ptrdiff_t>(offset + 1),
                        bytes.begin() + static_cast<std::ptrdiff_t>(offset + kRecord));
    }
  }
  set.count = static_cast<std::int64_t>(set.labels.size());
  set.classes = set.labels.empty() ? 0 : 1 + *std::max_element(set.labels.begin(), set.labels.end());
  return set;
}

std::unique_ptr<ImageDataset> make_image_dataset(const DataConfig& config, int channels, int image_size, int classes,
                                                 std::uint64_t seed) {
  if (config.crop_padding < 0 || config.crop_padding > 64)
    throw UserError("data.crop_padding = " + std::to_string(config.crop_padding) + "; allowed: 0..64");
  if (config.kind == "images") {
    if (channels < 1 || image_size < 1 || classes < 2)
      throw UserError("data.kind = \"images\" needs channels >= 1, image_size >= 1 and classes >= 2");
    return std::make_unique<GaussianImages>(channels, image_size, classes, seed);
  }
  if (config.kind == "idx" || config.kind == "cifar10") {
    if (config.path.empty())
      throw UserError("data.path: data.kind = \"" + config.kind + "\" reads files; allowed: the directory holding " +
                      (config.kind == "idx" ? "the IDX files" : "the CIFAR-10 binary batches"));
    ImageSet train, test;
    if (config.kind == "idx") {
      train = read_idx(find_file(config.path, "train-images-idx3-ubyte"),
                       find_file(config.path, "train-labels-idx1-ubyte"));
      test =
          read_idx(find_file(config.path, "t10k-images-idx3-ubyte"), find_file(config.path, "t10k-labels-idx1-ubyte"));
    } else {
      std::vector<std::string> train_paths;
      for (int i = 1; i <= 5; ++i)
        train_paths.push_back(find_file(config.path, "data_batch_" + std::to_string(i) + ".bin"));
      train = read_cifar10(train_paths);
      test = read_cifar10({find_file(config.path, "test_batch.bin")});
    }
    if (test.channels != train.channels || test.height != train.height || test.width != train.width)
      throw UserError("data.path: " + config.path + ": the test images differ in shape from the training images");
    check_matches_model(train, config.path, channels, image_size, classes);
    return std::make_unique<FileImages>(config.kind + " " + config.path, std::move(train), std::move(test), config,
                                        seed);
  }
  throw UserError("data.kind = \"" + config.kind +
                  "\" is not image data; a resnet needs data.kind = \"images\", \"idx\" or \"cifar10\"");
}

}  // namespace proplab
