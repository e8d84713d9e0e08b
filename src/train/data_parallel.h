// train/data_parallel: how the replicas of a data-parallel run exchange gradients and parameters, and how far
// apart their parameters drift (docs/distributed.md).
//
// Modes ([parallel] dp_mode, zero, bucket_mb):
// - allreduce: each replica's gradient is its share of the global one (the trainer scales the loss by 1/dp) and
//   the shares are summed. With bucket_mb > 0 the sum runs in buckets of about bucket_mb MiB, parameters taken in
//   reverse creation order; a bucket's non-blocking all-reduce starts as soon as the model reports its parameters'
//   gradients final (GradientListener), and every bucket is completed before clipping. With bucket_mb = 0 each
//   gradient tensor is all-reduced after backward. Either way the replicas apply identical updates. A pipeline
//   stage exchanges only the parameters it updates (`exchanged`: its own and the tied embedding copy; the others
//   carry zero gradients there), in buckets cut over those parameters alone.
// - allreduce with zero = 1 (ZeRO-1): the flattened gradients are reduce-scattered; replica r owns the flat slice
//   [r·c, (r+1)·c) with c = ceil(N / dp), clips it with the global norm, updates it with an optimizer that keeps
//   only that slice's state, and the parameters are all-gathered.
// - local_sgd: each replica steps on its own mean gradient; parameters averaged every sync_every steps.
// - gossip (D-PSGD): each replica steps on its own mean gradient, then mixes its parameters with its two ring
//   neighbours: x_r ← (x_{r-1} + x_r + x_{r+1}) / 3 (dp = 2: (x_0 + x_1) / 2), a doubly-stochastic W.
//
// Disagreement (recorded steps, dp > 1): for parameter tensor p, D_p = sqrt(Σ_r ‖θ_r,p − θ̄_p‖² / dp) / ‖θ̄_p‖
// with θ̄ the replicas' mean (0 when both are 0), and the same over all parameters together; measured after the
// step (mixing or averaging included) and before its mixing or averaging. Exactly 0 while replicas are identical.
//
// Device: the buffers live where the parameters do (on a GPU in a CUDA run, exchanged through the group's device
// transport: NCCL, or staged through host memory; dist/cuda_communicator.h). The disagreement is computed in double
// on the host from a copy of the parameters (recorded steps only).
//
// Every function here is collective over the data-parallel group: every replica calls it in the same order.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dist/communicator.h"
#include "io/run_file.h"
#include "io/run_reader.h"
#include "models/model.h"
#include "nn/parameter.h"
#include "ops/ops.h"
#include "train/compression.h"
#include "train/config.h"
#include "train/optimizer.h"

namespace proplab {

class DataParallel final : public GradientListener {
 public:
  // `group` null: one process. UserError for combinations that do not exist (zero = 1 with local_sgd or gossip;
  // compress other than "none" without replicas, with zero = 1, a local mode or on a GPU).
  // `exchanged` (per parameter in store order; empty: all): the gradients the allreduce mode sums; the others are
  // left as they are. Only with dp_mode = "allreduce" and zero = 0 (pipeline stages). `seed`: powersgd's first Q.
  DataParallel(const ParallelConfig& config, dist::Communicator* group, ParameterStore& params,
               std::vector<bool> exchanged = {}, std::uint64_t seed = 0);
  ~DataParallel() override;

  int replicas() const { return replicas_; }
  bool sharded() const { return zero_; }
  // The optimizer's slice of the flattened parameters (all of them unless zero = 1).
  ParameterShard optimizer_shard() const;

  // The listener for one micro-batch's backward: only the step's last micro-batch makes gradients final. Null
  // when nothing is overlapped (one process, unbucketed, local modes, zero, or set_overlap(false)).
  GradientListener* listener_for(bool last_micro_batch);
  // false: buckets start after backward (in finish_gradients), not during it; the sums are the same.
  void set_overlap(bool overlap) { overlap_ = overlap; }
  // Host seconds spent in finish_gradients so far: the exchange that backward did not hide.
  double exchange_seconds() const { return exchange_seconds_; }
  // After the step's backward passes: completes the gradient exchange (the sum of the shares — compressed with
  // [parallel] compress —, its reduce-scatter with zero = 1, or — local modes — the replica's own mean gradient: its
  // share times dp). `record`: a recorded step, whose compression statistics write_record writes.
  void finish_gradients(bool record = false);
  // The compressed exchange (null with compress = "none" or one replica).
  GradientCompressor* compressor() { return compressor_.get(); }
  // Clips the gradient by its global norm and returns the norm before clipping. With zero = 1 only the own slice
  // is current; `full` (recorded steps, where the recorder reads every gradient) gathers the clipped slices back
  // into every gradient tensor.
  double clip_gradients(double max_norm, bool full);
  // The step's optimizer update, then the parameter exchange (zero: all-gather; local_sgd: averaging every
  // sync_every steps; gossip: mixing). `norms` as in Optimizer::step (made global with zero = 1). `record`:
  // measures the disagreement for write_record.
  void update(Optimizer& optimizer, double lr, std::int64_t step, std::vector<ops::UpdateNorms>* norms, bool record);

  // Run file (dp > 1 only; rank 0 writes): /replicas/steps, /replicas/disagreement[_before_mix] [n, n_params],
  // /replicas/disagreement[_before_mix]_total [n, 1]; with compression also /compression/steps,
  // /compression/{error,residual} [n, n_params] and /compression/{error,residual}_total [n, 1].
  // create_datasets between RunWriter::create and start.
  void create_datasets(RunWriter& writer);
  void copy_history(const RunReader& previous, RunWriter& writer, std::int64_t before_step);
  void write_record(RunWriter& writer, std::int64_t step);

  // Checkpoints hold full tensors. To save: the optimizer's named state as full tensors (gathered from every
  // replica's slice with zero = 1; call on every replica). To load: full-size destinations, then
  // after_optimizer_load keeps each replica's slice.
  std::vector<std::pair<std::string, Tensor>> optimizer_state_to_save(Optimizer& optimizer);
  std::vector<std::pair<std::string, Tensor>> optimizer_state_to_load(Optimizer& optimizer);
  void after_optimizer_load(Optimizer& optimizer, const std::vector<std::pair<std::string, Tensor>>& loaded);

  // GradientListener: starts the buckets whose parameters are all final.
  void gradients_final_from(std::size_t first) override;

 private:
  struct Bucket {
    std::size_t first = 0, last = 0;  // parameters [first, last)
    Tensor buffer;                    // on the parameters' device
    std::unique_ptr<dist::PendingCollective> pending;
  };
  void start_bucket(Bucket& bucket);
  // Flat copies between the parameters (values or gradients) and a buffer covering flat range [begin, end) (any
  // device on either side).
  void pack(bool gradients, std::int64_t begin, std::int64_t end, Tensor& out) const;
  void unpack(bool gradients, std::int64_t begin, std::int64_t end, const Tensor& in);
  // A bucket's buffer: the exchanged gradients of its parameters, back to back.
  void pack_bucket(Bucket& bucket) const;
  void unpack_bucket(const Bucket& bucket);
  void average_parameters();
  void mix_parameters();
  void measure_disagreement(std::vector<double>& out);

  ParallelConfig config_;
  dist::Communicator* group_;
  ParameterStore& params_;
  int replicas_ = 1;
  bool local_ = false;  // local_sgd or gossip: replicas step on their own gradients
  bool zero_ = false;
  std::vector<bool> exchanged_;        // per parameter: summed by the allreduce mode
  std::vector<std::int64_t> offsets_;  // flat offset of each parameter; back() = N
  std::int64_t chunk_ = 0;             // zero: elements per replica's slice (N padded to dp·chunk)
  std::vector<Bucket> buckets_;        // in start order (last parameters first)
  std::size_t next_bucket_ = 0;
  bool overlap_ = true;
  double exchange_seconds_ = 0.0;
  Device device_ = Device::cpu;         // where the parameters and every buffer below live
  Tensor flat_, slice_;                 // zero: dp·chunk and chunk
  Tensor mix_;                          // gossip: 3·N (own, from the left, from the right)
  std::vector<double> after_, before_;  // disagreement per parameter, then the total
  SeriesId steps_series_, after_series_, after_total_series_, before_series_, before_total_series_;
  std::unique_ptr<GradientCompressor> compressor_;
  std::vector<double> compress_error_, compress_residual_;  // of the last recorded step, per parameter then total
  SeriesId compress_steps_series_, compress_error_series_, compress_error_total_series_, compress_residual_series_,
      compress_residual_total_series_;
};

}  // namespace proplab
