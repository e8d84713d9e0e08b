// Markov data: the chain's structure, its stationary distribution and entropy rate against independent
// computations, and the sampled sequences against the chain.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <set>

#include "core/error.h"
#include "data/dataset.h"
#include "data_test_util.h"

namespace proplab {
namespace {

using testing::token_batch;

std::vector<double> dense_transitions(const MarkovChain& chain) {
  const int v = chain.vocab();
  std::vector<double> p(static_cast<std::size_t>(v) * v, 0.0);
  for (int i = 0; i < v; ++i)
    for (int j = 0; j < v; ++j) p[i * v + j] = chain.probability(i, j);
  return p;
}

// π from (I - P)ᵀ π = 0 with the last equation replaced by Σ π = 1, by Gaussian elimination with partial pivoting.
std::vector<double> solve_stationary(const std::vector<double>& p, int v) {
  std::vector<double> a(static_cast<std::size_t>(v) * v);
  std::vector<double> b(v, 0.0);
  for (int i = 0; i < v; ++i)
    for (int j = 0; j < v; ++j) a[i * v + j] = (i == j ? 1.0 : 0.0) - p[j * v + i];
  for (int j = 0; j < v; ++j) a[(v - 1) * v + j] = 1.0;
  b[v - 1] = 1.0;
  for (int col = 0; col < v; ++col) {
    int pivot = col;
    for (int r = col + 1; r < v; ++r)
      if (std::fabs(a[r * v + col]) > std::fabs(a[pivot * v + col])) pivot = r;
    for (int j = 0; j < v; ++j) std::swap(a[col * v + j], a[pivot * v + j]);
    std::swap(b[col], b[pivot]);
    for (int r = col + 1; r < v; ++r) {
      const double f = a[r * v + col] / a[col * v + col];
      for (int j = col; j < v; ++j) a[r * v + j] -= f * a[col * v + j];
      b[r] -= f * b[col];
    }
  }
  std::vector<double> x(v);
  for (int r = v - 1; r >= 0; --r) {
    double s = b[r];
    for (int j = r + 1; j < v; ++j) s -= a[r * v + j] * x[j];
    x[r] = s / a[r * v + r];
  }
  return x;
}

double stationary_residual(const MarkovChain& chain) {
  const auto& pi = chain.stationary();
  std::vector<double> next(pi.size(), 0.0);
  for (int i = 0; i < chain.vocab(); ++i) {
    auto states = chain.next_states(i);
    auto probs = chain.next_probabilities(i);
    for (std::size_t j = 0; j < states.size(); ++j) next[states[j]] += pi[i] * probs[j];
  }
  double residual = 0.0;
  for (std::size_t i = 0; i < pi.size(); ++i) residual += std::fabs(next[i] - pi[i]);
  return residual;
}

TEST(MarkovChain, StructureIsSparseIrreducibleAndSeeded) {
  const MarkovChain chain(50, 4, 1.0, 7);
  for (int i = 0; i < chain.vocab(); ++i) {
    auto states = chain.next_states(i);
    auto probs = chain.next_probabilities(i);
    ASSERT_EQ(states.size(), 4u);
    std::set<int> distinct(states.begin(), states.end());
    EXPECT_EQ(distinct.size(), 4u) << "state " << i;
    EXPECT_TRUE(distinct.count((i + 1) % 50)) << "state " << i << " lacks the i + 1 successor";
    double total = 0.0;
    for (double p : probs) {
      EXPECT_GT(p, 0.0);
      total += p;
    }
    EXPECT_NEAR(total, 1.0, 1e-12);
  }
  const MarkovChain same(50, 4, 1.0, 7);
  const MarkovChain other(50, 4, 1.0, 8);
  bool any_difference = false;
  for (int i = 0; i < 50; ++i) {
    for (int j = 0; j < 50; ++j) {
      EXPECT_EQ(chain.probability(i, j), same.probability(i, j));
      any_difference |= chain.probability(i, j) != other.probability(i, j);
    }
  }
  EXPECT_TRUE(any_difference) << "a different seed should give a different chain";
  // Lower temperature concentrates the transitions: lower entropy rate.
  EXPECT_LT(MarkovChain(50, 4, 0.3, 7).entropy_rate(), chain.entropy_rate());
}

TEST(MarkovChain, StationaryMatchesADirectSolve) {
  for (auto [vocab, successors, seed] : {std::tuple{5, 3, 1ull}, std::tuple{12, 4, 2ull}, std::tuple{40, 2, 3ull}}) {
    const MarkovChain chain(vocab, successors, 1.0, seed);
    const auto exact = solve_stationary(dense_transitions(chain), vocab);
    for (int i = 0; i < vocab; ++i) EXPECT_NEAR(chain.stationary()[i], exact[i], 1e-10) << "vocab " << vocab;
    EXPECT_LT(stationary_residual(chain), 1e-11);
  }
}

TEST(MarkovChain, SlowlyMixingChainStillGetsItsStationaryDistribution) {
  // At temperature 0.1 a few transitions dominate and the chain is nearly deterministic: power iteration does not
  // converge in its budget, and the exact dense solve takes over.
  const MarkovChain chain(256, 4, 0.1, 1234);
  double total = 0.0;
  for (double p : chain.stationary()) {
    EXPECT_GE(p, 0.0);
    total += p;
  }
  EXPECT_NEAR(total, 1.0, 1e-12);
  EXPECT_LT(stationary_residual(chain), 1e-12);
}

TEST(MarkovChain, EntropyRateMatchesBruteForceBlockEntropies) {
  // For a stationary Markov chain H(X_1..X_n) - H(X_1..X_{n-1}) = H(X_n | X_{n-1}) is the entropy rate; compute
  // the block entropies by enumerating every sequence.
  const MarkovChain chain(4, 3, 0.7, 11);
  const int v = chain.vocab();
  const auto p = dense_transitions(chain);
  const auto pi = solve_stationary(p, v);
  auto block_entropy = [&](int length) {
    double entropy = 0.0;
    std::function<void(int, int, double)> walk = [&](int depth, int last, double probability) {
      if (probability == 0.0) return;
      if (depth == length) {
        entropy -= probability * std::log(probability);
        return;
      }
      for (int s = 0; s < v; ++s) walk(depth + 1, s, depth == 0 ? pi[s] : probability * p[last * v + s]);
    };
    walk(0, 0, 1.0);
    return entropy;
  };
  const double brute_force = block_entropy(7) - block_entropy(6);
  EXPECT_NEAR(chain.entropy_rate(), brute_force, 1e-10);
  EXPECT_GT(chain.entropy_rate(), 0.1);
  EXPECT_LT(chain.entropy_rate(), std::log(3.0));
}

TEST(MarkovChain, SingleSuccessorIsADeterministicCycle) {
  const MarkovChain chain(6, 1, 1.0, 3);
  EXPECT_EQ(chain.entropy_rate(), 0.0);
  for (double p : chain.stationary()) EXPECT_NEAR(p, 1.0 / 6.0, 1e-15);
  DataConfig config;
  config.kind = "markov";
  config.markov_successors = 1;
  auto data = make_token_dataset(config, 6, 10, 3);
  auto batch = token_batch(*data, Split::train, 0, 4);
  for (std::int64_t i = 0; i < batch.inputs.numel(); ++i)
    EXPECT_EQ(batch.targets.i32()[i], (batch.inputs.i32()[i] + 1) % 6);
}

TEST(MarkovChain, BadParametersAreUserErrors) {
  EXPECT_THROW(MarkovChain(10, 0, 1.0, 1), UserError);
  EXPECT_THROW(MarkovChain(10, 11, 1.0, 1), UserError);
  EXPECT_THROW(MarkovChain(10, 3, 0.0, 1), UserError);
  EXPECT_THROW(MarkovChain(10, 3, -1.0, 1), UserError);
  EXPECT_THROW(MarkovChain(10, 3, 1e-4, 1), UserError);  // transition probabilities underflow
  DataConfig config;
  config.kind = "markov";
  EXPECT_THROW(make_token_dataset(config, 1, 8, 1), UserError);
  config.markov_successors = 300;
  try {
    make_token_dataset(config, 256, 8, 1);
    FAIL() << "300 successors over 256 states should be rejected";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("markov_successors"), std::string::npos) << e.what();
  }
}

TEST(MarkovData, SamplesFollowTheChain) {
  DataConfig config;
  config.kind = "markov";
  config.markov_successors = 4;
  config.markov_temperature = 1.0;
  const int vocab = 64;
  const std::uint64_t seed = 99;
  auto data = make_token_dataset(config, vocab, 64, seed);
  const MarkovChain chain(vocab, 4, 1.0, seed);
  ASSERT_TRUE(data->entropy_rate().has_value());
  EXPECT_EQ(*data->entropy_rate(), chain.entropy_rate());
  EXPECT_EQ(data->vocab(), vocab);

  double nll = 0.0;
  std::int64_t count = 0;
  std::vector<double> frequency(vocab, 0.0);
  for (std::int64_t index = 0; index < 100; ++index) {
    auto batch = token_batch(*data, Split::train, index, 32);
    for (std::int64_t i = 0; i < batch.inputs.numel(); ++i) {
      const double p = chain.probability(batch.inputs.i32()[i], batch.targets.i32()[i]);
      ASSERT_GT(p, 0.0) << "transition " << batch.inputs.i32()[i] << " -> " << batch.targets.i32()[i]
                        << " is not in the chain";
      nll -= std::log(p);
      frequency[batch.inputs.i32()[i]] += 1.0;
      ++count;
    }
  }
  nll /= static_cast<double>(count);
  EXPECT_NEAR(nll, chain.entropy_rate(), 0.02 * chain.entropy_rate());
  // Sequences start stationary, so every position (hence the token histogram) follows π.
  double total_variation = 0.0;
  for (int s = 0; s < vocab; ++s) total_variation += 0.5 * std::fabs(frequency[s] / count - chain.stationary()[s]);
  EXPECT_LT(total_variation, 0.03);
  EXPECT_NE(data->describe().find("markov"), std::string::npos);
}

TEST(UniformData, EntropyIsLogVocabAndTokensAreUniform) {
  DataConfig config;
  config.kind = "uniform";
  auto data = make_token_dataset(config, 10, 32, 5);
  ASSERT_TRUE(data->entropy_rate().has_value());
  EXPECT_DOUBLE_EQ(*data->entropy_rate(), std::log(10.0));
  std::vector<double> frequency(10, 0.0);
  double count = 0;
  for (std::int64_t index = 0; index < 20; ++index) {
    auto batch = token_batch(*data, Split::validation, index, 16);
    for (std::int32_t id : batch.input_ids()) {
      frequency[id] += 1;
      ++count;
    }
  }
  for (double f : frequency) EXPECT_NEAR(f / count, 0.1, 0.01);
}

}  // namespace
}  // namespace proplab
