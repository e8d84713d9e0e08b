// ops/dropout: inverted dropout with a counter-based mask.
//
// Element i is dropped when CounterRng(seed, stream).uniform(i) < p and kept ones are scaled by 1/(1 - p). The
// mask is a pure function of (seed, stream, i): backward recomputes it instead of storing it, and it is the same
// for any thread count or device.
#include <cstdint>
#include <cstring>

#include "ops/dispatch.h"
#include "ops/ops.h"

#ifdef PROPLAB_WITH_CUDA
#include "kernels/dropout.cuh"
#endif

namespace proplab::ops {

namespace {

constexpr std::int64_t kParallelMin = 1 << 13;

// Philox4x32-10 for counter (index, stream) and key seed, first output word mapped to (0, 1): exactly
// CounterRng(seed, stream).uniform(index) (core/rng.cpp), restated inline so the mask loop vectorises (~5x
// faster than calling the out-of-line CounterRng per element). The dropout tests check it bit for bit.
struct PhiloxKey {
  std::uint32_t stream_lo, stream_hi, seed_lo, seed_hi;
};

inline float philox_uniform(std::uint64_t index, PhiloxKey key) {
  std::uint32_t c0 = static_cast<std::uint32_t>(index), c1 = static_cast<std::uint32_t>(index >> 32);
  std::uint32_t c2 = key.stream_lo, c3 = key.stream_hi, k0 = key.seed_lo, k1 = key.seed_hi;
  for (int round = 0; round < 10; ++round) {
    const std::uint64_t product0 = static_cast<std::uint64_t>(0xD2511F53u) * c0;
    const std::uint64_t product1 = static_cast<std::uint64_t>(0xCD9E8D57u) * c2;
    const std::uint32_t next0 = static_cast<std::uint32_t>(product1 >> 32) ^ c1 ^ k0;
    const std::uint32_t next2 = static_cast<std::uint32_t>(product0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<std::uint32_t>(product1);
    c3 = static_cast<std::uint32_t>(product0);
    c0 = next0;
    c2 = next2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  // (x + 0.5) / 2^32 on the top 24 bits, as CounterRng::uniform.
  return (static_cast<float>(static_cast<std::int32_t>(c0 >> 8)) + 0.5f) * (1.0f / 16777216.0f);
}

// out[i] = in[i] * keep_scale where kept, 0 where dropped; in and out may alias.
void apply_mask(const float* in, float p, std::uint64_t seed, std::uint64_t stream, std::int64_t n, float* out) {
  if (p == 0.0f) {
    if (out != in) std::memcpy(out, in, sizeof(float) * static_cast<std::size_t>(n));
    return;
  }
  const PhiloxKey key{static_cast<std::uint32_t>(stream), static_cast<std::uint32_t>(stream >> 32),
                      static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)};
  const float keep_scale = 1.0f / (1.0f - p);
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (std::int64_t i = 0; i < n; ++i)
    out[i] = philox_uniform(static_cast<std::uint64_t>(i), key) < p ? 0.0f : in[i] * keep_scale;
}

void check_rate(const char* op, float p) {
  PROPLAB_CHECK(p >= 0.0f && p < 1.0f, "op '", op, "': dropout rate must be in [0, 1), got ", p);
}

}  // namespace

void dropout_forward(const Tensor& x, float p, std::uint64_t seed, std::uint64_t stream, Tensor& y) {
  constexpr const char* op = "dropout_forward";
  expect_shape(op, "x", x, x.shape());
  expect_shape(op, "y", y, x.shape());
  check_rate(op, p);
  const Device device = common_device(op, {&x, &y});
  if (device == Device::cuda) {
#ifdef PROPLAB_WITH_CUDA
    kernels::dropout_apply(x.f32(), p, seed, stream, x.numel(), y.f32());
    return;
#else
    missing_device_impl(op, device);
#endif
  }
  apply_mask(x.f32(), p, seed, stream, x.numel(), y.f32());
}

void dropout_backward(const Tensor& d_y, float p, std::uint64_t seed, std::uint64_t stream, Tensor& d_x) {
  constexpr const char* op = "dropout_backward";
  expect_shape(op, "d_y", d_y, d_y.shape());
  expect_shape(op, "d_x", d_x, d_y.shape());
  check_rate(op, p);
  const Device device = common_device(op, {&d_y, &d_x});
  if (device == Device::cuda) {
#ifdef PROPLAB_WITH_CUDA
    kernels::dropout_apply(d_y.f32(), p, seed, stream, d_y.numel(), d_x.f32());
    return;
#else
    missing_device_impl(op, device);
#endif
  }
  apply_mask(d_y.f32(), p, seed, stream, d_y.numel(), d_x.f32());
}

}  // namespace proplab::ops
