#include "dist/pipeline_schedule.h"

#include <algorithm>
#include <limits>

#include "core/error.h"

namespace proplab::dist {

const char* pipeline_action_name(PipelineAction action) {
  switch (action) {
    case PipelineAction::receive_activation:
      return "receive_activation";
    case PipelineAction::forward:
      return "forward";
    case PipelineAction::send_activation:
      return "send_activation";
    case PipelineAction::receive_gradient:
      return "receive_gradient";
    case PipelineAction::backward:
      return "backward";
    case PipelineAction::send_gradient:
      return "send_gradient";
  }
  return "?";
}

int pipeline_slots(int stages, int stage, int microbatches) { return std::min(stages - stage, microbatches); }

std::vector<PipelineStep> one_f_one_b(int stages, int stage, int microbatches) {
  PROPLAB_CHECK(stages >= 1 && stage >= 0 && stage < stages && microbatches >= 1, "one_f_one_b: stage ", stage, " of ",
                stages, " with ", microbatches, " micro-batches");
  const bool first = stage == 0, last = stage == stages - 1;
  // The compute order: warm-up forwards, then one forward and one backward while forwards remain, then backwards.
  std::vector<PipelineStep> compute;
  const int warmup = std::min(stages - stage - 1, microbatches);
  int forwards = 0, backwards = 0;
  for (; forwards < warmup; ++forwards) compute.push_back({PipelineAction::forward, forwards});
  for (; forwards < microbatches; ++forwards, ++backwards) {
    compute.push_back({PipelineAction::forward, forwards});
    compute.push_back({PipelineAction::backward, backwards});
  }
  for (; backwards < microbatches; ++backwards) compute.push_back({PipelineAction::backward, backwards});

  // Each computation with its transfers around it.
  std::vector<PipelineStep> steps;
  for (const PipelineStep& c : compute) {
    if (c.action == PipelineAction::forward) {
      if (!first) steps.push_back({PipelineAction::receive_activation, c.microbatch});
      steps.push_back(c);
      if (!last) steps.push_back({PipelineAction::send_activation, c.microbatch});
    } else {
      if (!last) steps.push_back({PipelineAction::receive_gradient, c.microbatch});
      steps.push_back(c);
      if (!first) steps.push_back({PipelineAction::send_gradient, c.microbatch});
    }
  }
  // The lower neighbour sends its activation before it waits for a gradient, so this stage takes that activation
  // before it sends its own gradient down: "send gradient i, receive activation k" becomes "receive k, send i".
  for (std::size_t i = 0; i + 1 < steps.size(); ++i) {
    if (steps[i].action == PipelineAction::send_gradient && steps[i + 1].action == PipelineAction::receive_activation) {
      std::swap(steps[i], steps[i + 1]);
      ++i;
    }
  }
  return steps;
}

double bubble_fraction(int stages, int microbatches) {
  return static_cast<double>(stages - 1) / static_cast<double>(microbatches + stages - 1);
}

std::vector<int> balance_stages(const std::vector<double>& layer_cost, double first_extra, double last_extra,
                                int stages) {
  const int layers = static_cast<int>(layer_cost.size());
  PROPLAB_CHECK(stages >= 1 && stages <= layers, "balance_stages: ", stages, " stages for ", layers, " layers");
  std::vector<double> prefix(static_cast<std::size_t>(layers) + 1, 0.0);
  for (int l = 0; l < layers; ++l) prefix[l + 1] = prefix[l] + layer_cost[l];
  auto stage_cost = [&](int s, int begin, int end) {
    return prefix[end] - prefix[begin] + (s == 0 ? first_extra : 0.0) + (s == stages - 1 ? last_extra : 0.0);
  };
  constexpr double kInf = std::numeric_limits<double>::infinity();
  // best[s][j]: the smallest largest-stage cost of layers [0, j) on stages 0..s; start[s][j]: stage s's first layer.
  std::vector<std::vector<double>> best(stages, std::vector<double>(static_cast<std::size_t>(layers) + 1, kInf));
  std::vector<std::vector<int>> start(stages, std::vector<int>(static_cast<std::size_t>(layers) + 1, -1));
  for (int j = 1; j <= layers; ++j) {
    best[0][j] = stage_cost(0, 0, j);
    start[0][j] = 0;
  }
  for (int s = 1; s < stages; ++s) {
    for (int j = s + 1; j <= layers; ++j) {
      // Scanning the split point downwards keeps the latest (most layers on earlier stages) among equals.
      for (int i = j - 1; i >= s; --i) {
        const double cost = std::max(best[s - 1][i], stage_cost(s, i, j));
        if (cost < best[s][j]) {
          best[s][j] = cost;
          start[s][j] = i;
        }
      }
    }
  }
  std::vector<int> bounds(static_cast<std::size_t>(stages) + 1, 0);
  bounds[stages] = layers;
  for (int s = stages - 1; s >= 1; --s) bounds[s] = start[s][bounds[s + 1]];
  return bounds;
}

}  // namespace proplab::dist
