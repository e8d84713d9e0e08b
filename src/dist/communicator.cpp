#include "dist/communicator.h"

#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <unistd.h>
#include <sstream>

#include "core/error.h"

namespace proplab::dist {

const char* traffic_name(Traffic kind) {
  switch (kind) {
    case Traffic::all_reduce:
      return "all_reduce";
    case Traffic::reduce_scatter:
      return "reduce_scatter";
    case Traffic::all_gather:
      return "all_gather";
    case Traffic::broadcast:
      return "broadcast";
    case Traffic::send:
      return "send";
  }
  return "?";
}

std::int64_t Communicator::bytes_communicated() const {
  std::int64_t total = 0;
  for (std::int64_t bytes : bytes_) total += bytes;
  return total;
}

namespace {

// A collective that completed when it was started.
class CompletedCollective final : public PendingCollective {
 public:
  bool test() override { return true; }
  void wait() override {}
};

}  // namespace

std::unique_ptr<PendingCollective> Communicator::start_all_reduce(float* data, std::int64_t count) {
  all_reduce(data, count, ReduceOp::sum);
  return std::make_unique<CompletedCollective>();
}

namespace {

class SingleProcess final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const char* backend() const override { return "single"; }
  void all_reduce(float*, std::int64_t, ReduceOp) override {}
  void all_reduce(double*, std::int64_t, ReduceOp) override {}
  void reduce_scatter(const float* send, float* receive, std::int64_t count) override {
    if (send != receive) std::memmove(receive, send, static_cast<std::size_t>(count) * sizeof(float));
  }
  void all_gather(const float* send, float* receive, std::int64_t count) override {
    if (send != receive) std::memmove(receive, send, static_cast<std::size_t>(count) * sizeof(float));
  }
  void broadcast(void*, std::int64_t, int root) override {
    PROPLAB_CHECK(root == 0, "broadcast: root ", root, " outside a world of one");
  }
  void send(const float*, std::int64_t, int peer, int) override {
    PROPLAB_CHECK(false, "send: no peer ", peer, " in a world of one");
  }
  void receive(float*, std::int64_t, int peer, int) override {
    PROPLAB_CHECK(false, "receive: no peer ", peer, " in a world of one");
  }
  void send_receive(const float*, int to, float*, int from, std::int64_t, int) override {
    PROPLAB_CHECK(false, "send_receive: no peers ", to, " and ", from, " in a world of one");
  }
  void barrier() override {}
  std::unique_ptr<Communicator> split(int, int) override { return std::make_unique<SingleProcess>(); }
};

}  // namespace

std::unique_ptr<Communicator> make_single_process() { return std::make_unique<SingleProcess>(); }

bool launched_by_mpi() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK"})
    if (std::getenv(name)) return true;
  return false;
}

NodeRanks node_ranks(Communicator& world) {
  // Every rank broadcasts its host name's hash in turn; equal hashes share a node.
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  const std::uint64_t mine = std::hash<std::string>{}(host);
  NodeRanks out;
  out.ranks_on_node = 0;
  for (int r = 0; r < world.size(); ++r) {
    std::uint64_t theirs = mine;
    world.broadcast(&theirs, sizeof(theirs), r);
    if (theirs == mine) {
      if (r < world.rank()) ++out.local_rank;
      ++out.ranks_on_node;
    }
  }
  return out;
}

Coordinates coordinates_of(const Layout& layout, int world_rank) {
  PROPLAB_CHECK(world_rank >= 0 && world_rank < layout.world(), "coordinates_of: rank ", world_rank,
                " outside a world of ", layout.world());
  Coordinates at;
  at.tp = world_rank % layout.tp;
  at.sp = (world_rank / layout.tp) % layout.sp;
  at.dp = (world_rank / (layout.tp * layout.sp)) % layout.dp;
  at.pp = world_rank / (layout.tp * layout.sp * layout.dp);
  return at;
}

int world_rank_of(const Layout& layout, const Coordinates& at) {
  return ((at.pp * layout.dp + at.dp) * layout.sp + at.sp) * layout.tp + at.tp;
}

ProcessGroups make_process_groups(std::unique_ptr<Communicator> world, const Layout& layout) {
  if (layout.dp < 1 || layout.tp < 1 || layout.pp < 1 || layout.sp < 1 || world->size() != layout.world()) {
    std::ostringstream message;
    message << "parallel: the layout dp = " << layout.dp << ", tp = " << layout.tp << ", pp = " << layout.pp;
    if (layout.sp != 1) message << ", sp = " << layout.sp;
    message << " needs " << layout.world() << " processes, but " << world->size() << " were started; allowed: dp·tp·pp"
            << (layout.sp != 1 ? "·sp" : "") << " equal to the number of processes (e.g. mpirun -np " << layout.world()
            << ")";
    throw UserError(message.str());
  }
  ProcessGroups groups;
  groups.layout = layout;
  groups.at = coordinates_of(layout, world->rank());
  const Coordinates& at = groups.at;
  // Colors: the coordinates the group shares; keys: the coordinate that varies inside it.
  groups.data = world->split((at.pp * layout.sp + at.sp) * layout.tp + at.tp, at.dp);
  groups.tensor = world->split((at.pp * layout.dp + at.dp) * layout.sp + at.sp, at.tp);
  groups.pipeline = world->split((at.dp * layout.sp + at.sp) * layout.tp + at.tp, at.pp);
  groups.sequence = world->split((at.pp * layout.dp + at.dp) * layout.tp + at.tp, at.sp);
  groups.gradient = world->split(at.pp * layout.tp + at.tp, at.dp * layout.sp + at.sp);
  groups.world = std::move(world);
  return groups;
}

}  // namespace proplab::dist
