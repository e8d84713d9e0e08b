#include "train/optimizer.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "ops/ops.h"

namespace proplab {

double scheduled_lr(const TrainConfig& config, std::int64_t step) {
  if (config.warmup > 0 && step < config.warmup)
    return config.lr * static_cast<double>(step + 1) / static_cast<double>(config.warmup);
  if (config.schedule == ScheduleKind::constant) return config.lr;
  const double span = static_cast<double>(std::max<std::int64_t>(config.steps - 1 - config.warmup, 1));
  const double progress = std::min(1.0, static_cast<double>(step - config.warmup) / span);
  const double min_lr = config.lr * config.min_lr_ratio;
  return min_lr + 0.5 * (config.lr - min_lr) * (1.0 + std::cos(std::numbers::pi * progress));
}

namespace {

// The flat view of `t`'s elements [offset, offset + length), or `t` itself when that is all of it.
Tensor piece_of(const Tensor& t, const Optimizer::Piece& piece) {
  if (piece.offset == 0 && piece.length == t.numel()) return t;
  return t.reshape({t.numel()}).slice(0, piece.offset, piece.length);
}

}  // namespace

Optimizer::Optimizer(const TrainConfig& config, ParameterStore& params, ParameterShard shard)
    : config_(config), params_(params) {
  const std::int64_t total = params_.count_elements();
  const std::int64_t end = shard.end < 0 ? total : std::min(shard.end, total);
  PROPLAB_CHECK(shard.begin >= 0 && shard.begin <= end, "optimizer shard [", shard.begin, ", ", shard.end, ") outside ",
                total, " parameter elements");
  std::int64_t at = 0;
  for (auto& p : params_.all()) {
    const std::int64_t n = p->value.numel();
    Piece piece;
    piece.offset = std::clamp(shard.begin - at, std::int64_t{0}, n);
    piece.length = std::clamp(end - at, std::int64_t{0}, n) - piece.offset;
    pieces_.push_back(piece);
    at += n;
    if (piece.length == 0) {
      first_.emplace_back();
      second_.emplace_back();
      continue;
    }
    const Shape shape = piece.length == n ? p->value.shape() : Shape{piece.length};
    // On the parameter's device (the model is placed before the optimizer is built).
    const Device device = p->value.device();
    first_.push_back(Tensor::zeros(shape, DType::f32, device));
    second_.push_back(config.optimizer == OptimizerKind::adamw ? Tensor::zeros(shape, DType::f32, device) : Tensor());
  }
}

void Optimizer::step(double lr, std::vector<ops::UpdateNorms>* norms) {
  ++steps_taken_;
  auto& all = params_.all();
  if (norms) PROPLAB_CHECK(norms->size() == all.size(), "one UpdateNorms per parameter");
  // Every tensor's update in one call (one parallel region on the CPU); the pieces are views that must live
  // until it returns.
  std::vector<Tensor> values, grads;
  values.reserve(all.size());
  grads.reserve(all.size());
  std::vector<ops::AdamWStep> adamw;
  std::vector<ops::SgdStep> sgd;
  for (std::size_t i = 0; i < all.size(); ++i) {
    Parameter& p = *all[i];
    if (pieces_[i].length == 0) continue;
    values.push_back(piece_of(p.value, pieces_[i]));
    grads.push_back(piece_of(p.grad, pieces_[i]));
    const double param_lr = lr * p.lr_multiplier;
    const float decay = p.weight_decay ? static_cast<float>(config_.weight_decay) : 0.0f;
    ops::UpdateNorms* measured = norms ? &(*norms)[i] : nullptr;
    if (config_.optimizer == OptimizerKind::adamw) {
      ops::AdamWHyper h;
      h.lr = static_cast<float>(param_lr);
      h.beta1 = static_cast<float>(config_.beta1);
      h.beta2 = static_cast<float>(config_.beta2);
      h.eps = static_cast<float>(config_.eps);
      h.weight_decay = decay;
      h.step = steps_taken_;
      adamw.push_back({&values.back(), &grads.back(), &first_[i], &second_[i], h, measured});
    } else {
      ops::SgdHyper h;
      h.lr = static_cast<float>(param_lr);
      h.momentum = static_cast<float>(config_.momentum);
      h.weight_decay = decay;
      h.nesterov = config_.nesterov;
      sgd.push_back({&values.back(), &grads.back(), &first_[i], h, measured});
    }
  }
  if (!adamw.empty()) ops::adamw_update_each(adamw);
  if (!sgd.empty()) ops::sgd_update_each(sgd);
}

std::vector<std::pair<std::string, Tensor*>> Optimizer::state() {
  std::vector<std::pair<std::string, Tensor*>> out;
  auto& all = params_.all();
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (config_.optimizer == OptimizerKind::adamw) {
      out.emplace_back(all[i]->name + ".adam_m", &first_[i]);
      out.emplace_back(all[i]->name + ".adam_v", &second_[i]);
    } else {
      out.emplace_back(all[i]->name + ".momentum", &first_[i]);
    }
  }
  return out;
}

}  // namespace proplab
