// train/pipeline: pipeline-parallel training of the transformer ([parallel] pp > 1, microbatches = M).
//
// Each rank of a pipeline group is one stage: a contiguous range of blocks chosen so that the stages' estimated
// FLOPs are balanced (dist::balance_stages), with the embedding on the first stage and the final norm, head and
// loss on the last. A step runs the 1F1B schedule (dist/pipeline_schedule.h) over M pipeline micro-batches:
// each of the step's train.grad_accum data micro-batches (this data-parallel replica's rows of it) is cut into
// M / grad_accum equal row chunks, so the global batch, and with it every statistic, is the single process's.
//
// Invariants:
// - Every stage holds every parameter tensor (identically initialised, as in one process) but computes with,
//   and accumulates gradients into, only its own; the tied token embedding is used by the first and the last
//   stage, whose two gradients are summed before the update, so both copies stay identical.
// - Every collective here is called by every stage of the group in the same order.
// - Statistics and checkpoints are full-tensor: probe sums are merged into stage 0 exactly (Recorder's merge),
//   parameter statistics come from each parameter's owner, and a checkpoint gathers every owned parameter and
//   optimizer state tensor onto stage 0 (rank 0 writes it); every rank reads a checkpoint in full on resume.
// - tp × pp: a stage may be split over a tensor-parallel group (models/tensor_parallel.h). Rank t of the tensor
//   group of stage s talks only to rank t of stages s ± 1 (the same pipeline group: dist::make_process_groups
//   keeps tp fixed inside it); the activations and gradients it sends are the replicated residual stream. Each
//   stage's pieces are then what they are without the pipeline: the gradient norm sums the split parameters'
//   squares over the tensor group first, probes reach the recorder through the trainer's TensorParallelSink, and
//   a checkpoint gathers the pieces onto stage 0 (each tensor rank its own), where the tensor group gathers them
//   into full tensors.
// - sp × pp: a stage may run on a sequence-parallel rank's part of every sequence (train/sequence_parallel.h). The
//   pipeline groups keep sp fixed, so each ring rank's chain carries its own tokens; a stage's ring attention talks
//   to the same stage of the other chains. The micro-batch gradients are scaled by 1/sp more, the trainer sums them
//   over the ring, and the boundaries' compression sums are summed over the ring before the stages'.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "dist/communicator.h"
#include "io/run_file.h"
#include "io/run_reader.h"
#include "models/model.h"
#include "models/transformer.h"
#include "train/compression.h"
#include "train/recorder.h"
#include "train/trainer.h"

namespace proplab {

// UserError when the study cannot run as a pipeline with `stages_started` stages (null: one process), naming the
// key and what is allowed. Also refuses microbatches != 1 without pipeline parallelism.
void check_pipeline_layout(const RunSpec& spec, const dist::Communicator* stages_started, int data_replicas);

// The first block of every stage and the number of blocks (pp + 1 values), balanced by estimated FLOPs per token:
// a block's projections and attention, plus the head's readout on the last stage.
std::vector<int> pipeline_stage_blocks(const TransformerConfig& config, int stages);

class PipelineStage {
 public:
  // `stages`: this rank's pipeline group (its rank is the stage); `data`: its data-parallel group or null;
  // `tensor`: its tensor-parallel group when the model is split (tp × pp), else null; `sequence`: its
  // sequence-parallel ring when sequences are split (sp × pp), else null.
  PipelineStage(const RunSpec& spec, Model& model, dist::Communicator& stages, dist::Communicator* data,
                dist::Communicator* tensor = nullptr, dist::Communicator* sequence = nullptr);

  int stage() const { return stage_; }
  int stage_count() const { return stage_count_; }
  int first_block() const { return first_block_; }
  int last_block() const { return last_block_; }

  // The step's forward and backward passes in 1F1B order. `data_batch(m)` is this replica's rows of the step's
  // data micro-batch m; each pipeline micro-batch's gradient is scaled by 1/(M·dp). Returns the mean loss on the
  // last stage and 0 elsewhere (finish_backward shares it).
  double forward_backward(std::int64_t step, ProbeSink* sink, const std::function<Batch(int)>& data_batch);
  // After the data-parallel gradient sum: adds the tied embedding's two gradients, sends the loss from the last
  // stage to every stage, and (with a recorder) merges every stage's probe sums into stage 0's.
  double finish_backward(double loss, Recorder* recorder);
  // The global gradient norm (each parameter once, from its owner; split parameters summed over the tensor
  // group), and every owned gradient scaled by max_norm / norm when it is larger (0 disables clipping), as
  // ops::clip_grad_norm does in one process.
  double clip_grad_norm(double max_norm);
  // Each parameter statistic row from the parameter's owner, on every stage.
  void gather_param_stats(Recorder& recorder);
  // Validation loss of one batch (forward only, in chunks of the training micro-batch's rows), on every stage.
  double evaluate(const Batch& batch);
  // Checkpoint tensors (param/<name>, optim/<name>.<state>, buffer/<name>): each owned one sent to stage 0 and
  // written into `tensors` there. Data-parallel replicas other than 0 skip it (their tensors are identical).
  void gather_to_first_stage(std::map<std::string, Tensor>& tensors);
  // Per parameter (store order): true for the parameters whose gradients this stage computes and updates (its
  // own and the tied embedding copy); all others stay zero. The data-parallel exchange covers these only.
  const std::vector<bool>& updated_parameters() const { return updated_; }

  // [parallel] pp_compress: activations and their gradients cross each boundary as bf16 or int8 payloads
  // (train/compression.h). On recorded steps the sender measures what the rounding took away; rank 0 writes, per
  // boundary b (between stages b and b + 1), sqrt(Σ‖x − x̂‖² / Σ‖x‖²) over the step's micro-batches and the data
  // replicas: /compression/boundaries/{steps, activation_error, gradient_error} [n, pp − 1].
  void create_datasets(RunWriter& writer);
  void copy_history(const RunReader& previous, RunWriter& writer, std::int64_t before_step);
  void write_record(RunWriter& writer, std::int64_t step);

 private:
  // The stage that owns a parameter (the tied token embedding: stage 0).
  int owner_of(const std::string& parameter) const;
  void copy_chunk(const Batch& from, std::int64_t first_row, Batch& to) const;
  // A boundary transfer, compressed with pp_compress; `measure` adds the sender's rounding to boundary_sums_.
  void send_tensor(const Tensor& x, int to, int tag, bool gradient, bool measure);
  void receive_tensor(Tensor& into, int from, int tag);
  // CUDA ranks: the host buffer a boundary tensor of x's shape is encoded from (a copy of x when `copy`) or decoded
  // into; one buffer serves both, as a send and a receive never overlap.
  Tensor& on_host(const Tensor& x, bool copy = true);

  Transformer& model_;
  dist::Communicator& stages_;
  dist::Communicator* data_;
  dist::Communicator* tensor_;
  dist::Communicator* sequence_;
  std::uint64_t seed_;
  int stage_, stage_count_, first_block_, last_block_;
  int microbatches_, grad_accum_, chunks_per_micro_, replicas_, ring_, slots_;
  bool measured_ = false;  // the step's boundary transfers were measured (a recorded step with pp_compress)
  bool tied_;
  std::vector<int> bounds_;
  std::int64_t chunk_rows_ = 0;
  std::vector<Batch> chunks_;       // the step's pipeline micro-batches (copies: the data buffer is reused)
  std::vector<Tensor> received_;    // per slot: the activation from the previous stage [rows, D]
  Tensor received_gradient_;        // from the next stage [rows, D]
  std::vector<bool> owned_;         // per parameter (store order): counted in the norm by this stage
  std::vector<bool> updated_;       // per parameter: owned or the tied copy (updated_parameters())
  std::vector<Tensor*> all_grads_;  // gradients this stage scales when clipping (the tied copy too)
  Compression boundary_ = Compression::none;
  std::vector<std::uint32_t> words_;  // a compressed transfer's payload
  std::vector<float> decoded_;        // what a sent payload stands for (measured steps)
  Tensor host_;                       // CUDA ranks: on_host()'s buffer
  std::vector<double> boundary_sums_;  // per boundary: activations' Σ‖x − x̂‖², Σ‖x‖², then gradients' (4 each)
  std::vector<double> boundary_error_;  // of the last recorded step: activations' per boundary, then gradients'
  SeriesId boundary_steps_series_, activation_error_series_, gradient_error_series_;
};

}  // namespace proplab
