// The NCCL backend (CUDA device buffers), built when CUDA and NCCL are found (PROPLAB_WITH_NCCL). Bootstrap as
// NCCL documents it: ranks learn their node-local rank over MPI, pick that GPU, rank 0 creates the unique id and
// broadcasts it over MPI, then every rank joins with ncclCommInitRank.
//
// Streams: collectives run on the communicator's own stream. Each one first makes that stream wait for an event
// recorded on the compute stream (core/device.h), so it reads what the kernels before it wrote. A blocking
// collective is then completed by polling its stream against the deadline, so whatever the host enqueues after it
// runs after it. A started all-reduce (start_all_reduce) records a completion event instead: the compute stream
// goes on with backward while NCCL runs, and wait() polls that event against the deadline, then makes the compute
// stream wait for it. On timeout the NCCL communicator is aborted (so no kernel waits forever) and
// CollectiveTimeout is thrown.
#include "dist/nccl_communicator.h"

#include <chrono>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "core/device.h"
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

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, cudaStream_t stream, int rank, int size, double timeout_s)
      : comm_(comm), stream_(stream), rank_(rank), size_(size), timeout_s_(timeout_s) {}
  ~NcclCommunicator() override {
    if (comm_) ncclCommDestroy(comm_);
    if (ready_) cudaEventDestroy(ready_);
    if (barrier_scratch_) cudaFree(barrier_scratch_);
    if (stream_) cudaStreamDestroy(stream_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "nccl"; }

  void all_reduce(float* data, std::int64_t count, ReduceOp op) override {
    after_compute();
    check_nccl(ncclAllReduce(data, data, static_cast<std::size_t>(count), ncclFloat32, to_nccl(op), comm_, stream_),
               "ncclAllReduce");
    count_bytes(Traffic::all_reduce, count * 4);
    wait("all_reduce", count);
  }
  void all_reduce(double* data, std::int64_t count, ReduceOp op) override {
    after_compute();
    check_nccl(ncclAllReduce(data, data, static_cast<std::size_t>(count), ncclFloat64, to_nccl(op), comm_, stream_),
               "ncclAllReduce");
    count_bytes(Traffic::all_reduce, count * 8);
    wait("all_reduce", count);
  }
  void reduce_scatter(const float* send, float* receive, std::int64_t count) override {
    after_compute();
    check_nccl(ncclReduceScatter(send, receive, static_cast<std::size_t>(count), ncclFloat32, ncclSum, comm_, stream_),
               "ncclReduceScatter");
    count_bytes(Traffic::reduce_scatter, count * size_ * 4);
    wait("reduce_scatter", count * size_);
  }
  void all_gather(const float* send, float* receive, std::int64_t count) override {
    after_compute();
    check_nccl(ncclAllGather(send, receive, static_cast<std::size_t>(count), ncclFloat32, comm_, stream_),
               "ncclAllGather");
    count_bytes(Traffic::all_gather, count * 4);
    wait("all_gather", count * size_);
  }
  void broadcast(void* data, std::int64_t bytes, int root) override {
    after_compute();
    check_nccl(ncclBroadcast(data, data, static_cast<std::size_t>(bytes), ncclUint8, root, comm_, stream_),
               "ncclBroadcast");
    if (rank_ == root) count_bytes(Traffic::broadcast, bytes);
    wait("broadcast", bytes);
  }
  void send(const float* data, std::int64_t count, int peer, int) override {
    after_compute();
    check_nccl(ncclSend(data, static_cast<std::size_t>(count), ncclFloat32, peer, comm_, stream_), "ncclSend");
    count_bytes(Traffic::send, count * 4);
    wait("send", count);
  }
  void receive(float* data, std::int64_t count, int peer, int) override {
    after_compute();
    check_nccl(ncclRecv(data, static_cast<std::size_t>(count), ncclFloat32, peer, comm_, stream_), "ncclRecv");
    wait("receive", count);
  }
  void send_receive(const float* send, int to, float* receive, int from, std::int64_t count, int) override {
    after_compute();
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    check_nccl(ncclSend(send, static_cast<std::size_t>(count), ncclFloat32, to, comm_, stream_), "ncclSend");
    check_nccl(ncclRecv(receive, static_cast<std::size_t>(count), ncclFloat32, from, comm_, stream_), "ncclRecv");
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
    count_bytes(Traffic::send, count * 4);
    wait("send_receive", count);
  }
  void barrier() override {
    if (!barrier_scratch_) check_cuda(cudaMalloc(&barrier_scratch_, sizeof(float)), "cudaMalloc");
    check_cuda(cudaMemsetAsync(barrier_scratch_, 0, sizeof(float), stream_), "cudaMemsetAsync");
    all_reduce(barrier_scratch_, 1, ReduceOp::sum);
  }
  std::unique_ptr<PendingCollective> start_all_reduce(float* data, std::int64_t count) override {
    after_compute();
    check_nccl(ncclAllReduce(data, data, static_cast<std::size_t>(count), ncclFloat32, ncclSum, comm_, stream_),
               "ncclAllReduce");
    count_bytes(Traffic::all_reduce, count * 4);
    cudaEvent_t done = nullptr;
    check_cuda(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate");
    check_cuda(cudaEventRecord(done, stream_), "cudaEventRecord");
    return std::make_unique<Pending>(*this, done, count);
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
  // An all-reduce in flight on the communicator's stream, done when `done` is.
  class Pending final : public PendingCollective {
   public:
    Pending(NcclCommunicator& owner, cudaEvent_t done, std::int64_t count)
        : owner_(owner), done_(done), count_(count) {}
    ~Pending() override {
      if (done_) cudaEventDestroy(done_);
    }
    bool test() override {
      if (complete_) return true;
      const cudaError_t state = cudaEventQuery(done_);
      PROPLAB_CHECK(state == cudaSuccess || state == cudaErrorNotReady,
                    "CUDA event query failed: ", cudaGetErrorString(state));
      return state == cudaSuccess;
    }
    void wait() override {
      if (complete_) return;
      owner_.poll("all_reduce", count_, [&] { return cudaEventQuery(done_); });
      // The compute stream reads the sum after this: it waits for the event (already complete for the host).
      check_cuda(cudaStreamWaitEvent(static_cast<cudaStream_t>(cuda_stream()), done_, 0), "cudaStreamWaitEvent");
      complete_ = true;
    }

   private:
    NcclCommunicator& owner_;
    cudaEvent_t done_;
    std::int64_t count_;
    bool complete_ = false;
  };

  // The communicator's stream waits for everything enqueued on the compute stream so far.
  void after_compute() {
    PROPLAB_CHECK(comm_ != nullptr, "NCCL communicator used after it was aborted");
    if (!ready_) check_cuda(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "cudaEventCreate");
    check_cuda(cudaEventRecord(ready_, static_cast<cudaStream_t>(cuda_stream())), "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(stream_, ready_, 0), "cudaStreamWaitEvent");
  }

  void wait(const char* operation, std::int64_t count) {
    poll(operation, count, [&] { return cudaStreamQuery(stream_); });
  }

  // Polls `query` (cudaSuccess: complete) until it completes, NCCL reports an error, or the timeout passes.
  template <typename Query>
  void poll(const char* operation, std::int64_t count, Query&& query) {
    const auto start = std::chrono::steady_clock::now();
    for (long polls = 0;; ++polls) {
      const cudaError_t state = query();
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
  cudaEvent_t ready_ = nullptr;       // recorded on the compute stream before each collective
  float* barrier_scratch_ = nullptr;  // barrier(): one float all-reduced
};

}  // namespace

bool nccl_available() { return true; }

std::unique_ptr<Communicator> make_nccl_world(Communicator& mpi_world, double timeout_s) {
  int devices = 0;
  check_cuda(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
  const NodeRanks node = node_ranks(mpi_world);
  // Every rank refuses together (a node with too many ranks would otherwise leave the others in ncclCommInitRank).
  double too_many = node.ranks_on_node > devices ? 1.0 : 0.0;
  mpi_world.all_reduce(&too_many, 1, ReduceOp::max);
  if (too_many != 0.0) {
    std::ostringstream message;
    message << "parallel.comm = \"nccl\": a node has more ranks than GPUs (" << node.ranks_on_node << " ranks and "
            << devices << " GPU(s) on this one), and NCCL needs one GPU per rank; allowed: at most " << devices
            << " ranks per node, or parallel.comm = \"staged\" (ranks share GPUs, device buffers go through host "
               "memory and MPI), or device.type = \"cpu\"";
    throw UserError(message.str());
  }
  set_cuda_ordinal(node.local_rank);
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
  throw UserError(
      "parallel.comm = \"nccl\": this proplab was built without NCCL; allowed: parallel.comm = \"staged\" or "
      "\"auto\" (device buffers through host memory and MPI), or device.type = \"cpu\"");
}

#endif

}  // namespace proplab::dist
