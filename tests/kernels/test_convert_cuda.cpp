// kernels/convert (f32 → bf16, round to nearest even) against the host reference in bf16_reference.h, bitwise:
// exact bf16 values, ties both ways, the neighbours of ties, the largest finite values (rounding up to Inf), ±Inf,
// ±0, denormals of every kind (rounding to zero, to bf16 denormals, up to the smallest normal), and NaNs (quiet,
// signalling, payload only in the dropped bits: each must come out a NaN of its sign, whatever payload the
// hardware chooses), then a sweep of pseudo-random bit patterns long enough to need several grid-stride passes.
// The GPU tests skip at run time when no GPU is present; the host reference is itself checked everywhere, against
// a nearest-neighbour search in double.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "bf16_reference.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "kernels/context.cuh"
#include "kernels/convert.cuh"
#include "kernels/cuda_compare.h"

namespace proplab {
namespace {

using testing::bf16_bits_rne;
using testing::bf16_is_nan;
using testing::bits_float;
using testing::float_bits;
using testing::to_cuda;

// The patterns every rounding rule is checked on (sign added below).
const std::vector<std::uint32_t> kSpecialPatterns = {
    0x00000000u,  // +0
    0x3F800000u,  // 1: exact
    0x3F808000u,  // 1 + 2^-8: a tie, kept part even → down to 1
    0x3F818000u,  // a tie with an odd kept part → up
    0x3F807FFFu,  // just below a tie → down
    0x3F808001u,  // just above a tie → up
    0x3FFFFFFFu,  // carries through the mantissa into the exponent → 2
    0x7F7F7FFFu,  // below the tie under the largest bf16 → the largest bf16
    0x7F7F8000u,  // tie above the largest bf16, odd → Inf
    0x7F7FFFFFu,  // the largest f32 → Inf
    0x7F800000u,  // Inf
    0x00000001u,  // the smallest denormal → 0
    0x00008000u,  // a denormal tie, even → 0
    0x00018000u,  // a denormal tie, odd → up
    0x00010000u,  // the smallest bf16 denormal, exact
    0x0000FFFFu,  // → the denormal 0x0001
    0x00400000u,  // a mid denormal, exact
    0x007FFFFFu,  // the largest denormal → the smallest normal
    0x00800000u,  // the smallest normal
    0x7FC00000u,  // quiet NaN
    0x7F800001u,  // signalling NaN whose payload is only in the dropped bits
    0x7F80FFFFu,  // the same, more payload
    0x7FFFFFFFu,  // NaN with every payload bit set
};

std::vector<std::uint16_t> convert_on_gpu(const std::vector<float>& values) {
  const Tensor input = to_cuda(Tensor::from_vector({static_cast<std::int64_t>(values.size())}, values));
  kernels::Scratch output(sizeof(std::uint16_t) * values.size());
  kernels::convert_f32_to_bf16(input.f32(), output.as<std::uint16_t>(), static_cast<std::int64_t>(values.size()));
  std::vector<std::uint16_t> bits(values.size());
  kernels::copy_to_host(bits.data(), output.as<std::uint16_t>(), sizeof(std::uint16_t) * values.size());
  return bits;
}

// Bitwise against the reference; a NaN input must give a NaN (of either sign: the conversion may return the
// canonical NaN 0x7fff, as CUDA's host implementation of __float2bfloat16_rn does for every NaN).
void expect_rounded(const std::vector<float>& values, const std::vector<std::uint16_t>& bits) {
  ASSERT_EQ(values.size(), bits.size());
  std::int64_t failures = 0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    const std::uint16_t expected = bf16_bits_rne(values[i]);
    const bool ok = bf16_is_nan(expected) ? bf16_is_nan(bits[i]) : bits[i] == expected;
    if (!ok && ++failures <= 8)
      ADD_FAILURE() << "f32 0x" << std::hex << float_bits(values[i]) << ": gpu 0x" << bits[i] << ", expected 0x"
                    << expected << std::dec;
  }
  EXPECT_EQ(failures, 0) << failures << " of " << values.size() << " values rounded differently";
}

// The special values, both signs.
std::vector<float> special_values() {
  std::vector<float> values;
  for (const std::uint32_t pattern : kSpecialPatterns)
    for (const std::uint32_t sign : {0u, 0x80000000u}) values.push_back(bits_float(pattern | sign));
  return values;
}

// `count` floats with pseudo-random bit patterns (every exponent, denormals, Infs and NaNs included).
std::vector<float> random_patterns(std::int64_t count) {
  const CounterRng rng(2024, 0);
  std::vector<float> values(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i) {
    std::uint32_t words[4];
    rng.words(static_cast<std::uint64_t>(i), words);
    values[static_cast<std::size_t>(i)] = bits_float(words[0]);
  }
  return values;
}

// The reference by another route: of the two bf16 magnitudes around |v| (its truncation and the next one up), the
// nearer in double (the differences are exact), the even one on a tie. Past the largest bf16 the next one up is
// Inf, which rounding places at 2^128 (where the exponent range would go on), so exactly the values from the
// midpoint up round to Inf.
std::uint16_t nearest_bf16(float v) {
  const std::uint16_t below = static_cast<std::uint16_t>(float_bits(v) >> 16);  // truncation toward zero
  if ((below & 0x7F80u) == 0x7F80u) return below;                               // ±Inf (NaNs are not asked)
  const std::uint16_t above = static_cast<std::uint16_t>(below + 1);
  const double magnitude = std::abs(double(v));
  const double near = std::abs(double(testing::bf16_value(below)));
  const double far = (above & 0x7FFFu) == 0x7F80u ? std::ldexp(1.0, 128) : std::abs(double(testing::bf16_value(above)));
  const double to_below = magnitude - near, to_above = far - magnitude;
  if (to_below < to_above) return below;
  if (to_below > to_above) return above;
  return (below & 1u) == 0 ? below : above;
}

TEST(ConvertCuda, HostReferenceIsRoundToNearestEven) {
  std::vector<float> values = special_values();
  const std::vector<float> random = random_patterns(1 << 16);
  values.insert(values.end(), random.begin(), random.end());
  std::int64_t failures = 0;
  for (const float v : values) {
    if (std::isnan(v)) {
      EXPECT_TRUE(bf16_is_nan(bf16_bits_rne(v))) << std::hex << float_bits(v);
      continue;
    }
    if (bf16_bits_rne(v) != nearest_bf16(v) && ++failures <= 8)
      ADD_FAILURE() << "f32 0x" << std::hex << float_bits(v) << ": reference 0x" << bf16_bits_rne(v) << ", nearest 0x"
                    << nearest_bf16(v) << std::dec;
  }
  EXPECT_EQ(failures, 0);
  // Spot checks of the reference, so a wrong reference cannot pass unnoticed.
  EXPECT_EQ(bf16_bits_rne(bits_float(0x3F808000u)), 0x3F80u);
  EXPECT_EQ(bf16_bits_rne(bits_float(0x3F818000u)), 0x3F82u);
  EXPECT_EQ(bf16_bits_rne(bits_float(0x7F7FFFFFu)), 0x7F80u);
  EXPECT_EQ(bf16_bits_rne(bits_float(0x007FFFFFu)), 0x0080u);
  EXPECT_EQ(bf16_bits_rne(bits_float(0x80008000u)), 0x8000u);
  EXPECT_TRUE(bf16_is_nan(bf16_bits_rne(bits_float(0x7F800001u))));
}

TEST(ConvertCuda, SpecialValuesRoundToNearestEven) {
  SKIP_WITHOUT_GPU();
  const std::vector<float> values = special_values();
  expect_rounded(values, convert_on_gpu(values));
}

TEST(ConvertCuda, RandomBitPatternsMatchTheReference) {
  SKIP_WITHOUT_GPU();
  // More than three passes of the largest grid (1024 blocks · 256 threads), and not a multiple of a block.
  const std::vector<float> values = random_patterns(3 * 1024 * 256 + 17);
  expect_rounded(values, convert_on_gpu(values));
}

TEST(ConvertCuda, EmptyAndSingleValues) {
  SKIP_WITHOUT_GPU();
  kernels::convert_f32_to_bf16(nullptr, nullptr, 0);  // nothing to do, nothing launched
  const std::vector<float> one = {1.00390625f};       // 1 + 2^-8: a tie, rounds to 1
  EXPECT_EQ(convert_on_gpu(one), (std::vector<std::uint16_t>{0x3F80u}));
}

}  // namespace
}  // namespace proplab
