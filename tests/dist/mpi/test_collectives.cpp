// dist, MPI backend: collectives on 2 and 4 ranks (ctest runs this binary under mpirun --oversubscribe), the
// process groups of every layout that fits the world, and the timeout that keeps a stalled rank from hanging
// the others. Each rank runs every test; a failure on any rank fails the run.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "dist/communicator.h"
#include "mpi_test_main.h"

namespace proplab::dist {
namespace {

std::unique_ptr<Communicator> world(double timeout_s = 60.0) { return make_mpi_world(timeout_s); }

// A value only rank r's element i has: distinct across ranks and elements, exact in float.
float value(int rank, int i) { return static_cast<float>(rank * 1000 + i) * 0.5f; }

TEST(MpiCollectives, AllReduceSumMaxMinFloatAndDouble) {
  auto comm = world();
  const int n = comm->size(), r = comm->rank();
  const int count = 1000;
  std::vector<float> data(count);
  for (int i = 0; i < count; ++i) data[i] = value(r, i);
  comm->all_reduce(data.data(), count, ReduceOp::sum);
  for (int i = 0; i < count; ++i) {
    double expected = 0;
    for (int q = 0; q < n; ++q) expected += value(q, i);
    ASSERT_EQ(data[i], static_cast<float>(expected)) << i;
  }
  std::vector<double> big{static_cast<double>(r), -static_cast<double>(r)};
  comm->all_reduce(big.data(), 2, ReduceOp::max);
  EXPECT_EQ(big[0], n - 1);
  EXPECT_EQ(big[1], 0.0);
  std::vector<double> small{static_cast<double>(r)};
  comm->all_reduce(small.data(), 1, ReduceOp::min);
  EXPECT_EQ(small[0], 0.0);
}

TEST(MpiCollectives, ReduceScatterAndAllGather) {
  auto comm = world();
  const int n = comm->size(), r = comm->rank();
  const int per_rank = 7;
  std::vector<float> send(n * per_rank), part(per_rank), whole(n * per_rank);
  for (int i = 0; i < n * per_rank; ++i) send[i] = value(r, i);
  comm->reduce_scatter(send.data(), part.data(), per_rank);
  for (int i = 0; i < per_rank; ++i) {
    double expected = 0;
    for (int q = 0; q < n; ++q) expected += value(q, r * per_rank + i);
    ASSERT_EQ(part[i], static_cast<float>(expected));
  }
  comm->all_gather(part.data(), whole.data(), per_rank);
  for (int block = 0; block < n; ++block)
    for (int i = 0; i < per_rank; ++i) {
      double expected = 0;
      for (int q = 0; q < n; ++q) expected += value(q, block * per_rank + i);
      ASSERT_EQ(whole[block * per_rank + i], static_cast<float>(expected));
    }
}

TEST(MpiCollectives, BroadcastSendReceiveBarrier) {
  auto comm = world();
  const int n = comm->size(), r = comm->rank();
  std::uint64_t token = r == n - 1 ? 0xfeedbeefULL : 0;
  comm->broadcast(&token, sizeof(token), n - 1);
  EXPECT_EQ(token, 0xfeedbeefULL);
  // A ring: each rank sends to the next and receives from the previous (even ranks send first).
  std::vector<float> out(5, static_cast<float>(r)), in(5, -1.0f);
  const int next = (r + 1) % n, previous = (r + n - 1) % n;
  if (r % 2 == 0) {
    comm->send(out.data(), 5, next, 3);
    comm->receive(in.data(), 5, previous, 3);
  } else {
    comm->receive(in.data(), 5, previous, 3);
    comm->send(out.data(), 5, next, 3);
  }
  EXPECT_EQ(in, std::vector<float>(5, static_cast<float>(previous)));
  comm->barrier();
  EXPECT_GT(comm->bytes_communicated(), 0);
}

// A ring where every rank sends right and left at once (send_receive) must not deadlock, even with messages far
// beyond the eager limit; non-blocking all-reduces started together complete in any order of waiting; the byte
// counters count what each kind of operation was handed.
TEST(MpiCollectives, RingSendReceiveAndNonBlockingAllReduce) {
  auto comm = world();
  const int n = comm->size(), r = comm->rank();
  const int count = 1 << 18;  // 1 MiB
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  std::vector<float> mine(count), from_left(count), from_right(count);
  for (int i = 0; i < count; ++i) mine[i] = value(r, i % 1000);
  const std::int64_t sent_before = comm->bytes_communicated(Traffic::send);
  comm->send_receive(mine.data(), right, from_left.data(), left, count, 7);
  comm->send_receive(mine.data(), left, from_right.data(), right, count, 8);
  for (int i = 0; i < count; i += 997) {
    ASSERT_EQ(from_left[i], value(left, i % 1000)) << i;
    ASSERT_EQ(from_right[i], value(right, i % 1000)) << i;
  }
  EXPECT_EQ(comm->bytes_communicated(Traffic::send) - sent_before, 2 * 4 * std::int64_t{count});

  const std::int64_t reduced_before = comm->bytes_communicated(Traffic::all_reduce);
  std::vector<std::vector<float>> buckets(3, std::vector<float>(5000));
  std::vector<std::unique_ptr<PendingCollective>> pending;
  for (int b = 0; b < 3; ++b) {
    for (int i = 0; i < 5000; ++i) buckets[b][i] = value(r, i % 1000) + static_cast<float>(b);
    pending.push_back(comm->start_all_reduce(buckets[b].data(), 5000));
  }
  pending[1]->test();
  for (int b = 2; b >= 0; --b) pending[b]->wait();
  EXPECT_TRUE(pending[0]->test());
  for (int b = 0; b < 3; ++b)
    for (int i = 0; i < 5000; i += 101) {
      float expected = 0.0f;
      for (int q = 0; q < n; ++q) expected += value(q, i % 1000) + static_cast<float>(b);
      ASSERT_NEAR(buckets[b][i], expected, 1e-6 * std::abs(expected)) << b << " " << i;
    }
  EXPECT_EQ(comm->bytes_communicated(Traffic::all_reduce) - reduced_before, 3 * 4 * 5000);
}

TEST(MpiCollectives, ProcessGroupsOfEveryLayout) {
  const int n = world()->size();
  for (int dp = 1; dp <= n; ++dp) {
    for (int tp = 1; dp * tp <= n; ++tp) {
      for (int sp = 1; dp * tp * sp <= n; ++sp) {
        if (n % (dp * tp * sp) != 0) continue;
        const Layout layout{dp, tp, n / (dp * tp * sp), sp};
        ProcessGroups groups = make_process_groups(world(), layout);
        SCOPED_TRACE("dp " + std::to_string(dp) + " tp " + std::to_string(tp) + " pp " + std::to_string(layout.pp) +
                     " sp " + std::to_string(sp));
        ASSERT_EQ(groups.data->size(), layout.dp);
        ASSERT_EQ(groups.tensor->size(), layout.tp);
        ASSERT_EQ(groups.pipeline->size(), layout.pp);
        ASSERT_EQ(groups.sequence->size(), layout.sp);
        ASSERT_EQ(groups.gradient->size(), layout.dp * layout.sp);
        EXPECT_EQ(groups.gradient->rank(), groups.at.dp * layout.sp + groups.at.sp);
        EXPECT_EQ(groups.data->rank(), groups.at.dp);
        EXPECT_EQ(groups.tensor->rank(), groups.at.tp);
        EXPECT_EQ(groups.pipeline->rank(), groups.at.pp);
        EXPECT_EQ(groups.sequence->rank(), groups.at.sp);
        // A sum over each group adds exactly its members' world ranks: those that share every other coordinate.
        for (Communicator* group : {groups.data.get(), groups.tensor.get(), groups.pipeline.get(),
                                    groups.sequence.get(), groups.gradient.get()}) {
          double sum = groups.world->rank();
          group->all_reduce(&sum, 1);
          double expected = 0;
          for (int q = 0; q < n; ++q) {
            const Coordinates at = coordinates_of(layout, q);
            const bool same_dp = at.dp == groups.at.dp, same_tp = at.tp == groups.at.tp;
            const bool same_pp = at.pp == groups.at.pp, same_sp = at.sp == groups.at.sp;
            const bool member = group == groups.data.get()       ? same_tp && same_pp && same_sp
                                : group == groups.tensor.get()   ? same_dp && same_pp && same_sp
                                : group == groups.pipeline.get() ? same_dp && same_tp && same_sp
                                : group == groups.sequence.get() ? same_dp && same_tp && same_pp
                                                                 : same_tp && same_pp;
            if (member) expected += q;
          }
          EXPECT_EQ(sum, expected);
        }
      }
    }
  }
}

// The last rank stalls; every other rank's all-reduce must end with CollectiveTimeout naming the operation and
// the rank within the timeout plus a margin. The stalled rank then joins late, so the abandoned all-reduce
// completes in the background and the job can finish cleanly (its communicator and buffer are deliberately kept
// alive).
TEST(MpiCollectives, StalledRankTimesOutTheOthers) {
  // Its own communicator, so the late collective matches nothing else; kept alive (with the buffer) until the
  // process ends, since MPI still completes the abandoned all-reduce in the background.
  static Communicator* comm = world(1.0)->split(0, 0).release();
  const int n = comm->size(), r = comm->rank();
  static std::vector<float> data(16, 1.0f);
  if (r == n - 1) {
    std::this_thread::sleep_for(std::chrono::seconds(3));
    comm->all_reduce(data.data(), 16);  // the others posted theirs long ago: completes at once
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  try {
    comm->all_reduce(data.data(), 16);
    ADD_FAILURE() << "the all-reduce completed without the stalled rank";
  } catch (const CollectiveTimeout& e) {
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const std::string message = e.what();
    EXPECT_NE(message.find("all_reduce of 16 elements"), std::string::npos) << message;
    EXPECT_NE(message.find("world rank " + std::to_string(r)), std::string::npos) << message;
    EXPECT_GE(waited, 1.0);
    EXPECT_LT(waited, 2.5);
  }
}

}  // namespace
}  // namespace proplab::dist

int main(int argc, char** argv) { return proplab::testing::run_mpi_tests(argc, argv); }
