// Every token kind: batches are pure functions of (seed, split, index), targets are inputs shifted by one, and
// nothing depends on the thread count.
#include <gtest/gtest.h>

#include "core/error.h"
#include "core/parallel.h"
#include "data/dataset.h"
#include "data_test_util.h"

namespace proplab {
namespace {

using testing::source_dir;
using testing::token_batch;

DataConfig config_for(const std::string& kind) {
  DataConfig config;
  config.kind = kind;
  if (kind == "text") config.path = (source_dir() / "data" / "sample.txt").string();
  if (kind == "tokens") config.path = (source_dir() / "data" / "sample_tokens.bin").string();
  return config;
}

constexpr int kSeqLen = 24;

class TokenBatches : public ::testing::TestWithParam<std::string> {
 protected:
  std::unique_ptr<TokenDataset> make(std::uint64_t seed = 42) const {
    return make_token_dataset(config_for(GetParam()), 256, kSeqLen, seed);
  }
};

TEST_P(TokenBatches, SameIndexSameBatchOtherwiseDifferent) {
  auto data = make();
  EXPECT_EQ(data->seq_len(), kSeqLen);
  EXPECT_EQ(data->vocab(), 256);
  const auto first = token_batch(*data, Split::train, 5, 8);
  const auto again = token_batch(*make(), Split::train, 5, 8);  // a fresh dataset object, as another process would
  EXPECT_EQ(first.input_ids(), again.input_ids());
  EXPECT_EQ(first.target_ids(), again.target_ids());
  EXPECT_NE(first.input_ids(), token_batch(*data, Split::train, 6, 8).input_ids());
  EXPECT_NE(first.input_ids(), token_batch(*data, Split::validation, 5, 8).input_ids());
  EXPECT_NE(first.input_ids(), token_batch(*make(43), Split::train, 5, 8).input_ids());
}

TEST_P(TokenBatches, TargetsAreInputsShiftedByOne) {
  auto data = make();
  for (Split split : {Split::train, Split::validation}) {
    const auto batch = token_batch(*data, split, 3, 6);
    const std::int32_t* in = batch.inputs.i32();
    const std::int32_t* out = batch.targets.i32();
    for (int b = 0; b < 6; ++b) {
      for (int t = 0; t + 1 < kSeqLen; ++t) EXPECT_EQ(out[b * kSeqLen + t], in[b * kSeqLen + t + 1]);
      for (int t = 0; t < kSeqLen; ++t) {
        EXPECT_GE(in[b * kSeqLen + t], 0);
        EXPECT_LT(in[b * kSeqLen + t], data->vocab());
        EXPECT_LT(out[b * kSeqLen + t], data->vocab());
      }
    }
  }
}

TEST_P(TokenBatches, MicroBatchesStackToTheFullBatch) {
  auto data = make();
  const auto full = token_batch(*data, Split::validation, 3, 8);
  const auto part0 = token_batch(*data, Split::validation, 6, 4);
  const auto part1 = token_batch(*data, Split::validation, 7, 4);
  auto stacked = part0.input_ids();
  const auto tail = part1.input_ids();
  stacked.insert(stacked.end(), tail.begin(), tail.end());
  EXPECT_EQ(full.input_ids(), stacked);
}

TEST_P(TokenBatches, IndependentOfThreadCount) {
  auto data = make();
  // Large enough (rows * seq_len >= 2^16) that generation runs in parallel.
  const std::int64_t rows = 4096;
  const int before = threads();
  set_threads(1);
  const auto one = token_batch(*data, Split::train, 2, rows);
  set_threads(3);
  const auto three = token_batch(*data, Split::train, 2, rows);
  set_threads(before);
  EXPECT_EQ(one.input_ids(), three.input_ids());
  EXPECT_EQ(one.target_ids(), three.target_ids());
}

TEST_P(TokenBatches, WrongTensorsAreCallerBugs) {
  auto data = make();
  Tensor good = Tensor::empty({2, kSeqLen}, DType::i32);
  Tensor wrong_length = Tensor::empty({2, kSeqLen + 1}, DType::i32);
  Tensor wrong_dtype = Tensor::empty({2, kSeqLen}, DType::f32);
  Tensor other = Tensor::empty({2, kSeqLen}, DType::i32);
  EXPECT_THROW(data->batch(Split::train, 0, wrong_length, other), InternalError);
  EXPECT_THROW(data->batch(Split::train, 0, good, wrong_dtype), InternalError);
  EXPECT_THROW(data->batch(Split::train, -1, good, other), InternalError);
  EXPECT_FALSE(data->describe().empty());
}

INSTANTIATE_TEST_SUITE_P(AllKinds, TokenBatches, ::testing::Values("uniform", "markov", "text", "tokens"));

TEST(DataKinds, UnknownAndMismatchedKindsAreUserErrors) {
  DataConfig config;
  config.kind = "wikipedia";
  try {
    make_token_dataset(config, 256, 8, 1);
    FAIL() << "an unknown kind should be rejected";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("wikipedia"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("markov"), std::string::npos) << "should list the valid kinds: " << e.what();
  }
  EXPECT_THROW(make_vector_dataset(config, 4, 2, true, 1), UserError);
  config.kind = "gaussian";
  EXPECT_THROW(make_token_dataset(config, 256, 8, 1), UserError);
  config.kind = "markov";
  EXPECT_THROW(make_vector_dataset(config, 4, 2, true, 1), UserError);
  EXPECT_THROW(make_token_dataset(config, 256, 0, 1), UserError);
}

}  // namespace
}  // namespace proplab
