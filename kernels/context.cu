#include "kernels/context.cuh"

#include <string>

#include "core/device.h"
#include "kernels/common.cuh"

namespace proplab::kernels {

namespace detail {
namespace {
// cublasGetStatusName lives in libcublas, which proplab does not otherwise need: name the statuses here.
const char* status_name(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "cuBLAS status";
  }
}
}  // namespace

void fail_cublas(cublasStatus_t status, const char* what, const char* file, int line) {
  throw std::runtime_error(std::string("cuBLAS error in ") + what + ": " + status_name(status) + " (" +
                           std::to_string(static_cast<int>(status)) + ", " + file + ":" + std::to_string(line) + ")");
}
}  // namespace detail

Context& context() {
  static Context* instance = [] {
    auto* c = new Context();
    c->ordinal = cuda_ordinal();
    c->stream = static_cast<cudaStream_t>(cuda_stream());
    PROPLAB_CUBLAS_CHECK(cublasLtCreate(&c->lt));
    AllocationLabel label("the cuBLASLt workspace");
    c->workspace = proplab::detail::device_pool_allocate(kWorkspaceBytes);
    c->workspace_bytes = kWorkspaceBytes;
    return c;
  }();
  return *instance;
}

Scratch::Scratch(std::size_t bytes) : bytes_(bytes) {
  context();  // the stream and device exist before the pool is used
  data_ = proplab::detail::device_pool_allocate(bytes);
}

Scratch::~Scratch() { proplab::detail::device_pool_release(data_, bytes_); }

void copy_to_host(void* host, const void* device, std::size_t bytes) {
  if (bytes == 0) return;
  PROPLAB_CUDA_CHECK(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, context().stream));
  PROPLAB_CUDA_CHECK(cudaStreamSynchronize(context().stream));
}

void copy_to_device(void* device, const void* host, std::size_t bytes) {
  if (bytes == 0) return;
  PROPLAB_CUDA_CHECK(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, context().stream));
}

}  // namespace proplab::kernels
