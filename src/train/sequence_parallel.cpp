#include "train/sequence_parallel.h"

#include <algorithm>

#include "core/error.h"
#include "models/sequence_parallel.h"
#include "train/tensor_parallel.h"

namespace proplab {

SequenceParallelSink::SequenceParallelSink(ProbeSink& recorder, dist::Communicator& ring)
    : recorder_(recorder), ring_(ring) {}

const Tensor& SequenceParallelSink::whole(const Tensor& piece, std::int64_t sequences) {
  PROPLAB_CHECK(piece.is_contiguous() && piece.dtype() == DType::f32,
                "a sequence-parallel probe tensor must be contiguous f32");
  // (a GPU's piece is gathered on the host: recorded steps only)
  if (piece.device() != Device::cpu) staged_ = piece.to(Device::cpu);
  const Tensor& x = piece.device() == Device::cpu ? piece : staged_;
  const std::int64_t ranks = ring_.size(), features = x.dim(-1), rows = x.numel() / features;
  PROPLAB_CHECK(sequences > 0 && rows % sequences == 0, "a probe tensor of ", rows, " rows for ", sequences,
                " sequences");
  if (gathered_.numel() != ranks * rows * features) gathered_ = Tensor::empty({ranks * rows * features});
  ring_.all_gather(x.f32(), gathered_.f32(), x.numel());
  if (ring_.rank() != 0) return piece;
  // Block k of the gather is rank k's [B, Tl, F]: its chunks go to their places in every sequence (sequence_split).
  const std::int64_t local = rows / sequences, tokens = local * ranks;
  whole_ = Tensor::empty({ranks * rows, features});
  const float* in = gathered_.f32();
  float* out = whole_.f32();
  for (std::int64_t k = 0; k < ranks; ++k) {
    const SequenceSplit split = sequence_split(tokens, static_cast<int>(k), static_cast<int>(ranks));
    const std::int64_t piece = split.chunk * features;
#pragma omp parallel for schedule(static) if (rows * features > (1 << 16))
    for (std::int64_t b = 0; b < sequences; ++b)
      for (std::size_t j = 0; j < split.chunks.size(); ++j) {
        const float* from = in + ((k * sequences + b) * local + static_cast<std::int64_t>(j) * split.chunk) * features;
        std::copy(from, from + piece, out + (b * tokens + split.chunks[j] * split.chunk) * features);
      }
  }
  return whole_;
}

void SequenceParallelSink::forward(int probe, const Tensor& x, std::int64_t sequences) {
  const Tensor& t = whole(x, sequences);
  if (ring_.rank() == 0) recorder_.forward(probe, t, sequences);
}

void SequenceParallelSink::backward(int probe, const Tensor& d_x, std::int64_t sequences) {
  const Tensor& t = whole(d_x, sequences);
  if (ring_.rank() == 0) recorder_.backward(probe, t, sequences);
}

void SequenceParallelSink::attention_logits(int probe, const probe::LogitSums& sums, const Tensor& qkv, int heads,
                                            float logit_scale) {
  const probe::LogitSums total = sum_logit_sums(ring_, sums);
  if (ring_.rank() == 0) recorder_.attention_logits(probe, total, qkv, heads, logit_scale);
}

Batch sequence_piece(const Batch& batch, int rank, int ranks) {
  auto piece = [&](const Tensor& tokens) {
    PROPLAB_CHECK(tokens.ndim() == 2 && tokens.dtype() == DType::i32 && tokens.device() == Device::cpu &&
                      tokens.is_contiguous() && tokens.dim(1) % ranks == 0,
                  "sequence_piece: tokens must be contiguous i32 [B, T] on the host with T divisible by ", ranks,
                  ", got ", shape_string(tokens.shape()));
    const std::int64_t rows = tokens.dim(0), length = tokens.dim(1) / ranks;
    const SequenceSplit split = sequence_split(tokens.dim(1), rank, ranks);
    Tensor out = Tensor::empty({rows, length}, DType::i32);
    for (std::int64_t b = 0; b < rows; ++b)
      for (std::size_t j = 0; j < split.chunks.size(); ++j) {
        const std::int32_t* from = tokens.i32() + b * tokens.dim(1) + split.chunks[j] * split.chunk;
        std::copy(from, from + split.chunk, out.i32() + b * length + static_cast<std::int64_t>(j) * split.chunk);
      }
    return out;
  };
  return Batch{piece(batch.inputs), piece(batch.targets)};
}

}  // namespace proplab
