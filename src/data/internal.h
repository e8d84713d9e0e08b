// data/internal: pieces shared by the data module's source files (not part of its interface).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/rng.h"
#include "core/tensor.h"
#include "data/dataset.h"

namespace proplab::data_detail {

// Batches smaller than this many elements are generated on one thread: a parallel region costs more than it saves.
constexpr std::int64_t kParallelElements = 1 << 16;

// The CounterRng stream for one purpose ("data.windows", "data.markov.sample", ...) and split.
std::uint64_t split_stream(const char* purpose, Split split);

// A uniform double in (0, 1) with 53 random bits from counter `index`.
double unit_double(const CounterRng& rng, std::uint64_t index);

// Checks the caller's token batch tensors (i32, CPU, contiguous, equal shapes [B, seq_len]) and the index;
// returns B. A mismatch is a caller bug (InternalError).
std::int64_t check_token_batch(const Tensor& inputs, const Tensor& targets, int seq_len, std::int64_t index);

std::unique_ptr<TokenDataset> make_uniform_tokens(int vocab, int seq_len, std::uint64_t seed);
std::unique_ptr<TokenDataset> make_markov_tokens(const DataConfig& config, int vocab, int seq_len, std::uint64_t seed);
// kind is "text" or "tokens".
std::unique_ptr<TokenDataset> make_file_tokens(const DataConfig& config, int vocab, int seq_len, std::uint64_t seed);
std::unique_ptr<VectorDataset> make_gaussian_vectors(const DataConfig& config, int input_dim, int outputs,
                                                     bool classification, std::uint64_t seed);

}  // namespace proplab::data_detail
