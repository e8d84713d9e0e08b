// bench_moments: throughput of probe::accumulate (all statistics) on the reference transformer's recorded
// tensors, with 1 and 2 threads.
//
//   bench_moments [--threads 1,2] [--repeats 30] [--step-repeats 5]
//
// Per shape ([8,128,256] and [8,128,1024], data hot in cache as when the recorder runs right after the op):
// median and best G elements/s over the repeats. Then one recorded step of the reference model (4 layers,
// width 256, ffn 1024, batch 8, seq 128: per layer 7 [8,128,256] and 2 [8,128,1024] tensors forward and the
// same backward, 72 tensors, 31.5 M elements), each in its own buffer and its own MomentSums, finalized:
// the time per step (the target is <= 5% of a 130 ms step, 6.5 ms), once with each tensor just written (in
// cache, as when the recorder runs right after the op) and once streamed from memory (126 MB, a pessimistic
// bound). On a shared machine other processes make OpenMP regions wait for a time slice: compare best times.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "core/rng.h"
#include "probe/moments.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Shape3 {
  std::int64_t sequences, tokens, features;
  std::int64_t numel() const { return sequences * tokens * features; }
};

std::vector<float> random_tensor(std::int64_t n, std::uint64_t stream) {
  const proplab::CounterRng rng(7, stream);
  std::vector<float> values(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) values[static_cast<std::size_t>(i)] = 0.3f + 1.7f * rng.normal(i);
  return values;
}

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

struct Timing {
  double median_s = 0.0, best_s = 0.0;
};

template <typename Body>
Timing time_repeats(int repeats, Body body) {
  body();  // warm-up: thread pool, scratch buffers, caches
  std::vector<double> seconds;
  for (int r = 0; r < repeats; ++r) {
    const auto start = Clock::now();
    body();
    seconds.push_back(seconds_since(start));
  }
  std::sort(seconds.begin(), seconds.end());
  return {seconds[seconds.size() / 2], seconds.front()};
}

}  // namespace

int main(int argc, char** argv) {
  using namespace proplab;
  CLI::App app{"probe::accumulate throughput (all statistics)"};
  std::vector<int> thread_counts{1, 2};
  int repeats = 30, step_repeats = 5;
  app.add_option("--threads", thread_counts, "thread counts to measure")->delimiter(',');
  app.add_option("--repeats", repeats, "timed repeats per shape (median and best reported)");
  app.add_option("--step-repeats", step_repeats, "timed repeats of the whole recorded step");
  CLI11_PARSE(app, argc, argv);

  const probe::StatSelection all = probe::StatSelection::all();
  volatile double sink = 0.0;  // keeps the results alive

  const std::vector<Shape3> shapes{{8, 128, 256}, {8, 128, 1024}};
  std::printf("%-16s %7s %12s %12s %12s\n", "shape", "threads", "median ms", "median G/s", "best G/s");
  for (const Shape3& shape : shapes) {
    const std::vector<float> x = random_tensor(shape.numel(), static_cast<std::uint64_t>(shape.features));
    for (int threads : thread_counts) {
      set_threads(threads);
      const Timing t = time_repeats(repeats, [&] {
        probe::MomentSums sums;
        probe::accumulate(x.data(), shape.sequences, shape.tokens, shape.features, sums, all);
        sink = sink + probe::finalize(sums).kurtosis;
      });
      const std::string name = "[" + std::to_string(shape.sequences) + "," + std::to_string(shape.tokens) + "," +
                               std::to_string(shape.features) + "]";
      std::printf("%-16s %7d %12.3f %12.2f %12.2f\n", name.c_str(), threads, t.median_s * 1e3,
                  shape.numel() / t.median_s / 1e9, shape.numel() / t.best_s / 1e9);
    }
  }

  // One recorded step of the reference model.
  std::vector<Shape3> step;
  for (int layer = 0; layer < 4; ++layer)
    for (int direction = 0; direction < 2; ++direction) {
      for (int i = 0; i < 7; ++i) step.push_back({8, 128, 256});
      for (int i = 0; i < 2; ++i) step.push_back({8, 128, 1024});
    }
  std::int64_t step_elements = 0;
  std::vector<std::vector<float>> sources, tensors;
  for (std::size_t i = 0; i < step.size(); ++i) {
    sources.push_back(random_tensor(step[i].numel(), 100 + i));
    tensors.push_back(std::vector<float>(sources.back().size()));
    step_elements += step[i].numel();
  }
  std::printf("\nrecorded step: %zu tensors, %.2f M elements, each in its own buffer and MomentSums\n", step.size(),
              step_elements / 1e6);
  for (int threads : thread_counts) {
    set_threads(threads);
    for (bool just_written : {true, false}) {
      // just written: each tensor is produced (copied from its source, untimed) right before it is summarised,
      // as the recorder sees it; otherwise it is streamed from memory.
      std::vector<double> seconds;
      for (int r = 0; r <= step_repeats; ++r) {
        double total = 0.0;
        for (std::size_t i = 0; i < step.size(); ++i) {
          if (just_written) std::copy(sources[i].begin(), sources[i].end(), tensors[i].begin());
          const auto start = Clock::now();
          probe::MomentSums sums;
          probe::accumulate(just_written ? tensors[i].data() : sources[i].data(), step[i].sequences, step[i].tokens,
                            step[i].features, sums, all);
          sink = sink + probe::finalize(sums).corr;
          total += seconds_since(start);
        }
        if (r > 0) seconds.push_back(total);  // the first pass warms up
      }
      std::sort(seconds.begin(), seconds.end());
      const double median = seconds[seconds.size() / 2];
      std::printf(
          "  threads %d, %-13s median %6.2f ms (best %6.2f ms) per step = %5.2f G elements/s; %4.1f%% of a "
          "130 ms step\n",
          threads, just_written ? "just written:" : "from memory:", median * 1e3, seconds.front() * 1e3,
          step_elements / median / 1e9, 100.0 * median / 0.130);
    }
  }
  return 0;
}
