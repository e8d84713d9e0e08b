// kernels/emulation/runtime.cpp: the CUDA runtime functions proplab calls, for the emulated GPU (one device by
// default, its memory on the host). Declared by the real <cuda_runtime_api.h> (C linkage), so nothing else changes.
//
// Invariants:
// - There are PROPLAB_EMU_DEVICES devices (default 1), each "proplab CUDA emulator", compute capability 9.0; the
//   current device is per host thread (cudaSetDevice, as in the CUDA runtime), device 0 at first. Their memory is
//   one pool of host memory (256-byte aligned) that every device shares and reports as its own: the total is
//   PROPLAB_EMU_MEMORY_MB MiB (default 8192), and an allocation beyond what is free fails with
//   cudaErrorMemoryAllocation as on a full GPU. Each allocation remembers the device current when it was made
//   (cudaPointerGetAttributes reports it). Several emulated GPUs on one node are several processes (mpirun -np 4
//   with PROPLAB_EMU_DEVICES=4), each with its own emulator.
// - Pinned host memory (cudaHostAlloc, cudaMallocHost) is ordinary host memory that is tracked, so that
//   cudaPointerGetAttributes can tell it from unregistered host memory; it does not count against the device pool.
// - Every operation completes before it returns (kernels included, kernels/emulation/emu.cpp): streams and events
//   are tokens, synchronisation is a no-op, cudaStreamQuery always answers cudaSuccess, and cudaEventElapsedTime
//   reports 0 ms (the emulator knows nothing about GPU time). Every stream has priority 0, the only one there is.
// - Copies and fills check their device side: each device range must lie inside one live allocation, and for
//   host-to-device / device-to-host copies the host side must not; a violation prints what it was and fails with
//   cudaErrorInvalidValue (a GPU would fault or corrupt memory).
// - Errors are sticky per host thread until cudaGetLastError reads them, as in the CUDA runtime.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>

namespace proplab::emu::detail {

namespace {

thread_local cudaError_t last_error = cudaSuccess;
thread_local int current_device = 0;
constexpr std::size_t kAlignment = 256;
constexpr int kMaxDevices = 64;

// PROPLAB_EMU_DEVICES, read once: 1 when unset; a value outside 1..kMaxDevices is reported and taken as 1.
int device_count() {
  static const int count = [] {
    const char* text = std::getenv("PROPLAB_EMU_DEVICES");
    if (text == nullptr || *text == '\0') return 1;
    char* end = nullptr;
    const long value = std::strtol(text, &end, 10);
    if (*end != '\0' || value < 1 || value > kMaxDevices) {
      std::fprintf(stderr, "proplab CUDA emulator: PROPLAB_EMU_DEVICES=%s is not a device count in 1..%d; using 1\n",
                   text, kMaxDevices);
      return 1;
    }
    return static_cast<int>(value);
  }();
  return count;
}

cudaError_t fail(cudaError_t error) {
  last_error = error;
  return error;
}

class Memory {
 public:
  Memory() {
    std::size_t megabytes = 8192;
    if (const char* text = std::getenv("PROPLAB_EMU_MEMORY_MB"); text != nullptr && *text != '\0')
      megabytes = std::strtoull(text, nullptr, 10);
    total_ = megabytes << 20;
  }

  // What an address lies in.
  struct Found {
    cudaMemoryType type = cudaMemoryTypeUnregistered;
    int device = 0;
  };

  cudaError_t allocate(void** pointer, std::size_t bytes) {
    if (pointer == nullptr) return fail(cudaErrorInvalidValue);
    *pointer = nullptr;
    if (bytes == 0) return cudaSuccess;
    std::lock_guard<std::mutex> lock(mutex_);
    if (bytes > total_ - used_) return fail(cudaErrorMemoryAllocation);
    void* memory = ::operator new (bytes, std::align_val_t{kAlignment}, std::nothrow);
    if (memory == nullptr) return fail(cudaErrorMemoryAllocation);
    blocks_.emplace(reinterpret_cast<std::uintptr_t>(memory), Block{bytes, current_device});
    used_ += bytes;
    *pointer = memory;
    return cudaSuccess;
  }

  // Pinned host memory: tracked, not counted against the device pool.
  cudaError_t allocate_host(void** pointer, std::size_t bytes) {
    if (pointer == nullptr) return fail(cudaErrorInvalidValue);
    *pointer = nullptr;
    if (bytes == 0) return cudaSuccess;
    void* memory = ::operator new (bytes, std::align_val_t{kAlignment}, std::nothrow);
    if (memory == nullptr) return fail(cudaErrorMemoryAllocation);
    std::lock_guard<std::mutex> lock(mutex_);
    host_blocks_.emplace(reinterpret_cast<std::uintptr_t>(memory), Block{bytes, current_device});
    *pointer = memory;
    return cudaSuccess;
  }

  cudaError_t release_host(void* pointer) {
    if (pointer == nullptr) return cudaSuccess;
    std::lock_guard<std::mutex> lock(mutex_);
    const auto found = host_blocks_.find(reinterpret_cast<std::uintptr_t>(pointer));
    if (found == host_blocks_.end()) {
      std::fprintf(stderr, "proplab CUDA emulator: cudaFreeHost of %p, which is not a live pinned allocation\n",
                   pointer);
      return fail(cudaErrorInvalidValue);
    }
    host_blocks_.erase(found);
    ::operator delete (pointer, std::align_val_t{kAlignment});
    return cudaSuccess;
  }

  // The live allocation (device or pinned host) holding `pointer`, interior addresses included.
  Found find(const void* pointer) {
    const auto address = reinterpret_cast<std::uintptr_t>(pointer);
    std::lock_guard<std::mutex> lock(mutex_);
    if (const Block* block = holding(blocks_, address)) return {cudaMemoryTypeDevice, block->device};
    if (const Block* block = holding(host_blocks_, address)) return {cudaMemoryTypeHost, block->device};
    return {};
  }

  cudaError_t release(void* pointer) {
    if (pointer == nullptr) return cudaSuccess;
    std::lock_guard<std::mutex> lock(mutex_);
    const auto found = blocks_.find(reinterpret_cast<std::uintptr_t>(pointer));
    if (found == blocks_.end()) {
      std::fprintf(stderr, "proplab CUDA emulator: cudaFree of %p, which is not a live device allocation\n", pointer);
      return fail(cudaErrorInvalidValue);
    }
    used_ -= found->second.bytes;
    blocks_.erase(found);
    ::operator delete (pointer, std::align_val_t{kAlignment});
    return cudaSuccess;
  }

  // True when [pointer, pointer + bytes) lies inside one live allocation.
  bool is_device(const void* pointer, std::size_t bytes) {
    const auto address = reinterpret_cast<std::uintptr_t>(pointer);
    std::lock_guard<std::mutex> lock(mutex_);
    auto after = blocks_.upper_bound(address);
    if (after == blocks_.begin()) return false;
    --after;
    return address >= after->first && address - after->first + bytes <= after->second.bytes &&
           (bytes > 0 || address < after->first + after->second.bytes);
  }

  void info(std::size_t* free_bytes, std::size_t* total_bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (free_bytes != nullptr) *free_bytes = total_ - used_;
    if (total_bytes != nullptr) *total_bytes = total_;
  }

 private:
  struct Block {
    std::size_t bytes;
    int device;  // current when it was allocated
  };
  using Blocks = std::map<std::uintptr_t, Block>;

  static const Block* holding(const Blocks& blocks, std::uintptr_t address) {
    auto after = blocks.upper_bound(address);
    if (after == blocks.begin()) return nullptr;
    --after;
    return address - after->first < after->second.bytes ? &after->second : nullptr;
  }

  std::mutex mutex_;
  Blocks blocks_, host_blocks_;  // device allocations; pinned host allocations
  std::size_t total_ = 0, used_ = 0;
};

Memory& memory() {
  static Memory* instance = new Memory();  // never destroyed: memory freed during static destruction finds it
  return *instance;
}

cudaError_t check_device(const char* call, const char* role, const void* pointer, std::size_t bytes) {
  if (bytes == 0 || memory().is_device(pointer, bytes)) return cudaSuccess;
  std::fprintf(stderr, "proplab CUDA emulator: %s: the %s [%p, +%zu bytes) is not inside one device allocation\n", call,
               role, pointer, bytes);
  return fail(cudaErrorInvalidValue);
}

cudaError_t check_host(const char* call, const char* role, const void* pointer, std::size_t bytes) {
  if (bytes == 0 || !memory().is_device(pointer, 1)) return cudaSuccess;
  std::fprintf(stderr, "proplab CUDA emulator: %s: the %s %p is device memory, but the copy kind says host\n", call,
               role, pointer);
  return fail(cudaErrorInvalidValue);
}

cudaError_t copy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind, const char* call) {
  cudaError_t status = cudaSuccess;
  switch (kind) {
    case cudaMemcpyHostToHost:
      status = check_host(call, "destination", dst, bytes);
      if (status == cudaSuccess) status = check_host(call, "source", src, bytes);
      break;
    case cudaMemcpyHostToDevice:
      status = check_device(call, "destination", dst, bytes);
      if (status == cudaSuccess) status = check_host(call, "source", src, bytes);
      break;
    case cudaMemcpyDeviceToHost:
      status = check_host(call, "destination", dst, bytes);
      if (status == cudaSuccess) status = check_device(call, "source", src, bytes);
      break;
    case cudaMemcpyDeviceToDevice:
      status = check_device(call, "destination", dst, bytes);
      if (status == cudaSuccess) status = check_device(call, "source", src, bytes);
      break;
    case cudaMemcpyDefault:
      break;
    default:
      return fail(cudaErrorInvalidMemcpyDirection);
  }
  if (status != cudaSuccess) return status;
  if (bytes > 0) std::memmove(dst, src, bytes);
  return cudaSuccess;
}

cudaError_t fill(void* pointer, int value, std::size_t bytes, const char* call) {
  if (cudaError_t status = check_device(call, "destination", pointer, bytes); status != cudaSuccess) return status;
  if (bytes > 0) std::memset(pointer, value, bytes);
  return cudaSuccess;
}

cudaError_t fill_2d(void* pointer, std::size_t pitch, int value, std::size_t width, std::size_t height,
                    const char* call) {
  if (width > pitch && height > 1) return fail(cudaErrorInvalidPitchValue);
  if (width == 0 || height == 0) return cudaSuccess;
  auto* rows = static_cast<char*>(pointer);
  const std::size_t extent = pitch * (height - 1) + width;
  if (cudaError_t status = check_device(call, "destination", pointer, extent); status != cudaSuccess) return status;
  for (std::size_t r = 0; r < height; ++r) std::memset(rows + r * pitch, value, width);
  return cudaSuccess;
}

int token = 0;  // streams and events are distinct non-null addresses into this

}  // namespace

void set_last_error(cudaError_t error) { last_error = error; }

}  // namespace proplab::emu::detail

using proplab::emu::detail::current_device;
using proplab::emu::detail::device_count;
using proplab::emu::detail::fail;
using proplab::emu::detail::memory;

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return fail(cudaErrorInvalidValue);
  *count = device_count();
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (prop == nullptr) return fail(cudaErrorInvalidValue);
  if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice);
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof prop->name, "proplab CUDA emulator");
  memory().info(nullptr, &prop->totalGlobalMem);
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = 1;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = 1024;
  prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 0x7fffffff;
  prop->maxGridSize[1] = 65535;
  prop->maxGridSize[2] = 65535;
  prop->sharedMemPerBlock = 48 * 1024;
  prop->sharedMemPerBlockOptin = 48 * 1024;
  prop->regsPerBlock = 65536;
  prop->maxThreadsPerMultiProcessor = 2048;
  prop->totalConstMem = 64 * 1024;
  prop->memoryBusWidth = 64;
  prop->l2CacheSize = 0;
  prop->unifiedAddressing = 1;
  prop->managedMemory = 0;
  prop->concurrentKernels = 0;
  prop->pciBusID = device;  // tells the devices apart
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice);
  current_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return fail(cudaErrorInvalidValue);
  *device = current_device;
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  memory().info(free_bytes, total_bytes);
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** pointer, size_t bytes) { return memory().allocate(pointer, bytes); }
cudaError_t cudaFree(void* pointer) { return memory().release(pointer); }
cudaError_t cudaMallocAsync(void** pointer, size_t bytes, cudaStream_t) { return memory().allocate(pointer, bytes); }
cudaError_t cudaFreeAsync(void* pointer, cudaStream_t) { return memory().release(pointer); }
cudaError_t cudaMallocHost(void** pointer, size_t bytes) { return memory().allocate_host(pointer, bytes); }
cudaError_t cudaHostAlloc(void** pointer, size_t bytes, unsigned int) { return memory().allocate_host(pointer, bytes); }
cudaError_t cudaFreeHost(void* pointer) { return memory().release_host(pointer); }

// As the CUDA runtime (unified addressing, CUDA >= 11): device memory has only a device pointer, pinned host memory
// both (it is mapped), other host memory is unregistered and has neither. The pointers are `pointer` itself.
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* pointer) {
  if (attributes == nullptr) return fail(cudaErrorInvalidValue);
  const auto found = memory().find(pointer);
  *attributes = cudaPointerAttributes{};
  attributes->type = found.type;
  attributes->device = found.type == cudaMemoryTypeUnregistered ? cudaInvalidDeviceId : found.device;
  void* address = const_cast<void*>(pointer);
  attributes->devicePointer = found.type == cudaMemoryTypeUnregistered ? nullptr : address;
  attributes->hostPointer = found.type == cudaMemoryTypeDevice ? nullptr : address;
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  return proplab::emu::detail::copy(dst, src, bytes, kind, "cudaMemcpy");
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t) {
  return proplab::emu::detail::copy(dst, src, bytes, kind, "cudaMemcpyAsync");
}
cudaError_t cudaMemset(void* pointer, int value, size_t bytes) {
  return proplab::emu::detail::fill(pointer, value, bytes, "cudaMemset");
}
cudaError_t cudaMemsetAsync(void* pointer, int value, size_t bytes, cudaStream_t) {
  return proplab::emu::detail::fill(pointer, value, bytes, "cudaMemsetAsync");
}
cudaError_t cudaMemset2D(void* pointer, size_t pitch, int value, size_t width, size_t height) {
  return proplab::emu::detail::fill_2d(pointer, pitch, value, width, height, "cudaMemset2D");
}
cudaError_t cudaMemset2DAsync(void* pointer, size_t pitch, int value, size_t width, size_t height, cudaStream_t) {
  return proplab::emu::detail::fill_2d(pointer, pitch, value, width, height, "cudaMemset2DAsync");
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  if (stream == nullptr) return fail(cudaErrorInvalidValue);
  *stream = reinterpret_cast<cudaStream_t>(&proplab::emu::detail::token);
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int) { return cudaStreamCreate(stream); }
cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamQuery(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamGetPriority(cudaStream_t, int* priority) {
  if (priority == nullptr) return fail(cudaErrorInvalidValue);
  *priority = 0;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
  if (least != nullptr) *least = 0;
  if (greatest != nullptr) *greatest = 0;
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  if (event == nullptr) return fail(cudaErrorInvalidValue);
  *event = reinterpret_cast<cudaEvent_t>(&proplab::emu::detail::token);
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int) { return cudaEventCreate(event); }
cudaError_t cudaEventDestroy(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { return cudaSuccess; }
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventQuery(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned int) { return cudaSuccess; }
// Work completes when it is issued, so no GPU time passes between two events: 0 ms.
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (ms == nullptr || start == nullptr || end == nullptr) return fail(cudaErrorInvalidValue);
  *ms = 0.0f;
  return cudaSuccess;
}

cudaError_t cudaGetLastError(void) {
  const cudaError_t error = proplab::emu::detail::last_error;
  proplab::emu::detail::last_error = cudaSuccess;
  return error;
}
cudaError_t cudaPeekAtLastError(void) { return proplab::emu::detail::last_error; }

cudaError_t cudaRuntimeGetVersion(int* version) {
  if (version == nullptr) return fail(cudaErrorInvalidValue);
  *version = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int* version) { return cudaRuntimeGetVersion(version); }

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidPitchValue:
      return "cudaErrorInvalidPitchValue";
    case cudaErrorInvalidMemcpyDirection:
      return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorNoDevice:
      return "cudaErrorNoDevice";
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
    default:
      return "cudaErrorUnknown";
  }
}

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorInvalidPitchValue:
      return "invalid pitch argument";
    case cudaErrorInvalidMemcpyDirection:
      return "invalid copy direction for memcpy";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorNoDevice:
      return "no CUDA-capable device is detected";
    case cudaErrorNotReady:
      return "device not ready";
    default:
      return "unknown error";
  }
}

}  // extern "C"
