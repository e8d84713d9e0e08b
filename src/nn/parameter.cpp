#include "nn/parameter.h"

#include <algorithm>

#include "core/device.h"
#include "core/rng.h"
#include "ops/ops.h"

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

namespace {

// A shard seen as [outer, extent of the split dimension, inner] (row-major).
struct ShardGeometry {
  std::int64_t outer = 1, extent = 1, inner = 1;
};

ShardGeometry geometry_of(const ParamShard& shard) {
  ShardGeometry g;
  const Shape& full = shard.full_shape;
  PROPLAB_CHECK(shard.dim >= 0 && shard.dim < static_cast<int>(full.size()), "shard dimension ", shard.dim, " outside ",
                shape_string(full));
  for (int i = 0; i < shard.dim; ++i) g.outer *= full[static_cast<std::size_t>(i)];
  g.extent = full[static_cast<std::size_t>(shard.dim)];
  for (std::size_t i = static_cast<std::size_t>(shard.dim) + 1; i < full.size(); ++i) g.inner *= full[i];
  PROPLAB_CHECK(g.extent % (static_cast<std::int64_t>(shard.groups) * shard.parts) == 0, "dimension ", shard.dim,
                " of ", shape_string(full), " does not split into ", shard.groups, " blocks of ", shard.parts,
                " pieces");
  return g;
}

}  // namespace

Shape ParamShard::local_shape() const {
  if (!split()) return full_shape;
  Shape local = full_shape;
  local[static_cast<std::size_t>(dim)] /= parts;
  return local;
}

std::int64_t ParamShard::global_index(std::int64_t local) const {
  if (!split()) return local;
  const ShardGeometry g = geometry_of(*this);
  const std::int64_t local_extent = g.extent / parts;
  const std::int64_t block = g.extent / groups, piece = block / parts;
  const std::int64_t inner = local % g.inner;
  const std::int64_t along = (local / g.inner) % local_extent;
  const std::int64_t outer = local / (g.inner * local_extent);
  const std::int64_t global_along = (along / piece) * block + part * piece + along % piece;
  return (outer * g.extent + global_along) * g.inner + inner;
}

namespace {

// Copies between a full tensor and this rank's piece, one contiguous run of `inner · piece` elements at a time.
template <bool kIntoFull>
void copy_shard(const ParamShard& shard, float* full, float* local) {
  const ShardGeometry g = geometry_of(shard);
  const std::int64_t block = g.extent / shard.groups, piece = block / shard.parts;
  const std::int64_t run = piece * g.inner;
  std::int64_t l = 0;
  for (std::int64_t o = 0; o < g.outer; ++o)
    for (int b = 0; b < shard.groups; ++b) {
      float* f = full + (o * g.extent + b * block + shard.part * piece) * g.inner;
      if constexpr (kIntoFull)
        std::copy(local + l, local + l + run, f);
      else
        std::copy(f, f + run, local + l);
      l += run;
    }
}

}  // namespace

void copy_shard_from_full(const ParamShard& shard, const Tensor& full, Tensor& local) {
  PROPLAB_CHECK(full.shape() == shard.full_shape && local.shape() == shard.local_shape() && full.is_contiguous() &&
                    local.is_contiguous(),
                "copy_shard_from_full: shapes ", shape_string(full.shape()), " -> ", shape_string(local.shape()));
  if (full.device() != Device::cpu || local.device() != Device::cpu) {  // through host copies
    const Tensor host_full = full.to(Device::cpu);
    Tensor host_local = Tensor::empty(local.shape());
    copy_shard<false>(shard, const_cast<float*>(host_full.f32()), host_local.f32());
    local.copy_from(host_local);
    return;
  }
  copy_shard<false>(shard, const_cast<float*>(full.f32()), local.f32());
}

void copy_shard_into_full(const ParamShard& shard, const Tensor& local, Tensor& full) {
  PROPLAB_CHECK(full.shape() == shard.full_shape && local.shape() == shard.local_shape() && full.is_contiguous() &&
                    local.is_contiguous(),
                "copy_shard_into_full: shapes ", shape_string(local.shape()), " -> ", shape_string(full.shape()));
  if (full.device() != Device::cpu || local.device() != Device::cpu) {  // through host copies
    const Tensor host_local = local.to(Device::cpu);
    Tensor host_full = full.to(Device::cpu);
    copy_shard<true>(shard, host_full.f32(), const_cast<float*>(host_local.f32()));
    full.copy_from(host_full);
    return;
  }
  copy_shard<true>(shard, full.f32(), const_cast<float*>(local.f32()));
}

void init_tensor(Tensor& value, const InitSpec& spec, std::uint64_t seed, const std::string& name,
                 const ParamShard* shard) {
  float* v = value.f32();
  const std::int64_t n = value.numel();
  if (spec.kind == InitSpec::Kind::constant) {
    for (std::int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(spec.value);
    return;
  }
  const bool split = shard != nullptr && shard->split();
  if (split)
    PROPLAB_CHECK(value.shape() == shard->local_shape(), "init of ", name, ": shard of ",
                  shape_string(shard->full_shape), " is ", shape_string(shard->local_shape()), ", tensor is ",
                  shape_string(value.shape()));
  const Shape& full_shape = split ? shard->full_shape : value.shape();
  const std::int64_t full_numel = shape_numel(full_shape);
  auto index = [&](std::int64_t i) { return split ? shard->global_index(i) : i; };
  const CounterRng rng(seed, stream_id(name));
  if (!spec.row_block_stds.empty()) {
    // Equal row blocks are equal contiguous flat ranges (row-major) of the full tensor; element i keeps its own
    // RNG draw, only its std depends on the block.
    const auto blocks = static_cast<std::int64_t>(spec.row_block_stds.size());
    PROPLAB_CHECK(!full_shape.empty() && full_shape[0] % blocks == 0, "row-block init of ", name, ": dim 0 of ",
                  shape_string(full_shape), " splits into ", blocks, " equal blocks");
    const std::int64_t block_numel = full_numel / blocks;
    if (block_numel == 0) return;
    const std::vector<double>& stds = spec.row_block_stds;
#pragma omp parallel for schedule(static)
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t global = index(i);
      const double std = stds[static_cast<std::size_t>(global / block_numel)];
      v[i] = static_cast<float>(std * rng.normal(static_cast<std::uint64_t>(global)));
    }
    return;
  }
  const double std = spec.std;
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < n; ++i)
    v[i] = static_cast<float>(std * rng.normal(static_cast<std::uint64_t>(index(i))));
}

void ParameterStore::init(const ParamInitializer& rule, std::uint64_t seed) {
  for (auto& p : params_) {
    init_tensor(p->value, rule.init(p->info), seed, p->name, &p->shard);
    p->lr_multiplier = rule.lr_multiplier(p->info);
  }
}

void ParameterStore::to_device(Device device) {
  if (device == device_) return;
  for (auto& p : params_) {
    AllocationLabel label("parameter " + p->name);
    p->value = p->value.to(device);
    p->grad = p->grad.to(device);
  }
  device_ = device;
}

void ParameterStore::zero_grads() {
  if (device_ != Device::cpu) {
    for (auto& p : params_) ops::zero(p->grad);
    return;
  }
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

std::int64_t ParameterStore::count_full_elements() const {
  std::int64_t n = 0;
  for (const auto& p : params_) n += p->shard.split() ? p->shard.full_numel() : p->value.numel();
  return n;
}

}  // namespace proplab
