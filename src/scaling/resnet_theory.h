// scaling/resnet_theory: each ResNet rule's theory at initialisation: the predicted mean and variance of the
// stream entering and leaving every block and of every branch output (the probes blocks.b.in, blocks.b.branch,
// blocks.b.out of models/resnet.h), forward and backward.
//
// The model is read from the rule exactly as models/resnet builds it (the same ParamInfo roles and fans, λ, β,
// input scale, weight standardisation and its gain). Conventions and approximations (docs/theory.md, "ResNets"):
// - Position-resolved: every activation is a map over the image positions of per-position mean and second
//   moment (the same for every channel and image); a conv sums, at each output position, the taps inside the image
//   (zero padding at the borders; options.borders = false gives the interior-only wide limit).
// - Each element is Gaussian given its position's mean and variance, but for a plain conv's output without
//   BatchNorm: a Gaussian scale mixture (Plane::mix in the .cpp; docs/theory.md, "A ReLU after a conv of small
//   fan-in"). Distinct elements of a conv's input are independent of its weights: a plain conv with weight std² =
//   c/fan_in maps E[a²] to c·avg_taps E[a²]; a weight-standardised conv (zero-mean rows of squared norm (gain·scale)²)
//   maps to (gain·scale)²·(avg_taps E[a²] − (avg_taps mean)²); BatchNorm uses the batch statistics over images and
//   positions; an activation's moments are Gaussian integrals; the shortcut and the branch are independent.
// - A post-activation stream is rectified: its mean is tracked and the sum λ·x + β·f is closed as a Gaussian.
// - Backward: the mean softmax cross-entropy gradient, the classifier, average pooling (the gradient is shared by
//   an image's positions), transposed convs over the same taps, φ'(x)² per position (a carried post-activation sum:
//   the mask weighed by E[g² | sum], since consecutive blocks' masks are correlated through it), BatchNorm's
//   γ²·E[1/σ_c²] (less 2/fan-in where its own conv's transpose follows) less the part of the gradient its batch
//   statistics remove: the batch mean (the image-mean part, tracked as E[(mean over positions)²], over the batch
//   size, plus what the images' loss gradients share, from the logits' shared part and the batch's classes) and,
//   where its activation follows, that shared part's projection on x̂.
// - A stack of identity blocks (SkipInit) adds the part of the gradient that leans on the classifier's own
//   weights through the softmax (options.head_coupling).
#pragma once

#include <cstdint>
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
  // Backward: the gradient's second moment (its variance: gradients have mean ≈ 0) at stem.out and per block at
  // the stream entering it, its branch output and the stream leaving it.
  double grad_stem = 0.0;
  std::vector<double> grad_in, grad_branch, grad_out;
  // The finite-width band: the standard deviation of log(var) over initialisations and batches (docs/theory.md,
  // "Finite-width bands", ResNets), at stem.out and per block; NaN but for pre-activation ResNets with BatchNorm or
  // weight standardisation.
  double stem_log_sd = 0.0;
  std::vector<double> stream_in_log_sd, branch_log_sd, stream_out_log_sd;
  std::string formulae;                                      // one line: what was used
};

struct ResnetTheoryOptions {
  bool borders = true;         // zero padding at the image borders (false: every position is interior)
  std::int64_t batch = 1;      // images per micro-batch (the loss is their mean; BatchNorm's batch)
  double grad_scale = 1.0;     // on the loss (1/grad_accum)
  // The first micro-batch's targets (how many images share a class); empty: targets drawn uniformly at random.
  std::vector<std::int32_t> batch_targets;
  // Post-activation ReLU blocks with a rectified shortcut: carry the sum's distribution per position from block to
  // block (false: the Gaussian closure of each sum, which under-predicts the stream's growth).
  bool rectified_sums = true;
  // BatchNorm's channel-variance spread counts the zero padding's part of the conv input's centred Gram (every
  // channel's patch drops its mean at a border together; false: the interior's Gram at every position).
  bool padded_spread = true;
  // A ReLU after a plain conv without BatchNorm sees a Gaussian scale mixture (the conv's output given its input patch
  // is N(0, E[w²]·|patch|²)), carried from conv to conv as a product of Gamma factors (false: the Gaussian closure of
  // every conv's output, which under-predicts such a ReLU's variance: 0.9% at the stem, 4.3% after a 1×1 projection
  // from 16 channels).
  bool scale_mixture = true;
  // A ResNet whose blocks are all the identity at initialisation (SkipInit, Fixup) with a random classifier: the
  // gradient below the pooled features leans on the classifier's weights through the softmax, σ⁴·((tr S)² + tr S²)·
  // E|Jᵀf|² per image (docs/theory.md, "The classifier's coupling"; false: the independent-weights bookkeeping, 6.7%
  // low at a width-1 ResNet-56's input).
  bool head_coupling = true;
};

// The bookkeeping for a ResNet initialised by `rule`, on inputs of elementwise variance input_var (mean 0).
ResnetBookkeeping resnet_bookkeeping(const ResnetConfig& config, const ScalingRule& rule, double input_var = 1.0,
                                     const ResnetTheoryOptions& options = {});

// E[φ(x)] and E[φ(x)²] for x ~ N(mean, var).
StreamMoments activation_moments(Activation kind, double mean, double var);

}  // namespace proplab
