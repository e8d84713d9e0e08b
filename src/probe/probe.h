// probe: named points in a model where a tensor is summarised while it trains.
//
// A probe names a tensor of the forward graph (an activation) and, in backward, the gradient of the loss with
// respect to that same tensor. Models list their probes once, in forward order (ProbeInfo::depth is the index in
// that list), and on recorded steps hand each probed tensor to a ProbeSink right after the op that produced it,
// while its data is still hot in cache. On steps that are not recorded the sink is null and no work is done.
//
// Tensors given to a sink are contiguous f32 [rows, features] with rows = sequences · tokens (row index
// b·tokens + t), or [sequences, tokens, features].
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "probe/moments.h"

namespace proplab {

enum class ProbeKind { residual, branch, norm, preact, postact, logits, embed };
const char* probe_kind_name(ProbeKind kind);

struct ProbeInfo {
  std::string name;  // e.g. "blocks.12.attn.out"
  int depth = 0;     // position along the forward graph (index in the model's probe list)
  int block = -1;    // block (transformer) or layer (MLP) index; -1 outside blocks
  ProbeKind kind = ProbeKind::residual;
  bool has_backward = true;  // false where the gradient is internal to a fused op (attention logits)
  // Tensor parallelism: each rank holds a block of this tensor's features (FFN hidden units, attention heads,
  // vocabulary columns) rather than all of it.
  bool split_features = false;
};

// One block (the unit ProbeInfo::block counts) of a model whose blocks form stages (ResNets): its stage (0-based)
// and whether it is a transition, the block that opens a stage ≥ 1 by changing the resolution (stride 2, projection
// shortcut). Models without stages list no blocks.
struct BlockInfo {
  int stage = 0;
  bool transition = false;
};

class ProbeSink {
 public:
  virtual ~ProbeSink() = default;
  // The activation of probe `probe`: `x` viewed as [sequences, rows / sequences, features].
  virtual void forward(int probe, const Tensor& x, std::int64_t sequences) = 0;
  // The gradient of the loss with respect to probe `probe`'s tensor, same layout.
  virtual void backward(int probe, const Tensor& d_x, std::int64_t sequences) = 0;
  // Attention logits (pre-softmax, causal entries only): their power sums, gathered by the attention op while it
  // computed q·k·scale from the packed qkv [B, T, 3D] (also given, for sinks that want the tensor itself; with
  // sequence parallelism the sums are the whole sequences' and qkv is ring rank 0's own tokens [B, T/sp, 3D]).
  virtual void attention_logits(int probe, const probe::LogitSums& sums, const Tensor& qkv, int heads,
                                float logit_scale) = 0;
  // An NCHW image tensor [samples, C, H, W] for probe `probe` (its activation, or with `backward` its gradient),
  // meant as its channels-last view [samples, H·W, C]. A sink that can read it in place does so and returns
  // true; the default returns false, and the model then copies it channels-last and calls forward()/backward().
  virtual bool image(int probe, const Tensor& x, bool backward) {
    (void)probe, (void)x, (void)backward;
    return false;
  }
  // The sums probe `probe`'s activation (or with `backward` its gradient) is to be added to by an op that sums it
  // inside its own loop (ops::OpMoments), with the statistics to take in `which`; the probe then counts as seen. Null
  // (the default) when this sink takes whole tensors only: the model then calls forward()/backward().
  virtual probe::MomentSums* gathered(int probe, bool backward, probe::StatSelection& which) {
    (void)probe, (void)backward, (void)which;
    return nullptr;
  }
};

}  // namespace proplab
