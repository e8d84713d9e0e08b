#include "train/trainer.h"

#include <cerrno>
#include <chrono>
#include <cmath>
#include <ostream>
#include <sstream>

#include "core/parallel.h"
#include "data/dataset.h"
#include "data/images.h"
#include "io/checkpoint.h"
#include "io/run_lock.h"
#include "io/run_reader.h"
#include "models/model.h"
#include "models/profile.h"
#include "models/tensor_parallel.h"
#include "ops/ops.h"
#include "train/data_parallel.h"
#include "train/optimizer.h"
#include "train/pipeline.h"
#include "train/progress.h"
#include "train/recorder.h"
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
  return out.str();
}

// The resolved study as it defines the experiment: without [parallel] and [device], which say how it runs. A
// checkpoint (full tensors) resumes under another layout or thread count.
std::string experiment_config(const std::string& toml) {
  std::istringstream in(toml);
  std::ostringstream out;
  std::string line;
  bool skip = false;
  while (std::getline(in, line)) {
    if (!line.empty() && line.front() == '[') skip = line == "[parallel]" || line == "[device]";
    if (!skip) out << line << '\n';
  }
  return out.str();
}

// Rank 0 takes the run's lock before anything is written (io/run_lock.h). Under mpirun every rank learns whether
// it got it, so that all of them stop with its message when it did not.
std::optional<RunLock> lock_run(const RunOptions& options, bool root, const std::filesystem::path& run_file) {
  std::optional<RunLock> lock;
  std::string refusal;
  if (root) {
    try {
      lock.emplace(RunLock::acquire(run_file));
    } catch (const UserError& error) {
      refusal = error.what();
    }
  }
  if (options.world) {
    std::int64_t length = static_cast<std::int64_t>(refusal.size());
    options.world->broadcast(&length, sizeof length, 0);
    refusal.resize(static_cast<std::size_t>(length));
    if (length > 0) options.world->broadcast(refusal.data(), length, 0);
  }
  if (!refusal.empty()) throw UserError(refusal);
  return lock;
}

// What the ranks other than 0 say after rank 0's I/O failure.
constexpr const char* kRootCouldNotWrite = "rank 0 could not write the run file or the checkpoint";

// A write the operating system refused (IoError): to which file, at which step.
struct IoFailure {
  bool checkpoint = false;  // the checkpoint (else the run file)
  std::string path;
  std::string reason;     // e.g. "No space left on device"
  std::int64_t step = 0;  // the step being written (a checkpoint: the step it would resume at)
};

// "88 training rows (steps 0-87) and 9 records (the last at step 80)": what a reader is sure to find in the run
// file (rows of a flush that failed half-way may be there too).
std::string run_file_contents(const RunWriter& writer) {
  const RunWriter::FlushedExtent train = writer.flushed("/train/step");
  const RunWriter::FlushedExtent records = writer.flushed("/steps");
  std::string text = std::to_string(train.rows) + " training row" + (train.rows == 1 ? "" : "s");
  if (train.rows > 0) text += " (steps 0-" + std::to_string(train.last_int) + ")";
  text += " and " + std::to_string(records.rows) + " record" + (records.rows == 1 ? "" : "s");
  if (records.rows > 0) text += " (the last at step " + std::to_string(records.last_int) + ")";
  return text;
}

// "after 1 step", "after 20 steps".
std::string after_steps(std::int64_t steps) {
  return "after " + std::to_string(steps) + (steps == 1 ? " step" : " steps");
}

// Ends a run that rank 0 could not write: marks the run file failed as far as the file system lets it and says in
// one line what failed, what the run file holds, the last good checkpoint and the command that continues.
void end_after_io_failure(const IoFailure& failure, RunWriter& writer, const std::string& name,
                          const std::optional<std::int64_t>& last_checkpoint, const RunOptions& options,
                          RunSummary& summary) {
  const std::string run_file = writer.path().string();
  const bool run_file_exists = std::filesystem::exists(writer.path());
  // (gone with its folder, when that was removed or moved)
  const std::int64_t checkpoint_step = std::filesystem::exists(summary.checkpoint) ? last_checkpoint.value_or(-1) : -1;
  bool run_file_writable = failure.checkpoint && !writer.finished();
  if (run_file_writable) {  // the checkpoint failed: the run file may still take its last rows
    try {
      writer.flush();
    } catch (const IoError&) {
      run_file_writable = false;
    }
  }
  // "I/O failure after 10 steps: No space left on device while writing the run file 'out/q.h5'"
  const std::string what = std::string(io_failure_detail_prefix) + " " + after_steps(failure.step) + ": " +
                           failure.reason + " while writing " +
                           (failure.checkpoint ? "the checkpoint" : "the run file") + " '" + failure.path + "'";
  std::string detail = what + "; the run file holds at least " + run_file_contents(writer) + "; ";
  detail += checkpoint_step >= 0
                ? "last good checkpoint: step " + std::to_string(checkpoint_step) + ", continue with --resume"
                : "no checkpoint of this run, start again with --force";
  bool marked = false;
  if (run_file_writable) {
    try {
      writer.finish(RunStatus::failed, detail);
      marked = true;
    } catch (const IoError&) {
    }
  }
  if (!marked) marked = writer.abandon(RunStatus::failed, detail);

  const std::string command = options.command.empty() ? std::string("proplab run ...") : options.command;
  std::string message = name + ": " + what + ". ";
  if (!run_file_exists)
    message += "The run file '" + run_file + "' is gone (its folder was removed or moved). ";
  else
    message += "The run file '" + run_file + "' holds at least " + run_file_contents(writer) +
               (marked ? " and says failed. "
                       : "; its status could not be written, so it says running until `proplab recover " + run_file +
                             "` or a resumed run rewrites it. ");
  const std::string remedy = "Free space (or make the folder writable again), then ";
  if (checkpoint_step >= 0)
    message += "Last good checkpoint: step " + std::to_string(checkpoint_step) + " ('" + summary.checkpoint.string() +
               "'). " + remedy + "continue with: " + command + " --resume";
  else
    message += "No checkpoint of this run was written. " + remedy + "start again with: " + command + " --force";
  summary.status = RunStatus::failed;
  summary.detail = detail;
  summary.io_failure = true;
  summary.message = message;
}

}  // namespace

std::filesystem::path checkpoint_path(const std::filesystem::path& out_dir, const std::string& name) {
  return out_dir / (name + ".ckpt.h5");
}

void use_process_groups(RunOptions& options, const dist::ProcessGroups& groups) {
  if (groups.world->size() == 1) return;
  options.world = groups.world.get();
  options.data_parallel = groups.data.get();
  if (groups.layout.pp > 1) options.pipeline = groups.pipeline.get();
  if (groups.tensor->size() > 1) options.tensor_parallel = groups.tensor.get();
}

RunSummary run_training(const RunSpec& spec, const RunOptions& options) {
  using clock = std::chrono::steady_clock;
  std::ostream* log = options.log;
  const TrainConfig& tc = spec.train;

  // Everything that can fail on user input happens before the run file exists.
  if (spec.device.type == "cuda")
    throw UserError(
        "device.type: training on CUDA is not available in this version (only the residual-combine "
        "op has a CUDA kernel so far); allowed: \"cpu\" or \"auto\"");
  if ((spec.parallel.tp > 1 || spec.parallel.pp > 1) &&
      (spec.parallel.zero != 0 || spec.parallel.dp_mode != "allreduce"))
    throw UserError(
        "parallel: zero = 1, dp_mode = \"local_sgd\" and dp_mode = \"gossip\" combine with data parallelism "
        "only in this version; allowed with tp > 1 or pp > 1: zero = 0, dp_mode = \"allreduce\"");
  // Tensor parallel: the ranks that share one model replica, each holding a piece of it.
  dist::Communicator* tensor = options.tensor_parallel;
  const int tensor_ranks = tensor ? tensor->size() : 1;
  if (tensor_ranks != spec.parallel.tp)
    throw UserError("parallel.tp = " + std::to_string(spec.parallel.tp) + " needs " + std::to_string(spec.parallel.tp) +
                    " processes per replica (mpirun -np " +
                    std::to_string(spec.parallel.dp * spec.parallel.tp * spec.parallel.pp) + " proplab run ...), but " +
                    std::to_string(tensor_ranks) + " were started");
  check_tensor_parallel(spec.model, spec.parallel.tp);
  if (tensor_ranks == 1) tensor = nullptr;
  dist::Communicator* group = options.data_parallel;
  const int replicas = group ? group->size() : 1;
  if (replicas != spec.parallel.dp)
    throw UserError("parallel.dp = " + std::to_string(spec.parallel.dp) + " needs " + std::to_string(spec.parallel.dp) +
                    " processes (mpirun -np " + std::to_string(spec.parallel.dp) + " proplab run ...), but " +
                    std::to_string(replicas) + " were started");
  const bool root = (!group || group->rank() == 0) && (!options.pipeline || options.pipeline->rank() == 0) &&
                    (!tensor || tensor->rank() == 0);
  set_threads(spec.device.threads);
  const std::int64_t micro = tc.batch / tc.grad_accum;
  if (micro % replicas != 0)
    throw UserError("parallel.dp = " + std::to_string(replicas) + " must divide the micro-batch train.batch / " +
                    "train.grad_accum = " + std::to_string(micro) + "; allowed: a dp that divides it");
  check_pipeline_layout(spec, options.pipeline, replicas);
  // One writer per run: refused here, before anything is read or written, when another process writes this run.
  const std::optional<RunLock> lock = lock_run(options, root, run_file_path(options.out_dir, spec.name));
  const std::int64_t local_rows = micro / replicas;
  const std::int64_t first_row = group ? group->rank() * local_rows : 0;
  // This replica's rows of a micro-batch (all of them for one process).
  auto local = [&](Batch batch) {
    if (replicas == 1) return batch;
    return Batch{batch.inputs.slice(0, first_row, local_rows), batch.targets.slice(0, first_row, local_rows)};
  };
  RunData data(spec, micro);
  // The run's scaling rule, built once for the model and for what theory predicts for every probe at
  // initialisation (stored beside the measurements by rank 0, the only writer). A rule with a profiling pass
  // (Admin) profiles a temporary model of its own, once.
  const std::unique_ptr<ScalingRule> rule = make_model_rule(spec.model, spec.scaling, spec.seed);
  theory::ProbePrediction prediction;
  if (root) prediction = predict_for_run(spec, *rule);
  std::unique_ptr<Model> model = make_model(spec.model, *rule, spec.seed, tensor);
  std::optional<PipelineStage> stage;  // pipeline parallel: this rank's stage of the model
  if (spec.parallel.pp > 1) stage.emplace(spec, *model, *options.pipeline, group, tensor);
  PipelineStage* pipeline = stage ? &*stage : nullptr;
  // (a stage's replicas exchange only the gradients it updates)
  DataParallel data_parallel(spec.parallel, group, model->params(),
                             pipeline ? pipeline->updated_parameters() : std::vector<bool>{});
  Optimizer optimizer(tc, model->params(), data_parallel.optimizer_shard());
  Recorder recorder(spec.record, model->probes(), model->params(), tc.steps);
  recorder.set_tensor_parallel(tensor);
  std::optional<TensorParallelSink> tensor_sink;  // records split probes whole, replicated ones once
  if (tensor) tensor_sink.emplace(recorder, model->probes(), *tensor);
  ProbeSink* sink = tensor ? static_cast<ProbeSink*>(&*tensor_sink) : &recorder;
  if (root) {
    PROPLAB_CHECK(prediction.probes.size() == model->probes().size(), "theory predicts ", prediction.probes.size(),
                  " probes, the model has ", model->probes().size());
    for (std::size_t i = 0; i < prediction.probes.size(); ++i)
      PROPLAB_CHECK(prediction.probes[i].name == model->probes()[i].name, "theory probe ", prediction.probes[i].name,
                    " at depth ", i, " is ", model->probes()[i].name, " in the model");
  }

  RunSummary summary;
  summary.run_file = run_file_path(options.out_dir, spec.name);
  summary.checkpoint = checkpoint_path(options.out_dir, spec.name);
  summary.entropy_rate = data.loss_floor();

  std::int64_t start_step = 0;
  TrainCurves history;
  EvalCurves eval_history;
  std::optional<RunReader> previous;
  if (options.resume) {
    if (!std::filesystem::exists(summary.checkpoint))
      throw UserError("--resume: no checkpoint at " + summary.checkpoint.string() + " to resume from");
    // Full tensors in the file: a tensor-parallel rank reads them whole and keeps its pieces; with zero = 1 each
    // replica keeps its slice of the optimizer state.
    const auto optimizer_state = data_parallel.optimizer_state_to_load(optimizer);
    std::map<std::string, Tensor> local = checkpoint_tensors(*model, optimizer_state);
    const std::map<std::string, Tensor> targets = full_tensor_targets(model->params(), local);
    Checkpoint loaded = load_checkpoint(summary.checkpoint, targets);
    keep_local_pieces(model->params(), targets, local);
    data_parallel.after_optimizer_load(optimizer, optimizer_state);
    if (experiment_config(loaded.string_value("config")) != experiment_config(spec.config_toml))
      throw UserError("--resume: the study differs from the one the checkpoint " + summary.checkpoint.string() +
                      " was written with; resume with the same study and --set options (only [parallel] and "
                      "[device] may change)");
    start_step = loaded.int_value("step");
    optimizer.set_steps_taken(loaded.int_value("optimizer_steps"));
    model->after_parameter_load();
  }

  RunHeader header;
  header.proplab_version = options.proplab_version;
  header.config = spec.config_toml;
  header.device = "cpu";
  header.threads = threads();
  header.layout = layout_text(spec.parallel);
  // A resumed run rewrites its file: the history before the checkpoint comes from the previous file, moved aside
  // and read while the new one is written.
  std::filesystem::path previous_copy = summary.run_file;
  previous_copy += ".resume";
  if (root && options.resume && std::filesystem::exists(summary.run_file)) {
    std::filesystem::rename(summary.run_file, previous_copy);
    try {
      previous.emplace(RunReader::open(previous_copy));
      history = previous->read_train();
      eval_history = previous->read_eval();
    } catch (...) {
      previous.reset();
      std::filesystem::rename(previous_copy, summary.run_file);
      throw;
    }
  }
  std::optional<RunWriter> created;
  double wall_offset = 0.0;  // a resumed run's wall time goes on from where the previous file ended
  try {
    if (root) {
      created.emplace(RunWriter::create(summary.run_file, header, options.force || options.resume));
      recorder.create_datasets(*created);
      data_parallel.create_datasets(*created);
      recorder.write_block_layout(*created, model->block_layout());
      write_theory(*created, prediction);
      created->start();
      if (previous) {
        // A resumed run's file holds the whole history: rows before the checkpoint come from the previous file,
        // flushed before that file goes.
        recorder.copy_history(*previous, *created, start_step);
        data_parallel.copy_history(*previous, *created, start_step);
        for (std::size_t i = 0; i < history.size() && history.step[i] < start_step; ++i) {
          created->append_train({history.step[i], history.loss[i], history.lr[i], history.grad_norm[i],
                                 history.tokens_per_s[i], history.wall_time[i]});
          wall_offset = history.wall_time[i];
        }
        for (std::size_t i = 0; i < eval_history.size() && eval_history.step[i] <= start_step; ++i)
          created->append_eval({eval_history.step[i], eval_history.loss[i]});
        created->flush();
      }
    }
  } catch (...) {
    if (previous) {  // put the previous file back: nothing is lost when the new one cannot be written
      previous.reset();
      if (created) created->abandon(RunStatus::failed, "could not be written while resuming");
      created.reset();
      std::filesystem::rename(previous_copy, summary.run_file);
    }
    throw;
  }
  if (previous) {
    previous.reset();
    std::filesystem::remove(previous_copy);
  }
  // Only rank 0 writes; the other replicas compute and merge into it.
  RunWriter* writer = root ? &*created : nullptr;

  // A write the operating system refuses (disk full, quota, read-only or vanished directory) stops the run at the
  // next step boundary: nothing more is written, and no later checkpoint is taken (it would run ahead of the run
  // file's records), so --resume continues from the last good one without a gap.
  std::optional<IoFailure> io_failure;
  std::int64_t step = start_step;
  std::optional<std::int64_t> checkpoint_step;  // of the last good checkpoint of this run
  if (options.resume) checkpoint_step = start_step;
  auto guarded = [&](bool checkpoint, auto&& write) {
    if (io_failure) return;
    try {
      write();
    } catch (const IoError& error) {
      io_failure = IoFailure{checkpoint, checkpoint ? summary.checkpoint.string() : error.path(), error.reason(), step};
    }
  };

  auto evaluate = [&]() {
    double total = 0.0;
    for (int i = 0; i < tc.eval_batches; ++i)
      total += pipeline ? pipeline->evaluate(data.batch(Split::validation, i))
                        : model->evaluate(data.batch(Split::validation, i));
    return total / tc.eval_batches;
  };
  auto save = [&](std::int64_t step) {
    // Gathered from every replica's slice with zero = 1; otherwise rank 0's (the replicas' are identical).
    std::map<std::string, Tensor> tensors =
        checkpoint_tensors(*model, data_parallel.optimizer_state_to_save(optimizer));
    if (pipeline) pipeline->gather_to_first_stage(tensors);  // each stage's own tensors, full size, to rank 0
    // Tensor parallel: the first replica's (first stage's) group gathers its pieces into full tensors for rank 0.
    if (tensor && (!group || group->rank() == 0) && (!pipeline || pipeline->stage() == 0))
      tensors = gather_full_tensors(*tensor, model->params(), tensors);
    if (!root) return;
    // A checkpoint is taken only once the run file holds everything before it, so that --resume from it leaves no
    // gap in the run file whatever happens to the rows written after it.
    guarded(false, [&] {
      // (a run file whose folder was removed or moved still takes writes, which no one will read)
      if (!std::filesystem::exists(summary.run_file)) throw IoError(summary.run_file.string(), ENOENT);
      writer->flush();
    });
    if (io_failure) return;
    Checkpoint checkpoint;
    checkpoint.tensors = std::move(tensors);
    checkpoint.ints["step"] = step;
    checkpoint.ints["optimizer_steps"] = optimizer.steps_taken();
    checkpoint.ints["seed"] = static_cast<std::int64_t>(spec.seed);
    checkpoint.ints["data_position"] = step * tc.grad_accum;  // next train batch index
    checkpoint.strings["config"] = spec.config_toml;
    guarded(true, [&] {
      save_checkpoint(summary.checkpoint, checkpoint);  // (a checkpoint that fails leaves the previous one)
      checkpoint_step = step;
    });
  };

  if (log)
    *log << "proplab: " << spec.name << ": " << data.describe() << "; " << model->params().count_full_elements()
         << " parameters; " << threads() << " threads"
         << (start_step > 0 ? "; resuming at step " + std::to_string(start_step) : "") << "\n";
  std::ostream silent(nullptr);
  Progress progress(log ? *log : silent, options.terminal, tc.steps);
  const auto run_start = clock::now();
  const double tokens_per_step = static_cast<double>(tc.batch) * static_cast<double>(model->tokens_per_sample());

  RunStatus status = RunStatus::completed;
  std::string detail;
  // A collective that times out (a rank died or stalled) ends the run as failed, with every record so far flushed;
  // the caller then ends the other ranks (dist::abort_all).
  try {
    while (step < tc.steps) {
      // Every rank stops at the same step, or the others would wait forever: 1 interrupted, 2 rank 0 could not
      // write.
      double stop = io_failure ? 2.0 : options.interrupt && options.interrupt->load() ? 1.0 : 0.0;
      if (options.world) options.world->all_reduce(&stop, 1, dist::ReduceOp::max);
      if (stop == 2.0) {
        status = RunStatus::failed;
        if (!io_failure) detail = std::string(kRootCouldNotWrite) + " at step " + std::to_string(step);
        break;
      }
      if (stop == 1.0) {
        status = RunStatus::failed;
        detail = "interrupted at step " + std::to_string(step) + "; continue with --resume";
        break;
      }
      if (options.stop_after >= 0 && step >= options.stop_after) {
        status = RunStatus::failed;
        detail = "stopped at step " + std::to_string(step) + " (--stop-after); continue with --resume";
        break;
      }
      const auto step_start = clock::now();
      const double lr = scheduled_lr(tc, step);
      // Forward and backward over the step's micro-batches; the recorder sees every probe when `record`.
      auto forward_backward = [&](bool record) {
        if (record) recorder.begin_step();
        model->params().zero_grads();
        double total = 0.0;
        for (int m = 0; m < tc.grad_accum && !pipeline; ++m) {
          const std::int64_t index = step * tc.grad_accum + m;
          StepContext context;
          context.seed = spec.seed;
          context.micro_step = static_cast<std::uint64_t>(index);
          context.training = true;
          context.sink = record ? sink : nullptr;
          context.gradients = data_parallel.listener_for(m + 1 == tc.grad_accum);
          // Scaled so that each replica's gradients (and probed gradients) are its share of the single-process
          // ones: the sum over the group is the gradient of the global batch's mean loss.
          total += model->forward_backward(local(data.batch(Split::train, index)),
                                           1.0f / static_cast<float>(tc.grad_accum * replicas), context);
        }
        double loss = pipeline ? pipeline->forward_backward(
                                     step, record ? sink : nullptr,
                                     [&](int m) { return local(data.batch(Split::train, step * tc.grad_accum + m)); })
                               : total / tc.grad_accum;
        if (group && replicas > 1) {
          data_parallel.finish_gradients();  // summed, reduce-scattered, or (local modes) the replica's own
          group->all_reduce(&loss, 1);
          loss /= replicas;
          // (tensor parallel: only each group's rank 0 holds probe sums; the data groups of the others skip together)
          if (record && (!tensor || tensor->rank() == 0)) recorder.merge_replicas(*group);
        }
        if (pipeline)  // (tp × pp: the stages merge among the tensor groups' rank 0s, as the replicas do)
          loss = pipeline->finish_backward(loss, record && (!tensor || tensor->rank() == 0) ? &recorder : nullptr);
        return loss;
      };
      const bool record = recorder.records(step);
      double loss = forward_backward(record);
      // Clipped by the norm of the whole model's gradient: over the stages, over a tensor group's pieces, or (with
      // zero = 1) over the replicas' slices.
      auto clip = [&](bool full) {
        if (pipeline) return pipeline->clip_grad_norm(tc.grad_clip);
        return tensor ? clip_grad_norm_split(*tensor, model->params(), tc.grad_clip)
                      : data_parallel.clip_gradients(tc.grad_clip, full);
      };
      double grad_norm = clip(record);
      if (!std::isfinite(loss) || !std::isfinite(grad_norm)) {
        // Record the step that went non-finite (recomputed with the recorder when it was not scheduled: the step
        // is a pure function of the parameters, which have not been updated).
        if (!record) {
          loss = forward_backward(true);
          grad_norm = clip(true);
        }
        recorder.before_update();
        recorder.skip_update();
        recorder.after_update();
        if (pipeline) pipeline->gather_param_stats(recorder);
        std::string first;
        if (root) guarded(false, [&] { first = recorder.write_record(*writer, step); });
        status = RunStatus::diverged;
        detail = std::string(std::isfinite(loss) ? "gradient norm" : "loss") + " became non-finite at step " +
                 std::to_string(step) + (first.empty() ? "" : "; first non-finite probe: " + first);
        if (root)
          guarded(false, [&] {
            writer->append_train({step, loss, lr, grad_norm, 0.0,
                                  wall_offset + std::chrono::duration<double>(clock::now() - run_start).count()});
          });
        ++step;
        break;
      }
      if (record) recorder.before_update();
      data_parallel.update(optimizer, lr, step, record ? &recorder.update_norms() : nullptr, record);
      std::string first_nonfinite;
      if (record) {
        recorder.after_update();
        if (pipeline) pipeline->gather_param_stats(recorder);
        if (root)
          guarded(false, [&] {
            first_nonfinite = recorder.write_record(*writer, step);
            data_parallel.write_record(*writer, step);
          });
        if (options.world) {  // only rank 0 (world rank 0) finalised the statistics: tell the others
          std::uint8_t nonfinite = first_nonfinite.empty() ? 0 : 1;
          options.world->broadcast(&nonfinite, 1, 0);
          if (nonfinite && !root) first_nonfinite = "(found by rank 0)";
        }
      }
      const auto now = clock::now();
      const double step_seconds = std::chrono::duration<double>(now - step_start).count();
      summary.tokens_per_s = tokens_per_step / step_seconds;
      if (root)
        guarded(false, [&] {
          writer->append_train({step, loss, lr, grad_norm, summary.tokens_per_s,
                                wall_offset + std::chrono::duration<double>(now - run_start).count()});
        });
      summary.last_loss = loss;
      ++step;
      if (!first_nonfinite.empty() && spec.record.on_nonfinite == "stop") {
        status = RunStatus::diverged;
        detail = "a statistic became non-finite at step " + std::to_string(step - 1) + ": first " + first_nonfinite;
        break;
      }
      if ((tc.eval_every > 0 && step % tc.eval_every == 0) || step == tc.steps) {
        const double eval_loss = evaluate();
        if (root) guarded(false, [&] { writer->append_eval({step, eval_loss}); });
        summary.last_eval_loss = eval_loss;
      }
      if (tc.checkpoint_every > 0 && step % tc.checkpoint_every == 0) save(step);
      progress.update(step, loss, summary.last_eval_loss, summary.tokens_per_s);
    }
  } catch (const dist::CollectiveTimeout& e) {
    status = RunStatus::failed;
    detail = e.what();
    summary.collective_timeout = true;
  }
  summary.steps_done = step;
  if (options.world && !summary.collective_timeout) {
    // Rank 0's write failures in the last step reach the others here (earlier ones stopped the loop).
    double failed = io_failure ? 1.0 : 0.0;
    options.world->all_reduce(&failed, 1, dist::ReduceOp::max);
    if (failed != 0.0 && !root) {
      summary.io_failure = true;
      summary.message = spec.name + ": " + kRootCouldNotWrite + " (it says what and why)";
      if (status != RunStatus::diverged) {  // (a diverged run takes no final checkpoint on any rank)
        status = RunStatus::failed;
        detail = kRootCouldNotWrite;
      }
    }
  }
  // No checkpoint after a timeout: it may have struck between the update and the step count.
  if (status != RunStatus::diverged && !summary.collective_timeout) save(step);
  summary.status = status;
  summary.detail = status == RunStatus::completed ? "completed " + std::to_string(step) + " steps" : detail;
  if (root) guarded(false, [&] { writer->finish(status, summary.detail); });
  if (root && io_failure) end_after_io_failure(*io_failure, *writer, spec.name, checkpoint_step, options, summary);
  std::ostringstream final_line;
  final_line << "proplab: " << spec.name << ": " << run_status_name(summary.status) << " (" << summary.detail << ")";
  if (summary.last_eval_loss) final_line << "; validation loss " << *summary.last_eval_loss;
  if (summary.entropy_rate) final_line << " (data entropy rate " << *summary.entropy_rate << ")";
  final_line << "; run file " << summary.run_file.string();
  // (an I/O failure's message is the caller's to print, on stderr)
  progress.finish(summary.io_failure ? std::string() : final_line.str());
  return summary;
}

}  // namespace proplab
