#include "models/mlp.h"
#include "models/profile.h"
#include "models/resnet.h"
#include "models/sequence_parallel.h"
#include "models/transformer.h"

namespace proplab {

std::unique_ptr<Model> make_model(const ModelConfig& config, const ScalingConfig& scaling, std::uint64_t seed,
                                  dist::Communicator* tensor_parallel, dist::Communicator* sequence_parallel) {
  return make_model(config, *make_model_rule(config, scaling, seed), seed, tensor_parallel, sequence_parallel);
}

std::unique_ptr<Model> make_model(const ModelConfig& config, const ScalingRule& rule, std::uint64_t seed,
                                  dist::Communicator* tensor_parallel, dist::Communicator* sequence_parallel) {
  check_tensor_parallel(config, tensor_parallel != nullptr ? tensor_parallel->size() : 1);
  check_sequence_parallel(config, sequence_parallel != nullptr ? sequence_parallel->size() : 1);
  switch (config.kind()) {
    case ModelKind::transformer:
      return std::make_unique<Transformer>(config.transformer(), rule, seed, TensorParallel(tensor_parallel),
                                           sequence_parallel);
    case ModelKind::mlp:
      return std::make_unique<Mlp>(config.mlp(), rule, seed);
    case ModelKind::resnet:
      return std::make_unique<Resnet>(config.resnet(), rule, seed);
  }
  PROPLAB_CHECK(false, "make_model builds every model kind, not ", model_kind_name(config.kind()));
  return nullptr;
}

}  // namespace proplab
