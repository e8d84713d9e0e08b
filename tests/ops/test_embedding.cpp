#include <gtest/gtest.h>

#include <vector>

#include "core/rng.h"
#include "ops/ops.h"
#include "ops_testing.h"
#include "support/gradcheck.h"

namespace proplab {
namespace {

using testing::check_gradient;
using testing::project;
using testing::projection_weights;
using testing::random_tensor;

// Token ids in [0, vocab) with plenty of repeats (so backward must accumulate several positions per row).
Tensor make_tokens(std::int64_t batch, std::int64_t seq, std::int64_t vocab, std::uint64_t seed) {
  Tensor tokens = Tensor::empty({batch, seq}, DType::i32);
  CounterRng rng(seed, stream_id("test.tokens"));
  for (std::int64_t i = 0; i < batch * seq; ++i)
    tokens.i32()[i] = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(i), vocab));
  return tokens;
}

TEST(Embedding, ForwardMatchesNaive) {
  const std::int64_t batch = 2, seq = 4, vocab = 5, dim = 6;
  Tensor tokens = make_tokens(batch, seq, vocab, 1);
  Tensor table = random_tensor({vocab, dim}, 2), pos = random_tensor({seq + 3, dim}, 3);
  Tensor y = Tensor::empty({batch, seq, dim});
  for (bool with_pos : {true, false}) {
    ops::embedding_forward(tokens, table, with_pos ? &pos : nullptr, y);
    std::vector<double> expected;
    const std::vector<float> tv = table.to_vector(), pv = pos.to_vector();
    for (std::int64_t b = 0; b < batch; ++b)
      for (std::int64_t t = 0; t < seq; ++t)
        for (std::int64_t j = 0; j < dim; ++j) {
          const std::int32_t id = tokens.i32()[b * seq + t];
          expected.push_back(static_cast<double>(tv[id * dim + j]) + (with_pos ? pv[t * dim + j] : 0.0));
        }
    testing::expect_all_close(y, expected, 1e-6, 1e-6, with_pos ? "token + position" : "token only");
  }
}

TEST(Embedding, GradientsOfBothTables) {
  const std::int64_t batch = 3, seq = 4, vocab = 5, dim = 3;
  Tensor tokens = make_tokens(batch, seq, vocab, 4);
  Tensor table = random_tensor({vocab, dim}, 5), pos = random_tensor({seq + 1, dim}, 6);
  Tensor y = Tensor::empty({batch, seq, dim});
  auto loss = [&] {
    ops::embedding_forward(tokens, table, &pos, y);
    return project(y, 7);
  };
  Tensor d_y = projection_weights(y.shape(), 7);
  Tensor d_table = Tensor::zeros(table.shape()), d_pos = Tensor::zeros(pos.shape());
  ops::embedding_backward(tokens, d_y, d_table, &d_pos);
  EXPECT_GRAD_OK(check_gradient(loss, table, d_table));
  EXPECT_GRAD_OK(check_gradient(loss, pos, d_pos));
  // Rows of unused positions (t >= seq) receive nothing.
  for (std::int64_t j = 0; j < dim; ++j) EXPECT_EQ(d_pos.f32()[seq * dim + j], 0.0f);
}

TEST(Embedding, GradientsAccumulate) {
  Tensor tokens = make_tokens(2, 5, 4, 8);
  Tensor d_y = random_tensor({2, 5, 3}, 9);
  Tensor d_table = Tensor::zeros({4, 3}), d_pos = Tensor::zeros({5, 3});
  ops::embedding_backward(tokens, d_y, d_table, &d_pos);
  const std::vector<float> once_table = d_table.to_vector(), once_pos = d_pos.to_vector();
  ops::embedding_backward(tokens, d_y, d_table, &d_pos);
  std::vector<double> twice_table, twice_pos;
  for (float v : once_table) twice_table.push_back(2.0 * v);
  for (float v : once_pos) twice_pos.push_back(2.0 * v);
  testing::expect_all_close(d_table, twice_table, 1e-6, 1e-6, "d_token_table after two calls");
  testing::expect_all_close(d_pos, twice_pos, 1e-6, 1e-6, "d_pos_table after two calls");
}

TEST(Embedding, BackwardIndependentOfThreadCount) {
  // Large enough for the parallel path; vocab 50 so every row collects many positions.
  const std::int64_t batch = 4, seq = 64, vocab = 50, dim = 160;
  Tensor tokens = make_tokens(batch, seq, vocab, 10);
  Tensor d_y = random_tensor({batch, seq, dim}, 11);
  Tensor d_table1 = random_tensor({vocab, dim}, 12), d_pos1 = random_tensor({seq, dim}, 13);
  Tensor d_table2 = d_table1.clone(), d_pos2 = d_pos1.clone();
  {
    testing::ScopedThreads one(1);
    ops::embedding_backward(tokens, d_y, d_table1, &d_pos1);
  }
  {
    testing::ScopedThreads two(2);
    ops::embedding_backward(tokens, d_y, d_table2, &d_pos2);
  }
  EXPECT_TRUE(testing::bitwise_equal(d_table1, d_table2));
  EXPECT_TRUE(testing::bitwise_equal(d_pos1, d_pos2));
}

TEST(Embedding, TokenOutsideVocabularyIsAUserError) {
  Tensor tokens = make_tokens(2, 3, 4, 14);
  tokens.i32()[4] = 4;
  Tensor table = random_tensor({4, 2}, 15), y = Tensor::empty({2, 3, 2});
  try {
    ops::embedding_forward(tokens, table, nullptr, y);
    FAIL() << "token id 4 with vocab 4 must be rejected";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("embedding_forward"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("position 4"), std::string::npos) << e.what();
  }
  tokens.i32()[4] = -1;
  Tensor d_y = random_tensor({2, 3, 2}, 16), d_table = Tensor::zeros({4, 2});
  EXPECT_THROW(ops::embedding_backward(tokens, d_y, d_table, nullptr), UserError);
}

TEST(Embedding, PositionTableShorterThanSequenceIsAnInternalError) {
  Tensor tokens = make_tokens(1, 6, 4, 17);
  Tensor table = random_tensor({4, 2}, 18), pos = random_tensor({5, 2}, 19), y = Tensor::empty({1, 6, 2});
  EXPECT_THROW(ops::embedding_forward(tokens, table, &pos, y), InternalError);
}

}  // namespace
}  // namespace proplab
