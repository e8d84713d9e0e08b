// train/optimizer: AdamW and SGD-with-momentum over a ParameterStore, and the learning-rate schedules.
//
// The optimizer keeps one state tensor set per parameter in parameter order; its state (and step count) is what
// a checkpoint stores to resume bit for bit. Each parameter's lr is the scheduled lr times its rule-given
// multiplier; weight decay applies to matrices and embeddings only (Parameter::weight_decay).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "nn/parameter.h"
#include "ops/ops.h"
#include "train/config.h"

namespace proplab {

// Learning rate at (0-based) step: linear warmup over `warmup` steps, then constant or cosine decay to
// lr * min_lr_ratio at the last step.
double scheduled_lr(const TrainConfig& config, std::int64_t step);

// [begin, end) over the parameters' elements concatenated in creation order; end < 0: to the end.
struct ParameterShard {
  std::int64_t begin = 0;
  std::int64_t end = -1;
};

class Optimizer {
 public:
  Optimizer(const TrainConfig& config, ParameterStore& params, ParameterShard shard = {});
  // One update with the given scheduled learning rate (uses the accumulated gradients). With `norms` (one entry
  // per parameter, added to), also measures each tensor's Σ w² before and Σ Δw² inside the update loop.
  void step(double lr, std::vector<ops::UpdateNorms>* norms = nullptr);
  std::int64_t steps_taken() const { return steps_taken_; }
  void set_steps_taken(std::int64_t steps) { steps_taken_ = steps; }
  // Named state tensors for checkpoints: "<param>.adam_m", "<param>.adam_v" or "<param>.momentum", one set per
  // parameter in order. With a shard: the tensor holds the shard's part of the parameter as a flat [n] tensor
  // (undefined when the shard misses the parameter); a parameter wholly inside keeps its shape.
  std::vector<std::pair<std::string, Tensor*>> state();
  // The part of parameter i the shard covers: [offset, offset + length) of its flat elements.
  struct Piece {
    std::int64_t offset = 0, length = 0;
  };
  const std::vector<Piece>& pieces() const { return pieces_; }

 private:
  TrainConfig config_;
  ParameterStore& params_;
  std::vector<Tensor> first_;   // AdamW m or SGD momentum buffer
  std::vector<Tensor> second_;  // AdamW v
  std::vector<Piece> pieces_;   // per parameter
  std::int64_t steps_taken_ = 0;
};

}  // namespace proplab
