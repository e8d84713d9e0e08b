// nn/parameter: named trainable tensors and their gradients.
//
// Invariants:
// - A parameter's initial values are a pure function of (seed, parameter name, flat element index) through the
//   counter-based RNG, so they are identical on any device, thread count, rank count or sharding.
// - Gradients ACCUMULATE into `grad` (zero_grads() before a step); the optimizer reads `grad`.
// - Order of parameters is creation order; everything that iterates them (init, optimizer, norms, checkpoints)
//   uses that order, which keeps reductions deterministic.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "spec/param.h"

namespace proplab {

// How a parameter is split over the ranks of a tensor-parallel group. Dimension `dim` of the full tensor is cut
// into `groups` equal consecutive blocks (the packed qkv weight: q, k and v), each block into `parts` equal
// pieces; this rank holds piece `part` of every block, blocks in order. parts = 1: the whole tensor is here.
struct ParamShard {
  Shape full_shape;  // empty when not split
  int dim = 0;
  int groups = 1;
  int parts = 1;
  int part = 0;

  bool split() const { return parts > 1; }
  std::int64_t full_numel() const { return shape_numel(full_shape); }
  // The shape this rank holds.
  Shape local_shape() const;
  // The flat index in the full tensor of this rank's flat element `local`.
  std::int64_t global_index(std::int64_t local) const;
};

// This rank's piece of a full tensor (`local` has shard.local_shape()), and back: `full` receives the piece.
void copy_shard_from_full(const ParamShard& shard, const Tensor& full, Tensor& local);
void copy_shard_into_full(const ParamShard& shard, const Tensor& local, Tensor& full);

struct Parameter {
  std::string name;  // e.g. "blocks.3.attn.qkv.weight"
  ParamInfo info;
  ParamShard shard;  // tensor parallelism: `value` and `grad` hold this rank's piece
  Tensor value;
  Tensor grad;
  double lr_multiplier = 1.0;
  bool weight_decay = true;  // matrices and embeddings decay; biases, gains and scalars do not
};

// Elements of the parameter's full tensor (its piece's own count when not split).
inline std::int64_t full_numel(const Parameter& p) { return p.shard.split() ? p.shard.full_numel() : p.value.numel(); }

class ParameterStore {
 public:
  // Adds a parameter of the given shape (values uninitialised until init()).
  Parameter& add(const std::string& name, const Shape& shape, ParamRole role, std::int64_t fan_in, std::int64_t fan_out,
                 int block = -1);
  // Initialises every parameter from the rule (InitSpec) and the seed, split ones by their full-tensor indices;
  // sets lr multipliers.
  void init(const ParamInitializer& rule, std::uint64_t seed);
  void zero_grads();
  // Moves every value and gradient to `device` (parameters are initialised on the host, so their values do not
  // depend on the device they train on).
  void to_device(Device device);
  // Where the parameters live (the CPU until to_device).
  Device device() const { return device_; }
  Parameter* find(const std::string& name);
  std::vector<std::unique_ptr<Parameter>>& all() { return params_; }
  const std::vector<std::unique_ptr<Parameter>>& all() const { return params_; }
  std::int64_t count_elements() const;
  // Elements of the full tensors (split parameters counted whole).
  std::int64_t count_full_elements() const;

 private:
  std::vector<std::unique_ptr<Parameter>> params_;
  Device device_ = Device::cpu;
};

// Fills `value` from an InitSpec: N(0, std²) from CounterRng(seed, stream_id(name)) at each flat index (with
// per-row-block stds when the spec has them: the same draw at each index, scaled by its block's std), or a
// constant. With a split `shard`, `value` is this rank's piece and every element takes the draw (and row block)
// of its index in the full tensor, so the pieces together are exactly the unsplit tensor.
void init_tensor(Tensor& value, const InitSpec& spec, std::uint64_t seed, const std::string& name,
                 const ParamShard* shard = nullptr);

}  // namespace proplab
