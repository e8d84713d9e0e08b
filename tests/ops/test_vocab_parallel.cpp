// ops/vocab_parallel: the vocabulary split into shards, combined by hand the way the all-reduces combine ranks,
// gives the unsplit embedding and softmax cross-entropy (values and gradients), and the gradients of the pieces
// match finite differences.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "core/rng.h"
#include "ops/ops.h"
#include "ops/vocab_parallel.h"
#include "support/gradcheck.h"

namespace proplab {
namespace {

using testing::check_gradient;
using testing::project;
using testing::projection_weights;
using testing::random_tensor;

Tensor make_ids(std::int64_t count, std::int64_t vocab, std::uint64_t seed, const Shape& shape) {
  Tensor ids = Tensor::empty(shape, DType::i32);
  CounterRng rng(seed, stream_id("test.ids"));
  for (std::int64_t i = 0; i < count; ++i)
    ids.i32()[i] = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(i), vocab));
  return ids;
}

// Columns [first, first + width) of a [rows, V] tensor.
Tensor columns(const Tensor& x, std::int64_t first, std::int64_t width) {
  const std::int64_t rows = x.dim(0), v = x.dim(1);
  Tensor out = Tensor::empty({rows, width});
  for (std::int64_t r = 0; r < rows; ++r)
    std::copy(x.f32() + r * v + first, x.f32() + r * v + first + width, out.f32() + r * width);
  return out;
}

// The split cross-entropy over `shards` equal column blocks, combined as the ranks' all-reduces would; fills
// d_logits (full layout) when given.
double split_cross_entropy(const Tensor& logits, const Tensor& targets, int shards, Tensor* d_logits,
                           float grad_scale) {
  const std::int64_t rows = logits.dim(0), width = logits.dim(1) / shards;
  std::vector<Tensor> pieces;
  for (int k = 0; k < shards; ++k) pieces.push_back(columns(logits, k * width, width));
  std::vector<double> row_max(static_cast<std::size_t>(rows), -1e300), part;
  for (const Tensor& piece : pieces) {
    ops::cross_entropy_shard_max(piece, part);
    for (std::size_t r = 0; r < part.size(); ++r) row_max[r] = std::max(row_max[r], part[r]);
  }
  std::vector<double> sums(static_cast<std::size_t>(2 * rows), 0.0);
  for (int k = 0; k < shards; ++k) {
    ops::cross_entropy_shard_sums(pieces[static_cast<std::size_t>(k)], row_max, targets, k * width, part);
    for (std::size_t i = 0; i < part.size(); ++i) sums[i] += part[i];
  }
  double loss = 0.0;
  for (int k = 0; k < shards; ++k) {
    Tensor d_piece = Tensor::empty({rows, width});
    const double shard_loss =
        ops::cross_entropy_shard_finish(pieces[static_cast<std::size_t>(k)], row_max, sums, targets, k * width,
                                        d_logits ? &d_piece : nullptr, grad_scale);
    if (k > 0) {
      EXPECT_EQ(shard_loss, loss) << "every rank computes the same loss";
    }
    loss = shard_loss;
    if (d_logits)
      for (std::int64_t r = 0; r < rows; ++r)
        std::copy(d_piece.f32() + r * width, d_piece.f32() + (r + 1) * width,
                  d_logits->f32() + r * logits.dim(1) + k * width);
  }
  return loss;
}

TEST(VocabParallel, CrossEntropyMatchesTheUnsplitOp) {
  const std::int64_t rows = 7, vocab = 12;
  Tensor logits = random_tensor({rows, vocab}, 5, 2.0);
  Tensor targets = make_ids(rows, vocab, 6, {rows});
  Tensor d_full = Tensor::empty({rows, vocab});
  const double full = ops::softmax_cross_entropy(logits, targets, &d_full, 0.5f);
  for (int shards : {1, 2, 3, 4}) {
    SCOPED_TRACE("shards " + std::to_string(shards));
    Tensor d_split = Tensor::empty({rows, vocab});
    const double split = split_cross_entropy(logits, targets, shards, &d_split, 0.5f);
    EXPECT_NEAR(split, full, 1e-6 * full);
    for (std::int64_t i = 0; i < rows * vocab; ++i) EXPECT_NEAR(d_split.f32()[i], d_full.f32()[i], 1e-6) << i;
  }
}

TEST(VocabParallel, CrossEntropyGradientMatchesFiniteDifferences) {
  const std::int64_t rows = 5, vocab = 8;
  Tensor logits = random_tensor({rows, vocab}, 7);
  Tensor targets = make_ids(rows, vocab, 8, {rows});
  Tensor d_logits = Tensor::empty({rows, vocab});
  split_cross_entropy(logits, targets, 2, &d_logits, 1.0f);
  auto loss = [&]() { return split_cross_entropy(logits, targets, 2, nullptr, 1.0f); };
  EXPECT_GRAD_OK(check_gradient(loss, logits, d_logits));
}

TEST(VocabParallel, EmbeddingShardsSumToTheUnsplitLookup) {
  const std::int64_t batch = 3, seq = 5, vocab = 8, dim = 6;
  Tensor tokens = make_ids(batch * seq, vocab, 9, {batch, seq});
  Tensor table = random_tensor({vocab, dim}, 10), pos = random_tensor({seq + 2, dim}, 11);
  Tensor expected = Tensor::empty({batch, seq, dim});
  ops::embedding_forward(tokens, table, &pos, expected);
  for (int shards : {1, 2, 4}) {
    const std::int64_t rows = vocab / shards;
    Tensor total = Tensor::zeros({batch, seq, dim}), piece = Tensor::empty({batch, seq, dim});
    for (int k = 0; k < shards; ++k) {
      ops::embedding_shard_forward(tokens, table.slice(0, k * rows, rows), k * rows, vocab, piece);
      ops::axpy(1.0f, piece, total);
    }
    ops::position_add_forward(pos, total);
    EXPECT_EQ(total.to_vector(), expected.to_vector()) << shards << " shards";
  }
}

TEST(VocabParallel, EmbeddingShardGradients) {
  const std::int64_t batch = 2, seq = 4, vocab = 6, dim = 5, rows = 3;
  Tensor tokens = make_ids(batch * seq, vocab, 12, {batch, seq});
  Tensor shard = random_tensor({rows, dim}, 13), pos = random_tensor({seq, dim}, 14);
  const std::int64_t first = 3;
  Tensor y = Tensor::empty({batch, seq, dim});
  auto loss = [&]() {
    ops::embedding_shard_forward(tokens, shard, first, vocab, y);
    ops::position_add_forward(pos, y);
    return project(y, 15);
  };
  Tensor d_y = projection_weights({batch, seq, dim}, 15);
  Tensor d_shard = Tensor::zeros({rows, dim}), d_pos = Tensor::zeros({seq, dim});
  ops::embedding_shard_backward(tokens, d_y, first, d_shard);
  ops::position_add_backward(d_y, d_pos);
  EXPECT_GRAD_OK(check_gradient(loss, shard, d_shard));
  EXPECT_GRAD_OK(check_gradient(loss, pos, d_pos));
  // Rows of ids outside the shard get nothing; the shard's rows equal the unsplit table gradient's rows.
  Tensor d_full = Tensor::zeros({vocab, dim});
  Tensor d_pos_full = Tensor::zeros({seq, dim});
  ops::embedding_backward(tokens, d_y, d_full, &d_pos_full);
  EXPECT_EQ(d_shard.to_vector(), d_full.slice(0, first, rows).to_vector());
  EXPECT_EQ(d_pos.to_vector(), d_pos_full.to_vector());
}

TEST(VocabParallel, TokenOutsideTheVocabularyIsAUserError) {
  Tensor tokens = Tensor::empty({1, 2}, DType::i32);
  tokens.i32()[0] = 1;
  tokens.i32()[1] = 9;
  Tensor shard = random_tensor({2, 3}, 16), y = Tensor::empty({1, 2, 3});
  EXPECT_THROW(ops::embedding_shard_forward(tokens, shard, 0, 4, y), UserError);
}

}  // namespace
}  // namespace proplab
