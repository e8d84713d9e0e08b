// scaling/resnet_util: the ResNet stage layout (shared by models/resnet and the rules that depend on it) and the
// init and activation-gain helpers the ResNet rules share.
//
// Invariants: blocks are numbered 0..blocks()-1 over all stages in forward order; stage s holds blocks
// s·per_stage .. (s+1)·per_stage − 1; a block is a transition (stride 2 and a projection shortcut) when it opens
// stage s ≥ 1; the first block of stage 0 also has a projection shortcut (stride 1) when its input and output
// channels differ (bottleneck blocks).
#pragma once

#include <cmath>
#include <numbers>
#include <string>
#include <vector>

#include "core/error.h"
#include "scaling/rule.h"

namespace proplab::resnet_util {

constexpr int kStages = 3;

struct Layout {
  int per_stage = 0;  // residual blocks per stage
  int convs_per_branch = 2;
  bool bottleneck = false;
  int blocks() const { return kStages * per_stage; }
  int stage(int block) const { return block / per_stage; }
  bool opens_stage(int block) const { return block % per_stage == 0; }
  bool transition(int block) const { return opens_stage(block) && stage(block) > 0; }
  // A projection shortcut (1x1 conv): transitions, and the first bottleneck block (its channels grow ×4).
  bool projection(int block) const { return transition(block) || (bottleneck && block == 0); }
};

// The layout of a ResNet config; a UserError naming model.depth unless depth = 6n + 2 (basic) or 9n + 2
// (bottleneck) with n ≥ 1.
inline Layout layout(const ResnetConfig& config) {
  const bool basic = config.block == ResnetBlock::basic;
  const int per = basic ? 6 : 9;
  if (config.depth < per + 2 || (config.depth - 2) % per != 0)
    throw UserError("model.depth = " + std::to_string(config.depth) + ": a " + (basic ? "basic" : "bottleneck") +
                    "-block ResNet has depth " + std::to_string(per) + "n + 2; allowed: " + std::to_string(per + 2) +
                    ", " + std::to_string(2 * per + 2) + ", " + std::to_string(3 * per + 2) + ", ...");
  Layout out;
  out.per_stage = (config.depth - 2) / per;
  out.convs_per_branch = basic ? 2 : 3;
  out.bottleneck = !basic;
  return out;
}

// He (Kaiming) normal init for ReLU nets: conv weights N(0, 2/fan_in), the classifier N(0, 1/fan_in) with bias
// 0, norm gains (BatchNorm γ, weight-standardisation gains) 1, norm shifts 0, residual scalars 1.
inline InitSpec he_init(const ParamInfo& param) {
  switch (param.role) {
    case ParamRole::conv_stem:
    case ParamRole::conv_branch:
    case ParamRole::conv_branch_out:
    case ParamRole::conv_shortcut:
      return InitSpec::normal_std(std::sqrt(2.0 / static_cast<double>(param.fan_in)));
    case ParamRole::readout:
      return InitSpec::normal_std(std::sqrt(1.0 / static_cast<double>(param.fan_in)));
    case ParamRole::norm_gain:
    case ParamRole::residual_scale:
      return InitSpec::constant(1.0);
    default:
      return InitSpec::constant(0.0);
  }
}

// φ(x) for the activations a ResNet uses.
inline double activation_value(Activation kind, double x) {
  switch (kind) {
    case Activation::identity:
      return x;
    case Activation::relu:
      return x > 0 ? x : 0.0;
    case Activation::tanh:
      return std::tanh(x);
    case Activation::gelu_tanh:
      return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
    case Activation::gelu_erf:
      return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
  }
  return x;
}

// γ = 1 / sqrt(Var φ(z)), z ~ N(0, 1) (NF-Nets' activation gain: ReLU √(2/(1 − 1/π)) ≈ 1.7139), by the
// trapezoid rule on [−12, 12] (the Gaussian tail beyond is below double precision).
inline double activation_gain(Activation kind) {
  constexpr int kSteps = 24000;
  const double step = 24.0 / kSteps;
  double mean = 0.0, second = 0.0;
  for (int i = 0; i <= kSteps; ++i) {
    const double z = -12.0 + i * step;
    const double weight =
        (i == 0 || i == kSteps ? 0.5 : 1.0) * step * std::exp(-0.5 * z * z) / std::sqrt(2 * std::numbers::pi);
    const double value = activation_value(kind, z);
    mean += weight * value;
    second += weight * value * value;
  }
  return 1.0 / std::sqrt(second - mean * mean);
}

// NF-ResNet variance bookkeeping (Brock et al. 2021, "Characterizing signal propagation to close the performance
// gap in unnormalized ResNets"): with unit-variance branches f and x_{b+1} = x_b + α·f(x_b/β_b), the expected
// variance of the residual stream entering block b is v_0 = 1 (the stem), v_{b+1} = v_b + α², and after a
// projection block v_{b+1} = 1 + α² (its shortcut reads the normalised input, variance 1). Returns v_0..v_blocks;
// β_b = √v_b.
inline std::vector<double> nf_expected_variances(const Layout& layout, double alpha) {
  std::vector<double> v(static_cast<std::size_t>(layout.blocks()) + 1, 1.0);
  for (int b = 0; b < layout.blocks(); ++b) v[b + 1] = (layout.projection(b) ? 1.0 : v[b]) + alpha * alpha;
  return v;
}

// Throws unless the model is a ResNet with the required normalisation (`why` says why the rule fixes it).
inline void require_resnet_norm(const ModelConfig& shape, const std::string& rule, ResnetNorm required,
                                const std::string& why) {
  if (shape.kind() != ModelKind::resnet || shape.resnet().norm == required) return;
  const std::string wanted = required == ResnetNorm::none ? "none" : "batchnorm";
  const std::string have = shape.resnet().norm == ResnetNorm::none ? "none" : "batchnorm";
  throw UserError("model.norm = \"" + have + "\" conflicts with scaling rule \"" + rule +
                  "\", which requires model.norm = \"" + wanted + "\" (" + why + "); allowed: model.norm = \"" +
                  wanted + "\"");
}

}  // namespace proplab::resnet_util
