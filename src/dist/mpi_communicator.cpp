// The MPI backend (host buffers). Every collective is issued non-blocking and completed by polling MPI_Test
// against the communicator's deadline, so a stalled or dead peer turns into a CollectiveTimeout instead of a
// hang. Polling backs off from spinning to short sleeps: on an oversubscribed machine (more ranks than cores)
// a spinning rank would take the core the rank it waits for needs.
#include <chrono>
#include <cstdlib>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "dist/communicator.h"

#ifdef PROPLAB_WITH_MPI
#include <mpi.h>
#endif

namespace proplab::dist {

#ifdef PROPLAB_WITH_MPI

namespace {

void check_mpi(int code, const char* what) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  PROPLAB_CHECK(false, "MPI ", what, " failed: ", std::string(text, static_cast<std::size_t>(length)));
}

MPI_Op to_mpi(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return MPI_SUM;
    case ReduceOp::max:
      return MPI_MAX;
    case ReduceOp::min:
      return MPI_MIN;
  }
  return MPI_SUM;
}

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

void ensure_initialised() {
  int initialised = 0;
  check_mpi(MPI_Initialized(&initialised), "MPI_Initialized");
  if (initialised) return;
  int provided = 0;
  check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
  std::atexit(finalize_at_exit);
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, double timeout_s, bool owned) : comm_(comm), timeout_s_(timeout_s), owned_(owned) {
    check_mpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    check_mpi(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
    check_mpi(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owned_ && !finalized) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "mpi"; }

  void all_reduce(float* data, std::int64_t count, ReduceOp op) override {
    MPI_Request request;
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, data, to_int(count), MPI_FLOAT, to_mpi(op), comm_, &request),
              "MPI_Iallreduce");
    count_bytes(Traffic::all_reduce, count * 4);
    wait(request, "all_reduce", count);
  }
  void all_reduce(double* data, std::int64_t count, ReduceOp op) override {
    MPI_Request request;
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, data, to_int(count), MPI_DOUBLE, to_mpi(op), comm_, &request),
              "MPI_Iallreduce");
    count_bytes(Traffic::all_reduce, count * 8);
    wait(request, "all_reduce", count);
  }
  void reduce_scatter(const float* send, float* receive, std::int64_t count) override {
    MPI_Request request;
    check_mpi(MPI_Ireduce_scatter_block(send, receive, to_int(count), MPI_FLOAT, MPI_SUM, comm_, &request),
              "MPI_Ireduce_scatter_block");
    count_bytes(Traffic::reduce_scatter, count * size_ * 4);
    wait(request, "reduce_scatter", count * size_);
  }
  void all_gather(const float* send, float* receive, std::int64_t count) override {
    MPI_Request request;
    check_mpi(MPI_Iallgather(send, to_int(count), MPI_FLOAT, receive, to_int(count), MPI_FLOAT, comm_, &request),
              "MPI_Iallgather");
    count_bytes(Traffic::all_gather, count * 4);
    wait(request, "all_gather", count * size_);
  }
  void broadcast(void* data, std::int64_t bytes, int root) override {
    PROPLAB_CHECK(root >= 0 && root < size_, "broadcast: root ", root, " outside ", size_, " ranks");
    MPI_Request request;
    check_mpi(MPI_Ibcast(data, to_int(bytes), MPI_BYTE, root, comm_, &request), "MPI_Ibcast");
    if (rank_ == root) count_bytes(Traffic::broadcast, bytes);
    wait(request, "broadcast", bytes);
  }
  void send(const float* data, std::int64_t count, int peer, int tag) override {
    MPI_Request request;
    check_mpi(MPI_Isend(data, to_int(count), MPI_FLOAT, peer, tag, comm_, &request), "MPI_Isend");
    count_bytes(Traffic::send, count * 4);
    wait(request, "send", count, peer);
  }
  void receive(float* data, std::int64_t count, int peer, int tag) override {
    MPI_Request request;
    check_mpi(MPI_Irecv(data, to_int(count), MPI_FLOAT, peer, tag, comm_, &request), "MPI_Irecv");
    wait(request, "receive", count, peer);
  }
  void send_receive(const float* send, int to, float* receive, int from, std::int64_t count, int tag) override {
    MPI_Request requests[2];
    check_mpi(MPI_Irecv(receive, to_int(count), MPI_FLOAT, from, tag, comm_, &requests[0]), "MPI_Irecv");
    check_mpi(MPI_Isend(send, to_int(count), MPI_FLOAT, to, tag, comm_, &requests[1]), "MPI_Isend");
    count_bytes(Traffic::send, count * 4);
    wait(requests, 2, "send_receive", count, from);
  }
  std::unique_ptr<PendingCollective> start_all_reduce(float* data, std::int64_t count) override;
  void barrier() override {
    MPI_Request request;
    check_mpi(MPI_Ibarrier(comm_, &request), "MPI_Ibarrier");
    wait(request, "barrier", 0);
  }
  std::unique_ptr<Communicator> split(int color, int key) override {
    MPI_Comm child;
    check_mpi(MPI_Comm_split(comm_, color, key, &child), "MPI_Comm_split");
    return std::make_unique<MpiCommunicator>(child, timeout_s_, true);
  }

 private:
  static int to_int(std::int64_t count) {
    PROPLAB_CHECK(count >= 0 && count <= 0x7fffffff, "MPI message of ", count, " elements exceeds int");
    return static_cast<int>(count);
  }

  void wait(MPI_Request& request, const char* operation, std::int64_t count, int peer = -1) {
    wait(&request, 1, operation, count, peer);
  }

 public:
  static int world_rank() {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    return rank;
  }
  static std::string describe(const char* operation, std::int64_t count, int peer) {
    std::ostringstream text;
    text << operation << " of " << count << " elements";
    if (peer >= 0) text << " with rank " << peer;
    return text.str();
  }

  // Polls `requests` until all complete, or throws CollectiveTimeout after timeout_s (or when MPI reports the
  // operation failed).
  void wait(MPI_Request* requests, int n, const char* operation, std::int64_t count, int peer = -1) {
    const auto start = std::chrono::steady_clock::now();
    int done = 0;
    for (long polls = 0;; ++polls) {
      const int code = MPI_Testall(n, requests, &done, MPI_STATUSES_IGNORE);
      if (code != MPI_SUCCESS) {
        // A transport that notices a dead peer reports it here: the same fault as a timeout, found sooner.
        char text[MPI_MAX_ERROR_STRING];
        int length = 0;
        MPI_Error_string(code, text, &length);
        throw CollectiveTimeout("parallel: " + describe(operation, count, peer) + " failed on world rank " +
                                std::to_string(world_rank()) + ": " +
                                std::string(text, static_cast<std::size_t>(length)) + "; another rank probably exited");
      }
      if (done) return;
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (waited > timeout_s_) {
        std::ostringstream message;
        message << " did not complete within timeout_s = " << timeout_s_ << " s on world rank " << world_rank()
                << " (rank " << rank_ << " of " << size_
                << " in its group): another rank stopped or stalled before this collective";
        throw CollectiveTimeout("parallel: " + describe(operation, count, peer) + message.str());
      }
      if (polls > 200) std::this_thread::sleep_for(std::chrono::microseconds(polls > 2000 ? 1000 : 20));
    }
  }

 private:
  MPI_Comm comm_;
  double timeout_s_;
  bool owned_;
  int rank_ = 0, size_ = 1;
};

// An MPI_Iallreduce in flight. Never freed unfinished: MPI forbids freeing a collective's request, and a run that
// abandons one ends the job (dist::abort_all).
class MpiPendingAllReduce final : public PendingCollective {
 public:
  MpiPendingAllReduce(MpiCommunicator& comm, MPI_Request request, std::int64_t count)
      : comm_(comm), request_(request), count_(count) {}
  bool test() override {
    if (done_) return true;
    int done = 0;
    check_mpi(MPI_Test(&request_, &done, MPI_STATUS_IGNORE), "MPI_Test");
    done_ = done != 0;
    return done_;
  }
  void wait() override {
    if (done_) return;
    comm_.wait(&request_, 1, "all_reduce", count_);
    done_ = true;
  }

 private:
  MpiCommunicator& comm_;
  MPI_Request request_;
  std::int64_t count_;
  bool done_ = false;
};

std::unique_ptr<PendingCollective> MpiCommunicator::start_all_reduce(float* data, std::int64_t count) {
  MPI_Request request;
  check_mpi(MPI_Iallreduce(MPI_IN_PLACE, data, to_int(count), MPI_FLOAT, MPI_SUM, comm_, &request), "MPI_Iallreduce");
  count_bytes(Traffic::all_reduce, count * 4);
  return std::make_unique<MpiPendingAllReduce>(*this, request, count);
}

}  // namespace

bool mpi_available() { return true; }

std::unique_ptr<Communicator> make_mpi_world(double timeout_s) {
  PROPLAB_CHECK(timeout_s > 0, "make_mpi_world: needs timeout_s > 0");
  ensure_initialised();
  return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, timeout_s, false);
}

void abort_all(int exit_code) {
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (initialised) MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);
}

#else

bool mpi_available() { return false; }

std::unique_ptr<Communicator> make_mpi_world(double) {
  throw UserError(
      "parallel: this proplab was built without MPI (install libopenmpi-dev and reconfigure); allowed: a "
      "single process");
}

void abort_all(int exit_code) { std::_Exit(exit_code); }

#endif

}  // namespace proplab::dist
