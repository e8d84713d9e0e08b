// nn/parameter: split parameters (tensor parallelism). Every piece initialises to exactly the unsplit tensor's
// values at its full-tensor indices, for plain, packed (qkv: 3 blocks) and column splits and for row-block stds;
// the pieces tile the full tensor; the index map is the one written in the header.
#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "nn/parameter.h"

namespace proplab {
namespace {

ParamShard shard_of(const Shape& full, int dim, int groups, int parts, int part) {
  ParamShard shard;
  shard.full_shape = full;
  shard.dim = dim;
  shard.groups = groups;
  shard.parts = parts;
  shard.part = part;
  return shard;
}

InitSpec normal(double std) {
  InitSpec spec;
  spec.kind = InitSpec::Kind::normal;
  spec.std = std;
  return spec;
}

// Every split of `full` into `parts`: each piece's init equals the full init's piece bitwise, and the pieces put
// back together are the full tensor.
void expect_pieces_tile_full_init(const Shape& full_shape, int dim, int groups, int parts, const InitSpec& spec) {
  Tensor full = Tensor::zeros(full_shape);
  init_tensor(full, spec, 17, "blocks.0.attn.qkv.weight");
  Tensor rebuilt = Tensor::zeros(full_shape);
  std::set<std::int64_t> covered;
  for (int part = 0; part < parts; ++part) {
    SCOPED_TRACE("part " + std::to_string(part));
    const ParamShard shard = shard_of(full_shape, dim, groups, parts, part);
    Tensor piece = Tensor::zeros(shard.local_shape());
    init_tensor(piece, spec, 17, "blocks.0.attn.qkv.weight", &shard);
    Tensor expected = Tensor::zeros(shard.local_shape());
    copy_shard_from_full(shard, full, expected);
    ASSERT_EQ(piece.to_vector(), expected.to_vector());
    for (std::int64_t i = 0; i < piece.numel(); ++i) {
      ASSERT_EQ(piece.f32()[i], full.f32()[shard.global_index(i)]) << i;
      covered.insert(shard.global_index(i));
    }
    copy_shard_into_full(shard, piece, rebuilt);
  }
  EXPECT_EQ(static_cast<std::int64_t>(covered.size()), full.numel());
  EXPECT_EQ(rebuilt.to_vector(), full.to_vector());
}

TEST(ParamShard, RowSplitInitialisesToTheUnsplitValues) {
  expect_pieces_tile_full_init({12, 5}, 0, 1, 2, normal(0.3));
  expect_pieces_tile_full_init({12, 5}, 0, 1, 4, normal(0.3));
  expect_pieces_tile_full_init({12}, 0, 1, 3, normal(1.0));  // a column-parallel bias
}

TEST(ParamShard, PackedBlocksSplitSeparately) {
  // qkv [3D, D]: q, k and v rows each split by heads.
  expect_pieces_tile_full_init({24, 8}, 0, 3, 2, normal(0.1));
  expect_pieces_tile_full_init({24, 8}, 0, 3, 4, normal(0.1));
  expect_pieces_tile_full_init({24}, 0, 3, 2, normal(0.1));
}

TEST(ParamShard, ColumnSplitInitialisesToTheUnsplitValues) {
  expect_pieces_tile_full_init({6, 16}, 1, 1, 2, normal(0.2));
  expect_pieces_tile_full_init({6, 16}, 1, 1, 4, normal(0.2));
}

TEST(ParamShard, RowBlockStdsFollowTheFullTensorsBlocks) {
  InitSpec spec = normal(0.0);
  spec.row_block_stds = {0.5, 2.0, 7.0};  // q, k, v with their own stds
  expect_pieces_tile_full_init({24, 8}, 0, 3, 2, spec);
  expect_pieces_tile_full_init({24, 8}, 0, 3, 4, spec);
}

TEST(ParamShard, GlobalIndexOfPackedRows) {
  // [6, 2] in 3 blocks of 2 rows, 2 parts: part 1 holds rows 1, 3, 5.
  const ParamShard shard = shard_of({6, 2}, 0, 3, 2, 1);
  EXPECT_EQ(shard.local_shape(), (Shape{3, 2}));
  const std::vector<std::int64_t> expected = {2, 3, 6, 7, 10, 11};
  for (std::int64_t i = 0; i < 6; ++i) EXPECT_EQ(shard.global_index(i), expected[static_cast<std::size_t>(i)]) << i;
  // [2, 4] split by columns, part 1: columns 2, 3 of each row.
  const ParamShard columns = shard_of({2, 4}, 1, 1, 2, 1);
  const std::vector<std::int64_t> expected_columns = {2, 3, 6, 7};
  for (std::int64_t i = 0; i < 4; ++i)
    EXPECT_EQ(columns.global_index(i), expected_columns[static_cast<std::size_t>(i)]) << i;
}

TEST(ParamShard, StoreCountsFullElements) {
  ParameterStore store;
  Parameter& p = store.add("w", {3, 4}, ParamRole::ffn_in, 4, 6);
  p.shard = shard_of({6, 4}, 0, 1, 2, 0);
  store.add("b", {5}, ParamRole::bias, 4, 5);
  EXPECT_EQ(store.count_elements(), 17);
  EXPECT_EQ(store.count_full_elements(), 29);
  EXPECT_EQ(full_numel(p), 24);
}

}  // namespace
}  // namespace proplab
