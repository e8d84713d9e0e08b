// dist, NCCL backend: every collective of the Communicator on 2 and 4 ranks (ctest runs this binary under
// mpirun --oversubscribe), on device buffers from cudaMalloc, through the public API only (make_mpi_world, then
// make_nccl_world). On the emulated GPU (PROPLAB_EMU_DEVICES=4: one node with four GPUs) NCCL is emulated over MPI
// (kernels/emulation/nccl.cpp); on a real CUDA build it needs one GPU per rank of the node and skips, saying so,
// with fewer. Each rank runs every test; a failure on any rank fails the run.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dist/communicator.h"
#include "dist/nccl_communicator.h"
#include "mpi_test_main.h"

namespace proplab::dist {
namespace {

// Why this job cannot run the NCCL tests ("" when it can), the same answer on every rank.
std::string skip_reason() {
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int on_node = 0;
  MPI_Comm_size(node, &on_node);
  MPI_Comm_free(&node);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  cudaGetLastError();
  int missing = !nccl_available() || devices < on_node;
  MPI_Allreduce(MPI_IN_PLACE, &missing, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (!missing) return "";
  if (!nccl_available()) return "this build has no NCCL backend";
  return "NCCL needs one GPU per rank: " + std::to_string(on_node) + " ranks on this node, " + std::to_string(devices) +
         " GPU(s) (on the emulated GPU set PROPLAB_EMU_DEVICES)";
}

#define SKIP_WITHOUT_GPUS()                                                       \
  do {                                                                            \
    if (const std::string why = skip_reason(); !why.empty()) GTEST_SKIP() << why; \
  } while (0)

// A world of NCCL over the MPI world's processes. The MPI world carries the bootstrap and must outlive nothing
// here but the construction.
std::unique_ptr<Communicator> nccl_world(double timeout_s = 60.0) {
  auto mpi = make_mpi_world(timeout_s);
  return make_nccl_world(*mpi, timeout_s);
}

// A device buffer of n elements of T, filled from and read back to host vectors.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t n) : n_(n) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&data_), n * sizeof(T)), cudaSuccess);
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  ~DeviceBuffer() { cudaFree(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void upload(const std::vector<T>& host) {
    ASSERT_EQ(host.size(), n_);
    ASSERT_EQ(cudaMemcpy(data_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    EXPECT_EQ(cudaMemcpy(host.data(), data_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }
  T* get() { return data_; }

 private:
  T* data_ = nullptr;
  std::size_t n_;
};

// A value only rank r's element i has: distinct across ranks and elements, exact in float (sums too).
float value(int rank, int i) { return static_cast<float>(rank * 1000 + i) * 0.5f; }

TEST(NcclCollectives, WorldHasOneGpuPerRank) {
  SKIP_WITHOUT_GPUS();
  auto comm = nccl_world();
  int world_size = 0, world_rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  EXPECT_EQ(comm->size(), world_size);
  EXPECT_EQ(comm->rank(), world_rank);
  EXPECT_STREQ(comm->backend(), "nccl");
  // One node here: rank r took GPU r.
  int device = -1;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int local = 0;
  MPI_Comm_rank(node, &local);
  MPI_Comm_free(&node);
  EXPECT_EQ(device, local);
}

TEST(NcclCollectives, AllReduceSumMaxMinFloatAndDouble) {
  SKIP_WITHOUT_GPUS();
  auto comm = nccl_world();
  const int n = comm->size(), r = comm->rank();
  const int count = 1000;
  std::vector<float> host(count);
  for (int i = 0; i < count; ++i) host[i] = value(r, i);
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min}) {
    DeviceBuffer<float> data(host);
    comm->all_reduce(data.get(), count, op);
    const std::vector<float> got = data.download();
    for (int i = 0; i < count; ++i) {
      double expected = op == ReduceOp::sum ? 0.0 : value(0, i);
      for (int q = 0; q < n; ++q) {
        const double v = value(q, i);
        expected = op == ReduceOp::sum   ? expected + v
                   : op == ReduceOp::max ? std::max(expected, v)
                                         : std::min(expected, v);
      }
      ASSERT_EQ(got[i], static_cast<float>(expected)) << "op " << static_cast<int>(op) << " element " << i;
    }
  }
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min}) {
    // r + 0.25·i and its negative: the sum, max and min over ranks are exact in double.
    std::vector<double> values{static_cast<double>(r), -static_cast<double>(r), 0.25 * r + 1e-3};
    DeviceBuffer<double> data(values);
    comm->all_reduce(data.get(), 3, op);
    const std::vector<double> got = data.download();
    double sum = 0, low = 1e300, high = -1e300;
    for (int q = 0; q < n; ++q) {
      sum += 0.25 * q + 1e-3;
      low = std::min(low, 0.25 * q + 1e-3);
      high = std::max(high, 0.25 * q + 1e-3);
    }
    const double total = n * (n - 1) / 2.0;
    if (op == ReduceOp::sum) {
      EXPECT_EQ(got[0], total);
      EXPECT_EQ(got[1], -total);
      EXPECT_NEAR(got[2], sum, 1e-12);
    } else if (op == ReduceOp::max) {
      EXPECT_EQ(got[0], n - 1);
      EXPECT_EQ(got[1], 0.0);
      EXPECT_EQ(got[2], high);
    } else {
      EXPECT_EQ(got[0], 0.0);
      EXPECT_EQ(got[1], -(n - 1.0));
      EXPECT_EQ(got[2], low);
    }
  }
  EXPECT_EQ(comm->bytes_communicated(Traffic::all_reduce), 3 * 4 * count + 3 * 8 * 3);
}

TEST(NcclCollectives, ReduceScatterAndAllGather) {
  SKIP_WITHOUT_GPUS();
  auto comm = nccl_world();
  const int n = comm->size(), r = comm->rank();
  const int per_rank = 7;
  std::vector<float> host(n * per_rank);
  for (int i = 0; i < n * per_rank; ++i) host[i] = value(r, i);
  DeviceBuffer<float> send(host), part(per_rank), whole(n * per_rank);
  comm->reduce_scatter(send.get(), part.get(), per_rank);
  const std::vector<float> got = part.download();
  for (int i = 0; i < per_rank; ++i) {
    double expected = 0;
    for (int q = 0; q < n; ++q) expected += value(q, r * per_rank + i);
    ASSERT_EQ(got[i], static_cast<float>(expected)) << i;
  }
  comm->all_gather(part.get(), whole.get(), per_rank);
  const std::vector<float> gathered = whole.download();
  for (int block = 0; block < n; ++block)
    for (int i = 0; i < per_rank; ++i) {
      double expected = 0;
      for (int q = 0; q < n; ++q) expected += value(q, block * per_rank + i);
      ASSERT_EQ(gathered[block * per_rank + i], static_cast<float>(expected)) << block << " " << i;
    }
  EXPECT_EQ(comm->bytes_communicated(Traffic::reduce_scatter), 4 * n * per_rank);
  EXPECT_EQ(comm->bytes_communicated(Traffic::all_gather), 4 * per_rank);
}

TEST(NcclCollectives, BroadcastFromEachRoot) {
  SKIP_WITHOUT_GPUS();
  auto comm = nccl_world();
  const int n = comm->size(), r = comm->rank();
  for (int root = 0; root < n; ++root) {
    std::vector<std::uint64_t> host(3, 0);
    if (r == root) host = {0xfeedbeefULL + root, 17ULL * root, ~std::uint64_t{0} - root};
    DeviceBuffer<std::uint64_t> data(host);
    comm->broadcast(data.get(), 3 * sizeof(std::uint64_t), root);
    const std::vector<std::uint64_t> want{0xfeedbeefULL + root, 17ULL * root, ~std::uint64_t{0} - root};
    EXPECT_EQ(data.download(), want) << "root " << root;
  }
  // A broadcast counts its buffer on the root only.
  EXPECT_EQ(comm->bytes_communicated(Traffic::broadcast), 3 * 8);
}

TEST(NcclCollectives, SendReceiveBetweenPairsAndBarrier) {
  SKIP_WITHOUT_GPUS();
  auto comm = nccl_world();
  const int n = comm->size(), r = comm->rank();
  // Pairs (0, 1), (2, 3), ...: the even rank sends first, then receives the odd rank's answer.
  const int partner = r ^ 1;
  if (partner < n) {
    std::vector<float> mine(5);
    for (int i = 0; i < 5; ++i) mine[i] = value(r, i);
    DeviceBuffer<float> out(mine), in(5);
    if (r % 2 == 0) {
      comm->send(out.get(), 5, partner, 3);
      comm->receive(in.get(), 5, partner, 4);
    } else {
      comm->receive(in.get(), 5, partner, 3);
      comm->send(out.get(), 5, partner, 4);
    }
    const std::vector<float> got = in.download();
    for (int i = 0; i < 5; ++i) EXPECT_EQ(got[i], value(partner, i)) << i;
    EXPECT_EQ(comm->bytes_communicated(Traffic::send), 5 * 4);
  }
  comm->barrier();
}

// Every rank sends right and left at once (send_receive, one NCCL group each): no deadlock, even far beyond any
// eager limit.
TEST(NcclCollectives, SendReceiveAroundTheRing) {
  SKIP_WITHOUT_GPUS();
  auto comm = nccl_world();
  const int n = comm->size(), r = comm->rank();
  const int count = 1 << 18;  // 1 MiB
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  std::vector<float> host(count);
  for (int i = 0; i < count; ++i) host[i] = value(r, i % 1000);
  DeviceBuffer<float> mine(host), from_left(count), from_right(count);
  comm->send_receive(mine.get(), right, from_left.get(), left, count, 7);
  comm->send_receive(mine.get(), left, from_right.get(), right, count, 8);
  const std::vector<float> got_left = from_left.download(), got_right = from_right.download();
  for (int i = 0; i < count; i += 997) {
    ASSERT_EQ(got_left[i], value(left, i % 1000)) << i;
    ASSERT_EQ(got_right[i], value(right, i % 1000)) << i;
  }
  EXPECT_EQ(comm->bytes_communicated(Traffic::send), 2 * 4 * std::int64_t{count});
}

// Two halves (the lower ranks and the upper ones, ranked in reverse by key), each with its own collectives.
TEST(NcclCollectives, SplitIntoHalves) {
  SKIP_WITHOUT_GPUS();
  auto comm = nccl_world();
  const int n = comm->size(), r = comm->rank();
  const int half = n / 2, color = r < half ? 0 : 1;
  const int first = color == 0 ? 0 : half, members = color == 0 ? half : n - half;
  auto group = comm->split(color, -r);
  ASSERT_EQ(group->size(), members);
  EXPECT_EQ(group->rank(), first + members - 1 - r);
  DeviceBuffer<float> data(std::vector<float>{static_cast<float>(r), 1.0f});
  group->all_reduce(data.get(), 2, ReduceOp::sum);
  double expected = 0;
  for (int q = first; q < first + members; ++q) expected += q;
  EXPECT_EQ(data.download(), (std::vector<float>{static_cast<float>(expected), static_cast<float>(members)}));
  // A broadcast from the group's rank 0 (the highest world rank of the half).
  DeviceBuffer<std::int32_t> token(std::vector<std::int32_t>{group->rank() == 0 ? 100 + r : -1});
  group->broadcast(token.get(), sizeof(std::int32_t), 0);
  EXPECT_EQ(token.download(), std::vector<std::int32_t>{100 + first + members - 1});
  // The parent still works after the split.
  DeviceBuffer<double> one(std::vector<double>{1.0});
  comm->all_reduce(one.get(), 1, ReduceOp::sum);
  EXPECT_EQ(one.download(), std::vector<double>{static_cast<double>(n)});
}

TEST(NcclCollectives, StartAllReduceThenWait) {
  SKIP_WITHOUT_GPUS();
  auto comm = nccl_world();
  const int n = comm->size(), r = comm->rank();
  std::vector<std::unique_ptr<DeviceBuffer<float>>> buckets;
  std::vector<std::unique_ptr<PendingCollective>> pending;
  for (int b = 0; b < 3; ++b) {
    std::vector<float> host(5000);
    for (int i = 0; i < 5000; ++i) host[i] = value(r, i % 1000) + static_cast<float>(b);
    buckets.push_back(std::make_unique<DeviceBuffer<float>>(host));
    pending.push_back(comm->start_all_reduce(buckets[b]->get(), 5000));
  }
  pending[1]->test();
  for (int b = 2; b >= 0; --b) pending[b]->wait();
  EXPECT_TRUE(pending[0]->test());
  for (int b = 0; b < 3; ++b) {
    const std::vector<float> got = buckets[b]->download();
    for (int i = 0; i < 5000; i += 101) {
      double expected = 0;
      for (int q = 0; q < n; ++q) expected += value(q, i % 1000) + b;
      ASSERT_EQ(got[i], static_cast<float>(expected)) << b << " " << i;
    }
  }
  EXPECT_EQ(comm->bytes_communicated(Traffic::all_reduce), 3 * 4 * 5000);
}

}  // namespace
}  // namespace proplab::dist

int main(int argc, char** argv) { return proplab::testing::run_mpi_tests(argc, argv); }
