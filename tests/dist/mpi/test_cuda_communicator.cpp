// dist/cuda_communicator on 2 and 4 ranks: host buffers go over MPI unchanged (every build); device buffers are
// staged through pinned host memory (runs where there is a GPU, the emulated one included; skips otherwise): every
// collective gives MPI's exact result, started all-reduces complete out of order, a split keeps both sides, a call
// mixing a device and a host buffer is refused, and make_cuda_world refuses an unknown parallel.comm on every rank.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "core/tensor.h"
#include "dist/communicator.h"
#include "dist/cuda_communicator.h"
#include "mpi_test_main.h"

namespace proplab::dist {
namespace {

float value(int rank, int i) { return static_cast<float>(rank * 1000 + i) * 0.5f; }

std::unique_ptr<Communicator> staged() { return make_cuda_communicator(make_mpi_world(60.0), nullptr); }

// A device tensor holding `values`, and its values read back.
Tensor on_gpu(const std::vector<float>& values) {
  Tensor t = Tensor::empty({static_cast<std::int64_t>(values.size())}, DType::f32, Device::cuda);
  t.copy_from(Tensor::from_vector({static_cast<std::int64_t>(values.size())}, values));
  return t;
}
std::vector<float> read(const Tensor& t) { return t.to_vector(); }

#define REQUIRE_GPU()                                                 \
  if (!cuda_available())                                              \
  GTEST_SKIP() << "no CUDA GPU here (or no CUDA in this build): the " \
                  "staged device path runs where there is one"

// First: the GPU is chosen before anything else in the process touches CUDA.
TEST(CudaCommunicator, StagedWorldPicksTheNodeLocalGpuModuloTheGpus) {
  REQUIRE_GPU();
  CudaRanks ranks;
  auto world = make_cuda_world(make_mpi_world(60.0), "staged", 60.0, &ranks);
  EXPECT_EQ(ranks.transport, DeviceTransport::staged);
  EXPECT_EQ(ranks.ranks_on_node, world->size());  // (one node under ctest)
  EXPECT_EQ(ranks.local_rank, world->rank());
  EXPECT_EQ(ranks.ordinal, world->rank() % ranks.gpus);
}

TEST(CudaCommunicator, HostBuffersGoOverMpiUnchanged) {
  auto comm = staged();
  const int n = comm->size(), r = comm->rank();
  std::vector<float> data(100);
  for (int i = 0; i < 100; ++i) data[i] = value(r, i);
  comm->all_reduce(data.data(), 100, ReduceOp::sum);
  for (int i = 0; i < 100; ++i) {
    double expected = 0;
    for (int q = 0; q < n; ++q) expected += value(q, i);
    ASSERT_EQ(data[i], static_cast<float>(expected));
  }
  double flag = r;
  comm->all_reduce(&flag, 1, ReduceOp::max);
  EXPECT_EQ(flag, n - 1);
  EXPECT_EQ(comm->bytes_communicated(Traffic::all_reduce), 100 * 4 + 8);
  EXPECT_STREQ(comm->backend(), "staged+mpi");
}

TEST(CudaCommunicator, StagedAllReduceReduceScatterAllGatherBroadcast) {
  REQUIRE_GPU();
  auto comm = staged();
  const int n = comm->size(), r = comm->rank();
  const int per_rank = 5, count = n * per_rank;
  std::vector<float> mine(count);
  for (int i = 0; i < count; ++i) mine[i] = value(r, i);
  std::vector<double> sums(count);
  for (int i = 0; i < count; ++i)
    for (int q = 0; q < n; ++q) sums[i] += value(q, i);

  Tensor reduced = on_gpu(mine);
  comm->all_reduce(reduced.f32(), count, ReduceOp::sum);
  std::vector<float> got = read(reduced);
  for (int i = 0; i < count; ++i) ASSERT_EQ(got[i], static_cast<float>(sums[i])) << i;

  Tensor largest = on_gpu(mine);
  comm->all_reduce(largest.f32(), count, ReduceOp::max);
  got = read(largest);
  for (int i = 0; i < count; ++i) ASSERT_EQ(got[i], value(n - 1, i));

  {
    Tensor storage = Tensor::empty({4}, DType::f32, Device::cuda);  // room for two doubles on the GPU
    double host[2] = {r + 0.25, -static_cast<double>(r)};
    copy_host_to_device(storage.raw(), host, sizeof host);
    comm->all_reduce(static_cast<double*>(storage.raw()), 2, ReduceOp::sum);
    copy_device_to_host(host, storage.raw(), sizeof host);
    EXPECT_EQ(host[0], n * (n - 1) / 2.0 + 0.25 * n);
    EXPECT_EQ(host[1], -n * (n - 1) / 2.0);
  }

  Tensor send = on_gpu(mine), part = Tensor::empty({per_rank}, DType::f32, Device::cuda);
  comm->reduce_scatter(send.f32(), part.f32(), per_rank);
  got = read(part);
  for (int i = 0; i < per_rank; ++i) ASSERT_EQ(got[i], static_cast<float>(sums[r * per_rank + i]));

  Tensor whole = Tensor::empty({count}, DType::f32, Device::cuda);
  comm->all_gather(part.f32(), whole.f32(), per_rank);
  got = read(whole);
  for (int i = 0; i < count; ++i) ASSERT_EQ(got[i], static_cast<float>(sums[i]));

  for (int root = 0; root < n; ++root) {
    Tensor b = on_gpu(mine);
    comm->broadcast(b.raw(), count * 4, root);
    got = read(b);
    for (int i = 0; i < count; ++i) ASSERT_EQ(got[i], value(root, i)) << "root " << root;
  }
  // Payload counted as the host backends count it.
  EXPECT_EQ(comm->bytes_communicated(Traffic::all_reduce), 2 * count * 4 + 16);
  EXPECT_EQ(comm->bytes_communicated(Traffic::reduce_scatter), count * 4);
  EXPECT_EQ(comm->bytes_communicated(Traffic::all_gather), per_rank * 4);
}

TEST(CudaCommunicator, StagedPointToPointAndRing) {
  REQUIRE_GPU();
  auto comm = staged();
  const int n = comm->size(), r = comm->rank();
  const int count = 33;
  std::vector<float> mine(count);
  for (int i = 0; i < count; ++i) mine[i] = value(r, i);
  // Pairs (0, 1), (2, 3): the even rank sends first.
  const int peer = r ^ 1;
  if (peer < n) {
    Tensor out = on_gpu(mine), in = Tensor::empty({count}, DType::f32, Device::cuda);
    if (r % 2 == 0) {
      comm->send(out.f32(), count, peer, 7);
      comm->receive(in.f32(), count, peer, 8);
    } else {
      comm->receive(in.f32(), count, peer, 7);
      comm->send(out.f32(), count, peer, 8);
    }
    const std::vector<float> got = read(in);
    for (int i = 0; i < count; ++i) ASSERT_EQ(got[i], value(peer, i));
  }
  // A ring in which every rank sends before it receives.
  Tensor out = on_gpu(mine), in = Tensor::empty({count}, DType::f32, Device::cuda);
  comm->send_receive(out.f32(), (r + 1) % n, in.f32(), (r + n - 1) % n, count, 3);
  const std::vector<float> got = read(in);
  for (int i = 0; i < count; ++i) ASSERT_EQ(got[i], value((r + n - 1) % n, i));
}

TEST(CudaCommunicator, StartedAllReducesCompleteInAnyOrder) {
  REQUIRE_GPU();
  auto comm = staged();
  const int n = comm->size(), r = comm->rank();
  std::vector<Tensor> buckets;
  std::vector<std::unique_ptr<PendingCollective>> pending;
  for (int b = 0; b < 3; ++b) {
    std::vector<float> mine(10 + b);
    for (int i = 0; i < 10 + b; ++i) mine[i] = value(r, 100 * b + i);
    buckets.push_back(on_gpu(mine));
    pending.push_back(comm->start_all_reduce(buckets.back().f32(), 10 + b));
  }
  for (int b = 2; b >= 0; --b) {  // completed last to first: each has its own staging buffer
    pending[b]->test();
    pending[b]->wait();
    EXPECT_TRUE(pending[b]->test());
    const std::vector<float> got = read(buckets[b]);
    for (int i = 0; i < 10 + b; ++i) {
      double expected = 0;
      for (int q = 0; q < n; ++q) expected += value(q, 100 * b + i);
      ASSERT_EQ(got[i], static_cast<float>(expected)) << "bucket " << b;
    }
  }
}

TEST(CudaCommunicator, SplitKeepsTheStagedPath) {
  REQUIRE_GPU();
  auto comm = staged();
  const int r = comm->rank();
  auto half = comm->split(r % 2, r);
  EXPECT_STREQ(half->backend(), "staged+mpi");
  Tensor t = on_gpu({static_cast<float>(r)});
  half->all_reduce(t.f32(), 1, ReduceOp::sum);
  float expected = 0;
  for (int q = r % 2; q < comm->size(); q += 2) expected += static_cast<float>(q);
  EXPECT_EQ(read(t)[0], expected);
}

TEST(CudaCommunicator, RefusesOneDeviceAndOneHostBuffer) {
  REQUIRE_GPU();
  auto comm = staged();
  Tensor device = Tensor::zeros({4 * comm->size()}, DType::f32, Device::cuda);
  std::vector<float> host(4);
  EXPECT_THROW(comm->reduce_scatter(device.f32(), host.data(), 4), InternalError);
}

TEST(CudaCommunicator, UnknownTransportIsRefusedNamingTheKey) {
  try {
    make_cuda_world(make_mpi_world(60.0), "infiniband", 60.0);
    FAIL() << "an unknown parallel.comm was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.comm = \"infiniband\""), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace proplab::dist

int main(int argc, char** argv) { return proplab::testing::run_mpi_tests(argc, argv); }
