// theory/token_field: position-resolved moment maps for one sequence of L tokens under causal attention.
//
// theory/moments describes a representation by one token correlation r shared by every pair of tokens. Causal
// attention breaks that exchangeability: query t averages the prefix 0..t, so short prefixes (and tokens near
// each other) end up sharing much more than distant ones, and the variance of the next layer's prefix average
// depends on which tokens it averages. A TokenField keeps the token covariance instead, and the whole-model
// predictions (theory/model_theory) compose these maps along the model.
//
// Positions are grouped into contiguous buckets (TokenLayout): one position per bucket for short sequences (the
// maps are then exact to their assumptions: up to 40 tokens), and for long ones the first positions alone and later
// ones in buckets about 15% as wide as their distance from the start, where the covariance changes slowly. Per bucket
// pair the field keeps the mean covariance, so its cost is O(buckets²) per map instead of O(L²).
//
// Conventions (per feature; features are exchangeable and independent, as in theory/moments.h):
// - TokenField: every element has the scalar mean `mean` (μ, averaged over positions); covariances are second
//   moments about μ, E[(x_i - μ)(x_j - μ)]. A per-position mean that differs from μ is folded into them, so var()
//   is the population variance over all elements and corr() is exactly what probe/moments records as `corr`.
//   cov(a, b), a ≠ b: the mean covariance of a token in bucket a and one in bucket b; cov(a, a): the mean variance
//   of bucket a's tokens; within(a): the mean covariance of two different tokens of bucket a (unused for a
//   one-position bucket).
// - TokenGrad: the gradient's covariances, laid out the same way (mean 0).
// - Elementwise maps act on each pair through the scalar maps of theory/moments (the pair's variances are equal
//   after a norm; otherwise their geometric mean is used for the cross term).
// - Causal attention at initialisation: query i (n_i = i + 1 keys) spreads its logits over its keys with
//   variance D_i = scale²·d_head·E[q_i²]·spread_k(i) (spread_k(i): the variance of k across keys 0..i), and
//   E[Σ_k w_ik²] = s_i is that of n_i i.i.d. N(0, D_i·n_i/(n_i − 1)) logits (softmax_weight_moments; the log-normal
//   estimate e^D/(e^D + n − 1) used before 2026-12-03 is 6–20% high at D = 1 and up to 60% at 2). Two different
//   queries i, j share min(n_i, n_j) keys; on a shared key E[w_ik w_jk] = e^{ρ_ij·√(D_i D_j)}/(n_i n_j) (ρ_ij
//   the queries' correlation, capped by Cauchy–Schwarz at √(E[w_ik²]E[w_jk²])); the other key pairs share what
//   is left of Σ_{k,m} E[w_ik w_jm] = 1. A bucket's queries (and keys) are represented by its middle position.
//   Where the keys' deviations lie mostly along one direction of positions, a query's logits move together along it:
//   the forward mix then conditions on the query's coefficient along that mode (CausalWeights::Mode).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "spec/model.h"
#include "theory/moments.h"

namespace proplab::theory {

struct TokenLayout {
  std::int64_t length = 0;
  std::vector<std::int64_t> start, size;  // contiguous buckets covering 0..length-1 in order

  std::int64_t buckets() const { return static_cast<std::int64_t>(start.size()); }
  // One bucket per position.
  static std::shared_ptr<const TokenLayout> exact(std::int64_t length);
  // Exact up to 40 positions; beyond, positions 0..31 alone and then buckets of ⌈0.15·start⌉ positions.
  static std::shared_ptr<const TokenLayout> for_length(std::int64_t length);
};

// The covariance storage shared by fields and gradients.
struct TokenCov {
  std::shared_ptr<const TokenLayout> layout;
  std::vector<double> cov;     // [buckets, buckets]
  std::vector<double> within;  // [buckets]

  std::int64_t buckets() const { return layout->buckets(); }
  double at(std::int64_t a, std::int64_t b) const { return cov[static_cast<std::size_t>(a * buckets() + b)]; }
  double& at(std::int64_t a, std::int64_t b) { return cov[static_cast<std::size_t>(a * buckets() + b)]; }
  double diag(std::int64_t a) const { return at(a, a); }
  double var() const;  // the mean variance over all positions
  // The mean of every pair's covariance, the diagonal included, (Σ_{i,j} cov(i, j))/L²: per feature, the square
  // of the part the sequence's tokens share (their mean over positions), which is what a common input moves.
  double pair_mean() const;
  // (Σ_{i≠j} cov(i, j)) / ((L - 1)·Σ_i var(i)), or `none` when that is undefined.
  double corr(double none) const;
  static TokenCov filled(std::shared_ptr<const TokenLayout> layout, double var, double covariance);
};

struct TokenField : TokenCov {
  double mean = 0.0;
  // Each bucket's own mean where they differ (an activation's output over positions of unequal variance; empty: every
  // position's mean is `mean`). The covariances stay about `mean`; what reads second moments about zero needs the
  // per-position means: E[x_a x_b] = cov(a, b) + μ·(μ_a + μ_b) − μ² (linear_forward).
  std::vector<double> bucket_mean;
  Signal signal() const { return {mean, var(), corr(1.0)}; }
  // Every token with variance s.var and every pair with covariance s.corr·s.var.
  static TokenField exchangeable(std::shared_ptr<const TokenLayout> layout, const Signal& s);
};

struct TokenGrad : TokenCov {
  GradSignal signal() const { return {var(), corr(0.0)}; }
  // Uncorrelated tokens of variance `var`.
  static TokenGrad white(std::shared_ptr<const TokenLayout> layout, double var);
};

// y = W x (+ b): cov' = fan_in·σ_w²·E[x_a x_b] + σ_b², μ' = 0, with E[x_a x_b] = cov(a, b) + μ² when every position
// has the mean μ and cov(a, b) + μ·(μ_a + μ_b) − μ² with the positions' own means (TokenField::bucket_mean).
TokenField linear_forward(const TokenField& x, std::int64_t fan_in, double weight_var, double bias_var = 0.0);
// G' = fan_out·σ_w²·G.
TokenGrad linear_backward(const TokenGrad& d_y, std::int64_t fan_out, double weight_var);

// LayerNorm (over `features`) or RMSNorm per token, each pair as layernorm_forward / rmsnorm_forward maps it, with
// the norm's ε in the denominator (LayerNorm: a token of feature variance s² ≈ (1 - 1/features)·var keeps
// s²/(s² + ε) of its unit variance; RMSNorm divides by √(second moment + ε)).
TokenField norm_forward(NormKind kind, const TokenField& x, std::int64_t features, double eps = 0.0);
// G'(i, j) = G(i, j)/√((σ_i² + ε)(σ_j² + ε)) (LayerNorm; RMSNorm divides by the second moments + ε).
TokenGrad norm_backward(NormKind kind, const TokenField& x, const TokenGrad& d_y, double eps = 0.0);
// A residual-sum norm's (Post-LN, both) finite-width factor on its backward, per position (docs/theory.md, "A
// stream norm's scale fluctuates"): the norm divides the gradient by its token's σ_t, and σ_t² = |λx_t + βf_t|²/d
// fluctuates over the weights, so E[1/σ_t²] = (1 + V_t)/E[σ_t²] with
//   V_t = (κ_x·a_t² + 4·a_t·b_t + κ_f·b_t²)/d,
// a_t = λ²·Var x_t/Var s_t and b_t = 1 − a_t the skip's and the branch's shares of the sum, κ_x the input's own
// d·Var(|x_t|²)/E[|x_t|²]² (0 for a norm's output, 2 for a Gaussian embedding row) and κ_f the branch output's.
// LayerNorm divides by the token's variance about its own feature mean, (1 − u_t/d) of Var s_t (u_t = b_t when the
// input is a norm's output and centred already, 1 for a Gaussian input, κ_x > 0), and projects out the gradient's
// mean over features, which only the part a branch returned has (its share `mean_share[t]` of the incoming
// gradient: a random linear map leaves 1/d of it along the mean), and nothing along its output token (the network
// above is homogeneous in it). `jensen` receives 1 + V_t; the return value is 1 + V_t + (u_t − mean_share_t)/d
// (LayerNorm) or 1 + V_t (RMSNorm).
std::vector<double> sum_norm_gradient_factors(NormKind kind, const TokenField& input, const TokenField& sum,
                                              double lambda, double input_kappa, double branch_kappa,
                                              std::int64_t features, const std::vector<double>& mean_share,
                                              std::vector<double>* jensen = nullptr);
// Every pair (a, b) of g scaled by √(factor_a·factor_b) (the within-bucket pairs and the diagonal by factor_a).
TokenGrad scale_positions(const TokenGrad& g, const std::vector<double>& factor);
// E[φ(u)⁴]/E[φ(u)²]² for u ~ N(mean, var): how much one unit's square spreads (ReLU at mean 0: 6).
double activation_square_ratio(Activation kind, double mean, double var, const GaussHermite& rule);

// A pointwise nonlinearity: each bucket's variance and mean exactly (theory/moments at that variance), the cross
// terms from the pair correlation map at the mean variance (tabulated in θ = arccos r for GELU and tanh, closed
// form for ReLU and identity). `tables` keeps the tabulated maps for reuse (every block of a normed model reads
// the same variance).
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

// Inverted dropout on elements (independent masks): variances gain p·(var + μ²)/(1-p); backward the variances are
// divided by (1-p).
TokenField dropout_forward(const TokenField& x, double p);
TokenGrad dropout_backward(const TokenGrad& d_y, double p);

// y = λ·skip + β·branch, skip and branch uncorrelated.
TokenField residual_forward(const TokenField& skip, const TokenField& branch, double lambda, double beta);
// λ²·G + G_branch_in.
TokenGrad residual_backward(const TokenGrad& d_y, const TokenGrad& d_x_branch, double lambda);
TokenGrad scaled(const TokenGrad& g, double factor);

// The causal softmax weights of one head for the buckets' representative queries (see the header comment). Per query
// bucket a and key bucket x ≤ a ([buckets, buckets], 0 beyond): one key's mean weight E[w_ak] and mean square weight
// E[w_ak²] and its own logit spread, for independent logits whose spreads are each key's deviation from the prefix's
// mean key (docs/theory.md, "Keys of unequal spread"; equal spreads give 1/n and s/n). Two queries' products
// (causal_mix_forward and causal_mix_backward): E[w_ak w_bk] on a key both read from a threshold model of the two
// weights ("Two queries on one key"), and r_k·c_m·E[w_ak]E[w_bm] on different keys, fitted so that each key's
// products with the other query's keys sum to its mean weight ("Products of two weights").
struct CausalWeights {
  std::shared_ptr<const TokenLayout> layout;
  std::vector<double> key_spread;    // spread_k: the variance of k over the representative query's keys
  std::vector<double> logit_spread;  // D
  // (E[(Σ_k w_k z_k)²] − E[Σ_k w_k²]) and (E[(Σ_k w_k z_k)²] − E[Σ_k w_k² z_k²]) for n i.i.d. logits of spread D, z
  // the standardised logits: causal_mix_forward's finite-width term for Gaussian and fixed-length tokens.
  std::vector<double> aligned_gaussian, aligned_fixed;
  std::vector<double> key_mean, key_sq, key_logit;  // [buckets, buckets]: query bucket × key bucket
  // The threshold model of two queries' weights on one key (pair_products): κ²D/(1 + κ²D), Φ⁻¹(E[w]) and the
  // model's own variance of the weight, per query bucket × key bucket.
  std::vector<double> key_reach, key_threshold, key_self;
  std::vector<double> query_corr;                   // [buckets, buckets]: the queries' correlation ρ_ab
  std::vector<double> query_corr_within;            // two queries of one bucket
  double logit_var = 0.0;  // scale²·d_head·E[q²]·E[k²] (the logits' variance)
  // The keys' leading own mode, for causal_mix_forward (docs/theory.md, "Correlated logits"). A query's logits over
  // its keys are jointly normal, and where the keys' deviations from their prefix's mean lie mostly along one
  // direction of positions they move together. With u the leading eigenvector of the keys' covariance centred over
  // the sequence (eigenvalue λ), query a's logit on key k is m_ak·ξ_a + (the rest, independent per key), m_ak =
  // √(scale²·d_head·E[q_a²]·λ)·(u_k − ū_a) (ū_a: u's mean over a's keys), ξ_a ~ N(0, 1), and two queries' ξ share
  // their correlation ρ_ab. Given ξ the logits are independent with means m_ak·ξ, so the per-key representation
  // carries them. Active when some query's mean m_ak² over its keys reaches kModeLogitVariance; otherwise the
  // independent per-key law above stands alone. Only the forward mix reads it: causal_mix_backward and
  // causal_score_backward keep the independent law (the gradient's own covariance across positions is not what the
  // mode moves; not derived).
  struct Mode {
    bool active = false;
    std::vector<double> nodes, weights;  // the grid of ξ and its normal weights (summing to 1)
    std::vector<double> mean;            // [buckets, buckets]: E[w_ax] = E_ξ[E[w_ax | ξ]]
    // [buckets, nodes, buckets], given ξ_a = node: the per-key law as pair_products reads it (E[w_ax | ξ],
    // E[w_ax² | ξ], and the threshold model's Φ⁻¹ of the first and its own variance at the rest's reach).
    std::vector<double> given, given_sq, given_threshold, given_self;
    std::vector<double> reach;  // [buckets, buckets]: the threshold model's reach at the rest's spread
  } mode;
};
// The mean logit variance along the keys' leading own mode (over a query's keys, at the query with the most) from
// which causal_weights conditions on it. Below it the mode moves little: carried from 0.05, the rows of the accuracy
// table it then reached (the largest other than no-norm `xavier` 0.16, at the embedding's positions) moved by at most
// 0.5% on any probe, and no-norm `xavier`'s block 7 (0.05) by 0.2%; its block 8 (0.33) is where independent logits
// start to miss (E[Σw²] 10% high).
inline constexpr double kModeLogitVariance = 0.25;
// From the query and key fields of one head: scale_sq·head_dim·E[q_i²]·spread_k(i) is query i's logit spread.
CausalWeights causal_weights(const TokenField& q, const TokenField& k, double scale_sq, std::int64_t head_dim);
// Where the values come from, for the finite-width term of causal_mix_forward: the fan-in of the projection that made
// v, k and q from one input x (0: leave the term out), and whether every token of x has the same norm (x leaves a
// norm) rather than a Gaussian one.
struct ValueSource {
  std::int64_t fan_in = 0;
  bool fixed_norm = false;
};
// out_i = Σ_k w_ik v_k, under the keys' leading own mode where `w` carries it (E[w_ak w_bm] then integrated over the
// two queries' mode coefficients; docs/theory.md, "Correlated logits"). With source.fan_in = d > 0, query i's variance
// also gains the part of the values that lies along its logit direction (docs/theory.md, "Values along the logits"):
// its logits are x̃_k·u_i over the keys' own parts x̃_k, and each value feature x̃_k·w shares 1/d of its variance with
// them, so the keys the softmax picks carry larger values. Per query, K_v·(E[(Σ_k w_k z_k)²] − E[Σ_k w_k²])/d for a
// Gaussian x (K_v the values' spread, z the standardised logits); for a normed x, whose tokens' length is fixed, the
// picked keys' other directions are that much shorter and the term is K_v·(E[(Σ_k w_k z_k)²] − E[Σ_k w_k² z_k²])/d. The
// pair terms (two queries' logit directions share their correlation) are left out: under 0.2% of the output's
// covariance at d = 512.
TokenField causal_mix_forward(const TokenField& v, const CausalWeights& w, const ValueSource& source = {});
// d_v_k = Σ_i w_ik d_out_i.
TokenGrad causal_mix_backward(const TokenGrad& d_out, const CausalWeights& w);
// Moments of the softmax weights P over n keys whose logits are i.i.d. N(0, spread): sum_sq = E[Σ_j P_j²] and
// jacobian = E[Σ_j P_j² − 2Σ_j P_j³ + (Σ_j P_j²)²], the trace of E[Cov(ds)]/A for ds_j = P_j(a_j − Σ_m P_m a_m) with
// i.i.d. a_j of variance A (the softmax Jacobian applied to an independent gradient). With
// 1/Z^k = ∫ t^{k−1}e^{−tZ} dt/Γ(k):
//   E[P_1^k] = ∫ t^k ψ_k(t) φ(t)^{n−1} d(log t)/Γ(k),   E[P_1²P_2²] = ∫ t⁴ ψ_2(t)² φ(t)^{n−2} d(log t)/6,
//   φ(t) = E[exp(−t e^z)],   ψ_k(t) = E[e^{kz} exp(−t e^z)],   z ~ N(0, spread).
// Exact up to quadrature: E[ΣP²] within 0.2% of softmax_sum_p_sq's finer grids, both within Monte Carlo's 2% for
// n ≤ 64 and spread ≤ 7. Tabulated in √spread (steps of 0.1 up to 6, linear in between) and cached per n; n may be
// fractional (a bucket's representative query). Beyond √spread = 6 the nearly one-hot weights' asymptotics:
// 1 − E[ΣP²] ∝ 1/√spread from the table's last point, and the Jacobian → (1 − E[ΣP²])/3 with a 1/spread correction
// that meets the table, capped by its value there (docs/theory.md, "Saturated softmax"; within 4.2% of Monte Carlo
// up to √spread = 50 for 8 and 64 keys).
// tilt_sq = E[(Σ_j P_j z_j)²] and self_tilt = E[Σ_j P_j² z_j²] for the standardised logits z_j (logit/√spread):
//   E[(ΣPz)²] = n·∫ t²ψ_zz(t) φ^{n−1} d(log t) + n(n − 1)·∫ (tχ(t))² φ^{n−2} d(log t), over spread,
//   ψ_zz(t) = E[z² e^{2z} exp(−t e^z)],   χ(t) = E[z e^z exp(−t e^z)]   (z here the logit);
// uniform weights give 1/n for both. Beyond the table self_tilt closes its gap to E[z_max²] (its one-hot limit) as
// 1/√spread and tilt_sq's pair part falls as 1/√spread (within 1.5% of Monte Carlo at √spread = 8, 20 and 50, 8 and
// 64 keys).
struct SoftmaxWeightMoments {
  double sum_sq = 1.0, jacobian = 0.0, tilt_sq = 1.0, self_tilt = 1.0;
};
SoftmaxWeightMoments softmax_weight_moments(double keys, double spread);

// The query and key gradients through the logits (variances only: their cross-token covariance is neglected),
// for d_out at the mixed output, the value field v and the query field q (the keys' spread is in `w`):
// Var(d_q_i) = scale²·d_head·G_ii·K_v(i)·J'_i·K_k(i), Var(d_k_k) = Σ_{i≥k} scale²·d_head·G_ii·K_v(i)·(J_i/n_i)·E[q_i²],
// with J_i = softmax_weight_moments(n_i, D_i).jacobian at the logits' spread D_i = scale²·d_head·E[q_i²]·K_k(i), and
// K_v, K_k the variance of the values' and keys' parts that differ between keys (their sample variance over the
// prefix times n/(n − 1)). With `own_structure` the query path reads the tokens' own parts as they are rather than
// as i.i.d. keys (docs/theory.md, "The query path's own parts"): J'_i = (1 + 1/d)·(J_i + tr(ĀCĀC)/K² − tr(Ā²)) +
// (tr(ĀC)/K)²/d, Ā = diag(w̄) − w̄w̄ᵀ over query i's keys, C the values' covariance over them (the keys', queries'
// and values' are the same up to scale: linear maps of one input) and d = `fan_in`, the projections' input width
// (0: the finite-width part left out); without it J'_i = J_i.
struct ScoreGrads {
  TokenGrad d_q, d_k;
};
ScoreGrads causal_score_backward(const TokenGrad& d_out, const TokenField& v, const TokenField& q,
                                 const CausalWeights& w, double scale_sq, std::int64_t head_dim,
                                 std::int64_t fan_in = 0, bool own_structure = true);

}  // namespace proplab::theory
