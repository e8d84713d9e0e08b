#include "scaling/resnet_theory.h"

#include <cmath>
#include <numbers>

#include "scaling/resnet_util.h"

namespace proplab {

namespace {

// E[φ], E[φ²] as StreamMoments{mean = E[φ], var = E[φ²]} (the second moment, not the variance).
StreamMoments gaussian_integrals(Activation kind, double mean, double var) {
  if (var <= 0) {
    const double value = resnet_util::activation_value(kind, mean);
    return {value, value * value};
  }
  constexpr int kSteps = 4000;
  const double sd = std::sqrt(var), step = 24.0 / kSteps;
  double first = 0.0, second = 0.0;
  for (int i = 0; i <= kSteps; ++i) {
    const double z = -12.0 + i * step;
    const double weight =
        (i == 0 || i == kSteps ? 0.5 : 1.0) * step * std::exp(-0.5 * z * z) / std::sqrt(2 * std::numbers::pi);
    const double value = resnet_util::activation_value(kind, mean + sd * z);
    first += weight * value;
    second += weight * value * value;
  }
  return {first, second};
}

// A conv's output moments from its input's, for the conv described by (role, fan_in) under the rule.
struct ConvModel {
  const ScalingRule& rule;
  const ResnetRuleSpec& spec;
  // `input` holds mean and variance of what the conv reads; reads_activation picks the standardisation scale.
  StreamMoments apply(ParamRole role, std::int64_t fan_in, std::int64_t fan_out, int block, const StreamMoments& input,
                      bool reads_activation) const {
    if (spec.weight_standardization) {
      const InitSpec gain = rule.init(ParamInfo{ParamRole::norm_gain, fan_in, fan_out, block, ""});
      const double scale = (reads_activation ? spec.activation_gain : 1.0) * gain.value;
      return {0.0, scale * scale * input.var};
    }
    const InitSpec init = rule.init(ParamInfo{role, fan_in, fan_out, block, ""});
    const double weight_var = init.kind == InitSpec::Kind::constant ? 0.0 : init.std * init.std;
    return {0.0, weight_var * static_cast<double>(fan_in) * (input.var + input.mean * input.mean)};
  }
};

}  // namespace

StreamMoments activation_moments(Activation kind, double mean, double var) {
  return gaussian_integrals(kind, mean, var);
}

ResnetBookkeeping resnet_bookkeeping(const ResnetConfig& config, const ScalingRule& rule, double input_var) {
  const resnet_util::Layout layout = resnet_util::layout(config);
  const ResnetRuleSpec spec = rule.resnet();
  const ConvModel conv{rule, spec};
  const bool preact = config.preact, normed = config.norm == ResnetNorm::batchnorm;
  const Activation act = config.activation;
  const std::int64_t base = 16 * static_cast<std::int64_t>(config.width);
  const std::int64_t expansion = layout.bottleneck ? 4 : 1;
  auto norm = [&](const StreamMoments& x) -> StreamMoments {
    if (!normed) return x;
    const double gamma = rule.init(ParamInfo{ParamRole::norm_gain, 1, 1, -1, ""}).value;
    const double shift = rule.init(ParamInfo{ParamRole::norm_bias, 1, 1, -1, ""}).value;
    return {shift, gamma * gamma};
  };
  auto activate = [&](const StreamMoments& x) -> StreamMoments {
    const StreamMoments integrals = gaussian_integrals(act, x.mean, x.var);
    return {integrals.mean, integrals.var - integrals.mean * integrals.mean};
  };

  ResnetBookkeeping out;
  out.formulae =
      "resnet variance bookkeeping (wide limit, no borders): plain conv var = fan_in·std²·E[a²]; standardised "
      "conv var = (gain·scale)²·Var(a); BatchNorm → N(β, γ²); out = λ·shortcut + β·branch (independent)";
  StreamMoments x = conv.apply(ParamRole::conv_stem, config.in_channels * 9, base * 9, -1, {0.0, input_var}, false);
  if (!preact) x = activate(norm(x));
  out.stem = x;
  std::int64_t channels = base;
  for (int b = 0; b < layout.blocks(); ++b) {
    const std::int64_t width = base << layout.stage(b), block_out = width * expansion;
    struct Shape {
      std::int64_t in, out, kernel;
    };
    std::vector<Shape> shapes = layout.bottleneck
                                    ? std::vector<Shape>{{channels, width, 1}, {width, width, 3}, {width, block_out, 1}}
                                    : std::vector<Shape>{{channels, width, 3}, {width, width, 3}};
    const int m = static_cast<int>(shapes.size());
    const double s = rule.resnet_block(b).input_scale;
    const ResidualSpec residual = rule.residual(b, Branch::ffn);
    out.stream_in.push_back(x);
    const StreamMoments scaled{s * x.mean, s * s * x.var};
    StreamMoments cur = scaled, first_conv_input;
    for (int j = 0; j < m; ++j) {
      const ParamRole role = j == m - 1 ? ParamRole::conv_branch_out : ParamRole::conv_branch;
      const std::int64_t k2 = shapes[j].kernel * shapes[j].kernel;
      StreamMoments input = preact ? activate(norm(cur)) : cur;
      if (j == 0) first_conv_input = input;
      cur = conv.apply(role, shapes[j].in * k2, shapes[j].out * k2, b, input, true);
      if (!preact) {
        cur = norm(cur);
        if (j < m - 1) cur = activate(cur);
      }
    }
    out.branch.push_back(cur);
    StreamMoments shortcut = x;
    if (layout.projection(b)) {
      shortcut = conv.apply(ParamRole::conv_shortcut, channels, block_out, b, first_conv_input, true);
      if (!preact) shortcut = norm(shortcut);
    }
    StreamMoments sum{residual.lambda * shortcut.mean + residual.beta * cur.mean,
                      residual.lambda * residual.lambda * shortcut.var + residual.beta * residual.beta * cur.var};
    // A zero branch leaves a post-activation ReLU stream as it is (ReLU is idempotent on its non-negative output);
    // the Gaussian closure would not see that.
    const bool rectified_identity = !preact && !layout.projection(b) && act == Activation::relu &&
                                    residual.beta * residual.beta * cur.var == 0.0 && cur.mean == 0.0 &&
                                    residual.lambda >= 0.0;
    x = preact || rectified_identity ? sum : activate(sum);
    out.stream_out.push_back(x);
    channels = block_out;
  }
  return out;
}

}  // namespace proplab
