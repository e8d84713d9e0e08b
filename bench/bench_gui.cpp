// bench_gui: proplab-gui's frame time with a folder of many big runs (issue 5's target: 200 runs of 100 records
// × 400 probes under 16 ms per frame).
//
//   bench_gui [--dir DIR] [--runs 200] [--records 100] [--layers 100] [--frames 60] [--size 1600x1000]
//
// Writes the runs once (synthetic, through the real RunWriter: 4·layers + 2 probes, forward var and rms,
// backward var) unless DIR already holds them, opens DIR through the RunLibrary (worker-thread loading: the time
// until every run is read is printed), then renders the full UI headless (EGL) and times frames: building the UI
// (draw_frame, ImGui layout and tessellation, i.e. the frame thread's own work) and rendering it (OpenGL until
// glFinish; on CI this is Mesa's llvmpipe, a software rasteriser on the same 2 cores). Scenarios: each view with
// the default selection (8 runs), the depth view playing through records, and the depth and compare views with
// every run selected. Median, 95th percentile and worst frame of each.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "gui/app/app_state.h"
#include "gui/app/headless.h"
#include "gui/data/synthetic_run.h"

namespace {

using namespace proplab::gui;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

double percentile(std::vector<double> values, double p) {
  std::sort(values.begin(), values.end());
  const std::size_t index =
      std::min(values.size() - 1, static_cast<std::size_t>(p * static_cast<double>(values.size())));
  return values[index];
}

void write_runs(const fs::path& dir, int runs, std::int64_t records, std::int64_t layers) {
  const char* rules[] = {"standard", "deepscalelm", "deepnorm", "xavier"};
  const auto start = Clock::now();
  for (int i = 0; i < runs; ++i) {
    SyntheticRunSpec spec;
    spec.name = "run_" + std::to_string(i);
    spec.rule = rules[i % 4];
    spec.norm = i % 8 < 4 ? "pre" : "post";
    spec.layers = layers;
    spec.records = records;
    spec.steps_per_record = 1;
    spec.depth_slope = 0.01 * (1 + i % 17);
    spec.forward_scale = 0.5 + 0.01 * i;
    spec.write_through = false;
    write_synthetic_run(dir / spec.rule / (spec.name + ".h5"), spec);
  }
  std::printf("wrote %d runs (%lld records x %lld probes) in %.1f s\n", runs, static_cast<long long>(records),
              static_cast<long long>(4 * layers + 2), seconds_since(start));
}

struct Scenario {
  std::string name;
  View view;
  bool select_all;
  bool playing;
  bool theory = true;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_gui: proplab-gui frame time with many big runs"};
  std::string dir = (fs::temp_directory_path() / "proplab_bench_gui").string();
  int runs = 200, frames = 60;
  std::int64_t records = 100, layers = 100;
  std::string size = "1600x1000";
  app.add_option("--dir", dir, "folder of runs (written when it holds fewer than --runs files)");
  app.add_option("--runs", runs);
  app.add_option("--records", records);
  app.add_option("--layers", layers, "4*layers+2 probes per run");
  app.add_option("--frames", frames, "timed frames per scenario");
  app.add_option("--size", size, "WIDTHxHEIGHT");
  CLI11_PARSE(app, argc, argv);
  int width = 1600, height = 1000;
  if (std::sscanf(size.c_str(), "%dx%d", &width, &height) != 2) {
    std::fprintf(stderr, "bench_gui: --size %s: expected WIDTHxHEIGHT\n", size.c_str());
    return 2;
  }

  std::vector<std::string> problems;
  if (!fs::exists(dir) || discover_run_files({dir}, problems).size() < static_cast<std::size_t>(runs)) {
    fs::remove_all(dir);
    write_runs(dir, runs, records, layers);
  }

  HeadlessRenderer renderer(width, height);
  std::printf("renderer: %s, %dx%d\n", renderer.description().c_str(), width, height);
  AppState state;
  const auto load_start = Clock::now();
  state.library = std::make_unique<RunLibrary>(std::vector<fs::path>{dir});
  // Frames are drawn while the worker loads, as in the app: the frame time must not depend on loading.
  std::vector<double> loading_frames;
  while (!state.library_state.initial_scan_done) {
    loading_frames.push_back(renderer.render_frame(state).build_s);
  }
  const double load_s = seconds_since(load_start);
  std::printf(
      "loaded %zu runs in %.2f s on the worker; %zu frames drawn meanwhile, build median %.2f ms, worst %.2f ms\n",
      state.library_state.runs.size(), load_s, loading_frames.size(), 1e3 * percentile(loading_frames, 0.5),
      1e3 * percentile(loading_frames, 1.0));

  const std::vector<Scenario> scenarios = {
      {"depth, 8 runs", View::depth, false, false},
      {"depth, 8 runs, playing", View::depth, false, true},
      {"dynamics, 8 runs", View::dynamics, false, false},
      {"heatmap, 1 run", View::heatmap, false, false},
      {"compare, 8 runs", View::compare, false, false},
      {"depth, all runs", View::depth, true, false},
      {"depth, all runs, no theory", View::depth, true, false, false},
      {"compare, all runs", View::compare, true, false},
  };
  const std::vector<fs::path> default_selection = state.selection;
  std::printf("\n%-28s %9s %9s %9s   %9s %9s\n", "scenario", "build p50", "p95", "worst", "total p50", "p95");
  for (const auto& scenario : scenarios) {
    state.view = scenario.view;
    state.playing = scenario.playing;
    state.show_theory = scenario.theory;
    state.selection = default_selection;
    if (scenario.select_all) {
      state.selection.clear();
      for (const auto& run : state.library_state.runs) state.selection.push_back(run->path);
    }
    sync_selection(state);
    for (int i = 0; i < 5; ++i) renderer.render_frame(state);
    std::vector<double> build, total;
    for (int i = 0; i < frames; ++i) {
      const auto time = renderer.render_frame(state);
      build.push_back(time.build_s);
      total.push_back(time.total_s());
    }
    std::printf("%-28s %7.2f ms %6.2f ms %6.2f ms   %7.2f ms %6.2f ms\n", scenario.name.c_str(),
                1e3 * percentile(build, 0.5), 1e3 * percentile(build, 0.95), 1e3 * percentile(build, 1.0),
                1e3 * percentile(total, 0.5), 1e3 * percentile(total, 0.95));
  }
  return 0;
}
