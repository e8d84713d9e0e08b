#include "data/dataset.h"

#include <cmath>
#include <sstream>

#include "core/error.h"
#include "data/internal.h"

namespace proplab {

const char* split_name(Split split) { return split == Split::train ? "train" : "validation"; }

namespace data_detail {

std::uint64_t split_stream(const char* purpose, Split split) {
  return stream_id(purpose, split == Split::train ? 0 : 1);
}

double unit_double(const CounterRng& rng, std::uint64_t index) {
  std::uint32_t w[4];
  rng.words(index, w);
  std::uint64_t bits = (static_cast<std::uint64_t>(w[0]) << 21) | (w[1] >> 11);  // 53 bits
  return (static_cast<double>(bits) + 0.5) * 0x1p-53;
}

std::int64_t check_token_batch(const Tensor& inputs, const Tensor& targets, int seq_len, std::int64_t index) {
  PROPLAB_CHECK(index >= 0, "batch index must be >= 0, got ", index);
  for (const Tensor* t : {&inputs, &targets}) {
    PROPLAB_CHECK(t->defined(), "token batch tensors must be allocated by the caller");
    PROPLAB_CHECK(t->dtype() == DType::i32 && t->device() == Device::cpu && t->is_contiguous(),
                  "token batch tensors must be contiguous i32 on the CPU");
    PROPLAB_CHECK(t->ndim() == 2 && t->dim(1) == seq_len, "token batch tensors must be [B, ", seq_len, "], got ",
                  shape_string(t->shape()));
  }
  PROPLAB_CHECK(inputs.shape() == targets.shape(), "inputs ", shape_string(inputs.shape()), " and targets ",
                shape_string(targets.shape()), " differ in shape");
  return inputs.dim(0);
}

namespace {

// I.i.d. uniform tokens: the entropy rate is log V.
class UniformTokens final : public TokenDataset {
 public:
  UniformTokens(int vocab, int seq_len, std::uint64_t seed) : vocab_(vocab), seq_len_(seq_len), seed_(seed) {}

  int vocab() const override { return vocab_; }
  int seq_len() const override { return seq_len_; }

  void batch(Split split, std::int64_t index, Tensor& inputs, Tensor& targets) const override {
    const std::int64_t rows = check_token_batch(inputs, targets, seq_len_, index);
    const CounterRng rng(seed_, split_stream("data.uniform", split));
    const std::int64_t window = seq_len_ + 1;
    std::int32_t* in = inputs.i32();
    std::int32_t* out = targets.i32();
#pragma omp parallel for schedule(static) if (rows * seq_len_ >= kParallelElements)
    for (std::int64_t b = 0; b < rows; ++b) {
      const std::uint64_t first = static_cast<std::uint64_t>(index * rows + b) * window;
      std::int32_t previous = static_cast<std::int32_t>(rng.below(first, vocab_));
      for (std::int64_t t = 0; t < seq_len_; ++t) {
        const std::int32_t next = static_cast<std::int32_t>(rng.below(first + t + 1, vocab_));
        in[b * seq_len_ + t] = previous;
        out[b * seq_len_ + t] = next;
        previous = next;
      }
    }
  }

  std::optional<double> entropy_rate() const override { return std::log(static_cast<double>(vocab_)); }

  std::string describe() const override {
    std::ostringstream out;
    out << "uniform: i.i.d. uniform tokens, vocab " << vocab_ << ", seq_len " << seq_len_ << ", entropy rate "
        << std::log(static_cast<double>(vocab_)) << " nats/token";
    return out.str();
  }

 private:
  int vocab_;
  int seq_len_;
  std::uint64_t seed_;
};

}  // namespace

std::unique_ptr<TokenDataset> make_uniform_tokens(int vocab, int seq_len, std::uint64_t seed) {
  return std::make_unique<UniformTokens>(vocab, seq_len, seed);
}

}  // namespace data_detail

std::unique_ptr<TokenDataset> make_token_dataset(const DataConfig& config, int vocab, int seq_len, std::uint64_t seed) {
  if (seq_len < 1) throw UserError(detail::concat("data: seq_len must be >= 1, got ", seq_len));
  const std::string& kind = config.kind;
  if (kind == "uniform" || kind == "markov") {
    if (vocab < 2)
      throw UserError(
          detail::concat("data.kind = \"", kind, "\" needs a vocabulary of at least 2 tokens, got vocab ", vocab));
    if (kind == "uniform") return data_detail::make_uniform_tokens(vocab, seq_len, seed);
    return data_detail::make_markov_tokens(config, vocab, seq_len, seed);
  }
  if (kind == "text" || kind == "tokens") return data_detail::make_file_tokens(config, vocab, seq_len, seed);
  if (kind == "gaussian")
    throw UserError(
        "data.kind = \"gaussian\" is vector data for mlp models; a transformer needs uniform, markov, text or tokens");
  throw UserError(detail::concat("data.kind = \"", kind,
                                 "\" is not a data kind; valid kinds: uniform, markov, text, tokens, gaussian"));
}

std::unique_ptr<VectorDataset> make_vector_dataset(const DataConfig& config, int input_dim, int outputs,
                                                   bool classification, std::uint64_t seed) {
  const std::string& kind = config.kind;
  if (kind == "gaussian") return data_detail::make_gaussian_vectors(config, input_dim, outputs, classification, seed);
  if (kind == "uniform" || kind == "markov" || kind == "text" || kind == "tokens")
    throw UserError(detail::concat("data.kind = \"", kind,
                                   "\" is token data for transformer models; an mlp needs data.kind = \"gaussian\""));
  throw UserError(detail::concat("data.kind = \"", kind,
                                 "\" is not a data kind; valid kinds: uniform, markov, text, tokens, gaussian"));
}

}  // namespace proplab
