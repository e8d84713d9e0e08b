// ops/gather: the CPU side of ops::OpMoments, shared by the pointwise ops that take it (ops-internal): an op's
// elements computed chunk by chunk in probe::ChunkedAccumulation's chunks, its input's and output's statistics summed
// chunk by chunk as they are in cache.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>

#include <omp.h>

#include "core/error.h"
#include "core/tensor.h"
#include "ops/ops.h"

namespace proplab::ops {

// compute(begin, end) over [0, n) split into one consecutive range per thread (in parallel above `parallel_min`
// elements), each range a whole number of `granule`s (n must be one too). For work whose results do not depend on
// the split: pointwise (granule 1) or row by row (granule = the row's length).
template <typename Compute>
void in_thread_ranges(std::int64_t n, std::int64_t parallel_min, Compute compute, std::int64_t granule = 1) {
  const std::int64_t units = n / granule;
#pragma omp parallel if (n > parallel_min)
  {
    const std::int64_t threads = omp_get_num_threads(), thread = omp_get_thread_num();
    compute(units * thread / threads * granule, units * (thread + 1) / threads * granule);
  }
}

// Adds the statistics `stats` of the whole tensor t (CPU or GPU) to `sums`, as the sums an op gathers view it: an
// NCHW image plane by plane as its channels-last view (probe::accumulate_planes; CPU only), anything else as
// [sequences, rows / sequences, last dimension] (probe::accumulate).
inline void accumulate_whole(const Tensor& t, std::int64_t sequences, probe::MomentSums& sums,
                             const probe::StatSelection& stats) {
  if (t.ndim() == 4) {
    PROPLAB_CHECK(t.device() == Device::cpu && sequences == t.dim(0), "gathered moments of an image [",
                  shape_string(t.shape()), "] need it on the CPU and its samples as the sequences");
    probe::accumulate_planes(t.f32(), t.dim(0), t.dim(1), t.dim(2) * t.dim(3), sums, stats);
  } else {
    probe::accumulate(t, sequences, sums, stats);
  }
}

// Runs a pointwise op whose `compute(begin, end)` writes out[begin, end) from its inputs and gathers the statistics
// `moments` asks for of `in` and `out` (both [rows, features], or both NCHW images, f32 on the CPU): the elements are
// computed in probe::ChunkedAccumulation's chunks (in parallel above `parallel_min` elements), each chunk's input
// summed just before it is computed (out may alias in) and its output just after. `output_at(i)` is element i of the
// finished output (for the output's shift). A tensor the probe module does not take in chunks, or every tensor when
// `chunked` is false (an op whose own reductions need another chunking), is summed whole: the input before the
// op, the output after. Returns false, doing nothing, when there is nothing to gather; otherwise the op is done.
// An op that computes whole rows of the last dimension (a norm) sets `rows_whole`: the chunks are whole rows, and
// so are the ranges it is given without them.
template <typename Compute, typename OutputAt>
bool gather_moments(const OpMoments* moments, const Tensor& in, Tensor& out, std::int64_t parallel_min, Compute compute,
                    OutputAt output_at, bool chunked = true, bool rows_whole = false) {
  if (moments == nullptr || (moments->input == nullptr && moments->output == nullptr)) return false;
  const std::int64_t n = in.numel();
  if (n == 0) return false;
  // An NCHW image [samples, channels, H, W] is summed as its channels-last view, plane by plane
  // (probe::accumulate_planes); anything else as [sequences, rows / sequences, last dimension].
  const bool images = in.ndim() == 4;
  const std::int64_t features = images ? in.dim(1) : in.ndim() == 0 ? 1 : in.dim(-1);
  const std::int64_t rows = n / features;
  const std::int64_t sequences = moments->sequences, tokens = rows / sequences;
  PROPLAB_CHECK(sequences >= 1 && rows % sequences == 0 && (!images || sequences == in.dim(0)),
                "gathered moments: ", shape_string(in.shape()), " does not split into ", sequences, " sequences");
  const float* x = in.f32();
  std::optional<probe::ChunkedAccumulation> input, output;
  auto start = [&](std::optional<probe::ChunkedAccumulation>& chunked_sums, const float* data, probe::MomentSums& sums,
                   const probe::StatSelection& stats, const std::function<float(std::int64_t)>& value_at, int slot) {
    if (images)
      chunked_sums.emplace(probe::ChunkedAccumulation::Images{}, data, sequences, features, tokens, sums, stats,
                           value_at, slot);
    else
      chunked_sums.emplace(data, sequences, tokens, features, sums, stats, value_at, slot);
  };
  if (chunked && moments->input != nullptr)
    start(
        input, x, *moments->input, moments->input_stats, [x](std::int64_t i) { return x[i]; }, 0);
  if (chunked && moments->output != nullptr)
    start(output, out.f32(), *moments->output, moments->output_stats, output_at, 1);
  const bool in_chunks = input && input->supported(), out_chunks = output && output->supported();
  if (moments->input != nullptr && !in_chunks) accumulate_whole(in, sequences, *moments->input, moments->input_stats);
  if (in_chunks || out_chunks) {
    const probe::ChunkedAccumulation& plan = in_chunks ? *input : *output;  // both have the shape's chunks
    const std::int64_t chunks = plan.chunks();
#pragma omp parallel for schedule(static) if (n > parallel_min)
    for (std::int64_t c = 0; c < chunks; ++c) {
      if (in_chunks) input->add(c);
      compute(plan.begin(c), plan.end(c));
      if (out_chunks) output->add(c);
    }
    if (in_chunks) input->finish();
    if (out_chunks) output->finish();
  } else {
    in_thread_ranges(n, parallel_min, compute, rows_whole ? features : 1);
  }
  if (moments->output != nullptr && !out_chunks)
    accumulate_whole(out, sequences, *moments->output, moments->output_stats);
  return true;
}

// The statistics of an op's finished input and output, summed whole (a GPU op; an op whose own reductions need
// another chunking): the input before the op, the output after.
inline void accumulate_input(const OpMoments* moments, const Tensor& in) {
  if (moments != nullptr && moments->input != nullptr)
    accumulate_whole(in, moments->sequences, *moments->input, moments->input_stats);
}
inline void accumulate_output(const OpMoments* moments, const Tensor& out) {
  if (moments != nullptr && moments->output != nullptr)
    accumulate_whole(out, moments->sequences, *moments->output, moments->output_stats);
}

}  // namespace proplab::ops
