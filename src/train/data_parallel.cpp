#include "train/data_parallel.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <utility>

#include "core/device.h"
#include "core/error.h"

namespace proplab {

namespace {

Tensor& data_of(Parameter& p, bool gradients) { return gradients ? p.grad : p.value; }

// Copies `count` elements from flat position `from_offset` of `from` to flat position `to_offset` of `to` (either
// tensor on either device; both contiguous).
void copy_flat(const Tensor& to, std::int64_t to_offset, const Tensor& from, std::int64_t from_offset,
               std::int64_t count) {
  if (count == 0) return;
  Tensor target = to.reshape({to.numel()}).slice(0, to_offset, count);
  target.copy_from(from.reshape({from.numel()}).slice(0, from_offset, count));
}

// D = sqrt(spread / dp) / sqrt(mean_sq), with 0/0 = 0 (replicas that agree on a zero tensor).
double relative_distance(double spread, double mean_sq, int replicas) {
  const double distance = std::sqrt(spread / replicas);
  if (distance == 0.0) return 0.0;
  return distance / std::sqrt(mean_sq);
}

// The optimizer's own state tensors by name (handles, no copies): what a checkpoint saves and loads into when
// every rank holds the whole state (no ZeRO).
std::vector<std::pair<std::string, Tensor>> whole_state(Optimizer& optimizer) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& [name, tensor] : optimizer.state()) out.emplace_back(name, *tensor);
  return out;
}

}  // namespace

DataParallel::DataParallel(const ParallelConfig& config, dist::Communicator* group, ParameterStore& params,
                           std::vector<bool> exchanged, std::uint64_t seed)
    : config_(config), group_(group), params_(params), exchanged_(std::move(exchanged)) {
  replicas_ = group_ ? group_->size() : 1;
  if (!params_.all().empty()) device_ = params_.all().front()->value.device();
  if (config.zero == 1 && config.dp_mode != "allreduce")
    throw UserError(
        "parallel.zero = 1 shards the optimizer state of replicas that apply one common update; with "
        "parallel.dp_mode = \"" +
        config.dp_mode + "\" each replica keeps its own; allowed: zero = 1 with dp_mode = \"allreduce\"");
  const Compression compression = compression_of(config);
  if (compression != Compression::none) {
    const std::string key = std::string("parallel.compress = \"") + compression_name(compression) + "\"";
    if (replicas_ == 1)
      throw UserError(key +
                      " compresses the data-parallel gradient exchange, which needs parallel.dp > 1; allowed "
                      "with one replica: \"none\"");
    if (config.dp_mode != "allreduce" || config.zero != 0)
      throw UserError(key +
                      " compresses the summed gradients of dp_mode = \"allreduce\" with zero = 0; allowed with "
                      "parallel.dp_mode = \"" +
                      config.dp_mode + "\" and zero = " + std::to_string(config.zero) + ": \"none\"");
  }
  local_ = replicas_ > 1 && config.dp_mode != "allreduce";
  zero_ = replicas_ > 1 && config.zero == 1;
  const std::size_t n = params_.all().size();
  const bool restricted = !exchanged_.empty();
  if (!restricted) exchanged_.assign(n, true);
  PROPLAB_CHECK(exchanged_.size() == n, "DataParallel: ", exchanged_.size(), " exchange flags for ", n, " parameters");
  PROPLAB_CHECK(!restricted || (config.dp_mode == "allreduce" && config.zero == 0),
                "DataParallel: a restricted exchange (pipeline stage) with allreduce and zero = 0 only");
  offsets_.push_back(0);
  for (auto& p : params_.all()) offsets_.push_back(offsets_.back() + p->value.numel());
  const std::int64_t total = offsets_.back();
  if (zero_) {
    chunk_ = (total + replicas_ - 1) / replicas_;
    flat_ = Tensor::zeros({chunk_ * replicas_}, DType::f32, device_);
    slice_ = Tensor::zeros({chunk_}, DType::f32, device_);
  }
  if (compression != Compression::none)
    compressor_ = std::make_unique<GradientCompressor>(config, *group_, params_, exchanged_, seed);
  if (replicas_ > 1 && !local_ && !zero_ && !compressor_ && config.bucket_mb > 0.0) {
    const double bucket_bytes = config.bucket_mb * 1024.0 * 1024.0;
    // Elements of parameter i's gradient in the exchange (0 when it is not exchanged).
    auto elements_of = [&](std::size_t i) { return exchanged_[i] ? params_.all()[i]->value.numel() : 0; };
    std::size_t last = n;
    while (last > 0) {
      while (last > 0 && !exchanged_[last - 1]) --last;  // a bucket ends with an exchanged parameter
      if (last == 0) break;
      std::size_t first = last - 1;
      std::int64_t elements = elements_of(first);
      while (first > 0 && 4.0 * static_cast<double>(elements) < bucket_bytes) elements += elements_of(--first);
      Bucket bucket;
      bucket.first = first;
      bucket.last = last;
      bucket.buffer = Tensor::zeros({elements}, DType::f32, device_);
      buckets_.push_back(std::move(bucket));
      last = first;
    }
  }
  after_.assign(params_.all().size() + 1, 0.0);
  before_ = after_;
}

DataParallel::~DataParallel() = default;

ParameterShard DataParallel::optimizer_shard() const {
  if (!zero_) return {};
  const int rank = group_->rank();
  return {std::min(offsets_.back(), rank * chunk_), std::min(offsets_.back(), (rank + 1) * chunk_)};
}

void DataParallel::pack(bool gradients, std::int64_t begin, std::int64_t end, Tensor& out) const {
  auto& all = params_.all();
  for (std::size_t i = 0; i < all.size(); ++i) {
    const std::int64_t from = std::max(begin, offsets_[i]), to = std::min(end, offsets_[i + 1]);
    if (from >= to) continue;
    copy_flat(out, from - begin, data_of(*all[i], gradients), from - offsets_[i], to - from);
  }
}

void DataParallel::unpack(bool gradients, std::int64_t begin, std::int64_t end, const Tensor& in) {
  auto& all = params_.all();
  for (std::size_t i = 0; i < all.size(); ++i) {
    const std::int64_t from = std::max(begin, offsets_[i]), to = std::min(end, offsets_[i + 1]);
    if (from >= to) continue;
    copy_flat(data_of(*all[i], gradients), from - offsets_[i], in, from - begin, to - from);
  }
}

void DataParallel::pack_bucket(Bucket& bucket) const {
  auto& all = params_.all();
  std::int64_t at = 0;
  for (std::size_t i = bucket.first; i < bucket.last; ++i) {
    if (!exchanged_[i]) continue;
    const std::int64_t count = all[i]->grad.numel();
    copy_flat(bucket.buffer, at, all[i]->grad, 0, count);
    at += count;
  }
}

void DataParallel::unpack_bucket(const Bucket& bucket) {
  auto& all = params_.all();
  std::int64_t at = 0;
  for (std::size_t i = bucket.first; i < bucket.last; ++i) {
    if (!exchanged_[i]) continue;
    const std::int64_t count = all[i]->grad.numel();
    copy_flat(all[i]->grad, 0, bucket.buffer, at, count);
    at += count;
  }
}

GradientListener* DataParallel::listener_for(bool last_micro_batch) {
  return last_micro_batch && overlap_ && !buckets_.empty() ? this : nullptr;
}

void DataParallel::start_bucket(Bucket& bucket) {
  pack_bucket(bucket);
  bucket.pending = group_->start_all_reduce(bucket.buffer.f32(), bucket.buffer.numel());
}

void DataParallel::gradients_final_from(std::size_t first) {
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].first >= first)
    start_bucket(buckets_[next_bucket_++]);
  // MPI progresses non-blocking collectives only inside MPI calls: give the ones in flight a turn.
  for (std::size_t b = 0; b < next_bucket_; ++b) buckets_[b].pending->test();
}

void DataParallel::finish_gradients(bool record) {
  if (replicas_ == 1) return;
  // (on a GPU the host first waits for backward's kernels, so the time below is the exchange's alone)
  if (device_ != Device::cpu) cuda_synchronize("the end of backward");
  const auto begin = std::chrono::steady_clock::now();
  struct Timed {  // adds the time spent here, however the function returns
    double& total;
    std::chrono::steady_clock::time_point begin;
    ~Timed() { total += std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count(); }
  } timed{exchange_seconds_, begin};
  auto& all = params_.all();
  if (local_) {
    // The replica's own mean gradient: its share times dp (probes keep the single-process scale).
    for (auto& p : all) ops::scale(p->grad, static_cast<float>(replicas_));
    return;
  }
  if (zero_) {
    // (the padding past N stays zero: only an all-gather of slices, whose padding is zero, writes there)
    pack(true, 0, offsets_.back(), flat_);
    group_->reduce_scatter(flat_.f32(), slice_.f32(), chunk_);
    const ParameterShard own = optimizer_shard();
    unpack(true, own.begin, own.end, slice_);
    return;
  }
  if (compressor_) {
    compressor_->exchange(record);
    if (record) compressor_->measure(compress_error_, compress_residual_);
    return;
  }
  if (buckets_.empty()) {
    for (std::size_t i = 0; i < all.size(); ++i)
      if (exchanged_[i]) group_->all_reduce(all[i]->grad.f32(), all[i]->grad.numel());
    return;
  }
  while (next_bucket_ < buckets_.size()) start_bucket(buckets_[next_bucket_++]);
  for (Bucket& bucket : buckets_) {
    bucket.pending->wait();
    bucket.pending.reset();
    unpack_bucket(bucket);
  }
  next_bucket_ = 0;
}

double DataParallel::clip_gradients(double max_norm, bool full) {
  auto& all = params_.all();
  if (!zero_) {
    std::vector<Tensor*> grads;
    for (auto& p : all) grads.push_back(&p->grad);
    return ops::clip_grad_norm(grads, max_norm);
  }
  // The own slice's pieces of each gradient, in parameter order.
  const ParameterShard own = optimizer_shard();
  std::vector<Tensor> pieces;
  for (std::size_t i = 0; i < all.size(); ++i) {
    const std::int64_t from = std::max(own.begin, offsets_[i]), to = std::min(own.end, offsets_[i + 1]);
    if (from < to)
      pieces.push_back(all[i]->grad.reshape({all[i]->grad.numel()}).slice(0, from - offsets_[i], to - from));
  }
  double sum_sq = 0.0;
  for (const Tensor& piece : pieces) sum_sq += ops::sum_squares(piece);
  group_->all_reduce(&sum_sq, 1);
  const double norm = std::sqrt(sum_sq);
  // As ops::clip_grad_norm: a non-finite norm is left for the caller to report.
  if (max_norm > 0.0 && std::isfinite(norm) && norm > max_norm) {
    const float factor = static_cast<float>(max_norm / norm);
    for (Tensor& piece : pieces) ops::scale(piece, factor);
  }
  if (full) {
    pack(true, own.begin, own.end, slice_);
    group_->all_gather(slice_.f32(), flat_.f32(), chunk_);
    unpack(true, 0, offsets_.back(), flat_);
  }
  return norm;
}

void DataParallel::average_parameters() {
  for (auto& p : params_.all()) {
    group_->all_reduce(p->value.f32(), p->value.numel());
    if (device_ != Device::cpu) {  // (a multiply by 1/dp: exact for dp a power of two, as the host's divide)
      ops::scale(p->value, 1.0f / static_cast<float>(replicas_));
      continue;
    }
    float* v = p->value.f32();
    for (std::int64_t i = 0; i < p->value.numel(); ++i) v[i] /= static_cast<float>(replicas_);
  }
}

void DataParallel::mix_parameters() {
  const std::int64_t n = offsets_.back();
  const int rank = group_->rank();
  const int left = (rank + replicas_ - 1) % replicas_, right = (rank + 1) % replicas_;
  if (mix_.numel() != 3 * n) mix_ = Tensor::zeros({3 * n}, DType::f32, device_);
  Tensor own = mix_.slice(0, 0, n), left_part = mix_.slice(0, n, n), right_part = mix_.slice(0, 2 * n, n);
  pack(false, 0, n, own);
  group_->send_receive(own.f32(), right, left_part.f32(), left, n, 1);
  if (replicas_ > 2) group_->send_receive(own.f32(), left, right_part.f32(), right, n, 2);
  if (device_ != Device::cpu) {
    // The host's sums in the host's order; then a multiply by 1/2 or 1/3.
    if (replicas_ == 2) {
      ops::axpy(1.0f, left_part, own);
      ops::scale(own, 0.5f);
    } else {
      ops::axpy(1.0f, own, left_part);
      ops::axpy(1.0f, right_part, left_part);
      ops::scale(left_part, 1.0f / 3.0f);
      own.copy_from(left_part);
    }
  } else {
    float* mine = own.f32();
    const float* from_left = left_part.f32();
    const float* from_right = right_part.f32();
    if (replicas_ == 2) {
      // W = [[1/2, 1/2], [1/2, 1/2]]: both replicas compute the same sum a + b, so they end bitwise equal.
      for (std::int64_t i = 0; i < n; ++i) mine[i] = (mine[i] + from_left[i]) * 0.5f;
    } else {
      for (std::int64_t i = 0; i < n; ++i) mine[i] = (from_left[i] + mine[i] + from_right[i]) / 3.0f;
    }
  }
  unpack(false, 0, n, own);
}

void DataParallel::measure_disagreement(std::vector<double>& out) {
  // Deviations from rank 0's parameters, in double: exactly 0 while the replicas are identical, and the spread
  // Σ_r ‖θ_r − θ̄‖² is the same about any reference.
  const std::int64_t n = offsets_.back();
  Tensor values = Tensor::empty({n});  // on the host
  pack(false, 0, n, values);
  std::vector<float> reference(values.f32(), values.f32() + n);
  std::vector<double> deviation(reference.size());
  {
    std::vector<float> mine = reference;
    group_->broadcast(reference.data(), n * static_cast<std::int64_t>(sizeof(float)), 0);
    for (std::size_t e = 0; e < mine.size(); ++e)
      deviation[e] = static_cast<double>(mine[e]) - static_cast<double>(reference[e]);
  }
  std::vector<double> mean_deviation = deviation;
  group_->all_reduce(mean_deviation.data(), n);
  for (double& d : mean_deviation) d /= replicas_;
  const std::size_t count = params_.all().size();
  std::vector<double> spread(count, 0.0), mean_sq(count, 0.0);
  for (std::size_t i = 0; i < count; ++i) {
    for (std::int64_t e = offsets_[i]; e < offsets_[i + 1]; ++e) {
      const double away = deviation[e] - mean_deviation[e];
      const double mean = static_cast<double>(reference[e]) + mean_deviation[e];
      spread[i] += away * away;
      mean_sq[i] += mean * mean;
    }
  }
  group_->all_reduce(spread.data(), static_cast<std::int64_t>(count));
  out.assign(count + 1, 0.0);
  double spread_total = 0.0, mean_sq_total = 0.0;
  for (std::size_t i = 0; i < count; ++i) {
    out[i] = relative_distance(spread[i], mean_sq[i], replicas_);
    spread_total += spread[i];
    mean_sq_total += mean_sq[i];
  }
  out[count] = relative_distance(spread_total, mean_sq_total, replicas_);
}

void DataParallel::update(Optimizer& optimizer, double lr, std::int64_t step, std::vector<ops::UpdateNorms>* norms,
                          bool record) {
  optimizer.step(lr, norms);
  if (replicas_ == 1) return;
  if (zero_) {
    if (norms) {  // the slices' partial sums, made global
      std::vector<double> sums;
      for (const ops::UpdateNorms& u : *norms) sums.insert(sums.end(), {u.weight_sq, u.update_sq});
      group_->all_reduce(sums.data(), static_cast<std::int64_t>(sums.size()));
      for (std::size_t i = 0; i < norms->size(); ++i) (*norms)[i] = {sums[2 * i], sums[2 * i + 1]};
    }
    const ParameterShard own = optimizer_shard();
    ops::zero(slice_);
    pack(false, own.begin, own.end, slice_);
    group_->all_gather(slice_.f32(), flat_.f32(), chunk_);
    unpack(false, 0, offsets_.back(), flat_);
  }
  const bool mixes =
      config_.dp_mode == "gossip" || (config_.dp_mode == "local_sgd" && (step + 1) % config_.sync_every == 0);
  if (record && mixes) measure_disagreement(before_);
  if (mixes) {
    if (config_.dp_mode == "gossip")
      mix_parameters();
    else
      average_parameters();
  }
  if (record) {
    measure_disagreement(after_);
    if (!mixes) before_ = after_;
  }
}

void DataParallel::create_datasets(RunWriter& writer) {
  if (replicas_ == 1) return;
  const auto columns = static_cast<std::int64_t>(params_.all().size());
  steps_series_ = writer.create_series_1d_int("/replicas/steps");
  after_series_ = writer.create_series_2d("/replicas/disagreement", columns);
  after_total_series_ = writer.create_series_2d("/replicas/disagreement_total", 1);
  before_series_ = writer.create_series_2d("/replicas/disagreement_before_mix", columns);
  before_total_series_ = writer.create_series_2d("/replicas/disagreement_before_mix_total", 1);
  if (!compressor_) return;
  compress_steps_series_ = writer.create_series_1d_int("/compression/steps");
  compress_error_series_ = writer.create_series_2d("/compression/error", columns);
  compress_error_total_series_ = writer.create_series_2d("/compression/error_total", 1);
  compress_residual_series_ = writer.create_series_2d("/compression/residual", columns);
  compress_residual_total_series_ = writer.create_series_2d("/compression/residual_total", 1);
}

void DataParallel::copy_history(const RunReader& previous, RunWriter& writer, std::int64_t before_step) {
  if (replicas_ == 1 || !previous.exists("/replicas/steps")) return;
  const std::vector<std::int64_t> steps = previous.read_ints("/replicas/steps");
  const std::vector<std::pair<std::string, SeriesId>> series = {
      {"/replicas/disagreement", after_series_},
      {"/replicas/disagreement_total", after_total_series_},
      {"/replicas/disagreement_before_mix", before_series_},
      {"/replicas/disagreement_before_mix_total", before_total_series_}};
  std::vector<Dataset2D> data;
  for (const auto& [path, id] : series) data.push_back(previous.read_2d(path));
  for (std::size_t r = 0; r < steps.size() && steps[r] < before_step; ++r) {
    writer.append_int(steps_series_, steps[r]);
    for (std::size_t s = 0; s < series.size(); ++s)
      if (static_cast<std::int64_t>(r) < data[s].rows)
        writer.append_row(series[s].second, &data[s].values[r * data[s].columns]);
  }
  if (!compressor_ || !previous.exists("/compression/steps")) return;
  // (a run resumed with another scheme keeps the earlier rows: they say what ran before the checkpoint)
  const std::vector<std::int64_t> compressed_steps = previous.read_ints("/compression/steps");
  const std::vector<std::pair<std::string, SeriesId>> compressed = {
      {"/compression/error", compress_error_series_},
      {"/compression/error_total", compress_error_total_series_},
      {"/compression/residual", compress_residual_series_},
      {"/compression/residual_total", compress_residual_total_series_}};
  data.clear();
  for (const auto& [path, id] : compressed) data.push_back(previous.read_2d(path));
  for (std::size_t r = 0; r < compressed_steps.size() && compressed_steps[r] < before_step; ++r) {
    if (std::any_of(data.begin(), data.end(),
                    [&](const Dataset2D& d) { return static_cast<std::int64_t>(r) >= d.rows; }))
      break;  // whole records only
    writer.append_int(compress_steps_series_, compressed_steps[r]);
    for (std::size_t s = 0; s < compressed.size(); ++s)
      writer.append_row(compressed[s].second, &data[s].values[r * data[s].columns]);
  }
}

void DataParallel::write_record(RunWriter& writer, std::int64_t step) {
  if (replicas_ == 1) return;
  writer.append_int(steps_series_, step);
  writer.append_row(after_series_, after_.data());
  writer.append_row(after_total_series_, &after_.back());
  writer.append_row(before_series_, before_.data());
  writer.append_row(before_total_series_, &before_.back());
  if (!compressor_ || compress_error_.empty()) return;
  writer.append_int(compress_steps_series_, step);
  writer.append_row(compress_error_series_, compress_error_.data());
  writer.append_row(compress_error_total_series_, &compress_error_.back());
  writer.append_row(compress_residual_series_, compress_residual_.data());
  writer.append_row(compress_residual_total_series_, &compress_residual_.back());
}

std::vector<std::pair<std::string, Tensor>> DataParallel::optimizer_state_to_save(Optimizer& optimizer) {
  if (!zero_) return whole_state(optimizer);
  const auto state = optimizer.state();
  auto& all = params_.all();
  const std::size_t kinds = state.size() / all.size();
  const ParameterShard own = optimizer_shard();
  std::vector<Tensor> full;
  for (std::size_t i = 0; i < all.size(); ++i)
    for (std::size_t k = 0; k < kinds; ++k) full.push_back(Tensor::zeros(all[i]->value.shape()));
  for (std::size_t k = 0; k < kinds; ++k) {
    ops::zero(slice_);
    for (std::size_t i = 0; i < all.size(); ++i) {
      const Optimizer::Piece& piece = optimizer.pieces()[i];
      if (piece.length == 0) continue;
      copy_flat(slice_, offsets_[i] + piece.offset - own.begin, *state[i * kinds + k].second, 0, piece.length);
    }
    group_->all_gather(slice_.f32(), flat_.f32(), chunk_);
    for (std::size_t i = 0; i < all.size(); ++i)
      copy_flat(full[i * kinds + k], 0, flat_, offsets_[i], all[i]->value.numel());
  }
  std::vector<std::pair<std::string, Tensor>> out;
  for (std::size_t e = 0; e < state.size(); ++e) out.emplace_back(state[e].first, full[e]);
  return out;
}

std::vector<std::pair<std::string, Tensor>> DataParallel::optimizer_state_to_load(Optimizer& optimizer) {
  if (!zero_) return whole_state(optimizer);
  const auto state = optimizer.state();
  auto& all = params_.all();
  const std::size_t kinds = state.size() / all.size();
  std::vector<std::pair<std::string, Tensor>> out;
  for (std::size_t e = 0; e < state.size(); ++e)
    out.emplace_back(state[e].first, Tensor::zeros(all[e / kinds]->value.shape()));
  return out;
}

void DataParallel::after_optimizer_load(Optimizer& optimizer,
                                        const std::vector<std::pair<std::string, Tensor>>& loaded) {
  if (!zero_) return;  // loaded straight into the optimizer's own tensors
  const auto state = optimizer.state();
  const std::size_t kinds = state.size() / params_.all().size();
  for (std::size_t e = 0; e < state.size(); ++e) {
    const Optimizer::Piece& piece = optimizer.pieces()[e / kinds];
    if (piece.length == 0) continue;
    copy_flat(*state[e].second, 0, loaded[e].second, piece.offset, piece.length);
  }
}

}  // namespace proplab
