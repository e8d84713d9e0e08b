// kernels/emulation/runtime.cpp: the CUDA runtime functions proplab calls, for the emulated GPU (one device, its
// memory on the host). Declared by the real <cuda_runtime_api.h> (C linkage), so nothing else changes.
//
// Invariants:
// - Device 0 is "proplab CUDA emulator", compute capability 9.0. Its memory is host memory (256-byte aligned);
//   the total is PROPLAB_EMU_MEMORY_MB MiB (default 8192), and an allocation beyond what is free fails with
//   cudaErrorMemoryAllocation as on a full GPU.
// - Every operation completes before it returns (kernels included, kernels/emulation/emu.cpp): streams and events
//   are tokens, synchronisation is a no-op, cudaStreamQuery always answers cudaSuccess.
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
constexpr std::size_t kAlignment = 256;

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

  cudaError_t allocate(void** pointer, std::size_t bytes) {
    if (pointer == nullptr) return fail(cudaErrorInvalidValue);
    *pointer = nullptr;
    if (bytes == 0) return cudaSuccess;
    std::lock_guard<std::mutex> lock(mutex_);
    if (bytes > total_ - used_) return fail(cudaErrorMemoryAllocation);
    void* memory = ::operator new (bytes, std::align_val_t{kAlignment}, std::nothrow);
    if (memory == nullptr) return fail(cudaErrorMemoryAllocation);
    blocks_.emplace(reinterpret_cast<std::uintptr_t>(memory), bytes);
    used_ += bytes;
    *pointer = memory;
    return cudaSuccess;
  }

  cudaError_t release(void* pointer) {
    if (pointer == nullptr) return cudaSuccess;
    std::lock_guard<std::mutex> lock(mutex_);
    const auto found = blocks_.find(reinterpret_cast<std::uintptr_t>(pointer));
    if (found == blocks_.end()) {
      std::fprintf(stderr, "proplab CUDA emulator: cudaFree of %p, which is not a live device allocation\n", pointer);
      return fail(cudaErrorInvalidValue);
    }
    used_ -= found->second;
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
    return address >= after->first && address - after->first + bytes <= after->second &&
           (bytes > 0 || address < after->first + after->second);
  }

  void info(std::size_t* free_bytes, std::size_t* total_bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (free_bytes != nullptr) *free_bytes = total_ - used_;
    if (total_bytes != nullptr) *total_bytes = total_;
  }

 private:
  std::mutex mutex_;
  std::map<std::uintptr_t, std::size_t> blocks_;
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

using proplab::emu::detail::fail;
using proplab::emu::detail::memory;

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return fail(cudaErrorInvalidValue);
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (prop == nullptr) return fail(cudaErrorInvalidValue);
  if (device != 0) return fail(cudaErrorInvalidDevice);
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
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : fail(cudaErrorInvalidDevice); }

cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return fail(cudaErrorInvalidValue);
  *device = 0;
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
