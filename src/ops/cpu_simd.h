// ops/cpu_simd: float vectors of the build's widest width (GCC/Clang vector extensions) for the CPU reference
// ops that need more than the compiler's auto-vectorisation: a vectorised exp for softmax, masked tails, lane
// reductions.
//
// Invariants: results depend only on the inputs, never on the thread count; horizontal reductions combine the
// lanes in lane order. The width follows the target ISA (see kLanes), so -march=native gets AVX-512 where the
// machine has it and a portable build still gets full-width SSE2 vectors.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>

namespace proplab::ops::simd {

// The widest vector the build targets: 16 floats with AVX-512, 8 with AVX, 4 otherwise (SSE2, NEON).
// kVectorRegisters is the size of the register file, for kernels that size their register tiles by it.
#if defined(__AVX512F__)
constexpr std::int64_t kLanes = 16;
constexpr int kVectorRegisters = 32;
#elif defined(__AVX__)
constexpr std::int64_t kLanes = 8;
constexpr int kVectorRegisters = 16;
#else
constexpr std::int64_t kLanes = 4;
constexpr int kVectorRegisters = 16;
#endif

// kLanes floats; may_alias and 4-byte alignment so it can load from and store to any float buffer.
typedef float Vec __attribute__((vector_size(kLanes * sizeof(float)), aligned(4), may_alias));
typedef std::int32_t IntVec __attribute__((vector_size(kLanes * sizeof(std::int32_t)), aligned(4), may_alias));

inline Vec splat(float x) { return Vec{} + x; }
inline Vec load(const float* p) { return *reinterpret_cast<const Vec*>(p); }
inline void store(float* p, Vec v) { *reinterpret_cast<Vec*>(p) = v; }

// Lane-wise mask ? if_true : if_false (mask lanes are all ones or all zeros, as comparisons produce).
inline Vec select(IntVec mask, Vec if_true, Vec if_false) {
  IntVec t = std::bit_cast<IntVec>(if_true);
  IntVec f = std::bit_cast<IntVec>(if_false);
  return std::bit_cast<Vec>((t & mask) | (f & ~mask));
}

// Lanes whose index (base + lane) is below `limit`.
inline IntVec lanes_below(std::int64_t base, std::int64_t limit) {
  IntVec lane = {};
  for (int l = 0; l < kLanes; ++l) lane[l] = l;
  const std::int64_t count = std::clamp<std::int64_t>(limit - base, 0, kLanes);
  return lane < static_cast<std::int32_t>(count);
}

inline Vec max(Vec a, Vec b) { return select(a > b, a, b); }

inline float horizontal_sum(Vec v) {
  float total = 0.0f;
  for (int l = 0; l < kLanes; ++l) total += v[l];
  return total;
}
inline double horizontal_sum_double(Vec v) {
  double total = 0.0;
  for (int l = 0; l < kLanes; ++l) total += v[l];
  return total;
}
inline float horizontal_max(Vec v) {
  float m = v[0];
  for (int l = 1; l < kLanes; ++l) m = std::max(m, v[l]);
  return m;
}

// exp(x) for x <= 0 (softmax after max subtraction): Cody-Waite range reduction and a degree-6 polynomial
// (Cephes expf), about 1 ulp; exactly 0 below the float range (and for x = -inf).
inline Vec exp_nonpositive(Vec x) {
  const Vec round_magic = splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to the nearest integer
  Vec n = (x * splat(1.44269504088896341f) + round_magic) - round_magic;
  Vec r = x - n * splat(0.693359375f);
  r = r - n * splat(-2.12194440e-4f);
  Vec p = splat(1.9875691500e-4f);
  p = p * r + splat(1.3981999507e-3f);
  p = p * r + splat(8.3334519073e-3f);
  p = p * r + splat(4.1665795894e-2f);
  p = p * r + splat(1.6666665459e-1f);
  p = p * r + splat(5.0000001201e-1f);
  p = p * r * r + r + splat(1.0f);
  IntVec exponent = (__builtin_convertvector(n, IntVec) + 127) << 23;
  return select(x >= splat(-87.0f), p * std::bit_cast<Vec>(exponent), splat(0.0f));
}

}  // namespace proplab::ops::simd
