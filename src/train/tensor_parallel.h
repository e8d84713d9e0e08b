// train/tensor_parallel: what the training loop does differently when a model replica is split over a
// tensor-parallel group (models/tensor_parallel.h): probes, parameter statistics, gradient clipping and checkpoints
// that see the full tensors, so that the run file and checkpoint match a single-process run.
//
// - Probes: replicated tensors (residual stream, norms, branch outputs) are identical on every rank and recorded by
//   the group's rank 0 alone. A tensor split by features (ProbeInfo::split_features: FFN pre/post-activations, the
//   head's logits, and their gradients) is all-gathered on recorded steps into the single-process [rows, F] layout
//   and recorded whole by rank 0: every statistic (the per-feature chan_* ones and corr, whose per-sequence sums run
//   over features, included) is then computed exactly as one process computes it. The attention logits arrive as
//   power sums per rank (their heads): those are sums over elements, so they are summed (max for max_abs) over
//   the group.
// - Parameter statistics and the gradient norm: sums of squares of split parameters are summed over the group;
//   replicated ones are counted once.
// - Checkpoints hold full tensors: split parameters and their optimizer state are all-gathered before rank 0
//   writes, and on load every rank reads the full tensors and keeps its piece.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "dist/communicator.h"
#include "nn/parameter.h"
#include "probe/probe.h"

namespace proplab {

// A ProbeSink in front of the recorder on every rank of a tensor-parallel group (see above). Every rank must call
// it for the same probes in the same order (the model does).
class TensorParallelSink final : public ProbeSink {
 public:
  TensorParallelSink(ProbeSink& recorder, const std::vector<ProbeInfo>& probes, dist::Communicator& group);

  void forward(int probe, const Tensor& x, std::int64_t sequences) override;
  void backward(int probe, const Tensor& d_x, std::int64_t sequences) override;
  void attention_logits(int probe, const probe::LogitSums& sums, const Tensor& qkv, int heads,
                        float logit_scale) override;

 private:
  // The full [rows, F] tensor of a split one (rank 0's copy), or x itself when not split.
  const Tensor& whole(int probe, const Tensor& x);

  ProbeSink& recorder_;
  std::vector<ProbeInfo> probes_;
  dist::Communicator& group_;
  Tensor gathered_, whole_;
};

// Attention-logit power sums added over a group (count, non-finite count and the power sums summed, max_abs the
// maximum): the sums of every rank's logits. Every rank calls it.
probe::LogitSums sum_logit_sums(dist::Communicator& group, const probe::LogitSums& sums);

// Σ over the group of the split parameters' entries of `per_param` (one value per parameter, in store order);
// replicated parameters' entries are left as they are. Every rank calls it.
void sum_split_parameters(dist::Communicator& group, const ParameterStore& params, std::vector<double>& per_param);

// The global gradient norm over the full tensors (split parameters summed over the group); when max_norm > 0 and
// the norm exceeds it, every gradient is scaled by max_norm / norm (as ops::clip_grad_norm).
double clip_grad_norm_split(dist::Communicator& group, ParameterStore& params, double max_norm);

// Checkpoint tensors ("param/<name>", "optim/<name>.<state>") with split parameters' entries replaced by full
// tensors gathered over the group (every rank of the group calls it).
std::map<std::string, Tensor> gather_full_tensors(dist::Communicator& group, const ParameterStore& params,
                                                  const std::map<std::string, Tensor>& local);
// Load targets for a checkpoint of full tensors: the split entries of `local` replaced by fresh full-shape tensors.
std::map<std::string, Tensor> full_tensor_targets(const ParameterStore& params,
                                                  const std::map<std::string, Tensor>& local);
// After loading into full_tensor_targets(): copies this rank's pieces of the split entries into `local`.
void keep_local_pieces(const ParameterStore& params, const std::map<std::string, Tensor>& full,
                       std::map<std::string, Tensor>& local);

}  // namespace proplab
