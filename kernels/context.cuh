// kernels/context: what every CUDA launcher reaches — the compute stream (core/device's), the cuBLASLt handle and
// its workspace — and scratch buffers from the caching pool.
//
// Invariants:
// - context() is created on first use on the process's device (core/device.h cuda_ordinal()) and lives until the
//   process ends. Every launch in kernels/ takes context().stream; no kernel picks a stream itself.
// - The cuBLASLt workspace is allocated once (kWorkspaceBytes) from the pool, so a matmul never allocates.
// - Scratch holds a launcher's temporaries (per-block partial sums, sort buffers). It comes from core/device's
//   caching pool and goes back there when the Scratch is destroyed; that is safe while kernels using it are still
//   queued, because every later user of the block runs on the same stream, after them.
// - Host-compilable: no device code here, so src/ops/*.cpp may include it.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace proplab::kernels {

struct Context {
  int ordinal = 0;
  cudaStream_t stream = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
};

// 32 MiB: what cuBLASLt's Hopper kernels ask for at most.
constexpr std::size_t kWorkspaceBytes = std::size_t{32} << 20;

Context& context();

// A temporary device buffer from the caching pool (see invariants).
class Scratch {
 public:
  explicit Scratch(std::size_t bytes);
  ~Scratch();
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  std::size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

// Copies `count` values from the device to the host on the compute stream and waits for them (the one point where
// a launcher hands a scalar back to the host).
void copy_to_host(void* host, const void* device, std::size_t bytes);
void copy_to_device(void* device, const void* host, std::size_t bytes);

}  // namespace proplab::kernels

// PROPLAB_CUBLAS_CHECK(call): a cuBLAS(Lt) call; throws std::runtime_error naming the call and status otherwise.
#define PROPLAB_CUBLAS_CHECK(call)                                                                   \
  do {                                                                                               \
    cublasStatus_t proplab_cublas_status_ = (call);                                                  \
    if (proplab_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                             \
      ::proplab::kernels::detail::fail_cublas(proplab_cublas_status_, #call, __FILE__, __LINE__);    \
  } while (0)

namespace proplab::kernels::detail {
[[noreturn]] void fail_cublas(cublasStatus_t status, const char* what, const char* file, int line);
}  // namespace proplab::kernels::detail
