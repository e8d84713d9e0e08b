#include "dist/cuda_communicator.h"

#include <sstream>
#include <utility>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "core/tensor.h"
#include "dist/nccl_communicator.h"

namespace proplab::dist {

const char* device_transport_name(DeviceTransport transport) {
  return transport == DeviceTransport::nccl ? "nccl" : "staged";
}

namespace {

class CudaCommunicator final : public Communicator {
 public:
  CudaCommunicator(std::unique_ptr<Communicator> host, std::unique_ptr<Communicator> nccl)
      : host_(std::move(host)), nccl_(std::move(nccl)) {
    PROPLAB_CHECK(host_ != nullptr, "a CUDA communicator needs a host communicator");
    PROPLAB_CHECK(!nccl_ || (nccl_->rank() == host_->rank() && nccl_->size() == host_->size()),
                  "the NCCL and host communicators of a CUDA communicator must rank the same processes alike");
  }
  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  const char* backend() const override { return nccl_ ? "nccl+mpi" : "staged+mpi"; }

  void all_reduce(float* data, std::int64_t count, ReduceOp op) override { reduce_in_place(data, count, op); }
  void all_reduce(double* data, std::int64_t count, ReduceOp op) override { reduce_in_place(data, count, op); }

  void reduce_scatter(const float* send, float* receive, std::int64_t count) override {
    count_bytes(Traffic::reduce_scatter, count * size() * 4);
    if (!on_device(send, receive, "reduce_scatter")) return host_->reduce_scatter(send, receive, count);
    if (nccl_) return nccl_->reduce_scatter(send, receive, count);
    const std::size_t in_bytes = bytes_of<float>(count * size()), out_bytes = bytes_of<float>(count);
    auto* in = static_cast<float*>(first_.reserve(in_bytes));
    auto* out = static_cast<float*>(second_.reserve(out_bytes));
    copy_device_to_host(in, send, in_bytes);
    host_->reduce_scatter(in, out, count);
    copy_host_to_device(receive, out, out_bytes);
  }

  void all_gather(const float* send, float* receive, std::int64_t count) override {
    count_bytes(Traffic::all_gather, count * 4);
    if (!on_device(send, receive, "all_gather")) return host_->all_gather(send, receive, count);
    if (nccl_) return nccl_->all_gather(send, receive, count);
    const std::size_t in_bytes = bytes_of<float>(count), out_bytes = bytes_of<float>(count * size());
    auto* in = static_cast<float*>(first_.reserve(in_bytes));
    auto* out = static_cast<float*>(second_.reserve(out_bytes));
    copy_device_to_host(in, send, in_bytes);
    host_->all_gather(in, out, count);
    copy_host_to_device(receive, out, out_bytes);
  }

  void broadcast(void* data, std::int64_t bytes, int root) override {
    if (rank() == root) count_bytes(Traffic::broadcast, bytes);
    if (!is_device_pointer(data)) return host_->broadcast(data, bytes, root);
    if (nccl_) return nccl_->broadcast(data, bytes, root);
    void* staged = first_.reserve(static_cast<std::size_t>(bytes));
    if (rank() == root) copy_device_to_host(staged, data, static_cast<std::size_t>(bytes));
    host_->broadcast(staged, bytes, root);
    if (rank() != root) copy_host_to_device(data, staged, static_cast<std::size_t>(bytes));
  }

  void send(const float* data, std::int64_t count, int peer, int tag) override {
    count_bytes(Traffic::send, count * 4);
    if (!is_device_pointer(data)) return host_->send(data, count, peer, tag);
    if (nccl_) return nccl_->send(data, count, peer, tag);
    auto* staged = static_cast<float*>(first_.reserve(bytes_of<float>(count)));
    copy_device_to_host(staged, data, bytes_of<float>(count));
    host_->send(staged, count, peer, tag);
  }

  void receive(float* data, std::int64_t count, int peer, int tag) override {
    if (!is_device_pointer(data)) return host_->receive(data, count, peer, tag);
    if (nccl_) return nccl_->receive(data, count, peer, tag);
    auto* staged = static_cast<float*>(first_.reserve(bytes_of<float>(count)));
    host_->receive(staged, count, peer, tag);
    copy_host_to_device(data, staged, bytes_of<float>(count));
  }

  void send_receive(const float* send, int to, float* receive, int from, std::int64_t count, int tag) override {
    count_bytes(Traffic::send, count * 4);
    if (!on_device(send, receive, "send_receive")) return host_->send_receive(send, to, receive, from, count, tag);
    if (nccl_) return nccl_->send_receive(send, to, receive, from, count, tag);
    const std::size_t bytes = bytes_of<float>(count);
    auto* out = static_cast<float*>(first_.reserve(bytes));
    auto* in = static_cast<float*>(second_.reserve(bytes));
    copy_device_to_host(out, send, bytes);
    host_->send_receive(out, to, in, from, count, tag);
    copy_host_to_device(receive, in, bytes);
  }

  std::unique_ptr<PendingCollective> start_all_reduce(float* data, std::int64_t count) override {
    count_bytes(Traffic::all_reduce, count * 4);
    if (!is_device_pointer(data)) return host_->start_all_reduce(data, count);
    if (nccl_) return nccl_->start_all_reduce(data, count);
    // Staged: the bucket goes to a pinned buffer of its own, MPI sums it in the background, wait() copies it back.
    std::unique_ptr<PinnedBuffer> buffer = take_buffer();
    const std::size_t bytes = bytes_of<float>(count);
    auto* staged = static_cast<float*>(buffer->reserve(bytes));
    copy_device_to_host(staged, data, bytes);
    std::unique_ptr<PendingCollective> inner = host_->start_all_reduce(staged, count);
    return std::make_unique<StagedPending>(*this, std::move(inner), std::move(buffer), data, bytes);
  }

  void barrier() override { host_->barrier(); }

  std::unique_ptr<Communicator> split(int color, int key) override {
    std::unique_ptr<Communicator> host = host_->split(color, key);
    std::unique_ptr<Communicator> nccl = nccl_ ? nccl_->split(color, key) : nullptr;
    return std::make_unique<CudaCommunicator>(std::move(host), std::move(nccl));
  }

 private:
  class StagedPending final : public PendingCollective {
   public:
    StagedPending(CudaCommunicator& owner, std::unique_ptr<PendingCollective> inner,
                  std::unique_ptr<PinnedBuffer> buffer, float* device, std::size_t bytes)
        : owner_(owner), inner_(std::move(inner)), buffer_(std::move(buffer)), device_(device), bytes_(bytes) {}
    ~StagedPending() override {
      if (buffer_) owner_.give_back(std::move(buffer_));
    }
    bool test() override { return done_ || inner_->test(); }
    void wait() override {
      if (done_) return;
      inner_->wait();
      void* staged = buffer_->reserve(bytes_);
      copy_host_to_device(device_, staged, bytes_);
      done_ = true;
    }

   private:
    CudaCommunicator& owner_;
    std::unique_ptr<PendingCollective> inner_;
    std::unique_ptr<PinnedBuffer> buffer_;
    float* device_;
    std::size_t bytes_;
    bool done_ = false;
  };

  template <typename T>
  static std::size_t bytes_of(std::int64_t count) {
    return static_cast<std::size_t>(count) * sizeof(T);
  }

  // Whether a two-buffer call moves device memory; both buffers must agree.
  static bool on_device(const void* send, const void* receive, const char* operation) {
    const bool device = is_device_pointer(send);
    PROPLAB_CHECK(device == is_device_pointer(receive), operation,
                  ": one buffer on the GPU and the other on the host; both must be on one side");
    return device;
  }

  template <typename T>
  void reduce_in_place(T* data, std::int64_t count, ReduceOp op) {
    count_bytes(Traffic::all_reduce, count * static_cast<std::int64_t>(sizeof(T)));
    if (!is_device_pointer(data)) return host_->all_reduce(data, count, op);
    if (nccl_) return nccl_->all_reduce(data, count, op);
    const std::size_t bytes = bytes_of<T>(count);
    auto* staged = static_cast<T*>(first_.reserve(bytes));
    copy_device_to_host(staged, data, bytes);
    host_->all_reduce(staged, count, op);
    copy_host_to_device(data, staged, bytes);
  }

  std::unique_ptr<PinnedBuffer> take_buffer() {
    if (spare_.empty()) return std::make_unique<PinnedBuffer>();
    std::unique_ptr<PinnedBuffer> buffer = std::move(spare_.back());
    spare_.pop_back();
    return buffer;
  }
  void give_back(std::unique_ptr<PinnedBuffer> buffer) { spare_.push_back(std::move(buffer)); }

  std::unique_ptr<Communicator> host_, nccl_;
  PinnedBuffer first_, second_;                       // staging for blocking calls
  std::vector<std::unique_ptr<PinnedBuffer>> spare_;  // staging for started all-reduces, kept for the next step
};

}  // namespace

std::unique_ptr<Communicator> make_cuda_communicator(std::unique_ptr<Communicator> host,
                                                     std::unique_ptr<Communicator> nccl) {
  return std::make_unique<CudaCommunicator>(std::move(host), std::move(nccl));
}

std::unique_ptr<Communicator> make_cuda_world(std::unique_ptr<Communicator> mpi_world, const std::string& comm,
                                              double timeout_s, CudaRanks* chosen) {
  if (comm != "auto" && comm != "nccl" && comm != "staged")
    throw UserError("parallel.comm = \"" + comm +
                    "\": unknown transport for device buffers; allowed: \"auto\" (NCCL when this build has it), "
                    "\"nccl\" or \"staged\" (through host memory and MPI; ranks may share a GPU)");
  CudaRanks ranks;
  ranks.gpus = cuda_device_count();
  // Every rank refuses together: one rank's error would otherwise leave the others waiting in a collective.
  double no_gpu = ranks.gpus == 0 ? 1.0 : 0.0;
  mpi_world->all_reduce(&no_gpu, 1, ReduceOp::max);
  if (no_gpu != 0.0)
    throw UserError(
        "device.type = \"cuda\": a rank's machine has no CUDA GPU (the driver reports none); allowed there: "
        "device.type = \"cpu\"");
  const NodeRanks node = node_ranks(*mpi_world);
  ranks.local_rank = node.local_rank;
  ranks.ranks_on_node = node.ranks_on_node;
  ranks.transport =
      comm == "staged" || (comm == "auto" && !nccl_available()) ? DeviceTransport::staged : DeviceTransport::nccl;
  std::unique_ptr<Communicator> nccl;
  if (ranks.transport == DeviceTransport::nccl) {
    // (sets the GPU of the node-local rank; UserError without NCCL in this build)
    nccl = make_nccl_world(*mpi_world, timeout_s);
    ranks.ordinal = node.local_rank;
  } else {
    ranks.ordinal = node.local_rank % ranks.gpus;
    set_cuda_ordinal(ranks.ordinal);
  }
  if (chosen) *chosen = ranks;
  return make_cuda_communicator(std::move(mpi_world), std::move(nccl));
}

}  // namespace proplab::dist
