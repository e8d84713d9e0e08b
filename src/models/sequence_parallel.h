// models/sequence_parallel: causal multi-head self-attention over sequences split across the ranks of a sequence-
// parallel group, by ring attention (docs/distributed.md, "Sequence parallelism").
//
// Rank r of the ring (sp ranks) holds Tl = T/sp tokens of every sequence, as sequence_split says (two chunks, zigzag,
// when 2·sp divides T): its qkv is [B, Tl, 3D], packed as ops::attention_forward's. Its queries attend to every key at
// or before them in the whole sequence:
// - forward: each rank's key/value block travels once around the ring (sp − 1 paired sends to r + 1 and receives
//   from r − 1); per pair of a query chunk and a visiting key chunk, a later chunk is wholly masked and skipped, an
//   earlier one wholly visible, the same chunk causal (the blocks are passed on regardless). The softmax is taken
//   online (a running maximum m, sum l and weighted value sum per query, in float: ops::attention_block_forward, whose
//   logits are the attention op's own float products), and each query keeps its log-sum-exp m + log l for the backward
//   pass;
// - backward: the probabilities are recomputed from the saved log-sum-exp (ops::attention_block_backward); each
//   key/value block travels around the whole ring (sp sends) with its gradient accumulating beside it and arrives
//   home with every query's part.
// Every (sequence, head) pair is one task with a fixed loop order, so results are bitwise the same for any thread
// count; against ops::attention_forward on the whole sequence they agree within float rounding.
// Bytes sent per rank: forward 4·(sp − 1)·B·Tl·2D, backward 4·sp·B·Tl·4D.
// Tensors on a GPU are staged through host memory (copied in, computed on the host, copied back): the ring's
// arithmetic and transfers are the host's in this version.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "dist/communicator.h"
#include "probe/moments.h"
#include "spec/model.h"

namespace proplab {

// UserError unless a model of this config can have its sequences split over `sp` ranks (sp = 1 always can): the
// transformer only, with sp dividing model.seq_len. Messages name parallel.sp and the key.
void check_sequence_parallel(const ModelConfig& config, int sp);

// Which tokens of a sequence of `tokens` a rank of a ring of `ranks` holds. When 2·ranks divides the length, zigzag:
// rank r holds chunks r and 2·ranks − 1 − r of tokens / (2·ranks) tokens each, so that every rank's queries see as
// many causal keys as any other's (the first chunks see few, the last many); otherwise chunk r of tokens / ranks.
// Local token t is chunk chunks[t / chunk]'s token t % chunk.
struct SequenceSplit {
  std::int64_t chunk = 0;   // tokens per chunk
  std::vector<int> chunks;  // the rank's chunks (their index in the sequence), in local order
  // The sequence position of local token t.
  std::int64_t position(std::int64_t t) const {
    return chunks[static_cast<std::size_t>(t / chunk)] * chunk + t % chunk;
  }
};
SequenceSplit sequence_split(std::int64_t tokens, int rank, int ranks);

// out [B, Tl, D] and lse [B, H, Tl] (overwritten). With logit_sums, also adds the power sums of this rank's queries'
// causal logits (before the softmax); summed over the ring they are the whole sequence's.
void ring_attention_forward(dist::Communicator& ring, const Tensor& qkv, int heads, float logit_scale, Tensor& out,
                            Tensor& lse, probe::LogitSums* logit_sums = nullptr);
// d_qkv [B, Tl, 3D] (overwritten) from d_out [B, Tl, D], with the forward's out and lse.
void ring_attention_backward(dist::Communicator& ring, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                             const Tensor& d_out, int heads, float logit_scale, Tensor& d_qkv);

}  // namespace proplab
