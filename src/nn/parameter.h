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
#include "scaling/rule.h"

namespace proplab {

struct Parameter {
  std::string name;  // e.g. "blocks.3.attn.qkv.weight"
  ParamInfo info;
  Tensor value;
  Tensor grad;
  double lr_multiplier = 1.0;
  bool weight_decay = true;  // matrices and embeddings decay; biases, gains and scalars do not
};

class ParameterStore {
 public:
  // Adds a parameter of the given shape (values uninitialised until init()).
  Parameter& add(const std::string& name, const Shape& shape, ParamRole role, std::int64_t fan_in, std::int64_t fan_out,
                 int block = -1);
  // Initialises every parameter from the rule (InitSpec) and the seed; sets lr multipliers.
  void init(const ScalingRule& rule, std::uint64_t seed);
  void zero_grads();
  Parameter* find(const std::string& name);
  std::vector<std::unique_ptr<Parameter>>& all() { return params_; }
  const std::vector<std::unique_ptr<Parameter>>& all() const { return params_; }
  std::int64_t count_elements() const;

 private:
  std::vector<std::unique_ptr<Parameter>> params_;
};

// Fills `value` from an InitSpec: N(0, std²) from CounterRng(seed, stream_id(name)) at each flat index (with
// per-row-block stds when the spec has them: the same draw at each index, scaled by its block's std), or a
// constant.
void init_tensor(Tensor& value, const InitSpec& spec, std::uint64_t seed, const std::string& name);

}  // namespace proplab
