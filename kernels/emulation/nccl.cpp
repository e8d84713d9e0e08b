// kernels/emulation/nccl.cpp: NCCL for the emulated GPU, over MPI. The functions proplab's NCCL backend calls
// (src/dist/nccl_communicator.cpp) and a few more, declared by the real <nccl.h> (C linkage), so that code builds
// and runs unchanged on a machine without a GPU: each rank is its own process with its own emulated GPU
// (kernels/emulation/runtime.cpp; PROPLAB_EMU_DEVICES=4 under mpirun -np 4 is one node with four GPUs).
//
// Invariants:
// - Buffers are emulated device memory, which is host memory: every buffer must lie inside one live device
//   allocation of the communicator's device, or in pinned host memory (mapped, as with unified addressing); anything
//   else is refused with ncclInvalidArgument and a message (a GPU would fault). This is stricter than NCCL, which
//   checks pointers only with NCCL_CHECK_POINTERS=1.
// - Emulated streams are synchronous, so an operation completes during the call: each communicator owns an MPI
//   communicator of its own (split from MPI_COMM_WORLD or from its parent), on which collectives are blocking MPI
//   collectives and sends/receives blocking MPI point-to-point messages, matched in call order per peer as in NCCL.
// - Between ncclGroupStart and ncclGroupEnd (nesting counted, per host thread) calls are checked and queued, and run
//   at the outermost ncclGroupEnd: every send and receive is posted together (MPI_Isend/MPI_Irecv), then the
//   collectives run in call order, then the sends and receives are waited for (MPI_Waitall). So a ring in which
//   every rank sends before it receives cannot deadlock.
// - Reductions: sum, prod, max, min and avg over int8, uint8, int32, uint32, int64, uint64, float32 and float64
//   (MPI's own reductions; avg divides the sum by the rank count, truncating for integers as NCCL does); float16,
//   bfloat16 and the fp8 types move (broadcast, all-gather, send/receive) but are not reduced (ncclInvalidArgument).
//   Counts above INT_MAX elements are refused (MPI counts are int).
// - ncclCommInitRank is collective over MPI_COMM_WORLD: every world rank must call it (proplab does: all ranks build
//   the NCCL world together), each with the id of the communicator it joins; ranks with the same id (hashed to an
//   MPI_Comm_split colour) form one communicator, ordered by `rank`. MPI is initialised here when it is not yet
//   (proplab's MPI backend normally did it first) and then finalised at exit.
//
// What it cannot tell: timing and asynchrony (nothing is ever in flight after a call returns, so code that forgets
// to synchronise a stream passes here), NCCL's real algorithms (rings, trees, their reduction order: MPI's order is
// used) and timeouts: a blocking call cannot be timed out, so a dead or stalled peer hangs the call forever (the
// caller's polling of cudaStreamQuery never runs; only mpirun's own fault handling ends the job).
#include <mpi.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <unistd.h>
#include <vector>

struct ncclComm {
  MPI_Comm mpi = MPI_COMM_NULL;
  int rank = 0, size = 0, device = 0;
  ncclResult_t async_error = ncclSuccess;
};

namespace proplab::emu::nccl {
namespace {

thread_local std::string last_error;

ncclResult_t fail(ncclResult_t result, const std::string& message) {
  last_error = message;
  std::fprintf(stderr, "proplab NCCL emulator: %s\n", message.c_str());
  return result;
}

ncclResult_t check_mpi(int code, const char* call) {
  if (code == MPI_SUCCESS) return ncclSuccess;
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(code, text, &length);
  return fail(ncclSystemError, std::string(call) + " failed: " + text);
}

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

ncclResult_t ensure_mpi() {
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (initialised) return ncclSuccess;
  int provided = 0;
  if (ncclResult_t r = check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
      r != ncclSuccess)
    return r;
  std::atexit(finalize_at_exit);
  return ncclSuccess;
}

struct Type {
  MPI_Datatype mpi = MPI_DATATYPE_NULL;  // null: not reducible (moved as bytes)
  std::size_t bytes = 0;
};

Type type_of(ncclDataType_t type) {
  switch (type) {
    case ncclInt8:
      return {MPI_INT8_T, 1};
    case ncclUint8:
      return {MPI_UINT8_T, 1};
    case ncclInt32:
      return {MPI_INT32_T, 4};
    case ncclUint32:
      return {MPI_UINT32_T, 4};
    case ncclInt64:
      return {MPI_INT64_T, 8};
    case ncclUint64:
      return {MPI_UINT64_T, 8};
    case ncclFloat32:
      return {MPI_FLOAT, 4};
    case ncclFloat64:
      return {MPI_DOUBLE, 8};
    case ncclFloat16:
    case ncclBfloat16:
      return {MPI_DATATYPE_NULL, 2};
    default:
      break;
  }
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 24, 0)
  if (type == ncclFloat8e4m3 || type == ncclFloat8e5m2) return {MPI_DATATYPE_NULL, 1};
#endif
  return {};
}

ncclResult_t check_type(ncclDataType_t type, const char* call) {
  if (type_of(type).bytes == 0) return fail(ncclInvalidArgument, std::string(call) + ": unknown data type");
  return ncclSuccess;
}

ncclResult_t reduction(ncclDataType_t type, ncclRedOp_t op, const char* call, MPI_Datatype& mpi_type, MPI_Op& mpi_op) {
  mpi_type = type_of(type).mpi;
  if (mpi_type == MPI_DATATYPE_NULL)
    return fail(ncclInvalidArgument, std::string(call) + ": the emulated NCCL reduces no 16- or 8-bit floats");
  switch (op) {
    case ncclSum:
    case ncclAvg:
      mpi_op = MPI_SUM;
      return ncclSuccess;
    case ncclProd:
      mpi_op = MPI_PROD;
      return ncclSuccess;
    case ncclMax:
      mpi_op = MPI_MAX;
      return ncclSuccess;
    case ncclMin:
      mpi_op = MPI_MIN;
      return ncclSuccess;
    default:
      return fail(ncclInvalidArgument, std::string(call) + ": reduction operation " + std::to_string(op) +
                                           " is not emulated (sum, prod, max, min, avg)");
  }
}

// ncclAvg: the sum divided by the rank count.
template <typename T>
void divide(void* data, std::size_t count, int ranks) {
  auto* values = static_cast<T*>(data);
  for (std::size_t i = 0; i < count; ++i) values[i] = static_cast<T>(values[i] / static_cast<T>(ranks));
}

void average(void* data, std::size_t count, ncclDataType_t type, int ranks) {
  switch (type) {
    case ncclInt8:
      return divide<std::int8_t>(data, count, ranks);
    case ncclUint8:
      return divide<std::uint8_t>(data, count, ranks);
    case ncclInt32:
      return divide<std::int32_t>(data, count, ranks);
    case ncclUint32:
      return divide<std::uint32_t>(data, count, ranks);
    case ncclInt64:
      return divide<std::int64_t>(data, count, ranks);
    case ncclUint64:
      return divide<std::uint64_t>(data, count, ranks);
    case ncclFloat32:
      return divide<float>(data, count, ranks);
    case ncclFloat64:
      return divide<double>(data, count, ranks);
    default:
      return;
  }
}

ncclResult_t check_comm(ncclComm_t comm, const char* call) {
  if (comm == nullptr) return fail(ncclInvalidArgument, std::string(call) + ": null communicator");
  if (comm->mpi == MPI_COMM_NULL) return fail(ncclInvalidUsage, std::string(call) + ": communicator was aborted");
  return ncclSuccess;
}

ncclResult_t check_count(std::size_t count, const char* call) {
  if (count > static_cast<std::size_t>(INT_MAX))
    return fail(ncclInvalidArgument,
                std::string(call) + ": " + std::to_string(count) + " elements (the emulated NCCL takes up to INT_MAX)");
  return ncclSuccess;
}

ncclResult_t check_rank(ncclComm_t comm, int rank, const char* call, const char* role) {
  if (rank < 0 || rank >= comm->size)
    return fail(ncclInvalidArgument, std::string(call) + ": " + role + " " + std::to_string(rank) +
                                         " is not a rank of this communicator of " + std::to_string(comm->size));
  return ncclSuccess;
}

// The buffer [pointer, +bytes) must be emulated device memory of the communicator's device, or pinned host memory.
ncclResult_t check_buffer(ncclComm_t comm, const void* pointer, std::size_t bytes, const char* call, const char* role) {
  if (bytes == 0) return ncclSuccess;
  const auto* first = static_cast<const char*>(pointer);
  for (const char* at : {first, first + bytes - 1}) {
    cudaPointerAttributes attributes{};
    const bool known = pointer != nullptr && cudaPointerGetAttributes(&attributes, at) == cudaSuccess &&
                       attributes.devicePointer != nullptr;
    if (!known) {
      char text[160];
      std::snprintf(text, sizeof text, "%s: the %s [%p, +%zu bytes) is not inside device or pinned host memory", call,
                    role, pointer, bytes);
      return fail(ncclInvalidArgument, text);
    }
    if (attributes.type == cudaMemoryTypeDevice && attributes.device != comm->device) {
      char text[160];
      std::snprintf(text, sizeof text, "%s: the %s %p was allocated on device %d, the communicator's device is %d",
                    call, role, pointer, attributes.device, comm->device);
      return fail(ncclInvalidArgument, text);
    }
  }
  return ncclSuccess;
}

bool overlap(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
  const auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
  return a_bytes > 0 && b_bytes > 0 && x < y + b_bytes && y < x + a_bytes;
}

// Queued operations of an open group (per host thread, as NCCL's groups are).
struct PointToPoint {
  bool send;
  void* buffer;
  int count;
  MPI_Datatype type;
  int peer;
  MPI_Comm mpi;
};
thread_local int group_depth = 0;
thread_local std::vector<PointToPoint> group_messages;
thread_local std::vector<std::function<ncclResult_t()>> group_collectives;

ncclResult_t run_or_queue(std::function<ncclResult_t()> collective) {
  if (group_depth > 0) {
    group_collectives.push_back(std::move(collective));
    return ncclSuccess;
  }
  return collective();
}

ncclResult_t run_messages(std::vector<PointToPoint>& messages,
                          std::vector<std::function<ncclResult_t()>>& collectives) {
  std::vector<MPI_Request> requests(messages.size(), MPI_REQUEST_NULL);
  ncclResult_t result = ncclSuccess;
  for (std::size_t i = 0; i < messages.size() && result == ncclSuccess; ++i) {
    const PointToPoint& m = messages[i];
    result = m.send ? check_mpi(MPI_Isend(m.buffer, m.count, m.type, m.peer, 0, m.mpi, &requests[i]), "MPI_Isend")
                    : check_mpi(MPI_Irecv(m.buffer, m.count, m.type, m.peer, 0, m.mpi, &requests[i]), "MPI_Irecv");
  }
  for (auto& collective : collectives)
    if (result == ncclSuccess) result = collective();
  const ncclResult_t waited =
      check_mpi(MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
  return result != ncclSuccess ? result : waited;
}

ncclResult_t point_to_point(bool send, const void* buffer, std::size_t count, ncclDataType_t datatype, int peer,
                            ncclComm_t comm, const char* call) {
  if (ncclResult_t r = check_comm(comm, call); r != ncclSuccess) return r;
  if (ncclResult_t r = check_type(datatype, call); r != ncclSuccess) return r;
  if (ncclResult_t r = check_count(count, call); r != ncclSuccess) return r;
  if (ncclResult_t r = check_rank(comm, peer, call, "peer"); r != ncclSuccess) return r;
  const std::size_t bytes = count * type_of(datatype).bytes;
  if (ncclResult_t r = check_buffer(comm, buffer, bytes, call, "buffer"); r != ncclSuccess) return r;
  // Moved as bytes (so 16- and 8-bit floats travel too); at most INT_MAX bytes per message.
  if (bytes > static_cast<std::size_t>(INT_MAX))
    return fail(ncclInvalidArgument, std::string(call) + ": messages above INT_MAX bytes are not emulated");
  PointToPoint message{send, const_cast<void*>(buffer), static_cast<int>(bytes), MPI_BYTE, peer, comm->mpi};
  if (group_depth > 0) {
    group_messages.push_back(message);
    return ncclSuccess;
  }
  std::vector<PointToPoint> one{message};
  std::vector<std::function<ncclResult_t()>> none;
  return run_messages(one, none);
}

std::uint64_t hash(const ncclUniqueId& id) {
  std::uint64_t h = 1469598103934665603ULL;  // FNV-1a
  for (char c : id.internal) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ULL;
  }
  return h;
}

ncclComm_t make_comm(MPI_Comm mpi) {
  auto* comm = new ncclComm;
  comm->mpi = mpi;
  MPI_Comm_rank(mpi, &comm->rank);
  MPI_Comm_size(mpi, &comm->size);
  cudaGetDevice(&comm->device);
  return comm;
}

void free_comm(ncclComm_t comm) {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm->mpi != MPI_COMM_NULL) MPI_Comm_free(&comm->mpi);
  delete comm;
}

}  // namespace
}  // namespace proplab::emu::nccl

using namespace proplab::emu::nccl;

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return fail(ncclInvalidArgument, "ncclGetVersion: null version");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (id == nullptr) return fail(ncclInvalidArgument, "ncclGetUniqueId: null id");
  static std::atomic<std::uint64_t> counter{0};
  std::memset(id->internal, 0, sizeof id->internal);
  const std::int64_t pid = getpid();
  const std::int64_t now = std::chrono::steady_clock::now().time_since_epoch().count();
  const std::int64_t wall = std::chrono::system_clock::now().time_since_epoch().count();
  const std::uint64_t n = counter.fetch_add(1);
  char host[64] = {};
  gethostname(host, sizeof host - 1);
  std::memcpy(id->internal, "proplab-emu", 11);
  std::memcpy(id->internal + 16, &pid, 8);
  std::memcpy(id->internal + 24, &now, 8);
  std::memcpy(id->internal + 32, &wall, 8);
  std::memcpy(id->internal + 40, &n, 8);
  std::memcpy(id->internal + 48, host, sizeof host);
  return ncclSuccess;
}

// Collective over MPI_COMM_WORLD (see the header comment): every world rank calls it.
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  if (ncclResult_t r = ensure_mpi(); r != ncclSuccess) return r;
  if (comm != nullptr) *comm = nullptr;
  const bool valid = comm != nullptr && nranks >= 1 && rank >= 0 && rank < nranks;
  // A rank with bad arguments still takes part in the split (with no colour), so the others do not hang in it.
  const int color = valid ? static_cast<int>(hash(id) & 0x7fffffff) : MPI_UNDEFINED;
  MPI_Comm mpi = MPI_COMM_NULL;
  if (ncclResult_t r = check_mpi(MPI_Comm_split(MPI_COMM_WORLD, color, rank, &mpi), "MPI_Comm_split"); r != ncclSuccess)
    return r;
  if (!valid)
    return fail(ncclInvalidArgument, "ncclCommInitRank: rank " + std::to_string(rank) + " of " +
                                         std::to_string(nranks) + " ranks (or a null comm)");
  int size = 0, got = 0;
  MPI_Comm_size(mpi, &size);
  MPI_Comm_rank(mpi, &got);
  // Every member must have passed the same id, nranks and a rank equal to its place: agreed by all of them.
  ncclUniqueId first = id;
  MPI_Bcast(first.internal, NCCL_UNIQUE_ID_BYTES, MPI_BYTE, 0, mpi);
  int bad = size != nranks || got != rank || std::memcmp(first.internal, id.internal, NCCL_UNIQUE_ID_BYTES) != 0;
  MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, mpi);
  if (bad) {
    MPI_Comm_free(&mpi);
    return fail(ncclInvalidArgument, "ncclCommInitRank: rank " + std::to_string(rank) + " of " +
                                         std::to_string(nranks) + ": the ranks joining this id are " +
                                         std::to_string(size) + ", or their ranks or ids disagree");
  }
  *comm = make_comm(mpi);
  return ncclSuccess;
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t*) {
  if (ncclResult_t r = check_comm(comm, "ncclCommSplit"); r != ncclSuccess) return r;
  if (newcomm != nullptr) *newcomm = nullptr;
  const bool valid = newcomm != nullptr && (color >= 0 || color == NCCL_SPLIT_NOCOLOR);
  MPI_Comm mpi = MPI_COMM_NULL;
  if (ncclResult_t r = check_mpi(MPI_Comm_split(comm->mpi, valid && color >= 0 ? color : MPI_UNDEFINED, key, &mpi),
                                 "MPI_Comm_split");
      r != ncclSuccess)
    return r;
  if (!valid)
    return fail(ncclInvalidArgument, "ncclCommSplit: colour " + std::to_string(color) + " (or a null newcomm)");
  if (mpi != MPI_COMM_NULL) *newcomm = make_comm(mpi);
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) { return check_comm(comm, "ncclCommFinalize"); }

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm != nullptr) free_comm(comm);
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm != nullptr) free_comm(comm);
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (comm == nullptr || count == nullptr) return fail(ncclInvalidArgument, "ncclCommCount: null argument");
  *count = comm->size;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (comm == nullptr || rank == nullptr) return fail(ncclInvalidArgument, "ncclCommUserRank: null argument");
  *rank = comm->rank;
  return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  if (comm == nullptr || device == nullptr) return fail(ncclInvalidArgument, "ncclCommCuDevice: null argument");
  *device = comm->device;
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
  if (comm == nullptr || async_error == nullptr)
    return fail(ncclInvalidArgument, "ncclCommGetAsyncError: null argument");
  *async_error = comm->async_error;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
      return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
      return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument:
      return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
      return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t) { return last_error.c_str(); }

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t) {
  const char* call = "ncclAllReduce";
  if (ncclResult_t r = check_comm(comm, call); r != ncclSuccess) return r;
  MPI_Datatype type;
  MPI_Op mpi_op;
  if (ncclResult_t r = reduction(datatype, op, call, type, mpi_op); r != ncclSuccess) return r;
  if (ncclResult_t r = check_count(count, call); r != ncclSuccess) return r;
  const std::size_t bytes = count * type_of(datatype).bytes;
  if (ncclResult_t r = check_buffer(comm, sendbuff, bytes, call, "send buffer"); r != ncclSuccess) return r;
  if (ncclResult_t r = check_buffer(comm, recvbuff, bytes, call, "receive buffer"); r != ncclSuccess) return r;
  return run_or_queue([=] {
    const void* send = sendbuff == recvbuff ? MPI_IN_PLACE : sendbuff;
    if (ncclResult_t r =
            check_mpi(MPI_Allreduce(send, recvbuff, static_cast<int>(count), type, mpi_op, comm->mpi), "MPI_Allreduce");
        r != ncclSuccess)
      return r;
    if (op == ncclAvg) average(recvbuff, count, datatype, comm->size);
    return ncclSuccess;
  });
}

ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t) {
  const char* call = "ncclReduce";
  if (ncclResult_t r = check_comm(comm, call); r != ncclSuccess) return r;
  MPI_Datatype type;
  MPI_Op mpi_op;
  if (ncclResult_t r = reduction(datatype, op, call, type, mpi_op); r != ncclSuccess) return r;
  if (ncclResult_t r = check_count(count, call); r != ncclSuccess) return r;
  if (ncclResult_t r = check_rank(comm, root, call, "root"); r != ncclSuccess) return r;
  const std::size_t bytes = count * type_of(datatype).bytes;
  const bool is_root = comm->rank == root;
  if (ncclResult_t r = check_buffer(comm, sendbuff, bytes, call, "send buffer"); r != ncclSuccess) return r;
  if (is_root)
    if (ncclResult_t r = check_buffer(comm, recvbuff, bytes, call, "receive buffer"); r != ncclSuccess) return r;
  return run_or_queue([=] {
    const void* send = is_root && sendbuff == recvbuff ? MPI_IN_PLACE : sendbuff;
    if (ncclResult_t r = check_mpi(
            MPI_Reduce(send, is_root ? recvbuff : nullptr, static_cast<int>(count), type, mpi_op, root, comm->mpi),
            "MPI_Reduce");
        r != ncclSuccess)
      return r;
    if (is_root && op == ncclAvg) average(recvbuff, count, datatype, comm->size);
    return ncclSuccess;
  });
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t) {
  const char* call = "ncclBroadcast";
  if (ncclResult_t r = check_comm(comm, call); r != ncclSuccess) return r;
  if (ncclResult_t r = check_type(datatype, call); r != ncclSuccess) return r;
  if (ncclResult_t r = check_rank(comm, root, call, "root"); r != ncclSuccess) return r;
  const std::size_t bytes = count * type_of(datatype).bytes;
  if (ncclResult_t r = check_count(bytes, call); r != ncclSuccess) return r;
  const bool is_root = comm->rank == root;
  if (is_root)
    if (ncclResult_t r = check_buffer(comm, sendbuff, bytes, call, "send buffer"); r != ncclSuccess) return r;
  if (ncclResult_t r = check_buffer(comm, recvbuff, bytes, call, "receive buffer"); r != ncclSuccess) return r;
  return run_or_queue([=] {
    if (is_root && sendbuff != recvbuff && bytes > 0) std::memmove(recvbuff, sendbuff, bytes);
    return check_mpi(MPI_Bcast(recvbuff, static_cast<int>(bytes), MPI_BYTE, root, comm->mpi), "MPI_Bcast");
  });
}

ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                       cudaStream_t stream) {
  return ncclBroadcast(buff, buff, count, datatype, root, comm, stream);
}

// In place when recvbuff is sendbuff + rank·recvcount (NCCL's convention); any other overlap goes through a copy.
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t) {
  const char* call = "ncclReduceScatter";
  if (ncclResult_t r = check_comm(comm, call); r != ncclSuccess) return r;
  MPI_Datatype type;
  MPI_Op mpi_op;
  if (ncclResult_t r = reduction(datatype, op, call, type, mpi_op); r != ncclSuccess) return r;
  if (ncclResult_t r = check_count(recvcount * static_cast<std::size_t>(comm->size), call); r != ncclSuccess) return r;
  const std::size_t bytes = recvcount * type_of(datatype).bytes;
  if (ncclResult_t r = check_buffer(comm, sendbuff, bytes * comm->size, call, "send buffer"); r != ncclSuccess)
    return r;
  if (ncclResult_t r = check_buffer(comm, recvbuff, bytes, call, "receive buffer"); r != ncclSuccess) return r;
  return run_or_queue([=] {
    const void* send = sendbuff;
    std::vector<char> copy;
    if (overlap(sendbuff, bytes * comm->size, recvbuff, bytes)) {
      copy.assign(static_cast<const char*>(sendbuff), static_cast<const char*>(sendbuff) + bytes * comm->size);
      send = copy.data();
    }
    if (ncclResult_t r =
            check_mpi(MPI_Reduce_scatter_block(send, recvbuff, static_cast<int>(recvcount), type, mpi_op, comm->mpi),
                      "MPI_Reduce_scatter_block");
        r != ncclSuccess)
      return r;
    if (op == ncclAvg) average(recvbuff, recvcount, datatype, comm->size);
    return ncclSuccess;
  });
}

// In place when sendbuff is recvbuff + rank·sendcount (NCCL's convention, MPI_IN_PLACE's too).
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t) {
  const char* call = "ncclAllGather";
  if (ncclResult_t r = check_comm(comm, call); r != ncclSuccess) return r;
  if (ncclResult_t r = check_type(datatype, call); r != ncclSuccess) return r;
  const std::size_t bytes = sendcount * type_of(datatype).bytes;
  if (ncclResult_t r = check_count(bytes * comm->size, call); r != ncclSuccess) return r;
  if (ncclResult_t r = check_buffer(comm, sendbuff, bytes, call, "send buffer"); r != ncclSuccess) return r;
  if (ncclResult_t r = check_buffer(comm, recvbuff, bytes * comm->size, call, "receive buffer"); r != ncclSuccess)
    return r;
  return run_or_queue([=] {
    const void* send = sendbuff;
    std::vector<char> copy;
    if (sendbuff == static_cast<const char*>(recvbuff) + bytes * comm->rank) {
      send = MPI_IN_PLACE;
    } else if (overlap(sendbuff, bytes, recvbuff, bytes * comm->size)) {
      copy.assign(static_cast<const char*>(sendbuff), static_cast<const char*>(sendbuff) + bytes);
      send = copy.data();
    }
    return check_mpi(
        MPI_Allgather(send, static_cast<int>(bytes), MPI_BYTE, recvbuff, static_cast<int>(bytes), MPI_BYTE, comm->mpi),
        "MPI_Allgather");
  });
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t) {
  return point_to_point(true, sendbuff, count, datatype, peer, comm, "ncclSend");
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm, cudaStream_t) {
  return point_to_point(false, recvbuff, count, datatype, peer, comm, "ncclRecv");
}

ncclResult_t ncclGroupStart() {
  ++group_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (group_depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--group_depth > 0) return ncclSuccess;
  std::vector<PointToPoint> messages;
  std::vector<std::function<ncclResult_t()>> collectives;
  messages.swap(group_messages);
  collectives.swap(group_collectives);
  return run_messages(messages, collectives);
}

}  // extern "C"
