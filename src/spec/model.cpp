#include "spec/model.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace proplab {

const char* norm_placement_name(NormPlacement placement) {
  switch (placement) {
    case NormPlacement::pre:
      return "pre";
    case NormPlacement::post:
      return "post";
    case NormPlacement::both:
      return "both";
    case NormPlacement::none:
      return "none";
  }
  return "?";
}

const char* norm_kind_name(NormKind kind) { return kind == NormKind::layernorm ? "layernorm" : "rmsnorm"; }

const char* activation_name(Activation activation) {
  switch (activation) {
    case Activation::identity:
      return "linear";
    case Activation::relu:
      return "relu";
    case Activation::tanh:
      return "tanh";
    case Activation::gelu_tanh:
      return "gelu";
    case Activation::gelu_erf:
      return "gelu_erf";
  }
  return "?";
}

const char* model_kind_name(ModelKind kind) {
  switch (kind) {
    case ModelKind::transformer:
      return "transformer";
    case ModelKind::mlp:
      return "mlp";
    case ModelKind::resnet:
      return "resnet";
  }
  return "?";
}

namespace {

template <typename Config>
Config& config_of(std::variant<TransformerConfig, MlpConfig, ResnetConfig>& config, ModelKind wanted) {
  if (Config* held = std::get_if<Config>(&config)) return *held;
  throw std::logic_error(std::string("internal invariant failed: the model config of a ") +
                         model_kind_name(static_cast<ModelKind>(config.index())) + " was asked for as a " +
                         model_kind_name(wanted) + " config");
}

}  // namespace

void ModelConfig::set_kind(ModelKind kind) {
  if (kind == this->kind()) return;
  switch (kind) {
    case ModelKind::transformer:
      config_ = TransformerConfig{};
      return;
    case ModelKind::mlp:
      config_ = MlpConfig{};
      return;
    case ModelKind::resnet:
      config_ = ResnetConfig{};
      return;
  }
}

TransformerConfig& ModelConfig::transformer() { return config_of<TransformerConfig>(config_, ModelKind::transformer); }
const TransformerConfig& ModelConfig::transformer() const { return const_cast<ModelConfig*>(this)->transformer(); }
MlpConfig& ModelConfig::mlp() { return config_of<MlpConfig>(config_, ModelKind::mlp); }
const MlpConfig& ModelConfig::mlp() const { return const_cast<ModelConfig*>(this)->mlp(); }
ResnetConfig& ModelConfig::resnet() { return config_of<ResnetConfig>(config_, ModelKind::resnet); }
const ResnetConfig& ModelConfig::resnet() const { return const_cast<ModelConfig*>(this)->resnet(); }

int residual_adds(const ModelConfig& model) {
  switch (model.kind()) {
    case ModelKind::transformer:
      return 2 * model.transformer().layers;
    case ModelKind::resnet: {
      const int per_block = model.resnet().block == ResnetBlock::basic ? 6 : 9;
      return 3 * std::max((model.resnet().depth - 2) / per_block, 0);
    }
    case ModelKind::mlp:
      return model.mlp().residual ? std::max(model.mlp().layers - 1, 0) : 0;
  }
  return 0;
}

}  // namespace proplab
