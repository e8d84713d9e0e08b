// models: the trainable models, each with an explicit forward and backward (no autograd tape).
//
// A Model owns its parameters (ParameterStore) and the activation buffers it saves between forward and backward,
// allocated once per micro-batch shape and reused every step. forward_backward() runs forward, the loss and
// backward, ACCUMULATING parameter gradients scaled by grad_scale (so micro-batches add up); evaluate() runs
// forward and the loss only.
#pragma once

#include <cstdint>
#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dist/communicator.h"
#include "spec/model.h"
#include "nn/parameter.h"
#include "probe/probe.h"
#include "scaling/config.h"
#include "scaling/rule.h"

namespace proplab {

// One micro-batch. Language models: inputs and targets i32 [B, T]. MLP: inputs f32 [B, input_dim]; targets
// f32 [B, outputs] (regression) or i32 [B] (classification).
struct Batch {
  Tensor inputs;
  Tensor targets;
};

// Told during backward that parameter gradients are final for this pass: every parameter from index `first` (in
// creation order, ParameterStore::all()) onward receives nothing more from this backward pass. Data parallelism
// uses it to start reducing those gradients while the rest of backward runs. A model that never calls it is
// still correct: everything is reduced after backward.
class GradientListener {
 public:
  virtual ~GradientListener() = default;
  virtual void gradients_final_from(std::size_t first) = 0;
};

struct StepContext {
  std::uint64_t seed = 0;
  std::uint64_t micro_step = 0;           // global micro-batch counter: keys the dropout masks
  bool training = true;                   // dropout on
  ProbeSink* sink = nullptr;              // recorded steps: every probed tensor (forward) and its gradient (backward)
  GradientListener* gradients = nullptr;  // told as parameter gradients become final (null: nobody listens)
};

class Model {
 public:
  virtual ~Model() = default;
  virtual ParameterStore& params() = 0;
  // The model's probes in forward order (ProbeInfo::depth = index).
  virtual const std::vector<ProbeInfo>& probes() const = 0;
  // The stage of every block (index = ProbeInfo::block) when the blocks form stages; empty otherwise (default).
  virtual std::vector<BlockInfo> block_layout() const { return {}; }
  // Forward + mean loss + backward; parameter gradients += grad_scale * d(mean loss)/d(param).
  virtual double forward_backward(const Batch& batch, float grad_scale, const StepContext& context) = 0;
  // Forward + mean loss, no dropout, no gradients, no probes.
  virtual double evaluate(const Batch& batch) = 0;
  // Multiply-add FLOPs of one training step (forward + backward) on `samples` samples, counting every matrix
  // product (2 FLOPs per multiply-add); used for achieved GFLOP/s.
  virtual double train_flops(std::int64_t samples) const = 0;
  // Tokens (LM) or samples (MLP) per sample: tokens/s = samples/s * this.
  virtual std::int64_t tokens_per_sample() const = 0;
  // Copies learnable residual scalars etc. from parameters after a checkpoint load (nothing to do by default).
  virtual void after_parameter_load() {}
  // Named state that is not a parameter but must survive a checkpoint (BatchNorm running statistics): tensors the
  // model updates itself, never the optimizer (none by default).
  virtual std::vector<std::pair<std::string, Tensor*>> buffers() { return {}; }
  // Moves the parameters (initialised on the host) to `device`; activations are allocated there from then on.
  // A model that cannot train on the device says so (UserError naming device.type); the CPU always works.
  virtual void to_device(Device device) {
    if (device != Device::cpu)
      throw UserError(std::string("device.type = \"") + device_name(device) +
                      "\": this model does not train on it in this version; allowed: \"cpu\"");
  }
};

// Builds the model described by `config` with parameters initialised by the scaling rule from `seed`. With a
// tensor-parallel group of more than one rank (transformer only: check_tensor_parallel), this rank's piece; with a
// sequence-parallel ring of more than one rank (transformer only: check_sequence_parallel), a model that runs on this
// rank's part of every sequence.
std::unique_ptr<Model> make_model(const ModelConfig& config, const ScalingConfig& scaling, std::uint64_t seed,
                                  dist::Communicator* tensor_parallel = nullptr,
                                  dist::Communicator* sequence_parallel = nullptr);
// The same with the rule already built for `config` (make_model_rule, models/profile.h): a run builds its rule
// once and hands it to the model and to the theory.
std::unique_ptr<Model> make_model(const ModelConfig& config, const ScalingRule& rule, std::uint64_t seed,
                                  dist::Communicator* tensor_parallel = nullptr,
                                  dist::Communicator* sequence_parallel = nullptr);

}  // namespace proplab
