// kernels/activation: pointwise activation kernels (see kernels/activation.cuh for the contract and invariants).
//
// The device functions below restate src/ops/activation.cpp's approximations line for line (constants, clamps,
// polynomial order, the two-float exponent of the normal tail); bit reinterpretation uses __float_as_int and
// __int_as_float instead of std::bit_cast, and the x²/2 low part always uses fmaf (the CPU's __FMA__ path).
// One grid-stride kernel per activation and direction, grid a function of n only.
#include "kernels/activation.cuh"

#include <cuda_runtime.h>

#include "core/error.h"
#include "kernels/common.cuh"
#include "kernels/context.cuh"

namespace proplab::kernels {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;  // GPT-2 gelu: tanh(√(2/π)(x + 0.044715 x³))
constexpr float kGeluCubic = 0.044715f;
constexpr float kInvSqrt2 = 0.7071067811865476f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;

// e^(x + x_lo) (the CPU's exp_approx): Cody-Waite reduction by ln 2, degree-7 Taylor polynomial; 0 below -87,
// +inf above 88, NaN for NaN.
__device__ __forceinline__ float exp_approx(float x, float x_lo = 0.0f) {
  const float clamped = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  constexpr float kRoundShift = 12582912.0f;
  const float shifted = clamped * 1.44269504088896341f + kRoundShift;
  const float n = shifted - kRoundShift;
  // Two's-complement difference and shift done in unsigned arithmetic: the same bits as the CPU's int32 code.
  const unsigned n_bits =
      static_cast<unsigned>(__float_as_int(shifted)) - static_cast<unsigned>(__float_as_int(kRoundShift));
  float r = clamped - n * 0.693359375f;
  r = r + n * 2.12194440e-4f + x_lo;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const unsigned exponent_bits = (n_bits + 127u) << 23;
  const float result = p * __int_as_float(static_cast<int>(exponent_bits));
  return x < -87.0f ? 0.0f : (x > 88.0f ? __int_as_float(0x7f800000) : result);
}

// tanh (the CPU's tanh_approx): odd minimax polynomial below |x| = 0.625, 1 - 2/(e^2|x| + 1) above.
__device__ __forceinline__ float tanh_approx(float x) {
  const float magnitude = fabsf(x);
  const float e = exp_approx(2.0f * magnitude);
  const float large = copysignf(1.0f - 2.0f / (e + 1.0f), x);
  const float z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const float small = p * z * x + x;
  return magnitude > 0.625f ? large : small;
}

// x² / 2 as hi + lo (exact): the halving comes last and is exact, so contraction cannot change hi.
__device__ __forceinline__ void half_square(float x, float& hi, float& lo) {
  const float square = x * x;
  hi = 0.5f * square;
  lo = 0.5f * fmaf(x, x, -square);
}

// Φ(-a) = erfc(a/√2)/2 for 0 <= a <= 14 (the CPU's normal_tail: Numerical Recipes' erfcc with the exponent kept
// as an exact two-float sum).
__device__ __forceinline__ float normal_tail(float a) {
  const float t = 1.0f / (1.0f + 0.5f * kInvSqrt2 * a);
  float p = 0.17087277f;
  p = p * t - 0.82215223f;
  p = p * t + 1.48851587f;
  p = p * t - 1.13520398f;
  p = p * t + 0.27886807f;
  p = p * t - 0.18628806f;
  p = p * t + 0.09678418f;
  p = p * t + 0.37409196f;
  p = p * t + 1.00002368f;
  p = p * t - 1.26551223f;
  float z_sq, z_sq_lo;
  half_square(a, z_sq, z_sq_lo);
  // Two-sum: hi + lo == p - z_sq exactly.
  const float hi = p - z_sq;
  const float p_part = hi + z_sq;
  const float lo = (p - p_part) + (-z_sq - (hi - p_part)) - z_sq_lo;
  return 0.5f * t * exp_approx(hi, lo);
}

// Standard normal CDF Φ(x); beyond |x| = 14 it is 0 or 1 to float precision.
__device__ __forceinline__ float normal_cdf(float x) {
  const float magnitude = fabsf(x);
  const float tail = normal_tail(magnitude > 14.0f ? 14.0f : magnitude);
  return x < 0.0f ? tail : 1.0f - tail;
}

// Standard normal density φ(x).
__device__ __forceinline__ float normal_pdf(float x) {
  float half_sq, half_sq_lo;
  const float magnitude = fabsf(x);
  half_square(magnitude > 14.0f ? 14.0f : magnitude, half_sq, half_sq_lo);
  return kInvSqrt2Pi * exp_approx(-half_sq, -half_sq_lo);
}

// GPT-2 gelu in its sigmoid form x σ(2u), u = √(2/π)(x + 0.044715 x³).
__device__ __forceinline__ float gelu_tanh(float x) {
  const float u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
  return x / (1.0f + exp_approx(-2.0f * u));
}

__device__ __forceinline__ float gelu_tanh_grad(float x) {
  // Clamped to |x| <= 20 (comparisons keep NaN) and the exponent capped at 80, as on the CPU.
  x = x < -20.0f ? -20.0f : (x > 20.0f ? 20.0f : x);
  const float u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
  const float exponent = -2.0f * u;
  const float e = exp_approx(exponent > 80.0f ? 80.0f : exponent);
  const float s = 1.0f / (1.0f + e);  // σ(2u)
  const float du_dx = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x * x);
  return s + x * 2.0f * s * (e * s) * du_dx;
}

__device__ __forceinline__ float gelu_erf(float x) { return x * normal_cdf(x); }

__device__ __forceinline__ float gelu_erf_grad(float x) { return normal_cdf(x) + x * normal_pdf(x); }

// φ(x) for the non-identity kinds (identity is a copy).
template <ActivationKind kKind>
__device__ __forceinline__ float forward_value(float x) {
  if constexpr (kKind == ActivationKind::relu) {
    return x < 0.0f ? 0.0f : x;  // relu(NaN) = NaN
  } else if constexpr (kKind == ActivationKind::tanh) {
    return tanh_approx(x);
  } else if constexpr (kKind == ActivationKind::gelu_tanh) {
    return gelu_tanh(x);
  } else {
    static_assert(kKind == ActivationKind::gelu_erf);
    return gelu_erf(x);
  }
}

// d_y · φ'(x) for the non-identity kinds.
template <ActivationKind kKind>
__device__ __forceinline__ float backward_value(float x, float d_y) {
  if constexpr (kKind == ActivationKind::relu) {
    return x > 0.0f ? d_y : 0.0f;  // φ'(0) = 0
  } else if constexpr (kKind == ActivationKind::tanh) {
    const float t = tanh_approx(x);
    return d_y * (1.0f - t * t);
  } else if constexpr (kKind == ActivationKind::gelu_tanh) {
    return d_y * gelu_tanh_grad(x);
  } else {
    static_assert(kKind == ActivationKind::gelu_erf);
    return d_y * gelu_erf_grad(x);
  }
}

// y[i] = φ(x[i]); y may alias x.
template <ActivationKind kKind>
__global__ void __launch_bounds__(kBlockThreads) activation_forward_kernel(const float* x, float* y, std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    y[i] = forward_value<kKind>(x[i]);
}

// d_x[i] = d_y[i] · φ'(x[i]); d_x may alias d_y.
template <ActivationKind kKind>
__global__ void __launch_bounds__(kBlockThreads)
    activation_backward_kernel(const float* x, const float* d_y, float* d_x, std::int64_t n) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    d_x[i] = backward_value<kKind>(x[i], d_y[i]);
}

template <ActivationKind kKind>
void launch_forward(const float* x, float* y, std::int64_t n) {
  activation_forward_kernel<kKind><<<grid_blocks(n), kBlockThreads, 0, context().stream>>>(x, y, n);
  PROPLAB_CUDA_CHECK_LAUNCH("activation_forward_kernel");
}

template <ActivationKind kKind>
void launch_backward(const float* x, const float* d_y, float* d_x, std::int64_t n) {
  activation_backward_kernel<kKind><<<grid_blocks(n), kBlockThreads, 0, context().stream>>>(x, d_y, d_x, n);
  PROPLAB_CUDA_CHECK_LAUNCH("activation_backward_kernel");
}

// dst = src over n floats (nothing when they are the same buffer).
void copy_floats(const float* src, float* dst, std::int64_t n) {
  if (src == dst) return;
  PROPLAB_CUDA_CHECK(cudaMemcpyAsync(dst, src, sizeof(float) * static_cast<std::size_t>(n), cudaMemcpyDeviceToDevice,
                                     context().stream));
}

}  // namespace

void activation_forward(ActivationKind kind, const float* x, float* y, std::int64_t n) {
  PROPLAB_CHECK(n >= 0, "activation_forward: negative size ", n);
  if (n == 0) return;
  PROPLAB_CHECK(x != nullptr && y != nullptr, "activation_forward: null x or y");
  switch (kind) {
    case ActivationKind::identity:
      copy_floats(x, y, n);
      return;
    case ActivationKind::relu:
      launch_forward<ActivationKind::relu>(x, y, n);
      return;
    case ActivationKind::tanh:
      launch_forward<ActivationKind::tanh>(x, y, n);
      return;
    case ActivationKind::gelu_tanh:
      launch_forward<ActivationKind::gelu_tanh>(x, y, n);
      return;
    case ActivationKind::gelu_erf:
      launch_forward<ActivationKind::gelu_erf>(x, y, n);
      return;
  }
  PROPLAB_CHECK(false, "activation_forward: unknown activation ", static_cast<int>(kind));
}

void activation_backward(ActivationKind kind, const float* x, const float* d_y, float* d_x, std::int64_t n) {
  PROPLAB_CHECK(n >= 0, "activation_backward: negative size ", n);
  if (n == 0) return;
  PROPLAB_CHECK(x != nullptr && d_y != nullptr && d_x != nullptr, "activation_backward: null x, d_y or d_x");
  switch (kind) {
    case ActivationKind::identity:
      copy_floats(d_y, d_x, n);
      return;
    case ActivationKind::relu:
      launch_backward<ActivationKind::relu>(x, d_y, d_x, n);
      return;
    case ActivationKind::tanh:
      launch_backward<ActivationKind::tanh>(x, d_y, d_x, n);
      return;
    case ActivationKind::gelu_tanh:
      launch_backward<ActivationKind::gelu_tanh>(x, d_y, d_x, n);
      return;
    case ActivationKind::gelu_erf:
      launch_backward<ActivationKind::gelu_erf>(x, d_y, d_x, n);
      return;
  }
  PROPLAB_CHECK(false, "activation_backward: unknown activation ", static_cast<int>(kind));
}

}  // namespace proplab::kernels
