// The NCCL backend (CUDA device buffers), built when CUDA and NCCL are found (PROPLAB_WITH_NCCL). Bootstrap as
// NCCL documents it: ranks learn their node-local rank over MPI, pick that GPU, rank 0 creates the unique id and
// broadcasts it over MPI, then every rank joins with ncclCommInitRank. Collectives run on the communicator's own
// stream and are completed by polling the stream against the deadline; on timeout the NCCL communicator is
// aborted (so no kernel waits forever) and CollectiveTimeout is thrown.
#include "dist/nccl_communicator.h"

#include <chrono>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "core/error.h"

#ifdef PROPLAB_WITH_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#endif

namespace proplab::dist {

#ifdef PROPLAB_WITH_NCCL

namespace {

void check_cuda(cudaError_t code, const char* what) {
  PROPLAB_CHECK(code == cudaSuccess, "CUDA ", what, " failed: ", cudaGetErrorString(code));
}
void check_nccl(ncclResult_t code, const char* what) {
  PROPLAB_CHECK(code == ncclSuccess, "NCCL ", what, " failed: ", ncclGetErrorString(code));
}

ncclRedOp_t to_nccl(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return ncclSum;
    case ReduceOp::max:
      return ncclMax;
    case ReduceOp::min:
      return ncclMin;
  }
  return ncclSum;
}

// This rank's index among the ranks on its node: ranks broadcast their host name hashes in turn.
int node_local_rank(Communicator& world, int& ranks_on_node) {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  const std::uint64_t mine = std::hash<std::string>{}(host);
  int local = 0;
  ranks_on_node = 0;
  for (int r = 0; r < world.size(); ++r) {
    std::uint64_t theirs = mine;
    world.broadcast(&theirs, sizeof(theirs), r);
    if (theirs == mine) {
      if (r < world.rank()) ++local;
      ++ranks_on_node;
    }
  }
  return local;
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, cudaStream_t stream, int rank, int size, double timeout_s)
      : comm_(comm), stream_(stream), rank_(rank), size_(size), timeout_s_(timeout_s) {}
  ~NcclCommunicator() override {
    if (comm_) ncclCommDestroy(comm_);
    if (stream_) cudaStreamDestroy(stream_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "nccl"; }

  void all_reduce(float* data, std::int64_t count, ReduceOp op) override {
    check_nccl(ncclAllReduce(data, data, static_cast<std::size_t>(count), ncclFloat32, to_nccl(op), comm_, stream_),
               "ncclAllReduce");
    count_bytes(Traffic::all_reduce, count * 4);
    wait("all_reduce", count);
  }
  void all_reduce(double* data, std::int64_t count, ReduceOp op) override {
    check_nccl(ncclAllReduce(data, data, static_cast<std::size_t>(count), ncclFloat64, to_nccl(op), comm_, stream_),
               "ncclAllReduce");
    count_bytes(Traffic::all_reduce, count * 8);
    wait("all_reduce", count);
  }
  void reduce_scatter(const float* send, float* receive, std::int64_t count) override {
    check_nccl(ncclReduceScatter(send, receive, static_cast<std::size_t>(count), ncclFloat32, ncclSum, comm_, stream_),
               "ncclReduceScatter");
    count_bytes(Traffic::reduce_scatter, count * size_ * 4);
    wait("reduce_scatter", count * size_);
  }
  void all_gather(const float* send, float* receive, std::int64_t count) override {
    check_nccl(ncclAllGather(send, receive, static_cast<std::size_t>(count), ncclFloat32, comm_, stream_),
               "ncclAllGather");
    count_bytes(Traffic::all_gather, count * 4);
    wait("all_gather", count * size_);
  }
  void broadcast(void* data, std::int64_t bytes, int root) override {
    check_nccl(ncclBroadcast(data, data, static_cast<std::size_t>(bytes), ncclUint8, root, comm_, stream_),
               "ncclBroadcast");
    if (rank_ == root) count_bytes(Traffic::broadcast, bytes);
    wait("broadcast", bytes);
  }
  void send(const float* data, std::int64_t count, int peer, int) override {
    check_nccl(ncclSend(data, static_cast<std::size_t>(count), ncclFloat32, peer, comm_, stream_), "ncclSend");
    count_bytes(Traffic::send, count * 4);
    wait("send", count);
  }
  void receive(float* data, std::int64_t count, int peer, int) override {
    check_nccl(ncclRecv(data, static_cast<std::size_t>(count), ncclFloat32, peer, comm_, stream_), "ncclRecv");
    wait("receive", count);
  }
  void send_receive(const float* send, int to, float* receive, int from, std::int64_t count, int) override {
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    check_nccl(ncclSend(send, static_cast<std::size_t>(count), ncclFloat32, to, comm_, stream_), "ncclSend");
    check_nccl(ncclRecv(receive, static_cast<std::size_t>(count), ncclFloat32, from, comm_, stream_), "ncclRecv");
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
    count_bytes(Traffic::send, count * 4);
    wait("send_receive", count);
  }
  void barrier() override {
    float* scratch = nullptr;
    check_cuda(cudaMalloc(&scratch, sizeof(float)), "cudaMalloc");
    check_cuda(cudaMemsetAsync(scratch, 0, sizeof(float), stream_), "cudaMemsetAsync");
    all_reduce(scratch, 1, ReduceOp::sum);
    check_cuda(cudaFree(scratch), "cudaFree");
  }
  std::unique_ptr<Communicator> split(int color, int key) override {
    ncclComm_t child = nullptr;
    check_nccl(ncclCommSplit(comm_, color, key, &child, nullptr), "ncclCommSplit");
    cudaStream_t stream = nullptr;
    check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    int rank = 0, size = 0;
    check_nccl(ncclCommUserRank(child, &rank), "ncclCommUserRank");
    check_nccl(ncclCommCount(child, &size), "ncclCommCount");
    return std::make_unique<NcclCommunicator>(child, stream, rank, size, timeout_s_);
  }

 private:
  void wait(const char* operation, std::int64_t count) {
    const auto start = std::chrono::steady_clock::now();
    for (long polls = 0;; ++polls) {
      const cudaError_t state = cudaStreamQuery(stream_);
      if (state == cudaSuccess) return;
      PROPLAB_CHECK(state == cudaErrorNotReady, "CUDA stream query failed: ", cudaGetErrorString(state));
      ncclResult_t async = ncclSuccess;
      check_nccl(ncclCommGetAsyncError(comm_, &async), "ncclCommGetAsyncError");
      check_nccl(async, operation);
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (waited > timeout_s_) {
        ncclCommAbort(comm_);
        comm_ = nullptr;
        std::ostringstream message;
        message << "parallel: NCCL " << operation << " of " << count
                << " elements did not complete within timeout_s = " << timeout_s_ << " s on rank " << rank_ << " of "
                << size_ << ": another rank stopped or stalled before this collective";
        throw CollectiveTimeout(message.str());
      }
      if (polls > 200) std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  ncclComm_t comm_;
  cudaStream_t stream_;
  int rank_, size_;
  double timeout_s_;
};

}  // namespace

bool nccl_available() { return true; }

std::unique_ptr<Communicator> make_nccl_world(Communicator& mpi_world, double timeout_s) {
  int devices = 0;
  check_cuda(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
  int ranks_on_node = 0;
  const int local = node_local_rank(mpi_world, ranks_on_node);
  if (ranks_on_node > devices) {
    std::ostringstream message;
    message << "parallel: " << ranks_on_node << " ranks on this node but " << devices
            << " GPU(s); NCCL needs one GPU per rank; allowed: at most " << devices
            << " ranks per node with device = \"cuda\" (or device = \"cpu\" to use MPI)";
    throw UserError(message.str());
  }
  check_cuda(cudaSetDevice(local), "cudaSetDevice");
  ncclUniqueId id;
  if (mpi_world.rank() == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  mpi_world.broadcast(&id, sizeof(id), 0);
  ncclComm_t comm = nullptr;
  check_nccl(ncclCommInitRank(&comm, mpi_world.size(), id, mpi_world.rank()), "ncclCommInitRank");
  cudaStream_t stream = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  return std::make_unique<NcclCommunicator>(comm, stream, mpi_world.rank(), mpi_world.size(), timeout_s);
}

#else

bool nccl_available() { return false; }

std::unique_ptr<Communicator> make_nccl_world(Communicator&, double) {
  throw UserError("parallel: this proplab was built without CUDA/NCCL; allowed: device = \"cpu\" (the MPI backend)");
}

#endif

}  // namespace proplab::dist
