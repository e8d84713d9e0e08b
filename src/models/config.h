// models/config: the typed model description a study resolves to (defaults here are the documented defaults).
#pragma once

#include <string>

#include "ops/ops.h"

namespace proplab {

enum class NormPlacement { pre, post, none };
enum class NormKind { layernorm, rmsnorm };

const char* norm_placement_name(NormPlacement placement);
const char* norm_kind_name(NormKind kind);
const char* activation_name(ops::Activation activation);

// Decoder-only transformer LM; defaults give the GPT-2 shape (learned positions, biases, affine LayerNorm,
// tanh-approximated GELU, tied embeddings).
struct TransformerConfig {
  int layers = 4;
  int width = 256;
  int heads = 4;
  int ffn_mult = 4;
  NormPlacement norm = NormPlacement::pre;
  NormKind norm_kind = NormKind::layernorm;
  bool norm_affine = true;
  bool bias = true;
  ops::Activation activation = ops::Activation::gelu_tanh;
  float dropout = 0.0f;
  int vocab = 256;
  int seq_len = 128;
  bool tie_embeddings = true;
  float norm_eps = 1e-5f;
};

enum class MlpHead { regression, classification };

// Deep MLP for mean-field studies: h_l = φ(W_l h_{l-1} + b_l), optionally h_l = λ h_{l-1} + β φ(W_l h_{l-1} + b_l);
// weights N(0, sigma_w2 / fan_in), biases N(0, sigma_b2). Input layer maps input_dim -> width, readout
// width -> outputs (regression targets or classes).
struct MlpConfig {
  int layers = 8;
  int width = 256;
  int input_dim = 64;
  int outputs = 10;
  ops::Activation activation = ops::Activation::tanh;
  double sigma_w2 = 1.0;
  double sigma_b2 = 0.0;
  bool residual = false;
  MlpHead head = MlpHead::classification;
};

struct ModelConfig {
  std::string type = "transformer";  // transformer | mlp
  TransformerConfig transformer;
  MlpConfig mlp;
};

}  // namespace proplab
