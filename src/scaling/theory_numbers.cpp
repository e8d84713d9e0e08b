#include "scaling/theory_numbers.h"

#include <cmath>

#include "core/error.h"

namespace proplab {

namespace {

// The std of a Gaussian init (row block `block` of a packed tensor), 0 for a zero constant.
double std_of(const InitSpec& spec, const std::string& name, std::size_t block = 0) {
  if (spec.kind == InitSpec::Kind::constant) {
    if (spec.value == 0.0) return 0.0;
    throw UserError("theory: " + name + " is initialised to the constant " + std::to_string(spec.value) +
                    "; predictions need a Gaussian (or zero) initialisation of every matrix and bias");
  }
  return spec.block_std(block);
}

double std_of(const ScalingRule& rule, ParamRole role, std::int64_t fan_in, std::int64_t fan_out, int block,
              const std::string& name, std::size_t row_block = 0) {
  return std_of(rule.init(ParamInfo{role, fan_in, fan_out, block, name}), name, row_block);
}

}  // namespace

theory::TransformerNumbers transformer_numbers(const ScalingRule& rule, const TransformerConfig& config) {
  theory::TransformerNumbers n;
  n.config = config;
  const std::int64_t d = config.width, v = config.vocab, t = config.seq_len;
  const std::int64_t f = static_cast<std::int64_t>(config.ffn_mult) * d;
  n.token_embed_std = std_of(rule, ParamRole::token_embedding, v, d, -1, "embed.token.weight");
  n.position_embed_std = std_of(rule, ParamRole::position_embedding, t, d, -1, "embed.position.weight");
  for (int l = 0; l < config.layers; ++l) {
    theory::TransformerBlockNumbers b;
    const std::string block = "blocks." + std::to_string(l);
    const InitSpec qkv = rule.init(ParamInfo{ParamRole::attn_qkv, d, d, l, block + ".attn.qkv.weight"});
    b.q_std = std_of(qkv, block + ".attn.qkv.weight", 0);
    b.k_std = std_of(qkv, block + ".attn.qkv.weight", 1);
    b.v_std = std_of(qkv, block + ".attn.qkv.weight", 2);
    b.attn_out_std = std_of(rule, ParamRole::attn_out, d, d, l, block + ".attn.out.weight");
    b.ffn_in_std = std_of(rule, ParamRole::ffn_in, d, f, l, block + ".ffn.fc.weight");
    b.ffn_out_std = std_of(rule, ParamRole::ffn_out, f, d, l, block + ".ffn.proj.weight");
    if (config.bias) {
      b.qkv_bias_std = std_of(rule, ParamRole::bias, d, 3 * d, l, block + ".attn.qkv.bias");
      b.attn_out_bias_std = std_of(rule, ParamRole::bias, d, d, l, block + ".attn.out.bias");
      b.ffn_in_bias_std = std_of(rule, ParamRole::bias, d, f, l, block + ".ffn.fc.bias");
      b.ffn_out_bias_std = std_of(rule, ParamRole::bias, f, d, l, block + ".ffn.proj.bias");
    }
    const ResidualSpec attn = rule.residual(l, Branch::attention), ffn = rule.residual(l, Branch::ffn);
    b.attn_residual = {attn.lambda, attn.beta};
    b.ffn_residual = {ffn.lambda, ffn.beta};
    n.blocks.push_back(b);
  }
  n.logit_scale = rule.logit_scale(static_cast<int>(d / config.heads));
  n.output_multiplier = rule.output_multiplier();
  if (!config.tie_embeddings) n.readout_std = std_of(rule, ParamRole::readout, d, v, -1, "head.weight");
  return n;
}

theory::MlpNumbers mlp_numbers(const ScalingRule& rule, const MlpConfig& config) {
  theory::MlpNumbers n;
  n.config = config;
  for (int l = 0; l < config.layers; ++l) {
    const std::int64_t in = l == 0 ? config.input_dim : config.width;
    const std::string prefix = "layers." + std::to_string(l);
    theory::MlpLayerNumbers layer;
    const double w =
        std_of(rule, l == 0 ? ParamRole::mlp_input : ParamRole::mlp_hidden, in, config.width, l, prefix + ".weight");
    const double bias = std_of(rule, ParamRole::bias, in, config.width, l, prefix + ".bias");
    layer.weight_var = w * w;
    layer.bias_var = bias * bias;
    if (config.residual && l > 0) {
      const ResidualSpec spec = rule.residual(l, Branch::mlp);
      layer.residual = {spec.lambda, spec.beta};
    }
    n.layers.push_back(layer);
  }
  const double readout = std_of(rule, ParamRole::readout, config.width, config.outputs, -1, "readout.weight");
  const double readout_bias = std_of(rule, ParamRole::bias, config.width, config.outputs, -1, "readout.bias");
  n.readout_weight_var = readout * readout;
  n.readout_bias_var = readout_bias * readout_bias;
  n.output_multiplier = rule.output_multiplier();
  return n;
}

theory::TransformerNumbers transformer_numbers(const ScalingConfig& scaling, const TransformerConfig& config) {
  const ModelConfig shape(config);
  return transformer_numbers(*make_rule(scaling, shape), config);
}

theory::MlpNumbers mlp_numbers(const ScalingConfig& scaling, const MlpConfig& config) {
  const ModelConfig shape(config);
  return mlp_numbers(*make_rule(scaling, shape), config);
}

}  // namespace proplab
