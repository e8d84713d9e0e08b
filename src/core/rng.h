// core/rng: counter-based random numbers (Philox4x32-10).
//
// Every random value in proplab is a pure function of (seed, stream, index):
// - seed: the study seed;
// - stream: what the numbers are for (a parameter id, a dropout site and step, a data stream), see stream_id();
// - index: the element index (for a parameter, its flat index in the unsharded tensor).
// So a parameter's initial values are identical whatever the device, thread count, rank count or sharding,
// and nothing depends on the order in which values are drawn.
#pragma once

#include <cstdint>
#include <string_view>

namespace proplab {

struct Philox {
  // Four 32-bit random words for counter (index_lo, index_hi, c2, c3) and key (k0, k1).
  static void block(std::uint32_t counter[4], const std::uint32_t key[2], std::uint32_t out[4]);
};

// A 64-bit stream id from a name (FNV-1a) mixed with numbers: stream_id("blocks.3.attn.qkv.weight").
std::uint64_t stream_id(std::string_view name, std::uint64_t a = 0, std::uint64_t b = 0);

class CounterRng {
 public:
  CounterRng(std::uint64_t seed, std::uint64_t stream) : seed_(seed), stream_(stream) {}
  // Uniform in (0, 1), never exactly 0 or 1.
  float uniform(std::uint64_t index) const;
  // Standard normal (Box-Muller on one Philox block).
  float normal(std::uint64_t index) const;
  // Uniform integer in [0, n).
  std::uint64_t below(std::uint64_t index, std::uint64_t n) const;
  // Four raw words for this index.
  void words(std::uint64_t index, std::uint32_t out[4]) const;

 private:
  std::uint64_t seed_;
  std::uint64_t stream_;
};

}  // namespace proplab
