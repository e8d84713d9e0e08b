#include "nn/parameter.h"

#include "core/rng.h"

namespace proplab {

Parameter& ParameterStore::add(const std::string& name, const Shape& shape, ParamRole role, std::int64_t fan_in,
                               std::int64_t fan_out, int block) {
  PROPLAB_CHECK(find(name) == nullptr, "duplicate parameter name ", name);
  auto p = std::make_unique<Parameter>();
  p->name = name;
  p->info = ParamInfo{role, fan_in, fan_out, block, name};
  p->value = Tensor::zeros(shape);
  p->grad = Tensor::zeros(shape);
  p->weight_decay = role != ParamRole::bias && role != ParamRole::norm_gain && role != ParamRole::norm_bias &&
                    role != ParamRole::residual_scale;
  params_.push_back(std::move(p));
  return *params_.back();
}

void init_tensor(Tensor& value, const InitSpec& spec, std::uint64_t seed, const std::string& name) {
  float* v = value.f32();
  const std::int64_t n = value.numel();
  if (spec.kind == InitSpec::Kind::constant) {
    for (std::int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(spec.value);
    return;
  }
  const CounterRng rng(seed, stream_id(name));
  if (!spec.row_block_stds.empty()) {
    // Equal row blocks are equal contiguous flat ranges (row-major); element i keeps its own RNG draw, only its
    // std depends on the block.
    const auto blocks = static_cast<std::int64_t>(spec.row_block_stds.size());
    PROPLAB_CHECK(value.ndim() >= 1 && value.dim(0) % blocks == 0, "row-block init of ", name, ": dim 0 of ",
                  shape_string(value.shape()), " splits into ", blocks, " equal blocks");
    const std::int64_t block_numel = n / blocks;
    if (block_numel == 0) return;
    const std::vector<double>& stds = spec.row_block_stds;
#pragma omp parallel for schedule(static)
    for (std::int64_t i = 0; i < n; ++i) {
      const double std = stds[static_cast<std::size_t>(i / block_numel)];
      v[i] = static_cast<float>(std * rng.normal(static_cast<std::uint64_t>(i)));
    }
    return;
  }
  const double std = spec.std;
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(std * rng.normal(static_cast<std::uint64_t>(i)));
}

void ParameterStore::init(const ScalingRule& rule, std::uint64_t seed) {
  for (auto& p : params_) {
    init_tensor(p->value, rule.init(p->info), seed, p->name);
    p->lr_multiplier = rule.lr_multiplier(p->info);
  }
}

void ParameterStore::zero_grads() {
  for (auto& p : params_) {
    float* g = p->grad.f32();
    const std::int64_t n = p->grad.numel();
#pragma omp parallel for schedule(static) if (n > 65536)
    for (std::int64_t i = 0; i < n; ++i) g[i] = 0.0f;
  }
}

Parameter* ParameterStore::find(const std::string& name) {
  for (auto& p : params_)
    if (p->name == name) return p.get();
  return nullptr;
}

std::int64_t ParameterStore::count_elements() const {
  std::int64_t n = 0;
  for (const auto& p : params_) n += p->value.numel();
  return n;
}

}  // namespace proplab
