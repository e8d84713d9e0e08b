#include "train/optimizer.h"

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

Optimizer::Optimizer(const TrainConfig& config, ParameterStore& params) : config_(config), params_(params) {
  for (auto& p : params_.all()) {
    first_.push_back(Tensor::zeros(p->value.shape()));
    second_.push_back(config.optimizer == OptimizerKind::adamw ? Tensor::zeros(p->value.shape()) : Tensor());
  }
}

void Optimizer::step(double lr, std::vector<ops::UpdateNorms>* norms) {
  ++steps_taken_;
  auto& all = params_.all();
  if (norms) PROPLAB_CHECK(norms->size() == all.size(), "one UpdateNorms per parameter");
  for (std::size_t i = 0; i < all.size(); ++i) {
    Parameter& p = *all[i];
    const double param_lr = lr * p.lr_multiplier;
    const float decay = p.weight_decay ? static_cast<float>(config_.weight_decay) : 0.0f;
    if (config_.optimizer == OptimizerKind::adamw) {
      ops::AdamWHyper h;
      h.lr = static_cast<float>(param_lr);
      h.beta1 = static_cast<float>(config_.beta1);
      h.beta2 = static_cast<float>(config_.beta2);
      h.eps = static_cast<float>(config_.eps);
      h.weight_decay = decay;
      h.step = steps_taken_;
      ops::adamw_update(p.value, p.grad, first_[i], second_[i], h, norms ? &(*norms)[i] : nullptr);
    } else {
      ops::SgdHyper h;
      h.lr = static_cast<float>(param_lr);
      h.momentum = static_cast<float>(config_.momentum);
      h.weight_decay = decay;
      h.nesterov = config_.nesterov;
      ops::sgd_update(p.value, p.grad, first_[i], h, norms ? &(*norms)[i] : nullptr);
    }
  }
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
