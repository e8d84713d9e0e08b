#include "core/tensor.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <sstream>

#include "core/device.h"

#ifdef PROPLAB_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace proplab {

std::size_t dtype_size(DType dtype) { return dtype == DType::bf16 ? 2 : 4; }
const char* dtype_name(DType dtype) { return dtype == DType::f32 ? "f32" : dtype == DType::i32 ? "i32" : "bf16"; }
const char* device_name(Device device) { return device == Device::cpu ? "cpu" : "cuda"; }

std::string shape_string(const Shape& shape) {
  std::ostringstream out;
  out << "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << "]";
  return out.str();
}

std::int64_t shape_numel(const Shape& shape) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

namespace {

class CpuAllocator final : public Allocator {
 public:
  void* allocate(std::size_t bytes) override {
    std::size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
    if (!p) throw std::bad_alloc();
    return p;
  }
  void release(void* pointer, std::size_t) override { std::free(pointer); }
  Device device() const override { return Device::cpu; }
};

#ifdef PROPLAB_WITH_CUDA
cudaStream_t stream() { return static_cast<cudaStream_t>(cuda_stream()); }

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw std::runtime_error(std::string("CUDA error in ") + what + ": " + cudaGetErrorString(status));
}

// The caching pool of core/device: no cudaMalloc/cudaFree once a training step's sizes have been seen.
class CudaAllocator final : public Allocator {
 public:
  void* allocate(std::size_t bytes) override { return detail::device_pool_allocate(bytes); }
  void release(void* pointer, std::size_t bytes) override { detail::device_pool_release(pointer, bytes); }
  Device device() const override { return Device::cuda; }
};
#endif

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  std::int64_t s = 1;
  for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) {
    strides[i] = s;
    s *= shape[i];
  }
  return strides;
}

}  // namespace

Allocator& allocator_for(Device device) {
  static CpuAllocator cpu;
  if (device == Device::cpu) return cpu;
#ifdef PROPLAB_WITH_CUDA
  static CudaAllocator cuda;
  return cuda;
#else
  throw UserError("this proplab build has no CUDA backend (configure with -DPROPLAB_CUDA=ON on a machine with nvcc)");
#endif
}

Storage::Storage(std::size_t bytes, Device device) : bytes_(bytes), device_(device) {
  data_ = allocator_for(device).allocate(bytes);
}

Storage::~Storage() { allocator_for(device_).release(data_, bytes_); }

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (auto d : shape) PROPLAB_CHECK(d >= 0, "negative dimension in shape ", shape_string(shape));
  Tensor t;
  t.storage_ = std::make_shared<Storage>(static_cast<std::size_t>(shape_numel(shape)) * dtype_size(dtype), device);
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  std::size_t bytes = static_cast<std::size_t>(t.numel()) * dtype_size(dtype);
  if (device == Device::cpu) {
    std::memset(t.raw(), 0, bytes);
  } else {
#ifdef PROPLAB_WITH_CUDA
    check_cuda(cudaMemsetAsync(t.raw(), 0, bytes, stream()), "cudaMemsetAsync");
#endif
  }
  return t;
}

Tensor Tensor::from_vector(const Shape& shape, const std::vector<float>& values) {
  PROPLAB_CHECK(shape_numel(shape) == static_cast<std::int64_t>(values.size()), "from_vector: ", values.size(),
                " values for shape ", shape_string(shape));
  Tensor t = empty(shape);
  std::memcpy(t.raw(), values.data(), values.size() * sizeof(float));
  return t;
}

std::int64_t Tensor::dim(int i) const {
  int n = ndim();
  if (i < 0) i += n;
  PROPLAB_CHECK(i >= 0 && i < n, "dimension ", i, " out of range for shape ", shape_string(shape_));
  return shape_[i];
}

bool Tensor::is_contiguous() const { return strides_ == contiguous_strides(shape_); }

void* Tensor::raw() const {
  PROPLAB_CHECK(defined(), "access to an undefined tensor");
  return static_cast<char*>(storage_->data()) + offset_ * static_cast<std::int64_t>(dtype_size(dtype_));
}

float* Tensor::f32() {
  PROPLAB_CHECK(dtype_ == DType::f32, "f32() on a ", dtype_name(dtype_), " tensor");
  return static_cast<float*>(raw());
}

const float* Tensor::f32() const {
  PROPLAB_CHECK(dtype_ == DType::f32, "f32() on a ", dtype_name(dtype_), " tensor");
  return static_cast<const float*>(raw());
}

std::int32_t* Tensor::i32() {
  PROPLAB_CHECK(dtype_ == DType::i32, "i32() on a ", dtype_name(dtype_), " tensor");
  return static_cast<std::int32_t*>(raw());
}

const std::int32_t* Tensor::i32() const {
  PROPLAB_CHECK(dtype_ == DType::i32, "i32() on a ", dtype_name(dtype_), " tensor");
  return static_cast<const std::int32_t*>(raw());
}

Tensor Tensor::reshape(const Shape& shape) const {
  PROPLAB_CHECK(is_contiguous(), "reshape of a non-contiguous view ", shape_string(shape_));
  Shape resolved = shape;
  int infer = -1;
  std::int64_t known = 1;
  for (std::size_t i = 0; i < resolved.size(); ++i) {
    if (resolved[i] == -1) {
      PROPLAB_CHECK(infer < 0, "reshape: more than one -1 in ", shape_string(shape));
      infer = static_cast<int>(i);
    } else {
      known *= resolved[i];
    }
  }
  if (infer >= 0) {
    PROPLAB_CHECK(known > 0 && numel() % known == 0, "reshape ", shape_string(shape_), " to ", shape_string(shape));
    resolved[infer] = numel() / known;
  }
  PROPLAB_CHECK(shape_numel(resolved) == numel(), "reshape ", shape_string(shape_), " to ", shape_string(shape));
  Tensor t = *this;
  t.shape_ = resolved;
  t.strides_ = contiguous_strides(resolved);
  return t;
}

Tensor Tensor::slice(int d, std::int64_t start, std::int64_t length) const {
  if (d < 0) d += ndim();
  PROPLAB_CHECK(d >= 0 && d < ndim(), "slice dimension out of range");
  PROPLAB_CHECK(start >= 0 && length >= 0 && start + length <= shape_[d], "slice [", start, ", ", start + length,
                ") of dimension ", d, " of ", shape_string(shape_));
  Tensor t = *this;
  t.shape_[d] = length;
  t.offset_ += start * strides_[d];
  return t;
}

void Tensor::copy_from(const Tensor& source) {
  PROPLAB_CHECK(shape_ == source.shape_, "copy_from: shape ", shape_string(source.shape_), " into ",
                shape_string(shape_));
  PROPLAB_CHECK(dtype_ == source.dtype_, "copy_from: dtype mismatch");
  PROPLAB_CHECK(is_contiguous() && source.is_contiguous(), "copy_from needs contiguous tensors");
  std::size_t bytes = static_cast<std::size_t>(numel()) * dtype_size(dtype_);
  if (device_ == Device::cpu && source.device_ == Device::cpu) {
    std::memmove(raw(), source.raw(), bytes);
    return;
  }
#ifdef PROPLAB_WITH_CUDA
  cudaMemcpyKind kind = device_ == Device::cpu          ? cudaMemcpyDeviceToHost
                        : source.device_ == Device::cpu ? cudaMemcpyHostToDevice
                                                        : cudaMemcpyDeviceToDevice;
  // On the compute stream, in order with the kernels that produced or will consume the data; the host waits only
  // when it is the destination.
  check_cuda(cudaMemcpyAsync(raw(), source.raw(), bytes, kind, stream()), "cudaMemcpyAsync");
  if (kind == cudaMemcpyDeviceToHost) check_cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
#else
  throw UserError("this proplab build has no CUDA backend");
#endif
}

Tensor Tensor::clone() const { return to(device_); }

Tensor Tensor::to(Device device) const {
  Tensor t = empty(shape_, dtype_, device);
  t.copy_from(*this);
  return t;
}

void Tensor::fill(float value) {
  PROPLAB_CHECK(device_ == Device::cpu && is_contiguous(), "fill is a CPU, contiguous operation");
  float* p = f32();
  for (std::int64_t i = 0, n = numel(); i < n; ++i) p[i] = value;
}

std::vector<float> Tensor::to_vector() const {
  Tensor host = device_ == Device::cpu && is_contiguous() ? *this : to(Device::cpu);
  const float* p = host.f32();
  return std::vector<float>(p, p + host.numel());
}

float Tensor::item() const {
  PROPLAB_CHECK(numel() == 1, "item() on a tensor of shape ", shape_string(shape_));
  return to_vector()[0];
}

int cuda_device_count() {
#ifdef PROPLAB_WITH_CUDA
  int count = 0;
  // "no driver" / "insufficient driver" mean no GPU here, not an error.
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
#else
  return 0;
#endif
}

bool cuda_available() { return cuda_device_count() > 0; }

}  // namespace proplab
