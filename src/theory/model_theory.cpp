#include "theory/model_theory.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iomanip>
#include <limits>
#include <map>
#include <numbers>
#include <optional>
#include <sstream>
#include <string>

#include "core/error.h"
#include "theory/token_field.h"

namespace proplab::theory {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
// Beyond this logit spread √D (the keys' sample spread, as causal_weights keeps it) a head's softmax rows are nearly
// one-hot, and the expected gradient through queries and keys rests on the rare rows whose top two logits nearly
// tie: those within 16.6 of each other (past which the top weight rounds to 1 in float32) are a fraction of about
// 16.6·f/√D (f ≈ 2.3, the density at 0 of the gap between the top two of 64 standard normals), under 4% here. One
// network's gradient is then heavy-tailed about that expectation, so the backward is not predicted upstream of such
// an attention (docs/theory.md, "Saturated softmax").
constexpr double kSaturatedRoot = 1e3;

double clamp_unit(double r) { return std::clamp(r, -1.0, 1.0); }

class Builder {
 public:
  int add(const std::string& name, const char* kind, int block) {
    ProbeTheory p;
    p.name = name;
    p.kind = kind;
    p.block = block;
    prediction.probes.push_back(p);
    return static_cast<int>(prediction.probes.size()) - 1;
  }
  void set_forward(int probe, const Signal& s) {
    if (probe < 0) return;
    ProbeTheory& p = prediction.probes[probe];
    p.mean = s.mean;
    p.var = s.var;
    p.corr = s.corr;
  }
  void set_backward(int probe, const GradSignal& g) {
    if (probe < 0) return;
    prediction.probes[probe].backward_var = g.var;
    if (token_correlations) prediction.probes[probe].backward_corr = g.corr;
  }
  bool token_correlations = false;  // transformers: the backward maps carry the gradient's token correlation
  int correlated_logits = 0;        // attention sublayers whose weights carry the keys' leading own mode
  ProbePrediction prediction;
};

}  // namespace

VarRange one_network_range(double predicted_var, double var_log_sd) {
  if (!std::isfinite(var_log_sd)) return {kNaN, kNaN};
  const double centre = predicted_var * std::exp(-0.5 * var_log_sd * var_log_sd);
  return {centre * std::exp(-1.96 * var_log_sd), centre * std::exp(1.96 * var_log_sd)};
}

const ProbeTheory* ProbePrediction::find(const std::string& name) const {
  for (const ProbeTheory& p : probes)
    if (p.name == name) return &p;
  return nullptr;
}

std::string ProbePrediction::no_prediction_text() const {
  std::ostringstream out;
  for (const ProbeTheory& p : probes) {
    if (!p.no_forward.empty()) out << p.name << " (forward): " << p.no_forward << "\n";
    if (!p.no_backward.empty()) out << p.name << " (backward): " << p.no_backward << "\n";
  }
  return out.str();
}

std::vector<std::string> transformer_probe_names(const TransformerConfig& config) {
  std::vector<std::string> names;
  const bool pre = norms_branch_input(config.norm), post = norms_residual_sum(config.norm);
  names.push_back("embed.out");
  for (int l = 0; l < config.layers; ++l) {
    const std::string block = "blocks." + std::to_string(l);
    names.push_back(block + ".in");
    if (pre) names.push_back(block + ".attn.norm");
    names.push_back(block + ".attn.logits");
    names.push_back(block + ".attn.out");
    if (post) names.push_back(block + ".attn.sum");
    names.push_back(block + ".mid");
    if (pre) names.push_back(block + ".ffn.norm");
    names.push_back(block + ".ffn.preact");
    names.push_back(block + ".ffn.postact");
    names.push_back(block + ".ffn.out");
    if (post) names.push_back(block + ".ffn.sum");
    names.push_back(block + ".out");
  }
  if (config.norm == NormPlacement::pre) names.push_back("final_norm.out");
  names.push_back("head.logits");
  return names;
}

double same_label_pairs(const std::vector<std::int32_t>& labels) {
  std::map<std::int32_t, double> counts;
  for (std::int32_t y : labels) counts[y] += 1.0;
  double pairs = 0.0;
  for (const auto& [y, n] : counts) pairs += n * (n - 1.0);
  return pairs;
}

namespace {

// The grids softmax_sum_p_sq and softmax_logit_projection_sq integrate on: z ~ N(0, spread) on a trapezoid grid
// over ±9 sd (spacing at most 0.2; w the trapezoid weights times the density), log t on kT points wide enough for
// both ends of ∫ … d(log t) (the integrands go as t²·E[e^{2z}] at small t and die with φ^{C−1} at large t).
struct SoftmaxGrid {
  static constexpr int kT = 1500;
  std::vector<double> z, w;
  double lt_lo = 0.0, dlt = 0.0;
  double log_t(int k) const { return lt_lo + k * dlt; }
  double t_weight(int k) const { return dlt * (k == 0 || k == kT - 1 ? 0.5 : 1.0); }
};

SoftmaxGrid softmax_grid(double spread, double c) {
  SoftmaxGrid g;
  const double sd = std::sqrt(spread);
  const int nz = static_cast<int>(std::clamp(std::ceil(18.0 * sd / 0.2), 401.0, 4001.0));
  const double z_lo = -9.0 * sd, dz = 18.0 * sd / (nz - 1);
  g.z.resize(static_cast<std::size_t>(nz));
  g.w.resize(static_cast<std::size_t>(nz));
  for (int i = 0; i < nz; ++i) {
    g.z[i] = z_lo + i * dz;
    g.w[i] = std::exp(-0.5 * g.z[i] * g.z[i] / spread) / std::sqrt(2.0 * std::numbers::pi * spread) * dz *
             (i == 0 || i == nz - 1 ? 0.5 : 1.0);
  }
  const double lt_hi = std::log(1e3) + 9.0 * sd;
  g.lt_lo = std::log(1e-3) - 9.0 * sd - std::log(c);
  g.dlt = (lt_hi - g.lt_lo) / (SoftmaxGrid::kT - 1);
  return g;
}

}  // namespace

double softmax_sum_p_sq(double spread, std::int64_t classes) {
  PROPLAB_CHECK(classes > 0 && spread >= 0.0, "softmax_sum_p_sq: needs classes > 0 and spread >= 0, got ", classes,
                " and ", spread);
  const double c = static_cast<double>(classes);
  if (classes == 1) return 1.0;
  if (spread < 1e-12) return 1.0 / c;
  // With u = log t + z every term is exp(2u − e^u) or exp(−e^u), which neither overflows nor loses the peak.
  const SoftmaxGrid g = softmax_grid(spread, c);
  double total = 0.0;
  for (int k = 0; k < SoftmaxGrid::kT; ++k) {
    const double lt = g.log_t(k);
    double phi = 0.0, t2_psi = 0.0;
    for (std::size_t i = 0; i < g.z.size(); ++i) {
      const double u = lt + g.z[i];
      if (u > 700.0) continue;  // exp(−e^u) = 0
      const double e = std::exp(u);
      phi += g.w[i] * std::exp(-e);
      t2_psi += g.w[i] * std::exp(2.0 * u - e);
    }
    if (phi <= 0.0) continue;
    total += t2_psi * std::exp((c - 1.0) * std::log(phi)) * g.t_weight(k);
  }
  return std::clamp(c * total, 1.0 / c, 1.0);
}

double softmax_logit_projection_sq(double spread, std::int64_t classes) {
  PROPLAB_CHECK(classes > 0 && spread >= 0.0, "softmax_logit_projection_sq: needs classes > 0 and spread >= 0, got ",
                classes, " and ", spread);
  const double c = static_cast<double>(classes);
  if (classes == 1) return 1.0;
  if (spread < 1e-12) return 1.0 / c;  // p = 1/C: ℓ̂·p is the mean of C standard normals
  // E[(ℓ·p)²] = ∫ t·E[(Σ_c ℓ_c·e^{ℓ_c})²·e^{−t·Σ e^ℓ}] dt over independent classes: C·ψ₂·φ^{C−1} +
  // C(C − 1)·ψ₁²·φ^{C−2}, with ψ₂ = E[z²·e^{2z}·exp(−t·e^z)], ψ₁ = E[z·e^z·exp(−t·e^z)], φ = E[exp(−t·e^z)],
  // z ~ N(0, D); on softmax_sum_p_sq's grids (u = log t + z keeps every term finite).
  const SoftmaxGrid g = softmax_grid(spread, c);
  double total = 0.0;
  for (int k = 0; k < SoftmaxGrid::kT; ++k) {
    const double lt = g.log_t(k);
    double phi = 0.0, psi1 = 0.0, psi2 = 0.0;
    for (std::size_t i = 0; i < g.z.size(); ++i) {
      const double u = lt + g.z[i];
      if (u > 700.0) continue;
      const double e = std::exp(u);
      phi += g.w[i] * std::exp(-e);
      psi1 += g.w[i] * g.z[i] * std::exp(u - e);
      psi2 += g.w[i] * g.z[i] * g.z[i] * std::exp(2.0 * u - e);
    }
    if (phi <= 0.0) continue;
    const double term = c * psi2 * std::exp((c - 1.0) * std::log(phi)) +
                        c * (c - 1.0) * psi1 * psi1 * std::exp((c - 2.0) * std::log(phi));
    total += term * g.t_weight(k);
  }
  return total / spread;
}

double softmax_shared_excess_blurred(double r, double spread, std::int64_t classes) {
  return softmax_shared_excess_blurred(r, spread, classes, softmax_sum_p_sq(spread, classes));
}

double softmax_shared_excess_blurred(double r, double spread, std::int64_t classes, double sum_p_sq) {
  r = std::clamp(r, -1.0, 1.0);
  if (r <= 0.0 || !(spread > 1e-12)) return softmax_shared_excess(r, spread);
  // Two rows' logits are a shared part a ~ N(0, rD) plus their own δ ~ N(0, (1 − r)D): E[Σ p_i·p_j] = E_a[Σ q_v²]
  // with q = E_δ[softmax(a + δ)], taken as softmax(a/√(1 + π(1 − r)D/8)) (the probit approximation of a logistic
  // averaged over Gaussian noise).
  const double c = static_cast<double>(classes);
  const double whole = sum_p_sq - 1.0 / c;
  if (!(whole > 0.0)) return r;
  const double blurred = r * spread / (1.0 + std::numbers::pi * (1.0 - r) * spread / 8.0);
  return std::clamp((softmax_sum_p_sq(blurred, classes) - 1.0 / c) / whole, 0.0, 1.0);
}

double softmax_shared_excess(double r, double spread) {
  r = std::clamp(r, -1.0, 1.0);
  if (!(spread > 1e-12)) return r;
  // (e^{rD} − 1)/(e^D − 1) in a form that neither overflows nor cancels at any D > 0.
  const double whole = -std::expm1(-spread);  // (e^D − 1)·e^{−D}
  return r > 0.0 ? std::exp((r - 1.0) * spread) * -std::expm1(-r * spread) / whole
                 : std::expm1(r * spread) * std::exp(-spread) / whole;
}

double cross_entropy_grad_var(const Signal& logits, std::int64_t classes, std::int64_t rows, double grad_scale) {
  PROPLAB_CHECK(classes > 1 && rows > 0, "cross_entropy_grad_var: needs classes > 1 and rows > 0");
  const double c = static_cast<double>(classes), r = static_cast<double>(rows);
  // Within one row the C logits are products with independent weight rows, so their spread across classes is the
  // whole variance: what the rows share (logits.corr, through the stream's mean or the tokens' correlation) is
  // shared across rows, not across a row's classes. (Attention's softmax differs: a query's logits share the
  // keys' common part, which it ignores.)
  const double sum_p_sq = softmax_sum_p_sq(logits.var, classes);
  return (sum_p_sq - 2.0 / c + 1.0) / c / (r * r) * grad_scale * grad_scale;
}

namespace {

// E[Σ_v p_v²], E[p_self²] and E[p_self] for one self logit N(self_mean, self_var) among C - 1 log-normal weights of
// spread D: the others' log-mass is the random-energy estimate log(C - 1) + D/2 (√D < √(2 log(C - 1))), else
// √D·√(2 log(C - 1)); among themselves they have Σq² = e^D/(e^D + C - 2), so Σ_{v≠self} p_v² = (1 - p_self)²·Σq².
struct SelfLogitMoments {
  double sum_p_sq = 0.0, self_p_sq = 0.0, self_p = 0.0;
};

SelfLogitMoments self_logit_moments(double spread, double self_mean, double self_var, double classes) {
  const double others = classes - 1.0;
  const double log_others = std::log(others);
  const double others_log_mass =
      spread < 2.0 * log_others ? log_others + spread / 2.0 : std::sqrt(spread) * std::sqrt(2.0 * log_others);
  const double growth = std::exp(std::min(spread, 700.0));
  const double others_sq = others > 1.0 ? growth / (growth + others - 1.0) : 1.0;
  const GaussHermite rule(64);
  // sigmoid(t) and 1 - sigmoid(t) without overflow.
  auto split = [&](double z, double& p_self, double& p_rest) {
    const double t = z - others_log_mass;
    const double e = std::exp(-std::abs(t));
    const double big = 1.0 / (1.0 + e), small = e / (1.0 + e);
    p_self = t >= 0 ? big : small;
    p_rest = t >= 0 ? small : big;
  };
  const double std_dev = std::sqrt(self_var);
  SelfLogitMoments m;
  m.sum_p_sq = rule.expect(
      [&](double z) {
        double p_self = 0.0, p_rest = 0.0;
        split(z, p_self, p_rest);
        return p_self * p_self + others_sq * p_rest * p_rest;
      },
      self_mean, std_dev);
  m.self_p_sq = rule.expect(
      [&](double z) {
        double p_self = 0.0, p_rest = 0.0;
        split(z, p_self, p_rest);
        return p_self * p_self;
      },
      self_mean, std_dev);
  m.self_p = rule.expect(
      [&](double z) {
        double p_self = 0.0, p_rest = 0.0;
        split(z, p_self, p_rest);
        return p_self;
      },
      self_mean, std_dev);
  return m;
}

}  // namespace

double cross_entropy_grad_var_with_self(double spread, double self_mean, double self_var, std::int64_t classes,
                                        std::int64_t rows, double grad_scale) {
  PROPLAB_CHECK(classes > 1 && rows > 0, "cross_entropy_grad_var_with_self: needs classes > 1 and rows > 0");
  PROPLAB_CHECK(spread >= 0.0 && self_var >= 0.0, "cross_entropy_grad_var_with_self: needs spread, self_var >= 0");
  const double c = static_cast<double>(classes), r = static_cast<double>(rows);
  const SelfLogitMoments m = self_logit_moments(spread, self_mean, self_var, c);
  return (m.sum_p_sq - 2.0 / c + 1.0) / c / (r * r) * grad_scale * grad_scale;
}

namespace {

// One sublayer (attention or FFN with its residual add and, for post and both, its norm after the sum) at the field
// level: what the backward pass reads, and the probes it fills. Throughout, `pre` means a norm on the branch's input
// (pre, both) and `post` a norm after the sum (post, both): "both" composes the two, and no final norm.
struct Sublayer {
  TokenField input;   // x entering the sublayer
  TokenField hidden;  // FFN pre-activation
  TokenField v, q;    // attention projections the backward pass reads
  CausalWeights weights;
  TokenField sum;           // post, both: λx + βf before the norm
  TokenField out;           // the stream after the sublayer
  double branch_var = 0.0;  // the branch output's variance (after dropout), as its probe records it
  // Kept only by the probed forward pass (the finite-width bands read them): the branch's input (after the norm
  // for pre and both), the input of its output projection (attention: the mixed values; FFN: the activation) and its
  // output.
  TokenField branch_in, mixed, branch;
};

struct SublayerProbes {
  int input = -1, norm = -1, hidden = -1, mixed = -1, branch = -1, sum = -1, result = -1;
};

// The forward pass of sublayer `index` (2l: block l's attention, 2l + 1: its FFN) from the stream x. When
// `builder` is given, the probes are added to it and their forward statistics set. `without_branch_norm`: the branch
// reads x itself even where a norm on its input exists (the common-part terms of "both",
// common_part_without_branch_norm).
Sublayer sublayer_forward(const TransformerNumbers& numbers, int index, const TokenField& x, ActivationPairMaps& rule,
                          Builder* builder, SublayerProbes* probes, bool without_branch_norm = false) {
  const TransformerConfig& c = numbers.config;
  const std::int64_t d = c.width, f = static_cast<std::int64_t>(c.ffn_mult) * c.width, head_dim = d / c.heads;
  const bool pre = norms_branch_input(c.norm) && !without_branch_norm, post = norms_residual_sum(c.norm);
  const int l = index / 2;
  const bool attention = index % 2 == 0;
  const TransformerBlockNumbers& bn = numbers.blocks[static_cast<std::size_t>(l)];
  const std::string block = "blocks." + std::to_string(l);
  const std::string prefix = block + (attention ? ".attn" : ".ffn");
  auto add = [&](int& slot, const std::string& name, const char* kind, const TokenField* field) {
    if (!builder) return;
    slot = builder->add(name, kind, l);
    if (field) builder->set_forward(slot, field->signal());
  };
  SublayerProbes local;
  SublayerProbes& p = probes ? *probes : local;
  Sublayer s;
  s.input = x;
  if (attention) add(p.input, block + ".in", "residual", &x);
  TokenField branch_in = x;
  if (pre) {
    branch_in = norm_forward(c.norm_kind, x, d, c.norm_eps);
    add(p.norm, prefix + ".norm", "norm", &branch_in);
  }
  TokenField branch;
  if (attention) {
    const double bias_var = bn.qkv_bias_std * bn.qkv_bias_std;
    s.q = linear_forward(branch_in, d, bn.q_std * bn.q_std, bias_var);
    const TokenField k = linear_forward(branch_in, d, bn.k_std * bn.k_std, bias_var);
    s.v = linear_forward(branch_in, d, bn.v_std * bn.v_std, bias_var);
    const double scale_sq = numbers.logit_scale * numbers.logit_scale;
    s.weights = causal_weights(s.q, k, scale_sq, head_dim);
    if (builder && s.weights.mode.active) ++builder->correlated_logits;
    if (builder) {
      p.hidden = builder->add(prefix + ".logits", "logits", l);
      builder->set_forward(p.hidden, Signal{0.0, s.weights.logit_var, kNaN});
      ProbeTheory& t = builder->prediction.probes[static_cast<std::size_t>(p.hidden)];
      t.no_forward = "corr: the token correlation of attention logits is not recorded";
      t.backward_var = kNaN;
      t.no_backward = "the logits' gradient stays inside the fused attention op";
    }
    // The input's tokens have a fixed length after a norm: the branch norm's output, or a stream normed after the
    // sum below (above the embedding).
    TokenField mixed = causal_mix_forward(s.v, s.weights, ValueSource{d, pre || (post && index > 0)});
    branch = linear_forward(mixed, d, bn.attn_out_std * bn.attn_out_std, bn.attn_out_bias_std * bn.attn_out_bias_std);
    if (builder) s.mixed = std::move(mixed);
  } else {
    s.hidden = linear_forward(branch_in, d, bn.ffn_in_std * bn.ffn_in_std, bn.ffn_in_bias_std * bn.ffn_in_bias_std);
    add(p.hidden, prefix + ".preact", "preact", &s.hidden);
    TokenField mixed = activation_forward(c.activation, s.hidden, rule);
    add(p.mixed, prefix + ".postact", "postact", &mixed);
    branch = linear_forward(mixed, f, bn.ffn_out_std * bn.ffn_out_std, bn.ffn_out_bias_std * bn.ffn_out_bias_std);
    if (builder) s.mixed = std::move(mixed);
  }
  if (c.dropout > 0) branch = dropout_forward(branch, c.dropout);
  s.branch_var = branch.var();
  add(p.branch, prefix + ".out", "branch", &branch);
  if (builder) {
    s.branch_in = std::move(branch_in);
    s.branch = branch;
  }
  const ResidualNumbers& rn = attention ? bn.attn_residual : bn.ffn_residual;
  s.out = residual_forward(x, branch, rn.lambda, rn.beta);
  if (post) {
    s.sum = std::move(s.out);
    add(p.sum, prefix + ".sum", "residual", &s.sum);
    s.out = norm_forward(c.norm_kind, s.sum, d, c.norm_eps);
  }
  add(p.result, block + (attention ? ".mid" : ".out"), "residual", &s.out);
  return s;
}

// m_a = (1/L)·Σ_j cov(i, j) for a position i of bucket a: its covariance with the sequence's mean over the tokens
// (about the field's scalar mean).
std::vector<double> row_means(const TokenCov& x) {
  const TokenLayout& layout = *x.layout;
  const std::int64_t p = x.buckets();
  std::vector<double> out(static_cast<std::size_t>(p), 0.0);
  for (std::int64_t a = 0; a < p; ++a) {
    const std::size_t ia = static_cast<std::size_t>(a);
    double row = x.diag(a) + (static_cast<double>(layout.size[ia]) - 1.0) * x.within[ia];
    for (std::int64_t b = 0; b < p; ++b)
      if (b != a) row += static_cast<double>(layout.size[static_cast<std::size_t>(b)]) * x.at(a, b);
    out[ia] = row / static_cast<double>(layout.length);
  }
  return out;
}

// Whether the common-part terms of sublayer `index` (branch_common_gain, norm_removal) leave its branch norm out:
// under "both" above the first sublayer the branch's input x is already the output of the norm below, which at
// initialisation (unit gains, zero shifts) the branch norm maps to itself (up to ε), so the forward is Post-LN's;
// the two Jacobians differ only along each token's own x̂_t, which the norm below projects out of the gradient in
// either case, so below that norm the gradient is Post-LN's too. Post-LN's terms (Γ through the bare branch and the
// norm below's removal of Σ_t (J x)_t) are derived and measured for exactly that; composed through the branch norm
// the same gradient is split differently between Γ (smaller by the norm's projection) and the removal (whose response
// term vanishes), and the pieces do not cancel within the approximations (docs/theory.md, "Both norms").
bool common_part_without_branch_norm(const TransformerConfig& c, int index) {
  return c.norm == NormPlacement::both && index > 0;
}

// Whether two fields are the same bit for bit (layout object, mean and every covariance).
bool same_bits(const TokenField& a, const TokenField& b) {
  auto same = [](const std::vector<double>& u, const std::vector<double>& v) {
    return u.size() == v.size() && std::memcmp(u.data(), v.data(), u.size() * sizeof(double)) == 0;
  };
  return a.layout == b.layout && std::bit_cast<std::uint64_t>(a.mean) == std::bit_cast<std::uint64_t>(b.mean) &&
         same(a.cov, b.cov) && same(a.within, b.within);
}

// The square of the part every token of the field shares, per feature: the pair mean plus the mean's square.
double common_square(const TokenField& x) { return x.pair_mean() + x.mean * x.mean; }

// A norm's backward on the per-position coefficients of sublayer_backward's `aligned`: each divided by its
// position's scale, as norm_backward divides the covariance.
void divide_by_norm_scale(NormKind kind, const TokenField& x, double eps, std::vector<double>& alpha) {
  const double shift = (kind == NormKind::layernorm ? 0.0 : x.mean * x.mean) + eps;
  for (std::int64_t a = 0; a < x.buckets(); ++a) {
    const double second = x.diag(a) + shift;
    alpha[static_cast<std::size_t>(a)] = second > 0.0 ? alpha[static_cast<std::size_t>(a)] / std::sqrt(second) : 0.0;
  }
}

// Σ_{i ≥ j} α_i/(i + 1) for each position j, averaged over each bucket's positions (α per bucket): what the causal
// value path collects at key j from a gradient α_i shared by the queries, with E[w_ij] ≈ 1/(i + 1).
std::vector<double> causal_column_sums(const TokenLayout& layout, const std::vector<double>& alpha) {
  const std::int64_t length = layout.length;
  std::vector<double> per_position(static_cast<std::size_t>(length));
  for (std::int64_t a = 0; a < layout.buckets(); ++a)
    for (std::int64_t j = layout.start[static_cast<std::size_t>(a)];
         j < layout.start[static_cast<std::size_t>(a)] + layout.size[static_cast<std::size_t>(a)]; ++j)
      per_position[static_cast<std::size_t>(j)] = alpha[static_cast<std::size_t>(a)];
  double tail = 0.0;
  for (std::int64_t i = length - 1; i >= 0; --i) {
    tail += per_position[static_cast<std::size_t>(i)] / static_cast<double>(i + 1);
    per_position[static_cast<std::size_t>(i)] = tail;
  }
  std::vector<double> out(alpha.size(), 0.0);
  for (std::int64_t a = 0; a < layout.buckets(); ++a) {
    const std::size_t ia = static_cast<std::size_t>(a);
    for (std::int64_t j = layout.start[ia]; j < layout.start[ia] + layout.size[ia]; ++j)
      out[ia] += per_position[static_cast<std::size_t>(j)];
    out[ia] /= static_cast<double>(layout.size[ia]);
  }
  return out;
}

// β²·Γ of sublayer `index` (docs/theory.md, "The gradient along the stream's common part"): Γ = (J̄ĉ)·F̄/|c|, the
// branch's mean output F̄ read along its response to a shift of every token along the common direction ĉ, is
// ½·d|F̄|²/dε per unit of |c|, i.e. the change of the branch output's pair mean per change of the input's under that
// shift: a shift ε·ĉ moves cov(i, j) by ε·(m_i + m_j)/|c| (m_i = (1/L)·Σ_j cov(i, j)) and the pair mean by
// 2ε·|c|/width. Computed by the forward maps themselves (a Pre-LN branch's norm, the attention weights' and the
// activation's response included): the sublayer once more on the input so moved, its sum's pair mean less λ² times
// the input's.
// `rows`: row_means(s.input). `unmoved`: the sublayer at s.input as the move is taken (s, or under "both" s without
// its branch norm, common_part_without_branch_norm).
double branch_common_gain(const TransformerNumbers& numbers, int index, const Sublayer& s, const Sublayer& unmoved,
                          const std::vector<double>& rows, ActivationPairMaps& rule) {
  const TransformerConfig& c = numbers.config;
  const TransformerBlockNumbers& bn = numbers.blocks[static_cast<std::size_t>(index / 2)];
  const ResidualNumbers& rn = index % 2 == 0 ? bn.attn_residual : bn.ffn_residual;
  const double common = s.input.pair_mean();
  if (!(common > 0.0) || !(rn.beta > 0.0)) return 0.0;
  const double step = 1e-4;  // relative to the pair mean
  TokenField moved = s.input;
  for (std::int64_t a = 0; a < moved.buckets(); ++a) {
    const std::size_t ia = static_cast<std::size_t>(a);
    for (std::int64_t b = 0; b < moved.buckets(); ++b)
      moved.at(a, b) += step * (rows[ia] + rows[static_cast<std::size_t>(b)]);
    moved.within[ia] += 2.0 * step * rows[ia];
  }
  const bool bare = common_part_without_branch_norm(c, index);
  const Sublayer t = sublayer_forward(numbers, index, moved, rule, nullptr, nullptr, bare);
  const bool post = norms_residual_sum(c.norm);
  const TokenField& before = post ? unmoved.sum : unmoved.out;
  const TokenField& after = post ? t.sum : t.out;
  const double moved_in = moved.pair_mean() - common;
  const double moved_out = after.pair_mean() + after.mean * after.mean - before.pair_mean() - before.mean * before.mean;
  return std::max(0.0, moved_out / moved_in - rn.lambda * rn.lambda);
}

// Post-LN: what the stream norm below sublayer `index` (whose output is the sublayer's input x) removes from the
// part α·ĉ (docs/theory.md, "The gradient along the stream's common part", "The norm below removes a little").
// Norm(·)'s backward takes out each token's projection on its own output, (g_t·x_t)·x_t/d, which gradient
// independence takes as zero. With the norm above the sum s = λx + β·F(x), g_s ⟂ s_t per token, so
// g_t·x_t = β·((Jᵀg_s)_t·x_t − g_s,t·F_t), whose sum over the tokens vanishes for a branch homogeneous of degree 1
// (Euler) but not for GELU or the softmax. For the part α'·ĉ_s of g_s, with ĉ_s holding β·F̄/|c_s|, that sum is
// β²·(½·dC_F/dε − C_F)·d/|c_s| per unit of α' (ε a relative scaling of every input token, C_F the branch output's
// pair mean), and x_t·ĉ/d = m_t/|c| (m_t = row_means plus the mean's square), so α at x loses
// β²·(½·dC_F/dε − C_F)·m_t/√(C_x·C_s) per unit. The scaling response is the key side (the value path collects it
// at the keys, `collected`), the branch's own output the query side (α'_t). Returns the amount to subtract from α
// at x, per bucket. The step, 10⁻³, is well above the variance tolerance within which ActivationPairMaps reuses a
// table, so the activation's pair maps are rebuilt at the scaled input.
std::vector<double> norm_removal(const TransformerNumbers& numbers, int index, const Sublayer& s,
                                 const Sublayer& unmoved, const std::vector<double>& rows, const std::vector<double>& alpha,
                                 const std::vector<double>& collected, double common_in, double common_out,
                                 double lambda_sq, ActivationPairMaps& rule) {
  const double step = 1e-3;  // relative scaling of the input
  TokenField grown = s.input;
  const double factor = (1.0 + step) * (1.0 + step);
  for (double& v : grown.cov) v *= factor;
  for (double& v : grown.within) v *= factor;
  grown.mean *= 1.0 + step;
  const bool bare = common_part_without_branch_norm(numbers.config, index);
  const Sublayer t = sublayer_forward(numbers, index, grown, rule, nullptr, nullptr, bare);
  const double grown_out = common_square(t.sum);
  // (under "both" the ungrown sublayer without its branch norm too, so that both sides differ by the scaling alone)
  const double base_out = bare ? common_square(unmoved.sum) : common_out;
  const double own = base_out - lambda_sq * common_in;                                        // β²·C_F
  const double response = (grown_out - factor * lambda_sq * common_in - own) / (2.0 * step);  // β²·½·dC_F/dε
  const double shared = s.input.mean * s.input.mean;
  std::vector<double> removed(alpha.size(), 0.0);
  const double unit = 1.0 / std::sqrt(common_in * common_out);
  for (std::size_t a = 0; a < alpha.size(); ++a)
    removed[a] = (rows[a] + shared) * unit * (response * collected[a] - own * alpha[a]);
  return removed;
}

// The backward pass of one sublayer: g arrives at its output; returns the gradient at its input. `norm_reads`
// (Post-LN's last sublayer): what its norm's backward reads in place of g_out (loss_gradient: g_out less a tied
// head's removed self direction; g_out itself otherwise).
//
// `aligned` (in/out, per bucket): α_t, the part α_t·ĉ of the gradient at position t that points along the
// stream's common part ĉ, seeded by a tied head's first norm (loss_gradient). Gradient independence treats it
// like any other part; but ĉ at the sublayer's output contains the branch's own mean output βF̄, so the branch's
// backward returns a part along the skip's: ĉ_sᵀJᵀĉ_s ≈ λβ·Γ·C_x/C_s (Γ = (J̄ĉ)·F̄/|c|, branch_common_gain; C the
// pair means of the input and of the sum). The branch collects α at position t as w_t = α_t (FFN) or
// Σ_{i ≥ t} α_i/(i + 1) (attention's value path, which sums every later query's gradient at key t); the skip and
// the branch then add λ²β²·Γ·(C_x/C_s)·(α_i·w_j + α_j·w_i) to the gradient's covariance of positions i and j, and
// α_t reaches the input as √(C_x/C_s)·(λ²·α_t + β²·Γ·w_t), less (Post-LN, `norm_removes_part`) what the stream
// norm below removes (norm_removal) (docs/theory.md, "The gradient along the stream's common part").
//
// `mean_share` (in/out, per bucket; used with `scale_spread`, Post-LN and both): the share of g_out's variance that a
// branch's input map returned, the only part with a mean over features for a stream norm to project out; on return,
// the share of the input gradient's (sum_norm_gradient_factors).
TokenGrad sublayer_backward(const TransformerNumbers& numbers, int index, const Sublayer& s, const TokenGrad& g_out,
                            const TokenGrad* norm_reads, std::vector<double>* aligned, bool norm_removes_part,
                            bool scale_spread, std::vector<double>& mean_share, ActivationPairMaps& rule, Builder& b,
                            const SublayerProbes& p) {
  const TransformerConfig& c = numbers.config;
  const std::int64_t d = c.width, f = static_cast<std::int64_t>(c.ffn_mult) * c.width, head_dim = d / c.heads;
  const bool pre = norms_branch_input(c.norm), post = norms_residual_sum(c.norm);
  const bool attention = index % 2 == 0;
  const TransformerBlockNumbers& bn = numbers.blocks[static_cast<std::size_t>(index / 2)];
  b.set_backward(p.result, g_out.signal());
  TokenGrad d_combined = g_out;
  const ResidualNumbers& rn = attention ? bn.attn_residual : bn.ffn_residual;
  if (post) {
    d_combined = norm_backward(c.norm_kind, s.sum, norm_reads ? *norm_reads : g_out, c.norm_eps);
    if (aligned) divide_by_norm_scale(c.norm_kind, s.sum, c.norm_eps, *aligned);
    if (scale_spread) {
      // κ_f: the output projection's own 2 (a fresh map of d outputs), plus the value projection's 2 (attention) or
      // the hidden units' spread of their squares, (E[φ⁴]/E[φ²]² − 1)/ffn_mult (FFN); the first sublayer reads the
      // embedding, whose rows are Gaussian (κ_x = 2), every other a norm's output (κ_x = 0). The first attention's
      // values mix many embedding rows, whose norms' own spread (at most 2/d more in κ_f) is left out.
      const double branch_kappa =
          attention ? 4.0
                    : 2.0 + (activation_square_ratio(c.activation, s.hidden.mean, s.hidden.var(), rule.rule()) - 1.0) /
                                static_cast<double>(c.ffn_mult);
      std::vector<double> jensen;
      const std::vector<double> factor = sum_norm_gradient_factors(
          c.norm_kind, s.input, s.sum, rn.lambda, index == 0 ? 2.0 : 0.0, branch_kappa, d, mean_share, &jensen);
      d_combined = scale_positions(d_combined, factor);
      // The part along the common direction (mean-free) shares the scale's fluctuation, not the mean's removal.
      if (aligned)
        for (std::size_t a = 0; a < aligned->size(); ++a) (*aligned)[a] *= std::sqrt(jensen[a]);
    }
    b.set_backward(p.sum, d_combined.signal());
  }
  TokenGrad d_branch = scaled(d_combined, rn.beta * rn.beta);
  b.set_backward(p.branch, d_branch.signal());
  if (c.dropout > 0) d_branch = dropout_backward(d_branch, c.dropout);
  TokenGrad d_branch_in;
  if (attention) {
    const TokenGrad d_mixed = linear_backward(d_branch, d, bn.attn_out_std * bn.attn_out_std);
    const double scale_sq = numbers.logit_scale * numbers.logit_scale;
    const TokenGrad d_v = causal_mix_backward(d_mixed, s.weights);
    const ScoreGrads score = causal_score_backward(d_mixed, s.v, s.q, s.weights, scale_sq, head_dim, d);
    d_branch_in = linear_backward(d_v, d, bn.v_std * bn.v_std);
    const double q_gain = static_cast<double>(d) * bn.q_std * bn.q_std,
                 k_gain = static_cast<double>(d) * bn.k_std * bn.k_std;
    for (std::int64_t a = 0; a < d_branch_in.buckets(); ++a)
      d_branch_in.at(a, a) += q_gain * score.d_q.diag(a) + k_gain * score.d_k.diag(a);
  } else {
    const TokenGrad d_mixed = linear_backward(d_branch, d, bn.ffn_out_std * bn.ffn_out_std);
    b.set_backward(p.mixed, d_mixed.signal());
    const TokenGrad d_hidden = activation_backward(c.activation, s.hidden, d_mixed, rule);
    b.set_backward(p.hidden, d_hidden.signal());
    d_branch_in = linear_backward(d_hidden, f, bn.ffn_in_std * bn.ffn_in_std);
  }
  if (pre) {
    b.set_backward(p.norm, d_branch_in.signal());
    d_branch_in = norm_backward(c.norm_kind, s.input, d_branch_in, c.norm_eps);
  }
  TokenGrad g = residual_backward(d_combined, d_branch_in, rn.lambda);
  // What the stream norm below sees of a mean over features: the branch's return, unless a LayerNorm on the
  // branch's input projected it out; the skip carries d_combined, which this sublayer's own LayerNorm left mean-free.
  if (scale_spread)
    for (std::int64_t a = 0; a < g.buckets(); ++a)
      mean_share[static_cast<std::size_t>(a)] =
          (pre && c.norm_kind == NormKind::layernorm) || g.diag(a) <= 0.0 ? 0.0 : d_branch_in.diag(a) / g.diag(a);
  if (aligned) {
    const TokenField& summed = post ? s.sum : s.out;
    const double common_in = common_square(s.input), common_out = common_square(summed);
    const double ratio = common_in > 0.0 && common_out > 0.0 ? common_in / common_out : 0.0;
    const double lambda_sq = rn.lambda * rn.lambda;
    const std::vector<double> rows = row_means(s.input);
    // Under "both" above the first sublayer the common-part terms read the sublayer without its branch norm
    // (common_part_without_branch_norm): computed once here for both of them.
    const Sublayer bare = ratio > 0.0 && common_part_without_branch_norm(c, index)
                              ? sublayer_forward(numbers, index, s.input, rule, nullptr, nullptr, true)
                              : Sublayer();
    const Sublayer& unmoved = common_part_without_branch_norm(c, index) ? bare : s;
    const double branch = ratio > 0.0 ? branch_common_gain(numbers, index, s, unmoved, rows, rule) : 0.0;
    std::vector<double>& alpha = *aligned;
    const std::vector<double> collected = attention ? causal_column_sums(*g.layout, alpha) : alpha;
    const double cross = lambda_sq * branch * ratio;
    for (std::int64_t a = 0; a < g.buckets(); ++a) {
      const std::size_t ia = static_cast<std::size_t>(a);
      for (std::int64_t bb = 0; bb < g.buckets(); ++bb) {
        const std::size_t ib = static_cast<std::size_t>(bb);
        g.at(a, bb) += cross * (alpha[ia] * collected[ib] + alpha[ib] * collected[ia]);
      }
      g.within[ia] += cross * 2.0 * alpha[ia] * collected[ia];
    }
    // Post-LN and both: the input is the norm's output below (the first sublayer's is the embedding's); under both
    // the terms are Post-LN's there (common_part_without_branch_norm).
    const std::vector<double> removed =
        post && index > 0 && norm_removes_part && ratio > 0.0
            ? norm_removal(numbers, index, s, unmoved, rows, alpha, collected, common_in, common_out, lambda_sq, rule)
            : std::vector<double>(alpha.size(), 0.0);
    const double keep = std::sqrt(ratio);
    for (std::size_t a = 0; a < alpha.size(); ++a)
      alpha[a] = keep * (lambda_sq * alpha[a] + branch * collected[a]) - removed[a];
  }
  b.set_backward(p.input, g.signal());
  return g;
}

}  // namespace

void walk_attention_branches(TransformerNumbers& numbers, const TheoryInputs& inputs,
                             const std::function<void(int block, double branch_var)>& adjust) {
  const TransformerConfig& c = numbers.config;
  PROPLAB_CHECK(static_cast<int>(numbers.blocks.size()) == c.layers, "walk_attention_branches: ", numbers.blocks.size(),
                " block descriptions for ", c.layers, " layers");
  const std::int64_t tokens = inputs.tokens > 0 ? inputs.tokens : c.seq_len;
  const GaussHermite quadrature(64);
  ActivationPairMaps rule(quadrature);
  const double tok_var = numbers.token_embed_std * numbers.token_embed_std;
  const double embed_var = tok_var + numbers.position_embed_std * numbers.position_embed_std;
  const double r0 = inputs.input_corr ? *inputs.input_corr
                                      : (embed_var > 0 ? tok_var / (static_cast<double>(c.vocab) * embed_var) : 1.0);
  const std::shared_ptr<const TokenLayout> layout =
      inputs.exact_positions ? TokenLayout::exact(tokens) : TokenLayout::for_length(tokens);
  TokenField x = TokenField::exchangeable(layout, Signal{0.0, embed_var, clamp_unit(r0)});
  if (c.dropout > 0) x = dropout_forward(x, c.dropout);
  for (int i = 0; i < 2 * c.layers; ++i) {
    Sublayer s = sublayer_forward(numbers, i, x, rule, nullptr, nullptr);
    if (i % 2 == 0) {
      const double before = numbers.blocks[static_cast<std::size_t>(i / 2)].v_std *
                            numbers.blocks[static_cast<std::size_t>(i / 2)].attn_out_std;
      adjust(i / 2, s.branch_var);
      const TransformerBlockNumbers& bn = numbers.blocks[static_cast<std::size_t>(i / 2)];
      if (bn.v_std * bn.attn_out_std != before) s = sublayer_forward(numbers, i, x, rule, nullptr, nullptr);
    }
    x = std::move(s.out);
  }
}

namespace {

// How predict_transformer computes, for the run file's /theory formulae attribute.
// `token_pairs`: where the loss gradient's token covariance takes its coincidence rates from; `common_part`: whether
// the gradient's part along the stream's common part is carried (a tied head above a norm).
std::string transformer_formulae(const TransformerConfig& c, const TheoryInputs& inputs, const std::string& token_pairs,
                                 bool common_part, int correlated_logits) {
  std::ostringstream formulae;
  formulae << "position-resolved (token covariance [L, L], theory/token_field): embedding var σ_tok²+σ_pos², corr "
              "r_0 "
           << (inputs.input_corr ? "(given)" : "(uniform tokens)") << "; linear_forward; "
           << (c.norm_kind == NormKind::layernorm ? "layernorm" : "rmsnorm")
           << "_forward per token pair; activation_forward(" << activation_identifier(c.activation)
           << ") per token pair; causal attention (per key of each query's prefix E[w] and E[w²] of independent "
              "N(0, D_k) logits, each key with its own spread, by one-dimensional integrals; shared-key products for "
              "query pairs from a probit threshold model; the values' share along the logits, O(1/width)); "
              "dropout_forward; "
              "residual_forward; tied "
              "head: the input token's "
              "own logit from the stream's token-aligned variance. backward: softmax cross-entropy gradient "
              "(near-uniform, plus the tied self logit by quadrature), its token covariance from "
           << token_pairs
           << " and the logits' row correlation; linear/activation/norm/dropout/residual "
              "backward maps per token pair; causal attention value path (exact pair sums), query and key paths "
              "(per position, the softmax Jacobian's exact trace; the query path with the prefix's own covariance "
              "and the Gram's finite-width fluctuation)";
  if (correlated_logits > 0)
    formulae << "; in " << correlated_logits
             << " attention sublayer(s) the keys' leading own mode (mean logit variance along it >= "
             << kModeLogitVariance
             << ") carried forward: each query's logits given its coefficient on it, correlated between queries";
  if (norms_residual_sum(c.norm) && inputs.norm_scale_spread)
    formulae << "; each stream norm's backward with its finite-width factor (the token scale's spread over the "
                "weights, the centring, the mean it projects out)";
  if (common_part)
    formulae << "; the gradient's part along the stream's common part, seeded by the tied head's first norm, grown by "
                "each branch's response to a common shift"
             << (norms_residual_sum(c.norm) && inputs.norm_removes_part
                     ? " and reduced by each stream norm's removal of its projection on the token"
                     : "");
  return formulae.str();
}

// The head's logits (with a tied head, the mixture of the input token's own logit and the others).
struct HeadLogits {
  Signal logits;
  double other_spread = 0.0;  // the other logits' spread across classes
  bool self_logit = false;    // a tied head: one logit in C is the input token's own
  double self_mean = 0.0, self_var = 0.0;
};

HeadLogits head_logits(const TransformerNumbers& numbers, const Signal& head_signal, double token_aligned_var,
                       double tok_var) {
  const TransformerConfig& c = numbers.config;
  const std::int64_t d = c.width;
  const double head_std = c.tie_embeddings ? numbers.token_embed_std : numbers.readout_std;
  const double multiplier_sq = numbers.output_multiplier * numbers.output_multiplier;
  Signal logits = linear_forward(head_signal, d, head_std * head_std);
  logits.var *= multiplier_sq;
  const double other_spread = logits.var;  // a row's spread across classes (see cross_entropy_grad_var)
  // Tied head: the row's own input token's logit is h·E_tok with h = α·E_tok/σ_tok + rest (α² the aligned
  // variance), so it has mean α·σ_tok·d and variance σ_tok²·d·(var_h + α²) (|E_tok|² is χ²-distributed).
  const double dims = static_cast<double>(d), classes = static_cast<double>(c.vocab);
  const bool self_logit = c.tie_embeddings && token_aligned_var > 0.0 && head_signal.var > 0.0;
  const double self_mean =
      self_logit ? numbers.output_multiplier * std::sqrt(token_aligned_var) * numbers.token_embed_std * dims : 0.0;
  const double self_var = multiplier_sq * tok_var * dims * (head_signal.var + token_aligned_var);
  if (self_logit) {
    // One logit in C is the self logit: the mixture's mean and variance over all elements.
    const double others_var = logits.var;
    logits.mean = self_mean / classes;
    logits.var =
        ((classes - 1.0) * others_var + self_var + self_mean * self_mean) / classes - logits.mean * logits.mean;
  }
  return HeadLogits{logits, other_spread, self_logit, self_mean, self_var};
}

// How often two different rows of one sequence coincide, averaged over the batch's sequences and over the token
// pairs of every bucket pair (TokenCov::at for two buckets, `within` for two tokens of one bucket): the same input
// token, the same target, and one's target being the other's input (summed over the two orders, so 0..2). Plus
// how often a row's target is its own input token. Without the batch's tokens every coincidence has the rate of
// independent uniform tokens, 1/vocab.
struct TokenCoincidences {
  TokenCov same_input, same_target, target_is_input;
  double self_target = 0.0;
  // Over all pairs of different rows of the counted sequences (target_is_input: per order); sequences = 0 when
  // nothing was counted.
  double all_same_input = 0.0, all_same_target = 0.0, all_target_is_input = 0.0;
  std::int64_t sequences = 0;
  std::string describe() const {
    if (sequences == 0) return "uniform tokens";
    std::ostringstream text;
    text.precision(3);
    text << "the first batch's tokens (" << sequences << " sequences; of the pairs of different rows of one "
         << "sequence " << 100.0 * all_same_target << "% share a target, " << 100.0 * all_same_input
         << "% an input token; of the ordered pairs (i, j) " << 100.0 * all_target_is_input
         << "% have i's target as j's input; " << 100.0 * self_target << "% of rows have their input as target)";
    return text.str();
  }
};

TokenCoincidences token_coincidences(const std::shared_ptr<const TokenLayout>& layout, const TheoryInputs& inputs,
                                     std::int64_t vocab) {
  const double uniform = 1.0 / static_cast<double>(vocab);
  TokenCoincidences t{TokenCov::filled(layout, 0.0, uniform), TokenCov::filled(layout, 0.0, uniform),
                      TokenCov::filled(layout, 0.0, 2.0 * uniform), uniform};
  const std::int64_t length = layout->length, buckets = layout->buckets();
  const std::size_t row = static_cast<std::size_t>(length);
  PROPLAB_CHECK(inputs.batch_targets.size() == inputs.batch_inputs.size() &&
                    (inputs.batch_inputs.empty() || (row > 0 && inputs.batch_inputs.size() % row == 0)),
                "predict_transformer: batch_inputs and batch_targets need the same whole number of ", length,
                "-token sequences (", inputs.batch_inputs.size(), " and ", inputs.batch_targets.size(), " ids)");
  if (inputs.batch_inputs.empty()) return t;
  // O(sequences·L²): at long lengths only the first sequences (about 2^26 pairs in all, at least one sequence).
  const std::int64_t sequences = std::clamp<std::int64_t>((std::int64_t{1} << 26) / (length * length), 1,
                                                          static_cast<std::int64_t>(inputs.batch_inputs.size() / row));
  std::vector<std::int64_t> bucket(row);
  for (std::int64_t a = 0; a < buckets; ++a)
    for (std::int64_t i = 0; i < layout->size[static_cast<std::size_t>(a)]; ++i)
      bucket[static_cast<std::size_t>(layout->start[static_cast<std::size_t>(a)] + i)] = a;
  std::vector<double> pair_in(static_cast<std::size_t>(buckets * buckets)), pair_target(pair_in.size()),
      pair_cross(pair_in.size()), one_in(static_cast<std::size_t>(buckets)), one_target(one_in.size()),
      one_cross(one_in.size());
  double self_target = 0.0;
  for (std::int64_t s = 0; s < sequences; ++s) {
    const std::int32_t* x = inputs.batch_inputs.data() + static_cast<std::size_t>(s) * row;
    const std::int32_t* y = inputs.batch_targets.data() + static_cast<std::size_t>(s) * row;
    for (std::size_t i = 0; i < row; ++i) {
      self_target += x[i] == y[i] ? 1.0 : 0.0;
      const std::int64_t a = bucket[i];
      for (std::size_t j = 0; j < row; ++j) {
        if (j == i) continue;
        const std::int64_t b = bucket[j];
        const double in = x[i] == x[j] ? 1.0 : 0.0, target = y[i] == y[j] ? 1.0 : 0.0,
                     cross = (y[j] == x[i] ? 1.0 : 0.0) + (y[i] == x[j] ? 1.0 : 0.0);
        if (a == b) {
          one_in[static_cast<std::size_t>(a)] += in;
          one_target[static_cast<std::size_t>(a)] += target;
          one_cross[static_cast<std::size_t>(a)] += cross;
        } else {
          const std::size_t k = static_cast<std::size_t>(a * buckets + b);
          pair_in[k] += in;
          pair_target[k] += target;
          pair_cross[k] += cross;
        }
      }
    }
  }
  const double n = static_cast<double>(sequences);
  double total_in = 0.0, total_target = 0.0, total_cross = 0.0;
  for (std::size_t k = 0; k < pair_in.size(); ++k)
    total_in += pair_in[k], total_target += pair_target[k], total_cross += pair_cross[k];
  for (std::size_t a = 0; a < one_in.size(); ++a)
    total_in += one_in[a], total_target += one_target[a], total_cross += one_cross[a];
  const double all_pairs = n * static_cast<double>(length) * static_cast<double>(length - 1);
  if (all_pairs > 0.0) {
    t.all_same_input = total_in / all_pairs;
    t.all_same_target = total_target / all_pairs;
    t.all_target_is_input = 0.5 * total_cross / all_pairs;
  }
  t.sequences = sequences;
  for (std::int64_t a = 0; a < buckets; ++a) {
    const double size_a = static_cast<double>(layout->size[static_cast<std::size_t>(a)]);
    if (size_a > 1.0) {
      const double pairs = n * size_a * (size_a - 1.0);
      t.same_input.within[static_cast<std::size_t>(a)] = one_in[static_cast<std::size_t>(a)] / pairs;
      t.same_target.within[static_cast<std::size_t>(a)] = one_target[static_cast<std::size_t>(a)] / pairs;
      t.target_is_input.within[static_cast<std::size_t>(a)] = one_cross[static_cast<std::size_t>(a)] / pairs;
    }
    for (std::int64_t b = 0; b < buckets; ++b) {
      if (b == a) continue;
      const double pairs = n * size_a * static_cast<double>(layout->size[static_cast<std::size_t>(b)]);
      const std::size_t k = static_cast<std::size_t>(a * buckets + b);
      t.same_input.at(a, b) = pair_in[k] / pairs;
      t.same_target.at(a, b) = pair_target[k] / pairs;
      t.target_is_input.at(a, b) = pair_cross[k] / pairs;
    }
  }
  t.self_target = self_target / (n * static_cast<double>(length));
  return t;
}

// The loss gradient at the head's input, g_i = Wᵀ(p_i − y_i)·scale for row i (docs/theory.md, "Loss gradient").
// With the head's rows independent of the p's, E[g_i·g_j] ∝ E[(p_i − y_i)·(p_j − y_j)]
//   = E[p_i·p_j] − E[p_i,y_j] − E[p_j,y_i] + [y_i = y_j]:
// its diagonal sets the variance (E[Σp²] − 2E[p_y] + 1) and two rows of one sequence covary through the targets
// they share, their input tokens (a tied head's self logits) and the logits' own correlation across rows (the
// head input's token correlation r: E[p_iv·p_jv] − 1/C² ≈ (E[p_v²] − 1/C²)·(e^{rD} − 1)/(e^D − 1) at logit
// spread D, exact at r = 0 and r = 1). `unit`: the variance of one unit of those coefficient products per element,
// scale²/(C·R²) (with E[p_y] = 1/C the diagonal is cross_entropy_grad_var(_with_self)'s S − 2/C + 1 units).
//
// `aligned_share` κ (a tied head above a norm): the share of the head input's variance along its row's own token
// embedding. The norm's backward removes each row's component along its output ĥ_i, c_i·ĥ_i with
// c_i = g_i·ĥ_i ≈ √κ·|e|·(p_s,i − [y_i = s_i]) (the self logit's coefficient; what the other classes put along ĥ_i
// is O(1/width)); `norm_reads` is the gradient after that removal: every row loses κ·E[(p_s − [y = s])²], and a
// pair of rows changes by −E[c_j·(g_i·ĥ_j)] − E[c_i·(g_j·ĥ_i)] + E[c_i·c_j]·(ĥ_i·ĥ_j), with
// g_i·ĥ_j ≈ √κ·|e|·(p_i,s_j − [y_i = s_j]): κ·((p̂_s − t)²·r_ij − (p̂_s − t)·(2·P_ij − x_ij)) in the units of the
// coefficient products (t the rate of rows whose target is their input, P_ij the mean probability row i gives row
// j's input token, x_ij the target-is-input count of the pair). The removed parts all point along +ĥ (p_s > 0) and
// the ĥ_i correlate across rows, so the removal adds a positive covariance.
//
// `aligned`: per bucket, the part of the removal that points along the direction the rows' head inputs share (the
// stream's common part c = mean over the tokens): row i loses c_i·(ĥ_i·ĉ)·ĉ, with E[c_i] = √κ·|e|·(p̂_s − t) the same
// sign for every row and ĥ_i·ĉ = m_i/√(v_i·C) (m_i = (1/L)·Σ_j cov(i, j) the row's covariance with the common part,
// v_i its variance, C the pair mean): a coefficient per position, smaller at the first positions, which share less
// of the common part. The blocks below amplify that part beyond what gradient independence gives
// (sublayer_backward, "The gradient along the stream's common part" in docs/theory.md).
struct LossGradient {
  TokenGrad at_head, norm_reads;
  std::vector<double> aligned;
};

LossGradient loss_gradient(const std::shared_ptr<const TokenLayout>& layout, const TokenField& head_in,
                           const HeadLogits& head, double classes, double unit, const TokenCoincidences& t,
                           double aligned_share, const std::vector<double>& aligned_share_at) {
  // p̂_s: a row's mean probability of its own input token; p̂_o that of any other class. `excess`: E[Σ_v p_v²]
  // over the ordinary classes less its value at uniform weights, the part the logits' row correlation shares.
  double sum_p_sq = 0.0, self_p = 1.0 / classes, self_p_sq = 1.0 / (classes * classes), excess = 0.0,
         spread = head.other_spread;
  if (head.self_logit) {
    const SelfLogitMoments m = self_logit_moments(head.other_spread, head.self_mean, head.self_var, classes);
    const double growth = std::exp(std::min(head.other_spread, 700.0));
    const double others_sq = growth / (growth + classes - 2.0);
    sum_p_sq = m.sum_p_sq;
    self_p = m.self_p;
    self_p_sq = m.self_p_sq;
    excess = (1.0 - 2.0 * m.self_p + m.self_p_sq) * std::max(0.0, others_sq - 1.0 / (classes - 1.0));
  } else {
    spread = head.logits.var;
    sum_p_sq = softmax_sum_p_sq(spread, static_cast<std::int64_t>(classes));
    excess = std::max(0.0, sum_p_sq - 1.0 / classes);
  }
  const double other_p = (1.0 - self_p) / (classes - 1.0);
  const double diagonal = sum_p_sq - 2.0 * (t.self_target * self_p + (1.0 - t.self_target) * other_p) + 1.0;
  const double var = unit * diagonal;
  auto shared = [&](double r) { return softmax_shared_excess(r, spread); };
  auto cov = [&](double r, double same_input, double same_target, double target_is_input) {
    const double products = same_input * (self_p * self_p + (classes - 1.0) * other_p * other_p) +
                            (1.0 - same_input) * (2.0 * self_p * other_p + (classes - 2.0) * other_p * other_p);
    const double target_p = target_is_input * self_p + (2.0 - target_is_input) * other_p;
    return unit * (excess * shared(r) + products - target_p + same_target);
  };
  const double self_coefficient = self_p - t.self_target;
  auto removed = [&](double r, double same_input, double target_is_input) {
    const double input_p = same_input * self_p + (1.0 - same_input) * other_p;
    return unit * aligned_share *
           (self_coefficient * self_coefficient * std::clamp(r, -1.0, 1.0) -
            self_coefficient * (2.0 * input_p - target_is_input));
  };
  const double mean_sq = head_in.mean * head_in.mean;
  auto second = [&](double c) { return c + mean_sq; };
  const double self_sq = self_p_sq - 2.0 * t.self_target * self_p + t.self_target;  // E[(p_s − [y = s])²]
  LossGradient g{TokenGrad::white(layout, var),
                 TokenGrad::white(layout, std::max(0.0, var - unit * aligned_share * self_sq)),
                 std::vector<double>(static_cast<std::size_t>(layout->buckets()), 0.0)};
  const std::vector<double> row_common = row_means(head_in);
  const double common = second(head_in.pair_mean());
  for (std::int64_t a = 0; a < layout->buckets(); ++a) {
    const std::size_t ia = static_cast<std::size_t>(a);
    const double va = second(head_in.diag(a));
    if (va > 0.0 && common > 0.0)
      g.aligned[ia] = std::sqrt(unit * aligned_share_at[ia]) * std::abs(self_coefficient) *
                      std::clamp(second(row_common[ia]) / std::sqrt(va * common), 0.0, 1.0);
  }
  const std::int64_t buckets = layout->buckets();
  for (std::int64_t a = 0; a < buckets; ++a) {
    const double va = second(head_in.diag(a));
    const std::size_t ia = static_cast<std::size_t>(a);
    if (va > 0.0) {
      const double r = second(head_in.within[ia]) / va;
      g.at_head.within[ia] = cov(r, t.same_input.within[ia], t.same_target.within[ia], t.target_is_input.within[ia]);
      g.norm_reads.within[ia] =
          g.at_head.within[ia] + removed(r, t.same_input.within[ia], t.target_is_input.within[ia]);
    }
    for (std::int64_t b = 0; b < buckets; ++b) {
      if (b == a) continue;
      const double vb = second(head_in.diag(b));
      const double r = va > 0.0 && vb > 0.0 ? second(head_in.at(a, b)) / std::sqrt(va * vb) : 0.0;
      g.at_head.at(a, b) = cov(r, t.same_input.at(a, b), t.same_target.at(a, b), t.target_is_input.at(a, b));
      g.norm_reads.at(a, b) = g.at_head.at(a, b) + removed(r, t.same_input.at(a, b), t.target_is_input.at(a, b));
    }
  }
  return g;
}

}  // namespace

namespace {

// The finite-width spread of a layer's pre-activation scale (docs/theory.md, "Finite-width bands").
struct BandTerms {
  double log_slope = 1.0;       // d log E[φ(h)²] / d log K
  double post_log_slope = 1.0;  // d log Var[φ(h)] / d log K
  double kappa = 0.0;           // relative variance of the batch mean of φ(h)², per unit (× 1/width)
  double post_kappa = 0.0;      // the same for the centred (φ(h) − E φ)², the postact probe's own spread
  double post_var = 0.0;        // Var[φ(h)]
  double post_pair_cov = 0.0;   // Cov(φ(u), φ(v)) for two samples' pre-activations u, v (correlation `corr`)
};

// `pre`: the layer's pre-activations (mean 0: after a zero-mean linear layer), its corr the correlation between
// two samples; `samples`: the micro-batch.
BandTerms band_terms(Activation phi, const Signal& pre, std::int64_t samples, const GaussHermite& rule) {
  BandTerms t;
  if (!(pre.var > 0)) return t;
  const auto f = [phi](double x) { return activation_value(phi, x); };
  const auto moments = [&](double var) {
    const double sd = std::sqrt(var);
    const double m1 = rule.expect(f, pre.mean, sd);
    const double m2 = rule.expect([&](double x) { return f(x) * f(x); }, pre.mean, sd);
    return std::pair<double, double>{m1, m2};
  };
  constexpr double step = 1e-4;
  const auto [m1_up, m2_up] = moments(pre.var * (1.0 + step));
  const auto [m1_down, m2_down] = moments(pre.var * (1.0 - step));
  const double span = std::log1p(step) - std::log1p(-step);
  t.log_slope = (std::log(m2_up) - std::log(m2_down)) / span;
  t.post_log_slope = (std::log(m2_up - m1_up * m1_up) - std::log(m2_down - m1_down * m1_down)) / span;
  const auto [m1, m2] = moments(pre.var);
  const double centred_var = m2 - m1 * m1;
  const double sd = std::sqrt(pre.var);
  const auto square = [&](double x) { return f(x) * f(x); };
  const auto centred_square = [&](double x) { return (f(x) - m1) * (f(x) - m1); };
  const double corr = std::clamp(pre.corr, -1.0, 1.0);
  const double b = static_cast<double>(std::max<std::int64_t>(1, samples));
  const auto average = [&](const std::function<double(double)>& g, double mean_g) {
    const double same = rule.expect([&](double x) { return g(x) * g(x); }, pre.mean, sd) - mean_g * mean_g;
    const double pair = rule.expect_pair(g, g, pre.mean, sd, corr) - mean_g * mean_g;
    return (same + (b - 1.0) * pair) / b / (mean_g * mean_g);
  };
  t.kappa = average(square, m2);
  t.post_kappa = centred_var > 0 ? average(centred_square, centred_var) : 0.0;
  t.post_var = centred_var;
  t.post_pair_cov = rule.expect_pair(f, f, pre.mean, sd, corr) - m1 * m1;
  return t;
}

// A field of one sequence as a batch sees it: `sequences` copies whose rows covary by `cross`·cov (the positional
// part they share, docs/theory.md) and share the field's mean.
struct BatchField {
  const TokenField* field;
  double cross;
};

// The spread of the stream entering a sublayer.
struct StreamSpread {
  double log_var = 0.0;  // Var[log var] over initialisations and batches
  double cross = 0.0;    // the covariance of two sequences' rows as a fraction of a sequence's own
};

// Σ over the token pairs (i, j) of one sequence of fn(a_ij, b_ij), a and b two covariance layouts: the pairs of a
// bucket with itself count its positions' variances and, for a bucket of several positions, their `within`
// covariances.
template <class F>
double pair_sum(const TokenCov& a, const TokenCov& b, F fn) {
  const TokenLayout& layout = *a.layout;
  double sum = 0.0;
  for (std::int64_t i = 0; i < a.buckets(); ++i) {
    const double ni = static_cast<double>(layout.size[static_cast<std::size_t>(i)]);
    for (std::int64_t j = 0; j < a.buckets(); ++j) {
      if (i != j) {
        sum += ni * static_cast<double>(layout.size[static_cast<std::size_t>(j)]) * fn(a.at(i, j), b.at(i, j));
      } else {
        sum += ni * fn(a.diag(i), b.diag(i));
        if (ni > 1)
          sum += ni * (ni - 1.0) * fn(a.within[static_cast<std::size_t>(i)], b.within[static_cast<std::size_t>(i)]);
      }
    }
  }
  return sum;
}

// Σ over all row pairs of the batch of G_a·G_b, G the uncentred Gram matrices of two batch fields.
double batch_pair_sum(const BatchField& a, const BatchField& b, std::int64_t sequences) {
  const double n = static_cast<double>(std::max<std::int64_t>(1, sequences));
  const double ma = a.field->mean * a.field->mean, mb = b.field->mean * b.field->mean;
  const double within = pair_sum(*a.field, *b.field, [&](double x, double y) { return (x + ma) * (y + mb); });
  const double across =
      pair_sum(*a.field, *b.field, [&](double x, double y) { return (a.cross * x + ma) * (b.cross * y + mb); });
  return n * within + n * (n - 1.0) * across;
}

// Var[log mean square] that a fresh zero-mean linear map with `units` outputs adds over its weights: each output
// unit's mean square over the rows is wᵀGw, G the rows' uncentred Gram matrix of its inputs, relative variance
// 2·tr(G²)/tr(G)², averaged over `units` independent units. G is itself random: an average over the stream's d
// features, and over each fresh map's units since, E[G_ab²] = Ḡ_ab² + k·(Ḡ_aa·Ḡ_bb + Ḡ_ab²) with k =
// `gram_spread` = 1/d + Σ 1/units of those maps; so tr(G²)/tr(G)² = R·(1 + k) + k with R the ratio of the expected
// Gram Ḡ (the field's): the output can have no more independent directions than its input has.
double linear_square_mean_log_var(const BatchField& input, double gram_spread, std::int64_t units,
                                  std::int64_t sequences) {
  const double n = static_cast<double>(std::max<std::int64_t>(1, sequences));
  const double mu_sq = input.field->mean * input.field->mean;
  double trace = 0.0;
  for (std::int64_t i = 0; i < input.field->buckets(); ++i)
    trace += static_cast<double>(input.field->layout->size[static_cast<std::size_t>(i)]) * (input.field->diag(i) + mu_sq);
  trace *= n;
  if (!(trace > 0)) return 0.0;
  const double ratio = batch_pair_sum(input, input, sequences) / (trace * trace);
  return 2.0 / static_cast<double>(units) * (ratio * (1.0 + gram_spread) + gram_spread);
}

// Var[log var] of the embedding output: its mean square over the batch's rows of token and position embeddings,
// whose entries are drawn once per network. A token row (σ_tok², d entries) counts as often as its token occurs
// (two rows share a token with probability r0·(σ_tok² + σ_pos²)/σ_tok², from the input correlation), a position
// row once per sequence, and the cross term 2·tok·pos is zero in expectation.
double embedding_log_var(const TransformerNumbers& numbers, double r0, std::int64_t sequences, std::int64_t tokens) {
  const double d = static_cast<double>(numbers.config.width);
  const double tok = numbers.token_embed_std * numbers.token_embed_std;
  const double pos = numbers.position_embed_std * numbers.position_embed_std;
  const double total = tok + pos;
  if (!(total > 0)) return 0.0;
  const double b = static_cast<double>(std::max<std::int64_t>(1, sequences));
  const double rows = b * static_cast<double>(tokens);
  const double same_token = tok > 0 ? std::clamp(r0 * total / tok, 0.0, 1.0) : 0.0;
  const double token_part = tok * tok * 2.0 / d * (1.0 / rows + (1.0 - 1.0 / rows) * same_token);
  const double position_part = pos * pos * 2.0 / (d * static_cast<double>(tokens));
  const double cross_part = 4.0 * tok * pos / (d * rows) * (1.0 + (b - 1.0) * same_token);
  return (token_part + position_part + cross_part) / (total * total);
}

// Relative covariance Cov(g(u), g(v))/E[g]² of g = φ² (uncentred) or (φ − Eφ)² (centred) for u, v ~ N(mean, var)
// correlated c, and the centred correlation of φ(u), φ(v).
struct PairSquares {
  double square = 0.0, centred = 0.0, corr = 0.0;
};
PairSquares pair_squares(Activation phi, double mean, double var, double c, const GaussHermite& rule) {
  PairSquares out;
  if (!(var > 0)) return out;
  const double sd = std::sqrt(var);
  const auto f = [phi](double x) { return activation_value(phi, x); };
  const double m1 = rule.expect(f, mean, sd);
  const double m2 = rule.expect([&](double x) { return f(x) * f(x); }, mean, sd);
  const double centred_var = m2 - m1 * m1;
  const auto square = [&](double x) { return f(x) * f(x); };
  const auto centred_square = [&](double x) { return (f(x) - m1) * (f(x) - m1); };
  const double cc = std::clamp(c, -1.0, 1.0);
  out.square = (rule.expect_pair(square, square, mean, sd, cc) - m2 * m2) / (m2 * m2);
  if (centred_var > 0) {
    out.centred = (rule.expect_pair(centred_square, centred_square, mean, sd, cc) - centred_var * centred_var) /
                  (centred_var * centred_var);
    out.corr = (rule.expect_pair(f, f, mean, sd, cc) - m1 * m1) / centred_var;
  }
  return out;
}

// pair_squares tabulated over the correlation (201 points on [−1, 1], linear in between) with band_terms, for one
// activation at one pre-activation mean and variance; a normed model's blocks read (nearly) the same variance, so
// the last 16 tables are kept and one within 10⁻³ of the asked variance (and mean) is reused.
class PairSquareTables {
 public:
  struct Table {
    Activation phi;
    double mean = 0.0, var = 0.0;
    BandTerms terms;
    std::vector<PairSquares> grid;
    PairSquares at(double c) const {
      const double x = (std::clamp(c, -1.0, 1.0) + 1.0) * 0.5 * static_cast<double>(grid.size() - 1);
      const std::size_t i = std::min(static_cast<std::size_t>(x), grid.size() - 2);
      const double w = x - static_cast<double>(i);
      const PairSquares& a = grid[i];
      const PairSquares& b = grid[i + 1];
      return {a.square + w * (b.square - a.square), a.centred + w * (b.centred - a.centred),
              a.corr + w * (b.corr - a.corr)};
    }
  };
  explicit PairSquareTables(const GaussHermite& rule) : rule_(&rule) {}
  const Table& get(Activation phi, double mean, double var) {
    for (const auto& t : tables_)
      if (t->phi == phi && std::fabs(t->var - var) <= 1e-3 * var && std::fabs(t->mean - mean) <= 1e-3 * std::sqrt(var))
        return *t;
    auto t = std::make_unique<Table>();
    t->phi = phi;
    t->mean = mean;
    t->var = var;
    t->terms = band_terms(phi, Signal{mean, var, 0.0}, 1, *rule_);
    constexpr int points = 201;
    for (int i = 0; i < points; ++i)
      t->grid.push_back(pair_squares(phi, mean, var, -1.0 + 2.0 * i / (points - 1), *rule_));
    if (tables_.size() == 16) tables_.erase(tables_.begin());
    tables_.push_back(std::move(t));
    return *tables_.back();
  }

 private:
  const GaussHermite* rule_;
  std::vector<std::unique_ptr<Table>> tables_;
};

// The bands of one sublayer's probes (docs/theory.md, "Finite-width bands", transformers) from the spread
// `stream.log_var` of the stream entering it and its cross-sequence correlation `stream.cross`; updates both to
// the stream leaving it. Each fresh linear map adds linear_square_mean_log_var of its input; an activation adds its
// units' own spread (over the batch's row pairs) and carries its input's scale with its log-slope; a norm fixes
// its output's scale (no band; its input's spread does not pass into the branch); the residual add mixes the
// skip's and the branch's spreads with their shares of the sum, plus the skip–branch cross term. Neglected: the
// attention weights' own fluctuation over the query/key draws, biases and dropout.
StreamSpread sublayer_bands(const TransformerNumbers& numbers, int index, const Sublayer& s, const SublayerProbes& p,
                            const StreamSpread& in, std::int64_t sequences, PairSquareTables& tables, Builder& b) {
  const TransformerConfig& c = numbers.config;
  const std::int64_t d = c.width, f = static_cast<std::int64_t>(c.ffn_mult) * c.width;
  const bool pre = norms_branch_input(c.norm), post = norms_residual_sum(c.norm);
  const bool attention = index % 2 == 0;
  const TransformerBlockNumbers& bn = numbers.blocks[static_cast<std::size_t>(index / 2)];
  const ResidualNumbers& rn = attention ? bn.attn_residual : bn.ffn_residual;
  const double seqs = static_cast<double>(std::max<std::int64_t>(1, sequences));
  const double tokens = static_cast<double>(s.input.layout->length), rows = seqs * tokens;
  const auto set_band = [&](int probe, double log_var) {
    if (probe >= 0) b.prediction.probes[static_cast<std::size_t>(probe)].var_log_sd = std::sqrt(std::max(0.0, log_var));
  };
  if (!(post && index > 0)) set_band(p.input, in.log_var);  // Post-LN's (and both's) later inputs are norm outputs
  // A LayerNorm's output keeps s²/(s² + ε) of unit variance (s² ≈ (1 − 1/d)·var its input's feature variance), so
  // it carries the share ε/(s² + ε) of its input's log-scale; RMSNorm the same with the second moment.
  const auto norm_passes = [&](const TokenField& x) {
    const double s2 = c.norm_kind == NormKind::layernorm ? (1.0 - 1.0 / static_cast<double>(d)) * x.var()
                                                         : x.var() + x.mean * x.mean;
    const double share = s2 > 0 ? c.norm_eps / (s2 + c.norm_eps) : 0.0;
    return share * share;
  };
  // The branch's scale follows the stream's unless a norm sets it (pre, both: the branch reads the normed stream).
  const double scale_log_var = pre ? norm_passes(s.input) * in.log_var : in.log_var;
  double slope = 1.0, fresh = 0.0;  // the branch's log-slope on the stream's scale, and its own spread
  double branch_cross = in.cross;   // the branch output's cross-sequence correlation
  double shared_alpha = 0.0;        // FFN: how much of the stream Gram's sampling its branch Gram shares
  const double stream_gram = 1.0 / static_cast<double>(d);  // the stream's Gram: an average over its d features
  if (attention) {
    // mixed = P·(W_v x̂): per value unit a fresh linear map of the attention-averaged inputs, whose rows have the
    // mixed field's covariance; then the output projection of the mixed values.
    const BatchField mixed{&s.mixed, in.cross};
    fresh = linear_square_mean_log_var(mixed, stream_gram, d, sequences) +
            linear_square_mean_log_var(mixed, 2.0 * stream_gram, d, sequences);
  } else {
    set_band(p.hidden, scale_log_var + linear_square_mean_log_var({&s.branch_in, in.cross}, stream_gram, f, sequences));
    const double hidden_gram = stream_gram + 1.0 / static_cast<double>(f);
    // The activation's units: the relative variance of one unit's mean of φ² over the batch's rows, whose pairs
    // correlate by c_ij within a sequence and by cross·c_ij across sequences.
    const double var_h = s.hidden.var(), mean_h = s.hidden.mean;
    const double corr_h = s.hidden.corr(0.0);
    // A pair's actual correlation scatters about its expectation c by Var = k·(1 - c²)² (the Gram's sampling):
    // E[κ(c)] ≈ κ(c) + ½κ''(c)·Var.
    const PairSquareTables::Table& table = tables.get(c.activation, mean_h, var_h);
    const auto pair_at = [&](double corr) {
      PairSquares at = table.at(corr);
      const double h = 0.02, lo = std::clamp(corr - h, -1.0, 1.0 - 2 * h), mid = lo + h;
      const PairSquares a = table.at(lo);
      const PairSquares m = table.at(mid);
      const PairSquares z = table.at(lo + 2 * h);
      const double spread = hidden_gram * (1.0 - corr * corr) * (1.0 - corr * corr) / (2.0 * h * h);
      at.square += 0.5 * (a.square - 2.0 * m.square + z.square) * spread;
      at.centred += 0.5 * (a.centred - 2.0 * m.centred + z.centred) * spread;
      return at;
    };
    const PairSquares self = table.at(1.0);
    const PairSquares within = pair_at(corr_h);
    const PairSquares across = pair_at(in.cross);
    const PairSquares across_other = pair_at(in.cross * corr_h);
    const auto unit_spread = [&](double PairSquares::*m) {
      return (self.*m + (tokens - 1.0) * within.*m + (seqs - 1.0) * (across.*m + (tokens - 1.0) * across_other.*m)) /
             rows;
    };
    const BandTerms& t = table.terms;
    set_band(p.mixed, t.post_log_slope * t.post_log_slope * scale_log_var + unit_spread(&PairSquares::centred) / f);
    slope = t.log_slope;
    fresh = unit_spread(&PairSquares::square) / f +
            linear_square_mean_log_var({&s.mixed, across.corr}, hidden_gram, d, sequences);
    // The output projection maps the activation's uncentred Gram: its mean is shared by every row.
    const double m_sq = s.mixed.mean * s.mixed.mean, v_phi = s.mixed.var();
    // k(c) = E[φ(u)φ(v)] = corr_φ(c)·Var φ + m²: its slope at the rows' correlation, relative to E[φ²].
    shared_alpha = v_phi * (table.at(corr_h + 0.01).corr - table.at(corr_h - 0.01).corr) / 0.02 / (v_phi + m_sq);
    branch_cross = (across.corr * v_phi + m_sq) / (v_phi + m_sq);
  }
  set_band(p.branch, slope * slope * scale_log_var + fresh);
  if (pre) slope *= std::sqrt(norm_passes(s.input));
  // The residual add y = λx + βb: v_y = λ²v_x + β²v_b + 2λβ·C, C the empirical skip–branch covariance (zero in
  // expectation; over the output projection's weights Var C = Σ_row pairs G_b·G_x/(d·rows²)).
  const TokenField& y = post ? s.sum : s.out;
  const double vx = s.input.var(), vb = s.branch_var, vy = y.var();
  if (!(vy > 0)) return {};
  const double lambda = rn.lambda, beta = rn.beta;
  double cross_var = batch_pair_sum({&s.branch, branch_cross}, {&s.input, in.cross}, sequences) /
                     (static_cast<double>(d) * rows * rows);
  // The FFN's Gram is built from the same normed stream as the skip's: a pair of rows whose stream correlation
  // happens to be c (Var ≈ 1/d about its expectation) has E[φ_a·φ_b] moved by k'(c̄)·c, so E[G_b·G_x] exceeds
  // Ḡ_b·Ḡ_x by α·v_b·v_x/d on every pair, α = k'(c̄)/E[φ²] (docs/theory.md). Attention's share of this (through
  // each query's weight on its own key) is not carried.
  cross_var += shared_alpha * vb * vx / (static_cast<double>(d) * static_cast<double>(d));
  const double carried = (lambda * lambda * vx + beta * beta * vb * slope) / vy;
  const double own = beta * beta * vb / vy;
  StreamSpread out;
  out.log_var = carried * carried * in.log_var + own * own * fresh +
                4.0 * lambda * lambda * beta * beta * cross_var / (vy * vy);
  out.cross = (lambda * lambda * vx * in.cross + beta * beta * vb * branch_cross) / vy;
  if (post) {
    set_band(p.sum, out.log_var);
    out.log_var *= norm_passes(s.sum);  // the norm fixes the stream's scale but for ε's share
  }
  set_band(p.result, out.log_var);
  if (post) b.prediction.probes[static_cast<std::size_t>(p.result)].var_log_sd = kNaN;
  return out;
}

}  // namespace

ProbePrediction predict_transformer(const TransformerNumbers& numbers, const TheoryInputs& inputs) {
  const TransformerConfig& c = numbers.config;
  PROPLAB_CHECK(static_cast<int>(numbers.blocks.size()) == c.layers, "predict_transformer: ", numbers.blocks.size(),
                " block descriptions for ", c.layers, " layers");
  const std::int64_t d = c.width;
  const std::int64_t tokens = inputs.tokens > 0 ? inputs.tokens : c.seq_len;
  const double p = c.dropout;
  const bool pre = c.norm == NormPlacement::pre;  // a final norm (Pre-LN only; post and both end on a sum's norm)
  const bool post = norms_residual_sum(c.norm);
  const GaussHermite quadrature(64);
  ActivationPairMaps rule(quadrature);
  Builder b;
  b.token_correlations = true;

  // Forward.
  const double tok_var = numbers.token_embed_std * numbers.token_embed_std;
  const double pos_var = numbers.position_embed_std * numbers.position_embed_std;
  const double embed_var = tok_var + pos_var;
  double r0 = inputs.input_corr ? *inputs.input_corr
                                : (embed_var > 0 ? tok_var / (static_cast<double>(c.vocab) * embed_var) : 1.0);
  const std::shared_ptr<const TokenLayout> layout =
      inputs.exact_positions ? TokenLayout::exact(tokens) : TokenLayout::for_length(tokens);
  TokenField x = TokenField::exchangeable(layout, Signal{0.0, embed_var, clamp_unit(r0)});
  if (p > 0) x = dropout_forward(x, p);
  // The variance of the stream's component along its row's own token embedding (σ_tok·u, u the unit-variance
  // embedding row): branches are independent of u, so it is scaled by λ² at each residual and by the norms' gain²;
  // a tied head reads it back as the input token's own logit.
  double token_aligned_var = tok_var;
  // The same per position: a position whose branches add more variance keeps less of its token (the first
  // positions, whose attention averages fewer tokens). Read by the gradient's part along the common part.
  std::vector<double> token_aligned_at(static_cast<std::size_t>(layout->buckets()), tok_var);
  const int probe_embed = b.add("embed.out", "embed", -1);
  b.set_forward(probe_embed, x.signal());
  // Finite-width bands: Var[log var] of the stream entering the next sublayer over initialisations and batches.
  // The sequences share the position embeddings: a row's covariance with the same position of another sequence is
  // σ_pos²/(σ_tok² + σ_pos²) of its variance.
  PairSquareTables tables(quadrature);
  StreamSpread spread{embedding_log_var(numbers, r0, inputs.sequences, tokens), embed_var > 0 ? pos_var / embed_var : 0.0};
  b.prediction.probes[static_cast<std::size_t>(probe_embed)].var_log_sd = std::sqrt(spread.log_var);

  // The fields of every sublayer would need O(layers·L²) memory; the forward pass keeps the stream entering every
  // `segment`-th sublayer and the backward pass recomputes one segment at a time.
  const int sublayers = 2 * c.layers;
  const std::size_t field_bytes = static_cast<std::size_t>(layout->buckets() * layout->buckets()) * sizeof(double);
  const int segment = static_cast<int>(std::clamp<std::size_t>((std::size_t{96} << 20) / (12 * field_bytes), 1, 64));
  std::vector<TokenField> checkpoints;
  // The attention sublayers of the last segment as this forward pass computes them: the backward pass starts with
  // that segment and takes each one whose input it finds bit for bit the same instead of recomputing it (an
  // attention sublayer's fields depend on its input alone; an FFN's also on which of ActivationPairMaps' tables it
  // meets, so the FFNs are recomputed, and the result is the recomputation's bit for bit).
  const int last_start = ((sublayers - 1) / segment) * segment;
  std::vector<std::optional<Sublayer>> kept(static_cast<std::size_t>(sublayers - last_start));
  std::vector<SublayerProbes> probes(static_cast<std::size_t>(sublayers));
  int saturated_block = -1;  // the last block whose attention is one-hot to float32 precision (below)
  double saturated_spread = 0.0;
  for (int i = 0; i < sublayers; ++i) {
    if (i % segment == 0) checkpoints.push_back(x);
    const TransformerBlockNumbers& bn = numbers.blocks[static_cast<std::size_t>(i / 2)];
    const ResidualNumbers& rn = i % 2 == 0 ? bn.attn_residual : bn.ffn_residual;
    Sublayer s = sublayer_forward(numbers, i, x, rule, &b, &probes[static_cast<std::size_t>(i)]);
    if (i % 2 == 0 && !s.weights.logit_spread.empty()) {
      const double top = *std::max_element(s.weights.logit_spread.begin(), s.weights.logit_spread.end());
      if (top > kSaturatedRoot * kSaturatedRoot) saturated_block = i / 2, saturated_spread = top;
    }
    if (c.norm != NormPlacement::none)
      spread = sublayer_bands(numbers, i, s, probes[static_cast<std::size_t>(i)], spread, inputs.sequences, tables, b);
    token_aligned_var *= rn.lambda * rn.lambda;
    for (double& v : token_aligned_at) v *= rn.lambda * rn.lambda;
    if (post) {
      const double sum_var = s.sum.var();
      token_aligned_var = sum_var > 0.0 ? token_aligned_var * s.out.var() / sum_var : 0.0;
      for (std::int64_t a = 0; a < s.sum.buckets(); ++a) {
        double& v = token_aligned_at[static_cast<std::size_t>(a)];
        v = s.sum.diag(a) > 0.0 ? v * s.out.diag(a) / s.sum.diag(a) : 0.0;
      }
    }
    if (i >= last_start && i % 2 == 0) {
      Sublayer& k = kept[static_cast<std::size_t>(i - last_start)].emplace(s);
      k.branch_in = k.mixed = k.branch = TokenField();  // (what only the probed forward pass keeps)
    }
    x = std::move(s.out);
  }
  TokenField head_in = x;
  int probe_final = -1;
  if (pre) {
    head_in = norm_forward(c.norm_kind, x, d, c.norm_eps);
    token_aligned_var = x.var() > 0.0 ? token_aligned_var * head_in.var() / x.var() : 0.0;
    for (std::int64_t a = 0; a < x.buckets(); ++a) {
      double& v = token_aligned_at[static_cast<std::size_t>(a)];
      v = x.diag(a) > 0.0 ? v * head_in.diag(a) / x.diag(a) : 0.0;
    }
    probe_final = b.add("final_norm.out", "norm", -1);
    b.set_forward(probe_final, head_in.signal());
  }
  const Signal head_signal = head_in.signal();
  const double head_std = c.tie_embeddings ? numbers.token_embed_std : numbers.readout_std;
  const double multiplier_sq = numbers.output_multiplier * numbers.output_multiplier;
  const HeadLogits head = head_logits(numbers, head_signal, token_aligned_var, tok_var);
  const Signal& logits = head.logits;
  const bool self_logit = head.self_logit;
  const double classes = static_cast<double>(c.vocab);
  const int probe_logits = b.add("head.logits", "logits", -1);
  b.set_forward(probe_logits, logits);
  // An untied head is a fresh linear map of the normed head input; a tied head reads the input tokens' own
  // embeddings back, and has no band. Without norms no probe has one: the attention logits follow the stream's
  // scale, which the bands do not carry (docs/theory.md).
  if (!c.tie_embeddings && c.norm != NormPlacement::none)
    b.prediction.probes[static_cast<std::size_t>(probe_logits)].var_log_sd = std::sqrt(linear_square_mean_log_var(
        {&head_in, spread.cross}, 1.0 / static_cast<double>(d), c.vocab, inputs.sequences));
  if (c.norm == NormPlacement::none)
    for (ProbeTheory& t : b.prediction.probes) t.var_log_sd = kNaN;

  // Backward: d(mean CE)/d(logits), with the tied head's self logit when there is one; targets independent of the
  // logits. Two rows of one sequence covary through the batch's coinciding tokens and the logits' row correlation
  // (loss_gradient); the head's backward is a linear map, so its input gradient has the same token covariance.
  const double rows = static_cast<double>(inputs.sequences * tokens);
  const double unit = inputs.grad_scale * inputs.grad_scale / (classes * rows * rows);
  // The head's input gradient Σ_v g_v·E_v has the part g_self·E_tok along the input token's row, a share
  // κ = α²/var_h of which lies along h itself; the first norm below (which removes its output's own direction) drops
  // that part: the fraction κ·E[g_self²]/E[Σ_v g_v²] of the variance, and a positive covariance between rows
  // (loss_gradient). Without norms nothing removes it.
  const double aligned_share =
      self_logit && c.norm != NormPlacement::none ? std::min(1.0, token_aligned_var / head_signal.var) : 0.0;
  const TokenCoincidences coincidences = token_coincidences(layout, inputs, c.vocab);
  std::vector<double> aligned_share_at(token_aligned_at.size(), 0.0);
  for (std::int64_t a = 0; a < head_in.buckets() && aligned_share > 0.0; ++a)
    aligned_share_at[static_cast<std::size_t>(a)] =
        head_in.diag(a) > 0.0 ? std::min(1.0, token_aligned_at[static_cast<std::size_t>(a)] / head_in.diag(a)) : 0.0;
  const LossGradient loss =
      loss_gradient(layout, head_in, head, classes, unit, coincidences, aligned_share, aligned_share_at);
  b.set_backward(probe_logits, loss.at_head.signal());
  const double head_gain = multiplier_sq * classes * head_std * head_std;
  TokenGrad g = scaled(loss.at_head, head_gain);
  const TokenGrad first_norm_reads = scaled(loss.norm_reads, head_gain);
  // The gradient's part along the stream's common part, per position (sublayer_backward).
  std::vector<double> aligned = loss.aligned;
  for (double& a : aligned) a *= std::sqrt(head_gain);
  if (pre) {
    b.set_backward(probe_final, g.signal());
    g = norm_backward(c.norm_kind, x, first_norm_reads, c.norm_eps);
    divide_by_norm_scale(c.norm_kind, x, c.norm_eps, aligned);
  }
  // The head's gradient is a random linear map's transpose: 1/d of it lies along the mean (sublayer_backward).
  std::vector<double> mean_share(static_cast<std::size_t>(g.buckets()), 1.0);
  for (int start = static_cast<int>(checkpoints.size() - 1) * segment; start >= 0; start -= segment) {
    const int end = std::min(start + segment, sublayers);
    std::vector<Sublayer> states;
    states.reserve(static_cast<std::size_t>(end - start));
    TokenField stream = checkpoints[static_cast<std::size_t>(start / segment)];
    for (int i = start; i < end; ++i) {
      std::optional<Sublayer>* forward = start == last_start ? &kept[static_cast<std::size_t>(i - start)] : nullptr;
      if (forward && forward->has_value() && same_bits((*forward)->input, stream))
        states.push_back(std::move(**forward));
      else
        states.push_back(sublayer_forward(numbers, i, stream, rule, nullptr, nullptr));
      if (forward) forward->reset();
      stream = states.back().out;
    }
    for (int i = end - 1; i >= start; --i) {
      const TokenGrad* norm_reads = i == sublayers - 1 && post ? &first_norm_reads : nullptr;
      g = sublayer_backward(numbers, i, states[static_cast<std::size_t>(i - start)], g, norm_reads,
                            aligned_share > 0.0 && inputs.common_part_gradient ? &aligned : nullptr,
                            inputs.norm_removes_part, post && inputs.norm_scale_spread, mean_share, rule, b,
                            probes[static_cast<std::size_t>(i)]);
      states.pop_back();
    }
  }
  b.set_backward(probe_embed, g.signal());
  if (saturated_block >= 0) {
    // Everything upstream of that attention's output (the probes are in forward order): its own input and every
    // probe below it.
    const int cut = probes[static_cast<std::size_t>(2 * saturated_block)].branch;
    std::ostringstream why;
    why << std::setprecision(2) << "below block " << saturated_block
        << "'s saturated attention (logit spread √D = " << std::sqrt(saturated_spread) << " > " << kSaturatedRoot
        << ": one-hot softmax rows; docs/theory.md, \"Saturated softmax\")";
    const std::string reason = why.str();
    for (int i = 0; i < cut; ++i) {
      ProbeTheory& t = b.prediction.probes[static_cast<std::size_t>(i)];
      t.backward_var = kNaN;
      t.backward_corr = kNaN;
      if (t.no_backward.empty()) t.no_backward = reason;
    }
  }

  b.prediction.formulae = transformer_formulae(c, inputs, coincidences.describe(),
                                               aligned_share > 0.0 && inputs.common_part_gradient, b.correlated_logits);
  return b.prediction;
}

namespace {

// Var[log var] of a residual stream y = λ·x + β·φ(W x + b) (the residual MLP's layers l ≥ 1) over
// initialisations, from the input stream's `input_log_var` (docs/theory.md, "Finite-width bands", residual
// streams). Three parts, to first order in 1/width, every moment of the stream taken to scale with its variance:
// the input's own spread, carried with the share its skip and its branch (whose Var[φ] follows the stream through
// K with slope post_log_slope·weight_share) keep in y; the branch variance's own spread post_kappa/width; and
// the empirical cross-covariance of x and φ across units (zero in expectation, each unit's product an
// independent draw of its branch weights), Var = (v_x·Var φ/B + (1 − 1/B)·c_x·v_x·Cov(φ_b, φ_b'))/width.
double residual_stream_log_var(const Signal& x, const Signal& y, const BandTerms& t, double lambda, double beta,
                               double weight_share, double input_log_var, std::int64_t width,
                               std::int64_t samples) {
  if (!(y.var > 0)) return 0.0;
  const double n = static_cast<double>(width);
  const double b = static_cast<double>(std::max<std::int64_t>(1, samples));
  const double skip = lambda * lambda * x.var, branch = beta * beta * t.post_var;
  const double carried = (skip + branch * t.post_log_slope * weight_share) / y.var;
  const double cross = (x.var * t.post_var / b + (1.0 - 1.0 / b) * x.corr * x.var * t.post_pair_cov) / n;
  return carried * carried * input_log_var + branch * branch * t.post_kappa / n / (y.var * y.var) +
         4.0 * lambda * lambda * beta * beta * cross / (y.var * y.var);
}

// The measurement's own spread: the log of a mean of squares of `units` × samples Gaussian values whose samples
// correlate by `corr` (variance 2/units·(1/B + (1 − 1/B)·corr²)).
double square_mean_log_var(std::int64_t units, std::int64_t samples, double corr) {
  const double b = static_cast<double>(std::max<std::int64_t>(1, samples));
  return 2.0 / static_cast<double>(units) * (1.0 / b + (1.0 - 1.0 / b) * corr * corr);
}

// The O(1/width) shift of a residual MLP's expected variances (docs/theory.md, "Finite-width bands", the mean of a
// residual stream). At finite width each sample's stream has its own scale Q_b and its own mean over units x̄_b:
// its branch's pre-activations are N(0, K_b) with K_b = w·n·Q_b + σ_b², so a sample with a larger scale also gets a
// larger branch mean m(K_b) (ReLU: √(K_b/2π)), which its stream accumulates. The measured variance over units and
// samples is mean_b Q_b − (mean_b x̄_b)², which exceeds the infinite-width λ²v + β²Var φ by the samples' spread of
// x̄_b (less its 1/B part) plus the Jensen and covariance terms below. Per sample, (q, d) = (δQ_b/Q, δx̄_b) is
// carried linearly from layer to layer with fresh noise from each layer's weights: the branch's mean square, its
// mean over units and the skip–branch cross term, each an average over `width` independent units. `total` is the
// covariance of one sample's (q, d), `common` the part two samples share (their noises correlate through the
// pre-activations' correlation); the per-sample spread of x̄_b is total − common.
// One MLP layer's forward signals (out: the residual stream after the add, layers l ≥ 1 of the residual form) and
// its probes.
struct MlpLayerState {
  Signal input, pre, post, out;
  int probe_pre = -1, probe_post = -1, probe_out = -1;
};

struct ResidualMeanShift {
  double pre = 0.0, post = 0.0, out = 0.0;  // relative shifts of the layer's preact, postact and out variances
};

std::vector<ResidualMeanShift> residual_mlp_mean_shifts(Activation phi, const std::vector<MlpLayerState>& states,
                                                        const std::vector<MlpLayerNumbers>& numbers,
                                                        std::int64_t width, std::int64_t samples,
                                                        double input_norm_spread, const GaussHermite& rule) {
  const std::size_t layers = states.size();
  std::vector<ResidualMeanShift> shifts(layers);
  if (layers < 2) return shifts;
  const double n = static_cast<double>(width);
  const double batch = static_cast<double>(std::max<std::int64_t>(1, samples));
  const auto f = [phi](double x) { return activation_value(phi, x); };
  const auto f2 = [&](double x) { return f(x) * f(x); };
  // E[φ] and E[φ²] at pre-activation variance K·(1 + δ), and their first and (halved) second derivatives in δ.
  struct Slopes {
    double m = 0, a = 0, m1 = 0, m2 = 0, a1 = 0, a2 = 0;
  };
  const auto slopes = [&](double k) {
    constexpr double h = 1e-3;
    const auto at = [&](double scale) {
      const double sd = std::sqrt(k * scale);
      return std::pair<double, double>{rule.expect(f, 0.0, sd), rule.expect(f2, 0.0, sd)};
    };
    const auto [m0, a0] = at(1.0);
    const auto [m_up, a_up] = at(1.0 + h);
    const auto [m_down, a_down] = at(1.0 - h);
    return Slopes{m0,
                  a0,
                  (m_up - m_down) / (2 * h),
                  0.5 * (m_up - 2 * m0 + m_down) / (h * h),
                  (a_up - a_down) / (2 * h),
                  0.5 * (a_up - 2 * a0 + a_down) / (h * h)};
  };
  // Covariances (× width) of one unit's φ², φ for one sample (c = 1) or two samples whose pre-activations
  // correlate by c: Cov(φ²,φ²), Cov(φ²,φ), Cov(φ,φ).
  struct UnitCov {
    double ee = 0, em = 0, mm = 0;
  };
  const auto unit_cov = [&](double k, double c, const Slopes& sl) {
    const double sd = std::sqrt(k);
    if (c >= 1.0) {
      return UnitCov{rule.expect([&](double x) { return f2(x) * f2(x); }, 0.0, sd) - sl.a * sl.a,
                     rule.expect([&](double x) { return f2(x) * f(x); }, 0.0, sd) - sl.a * sl.m,
                     sl.a - sl.m * sl.m};
    }
    return UnitCov{rule.expect_pair(f2, f2, 0.0, sd, c) - sl.a * sl.a,
                   rule.expect_pair(f2, f, 0.0, sd, c) - sl.a * sl.m, rule.expect_pair(f, f, 0.0, sd, c) - sl.m * sl.m};
  };
  using Cov2 = std::array<double, 3>;  // (qq, qd, dd)
  // Layer 0's output is the first stream: Q = E[φ²], x̄ = E[φ]; the data's per-sample norms enter through K_0.
  const Signal& pre0 = states[0].pre;
  const double share0 = pre0.var > 0 ? std::max(0.0, pre0.var - numbers[0].bias_var) / pre0.var : 0.0;
  const Slopes s0 = slopes(pre0.var);
  const double v0 = share0 * share0 * input_norm_spread;
  const UnitCov same0 = unit_cov(pre0.var, 1.0, s0), pair0 = unit_cov(pre0.var, std::clamp(pre0.corr, -1.0, 1.0), s0);
  Cov2 total{(s0.a1 * s0.a1 * v0 + same0.ee / n) / (s0.a * s0.a),
             (s0.a1 * s0.m1 * v0 + same0.em / n) / s0.a, s0.m1 * s0.m1 * v0 + same0.mm / n};
  Cov2 common{pair0.ee / n / (s0.a * s0.a), pair0.em / n / s0.a, pair0.mm / n};
  double shift_q = s0.a2 * v0, shift_mean = s0.m2 * v0;  // E[Q_b] − Q, E[x̄_b] − x̄
  for (std::size_t l = 1; l < layers; ++l) {
    const Signal& x = states[l].input;
    const Signal& pre = states[l].pre;
    const double lambda = numbers[l].residual.lambda, beta = numbers[l].residual.beta;
    const double q = x.var + x.mean * x.mean;
    if (!(pre.var > 0) || !(q > 0)) break;
    const double share = std::max(0.0, pre.var - numbers[l].bias_var) / pre.var;
    const Slopes sl = slopes(pre.var);
    const UnitCov same = unit_cov(pre.var, 1.0, sl), pair = unit_cov(pre.var, std::clamp(pre.corr, -1.0, 1.0), sl);
    const double corr_x = std::clamp(x.corr, -1.0, 1.0);
    // Shifts at this layer's preact and postact, from the input stream's.
    const double jensen_a = sl.a1 * share * shift_q / q + sl.a2 * share * share * total[0];
    const double jensen_m = sl.m1 * share * shift_q / q + sl.m2 * share * share * total[0];
    const double spread_m_total = sl.m1 * sl.m1 * share * share * total[0] + same.mm / n;
    const double spread_m_common = sl.m1 * sl.m1 * share * share * common[0] + pair.mm / n;
    const double post_var = states[l].post.var;
    shifts[l].pre = share * shift_q / q;
    if (post_var > 0) {
      shifts[l].post = (jensen_a - 2.0 * sl.m * jensen_m -
                        (spread_m_common + (spread_m_total - spread_m_common) / batch)) /
                       post_var;
    }
    // The stream after the add.
    const double mean_out = lambda * x.mean + beta * sl.m;
    const double var_out = lambda * lambda * x.var + beta * beta * post_var;
    const double q_out = var_out + mean_out * mean_out;
    const double mqq = (lambda * lambda * q + beta * beta * sl.a1 * share + 2 * lambda * beta * x.mean * sl.m1 * share) / q_out;
    const double mqd = 2 * lambda * beta * sl.m / q_out;
    const double mdq = beta * sl.m1 * share, mdd = lambda;
    const auto carry = [&](const Cov2& c, const UnitCov& u, double cross) {
      const double ee = u.ee / n, em = u.em / n, mm = u.mm / n;
      const double lb = lambda * beta;
      const double noise_qq = (beta * beta * beta * beta * ee + 4 * lb * beta * beta * x.mean * em +
                               4 * lb * lb * x.mean * x.mean * mm + 4 * lb * lb * cross / n) /
                              (q_out * q_out);
      const double noise_qd = (beta * beta * beta * em + 2 * lb * beta * x.mean * mm) / q_out;
      const double noise_dd = beta * beta * mm;
      return Cov2{mqq * mqq * c[0] + 2 * mqq * mqd * c[1] + mqd * mqd * c[2] + noise_qq,
                  mqq * mdq * c[0] + (mqq * mdd + mqd * mdq) * c[1] + mqd * mdd * c[2] + noise_qd,
                  mdq * mdq * c[0] + 2 * mdq * mdd * c[1] + mdd * mdd * c[2] + noise_dd};
    };
    const double next_shift_q = lambda * lambda * shift_q + beta * beta * jensen_a +
                                2 * lambda * beta * (x.mean * jensen_m + sl.m * shift_mean + sl.m1 * share * total[1]);
    shift_mean = lambda * shift_mean + beta * jensen_m;
    shift_q = next_shift_q;
    total = carry(total, same, x.var * post_var);
    common = carry(common, pair, corr_x * x.var * pair.mm);
    if (var_out > 0) {
      const double mean_spread = common[2] + (total[2] - common[2]) / batch;
      shifts[l].out = (shift_q - 2 * mean_out * shift_mean - mean_spread) / var_out;
    }
  }
  return shifts;
}

// The gradient's part along the forward signal (docs/theory.md, "The gradient's mean over units"). Through
// x → λx + β·φ(Wx) the branch's backward Wᵀ(φ'(Wx)⊙g) is not independent of g's mean over units: by Stein's lemma
// in W, E_W[Wᵀ(φ'⊙g)] = σ_w²·x·mean_j ∂(φ'_j·g_j)/∂pre_j, a drift along each sample's own stream x. Per sample the
// gradient is then u·1 + V·x + (a part independent of the layer's weights), and through one layer
//   κ = σ_w²·(ρ·ḡ + β·e·V),  ḡ = u + V·m_out,  ρ = E[φ''(pre)],  e = E[φ''φ + φ'²] − ρ·φ̄,
//   u ← λu + λβ·φ̄·V,  V ← λ²V + βκ,
// with m the stream's mean over units and φ̄ = E[φ]. The pair (u, V) is carried as its second moments over samples
// (`per`) and between two samples of the batch (`shared`); the measured variance subtracts the batch mean's square.
// Only a stream with a mean over units (ReLU, GELU) feeds it: with m = 0 the drift stays at its 1/width seed.
struct AlignedGradient {
  // Second moments of (u, V): [uu, uV, VV], one sample's and two samples' of one batch.
  std::array<double, 3> per{}, shared{};
  // E[(a·u + b·V)(c·u + d·V)], and E[(a·u + b·V)²].
  static double bilinear(const std::array<double, 3>& m, double a, double b, double c, double d) {
    return a * c * m[0] + (a * d + b * c) * m[1] + b * d * m[2];
  }
  static double quad(const std::array<double, 3>& m, double a, double b) { return bilinear(m, a, b, a, b); }
  // The batch mean's square of a·u + b·V (what a population variance over the batch subtracts).
  double batch_mean_sq(double a, double b, double batch) const {
    return quad(per, a, b) / batch + (1.0 - 1.0 / batch) * quad(shared, a, b);
  }
  void map(double uu, double uv, double vu, double vv) {
    for (std::array<double, 3>* c : {&per, &shared}) {
      const std::array<double, 3> o = *c;
      *c = {uu * uu * o[0] + 2 * uu * uv * o[1] + uv * uv * o[2],
            uu * vu * o[0] + (uu * vv + uv * vu) * o[1] + uv * vv * o[2],
            vu * vu * o[0] + 2 * vu * vv * o[1] + vv * vv * o[2]};
    }
  }
};

// The activation's expectations the drift needs, at pre ~ N(mean, K): by Stein, E[φ''] = E[(pre − μ)φ']/K and
// E[φ''φ + φ'²] = E[(pre − μ)φ'φ]/K.
struct DriftMoments {
  double rho = 0.0, e = 0.0, slope = 0.0;  // E[φ''], E[φ''φ + φ'²] − E[φ'']·E[φ], E[φ']
  double a1 = 0.0, a2 = 0.0;               // E[φ'²φ] − E[φ'²]E[φ], E[φ'²φ²] − E[φ'²]E[φ²]
  double slope_phi = 0.0;                  // E[φ'φ] − E[φ']E[φ]
};

DriftMoments drift_moments(Activation phi, const Signal& pre, const GaussHermite& rule) {
  DriftMoments d;
  if (!(pre.var > 0)) return d;
  const double sd = std::sqrt(pre.var), mu = pre.mean;
  const auto f = [phi](double x) { return activation_value(phi, x); };
  const auto df = [phi](double x) { return activation_derivative(phi, x); };
  const double mean_f = rule.expect(f, mu, sd), mean_f2 = rule.expect([&](double x) { return f(x) * f(x); }, mu, sd);
  const double mean_d2 = rule.expect([&](double x) { return df(x) * df(x); }, mu, sd);
  d.slope = rule.expect(df, mu, sd);
  d.rho = rule.expect([&](double x) { return (x - mu) * df(x); }, mu, sd) / pre.var;
  d.e = rule.expect([&](double x) { return (x - mu) * df(x) * f(x); }, mu, sd) / pre.var - d.rho * mean_f;
  d.a1 = rule.expect([&](double x) { return df(x) * df(x) * f(x); }, mu, sd) - mean_d2 * mean_f;
  d.a2 = rule.expect([&](double x) { return df(x) * df(x) * f(x) * f(x); }, mu, sd) - mean_d2 * mean_f2;
  d.slope_phi = rule.expect([&](double x) { return df(x) * f(x); }, mu, sd) - d.slope * mean_f;
  return d;
}

// The readout's seed of (u, V) at the last stream h (second moment top_var per unit). g = s·W_oᵀd with logits
// ℓ = s·W_o·h: Stein in W_o gives the drift V = s²σ_o²·Σ_c E[∂d_c/∂ℓ_c] along h, and the mean over units
// (1/width)·R·d, R = W_o·1 the rows' sums, which correlate with the logits by ρ = m_h/√q_h (h's mean over units
// carries R into every logit). With R = ρ·ℓ̂ + √(1 − ρ²)·η (ℓ̂ the standardised logits, η independent),
// E[(R·d)²] = Var R·(ρ²·E[(ℓ̂·d)²] + (1 − ρ²)·E|d|²) per sample; for two samples of the batch the logits' shared
// part (correlation r) decides how much of it they share, as for the loss gradient's rows ("Rows of one sequence").
AlignedGradient readout_aligned_gradient(const MlpConfig& c, const MlpNumbers& numbers, const TheoryInputs& inputs,
                                         const Signal& h, const Signal& out, double top_var) {
  AlignedGradient a;
  const double width = static_cast<double>(c.width);
  const double q = h.var + h.mean * h.mean;
  if (!(q > 0) || !(out.var > 0) || !(top_var > 0)) return a;
  const double rho_sq = std::clamp(h.mean * h.mean / q, 0.0, 1.0);
  const double r = std::clamp(out.corr, -1.0, 1.0);
  const double rows = static_cast<double>(std::max<std::int64_t>(1, inputs.sequences));
  const double classes = static_cast<double>(c.outputs);
  double per = 1.0, shared = 0.0, drift = 0.0;  // per and shared in units of E|d|²; drift = Σ_c E[∂d_c/∂ℓ_c]
  if (c.head == MlpHead::classification) {
    // d = p − y (times scale/rows): E|d|² = S − 2/C + 1, E[(ℓ̂·d)²] = F − 2/C + 1 (E[(ℓ̂·p)·ℓ̂_y] = 1/C by Stein,
    // the softmax being shift-invariant), and for two samples E[(R·d_i)(R·d_j)] = (ρ²F + (1 − ρ²)S − 1/C)·s(r)
    // − 1/C + P(y_i = y_j) (the first batch's labels; 1/C without them).
    const double s_sq = softmax_sum_p_sq(out.var, c.outputs);
    const double f_sq = softmax_logit_projection_sq(out.var, c.outputs);
    const double iso = s_sq - 2.0 / classes + 1.0;
    double same_label = 1.0 / classes;
    if (inputs.batch_targets.size() > 1) {
      const double n = static_cast<double>(inputs.batch_targets.size());
      same_label = same_label_pairs(inputs.batch_targets) / (n * (n - 1.0));
    }
    per = (rho_sq * (f_sq - 2.0 / classes + 1.0) + (1.0 - rho_sq) * iso) / iso;
    shared = ((rho_sq * f_sq + (1.0 - rho_sq) * s_sq - 1.0 / classes) *
                  softmax_shared_excess_blurred(r, out.var, c.outputs, s_sq) -
              1.0 / classes + same_label) /
             iso;
    drift = (1.0 - s_sq) * inputs.grad_scale / rows;
  } else {
    // d = (ℓ − t)/numel with targets independent of the logits: jointly Gaussian R and ℓ (Isserlis).
    const double t2 = inputs.target_second_moment, l2 = out.var + out.mean * out.mean;
    const double iso = l2 + t2;
    per = ((1.0 + 2.0 * rho_sq) * l2 + t2 + (classes - 1.0) * rho_sq * l2) / iso;
    shared = ((r + 2.0 * rho_sq) * l2 + (classes - 1.0) * rho_sq * l2) / iso;
    drift = inputs.grad_scale / rows;  // Σ_c ∂d_c/∂ℓ_c = C·scale/numel
  }
  const double v = numbers.output_multiplier * numbers.output_multiplier * numbers.readout_weight_var * drift;
  const double v_sq = v * v, mean_part = v_sq * h.mean * h.mean;
  a.per = {std::max(0.0, top_var * per / width - mean_part), 0.0, v_sq};
  a.shared = {std::max(0.0, top_var * shared / width - mean_part), 0.0, v_sq};
  return a;
}

}  // namespace

ProbePrediction predict_mlp(const MlpNumbers& numbers, const TheoryInputs& inputs) {
  const MlpConfig& c = numbers.config;
  PROPLAB_CHECK(static_cast<int>(numbers.layers.size()) == c.layers, "predict_mlp: ", numbers.layers.size(),
                " layer descriptions for ", c.layers, " layers");
  const Activation phi = c.activation;
  const GaussHermite rule(64);
  Builder b;
  const char* no_corr = "corr: one token per sample (the token correlation is not defined)";
  std::vector<MlpLayerState> states(static_cast<std::size_t>(c.layers));
  Signal h{inputs.input_mean, inputs.input_var, 0.0};
  for (int l = 0; l < c.layers; ++l) {
    MlpLayerState& s = states[l];
    const MlpLayerNumbers& ln = numbers.layers[l];
    const std::string prefix = "layers." + std::to_string(l);
    s.input = h;
    s.pre = linear_forward(h, l == 0 ? c.input_dim : c.width, ln.weight_var, ln.bias_var);
    s.post = s.pre.var > 0 ? activation_forward(phi, s.pre, rule) : Signal{activation_value(phi, s.pre.mean), 0.0, 1.0};
    s.probe_pre = b.add(prefix + ".preact", "preact", l);
    b.set_forward(s.probe_pre, s.pre);
    s.probe_post = b.add(prefix + ".postact", "postact", l);
    b.set_forward(s.probe_post, s.post);
    h = s.post;
    if (c.residual && l > 0) {
      h = residual_forward(s.input, s.post, ln.residual.lambda, ln.residual.beta);
      s.out = h;
      s.probe_out = b.add(prefix + ".out", "residual", l);
      b.set_forward(s.probe_out, h);
    }
  }
  Signal out = linear_forward(h, c.width, numbers.readout_weight_var, numbers.readout_bias_var);
  out.var *= numbers.output_multiplier * numbers.output_multiplier;
  const int probe_out = b.add("readout.out", "logits", -1);
  b.set_forward(probe_out, out);

  const std::int64_t rows = inputs.sequences;
  GradSignal g;
  if (c.head == MlpHead::classification) {
    g = GradSignal{cross_entropy_grad_var(out, c.outputs, rows, inputs.grad_scale), 0.0};
  } else {
    // d(0.5·mean (y - t)²)/dy = (y - t)/numel with targets independent of the output.
    const double numel = static_cast<double>(rows) * static_cast<double>(c.outputs);
    g = GradSignal{(out.var + out.mean * out.mean + inputs.target_second_moment) / (numel * numel) * inputs.grad_scale *
                       inputs.grad_scale,
                   0.0};
  }
  b.set_backward(probe_out, g);
  const double multiplier_sq = numbers.output_multiplier * numbers.output_multiplier;
  g = linear_backward(GradSignal{g.var * multiplier_sq, 0.0}, c.outputs, numbers.readout_weight_var);
  const double width = static_cast<double>(c.width), batch = static_cast<double>(std::max<std::int64_t>(1, rows));
  AlignedGradient aligned = readout_aligned_gradient(c, numbers, inputs, h, out, g.var);
  for (int l = c.layers - 1; l >= 0; --l) {
    const MlpLayerState& s = states[l];
    const MlpLayerNumbers& ln = numbers.layers[l];
    // The layer as x_out = λ·x + β·φ(W·x + b); a plain layer is λ = 0, β = 1.
    const bool residual = s.probe_out >= 0;
    const double lambda = residual ? ln.residual.lambda : 0.0, beta = residual ? ln.residual.beta : 1.0;
    const double m_out = residual ? s.out.mean : s.post.mean;
    const DriftMoments dm = drift_moments(phi, s.pre, rule);
    const double beta_sq = beta * beta;
    // g's mean over units is u + V·m_out; a population variance subtracts its batch mean's square.
    const double out_mean_sq = aligned.batch_mean_sq(1.0, m_out, batch);
    GradSignal d_post = g;
    if (residual) {
      b.set_backward(s.probe_out, GradSignal{g.var - out_mean_sq, 0.0});
      d_post = residual_branch_backward(g, beta);
    }
    b.set_backward(s.probe_post, GradSignal{d_post.var - beta_sq * out_mean_sq, 0.0});
    GradSignal d_pre = s.pre.var > 0
                           ? activation_backward(phi, s.pre, d_post, rule)
                           : GradSignal{d_post.var * std::pow(activation_derivative(phi, s.pre.mean), 2), 0.0};
    // g holds β·V·φ_j, which φ'_j sees: E[φ'²g²] gains β²·E[V²]·a2 + 2β·E[V·(u + λV·m_in)]·a1.
    const double m_in = s.input.mean;
    const double per_v = aligned.per[2], per_uv = aligned.per[1];
    d_pre.var += beta_sq * (beta_sq * per_v * dm.a2 + 2.0 * beta * (per_uv + lambda * m_in * per_v) * dm.a1);
    // Its batch mean over units: β·(E[φ']·ḡ + β·V·(E[φ'φ] − E[φ']E[φ])).
    b.set_backward(
        s.probe_pre,
        GradSignal{d_pre.var - beta_sq * aligned.batch_mean_sq(dm.slope, dm.slope * m_out + beta * dm.slope_phi, batch),
                   0.0});
    if (l > 0) {
      const GradSignal d_in = linear_backward(d_pre, c.width, ln.weight_var);
      g = residual ? residual_backward(g, d_in, lambda) : d_in;
      // The drift κ = k_u·u + k_V·V lies along x (second moment q_in); its cross term with the skip reads g's own
      // part along x: (g·x)/width = V·(x_out·x)/width + u·m_in, with (x_out·x)/width = λq_in + β·φ̄·m_in.
      const double sigma_w2 = ln.weight_var * width;
      const double q_in = s.input.var + m_in * m_in;
      const double phi_mean = s.post.mean;
      const double k_u = sigma_w2 * dm.rho, k_v = sigma_w2 * (dm.rho * m_out + beta * dm.e);
      const double drift_sq = AlignedGradient::quad(aligned.per, k_u, k_v);
      const double drift_g =
          AlignedGradient::bilinear(aligned.per, k_u, k_v, 0.0, 1.0) * (lambda * q_in + beta * phi_mean * m_in) +
          AlignedGradient::bilinear(aligned.per, k_u, k_v, 1.0, 0.0) * m_in;
      g.var += beta_sq * drift_sq * q_in + 2.0 * lambda * beta * drift_g;
      aligned.map(lambda, lambda * beta * phi_mean, beta * k_u, lambda * lambda + beta * k_v);
    }
  }
  // Finite-width bands: var_scale is Var[log K_l] of the pre-activation scale over initialisations; the input
  // batch is taken as given (K_0 fixed). A layer's output (φ for a plain layer, the residual stream for l ≥ 1 of
  // the residual form) has log-variance spread `stream`; the next layer's K carries it with its weight share.
  {
    double var_scale = 0.0, stream_before = 0.0;
    const auto set_band = [&](int probe, double log_var) {
      if (probe >= 0) b.prediction.probes[probe].var_log_sd = std::sqrt(std::max(0.0, log_var));
    };
    for (int l = 0; l < c.layers; ++l) {
      const MlpLayerState& s = states[l];
      const BandTerms t = band_terms(phi, s.pre, inputs.sequences, rule);
      set_band(s.probe_pre, var_scale + square_mean_log_var(c.width, inputs.sequences, s.pre.corr));
      set_band(s.probe_post, t.post_log_slope * t.post_log_slope * var_scale + t.post_kappa / c.width);
      double stream = t.log_slope * t.log_slope * var_scale + t.kappa / c.width;
      if (s.probe_out >= 0) {
        const MlpLayerNumbers& ln = numbers.layers[l];
        const double share = s.pre.var > 0 ? std::max(0.0, s.pre.var - ln.bias_var) / s.pre.var : 0.0;
        stream = residual_stream_log_var(s.input, s.out, t, ln.residual.lambda, ln.residual.beta, share, stream_before,
                                         c.width, inputs.sequences);
        set_band(s.probe_out, stream);
      }
      stream_before = stream;
      // The next linear layer: its weight part w·fan_in·E[x²] of K_{l+1} carries the fluctuation of its input.
      const double bias_var = l + 1 < c.layers ? numbers.layers[l + 1].bias_var : numbers.readout_bias_var;
      const double next_var = l + 1 < c.layers ? states[l + 1].pre.var : out.var / (numbers.output_multiplier *
                                                                                   numbers.output_multiplier);
      const double weight_share = next_var > 0 ? std::max(0.0, next_var - bias_var) / next_var : 0.0;
      var_scale = weight_share * weight_share * stream;
    }
    set_band(probe_out, var_scale + square_mean_log_var(c.outputs, inputs.sequences, out.corr));
  }
  // The residual form's O(1/width) shift of the expected variances (docs/theory.md; plain MLPs have none at this
  // order that the bookkeeping keeps).
  if (c.residual) {
    const std::vector<ResidualMeanShift> shifts = residual_mlp_mean_shifts(
        phi, states, numbers.layers, c.width, inputs.sequences, inputs.input_norm_spread, rule);
    for (int l = 1; l < c.layers; ++l) {
      const MlpLayerState& s = states[l];
      const auto shift = [&](int probe, double relative) {
        if (probe >= 0) b.prediction.probes[probe].var *= 1.0 + relative;
      };
      shift(s.probe_pre, shifts[l].pre);
      shift(s.probe_post, shifts[l].post);
      shift(s.probe_out, shifts[l].out);
    }
  }
  for (ProbeTheory& p : b.prediction.probes) {
    p.corr = kNaN;
    p.no_forward = no_corr;
  }

  // Mean field of the hidden layers (σ_w² = fan_in · per-entry variance).
  if (c.layers > 1) {
    const MlpLayerNumbers& hidden = numbers.layers[1];
    const MeanField field(phi, hidden.weight_var * static_cast<double>(c.width), hidden.bias_var, rule);
    MeanFieldSummary summary;
    const double q0 = states[0].pre.var + states[0].pre.mean * states[0].pre.mean;
    const double c0 = inputs.input_corr ? *inputs.input_corr : 0.0;
    const std::optional<double> q_star = field.fixed_point(q0);
    summary.q_star = q_star ? *q_star : std::numeric_limits<double>::infinity();
    summary.chi1 = field.chi1_at_fixed_point(q0);
    summary.phase = field.phase(1e-6, q0);
    summary.layers = field.propagate(q0, c0, c.layers - 1);
    if (q_star && *q_star > 0) {
      double corr = c0;
      for (int it = 0; it < 100000; ++it) {
        const double next = field.c_map(*q_star, corr);
        if (std::abs(next - corr) < 1e-13) {
          corr = next;
          break;
        }
        corr = next;
      }
      summary.c_star = corr;
    } else {
      summary.c_star = kNaN;
    }
    b.prediction.mean_field = summary;
  }
  b.prediction.formulae =
      "forward: linear_forward (q map), activation_forward(" + std::string(activation_identifier(phi)) + ")" +
      (c.residual ? ", residual_forward" : "") +
      "; backward: " + (c.head == MlpHead::classification ? "softmax cross-entropy" : "mean squared error") +
      " gradient, linear/activation" + (c.residual ? "/residual" : "") +
      " backward maps; mean field: MeanField q*, c*, chi1 (Poole et al. 2016, Schoenholz et al. 2017)";
  return b.prediction;
}

}  // namespace proplab::theory
