// The emulated NCCL itself (kernels/emulation/nccl.cpp, PROPLAB_CUDA=EMULATE with MPI), on 2 and 4 ranks with
// PROPLAB_EMU_DEVICES=4: what proplab's NCCL backend does not reach through the Communicator (every reduction on
// integer and floating types, in and out of place, ncclReduce, in-place all-gather and reduce-scatter, groups that
// mix sends, receives and collectives, NCCL_SPLIT_NOCOLOR) and the checks it makes (host buffers, the wrong
// device, bad ranks, a mismatched ncclCommInitRank).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <mpi.h>
#include <nccl.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "mpi_test_main.h"

namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// A communicator over the whole world, on device world_rank().
ncclComm_t world_comm() {
  EXPECT_EQ(cudaSetDevice(world_rank()), cudaSuccess);
  ncclUniqueId id;
  if (world_rank() == 0) {
    EXPECT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  }
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm = nullptr;
  EXPECT_EQ(ncclCommInitRank(&comm, world_size(), id, world_rank()), ncclSuccess);
  return comm;
}

template <typename T>
T* device_copy(const std::vector<T>& host) {
  T* d = nullptr;
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), host.size() * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(d, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return d;
}

template <typename T>
std::vector<T> host_copy(const T* d, std::size_t n) {
  std::vector<T> host(n);
  EXPECT_EQ(cudaMemcpy(host.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return host;
}

TEST(NcclEmulator, CommunicatorQueries) {
  ncclComm_t comm = world_comm();
  int count = 0, rank = -1, device = -1, version = 0;
  ncclResult_t async = ncclInternalError;
  EXPECT_EQ(ncclCommCount(comm, &count), ncclSuccess);
  EXPECT_EQ(ncclCommUserRank(comm, &rank), ncclSuccess);
  EXPECT_EQ(ncclCommCuDevice(comm, &device), ncclSuccess);
  EXPECT_EQ(ncclCommGetAsyncError(comm, &async), ncclSuccess);
  EXPECT_EQ(ncclGetVersion(&version), ncclSuccess);
  EXPECT_EQ(count, world_size());
  EXPECT_EQ(rank, world_rank());
  EXPECT_EQ(device, world_rank());
  EXPECT_EQ(async, ncclSuccess);
  EXPECT_EQ(version, NCCL_VERSION_CODE);
  EXPECT_STREQ(ncclGetErrorString(ncclInvalidArgument), "invalid argument (run with NCCL_DEBUG=WARN for details)");
  ncclUniqueId a, b;
  ASSERT_EQ(ncclGetUniqueId(&a), ncclSuccess);
  ASSERT_EQ(ncclGetUniqueId(&b), ncclSuccess);
  EXPECT_NE(std::memcmp(&a, &b, sizeof a), 0);
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

// sum, prod, max, min, avg on int32, int64, uint8, float32 and float64; out of place, then in place.
TEST(NcclEmulator, AllReduceEveryOpAndType) {
  ncclComm_t comm = world_comm();
  const int n = world_size(), r = world_rank();
  for (bool in_place : {false, true}) {
    for (ncclRedOp_t op : {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg}) {
      // rank r holds r + 1 + i: on 4 ranks the largest product is 2·3·4·5 = 120, exact in every type.
      auto expect = [&](int i) {
        double sum = 0, prod = 1, high = -1e300, low = 1e300;
        for (int q = 0; q < n; ++q) {
          const double v = q + 1 + i;
          sum += v, prod *= v, high = std::max(high, v), low = std::min(low, v);
        }
        return op == ncclSum ? sum : op == ncclProd ? prod : op == ncclMax ? high : op == ncclMin ? low : sum / n;
      };
      auto check = [&](auto zero, ncclDataType_t type, const char* name) {
        using T = decltype(zero);
        const int count = 2;
        std::vector<T> host(count);
        for (int i = 0; i < count; ++i) host[i] = static_cast<T>(r + 1 + i);
        T* send = device_copy(host);
        T* receive = in_place ? send : device_copy(std::vector<T>(count));
        ASSERT_EQ(ncclAllReduce(send, receive, count, type, op, comm, nullptr), ncclSuccess) << name;
        const std::vector<T> got = host_copy(receive, count);
        for (int i = 0; i < count; ++i)
          EXPECT_EQ(got[i], static_cast<T>(expect(i))) << name << " op " << op << " in place " << in_place;
        cudaFree(send);
        if (!in_place) cudaFree(receive);
      };
      check(std::int32_t{}, ncclInt32, "int32");
      check(std::int64_t{}, ncclInt64, "int64");
      check(std::uint8_t{}, ncclUint8, "uint8");
      check(float{}, ncclFloat32, "float32");
      check(double{}, ncclFloat64, "float64");
    }
  }
  ncclCommDestroy(comm);
}

TEST(NcclEmulator, ReduceAndInPlaceGathers) {
  ncclComm_t comm = world_comm();
  const int n = world_size(), r = world_rank();
  // ncclReduce to the last rank: only it receives.
  float* send = device_copy(std::vector<float>{static_cast<float>(r), 1.0f});
  float* receive = device_copy(std::vector<float>{-1.0f, -1.0f});
  ASSERT_EQ(ncclReduce(send, receive, 2, ncclFloat32, ncclSum, n - 1, comm, nullptr), ncclSuccess);
  const std::vector<float> reduced = host_copy(receive, 2);
  if (r == n - 1)
    EXPECT_EQ(reduced, (std::vector<float>{n * (n - 1) / 2.0f, static_cast<float>(n)}));
  else
    EXPECT_EQ(reduced, (std::vector<float>{-1.0f, -1.0f}));
  cudaFree(send);
  cudaFree(receive);
  // All-gather in place: this rank's block already sits at its place in the receive buffer.
  const int per = 3;
  std::vector<std::int32_t> host(n * per, -1);
  for (int i = 0; i < per; ++i) host[r * per + i] = 10 * r + i;
  std::int32_t* whole = device_copy(host);
  ASSERT_EQ(ncclAllGather(whole + r * per, whole, per, ncclInt32, comm, nullptr), ncclSuccess);
  const std::vector<std::int32_t> gathered = host_copy(whole, n * per);
  for (int q = 0; q < n; ++q)
    for (int i = 0; i < per; ++i) EXPECT_EQ(gathered[q * per + i], 10 * q + i);
  // Reduce-scatter in place: the result lands on this rank's block of the input.
  for (int i = 0; i < n * per; ++i) host[i] = i + r;
  cudaMemcpy(whole, host.data(), host.size() * 4, cudaMemcpyHostToDevice);
  ASSERT_EQ(ncclReduceScatter(whole, whole + r * per, per, ncclInt32, ncclSum, comm, nullptr), ncclSuccess);
  const std::vector<std::int32_t> scattered = host_copy(whole + r * per, per);
  for (int i = 0; i < per; ++i) EXPECT_EQ(scattered[i], n * (r * per + i) + n * (n - 1) / 2);
  cudaFree(whole);
  ncclCommDestroy(comm);
}

// One group: a ring of sends posted before the receives, and an all-reduce in the middle; nothing deadlocks and
// every result is there after ncclGroupEnd.
TEST(NcclEmulator, GroupsMixSendsReceivesAndCollectives) {
  ncclComm_t comm = world_comm();
  const int n = world_size(), r = world_rank();
  const int count = 1 << 18;
  float* out = device_copy(std::vector<float>(count, static_cast<float>(r)));
  float* in = device_copy(std::vector<float>(count, -1.0f));
  double* total = device_copy(std::vector<double>{static_cast<double>(r)});
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);  // nested
  ASSERT_EQ(ncclSend(out, count, ncclFloat32, (r + 1) % n, comm, nullptr), ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);  // inner: nothing runs yet
  ASSERT_EQ(ncclAllReduce(total, total, 1, ncclFloat64, ncclSum, comm, nullptr), ncclSuccess);
  ASSERT_EQ(ncclRecv(in, count, ncclFloat32, (r + n - 1) % n, comm, nullptr), ncclSuccess);
  EXPECT_EQ(host_copy(total, 1)[0], static_cast<double>(r));  // queued, not run
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  EXPECT_EQ(host_copy(total, 1)[0], n * (n - 1) / 2.0);
  const std::vector<float> got = host_copy(in, count);
  EXPECT_EQ(got.front(), static_cast<float>((r + n - 1) % n));
  EXPECT_EQ(got.back(), static_cast<float>((r + n - 1) % n));
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);  // unbalanced
  cudaFree(out);
  cudaFree(in);
  cudaFree(total);
  ncclCommDestroy(comm);
}

TEST(NcclEmulator, SplitWithNoColourGivesNoCommunicator) {
  ncclComm_t comm = world_comm();
  const int r = world_rank();
  ncclComm_t child = reinterpret_cast<ncclComm_t>(&comm);  // must be overwritten
  ASSERT_EQ(ncclCommSplit(comm, r == 0 ? NCCL_SPLIT_NOCOLOR : 5, 0, &child, nullptr), ncclSuccess);
  if (r == 0) {
    EXPECT_EQ(child, nullptr);
  } else {
    ASSERT_NE(child, nullptr);
    int count = 0, rank = -1;
    ncclCommCount(child, &count);
    ncclCommUserRank(child, &rank);
    EXPECT_EQ(count, world_size() - 1);
    EXPECT_EQ(rank, r - 1);
    EXPECT_EQ(ncclCommAbort(child), ncclSuccess);
  }
  ncclCommDestroy(comm);
}

// Host buffers, another device's memory and bad ranks are refused before anything is sent (so no rank waits).
TEST(NcclEmulator, RefusesWhatAGpuCouldNotDo) {
  ncclComm_t comm = world_comm();
  const int n = world_size(), r = world_rank();
  std::vector<float> host(4, 1.0f);
  EXPECT_EQ(ncclAllReduce(host.data(), host.data(), 4, ncclFloat32, ncclSum, comm, nullptr), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(comm)).find("not inside device or pinned host memory"), std::string::npos);
  float* d = device_copy(host);
  EXPECT_EQ(ncclAllReduce(d, d, 5, ncclFloat32, ncclSum, comm, nullptr), ncclInvalidArgument);  // past the end
  EXPECT_EQ(ncclSend(d, 4, ncclFloat32, n, comm, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclBroadcast(d, d, 4, ncclFloat32, -1, comm, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(d, d, 4, ncclFloat16, ncclSum, comm, nullptr), ncclInvalidArgument);
  // Memory of another device: allocated after switching to it.
  ASSERT_EQ(cudaSetDevice((r + 1) % n), cudaSuccess);
  float* other = device_copy(host);
  ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
  EXPECT_EQ(ncclAllReduce(other, other, 4, ncclFloat32, ncclSum, comm, nullptr), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(comm)).find("allocated on device"), std::string::npos);
  // Pinned host memory is mapped, so it is accepted.
  float* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(reinterpret_cast<void**>(&pinned), 16), cudaSuccess);
  for (int i = 0; i < 4; ++i) pinned[i] = 1.0f;
  EXPECT_EQ(ncclAllReduce(pinned, pinned, 4, ncclFloat32, ncclSum, comm, nullptr), ncclSuccess);
  EXPECT_EQ(pinned[3], static_cast<float>(n));
  cudaFreeHost(pinned);
  cudaFree(other);
  cudaFree(d);
  ncclCommDestroy(comm);
}

// Every rank calls ncclCommInitRank; ranks that disagree on the rank count all get ncclInvalidArgument.
TEST(NcclEmulator, MismatchedInitFailsEverywhere) {
  ncclUniqueId id;
  if (world_rank() == 0) {
    EXPECT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  }
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm = nullptr;
  EXPECT_EQ(ncclCommInitRank(&comm, world_size() + 1, id, world_rank()), ncclInvalidArgument);
  EXPECT_EQ(comm, nullptr);
}

}  // namespace

int main(int argc, char** argv) { return proplab::testing::run_mpi_tests(argc, argv); }
