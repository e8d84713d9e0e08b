// train/compression: the data-parallel gradient exchange with compressed payloads ([parallel] compress;
// docs/distributed.md, "Compressed gradient exchange").
//
// Each replica holds its share g_r of the step's gradient (the trainer scales the loss by 1/dp); the exchange
// replaces every exchanged gradient with an estimate of the sum Σ_r g_r built from compressed payloads:
// - bf16: each element rounded to bfloat16 (nearest, ties to even); the payloads are all-gathered and every
//   replica decodes and adds them in rank order, so every replica holds the same sum.
// - int8: per block of kInt8Block elements of a tensor, the scale s = max|x| / 127 and q = round(x / s) in
//   [−127, 127]; all-gathered and added in rank order as bf16.
// - topk (compress_ratio ρ): with error feedback, x = g + e; the k = max(1, ⌈ρ·n⌉) entries of largest |x| per
//   tensor (ties: the lower index) are sent as (index, value) and e ← x minus what was sent; all-gathered and
//   added in rank order.
// - powersgd (compress_rank r; Vogels et al. 2019, with error feedback): a tensor of two or more dimensions is a
//   matrix [shape[0], numel / shape[0]]; x = g + e, P = Σ_r x_r·Q (all-reduced), P̂ = P with orthonormal columns
//   (Gram–Schmidt), Q ← Σ_r x_rᵀ·P̂ (all-reduced; the next step starts from it), the sum is P̂·Qᵀ and
//   e ← x − P̂·(x_rᵀ·P̂)ᵀ, this replica's own part's residual. One-dimensional tensors are summed uncompressed in
//   the first all-reduce.
// With error feedback, Σ over steps of the exchanged sums plus Σ_r e_r equals Σ over steps of Σ_r g_r (up to
// float rounding): nothing a replica computed is dropped, only delayed.
//
// Deterministic: the same inputs give bitwise the same sums on every replica and in every run of the layout.
// CUDA ranks stage the exchanged gradients through host memory: the same codecs on the same values, so a CUDA rank's
// exchange sums what a CPU rank's would for the same gradients.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "dist/communicator.h"
#include "nn/parameter.h"
#include "train/config.h"

namespace proplab {

enum class Compression { none, bf16, int8, topk, powersgd };
// From [parallel] compress; UserError naming the key for an unknown scheme.
Compression compression_of(const ParallelConfig& config);
const char* compression_name(Compression scheme);

constexpr std::int64_t kInt8Block = 1024;  // elements per int8 scale

// From [parallel] pp_compress: how activations and their gradients cross a pipeline boundary ("none", "bf16",
// "int8"); UserError naming the key otherwise.
Compression boundary_compression_of(const ParallelConfig& config);

// The bf16 and int8 payloads (of the gradient exchange and of pipeline boundaries): 32-bit words for n elements
// (bf16 ⌈n/2⌉: two per word, the first in the low half; int8 ⌈n/kInt8Block⌉ scales as float bits, then ⌈n/4⌉ words
// of four int8 each), the encoding, and the decoding (which overwrites `out`).
std::int64_t payload_words(Compression scheme, std::int64_t n);
void encode_payload(Compression scheme, const float* x, std::int64_t n, std::uint32_t* words);
void decode_payload(Compression scheme, const std::uint32_t* words, std::int64_t n, float* out);

// Bytes one replica hands to collectives per exchange for a tensor of this shape (docs/distributed.md):
// bf16 4·⌈n/2⌉; int8 4·⌈n/kInt8Block⌉ + 4·⌈n/4⌉; topk 8·k; powersgd 4·r·(rows + cols) for a matrix, 4·n for a
// vector; none 4·n.
std::int64_t compressed_bytes(const ParallelConfig& config, const Shape& shape);

class GradientCompressor;

// Checkpoints: the state (GradientCompressor::state()) of every rank of `world` as tensors
// "compression/state/<world rank>" [n_r] on world rank 0 (empty elsewhere). Collective over `world`; every rank
// passes its compressor (all or none of them have one).
std::map<std::string, Tensor> gather_compression_state(dist::Communicator& world, const GradientCompressor* compressor);

class GradientCompressor {
 public:
  // `exchanged`: per parameter in store order (empty: all). UserError naming the keys for a combination that does
  // not exist: powersgd's rank above a matrix's smaller side, a ratio outside (0, 1].
  GradientCompressor(const ParallelConfig& config, dist::Communicator& group, ParameterStore& params,
                     std::vector<bool> exchanged, std::uint64_t seed);

  Compression scheme() const { return scheme_; }
  bool error_feedback() const { return scheme_ == Compression::topk || scheme_ == Compression::powersgd; }
  // Collective. Each exchanged gradient holds this replica's share on entry and the exchanged sum on return.
  // `measure`: also keeps what measure() reports (a pass over the gradients).
  void exchange(bool measure);
  // Collective, after an exchange(true): per parameter (store order; 0 for those not exchanged) and then over all
  // of them, the relative compression error sqrt(Σ_r ‖x_r − c_r‖² / Σ_r ‖x_r‖²) of what the replicas compressed
  // (x_r; with error feedback g_r + e_r) against what each one's payload stands for (c_r), and the residual norm
  // sqrt(Σ_r ‖e_r‖²) left after it (0 without error feedback).
  void measure(std::vector<double>& error, std::vector<double>& residual);
  // This replica's error-feedback residual of parameter i (empty without error feedback).
  const std::vector<float>& residual(std::size_t i) const { return residual_[i]; }
  // What carries over from step to step, as one flat vector for checkpoints: every exchanged parameter's residual,
  // then PowerSGD's Q of every matrix, in store order (empty for bf16 and int8). set_state takes back what state()
  // gave on this rank under the same layout and scheme.
  std::vector<float> state() const;
  void set_state(const std::vector<float>& state);

 private:
  void exchange_gathered(bool measure);  // bf16, int8, topk
  void exchange_powersgd(bool measure);
  // Encodes x (n elements) into `words`; `decoded` (unless null) gets what the payload stands for.
  void encode(const float* x, std::int64_t n, std::uint32_t* words, std::vector<float>* decoded) const;
  // Adds what a payload of n elements stands for to `sum`.
  void add_decoded(const std::uint32_t* words, std::int64_t n, float* sum) const;
  std::int64_t words_of(std::size_t i) const;  // payload words of parameter i
  // Parameter i's gradient where the exchange reads and writes it: the gradient itself, or its host copy on a GPU.
  Tensor& gradient(std::size_t i);

  Compression scheme_;
  ParallelConfig config_;
  dist::Communicator& group_;
  ParameterStore& params_;
  std::vector<bool> exchanged_;
  std::vector<std::vector<float>> residual_;               // error feedback, per parameter
  std::vector<std::vector<float>> q_;                      // powersgd: Q per matrix [cols, r], empty for vectors
  std::vector<double> input_sq_, error_sq_, residual_sq_;  // of the last measured exchange, this replica's
  std::vector<Tensor> host_;                               // CUDA ranks: host copies of the exchanged gradients
};

}  // namespace proplab
