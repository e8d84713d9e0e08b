// kernels/activation: the CUDA side of the pointwise activations (ops::activation_forward/backward in
// src/ops/ops.h; src/ops/activation.cpp is the reference) — host launchers.
//
// Invariants:
// - x, y, d_y, d_x are device pointers to n contiguous floats. y may alias x; d_x may alias d_y (each element is
//   read before it is written, by the same thread).
// - The formulas are the CPU's term for term: the same branch-free approximations of e^x, tanh and the normal CDF
//   and density (same polynomials, constants, clamps and NaN behaviour), GPT-2's tanh GELU in its sigmoid form,
//   the erf GELU as x Φ(x), relu(NaN) = NaN and relu'(0) = 0. Only the compilers' multiply-add contraction may
//   differ, so results agree with the CPU to a few float ulps.
// - d_x OVERWRITES. Everything is enqueued on context().stream; nothing synchronises. Host-compilable.
#pragma once

#include <cstdint>

namespace proplab::kernels {

// The activations, in the order of proplab::Activation (spec/model.h); ops/activation.cpp maps one to the other.
enum class ActivationKind : std::uint8_t { identity, relu, tanh, gelu_tanh, gelu_erf };

// y = φ(x) elementwise.
void activation_forward(ActivationKind kind, const float* x, float* y, std::int64_t n);

// d_x = d_y · φ'(x) elementwise.
void activation_backward(ActivationKind kind, const float* x, const float* d_y, float* d_x, std::int64_t n);

}  // namespace proplab::kernels
