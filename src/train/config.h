// train/config: training, device, parallel layout and recording settings a study resolves to.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace proplab {

enum class OptimizerKind { adamw, sgd };
enum class ScheduleKind { constant, cosine };

struct TrainConfig {
  std::int64_t steps = 200;
  int batch = 8;       // sequences (or samples) per optimizer step, before accumulation split
  int grad_accum = 1;  // micro-batches per step; batch must be divisible by it
  double lr = 1e-3;
  OptimizerKind optimizer = OptimizerKind::adamw;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double momentum = 0.9;  // sgd
  bool nesterov = false;  // sgd
  ScheduleKind schedule = ScheduleKind::constant;
  std::int64_t warmup = 0;    // linear warmup steps
  double min_lr_ratio = 0.1;  // cosine: final lr = lr * min_lr_ratio
  double weight_decay = 0.0;
  double grad_clip = 1.0;         // global norm; 0 disables
  std::int64_t eval_every = 100;  // 0 disables periodic eval (the final eval still runs)
  int eval_batches = 4;
  std::int64_t checkpoint_every = 0;  // 0: only at the end
  // false: a run that completes takes no checkpoint at its end (one stopped early still does). Not part of the
  // experiment: left out of the resolved text when true, and ignored when --resume compares studies.
  bool final_checkpoint = true;
};

struct DeviceConfig {
  std::string type = "auto";  // auto | cpu | cuda
  int threads = 0;            // 0: all cores
  // Inputs of the CUDA matrix products (linear layers, convolutions): "fp32" or "bf16" (rounded operands, f32
  // accumulation, outputs and state); bf16 needs the run to compute on the GPU.
  std::string precision = "fp32";
};

struct ParallelConfig {
  // The processes of the layout: dp·tp·pp·sp.
  int world() const { return dp * tp * pp * sp; }
  int dp = 1;
  int tp = 1;
  int pp = 1;
  // Sequence parallel: each sequence's tokens split over sp ranks (transformer; ring attention,
  // models/sequence_parallel.h, train/sequence_parallel.h).
  int sp = 1;
  int microbatches = 1;
  double timeout_s = 300.0;  // a collective that waits longer ends the run (a rank died or stalled)
  // Data parallel: "allreduce" (gradients summed every step), "local_sgd" (each replica steps on its own
  // gradient; parameters averaged every `sync_every` steps) or "gossip" (each replica steps on its own gradient,
  // then averages its parameters with its two ring neighbours: D-PSGD).
  std::string dp_mode = "allreduce";
  int sync_every = 1;
  // allreduce: gradients are summed in buckets of about this many MiB (parameters in reverse order), each started
  // as soon as backward has finished its parameters; 0: one all-reduce per tensor after backward.
  double bucket_mb = 1.0;
  // ZeRO stage: 0 (every replica keeps the whole optimizer state) or 1 (each keeps the state of its slice of the
  // flattened parameters: reduce-scatter gradients, update the slice, all-gather parameters).
  int zero = 0;
  // allreduce, zero = 0: how the gradients travel (train/compression.h): "none" (float32), "bf16", "int8" (a scale
  // per 1024 elements), "topk" (the largest compress_ratio of each gradient, with error feedback) or "powersgd"
  // (rank compress_rank, with error feedback).
  std::string compress = "none";
  double compress_ratio = 0.01;
  int compress_rank = 4;
  // pp > 1: how activations and their gradients cross a stage boundary: "none" (float32), "bf16" or "int8".
  std::string pp_compress = "none";
  // How a CUDA run's ranks move device buffers: "nccl" (one GPU per rank), "staged" (through pinned host memory and
  // MPI; ranks may share a GPU) or "auto" (NCCL when this build has it, else staged). CPU runs ignore it.
  std::string comm = "auto";
};

// What to record (used by the recording module): schedule and statistic selection.
struct RecordConfig {
  std::int64_t every = 10;
  bool log_spaced = false;
  std::vector<std::string> forward;   // empty: all
  std::vector<std::string> backward;  // empty: all
  std::vector<std::string> params;    // empty: all
  std::string on_nonfinite = "stop";  // stop | continue
};

// Inputs of the theoretical predictions that the model does not fix.
struct TheoryConfig {
  // Token correlation of the embedding output; absent: measured on the first training batch.
  std::optional<double> input_corr;
};

}  // namespace proplab
