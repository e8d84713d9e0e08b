// train/recorder: turns the probes' tensors into per-record statistics rows of the run file.
//
// On a recorded step the trainer passes the Recorder as the models' ProbeSink: every probed activation and
// gradient is summarised into mergeable float64 moment sums (probe/moments.h) right after the op that made it;
// micro-batches merge into the same sums. After the update the Recorder adds the parameter statistics and appends
// one row per statistic to the run file. On other steps it is not called at all.
//
// Schedule: step 0 (the first forward/backward, before any update: the state at initialisation), every `every`
// steps, the last step, and with log_spaced also 1, 2, 3, 5, 8, 13, ... (Fibonacci).
//
// Run-file layout it creates (docs/run-format.md): /steps [n_records]; /probes/{name,depth,block,kind} [P];
// /blocks/{stage,transition} [n_blocks] (models whose blocks form stages);
// /forward/<stat>, /backward/<stat> [n_records, P]; /params/name [n_params]; /params/<stat> [n_records, n_params].
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dist/communicator.h"
#include "io/run_file.h"
#include "io/run_reader.h"
#include "nn/parameter.h"
#include "ops/ops.h"
#include "probe/moments.h"
#include "probe/probe.h"
#include "train/config.h"

namespace proplab {

// The parameter statistics, in column order of their names.
enum class ParamStat { weight_rms, grad_rms, update_ratio };
const std::vector<std::string>& param_stat_names();

// True when `step` (0-based) of a run of `total_steps` is recorded under `config`.
bool is_recorded_step(const RecordConfig& config, std::int64_t step, std::int64_t total_steps);

class Recorder final : public ProbeSink {
 public:
  // UserError for unknown statistic names.
  Recorder(const RecordConfig& config, const std::vector<ProbeInfo>& probes, ParameterStore& params,
           std::int64_t total_steps);

  bool records(std::int64_t step) const { return is_recorded_step(config_, step, total_steps_); }
  // Creates the datasets (call between RunWriter::create and start).
  void create_datasets(RunWriter& writer);
  // Writes the model's stage layout (Model::block_layout), /blocks/stage and /blocks/transition [n_blocks], when
  // there is one (call with create_datasets); nothing when `blocks` is empty. It must cover every probe's block.
  void write_block_layout(RunWriter& writer, const std::vector<BlockInfo>& blocks) const;
  // Appends the records of a previous run file with step < before_step (resume).
  void copy_history(const RunReader& previous, RunWriter& writer, std::int64_t before_step);

  // A recorded step: begin_step, then the model's forward/backward with this sink, then before_update,
  // the optimizer update measuring into update_norms(), after_update, then write_record.
  void begin_step();
  void before_update();
  std::vector<ops::UpdateNorms>& update_norms() { return update_norms_; }
  // Instead of an update (a step that diverged before it): weights measured as they are, update 0.
  void skip_update();
  void after_update();
  // Appends the step's rows and flushes the file (SWMR readers see the record at once). Returns "" or, when some
  // statistic is non-finite, the first probe (in depth order, forward before backward) or parameter that went
  // non-finite, e.g. "blocks.3.attn.out (forward)".
  std::string write_record(RunWriter& writer, std::int64_t step);

  // Data parallel (and pipeline stages): merges every rank's probe sums into rank 0's. Each probe's sums are
  // re-centred on the shift of the lowest rank that saw it and added in one sum over the group, whose size does not
  // grow with the ranks (power sums add exactly; a probe a rank did not see adds zeros); max |x| in one maximum.
  // In a CUDA run (set_device) the sum runs on device buffers, over NCCL when the group has it. Call on every rank
  // of the group after the step's backward passes; then rank 0 writes the record.
  void merge_replicas(dist::Communicator& group);
  // Where the run computes: the sums are merged through device buffers on a GPU.
  void set_device(Device device) { device_ = device; }
  // The parameter statistics of the step, [stat][parameter] (pipeline stages fill in the rows they own).
  std::vector<std::vector<double>>& param_rows() { return param_rows_; }
  // Tensor parallelism: parameters split over `group` (ParamShard) get their statistics from the full tensors
  // (sums of squares summed over the group, train/tensor_parallel.h). Every rank of the group then calls
  // before_update and after_update together.
  void set_tensor_parallel(dist::Communicator* group) { tensor_group_ = group; }

  // ProbeSink
  void forward(int probe_index, const Tensor& x, std::int64_t sequences) override;
  void backward(int probe_index, const Tensor& d_x, std::int64_t sequences) override;
  probe::MomentSums* gathered(int probe_index, bool backward, probe::StatSelection& which) override;
  void attention_logits(int probe_index, const probe::LogitSums& sums, const Tensor& qkv, int heads,
                        float logit_scale) override;
  // CPU images are summed in place (probe::accumulate_planes); GPU ones take the channels-last copy.
  bool image(int probe_index, const Tensor& x, bool backward) override;

 private:
  void accumulate_into(probe::MomentSums& sums, const Tensor& x, std::int64_t sequences,
                       const probe::StatSelection& which);

  RecordConfig config_;
  std::vector<ProbeInfo> probes_;
  ParameterStore& params_;
  dist::Communicator* tensor_group_ = nullptr;
  Device device_ = Device::cpu;
  std::int64_t total_steps_;
  probe::StatSelection forward_stats_, backward_stats_;
  std::vector<ParamStat> param_stats_;
  std::vector<probe::MomentSums> forward_sums_, backward_sums_;
  std::vector<bool> forward_seen_, backward_seen_;
  std::vector<ops::UpdateNorms> update_norms_;   // per parameter, filled by the optimizer's update
  std::vector<std::vector<double>> param_rows_;  // [stat][param]
  // Series ids.
  SeriesId steps_series_;
  std::vector<SeriesId> forward_series_, backward_series_, param_series_;
};

}  // namespace proplab
