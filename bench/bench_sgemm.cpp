// bench_sgemm: sgemm GFLOP/s at the reference transformer's matrix shapes (see sgemm_rate.h), per shape and as
// the FLOP-weighted rate of one training step, for each requested thread count, through proplab's ops::sgemm
// (fixed pieces on the OpenMP pool, bitwise the same for any thread count) and through OpenBLAS's own threads.
//
//   bench_sgemm [--threads 1,2] [--repeats 15] [--no-attention] [--json]
//
// A shape whose spot check against a double-precision reference fails (relative error > 1e-4) makes the run
// exit with status 1: the numbers would be for the wrong product.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <vector>

#include "sgemm_rate.h"

namespace {

constexpr double kMaxRelError = 1e-4;

const char* group_name(proplab::bench::SgemmGroup group) {
  return group == proplab::bench::SgemmGroup::linear ? "linear" : "attention";
}

void print_table(const proplab::bench::SgemmStepRate& step) {
  std::printf("%d threads, %s\n", step.threads, proplab::bench::gemm_path_name(step.path));
  std::printf("  %-22s %5s %5s %5s %3s %3s %4s %9s %10s %9s\n", "shape", "M", "N", "K", "tA", "tB", "beta", "per_step",
              "us/call", "GFLOP/s");
  for (const auto& rate : step.rates) {
    const auto& s = rate.shape;
    std::printf("  %-22s %5d %5d %5d %3s %3s %4.0f %9lld %10.1f %9.1f\n", s.name.c_str(), s.m, s.n, s.k,
                s.trans_a ? "T" : "N", s.trans_b ? "T" : "N", s.beta, static_cast<long long>(s.per_step),
                rate.seconds * 1e6, rate.gflops);
  }
  std::printf("  step: %.2f GFLOP in %.2f ms of sgemm -> %.1f GFLOP/s (linear %.1f, attention %.1f)\n",
              step.step_flops / 1e9, step.step_seconds * 1e3, step.step_gflops,
              step.group_gflops(proplab::bench::SgemmGroup::linear),
              step.group_gflops(proplab::bench::SgemmGroup::attention));
  std::printf("  other processes kept %.2f cores busy meanwhile%s\n", step.other_load_cores,
              step.other_load_cores > 0.05 ? " (shared machine: rates are low and noisy)" : "");
}

void print_json(const std::vector<proplab::bench::SgemmStepRate>& steps) {
  std::printf("[\n");
  for (std::size_t t = 0; t < steps.size(); ++t) {
    const auto& step = steps[t];
    std::printf(
        "  {\"threads\": %d, \"path\": \"%s\", \"step_gflop\": %.6f, \"step_ms\": %.6f, \"step_gflops\": %.3f, "
        "\"linear_gflops\": %.3f, \"attention_gflops\": %.3f, \"other_load_cores\": %.3f, \"shapes\": [\n",
        step.threads, step.path == proplab::bench::GemmPath::proplab ? "proplab" : "openblas_threads",
        step.step_flops / 1e9, step.step_seconds * 1e3, step.step_gflops,
        step.group_gflops(proplab::bench::SgemmGroup::linear), step.group_gflops(proplab::bench::SgemmGroup::attention),
        step.other_load_cores);
    for (std::size_t i = 0; i < step.rates.size(); ++i) {
      const auto& rate = step.rates[i];
      const auto& s = rate.shape;
      std::printf(
          "    {\"name\": \"%s\", \"group\": \"%s\", \"m\": %d, \"n\": %d, \"k\": %d, \"trans_a\": %s, "
          "\"trans_b\": %s, \"beta\": %.0f, \"per_step\": %lld, \"us_per_call\": %.3f, \"gflops\": %.3f}%s\n",
          s.name.c_str(), group_name(s.group), s.m, s.n, s.k, s.trans_a ? "true" : "false",
          s.trans_b ? "true" : "false", s.beta, static_cast<long long>(s.per_step), rate.seconds * 1e6, rate.gflops,
          i + 1 < step.rates.size() ? "," : "");
    }
    std::printf("  ]}%s\n", t + 1 < steps.size() ? "," : "");
  }
  std::printf("]\n");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"sgemm GFLOP/s at the reference transformer's shapes (4 layers, width 256, batch 8 x 128)"};
  std::vector<int> thread_counts{1, 2};
  int repeats = 15;
  bool no_attention = false;
  bool json = false;
  app.add_option("--threads", thread_counts, "thread counts to measure, comma separated")
      ->delimiter(',')
      ->check(CLI::Range(1, 1024));
  app.add_option("--repeats", repeats, "timed samples per shape (the median is reported)")
      ->check(CLI::Range(1, 100000));
  app.add_flag("--no-attention", no_attention, "only the Linear (and LM head) sgemms, not the attention ones");
  app.add_flag("--json", json, "print JSON instead of tables");
  CLI11_PARSE(app, argc, argv);

  const proplab::bench::SgemmModelDims dims;
  const auto shapes = proplab::bench::step_sgemm_shapes(dims, !no_attention);
  std::vector<proplab::bench::SgemmStepRate> steps;
  bool wrong = false;
  for (int threads : thread_counts) for (const auto path : {proplab::bench::GemmPath::proplab,
                                                             proplab::bench::GemmPath::openblas_threads}) {
    steps.push_back(proplab::bench::measure_sgemm_rates(shapes, threads, repeats, 2e-3, path));
    for (const auto& rate : steps.back().rates) {
      if (rate.max_rel_error > kMaxRelError) {
        std::fprintf(stderr, "bench_sgemm: %s gives relative error %.3g (> %.0e) against the reference\n",
                     rate.shape.name.c_str(), rate.max_rel_error, kMaxRelError);
        wrong = true;
      }
    }
    if (!json) print_table(steps.back());
  }
  if (json) print_json(steps);
  return wrong ? 1 : 0;
}
