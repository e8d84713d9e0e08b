// core/philox: the Philox4x32-10 block and the uniform draw, written once for the host and for CUDA kernels.
//
// core/rng (CounterRng) is built on these functions and kernels/ calls them on the device, so a dropout mask or
// an initial value drawn on the GPU is bitwise the value drawn on the CPU: same counter (index, stream), same key
// (seed), same integer arithmetic, same single rounding to float.
//
// Invariants:
// - Header-only, no dependencies: a .cu file includes it and its functions compile as __host__ __device__.
// - philox_uniform(seed, stream, index) == CounterRng(seed, stream).uniform(index), bit for bit.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define PROPLAB_HOST_DEVICE __host__ __device__
#else
#define PROPLAB_HOST_DEVICE
#endif

namespace proplab {

// Four 32-bit random words for counter (c[0..3]) and key (k[0..1]): ten Philox rounds.
PROPLAB_HOST_DEVICE inline void philox4x32_10(const std::uint32_t counter[4], const std::uint32_t key[2],
                                              std::uint32_t out[4]) {
  constexpr std::uint32_t kMul0 = 0xD2511F53u;
  constexpr std::uint32_t kMul1 = 0xCD9E8D57u;
  constexpr std::uint32_t kWeyl0 = 0x9E3779B9u;
  constexpr std::uint32_t kWeyl1 = 0xBB67AE85u;
  std::uint32_t c0 = counter[0], c1 = counter[1], c2 = counter[2], c3 = counter[3];
  std::uint32_t k0 = key[0], k1 = key[1];
  for (int round = 0; round < 10; ++round) {
    const std::uint64_t p0 = static_cast<std::uint64_t>(kMul0) * c0;
    const std::uint64_t p1 = static_cast<std::uint64_t>(kMul1) * c2;
    const std::uint32_t hi0 = static_cast<std::uint32_t>(p0 >> 32), lo0 = static_cast<std::uint32_t>(p0);
    const std::uint32_t hi1 = static_cast<std::uint32_t>(p1 >> 32), lo1 = static_cast<std::uint32_t>(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

// The four words of (seed, stream, index): counter (index lo, index hi, stream lo, stream hi), key (seed lo, hi).
PROPLAB_HOST_DEVICE inline void philox_words(std::uint64_t seed, std::uint64_t stream, std::uint64_t index,
                                             std::uint32_t out[4]) {
  const std::uint32_t counter[4] = {static_cast<std::uint32_t>(index), static_cast<std::uint32_t>(index >> 32),
                                    static_cast<std::uint32_t>(stream), static_cast<std::uint32_t>(stream >> 32)};
  const std::uint32_t key[2] = {static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)};
  philox4x32_10(counter, key, out);
}

// A word mapped into (0, 1): (top 24 bits + 0.5) / 2^24, exact in float, never 0 or 1.
PROPLAB_HOST_DEVICE inline float philox_unit(std::uint32_t word) {
  return (static_cast<float>(word >> 8) + 0.5f) * (1.0f / 16777216.0f);
}

// Uniform in (0, 1) from the first word of (seed, stream, index).
PROPLAB_HOST_DEVICE inline float philox_uniform(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  std::uint32_t w[4];
  philox_words(seed, stream, index, w);
  return philox_unit(w[0]);
}

}  // namespace proplab
