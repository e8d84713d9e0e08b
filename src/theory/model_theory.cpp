#include "theory/model_theory.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "core/error.h"

namespace proplab::theory {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

double clamp_unit(double r) { return std::clamp(r, -1.0, 1.0); }

Activation to_theory(ops::Activation activation) {
  // theory::Activation lists the same functions in the same order as ops::Activation.
  return static_cast<Activation>(static_cast<int>(activation));
}

// Sums over the causal attention pattern of one sequence of L tokens (query t sees keys 0..t) that the causal
// maps need, for softmax weights whose logits vary across keys with variance `logit_var` and across queries with
// correlation `query_corr`. A query over n keys has E[Σ_s w_s²] ≈ s_n = e^D/(e^D + n - 1) (log-normal weights;
// exact at D = 0 and for n = 1).
struct CausalSums {
  double self = 0.0;        // A: mean over queries of E[Σ_s w_ts²]
  double cross = 0.0;       // P: mean over query pairs t ≠ t' of Σ_s E[w_ts w_t's]
  double grad_self = 0.0;   // mean over keys of (Σ_{t≥s} w_ts)² - Σ_t w_ts² (uniform weights)
  double grad_cross = 0.0;  // mean over key pairs s ≠ s' of Σ_t w_ts w_ts'
  double grad_pair = 0.0;   // mean over key pairs of (Σ_t w_ts)(Σ_t w_ts') - Σ_t w_ts w_ts'
  double score = 0.0;       // mean over queries of E[Σ_s w_ts²]·(1 - 1/n): the logit-gradient factor
};

CausalSums causal_sums(std::int64_t length, double logit_var, double query_corr) {
  CausalSums sums;
  const double l = static_cast<double>(length);
  const double growth = std::exp(std::min(logit_var, 700.0));
  double self = 0.0, uniform_self = 0.0, score = 0.0, cross_uniform = 0.0, grad_cross = 0.0;
  for (std::int64_t t = 0; t < length; ++t) {
    const double n = static_cast<double>(t + 1);
    const double s_n = growth / (growth + n - 1.0);
    self += s_n;
    uniform_self += 1.0 / n;
    score += s_n * (1.0 - 1.0 / n);
    cross_uniform += 2.0 * static_cast<double>(t) / n;  // pairs whose later query is t: Σ_s w_ts w_t's = 1/(t+1)
    grad_cross += static_cast<double>(t) / n;           // key pairs s ≠ s' ≤ t, both weighted 1/(t+1)
  }
  sums.self = self / l;
  sums.score = score / l;
  // Column sums of the uniform causal pattern: c_s = H_L - H_s.
  double harmonic_total = 0.0;
  for (std::int64_t k = 1; k <= length; ++k) harmonic_total += 1.0 / static_cast<double>(k);
  double column_sq = 0.0, harmonic = 0.0;
  for (std::int64_t s = 0; s < length; ++s) {
    const double column = harmonic_total - harmonic;
    column_sq += column * column;
    harmonic += 1.0 / static_cast<double>(s + 1);
  }
  sums.grad_self = (column_sq - uniform_self) / l;
  if (length > 1) {
    const double pairs = l * (l - 1.0);
    // Queries share keys: correlated queries put their weight on the same keys (factor e^{r_q·D}).
    sums.cross = std::min(sums.self, std::exp(std::min(query_corr * logit_var, 700.0)) * cross_uniform / pairs);
    sums.grad_cross = 2.0 * grad_cross / pairs;
    // Σ_s c_s = L: the mean product of two different columns.
    sums.grad_pair = (l * l - column_sq) / pairs - sums.grad_cross;
  }
  return sums;
}

// The residual stream and the saved signals of one sublayer, for the backward pass.
struct SublayerState {
  Signal input;      // x entering the sublayer
  Signal branch_in;  // what the branch reads (Norm(x) for pre, else x)
  Signal hidden;     // FFN pre-activation
  Signal v, q, k;    // attention projections
  CausalSums sums;
  double logit_var = 0.0;
  Signal sum;  // post: λx + βf before the norm
  int probe_input = -1, probe_norm = -1, probe_hidden = -1, probe_mixed = -1, probe_branch = -1, probe_sum = -1,
      probe_result = -1;
};

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
    if (probe >= 0) prediction.probes[probe].backward_var = g.var;
  }
  ProbePrediction prediction;
};

Signal norm_forward(const TransformerConfig& c, const Signal& x) {
  return c.norm_kind == NormKind::layernorm ? layernorm_forward(x, c.width) : rmsnorm_forward(x);
}
GradSignal norm_backward(const TransformerConfig& c, const Signal& x, const GradSignal& d_y) {
  return c.norm_kind == NormKind::layernorm ? layernorm_backward(x, d_y) : rmsnorm_backward(x, d_y);
}

}  // namespace

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
  const bool pre = config.norm == NormPlacement::pre, post = config.norm == NormPlacement::post;
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
  if (pre) names.push_back("final_norm.out");
  names.push_back("head.logits");
  return names;
}

double cross_entropy_grad_var(const Signal& logits, std::int64_t classes, std::int64_t rows, double grad_scale) {
  PROPLAB_CHECK(classes > 1 && rows > 0, "cross_entropy_grad_var: needs classes > 1 and rows > 0");
  const double c = static_cast<double>(classes), r = static_cast<double>(rows);
  const double spread = logits.var * (1.0 - logits.corr);
  const double growth = std::exp(std::min(spread, 700.0));
  const double sum_p_sq = growth / (growth + c - 1.0);
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

ProbePrediction predict_transformer(const TransformerNumbers& numbers, const TheoryInputs& inputs) {
  const TransformerConfig& c = numbers.config;
  PROPLAB_CHECK(static_cast<int>(numbers.blocks.size()) == c.layers, "predict_transformer: ", numbers.blocks.size(),
                " block descriptions for ", c.layers, " layers");
  const std::int64_t d = c.width, f = static_cast<std::int64_t>(c.ffn_mult) * c.width;
  const std::int64_t tokens = inputs.tokens > 0 ? inputs.tokens : c.seq_len;
  const std::int64_t head_dim = d / c.heads;
  const double p = c.dropout;
  const bool pre = c.norm == NormPlacement::pre, post = c.norm == NormPlacement::post;
  const Activation phi = to_theory(c.activation);
  const GaussHermite rule(64);
  Builder b;

  // Forward.
  const double tok_var = numbers.token_embed_std * numbers.token_embed_std;
  const double pos_var = numbers.position_embed_std * numbers.position_embed_std;
  const double embed_var = tok_var + pos_var;
  double r0 = inputs.input_corr ? *inputs.input_corr
                                : (embed_var > 0 ? tok_var / (static_cast<double>(c.vocab) * embed_var) : 1.0);
  Signal x{0.0, embed_var, clamp_unit(r0)};
  if (p > 0) x = dropout_forward(x, p);
  // The variance of the stream's component along its row's own token embedding (σ_tok·u, u the unit-variance
  // embedding row): branches are independent of u, so it is scaled by λ² at each residual and by the norms' gain²;
  // a tied head reads it back as the input token's own logit.
  double token_aligned_var = tok_var;
  const int probe_embed = b.add("embed.out", "embed", -1);
  b.set_forward(probe_embed, x);

  std::vector<SublayerState> states(2 * static_cast<std::size_t>(c.layers));
  for (int l = 0; l < c.layers; ++l) {
    const TransformerBlockNumbers& bn = numbers.blocks[l];
    const std::string block = "blocks." + std::to_string(l);
    for (int which = 0; which < 2; ++which) {
      SublayerState& s = states[2 * l + which];
      const bool attention = which == 0;
      const std::string prefix = block + (attention ? ".attn" : ".ffn");
      s.input = x;
      if (attention) s.probe_input = b.add(block + ".in", "residual", l), b.set_forward(s.probe_input, x);
      s.branch_in = x;
      if (pre) {
        s.branch_in = norm_forward(c, x);
        s.probe_norm = b.add(prefix + ".norm", "norm", l);
        b.set_forward(s.probe_norm, s.branch_in);
      }
      Signal branch;
      if (attention) {
        const double bias_var = bn.qkv_bias_std * bn.qkv_bias_std;
        s.q = linear_forward(s.branch_in, d, bn.q_std * bn.q_std, bias_var);
        s.k = linear_forward(s.branch_in, d, bn.k_std * bn.k_std, bias_var);
        s.v = linear_forward(s.branch_in, d, bn.v_std * bn.v_std, bias_var);
        // Logits scale·q·k over one head: total variance, and the part that varies across keys.
        const double scale_sq = numbers.logit_scale * numbers.logit_scale;
        const double logit_total = scale_sq * static_cast<double>(head_dim) * s.q.var * s.k.var;
        s.logit_var = logit_total * (1.0 - s.k.corr);
        s.sums = causal_sums(tokens, s.logit_var, s.q.corr);
        s.probe_hidden = b.add(prefix + ".logits", "logits", l);
        b.set_forward(s.probe_hidden, Signal{0.0, logit_total, kNaN});
        b.prediction.probes[s.probe_hidden].no_forward =
            "corr: the token correlation of attention logits is not recorded";
        b.prediction.probes[s.probe_hidden].backward_var = kNaN;
        b.prediction.probes[s.probe_hidden].no_backward = "the logits' gradient stays inside the fused attention op";
        // Causal mixing: out_t = Σ_s w_ts v_s; the shared part of v passes whole, the rest by Σ w².
        const double shared = s.v.corr;
        const double mixed_var = s.v.var * (shared + (1.0 - shared) * s.sums.self);
        const double mixed_cov = s.v.var * (shared + (1.0 - shared) * s.sums.cross);
        const Signal mixed{0.0, mixed_var, mixed_var > 0 ? clamp_unit(mixed_cov / mixed_var) : 1.0};
        branch =
            linear_forward(mixed, d, bn.attn_out_std * bn.attn_out_std, bn.attn_out_bias_std * bn.attn_out_bias_std);
      } else {
        s.hidden =
            linear_forward(s.branch_in, d, bn.ffn_in_std * bn.ffn_in_std, bn.ffn_in_bias_std * bn.ffn_in_bias_std);
        s.probe_hidden = b.add(prefix + ".preact", "preact", l);
        b.set_forward(s.probe_hidden, s.hidden);
        const Signal mixed = s.hidden.var > 0 ? activation_forward(phi, s.hidden, rule)
                                              : Signal{activation_value(phi, s.hidden.mean), 0.0, 1.0};
        s.probe_mixed = b.add(prefix + ".postact", "postact", l);
        b.set_forward(s.probe_mixed, mixed);
        branch = linear_forward(mixed, f, bn.ffn_out_std * bn.ffn_out_std, bn.ffn_out_bias_std * bn.ffn_out_bias_std);
      }
      if (p > 0) branch = dropout_forward(branch, p);
      s.probe_branch = b.add(prefix + ".out", "branch", l);
      b.set_forward(s.probe_branch, branch);
      const ResidualNumbers& rn = attention ? bn.attn_residual : bn.ffn_residual;
      Signal out = residual_forward(x, branch, rn.lambda, rn.beta);
      token_aligned_var *= rn.lambda * rn.lambda;
      if (post) {
        s.sum = out;
        s.probe_sum = b.add(prefix + ".sum", "residual", l);
        b.set_forward(s.probe_sum, out);
        out = norm_forward(c, out);
        token_aligned_var = s.sum.var > 0.0 ? token_aligned_var * out.var / s.sum.var : 0.0;
      }
      s.probe_result = b.add(block + (attention ? ".mid" : ".out"), "residual", l);
      b.set_forward(s.probe_result, out);
      x = out;
    }
  }
  Signal head_in = x;
  int probe_final = -1;
  if (pre) {
    head_in = norm_forward(c, x);
    token_aligned_var = x.var > 0.0 ? token_aligned_var * head_in.var / x.var : 0.0;
    probe_final = b.add("final_norm.out", "norm", -1);
    b.set_forward(probe_final, head_in);
  }
  const double head_std = c.tie_embeddings ? numbers.token_embed_std : numbers.readout_std;
  const double multiplier_sq = numbers.output_multiplier * numbers.output_multiplier;
  Signal logits = linear_forward(head_in, d, head_std * head_std);
  logits.var *= multiplier_sq;
  const double other_spread = logits.var * (1.0 - logits.corr);
  // Tied head: the row's own input token's logit is h·E_tok with h = α·E_tok/σ_tok + rest (α² the aligned
  // variance), so it has mean α·σ_tok·d and variance σ_tok²·d·(var_h + α²) (|E_tok|² is χ²-distributed).
  const double dims = static_cast<double>(d), classes = static_cast<double>(c.vocab);
  const bool self_logit = c.tie_embeddings && token_aligned_var > 0.0 && head_in.var > 0.0;
  const double self_mean =
      self_logit ? numbers.output_multiplier * std::sqrt(token_aligned_var) * numbers.token_embed_std * dims : 0.0;
  const double self_var = multiplier_sq * tok_var * dims * (head_in.var + token_aligned_var);
  if (self_logit) {
    // One logit in C is the self logit: the mixture's mean and variance over all elements.
    const double others_var = logits.var;
    logits.mean = self_mean / classes;
    logits.var =
        ((classes - 1.0) * others_var + self_var + self_mean * self_mean) / classes - logits.mean * logits.mean;
  }
  const int probe_logits = b.add("head.logits", "logits", -1);
  b.set_forward(probe_logits, logits);

  // Backward: d(mean CE)/d(logits), with the tied head's self logit when there is one; targets independent of the
  // logits and of each other (r_g = 0).
  const std::int64_t rows = inputs.sequences * tokens;
  GradSignal g{
      self_logit ? cross_entropy_grad_var_with_self(other_spread, self_mean, self_var, c.vocab, rows, inputs.grad_scale)
                 : cross_entropy_grad_var(logits, c.vocab, rows, inputs.grad_scale),
      0.0};
  b.set_backward(probe_logits, g);
  // The head's input gradient Σ_v g_v·E_v has the part g_self·E_tok along the input token's row, a share
  // α²/var_h of which lies along h itself; the first norm below (which removes its output's own direction) drops
  // that part: the fraction α²/var_h · E[g_self²]/E[Σ_v g_v²] of the variance.
  double first_norm_keep = 1.0;
  if (self_logit) {
    const SelfLogitMoments m = self_logit_moments(other_spread, self_mean, self_var, classes);
    const double self_g_sq = m.self_p_sq - 2.0 * m.self_p / classes + 1.0 / classes;
    const double all_g_sq = m.sum_p_sq - 2.0 / classes + 1.0;
    first_norm_keep = 1.0 - std::min(1.0, token_aligned_var / head_in.var) * self_g_sq / all_g_sq;
  }
  g = linear_backward(GradSignal{g.var * numbers.output_multiplier * numbers.output_multiplier, g.corr}, c.vocab,
                      head_std * head_std);
  if (pre) {
    b.set_backward(probe_final, g);
    g = norm_backward(c, x, GradSignal{g.var * first_norm_keep, g.corr});
  }
  for (int i = 2 * c.layers - 1; i >= 0; --i) {
    const SublayerState& s = states[i];
    const TransformerBlockNumbers& bn = numbers.blocks[i / 2];
    const bool attention = i % 2 == 0;
    b.set_backward(s.probe_result, g);
    GradSignal d_combined = g;
    if (post) {
      const double keep = i == 2 * c.layers - 1 ? first_norm_keep : 1.0;
      d_combined = norm_backward(c, s.sum, GradSignal{g.var * keep, g.corr});
      b.set_backward(s.probe_sum, d_combined);
    }
    const ResidualNumbers& rn = attention ? bn.attn_residual : bn.ffn_residual;
    GradSignal d_branch = residual_branch_backward(d_combined, rn.beta);
    b.set_backward(s.probe_branch, d_branch);
    if (p > 0) d_branch = dropout_backward(d_branch, p);
    GradSignal d_branch_in;
    if (attention) {
      const GradSignal d_mixed = linear_backward(d_branch, d, bn.attn_out_std * bn.attn_out_std);
      // Value path: d_v_s = Σ_{t≥s} w_ts d_t (causal sums), then through W_v.
      const double dv_var = d_mixed.var * (s.sums.self + d_mixed.corr * s.sums.grad_self);
      const double dv_cov = d_mixed.var * (s.sums.grad_cross + d_mixed.corr * s.sums.grad_pair);
      // Query and key paths, through the logits' gradient w_ts(g_t·v_s - Σ_s' w_ts' g_t·v_s'): only the parts of
      // v and k that vary across keys reach it.
      const double score_var = numbers.logit_scale * numbers.logit_scale * static_cast<double>(head_dim) * d_mixed.var *
                               s.v.var * (1.0 - s.v.corr) * s.sums.score;
      const double dq_var = score_var * s.k.var * (1.0 - s.k.corr);
      const double dk_var = score_var * s.q.var;
      const double dx_var = static_cast<double>(d) * (bn.v_std * bn.v_std * dv_var + bn.q_std * bn.q_std * dq_var +
                                                      bn.k_std * bn.k_std * dk_var);
      const double dx_cov = static_cast<double>(d) * bn.v_std * bn.v_std * dv_cov;
      d_branch_in = GradSignal{dx_var, dx_var > 0 ? clamp_unit(dx_cov / dx_var) : 0.0};
    } else {
      const GradSignal d_mixed = linear_backward(d_branch, d, bn.ffn_out_std * bn.ffn_out_std);
      b.set_backward(s.probe_mixed, d_mixed);
      const GradSignal d_hidden =
          s.hidden.var > 0
              ? activation_backward(phi, s.hidden, d_mixed, rule)
              : GradSignal{d_mixed.var * std::pow(activation_derivative(phi, s.hidden.mean), 2), d_mixed.corr};
      b.set_backward(s.probe_hidden, d_hidden);
      d_branch_in = linear_backward(d_hidden, f, bn.ffn_in_std * bn.ffn_in_std);
    }
    if (pre) {
      b.set_backward(s.probe_norm, d_branch_in);
      d_branch_in = norm_backward(c, s.input, d_branch_in);
    }
    g = residual_backward(d_combined, d_branch_in, rn.lambda);
    b.set_backward(s.probe_input, g);
  }
  b.set_backward(probe_embed, g);

  std::ostringstream formulae;
  formulae << "forward: embedding var σ_tok²+σ_pos², corr r_0 " << (inputs.input_corr ? "(given)" : "(uniform tokens)")
           << "; linear_forward; " << (c.norm_kind == NormKind::layernorm ? "layernorm" : "rmsnorm")
           << "_forward; activation_forward(" << activation_name(phi)
           << "); causal attention (Σw² ≈ e^D/(e^D+n-1) per query, shared value part kept); dropout_forward; "
              "residual_forward; tied head: the input token's own logit from the stream's token-aligned variance. "
              "backward: softmax cross-entropy gradient (near-uniform, plus the tied self logit by quadrature); "
              "linear/activation/norm/dropout/residual backward maps; causal attention value, query and key paths";
  b.prediction.formulae = formulae.str();
  return b.prediction;
}

ProbePrediction predict_mlp(const MlpNumbers& numbers, const TheoryInputs& inputs) {
  const MlpConfig& c = numbers.config;
  PROPLAB_CHECK(static_cast<int>(numbers.layers.size()) == c.layers, "predict_mlp: ", numbers.layers.size(),
                " layer descriptions for ", c.layers, " layers");
  const Activation phi = to_theory(c.activation);
  const GaussHermite rule(64);
  Builder b;
  const char* no_corr = "corr: one token per sample (the token correlation is not defined)";
  struct LayerState {
    Signal input, pre, post;
    int probe_pre = -1, probe_post = -1, probe_out = -1;
  };
  std::vector<LayerState> states(static_cast<std::size_t>(c.layers));
  Signal h{inputs.input_mean, inputs.input_var, 0.0};
  for (int l = 0; l < c.layers; ++l) {
    LayerState& s = states[l];
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
  g = linear_backward(GradSignal{g.var * numbers.output_multiplier * numbers.output_multiplier, 0.0}, c.outputs,
                      numbers.readout_weight_var);
  for (int l = c.layers - 1; l >= 0; --l) {
    const LayerState& s = states[l];
    const MlpLayerNumbers& ln = numbers.layers[l];
    GradSignal d_post = g;
    if (s.probe_out >= 0) {
      b.set_backward(s.probe_out, g);
      d_post = residual_branch_backward(g, ln.residual.beta);
    }
    b.set_backward(s.probe_post, d_post);
    const GradSignal d_pre = s.pre.var > 0
                                 ? activation_backward(phi, s.pre, d_post, rule)
                                 : GradSignal{d_post.var * std::pow(activation_derivative(phi, s.pre.mean), 2), 0.0};
    b.set_backward(s.probe_pre, d_pre);
    if (l > 0) {
      const GradSignal d_in = linear_backward(d_pre, c.width, ln.weight_var);
      g = s.probe_out >= 0 ? residual_backward(g, d_in, ln.residual.lambda) : d_in;
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
      "forward: linear_forward (q map), activation_forward(" + std::string(activation_name(phi)) + ")" +
      (c.residual ? ", residual_forward" : "") +
      "; backward: " + (c.head == MlpHead::classification ? "softmax cross-entropy" : "mean squared error") +
      " gradient, linear/activation" + (c.residual ? "/residual" : "") +
      " backward maps; mean field: MeanField q*, c*, chi1 (Poole et al. 2016, Schoenholz et al. 2017)";
  return b.prediction;
}

}  // namespace proplab::theory
