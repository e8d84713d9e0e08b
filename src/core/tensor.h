// core/tensor: proplab's n-dimensional array.
//
// Layout rules (the only place they are written down):
// - Row-major. Strides are in elements, not bytes. A freshly allocated tensor is contiguous.
// - Activations are [batch, tokens, features] (or [rows, features] once batch and tokens are flattened, with
//   rows = batch * tokens, row index = b * tokens + t). Images (later) are NCHW.
// - Linear weights are [out_features, in_features] (y = x W^T + b), embeddings [vocab, features].
// - A tensor owns a reference to ref-counted Storage; views (reshape, slice) share it and are O(1).
// - Data lives on one Device. Host<->device copies are explicit (copy_from, to); accessors never copy.
// - dtype f32 is the compute type; i32 holds token ids and class labels; bf16 is reserved for storage by the
//   CUDA backend.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"

namespace proplab {

enum class DType : std::uint8_t { f32, bf16, i32 };
enum class Device : std::uint8_t { cpu, cuda };

std::size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);
const char* device_name(Device device);

using Shape = std::vector<std::int64_t>;
std::string shape_string(const Shape& shape);
std::int64_t shape_numel(const Shape& shape);

// Allocator per device: 64-byte aligned host memory on the CPU, cudaMalloc on CUDA (when built with it).
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void release(void* pointer, std::size_t bytes) = 0;
  virtual Device device() const = 0;
};
Allocator& allocator_for(Device device);

// A block of memory on one device, freed when the last Tensor referring to it goes away.
class Storage {
 public:
  Storage(std::size_t bytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  Device device_ = Device::cpu;
};

class Tensor {
 public:
  Tensor() = default;

  // Uninitialised contiguous tensor.
  static Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu);
  // Contiguous tensor filled with zeros.
  static Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu);
  // CPU f32 tensor holding the given values (tests, small constants).
  static Tensor from_vector(const Shape& shape, const std::vector<float>& values);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  // Size of dimension i; negative i counts from the end.
  std::int64_t dim(int i) const;
  std::int64_t numel() const { return shape_numel(shape_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  bool is_contiguous() const;

  // Typed pointer to the first element (after the view offset). Checks dtype f32.
  float* f32();
  const float* f32() const;
  std::int32_t* i32();
  const std::int32_t* i32() const;
  void* raw() const;

  // A view with another shape over the same contiguous elements (one -1 dimension may be inferred).
  Tensor reshape(const Shape& shape) const;
  // A view of `length` entries of dimension `dim` starting at `start`.
  Tensor slice(int dim, std::int64_t start, std::int64_t length) const;

  // Deep copies. copy_from requires equal shapes and dtypes; either side may be on either device.
  void copy_from(const Tensor& source);
  Tensor clone() const;
  Tensor to(Device device) const;

  // CPU-only conveniences (tests, initialisation, small host work).
  void fill(float value);
  std::vector<float> to_vector() const;
  float item() const;

  // Reference-count of the underlying storage (tests of view semantics).
  long use_count() const { return storage_.use_count(); }

 private:
  std::shared_ptr<Storage> storage_;
  Shape shape_;
  Shape strides_;
  std::int64_t offset_ = 0;  // in elements
  DType dtype_ = DType::f32;
  Device device_ = Device::cpu;
};

// True when this build has the CUDA backend and at least one usable GPU is present.
bool cuda_available();
// Number of usable GPUs (0 in a CPU-only build or when the driver reports none).
int cuda_device_count();

}  // namespace proplab
