// bench_dist: per-step time and bytes communicated by data, tensor and pipeline parallelism on the reference model
// (transformer, 4 layers, width 256, 4 heads, seq 128, batch 8, vocab 256, fp32 AdamW), against the formulas in
// docs/distributed.md.
//
//   bench_dist [--steps N] [--threads N] [--set key=value ...]            one process
//   mpirun -np 2 bench_dist --set parallel.dp=2 [--set parallel.zero=1]   data parallel
//   mpirun -np 2 bench_dist --set parallel.tp=2                           tensor parallel
//   mpirun -np 2 bench_dist --set parallel.pp=2 --set parallel.microbatches=4   pipeline parallel
//   mpirun -np 2 bench_dist --set parallel.sp=2                           sequence parallel
//
// Runs the study twice, for N/3 and N steps (records only at the first and last step of each), and takes the
// bytes per step from the difference between the two runs, so the recorded steps' extra traffic, the final
// evaluation and the final checkpoint cancel out. Bytes are the payload every communicator of the layout (data,
// tensor, pipeline groups, sequence rings and the gradient groups of dp·sp ranks) counted, on rank 0 and summed over
// all ranks. ms/step is the median over the longer run's unrecorded steps (rank 0's run file). With --reference-ms T1
// (the one-process ms/step at one thread) it also prints the parallel efficiency T1 / (ranks · T). Every layout also
// reports the gradient exchange's exposed time: host seconds per step spent completing it after backward (allreduce
// mode). With --overlap the longer run is repeated with every bucket started after backward instead of during it (the
// same buckets, the same sums), and the measured overlap is 1 − exposed(during) / exposed(after): the fraction of the
// exchange that backward hid.
//
// CUDA ranks: --set device.type=cuda (and parallel.comm=nccl|staged) under mpirun, as `proplab run` does.
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
#include "train/compression.h"
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

// What the formulas of docs/distributed.md give per step: on rank 0 and summed over every rank. Negative: no
// formula for this layout.
struct Expected {
  double rank0 = -1.0, all = -1.0;
};

Expected expected_bytes(const Study& study, dist::Communicator* tensor) {
  const ParallelConfig& p = study.parallel;
  const RunSpec spec = to_run_spec(study);
  const TransformerConfig& m = spec.model.transformer();
  const double batch = static_cast<double>(spec.train.batch), t = m.seq_len, d = m.width, v = m.vocab;
  Expected out;
  if (p.sp > 1 && p.dp == 1 && p.tp == 1 && p.pp == 1) {
    // Sequence parallel, per rank: each micro-batch's ring attention in every layer sends its key/value block on
    // (sp − 1 times, 2D floats per token) forward and its key/value block with their gradients (sp times, 4D floats
    // per token) backward, for Bm = batch / grad_accum rows of Tl = T / sp tokens; then the gradients summed over
    // the ring (N floats, in buckets), the loss (a double) and the stop flag.
    const double n = static_cast<double>(make_model(spec.model, spec.scaling, spec.seed)->params().count_elements());
    const double tokens = batch / spec.train.grad_accum * (t / p.sp);
    const double attention = 4.0 * (p.sp - 1) * tokens * 2.0 * d + 4.0 * p.sp * tokens * 4.0 * d;
    const double rank = spec.train.grad_accum * m.layers * attention + 4.0 * n + 16.0;
    out.rank0 = rank;
    out.all = p.sp * rank;
  } else if (p.sp > 1) {
    return out;                         // (no formula for sequence parallelism combined with another split)
  } else if (p.tp == 1 && p.pp == 1) {  // data parallel: N parameters, c = ceil(N / dp); 16 bytes of loss and stop flag
    const double n = static_cast<double>(make_model(spec.model, spec.scaling, spec.seed)->params().count_elements());
    const double c = std::ceil(n / p.dp);
    double rank = 0.0;
    if (p.dp > 1) {
      if (p.compress != "none") {  // each gradient's compressed payload (train/compression.h)
        const std::unique_ptr<Model> model = make_model(spec.model, spec.scaling, spec.seed);
        for (const auto& param : model->params().all())
          rank += static_cast<double>(compressed_bytes(p, param->value.shape()));
        rank += 16.0;
      } else if (p.zero == 1)
        rank = 4.0 * p.dp * c + 4.0 * c + 24.0;  // + the gradient norm's double
      else if (p.dp_mode == "local_sgd")
        rank = 4.0 * n / p.sync_every + 16.0;
      else if (p.dp_mode == "gossip")
        rank = 4.0 * n * (p.dp == 2 ? 1 : 2) + 16.0;
      else
        rank = 4.0 * n + 16.0;
    }
    out.rank0 = rank;
    out.all = p.dp * rank;
  } else if (p.dp == 1 && p.pp == 1) {
    // Tensor parallel, per rank: each micro-batch's R = (batch / grad_accum)·T rows cost 8·R·D·(1 + 2L) bytes of
    // f/g all-reduces and 24·R of cross-entropy; the gradient norm one double per split parameter; the stop flag.
    const double rows = batch / spec.train.grad_accum * t;
    const std::unique_ptr<Model> piece = make_model(spec.model, spec.scaling, spec.seed, tensor);
    double split = 0.0;
    for (const auto& param : piece->params().all())
      if (param->shard.split()) split += 1.0;
    const double rank =
        spec.train.grad_accum * (8.0 * rows * d * (1.0 + 2.0 * m.layers) + 24.0 * rows) + 8.0 * split + 8.0;
    out.rank0 = rank;
    out.all = p.tp * rank;
  } else if (p.dp == 1 && p.tp == 1) {
    // Pipeline parallel: each boundary carries batch·T·D floats forward (activations) and back (gradients) — with
    // pp_compress, each of the M transfers of (batch/M)·T·D floats as its payload's words —; the tied embedding's
    // gradient both ways between the first and last stage; per stage the gradient norm and the stop flag (8 bytes
    // each); the loss broadcast (8 bytes) from the last stage. Rank 0 is the first stage.
    const double tied = m.tie_embeddings ? 4.0 * v * d : 0.0;
    const Compression boundary = boundary_compression_of(p);
    const auto elements = static_cast<std::int64_t>(batch / p.microbatches * t * d);
    const double transfer = boundary == Compression::none
                                ? 4.0 * static_cast<double>(elements)
                                : 4.0 * static_cast<double>(payload_words(boundary, elements));
    const double one_way = p.microbatches * transfer;  // a boundary's bytes per step in one direction
    out.rank0 = one_way + tied + 16.0;
    out.all = 2.0 * (p.pp - 1) * one_way + 2.0 * tied + 16.0 * p.pp + 8.0;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app(
      "bench_dist: data-, tensor-, pipeline- and sequence-parallel step time and bytes per step on the reference "
      "model");
  std::int64_t steps = 12;
  int threads = 0;
  double reference_ms = 0.0;
  std::vector<std::string> settings;
  std::string out = "bench_dist_runs";
  bool overlap = false;
  bool check = false;
  app.add_option("--steps", steps, "steps of the longer run (the shorter has a third)")->check(CLI::Range(6, 100000));
  app.add_option("--threads", threads, "threads per process (0: all cores)");
  app.add_option("--set", settings, "study overrides, e.g. parallel.dp=2");
  app.add_option("--out", out, "folder for the run files");
  app.add_flag("--overlap", overlap,
               "repeat the longer run with every bucket started after backward: prints the measured overlap");
  app.add_flag("--check", check, "exit 1 unless the counted bytes equal the formula's (rank 0 and all ranks)");
  app.add_option("--reference-ms", reference_ms,
                 "one-process ms/step at one thread: prints the efficiency T1 / (ranks * ms/step)")
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  try {
    std::vector<std::string> overrides = settings;
    overrides.push_back("device.threads=" + std::to_string(threads));
    overrides.push_back("record.every=1000000");
    const Study base = parse_study(kStudy, "bench_dist", ".", overrides);
    std::optional<dist::ProcessGroups> groups;
    RunOptions options;
    // The communicators whose bytes count (each once; the world carries the stop flag).
    std::vector<dist::Communicator*> counted_groups;
    if (dist::launched_by_mpi()) {
      groups.emplace(make_run_process_groups(to_run_spec(base), options));  // (CUDA ranks as `proplab run` has them)
      counted_groups = {groups->world.get(),    groups->data.get(),     groups->tensor.get(),
                        groups->pipeline.get(), groups->sequence.get(), groups->gradient.get()};
    }
    const bool root = !groups || groups->world->rank() == 0;
    const int ranks = groups ? groups->world->size() : 1;
    const ParallelConfig& layout = base.parallel;
    options.out_dir =
        std::filesystem::path(out) /
        (layout.dp_mode + "-dp" + std::to_string(layout.dp) + "-tp" + std::to_string(layout.tp) + "-pp" +
         std::to_string(layout.pp) + "-sp" + std::to_string(layout.sp) + "-m" + std::to_string(layout.microbatches) +
         "-zero" + std::to_string(layout.zero) + "-" + layout.compress + "-pp_" + layout.pp_compress);
    options.force = true;
    auto bytes_now = [&](dist::Traffic kind) {
      std::int64_t total = 0;
      for (const dist::Communicator* c : counted_groups) total += c->bytes_communicated(kind);
      return total;
    };
    double counted[2][dist::kTrafficKinds] = {};
    const std::int64_t lengths[2] = {steps / 3, steps};
    std::vector<double> seconds, serial_seconds;
    double exposed[2] = {0.0, 0.0};  // exchange seconds per step: buckets during backward, then after it
    for (int run = 0; run < (overlap ? 3 : 2); ++run) {
      options.overlap_buckets = run < 2;
      std::vector<std::string> run_overrides = overrides;
      run_overrides.push_back("train.steps=" + std::to_string(lengths[std::min(run, 1)]));
      const Study study = parse_study(kStudy, "bench_dist", ".", run_overrides);
      std::int64_t before[dist::kTrafficKinds] = {};
      for (int k = 0; k < dist::kTrafficKinds; ++k) before[k] = bytes_now(static_cast<dist::Traffic>(k));
      const RunSummary summary = run_training(to_run_spec(study), options);
      if (summary.status != RunStatus::completed) throw UserError("bench_dist: the run ended " + summary.detail);
      if (run < 2)
        for (int k = 0; k < dist::kTrafficKinds; ++k)
          counted[run][k] = static_cast<double>(bytes_now(static_cast<dist::Traffic>(k)) - before[k]);
      if (run >= 1) exposed[run - 1] = summary.gradient_exchange_s / static_cast<double>(steps);
      if (root && run >= 1) {
        const RunReader reader = RunReader::open(summary.run_file);
        const TrainCurves train = reader.read_train();
        for (std::size_t i = 2; i + 1 < train.size(); ++i)  // unrecorded steps (0 and the last are recorded)
          (run == 1 ? seconds : serial_seconds).push_back(train.wall_time[i] - train.wall_time[i - 1]);
      }
    }
    const double counted_steps = static_cast<double>(steps - steps / 3);
    double per_step[dist::kTrafficKinds], all_ranks[dist::kTrafficKinds];
    for (int k = 0; k < dist::kTrafficKinds; ++k)
      all_ranks[k] = per_step[k] = (counted[1][k] - counted[0][k]) / counted_steps;
    if (groups) groups->world->all_reduce(all_ranks, dist::kTrafficKinds);
    if (!root) return 0;
    const Expected expected = expected_bytes(base, options.tensor_parallel);
    const double ms = 1e3 * median(seconds);
    std::printf(
        "bench_dist: reference transformer, dp=%d tp=%d pp=%d sp=%d microbatches=%d dp_mode=%s zero=%d bucket_mb=%g "
        "compress=%s (ratio %g, rank %d) pp_compress=%s threads=%d\n",
        layout.dp, layout.tp, layout.pp, layout.sp, layout.microbatches, layout.dp_mode.c_str(), layout.zero,
        layout.bucket_mb, layout.compress.c_str(), layout.compress_ratio, layout.compress_rank,
        layout.pp_compress.c_str(), threads);
    std::printf("  ms/step (median of %zu unrecorded steps): %.1f\n", seconds.size(), ms);
    if ((layout.dp > 1 || layout.sp > 1) && layout.dp_mode == "allreduce") {
      std::printf("  exchange after backward: %.2f ms/step (rank 0; buckets started during backward)\n",
                  1e3 * exposed[0]);
      if (overlap) {
        std::printf("  exchange after backward: %.2f ms/step with every bucket started after backward (%.1f ms/step)\n",
                    1e3 * exposed[1], 1e3 * median(serial_seconds));
        if (exposed[1] > 0.0)
          std::printf("  overlap         %.2f = 1 - %.2f / %.2f (the share of the exchange backward hid)\n",
                      1.0 - exposed[0] / exposed[1], 1e3 * exposed[0], 1e3 * exposed[1]);
      }
    }
    double total = 0.0, total_all = 0.0;
    for (int k = 0; k < dist::kTrafficKinds; ++k) {
      total += per_step[k];
      total_all += all_ranks[k];
      if (all_ranks[k] != 0.0)
        std::printf("  %-15s %14.0f bytes/step (rank 0), %14.0f (all ranks)\n",
                    dist::traffic_name(static_cast<dist::Traffic>(k)), per_step[k], all_ranks[k]);
    }
    std::printf("  total           %14.0f bytes/step (rank 0), %14.0f (all ranks)\n", total, total_all);
    if (expected.rank0 >= 0.0)
      std::printf("  formula         %14.0f bytes/step (rank 0), %14.0f (all ranks)\n", expected.rank0, expected.all);
    else
      std::printf("  formula         (none for this combined layout)\n");
    if (reference_ms > 0.0)
      std::printf("  efficiency      %.2f = %.1f ms / (%d ranks x %.1f ms)\n", reference_ms / (ranks * ms),
                  reference_ms, ranks, ms);
    if (check && !(expected.rank0 == total && expected.all == total_all)) {
      std::printf("bench_dist: the counted bytes differ from the formula\n");
      return 1;
    }
  } catch (const std::exception& e) {
    std::cerr << "bench_dist: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
