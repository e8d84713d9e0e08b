#include "models/config.h"

namespace proplab {

const char* norm_placement_name(NormPlacement placement) {
  switch (placement) {
    case NormPlacement::pre:
      return "pre";
    case NormPlacement::post:
      return "post";
    case NormPlacement::none:
      return "none";
  }
  return "?";
}

const char* norm_kind_name(NormKind kind) { return kind == NormKind::layernorm ? "layernorm" : "rmsnorm"; }

const char* activation_name(ops::Activation activation) {
  switch (activation) {
    case ops::Activation::identity:
      return "linear";
    case ops::Activation::relu:
      return "relu";
    case ops::Activation::tanh:
      return "tanh";
    case ops::Activation::gelu_tanh:
      return "gelu";
    case ops::Activation::gelu_erf:
      return "gelu_erf";
  }
  return "?";
}

}  // namespace proplab
