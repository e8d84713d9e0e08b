// CUDA-vs-CPU comparison of the statistics an op gathers (ops::OpMoments) on a GPU, where it runs its kernel and sums
// the finished tensors (probe::accumulate on the device), against the CPU op, which sums them inside its loop: the
// activation forward and backward (d_x aliasing d_y, so the input must be summed before the kernel overwrites it),
// the residual combine and its ReLU form forward and backward, LayerNorm and RMSNorm forward. Skipped at run time
// when no GPU is present.
//
// Tolerance: the two devices' elements differ by a few float ulps (the approximations' contraction; the tests of
// each op), and their float64 sums by rounding; each finished statistic within 1e-5 of its natural scale (the rms
// for mean, rms and max_abs; the variance for var and chan_var; the mean square for chan_mean_sq; 1 for kurtosis
// and corr), the counts exactly.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "core/tensor.h"
#include "cuda_compare.h"
#include "ops/ops.h"
#include "probe/moments.h"
#include "support/gradcheck.h"

namespace proplab {
namespace {

using testing::random_tensor;

#define SKIP_WITHOUT_GPU() \
  if (!proplab::cuda_available()) GTEST_SKIP() << "no CUDA GPU: skipping CUDA-vs-CPU comparison"

constexpr std::int64_t kSequences = 4;
const Shape kShape{kSequences * 64, 256};

void expect_statistics_match(const probe::MomentSums& cuda, const probe::MomentSums& cpu, const std::string& what) {
  ASSERT_EQ(cuda.count, cpu.count) << what;
  EXPECT_EQ(cuda.sequences, cpu.sequences) << what;
  EXPECT_EQ(cuda.nonfinite, cpu.nonfinite) << what;
  const probe::Moments a = probe::finalize(cuda), b = probe::finalize(cpu);
  const double mean_square = b.rms * b.rms;
  const struct {
    probe::Stat stat;
    double scale;
  } checks[] = {{probe::Stat::mean, b.rms},
                {probe::Stat::var, b.var},
                {probe::Stat::rms, b.rms},
                {probe::Stat::max_abs, b.rms},
                {probe::Stat::kurtosis, 1.0},
                {probe::Stat::corr, 1.0},
                {probe::Stat::chan_mean_sq, mean_square},
                {probe::Stat::chan_var, b.var}};
  for (const auto& check : checks) {
    const double x = a.value(check.stat), y = b.value(check.stat);
    EXPECT_LE(std::abs(x - y), 1e-5 * check.scale)
        << what << " " << probe::stat_name(check.stat) << ": cuda " << x << " vs cpu " << y;
  }
}

// Runs `op(device, moments)` on the CPU inputs and on their GPU copies and compares the gathered statistics of the
// op's input (unless `output_only`) and output.
template <typename Op>
void compare(const std::string& what, Op op, bool output_only = false) {
  const probe::StatSelection all = probe::StatSelection::all();
  probe::MomentSums cpu_in, cpu_out, cuda_in, cuda_out;
  ops::OpMoments cpu{output_only ? nullptr : &cpu_in, all, &cpu_out, all, kSequences};
  ops::OpMoments cuda{output_only ? nullptr : &cuda_in, all, &cuda_out, all, kSequences};
  op(Device::cpu, cpu);
  op(Device::cuda, cuda);
  if (!output_only) expect_statistics_match(cuda_in, cpu_in, what + " input");
  expect_statistics_match(cuda_out, cpu_out, what + " output");
}

Tensor on(Device device, const Tensor& host) { return device == Device::cpu ? host.clone() : testing::to_cuda(host); }

TEST(GatheredMomentsCuda, ActivationMatchesCpu) {
  SKIP_WITHOUT_GPU();
  const Tensor x = random_tensor(kShape, 1), d_y = random_tensor(kShape, 2);
  for (Activation kind : {Activation::relu, Activation::gelu_tanh, Activation::tanh}) {
    const std::string name = activation_name(kind);
    compare(name + " forward", [&](Device device, ops::OpMoments& m) {
      Tensor y = Tensor::empty(kShape, DType::f32, device);
      ops::activation_forward(kind, on(device, x), y, &m);
    });
    compare(name + " backward, d_x aliasing d_y", [&](Device device, ops::OpMoments& m) {
      Tensor grad = on(device, d_y);
      ops::activation_backward(kind, on(device, x), grad, grad, &m);
    });
  }
}

TEST(GatheredMomentsCuda, ResidualMatchesCpu) {
  SKIP_WITHOUT_GPU();
  const Tensor x = random_tensor(kShape, 3), f = random_tensor(kShape, 4), d_y = random_tensor(kShape, 5);
  compare("residual forward", [&](Device device, ops::OpMoments& m) {
    Tensor y = Tensor::empty(kShape, DType::f32, device);
    ops::residual_forward(on(device, x), on(device, f), 0.8f, 0.6f, y, &m);
  });
  compare("residual backward, d_x aliasing d_y", [&](Device device, ops::OpMoments& m) {
    Tensor grad = on(device, d_y), d_f = Tensor::empty(kShape, DType::f32, device);
    ops::residual_backward(on(device, x), on(device, f), grad, 0.8f, 0.6f, &grad, &d_f, nullptr, nullptr, &m);
  });
  compare("residual relu forward", [&](Device device, ops::OpMoments& m) {
    Tensor y = Tensor::empty(kShape, DType::f32, device);
    ops::residual_relu_forward(on(device, x), on(device, f), 0.8f, 0.6f, y, &m);
  });
  compare("residual relu backward", [&](Device device, ops::OpMoments& m) {
    const Tensor xs = on(device, x), fs = on(device, f);
    Tensor y = Tensor::empty(kShape, DType::f32, device);
    ops::residual_relu_forward(xs, fs, 0.8f, 0.6f, y);
    Tensor grad = on(device, d_y), d_x = Tensor::empty(kShape, DType::f32, device);
    Tensor d_f = Tensor::empty(kShape, DType::f32, device);
    ops::residual_relu_backward(xs, fs, y, grad, 0.8f, 0.6f, &d_x, &d_f, nullptr, nullptr, &m);
  });
}

TEST(GatheredMomentsCuda, NormsMatchCpu) {
  SKIP_WITHOUT_GPU();
  const Tensor x = random_tensor(kShape, 6, 1.5, 0.3), gain = random_tensor({kShape[1]}, 7, 0.2, 1.0);
  compare(
      "layernorm forward",
      [&](Device device, ops::OpMoments& m) {
        Tensor y = Tensor::empty(kShape, DType::f32, device), mean = Tensor::empty({kShape[0]}, DType::f32, device);
        Tensor rstd = Tensor::empty({kShape[0]}, DType::f32, device);
        ops::layernorm_forward(on(device, x), nullptr, nullptr, 1e-5f, y, mean, rstd, &m);
      },
      true);
  compare(
      "rmsnorm forward",
      [&](Device device, ops::OpMoments& m) {
        const Tensor g = on(device, gain);
        Tensor y = Tensor::empty(kShape, DType::f32, device), rstd = Tensor::empty({kShape[0]}, DType::f32, device);
        ops::rmsnorm_forward(on(device, x), &g, 1e-5f, y, rstd, &m);
      },
      true);
}

}  // namespace
}  // namespace proplab
