// data: what a study trains and evaluates on. Token streams for language models (kinds uniform, markov, text,
// tokens) and teacher-labelled gaussian vectors for MLPs (kind gaussian).
//
// Invariants:
// - No cursor: a batch is a pure function of (seed, split, index, batch shape). Row b of batch `index` with B rows
//   is sample s = index * B + b of its split, and sample s depends only on (seed, split, s). So resuming needs only
//   the next batch index, any process (data-parallel rank, evaluator) can produce any batch, and batch `index` of
//   B rows equals the k micro-batches of B / k rows with indices index * k + j, j = 0..k-1, stacked.
// - All randomness is counter-based (CounterRng, core/rng.h) under stream ids "data.<purpose>" mixed with the
//   split: train and validation draw from different streams, and batches are bitwise identical whatever the
//   thread count or process.
// - Token batches are i32 CPU tensors [B, T] with T = seq_len. Each row is a window of T + 1 consecutive tokens:
//   inputs[b][t] = w[t], targets[b][t] = w[t + 1]. Every id is in [0, vocab()).
// - Vocabulary: the `vocab` argument is the model's. For uniform and markov it is the vocabulary (>= 2). For
//   files, vocab > 0 means ids must be below it (else a UserError naming the file, the id and where it is) and
//   vocab() = vocab; vocab <= 0 means "from the data": 256 for text, max id + 1 for tokens.
// - Files (text, tokens) are read whole into memory once, at construction. Split: train = the first
//   floor((1 - val_fraction) * n) tokens, validation = the rest; windows never cross that boundary, so no
//   validation window contains a training token. A missing, unreadable, empty, malformed or too-short file (fewer
//   than seq_len + 1 tokens in either split) is a UserError naming the path and the expected format.
// - Vector batches: x f32 CPU [B, input_dim] with x ~ N(0, I); y f32 [B, outputs] (regression) or i32 [B]
//   (classification). The teacher is linear, y = W x with W[o][i] ~ N(0, 1 / input_dim), the same for both splits.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "data/config.h"

namespace proplab {

enum class Split { train, validation };
const char* split_name(Split split);

// Language-model data.
class TokenDataset {
 public:
  virtual ~TokenDataset() = default;
  // Number of distinct token ids the data may use (every id < vocab()).
  virtual int vocab() const = 0;
  // Window length T (inputs and targets are [B, T]).
  virtual int seq_len() const = 0;
  // Fills inputs/targets (i32 CPU contiguous [B, seq_len], allocated by the caller) with batch `index` (>= 0) of
  // `split`; targets are inputs shifted by one token. A pure function of (seed, split, index, B).
  virtual void batch(Split split, std::int64_t index, Tensor& inputs, Tensor& targets) const = 0;
  // Exact entropy rate in nats/token when known (uniform, markov), else nullopt: the floor of the mean
  // next-token cross-entropy.
  virtual std::optional<double> entropy_rate() const { return std::nullopt; }
  // One line: kind and parameters (file path, split sizes, entropy rate when known).
  virtual std::string describe() const = 0;
};

// MLP data: gaussian inputs, targets from a fixed random linear teacher.
class VectorDataset {
 public:
  virtual ~VectorDataset() = default;
  virtual int input_dim() const = 0;
  // Regression target width, or number of classes.
  virtual int outputs() const = 0;
  virtual bool classification() const = 0;
  // Fills x (f32 CPU [B, input_dim]) and y (regression: f32 [B, outputs] = teacher(x) + N(0, noise²);
  // classification: i32 [B] = argmax(teacher(x) + N(0, noise²))) with batch `index` of `split`. Pure as above.
  virtual void batch(Split split, std::int64_t index, Tensor& x, Tensor& y) const = 0;
  // The noiseless teacher outputs f32 [B, outputs] for x f32 [B, input_dim].
  virtual Tensor teacher(const Tensor& x) const = 0;
  // Lowest achievable expected loss when known: regression 0.5 * noise² (ops::mse_loss is 0.5 * mean square),
  // classification without noise 0 (labels are a function of x); nullopt for noisy classification.
  virtual std::optional<double> loss_floor() const = 0;
  virtual std::string describe() const = 0;
};

// Builds the token data of kind uniform | markov | text | tokens. UserError on a bad config or file.
std::unique_ptr<TokenDataset> make_token_dataset(const DataConfig& config, int vocab, int seq_len, std::uint64_t seed);
// Builds the vector data of kind gaussian. UserError on a bad config.
std::unique_ptr<VectorDataset> make_vector_dataset(const DataConfig& config, int input_dim, int outputs,
                                                   bool classification, std::uint64_t seed);

// The markov kind's chain: a seeded sparse random Markov chain over [0, vocab). State i has `successors`
// distinct next states: i + 1 mod vocab, which makes the chain irreducible (so π is unique), and successors - 1
// others drawn uniformly at random (possibly i itself); their probabilities are softmax(g / temperature) with
// g ~ N(0, 1). Sequences start from π, so they are stationary and every target is one transition whether or not
// the chain is periodic. (A guaranteed self-loop would make successors = 2 a ring that mixes in ~vocab² steps.)
// A pure function of (vocab, successors, temperature, seed): the markov data uses
// MarkovChain(vocab, markov_successors, markov_temperature, seed).
class MarkovChain {
 public:
  // UserError when successors is outside [1, vocab], temperature <= 0, or the chain mixes too slowly for the
  // stationary distribution to converge (very low temperatures).
  MarkovChain(int vocab, int successors, double temperature, std::uint64_t seed);

  int vocab() const { return vocab_; }
  int successors() const { return successors_; }
  double temperature() const { return temperature_; }
  // The successors of `state` and their transition probabilities, in the same order (they sum to 1).
  std::span<const std::int32_t> next_states(int state) const;
  std::span<const double> next_probabilities(int state) const;
  // P(next = to | current = from); 0 when `to` is not a successor of `from`.
  double probability(int from, int to) const;
  // Stationary distribution π (π P = π, Σ π = 1): power iteration from uniform on the lazy chain (I + P) / 2
  // until ||π P - π||₁ < 1e-12; a chain that mixes too slowly for that (very low temperature) is solved exactly by
  // dense elimination when vocab <= 2048, else the constructor throws.
  const std::vector<double>& stationary() const { return stationary_; }
  // Σ_i π_i H(P(· | i)) in nats per token.
  double entropy_rate() const { return entropy_rate_; }
  // Inverse-CDF sampling with u in (0, 1): a state from π, and a successor of `state`.
  int sample_stationary(double u) const;
  int sample_next(int state, double u) const;

 private:
  void compute_stationary();

  int vocab_;
  int successors_;
  double temperature_;
  std::vector<std::int32_t> next_states_;      // [vocab * successors]
  std::vector<double> next_probabilities_;     // [vocab * successors]
  std::vector<double> next_cumulative_;        // [vocab * successors], running sums per state
  std::vector<double> stationary_;             // [vocab]
  std::vector<double> stationary_cumulative_;  // [vocab]
  double entropy_rate_ = 0.0;
};

}  // namespace proplab
