// scaling/resnet_theory: each ResNet rule's theory, the variance bookkeeping of the residual stream at
// initialisation: the predicted mean and variance of the stream entering and leaving every block and of every
// branch output (the probes blocks.b.in, blocks.b.branch, blocks.b.out of models/resnet.h).
//
// The model is read from the rule exactly as models/resnet builds it (the same ParamInfo roles and fans, λ, β,
// input scale, weight standardisation and its gain). Conventions and approximations (the wide limit):
// - Every element is treated as Gaussian N(mean, var) with a mean shared by all elements (the probes' mean and
//   population variance over the whole tensor); distinct elements of a conv's input are independent and the
//   conv's weights independent of them: a plain conv with weight std² = c/fan_in maps E[a²] to var c·E[a²]
//   (mean 0); a weight-standardised conv (zero-mean rows of squared norm (gain·scale)²) maps Var(a) to
//   (gain·scale)²·Var(a); BatchNorm maps anything to N(β_norm, γ²); an activation's moments are Gaussian
//   integrals (trapezoid rule); the shortcut and the branch are independent.
// - Zero padding at the image borders is ignored (it lowers a 3x3 conv's output variance by about
//   (perimeter / area)/3, a few percent at 32x32) and so are the small positive correlations ReLU leaves between
//   a conv's inputs (measured NF-ResNets at 16x16 end a 50-block stage near 2.3 where this bookkeeping says 3.0).
// - A post-activation stream is rectified: its mean is tracked and the sum λ·x + β·f is closed as a Gaussian.
#pragma once

#include <string>
#include <vector>

#include "spec/model.h"
#include "scaling/rule.h"

namespace proplab {

struct StreamMoments {
  double mean = 0.0;
  double var = 0.0;
};

struct ResnetBookkeeping {
  StreamMoments stem;                                        // probe stem.out
  std::vector<StreamMoments> stream_in, branch, stream_out;  // per block
  std::string formulae;                                      // one line: what was used
};

// The bookkeeping for a ResNet initialised by `rule`, on inputs of elementwise variance input_var (mean 0).
ResnetBookkeeping resnet_bookkeeping(const ResnetConfig& config, const ScalingRule& rule, double input_var = 1.0);

// E[φ(x)] and E[φ(x)²] for x ~ N(mean, var).
StreamMoments activation_moments(Activation kind, double mean, double var);

}  // namespace proplab
