// kernels/dropout: the CUDA side of inverted dropout with a counter-based mask (ops::dropout_forward/backward in
// src/ops/ops.h; src/ops/dropout.cpp is the reference) — host launcher.
//
// Invariants:
// - Element i is dropped (written +0) when proplab::philox_uniform(seed, stream, i) < p (core/philox.h, the same
//   draw as CounterRng(seed, stream).uniform(i)); a kept element is in[i] · keep_scale rounded once, keep_scale =
//   1/(1 − p) computed on the host in float exactly as the CPU does. The output is bitwise the CPU's.
// - p == 0 copies (nothing when in and out are the same buffer), as the CPU does.
// - in and out are device pointers to n contiguous floats and may alias. out is OVERWRITTEN.
// - Enqueued on context().stream; nothing synchronises. Host-compilable.
#pragma once

#include <cstdint>

namespace proplab::kernels {

// out[i] = philox_uniform(seed, stream, i) < p ? 0 : in[i] · (1/(1 − p)), 0 <= p < 1. Forward and backward alike.
void dropout_apply(const float* in, float p, std::uint64_t seed, std::uint64_t stream, std::int64_t n, float* out);

}  // namespace proplab::kernels
