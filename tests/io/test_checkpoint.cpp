#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>

#include "core/rng.h"
#include "io/checkpoint.h"
#include "io/run_file.h"
#include "io_test_support.h"

namespace proplab {
namespace {

using io_test::ScratchDirectory;
using io_test::user_error_message;

Tensor random_tensor(const Shape& shape, std::uint64_t stream) {
  Tensor tensor = Tensor::empty(shape);
  const CounterRng rng(1234, stream);
  float* data = tensor.f32();
  for (std::int64_t i = 0; i < tensor.numel(); ++i) data[i] = rng.normal(static_cast<std::uint64_t>(i));
  return tensor;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() &&
         std::memcmp(a.f32(), b.f32(), static_cast<std::size_t>(a.numel()) * sizeof(float)) == 0;
}

bool bitwise_equal(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

Checkpoint sample_checkpoint() {
  Checkpoint checkpoint;
  checkpoint.tensors["embed.weight"] = random_tensor({16, 8}, 1);
  checkpoint.tensors["blocks.0/attn.qkv.weight"] = random_tensor({24, 8}, 2);  // nested name
  checkpoint.tensors["adam/m/embed.weight"] = random_tensor({16, 8}, 3);
  checkpoint.tensors["residual_scale"] = Tensor::from_vector({}, {0.70710677f});  // rank 0
  Tensor special = Tensor::empty({7});
  const float values[7] = {-0.0f,
                           std::numeric_limits<float>::denorm_min(),
                           std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::max(),
                           std::numeric_limits<float>::quiet_NaN(),
                           1.0f / 3.0f};
  std::memcpy(special.f32(), values, sizeof values);
  checkpoint.tensors["special"] = special;
  checkpoint.ints["step"] = 1200;
  checkpoint.ints["data_position"] = std::numeric_limits<std::int64_t>::max();
  checkpoint.ints["seed"] = std::numeric_limits<std::int64_t>::min();
  checkpoint.floats["loss_scale"] = 1.0 / 3.0;
  checkpoint.floats["negative_zero"] = -0.0;
  checkpoint.floats["tiny"] = std::numeric_limits<double>::denorm_min();
  checkpoint.strings["config"] = "[train]\nsteps = 200\nlr = 1e-3\n# \xe2\x9c\x93\n";
  checkpoint.strings["empty"] = "";
  return checkpoint;
}

void expect_same_scalars(const Checkpoint& read, const Checkpoint& written) {
  EXPECT_EQ(read.ints, written.ints);
  ASSERT_EQ(read.floats.size(), written.floats.size());
  for (const auto& [name, value] : written.floats) {
    EXPECT_TRUE(bitwise_equal(read.float_value(name), value)) << name;
  }
  EXPECT_EQ(read.strings, written.strings);
}

// Fresh targets with the sample's shapes, filled with a value the checkpoint does not contain.
std::map<std::string, Tensor> blank_targets(const Checkpoint& like) {
  std::map<std::string, Tensor> targets;
  for (const auto& [name, tensor] : like.tensors) {
    Tensor target = Tensor::empty(tensor.shape());
    target.fill(-7.0f);
    targets[name] = target;
  }
  return targets;
}

TEST(Checkpoint, RoundTripIsBitwise) {
  ScratchDirectory dir;
  const auto path = dir / "ckpt" / "step_1200.h5";
  const Checkpoint written = sample_checkpoint();
  // The folder must exist: a missing one is an I/O failure (a run whose folder vanished must notice).
  EXPECT_THROW(save_checkpoint(path, written), IoError);
  EXPECT_FALSE(std::filesystem::exists(dir / "ckpt"));
  std::filesystem::create_directories(dir / "ckpt");
  save_checkpoint(path, written);
  EXPECT_TRUE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path.string() + ".tmp"));

  std::map<std::string, Tensor> targets = blank_targets(written);
  const Checkpoint loaded = load_checkpoint(path, targets);
  for (const auto& [name, tensor] : written.tensors) {
    EXPECT_TRUE(bitwise_equal(targets.at(name), tensor)) << name;  // filled in place
    EXPECT_EQ(loaded.tensors.at(name).f32(), targets.at(name).f32()) << name;
  }
  expect_same_scalars(loaded, written);
  EXPECT_EQ(loaded.int_value("step"), 1200);
  EXPECT_EQ(loaded.string_value("config"), written.strings.at("config"));

  const Checkpoint everything = read_checkpoint(path);
  ASSERT_EQ(everything.tensors.size(), written.tensors.size());
  for (const auto& [name, tensor] : written.tensors) {
    ASSERT_EQ(everything.tensors.count(name), 1u) << name;
    EXPECT_TRUE(bitwise_equal(everything.tensors.at(name), tensor)) << name;
  }
  EXPECT_EQ(everything.tensors.at("residual_scale").shape(), Shape{});
  expect_same_scalars(everything, written);
}

TEST(Checkpoint, ShapeMismatchNamesTheTensorAndBothShapesAndWritesNothing) {
  ScratchDirectory dir;
  const auto path = dir / "model.h5";
  const Checkpoint written = sample_checkpoint();
  save_checkpoint(path, written);
  std::map<std::string, Tensor> targets = blank_targets(written);
  targets["blocks.0/attn.qkv.weight"] = Tensor::zeros({8, 24});
  const std::string message = user_error_message([&] { load_checkpoint(path, targets); });
  EXPECT_NE(message.find("'blocks.0/attn.qkv.weight'"), std::string::npos) << message;
  EXPECT_NE(message.find("[24, 8]"), std::string::npos) << message;
  EXPECT_NE(message.find("[8, 24]"), std::string::npos) << message;
  EXPECT_EQ(targets.at("embed.weight").to_vector(), std::vector<float>(16 * 8, -7.0f));  // untouched
}

TEST(Checkpoint, MissingAndUnexpectedTensorsAreUserErrors) {
  ScratchDirectory dir;
  const auto path = dir / "model.h5";
  const Checkpoint written = sample_checkpoint();
  save_checkpoint(path, written);

  std::map<std::string, Tensor> targets = blank_targets(written);
  targets["blocks.1/attn.qkv.weight"] = Tensor::zeros({24, 8});
  std::string message = user_error_message([&] { load_checkpoint(path, targets); });
  EXPECT_NE(message.find("has no tensor 'blocks.1/attn.qkv.weight'"), std::string::npos) << message;
  EXPECT_NE(message.find("embed.weight"), std::string::npos) << message;  // lists what it holds

  targets = blank_targets(written);
  targets.erase("adam/m/embed.weight");
  message = user_error_message([&] { load_checkpoint(path, targets); });
  EXPECT_NE(message.find("holds tensor 'adam/m/embed.weight'"), std::string::npos) << message;

  const Checkpoint loaded = read_checkpoint(path);
  EXPECT_NE(user_error_message([&] { loaded.int_value("epoch"); }).find("'epoch'"), std::string::npos);
  EXPECT_NE(user_error_message([&] { loaded.float_value("step"); }).find("'step'"), std::string::npos);
}

TEST(Checkpoint, OptionalTensorsAndSkippedPrefixes) {
  ScratchDirectory dir;
  const auto path = dir / "model.h5";
  const Checkpoint written = sample_checkpoint();
  save_checkpoint(path, written);
  std::map<std::string, Tensor> targets = blank_targets(written);
  const Tensor wanted = targets.at("adam/m/embed.weight");
  targets.erase("adam/m/embed.weight");
  targets.erase("blocks.0/attn.qkv.weight");
  // Optional: filled when present with the expected shape; absent or of another shape, left alone and not returned.
  Tensor other_shape = Tensor::empty({8, 24});  // stored as [24, 8]
  other_shape.fill(-7.0f);
  const std::map<std::string, Tensor> optional{
      {"adam/m/embed.weight", wanted}, {"adam/missing", Tensor::zeros({3})}, {"blocks.0/attn.qkv.weight", other_shape}};
  const Checkpoint loaded = load_checkpoint(path, targets, optional, {"blocks."});
  EXPECT_TRUE(bitwise_equal(wanted, written.tensors.at("adam/m/embed.weight")));
  EXPECT_EQ(loaded.tensors.count("adam/m/embed.weight"), 1u);
  EXPECT_EQ(loaded.tensors.count("adam/missing"), 0u);
  EXPECT_EQ(loaded.tensors.count("blocks.0/attn.qkv.weight"), 0u);
  EXPECT_EQ(other_shape.to_vector(), std::vector<float>(24 * 8, -7.0f));
  // A stored tensor that is neither asked for nor under a skipped prefix is still refused.
  std::string message = user_error_message([&] { load_checkpoint(path, targets, {}, {"adam/"}); });
  EXPECT_NE(message.find("holds tensor 'blocks.0/attn.qkv.weight'"), std::string::npos) << message;
  targets.erase("embed.weight");
  message = user_error_message([&] { load_checkpoint(path, targets, {}, {"blocks.", "adam/"}); });
  EXPECT_NE(message.find("holds tensor 'embed.weight'"), std::string::npos) << message;
}

TEST(Checkpoint, ReplacingKeepsTheOldFileUntilTheNewOneIsComplete) {
  ScratchDirectory dir;
  const auto path = dir / "model.h5";
  Checkpoint first;
  first.tensors["w"] = random_tensor({4, 4}, 10);
  first.ints["step"] = 100;
  save_checkpoint(path, first);

  // A crash in the middle of a later save leaves a partial <path>.tmp; the checkpoint itself is intact.
  std::ofstream(path.string() + ".tmp") << "partial";
  std::map<std::string, Tensor> targets = {{"w", Tensor::zeros({4, 4})}};
  EXPECT_EQ(load_checkpoint(path, targets).int_value("step"), 100);
  EXPECT_TRUE(bitwise_equal(targets.at("w"), first.tensors.at("w")));

  Checkpoint second;
  second.tensors["w"] = random_tensor({4, 4}, 11);
  second.ints["step"] = 200;
  save_checkpoint(path, second);
  EXPECT_FALSE(std::filesystem::exists(path.string() + ".tmp"));
  EXPECT_EQ(load_checkpoint(path, targets).int_value("step"), 200);
  EXPECT_TRUE(bitwise_equal(targets.at("w"), second.tensors.at("w")));
}

TEST(Checkpoint, RefusesFilesThatAreNotCheckpoints) {
  ScratchDirectory dir;
  EXPECT_NE(user_error_message([&] { read_checkpoint(dir / "missing.h5"); }).find("does not exist"), std::string::npos);
  const auto text = dir / "text.h5";
  std::ofstream(text) << "not hdf5";
  EXPECT_NE(user_error_message([&] { read_checkpoint(text); }).find("is not an HDF5 file"), std::string::npos);

  const auto run = dir / "run.h5";
  RunHeader header;
  header.proplab_version = "test";
  RunWriter::create(run, header, false).finish(RunStatus::completed, "");
  EXPECT_NE(user_error_message([&] { read_checkpoint(run); }).find("is not a proplab checkpoint"), std::string::npos);
}

TEST(Checkpoint, InvalidNamesAndNonContiguousTensorsAreInternalErrors) {
  ScratchDirectory dir;
  Checkpoint bad_name;
  bad_name.tensors["/absolute"] = Tensor::zeros({2});
  EXPECT_THROW(save_checkpoint(dir / "a.h5", bad_name), InternalError);
  Checkpoint dot;
  dot.ints["a/../b"] = 1;
  EXPECT_THROW(save_checkpoint(dir / "b.h5", dot), InternalError);
  Checkpoint strided;
  strided.tensors["cols"] = Tensor::zeros({4, 4}).slice(1, 0, 2);
  EXPECT_THROW(save_checkpoint(dir / "c.h5", strided), InternalError);
  EXPECT_FALSE(std::filesystem::exists(dir / "a.h5"));
  EXPECT_FALSE(std::filesystem::exists(dir / "c.h5"));
}

}  // namespace
}  // namespace proplab
