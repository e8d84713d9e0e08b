#include "train/recorder.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/device.h"
#include "ops/ops.h"
#include "train/tensor_parallel.h"

namespace proplab {

const std::vector<std::string>& param_stat_names() {
  static const std::vector<std::string> names = {"weight_rms", "grad_rms", "update_ratio"};
  return names;
}

bool is_recorded_step(const RecordConfig& config, std::int64_t step, std::int64_t total_steps) {
  if (step == 0 || step == total_steps - 1) return true;
  if (config.every > 0 && step % config.every == 0) return true;
  if (config.log_spaced) {
    std::int64_t a = 1, b = 2;  // 1, 2, 3, 5, 8, 13, ...
    while (a < step) {
      const std::int64_t next = a + b;
      a = b;
      b = next;
    }
    return a == step;
  }
  return false;
}

namespace {

probe::StatSelection selection_from(const std::vector<std::string>& names, const char* what) {
  if (names.empty()) return probe::StatSelection::all();
  return probe::StatSelection::parse(names, std::string("record.") + what);
}

std::vector<std::int64_t> ints_of(const std::vector<ProbeInfo>& probes, int ProbeInfo::*field) {
  std::vector<std::int64_t> out;
  for (const ProbeInfo& p : probes) out.push_back(p.*field);
  return out;
}

}  // namespace

Recorder::Recorder(const RecordConfig& config, const std::vector<ProbeInfo>& probes, ParameterStore& params,
                   std::int64_t total_steps)
    : config_(config), probes_(probes), params_(params), total_steps_(total_steps) {
  forward_stats_ = selection_from(config.forward, "forward");
  backward_stats_ = selection_from(config.backward, "backward");
  const std::vector<std::string>& names = param_stat_names();
  if (config.params.empty()) {
    param_stats_ = {ParamStat::weight_rms, ParamStat::grad_rms, ParamStat::update_ratio};
  } else {
    for (const std::string& name : config.params) {
      auto it = std::find(names.begin(), names.end(), name);
      if (it == names.end()) {
        std::string allowed;
        for (const std::string& known : names) allowed += (allowed.empty() ? "" : ", ") + known;
        throw UserError("record.params: unknown statistic \"" + name + "\"; allowed: " + allowed);
      }
      param_stats_.push_back(static_cast<ParamStat>(it - names.begin()));
    }
  }
  forward_sums_.resize(probes_.size());
  backward_sums_.resize(probes_.size());
  forward_seen_.assign(probes_.size(), false);
  backward_seen_.assign(probes_.size(), false);
  param_rows_.assign(param_stats_.size(), std::vector<double>(params_.all().size(), 0.0));
}

void Recorder::create_datasets(RunWriter& writer) {
  std::vector<std::string> names, kinds;
  for (const ProbeInfo& p : probes_) {
    names.push_back(p.name);
    kinds.push_back(probe_kind_name(p.kind));
  }
  writer.write_strings("/probes/name", names);
  writer.write_ints("/probes/depth", ints_of(probes_, &ProbeInfo::depth));
  writer.write_ints("/probes/block", ints_of(probes_, &ProbeInfo::block));
  writer.write_strings("/probes/kind", kinds);
  std::vector<std::string> param_names;
  for (const auto& p : params_.all()) param_names.push_back(p->name);
  writer.write_strings("/params/name", param_names);
  steps_series_ = writer.create_series_1d_int("/steps");
  const std::int64_t n_probes = static_cast<std::int64_t>(probes_.size());
  const auto& stats = probe::stat_names();
  for (std::size_t i = 0; i < stats.size(); ++i) {
    if (forward_stats_.has(static_cast<probe::Stat>(i)))
      forward_series_.push_back(writer.create_series_2d("/forward/" + std::string(stats[i]), n_probes));
    if (backward_stats_.has(static_cast<probe::Stat>(i)))
      backward_series_.push_back(writer.create_series_2d("/backward/" + std::string(stats[i]), n_probes));
  }
  for (ParamStat stat : param_stats_)
    param_series_.push_back(writer.create_series_2d("/params/" + param_stat_names()[static_cast<int>(stat)],
                                                    static_cast<std::int64_t>(params_.all().size())));
}

void Recorder::write_block_layout(RunWriter& writer, const std::vector<BlockInfo>& blocks) const {
  if (blocks.empty()) return;
  for (const ProbeInfo& p : probes_)
    PROPLAB_CHECK(p.block < static_cast<int>(blocks.size()), "probe ", p.name, " is in block ", p.block,
                  " but the block layout has ", blocks.size(), " blocks");
  std::vector<std::int64_t> stages, transitions;
  for (const BlockInfo& block : blocks) {
    stages.push_back(block.stage);
    transitions.push_back(block.transition ? 1 : 0);
  }
  writer.write_ints("/blocks/stage", stages);
  writer.write_ints("/blocks/transition", transitions);
}

void Recorder::copy_history(const RunReader& previous, RunWriter& writer, std::int64_t before_step) {
  if (!previous.exists("/steps")) return;
  const std::vector<std::int64_t> steps = previous.read_ints("/steps");
  std::vector<std::pair<std::string, SeriesId>> series;
  const auto& stats = probe::stat_names();
  std::size_t f = 0, b = 0;
  for (std::size_t i = 0; i < stats.size(); ++i) {
    if (forward_stats_.has(static_cast<probe::Stat>(i)))
      series.emplace_back("/forward/" + std::string(stats[i]), forward_series_[f++]);
    if (backward_stats_.has(static_cast<probe::Stat>(i)))
      series.emplace_back("/backward/" + std::string(stats[i]), backward_series_[b++]);
  }
  for (std::size_t i = 0; i < param_stats_.size(); ++i)
    series.emplace_back("/params/" + param_stat_names()[static_cast<int>(param_stats_[i])], param_series_[i]);
  std::vector<Dataset2D> data;
  for (const auto& [path, id] : series) data.push_back(previous.read_2d(path));
  for (std::size_t r = 0; r < steps.size() && steps[r] < before_step; ++r) {
    writer.append_int(steps_series_, steps[r]);
    for (std::size_t s = 0; s < series.size(); ++s) {
      if (static_cast<std::int64_t>(r) < data[s].rows)
        writer.append_row(series[s].second, &data[s].values[r * data[s].columns]);
    }
  }
}

void Recorder::begin_step() {
  for (std::size_t i = 0; i < probes_.size(); ++i) {
    forward_sums_[i].clear();  // keeps the per-feature arrays' capacity
    backward_sums_[i].clear();
  }
  forward_seen_.assign(probes_.size(), false);
  backward_seen_.assign(probes_.size(), false);
}

void Recorder::accumulate_into(probe::MomentSums& sums, const Tensor& x, std::int64_t sequences,
                               const probe::StatSelection& which) {
  const std::int64_t features = x.dim(-1);
  const std::int64_t rows = x.numel() / features;
  PROPLAB_CHECK(sequences > 0 && rows % sequences == 0, "probe tensor ", shape_string(x.shape()), " with ", sequences,
                " sequences");
  if (x.device() == Device::cpu)
    probe::accumulate(x.f32(), sequences, rows / sequences, features, sums, which);
  else
    probe::accumulate(x, sequences, sums, which);  // on the GPU: only the finished sums come back
}

void Recorder::merge_replicas(dist::Communicator& group) {
  const int ranks = group.size();
  if (ranks == 1) return;
  const int rank = group.rank();
  // Slot k: probe k / 2, forward (even) or backward (odd).
  const std::size_t slots = 2 * probes_.size();
  auto sums_of = [&](std::size_t k) -> probe::MomentSums& {
    return (k % 2 == 0 ? forward_sums_ : backward_sums_)[k / 2];
  };
  auto seen = [&](std::size_t k) { return static_cast<bool>((k % 2 == 0 ? forward_seen_ : backward_seen_)[k / 2]); };

  // 1. What each slot holds on the ranks that saw it (maxima: the others send zeros), and the first rank that saw
  //    it (as ranks − rank, so that the largest is the lowest rank), whose shift the merged sums are about.
  constexpr std::size_t kShape = 6;  // T, F, selection bits, feature_sum and feature_sum_sq lengths, first rank
  std::vector<double> shape(slots * kShape, 0.0);
  for (std::size_t k = 0; k < slots; ++k) {
    if (!seen(k)) continue;
    const probe::MomentSums& s = sums_of(k);
    double* row = &shape[k * kShape];
    row[0] = static_cast<double>(s.tokens_per_sequence);
    row[1] = static_cast<double>(s.features);
    row[2] = static_cast<double>(s.selection.bits());
    row[3] = static_cast<double>(s.feature_sum.size());
    row[4] = static_cast<double>(s.feature_sum_sq.size());
    row[5] = static_cast<double>(ranks - rank);
  }
  group.all_reduce(shape.data(), static_cast<std::int64_t>(shape.size()), dist::ReduceOp::max);
  std::vector<double> shift(slots, 0.0);
  for (std::size_t k = 0; k < slots; ++k)
    if (seen(k) && shape[k * kShape + 5] == static_cast<double>(ranks - rank)) shift[k] = sums_of(k).shift;
  group.all_reduce(shift.data(), static_cast<std::int64_t>(slots), dist::ReduceOp::sum);  // (one rank adds)

  // 2. Every rank's sums about that shift, added: one sum over a block whose size does not grow with the ranks
  //    (on the GPU in a CUDA run: through the group's device transport), and one maximum of max |x| (a NaN there
  //    travels as a count).
  constexpr std::size_t kFixed = 9;  // count, sequences, sum, sum_sq, sum_cube, sum_quad, seq, nonfinite, NaN max
  std::vector<std::size_t> offset(slots + 1, 0);
  for (std::size_t k = 0; k < slots; ++k)
    offset[k + 1] =
        offset[k] + (shape[k * kShape + 5] > 0.0 ? kFixed + static_cast<std::size_t>(shape[k * kShape + 3]) +
                                                       static_cast<std::size_t>(shape[k * kShape + 4])
                                                 : 0);
  std::vector<double> added(offset.back(), 0.0), largest(slots, 0.0);
  for (std::size_t k = 0; k < slots; ++k) {
    if (!seen(k)) continue;
    probe::MomentSums s = sums_of(k);
    s.recentre(shift[k]);
    double* out = &added[offset[k]];
    const double fixed[kFixed] = {static_cast<double>(s.count),
                                  static_cast<double>(s.sequences),
                                  s.sum,
                                  s.sum_sq,
                                  s.sum_cube,
                                  s.sum_quad,
                                  s.seq_sum_norm_sq,
                                  static_cast<double>(s.nonfinite),
                                  std::isnan(s.max_abs) ? 1.0 : 0.0};
    std::copy(fixed, fixed + kFixed, out);
    std::copy(s.feature_sum.begin(), s.feature_sum.end(), out + kFixed);
    std::copy(s.feature_sum_sq.begin(), s.feature_sum_sq.end(), out + kFixed + s.feature_sum.size());
    largest[k] = std::isnan(s.max_abs) ? 0.0 : s.max_abs;
  }
  if (device_ != Device::cpu && !added.empty()) {
    // (f32 storage of twice the length holds the doubles on the GPU)
    Tensor on_device = Tensor::empty({2 * static_cast<std::int64_t>(added.size())}, DType::f32, device_);
    copy_host_to_device(on_device.raw(), added.data(), added.size() * sizeof(double));
    group.all_reduce(static_cast<double*>(on_device.raw()), static_cast<std::int64_t>(added.size()),
                     dist::ReduceOp::sum);
    copy_device_to_host(added.data(), on_device.raw(), added.size() * sizeof(double));
  } else {
    group.all_reduce(added.data(), static_cast<std::int64_t>(added.size()), dist::ReduceOp::sum);
  }
  group.all_reduce(largest.data(), static_cast<std::int64_t>(slots), dist::ReduceOp::max);
  if (rank != 0) return;

  // 3. Rank 0 holds the merged sums.
  for (std::size_t k = 0; k < slots; ++k) {
    const double* row = &shape[k * kShape];
    if (row[5] == 0.0) continue;  // no rank saw it
    probe::MomentSums merged;
    const double* in = &added[offset[k]];
    merged.count = static_cast<std::int64_t>(in[0]);
    merged.sequences = static_cast<std::int64_t>(in[1]);
    merged.tokens_per_sequence = static_cast<std::int64_t>(row[0]);
    merged.features = static_cast<std::int64_t>(row[1]);
    merged.selection = probe::StatSelection::from_bits(static_cast<std::uint32_t>(row[2]));
    merged.shift = shift[k];
    merged.sum = in[2];
    merged.sum_sq = in[3];
    merged.sum_cube = in[4];
    merged.sum_quad = in[5];
    merged.seq_sum_norm_sq = in[6];
    merged.nonfinite = static_cast<std::int64_t>(in[7]);
    merged.max_abs = in[8] > 0.0 ? std::numeric_limits<double>::quiet_NaN() : largest[k];
    const auto sums = static_cast<std::size_t>(row[3]), squares = static_cast<std::size_t>(row[4]);
    merged.feature_sum.assign(in + kFixed, in + kFixed + sums);
    merged.feature_sum_sq.assign(in + kFixed + sums, in + kFixed + sums + squares);
    sums_of(k) = std::move(merged);
    (k % 2 == 0 ? forward_seen_ : backward_seen_)[k / 2] = true;
  }
}

void Recorder::forward(int probe_index, const Tensor& x, std::int64_t sequences) {
  accumulate_into(forward_sums_[probe_index], x, sequences, forward_stats_);
  forward_seen_[probe_index] = true;
}

void Recorder::backward(int probe_index, const Tensor& d_x, std::int64_t sequences) {
  accumulate_into(backward_sums_[probe_index], d_x, sequences, backward_stats_);
  backward_seen_[probe_index] = true;
}

probe::MomentSums* Recorder::gathered(int probe_index, bool backward, probe::StatSelection& which) {
  (backward ? backward_seen_ : forward_seen_)[probe_index] = true;
  which = backward ? backward_stats_ : forward_stats_;
  return &(backward ? backward_sums_ : forward_sums_)[probe_index];
}

bool Recorder::image(int probe_index, const Tensor& x, bool backward) {
  if (x.device() != Device::cpu || x.ndim() != 4 || !x.is_contiguous() || x.dtype() != DType::f32) return false;
  probe::MomentSums& sums = (backward ? backward_sums_ : forward_sums_)[probe_index];
  probe::accumulate_planes(x.f32(), x.dim(0), x.dim(1), x.dim(2) * x.dim(3), sums,
                           backward ? backward_stats_ : forward_stats_);
  (backward ? backward_seen_ : forward_seen_)[probe_index] = true;
  return true;
}

void Recorder::attention_logits(int probe_index, const probe::LogitSums& sums, const Tensor&, int, float) {
  // Moments over the causal entries that exist; token correlation and per-feature statistics do not apply (NaN).
  forward_sums_[probe_index].merge(probe::moment_sums(sums, forward_stats_));
  forward_seen_[probe_index] = true;
}

void Recorder::before_update() {
  auto& all = params_.all();
  update_norms_.assign(all.size(), ops::UpdateNorms{});
  for (std::size_t s = 0; s < param_stats_.size(); ++s) {
    if (param_stats_[s] != ParamStat::grad_rms) continue;
    // Every gradient's Σg² in one parallel region (bitwise one ops::sum_squares each).
    std::vector<const Tensor*> grads(all.size());
    for (std::size_t i = 0; i < all.size(); ++i) grads[i] = &all[i]->grad;
    std::vector<double> squares = ops::sum_squares_each(grads);
    if (tensor_group_ == nullptr) {
      for (std::size_t i = 0; i < all.size(); ++i)
        param_rows_[s][i] =
            std::sqrt(squares[i] / static_cast<double>(std::max<std::int64_t>(all[i]->grad.numel(), 1)));
      continue;
    }
    sum_split_parameters(*tensor_group_, params_, squares);
    for (std::size_t i = 0; i < all.size(); ++i)
      param_rows_[s][i] = std::sqrt(squares[i] / static_cast<double>(std::max<std::int64_t>(full_numel(*all[i]), 1)));
  }
}

void Recorder::skip_update() {
  auto& all = params_.all();
  std::vector<const Tensor*> values(all.size());
  for (std::size_t i = 0; i < all.size(); ++i) values[i] = &all[i]->value;
  const std::vector<double> squares = ops::sum_squares_each(values);
  for (std::size_t i = 0; i < all.size(); ++i) update_norms_[i] = {squares[i], 0.0};
}

void Recorder::after_update() {
  auto& all = params_.all();
  if (tensor_group_ != nullptr) {  // the full tensors' sums
    std::vector<double> weight_sq(all.size()), update_sq(all.size());
    for (std::size_t i = 0; i < all.size(); ++i) {
      weight_sq[i] = update_norms_[i].weight_sq;
      update_sq[i] = update_norms_[i].update_sq;
    }
    sum_split_parameters(*tensor_group_, params_, weight_sq);
    sum_split_parameters(*tensor_group_, params_, update_sq);
    for (std::size_t i = 0; i < all.size(); ++i) update_norms_[i] = {weight_sq[i], update_sq[i]};
  }
  for (std::size_t i = 0; i < all.size(); ++i) {
    const double before_sq = update_norms_[i].weight_sq, delta_sq = update_norms_[i].update_sq;
    const double n = static_cast<double>(std::max<std::int64_t>(full_numel(*all[i]), 1));
    for (std::size_t s = 0; s < param_stats_.size(); ++s) {
      if (param_stats_[s] == ParamStat::weight_rms) param_rows_[s][i] = std::sqrt(before_sq / n);
      // ‖W_after − W_before‖ / ‖W_before‖ over the tensor.
      if (param_stats_[s] == ParamStat::update_ratio)
        param_rows_[s][i] = std::sqrt(delta_sq / std::max(before_sq, 1e-300));
    }
  }
}

std::string Recorder::write_record(RunWriter& writer, std::int64_t step) {
  const std::size_t n = probes_.size();
  const auto& stats = probe::stat_names();
  std::vector<probe::Moments> forward(n), backward(n);
  for (std::size_t p = 0; p < n; ++p) {
    forward[p] = forward_seen_[p] ? probe::finalize(forward_sums_[p]) : probe::finalize(probe::MomentSums{});
    backward[p] = backward_seen_[p] ? probe::finalize(backward_sums_[p]) : probe::finalize(probe::MomentSums{});
  }
  writer.append_int(steps_series_, step);
  std::vector<double> row(n);
  std::size_t f = 0, b = 0;
  for (std::size_t i = 0; i < stats.size(); ++i) {
    const probe::Stat stat = static_cast<probe::Stat>(i);
    if (forward_stats_.has(stat)) {
      for (std::size_t p = 0; p < n; ++p) row[p] = forward[p].value(stat);
      writer.append_row(forward_series_[f++], row.data());
    }
    if (backward_stats_.has(stat)) {
      for (std::size_t p = 0; p < n; ++p) row[p] = backward[p].value(stat);
      writer.append_row(backward_series_[b++], row.data());
    }
  }
  for (std::size_t s = 0; s < param_stats_.size(); ++s) writer.append_row(param_series_[s], param_rows_[s].data());
  // Every record is handed to the run file's writer thread at once, which writes and flushes it as one: a reader
  // (or a crash) sees whole records. (The write happens there; this thread does not wait for it.)
  writer.flush();

  // The first non-finite value, in depth order: a probe that saw NaN/Inf (or whose moments overflowed).
  // Only recorded statistics count: the others are NaN by design (a study may record just `var`).
  auto bad = [](const probe::Moments& m, const probe::StatSelection& which) {
    using probe::Stat;
    return (which.has(Stat::nonfinite) && m.nonfinite > 0) || (which.has(Stat::mean) && !std::isfinite(m.mean)) ||
           (which.has(Stat::var) && !std::isfinite(m.var)) || (which.has(Stat::rms) && !std::isfinite(m.rms)) ||
           (which.has(Stat::max_abs) && !std::isfinite(m.max_abs));
  };
  for (std::size_t p = 0; p < n; ++p)
    if (forward_seen_[p] && bad(forward[p], forward_stats_)) return probes_[p].name + " (forward)";
  for (std::size_t p = 0; p < n; ++p)
    if (backward_seen_[p] && bad(backward[p], backward_stats_)) return probes_[p].name + " (backward)";
  for (std::size_t s = 0; s < param_stats_.size(); ++s)
    for (std::size_t i = 0; i < params_.all().size(); ++i)
      if (!std::isfinite(param_rows_[s][i]))
        return params_.all()[i]->name + " (" + param_stat_names()[static_cast<int>(param_stats_[s])] + ")";
  return "";
}

}  // namespace proplab
