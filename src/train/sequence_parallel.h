// train/sequence_parallel: what the training loop does differently when every sequence is split over a
// sequence-parallel ring (models/sequence_parallel.h, docs/distributed.md "Sequence parallelism"), so that the run
// file matches a single-process run.
//
// - Data: ring rank r of sp takes its tokens of every row its replica takes (inputs and targets): the chunks
//   sequence_split names (r and 2·sp − 1 − r of T/(2·sp) tokens when 2·sp divides T, else chunk r of T/sp).
// - Loss and gradients: each rank's loss is the mean over its tokens and its gradients are scaled by 1/sp more
//   (the trainer's grad_scale), so every rank's gradient is a part of the global one: the gradient exchange runs over
//   the dp·sp ranks of the replicas and their rings together (dist::ProcessGroups::gradient), as data parallelism
//   over dp·sp ranks would, buckets overlapped with backward, and the loss is their mean.
// - Probes: every probed tensor is per token, so the ring's pieces of it are all-gathered on recorded steps into
//   the single-process [B·T, F] layout (sequence b's tokens in order) and recorded whole by ring rank 0: the
//   per-sequence sums behind corr span the ring exactly as in one process. The attention logits arrive as power sums
//   over this rank's queries: summed (max for max_abs) over the ring.
#pragma once

#include "dist/communicator.h"
#include "models/model.h"
#include "probe/probe.h"

namespace proplab {

// A ProbeSink in front of the recorder (or of a TensorParallelSink's recorder) on every rank of a ring. Every rank
// of the ring calls it for the same probes in the same order (the model does).
class SequenceParallelSink final : public ProbeSink {
 public:
  SequenceParallelSink(ProbeSink& recorder, dist::Communicator& ring);

  void forward(int probe, const Tensor& x, std::int64_t sequences) override;
  void backward(int probe, const Tensor& d_x, std::int64_t sequences) override;
  void attention_logits(int probe, const probe::LogitSums& sums, const Tensor& qkv, int heads,
                        float logit_scale) override;

 private:
  // The whole sequences' [B·T, F] tensor on ring rank 0 (gathered from every rank's [B·T/sp, F], on the host);
  // `piece` elsewhere.
  const Tensor& whole(const Tensor& piece, std::int64_t sequences);

  ProbeSink& recorder_;
  dist::Communicator& ring_;
  Tensor staged_, gathered_, whole_;
};

// This rank's tokens (sequence_split's chunks, in order) of every row of a language-model batch (inputs and targets
// i32 [B, T]), copied (contiguous, on the host).
Batch sequence_piece(const Batch& batch, int rank, int ranks);

}  // namespace proplab
