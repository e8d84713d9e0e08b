#include <algorithm>
#include <cmath>
#include <sstream>

#include "core/error.h"
#include "data/dataset.h"
#include "data/internal.h"

namespace proplab {

namespace {
constexpr double kStationaryTolerance = 1e-12;  // on ||π P - π||₁
// Largest vocab for the dense exact fallback (GTH, ~vocab³/3 multiply-adds, vocab² doubles).
constexpr int kDenseStationaryMaxVocab = 2048;
// Power-iteration budget in transition visits (iterations * vocab * successors), about 0.2 s with the dense
// fallback behind it and 2 s without.
constexpr double kStationaryWorkWithFallback = 2e8;
constexpr double kStationaryWork = 2e9;

// Stationary distribution of the dense row-stochastic matrix p [n * n] (overwritten) by Grassmann-Taksar-Heyman
// state reduction: exact elimination without subtractions, so accurate however slowly the chain mixes.
std::vector<double> gth_stationary(std::vector<double>& p, std::size_t n) {
  for (std::size_t k = n - 1; k >= 1; --k) {
    const double* row_k = &p[k * n];
    double out_mass = 0.0;  // mass leaving state k for states below it; > 0 in an irreducible chain
    for (std::size_t j = 0; j < k; ++j) out_mass += row_k[j];
    PROPLAB_CHECK(out_mass > 0.0, "markov chain is reducible: state ", k, " cannot reach lower states");
    for (std::size_t i = 0; i < k; ++i) {
      double* row_i = &p[i * n];
      if (row_i[k] == 0.0) continue;
      const double through_k = row_i[k] / out_mass;
      row_i[k] = through_k;
      for (std::size_t j = 0; j < k; ++j) row_i[j] += through_k * row_k[j];
    }
  }
  std::vector<double> pi(n, 0.0);
  pi[0] = 1.0;
  for (std::size_t j = 1; j < n; ++j)
    for (std::size_t i = 0; i < j; ++i) pi[j] += pi[i] * p[i * n + j];
  double total = 0.0;
  for (double x : pi) total += x;
  for (double& x : pi) x /= total;
  return pi;
}
}  // namespace

MarkovChain::MarkovChain(int vocab, int successors, double temperature, std::uint64_t seed)
    : vocab_(vocab), successors_(successors), temperature_(temperature) {
  if (vocab < 2) throw UserError(detail::concat("markov data needs a vocabulary of at least 2 tokens, got ", vocab));
  if (successors < 1 || successors > vocab)
    throw UserError(detail::concat("data.markov_successors = ", successors, " must be in [1, vocab = ", vocab, "]"));
  if (!(temperature > 0.0) || !std::isfinite(temperature))
    throw UserError(detail::concat("data.markov_temperature = ", temperature, " must be a positive number"));

  const std::size_t k = static_cast<std::size_t>(successors);
  next_states_.resize(static_cast<std::size_t>(vocab) * k);
  next_probabilities_.resize(next_states_.size());
  next_cumulative_.resize(next_states_.size());

  // mark[s] == state while s is already a successor of `state`: O(1) duplicate checks.
  std::vector<std::int32_t> mark(static_cast<std::size_t>(vocab), -1);
  std::vector<std::int32_t> candidates;
  const CounterRng weight_rng(seed, stream_id("data.markov.weights"));
  std::vector<double> logits(k);
  for (std::int32_t state = 0; state < vocab; ++state) {
    std::int32_t* next = &next_states_[state * k];
    std::size_t count = 0;
    auto add = [&](std::int32_t s) {
      next[count++] = s;
      mark[s] = state;
    };
    add((state + 1) % vocab);
    const std::size_t random_count = k - count;
    if (random_count > 0) {
      const CounterRng pick_rng(seed, stream_id("data.markov.successors", static_cast<std::uint64_t>(state)));
      if (2 * k <= static_cast<std::size_t>(vocab)) {
        // Sparse: rejection sampling needs few draws when at most half the states are taken.
        for (std::uint64_t draw = 0; count < k; ++draw) {
          const auto s = static_cast<std::int32_t>(pick_rng.below(draw, static_cast<std::uint64_t>(vocab)));
          if (mark[s] != state) add(s);
        }
      } else {
        // Dense: a partial Fisher-Yates shuffle of the states not yet taken.
        candidates.clear();
        for (std::int32_t s = 0; s < vocab; ++s)
          if (mark[s] != state) candidates.push_back(s);
        for (std::size_t j = 0; j < random_count; ++j) {
          const std::size_t r = j + pick_rng.below(j, candidates.size() - j);
          std::swap(candidates[j], candidates[r]);
          add(candidates[j]);
        }
      }
    }
    PROPLAB_CHECK(count == k, "state ", state, " got ", count, " successors instead of ", k);

    double top = -INFINITY;
    for (std::size_t j = 0; j < k; ++j) {
      logits[j] = static_cast<double>(weight_rng.normal(state * k + j)) / temperature;
      top = std::max(top, logits[j]);
    }
    double total = 0.0;
    for (std::size_t j = 0; j < k; ++j) {
      logits[j] = std::exp(logits[j] - top);
      total += logits[j];
    }
    double running = 0.0;
    for (std::size_t j = 0; j < k; ++j) {
      const double p = logits[j] / total;
      if (p == 0.0)
        throw UserError(
            detail::concat("data.markov_temperature = ", temperature,
                           " is too low: transition probabilities underflow to 0 and the chain falls apart; "
                           "use a temperature of about 0.1 or more"));
      next_probabilities_[state * k + j] = p;
      running += p;
      next_cumulative_[state * k + j] = running;
    }
    next_cumulative_[state * k + k - 1] = 1.0;
  }
  compute_stationary();

  entropy_rate_ = 0.0;
  for (std::int32_t state = 0; state < vocab; ++state) {
    double entropy = 0.0;
    for (double p : next_probabilities(state)) entropy -= p * std::log(p);
    entropy_rate_ += stationary_[state] * entropy;
  }
}

void MarkovChain::compute_stationary() {
  const std::size_t v = static_cast<std::size_t>(vocab_);
  const std::size_t k = static_cast<std::size_t>(successors_);
  // Power iteration on the lazy chain (I + P) / 2: same stationary distribution, but no eigenvalue on (or near)
  // the unit circle other than 1, so it converges even when the chain is periodic or nearly deterministic.
  std::vector<double> pi(v, 1.0 / static_cast<double>(v));
  std::vector<double> next(v);
  const double work = vocab_ <= kDenseStationaryMaxVocab ? kStationaryWorkWithFallback : kStationaryWork;
  const auto max_iterations = static_cast<std::int64_t>(work / static_cast<double>(v * k)) + 1000;
  double residual = INFINITY;  // ||pi P - pi||_1 of the current pi
  std::int64_t iteration = 0;
  for (; iteration < max_iterations; ++iteration) {
    std::fill(next.begin(), next.end(), 0.0);
    for (std::size_t i = 0; i < v; ++i) {
      const double mass = pi[i];
      for (std::size_t j = 0; j < k; ++j) next[next_states_[i * k + j]] += mass * next_probabilities_[i * k + j];
    }
    residual = 0.0;
    double total = 0.0;
    for (std::size_t i = 0; i < v; ++i) {
      residual += std::fabs(next[i] - pi[i]);
      next[i] = 0.5 * (pi[i] + next[i]);
      total += next[i];
    }
    if (residual < kStationaryTolerance) break;
    for (std::size_t i = 0; i < v; ++i) pi[i] = next[i] / total;
  }
  if (!(residual < kStationaryTolerance)) {
    if (vocab_ > kDenseStationaryMaxVocab)
      throw UserError(detail::concat(
          "markov data (vocab ", vocab_, ", data.markov_successors = ", successors_,
          ", data.markov_temperature = ", temperature_,
          "): the chain mixes too slowly for its stationary distribution to converge (||pi P - pi||_1 = ", residual,
          " after ", iteration, " power iterations) and the vocab is above ", kDenseStationaryMaxVocab,
          " for the exact dense solve; raise markov_temperature or markov_successors"));
    std::vector<double> dense(v * v, 0.0);
    for (std::size_t i = 0; i < v; ++i)
      for (std::size_t j = 0; j < k; ++j) dense[i * v + next_states_[i * k + j]] += next_probabilities_[i * k + j];
    pi = gth_stationary(dense, v);
  }
  stationary_ = std::move(pi);
  stationary_cumulative_.resize(v);
  double running = 0.0;
  for (std::size_t i = 0; i < v; ++i) {
    running += stationary_[i];
    stationary_cumulative_[i] = running;
  }
  stationary_cumulative_[v - 1] = 1.0;
}

std::span<const std::int32_t> MarkovChain::next_states(int state) const {
  PROPLAB_CHECK(state >= 0 && state < vocab_, "markov state ", state, " outside [0, ", vocab_, ")");
  return {next_states_.data() + static_cast<std::size_t>(state) * successors_, static_cast<std::size_t>(successors_)};
}

std::span<const double> MarkovChain::next_probabilities(int state) const {
  PROPLAB_CHECK(state >= 0 && state < vocab_, "markov state ", state, " outside [0, ", vocab_, ")");
  return {next_probabilities_.data() + static_cast<std::size_t>(state) * successors_,
          static_cast<std::size_t>(successors_)};
}

double MarkovChain::probability(int from, int to) const {
  auto states = next_states(from);
  for (std::size_t j = 0; j < states.size(); ++j)
    if (states[j] == to) return next_probabilities(from)[j];
  return 0.0;
}

int MarkovChain::sample_stationary(double u) const {
  auto it = std::upper_bound(stationary_cumulative_.begin(), stationary_cumulative_.end(), u);
  return static_cast<int>(std::min<std::ptrdiff_t>(it - stationary_cumulative_.begin(), vocab_ - 1));
}

int MarkovChain::sample_next(int state, double u) const {
  const std::size_t base = static_cast<std::size_t>(state) * successors_;
  for (int j = 0; j < successors_ - 1; ++j)
    if (u < next_cumulative_[base + j]) return next_states_[base + j];
  return next_states_[base + successors_ - 1];
}

namespace data_detail {
namespace {

// Sequences of the chain, each started from its stationary distribution (so every position has marginal π and
// every target is one transition: the loss floor is exactly the entropy rate).
class MarkovTokens final : public TokenDataset {
 public:
  MarkovTokens(MarkovChain chain, int seq_len, std::uint64_t seed)
      : chain_(std::move(chain)), seq_len_(seq_len), seed_(seed) {}

  int vocab() const override { return chain_.vocab(); }
  int seq_len() const override { return seq_len_; }

  void batch(Split split, std::int64_t index, Tensor& inputs, Tensor& targets) const override {
    const std::int64_t rows = check_token_batch(inputs, targets, seq_len_, index);
    const CounterRng rng(seed_, split_stream("data.markov.sample", split));
    const std::int64_t window = seq_len_ + 1;
    std::int32_t* in = inputs.i32();
    std::int32_t* out = targets.i32();
#pragma omp parallel for schedule(static) if (rows * seq_len_ >= kParallelElements)
    for (std::int64_t b = 0; b < rows; ++b) {
      const std::uint64_t first = static_cast<std::uint64_t>(index * rows + b) * window;
      int state = chain_.sample_stationary(unit_double(rng, first));
      for (std::int64_t t = 0; t < seq_len_; ++t) {
        const int next = chain_.sample_next(state, unit_double(rng, first + t + 1));
        in[b * seq_len_ + t] = state;
        out[b * seq_len_ + t] = next;
        state = next;
      }
    }
  }

  std::optional<double> entropy_rate() const override { return chain_.entropy_rate(); }

  std::string describe() const override {
    std::ostringstream out;
    out << "markov: vocab " << chain_.vocab() << ", " << chain_.successors() << " successors/state, temperature "
        << chain_.temperature() << ", seq_len " << seq_len_ << ", entropy rate " << chain_.entropy_rate()
        << " nats/token (uniform: " << std::log(static_cast<double>(chain_.vocab())) << ")";
    return out.str();
  }

 private:
  MarkovChain chain_;
  int seq_len_;
  std::uint64_t seed_;
};

}  // namespace

std::unique_ptr<TokenDataset> make_markov_tokens(const DataConfig& config, int vocab, int seq_len, std::uint64_t seed) {
  return std::make_unique<MarkovTokens>(MarkovChain(vocab, config.markov_successors, config.markov_temperature, seed),
                                        seq_len, seed);
}

}  // namespace data_detail
}  // namespace proplab
