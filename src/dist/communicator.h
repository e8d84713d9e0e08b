// dist/communicator: collectives between the processes of a run, and the process groups of a parallel layout.
//
// One interface, three backends: single-process (a world of one; every collective is a copy or a no-op), MPI
// (Open MPI; host buffers), NCCL (CUDA device buffers; the unique id travels over MPI). The training code talks
// only to Communicator, so a layout runs the same code on any backend.
//
// Invariants:
// - Every rank of a communicator calls the same collectives in the same order with the same counts (the usual
//   MPI contract); counts are elements, not bytes.
// - Buffers: host memory for the single-process and MPI backends, device memory for NCCL.
// - Reductions are sums unless an op says otherwise. MPI's reduction order is fixed for a given communicator
//   size and message, so results repeat bit for bit at a fixed layout; across backends or layouts they agree
//   within rounding.
// - No collective waits forever: each has the communicator's timeout. A collective that does not complete in
//   time throws CollectiveTimeout naming the operation, its size and the waiting rank; the caller marks the run
//   failed and exits (dist::abort_all ends the other ranks).
// - Layout ranks: world rank = ((pp_rank·dp + dp_rank)·sp + sp_rank)·tp + tp_rank (tensor-parallel neighbours are
//   adjacent, as in Megatron-LM, so on multi-GPU nodes they share a node; sequence-parallel neighbours come next).
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

namespace proplab::dist {

enum class ReduceOp { sum, max, min };

// What the byte counters are kept per (Communicator::bytes_communicated).
enum class Traffic { all_reduce, reduce_scatter, all_gather, broadcast, send };
constexpr int kTrafficKinds = 5;
const char* traffic_name(Traffic kind);

// A collective that did not complete within the communicator's timeout.
class CollectiveTimeout : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A collective in flight (Communicator::start_all_reduce). Its buffer must stay alive and untouched until wait()
// returns.
class PendingCollective {
 public:
  virtual ~PendingCollective() = default;
  // Lets the backend progress the operation; true once it is complete (then wait() returns at once).
  virtual bool test() = 0;
  // Completes it; CollectiveTimeout after the communicator's timeout of waiting here.
  virtual void wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* backend() const = 0;

  // In place over `count` elements.
  virtual void all_reduce(float* data, std::int64_t count, ReduceOp op = ReduceOp::sum) = 0;
  virtual void all_reduce(double* data, std::int64_t count, ReduceOp op = ReduceOp::sum) = 0;
  // send holds size()·count_per_rank elements; rank r receives the sum of every rank's block r.
  virtual void reduce_scatter(const float* send, float* receive, std::int64_t count_per_rank) = 0;
  // receive holds size()·count_per_rank elements: block r is rank r's send.
  virtual void all_gather(const float* send, float* receive, std::int64_t count_per_rank) = 0;
  virtual void broadcast(void* data, std::int64_t bytes, int root) = 0;
  virtual void send(const float* data, std::int64_t count, int peer, int tag) = 0;
  virtual void receive(float* data, std::int64_t count, int peer, int tag) = 0;
  // Sends `send` to rank `to` while receiving `receive` from rank `from`, both in flight together, so a ring of
  // ranks that all send before they receive cannot deadlock. `to` may equal `from`.
  virtual void send_receive(const float* send, int to, float* receive, int from, std::int64_t count, int tag) = 0;
  // In-place sum all-reduce started now and completed by the returned handle's wait(): the caller overlaps it
  // with other work. Backends without non-blocking collectives complete it here.
  virtual std::unique_ptr<PendingCollective> start_all_reduce(float* data, std::int64_t count);
  virtual void barrier() = 0;
  // A communicator over the ranks that pass the same `color`, ranked by `key` (then by this rank).
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

  // Payload bytes this rank handed to collectives and sends so far (for the communication benchmarks): an
  // all-reduce counts its buffer, a reduce-scatter its whole input, an all-gather this rank's block, a broadcast
  // the buffer on the root only, a send its message (a receive counts nothing).
  std::int64_t bytes_communicated() const;
  std::int64_t bytes_communicated(Traffic kind) const { return bytes_[static_cast<int>(kind)]; }

 protected:
  void count_bytes(Traffic kind, std::int64_t bytes) { bytes_[static_cast<int>(kind)] += bytes; }

 private:
  std::int64_t bytes_[kTrafficKinds] = {};
};

// A world of one process.
std::unique_ptr<Communicator> make_single_process();

// True when this build has the MPI backend.
bool mpi_available();
// True when this process was started by an MPI launcher (mpirun/mpiexec/srun): OMPI_/PMI_/PMIX_ variables.
bool launched_by_mpi();
// MPI_COMM_WORLD, initialising MPI on first use (MPI_Finalize runs at exit). `timeout_s` bounds every
// collective. UserError when this build has no MPI backend.
std::unique_ptr<Communicator> make_mpi_world(double timeout_s);
// This rank's index among the world's ranks on its node (host name), and how many ranks the node has: the GPU a
// rank computes on is its node-local rank. Collective over `world`.
struct NodeRanks {
  int local_rank = 0;
  int ranks_on_node = 1;
};
NodeRanks node_ranks(Communicator& world);
// Ends every rank of the MPI job with `exit_code` (MPI_Abort), after a timeout or a fatal error on one rank.
[[noreturn]] void abort_all(int exit_code);

// A `[parallel]` layout: world = dp·tp·pp·sp.
struct Layout {
  int dp = 1, tp = 1, pp = 1, sp = 1;
  int world() const { return dp * tp * pp * sp; }
};

struct Coordinates {
  int dp = 0, tp = 0, pp = 0, sp = 0;
};
// The layout coordinates of a world rank, and back.
Coordinates coordinates_of(const Layout& layout, int world_rank);
int world_rank_of(const Layout& layout, const Coordinates& at);

// The process groups of a layout: ranks that share (tp, pp, sp) form a data-parallel group, ranks that share
// (dp, tp, pp) a sequence-parallel ring, and so on; ranks that share (tp, pp) — the data-parallel replicas and their
// rings together, dp·sp ranks ranked by (dp, sp) — sum their gradients (`gradient`).
struct ProcessGroups {
  Layout layout;
  Coordinates at;
  std::unique_ptr<Communicator> world, data, tensor, pipeline, sequence, gradient;
};
// UserError when the world's size is not dp·tp·pp·sp (naming both).
ProcessGroups make_process_groups(std::unique_ptr<Communicator> world, const Layout& layout);

}  // namespace proplab::dist
