#include "core/rng.h"

#include <cmath>

namespace proplab {

namespace {
constexpr std::uint32_t kMul0 = 0xD2511F53u;
constexpr std::uint32_t kMul1 = 0xCD9E8D57u;
constexpr std::uint32_t kWeyl0 = 0x9E3779B9u;
constexpr std::uint32_t kWeyl1 = 0xBB67AE85u;

inline void mulhilo(std::uint32_t a, std::uint32_t b, std::uint32_t& hi, std::uint32_t& lo) {
  std::uint64_t p = static_cast<std::uint64_t>(a) * b;
  hi = static_cast<std::uint32_t>(p >> 32);
  lo = static_cast<std::uint32_t>(p);
}

inline float to_unit(std::uint32_t x) {
  // (x + 0.5) / 2^32 in float: strictly inside (0, 1) after rounding for 24 significant bits.
  return (static_cast<float>(x >> 8) + 0.5f) * (1.0f / 16777216.0f);
}
}  // namespace

void Philox::block(std::uint32_t counter[4], const std::uint32_t key_in[2], std::uint32_t out[4]) {
  std::uint32_t c0 = counter[0], c1 = counter[1], c2 = counter[2], c3 = counter[3];
  std::uint32_t k0 = key_in[0], k1 = key_in[1];
  for (int round = 0; round < 10; ++round) {
    std::uint32_t hi0, lo0, hi1, lo1;
    mulhilo(kMul0, c0, hi0, lo0);
    mulhilo(kMul1, c2, hi1, lo1);
    std::uint32_t n0 = hi1 ^ c1 ^ k0;
    std::uint32_t n1 = lo1;
    std::uint32_t n2 = hi0 ^ c3 ^ k1;
    std::uint32_t n3 = lo0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
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

void CounterRng::words(std::uint64_t index, std::uint32_t out[4]) const {
  std::uint32_t counter[4] = {static_cast<std::uint32_t>(index), static_cast<std::uint32_t>(index >> 32),
                              static_cast<std::uint32_t>(stream_), static_cast<std::uint32_t>(stream_ >> 32)};
  std::uint32_t key[2] = {static_cast<std::uint32_t>(seed_), static_cast<std::uint32_t>(seed_ >> 32)};
  Philox::block(counter, key, out);
}

float CounterRng::uniform(std::uint64_t index) const {
  std::uint32_t w[4];
  words(index, w);
  return to_unit(w[0]);
}

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
