// spec/param: the vocabulary between the layers that hold parameters (nn, models) and the scaling rules that decide
// their initial distributions and residual weights: what a parameter is (ParamRole, ParamInfo), how it is drawn
// (InitSpec) and how a residual branch is weighted (ResidualSpec).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace proplab {

enum class ParamRole {
  token_embedding,
  position_embedding,
  attn_qkv,
  attn_out,  // attention output projection (a residual branch's last matrix)
  ffn_in,
  ffn_out,     // FFN output projection (a residual branch's last matrix)
  readout,     // untied LM head or MLP readout
  mlp_input,   // MLP first layer (input_dim -> width)
  mlp_hidden,  // MLP hidden layers
  bias,        // every bias vector
  norm_gain,
  norm_bias,
  residual_scale,  // learnable lambda / beta scalars
  // ResNets (fan_in = input channels per group · kernel area):
  conv_stem,        // the first conv (image channels -> stage 0)
  conv_branch,      // a residual branch's conv other than its last
  conv_branch_out,  // a residual branch's last conv
  conv_shortcut,    // a transition block's projection shortcut
};
// "token_embedding", "attn_qkv", ...
const char* param_role_name(ParamRole role);

enum class Branch { attention, ffn, mlp };

struct ParamInfo {
  ParamRole role;
  std::int64_t fan_in = 0;
  std::int64_t fan_out = 0;
  int block = -1;  // -1 outside blocks
  std::string name;
};

struct InitSpec {
  enum class Kind { normal, constant } kind = Kind::normal;
  double std = 0.0;    // normal: N(0, std^2)
  double value = 0.0;  // constant
  // normal, optional: when not empty, the tensor's dim 0 (rows) is split into row_block_stds.size() equal
  // blocks (dim 0 must divide evenly) and block b is drawn N(0, row_block_stds[b]^2); `std` is then unused.
  // Packed QKV [3D, D] uses three blocks: Q, K, V.
  std::vector<double> row_block_stds;
  static InitSpec normal_std(double s) { return {Kind::normal, s, 0.0, {}}; }
  static InitSpec normal_row_blocks(std::vector<double> stds) { return {Kind::normal, 0.0, 0.0, std::move(stds)}; }
  static InitSpec constant(double v) { return {Kind::constant, 0.0, v, {}}; }
  // The std of row block `block` (the single std when there are no row blocks).
  double block_std(std::size_t block) const { return row_block_stds.empty() ? std : row_block_stds.at(block); }
};

struct ResidualSpec {
  double lambda = 1.0;  // weight of the skip path
  double beta = 1.0;    // weight of the branch
  bool learnable_lambda = false;
  bool learnable_beta = false;
};

// Whoever decides every parameter's initial distribution and learning-rate multiplier: a scaling rule
// (scaling/rule.h). A parameter store (nn/parameter.h) asks it once per parameter.
class ParamInitializer {
 public:
  virtual ~ParamInitializer() = default;
  virtual InitSpec init(const ParamInfo& param) const = 0;
  // Multiplier on the learning rate of this parameter (1 unless a rule says otherwise).
  virtual double lr_multiplier(const ParamInfo& param) const;
};

}  // namespace proplab
