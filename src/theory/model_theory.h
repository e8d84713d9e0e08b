// theory/model_theory: predicted moments of every probe of a whole model at initialisation, composed from the
// component maps (theory/moments.h) along the model's actual graph, and the MLP's mean-field quantities
// (theory/mean_field.h).
//
// The model is described by plain numbers (TransformerNumbers, MlpNumbers: the config plus every init std and
// residual weight the scaling rule chose), so this module depends on nothing but core and the header-only model
// config; scaling/theory_numbers builds the numbers from a rule.
//
// Invariants and conventions:
// - Predictions are returned in the model's probe order with exactly the model's probe names (the names are
//   built here the same way models/transformer.cpp and models/mlp.cpp build them; tests check they agree).
// - Forward statistics are those probe/moments records: the mean and population variance over all elements, and
//   the token correlation `corr` centred by the scalar mean. Backward: the variance of the gradient of the mean
//   loss with respect to the probe's tensor (as ops::softmax_cross_entropy / ops::mse_loss scale it).
// - A statistic without a prediction is NaN, and the probe's `no_forward` / `no_backward` says why.
// - Attention is causal (token t attends to tokens 0..t), as in ops::attention_forward; the causal maps here
//   replace the reference's bidirectional single-head formula (docs/theory.md, "predictions along the model").
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "spec/model.h"
#include "theory/mean_field.h"
#include "theory/moments.h"

namespace proplab::theory {

struct ResidualNumbers {
  double lambda = 1.0;  // skip weight λ
  double beta = 1.0;    // branch weight β
};

// One transformer block's initial distributions (stds of N(0, std²) entries; 0 for a zero-initialised tensor).
struct TransformerBlockNumbers {
  double q_std = 0.0, k_std = 0.0, v_std = 0.0;  // the packed QKV's three row blocks
  double qkv_bias_std = 0.0;
  double attn_out_std = 0.0, attn_out_bias_std = 0.0;
  double ffn_in_std = 0.0, ffn_in_bias_std = 0.0;
  double ffn_out_std = 0.0, ffn_out_bias_std = 0.0;
  ResidualNumbers attn_residual, ffn_residual;
};

struct TransformerNumbers {
  TransformerConfig config;
  double token_embed_std = 0.0;
  double position_embed_std = 0.0;
  std::vector<TransformerBlockNumbers> blocks;  // config.layers entries
  double logit_scale = 0.0;                     // attention logit scale (1/√d_head by default)
  double output_multiplier = 1.0;               // on the head's logits
  double readout_std = 0.0;                     // untied head only
};

struct MlpLayerNumbers {
  double weight_var = 0.0;  // per-entry variance of W_l (σ_w²/fan_in for the mean-field init)
  double bias_var = 0.0;
  ResidualNumbers residual;  // used for l > 0 when config.residual
};

struct MlpNumbers {
  MlpConfig config;
  std::vector<MlpLayerNumbers> layers;  // config.layers entries
  double readout_weight_var = 0.0;
  double readout_bias_var = 0.0;
  double output_multiplier = 1.0;
};

// What the predictions need beyond the model: the data and the batch.
struct TheoryInputs {
  // Transformer: the token correlation r_0 of the embedding output (measured on the first batch, or a study's
  // [theory] input_corr). Absent: the estimate for independent uniform tokens, σ_tok²/(V·(σ_tok² + σ_pos²)).
  std::optional<double> input_corr;
  // Transformer: the token ids of the batch the prediction describes ([sequences, tokens] row-major; inputs and
  // next-token targets). Two rows of one sequence have correlated loss gradients when they share a target, an
  // input token, or one's target is the other's input (docs/theory.md, "Rows of one sequence"); the theory counts
  // those coincidences here. Empty: independent uniform tokens (each coincidence at the rate 1/vocab).
  // MLP classification: batch_targets are the batch's labels ([sequences]); two samples with one label share more
  // of the readout's seed of the gradient's mean over units (docs/theory.md, "The gradient's mean over units").
  // Empty: uniform labels (rate 1/C).
  std::vector<std::int32_t> batch_inputs, batch_targets;
  // MLP: the mean and variance of the input vectors' elements.
  double input_mean = 0.0;
  double input_var = 1.0;
  // MLP: the relative variance of one sample's mean square over its elements (N(0, 1) inputs of dimension d:
  // 2/d); 0 when every sample has the same norm. Only the residual form's O(1/width) shift uses it.
  double input_norm_spread = 0.0;
  // MLP regression: E[t²] of the targets (the mean-squared-error gradient is (y - t)/numel).
  double target_second_moment = 1.0;
  // The micro-batch: sequences (MLP: samples) and tokens per sequence (0: config.seq_len); the loss is the mean
  // over its rows, times grad_scale (1/grad_accum).
  std::int64_t sequences = 1;
  std::int64_t tokens = 0;
  double grad_scale = 1.0;
  // Transformer: track every token position separately at any length (theory/token_field's exact layout). By
  // default sequences longer than 40 tokens group later positions into buckets (≈ 0.15× their position wide).
  bool exact_positions = false;
  // Transformer with a tied head and norms: carry the gradient's part along the stream's common part, which the
  // blocks amplify beyond gradient independence (docs/theory.md, "The gradient along the stream's common part").
  // Off only to measure what the term does.
  bool common_part_gradient = true;
  // Post-LN (and both), with common_part_gradient: each stream norm's backward removes a little of that part,
  // because the sublayer above it is not homogeneous of degree 1 (GELU, the softmax) (docs/theory.md, "The norm below
  // removes a little"). Off only to measure what the term does.
  bool norm_removes_part = true;
  // Post-LN (and both): each stream norm's backward carries its finite-width factor, the fluctuation of the token's
  // scale it divides by less the mean it projects out (docs/theory.md, "A stream norm's scale fluctuates"). Off only
  // to measure what the term does.
  bool norm_scale_spread = true;
};

// The prediction for one probe.
struct ProbeTheory {
  std::string name;
  std::string kind;  // as probe_kind_name: residual, branch, norm, preact, postact, logits, embed
  int block = -1;
  double mean = 0.0, var = 0.0, corr = 0.0;  // forward; NaN where not predicted
  double backward_var = 0.0;                 // NaN where not predicted
  // Transformers: the gradient's token correlation (as probe/moments records `corr`; docs/theory.md, "Rows of one
  // sequence"). NaN for the other models. Written to run files as /theory/backward/corr.
  double backward_corr = std::numeric_limits<double>::quiet_NaN();
  std::string no_forward;                    // why a forward statistic is NaN ("" when all are predicted)
  std::string no_backward;                   // why backward_var is NaN
  // The finite-width band: the standard deviation of log(var) over initialisations of a network of this width
  // (predict_mlp, and predict_transformer with norms; docs/theory.md, "Finite-width bands"). One network's log(var)
  // is about Gaussian with this spread and mean log(var) − var_log_sd²/2 (its expectation is var). NaN where no band
  // is derived (norm outputs, attention logits, a tied head's logits, transformers without norms; ResNets: see
  // scaling/resnet_theory.h).
  double var_log_sd = std::numeric_limits<double>::quiet_NaN();
};

// Where one network's var falls with 95% probability under a finite-width band (ProbeTheory::var_log_sd): log(var)
// ~ N(log(predicted) − sd²/2, sd²), so the range is predicted·exp(−sd²/2 ∓ 1.96·sd). NaN bounds without a band.
struct VarRange {
  double low = 0.0, high = 0.0;
};
VarRange one_network_range(double predicted_var, double var_log_sd);

// Mean-field summary of an MLP (σ_w², σ_b² of the hidden layers).
struct MeanFieldSummary {
  double q_star = 0.0;  // fixed point of the length map (+inf when q diverges)
  double c_star = 0.0;  // the correlation map's fixed point reached from c_0 (1 in the ordered phase)
  double chi1 = 0.0;    // slope of the correlation map at c = 1 (per-layer gradient factor)
  Phase phase = Phase::critical;
  std::vector<MeanFieldLayer> layers;  // q_l, c_l of the pre-activations, l = 0..layers-1
};

struct ProbePrediction {
  std::vector<ProbeTheory> probes;             // the model's probe order
  std::string formulae;                        // which maps were used (stored as the run file's `formulae` attribute)
  std::optional<MeanFieldSummary> mean_field;  // MLPs only

  // The probe with this name, or nullptr.
  const ProbeTheory* find(const std::string& name) const;
  // One line per statistic without a prediction: "name: reason" (the run file's `no_prediction` attribute).
  std::string no_prediction_text() const;
};

// The transformer's probe names in forward order (the same list models/transformer.cpp builds).
std::vector<std::string> transformer_probe_names(const TransformerConfig& config);

// Predictions for every probe of a transformer. Requires numbers.blocks.size() == config.layers.
// Norm placement "both" composes Pre-LN's branch norm with Post-LN's norm after each sum (no final norm).
// With norms (pre, post or both), the finite-width band of the embedding, stream, branch, FFN and untied-head probes
// (var_log_sd): each fresh linear map's weights add 2/units·tr(G²)/tr(G)² (G the Gram matrix of its input rows,
// itself sampled over the stream's width), an activation its units' own spread, and the residual adds carry the
// stream's spread by the share the skip keeps (docs/theory.md, "Finite-width bands", transformers).
ProbePrediction predict_transformer(const TransformerNumbers& numbers, const TheoryInputs& inputs);
// One forward pass over the blocks (no probes, no backward) for rules that set each block from what reaches it:
// at every block l, `adjust(l, var)` gets the predicted variance of the attention branch output (blocks.l.attn.out)
// under the numbers as they are, and may change numbers.blocks[l]; the pass then continues from the block as
// adjusted. (The attention branch variance is proportional to v_std²·attn_out_std² when the branch has no biases.)
void walk_attention_branches(TransformerNumbers& numbers, const TheoryInputs& inputs,
                             const std::function<void(int block, double branch_var)>& adjust);
// Predictions for every probe of an MLP, plus its mean-field summary. c_0 (for the summary) is input_corr or 0.
// MLPs also get the finite-width band of every preact, postact, residual and readout probe (var_log_sd):
// each layer's weights rescale the next layer's pre-activation scale by a random factor whose log has variance
// κ/width (κ from the activation's fourth moments at the layer's variance and sample correlation, averaged over
// the micro-batch), carried through the depth by the slope of the length map (1 for ReLU and linear: Hanin & Nica's
// random walk, 5·l/width for one ReLU input), plus the measurement's own χ² spread. In the residual form the stream
// carries its input's spread by the share the skip and the branch keep, plus the branch variance's own spread and
// the skip–branch cross-covariance's (docs/theory.md, "Finite-width bands").
ProbePrediction predict_mlp(const MlpNumbers& numbers, const TheoryInputs& inputs);

// E[Σ_v p_v²] of the softmax of C independent N(0, spread) logits, to about 0.5% at any spread (not the log-normal
// estimate e^D/(e^D + C − 1), which is 16% high at D = 1 and twice too high at D = 4 with C = 10): with
// 1/(a + R)² = ∫ t·e^{−t(a+R)} dt and E[e^{−tR}] = φ(t)^{C−1} for R the sum of the other C − 1 weights,
// S = C·∫ t²·ψ(t)·φ(t)^{C−1} d(log t), φ(t) = E[exp(−t·e^z)], ψ(t) = E[e^{2z}·exp(−t·e^z)], z ~ N(0, spread).
double softmax_sum_p_sq(double spread, std::int64_t classes);

// E[(ℓ̂·p)²] for the softmax p of C independent N(0, spread) logits ℓ = √spread·ℓ̂: the square of the standardised
// logits' projection on the probabilities (1/C at spread 0, E[max of C normals²] as the softmax saturates). With
// 1/(Σe^ℓ)² = ∫ t·e^{−t·Σe^ℓ} dt it is (C·∫ t²ψ₂φ^{C−1} + C(C − 1)·∫ (tψ₁)²φ^{C−2} d(log t))/spread, ψ₂ =
// E[z²e^{2z}·exp(−t·e^z)], ψ₁ = E[z·e^z·exp(−t·e^z)], φ as for softmax_sum_p_sq. A readout's row sums are correlated
// with its logits, and this is what their correlation carries into the gradient's mean over units (predict_mlp).
double softmax_logit_projection_sq(double spread, std::int64_t classes);

// The share of E[Σ_v p_v²] − 1/C that two rows whose logits correlate by r have in common, E[Σ_v p_iv·p_jv] − 1/C,
// at logit spread D: (e^{rD} − 1)/(e^D − 1) (log-normal weights; exact at r = 0 and r = 1).
double softmax_shared_excess(double r, double spread);

// The same share for r > 0, right at any spread (the log-normal form above holds only while D ≲ 1: at D = 8 and
// r = 0.9 it gives 0.45 where the rows share 0.82): the rows' logits are a shared part N(0, rD) plus their own
// N(0, (1 − r)D), and averaging a softmax over its own part is taken as softening the shared part by
// √(1 + π(1 − r)D/8), so the share is (S(rD/(1 + π(1 − r)D/8)) − 1/C)/(S(D) − 1/C) with S = softmax_sum_p_sq
// (within 5 points of Monte Carlo for C = 10, D ≤ 13000, r ≥ 0.5). r ≤ 0: softmax_shared_excess.
double softmax_shared_excess_blurred(double r, double spread, std::int64_t classes);
// The same with S(D) = softmax_sum_p_sq(spread, classes) already at hand (it is the slow part).
double softmax_shared_excess_blurred(double r, double spread, std::int64_t classes, double sum_p_sq);

// Σ_v n_v·(n_v − 1) over the labels' counts n_v: the ordered pairs of a batch's samples that share a label.
double same_label_pairs(const std::vector<std::int32_t>& labels);

// The variance of d(mean CE loss)/d(logit) over the [rows, classes] logits: with S = E[Σ_v p_v²]
// (softmax_sum_p_sq at the logits' whole variance: a row's classes come from independent weight rows), each row
// contributes Σ_v (p_v - y_v)² = S - 2·E[p_y] + 1 with E[p_y] ≈ 1/C (targets independent of the logits), so
// Var = (S - 2/C + 1)/C / rows² · scale².
double cross_entropy_grad_var(const Signal& logits, std::int64_t classes, std::int64_t rows, double grad_scale);

// The same variance when each row has one outlying logit (a tied head's logit for the row's own input token):
// that logit is N(self_mean, self_var), the other C - 1 are log-normal softmax weights with spread D (variance
// across classes). With a the others' log-mass (log(C - 1) + D/2, or √(2D·log(C - 1)) once D > 2·log(C - 1)),
// p_self = sigmoid(z_self - a) and Σ_{v≠self} p_v² ≈ (1 - p_self)²·e^D/(e^D + C - 2), so
// S = E[p_self² + (1 - p_self)²·e^D/(e^D + C - 2)] over z_self by Gauss-Hermite quadrature; targets independent
// of the logits (E[p_y] = 1/C).
double cross_entropy_grad_var_with_self(double spread, double self_mean, double self_var, std::int64_t classes,
                                        std::int64_t rows, double grad_scale);

}  // namespace proplab::theory
