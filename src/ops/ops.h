// ops: proplab's operations, one entry point per op, each dispatching on its tensors' device to the CPU
// implementation (the reference, in this folder) or to kernels/ (CUDA). A missing device implementation is a
// UserError naming the op.
//
// Conventions for every op here:
// - Tensors are contiguous f32 unless stated (token ids and labels are i32). Shapes are checked.
// - Outputs are preallocated by the caller and overwritten.
// - Backward: activation gradients (d_x) OVERWRITE; parameter gradients (d_weight, d_bias, d_gamma, d_lambda...)
//   ACCUMULATE (+=), so micro-batches and shared parameters add up without extra buffers.
// - Every reduction is chunked independently of the thread count, so results are bitwise identical for any
//   number of threads.
// - rows = batch * tokens; features last.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "probe/moments.h"
#include "spec/model.h"

namespace proplab::ops {

// ---- elementwise helpers ----------------------------------------------------------------------------------
// y += alpha * x
void axpy(float alpha, const Tensor& x, Tensor& y);
// x *= alpha
void scale(Tensor& x, float alpha);
// x = 0
void zero(Tensor& x);
// Σ x_i·y_i in double, deterministic.
double dot(const Tensor& x, const Tensor& y);
// Σ x_i² in double, deterministic.
double sum_squares(const Tensor& x);
// sum_squares of each tensor, bitwise as one call each, in one parallel region for all of them on the CPU (a region
// per tensor costs more than many small tensors' sums where the idle thread sleeps between regions).
std::vector<double> sum_squares_each(const std::vector<const Tensor*>& xs);

// ---- linear: y = x W^T (+ b); x [rows, in], W [out, in], b [out], y [rows, out] ------------------------------
void linear_forward(const Tensor& x, const Tensor& weight, const Tensor* bias, Tensor& y);
// d_x (overwrite, skipped when null), d_weight (+=), d_bias (+=, skipped when null).
void linear_backward(const Tensor& x, const Tensor& weight, const Tensor& d_y, Tensor* d_x, Tensor& d_weight,
                     Tensor* d_bias);

// ---- embedding: y[b,t] = token_table[tokens[b,t]] (+ pos_table[t]) -------------------------------------------
// tokens i32 [B, T] with values in [0, V); token_table [V, D]; pos_table [T_max >= T, D]; y [B, T, D].
void embedding_forward(const Tensor& tokens, const Tensor& token_table, const Tensor* pos_table, Tensor& y);
// d_token_table (+=), d_pos_table (+=, skipped when null). Deterministic (no scatter races).
void embedding_backward(const Tensor& tokens, const Tensor& d_y, Tensor& d_token_table, Tensor* d_pos_table);

// ---- moments gathered inside an op (probe recording) -------------------------------------------------------------
// Sums an op adds its input's and its output's statistics to while it runs, each tensor viewed as [sequences,
// rows / sequences, last dimension] (an NCHW image as its channels-last view, sequences = samples, as
// probe::accumulate_planes sums it; on the CPU only): bitwise what probe::accumulate of the finished tensor adds (on
// the CPU the op sums each chunk of probe::ChunkedAccumulation inside its own loop while the chunk is in cache; on a
// GPU it accumulates the finished tensors). Null sums are not taken.
struct OpMoments {
  probe::MomentSums* input = nullptr;
  probe::StatSelection input_stats;
  probe::MomentSums* output = nullptr;
  probe::StatSelection output_stats;
  std::int64_t sequences = 1;
};

// ---- normalisation over the last dimension; x [rows, D] -------------------------------------------------------
// LayerNorm: y = (x - mean) * rstd (* gamma + beta). Saves mean [rows], rstd [rows] for backward.
// With `moments`, the statistics of y (output; a norm takes no input sums).
void layernorm_forward(const Tensor& x, const Tensor* gamma, const Tensor* beta, float eps, Tensor& y, Tensor& mean,
                       Tensor& rstd, const OpMoments* moments = nullptr);
void layernorm_backward(const Tensor& x, const Tensor* gamma, const Tensor& mean, const Tensor& rstd, const Tensor& d_y,
                        Tensor& d_x, Tensor* d_gamma, Tensor* d_beta);
// RMSNorm: y = x * rstd (* gamma), rstd = 1/sqrt(mean(x²) + eps). Saves rstd [rows].
void rmsnorm_forward(const Tensor& x, const Tensor* gamma, float eps, Tensor& y, Tensor& rstd,
                     const OpMoments* moments = nullptr);
void rmsnorm_backward(const Tensor& x, const Tensor* gamma, const Tensor& rstd, const Tensor& d_y, Tensor& d_x,
                      Tensor* d_gamma);

// ---- pointwise activations ------------------------------------------------------------------------------------
using ::proplab::Activation;  // (spec/model.h)
// y = φ(x); with `moments`, the statistics of x (input) and y (output).
void activation_forward(Activation kind, const Tensor& x, Tensor& y, const OpMoments* moments = nullptr);
// d_x = d_y * φ'(x) (overwrite). d_x may alias d_y. With `moments`, the statistics of d_y (input) and d_x (output).
void activation_backward(Activation kind, const Tensor& x, const Tensor& d_y, Tensor& d_x,
                         const OpMoments* moments = nullptr);

// ---- causal multi-head self-attention ---------------------------------------------------------------------------
// qkv [B, T, 3D] holds q, k, v side by side (each [B, T, D], head h at features h*Dh..(h+1)*Dh), D = heads*Dh.
// probs [B, H, T, T] (saved; entries above the diagonal are 0); out [B, T, D]. logits = q·k * logit_scale
// (1/sqrt(Dh) by default, 1/Dh under muP).
// With logit_sums (recorded steps only), also adds the power sums of the causal logits (j <= i, before the
// softmax) while computing them: per (sequence, head) in double, combined in (sequence, head) order.
using probe::LogitSums;
void attention_forward(const Tensor& qkv, int heads, float logit_scale, Tensor& probs, Tensor& out,
                       LogitSums* logit_sums = nullptr);
// d_qkv (overwrite) [B, T, 3D].
void attention_backward(const Tensor& qkv, const Tensor& probs, const Tensor& d_out, int heads, float logit_scale,
                        Tensor& d_qkv);

// ---- blockwise attention (ring attention's steps, models/sequence_parallel.h; CPU) ------------------------------
// The queries of qkv [B, Tq, 3D] against one block of keys and values kv [B, Tk, W] (per token its keys at
// features [0, D) and values at [D, 2D); W >= 2D). `causal`: the block is the queries' own tokens (Tk = Tq; key j is
// visible to query i when j <= i); otherwise every key is visible. Logits as attention_forward's (the same float
// products), the softmax taken online over the blocks (flash-attention style) in float:
// forward: the running row maximum m and sum l [B, H, Tq] and the unnormalised output o [B, Tq, D] are updated in
// place (start from m = -inf, l = 0, o = 0; after the last block out = o / l and the log-sum-exp is m + log l).
// With logit_sums, adds the visible logits' power sums, per (sequence, head) and added in that order.
void attention_block_forward(const Tensor& qkv, const Tensor& kv, int heads, float logit_scale, bool causal, Tensor& m,
                             Tensor& l, Tensor& o, LogitSums* logit_sums = nullptr);
// backward: from the forward's log-sum-exp lse and row_dot = Σ_d d_out·out [B, H, Tq], adds this block's part of
// d_q to d_q [B, Tq, D] and the block's key and value gradients to kv's features [2D, 3D) and [3D, 4D) (W >= 4D).
void attention_block_backward(const Tensor& qkv, const Tensor& d_out, const Tensor& lse, const Tensor& row_dot,
                              int heads, float logit_scale, bool causal, Tensor& kv, Tensor& d_q);

// ---- residual combine: y = lambda * x + beta * f ------------------------------------------------------------------
// With `moments`, the statistics of f (input) and y (output).
void residual_forward(const Tensor& x, const Tensor& f, float lambda, float beta, Tensor& y,
                      const OpMoments* moments = nullptr);
// d_x = lambda*d_y, d_f = beta*d_y (overwrite; each skipped when null; d_x may alias d_y);
// d_lambda += Σ d_y·x, d_beta += Σ d_y·f (each skipped when null; learnable scalars).
// With `moments`, the statistics of d_y (input) and d_f (output; then d_f must be given).
void residual_backward(const Tensor& x, const Tensor& f, const Tensor& d_y, float lambda, float beta, Tensor* d_x,
                       Tensor* d_f, double* d_lambda, double* d_beta, const OpMoments* moments = nullptr);
// y = relu(lambda * x + beta * f) in one pass (bitwise residual_forward then activation_forward(relu); on a GPU it
// is those two calls).
void residual_relu_forward(const Tensor& x, const Tensor& f, float lambda, float beta, Tensor& y,
                           const OpMoments* moments = nullptr);
// Its backward from y: d_y is dL/dy on entry and dL/d(lambda * x + beta * f) on return (masked by y > 0, which holds
// exactly where the sum is > 0); then as residual_backward (d_x may alias d_y). Bitwise activation_backward(relu)
// then residual_backward. With `moments` (as residual_forward's and residual_backward's), the statistics of f and y
// forward, of d_y as it enters (unmasked) and d_f backward.
void residual_relu_backward(const Tensor& x, const Tensor& f, const Tensor& y, Tensor& d_y, float lambda, float beta,
                            Tensor* d_x, Tensor* d_f, double* d_lambda, double* d_beta,
                            const OpMoments* moments = nullptr);

// ---- dropout with a counter-based mask ----------------------------------------------------------------------------
// Element i is dropped when CounterRng(seed, stream).uniform(i) < p; kept ones are scaled by 1/(1-p).
// The mask is recomputed in backward, never stored. p = 0 copies.
void dropout_forward(const Tensor& x, float p, std::uint64_t seed, std::uint64_t stream, Tensor& y);
void dropout_backward(const Tensor& d_y, float p, std::uint64_t seed, std::uint64_t stream, Tensor& d_x);

// ---- losses
// ---------------------------------------------------------------------------------------------------------- Softmax
// cross-entropy over the last dim of logits [rows, V] against targets i32 [rows]. Returns the mean loss over rows
// (double). When d_logits is given it is overwritten with grad_scale * (softmax - onehot) / rows.
double softmax_cross_entropy(const Tensor& logits, const Tensor& targets, Tensor* d_logits, float grad_scale = 1.0f);
// Mean squared error 0.5*mean((pred - target)²) over all elements; d_pred = grad_scale*(pred - target)/numel.
double mse_loss(const Tensor& pred, const Tensor& target, Tensor* d_pred, float grad_scale = 1.0f);

// ---- images (NCHW) -----------------------------------------------------------------------------------------------
// Images are [N, C, H, W], row-major (w fastest, then h, then channel, then sample). Convolution weights are
// [C_out, C_in / groups, KH, KW]; group g maps input channels g·C_in/groups.. to output channels g·C_out/groups..
// Output sizes: H_out = (H + 2·padding − KH) / stride + 1 (floor), likewise W_out. Zero padding.
struct Conv2dParams {
  int stride = 1;
  int padding = 0;
  int groups = 1;
};
// The output spatial size for an input size, kernel size and params (a UserError when it would be < 1).
std::int64_t conv2d_out_size(std::int64_t in, std::int64_t kernel, int stride, int padding);
// The CPU's convolution kernels: `winograd` (the default: Winograd F(2×2, 3×3), ops/conv_winograd.h, for the
// forward and the stride-1 d_x of 3 × 3, stride-1, one-group convolutions, and `direct` for the rest of what it
// runs), `direct` (packed direct convolution, ops/conv_direct.h: the forward, strided ones from 32 input channels,
// the stride-1 d_x and the weight gradient of one-group convolutions) or `im2col` (im2col + sgemm for
// everything). The first two need AVX-512F; other CPUs run im2col whatever the setting. Process-wide;
// PROPLAB_CONV=direct or PROPLAB_CONV=im2col in the environment chooses the others. Each is bitwise independent
// of the thread count; they differ in the last bits. conv_direct_supported(): whether this CPU runs the Winograd
// and direct kernels at all.
enum class ConvKernel { winograd, direct, im2col };
ConvKernel conv_kernel();
void set_conv_kernel(ConvKernel kernel);
bool conv_direct_supported();
// y [N, C_out, H_out, W_out] = conv(x [N, C_in, H, W], weight) (+ bias [C_out]).
void conv2d_forward(const Tensor& x, const Tensor& weight, const Tensor* bias, const Conv2dParams& params, Tensor& y);
// d_x (overwrite, skipped when null), d_weight (+=), d_bias (+=, skipped when null).
void conv2d_backward(const Tensor& x, const Tensor& weight, const Tensor& d_y, const Conv2dParams& params, Tensor* d_x,
                     Tensor& d_weight, Tensor* d_bias);

// BatchNorm per channel over (N, H, W) of x [N, C, H, W] (or [N, C]): y = (x − mean_c)·rstd_c (·gamma + beta).
// training: batch statistics (population variance), saved into mean/rstd [C], and the running statistics are
// updated running ← (1 − momentum)·running + momentum·batch (running_var takes the unbiased batch variance).
// eval: mean/rstd are filled from running_mean/running_var (left unchanged) and used instead.
void batchnorm_forward(const Tensor& x, const Tensor* gamma, const Tensor* beta, float eps, bool training,
                       float momentum, Tensor& running_mean, Tensor& running_var, Tensor& y, Tensor& mean,
                       Tensor& rstd);
// d_x (overwrite; through the batch statistics when training, the fixed running ones in eval), d_gamma/d_beta (+=).
void batchnorm_backward(const Tensor& x, const Tensor* gamma, const Tensor& mean, const Tensor& rstd, const Tensor& d_y,
                        bool training, Tensor& d_x, Tensor* d_gamma, Tensor* d_beta);
// BatchNorm then ReLU in one pass: z = relu(batchnorm(x)), the normalised values never stored (bitwise what
// batchnorm_forward then activation_forward(relu) give in z; on a GPU it is those two calls).
void batchnorm_relu_forward(const Tensor& x, const Tensor* gamma, const Tensor* beta, float eps, bool training,
                            float momentum, Tensor& running_mean, Tensor& running_var, Tensor& z, Tensor& mean,
                            Tensor& rstd);
// Its backward from z and d_z: d_x (overwrite; may alias d_z, not z), d_gamma/d_beta (+=). The ReLU's gradient,
// masked by z > 0 (which holds exactly where the normalised value is > 0), is written into d_x plane by plane and
// summed from there: bitwise activation_backward(relu) then batchnorm_backward.
void batchnorm_relu_backward(const Tensor& x, const Tensor* gamma, const Tensor& mean, const Tensor& rstd,
                             const Tensor& z, const Tensor& d_z, bool training, Tensor& d_x, Tensor* d_gamma,
                             Tensor* d_beta);
// A post-activation residual block's end in one last pass: out = relu(λ·shortcut + β·batchnorm(x)), the branch
// batchnorm(x) never stored; mean, rstd and the running statistics as batchnorm_forward. Bitwise what
// batchnorm_forward then residual_relu_forward give (on a GPU it is those two calls). out aliases neither x nor
// shortcut. The backward is the two ops' own: residual_relu_backward reads the branch only for a learnable λ or β.
void batchnorm_residual_relu_forward(const Tensor& x, const Tensor* gamma, const Tensor* beta, float eps, bool training,
                                     float momentum, Tensor& running_mean, Tensor& running_var, const Tensor& shortcut,
                                     float lambda, float branch_scale, Tensor& out, Tensor& mean, Tensor& rstd);

// Scaled weight standardisation (NF-Nets) of weight [C_out, ...] per output row o over its fan_in elements:
// w_hat[o, j] = gain[o] · scale · (w[o, j] − mean_o) · rstd_o, rstd_o = 1/sqrt(fan_in · var_o + eps)
// (var population), so a standardised row has Σ_j w_hat² ≈ (gain·scale)². Saves mean, rstd [C_out].
void weight_standardize_forward(const Tensor& weight, const Tensor* gain, float scale, float eps, Tensor& w_hat,
                                Tensor& mean, Tensor& rstd);
// d_weight (+=) and d_gain (+=, skipped when null) from d_w_hat: both are parameter gradients.
void weight_standardize_backward(const Tensor& weight, const Tensor* gain, float scale, const Tensor& mean,
                                 const Tensor& rstd, const Tensor& d_w_hat, Tensor& d_weight, Tensor* d_gain);

// Average pooling, kernel k × k, stride s, no padding: y [N, C, H_out, W_out].
void avg_pool2d_forward(const Tensor& x, int kernel, int stride, Tensor& y);
void avg_pool2d_backward(const Tensor& d_y, int kernel, int stride, Tensor& d_x);
// Max pooling, kernel k × k, stride s, padding p (padding never wins). argmax i32 [N, C, H_out, W_out] holds the
// flat h·W + w index of each window's maximum (first one on ties) for backward.
void max_pool2d_forward(const Tensor& x, int kernel, int stride, int padding, Tensor& y, Tensor& argmax);
void max_pool2d_backward(const Tensor& d_y, const Tensor& argmax, Tensor& d_x);
// Global average pooling: y [N, C] = mean over H, W of x [N, C, H, W].
void global_avg_pool_forward(const Tensor& x, Tensor& y);
void global_avg_pool_backward(const Tensor& d_y, Tensor& d_x);
// Channels last: y [N, H·W, C] from x [N, C, H, W] (how probes see an image: tokens = pixels, features =
// channels); and its inverse.
void nchw_to_nhwc(const Tensor& x, Tensor& y);
void nhwc_to_nchw(const Tensor& x, Tensor& y);

// ---- optimizers (in place on one parameter tensor)
// --------------------------------------------------------------------
struct AdamWHyper {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;  // decoupled: param -= lr * weight_decay * param
  std::int64_t step = 1;      // 1-based, for bias correction
};
// What an update did to one tensor, measured inside the update loop when asked (recorded steps):
// Σ w² before the update and Σ (w_after − w_before)², each over fixed blocks combined in order (deterministic).
struct UpdateNorms {
  double weight_sq = 0.0;
  double update_sq = 0.0;
};
void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWHyper& hyper,
                  UpdateNorms* norms = nullptr);

struct SgdHyper {
  float lr = 1e-2f;
  float momentum = 0.9f;
  float weight_decay = 0.0f;  // coupled (added to the gradient), as in classic SGD
  bool nesterov = false;
};
void sgd_update(Tensor& param, const Tensor& grad, Tensor& momentum_buffer, const SgdHyper& hyper,
                UpdateNorms* norms = nullptr);

// One tensor's step for the _each forms (the same arguments as adamw_update / sgd_update).
struct AdamWStep {
  Tensor* param;
  const Tensor* grad;
  Tensor* m;
  Tensor* v;
  AdamWHyper hyper;
  UpdateNorms* norms = nullptr;
};
struct SgdStep {
  Tensor* param;
  const Tensor* grad;
  Tensor* momentum_buffer;
  SgdHyper hyper;
  UpdateNorms* norms = nullptr;
};
// The update of every tensor of a step, bitwise the same as one call each: CPU tensors' blocks share one parallel
// region (under passive waiting a region each cost more than the small tensors' updates), CUDA tensors' kernels
// are enqueued in order.
void adamw_update_each(const std::vector<AdamWStep>& steps);
void sgd_update_each(const std::vector<SgdStep>& steps);

// ---- global gradient-norm clipping
// ------------------------------------------------------------------------------------- Returns the global L2 norm over
// all grads (double, deterministic order); when max_norm > 0 and the norm exceeds it, scales every grad by max_norm /
// norm.
double clip_grad_norm(const std::vector<Tensor*>& grads, double max_norm);

}  // namespace proplab::ops
