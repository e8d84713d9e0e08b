// ops/activation: pointwise activations and their derivatives.
//
// The transcendental parts use the inline, branch-free approximations below (relative error below 4e-7, a few
// float ulps, checked against double libm in tests/ops/test_activation.cpp) so that every loop vectorises;
// libm's scalar tanhf/erff cost about as much as the matmuls around them at small widths.
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "ops/dispatch.h"
#include "ops/gather.h"
#include "ops/ops.h"

#ifdef PROPLAB_WITH_CUDA
#include "kernels/activation.cuh"
#endif

namespace proplab::ops {

namespace {

constexpr std::int64_t kParallelMin = 1 << 14;
constexpr float kSqrt2OverPi = 0.7978845608028654f;  // GPT-2 gelu: tanh(√(2/π)(x + 0.044715 x³))
constexpr float kGeluCubic = 0.044715f;
constexpr float kInvSqrt2 = 0.7071067811865476f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;

// e^(x + x_lo), x_lo a small correction carried separately (|x_lo| << 1). Cody-Waite reduction by ln 2 with a
// degree-7 Taylor polynomial on [-ln2/2, ln2/2]. Below -87 it returns 0 and above 88 +inf (where float e^x
// leaves the normal range); NaN gives NaN. Clamps are written as comparisons, not fmin/fmax, whose NaN rules
// keep GCC from vectorising.
inline float exp_approx(float x, float x_lo = 0.0f) {
  const float clamped = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  // n = round(x / ln 2) by the 1.5 * 2^23 shift trick (the integer lands in the low mantissa bits): plain adds,
  // which vectorise where floorf does not.
  constexpr float kRoundShift = 12582912.0f;
  const float shifted = clamped * 1.44269504088896341f + kRoundShift;
  const float n = shifted - kRoundShift;
  const std::int32_t n_int = std::bit_cast<std::int32_t>(shifted) - std::bit_cast<std::int32_t>(kRoundShift);
  // ln 2 = 0.693359375 - 2.12194440e-4; the first product and difference are exact.
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
  const std::int32_t exponent_bits = (n_int + 127) << 23;
  const float result = p * std::bit_cast<float>(exponent_bits);
  return x < -87.0f ? 0.0f : (x > 88.0f ? std::numeric_limits<float>::infinity() : result);
}

// tanh: an odd minimax polynomial (Cephes tanhf) below |x| = 0.625, where 1 - 2/(e^2x + 1) would cancel.
inline float tanh_approx(float x) {
  const float magnitude = std::fabs(x);
  const float e = exp_approx(2.0f * magnitude);
  const float large = std::copysign(1.0f - 2.0f / (e + 1.0f), x);
  const float z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const float small = p * z * x + x;
  return magnitude > 0.625f ? large : small;
}

// x² / 2 as an unevaluated sum hi + lo (exact with FMA): exponents like -x²/2 reach -87, where rounding x² to
// float alone would cost ~1e-5 relative error in e^(-x²/2). The halving comes last and is exact, so the
// compiler's a*b+c contraction (on by default in GCC) cannot change hi where it is later added to.
inline void half_square(float x, float& hi, float& lo) {
  const float square = x * x;
  hi = 0.5f * square;
#ifdef __FMA__
  lo = 0.5f * std::fma(x, x, -square);
#else
  lo = 0.0f;
#endif
}

// Φ(-a) = erfc(a/√2)/2 for 0 <= a <= 14 (relative error ~3e-7): Numerical Recipes' Chebyshev fit of erfc
// (erfcc), erfc(z) = t e^(-z² + P(t)), t = 1/(1 + z/2), with the exponent kept as an exact two-float sum.
inline float normal_tail(float a) {
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

// Standard normal CDF Φ(x), accurate in both tails. Beyond |x| = 14, Φ is 0 or 1 to float precision.
inline float normal_cdf(float x) {
  const float magnitude = std::fabs(x);
  const float tail = normal_tail(magnitude > 14.0f ? 14.0f : magnitude);
  return x < 0.0f ? tail : 1.0f - tail;
}

// Standard normal density φ(x).
inline float normal_pdf(float x) {
  float half_sq, half_sq_lo;
  const float magnitude = std::fabs(x);
  half_square(magnitude > 14.0f ? 14.0f : magnitude, half_sq, half_sq_lo);
  return kInvSqrt2Pi * exp_approx(-half_sq, -half_sq_lo);
}

// GPT-2 gelu: x/2 (1 + tanh u) = x σ(2u), u = √(2/π)(x + 0.044715 x³). The sigmoid form has no cancellation
// for negative x, where 1 + tanh u → 0.
inline float gelu_tanh(float x) {
  const float u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
  return x / (1.0f + exp_approx(-2.0f * u));
}

inline float gelu_tanh_grad(float x) {
  // Beyond |x| = 20 the derivative is 1 or 0 to float precision; clamping keeps x³ from overflowing (written
  // with comparisons so a NaN x stays NaN), and capping the exponent at 80 keeps e and e σ finite.
  x = x < -20.0f ? -20.0f : (x > 20.0f ? 20.0f : x);
  const float u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
  const float exponent = -2.0f * u;
  const float e = exp_approx(exponent > 80.0f ? 80.0f : exponent);
  const float s = 1.0f / (1.0f + e);  // σ(2u) = (1 + tanh u)/2
  const float du_dx = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x * x);
  // d/dx [x σ(2u)] = σ(2u) + x · 2σ(2u)(1 - σ(2u)) · u',  with 1 - σ(2u) = e σ(2u).
  return s + x * 2.0f * s * (e * s) * du_dx;
}

inline float gelu_erf(float x) { return x * normal_cdf(x); }

inline float gelu_erf_grad(float x) { return normal_cdf(x) + x * normal_pdf(x); }

#ifdef PROPLAB_WITH_CUDA
kernels::ActivationKind device_kind(const char* op, Activation kind) {
  switch (kind) {
    case Activation::identity:
      return kernels::ActivationKind::identity;
    case Activation::relu:
      return kernels::ActivationKind::relu;
    case Activation::tanh:
      return kernels::ActivationKind::tanh;
    case Activation::gelu_tanh:
      return kernels::ActivationKind::gelu_tanh;
    case Activation::gelu_erf:
      return kernels::ActivationKind::gelu_erf;
  }
  PROPLAB_CHECK(false, "op '", op, "': unknown activation ", static_cast<int>(kind));
  return kernels::ActivationKind::identity;
}
#endif

void expect_pointwise(const char* op, const Tensor& x, const Tensor& other, const char* other_name) {
  expect_shape(op, "x", x, x.shape());
  expect_shape(op, other_name, other, x.shape());
}

// φ(x) and d_y·φ'(x) of one element, as every CPU loop below computes them (and the shift samples of a gathered
// output: ops::OpMoments).
template <Activation kKind>
inline float forward_one(float x) {
  if constexpr (kKind == Activation::identity) {
    return x;
  } else if constexpr (kKind == Activation::relu) {
    return x < 0.0f ? 0.0f : x;  // relu(NaN) = NaN: a diverging run stays visible
  } else if constexpr (kKind == Activation::tanh) {
    return tanh_approx(x);
  } else if constexpr (kKind == Activation::gelu_tanh) {
    return gelu_tanh(x);
  } else {
    return gelu_erf(x);
  }
}

template <Activation kKind>
inline float backward_one(float x, float d_y) {
  if constexpr (kKind == Activation::identity) {
    return d_y;
  } else if constexpr (kKind == Activation::relu) {
    return x > 0.0f ? d_y : 0.0f;  // φ'(0) = 0 (the subgradient that keeps dead units dead)
  } else if constexpr (kKind == Activation::tanh) {
    const float t = tanh_approx(x);
    return d_y * (1.0f - t * t);
  } else if constexpr (kKind == Activation::gelu_tanh) {
    return d_y * gelu_tanh_grad(x);
  } else {
    return d_y * gelu_erf_grad(x);
  }
}

// f(std::integral_constant<Activation, kind>) for the runtime kind.
template <typename F>
void with_kind(const char* op, Activation kind, F f) {
  switch (kind) {
    case Activation::identity:
      return f(std::integral_constant<Activation, Activation::identity>{});
    case Activation::relu:
      return f(std::integral_constant<Activation, Activation::relu>{});
    case Activation::tanh:
      return f(std::integral_constant<Activation, Activation::tanh>{});
    case Activation::gelu_tanh:
      return f(std::integral_constant<Activation, Activation::gelu_tanh>{});
    case Activation::gelu_erf:
      return f(std::integral_constant<Activation, Activation::gelu_erf>{});
  }
  PROPLAB_CHECK(false, "op '", op, "': unknown activation ", static_cast<int>(kind));
}

}  // namespace

void activation_forward(Activation kind, const Tensor& x, Tensor& y, const OpMoments* moments) {
  constexpr const char* op = "activation_forward";
  expect_pointwise(op, x, y, "y");
  const Device device = common_device(op, {&x, &y});
  if (device == Device::cuda) {
#ifdef PROPLAB_WITH_CUDA
    accumulate_input(moments, x);
    kernels::activation_forward(device_kind(op, kind), x.f32(), y.f32(), x.numel());
    accumulate_output(moments, y);
    return;
#else
    missing_device_impl(op, device);
#endif
  }

  const float* in = x.f32();
  float* out = y.f32();
  const std::int64_t n = x.numel();
  with_kind(op, kind, [&](auto k) {
    constexpr Activation kKind = decltype(k)::value;
    auto compute = [in, out](std::int64_t begin, std::int64_t end) {
#pragma omp simd
      for (std::int64_t i = begin; i < end; ++i) out[i] = forward_one<kKind>(in[i]);
    };
    if (gather_moments(moments, x, y, kParallelMin, compute,
                       [in](std::int64_t i) { return forward_one<kKind>(in[i]); }))
      return;
    in_thread_ranges(n, kParallelMin, compute);
  });
}

void activation_backward(Activation kind, const Tensor& x, const Tensor& d_y, Tensor& d_x, const OpMoments* moments) {
  constexpr const char* op = "activation_backward";
  expect_pointwise(op, x, d_y, "d_y");
  expect_shape(op, "d_x", d_x, x.shape());
  const Device device = common_device(op, {&x, &d_y, &d_x});
  if (device == Device::cuda) {
#ifdef PROPLAB_WITH_CUDA
    accumulate_input(moments, d_y);  // (d_x may alias d_y)
    kernels::activation_backward(device_kind(op, kind), x.f32(), d_y.f32(), d_x.f32(), x.numel());
    accumulate_output(moments, d_x);
    return;
#else
    missing_device_impl(op, device);
#endif
  }

  // No restrict: d_x may alias d_y (each element is read before it is written).
  const float* in = x.f32();
  const float* grad_out = d_y.f32();
  float* grad_in = d_x.f32();
  const std::int64_t n = x.numel();
  with_kind(op, kind, [&](auto k) {
    constexpr Activation kKind = decltype(k)::value;
    const bool nothing_to_write = kKind == Activation::identity && grad_in == grad_out;  // d_x = d_y in place
    auto compute = [in, grad_out, grad_in, nothing_to_write](std::int64_t begin, std::int64_t end) {
      if (nothing_to_write) return;
#pragma omp simd
      for (std::int64_t i = begin; i < end; ++i) grad_in[i] = backward_one<kKind>(in[i], grad_out[i]);
    };
    if (gather_moments(moments, d_y, d_x, kParallelMin, compute,
                       [in, grad_out](std::int64_t i) { return backward_one<kKind>(in[i], grad_out[i]); }))
      return;
    if (!nothing_to_write) in_thread_ranges(n, kParallelMin, compute);
  });
}

}  // namespace proplab::ops
