// dist/pipeline_schedule: the 1F1B (PipeDream-Flush) schedule of a pipeline-parallel step and the split of a
// model's layers into stages, as pure functions (no communication), so they are tested on their own.
//
// A step runs `microbatches` micro-batches through `stages` stages. Stage s first runs min(stages − s − 1, M)
// warm-up forwards, then alternates one forward and one backward while forwards remain (steady state), then runs
// the remaining backwards (cool-down). Every stage's action list also holds its point-to-point transfers:
// activations go up (stage s → s + 1) after a forward, their gradients come down after a backward.
//
// Invariants:
// - Deadlock-free even when every send blocks until its receive is posted (rendezvous): between two neighbours
//   the lower stage sends its activation before it receives a gradient, and the upper stage receives that
//   activation before it sends its gradient (a stage's "send gradient i, receive activation k" pair is issued as
//   "receive k, send i"). Eager sends (small MPI messages) only complete sooner.
// - Tags: an activation of micro-batch m travels with tag 2·m, its gradient with 2·m + 1.
// - A stage holds at most min(stages − s, M) micro-batches between forward and backward; micro-batch m lives in
//   slot m mod slots (the in-flight set is always a run of consecutive micro-batches).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace proplab::dist {

enum class PipelineAction {
  receive_activation,  // from stage − 1, into the micro-batch's slot
  forward,
  send_activation,   // to stage + 1
  receive_gradient,  // from stage + 1
  backward,
  send_gradient,  // to stage − 1
};
const char* pipeline_action_name(PipelineAction action);

struct PipelineStep {
  PipelineAction action;
  int microbatch;
};

// Stage `stage`'s actions for one training step, in the order it runs them.
std::vector<PipelineStep> one_f_one_b(int stages, int stage, int microbatches);

// Micro-batches stage `stage` holds between forward and backward at most: min(stages − stage, microbatches).
int pipeline_slots(int stages, int stage, int microbatches);

// The message tag of a micro-batch's activation (gradient: tag + 1).
inline int activation_tag(int microbatch) { return 2 * microbatch; }
inline int gradient_tag(int microbatch) { return 2 * microbatch + 1; }

// Fraction of a step's time each stage idles in the 1F1B schedule when the stages cost the same:
// (p − 1)/(M + p − 1), i.e. an idle time of (p − 1)/M times the work itself.
double bubble_fraction(int stages, int microbatches);

// Splits `layer_cost.size()` layers into `stages` contiguous non-empty groups minimising the largest stage cost,
// where stage 0 also pays `first_extra` (the embedding) and the last stage `last_extra` (final norm, head, loss).
// Returns stages + 1 boundaries: stage s runs layers [b[s], b[s+1]). Ties go to the split that puts layers on
// earlier stages. Requires 1 <= stages <= layers.
std::vector<int> balance_stages(const std::vector<double>& layer_cost, double first_extra, double last_extra,
                                int stages);

}  // namespace proplab::dist
