// Image data: the IDX reader (raw and gzip'd) on tiny generated files and on Debian's Fashion-MNIST, the CIFAR-10
// binary reader, clear errors for missing and malformed files, normalisation, epoch permutations, augmentation
// determinism and the synthetic Gaussian images.
#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "data/images.h"
#include "support/temp_dir.h"

namespace proplab {
namespace {

namespace fs = std::filesystem;

std::vector<std::uint8_t> idx_bytes(int type_dims, const std::vector<std::uint32_t>& dims,
                                    const std::vector<std::uint8_t>& payload) {
  std::vector<std::uint8_t> bytes{0, 0, 0x08, static_cast<std::uint8_t>(type_dims)};
  for (std::uint32_t d : dims)
    for (int shift = 24; shift >= 0; shift -= 8) bytes.push_back(static_cast<std::uint8_t>(d >> shift));
  bytes.insert(bytes.end(), payload.begin(), payload.end());
  return bytes;
}

void write_file(const fs::path& path, const std::vector<std::uint8_t>& bytes, bool gzip) {
  if (gzip) {
    gzFile file = gzopen(path.c_str(), "wb");
    ASSERT_NE(file, nullptr);
    ASSERT_EQ(gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
    ASSERT_EQ(gzclose(file), Z_OK);
  } else {
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
}

// A tiny IDX data set in `dir`: `count` images of 4x4 with pixel (i, r, c) = (i·16 + r·4 + c)·3 mod 256 and
// labels i mod 3, for both train and t10k (test: count / 2 images).
void write_tiny_idx(const fs::path& dir, int count, bool gzip) {
  for (const std::string prefix : {"train", "t10k"}) {
    const int n = prefix == "train" ? count : count / 2;
    std::vector<std::uint8_t> pixels, labels;
    for (int i = 0; i < n; ++i) {
      for (int k = 0; k < 16; ++k) pixels.push_back(static_cast<std::uint8_t>(((i * 16 + k) * 3) % 256));
      labels.push_back(static_cast<std::uint8_t>(i % 3));
    }
    const std::string suffix = gzip ? ".gz" : "";
    write_file(dir / (prefix + "-images-idx3-ubyte" + suffix), idx_bytes(3, {std::uint32_t(n), 4, 4}, pixels), gzip);
    write_file(dir / (prefix + "-labels-idx1-ubyte" + suffix), idx_bytes(1, {std::uint32_t(n)}, labels), gzip);
  }
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(IdxReader, ReadsRawAndGzipFilesAlike) {
  testing::TempDir raw, gz;
  write_tiny_idx(raw.path(), 6, false);
  write_tiny_idx(gz.path(), 6, true);
  const ImageSet a =
      read_idx((raw.path() / "train-images-idx3-ubyte").string(), (raw.path() / "train-labels-idx1-ubyte").string());
  const ImageSet b = read_idx((gz.path() / "train-images-idx3-ubyte.gz").string(),
                              (gz.path() / "train-labels-idx1-ubyte.gz").string());
  EXPECT_EQ(a.count, 6);
  EXPECT_EQ(a.channels, 1);
  EXPECT_EQ(a.height, 4);
  EXPECT_EQ(a.width, 4);
  EXPECT_EQ(a.classes, 3);
  EXPECT_EQ(a.pixels[5 * 16 + 7], (5 * 16 + 7) * 3 % 256);
  EXPECT_EQ(a.labels, (std::vector<std::int32_t>{0, 1, 2, 0, 1, 2}));
  EXPECT_EQ(a.pixels, b.pixels);
  EXPECT_EQ(a.labels, b.labels);
}

TEST(IdxReader, ErrorsNameThePathAndTheFormat) {
  testing::TempDir dir;
  const fs::path images = dir.path() / "images", labels = dir.path() / "labels";
  write_file(labels, idx_bytes(1, {2}, {0, 1}), false);
  // Missing.
  std::string message = error_of([&] { read_idx(images.string(), labels.string()); });
  EXPECT_NE(message.find(images.string()), std::string::npos) << message;
  EXPECT_NE(message.find("IDX image file"), std::string::npos) << message;
  // Wrong magic (a label file where images are expected).
  write_file(images, idx_bytes(1, {2}, {0, 1}), false);
  message = error_of([&] { read_idx(images.string(), labels.string()); });
  EXPECT_NE(message.find("magic number 0x00000801"), std::string::npos) << message;
  // Truncated payload.
  write_file(images, idx_bytes(3, {2, 4, 4}, std::vector<std::uint8_t>(20, 1)), false);
  message = error_of([&] { read_idx(images.string(), labels.string()); });
  EXPECT_NE(message.find("holds 20 data bytes, its header announces 32"), std::string::npos) << message;
  // Label count mismatch.
  write_file(images, idx_bytes(3, {3, 4, 4}, std::vector<std::uint8_t>(48, 1)), false);
  message = error_of([&] { read_idx(images.string(), labels.string()); });
  EXPECT_NE(message.find("holds 2 labels for the 3 images"), std::string::npos) << message;
  EXPECT_NE(message.find(labels.string()), std::string::npos) << message;
  // Corrupt gzip stream.
  std::vector<std::uint8_t> bad{0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3, 1, 2, 3, 4, 5};
  write_file(images, bad, false);
  message = error_of([&] { read_idx(images.string(), labels.string()); });
  EXPECT_NE(message.find(images.string()), std::string::npos) << message;
}

TEST(Cifar10Reader, ReadsRecordsAndRejectsBadSizes) {
  testing::TempDir dir;
  std::vector<std::uint8_t> bytes;
  for (int record = 0; record < 2; ++record) {
    bytes.push_back(static_cast<std::uint8_t>(7 + record));
    for (int k = 0; k < 3072; ++k) bytes.push_back(static_cast<std::uint8_t>((k + record) % 251));
  }
  write_file(dir.path() / "batch.bin", bytes, false);
  const ImageSet set = read_cifar10({(dir.path() / "batch.bin").string()});
  EXPECT_EQ(set.count, 2);
  EXPECT_EQ(set.channels, 3);
  EXPECT_EQ(set.labels, (std::vector<std::int32_t>{7, 8}));
  EXPECT_EQ(set.pixels[3072 + 1024 * 2 + 5], (1024 * 2 + 5 + 1) % 251);  // record 1, blue channel, pixel 5
  bytes.pop_back();
  write_file(dir.path() / "short.bin", bytes, false);
  const std::string message = error_of([&] { read_cifar10({(dir.path() / "short.bin").string()}); });
  EXPECT_NE(message.find("short.bin"), std::string::npos) << message;
  EXPECT_NE(message.find("CIFAR-10 binary batch"), std::string::npos) << message;
}

Tensor images_of(const ImageDataset& data, Split split, std::int64_t index, std::int64_t rows, Tensor& labels) {
  Tensor x = Tensor::empty({rows, data.channels(), data.image_size(), data.image_size()});
  labels = Tensor::empty({rows}, DType::i32);
  data.batch(split, index, x, labels);
  return x;
}

TEST(ImageDataset, IdxEpochsArePermutationsNormalisedAndDeterministic) {
  testing::TempDir dir;
  write_tiny_idx(dir.path(), 10, true);
  DataConfig config;
  config.kind = "idx";
  config.path = dir.path().string();
  config.augment = false;
  const auto data = make_image_dataset(config, 1, 4, 3, 5);
  EXPECT_EQ(data->examples(Split::train), 10);
  EXPECT_EQ(data->examples(Split::validation), 5);
  // One epoch (10 samples, as 5 batches of 2) visits every image once; the second epoch in another order.
  std::set<std::vector<float>> seen;
  std::vector<double> pixels;
  std::vector<std::vector<float>> epoch0;
  Tensor labels;
  for (int index = 0; index < 5; ++index) {
    const Tensor x = images_of(*data, Split::train, index, 2, labels);
    for (int b = 0; b < 2; ++b) {
      std::vector<float> image(x.f32() + b * 16, x.f32() + (b + 1) * 16);
      seen.insert(image);
      epoch0.push_back(image);
      pixels.insert(pixels.end(), image.begin(), image.end());
      // The first pixel identifies the image i (3·16·i mod 256): its label is i mod 3.
    }
  }
  EXPECT_EQ(seen.size(), 10u);
  double mean = 0, var = 0;
  for (double p : pixels) mean += p;
  mean /= static_cast<double>(pixels.size());
  for (double p : pixels) var += (p - mean) * (p - mean);
  var /= static_cast<double>(pixels.size());
  EXPECT_NEAR(mean, 0.0, 1e-5);
  EXPECT_NEAR(var, 1.0, 1e-4);
  const Tensor epoch1 = images_of(*data, Split::train, 0, 10, labels);
  std::vector<std::vector<float>> second;
  for (int b = 0; b < 10; ++b) second.emplace_back(epoch1.f32() + b * 16, epoch1.f32() + (b + 1) * 16);
  EXPECT_EQ(second, epoch0) << "batch 0 of 10 rows is batches 0..4 of 2 rows stacked";
  const Tensor next_epoch = images_of(*data, Split::train, 1, 10, labels);
  EXPECT_NE(std::vector<float>(next_epoch.f32(), next_epoch.f32() + 160),
            std::vector<float>(epoch1.f32(), epoch1.f32() + 160));
  // Validation: the test set in file order, labels i mod 3.
  images_of(*data, Split::validation, 0, 5, labels);
  EXPECT_EQ(std::vector<std::int32_t>(labels.i32(), labels.i32() + 5), (std::vector<std::int32_t>{0, 1, 2, 0, 1}));
}

TEST(ImageDataset, AugmentationIsDeterministicUnderTheSeedAndOnlyInTraining) {
  testing::TempDir dir;
  write_tiny_idx(dir.path(), 8, false);
  DataConfig config;
  config.kind = "idx";
  config.path = dir.path().string();
  config.crop_padding = 1;
  const auto a = make_image_dataset(config, 1, 4, 3, 5), b = make_image_dataset(config, 1, 4, 3, 5);
  const auto other_seed = make_image_dataset(config, 1, 4, 3, 6);
  Tensor labels;
  const Tensor xa = images_of(*a, Split::train, 3, 8, labels), xb = images_of(*b, Split::train, 3, 8, labels);
  const Tensor xc = images_of(*other_seed, Split::train, 3, 8, labels);
  EXPECT_EQ(xa.to_vector(), xb.to_vector());
  EXPECT_NE(xa.to_vector(), xc.to_vector());
  // Augmented images contain zero-padding (crop) or differ from every plain image: some of the 8 are altered.
  config.augment = false;
  const auto plain = make_image_dataset(config, 1, 4, 3, 5);
  const Tensor xp = images_of(*plain, Split::train, 3, 8, labels);
  EXPECT_NE(xa.to_vector(), xp.to_vector());
  // Flip only (no crop): each augmented image is the plain one or its mirror.
  config.augment = true;
  config.crop_padding = 0;
  const auto flip_only = make_image_dataset(config, 1, 4, 3, 5);
  const Tensor xf = images_of(*flip_only, Split::train, 3, 8, labels);
  int flipped = 0;
  for (int i = 0; i < 8; ++i) {
    bool same = true, mirrored = true;
    for (int r = 0; r < 4; ++r)
      for (int c = 0; c < 4; ++c) {
        same &= xf.f32()[i * 16 + r * 4 + c] == xp.f32()[i * 16 + r * 4 + c];
        mirrored &= xf.f32()[i * 16 + r * 4 + c] == xp.f32()[i * 16 + r * 4 + 3 - c];
      }
    EXPECT_TRUE(same || mirrored) << "image " << i;
    flipped += !same;
  }
  EXPECT_GT(flipped, 0);
  EXPECT_LT(flipped, 8);
  // Validation is never augmented.
  const Tensor va = images_of(*a, Split::validation, 0, 4, labels),
               vp = images_of(*plain, Split::validation, 0, 4, labels);
  EXPECT_EQ(va.to_vector(), vp.to_vector());
}

TEST(ImageDataset, MissingDirectoryAndMismatchedModelAreUserErrors) {
  DataConfig config;
  config.kind = "idx";
  config.path = "/nonexistent/fashion";
  std::string message = error_of([&] { make_image_dataset(config, 1, 28, 10, 1); });
  EXPECT_NE(message.find("/nonexistent/fashion/train-images-idx3-ubyte"), std::string::npos) << message;
  testing::TempDir dir;
  write_tiny_idx(dir.path(), 4, false);
  config.path = dir.path().string();
  message = error_of([&] { make_image_dataset(config, 3, 32, 10, 1); });
  EXPECT_NE(message.find("model.image_size"), std::string::npos) << message;
  config.kind = "cifar10";
  message = error_of([&] { make_image_dataset(config, 3, 32, 10, 1); });
  EXPECT_NE(message.find("data_batch_1.bin"), std::string::npos) << message;
}

TEST(ImageDataset, GaussianImagesAreDeterministicWithTeacherLabels) {
  DataConfig config;
  config.kind = "images";
  const auto data = make_image_dataset(config, 3, 8, 5, 7);
  Tensor la, lb, lv;
  const Tensor a = images_of(*data, Split::train, 2, 16, la), b = images_of(*data, Split::train, 2, 16, lb);
  EXPECT_EQ(a.to_vector(), b.to_vector());
  const Tensor v = images_of(*data, Split::validation, 2, 16, lv);
  EXPECT_NE(a.to_vector(), v.to_vector());
  std::set<int> classes;
  for (int i = 0; i < 16; ++i) {
    EXPECT_GE(la.i32()[i], 0);
    EXPECT_LT(la.i32()[i], 5);
    classes.insert(la.i32()[i]);
  }
  EXPECT_GT(classes.size(), 2u);
  const std::vector<float> pixels = a.to_vector();
  double sq = 0;
  for (float p : pixels) sq += p * p;
  EXPECT_NEAR(sq / pixels.size(), 1.0, 0.1);
}

TEST(ImageDataset, FashionMnistFromDebian) {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  if (!fs::exists(dir + "/train-images-idx3-ubyte.gz"))
    GTEST_SKIP() << dir << " is missing: install Debian's dataset-fashion-mnist (scripts/setup-debian.sh)";
  DataConfig config;
  config.kind = "idx";
  config.path = dir;
  config.crop_padding = 2;
  const auto data = make_image_dataset(config, 1, 28, 10, 1);
  EXPECT_EQ(data->examples(Split::train), 60000);
  EXPECT_EQ(data->examples(Split::validation), 10000);
  EXPECT_EQ(data->classes(), 10);
  Tensor labels;
  images_of(*data, Split::validation, 0, 1000, labels);
  std::vector<int> counts(10, 0);
  for (int i = 0; i < 1000; ++i) ++counts[labels.i32()[i]];
  for (int c = 0; c < 10; ++c) EXPECT_GT(counts[c], 50) << "class " << c;  // t10k is balanced (1000 each)
}

}  // namespace
}  // namespace proplab
