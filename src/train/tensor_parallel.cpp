#include "train/tensor_parallel.h"

#include <algorithm>
#include <cmath>

#include "ops/ops.h"

namespace proplab {

TensorParallelSink::TensorParallelSink(ProbeSink& recorder, const std::vector<ProbeInfo>& probes,
                                       dist::Communicator& group)
    : recorder_(recorder), probes_(probes), group_(group) {}

const Tensor& TensorParallelSink::whole(int probe, const Tensor& x) {
  if (!probes_[static_cast<std::size_t>(probe)].split_features) return x;
  PROPLAB_CHECK(x.is_contiguous() && x.dtype() == DType::f32, "a split probe tensor must be contiguous f32");
  const std::int64_t ranks = group_.size(), features = x.dim(-1), rows = x.numel() / features;
  // Gathered where the pieces are (a GPU's over its device transport), then reordered on the host: rank 0 measures
  // the whole tensor there (recorded steps only).
  if (gathered_.numel() != ranks * rows * features || gathered_.device() != x.device())
    gathered_ = Tensor::empty({ranks * rows * features}, DType::f32, x.device());
  group_.all_gather(x.f32(), gathered_.f32(), x.numel());
  if (group_.rank() != 0) return x;
  const Tensor gathered = gathered_.device() == Device::cpu ? gathered_ : gathered_.to(Device::cpu);
  // Block k of the gather is rank k's [rows, F/tp]: it becomes columns [k·F/tp, (k+1)·F/tp) of every row.
  whole_ = Tensor::empty({rows, ranks * features});
  const float* in = gathered.f32();
  float* out = whole_.f32();
#pragma omp parallel for schedule(static) if (rows * features * ranks > (1 << 16))
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t k = 0; k < ranks; ++k)
      std::copy(in + (k * rows + r) * features, in + (k * rows + r + 1) * features, out + (r * ranks + k) * features);
  return whole_;
}

void TensorParallelSink::forward(int probe, const Tensor& x, std::int64_t sequences) {
  const Tensor& t = whole(probe, x);
  if (group_.rank() == 0) recorder_.forward(probe, t, sequences);
}

void TensorParallelSink::backward(int probe, const Tensor& d_x, std::int64_t sequences) {
  const Tensor& t = whole(probe, d_x);
  if (group_.rank() == 0) recorder_.backward(probe, t, sequences);
}

void TensorParallelSink::attention_logits(int probe, const probe::LogitSums& sums, const Tensor& qkv, int heads,
                                          float logit_scale) {
  // Power sums over this rank's heads.
  const probe::LogitSums total = sum_logit_sums(group_, sums);
  if (group_.rank() == 0) recorder_.attention_logits(probe, total, qkv, heads * group_.size(), logit_scale);
}

probe::LogitSums sum_logit_sums(dist::Communicator& group, const probe::LogitSums& sums) {
  // Sums over elements add, maxima take the maximum.
  double added[6] = {static_cast<double>(sums.count),
                     static_cast<double>(sums.nonfinite),
                     sums.sum,
                     sums.sum_sq,
                     sums.sum_cube,
                     sums.sum_quad};
  double largest = sums.max_abs;
  group.all_reduce(added, 6, dist::ReduceOp::sum);
  group.all_reduce(&largest, 1, dist::ReduceOp::max);
  probe::LogitSums total;
  total.count = static_cast<std::int64_t>(added[0]);
  total.nonfinite = static_cast<std::int64_t>(added[1]);
  total.sum = added[2];
  total.sum_sq = added[3];
  total.sum_cube = added[4];
  total.sum_quad = added[5];
  total.max_abs = largest;
  return total;
}

void sum_split_parameters(dist::Communicator& group, const ParameterStore& params, std::vector<double>& per_param) {
  const auto& all = params.all();
  PROPLAB_CHECK(per_param.size() == all.size(), per_param.size(), " values for ", all.size(), " parameters");
  std::vector<double> split;
  for (std::size_t i = 0; i < all.size(); ++i)
    if (all[i]->shard.split()) split.push_back(per_param[i]);
  if (split.empty()) return;
  group.all_reduce(split.data(), static_cast<std::int64_t>(split.size()), dist::ReduceOp::sum);
  std::size_t k = 0;
  for (std::size_t i = 0; i < all.size(); ++i)
    if (all[i]->shard.split()) per_param[i] = split[k++];
}

double clip_grad_norm_split(dist::Communicator& group, ParameterStore& params, double max_norm) {
  const auto& all = params.all();
  std::vector<double> squares(all.size());
  for (std::size_t i = 0; i < all.size(); ++i) squares[i] = ops::sum_squares(all[i]->grad);
  sum_split_parameters(group, params, squares);
  double total = 0.0;
  for (double s : squares) total += s;
  const double norm = std::sqrt(total);
  // As ops::clip_grad_norm: a non-finite norm is returned for the caller to report, gradients untouched.
  if (max_norm > 0.0 && std::isfinite(norm) && norm > max_norm)
    for (auto& p : all) ops::scale(p->grad, static_cast<float>(max_norm / norm));
  return norm;
}

namespace {

// The parameter a checkpoint entry belongs to ("param/<name>" or "optim/<name>.<state>"), null for others.
const Parameter* owner_of(const ParameterStore& params, const std::string& key) {
  auto find = [&](const std::string& name) -> const Parameter* {
    for (const auto& p : params.all())
      if (p->name == name) return p.get();
    return nullptr;
  };
  if (key.rfind("param/", 0) == 0) return find(key.substr(6));
  if (key.rfind("optim/", 0) == 0) {
    const std::string rest = key.substr(6);
    const std::size_t dot = rest.rfind('.');
    if (dot != std::string::npos) return find(rest.substr(0, dot));
  }
  return nullptr;
}

}  // namespace

std::map<std::string, Tensor> gather_full_tensors(dist::Communicator& group, const ParameterStore& params,
                                                  const std::map<std::string, Tensor>& local) {
  std::map<std::string, Tensor> full;
  for (const auto& [key, tensor] : local) {
    const Parameter* p = owner_of(params, key);
    if (p == nullptr || !p->shard.split()) {
      full.emplace(key, tensor);
      continue;
    }
    PROPLAB_CHECK(p->shard.parts == group.size(), key, " is split into ", p->shard.parts, " pieces over ", group.size(),
                  " ranks");
    // (on the host: checkpoints hold host tensors, and this runs only when one is written)
    const Tensor piece_here = tensor.device() == Device::cpu ? tensor : tensor.to(Device::cpu);
    Tensor gathered = Tensor::empty({group.size() * tensor.numel()});
    group.all_gather(piece_here.f32(), gathered.f32(), tensor.numel());
    Tensor whole = Tensor::empty(p->shard.full_shape);
    ParamShard piece = p->shard;
    for (int k = 0; k < group.size(); ++k) {
      piece.part = k;
      copy_shard_into_full(piece, gathered.slice(0, k * tensor.numel(), tensor.numel()).reshape(tensor.shape()), whole);
    }
    full.emplace(key, whole);
  }
  return full;
}

std::map<std::string, Tensor> full_tensor_targets(const ParameterStore& params,
                                                  const std::map<std::string, Tensor>& local) {
  std::map<std::string, Tensor> targets;
  for (const auto& [key, tensor] : local) {
    const Parameter* p = owner_of(params, key);
    targets.emplace(key, p != nullptr && p->shard.split() ? Tensor::empty(p->shard.full_shape) : tensor);
  }
  return targets;
}

void keep_local_pieces(const ParameterStore& params, const std::map<std::string, Tensor>& full,
                       std::map<std::string, Tensor>& local) {
  for (auto& [key, tensor] : local) {
    const Parameter* p = owner_of(params, key);
    if (p != nullptr && p->shard.split()) copy_shard_from_full(p->shard, full.at(key), tensor);
  }
}

}  // namespace proplab
