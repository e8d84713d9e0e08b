// core/device: the CUDA device a process computes on — its stream, its caching memory pool, what it is — behind a
// header that needs no CUDA headers (a CPU-only build compiles it; every function then reports "no GPU").
//
// Invariants:
// - One compute stream per process (on device ordinal cuda_ordinal()). Every kernel, cuBLASLt call and tensor
//   copy is enqueued on it (kernels/context.cuh hands it to launchers), so work is ordered without per-op
//   synchronisation; the host waits only where it reads a result (cuda_synchronize, a device-to-host copy).
// - Device memory comes from a caching pool: a released block goes back to a free list keyed by its rounded size
//   and is handed out again for the next request of that size, so a training step, which asks for the same sizes
//   every step, calls cudaMalloc only in its first step and never cudaFree. Reuse is safe without events because
//   all work runs on the one stream, in order.
// - When cudaMalloc fails the pool frees its cached blocks and tries once more; if that fails too it throws
//   DeviceMemoryError naming what was being allocated (the innermost AllocationLabel), its size, and the free and
//   total memory of the device.
// - The matrix-product precision (MatmulPrecision) is one process-wide setting, fp32 unless a run sets it: with
//   bf16 the CUDA linear and convolution products round their operands to bf16 (accumulating in f32); every other
//   op, and every op on the CPU, ignores it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace proplab {

// Out of device memory: what(): "out of GPU memory allocating <label> (<size>): <free> free of <total> on <GPU>;
// proplab holds <held> (<cached> cached)".
struct DeviceMemoryError : std::runtime_error {
  DeviceMemoryError(const std::string& message, std::size_t requested_bytes)
      : std::runtime_error(message), requested_bytes_(requested_bytes) {}
  std::size_t requested_bytes() const { return requested_bytes_; }

 private:
  std::size_t requested_bytes_;
};

// What the GPU is (empty name and zero sizes without one).
struct GpuInfo {
  int ordinal = -1;
  std::string name;
  int compute_major = 0, compute_minor = 0;
  std::size_t total_bytes = 0;
  std::size_t free_bytes = 0;
};
// The GPU this process computes on; a UserError when there is none (or no CUDA in this build).
GpuInfo gpu_info();

// The device ordinal this process uses (0 unless set_cuda_ordinal chose another before the first CUDA call).
int cuda_ordinal();
// Chooses the device ordinal (one GPU per rank: the local rank); a UserError when it does not exist.
void set_cuda_ordinal(int ordinal);

// The compute stream as an opaque pointer (a cudaStream_t); created on first use.
void* cuda_stream();
// Waits for everything enqueued on the compute stream; rethrows an asynchronous CUDA error naming `where`.
void cuda_synchronize(const char* where);

// True when `pointer` lies in device memory (anywhere inside an allocation): how a communicator that carries both
// host and device buffers tells them apart. Always false in a build without CUDA.
bool is_device_pointer(const void* pointer);
// Copies between host and device memory on the compute stream, in order with the kernels before it, and waits for
// the copy: the host may read (or reuse) its side on return.
void copy_device_to_host(void* host, const void* device, std::size_t bytes);
void copy_host_to_device(void* device, const void* host, std::size_t bytes);

// Page-locked host memory (cudaHostAlloc), through which device buffers are staged for MPI; it grows on demand and
// keeps its largest size. Plain host memory in a build without CUDA.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer();
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  // At least `bytes` bytes (the contents are not kept when it grows).
  void* reserve(std::size_t bytes);
  std::size_t capacity() const { return capacity_; }

 private:
  void* data_ = nullptr;
  std::size_t capacity_ = 0;
};

// The pool's counters, in bytes.
struct DeviceMemoryStats {
  std::size_t in_use = 0;               // handed out to tensors now
  std::size_t peak_in_use = 0;          // the most ever handed out at once (since reset_peak_memory)
  std::size_t reserved = 0;             // obtained from cudaMalloc (in use + cached)
  std::int64_t device_allocations = 0;  // cudaMalloc calls so far
};
DeviceMemoryStats device_memory_stats();
void reset_peak_device_memory();
// Returns every cached (free) block to the driver.
void release_cached_device_memory();

// The size class of a request: multiples of 512 bytes up to 1 MiB, multiples of 2 MiB above (at least 512).
std::size_t device_block_size(std::size_t bytes);

// Names the allocations made on this thread while it lives (innermost wins), for out-of-memory messages:
// AllocationLabel label("blocks.3.mlp.fc.weight");
class AllocationLabel {
 public:
  explicit AllocationLabel(std::string label);
  ~AllocationLabel();
  AllocationLabel(const AllocationLabel&) = delete;
  AllocationLabel& operator=(const AllocationLabel&) = delete;
  // The innermost label on this thread, or "a tensor".
  static std::string current();

 private:
  std::string previous_;
  bool had_previous_;
};

namespace detail {
// The pool behind Allocator for Device::cuda (core/tensor.cpp); bytes as requested (rounded inside).
void* device_pool_allocate(std::size_t bytes);
void device_pool_release(void* pointer, std::size_t bytes);
}  // namespace detail

// The inputs of the CUDA matrix products (linear layers, convolutions): fp32, or bf16 operands rounded to nearest
// even with f32 accumulation and f32 outputs. Read by src/ops on every CUDA product; the CPU ignores it.
enum class MatmulPrecision : std::uint8_t { fp32, bf16 };
void set_matmul_precision(MatmulPrecision precision);
MatmulPrecision matmul_precision();
// "fp32" or "bf16".
const char* matmul_precision_name(MatmulPrecision precision);

// Sets the matrix-product precision while it lives and restores the previous one after (a run's duration).
class ScopedMatmulPrecision {
 public:
  explicit ScopedMatmulPrecision(MatmulPrecision precision) : previous_(matmul_precision()) {
    set_matmul_precision(precision);
  }
  ~ScopedMatmulPrecision() { set_matmul_precision(previous_); }
  ScopedMatmulPrecision(const ScopedMatmulPrecision&) = delete;
  ScopedMatmulPrecision& operator=(const ScopedMatmulPrecision&) = delete;

 private:
  MatmulPrecision previous_;
};

// "1.50 GiB", "12.0 MiB", "512 B".
std::string format_bytes(std::size_t bytes);

}  // namespace proplab
