// ops/linear: y = x W^T + b on the CPU through ops::sgemm (ops/gemm.h: OpenBLAS in fixed pieces on the OpenMP
// pool, bitwise the same for any thread count), on CUDA through kernels::gemm (cuBLASLt).
//
// x may carry any leading dimensions ([rows, in] or [B, T, in]); they are flattened into rows. On CUDA with
// MatmulPrecision::bf16 (core/device.h) every product's two operands are rounded to bf16 into scratch first
// (kernels/convert); outputs, the bias and the gradients stay f32 and accumulate in f32. The CPU always runs f32.

#include <algorithm>
#include <cstdint>

#include "ops/dispatch.h"
#include "ops/gemm.h"
#include "ops/ops.h"

#ifdef PROPLAB_WITH_CUDA
#include <optional>

#include "core/device.h"
#include "kernels/convert.cuh"
#include "kernels/matmul.cuh"
#include "kernels/reduce.cuh"
#endif

namespace proplab::ops {

namespace {

// Bias-gradient columns summed by one task: 64 doubles of accumulators stay in registers/L1.
constexpr std::int64_t kBiasColumnBlock = 64;

// x's shape with its last dimension replaced by `last`.
Shape with_last_dim(const Shape& shape, std::int64_t last) {
  Shape out = shape;
  out.back() = last;
  return out;
}

// d_bias[j] += Σ_r d_y[r, j]. Each column is summed over rows in row order in double, whatever the thread count.
void add_column_sums(const float* d_y, std::int64_t rows, std::int64_t cols, float* d_bias) {
  const std::int64_t blocks = (cols + kBiasColumnBlock - 1) / kBiasColumnBlock;
#pragma omp parallel for schedule(static) if (rows * cols > (1 << 15))
  for (std::int64_t block = 0; block < blocks; ++block) {
    const std::int64_t begin = block * kBiasColumnBlock;
    const std::int64_t width = std::min(kBiasColumnBlock, cols - begin);
    double sums[kBiasColumnBlock] = {};
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* row = d_y + r * cols + begin;
#pragma omp simd
      for (std::int64_t j = 0; j < width; ++j) sums[j] += row[j];
    }
    for (std::int64_t j = 0; j < width; ++j) d_bias[begin + j] += static_cast<float>(sums[j]);
  }
}

#ifdef PROPLAB_WITH_CUDA
// The inputs the CUDA products take under the process's matrix-product precision.
kernels::GemmInput gemm_input() {
  return matmul_precision() == MatmulPrecision::bf16 ? kernels::GemmInput::bf16 : kernels::GemmInput::f32;
}

// An operand of a CUDA product: the contiguous f32 tensor itself, or for bf16 inputs its rounded copy in scratch
// (released when the operand goes, after the product is enqueued).
class GemmOperand {
 public:
  GemmOperand(const Tensor& tensor, kernels::GemmInput input) : f32_(tensor.f32()) {
    if (input == kernels::GemmInput::bf16) bf16_.emplace(tensor.f32(), tensor.numel());
  }
  const void* data() const { return bf16_ ? static_cast<const void*>(bf16_->data()) : f32_; }

 private:
  const float* f32_;
  std::optional<kernels::Bf16Copy> bf16_;
};
#endif

}  // namespace

void linear_forward(const Tensor& x, const Tensor& weight, const Tensor* bias, Tensor& y) {
  constexpr const char* op = "linear_forward";
  PROPLAB_CHECK(weight.ndim() == 2, "op '", op, "': weight must be [out, in], got ", shape_string(weight.shape()));
  PROPLAB_CHECK(x.ndim() >= 2, "op '", op, "': x must be [rows, in], got ", shape_string(x.shape()));
  const std::int64_t out_features = weight.dim(0);
  const std::int64_t in_features = weight.dim(1);
  expect_shape(op, "x", x, with_last_dim(x.shape(), in_features));
  expect_shape(op, "weight", weight, weight.shape());
  if (bias) expect_shape(op, "bias", *bias, {out_features});
  expect_shape(op, "y", y, with_last_dim(x.shape(), out_features));
  const Device device = common_device(op, {&x, &weight, bias, &y});
  const std::int64_t rows = x.numel() / std::max<std::int64_t>(in_features, 1);
  if (device == Device::cuda) {
#ifdef PROPLAB_WITH_CUDA
    PROPLAB_CHECK(in_features > 0 || !bias, "op '", op, "': a zero-width layer with a bias on CUDA");
    // y [rows, out] = x [rows, in] · W^T (+ b, cuBLASLt's bias epilogue)
    const kernels::GemmInput input = gemm_input();
    const GemmOperand x_in(x, input), weight_in(weight, input);
    kernels::gemm(false, true, rows, out_features, in_features, x_in.data(), in_features, weight_in.data(), in_features,
                  y.f32(), out_features, 1.0f, 0.0f, bias ? bias->f32() : nullptr, input);
    return;
#else
    missing_device_impl(op, device);
#endif
  }
  if (rows == 0 || out_features == 0) return;
  float* y_data = y.f32();
  if (in_features == 0) {
    if (bias)
      for (std::int64_t r = 0; r < rows; ++r)
        std::copy(bias->f32(), bias->f32() + out_features, y_data + r * out_features);
    else
      std::fill(y_data, y_data + rows * out_features, 0.0f);
    return;
  }
  if (bias)  // each piece of y seeded with the bias, then accumulated onto (no separate pass over y)
    sgemm_bias(false, true, rows, out_features, in_features, x.f32(), in_features, weight.f32(), in_features,
               bias->f32(), y_data, out_features);
  else
    sgemm(false, true, rows, out_features, in_features, 1.0f, x.f32(), in_features, weight.f32(), in_features, 0.0f,
          y_data, out_features);
}

void linear_backward(const Tensor& x, const Tensor& weight, const Tensor& d_y, Tensor* d_x, Tensor& d_weight,
                     Tensor* d_bias) {
  constexpr const char* op = "linear_backward";
  PROPLAB_CHECK(weight.ndim() == 2, "op '", op, "': weight must be [out, in], got ", shape_string(weight.shape()));
  PROPLAB_CHECK(x.ndim() >= 2, "op '", op, "': x must be [rows, in], got ", shape_string(x.shape()));
  const std::int64_t out_features = weight.dim(0);
  const std::int64_t in_features = weight.dim(1);
  expect_shape(op, "x", x, with_last_dim(x.shape(), in_features));
  expect_shape(op, "weight", weight, weight.shape());
  expect_shape(op, "d_y", d_y, with_last_dim(x.shape(), out_features));
  if (d_x) expect_shape(op, "d_x", *d_x, x.shape());
  expect_shape(op, "d_weight", d_weight, weight.shape());
  if (d_bias) expect_shape(op, "d_bias", *d_bias, {out_features});
  const Device device = common_device(op, {&x, &weight, &d_y, d_x, &d_weight, d_bias});
  const std::int64_t rows = x.numel() / std::max<std::int64_t>(in_features, 1);
  if (device == Device::cuda) {
#ifdef PROPLAB_WITH_CUDA
    const kernels::GemmInput input = gemm_input();
    const GemmOperand d_y_in(d_y, input);
    // d_x [rows, in] = d_y [rows, out] · W [out, in]
    if (d_x && d_x->numel() > 0) {
      const GemmOperand weight_in(weight, input);
      kernels::gemm(false, false, rows, in_features, out_features, d_y_in.data(), out_features, weight_in.data(),
                    in_features, d_x->f32(), in_features, 1.0f, 0.0f, nullptr, input);
    }
    if (rows == 0 || out_features == 0) return;
    // d_W [out, in] += d_y^T [out, rows] · x [rows, in] (accumulated in f32 onto the f32 gradient)
    if (in_features > 0) {
      const GemmOperand x_in(x, input);
      kernels::gemm(true, false, out_features, in_features, rows, d_y_in.data(), out_features, x_in.data(), in_features,
                    d_weight.f32(), in_features, 1.0f, 1.0f, nullptr, input);
    }
    if (d_bias) kernels::column_sum(d_y.f32(), rows, out_features, d_bias->f32(), true);
    return;
#else
    missing_device_impl(op, device);
#endif
  }
  const std::int64_t m = rows, n_out = out_features, n_in = in_features;
  if (d_x && d_x->numel() > 0) {
    if (out_features == 0) {
      std::fill(d_x->f32(), d_x->f32() + d_x->numel(), 0.0f);
    } else {
      // d_x [rows, in] = d_y [rows, out] · W [out, in]
      sgemm(false, false, m, n_in, n_out, 1.0f, d_y.f32(), n_out, weight.f32(), n_in, 0.0f, d_x->f32(), n_in);
    }
  }
  if (rows == 0 || out_features == 0) return;
  if (in_features > 0) {
    // d_W [out, in] += d_y^T [out, rows] · x [rows, in]
    sgemm(true, false, n_out, n_in, m, 1.0f, d_y.f32(), n_out, x.f32(), n_in, 1.0f, d_weight.f32(), n_in);
  }
  if (d_bias) add_column_sums(d_y.f32(), rows, out_features, d_bias->f32());
}

}  // namespace proplab::ops
