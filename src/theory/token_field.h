// theory/token_field: position-resolved moment maps for one sequence of L tokens under causal attention.
//
// theory/moments describes a representation by one token correlation r shared by every pair of tokens. Causal
// attention breaks that exchangeability: query t averages the prefix 0..t, so short prefixes (and tokens near
// each other) end up sharing much more than distant ones, and the variance of the next layer's prefix average
// depends on which tokens it averages. A TokenField keeps the whole [L, L] token covariance instead, and the
// whole-model predictions (theory/model_theory) compose these maps along the model.
//
// Conventions (per feature; features are exchangeable and independent, as in theory/moments.h):
// - TokenField: every element has the scalar mean `mean` (μ, averaged over positions); cov(i, j) is the second
//   moment about μ, E[(x_i - μ)(x_j - μ)] for tokens i, j of one sequence. A per-position mean that differs from
//   μ is folded into cov, so var() (the mean of the diagonal) is the population variance over all elements and
//   corr() is exactly what probe/moments records as `corr`.
// - TokenGrad: the gradient's covariance G(i, j) = E[g_i g_j] (mean 0).
// - Elementwise maps act on each pair of tokens through the scalar maps of theory/moments (the pair's variances
//   are equal after a norm; otherwise their geometric mean is used for the cross term).
// - Causal attention at initialisation: query i (n_i = i + 1 keys) spreads its logits over its keys with
//   variance D_i = scale²·d_head·E[q_i²]·spread_k(i) (spread_k(i): the variance of k across keys 0..i), and
//   its softmax weights are log-normal: E[Σ_k w_ik²] = s_i = e^{D_i}/(e^{D_i} + n_i - 1). Two different
//   queries i, j share min(n_i, n_j) keys; on a shared key E[w_ik w_jk] = e^{ρ_ij·√(D_i D_j)}/(n_i n_j) (ρ_ij
//   the queries' correlation, capped so that no pair weight exceeds what the same query gives itself); the
//   other key pairs share what is left of Σ_{k,m} E[w_ik w_jm] = 1.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "models/config.h"
#include "theory/moments.h"

namespace proplab::theory {

struct TokenField {
  std::int64_t length = 0;
  double mean = 0.0;
  std::vector<double> cov;  // [length, length], symmetric

  double at(std::int64_t i, std::int64_t j) const { return cov[static_cast<std::size_t>(i * length + j)]; }
  double& at(std::int64_t i, std::int64_t j) { return cov[static_cast<std::size_t>(i * length + j)]; }
  double var() const;   // mean of the diagonal
  double corr() const;  // (Σ_ij cov - Σ_i cov_ii) / ((L - 1)·Σ_i cov_ii); 1 when the diagonal is 0
  Signal signal() const { return {mean, var(), corr()}; }
  // Every token with variance s.var and every pair with covariance s.corr·s.var.
  static TokenField exchangeable(std::int64_t length, const Signal& s);
};

struct TokenGrad {
  std::int64_t length = 0;
  std::vector<double> cov;  // [length, length], symmetric

  double at(std::int64_t i, std::int64_t j) const { return cov[static_cast<std::size_t>(i * length + j)]; }
  double& at(std::int64_t i, std::int64_t j) { return cov[static_cast<std::size_t>(i * length + j)]; }
  double var() const;
  double corr() const;  // 0 when the diagonal is 0
  GradSignal signal() const { return {var(), corr()}; }
  // Uncorrelated tokens of variance `var`.
  static TokenGrad white(std::int64_t length, double var);
};

// y = W x (+ b): cov' = fan_in·σ_w²·(cov + μ²) + σ_b², μ' = 0.
TokenField linear_forward(const TokenField& x, std::int64_t fan_in, double weight_var, double bias_var = 0.0);
// G' = fan_out·σ_w²·G.
TokenGrad linear_backward(const TokenGrad& d_y, std::int64_t fan_out, double weight_var);

// LayerNorm (over `features`) or RMSNorm per token: each pair through layernorm_forward / rmsnorm_forward.
TokenField norm_forward(NormKind kind, const TokenField& x, std::int64_t features);
// G'(i, j) = G(i, j)/√(σ_i² σ_j²) (LayerNorm; RMSNorm divides by the second moments).
TokenGrad norm_backward(NormKind kind, const TokenField& x, const TokenGrad& d_y);

// A pointwise nonlinearity: the diagonal and each position's mean exactly (theory/moments at that position's
// variance), the cross terms from the pair correlation map at the mean variance (tabulated in θ = arccos r for
// GELU and tanh, closed form for ReLU and identity).
// `tables` keeps the tabulated maps for reuse (every block of a normed model reads the same variance).
class PairMaps;
class ActivationPairMaps {
 public:
  explicit ActivationPairMaps(const GaussHermite& rule);
  ~ActivationPairMaps();
  const GaussHermite& rule() const { return *rule_; }
  // The maps of `kind` at input mean `mean` and variance `var` (built on first use; the last 16 are kept).
  const PairMaps& get(Activation kind, double mean, double var);

 private:
  const GaussHermite* rule_;
  std::vector<std::unique_ptr<PairMaps>> tables_;
};
TokenField activation_forward(Activation kind, const TokenField& x, ActivationPairMaps& tables);
TokenGrad activation_backward(Activation kind, const TokenField& x, const TokenGrad& d_y, ActivationPairMaps& tables);

// Inverted dropout on elements (independent masks): the diagonal gains p·(var + μ²)/(1-p); backward the
// diagonal is divided by (1-p).
TokenField dropout_forward(const TokenField& x, double p);
TokenGrad dropout_backward(const TokenGrad& d_y, double p);

// y = λ·skip + β·branch, skip and branch uncorrelated.
TokenField residual_forward(const TokenField& skip, const TokenField& branch, double lambda, double beta);
// λ²·G + G_branch_in.
TokenGrad residual_backward(const TokenGrad& d_y, const TokenGrad& d_x_branch, double lambda);
TokenGrad scaled(const TokenGrad& g, double factor);

// The expected pair products of the causal softmax weights of one head (see the header comment).
struct CausalWeights {
  std::int64_t length = 0;
  std::vector<double> logit_spread;  // D_i
  std::vector<double> self_sq;       // s_i = E[Σ_k w_ik²]
  std::vector<double> same_key;      // [L, L]: E[w_ik w_jk] for a key k both see
  std::vector<double> other_keys;    // [L, L]: E[w_ik w_jm] for any other key pair (k ≠ m, or a key one lacks)
  double logit_var = 0.0;            // mean over queries of scale²·d_head·E[q_i²]·E[k²] (the logits' variance)
};
// From the query and key fields of one head: scale_sq·head_dim·E[q_i²]·spread_k(i) is query i's logit spread.
CausalWeights causal_weights(const TokenField& q, const TokenField& k, double scale_sq, std::int64_t head_dim);
// out_i = Σ_k w_ik v_k.
TokenField causal_mix_forward(const TokenField& v, const CausalWeights& w);
// d_v_k = Σ_i w_ik d_out_i.
TokenGrad causal_mix_backward(const TokenGrad& d_out, const CausalWeights& w);
// The query and key gradients through the logits (diagonal only: their cross-token covariance is neglected),
// for d_out at the mixed output, the value field v, the query field q, the key field k:
// Var(d_q_i) = scale²·d_head·G_ii·spread_v(i)·s_i(1 - 1/n_i)·spread_k(i),
// Var(d_k_k) = Σ_{i≥k} scale²·d_head·G_ii·spread_v(i)·(s_i/n_i)(1 - 1/n_i)·E[q_i²].
struct ScoreGrads {
  TokenGrad d_q, d_k;
};
ScoreGrads causal_score_backward(const TokenGrad& d_out, const TokenField& v, const TokenField& q, const TokenField& k,
                                 const CausalWeights& w, double scale_sq, std::int64_t head_dim);

}  // namespace proplab::theory
