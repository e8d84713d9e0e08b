// models/gather: the probes on an op's input and output summed inside the op (ops::OpMoments), where the sink takes
// sums gathered that way (the Recorder does); other sinks get the whole tensors through forward()/backward().
#pragma once

#include <cstdint>

#include "ops/ops.h"
#include "probe/probe.h"

namespace proplab {

// The sums `sink` gathers for probes `input_probe` and `output_probe` (−1: none) of one op, forward or backward;
// empty without a sink. A probe whose sums are null here is passed whole by the caller.
inline ops::OpMoments gathered_moments(ProbeSink* sink, int input_probe, int output_probe, bool backward,
                                       std::int64_t sequences) {
  ops::OpMoments moments;
  moments.sequences = sequences;
  if (sink == nullptr) return moments;
  if (input_probe >= 0) moments.input = sink->gathered(input_probe, backward, moments.input_stats);
  if (output_probe >= 0) moments.output = sink->gathered(output_probe, backward, moments.output_stats);
  return moments;
}

}  // namespace proplab
