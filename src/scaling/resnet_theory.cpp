#include "scaling/resnet_theory.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <numbers>
#include <optional>
#include <utility>

#include "scaling/resnet_util.h"
#include "theory/model_theory.h"
#include "theory/moments.h"

namespace proplab {

namespace {

double normal_cdf(double z) { return 0.5 * std::erfc(-z / std::numbers::sqrt2); }

// E[φ], E[φ²] as StreamMoments{mean = E[φ], var = E[φ²]} (the second moment, not the variance).
StreamMoments gaussian_integrals(Activation kind, double mean, double var) {
  if (var <= 0) {
    const double value = resnet_util::activation_value(kind, mean);
    return {value, value * value};
  }
  const double sd = std::sqrt(var);
  if (kind == Activation::relu) {
    // Closed form: E[relu] = μΦ + σφ, E[relu²] = (μ² + σ²)Φ + μσφ at μ/σ.
    const double z = mean / sd, cdf = normal_cdf(z), pdf = std::exp(-0.5 * z * z) / std::sqrt(2 * std::numbers::pi);
    return {mean * cdf + sd * pdf, (mean * mean + var) * cdf + mean * sd * pdf};
  }
  constexpr int kSteps = 4000;
  const double step = 24.0 / kSteps;
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

// E[φ'(x)] and E[φ'(x)²] for x ~ N(mean, var) (the slope by central differences for the smooth activations).
struct Slope {
  double mean = 0.0, second = 0.0;
};
Slope slope_integrals(Activation kind, double mean, double var) {
  if (kind == Activation::identity) return {1.0, 1.0};
  const double sd = std::sqrt(std::max(var, 0.0));
  if (kind == Activation::relu) {
    const double p = sd > 0 ? normal_cdf(mean / sd) : (mean > 0 ? 1.0 : 0.0);
    return {p, p};
  }
  constexpr int kSteps = 2000;
  const double step = 24.0 / kSteps, h = 1e-5;
  double first = 0.0, second = 0.0;
  for (int i = 0; i <= kSteps; ++i) {
    const double z = -12.0 + i * step;
    const double weight =
        (i == 0 || i == kSteps ? 0.5 : 1.0) * step * std::exp(-0.5 * z * z) / std::sqrt(2 * std::numbers::pi);
    const double x = mean + sd * z;
    const double d =
        (resnet_util::activation_value(kind, x + h) - resnet_util::activation_value(kind, x - h)) / (2 * h);
    first += weight * d;
    second += weight * d * d;
  }
  return {first, second};
}

// E[φ(x)⁴] for x ~ N(mean, var): what a conv reading φ's output sees of its patches' spread (the scale mixture).
double gaussian_fourth(Activation kind, double mean, double var) {
  if (var <= 0) {
    const double value = resnet_util::activation_value(kind, mean);
    return value * value * value * value;
  }
  const double sd = std::sqrt(var);
  if (kind == Activation::relu) {
    // Closed form: (μ⁴ + 6μ²σ² + 3σ⁴)Φ + (μ³σ + 5μσ³)φ at μ/σ.
    const double z = mean / sd, cdf = normal_cdf(z), pdf = std::exp(-0.5 * z * z) / std::sqrt(2 * std::numbers::pi);
    const double m2 = mean * mean;
    return (m2 * m2 + 6.0 * m2 * var + 3.0 * var * var) * cdf + (m2 * mean * sd + 5.0 * mean * var * sd) * pdf;
  }
  constexpr int kSteps = 4000;
  const double step = 24.0 / kSteps;
  double fourth = 0.0;
  for (int i = 0; i <= kSteps; ++i) {
    const double z = -12.0 + i * step;
    const double weight =
        (i == 0 || i == kSteps ? 0.5 : 1.0) * step * std::exp(-0.5 * z * z) / std::sqrt(2 * std::numbers::pi);
    const double value = resnet_util::activation_value(kind, mean + sd * z);
    fourth += weight * value * value * value * value;
  }
  return fourth;
}

// A Gaussian scale mixture N(mean, var·s), s of mean 1 and relative variance cv2 taken as Gamma-distributed (shape
// 1/cv2; docs/theory.md, "ResNets", "A ReLU after a conv of small fan-in"): the nodes s_i and weights w_i of a
// trapezoid rule in log s over ±9 standard deviations of log s, normalised to Σw = 1 and Σw·s = 1. Empty below
// cv2 = 1e-9 (a plain Gaussian).
struct MixtureNode {
  double s = 1.0, w = 1.0;
};
// E[√s] for s Gamma-distributed of mean 1 and relative variance cv2: Γ(k + ½)/(Γ(k)·√k), k = 1/cv2 (its asymptotic
// series for large k, where the two log-gammas would cancel to rounding).
double gamma_root(double cv2) {
  if (!(cv2 > 0.0)) return 1.0;
  const double k = 1.0 / cv2;
  if (k > 100.0) return 1.0 - 1.0 / (8.0 * k) + 1.0 / (128.0 * k * k) + 5.0 / (1024.0 * k * k * k);
  return std::exp(std::lgamma(k + 0.5) - std::lgamma(k)) / std::sqrt(k);
}
std::vector<MixtureNode> gamma_scale_nodes(double cv2) {
  if (!(cv2 > 1e-9)) return {};
  const double k = 1.0 / cv2;
  // log s has mode log 1 = 0 at shape k (density ∝ exp(k·u − k·e^u)) and standard deviation √ψ'(k) ≈ √(1/k + 1/(2k²)).
  const double sd = std::sqrt(1.0 / k + 0.5 / (k * k));
  constexpr int kNodes = 33;
  const double step = 18.0 * sd / (kNodes - 1);
  std::vector<MixtureNode> nodes(kNodes);
  double total = 0.0, first = 0.0;
  for (int i = 0; i < kNodes; ++i) {
    const double u = -9.0 * sd + i * step;
    nodes[static_cast<std::size_t>(i)] = {std::exp(u), std::exp(k * u - k * std::exp(u))};
    total += nodes[static_cast<std::size_t>(i)].w;
    first += nodes[static_cast<std::size_t>(i)].w * std::exp(u);
  }
  for (MixtureNode& n : nodes) {
    n.w /= total;
    n.s /= first / total;
  }
  return nodes;
}

// The activation's integrals per distinct (mean, var): most positions of a map (all of its interior) share them, and
// the smooth activations' quadrature is thousands of evaluations. The `mixed` forms average over a Gaussian scale
// mixture of relative variance cv2 (gamma_scale_nodes; cv2 = 0: the Gaussian's).
class ActivationIntegrals {
 public:
  explicit ActivationIntegrals(Activation kind) : kind_(kind) {}
  const StreamMoments& moments(double mean, double var) {
    auto [it, fresh] = moments_.try_emplace({mean, var});
    if (fresh) it->second = gaussian_integrals(kind_, mean, var);
    return it->second;
  }
  const Slope& slope(double mean, double var) {
    auto [it, fresh] = slopes_.try_emplace({mean, var});
    if (fresh) it->second = slope_integrals(kind_, mean, var);
    return it->second;
  }
  double fourth(double mean, double var) {
    auto [it, fresh] = fourths_.try_emplace({mean, var});
    if (fresh) it->second = gaussian_fourth(kind_, mean, var);
    return it->second;
  }
  StreamMoments mixed_moments(double mean, double var, double cv2) {
    const auto [first, second] = mixed(var, cv2, [&](double v) {
      const StreamMoments& m = moments(mean, v);
      return std::pair{m.mean, m.var};
    });
    return {first, second};
  }
  Slope mixed_slope(double mean, double var, double cv2) {
    const auto [first, second] = mixed(var, cv2, [&](double v) {
      const Slope& s = slope(mean, v);
      return std::pair{s.mean, s.second};
    });
    return {first, second};
  }
  double mixed_fourth(double mean, double var, double cv2) {
    return mixed(var, cv2, [&](double v) { return std::pair{fourth(mean, v), 0.0}; }).first;
  }
  // The relative variance over the mixture of E[φ² | s]: how much of the scale the activation's output keeps
  // (cv2 itself for a ReLU of a centred input, whose E[φ² | s] = var·s/2).
  double mixed_second_spread(double mean, double var, double cv2) {
    const std::vector<MixtureNode>& nodes = nodes_for(cv2);
    double first = 0.0, second = 0.0;
    for (const MixtureNode& n : nodes) {
      const double g = moments(mean, var * n.s).var;
      first += n.w * g;
      second += n.w * g * g;
    }
    return first > 0.0 ? std::max(0.0, second / (first * first) - 1.0) : 0.0;
  }

 private:
  // Two integrals at variance v averaged over the mixture's nodes (at v itself without a mixture).
  template <typename F>
  std::pair<double, double> mixed(double var, double cv2, F&& at) {
    const std::vector<MixtureNode>& nodes = nodes_for(cv2);
    if (nodes.empty()) return at(var);
    std::pair<double, double> sum{0.0, 0.0};
    for (const MixtureNode& n : nodes) {
      const std::pair<double, double> value = at(var * n.s);
      sum.first += n.w * value.first;
      sum.second += n.w * value.second;
    }
    return sum;
  }
  const std::vector<MixtureNode>& nodes_for(double cv2) {
    auto [it, fresh] = nodes_.try_emplace(cv2);
    if (fresh) it->second = gamma_scale_nodes(cv2);
    return it->second;
  }
  Activation kind_;
  std::map<std::pair<double, double>, StreamMoments> moments_;
  std::map<std::pair<double, double>, Slope> slopes_;
  std::map<std::pair<double, double>, double> fourths_;
  std::map<double, std::vector<MixtureNode>> nodes_;
};

double average(const std::vector<double>& values) {
  double s = 0.0;
  for (double v : values) s += v;
  return values.empty() ? 0.0 : s / static_cast<double>(values.size());
}

// E[x(p)·y(p + Δ)] pairs of a k×k kernel at offset Δ: (k − |Δx|)⁺·(k − |Δy|)⁺.
double kernel_overlap(int kernel, int dx, int dy) {
  return static_cast<double>(std::max(0, kernel - std::abs(dx)) * std::max(0, kernel - std::abs(dy)));
}
constexpr int kReach = 2;  // offsets −2..2: what two taps of a 3×3 kernel can be apart
using Offsets = std::array<double, (2 * kReach + 1) * (2 * kReach + 1)>;
std::size_t offset_index(int dx, int dy) {
  return static_cast<std::size_t>((dy + kReach) * (2 * kReach + 1) + dx + kReach);
}

// Per-position moments of one activation map [size, size] (the same for every channel and image): mean[p] and the
// second moment E[a²][p]. Borders make them position-dependent (zero padding).
// channel_mean_sq: E over channels of the square of a channel's mean over images (at an interior position; the part
// of the second moment a channel shares across images).
// mean_share[p]: E over channels of δ_c(p)·δ̄_c, where δ_c(p) is channel c's own mean at p (over images, less the
// channels' shared mean[p]) and δ̄_c its average over positions. What BatchNorm subtracts at p is the channel's mean
// over the whole batch: near a zero-padded border a conv's output reads fewer taps, so its channel-specific mean
// there is a smaller part of the mean BatchNorm removes (see `norm`).
// The finite-width band (docs/theory.md, "Finite-width bands", ResNets): coupling = d log(var)/d log(var of the
// stream entering the block), fresh = Var[log var] from the weights drawn since, channel_spread = the relative
// variance of one channel's mean square across the channels of one network, coherence[Δ] = E over channel pairs
// (c, c', the same channel included) of the squared realised correlation of c at p and c' at p + Δ over positions
// and images (zero in expectation over the weights, but fixed in one network). var_spread = the relative variance of
// one channel's own variance (its second moment less its mean²) across the channels: what BatchNorm divides a
// channel's gradient by varies with it, and E[1/σ_c²] ≈ (1 + var_spread)/E[σ_c²].
struct Plane {
  int size = 0;
  std::vector<double> mean, second;
  double channel_mean_sq = 0.0;
  std::vector<double> mean_share;
  double coupling = 1.0, fresh = 0.0, channel_spread = 0.0, var_spread = 0.0;
  Offsets coherence{};
  // link[Δ]: Σ over this plane's channels c' of E[realised Cov(x_c(p), plane_c'(p + Δ))²]/(Var x·Var plane), x the
  // stream entering the block (one channel c): how much of this plane follows the stream in one network.
  Offsets link{};
  // The scale mixture (docs/theory.md, "ResNets", "A ReLU after a conv of small fan-in"): over i.i.d. weights a
  // plain conv's output is exactly N(0, E[w²]·|patch|²) given its input patch, so over the patches each element is a
  // Gaussian scale mixture N(mean, var·s), E[s] = 1. mix[p] is Var[s] at p and root[p] is E[√s] (s is a product of
  // independent Gamma factors, one per conv since the last norm: E[√s] is the product of theirs); empty: s = 1.
  // Every output channel at p shares s (the same patch), so the channels' squares covary: shared[p] is the relative
  // variance of the part of E[a² | s] that the channels at p share, shared_root[p] E[√·] of it (empty: mix and root,
  // a conv's output; a ReLU of a centred mixture keeps them). fourth[p] is E[a⁴] at p where an activation made it
  // (empty: that of the mixture, m⁴ + 6m²v + 3v²(1 + mix)).
  std::vector<double> mix, root, shared, shared_root, fourth;
  double mix_at(std::size_t p) const { return mix.empty() ? 0.0 : mix[p]; }
  double root_at(std::size_t p) const { return root.empty() ? gamma_root(mix_at(p)) : root[p]; }
  double shared_at(std::size_t p) const { return shared.empty() ? mix_at(p) : shared[p]; }
  double shared_root_at(std::size_t p) const { return shared.empty() ? root_at(p) : shared_root[p]; }
  double fourth_at(std::size_t p) const {
    if (!fourth.empty()) return fourth[p];
    const double m = mean[p], v = var_at(p);
    return m * m * m * m + 6.0 * m * m * v + 3.0 * v * v * (1.0 + mix_at(p));
  }
  void clear_mixture() {
    mix.clear();
    root.clear();
    shared.clear();
    shared_root.clear();
    fourth.clear();
  }
  static Plane uniform(int size, double mean, double var) {
    const std::size_t n = static_cast<std::size_t>(size) * static_cast<std::size_t>(size);
    Plane plane;
    plane.size = size;
    plane.mean.assign(n, mean);
    plane.second.assign(n, var + mean * mean);
    plane.channel_mean_sq = mean * mean;
    plane.mean_share.assign(n, 0.0);
    return plane;
  }
  double log_var(double stream_log_var) const { return coupling * coupling * stream_log_var + fresh; }
  // E over channels of δ̄_c²: the channel-specific part of a channel's mean over the batch.
  double avg_mean_share() const { return average(mean_share); }
  std::size_t count() const { return mean.size(); }
  double avg_mean() const {
    double s = 0.0;
    for (double m : mean) s += m;
    return s / static_cast<double>(count());
  }
  double avg_second() const {
    double s = 0.0;
    for (double m : second) s += m;
    return s / static_cast<double>(count());
  }
  // The population moments over all elements of the tensor (what a probe records).
  StreamMoments population() const {
    const double m = avg_mean();
    return {m, std::max(0.0, avg_second() - m * m)};
  }
  double var_at(std::size_t p) const { return std::max(0.0, second[p] - mean[p] * mean[p]); }
};

// Gradient second moments per position, and E[(mean over an image's positions)²]. BatchNorm's batch mean removes
// E[(mean over the batch's images of that)²] = image_mean_sq/N + images_shared: `images_shared` is what the images'
// means share beyond independent images (their covariance, from the loss: the logits' part the images share and
// the targets they share; it can be negative). Gradients have mean zero.
struct GradPlane {
  int size = 0;
  std::vector<double> second;
  double image_mean_sq = 0.0, images_shared = 0.0;
  double avg() const { return average(second); }
};

// A k×k conv (k = 1 or 3, padding k/2) with stride: which input positions feed output position (oy, ox).
template <typename F>
void for_taps(int in_size, int kernel, int stride, int oy, int ox, F&& f) {
  const int pad = kernel / 2;
  for (int ky = 0; ky < kernel; ++ky)
    for (int kx = 0; kx < kernel; ++kx) {
      const int y = oy * stride + ky - pad, x = ox * stride + kx - pad;
      if (y >= 0 && y < in_size && x >= 0 && x < in_size) f(static_cast<std::size_t>(y) * in_size + x);
    }
}

int out_size_of(int in_size, int kernel, int stride) { return (in_size + 2 * (kernel / 2) - kernel) / stride + 1; }

// A conv's weights as the bookkeeping sees them: plain i.i.d. (E[w²] = weight_var) or weight-standardised rows (zero
// mean, squared norm `ws_norm_sq`).
struct ConvWeights {
  bool standardised = false;
  double weight_var = 0.0;  // plain: per entry
  double ws_norm_sq = 0.0;  // standardised: (gain·scale)²
  std::int64_t in = 0, out = 0;
  int kernel = 3, stride = 1;
  // E[w²] per entry as the backward pass sees it (a standardised row: ws_norm_sq / fan_in).
  double entry_var() const {
    return standardised ? ws_norm_sq / static_cast<double>(in * kernel * kernel) : weight_var;
  }
};

// tr(G²)/tr(G)² for a plain conv's centred input Gram G over the n = C_in·k² patch entries, with zero padding. A
// patch entry (channel i, tap t) at output p is 0 where p + t is outside and a(p + t) inside, whose mean over the
// images is the plane's shared mean m(p + t) (the channel's own part left out). Centring over the whole batch (what
// BatchNorm's statistics do) leaves, besides each entry's own variance v·f_t (f_t: the fraction of outputs whose tap
// t is inside), the spread of that mean over the outputs, K(t, s) = Cov_p(m̃_t(p), m̃_s(p)) with m̃_t(p) = m(p + t)
// inside and 0 outside, the same for every pair of channels: G = F + K ⊗ 11ᵀ. So
//   tr(G)  = C_in·Σ_t (v·f_t + K(t, t)),
//   tr(G²) = C_in·(1 + channel_spread)·Σ_t (v·f_t)² + realised·f̄² + 2·C_in·Σ_t v·f_t·K(t, t) + C_in²·Σ_{t,s} K(t, s)²
// (the cross term's pairs of distinct channels or taps have realised covariances of either sign, zero in
// expectation). Interior only (f = 1, K = 0) this is the unpadded (C_in·k²·v²·(1 + channel_spread) + realised)/(n·v)².
// The C_in² term is what a small map adds: on an 8×8 map 28 of the 64 outputs read a padded tap, and every channel's
// patch drops its mean there together.
double padded_centred_ratio(const Plane& x, const ConvWeights& w, int out, double var, double realised) {
  const int pad = w.kernel / 2, k2 = w.kernel * w.kernel;
  const double c_in = static_cast<double>(w.in), outputs = static_cast<double>(out) * out;
  std::vector<double> f(static_cast<std::size_t>(k2), 0.0), m(static_cast<std::size_t>(k2) * out * out, 0.0);
  for (int ky = 0; ky < w.kernel; ++ky)
    for (int kx = 0; kx < w.kernel; ++kx) {
      const std::size_t t = static_cast<std::size_t>(ky * w.kernel + kx);
      for (int oy = 0; oy < out; ++oy)
        for (int ox = 0; ox < out; ++ox) {
          const int iy = oy * w.stride + ky - pad, ix = ox * w.stride + kx - pad;
          if (iy < 0 || iy >= x.size || ix < 0 || ix >= x.size) continue;
          f[t] += 1.0 / outputs;
          m[t * static_cast<std::size_t>(out * out) + static_cast<std::size_t>(oy * out + ox)] =
              x.mean[static_cast<std::size_t>(iy) * x.size + ix];
        }
    }
  std::vector<double> centre(static_cast<std::size_t>(k2), 0.0);
  for (std::size_t t = 0; t < centre.size(); ++t)
    for (int p = 0; p < out * out; ++p) centre[t] += m[t * static_cast<std::size_t>(out * out) + p] / outputs;
  double trace = 0.0, squares = 0.0, f_avg = 0.0;
  for (std::size_t t = 0; t < centre.size(); ++t) {
    f_avg += f[t] / k2;
    for (std::size_t s = 0; s < centre.size(); ++s) {
      double k = 0.0;
      for (int p = 0; p < out * out; ++p)
        k += (m[t * static_cast<std::size_t>(out * out) + p] - centre[t]) *
             (m[s * static_cast<std::size_t>(out * out) + p] - centre[s]) / outputs;
      squares += c_in * c_in * k * k;
      if (s == t) {
        const double own = var * f[t];
        trace += c_in * (own + k);
        squares += c_in * (1.0 + x.channel_spread) * own * own + 2.0 * c_in * own * k;
      }
    }
  }
  squares += realised * f_avg * f_avg;
  return trace > 0 ? squares / (trace * trace) : 0.0;
}

// Forward: plain conv out E[y²][p] = in·E[w²]·Σ_taps E[a²] (padding taps are zero); standardised conv
// out Var = ws_norm_sq·(avg_taps E[a²] − (avg_taps mean)²) over the k² taps (zero where padded). Mean 0. A channel's
// mean is Σ w·(input channel means): E[w²]·in·k²·channel_mean_sq (standardised rows: less the shared mean).
Plane conv_forward(const Plane& x, const ConvWeights& w, bool borders, bool padded_spread, bool mixture) {
  const int out = borders ? out_size_of(x.size, w.kernel, w.stride) : x.size / w.stride;
  Plane y = Plane::uniform(out, 0.0, 0.0);
  const double taps = static_cast<double>(w.kernel * w.kernel);
  // The scale mixture of a plain conv's output (Plane::mix): given the patch, y ~ N(0, E[w²]·|patch|²), and |patch|²
  // sums C_in channels' squares at each tap inside. Given the scale s_t that a tap's channels share (Plane::shared),
  // those are independent: E[a² | s] = s·e2, E[a⁴ | s] = s²·e4 with e4 = E[a⁴]/(1 + shared). So |patch|² is the
  // taps' shared scale times a fresh factor of relative variance Σ_t (e4 − e2²)/(C_in·(Σ_t e2)²): 2/(C_in·taps) for
  // i.i.d. Gaussian inputs, 5/C_in through a 1×1 conv reading a ReLU of a centred mixture (e4 = 6·e2²). The taps'
  // shared scales are taken as independent, averaged with weights e2 (exact for 1×1 convs, the projections): relative
  // variance Σ_t e2²·shared/(Σ_t e2)². The two factors multiply (Var[s] = (1 + a)(1 + b) − 1, E[√s] the product).
  // Weight-standardised rows (zero mean, fixed norm) leave only the channels' within-channel kurtosis, not tracked
  // (NF ResNets).
  const bool mixes = mixture && !w.standardised;
  if (mixes) {
    y.mix.assign(y.count(), 0.0);
    y.root.assign(y.count(), 1.0);
  }
  struct Tapped {
    double second = 0.0, mean = 0.0, fresh = 0.0, shared = 0.0, shared_root = 1.0;
    int inside = 0;
  };
  auto tap = [&](Tapped& t, std::size_t q) {
    t.second += x.second[q];
    t.mean += x.mean[q];
    if (!mixes) return;
    const double e2 = x.second[q], shared = x.shared_at(q);
    t.fresh += std::max(0.0, x.fourth_at(q) / (1.0 + shared) - e2 * e2);
    t.shared += e2 * e2 * shared;
    t.shared_root = x.shared_root_at(q);
    ++t.inside;
  };
  Tapped interior;  // borders = false: every tap reads the plane's average
  if (!borders) {
    Tapped plane;
    for (std::size_t q = 0; q < x.count(); ++q) tap(plane, q);
    const double scale = taps / static_cast<double>(x.count());
    interior.second = scale * plane.second;
    interior.mean = scale * plane.mean;
    interior.fresh = scale * plane.fresh;
    interior.shared = scale * plane.shared;
    interior.shared_root = plane.shared_root;
    interior.inside = w.kernel * w.kernel;
  }
  for (int oy = 0; oy < out; ++oy)
    for (int ox = 0; ox < out; ++ox) {
      Tapped t = interior;
      if (borders) {
        t = Tapped{};
        for_taps(x.size, w.kernel, w.stride, oy, ox, [&](std::size_t q) { tap(t, q); });
      }
      const double second = t.second, mean = t.mean;
      const std::size_t p = static_cast<std::size_t>(oy) * out + ox;
      y.second[p] = w.standardised
                        ? w.ws_norm_sq * std::max(0.0, second / taps - (mean / taps) * (mean / taps))
                        : w.weight_var * static_cast<double>(w.in) * second;
      if (mixes && second > 0.0) {
        const double fresh = t.fresh / (static_cast<double>(w.in) * second * second);
        const double shared = t.shared / (second * second);
        y.mix[p] = (1.0 + shared) * (1.0 + fresh) - 1.0;
        y.root[p] = (t.inside == 1 ? t.shared_root : gamma_root(shared)) * gamma_root(fresh);
      }
    }
  const double shared = x.avg_mean();
  y.channel_mean_sq = w.standardised ? w.ws_norm_sq * std::max(0.0, x.channel_mean_sq - shared * shared)
                                     : w.weight_var * static_cast<double>(w.in) * taps * x.channel_mean_sq;
  // The band: an output channel's mean square is wᵀGw, G the input patches' second-moment matrix over the n =
  // C_in·k² inputs: within a channel s = E[a²] on the diagonal and the channel's mean μ² + δ² off it, between
  // channels μ² (plus δ_c·δ_c', zero in expectation), and on every pair the realised covariance the input's own
  // weights left (its coherence: Σ_pairs ≈ C_in²·Var²·Σ_Δ P_k(Δ)·coherence[Δ], P_k(Δ) the tap pairs at offset Δ).
  // Plain rows: relative variance 2·tr(G²)/tr(G)²; standardised rows (zero mean, fixed norm) see G less its shared
  // mean, and only its departure from isotropy: 2·(tr(G'²)/tr(G')² − 1/n). The output channels' realised
  // correlations are the centred Gram's tr(G_c²)/tr(G_c)², spread over offsets as the kernel overlaps. Borders are
  // ignored here (BatchNorm's var_spread counts them: padded_centred_ratio).
  {
    const double c_in = static_cast<double>(w.in), n = c_in * taps;
    const double mu_sq = shared * shared, delta_sq = std::max(0.0, x.channel_mean_sq - mu_sq);
    const double var = std::max(x.avg_second() - x.channel_mean_sq, 0.0);  // a channel's own variance
    double coherent = 0.0;  // Σ_Δ P_k(Δ)·coherence[Δ]
    for (int dy = -kReach; dy <= kReach; ++dy)
      for (int dx = -kReach; dx <= kReach; ++dx)
        coherent += kernel_overlap(w.kernel, dx, dy) * x.coherence[offset_index(dx, dy)];
    const double realised = c_in * c_in * var * var * coherent;
    const double s = w.standardised ? std::max(x.avg_second() - mu_sq, 1e-300) : x.avg_second();
    const double within = w.standardised ? delta_sq : mu_sq + delta_sq;
    const double across_sq = w.standardised ? delta_sq * delta_sq : mu_sq * mu_sq + delta_sq * delta_sq;
    const double squares = c_in * (taps * s * s * (1.0 + x.channel_spread) + taps * (taps - 1.0) * within * within) +
                           c_in * (c_in - 1.0) * taps * taps * across_sq + realised;
    const double ratio = s > 0 ? squares / (n * s * n * s) : 0.0;
    const double per_channel = w.standardised ? 2.0 * std::max(0.0, ratio - 1.0 / n) : 2.0 * ratio;
    y.coupling = x.coupling;
    y.fresh = x.fresh + per_channel / static_cast<double>(w.out);
    y.channel_spread = per_channel;
    const double centred =
        var > 0 ? (c_in * taps * var * var * (1.0 + x.channel_spread) + realised) / (n * var * n * var) : 0.0;
    y.var_spread = w.standardised             ? 2.0 * std::max(0.0, centred - 1.0 / n)
                   : borders && padded_spread ? 2.0 * padded_centred_ratio(x, w, out, var, realised)
                                              : 2.0 * centred;
    for (int dy = -kReach; dy <= kReach; ++dy)
      for (int dx = -kReach; dx <= kReach; ++dx)
        y.coherence[offset_index(dx, dy)] = centred * kernel_overlap(w.kernel, w.stride * dx, w.stride * dy) / taps;
    // The link: Cov(x_c, y_c'(Δ)) = Σ_{c_in, t} w·Cov(x_c, a_c_in(stride·Δ + t)), so over the weights each output
    // channel gets Var a·Σ_t link_a(stride·Δ + t)/(C_in·k²·s) (s as above: what the row's weights normalise), and
    // the C_out channels sum.
    const int pad = w.kernel / 2;
    const double plane_var = std::max(x.avg_second() - mu_sq, 0.0);
    for (int dy = -kReach; dy <= kReach; ++dy)
      for (int dx = -kReach; dx <= kReach; ++dx) {
        double sum = 0.0;
        for (int ty = -pad; ty <= pad; ++ty)
          for (int tx = -pad; tx <= pad; ++tx) {
            const int ix = w.stride * dx + tx, iy = w.stride * dy + ty;
            if (std::abs(ix) <= kReach && std::abs(iy) <= kReach) sum += x.link[offset_index(ix, iy)];
          }
        y.link[offset_index(dx, dy)] = s > 0 ? static_cast<double>(w.out) * plane_var * sum / (n * s) : 0.0;
      }
  }
  // A channel's mean at p is Σ_{taps inside} w·(input channel means), so two positions share the taps both read:
  // E[δ(p)·δ(p')] = C_in·E[w²]·Σ_{t ∈ T(p) ∩ T(p')} E[μ(p + t)·μ(p' + t)], T the taps inside and μ an input channel's
  // mean. That mean is the plane's shared mean m(q), which follows the position (an activation's mean is lower where
  // its input's variance is, near a border), plus the channel's own part, of second moment d = channel_mean_sq −
  // (avg m)², taken as the same at every position: E[μ(q)·μ(q')] = m(q)·m(q') + d. Averaged over the N_out outputs
  // p' it is Σ_{t inside at p} (m(p + t)·m̄_t + d·f_t), with m̄_t = (1/N_out)·Σ_{p': t inside} m(p' + t) and f_t the
  // fraction of outputs whose tap t is inside. Interior only: k²·channel_mean_sq.
  if (w.standardised || !borders) {
    std::fill(y.mean_share.begin(), y.mean_share.end(), y.channel_mean_sq);
  } else {
    const int pad = w.kernel / 2;
    const std::size_t taps_count = static_cast<std::size_t>(w.kernel * w.kernel);
    std::vector<double> inside_share(taps_count, 0.0), tap_mean(taps_count, 0.0);
    auto input_at = [&](int o_y, int o_x, int ky, int kx) -> std::ptrdiff_t {
      const int iy = o_y * w.stride + ky - pad, ix = o_x * w.stride + kx - pad;
      if (iy < 0 || iy >= x.size || ix < 0 || ix >= x.size) return -1;
      return static_cast<std::ptrdiff_t>(iy) * x.size + ix;
    };
    const double outputs = static_cast<double>(out) * out;
    for (int ky = 0; ky < w.kernel; ++ky)
      for (int kx = 0; kx < w.kernel; ++kx) {
        const std::size_t t = static_cast<std::size_t>(ky * w.kernel + kx);
        for (int oy = 0; oy < out; ++oy)
          for (int ox = 0; ox < out; ++ox) {
            const std::ptrdiff_t q = input_at(oy, ox, ky, kx);
            if (q < 0) continue;
            inside_share[t] += 1.0 / outputs;
            tap_mean[t] += x.mean[static_cast<std::size_t>(q)] / outputs;
          }
      }
    const double shared = x.avg_mean(), own = std::max(0.0, x.channel_mean_sq - shared * shared);
    const double scale = w.weight_var * static_cast<double>(w.in);
    for (int oy = 0; oy < out; ++oy)
      for (int ox = 0; ox < out; ++ox) {
        double sum = 0.0;
        for (int ky = 0; ky < w.kernel; ++ky)
          for (int kx = 0; kx < w.kernel; ++kx) {
            const std::ptrdiff_t q = input_at(oy, ox, ky, kx);
            if (q < 0) continue;
            const std::size_t t = static_cast<std::size_t>(ky * w.kernel + kx);
            sum += x.mean[static_cast<std::size_t>(q)] * tap_mean[t] + own * inside_share[t];
          }
        y.mean_share[static_cast<std::size_t>(oy) * out + ox] = scale * sum;
      }
  }
  return y;
}

// Backward: E[dx²][q] = out·E[w²]·Σ over the (output position, tap) pairs that read q of E[dy²]. The image-mean
// part: Σ_q dx = Σ_p Σ_k w_k·dy[p] (interior), so E[(mean_q dx)²] = out·E[w²]·k²·(HW_out/HW_in)²·E[(mean_p dy)²].
GradPlane conv_backward(const GradPlane& dy, int in_size, const ConvWeights& w, bool borders) {
  GradPlane dx;
  dx.size = in_size;
  dx.second.assign(static_cast<std::size_t>(in_size) * in_size, 0.0);
  const double v = static_cast<double>(w.out) * w.entry_var(), taps = static_cast<double>(w.kernel * w.kernel);
  if (borders) {
    for (int oy = 0; oy < dy.size; ++oy)
      for (int ox = 0; ox < dy.size; ++ox) {
        const double g = dy.second[static_cast<std::size_t>(oy) * dy.size + ox];
        for_taps(in_size, w.kernel, w.stride, oy, ox, [&](std::size_t q) { dx.second[q] += v * g; });
      }
  } else {
    // The interior: each input position is read by k²/stride² (output, tap) pairs.
    const double each = v * taps / static_cast<double>(w.stride * w.stride) * dy.avg();
    std::fill(dx.second.begin(), dx.second.end(), each);
  }
  const double area = static_cast<double>(dy.size * dy.size) / static_cast<double>(in_size * in_size);
  // An image-mean part ḡ of dy (the same at every output) sums to Σ_t w_t·n_t·ḡ over the input, n_t the outputs
  // whose tap t is inside: Σ_t n_t²/(k²·HW_out²) of the interior's k²·HW_out² (0.71 for a 3×3 conv on 8×8).
  double inside = 1.0;
  if (borders) {
    const int pad = w.kernel / 2;
    double sum_sq = 0.0;
    for (int ky = 0; ky < w.kernel; ++ky)
      for (int kx = 0; kx < w.kernel; ++kx) {
        auto count = [&](int k) {
          int n = 0;
          for (int o = 0; o < dy.size; ++o) n += (o * w.stride + k - pad >= 0 && o * w.stride + k - pad < in_size);
          return static_cast<double>(n);
        };
        const double n = count(ky) * count(kx);
        sum_sq += n * n;
      }
    const double outputs = static_cast<double>(dy.size * dy.size);
    inside = sum_sq / (taps * outputs * outputs);
  }
  dx.image_mean_sq = inside * v * taps * area * area * dy.image_mean_sq;
  dx.images_shared = inside * v * taps * area * area * dy.images_shared;
  return dx;
}

// The part of grid cell `index` (values in [(index − ½)h, (index + ½)h]) above 0.
double positive_share(std::int64_t index) { return index > 0 ? 1.0 : index == 0 ? 0.5 : 0.0; }

// The distribution over channels and images of one position's value (a post-activation block's sum before its ReLU),
// as masses on a grid of spacing h: mass[j] at (first + j)·h.
struct Density {
  double h = 0.0;
  std::int64_t first = 0;
  std::vector<double> mass;
};

// The masses of N(mean, var) on the grid's cells [(k − ½)h, (k + ½)h], from a normal of variance var − h²/12, so that
// the masses (each at its cell's centre) keep var: a cell spreads its mass over a width h, variance h²/12.
Density gaussian_density(double mean, double var, double h) {
  const double sd = std::sqrt(std::max(var - h * h / 12.0, 0.25 * var));
  Density d;
  d.h = h;
  if (!(sd > 0)) {
    d.first = std::llround(mean / h);
    d.mass = {1.0};
    return d;
  }
  constexpr double kReachSd = 9.0;
  d.first = static_cast<std::int64_t>(std::floor((mean - kReachSd * sd) / h));
  const std::int64_t last = static_cast<std::int64_t>(std::ceil((mean + kReachSd * sd) / h));
  d.mass.resize(static_cast<std::size_t>(last - d.first + 1));
  double below = normal_cdf(((static_cast<double>(d.first) - 0.5) * h - mean) / sd);
  for (std::size_t j = 0; j < d.mass.size(); ++j) {
    const double above =
        normal_cdf(((static_cast<double>(d.first + static_cast<std::int64_t>(j)) + 0.5) * h - mean) / sd);
    d.mass[j] = above - below;
    below = above;
  }
  return d;
}

// The masses of the scale mixture N(mean, var·s) (Plane::mix, gamma_scale_nodes) on the same grid: its nodes'
// Gaussian masses, weighted.
Density mixture_density(double mean, double var, double cv2, double h) {
  const std::vector<MixtureNode> nodes = gamma_scale_nodes(cv2);
  if (nodes.empty()) return gaussian_density(mean, var, h);
  std::vector<Density> parts;
  std::int64_t first = std::numeric_limits<std::int64_t>::max(), last = std::numeric_limits<std::int64_t>::min();
  for (const MixtureNode& n : nodes) {
    parts.push_back(gaussian_density(mean, var * n.s, h));
    first = std::min(first, parts.back().first);
    last = std::max(last, parts.back().first + static_cast<std::int64_t>(parts.back().mass.size()) - 1);
  }
  Density d;
  d.h = h;
  d.first = first;
  d.mass.assign(static_cast<std::size_t>(last - first + 1), 0.0);
  for (std::size_t i = 0; i < nodes.size(); ++i)
    for (std::size_t j = 0; j < parts[i].mass.size(); ++j)
      d.mass[static_cast<std::size_t>(parts[i].first - first) + j] += nodes[i].w * parts[i].mass[j];
  return d;
}

// s = λ·ReLU(u) + y, y ~ N(m, v) independent of u (the branch's normalised output at one position; u the previous
// sum, whose ReLU is the stream): E[ReLU(s)], E[ReLU(s)²] and P(s > 0) summed exactly over λ·ReLU(u)'s masses (the
// Gaussian ReLU moments in closed form per mass), and s's own masses on a grid of spacing h for the next block.
struct RectifiedSum {
  StreamMoments moments;  // {E[ReLU(s)], E[ReLU(s)²]}
  double fourth = 0.0;    // E[ReLU(s)⁴]
  double positive = 0.0;  // P(s > 0): ReLU's slope
  Density sum;
};
RectifiedSum rectified_sum(const Density& u, double lambda, double m, double v, double h) {
  // λ·ReLU(u) on the new grid: masses at or below 0 gather at 0; a value between two points splits linearly between
  // them (mass and mean kept).
  PROPLAB_CHECK(!u.mass.empty() && lambda >= 0.0 && h > 0.0, "rectified_sum: needs masses, λ ≥ 0 and h > 0");
  // λ·ReLU is monotone: the last mass maps to the largest value (+1: room for its split).
  const double top =
      lambda * std::max(0.0, static_cast<double>(u.first + static_cast<std::int64_t>(u.mass.size()) - 1) * u.h);
  std::vector<double> x(static_cast<std::size_t>(std::ceil(top / h)) + 2, 0.0);
  const bool aligned = lambda == 1.0 && u.h == h;
  for (std::size_t j = 0; j < u.mass.size(); ++j) {
    const std::int64_t index = u.first + static_cast<std::int64_t>(j);
    if (index <= 0 || lambda == 0.0) {
      x[0] += u.mass[j];
    } else if (aligned) {
      x[static_cast<std::size_t>(index)] += u.mass[j];
    } else {
      const double t = lambda * static_cast<double>(index) * u.h / h;
      const auto k = static_cast<std::size_t>(std::floor(t));
      const double f = t - static_cast<double>(k);
      x[k] += u.mass[j] * (1.0 - f);
      x[k + 1] += u.mass[j] * f;
    }
  }
  RectifiedSum out;
  for (std::size_t k = 0; k < x.size(); ++k) {
    if (x[k] == 0.0) continue;
    const double mu = static_cast<double>(k) * h + m;
    const StreamMoments relu = gaussian_integrals(Activation::relu, mu, v);  // {E[ReLU], E[ReLU²]}
    out.moments.mean += x[k] * relu.mean;
    out.moments.var += x[k] * relu.var;
    out.fourth += x[k] * gaussian_fourth(Activation::relu, mu, v);
    out.positive += x[k] * slope_integrals(Activation::relu, mu, v).mean;
  }
  // s's masses: x convolved with y's cell masses (offsets d: N(m, v) on [(d − ½)h, (d + ½)h]).
  const Density kernel = gaussian_density(m, v, h);
  out.sum.h = h;
  out.sum.first = kernel.first;
  out.sum.mass.assign(x.size() + kernel.mass.size() - 1, 0.0);
  for (std::size_t k = 0; k < x.size(); ++k) {
    if (x[k] == 0.0) continue;
    for (std::size_t d = 0; d < kernel.mass.size(); ++d) out.sum.mass[k + d] += x[k] * kernel.mass[d];
  }
  // Trim the tails that carry nothing.
  std::size_t begin = 0, end = out.sum.mass.size();
  while (begin < end && out.sum.mass[begin] < 1e-15) ++begin;
  while (end > begin && out.sum.mass[end - 1] < 1e-15) --end;
  out.sum.mass = std::vector<double>(out.sum.mass.begin() + static_cast<std::ptrdiff_t>(begin),
                                     out.sum.mass.begin() + static_cast<std::ptrdiff_t>(end));
  out.sum.first += static_cast<std::int64_t>(begin);
  return out;
}

// The gradient's part that leans on the classifier's own weights (docs/theory.md, "ResNets", "The classifier's
// coupling"). Over the head's weights H (variance σ²) the loss gradient at the pooled features, Hᵀ(p − y) with
// p = softmax(H·f), has the mean σ²·tr S·f (Stein; S = diag p − ppᵀ), and below the features the gradient gains
// σ⁴·((tr S)² + tr S²)·E|Jᵀf|² over the bookkeeping (J the Jacobian from a layer to the features of the same image):
// f propagated backward through the very weights that made it, which the independent-weights bookkeeping
// underestimates. This carries E|Jᵀf|² through a stack of identity blocks, 1×1 projections and ReLU masks (a
// SkipInit or Fixup ResNet at initialisation): at a level whose pre-activation y has, per channel, the mean μ ~ N(0,
// q_μ) (over the weights) and the rest ε ~ N(0, s²), the part of Jᵀf that is a function of the channel's (μ, y) is
// G = a₁·ρ(μ) + a₂·ReLU(y) + a₃·1(y > 0)·ρ(μ), ρ(μ) = E_ε[ReLU(μ + ε)], and the rest (`incoherent`) is independent
// of the weights below. A ReLU mask maps (a₁, a₂, a₃) to (0, a₂, a₁ + a₃); a 1×1 conv's transpose sums its C_out
// channels' G coherently: E[W_c·G_c] = v·E[∇_{W_c}G_c] = v·(K_μ·ā + K_y·(a − ā)) at the input a = ReLU(y_in) that the
// output position reads (ā its channels' means), K_y = E[∂_y G], K_μ = E[∂_μ G] + K_y, so the input gains
// C_out(C_out − 1)·v²·E[(K_μ·ρ + K_y·(ReLU − ρ))²] over the naive C_out·v·E[G²].
class HeadCoupling {
 public:
  // Starts at the pooled features' input, the ReLU output of the pre-activation `top` (unmasked): each position
  // carries f/area, f ≈ ρ(μ) a channel's mean, plus the image's own deviation (independent).
  HeadCoupling(const Plane& top, double own_part) : size_(top.size), stats_(stats_of(top)) {
    const std::size_t n = top.count();
    const double area = static_cast<double>(n);
    a1_.assign(n, 1.0 / area);
    a2_.assign(n, 0.0);
    a3_.assign(n, 0.0);
    incoherent_.assign(n, own_part / (area * area));
  }
  // E|Jᵀf|² per element at the current level.
  double energy() {
    if (energy_ < 0.0) {
      double total = 0.0;
      for (std::size_t p = 0; p < a1_.size(); ++p) total += incoherent_[p] + at(p).square;
      energy_ = total / static_cast<double>(a1_.size());
    }
    return energy_;
  }
  // The ReLU mask of `pre` (the level's own pre-activation: the same values, so its per-channel statistics stay).
  // Once per level: the ReLUs of a rectified stream (post-activation zero-branch blocks) mask the same entries again.
  void mask(const Plane& pre) {
    if (masked_) return;
    masked_ = true;
    energy_ = -1.0;
    for (std::size_t p = 0; p < a1_.size(); ++p) {
      a3_[p] += a1_[p];
      a1_[p] = 0.0;
      incoherent_[p] *= normal_cdf(pre.mean[p] / std::sqrt(std::max(pre.var_at(p), 1e-300)));
    }
  }
  // The transpose of a plain 1×1 conv (weights w, its stride) whose input is ReLU(`pre_in`); the current level is
  // its output.
  void transpose(const ConvWeights& w, const Plane& pre_in) {
    const auto stride = static_cast<std::size_t>(w.stride);
    const std::size_t n_in = pre_in.count();
    const auto out_size = static_cast<std::size_t>(size_), in_size = static_cast<std::size_t>(pre_in.size);
    const double c_out = static_cast<double>(w.out), v = w.weight_var;
    std::vector<Channels> stats_in = stats_of(pre_in);
    std::vector<double> a1(n_in, 0.0), a2(n_in, 0.0), a3(n_in, 0.0), incoherent(n_in, 0.0);
    for (std::size_t oy = 0; oy < out_size; ++oy) {
      for (std::size_t ox = 0; ox < out_size; ++ox) {
        const std::size_t p = oy * out_size + ox;
        const std::size_t q = oy * stride * in_size + ox * stride;
        if (q >= n_in) continue;
        const Here h = at(p);
        const Channels& below = stats_in[q];
        const double coherent = h.k_mu * h.k_mu * below.rho_sq + h.k_y * h.k_y * (below.relu_sq - below.rho_sq);
        a1[q] = c_out * v * (h.k_mu - h.k_y);
        a2[q] = c_out * v * h.k_y;
        incoherent[q] = c_out * v * (incoherent_[p] + h.square) - c_out * v * v * coherent;
      }
    }
    a1_ = std::move(a1);
    a2_ = std::move(a2);
    a3_ = std::move(a3);
    incoherent_ = std::move(incoherent);
    stats_ = std::move(stats_in);
    size_ = pre_in.size;
    energy_ = -1.0;
    masked_ = false;
  }

 private:
  // Per channel at one position of a centred pre-activation plane: μ ~ N(0, q_μ), the channels' mean square scaled
  // with the position's variance (a border position reads fewer taps), ε ~ N(0, s²). E[ρ²], E[ReLU(y)²], and the
  // integrals K reads.
  struct Channels {
    double rho_sq = 0.0, relu_sq = 0.0, cdf = 0.5, cdf_sq = 0.25, cdf_rho_sq = 0.0, density_rho = 0.0;
  };
  // Every position's, once per level.
  static std::vector<Channels> stats_of(const Plane& y) {
    double interior = 0.0;
    for (std::size_t i = 0; i < y.count(); ++i) interior = std::max(interior, y.var_at(i));
    std::vector<Channels> out;
    out.reserve(y.count());
    for (std::size_t p = 0; p < y.count(); ++p) out.push_back(channels(y, p, interior));
    return out;
  }
  static Channels channels(const Plane& y, std::size_t p, double interior) {
    static const theory::GaussHermite rule(64);
    const double var = y.var_at(p);
    const double q_mu = interior > 0 ? std::clamp(y.channel_mean_sq * var / interior, 0.0, var) : 0.0;
    const double s = std::sqrt(std::max(var - q_mu, 1e-300));
    Channels c;
    c.relu_sq = 0.5 * var;
    auto each = [&](auto&& f) { return rule.expect(f, 0.0, std::sqrt(q_mu)); };
    auto cdf = [&](double mu) { return normal_cdf(mu / s); };
    auto rho = [&](double mu) {
      return mu * normal_cdf(mu / s) + s * std::exp(-0.5 * mu * mu / (s * s)) / std::sqrt(2.0 * std::numbers::pi);
    };
    c.rho_sq = each([&](double mu) { return rho(mu) * rho(mu); });
    c.cdf = each(cdf);
    c.cdf_sq = each([&](double mu) { return cdf(mu) * cdf(mu); });
    c.cdf_rho_sq = each([&](double mu) { return cdf(mu) * rho(mu) * rho(mu); });
    c.density_rho = each([&](double mu) {
      return std::exp(-0.5 * mu * mu / (s * s)) / (s * std::sqrt(2.0 * std::numbers::pi)) * rho(mu);
    });
    return c;
  }
  struct Here {
    double square = 0.0, k_mu = 0.0, k_y = 0.0;
  };
  Here at(std::size_t p) const {
    const double a1 = a1_[p], a2 = a2_[p], a3 = a3_[p];
    if (a1 == 0.0 && a2 == 0.0 && a3 == 0.0) return {};
    const Channels& c = stats_[p];
    Here h;
    h.square = (a1 * a1 + 2.0 * a1 * a2 + 2.0 * a2 * a3) * c.rho_sq + a2 * a2 * c.relu_sq +
               (a3 * a3 + 2.0 * a1 * a3) * c.cdf_rho_sq;
    h.k_y = a2 * c.cdf + a3 * c.density_rho;
    h.k_mu = a1 * c.cdf + a3 * c.cdf_sq + h.k_y;
    return h;
  }
  int size_;                     // the current level's side
  std::vector<Channels> stats_;  // its per-channel statistics, per position
  double energy_ = -1.0;
  bool masked_ = false;
  std::vector<double> a1_, a2_, a3_, incoherent_;
};

}  // namespace

StreamMoments activation_moments(Activation kind, double mean, double var) {
  return gaussian_integrals(kind, mean, var);
}

ResnetBookkeeping resnet_bookkeeping(const ResnetConfig& config, const ScalingRule& rule, double input_var,
                                     const ResnetTheoryOptions& options) {
  const resnet_util::Layout layout = resnet_util::layout(config);
  const ResnetRuleSpec spec = rule.resnet();
  const bool preact = config.preact, normed = config.norm == ResnetNorm::batchnorm;
  const bool borders = options.borders;
  const Activation act = config.activation;
  const std::int64_t base = 16 * static_cast<std::int64_t>(config.width);
  const std::int64_t expansion = layout.bottleneck ? 4 : 1;
  const double gamma = rule.init(ParamInfo{ParamRole::norm_gain, 1, 1, -1, ""}).value;
  const double shift = rule.init(ParamInfo{ParamRole::norm_bias, 1, 1, -1, ""}).value;
  const double batch = static_cast<double>(std::max<std::int64_t>(1, options.batch));
  ActivationIntegrals integrals(act);

  auto weights = [&](ParamRole role, std::int64_t in, std::int64_t out, int kernel, int stride, int block,
                     bool reads_activation) {
    ConvWeights w;
    w.in = in;
    w.out = out;
    w.kernel = kernel;
    w.stride = stride;
    const std::int64_t fan_in = in * kernel * kernel, fan_out = out * kernel * kernel;
    if (spec.weight_standardization) {
      const InitSpec g = rule.init(ParamInfo{ParamRole::norm_gain, fan_in, fan_out, block, ""});
      const double scale = (reads_activation ? spec.activation_gain : 1.0) * g.value;
      w.standardised = true;
      w.ws_norm_sq = scale * scale;
    } else {
      const InitSpec init = rule.init(ParamInfo{role, fan_in, fan_out, block, ""});
      w.weight_var = init.kind == InitSpec::Kind::constant ? 0.0 : init.std * init.std;
    }
    return w;
  };
  // BatchNorm (batch statistics over images and positions): per position (x − μ̄)/σ̄·γ + β.
  struct NormStats {
    double mean = 0.0, sd = 1.0;
  };
  // A channel's batch mean is the shared mean plus its own δ̄_c; its batch variance lacks E[δ̄_c²] (and the shared
  // mean's square).
  auto norm_stats = [&](const Plane& x) {
    const double m = x.avg_mean();
    return NormStats{m, std::sqrt(std::max(x.avg_second() - m * m - x.avg_mean_share(), 1e-30))};
  };
  // At p the channel loses its batch mean: Var(p) − 2·E[δ(p)·δ̄] + E[δ̄²] (the per-position variance includes the
  // channel-specific means δ(p)). In the interior this is Var − E[δ̄²]; at a border, whose taps read less of the
  // channel's mean, more of its variance stays. Afterwards the channel-specific means average to zero over the
  // positions, so mean_share is 0.
  auto norm = [&](const Plane& x) -> Plane {
    if (!normed) return x;
    const NormStats s = norm_stats(x);
    const double share = x.avg_mean_share();
    Plane y = x;
    for (std::size_t p = 0; p < x.count(); ++p) {
      const double m = shift + gamma * (x.mean[p] - s.mean) / s.sd,
                   v = gamma * gamma * std::max(0.0, x.var_at(p) - 2.0 * x.mean_share[p] + share) / (s.sd * s.sd);
      y.mean[p] = m;
      y.second[p] = v + m * m;
    }
    y.channel_mean_sq = shift * shift;
    std::fill(y.mean_share.begin(), y.mean_share.end(), 0.0);
    // Each channel divided by its own batch deviation: the channels' scale spread, which most of a conv's scale
    // mixture is, is gone; the within-channel kurtosis left ((κ_c − 3)/fan-in) is not tracked.
    y.clear_mixture();
    // Every channel is normalised by its own batch statistics: no scale spread is left.
    y.coupling = 0.0;
    y.fresh = 0.0;
    y.channel_spread = 0.0;
    y.var_spread = 0.0;
    return y;
  };
  // A channel's mean after φ: the shared mean plus its deviation times the mean slope. The moments are those of
  // the input's scale mixture (Plane::mix; a ReLU of a centred mixture keeps E[φ²] = v/2 and lowers E[φ] to
  // E[√s]·√v/√(2π)); the output's E[φ⁴] is kept for the next conv.
  auto activate = [&](const Plane& x) -> Plane {
    Plane y = x;
    y.clear_mixture();
    y.fourth.resize(x.count());
    y.shared.resize(x.count());
    y.shared_root.resize(x.count());
    std::vector<double> slopes(x.count());
    for (std::size_t p = 0; p < x.count(); ++p) {
      const double mean = x.mean[p], var = x.var_at(p), mix = x.mix_at(p);
      if (act == Activation::relu && mean == 0.0 && mix > 0.0) {
        // A ReLU of a centred mixture, exactly: E[φ] = E[√s]·√v/√(2π), E[φ²] = v/2, E[φ⁴] = 3v²·E[s²]/2, and
        // E[φ² | s] ∝ s keeps the whole scale for the next conv.
        y.mean[p] = x.root_at(p) * std::sqrt(var / (2.0 * std::numbers::pi));
        y.second[p] = 0.5 * var;
        y.fourth[p] = 1.5 * var * var * (1.0 + mix);
        y.shared[p] = mix;
        y.shared_root[p] = x.root_at(p);
        slopes[p] = 0.5;
        continue;
      }
      // Otherwise the mixture as one Gamma factor of its variance.
      const StreamMoments m = integrals.mixed_moments(mean, var, mix);
      y.mean[p] = m.mean;
      y.second[p] = m.var;
      y.fourth[p] = integrals.mixed_fourth(mean, var, mix);
      y.shared[p] = integrals.mixed_second_spread(mean, var, mix);
      y.shared_root[p] = gamma_root(y.shared[p]);
      slopes[p] = integrals.mixed_slope(mean, var, mix).mean;
    }
    const double slope = average(slopes);
    const double in_mean = x.avg_mean(), out_mean = y.avg_mean();
    y.channel_mean_sq = out_mean * out_mean + slope * slope * std::max(0.0, x.channel_mean_sq - in_mean * in_mean);
    // δ_out(p) ≈ φ'-mean(p)·δ(p): E[δ_out(p)·δ̄_out] ≈ slope(p)·(mean slope)·E[δ(p)·δ̄].
    for (std::size_t p = 0; p < x.count(); ++p)
      y.mean_share[p] = slopes[p] * slope * x.mean_share[p];
    // The band: E[φ²] follows a rescaling of its input (mean and variance together) with this log-slope (1 for
    // ReLU); the units' own sampling over positions × images is negligible.
    const double m = x.avg_mean(), v = std::max(x.avg_second() - m * m, 0.0);
    constexpr double h = 1e-3;
    const double up = integrals.moments(m * std::sqrt(1.0 + h), v * (1.0 + h)).var,
                 down = integrals.moments(m * std::sqrt(1.0 - h), v * (1.0 - h)).var;
    const double log_slope =
        up > 0 && down > 0 ? (std::log(up) - std::log(down)) / (std::log1p(h) - std::log1p(-h)) : 1.0;
    y.coupling = log_slope * x.coupling;
    y.fresh = log_slope * log_slope * x.fresh;
    y.channel_spread = log_slope * log_slope * x.channel_spread;
    y.var_spread = log_slope * log_slope * x.var_spread;
    // A small realised correlation c passes as c·E[φ']²·Var_in/Var_out (the first Hermite term).
    const double out_var = y.population().var, in_slope = integrals.slope(m, v).mean;
    const double pass = out_var > 0 ? in_slope * in_slope * v / out_var : 0.0;
    for (double& c : y.coherence) c *= pass * pass;
    for (double& l : y.link) l *= pass;
    return y;
  };
  auto scaled = [](Plane x, double s) {
    for (double& m : x.mean) m *= s;
    for (double& v : x.second) v *= s * s;
    for (double& v : x.fourth) v *= s * s * s * s;
    for (double& v : x.mean_share) v *= s * s;
    x.channel_mean_sq *= s * s;
    return x;
  };

  // The forward pass, keeping what the backward pass needs.
  struct ConvStep {
    ConvWeights w;
    Plane input;     // what the conv reads
    Plane pre_norm;  // post-activation: the conv's output (the norm's input); pre-activation: the norm's input
    Plane pre_act;   // the activation's input (when one follows)
    bool has_act = false;
  };
  struct BlockState {
    double input_scale = 1.0, lambda = 1.0, beta = 1.0;
    Plane stream_in, sum;  // sum: the post-activation pre-rectification sum
    bool passes = false;   // post-activation zero-branch block: ReLU of the rectified stream, which it leaves as is
    Plane rectifier_input;  // post-activation: the input of the ReLU that last rectified the stream entering
    // Post-activation ReLU blocks whose sum's distribution is carried: per position, the sum's masses, P(sum > 0)
    // (ReLU's slope), the branch's mean and variance (β included) on the grid of spacing grid_h; density_input: the
    // block whose sum_density is this block's u (−1: Gaussian, from rectifier_input).
    std::vector<Density> sum_density;
    std::vector<double> sum_positive, branch_mean, branch_var;
    double grid_h = 0.0;
    int density_input = -1;
    std::vector<ConvStep> steps;
    bool projection = false;
    ConvWeights shortcut;
    Plane shortcut_input, shortcut_out;
  };
  std::vector<BlockState> states;

  ResnetBookkeeping out;
  out.formulae = std::string("resnet variance bookkeeping, position-resolved (") +
                 (borders ? "zero-padded borders" : "interior only") +
                 "): plain conv E[y²] = C_in·std²·Σ_taps E[a²]; standardised conv Var = (gain·scale)²·(avg E[a²] − "
                 "avg(mean)²); BatchNorm on the batch statistics; a ReLU after a plain conv without BatchNorm sees a "
                 "Gaussian scale mixture (Gamma factors); out = λ·shortcut + β·branch (independent); "
                 "post-activation ReLU sums with a rectified shortcut carried as distributions per position; "
                 "backward: transposed conv sums, φ'² per position (carried sums: E[g²|s] weighs the mask), "
                 "BatchNorm γ²·E[1/σ_c²] less the batch mean (the images' loss gradients covary); identity blocks at "
                 "initialisation: + the classifier's coupling σ⁴·((tr S)² + tr S²)·E|Jᵀf|²";
  const int image = config.image_size;
  // The images' own sampling: a mean of squares of in_channels × image² × batch N(0, input_var) pixels, and per
  // channel of image² × batch of them.
  Plane images = Plane::uniform(image, 0.0, input_var);
  const double pixels = static_cast<double>(image) * image * batch;
  images.coupling = 0.0;
  images.fresh = 2.0 / (static_cast<double>(config.in_channels) * pixels);
  images.channel_spread = 2.0 / pixels;
  images.var_spread = images.channel_spread;
  Plane x = conv_forward(images, weights(ParamRole::conv_stem, config.in_channels, base, 3, 1, -1, false), borders,
                         options.padded_spread, options.scale_mixture);
  Plane rectifier_input;
  int density_block = -1;  // post-activation: the block whose sum_density is rectifier_input's (−1: Gaussian)
  if (!preact) {
    rectifier_input = norm(x);
    x = activate(rectifier_input);
  }
  out.stem = x.population();
  double stream_log_var = x.log_var(0.0);  // Var[log var] of the stream entering the next block
  out.stem_log_sd = std::sqrt(stream_log_var);
  std::int64_t channels = base;
  for (int b = 0; b < layout.blocks(); ++b) {
    const std::int64_t width = base << layout.stage(b), block_out = width * expansion;
    const int stride = layout.transition(b) ? 2 : 1;
    struct Shape {
      std::int64_t in, out;
      int kernel, stride;
    };
    const std::vector<Shape> shapes =
        layout.bottleneck ? std::vector<Shape>{{channels, width, 1, 1}, {width, width, 3, stride}, {width, block_out, 1, 1}}
                          : std::vector<Shape>{{channels, width, 3, stride}, {width, width, 3, 1}};
    const int m = static_cast<int>(shapes.size());
    BlockState st;
    st.input_scale = rule.resnet_block(b).input_scale;
    const ResidualSpec residual = rule.residual(b, Branch::ffn);
    st.lambda = residual.lambda;
    st.beta = residual.beta;
    x.coupling = 1.0;  // the band's terms are counted from this block's input stream on
    x.fresh = 0.0;
    // The stream's link with itself: its own channel at Δ = 0 and, through their realised correlations, the others.
    for (std::size_t i = 0; i < x.link.size(); ++i)
      x.link[i] = static_cast<double>(channels) * x.coherence[i] + (i == offset_index(0, 0) ? 1.0 : 0.0);
    st.stream_in = x;
    st.rectifier_input = rectifier_input;
    out.stream_in.push_back(x.population());
    out.stream_in_log_sd.push_back(std::sqrt(stream_log_var));
    Plane cur = scaled(x, st.input_scale), first_conv_input;
    for (int j = 0; j < m; ++j) {
      ConvStep step;
      step.w = weights(j == m - 1 ? ParamRole::conv_branch_out : ParamRole::conv_branch, shapes[j].in, shapes[j].out,
                       shapes[j].kernel, shapes[j].stride, b, true);
      if (preact) {
        step.pre_norm = cur;
        step.pre_act = norm(cur);
        step.has_act = true;
        step.input = activate(step.pre_act);
      } else {
        step.input = cur;
      }
      if (j == 0) first_conv_input = step.input;
      cur = conv_forward(step.input, step.w, borders, options.padded_spread, options.scale_mixture);
      if (!preact) {
        step.pre_norm = cur;
        cur = norm(cur);
        if (j < m - 1) {
          step.pre_act = cur;
          step.has_act = true;
          cur = activate(cur);
        }
      }
      st.steps.push_back(std::move(step));
    }
    out.branch.push_back(cur.population());
    out.branch_log_sd.push_back(std::sqrt(cur.log_var(stream_log_var)));
    Plane shortcut = x;
    st.projection = layout.projection(b);
    if (st.projection) {
      st.shortcut = weights(ParamRole::conv_shortcut, channels, block_out, 1, stride, b, true);
      // Pre-activation: the projection reads act(norm(s·x)) (the first conv's input); post-activation: s·x.
      st.shortcut_input = first_conv_input;
      st.shortcut_out =
          conv_forward(st.shortcut_input, st.shortcut, borders, options.padded_spread, options.scale_mixture);
      shortcut = preact ? st.shortcut_out : norm(st.shortcut_out);
    }
    Plane sum = shortcut;
    for (std::size_t p = 0; p < sum.count(); ++p) {
      const double mean = st.lambda * shortcut.mean[p] + st.beta * cur.mean[p];
      const double var = st.lambda * st.lambda * shortcut.var_at(p) + st.beta * st.beta * cur.var_at(p);
      sum.mean[p] = mean;
      sum.second[p] = var + mean * mean;
    }
    sum.channel_mean_sq = st.lambda * st.lambda * shortcut.channel_mean_sq + st.beta * st.beta * cur.channel_mean_sq +
                          2.0 * st.lambda * st.beta * shortcut.avg_mean() * cur.avg_mean();
    for (std::size_t p = 0; p < sum.count(); ++p)
      sum.mean_share[p] = st.lambda * st.lambda * shortcut.mean_share[p] + st.beta * st.beta * cur.mean_share[p];
    // The sum's scale mixture: a zero part (a Fixup or SkipInit branch at initialisation) leaves the other's; two
    // nonzero parts are closed as a Gaussian.
    if (st.beta * st.beta * cur.avg_second() == 0.0) {
      for (double& v : sum.fourth) v *= st.lambda * st.lambda * st.lambda * st.lambda;
    } else if (st.lambda * st.lambda * shortcut.avg_second() == 0.0) {
      sum.mix = cur.mix;
      sum.root = cur.root;
      sum.shared = cur.shared;
      sum.shared_root = cur.shared_root;
      sum.fourth = cur.fourth;
      for (double& v : sum.fourth) v *= st.beta * st.beta * st.beta * st.beta;
    } else {
      sum.clear_mixture();
    }
    // The band of the sum: each part's coupling to the block input's scale and its own spread, weighted by its
    // share, plus the empirical shortcut–branch covariance over elements (zero in expectation). Over the branch's
    // last conv its dominant part is the channels' own means: (1/C)·Σ_c δ_s,c·δ_b,c with variance
    // E[δ_s²]·E[δ_b²]/C (the two channel means are independent; positions are uncorrelated beyond them).
    {
      const double vs = st.lambda * st.lambda * shortcut.population().var,
                   vb = st.beta * st.beta * cur.population().var;
      const double vy = sum.population().var;
      if (vy > 0) {
        const double ms = shortcut.avg_mean(), mb = cur.avg_mean();
        const double ds = std::max(0.0, shortcut.channel_mean_sq - ms * ms),
                     db = std::max(0.0, cur.channel_mean_sq - mb * mb);
        // The channel-matched realised covariance of the shortcut (the identity: the block's input) and the
        // branch, E[Cov(x_c, b_c)²] = Var x·Var b·link_b[0]/C_out, adds to the channel means' part.
        // A projection shortcut follows the stream through its own link: E[Cov(s_c, b_c)²] ≈ C_in·link_s·link_b/C_out²
        // (over the stream's C_in channels; its self-link, which both count, once).
        const std::size_t at0 = offset_index(0, 0);
        const double linked =
            st.projection
                ? vs * vb * static_cast<double>(channels) * shortcut.link[at0] * cur.link[at0] /
                      (static_cast<double>(block_out) * static_cast<double>(block_out) * std::max(x.link[at0], 1.0))
                : vs * vb * cur.link[at0] / static_cast<double>(block_out);
        const double cross = 4.0 * (st.lambda * st.lambda * st.beta * st.beta * ds * db + linked);
        sum.coupling = (vs * shortcut.coupling + vb * cur.coupling) / vy;
        sum.fresh =
            (vs * vs * shortcut.fresh + vb * vb * cur.fresh + cross / static_cast<double>(block_out)) / (vy * vy);
        sum.channel_spread = (vs * vs * shortcut.channel_spread + vb * vb * cur.channel_spread + cross) / (vy * vy);
        sum.var_spread = (vs * vs * shortcut.var_spread + vb * vb * cur.var_spread + 4.0 * linked) / (vy * vy);
        for (std::size_t i = 0; i < sum.coherence.size(); ++i)
          sum.coherence[i] = (vs * vs * shortcut.coherence[i] + vb * vb * cur.coherence[i]) / (vy * vy);
      }
    }
    // A zero branch leaves a post-activation ReLU stream as it is (ReLU is idempotent on its non-negative output);
    // the Gaussian closure would not see that.
    const bool rectified_identity = !preact && !st.projection && act == Activation::relu &&
                                    st.beta * st.beta * cur.avg_second() == 0.0 && residual.lambda >= 0.0;
    st.sum = sum;
    st.passes = rectified_identity;  // its entries that are 0 stay 0
    x = preact || rectified_identity ? sum : activate(sum);
    // A post-activation ReLU block whose shortcut is the rectified stream: the sum λ·ReLU(u) + β·branch is not
    // Gaussian (λ·ReLU(u) has mass at 0), and the Gaussian closure of its ReLU falls short (docs/theory.md,
    // "ResNets"). Its per-position distribution is carried from block to block instead (u the previous sum: Gaussian
    // after the stem's norm or a projection block), and the stream's moments and ReLU's slope are taken from it. A
    // projection block's sum is Gaussian; its distribution is kept too, for the backward: the masks of consecutive
    // blocks are correlated through it.
    const bool carried = !preact && act == Activation::relu && !rectified_identity && options.rectified_sums &&
                         (st.projection || st.lambda >= 0.0);
    double min_var = std::numeric_limits<double>::infinity(), avg_var = 0.0;  // the branch's, over positions
    for (std::size_t p = 0; carried && p < cur.count(); ++p) {
      const double v = st.beta * st.beta * cur.var_at(p);
      avg_var += v / static_cast<double>(cur.count());
      if (v > 0) min_var = std::min(min_var, v);
    }
    if (carried && avg_var > 0.0) {
      // The grid resolves the narrowest branch distribution by 6 points per standard deviation, but no finer than
      // √0.05 of the average's: a nearly constant position does not make every position's grid huge. (Masses that
      // fall between grid points split linearly: mass and mean kept, the variance raised by f(1 − f)·h², at most
      // h²/4 = Var/144 per block at the narrowest position, and under 0.2% of the stream's in all.)
      st.grid_h = std::sqrt(std::max(std::min(min_var, avg_var), 0.05 * avg_var)) / 6.0;
      st.branch_mean.resize(sum.count());
      st.branch_var.resize(sum.count());
      st.sum_density.resize(sum.count());
      st.sum_positive.assign(sum.count(), 0.0);
      st.density_input = st.projection ? -1 : density_block;
      for (std::size_t p = 0; p < sum.count(); ++p) {
        st.branch_mean[p] = st.beta * cur.mean[p];
        st.branch_var[p] = st.beta * st.beta * cur.var_at(p);
        if (st.projection) {
          st.sum_density[p] = mixture_density(sum.mean[p], sum.var_at(p), sum.mix_at(p), st.grid_h);
          st.sum_positive[p] = integrals.mixed_slope(sum.mean[p], sum.var_at(p), sum.mix_at(p)).mean;
          continue;
        }
        const Density u = density_block >= 0 ? states[static_cast<std::size_t>(density_block)].sum_density[p]
                                             : mixture_density(rectifier_input.mean[p], rectifier_input.var_at(p),
                                                               rectifier_input.mix_at(p), st.grid_h);
        RectifiedSum r = rectified_sum(u, st.lambda, st.branch_mean[p], st.branch_var[p], st.grid_h);
        x.mean[p] = r.moments.mean;
        x.second[p] = r.moments.var;
        x.fourth[p] = r.fourth;
        st.sum_positive[p] = r.positive;
        st.sum_density[p] = std::move(r.sum);
      }
      if (!st.projection) {
        // The channels' means follow the carried moments too (activate() had them from the Gaussian closure): the
        // shared mean², plus the channels' own spread through the mean slope P(s > 0), as activate() does.
        const double slope = average(st.sum_positive), in_mean = sum.avg_mean(), out_mean = x.avg_mean();
        x.channel_mean_sq =
            out_mean * out_mean + slope * slope * std::max(0.0, sum.channel_mean_sq - in_mean * in_mean);
        for (std::size_t p = 0; p < sum.count(); ++p) x.mean_share[p] = st.sum_positive[p] * slope * sum.mean_share[p];
      }
      density_block = b;
    } else if (!rectified_identity) {
      density_block = -1;  // the stream's rectifier input is Gaussian again (or not followed)
    }
    if (!rectified_identity) rectifier_input = sum;
    out.stream_out.push_back(x.population());
    stream_log_var = x.log_var(stream_log_var);
    out.stream_out_log_sd.push_back(std::sqrt(stream_log_var));
    states.push_back(std::move(st));
    channels = block_out;
  }

  // Backward from the loss: mean softmax cross-entropy over `batch` images (near-uniform predictions), the
  // classifier (fan_out = classes), global average pooling (every position gets 1/HW of the pooled gradient).
  const std::int64_t classes = config.classes;
  const InitSpec head = rule.init(ParamInfo{ParamRole::readout, channels, classes, -1, ""});
  const double head_var = head.kind == InitSpec::Kind::constant ? 0.0 : head.std * head.std;
  Plane final_in = x;
  Plane final_pre_act;
  if (preact) {
    final_pre_act = norm(x);
    final_in = activate(final_pre_act);
  }
  // The logits: z_bv = Σ_c W_vc·p_bc with p_bc channel c of image b averaged over the positions, so a row's spread
  // across classes is head_var·C·E[p²]. E[p²] is a channel's mean over images and positions squared
  // (channel_mean_sq) plus the image's own deviation from it, averaged over the `area` positions, taken as
  // independent: (E[a²] − channel_mean_sq)/area. (Not E[a²] itself: averaging over 64 positions removes most of the
  // per-position variance, and with the exact softmax moments that overestimate put the top gradient 3.5–4% high
  // over 24 seeds.) The images share head_var·C·channel_mean_sq of it (corr).
  const double area_count = static_cast<double>(final_in.count());
  const double pooled_sq =
      final_in.channel_mean_sq + std::max(0.0, final_in.avg_second() - final_in.channel_mean_sq) / area_count;
  const double logit_second = head_var * static_cast<double>(channels) * pooled_sq;
  const double logit_shared = head_var * static_cast<double>(channels) * final_in.channel_mean_sq;
  const theory::Signal logits{0.0, logit_second, logit_second > 0 ? logit_shared / logit_second : 0.0};
  const double d_logit = theory::cross_entropy_grad_var(logits, classes, static_cast<std::int64_t>(batch),
                                                        options.grad_scale);
  const double d_pooled = static_cast<double>(classes) * head_var * d_logit;
  const double area = static_cast<double>(final_in.count());
  GradPlane g;
  g.size = final_in.size;
  g.second.assign(final_in.count(), d_pooled / (area * area));
  g.image_mean_sq = d_pooled / (area * area);
  // The images' loss gradients covary (docs/theory.md, "ResNets"): with the classifier's rows independent of the
  // p's, E[g_i·g_j] ∝ E[(p_i − y_i)·(p_j − y_j)] = (S − 1/C)·s(r) − 1/C + [y_i = y_j] for two images whose logits
  // correlate by r (s(r) = softmax_shared_excess; S = E[Σp²]), against S − 2/C + 1 on the diagonal. Their batch
  // mean's square is (diagonal + (N − 1)·(pair term) + pairs/N)/(N·diagonal) of the variance, `pairs` = Σ_v n_v(n_v −
  // 1) over the batch's target counts (random targets: N(N − 1)/C).
  const double sum_p_sq = theory::softmax_sum_p_sq(logits.var, classes);
  {
    const double c = static_cast<double>(classes);
    const double diagonal = sum_p_sq - 2.0 / c + 1.0;
    double pairs = batch * (batch - 1.0) / c;
    if (!options.batch_targets.empty()) pairs = theory::same_label_pairs(options.batch_targets);
    const double pair_term = (sum_p_sq - 1.0 / c) * theory::softmax_shared_excess(logits.corr, logits.var) - 1.0 / c;
    const double share = (diagonal + (batch - 1.0) * pair_term + pairs / batch) / (batch * diagonal);
    g.images_shared = g.image_mean_sq * (std::clamp(share, 0.0, 1.0) - 1.0 / batch);
  }

  auto act_backward = [&](const GradPlane& dy, const Plane& pre) {
    GradPlane dx = dy;
    double slope_mean = 0.0;
    for (std::size_t p = 0; p < dy.second.size(); ++p) {
      const Slope s = integrals.mixed_slope(pre.mean[p], pre.var_at(p), pre.mix_at(p));
      dx.second[p] *= s.second;
      slope_mean += s.mean;
    }
    slope_mean /= static_cast<double>(dy.second.size());
    dx.image_mean_sq = dy.image_mean_sq * slope_mean * slope_mean;
    dx.images_shared = dy.images_shared * slope_mean * slope_mean;
    return dx;
  };
  // BatchNorm's backward: γ/σ̄·(g − mean_batch(g) − x̂·mean(g·x̂)); the last term is O(1/(N·HW)) and dropped.
  // `own_fan_in` (0: none): the norm's input is the output of a conv of that fan-in, and that conv's transpose comes
  // next, so what reaches its input is Σ_c w_c,i²/σ_c² with σ_c² = w_cᵀG_c·w_c grown by the same weights. Over the
  // inputs i, E[|w|²/(wᵀGw)] = (n/Λ)·(1 + 2Σλ²/Λ² − 2/n) to second order (λ the Gram's eigenvalues, Λ = Σλ; exact
  // for an isotropic Gram, E[z_i²/Σ_k z_k²] = 1/n): the weights' spread less 2/n.
  // `projected`: what its projection on x̂ removes besides (see norm_act_backward), before the 1/σ² factor.
  auto norm_backward = [&](const GradPlane& dy, const Plane& pre, double own_fan_in, double projected = 0.0) {
    if (!normed) return dy;
    const NormStats s = norm_stats(pre);
    // E[1/σ_c²] over the channels: (1 + spread)/σ̄² to second order in the relative variance of their batch
    // variances: the weights' var_spread (less 2/n for the own conv's inputs), plus the batch's own sampling of a
    // variance over batch × HW elements, 2/(batch·HW) (positions taken as independent; their correlation would add).
    const double sampling = 2.0 / (static_cast<double>(batch) * static_cast<double>(pre.count()));
    const double own = own_fan_in > 0 ? 2.0 / own_fan_in : 0.0;
    const double k = gamma * gamma * std::max(0.0, 1.0 + pre.var_spread - own + sampling) / (s.sd * s.sd);
    const double batch_mean_sq = std::max(0.0, dy.image_mean_sq / batch + dy.images_shared) + projected;
    GradPlane dx = dy;
    for (double& v : dx.second) v = k * std::max(0.0, v - batch_mean_sq);
    dx.image_mean_sq = k * std::max(0.0, dy.image_mean_sq - batch_mean_sq);
    dx.images_shared = -dx.image_mean_sq / batch;  // the batch mean is gone: the images' means sum to 0
    return dx;
  };
  // An activation right after the norm, backward through both. The part of the gradient shared by the whole batch
  // (per channel: image_mean_sq/N + images_shared before the mask, ḡ²) reaches the norm as ḡ·φ'(x̂), and the
  // norm's backward removes its projections on 1 (the batch mean, above) and on x̂: the latter is
  // ḡ²·E[x̂·φ'(x̂)]² (ReLU: E[x̂·1(x̂ > 0)] = 0.40 for a centred unit x̂), the "O(1/(N·HW))" term only while the
  // gradient has no shared part.
  auto norm_act_backward = [&](const GradPlane& dy, const Plane& act_in, const Plane& pre, double own_fan_in) {
    const double shared = std::max(0.0, dy.image_mean_sq / batch + dy.images_shared);
    double along = 0.0;  // E[x̂·φ'(x̂)] averaged over the positions, x̂ = (act_in − β)/γ
    if (normed && shared > 0.0 && gamma != 0.0) {
      for (std::size_t p = 0; p < act_in.count(); ++p) {
        const double mean = (act_in.mean[p] - shift) / gamma, sd = std::sqrt(act_in.var_at(p)) / std::abs(gamma);
        double e = 0.0;
        if (act == Activation::relu) {
          e = gaussian_integrals(Activation::relu, mean, sd * sd).mean;  // E[x·1(x > 0)] = E[ReLU(x)]
        } else {
          static const theory::GaussHermite rule(64);
          constexpr double kStep = 1e-5;
          e = rule.expect([&](double z) {
            const double x = mean + sd * z, y = shift + gamma * x;
            return x * (resnet_util::activation_value(act, y + kStep) - resnet_util::activation_value(act, y - kStep)) /
                   (2 * kStep);
          });
        }
        along += e / static_cast<double>(act_in.count());
      }
    }
    return norm_backward(act_backward(dy, act_in), pre, own_fan_in, shared * along * along);
  };
  auto add_into = [](GradPlane& into, const GradPlane& other, double weight) {
    for (std::size_t p = 0; p < into.second.size(); ++p) into.second[p] += weight * other.second[p];
    into.image_mean_sq += weight * other.image_mean_sq;
    into.images_shared += weight * other.images_shared;
  };
  auto times = [](GradPlane gp, double weight) {
    for (double& v : gp.second) v *= weight;
    gp.image_mean_sq *= weight;
    gp.images_shared *= weight;
    return gp;
  };

  if (preact) g = norm_act_backward(g, final_pre_act, x, 0.0);
  const int blocks = layout.blocks();
  // The classifier's coupling (HeadCoupling above), where it is derived: plain convs, no norm, ReLU, and every block
  // the identity at initialisation (its branch's β = 0, λ = 1, input scale 1) with plain 1×1 projections. Its scale
  // σ⁴·((tr S)² + tr S²)·(grad_scale/batch)², with E[Σp²] = S₂ the softmax's and Σp³ ≈ (C·S₂)³/C² (log-normal
  // probabilities): tr S = 1 − S₂, tr S² = S₂ − 2·Σp³ + S₂².
  std::optional<HeadCoupling> coupling;
  double coupling_scale = 0.0;
  {
    bool identity = options.head_coupling && head_var > 0.0 && act == Activation::relu && !normed &&
                    !spec.weight_standardization && !states.empty();
    for (const BlockState& st : states)
      identity = identity && st.beta == 0.0 && st.lambda == 1.0 && st.input_scale == 1.0 &&
                 (!st.projection || (!st.shortcut.standardised && st.shortcut.kernel == 1));
    if (identity) {
      const double c = static_cast<double>(classes), trace = 1.0 - sum_p_sq;
      const double cube = std::pow(c * sum_p_sq, 3.0) / (c * c);
      const double trace_sq = sum_p_sq - 2.0 * cube + sum_p_sq * sum_p_sq;
      const double per_image = options.grad_scale / batch;
      coupling_scale = head_var * head_var * (trace * trace + trace_sq) * per_image * per_image;
      const double own = std::max(0.0, final_in.avg_second() - final_in.channel_mean_sq) / area;
      const BlockState& last = states.back();
      coupling.emplace(preact ? final_pre_act : (last.passes ? last.rectifier_input : last.sum), own);
      if (preact) coupling->mask(final_pre_act);
    }
  }
  auto coupled = [&]() { return coupling ? coupling_scale * coupling->energy() : 0.0; };
  out.grad_in.assign(static_cast<std::size_t>(blocks), 0.0);
  out.grad_branch.assign(static_cast<std::size_t>(blocks), 0.0);
  out.grad_out.assign(static_cast<std::size_t>(blocks), 0.0);
  bool masked = false;  // g is already zero where the rectified stream is (a zero-branch block above passed it)
  // Post-activation carried sums: E[g² | this block's sum = s]/E[g²] per position on its sum_density grid, from the
  // block above (empty: g independent of the sum), and the mask's weight E[1(s > 0)·profile] per position.
  std::vector<std::vector<double>> profile;
  std::vector<double> kept;
  for (int b = blocks - 1; b >= 0; --b) {
    const BlockState& st = states[static_cast<std::size_t>(b)];
    out.grad_out[static_cast<std::size_t>(b)] = g.avg() + coupled();
    if (coupling && preact && st.projection) {
      coupling->transpose(st.shortcut, st.steps.front().pre_act);
      coupling->mask(st.steps.front().pre_act);
    } else if (coupling && !preact) {
      coupling->mask(st.passes ? st.rectifier_input : st.sum);
      if (st.projection) coupling->transpose(st.shortcut, st.rectifier_input);
    }
    GradPlane d_sum = g;
    if (!preact && !st.passes) {
      // The ReLU of this sum made the stream a zero-branch block above masked with: it does not mask twice.
      if (!masked && !st.sum_positive.empty()) {
        // P(sum > 0) from the carried distribution; where the gradient arriving here depends on this sum (`profile`,
        // from the block above), the mask weighs it: E[g²·1(s > 0)] = Σ_s D(s)·1(s > 0)·E[g² | s].
        double slope_mean = 0.0;
        kept.assign(d_sum.second.size(), 0.0);
        for (std::size_t p = 0; p < d_sum.second.size(); ++p) {
          double w = st.sum_positive[p];
          if (!profile.empty()) {
            const Density& d = st.sum_density[p];
            w = 0.0;
            for (std::size_t j = 0; j < d.mass.size(); ++j)
              w += d.mass[j] * positive_share(d.first + static_cast<std::int64_t>(j)) * profile[p][j];
          }
          kept[p] = w;
          d_sum.second[p] *= w;
          slope_mean += st.sum_positive[p] / static_cast<double>(d_sum.second.size());
        }
        d_sum.image_mean_sq *= slope_mean * slope_mean;
        d_sum.images_shared *= slope_mean * slope_mean;
      } else if (!masked) {
        d_sum = act_backward(g, st.sum);
      }
      masked = false;
    } else if (!preact) {
      // A ReLU of the rectified stream: its gradient is 0 where the stream is 0 (ReLU'(0) = 0), the same entries
      // for every such block in a row: the first one masks, the rest pass.
      if (!masked) d_sum = act_backward(g, st.rectifier_input);
      masked = true;
    }
    GradPlane d_branch = times(d_sum, st.beta * st.beta);
    out.grad_branch[static_cast<std::size_t>(b)] = d_branch.avg();
    // The branch backward, conv by conv from the last.
    const int m = static_cast<int>(st.steps.size());
    GradPlane cur = d_branch;
    GradPlane d_first_input;  // the gradient at the first conv's input (pre-activation: shared with the projection)
    for (int j = m - 1; j >= 0; --j) {
      const ConvStep& step = st.steps[static_cast<std::size_t>(j)];
      if (!preact) {
        const double fan_in = static_cast<double>(step.w.in * step.w.kernel * step.w.kernel);
        cur = j < m - 1 ? norm_act_backward(cur, step.pre_act, step.pre_norm, fan_in)
                        : norm_backward(cur, step.pre_norm, fan_in);
      }
      cur = conv_backward(cur, step.input.size, step.w, borders);
      if (preact) {
        if (j == 0 && st.projection) {
          // The projection reads the same act(norm(s·x)): its gradient joins before the norm and activation
          // (independent weights: the second moments add).
          GradPlane d_short = times(d_sum, st.lambda * st.lambda);
          add_into(cur, conv_backward(d_short, step.input.size, st.shortcut, borders), 1.0);
        }
        // Norm j normalises conv j − 1's output (j > 0), whose transpose comes next.
        const ConvWeights* below = j > 0 ? &st.steps[static_cast<std::size_t>(j - 1)].w : nullptr;
        cur = norm_act_backward(cur, step.pre_act, step.pre_norm,
                                below ? static_cast<double>(below->in * below->kernel * below->kernel) : 0.0);
      }
    }
    GradPlane d_x = times(cur, st.input_scale * st.input_scale);
    if (!st.projection) {
      add_into(d_x, d_sum, st.lambda * st.lambda);
    } else if (!preact) {
      GradPlane d_short = norm_backward(times(d_sum, st.lambda * st.lambda), st.shortcut_out,
                                        static_cast<double>(st.shortcut.in * st.shortcut.kernel * st.shortcut.kernel));
      add_into(d_x, times(conv_backward(d_short, st.shortcut_input.size, st.shortcut, borders),
                          st.input_scale * st.input_scale),
               1.0);
    }
    // The masks of consecutive blocks are correlated: this block's sum is λ·ReLU(u) + y with u the sum below, so
    // given u the skip part of the gradient entering the block below is λ²·E[g²]·T(u), T(u) = E_y[profile(s)·
    // 1(s > 0)] at s = λ·ReLU(u) + y, while the branch part does not depend on u. Their ratio to their average is
    // the profile the block below weighs its own mask with (docs/theory.md, "ResNets").
    std::vector<std::vector<double>> below;
    if (!preact && !masked && !st.passes && !st.sum_density.empty() && !st.projection && st.density_input == b - 1 &&
        b >= 1) {
      const BlockState& under = states[static_cast<std::size_t>(b - 1)];
      below.resize(d_x.second.size());
      for (std::size_t p = 0; p < d_x.second.size(); ++p) {
        const Density& here = st.sum_density[p];
        const Density& u = under.sum_density[p];
        const Density kernel = gaussian_density(st.branch_mean[p], st.branch_var[p], st.grid_h);
        // 1(s > 0)·profile(s) at grid index `index` of this block's sum (the profile's edge values beyond its grid).
        auto weight_at = [&](std::int64_t index) {
          const std::int64_t j =
              std::clamp<std::int64_t>(index - here.first, 0, static_cast<std::int64_t>(here.mass.size()) - 1);
          return positive_share(index) * (profile.empty() ? 1.0 : profile[p][static_cast<std::size_t>(j)]);
        };
        std::map<std::int64_t, double> t_of;  // T at λ·ReLU(u) = k·grid_h
        auto t_at = [&](std::int64_t k) {
          auto [it, fresh] = t_of.try_emplace(k, 0.0);
          if (fresh)
            for (std::size_t d = 0; d < kernel.mass.size(); ++d)
              it->second += kernel.mass[d] * weight_at(k + kernel.first + static_cast<std::int64_t>(d));
          return it->second;
        };
        const double lambda_sq = st.lambda * st.lambda;
        const double skip = lambda_sq * g.second[p], branch = d_x.second[p] - lambda_sq * d_sum.second[p];
        const double total = skip * kept[p] + branch;
        below[p].resize(u.mass.size());
        for (std::size_t j = 0; j < u.mass.size(); ++j) {
          const double value =
              st.lambda * std::max(0.0, static_cast<double>(u.first + static_cast<std::int64_t>(j)) * u.h);
          const double t = value / st.grid_h;
          const auto k0 = static_cast<std::int64_t>(std::floor(t));
          const double f = t - static_cast<double>(k0);
          const double tu = f > 0 ? (1.0 - f) * t_at(k0) + f * t_at(k0 + 1) : t_at(k0);
          below[p][j] = total > 0 ? (skip * tu + branch) / total : 1.0;
        }
      }
    }
    profile = std::move(below);
    g = d_x;
    out.grad_in[static_cast<std::size_t>(b)] = g.avg() + coupled();
  }
  // stem.out is the stream entering block 0.
  out.grad_stem = out.grad_in.empty() ? g.avg() : out.grad_in.front();
  // The bands are kept where they were checked over initialisations (docs/theory.md, "Finite-width bands",
  // ResNets): pre-activation ResNets with BatchNorm or weight-standardised (NF) convs. Elsewhere NaN: a
  // post-activation stream, or an unnormalised one with plain convs (SkipInit, Fixup, He), measured wider than
  // this bookkeeping, or with a centre that misses by more than the band.
  if (!(preact && (normed || spec.weight_standardization))) {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    out.stem_log_sd = nan;
    for (auto* v : {&out.stream_in_log_sd, &out.branch_log_sd, &out.stream_out_log_sd})
      std::fill(v->begin(), v->end(), nan);
  }
  return out;
}

}  // namespace proplab
