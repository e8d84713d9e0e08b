// dist: layout coordinates, process-group errors and the single-process backend.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "dist/communicator.h"

namespace proplab::dist {
namespace {

TEST(Layout, CoordinatesRoundTripAndTensorRanksAreAdjacent) {
  const Layout layout{2, 3, 2};
  std::set<std::tuple<int, int, int>> seen;
  for (int r = 0; r < layout.world(); ++r) {
    const Coordinates at = coordinates_of(layout, r);
    EXPECT_EQ(world_rank_of(layout, at), r);
    seen.insert({at.dp, at.tp, at.pp});
  }
  EXPECT_EQ(static_cast<int>(seen.size()), layout.world());
  // Tensor-parallel neighbours are adjacent world ranks.
  EXPECT_EQ(world_rank_of(layout, {0, 1, 0}), 1);
  EXPECT_EQ(world_rank_of(layout, {1, 0, 0}), 3);
  EXPECT_EQ(world_rank_of(layout, {0, 0, 1}), 6);
}

TEST(Layout, SequenceRanksComeBetweenTensorAndDataRanks) {
  const Layout layout{2, 2, 2, 3};  // dp, tp, pp, sp: 24 ranks
  std::set<std::tuple<int, int, int, int>> seen;
  for (int r = 0; r < layout.world(); ++r) {
    const Coordinates at = coordinates_of(layout, r);
    EXPECT_EQ(world_rank_of(layout, at), r);
    seen.insert({at.dp, at.tp, at.pp, at.sp});
  }
  EXPECT_EQ(static_cast<int>(seen.size()), 24);
  EXPECT_EQ(world_rank_of(layout, {0, 1, 0, 0}), 1);   // tp innermost
  EXPECT_EQ(world_rank_of(layout, {0, 0, 0, 1}), 2);   // then sp
  EXPECT_EQ(world_rank_of(layout, {1, 0, 0, 0}), 6);   // then dp
  EXPECT_EQ(world_rank_of(layout, {0, 0, 1, 0}), 12);  // pp outermost
}

TEST(Layout, WorldSizeMustMatchTheLayout) {
  try {
    make_process_groups(make_single_process(), Layout{2, 1, 1});
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("needs 2 processes, but 1 were started"), std::string::npos) << message;
    EXPECT_NE(message.find("mpirun -np 2"), std::string::npos) << message;
  }
  try {
    make_process_groups(make_single_process(), Layout{1, 1, 1, 2});
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("sp = 2 needs 2 processes"), std::string::npos) << message;
  }
}

TEST(SingleProcess, CollectivesAreIdentities) {
  ProcessGroups groups = make_process_groups(make_single_process(), Layout{});
  EXPECT_EQ(groups.world->size(), 1);
  EXPECT_EQ(groups.data->size(), 1);
  EXPECT_EQ(groups.sequence->size(), 1);
  std::vector<float> data{1.5f, -2.0f};
  groups.world->all_reduce(data.data(), 2);
  EXPECT_EQ(data, (std::vector<float>{1.5f, -2.0f}));
  std::vector<float> gathered(2);
  groups.tensor->all_gather(data.data(), gathered.data(), 2);
  EXPECT_EQ(gathered, data);
  EXPECT_THROW(groups.world->send(data.data(), 2, 1, 0), InternalError);
}

}  // namespace
}  // namespace proplab::dist
