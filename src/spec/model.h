// spec/model: the model description every layer above shares — the three model configs a study resolves to
// (defaults here are the documented defaults) and the enums that name their parts. ops, nn, scaling, theory,
// models and study all use these one definitions; spec depends on nothing but the standard library.
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace proplab {

// The pointwise nonlinearities. gelu_tanh is GPT-2's tanh approximation, gelu_erf the exact GELU.
enum class Activation { identity, relu, tanh, gelu_tanh, gelu_erf };
// pre: a norm on each branch's input (and a final norm); post: a norm after each residual sum; both: the two
// together (a norm on each branch's input and after each sum, no final norm: Keel); none: no norms.
enum class NormPlacement { pre, post, both, none };
enum class NormKind { layernorm, rmsnorm };

// The names a study file uses: "linear", "relu", "tanh", "gelu", "gelu_erf"; "pre", "post", "both", "none";
// "layernorm", "rmsnorm".
const char* activation_name(Activation activation);
const char* norm_placement_name(NormPlacement placement);
const char* norm_kind_name(NormKind kind);
// Whether a placement puts a norm on each branch's input (pre, both) or after each residual sum (post, both).
inline bool norms_branch_input(NormPlacement placement) {
  return placement == NormPlacement::pre || placement == NormPlacement::both;
}
inline bool norms_residual_sum(NormPlacement placement) {
  return placement == NormPlacement::post || placement == NormPlacement::both;
}

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
  Activation activation = Activation::gelu_tanh;
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
  Activation activation = Activation::tanh;
  double sigma_w2 = 1.0;
  double sigma_b2 = 0.0;
  bool residual = false;
  MlpHead head = MlpHead::classification;
};

enum class ResnetBlock { basic, bottleneck };
enum class ResnetNorm { batchnorm, none };

// CIFAR-style ResNet on NCHW images (He et al. 2016): a 3x3 stem conv, three stages of residual blocks with
// 16·width, 32·width, 64·width channels (×4 at a bottleneck block's output), each stage after the first opening
// with a transition block (stride 2, projection shortcut), global average pooling and a linear classifier.
// depth = 6n + 2 (basic: n blocks of two 3x3 convs per stage) or 9n + 2 (bottleneck: 1x1, 3x3, 1x1).
// preact: pre-activation blocks x + f(act(norm(x))) (He et al. 2016b); otherwise post-activation
// act(x + norm(conv(...))).
struct ResnetConfig {
  int depth = 20;
  int width = 1;
  ResnetBlock block = ResnetBlock::basic;
  ResnetNorm norm = ResnetNorm::batchnorm;
  bool preact = false;
  Activation activation = Activation::relu;
  int in_channels = 3;
  int image_size = 32;
  int classes = 10;
  float norm_eps = 1e-5f;
  float bn_momentum = 0.1f;
};

enum class ModelKind { transformer, mlp, resnet };
inline constexpr ModelKind kModelKinds[] = {ModelKind::transformer, ModelKind::mlp, ModelKind::resnet};
// "transformer", "mlp", "resnet" (the study's model.type).
const char* model_kind_name(ModelKind kind);

// The model a study describes: exactly one of the three configs. Code branches on kind() (or visit()), never on a
// name; asking for the config of another kind is a broken invariant (std::logic_error naming both kinds).
class ModelConfig {
 public:
  ModelConfig() = default;  // a transformer with the default config
  ModelConfig(const TransformerConfig& config) : config_(config) {}
  ModelConfig(const MlpConfig& config) : config_(config) {}
  ModelConfig(const ResnetConfig& config) : config_(config) {}

  ModelKind kind() const { return static_cast<ModelKind>(config_.index()); }
  // Makes this a model of `kind` with that kind's default config; a model of that kind already is left alone.
  void set_kind(ModelKind kind);

  const TransformerConfig& transformer() const;
  TransformerConfig& transformer();
  const MlpConfig& mlp() const;
  MlpConfig& mlp();
  const ResnetConfig& resnet() const;
  ResnetConfig& resnet();

  // Calls `visitor` with the config (TransformerConfig, MlpConfig or ResnetConfig).
  template <typename Visitor>
  decltype(auto) visit(Visitor&& visitor) const {
    return std::visit(std::forward<Visitor>(visitor), config_);
  }

 private:
  std::variant<TransformerConfig, MlpConfig, ResnetConfig> config_;  // in ModelKind's order
};

// The number of residual combines in the model (transformer: 2 per layer; ResNet: one per block; MLP with
// residual = true: one per hidden layer after the first).
int residual_adds(const ModelConfig& model);

}  // namespace proplab
