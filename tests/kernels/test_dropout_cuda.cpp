// CUDA-vs-CPU comparison of dropout (kernels/dropout.cu against the CPU reference in src/ops/dropout.cpp), through
// the ops entry points. The mask is a pure function of (seed, stream, index) drawn by the same Philox code on both
// sides and the kept values are one rounded multiply by the same 1/(1 − p), so the outputs must agree BITWISE
// (tolerance zero). Skipped at run time when no GPU is present.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "ops/ops.h"
#include "support/gradcheck.h"

namespace proplab {
namespace {

using testing::random_tensor;

// Odd sizes, sizes around a block, and one larger than a full grid pass (1024 blocks · 256 threads).
const std::vector<Shape> kShapes = {{1}, {7}, {1023}, {4097}, {3, 17, 61}, {3'000'017}};
const std::vector<float> kRates = {0.0f, 0.1f, 0.3f, 0.5f, 0.9f};

// A small seed and stream, and ones using all 64 bits of the Philox key and counter words.
struct SeedStream {
  std::uint64_t seed, stream;
};
const std::vector<SeedStream> kSeeds = {{1234, stream_id("test.dropout_cuda", 3, 7)},
                                        {0xF00DFACE12345678ull, 0xFEDCBA9876543210ull}};

#define SKIP_WITHOUT_GPU() \
  if (!proplab::cuda_available()) GTEST_SKIP() << "no CUDA GPU: skipping CUDA-vs-CPU comparison"

Tensor to_cuda(const Tensor& host) {
  Tensor device = Tensor::empty(host.shape(), DType::f32, Device::cuda);
  device.copy_from(host);
  return device;
}

void expect_bitwise(const std::vector<float>& actual, const std::vector<float>& expected, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  std::int64_t differing = 0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    if (std::bit_cast<std::uint32_t>(actual[i]) != std::bit_cast<std::uint32_t>(expected[i]) && ++differing <= 5)
      ADD_FAILURE() << what << "[" << i << "]: cuda " << actual[i] << " vs cpu " << expected[i];
  }
  EXPECT_EQ(differing, 0) << what << ": " << differing << " of " << actual.size() << " elements differ in their bits";
}

std::string describe(const Shape& shape, float p, const SeedStream& s) {
  return "shape " + shape_string(shape) + " p " + std::to_string(p) + " seed " + std::to_string(s.seed) + " stream " +
         std::to_string(s.stream);
}

TEST(DropoutCuda, ForwardAndBackwardBitwiseEqualCpu) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 100;
  for (const Shape& shape : kShapes) {
    const Tensor x = random_tensor(shape, seed += 10), d_y = random_tensor(shape, seed + 1);
    const Tensor x_cuda = to_cuda(x), d_y_cuda = to_cuda(d_y);
    for (float p : kRates) {
      for (const SeedStream& s : kSeeds) {
        SCOPED_TRACE(describe(shape, p, s));
        Tensor y = Tensor::empty(shape), d_x = Tensor::empty(shape);
        ops::dropout_forward(x, p, s.seed, s.stream, y);
        ops::dropout_backward(d_y, p, s.seed, s.stream, d_x);
        Tensor y_cuda = to_cuda(d_y), d_x_cuda = to_cuda(x);  // overwritten
        ops::dropout_forward(x_cuda, p, s.seed, s.stream, y_cuda);
        ops::dropout_backward(d_y_cuda, p, s.seed, s.stream, d_x_cuda);
        expect_bitwise(y_cuda.to_vector(), y.to_vector(), "dropout y");
        expect_bitwise(d_x_cuda.to_vector(), d_x.to_vector(), "dropout d_x");
      }
    }
  }
}

// The mask really is the CounterRng's (not merely the same as some CPU mistake): dropped where uniform(i) < p,
// and the drop rate is near p.
TEST(DropoutCuda, MaskIsTheCounterRngs) {
  SKIP_WITHOUT_GPU();
  const std::int64_t n = 100'003;
  const float p = 0.3f;
  const SeedStream s = kSeeds[1];
  const Tensor x = random_tensor({n}, 500);
  Tensor y = Tensor::empty({n}, DType::f32, Device::cuda);
  ops::dropout_forward(to_cuda(x), p, s.seed, s.stream, y);
  const std::vector<float> xs = x.to_vector(), ys = y.to_vector();
  const CounterRng rng(s.seed, s.stream);
  const float keep_scale = 1.0f / (1.0f - p);
  std::int64_t dropped = 0, wrong = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const bool drop = rng.uniform(static_cast<std::uint64_t>(i)) < p;
    dropped += drop;
    const float expected = drop ? 0.0f : xs[i] * keep_scale;
    if (std::bit_cast<std::uint32_t>(ys[i]) != std::bit_cast<std::uint32_t>(expected) && ++wrong <= 5)
      ADD_FAILURE() << "element " << i << ": cuda " << ys[i] << " vs " << expected;
  }
  EXPECT_EQ(wrong, 0);
  // Binomial(n, p): standard deviation ~145 drops, so 0.01 · n is ~7 sigma.
  EXPECT_NEAR(static_cast<double>(dropped) / n, p, 0.01);
}

// In place (y aliasing x, d_x aliasing d_y), including p = 0, which copies nothing then.
TEST(DropoutCuda, InPlaceBitwiseEqualCpu) {
  SKIP_WITHOUT_GPU();
  const Shape shape = {5, 1001};
  const Tensor x = random_tensor(shape, 600);
  for (float p : {0.0f, 0.25f}) {
    SCOPED_TRACE("p " + std::to_string(p));
    Tensor y = Tensor::empty(shape), d_x = Tensor::empty(shape);
    ops::dropout_forward(x, p, 77, 88, y);
    ops::dropout_backward(x, p, 77, 88, d_x);
    Tensor in_place = to_cuda(x);
    ops::dropout_forward(in_place, p, 77, 88, in_place);
    expect_bitwise(in_place.to_vector(), y.to_vector(), "y aliasing x");
    Tensor grad_in_place = to_cuda(x);
    ops::dropout_backward(grad_in_place, p, 77, 88, grad_in_place);
    expect_bitwise(grad_in_place.to_vector(), d_x.to_vector(), "d_x aliasing d_y");
  }
}

TEST(DropoutCuda, BitwiseRepeatable) {
  SKIP_WITHOUT_GPU();
  const Shape shape = {3'000'017};
  const Tensor x = to_cuda(random_tensor(shape, 700));
  Tensor first = Tensor::empty(shape, DType::f32, Device::cuda),
         second = Tensor::empty(shape, DType::f32, Device::cuda);
  ops::dropout_forward(x, 0.2f, 99, 5, first);
  ops::dropout_forward(x, 0.2f, 99, 5, second);
  expect_bitwise(second.to_vector(), first.to_vector(), "repeated dropout");
}

}  // namespace
}  // namespace proplab
