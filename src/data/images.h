// data/images: image classification data for ResNets: IDX files (MNIST / Fashion-MNIST, gzip'd or raw), the
// CIFAR-10 binary format, and synthetic Gaussian images.
//
// Invariants (as for every dataset in data/dataset.h):
// - No cursor: row b of batch `index` with B rows is sample s = index·B + b of its split, a pure function of
//   (seed, split, s). Training samples visit the training set in epochs: epoch e = s / n is a seeded permutation
//   of the n examples (a keyed Feistel bijection, evaluated per sample, so any batch is produced directly).
//   Validation samples are the test set in file order, s mod n, never augmented.
// - Images are f32 CPU [B, C, H, W] (NCHW, as in core/tensor.h), labels i32 [B]. Pixels are bytes / 255,
//   normalised per channel with the training set's mean and std (population, in double): each channel of the
//   training set has mean 0 and variance 1.
// - Augmentation (training only, data.augment): a random crop of the image zero-padded by crop_padding pixels
//   (the padding is 0 after normalisation: the channel mean) and, with data.flip, a random horizontal flip, both
//   drawn from CounterRng(seed, "data.images.augment") at the sample index: deterministic under the seed.
// - A missing, unreadable, truncated or malformed file is a UserError naming the path and the expected format.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "data/config.h"
#include "data/dataset.h"

namespace proplab {

// Decoded images: pixels [count, channels, height, width] bytes (NCHW), labels [count].
struct ImageSet {
  std::int64_t count = 0;
  int channels = 0, height = 0, width = 0;
  int classes = 0;  // max label + 1
  std::vector<std::uint8_t> pixels;
  std::vector<std::int32_t> labels;
};

// The bytes of a file, gunzipped when it is gzip'd (zlib reads plain files unchanged). UserError naming the path
// when it cannot be read.
std::vector<std::uint8_t> read_maybe_gzip(const std::string& path, const std::string& format);
// An IDX image file (magic 0x00000803, u8 [count, rows, cols], big-endian sizes) and its IDX label file (magic
// 0x00000801, u8 [count]). UserError naming the path and the IDX format on any mismatch.
ImageSet read_idx(const std::string& images_path, const std::string& labels_path);
// CIFAR-10 binary batches: records of 1 label byte + 3072 pixel bytes (3 × 32 × 32, channel-major).
ImageSet read_cifar10(const std::vector<std::string>& paths);

class ImageDataset {
 public:
  virtual ~ImageDataset() = default;
  virtual int channels() const = 0;
  virtual int image_size() const = 0;
  virtual int classes() const = 0;
  // Examples in a split (synthetic images: unbounded, reported as 0).
  virtual std::int64_t examples(Split split) const = 0;
  // Fills x (f32 CPU [B, C, H, W]) and y (i32 CPU [B]) with batch `index` of `split`.
  virtual void batch(Split split, std::int64_t index, Tensor& x, Tensor& y) const = 0;
  virtual std::string describe() const = 0;
};

// Builds image data of kind images | idx | cifar10 for a model reading `channels` × image_size² images into
// `classes` classes. idx: data.path holds train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte
// and t10k-labels-idx1-ubyte, each optionally ending in .gz; cifar10: data.path holds data_batch_1.bin ..
// data_batch_5.bin and test_batch.bin. images: x ~ N(0, 1) per pixel, labels argmax of a fixed random linear
// teacher (W[k][i] ~ N(0, 1/(C·H·W))), the same for both splits. UserError on a bad config, a missing or
// malformed file, or images that do not match the model.
std::unique_ptr<ImageDataset> make_image_dataset(const DataConfig& config, int channels, int image_size, int classes,
                                                 std::uint64_t seed);

}  // namespace proplab
