// kernels/common: what every CUDA op in kernels/ shares — error checks, launch geometry, alignment tests.
//
// Invariants:
// - Every CUDA runtime call goes through PROPLAB_CUDA_CHECK and every kernel launch is followed by
//   PROPLAB_CUDA_CHECK_LAUNCH(kernel name); a failure throws std::runtime_error naming the call (or kernel), the
//   CUDA error string, file and line. Nothing is silently ignored.
// - Launch geometry of a reduction depends only on the problem size (never on the GPU's SM count), so a
//   deterministic fixed-order reduction gives bitwise the same result on every GPU and every run.
// - Host-compilable: this header declares no device code, so .cpp files may include it too.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace proplab::kernels {

// Threads per block for the elementwise and reduction kernels (a power of two: the block reductions need it).
constexpr int kBlockThreads = 256;
// Upper bound on the grid of a grid-stride kernel; beyond it each thread loops.
constexpr std::int64_t kMaxBlocks = 1024;

namespace detail {
[[noreturn]] inline void fail_cuda(cudaError_t status, const char* what, const char* file, int line) {
  throw std::runtime_error(std::string("CUDA error in ") + what + ": " + cudaGetErrorName(status) + ": " +
                           cudaGetErrorString(status) + " (" + file + ":" + std::to_string(line) + ")");
}
}  // namespace detail

// Blocks for a grid-stride kernel over `work_items` items, `items_per_thread` each on the first pass; at least 1,
// at most kMaxBlocks. A function of the size only (see invariants).
inline unsigned grid_blocks(std::int64_t work_items, std::int64_t items_per_thread = 1) {
  std::int64_t per_block = static_cast<std::int64_t>(kBlockThreads) * items_per_thread;
  std::int64_t blocks = (work_items + per_block - 1) / per_block;
  return static_cast<unsigned>(std::clamp<std::int64_t>(blocks, 1, kMaxBlocks));
}

// True when `pointer` is null or a multiple of `bytes` (float4 access needs 16).
inline bool is_aligned(const void* pointer, std::uintptr_t bytes) {
  return reinterpret_cast<std::uintptr_t>(pointer) % bytes == 0;
}

}  // namespace proplab::kernels

// PROPLAB_CUDA_CHECK(call): evaluates a CUDA runtime call once; throws std::runtime_error unless cudaSuccess.
#define PROPLAB_CUDA_CHECK(call)                                                              \
  do {                                                                                        \
    cudaError_t proplab_cuda_status_ = (call);                                                \
    if (proplab_cuda_status_ != cudaSuccess)                                                  \
      ::proplab::kernels::detail::fail_cuda(proplab_cuda_status_, #call, __FILE__, __LINE__); \
  } while (0)

// PROPLAB_CUDA_CHECK_LAUNCH("kernel_name"), a string literal: right after a <<<...>>> launch; throws naming the
// kernel when the launch failed (bad configuration, no device, no kernel image for this GPU, ...).
#define PROPLAB_CUDA_CHECK_LAUNCH(kernel_name)                                                               \
  do {                                                                                                       \
    cudaError_t proplab_cuda_status_ = cudaGetLastError();                                                   \
    if (proplab_cuda_status_ != cudaSuccess)                                                                 \
      ::proplab::kernels::detail::fail_cuda(proplab_cuda_status_, "launch of kernel " kernel_name, __FILE__, \
                                            __LINE__);                                                       \
  } while (0)
