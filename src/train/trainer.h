// train/trainer: runs one study end to end — builds the model and data, trains, evaluates, checkpoints and
// writes the run file.
//
// Determinism: everything random is counter-based and keyed by (seed, what, index); the data batch of step s,
// micro-batch m is batch number s·grad_accum + m; dropout masks are keyed by the same micro-batch number. So a
// run is a pure function of its config, and a resumed run continues bit for bit: the checkpoint holds the
// parameters, the optimizer state and the step (the data position and RNG state follow from the step).
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <optional>
#include <string>

#include "core/device.h"
#include "data/config.h"
#include "io/run_file.h"
#include "spec/model.h"
#include "scaling/config.h"
#include "dist/communicator.h"
#include "core/tensor.h"
#include "train/config.h"

namespace proplab {

// Everything a run needs, as resolved from a study.
struct RunSpec {
  std::string name;
  std::uint64_t seed = 0;
  ModelConfig model;
  ScalingConfig scaling;
  TrainConfig train;
  DataConfig data;
  RecordConfig record;
  ParallelConfig parallel;
  DeviceConfig device;
  TheoryConfig theory;
  std::string config_toml;  // the resolved study, stored in the run file and checkpoint
};

struct RunOptions {
  std::filesystem::path out_dir;  // the run file is out_dir/<name>.h5, the checkpoint out_dir/<name>.ckpt.h5
  bool resume = false;            // continue from the checkpoint
  bool force = false;             // overwrite an existing run file
  std::int64_t stop_after = -1;   // stop cleanly (with a checkpoint) once this many steps are done; -1: never
  std::ostream* log = nullptr;    // progress and messages (null: silent)
  bool terminal = false;          // live one-line progress (else periodic lines)
  const std::atomic<bool>* interrupt = nullptr;  // set by SIGINT/SIGTERM: stop at the next step boundary
  // Data parallel: the group of replicas (size = [parallel] dp), null for one process. Every replica runs this
  // with the same spec; replica r takes rows [r·B/dp, (r+1)·B/dp) of each micro-batch, gradients are summed over
  // the group, probe sums merged into rank 0's, and only rank 0 writes the run file and checkpoints.
  dist::Communicator* data_parallel = nullptr;
  // Pipeline parallel: this rank's pipeline group (size = [parallel] pp; its rank is the stage), null without
  // pipeline parallelism (train/pipeline.h).
  dist::Communicator* pipeline = nullptr;
  // Tensor parallel: the ranks that share one model replica (size = [parallel] tp), null for tp = 1. Each holds
  // its piece of the model (models/tensor_parallel.h); statistics and checkpoints stay full-tensor.
  dist::Communicator* tensor_parallel = nullptr;
  // Sequence parallel: the ring of ranks that share every sequence (size = [parallel] sp), null for sp = 1. Each takes
  // its part of every sequence's tokens (train/sequence_parallel.h); the loss, gradients and statistics are the
  // ring's whole.
  dist::Communicator* sequence_parallel = nullptr;
  // With sequence parallelism: the ranks that sum their gradients, the data-parallel replicas and their rings together
  // (size dp·sp); the gradient exchange ([parallel] dp_mode, bucket_mb, zero, compress) runs over it. Null for
  // sp = 1, where it is the data-parallel group.
  dist::Communicator* gradient_sum = nullptr;
  // Every rank of the layout, null for one process: the ranks agree over it on when to stop and on rank 0's
  // verdict about non-finite statistics.
  dist::Communicator* world = nullptr;
  // A CUDA run with several ranks: how its device buffers travel ("nccl" or "staged", dist/cuda_communicator.h;
  // the communicators above then carry host and device buffers). Empty otherwise. Written into the run file's
  // layout attribute.
  std::string device_comm;
  // Data parallel (allreduce, bucket_mb > 0): false starts every bucket after backward instead of during it, the
  // same buckets without overlap (for bench_dist's overlap measurement; runs give the same results either way).
  bool overlap_buckets = true;
  std::string proplab_version = "0.1.0";
  // The command that ran this study without --resume or --force ("proplab run STUDY --out DIR ..."), for the
  // message that says how to continue after an I/O failure; empty: the message names the flag only.
  std::string command;
};

struct RunSummary {
  RunStatus status = RunStatus::completed;
  std::string detail;
  std::int64_t steps_done = 0;
  double last_loss = 0.0;
  std::optional<double> last_eval_loss;
  std::optional<double> entropy_rate;  // the data's loss floor when known
  double tokens_per_s = 0.0;
  std::filesystem::path run_file;
  std::filesystem::path checkpoint;
  // Data parallel: a collective timed out (status failed, detail names it); the other ranks cannot be relied on
  // to finish, so the caller ends the job (dist::abort_all).
  bool collective_timeout = false;
  // The operating system refused a write to the run file or the checkpoint (no space, quota, a read-only or
  // vanished directory): the run stopped at a step boundary with status failed, resumable from its last good
  // checkpoint. `message` says in one line what failed, the step, what the run file holds, the last good
  // checkpoint and the command that continues (rank 0; other ranks: that rank 0 could not write).
  bool io_failure = false;
  std::string message;
  // The GPU ran out of memory during a step: status failed, detail names the allocation, its size and the free
  // memory; the records so far are in the run file and no checkpoint was taken after the last good one.
  bool out_of_memory = false;
  // Data parallel (allreduce): the host seconds spent completing the gradient exchange after backward, summed over
  // the run's steps — the part of the exchange backward did not hide (bench_dist's overlap measurement).
  double gradient_exchange_s = 0.0;
};

// Where the study's run computes: device.type "cpu", "cuda" (a UserError naming the key when this build has no
// CUDA backend or the machine no GPU) or "auto" (the GPU when present and the run can use it, else the CPU).
// device.precision = "bf16" needs the GPU: a run that would compute on the CPU is a UserError naming
// device.precision.
Device run_device(const RunSpec& spec);
// The matrix-product precision of device.precision ("fp32" or "bf16"; a UserError naming the key otherwise).
MatmulPrecision run_precision(const RunSpec& spec);
// "cpu", or "cuda:0 NVIDIA H200 (139.8 GiB)" for the run file's device attribute.
std::string device_description(Device device);
// True when this build has the CUDA backend.
bool cuda_built();

std::filesystem::path checkpoint_path(const std::filesystem::path& out_dir, const std::string& name);
// A resolved study (RunSpec::config_toml) less train.final_checkpoint, which changes nothing a run computes or
// records: what a run file's or checkpoint's study is compared on (--resume, a sweep's finished and stopped points).
std::string outcome_config(const std::string& config_toml);

// Runs the study. Throws UserError for problems found before training starts (nothing is written then), among
// them another process writing the same run (io/run_lock.h: rank 0 holds the run's lock from before it writes
// anything until it has written everything), and IoError when the run file cannot even be created.
RunSummary run_training(const RunSpec& spec, const RunOptions& options);

// Points `options` at the groups of a `[parallel]` layout of several processes (a world of one changes nothing).
void use_process_groups(RunOptions& options, const dist::ProcessGroups& groups);

// Under an MPI launcher: MPI_COMM_WORLD as the spec's layout. A CUDA layout's world also carries device buffers
// (dist::make_cuda_world: NCCL or staged, as parallel.comm says; each rank takes its GPU here, before anything else
// touches CUDA; options.device_comm names the transport). Then use_process_groups. Collective over the world.
dist::ProcessGroups make_run_process_groups(const RunSpec& spec, RunOptions& options);

}  // namespace proplab
