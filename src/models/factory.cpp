#include "models/mlp.h"
#include "models/resnet.h"
#include "models/transformer.h"

namespace proplab {

ModelShape model_shape(const ModelConfig& config) {
  ModelShape shape;
  shape.type = config.type;
  shape.transformer = config.transformer;
  shape.mlp = config.mlp;
  shape.resnet = config.resnet;
  return shape;
}

std::unique_ptr<Model> make_model(const ModelConfig& config, const ScalingConfig& scaling, std::uint64_t seed,
                                  dist::Communicator* tensor_parallel) {
  check_tensor_parallel(config, tensor_parallel != nullptr ? tensor_parallel->size() : 1);
  if (config.type == "transformer")
    return std::make_unique<Transformer>(config.transformer, scaling, seed, TensorParallel(tensor_parallel));
  if (config.type == "mlp") return std::make_unique<Mlp>(config.mlp, scaling, seed);
  if (config.type == "resnet") return std::make_unique<Resnet>(config.resnet, scaling, seed);
  throw UserError("model.type: unknown model \"" + config.type + "\"; allowed: transformer, mlp, resnet");
}

}  // namespace proplab
