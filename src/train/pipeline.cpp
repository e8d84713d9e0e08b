#include "train/pipeline.h"

#include <algorithm>
#include <cmath>

#include "dist/pipeline_schedule.h"
#include "ops/ops.h"
#include "train/tensor_parallel.h"

namespace proplab {

namespace {

std::string text(std::int64_t value) { return std::to_string(value); }

// The parameter a checkpoint tensor belongs to: param/<p>, buffer/<p>, optim/<p>.<state>.
std::string parameter_of(const std::string& tensor) {
  const std::size_t slash = tensor.find('/');
  std::string rest = tensor.substr(slash + 1);
  if (tensor.rfind("optim/", 0) == 0) rest = rest.substr(0, rest.rfind('.'));
  return rest;
}

}  // namespace

void check_pipeline_layout(const RunSpec& spec, const dist::Communicator* stages_started, int data_replicas) {
  const ParallelConfig& p = spec.parallel;
  if (p.pp == 1) {
    if (p.microbatches != 1)
      throw UserError("parallel.microbatches = " + text(p.microbatches) +
                      " applies to pipeline parallelism only; allowed: microbatches = 1 when parallel.pp = 1 (split "
                      "the batch with train.grad_accum instead)");
    if (boundary_compression_of(p) != Compression::none)
      throw UserError("parallel.pp_compress = \"" + p.pp_compress +
                      "\" compresses what crosses pipeline stage boundaries, which needs parallel.pp > 1; allowed "
                      "with pp = 1: \"none\"");
    return;
  }
  const std::string pp = "parallel.pp = " + text(p.pp);
  if (spec.model.kind() != ModelKind::transformer)
    throw UserError(pp +
                    ": pipeline parallelism is built for the transformer only; allowed: pp = 1 for model.type = \"" +
                    std::string(model_kind_name(spec.model.kind())) + "\"");
  if (p.pp > spec.model.transformer().layers)
    throw UserError(pp + " needs at least " + text(p.pp) + " transformer blocks, but model.layers = " +
                    text(spec.model.transformer().layers) + "; allowed: pp <= model.layers");
  const int accum = spec.train.grad_accum;
  if (p.microbatches % accum != 0)
    throw UserError("parallel.microbatches = " + text(p.microbatches) +
                    " must be a multiple of train.grad_accum = " + text(accum) +
                    " (each of the step's micro-batches is cut into microbatches / grad_accum pieces); "
                    "allowed: " +
                    text(accum) + ", " + text(2 * accum) + ", " + text(3 * accum) + ", ...");
  const std::int64_t rows = spec.train.batch / accum / data_replicas;
  const int pieces = p.microbatches / accum;
  if (rows % pieces != 0)
    throw UserError("parallel.microbatches = " + text(p.microbatches) + " cuts each replica's " + text(rows) +
                    " rows of a micro-batch (train.batch / train.grad_accum / parallel.dp) into " + text(pieces) +
                    " pieces, but " + text(pieces) + " does not divide " + text(rows) +
                    "; allowed: microbatches / grad_accum dividing " + text(rows));
  const int started = stages_started ? stages_started->size() : 1;
  if (started != p.pp)
    throw UserError(pp + " needs dp·tp·pp·sp = " + text(p.world()) + " processes (mpirun -np " + text(p.world()) +
                    " proplab run ...), but the pipeline has " + text(started) + (started == 1 ? " stage" : " stages"));
}

std::vector<int> pipeline_stage_blocks(const TransformerConfig& config, int stages) {
  const double d = config.width, f = static_cast<double>(config.ffn_mult) * d, t = config.seq_len;
  // Multiply-adds per token, as in Transformer::train_flops: QKV, output projection, FFN, attention; the head.
  const double block = 3 * d * d + d * d + 2 * d * f + 2 * t * d;
  const double head = d * static_cast<double>(config.vocab);
  return dist::balance_stages(std::vector<double>(static_cast<std::size_t>(config.layers), block), 0.0, head, stages);
}

PipelineStage::PipelineStage(const RunSpec& spec, Model& model, dist::Communicator& stages, dist::Communicator* data,
                             dist::Communicator* tensor, dist::Communicator* sequence)
    : model_(dynamic_cast<Transformer&>(model)),
      stages_(stages),
      data_(data),
      tensor_(tensor != nullptr && tensor->size() > 1 ? tensor : nullptr),
      sequence_(sequence != nullptr && sequence->size() > 1 ? sequence : nullptr),
      seed_(spec.seed),
      stage_(stages.rank()),
      stage_count_(stages.size()),
      microbatches_(spec.parallel.microbatches),
      grad_accum_(spec.train.grad_accum),
      chunks_per_micro_(spec.parallel.microbatches / spec.train.grad_accum),
      replicas_(data ? data->size() : 1),
      ring_(sequence_ ? sequence_->size() : 1),
      tied_(spec.model.transformer().tie_embeddings) {
  bounds_ = pipeline_stage_blocks(spec.model.transformer(), stage_count_);
  first_block_ = bounds_[static_cast<std::size_t>(stage_)];
  last_block_ = bounds_[static_cast<std::size_t>(stage_) + 1];
  slots_ = dist::pipeline_slots(stage_count_, stage_, microbatches_);
  model_.set_stage(first_block_, last_block_, slots_);
  chunk_rows_ = spec.train.batch / grad_accum_ / replicas_ / chunks_per_micro_;
  // (a sequence-parallel rank's chain carries its part of every sequence)
  const std::int64_t t = spec.model.transformer().seq_len / ring_, d = spec.model.transformer().width;
  // Micro-batch pieces and the buffers activations and gradients arrive in live on the model's device.
  const Device device = model_.params().all().front()->value.device();
  for (int c = 0; c < microbatches_; ++c)
    chunks_.push_back(
        {Tensor::empty({chunk_rows_, t}, DType::i32, device), Tensor::empty({chunk_rows_, t}, DType::i32, device)});
  for (int s = 0; s < slots_; ++s) received_.push_back(Tensor::empty({chunk_rows_ * t, d}, DType::f32, device));
  received_gradient_ = Tensor::empty({chunk_rows_ * t, d}, DType::f32, device);
  boundary_ = boundary_compression_of(spec.parallel);
  boundary_sums_.assign(4 * static_cast<std::size_t>(stage_count_ - 1), 0.0);
  const bool last = stage_ == stage_count_ - 1;
  for (auto& p : model_.params().all()) {
    const int owner = owner_of(p->name);
    const bool tied_copy = tied_ && last && p->name == "embed.token.weight";
    owned_.push_back(owner == stage_);
    updated_.push_back(owner == stage_ || tied_copy);
    if (owner == stage_ || tied_copy) all_grads_.push_back(&p->grad);
  }
}

int PipelineStage::owner_of(const std::string& parameter) const {
  if (parameter.rfind("embed.", 0) == 0) return 0;
  if (parameter.rfind("blocks.", 0) == 0) {
    const int block = std::stoi(parameter.substr(7, parameter.find('.', 7) - 7));
    for (int s = 0; s < stage_count_; ++s)
      if (block < bounds_[static_cast<std::size_t>(s) + 1]) return s;
  }
  return stage_count_ - 1;  // final_norm, head
}

void PipelineStage::copy_chunk(const Batch& from, std::int64_t first_row, Batch& to) const {
  to.inputs.copy_from(from.inputs.slice(0, first_row, chunk_rows_));
  to.targets.copy_from(from.targets.slice(0, first_row, chunk_rows_));
}

void PipelineStage::send_tensor(const Tensor& x, int to, int tag, bool gradient, bool measure) {
  if (boundary_ == Compression::none) {
    stages_.send(x.f32(), x.numel(), to, tag);
    return;
  }
  const std::int64_t n = x.numel();
  // (CUDA ranks encode and decode on the host: the payload is the same bits either way)
  const float* values = x.device() == Device::cpu ? x.f32() : on_host(x).f32();
  words_.resize(static_cast<std::size_t>(payload_words(boundary_, n)));
  encode_payload(boundary_, values, n, words_.data());
  if (measure) {
    decoded_.resize(static_cast<std::size_t>(n));
    decode_payload(boundary_, words_.data(), n, decoded_.data());
    // (the boundary below this stage for a gradient, above it for an activation)
    const int boundary = gradient ? stage_ - 1 : stage_;
    double* sums = &boundary_sums_[static_cast<std::size_t>(4 * boundary + (gradient ? 2 : 0))];
    for (std::int64_t e = 0; e < n; ++e) {
      const double value = values[e], left = value - decoded_[e];
      sums[0] += left * left;
      sums[1] += value * value;
    }
  }
  // (the payload's bits travel unchanged: MPI_FLOAT between hosts of one architecture)
  stages_.send(reinterpret_cast<const float*>(words_.data()), static_cast<std::int64_t>(words_.size()), to, tag);
}

Tensor& PipelineStage::on_host(const Tensor& x, bool copy) {
  if (!host_.defined() || host_.shape() != x.shape()) host_ = Tensor::empty(x.shape());
  if (copy) host_.copy_from(x);
  return host_;
}

void PipelineStage::receive_tensor(Tensor& into, int from, int tag) {
  if (boundary_ == Compression::none) {
    stages_.receive(into.f32(), into.numel(), from, tag);
    return;
  }
  words_.resize(static_cast<std::size_t>(payload_words(boundary_, into.numel())));
  stages_.receive(reinterpret_cast<float*>(words_.data()), static_cast<std::int64_t>(words_.size()), from, tag);
  if (into.device() == Device::cpu) {
    decode_payload(boundary_, words_.data(), into.numel(), into.f32());
    return;
  }
  Tensor& host = on_host(into, false);
  decode_payload(boundary_, words_.data(), into.numel(), host.f32());
  into.copy_from(host);
}

double PipelineStage::forward_backward(std::int64_t step, ProbeSink* sink,
                                       const std::function<Batch(int)>& data_batch) {
  std::fill(boundary_sums_.begin(), boundary_sums_.end(), 0.0);
  const bool measure = sink != nullptr && boundary_ != Compression::none;
  measured_ = measure;
  for (int m = 0; m < grad_accum_; ++m) {
    const Batch rows = data_batch(m);
    for (int piece = 0; piece < chunks_per_micro_; ++piece)
      copy_chunk(rows, piece * chunk_rows_, chunks_[static_cast<std::size_t>(m * chunks_per_micro_ + piece)]);
  }
  const float grad_scale = 1.0f / static_cast<float>(microbatches_ * replicas_ * ring_);
  auto context_of = [&](int microbatch) {
    StepContext context;
    context.seed = seed_;
    // Dropout masks are keyed by the data micro-batch, as in one process.
    context.micro_step = static_cast<std::uint64_t>(step * grad_accum_ + microbatch / chunks_per_micro_);
    context.training = true;
    context.sink = sink;
    return context;
  };
  double total = 0.0;
  Tensor output, d_input;  // the last forward's output and backward's input gradient, until sent
  for (const dist::PipelineStep& s : dist::one_f_one_b(stage_count_, stage_, microbatches_)) {
    const int m = s.microbatch, slot = m % slots_;
    const Batch& chunk = chunks_[static_cast<std::size_t>(m)];
    switch (s.action) {
      case dist::PipelineAction::receive_activation:
        receive_tensor(received_[static_cast<std::size_t>(slot)], stage_ - 1, dist::activation_tag(m));
        break;
      case dist::PipelineAction::forward:
        total += model_.stage_forward(slot, chunk, received_[static_cast<std::size_t>(slot)], output, grad_scale,
                                      context_of(m));
        break;
      case dist::PipelineAction::send_activation:
        send_tensor(output, stage_ + 1, dist::activation_tag(m), false, measure);
        break;
      case dist::PipelineAction::receive_gradient:
        receive_tensor(received_gradient_, stage_ + 1, dist::gradient_tag(m));
        break;
      case dist::PipelineAction::backward:
        model_.stage_backward(slot, chunk, received_gradient_, d_input, context_of(m));
        break;
      case dist::PipelineAction::send_gradient:
        send_tensor(d_input, stage_ - 1, dist::gradient_tag(m), true, measure);
        break;
    }
  }
  return stage_ == stage_count_ - 1 ? total / microbatches_ : 0.0;
}

double PipelineStage::finish_backward(double loss, Recorder* recorder) {
  const int last = stage_count_ - 1;
  if (tied_ && (stage_ == 0 || stage_ == last)) {
    // Both ends add the other's gradient (a + b = b + a: the two copies stay bitwise equal). The first stage
    // sends first and the last receives first, so the exchange cannot deadlock.
    Tensor& grad = model_.params().find("embed.token.weight")->grad;
    Tensor theirs = Tensor::empty(grad.shape(), DType::f32, grad.device());
    if (stage_ == 0) {
      stages_.send(grad.f32(), grad.numel(), last, 0);
      stages_.receive(theirs.f32(), theirs.numel(), last, 0);
    } else {
      stages_.receive(theirs.f32(), theirs.numel(), 0, 0);
      stages_.send(grad.f32(), grad.numel(), 0, 0);
    }
    ops::axpy(1.0f, theirs, grad);
  }
  stages_.broadcast(&loss, sizeof loss, last);
  // (every ring rank measured its own tokens' transfers: the ring's sums are the whole sequences')
  if (measured_ && sequence_)
    sequence_->all_reduce(boundary_sums_.data(), static_cast<std::int64_t>(boundary_sums_.size()));
  if (recorder) recorder->merge_replicas(stages_);
  if (recorder && boundary_ != Compression::none) {
    // Each boundary's sums are one stage's (the sender's): the sum over the stages is them; then over the
    // replicas. (Only tensor rank 0's chains take part: the others send the same tensors.)
    std::vector<double> sums = boundary_sums_;
    stages_.all_reduce(sums.data(), static_cast<std::int64_t>(sums.size()));
    if (data_) data_->all_reduce(sums.data(), static_cast<std::int64_t>(sums.size()));
    const std::size_t boundaries = sums.size() / 4;
    boundary_error_.assign(2 * boundaries, 0.0);
    for (std::size_t b = 0; b < boundaries; ++b)
      for (std::size_t g = 0; g < 2; ++g) {
        const double left = sums[4 * b + 2 * g], whole = sums[4 * b + 2 * g + 1];
        boundary_error_[g * boundaries + b] = whole == 0.0 ? 0.0 : std::sqrt(left / whole);
      }
  }
  return loss;
}

double PipelineStage::clip_grad_norm(double max_norm) {
  const auto& all = model_.params().all();
  std::vector<double> squares(all.size(), 0.0);
  for (std::size_t i = 0; i < all.size(); ++i)
    if (owned_[i]) squares[i] = ops::sum_squares(all[i]->grad);
  if (tensor_) sum_split_parameters(*tensor_, model_.params(), squares);  // a split parameter's pieces add up
  double total = 0.0;
  for (double s : squares) total += s;
  stages_.all_reduce(&total, 1);
  const double norm = std::sqrt(total);
  if (max_norm > 0.0 && std::isfinite(norm) && norm > max_norm) {
    const float factor = static_cast<float>(max_norm / norm);
    for (Tensor* grad : all_grads_) ops::scale(*grad, factor);
  }
  return norm;
}

void PipelineStage::gather_param_stats(Recorder& recorder) {
  std::vector<std::vector<double>>& rows = recorder.param_rows();
  auto& all = model_.params().all();
  std::vector<double> packed;
  for (const std::vector<double>& row : rows)
    for (std::size_t i = 0; i < all.size(); ++i) packed.push_back(owner_of(all[i]->name) == stage_ ? row[i] : 0.0);
  // Each entry is non-zero on one stage only: the sum is that value, exactly.
  stages_.all_reduce(packed.data(), static_cast<std::int64_t>(packed.size()));
  std::size_t k = 0;
  for (std::vector<double>& row : rows)
    for (std::size_t i = 0; i < all.size(); ++i) row[i] = packed[k++];
}

double PipelineStage::evaluate(const Batch& batch) {
  const std::int64_t rows = batch.inputs.dim(0);
  PROPLAB_CHECK(rows % chunk_rows_ == 0, "pipeline evaluate: ", rows, " rows in chunks of ", chunk_rows_);
  StepContext context;
  context.training = false;
  Batch& chunk = chunks_[0];
  Tensor& input = received_[0];
  Tensor output;
  double total = 0.0;
  const int pieces = static_cast<int>(rows / chunk_rows_);
  for (int piece = 0; piece < pieces; ++piece) {
    copy_chunk(batch, piece * chunk_rows_, chunk);
    if (stage_ > 0) receive_tensor(input, stage_ - 1, dist::activation_tag(piece));
    total += model_.stage_forward(0, chunk, input, output, 0.0f, context);
    if (stage_ < stage_count_ - 1) send_tensor(output, stage_ + 1, dist::activation_tag(piece), false, false);
  }
  double loss = total / pieces;
  stages_.broadcast(&loss, sizeof loss, stage_count_ - 1);
  return loss;
}

void PipelineStage::gather_to_first_stage(std::map<std::string, Tensor>& tensors) {
  // (the same for every stage of this group)
  if ((data_ && data_->rank() != 0) || (sequence_ && sequence_->rank() != 0)) return;
  for (auto& [name, tensor] : tensors) {
    const int owner = owner_of(parameter_of(name));
    if (owner == 0) continue;
    PROPLAB_CHECK(tensor.dtype() == DType::f32, "checkpoint tensor ", name, " is not f32");
    if (stage_ == owner) stages_.send(tensor.f32(), tensor.numel(), 0, 0);
    if (stage_ == 0) stages_.receive(tensor.f32(), tensor.numel(), owner, 0);
  }
}

void PipelineStage::create_datasets(RunWriter& writer) {
  if (boundary_ == Compression::none) return;
  const auto boundaries = static_cast<std::int64_t>(stage_count_ - 1);
  boundary_steps_series_ = writer.create_series_1d_int("/compression/boundaries/steps");
  activation_error_series_ = writer.create_series_2d("/compression/boundaries/activation_error", boundaries);
  gradient_error_series_ = writer.create_series_2d("/compression/boundaries/gradient_error", boundaries);
}

void PipelineStage::copy_history(const RunReader& previous, RunWriter& writer, std::int64_t before_step) {
  if (boundary_ == Compression::none || !previous.exists("/compression/boundaries/steps")) return;
  const std::vector<std::int64_t> steps = previous.read_ints("/compression/boundaries/steps");
  const Dataset2D activations = previous.read_2d("/compression/boundaries/activation_error");
  const Dataset2D gradients = previous.read_2d("/compression/boundaries/gradient_error");
  // (rows of another pipeline depth do not fit the columns: the history starts again)
  if (activations.columns != stage_count_ - 1 || gradients.columns != stage_count_ - 1) return;
  for (std::size_t r = 0; r < steps.size() && steps[r] < before_step; ++r) {
    if (static_cast<std::int64_t>(r) >= activations.rows || static_cast<std::int64_t>(r) >= gradients.rows) break;
    writer.append_int(boundary_steps_series_, steps[r]);
    writer.append_row(activation_error_series_, &activations.values[r * activations.columns]);
    writer.append_row(gradient_error_series_, &gradients.values[r * gradients.columns]);
  }
}

void PipelineStage::write_record(RunWriter& writer, std::int64_t step) {
  if (boundary_ == Compression::none || boundary_error_.empty()) return;
  const std::size_t boundaries = boundary_error_.size() / 2;
  writer.append_int(boundary_steps_series_, step);
  writer.append_row(activation_error_series_, boundary_error_.data());
  writer.append_row(gradient_error_series_, boundary_error_.data() + boundaries);
}

}  // namespace proplab
