// bench_dist: per-step time and bytes communicated by data parallelism on the reference model (transformer,
// 4 layers, width 256, 4 heads, seq 128, batch 8, vocab 256, fp32 AdamW), against the formula in
// docs/distributed.md.
//
//   bench_dist [--steps N] [--threads N] [--set key=value ...]            one process
//   mpirun -np 2 bench_dist --set parallel.dp=2 [--set parallel.zero=1]   data parallel
//
// Runs the study twice, for N/3 and N steps (records only at the first and last step of each), and takes the
// bytes per step from the difference between the two runs, so the recorded steps' extra traffic cancels out.
// ms/step is the median over the longer run's unrecorded steps (rank 0's run file).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "dist/communicator.h"
#include "io/run_reader.h"
#include "models/model.h"
#include "study/run_spec.h"
#include "study/study.h"
#include "train/trainer.h"

namespace {

using namespace proplab;

const char* kStudy = R"(name = "bench_dist"
seed = 1
[model]
type = "transformer"
layers = 4
width = 256
heads = 4
vocab = 256
seq_len = 128
[data]
kind = "markov"
[train]
batch = 8
lr = 1e-3
eval_every = 0
eval_batches = 1
)";

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("bench_dist: data-parallel step time and bytes per step on the reference model");
  std::int64_t steps = 12;
  int threads = 0;
  std::vector<std::string> settings;
  std::string out = "bench_dist_runs";
  app.add_option("--steps", steps, "steps of the longer run (the shorter has a third)")->check(CLI::Range(6, 100000));
  app.add_option("--threads", threads, "threads per process (0: all cores)");
  app.add_option("--set", settings, "study overrides, e.g. parallel.dp=2");
  app.add_option("--out", out, "folder for the run files");
  CLI11_PARSE(app, argc, argv);
  try {
    std::vector<std::string> overrides = settings;
    overrides.push_back("device.threads=" + std::to_string(threads));
    overrides.push_back("record.every=1000000");
    const Study base = parse_study(kStudy, "bench_dist", ".", overrides);
    std::optional<dist::ProcessGroups> groups;
    RunOptions options;
    if (dist::launched_by_mpi()) {
      groups.emplace(dist::make_process_groups(dist::make_mpi_world(base.parallel.timeout_s),
                                               dist::Layout{base.parallel.dp, base.parallel.tp, base.parallel.pp}));
      if (groups->world->size() > 1) options.data_parallel = groups->data.get();
    }
    const bool root = !groups || groups->world->rank() == 0;
    dist::Communicator* group = options.data_parallel;
    options.out_dir = std::filesystem::path(out) / (base.parallel.dp_mode + "-dp" + std::to_string(base.parallel.dp) +
                                                    "-zero" + std::to_string(base.parallel.zero));
    options.force = true;
    std::int64_t counted[2][dist::kTrafficKinds] = {};
    const std::int64_t lengths[2] = {steps / 3, steps};
    std::vector<double> seconds;
    for (int run = 0; run < 2; ++run) {
      std::vector<std::string> run_overrides = overrides;
      run_overrides.push_back("train.steps=" + std::to_string(lengths[run]));
      const Study study = parse_study(kStudy, "bench_dist", ".", run_overrides);
      std::int64_t before[dist::kTrafficKinds] = {};
      for (int k = 0; k < dist::kTrafficKinds; ++k)
        before[k] = group ? group->bytes_communicated(static_cast<dist::Traffic>(k)) : 0;
      const RunSummary summary = run_training(to_run_spec(study), options);
      if (summary.status != RunStatus::completed) throw UserError("bench_dist: the run ended " + summary.detail);
      for (int k = 0; k < dist::kTrafficKinds; ++k)
        counted[run][k] = (group ? group->bytes_communicated(static_cast<dist::Traffic>(k)) : 0) - before[k];
      if (root && run == 1) {
        const RunReader reader = RunReader::open(summary.run_file);
        const TrainCurves train = reader.read_train();
        for (std::size_t i = 2; i + 1 < train.size(); ++i)  // unrecorded steps (0 and the last are recorded)
          seconds.push_back(train.wall_time[i] - train.wall_time[i - 1]);
      }
    }
    if (!root) return 0;
    const int dp = base.parallel.dp;
    std::printf("bench_dist: reference transformer, dp=%d dp_mode=%s zero=%d bucket_mb=%g threads=%d\n", dp,
                base.parallel.dp_mode.c_str(), base.parallel.zero, base.parallel.bucket_mb, threads);
    std::printf("  ms/step (median of %zu unrecorded steps): %.1f\n", seconds.size(), 1e3 * median(seconds));
    std::int64_t total = 0;
    for (int k = 0; k < dist::kTrafficKinds; ++k) {
      const double per_step =
          static_cast<double>(counted[1][k] - counted[0][k]) / static_cast<double>(steps - steps / 3);
      total += counted[1][k] - counted[0][k];
      if (per_step != 0.0)
        std::printf("  %-15s %14.0f bytes/step\n", dist::traffic_name(static_cast<dist::Traffic>(k)), per_step);
    }
    // The formula of docs/distributed.md: N parameters, c = ceil(N / dp); 16 bytes of loss and stop flag (zero = 1:
    // 8 more, the gradient norm).
    const RunSpec spec = to_run_spec(base);
    const double n = static_cast<double>(make_model(spec.model, spec.scaling, spec.seed)->params().count_elements());
    const double c = std::ceil(n / dp);
    double expected = 0.0;
    if (dp > 1) {
      if (base.parallel.zero == 1)
        expected = 4.0 * dp * c + 4.0 * c + 24.0;  // + the gradient norm's double
      else if (base.parallel.dp_mode == "local_sgd")
        expected = 4.0 * n / base.parallel.sync_every + 16.0;
      else if (base.parallel.dp_mode == "gossip")
        expected = 4.0 * n * (dp == 2 ? 1 : 2) + 16.0;
      else
        expected = 4.0 * n + 16.0;
    }
    std::printf("  total           %14.0f bytes/step (rank 0); formula %.0f (N = %.0f parameters)\n",
                static_cast<double>(total) / static_cast<double>(steps - steps / 3), expected, n);
  } catch (const std::exception& e) {
    std::cerr << "bench_dist: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
