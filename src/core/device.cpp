#include "core/device.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <new>
#include <cstdio>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/error.h"

#ifdef PROPLAB_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace proplab {

namespace {
thread_local std::string t_label;
thread_local bool t_has_label = false;
}  // namespace

AllocationLabel::AllocationLabel(std::string label) : previous_(std::move(t_label)), had_previous_(t_has_label) {
  t_label = std::move(label);
  t_has_label = true;
}

AllocationLabel::~AllocationLabel() {
  t_label = std::move(previous_);
  t_has_label = had_previous_;
}

std::string AllocationLabel::current() { return t_has_label ? t_label : std::string("a tensor"); }

namespace {
std::atomic<MatmulPrecision> g_matmul_precision{MatmulPrecision::fp32};
}  // namespace

void set_matmul_precision(MatmulPrecision precision) { g_matmul_precision.store(precision); }
MatmulPrecision matmul_precision() { return g_matmul_precision.load(); }
const char* matmul_precision_name(MatmulPrecision precision) {
  return precision == MatmulPrecision::bf16 ? "bf16" : "fp32";
}

std::string format_bytes(std::size_t bytes) {
  char text[64];
  const double b = static_cast<double>(bytes);
  if (bytes >= (std::size_t{1} << 30))
    std::snprintf(text, sizeof text, "%.2f GiB", b / (1u << 30));
  else if (bytes >= (std::size_t{1} << 20))
    std::snprintf(text, sizeof text, "%.1f MiB", b / (1u << 20));
  else if (bytes >= 1024)
    std::snprintf(text, sizeof text, "%.1f KiB", b / 1024);
  else
    std::snprintf(text, sizeof text, "%zu B", bytes);
  return text;
}

std::size_t device_block_size(std::size_t bytes) {
  constexpr std::size_t kSmall = 512, kLarge = std::size_t{2} << 20, kSmallLimit = std::size_t{1} << 20;
  if (bytes == 0) return kSmall;
  if (bytes <= kSmallLimit) return (bytes + kSmall - 1) / kSmall * kSmall;
  return (bytes + kLarge - 1) / kLarge * kLarge;
}

#ifdef PROPLAB_WITH_CUDA

namespace {

int g_ordinal = 0;
std::atomic<bool> g_stream_made{false};  // the compute stream exists (on g_ordinal's device)

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw std::runtime_error(std::string("CUDA error in ") + what + ": " + cudaGetErrorName(status) + ": " +
                             cudaGetErrorString(status));
}

void require_gpu() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    throw UserError("no CUDA GPU is present (the CUDA driver reports none)");
  }
}

// The caching pool. All blocks belong to g_ordinal's device.
class Pool {
 public:
  void* allocate(std::size_t bytes) {
    const std::size_t size = device_block_size(bytes);
    std::lock_guard<std::mutex> lock(mutex_);
    void* pointer = nullptr;
    auto cached = free_.find(size);
    if (cached != free_.end()) {
      pointer = cached->second;
      free_.erase(cached);
      cached_bytes_ -= size;
    } else {
      pointer = device_malloc(size, bytes);
    }
    stats_.in_use += size;
    if (stats_.in_use > stats_.peak_in_use) stats_.peak_in_use = stats_.in_use;
    return pointer;
  }

  void release(void* pointer, std::size_t bytes) {
    if (!pointer) return;
    const std::size_t size = device_block_size(bytes);
    std::lock_guard<std::mutex> lock(mutex_);
    free_.emplace(size, pointer);
    cached_bytes_ += size;
    stats_.in_use -= size;
  }

  void release_cached() {
    std::lock_guard<std::mutex> lock(mutex_);
    release_cached_locked();
  }

  DeviceMemoryStats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

  void reset_peak() {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.peak_in_use = stats_.in_use;
  }

 private:
  void* device_malloc(std::size_t size, std::size_t requested) {
    void* pointer = nullptr;
    cudaError_t status = cudaMalloc(&pointer, size);
    if (status == cudaErrorMemoryAllocation && cached_bytes_ > 0) {
      cudaGetLastError();
      release_cached_locked();
      status = cudaMalloc(&pointer, size);
    }
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      std::size_t free_bytes = 0, total_bytes = 0;
      cudaMemGetInfo(&free_bytes, &total_bytes);
      cudaDeviceProp prop{};
      cudaGetDeviceProperties(&prop, g_ordinal);
      throw DeviceMemoryError("out of GPU memory allocating " + AllocationLabel::current() + " (" +
                                  format_bytes(requested) + "): " + format_bytes(free_bytes) + " free of " +
                                  format_bytes(total_bytes) + " on " + prop.name + " (GPU " +
                                  std::to_string(g_ordinal) + "); proplab holds " + format_bytes(stats_.reserved) +
                                  ", of which " + format_bytes(stats_.in_use) + " in use",
                              requested);
    }
    check(status, "cudaMalloc");
    stats_.reserved += size;
    ++stats_.device_allocations;
    return pointer;
  }

  void release_cached_locked() {
    // The stream may still use a block released moments ago: wait for it before handing memory back.
    cudaDeviceSynchronize();
    for (auto& [size, pointer] : free_) {
      cudaFree(pointer);
      stats_.reserved -= size;
    }
    free_.clear();
    cached_bytes_ = 0;
  }

  std::mutex mutex_;
  std::multimap<std::size_t, void*> free_;
  std::size_t cached_bytes_ = 0;
  DeviceMemoryStats stats_;
};

Pool& pool() {
  // Never destroyed: tensors released during static destruction still find it (their blocks simply stay cached
  // until the process ends and the driver reclaims everything).
  static Pool* instance = new Pool();
  return *instance;
}

}  // namespace

GpuInfo gpu_info() {
  require_gpu();
  GpuInfo info;
  info.ordinal = g_ordinal;
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, g_ordinal), "cudaGetDeviceProperties");
  info.name = prop.name;
  info.compute_major = prop.major;
  info.compute_minor = prop.minor;
  check(cudaSetDevice(g_ordinal), "cudaSetDevice");
  check(cudaMemGetInfo(&info.free_bytes, &info.total_bytes), "cudaMemGetInfo");
  return info;
}

int cuda_ordinal() { return g_ordinal; }

void set_cuda_ordinal(int ordinal) {
  require_gpu();
  int count = 0;
  check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  if (ordinal < 0 || ordinal >= count)
    throw UserError("GPU " + std::to_string(ordinal) + " does not exist (this machine has " + std::to_string(count) +
                    ")");
  PROPLAB_CHECK(!g_stream_made.load() || ordinal == g_ordinal, "set_cuda_ordinal(", ordinal,
                ") after the compute stream was made on GPU ", g_ordinal, ": a rank chooses its GPU first");
  g_ordinal = ordinal;
  check(cudaSetDevice(ordinal), "cudaSetDevice");
}

void* cuda_stream() {
  static cudaStream_t stream = [] {
    require_gpu();
    check(cudaSetDevice(g_ordinal), "cudaSetDevice");
    cudaStream_t s = nullptr;
    check(cudaStreamCreate(&s), "cudaStreamCreate");
    g_stream_made.store(true);
    return s;
  }();
  return stream;
}

void cuda_synchronize(const char* where) {
  const cudaError_t status = cudaStreamSynchronize(static_cast<cudaStream_t>(cuda_stream()));
  if (status != cudaSuccess)
    throw std::runtime_error(std::string("CUDA error while waiting for the GPU (") + where +
                             "): " + cudaGetErrorName(status) + ": " + cudaGetErrorString(status));
}

bool is_device_pointer(const void* pointer) {
  if (pointer == nullptr) return false;
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, pointer) != cudaSuccess) {
    cudaGetLastError();  // (older runtimes report plain host memory as an error)
    return false;
  }
  return attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
}

void copy_device_to_host(void* host, const void* device, std::size_t bytes) {
  if (bytes == 0) return;
  const auto stream = static_cast<cudaStream_t>(cuda_stream());
  check(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync (device to host)");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

void copy_host_to_device(void* device, const void* host, std::size_t bytes) {
  if (bytes == 0) return;
  const auto stream = static_cast<cudaStream_t>(cuda_stream());
  check(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync (host to device)");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

PinnedBuffer::~PinnedBuffer() {
  if (data_) cudaFreeHost(data_);
}

void* PinnedBuffer::reserve(std::size_t bytes) {
  if (bytes <= capacity_ && data_) return data_;
  if (data_) check(cudaFreeHost(data_), "cudaFreeHost");
  data_ = nullptr;
  capacity_ = 0;
  const std::size_t size = std::max<std::size_t>(bytes, 4096);
  check(cudaHostAlloc(&data_, size, cudaHostAllocDefault), "cudaHostAlloc");
  capacity_ = size;
  return data_;
}

DeviceMemoryStats device_memory_stats() { return pool().stats(); }
void reset_peak_device_memory() { pool().reset_peak(); }
void release_cached_device_memory() { pool().release_cached(); }

namespace detail {
void* device_pool_allocate(std::size_t bytes) { return pool().allocate(bytes); }
void device_pool_release(void* pointer, std::size_t bytes) { pool().release(pointer, bytes); }
}  // namespace detail

#else  // no CUDA in this build

namespace {
[[noreturn]] void no_cuda() {
  throw UserError("this proplab build has no CUDA backend (configure with -DPROPLAB_CUDA=ON on a machine with nvcc)");
}
}  // namespace

GpuInfo gpu_info() { no_cuda(); }
int cuda_ordinal() { return 0; }
void set_cuda_ordinal(int) { no_cuda(); }
void* cuda_stream() { no_cuda(); }
void cuda_synchronize(const char*) {}
DeviceMemoryStats device_memory_stats() { return {}; }
bool is_device_pointer(const void*) { return false; }
void copy_device_to_host(void*, const void*, std::size_t) { no_cuda(); }
void copy_host_to_device(void*, const void*, std::size_t) { no_cuda(); }
PinnedBuffer::~PinnedBuffer() { std::free(data_); }
void* PinnedBuffer::reserve(std::size_t bytes) {
  if (bytes <= capacity_ && data_) return data_;
  std::free(data_);
  capacity_ = std::max<std::size_t>(bytes, 4096);
  data_ = std::malloc(capacity_);
  if (!data_) throw std::bad_alloc();
  return data_;
}
void reset_peak_device_memory() {}
void release_cached_device_memory() {}

#endif

}  // namespace proplab
