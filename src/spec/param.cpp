#include "spec/param.h"

namespace proplab {

const char* param_role_name(ParamRole role) {
  switch (role) {
    case ParamRole::token_embedding:
      return "token_embedding";
    case ParamRole::position_embedding:
      return "position_embedding";
    case ParamRole::attn_qkv:
      return "attn_qkv";
    case ParamRole::attn_out:
      return "attn_out";
    case ParamRole::ffn_in:
      return "ffn_in";
    case ParamRole::ffn_out:
      return "ffn_out";
    case ParamRole::readout:
      return "readout";
    case ParamRole::mlp_input:
      return "mlp_input";
    case ParamRole::mlp_hidden:
      return "mlp_hidden";
    case ParamRole::bias:
      return "bias";
    case ParamRole::norm_gain:
      return "norm_gain";
    case ParamRole::norm_bias:
      return "norm_bias";
    case ParamRole::residual_scale:
      return "residual_scale";
    case ParamRole::conv_stem:
      return "conv_stem";
    case ParamRole::conv_branch:
      return "conv_branch";
    case ParamRole::conv_branch_out:
      return "conv_branch_out";
    case ParamRole::conv_shortcut:
      return "conv_shortcut";
  }
  return "?";
}

double ParamInitializer::lr_multiplier(const ParamInfo&) const { return 1.0; }

}  // namespace proplab
