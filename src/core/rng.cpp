#include "core/rng.h"

#include <cmath>

#include "core/philox.h"

namespace proplab {

void Philox::block(std::uint32_t counter[4], const std::uint32_t key[2], std::uint32_t out[4]) {
  philox4x32_10(counter, key, out);
}

std::uint64_t stream_id(std::string_view name, std::uint64_t a, std::uint64_t b) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : name) {
    h ^= ch;
    h *= 1099511628211ull;
  }
  auto mix = [](std::uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
  };
  h = mix(h ^ mix(a + 0x9E3779B97F4A7C15ull));
  h = mix(h ^ mix(b + 0xD1B54A32D192ED03ull));
  return h;
}

void CounterRng::words(std::uint64_t index, std::uint32_t out[4]) const { philox_words(seed_, stream_, index, out); }

float CounterRng::uniform(std::uint64_t index) const { return philox_uniform(seed_, stream_, index); }

float CounterRng::normal(std::uint64_t index) const {
  std::uint32_t w[4];
  words(index, w);
  // Box-Muller in double so the tails are accurate; the result is rounded once to float.
  double u1 = (static_cast<double>(w[0]) + 0.5) / 4294967296.0;
  double u2 = (static_cast<double>(w[1]) + 0.5) / 4294967296.0;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

std::uint64_t CounterRng::below(std::uint64_t index, std::uint64_t n) const {
  std::uint32_t w[4];
  words(index, w);
  std::uint64_t x = (static_cast<std::uint64_t>(w[2]) << 32) | w[3];
  // Multiply-shift: bias below 2^-64 * n, negligible for our ranges.
  return static_cast<std::uint64_t>((static_cast<unsigned __int128>(x) * n) >> 64);
}

}  // namespace proplab
