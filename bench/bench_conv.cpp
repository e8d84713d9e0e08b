// bench_conv: the image ops of a ResNet-20 step at their own shapes (Fashion-MNIST-shaped input, batch 128):
// conv2d forward / backward (with d_x), batchnorm + ReLU forward / backward (as two ops and fused, alternately),
// a post-activation block's end (batchnorm, the residual sum and ReLU: two ops and fused, alternately),
// each timed alone (median of --reps calls), and the sum over one step's calls. Shows where a ResNet step's time goes
// without a profiler. Besides wall time it reports the process's CPU time per call (all threads, getrusage), which
// other load on shared cores disturbs much less: compare builds by it.
//
// --kernels instead times each conv under the three CPU kernel settings (ops::ConvKernel: winograd, direct and
// im2col), call by call alternately so machine noise hits them alike, and prints the step totals' ratios.
//
//   bench_conv [--reps N] [--threads N] [--batch N] [--kernels]
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "core/rng.h"
#include "ops/ops.h"

namespace {

using namespace proplab;

double cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
}

// Median wall ms and median CPU ms (all threads) over `reps` calls after one untimed call.
struct Timing {
  double wall = 0.0, cpu = 0.0;
};

Timing median_ms(int reps, const std::function<void()>& call) {
  call();
  std::vector<double> wall, cpu;
  for (int r = 0; r < reps; ++r) {
    const double cpu_start = cpu_seconds();
    const auto start = std::chrono::steady_clock::now();
    call();
    wall.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    cpu.push_back(1e3 * (cpu_seconds() - cpu_start));
  }
  std::sort(wall.begin(), wall.end());
  std::sort(cpu.begin(), cpu.end());
  return {wall[wall.size() / 2], cpu[cpu.size() / 2]};
}

// Median wall ms of one call under each conv kernel, timed alternately (a, b, c, a, b, c, ...) after one untimed
// call under each.
std::vector<double> median_each(int reps, const std::function<void()>& call,
                                const std::vector<ops::ConvKernel>& kernels) {
  std::vector<std::vector<double>> times(kernels.size());
  for (int r = -1; r < reps; ++r)
    for (std::size_t k = 0; k < kernels.size(); ++k) {
      ops::set_conv_kernel(kernels[k]);
      const auto start = std::chrono::steady_clock::now();
      call();
      if (r >= 0)
        times[k].push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    }
  std::vector<double> medians;
  for (auto& t : times) {
    std::sort(t.begin(), t.end());
    medians.push_back(t[t.size() / 2]);
  }
  ops::set_conv_kernel(ops::ConvKernel::winograd);
  return medians;
}

Tensor random(const Shape& shape, std::uint64_t stream) {
  Tensor t = Tensor::empty(shape);
  const CounterRng rng(7, stream);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = rng.normal(static_cast<std::uint64_t>(i));
  return t;
}

struct ConvCase {
  std::int64_t c_in, c_out, size;
  int kernel, stride;
  int per_step;  // calls of this shape in one ResNet-20 step
};

// One case's operands (random, from consecutive streams) and outputs, and its name "c_in>c_out, size, k/s".
struct ConvTensors {
  ConvTensors(const ConvCase& c, int batch, std::uint64_t& stream)
      : params{c.stride, c.kernel / 2, 1},
        out_size(ops::conv2d_out_size(c.size, c.kernel, c.stride, c.kernel / 2)),
        x(random({batch, c.c_in, c.size, c.size}, stream++)),
        w(random({c.c_out, c.c_in, c.kernel, c.kernel}, stream++)),
        y(Tensor::empty({batch, c.c_out, out_size, out_size})),
        d_y(random(y.shape(), stream++)),
        d_x(Tensor::empty(x.shape())),
        d_w(Tensor::zeros(w.shape())),
        first(c.c_in == 1),
        name(std::to_string(c.c_in) + ">" + std::to_string(c.c_out) + ", " + std::to_string(c.size) + ", " +
             std::to_string(c.kernel) + "/" + std::to_string(c.stride)) {}
  void forward() { ops::conv2d_forward(x, w, nullptr, params, y); }
  void backward() { ops::conv2d_backward(x, w, d_y, params, first ? nullptr : &d_x, d_w, nullptr); }
  void weight_grad() { ops::conv2d_backward(x, w, d_y, params, nullptr, d_w, nullptr); }

  ops::Conv2dParams params;
  std::int64_t out_size;
  Tensor x, w, y, d_y, d_x, d_w;
  bool first;  // the stem: no d_x
  std::string name;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ResNet-20 image ops at their own shapes"};
  int reps = 5, threads_arg = 0, batch = 128;
  app.add_option("--reps", reps, "timed calls per op (median)")->check(CLI::PositiveNumber);
  app.add_option("--threads", threads_arg, "threads (0: all cores)")->check(CLI::NonNegativeNumber);
  app.add_option("--batch", batch, "images")->check(CLI::PositiveNumber);
  bool compare_kernels = false;
  app.add_flag("--kernels", compare_kernels,
               "time each conv under the winograd, direct and im2col kernels, alternately");
  CLI11_PARSE(app, argc, argv);
  set_threads(threads_arg);

  const std::vector<ConvCase> cases = {
      {1, 16, 28, 3, 1, 1},  {16, 16, 28, 3, 1, 6}, {16, 32, 28, 3, 2, 1}, {16, 32, 28, 1, 2, 1},
      {32, 32, 14, 3, 1, 5}, {32, 64, 14, 3, 2, 1}, {32, 64, 14, 1, 2, 1}, {64, 64, 7, 3, 1, 5},
  };
  std::printf("bench_conv: batch %d, %d threads, median of %d calls\n", batch, threads(), reps);
  if (compare_kernels) {
    const std::vector<ops::ConvKernel> kernels = {ops::ConvKernel::winograd, ops::ConvKernel::direct,
                                                  ops::ConvKernel::im2col};
    std::printf("%-26s %28s %28s %28s %7s\n", "conv (c_in>c_out, size, k/s)", "fwd ms winograd/direct/im2col",
                "bwd ms winograd/direct/im2col", "of which d_weight", "x step");
    double totals[3] = {0.0, 0.0, 0.0};
    std::uint64_t stream = 0;
    for (const ConvCase& c : cases) {
      ConvTensors t(c, batch, stream);
      const auto forward = median_each(
          reps, [&] { t.forward(); }, kernels);
      const auto backward = median_each(
          reps, [&] { t.backward(); }, kernels);
      const auto weight_grad = median_each(
          reps, [&] { t.weight_grad(); }, kernels);
      std::printf("%-26s %8.2f / %6.2f / %6.2f   %8.2f / %6.2f / %6.2f   %8.2f / %6.2f / %6.2f   %7d\n", t.name.c_str(),
                  forward[0], forward[1], forward[2], backward[0], backward[1], backward[2], weight_grad[0],
                  weight_grad[1], weight_grad[2], c.per_step);
      for (int k = 0; k < 3; ++k) totals[k] += c.per_step * (forward[k] + backward[k]);
    }
    std::printf("convs in one step: winograd %.1f ms, direct %.1f ms (%.2fx), im2col %.1f ms (%.2fx)\n", totals[0],
                totals[1], totals[1] / totals[0], totals[2], totals[2] / totals[0]);
    return 0;
  }
  std::printf("%-26s %16s %16s %10s %7s\n", "conv (c_in>c_out, size, k/s)", "fwd ms (cpu)", "bwd ms (cpu)", "GFLOP/s",
              "x step");
  double conv_total = 0.0, conv_cpu = 0.0, flops_total = 0.0;
  std::uint64_t stream = 0;
  for (const ConvCase& c : cases) {
    ConvTensors t(c, batch, stream);
    const Timing forward = median_ms(reps, [&] { t.forward(); });
    const bool first = t.first;
    const std::int64_t out_size = t.out_size;
    const Timing backward = median_ms(reps, [&] { t.backward(); });
    const double flops = 2.0 *
                         static_cast<double>(batch * c.c_in * c.kernel * c.kernel * c.c_out * out_size * out_size) *
                         (first ? 2.0 : 3.0);
    const std::string& name = t.name;
    std::printf("%-26s %7.2f (%6.2f) %7.2f (%6.2f) %10.1f %7d\n", name.c_str(), forward.wall, forward.cpu,
                backward.wall, backward.cpu, flops / ((forward.wall + backward.wall) / 1e3) / 1e9, c.per_step);
    conv_total += c.per_step * (forward.wall + backward.wall);
    conv_cpu += c.per_step * (forward.cpu + backward.cpu);
    flops_total += c.per_step * flops;
  }
  std::printf("convs in one step: %.1f ms (%.1f GFLOP/s), %.1f ms CPU time\n", conv_total,
              flops_total / (conv_total / 1e3) / 1e9, conv_cpu);

  // BatchNorm (+ ReLU) at each activation shape, training mode; per step: 7 / 6 / 6 of them (+ shortcuts).
  struct NormCase {
    std::int64_t channels, size;
    int per_step;
  };
  double norm_total = 0.0, fused_total = 0.0;
  for (const NormCase& n : std::vector<NormCase>{{16, 28, 7}, {32, 14, 7}, {64, 7, 7}}) {
    Tensor x = random({batch, n.channels, n.size, n.size}, stream++);
    Tensor y = Tensor::empty(x.shape()), act = Tensor::empty(x.shape()), d = random(x.shape(), stream++);
    Tensor d_x = Tensor::empty(x.shape());
    Tensor gamma = Tensor::zeros({n.channels}), beta = Tensor::zeros({n.channels});
    Tensor running_mean = Tensor::zeros({n.channels}), running_var = Tensor::zeros({n.channels});
    gamma.fill(1.0f);
    running_var.fill(1.0f);
    Tensor mean = Tensor::empty({n.channels}), rstd = Tensor::empty({n.channels});
    Tensor d_gamma = Tensor::zeros({n.channels}), d_beta = Tensor::zeros({n.channels});
    // The two ops, then the fused op (ops::batchnorm_relu_*), call by call alternately.
    const std::function<void()> calls[4] = {
        [&] {
          ops::batchnorm_forward(x, &gamma, &beta, 1e-5f, true, 0.1f, running_mean, running_var, y, mean, rstd);
          ops::activation_forward(Activation::relu, y, act);
        },
        [&] {
          ops::batchnorm_relu_forward(x, &gamma, &beta, 1e-5f, true, 0.1f, running_mean, running_var, act, mean, rstd);
        },
        [&] {
          ops::activation_backward(Activation::relu, y, d, d_x);
          ops::batchnorm_backward(x, &gamma, mean, rstd, d_x, true, d_x, &d_gamma, &d_beta);
        },
        [&] { ops::batchnorm_relu_backward(x, &gamma, mean, rstd, act, d, true, d_x, &d_gamma, &d_beta); }};
    std::vector<double> wall[4];
    for (int r = -1; r < reps; ++r)
      for (int k = 0; k < 4; ++k) {
        const auto start = std::chrono::steady_clock::now();
        calls[k]();
        if (r >= 0)
          wall[k].push_back(
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
      }
    double ms[4];
    for (int k = 0; k < 4; ++k) {
      std::sort(wall[k].begin(), wall[k].end());
      ms[k] = wall[k][wall[k].size() / 2];
    }
    std::printf(
        "batchnorm+relu %2lld channels, %2lld px: fwd %.2f ms (fused %.2f, %.2fx), bwd %.2f ms (fused %.2f, %.2fx), x "
        "%d "
        "per step\n",
        static_cast<long long>(n.channels), static_cast<long long>(n.size), ms[0], ms[1], ms[0] / ms[1], ms[2], ms[3],
        ms[2] / ms[3], n.per_step);
    norm_total += n.per_step * (ms[0] + ms[2]);
    fused_total += n.per_step * (ms[1] + ms[3]);
  }
  std::printf("batchnorm+relu in one step: %.1f ms as two ops, %.1f ms fused (%.2fx)\n", norm_total, fused_total,
              norm_total / fused_total);

  // A post-activation block's end: BatchNorm, then the residual sum and ReLU, as two ops and fused
  // (ops::batchnorm_residual_relu_forward), alternately; per step: 3 blocks at each shape.
  double end_total = 0.0, end_fused = 0.0;
  for (const NormCase& n : std::vector<NormCase>{{16, 28, 3}, {32, 14, 3}, {64, 7, 3}}) {
    Tensor x = random({batch, n.channels, n.size, n.size}, stream++), shortcut = random(x.shape(), stream++);
    Tensor branch = Tensor::empty(x.shape()), out = Tensor::empty(x.shape());
    Tensor gamma = Tensor::zeros({n.channels}), beta = Tensor::zeros({n.channels});
    Tensor running_mean = Tensor::zeros({n.channels}), running_var = Tensor::zeros({n.channels});
    gamma.fill(1.0f);
    running_var.fill(1.0f);
    Tensor mean = Tensor::empty({n.channels}), rstd = Tensor::empty({n.channels});
    const std::function<void()> calls[2] = {
        [&] {
          ops::batchnorm_forward(x, &gamma, &beta, 1e-5f, true, 0.1f, running_mean, running_var, branch, mean, rstd);
          ops::residual_relu_forward(shortcut, branch, 1.0f, 1.0f, out);
        },
        [&] {
          ops::batchnorm_residual_relu_forward(x, &gamma, &beta, 1e-5f, true, 0.1f, running_mean, running_var, shortcut,
                                               1.0f, 1.0f, out, mean, rstd);
        }};
    std::vector<double> wall[2];
    for (int r = -1; r < reps; ++r)
      for (int k = 0; k < 2; ++k) {
        const auto start = std::chrono::steady_clock::now();
        calls[k]();
        if (r >= 0)
          wall[k].push_back(
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
      }
    for (auto& w : wall) std::sort(w.begin(), w.end());
    const double two = wall[0][wall[0].size() / 2], fused = wall[1][wall[1].size() / 2];
    std::printf("batchnorm+residual+relu %2lld channels, %2lld px: fwd %.2f ms (fused %.2f, %.2fx), x %d per step\n",
                static_cast<long long>(n.channels), static_cast<long long>(n.size), two, fused, two / fused,
                n.per_step);
    end_total += n.per_step * two;
    end_fused += n.per_step * fused;
  }
  std::printf("block ends in one step: %.1f ms as two ops, %.1f ms fused (%.2fx)\n", end_total, end_fused,
              end_total / end_fused);
  return 0;
}
