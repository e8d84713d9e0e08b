#include "train/trainer.h"

#include <cerrno>
#include <chrono>
#include <cmath>
#include <ostream>
#include <sstream>

#include "core/device.h"
#include "core/parallel.h"
#include "dist/cuda_communicator.h"
#include "data/dataset.h"
#include "data/images.h"
#include "io/checkpoint.h"
#include "io/run_reader.h"
#include "models/model.h"
#include "models/profile.h"
#include "models/sequence_parallel.h"
#include "models/tensor_parallel.h"
#include "ops/gemm.h"
#include "ops/ops.h"
#include "train/data_parallel.h"
#include "train/optimizer.h"
#include "train/pipeline.h"
#include "train/progress.h"
#include "train/recorder.h"
#include "train/run_files.h"
#include "train/sequence_parallel.h"
#include "train/tensor_parallel.h"
#include "train/theory_run.h"

namespace proplab {

namespace {

// The data side of a run: token data for the transformer, vectors for the MLP, images for the ResNet, behind one
// batch() call.
class RunData {
 public:
  RunData(const RunSpec& spec, std::int64_t micro_batch) {
    if (spec.model.kind() == ModelKind::transformer) {
      const TransformerConfig& m = spec.model.transformer();
      tokens_ = make_token_dataset(spec.data, m.vocab, m.seq_len, spec.seed);
      if (tokens_->vocab() > m.vocab)
        throw UserError("data: the data uses " + std::to_string(tokens_->vocab()) + " token ids but model.vocab is " +
                        std::to_string(m.vocab) + "; allowed: model.vocab >= " + std::to_string(tokens_->vocab()));
      batch_.inputs = Tensor::empty({micro_batch, m.seq_len}, DType::i32);
      batch_.targets = Tensor::empty({micro_batch, m.seq_len}, DType::i32);
    } else if (spec.model.kind() == ModelKind::resnet) {
      const ResnetConfig& m = spec.model.resnet();
      images_ = make_image_dataset(spec.data, m.in_channels, m.image_size, m.classes, spec.seed);
      batch_.inputs = Tensor::empty({micro_batch, m.in_channels, m.image_size, m.image_size});
      batch_.targets = Tensor::empty({micro_batch}, DType::i32);
    } else {
      const MlpConfig& m = spec.model.mlp();
      const bool classification = m.head == MlpHead::classification;
      vectors_ = make_vector_dataset(spec.data, m.input_dim, m.outputs, classification, spec.seed);
      batch_.inputs = Tensor::empty({micro_batch, m.input_dim});
      batch_.targets =
          classification ? Tensor::empty({micro_batch}, DType::i32) : Tensor::empty({micro_batch, m.outputs});
    }
  }

  const Batch& batch(Split split, std::int64_t index) {
    if (images_)
      images_->batch(split, index, batch_.inputs, batch_.targets);
    else if (tokens_)
      tokens_->batch(split, index, batch_.inputs, batch_.targets);
    else
      vectors_->batch(split, index, batch_.inputs, batch_.targets);
    return batch_;
  }

  std::optional<double> loss_floor() const {
    if (images_) return std::nullopt;
    return tokens_ ? tokens_->entropy_rate() : vectors_->loss_floor();
  }
  std::string describe() const {
    if (images_) return images_->describe();
    return tokens_ ? tokens_->describe() : vectors_->describe();
  }

 private:
  std::unique_ptr<TokenDataset> tokens_;
  std::unique_ptr<VectorDataset> vectors_;
  std::unique_ptr<ImageDataset> images_;  // resnet
  Batch batch_;
};

std::map<std::string, Tensor> checkpoint_tensors(Model& model,
                                                 const std::vector<std::pair<std::string, Tensor>>& optimizer_state) {
  std::map<std::string, Tensor> tensors;
  for (auto& p : model.params().all()) tensors.emplace("param/" + p->name, p->value);
  for (auto& [name, tensor] : optimizer_state) tensors.emplace("optim/" + name, tensor);
  for (auto& [name, tensor] : model.buffers()) tensors.emplace("buffer/" + name, *tensor);
  return tensors;
}

std::string layout_text(const ParallelConfig& p) {
  std::ostringstream out;
  out << "dp=" << p.dp << " tp=" << p.tp << " pp=" << p.pp;
  if (p.sp != 1) out << " sp=" << p.sp;
  if (p.compress == "topk")
    out << " compress=topk(ratio=" << p.compress_ratio << ")";
  else if (p.compress == "powersgd")
    out << " compress=powersgd(rank=" << p.compress_rank << ")";
  else if (p.compress != "none")
    out << " compress=" << p.compress;
  if (p.pp_compress != "none") out << " pp_compress=" << p.pp_compress;
  return out.str();
}

// The resolved study as it defines the experiment: outcome_config without [parallel] and [device], which say how it
// runs. A checkpoint (full tensors) resumes under another layout or thread count.
std::string experiment_config(const std::string& toml) {
  std::istringstream in(outcome_config(toml));
  std::ostringstream out;
  std::string line;
  bool skip = false;
  while (std::getline(in, line)) {
    if (!line.empty() && line.front() == '[') skip = line == "[parallel]" || line == "[device]";
    if (!skip) out << line << '\n';
  }
  return out.str();
}

}  // namespace

bool cuda_built() {
#ifdef PROPLAB_WITH_CUDA
  return true;
#else
  return false;
#endif
}

std::string device_description(Device device) {
  if (device == Device::cpu) return "cpu";
  const GpuInfo gpu = gpu_info();
  return "cuda:" + std::to_string(gpu.ordinal) + " " + gpu.name + " (" + format_bytes(gpu.total_bytes) + ")";
}

namespace {

// device.type resolved for this build, machine and run (run_device without the precision check).
Device resolve_device_type(const RunSpec& spec) {
  const std::string& type = spec.device.type;
  if (type == "cpu") return Device::cpu;
  const bool built = cuda_built();
  if (type == "cuda") {
    if (!built)
      throw UserError(
          "device.type = \"cuda\": this proplab build has no CUDA backend (it was configured without nvcc); "
          "allowed here: \"cpu\" or \"auto\"");
    if (spec.model.kind() == ModelKind::resnet && spec.scaling.rule == "fixup")
      throw UserError(
          "device.type = \"cuda\": the scalar biases of scaling.rule = \"fixup\" do not train on CUDA in this "
          "version; allowed with fixup: \"cpu\" or \"auto\"");
    if (!cuda_available())
      throw UserError(
          "device.type = \"cuda\": no CUDA GPU is present on this machine (the driver reports none); allowed "
          "here: \"cpu\" or \"auto\"");
    return Device::cuda;
  }
  // auto: the GPU when there is one and the run can use it (one process; not Fixup's scalar biases), else the CPU.
  // A parallel layout computes on GPUs only when it asks for them (device.type = "cuda"), so that the same
  // mpirun line means the same thing on a machine with a GPU and on one without.
  const bool fits =
      !(spec.model.kind() == ModelKind::resnet && spec.scaling.rule == "fixup") && spec.parallel.world() == 1;
  return built && fits && cuda_available() ? Device::cuda : Device::cpu;
}

}  // namespace

MatmulPrecision run_precision(const RunSpec& spec) {
  const std::string& precision = spec.device.precision;
  if (precision == "fp32") return MatmulPrecision::fp32;
  if (precision == "bf16") return MatmulPrecision::bf16;
  throw UserError("device.precision = \"" + precision + "\": unknown precision; allowed: \"fp32\" or \"bf16\"");
}

Device run_device(const RunSpec& spec) {
  const MatmulPrecision precision = run_precision(spec);
  const Device device = resolve_device_type(spec);
  if (device == Device::cpu && precision == MatmulPrecision::bf16) {
    std::string why = "device.type = \"" + spec.device.type + "\"";
    if (spec.device.type != "cpu") why += " resolved to the CPU (no GPU this run can use)";
    throw UserError("device.precision = \"bf16\": bf16 matrix products run only on the GPU, but " + why +
                    "; allowed on the CPU: \"fp32\"");
  }
  return device;
}

namespace {

// Stage 1 of a run: what the launch and the study say about the layout, checked before anything is read or
// written (every rank checks the same).
struct RunLayout {
  dist::Communicator* tensor = nullptr;  // the ranks that share one model replica; null for tp = 1
  dist::Communicator* sequence = nullptr;  // the ring that shares every sequence; null for sp = 1
  int ring = 1;                            // its ranks
  dist::Communicator* group = nullptr;   // the data-parallel replicas; null for one process
  int replicas = 1;
  // The ranks that sum their gradients: the replicas and, with a ring, their rings (dp·sp); null for one process.
  dist::Communicator* exchange = nullptr;
  bool root = true;             // this rank writes the run file and checkpoints
  std::int64_t micro = 0;       // rows of a micro-batch
  std::int64_t local_rows = 0;  // this replica's rows of it
  std::int64_t first_row = 0;
};

RunLayout check_layout(const RunSpec& spec, const RunOptions& options) {
  // device.type names a device this build and machine have, for a run that can use it, in a precision it has
  run_device(spec);
  if ((spec.parallel.tp > 1 || spec.parallel.pp > 1) &&
      (spec.parallel.zero != 0 || spec.parallel.dp_mode != "allreduce"))
    throw UserError(
        "parallel: zero = 1, dp_mode = \"local_sgd\" and dp_mode = \"gossip\" combine with data and sequence "
        "parallelism only in this version; allowed with tp > 1 or pp > 1: zero = 0, dp_mode = \"allreduce\"");
  // (a ring's ranks hold parts of one replica's gradient: they must sum it every step)
  if (spec.parallel.sp > 1 && spec.parallel.dp_mode != "allreduce")
    throw UserError("parallel.dp_mode = \"" + spec.parallel.dp_mode +
                    "\" with parallel.sp = " + std::to_string(spec.parallel.sp) +
                    ": each replica steps on its own gradient, but a sequence-parallel ring holds parts of one "
                    "replica's gradient; allowed with sp > 1: dp_mode = \"allreduce\"");
  RunLayout layout;
  // Sequence parallel: the ranks that share every sequence, each holding a part of its tokens.
  check_sequence_parallel(spec.model, spec.parallel.sp);
  layout.sequence = options.sequence_parallel;
  layout.ring = layout.sequence ? layout.sequence->size() : 1;
  if (layout.ring != spec.parallel.sp)
    throw UserError("parallel.sp = " + std::to_string(spec.parallel.sp) + " needs " + std::to_string(spec.parallel.sp) +
                    " processes per sequence (mpirun -np " + std::to_string(spec.parallel.world()) +
                    " proplab run ...), but " + std::to_string(layout.ring) + " were started");
  if (layout.ring == 1) layout.sequence = nullptr;
  // Tensor parallel: the ranks that share one model replica, each holding a piece of it.
  layout.tensor = options.tensor_parallel;
  const int tensor_ranks = layout.tensor ? layout.tensor->size() : 1;
  if (tensor_ranks != spec.parallel.tp)
    throw UserError("parallel.tp = " + std::to_string(spec.parallel.tp) + " needs " + std::to_string(spec.parallel.tp) +
                    " processes per replica (mpirun -np " + std::to_string(spec.parallel.world()) +
                    " proplab run ...), but " + std::to_string(tensor_ranks) + " were started");
  check_tensor_parallel(spec.model, spec.parallel.tp);
  if (tensor_ranks == 1) layout.tensor = nullptr;
  layout.group = options.data_parallel;
  layout.replicas = layout.group ? layout.group->size() : 1;
  if (layout.replicas != spec.parallel.dp)
    throw UserError("parallel.dp = " + std::to_string(spec.parallel.dp) + " needs " + std::to_string(spec.parallel.dp) +
                    " processes (mpirun -np " + std::to_string(spec.parallel.dp) + " proplab run ...), but " +
                    std::to_string(layout.replicas) + " were started");
  layout.root = (!layout.group || layout.group->rank() == 0) && (!options.pipeline || options.pipeline->rank() == 0) &&
                (!layout.tensor || layout.tensor->rank() == 0) && (!layout.sequence || layout.sequence->rank() == 0);
  layout.micro = spec.train.batch / spec.train.grad_accum;
  if (layout.micro % layout.replicas != 0)
    throw UserError("parallel.dp = " + std::to_string(layout.replicas) +
                    " must divide the micro-batch train.batch / train.grad_accum = " + std::to_string(layout.micro) +
                    "; allowed: a dp that divides it");
  check_pipeline_layout(spec, options.pipeline, layout.replicas);
  layout.local_rows = layout.micro / layout.replicas;
  layout.first_row = layout.group ? layout.group->rank() * layout.local_rows : 0;
  layout.exchange = layout.sequence ? options.gradient_sum : layout.group;
  PROPLAB_CHECK(!layout.sequence || (layout.exchange && layout.exchange->size() == layout.replicas * layout.ring),
                "a sequence-parallel run sums its gradients over dp·sp ranks");
  return layout;
}

// One run in progress, in the stages run_training calls in order: set up (the constructor), resume (with
// --resume), open the run file, train, finish. Every rank runs every stage; only rank 0 writes.
class TrainingRun {
 public:
  TrainingRun(const RunSpec& spec, const RunOptions& options, const RunLayout& layout);
  // Loads the checkpoint: parameters, optimizer state and the step to go on from.
  void resume();
  // Rank 0: creates the run file, with a resumed run's history before the checkpoint copied from the previous one.
  void open_run_file();
  // The step loop, until the last step or a stop (interrupt, --stop-after, divergence, an I/O failure, a timeout).
  void train();
  // The final checkpoint, the run file's status and the final line.
  RunSummary finish();

 private:
  using Clock = std::chrono::steady_clock;

  // One step; false when the run stops here.
  bool run_step();
  // Forward and backward over the step's micro-batches (the recorder sees every probe when `record`); the loss.
  double forward_backward(bool record);
  // Clips by the norm of the whole model's gradient: over the stages, a tensor group's pieces, or (zero = 1) the
  // replicas' slices. The norm before clipping.
  double clip(bool full);
  // Records the step whose loss or gradient norm went non-finite and ends the run as diverged.
  void end_diverged(double loss, double grad_norm, double lr, bool recorded);
  double evaluate();
  void save(std::int64_t step);
  // The layout a checkpoint's compression state belongs to: [parallel] as the run file's layout attribute says it
  // (without pp_compress, which keeps no state, and without the device transport), and the number of processes.
  std::string compression_layout() const {
    ParallelConfig layout = spec_.parallel;
    layout.pp_compress = "none";
    return layout_text(layout) + " ranks=" + std::to_string(options_.world ? options_.world->size() : 1);
  }
  // Runs a write of rank 0's; a write the operating system refuses stops the run at the next step boundary.
  template <typename Write>
  void guarded(bool checkpoint, Write&& write) {
    if (io_failure_) return;
    try {
      write();
    } catch (const IoError& error) {
      // The run file's writer thread reports a refused write at a later call: the failure belongs to the step
      // whose rows it was writing, the one after the last training row appended before they were handed over.
      const std::optional<std::int64_t> last_handed_over =
          checkpoint ? std::nullopt : writer_->failed_write_last_train_step();
      const std::int64_t step = last_handed_over ? *last_handed_over + 1 : step_;
      io_failure_ =
          IoFailure{checkpoint, checkpoint ? summary_.checkpoint.string() : error.path(), error.reason(), step};
    }
  }
  // A batch on the model's device: batches are made on the host (pure functions of seed and index) and copied over.
  Batch on_device(const Batch& batch) const {
    if (device_ == Device::cpu) return batch;
    return Batch{batch.inputs.to(device_), batch.targets.to(device_)};
  }
  // This replica's rows of a micro-batch (all of them for one process), on the model's device; with a
  // sequence-parallel ring, this rank's part of their tokens.
  Batch local(const Batch& batch) const {
    const Batch rows = layout_.replicas == 1 ? batch
                                             : Batch{batch.inputs.slice(0, layout_.first_row, layout_.local_rows),
                                                     batch.targets.slice(0, layout_.first_row, layout_.local_rows)};
    return on_device(in_ring(rows));
  }
  // This rank's part of every sequence of a batch (the batch itself without a ring).
  Batch in_ring(const Batch& batch) const {
    if (!layout_.sequence) return batch;
    return sequence_piece(batch, layout_.sequence->rank(), layout_.ring);
  }

  const RunSpec& spec_;
  const RunOptions& options_;
  const TrainConfig& tc_;
  const RunLayout layout_;
  const Device device_;
  RunData data_;
  // The run's scaling rule, built once for the model and for what theory predicts for every probe at
  // initialisation (stored beside the measurements by rank 0). A rule with a profiling pass (Admin) profiles a
  // temporary model of its own, once.
  const std::unique_ptr<ScalingRule> rule_;
  theory::ProbePrediction prediction_;
  std::unique_ptr<Model> model_;
  std::optional<PipelineStage> stage_;  // pipeline parallel: this rank's stage of the model
  PipelineStage* pipeline_ = nullptr;
  std::optional<DataParallel> data_parallel_;
  std::optional<Optimizer> optimizer_;
  std::optional<Recorder> recorder_;
  std::optional<TensorParallelSink> tensor_sink_;  // records split probes whole, replicated ones once
  std::optional<SequenceParallelSink> sequence_sink_;  // records every probe over the whole sequences
  ProbeSink* sink_ = nullptr;

  RunSummary summary_;
  std::int64_t start_step_ = 0;
  std::optional<RunWriter> created_;
  RunWriter* writer_ = nullptr;  // rank 0's run file; null elsewhere
  double wall_offset_ = 0.0;     // a resumed run's wall time goes on from where the previous file ended
  // A write the operating system refuses (disk full, quota, read-only or vanished directory) stops the run at the
  // next step boundary: nothing more is written, and no later checkpoint is taken (it would run ahead of the run
  // file's records), so --resume continues from the last good one without a gap.
  std::optional<IoFailure> io_failure_;
  std::optional<std::int64_t> checkpoint_step_;  // of the last good checkpoint of this run
  std::int64_t step_ = 0;
  RunStatus status_ = RunStatus::completed;
  std::string detail_;
  std::ostream silent_{nullptr};
  std::optional<Progress> progress_;
  Clock::time_point run_start_;
  double tokens_per_step_ = 0.0;
};

TrainingRun::TrainingRun(const RunSpec& spec, const RunOptions& options, const RunLayout& layout)
    : spec_(spec),
      options_(options),
      tc_(spec.train),
      layout_(layout),
      device_(run_device(spec)),
      data_(spec, layout.micro),
      rule_(make_model_rule(spec.model, spec.scaling, spec.seed)) {
  if (layout_.root) prediction_ = predict_for_run(spec, *rule_);
  model_ = make_model(spec.model, *rule_, spec.seed, layout_.tensor, layout_.sequence);
  // Initialised on the host (the same values on every device), then moved before anything refers to the tensors.
  model_->to_device(device_);
  if (spec.parallel.pp > 1)
    stage_.emplace(spec, *model_, *options.pipeline, layout_.group, layout_.tensor, layout_.sequence);
  pipeline_ = stage_ ? &*stage_ : nullptr;
  // (a stage's replicas exchange only the gradients it updates)
  // (with a ring, over the replicas and their rings: every rank's gradient is a part of the global one)
  data_parallel_.emplace(spec.parallel, layout_.exchange, model_->params(),
                         pipeline_ ? pipeline_->updated_parameters() : std::vector<bool>{}, spec.seed);
  data_parallel_->set_overlap(options.overlap_buckets);
  optimizer_.emplace(tc_, model_->params(), data_parallel_->optimizer_shard());
  recorder_.emplace(spec.record, model_->probes(), model_->params(), tc_.steps);
  recorder_->set_tensor_parallel(layout_.tensor);
  recorder_->set_device(device_);
  // The probes' path to the recorder: tensor-parallel pieces whole, then the ring's tokens whole.
  ProbeSink* recorded = &*recorder_;
  if (layout_.sequence) recorded = &sequence_sink_.emplace(*recorder_, *layout_.sequence);
  if (layout_.tensor) recorded = &tensor_sink_.emplace(*recorded, model_->probes(), *layout_.tensor);
  sink_ = recorded;
  if (layout_.root) {
    PROPLAB_CHECK(prediction_.probes.size() == model_->probes().size(), "theory predicts ", prediction_.probes.size(),
                  " probes, the model has ", model_->probes().size());
    for (std::size_t i = 0; i < prediction_.probes.size(); ++i)
      PROPLAB_CHECK(prediction_.probes[i].name == model_->probes()[i].name, "theory probe ", prediction_.probes[i].name,
                    " at depth ", i, " is ", model_->probes()[i].name, " in the model");
  }
  summary_.run_file = run_file_path(options.out_dir, spec.name);
  summary_.checkpoint = checkpoint_path(options.out_dir, spec.name);
  summary_.entropy_rate = data_.loss_floor();
}

void TrainingRun::resume() {
  if (!std::filesystem::exists(summary_.checkpoint))
    throw UserError("--resume: no checkpoint at " + summary_.checkpoint.string() + " to resume from");
  // Full tensors in the file: a tensor-parallel rank reads them whole and keeps its pieces; with zero = 1 each
  // replica keeps its slice of the optimizer state.
  const auto optimizer_state = data_parallel_->optimizer_state_to_load(*optimizer_);
  std::map<std::string, Tensor> local = checkpoint_tensors(*model_, optimizer_state);
  const std::map<std::string, Tensor> targets = full_tensor_targets(model_->params(), local);
  // The compressed exchange's error feedback, this rank's own, when the checkpoint has it under this layout (any
  // other layout's is skipped: the state then starts afresh).
  GradientCompressor* compressor = data_parallel_->compressor();
  const std::vector<float> fresh = compressor ? compressor->state() : std::vector<float>{};
  const std::string state_name = "compression/state/" + std::to_string(options_.world ? options_.world->rank() : 0);
  std::map<std::string, Tensor> optional;
  if (!fresh.empty()) optional.emplace(state_name, Tensor::empty({static_cast<std::int64_t>(fresh.size())}));
  // (io/checkpoint reads into tensors on any device: a run checkpointed on a GPU resumes on the CPU and back)
  Checkpoint loaded = load_checkpoint(summary_.checkpoint, targets, optional, {"compression/"});
  keep_local_pieces(model_->params(), targets, local);
  data_parallel_->after_optimizer_load(*optimizer_, optimizer_state);
  if (experiment_config(loaded.string_value("config")) != experiment_config(spec_.config_toml))
    throw UserError("--resume: the study differs from the one the checkpoint " + summary_.checkpoint.string() +
                    " was written with; resume with the same study and --set options (only [parallel] and "
                    "[device] may change)");
  if (!fresh.empty()) {
    const auto layout = loaded.strings.find("compression/layout");
    const auto state = loaded.tensors.find(state_name);
    const bool same_layout = layout != loaded.strings.end() && layout->second == compression_layout();
    // Every rank takes its state back, or none does (a rank whose state is missing restarts them all).
    double found = same_layout && state != loaded.tensors.end() ? 1.0 : 0.0;
    if (options_.world) options_.world->all_reduce(&found, 1, dist::ReduceOp::min);
    if (found == 1.0) {
      compressor->set_state(state->second.to_vector());
    } else if (layout_.root && options_.log) {
      *options_.log << "proplab: " << spec_.name << ": the " << compression_name(compressor->scheme())
                    << " error feedback starts afresh: the checkpoint was written "
                    << (layout == loaded.strings.end() ? std::string("without it")
                        : !same_layout                 ? "under another layout (" + layout->second + ")"
                                                       : std::string("without every rank's state"))
                    << "\n";
    }
  }
  start_step_ = loaded.int_value("step");
  optimizer_->set_steps_taken(loaded.int_value("optimizer_steps"));
  model_->after_parameter_load();
  checkpoint_step_ = start_step_;
}

void TrainingRun::open_run_file() {
  step_ = start_step_;
  if (!layout_.root) return;
  RunHeader header;
  header.proplab_version = options_.proplab_version;
  header.config = spec_.config_toml;
  header.device = device_description(device_);
  header.threads = threads();
  header.layout = layout_text(spec_.parallel);
  if (!options_.device_comm.empty()) header.layout += " comm=" + options_.device_comm;
  header.precision = matmul_precision_name(run_precision(spec_));
  // The CPU libraries and kernels differ in the last bits (ops/gemm.h, ops::ConvKernel): the file says which ran.
  if (device_ == Device::cpu)
    header.kernels =
        "sgemm: " + ops::gemm_backend_name() + "; conv: " +
        (!ops::conv_direct_supported() || ops::conv_kernel() == ops::ConvKernel::im2col ? "im2col"
         : ops::conv_kernel() == ops::ConvKernel::direct                                ? "direct (AVX-512) and im2col"
                                                         : "winograd F(2x2,3x3), direct (AVX-512) and im2col");
  // A resumed run rewrites its file: the history before the checkpoint comes from the previous file, moved aside
  // and read while the new one is written.
  std::filesystem::path previous_copy = summary_.run_file;
  previous_copy += ".resume";
  std::optional<RunReader> previous;
  TrainCurves history;
  EvalCurves eval_history;
  if (options_.resume && std::filesystem::exists(summary_.run_file)) {
    std::filesystem::rename(summary_.run_file, previous_copy);
    try {
      previous.emplace(RunReader::open(previous_copy));
      history = previous->read_train();
      eval_history = previous->read_eval();
    } catch (...) {
      previous.reset();
      std::filesystem::rename(previous_copy, summary_.run_file);
      throw;
    }
  }
  try {
    created_.emplace(RunWriter::create(summary_.run_file, header, options_.force || options_.resume));
    recorder_->create_datasets(*created_);
    data_parallel_->create_datasets(*created_);
    if (pipeline_) pipeline_->create_datasets(*created_);
    recorder_->write_block_layout(*created_, model_->block_layout());
    write_theory(*created_, prediction_);
    created_->start();
    if (previous) {
      // A resumed run's file holds the whole history: rows before the checkpoint come from the previous file,
      // flushed before that file goes.
      recorder_->copy_history(*previous, *created_, start_step_);
      data_parallel_->copy_history(*previous, *created_, start_step_);
      if (pipeline_) pipeline_->copy_history(*previous, *created_, start_step_);
      for (std::size_t i = 0; i < history.size() && history.step[i] < start_step_; ++i) {
        created_->append_train({history.step[i], history.loss[i], history.lr[i], history.grad_norm[i],
                                history.tokens_per_s[i], history.wall_time[i]});
        wall_offset_ = history.wall_time[i];
      }
      for (std::size_t i = 0; i < eval_history.size() && eval_history.step[i] <= start_step_; ++i)
        created_->append_eval({eval_history.step[i], eval_history.loss[i]});
      created_->flush_and_wait();
    }
  } catch (...) {
    if (previous) {  // put the previous file back: nothing is lost when the new one cannot be written
      previous.reset();
      if (created_) created_->abandon(RunStatus::failed, "could not be written while resuming");
      created_.reset();
      std::filesystem::rename(previous_copy, summary_.run_file);
    }
    throw;
  }
  if (previous) {
    previous.reset();
    std::filesystem::remove(previous_copy);
  }
  writer_ = &*created_;
}

double TrainingRun::evaluate() {
  double total = 0.0;
  for (int i = 0; i < tc_.eval_batches; ++i)
    total += pipeline_ ? pipeline_->evaluate(in_ring(data_.batch(Split::validation, i)))
                       : model_->evaluate(on_device(in_ring(data_.batch(Split::validation, i))));
  if (layout_.sequence) {  // the mean over the ring's tokens
    layout_.sequence->all_reduce(&total, 1);
    total /= layout_.ring;
  }
  return total / tc_.eval_batches;
}

void TrainingRun::save(std::int64_t step) {
  // Gathered from every replica's slice with zero = 1; otherwise rank 0's (the replicas' are identical).
  std::map<std::string, Tensor> tensors =
      checkpoint_tensors(*model_, data_parallel_->optimizer_state_to_save(*optimizer_));
  if (pipeline_) pipeline_->gather_to_first_stage(tensors);  // each stage's own tensors, full size, to rank 0
  // Tensor parallel: the first replica's (first stage's) group gathers its pieces into full tensors for rank 0.
  if (layout_.tensor && (!layout_.group || layout_.group->rank() == 0) && (!pipeline_ || pipeline_->stage() == 0) &&
      (!layout_.sequence || layout_.sequence->rank() == 0))
    tensors = gather_full_tensors(*layout_.tensor, model_->params(), tensors);
  // The compressed exchange's error feedback: every rank's own state, to rank 0 (resumed under the same layout).
  if (options_.world) tensors.merge(gather_compression_state(*options_.world, data_parallel_->compressor()));
  if (!layout_.root) return;
  // A checkpoint is taken only once the run file holds everything before it (written and flushed by its writer
  // thread), so that --resume from it leaves no gap in the run file whatever happens to the rows written after it.
  guarded(false, [&] {
    writer_->flush_and_wait();
    // (a run file whose folder was removed or moved still takes writes, which no one will read)
    if (!std::filesystem::exists(summary_.run_file)) throw IoError(summary_.run_file.string(), ENOENT);
  });
  if (io_failure_) return;
  Checkpoint checkpoint;
  checkpoint.tensors = std::move(tensors);
  checkpoint.ints["step"] = step;
  checkpoint.ints["optimizer_steps"] = optimizer_->steps_taken();
  checkpoint.ints["seed"] = static_cast<std::int64_t>(spec_.seed);
  checkpoint.ints["data_position"] = step * tc_.grad_accum;  // next train batch index
  checkpoint.strings["config"] = spec_.config_toml;
  // (the layout the compression state belongs to: a resume under another one starts it afresh)
  checkpoint.strings["compression/layout"] = compression_layout();
  guarded(true, [&] {
    save_checkpoint(summary_.checkpoint, checkpoint);  // (a checkpoint that fails leaves the previous one)
    checkpoint_step_ = step;
  });
}

double TrainingRun::forward_backward(bool record) {
  if (record) recorder_->begin_step();
  model_->params().zero_grads();
  double total = 0.0;
  for (int m = 0; m < tc_.grad_accum && !pipeline_; ++m) {
    const std::int64_t index = step_ * tc_.grad_accum + m;
    StepContext context;
    context.seed = spec_.seed;
    context.micro_step = static_cast<std::uint64_t>(index);
    context.training = true;
    context.sink = record ? sink_ : nullptr;
    context.gradients = data_parallel_->listener_for(m + 1 == tc_.grad_accum);
    // Scaled so that each replica's gradients (and probed gradients) are its share of the single-process ones: the
    // sum over the group is the gradient of the global batch's mean loss.
    total +=
        model_->forward_backward(local(data_.batch(Split::train, index)),
                                 1.0f / static_cast<float>(tc_.grad_accum * layout_.replicas * layout_.ring), context);
  }
  double loss = pipeline_ ? pipeline_->forward_backward(
                                step_, record ? sink_ : nullptr,
                                [&](int m) { return local(data_.batch(Split::train, step_ * tc_.grad_accum + m)); })
                          : total / tc_.grad_accum;
  // (tensor and sequence parallel: only the rank 0 of both groups holds probe sums; the others' data groups skip)
  const bool holds_sums =
      (!layout_.tensor || layout_.tensor->rank() == 0) && (!layout_.sequence || layout_.sequence->rank() == 0);
  dist::Communicator* exchange = layout_.exchange;
  if (exchange && exchange->size() > 1) {
    // Summed, reduce-scattered, or (local modes) the replica's own; every rank's loss is its tokens' mean (the
    // ranks' token counts are equal), so the step's loss is their mean.
    data_parallel_->finish_gradients(record);
    exchange->all_reduce(&loss, 1);
    loss /= exchange->size();
  }
  if (record && holds_sums && layout_.group && layout_.replicas > 1) recorder_->merge_replicas(*layout_.group);
  if (pipeline_)  // (tp × pp: the stages merge among the tensor groups' rank 0s, as the replicas do)
    loss = pipeline_->finish_backward(loss, record && holds_sums ? &*recorder_ : nullptr);
  return loss;
}

double TrainingRun::clip(bool full) {
  if (pipeline_) return pipeline_->clip_grad_norm(tc_.grad_clip);
  return layout_.tensor ? clip_grad_norm_split(*layout_.tensor, model_->params(), tc_.grad_clip)
                        : data_parallel_->clip_gradients(tc_.grad_clip, full);
}

void TrainingRun::end_diverged(double loss, double grad_norm, double lr, bool recorded) {
  // The step is recorded (recomputed with the recorder when it was not scheduled: the step is a pure function of
  // the parameters, which have not been updated).
  if (!recorded) {
    loss = forward_backward(true);
    grad_norm = clip(true);
  }
  recorder_->before_update();
  recorder_->skip_update();
  recorder_->after_update();
  if (pipeline_) pipeline_->gather_param_stats(*recorder_);
  std::string first;
  if (layout_.root) guarded(false, [&] { first = recorder_->write_record(*writer_, step_); });
  status_ = RunStatus::diverged;
  detail_ = std::string(std::isfinite(loss) ? "gradient norm" : "loss") + " became non-finite at step " +
            std::to_string(step_) + (first.empty() ? "" : "; first non-finite probe: " + first);
  if (layout_.root)
    guarded(false, [&] {
      writer_->append_train({step_, loss, lr, grad_norm, 0.0,
                             wall_offset_ + std::chrono::duration<double>(Clock::now() - run_start_).count()});
    });
  ++step_;
}

bool TrainingRun::run_step() {
  // Every rank stops at the same step, or the others would wait forever: 1 interrupted, 2 rank 0 could not write.
  double stop = io_failure_ ? 2.0 : options_.interrupt && options_.interrupt->load() ? 1.0 : 0.0;
  if (options_.world) options_.world->all_reduce(&stop, 1, dist::ReduceOp::max);
  if (stop == 2.0) {
    status_ = RunStatus::failed;
    if (!io_failure_) detail_ = std::string(kRootCouldNotWrite) + " at step " + std::to_string(step_);
    return false;
  }
  if (stop == 1.0) {
    status_ = RunStatus::failed;
    detail_ = "interrupted at step " + std::to_string(step_) + "; continue with --resume";
    return false;
  }
  if (options_.stop_after >= 0 && step_ >= options_.stop_after) {
    status_ = RunStatus::failed;
    detail_ = "stopped at step " + std::to_string(step_) + " (--stop-after); continue with --resume";
    return false;
  }
  const auto step_start = Clock::now();
  const double lr = scheduled_lr(tc_, step_);
  const bool record = recorder_->records(step_);
  const double loss = forward_backward(record);
  const double grad_norm = clip(record);
  if (!std::isfinite(loss) || !std::isfinite(grad_norm)) {
    end_diverged(loss, grad_norm, lr, record);
    return false;
  }
  if (record) recorder_->before_update();
  data_parallel_->update(*optimizer_, lr, step_, record ? &recorder_->update_norms() : nullptr, record);
  std::string first_nonfinite;
  if (record) {
    recorder_->after_update();
    if (pipeline_) pipeline_->gather_param_stats(*recorder_);
    if (layout_.root)
      guarded(false, [&] {
        first_nonfinite = recorder_->write_record(*writer_, step_);
        data_parallel_->write_record(*writer_, step_);
        if (pipeline_) pipeline_->write_record(*writer_, step_);
      });
    if (options_.world) {  // only rank 0 (world rank 0) finalised the statistics: tell the others
      std::uint8_t nonfinite = first_nonfinite.empty() ? 0 : 1;
      options_.world->broadcast(&nonfinite, 1, 0);
      if (nonfinite && !layout_.root) first_nonfinite = "(found by rank 0)";
    }
  }
  const auto now = Clock::now();
  summary_.tokens_per_s = tokens_per_step_ / std::chrono::duration<double>(now - step_start).count();
  if (layout_.root)
    guarded(false, [&] {
      writer_->append_train({step_, loss, lr, grad_norm, summary_.tokens_per_s,
                             wall_offset_ + std::chrono::duration<double>(now - run_start_).count()});
    });
  summary_.last_loss = loss;
  ++step_;
  if (!first_nonfinite.empty() && spec_.record.on_nonfinite == "stop") {
    status_ = RunStatus::diverged;
    detail_ = "a statistic became non-finite at step " + std::to_string(step_ - 1) + ": first " + first_nonfinite;
    return false;
  }
  if ((tc_.eval_every > 0 && step_ % tc_.eval_every == 0) || step_ == tc_.steps) {
    const double eval_loss = evaluate();
    if (layout_.root) guarded(false, [&] { writer_->append_eval({step_, eval_loss}); });
    summary_.last_eval_loss = eval_loss;
  }
  if (tc_.checkpoint_every > 0 && step_ % tc_.checkpoint_every == 0) save(step_);
  progress_->update(step_, loss, summary_.last_eval_loss, summary_.tokens_per_s);
  return true;
}

void TrainingRun::train() {
  if (options_.log)
    *options_.log << "proplab: " << spec_.name << ": " << data_.describe() << "; "
                  << model_->params().count_full_elements() << " parameters; " << threads() << " threads"
                  << (start_step_ > 0 ? "; resuming at step " + std::to_string(start_step_) : "") << "\n";
  progress_.emplace(options_.log ? *options_.log : silent_, options_.terminal, tc_.steps);
  run_start_ = Clock::now();
  tokens_per_step_ = static_cast<double>(tc_.batch) * static_cast<double>(model_->tokens_per_sample());
  // A collective that times out (a rank died or stalled) ends the run as failed, with every record so far flushed;
  // the caller then ends the other ranks (dist::abort_all).
  try {
    while (step_ < tc_.steps && run_step()) {
    }
  } catch (const dist::CollectiveTimeout& e) {
    status_ = RunStatus::failed;
    detail_ = e.what();
    summary_.collective_timeout = true;
  } catch (const DeviceMemoryError& e) {
    // The step that ran out is abandoned; every record before it is in the run file, and the last checkpoint stays
    // the one to resume from (no checkpoint of a half-done step).
    status_ = RunStatus::failed;
    detail_ = std::string(e.what()) + " at step " + std::to_string(step_);
    summary_.out_of_memory = true;
  }
}

RunSummary TrainingRun::finish() {
  summary_.steps_done = step_;
  summary_.gradient_exchange_s = data_parallel_->exchange_seconds();
  bool write_failed = io_failure_.has_value();
  if (options_.world && !summary_.collective_timeout) {
    // Rank 0's write failures in the last step reach the others here (earlier ones stopped the loop).
    double failed = io_failure_ ? 1.0 : 0.0;
    options_.world->all_reduce(&failed, 1, dist::ReduceOp::max);
    write_failed = failed != 0.0;
    if (failed != 0.0 && !layout_.root) {
      summary_.io_failure = true;
      summary_.message = spec_.name + ": " + kRootCouldNotWrite + " (it says what and why)";
      if (status_ != RunStatus::diverged) {  // (a diverged run takes no final checkpoint on any rank)
        status_ = RunStatus::failed;
        detail_ = kRootCouldNotWrite;
      }
    }
  }
  // No checkpoint after a timeout: it may have struck between the update and the step count. A run that completes
  // takes one unless train.final_checkpoint = false; one whose last step's rows rank 0 could not write still does
  // (rank 0's status says completed until end_after_io_failure, and every rank must agree: the save gathers).
  const bool wanted = tc_.final_checkpoint || status_ != RunStatus::completed || write_failed;
  if (wanted && status_ != RunStatus::diverged && !summary_.collective_timeout && !summary_.out_of_memory) save(step_);
  summary_.status = status_;
  summary_.detail = status_ == RunStatus::completed ? "completed " + std::to_string(step_) + " steps" : detail_;
  if (layout_.root) guarded(false, [&] { writer_->finish(status_, summary_.detail); });
  if (layout_.root && io_failure_)
    end_after_io_failure(*io_failure_, *writer_, spec_.name, checkpoint_step_, options_, summary_);
  std::ostringstream final_line;
  final_line << "proplab: " << spec_.name << ": " << run_status_name(summary_.status) << " (" << summary_.detail << ")";
  if (summary_.last_eval_loss) final_line << "; validation loss " << *summary_.last_eval_loss;
  if (summary_.entropy_rate) final_line << " (data entropy rate " << *summary_.entropy_rate << ")";
  final_line << "; run file " << summary_.run_file.string();
  // (an I/O failure's message is the caller's to print, on stderr)
  progress_->finish(summary_.io_failure ? std::string() : final_line.str());
  return summary_;
}

}  // namespace

std::string outcome_config(const std::string& config_toml) {
  std::istringstream in(config_toml);
  std::ostringstream out;
  std::string line;
  bool train = false;
  while (std::getline(in, line)) {
    if (!line.empty() && line.front() == '[') train = line == "[train]";
    if (!(train && line.starts_with("final_checkpoint ="))) out << line << '\n';
  }
  return out.str();
}

std::filesystem::path checkpoint_path(const std::filesystem::path& out_dir, const std::string& name) {
  return out_dir / (name + ".ckpt.h5");
}

void use_process_groups(RunOptions& options, const dist::ProcessGroups& groups) {
  if (groups.world->size() == 1) return;
  options.world = groups.world.get();
  options.data_parallel = groups.data.get();
  if (groups.layout.pp > 1) options.pipeline = groups.pipeline.get();
  if (groups.tensor->size() > 1) options.tensor_parallel = groups.tensor.get();
  if (groups.sequence->size() > 1) {
    options.sequence_parallel = groups.sequence.get();
    options.gradient_sum = groups.gradient.get();
  }
}

dist::ProcessGroups make_run_process_groups(const RunSpec& spec, RunOptions& options) {
  std::unique_ptr<dist::Communicator> world = dist::make_mpi_world(spec.parallel.timeout_s);
  if (world->size() > 1 && run_device(spec) == Device::cuda) {
    dist::CudaRanks ranks;
    world = dist::make_cuda_world(std::move(world), spec.parallel.comm, spec.parallel.timeout_s, &ranks);
    options.device_comm = dist::device_transport_name(ranks.transport);
  }
  dist::ProcessGroups groups = dist::make_process_groups(
      std::move(world), dist::Layout{spec.parallel.dp, spec.parallel.tp, spec.parallel.pp, spec.parallel.sp});
  use_process_groups(options, groups);
  return groups;
}

// The stages of a run, in order (TrainingRun): everything that can fail on user input happens before the run file
// exists.
RunSummary run_training(const RunSpec& spec, const RunOptions& options) {
  const RunLayout layout = check_layout(spec, options);
  set_threads(spec.device.threads);
  // The matrix products' precision for this run's ops, restored when the run returns or throws.
  const ScopedMatmulPrecision precision(run_precision(spec));
  // One writer per run: refused here, before anything is read or written, when another process writes this run.
  const std::optional<RunLock> lock = lock_run(options, layout.root, run_file_path(options.out_dir, spec.name));
  TrainingRun run(spec, options, layout);
  if (options.resume) run.resume();
  run.open_run_file();
  run.train();
  return run.finish();
}

}  // namespace proplab
