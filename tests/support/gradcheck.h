// Shared finite-difference gradient checker used by every op, layer and model test.
//
// The caller provides `loss()`, a scalar (double) function of some float parameters, and the analytic
// gradient of that loss with respect to one input tensor. The checker perturbs each (or a sample of) input
// element by ±step, takes the central difference, and compares with the analytic value:
//   |numeric - analytic| <= atol + rtol * max(|numeric|, |analytic|).
// Kinks (ReLU at 0, max, ...): where the one-sided differences disagree by more than kink_tolerance, the
// function is not smooth within ±step and the element is skipped (counted; at most max_kink_fraction may be).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "core/tensor.h"

namespace proplab::testing {

struct GradCheckOptions {
  double step = 1e-2;
  double rtol = 2e-2;
  double atol = 1e-4;
  double kink_tolerance = 0.2;      // relative disagreement of one-sided slopes that marks a kink
  double max_kink_fraction = 0.05;  // fail if more elements than this are skipped as kinks
  std::int64_t max_elements = 200;  // check at most this many elements (a deterministic spread sample)
};

struct GradCheckResult {
  bool ok = true;
  std::int64_t checked = 0;
  std::int64_t kinks = 0;
  double worst_error = 0.0;  // worst |numeric - analytic| / (atol + rtol * scale)
  std::string message;
};

// `input` must be a CPU f32 tensor that `loss` reads; it is restored after each perturbation.
GradCheckResult check_gradient(const std::function<double()>& loss, Tensor& input, const Tensor& analytic,
                               const GradCheckOptions& options = {});

// A fixed random projection: returns Σ y_i * r_i with r ~ N(0,1) from (seed, i), in double. Turning a tensor
// output into a scalar loss this way exercises every output element; its gradient w.r.t. y is r.
double project(const Tensor& y, std::uint64_t seed);
// The gradient of project(y, seed) w.r.t. y: a tensor of the same shape holding r.
Tensor projection_weights(const Shape& shape, std::uint64_t seed);

// A CPU f32 tensor with N(0, std^2) entries drawn from (seed, stream) — never zeros.
Tensor random_tensor(const Shape& shape, std::uint64_t seed, double std = 1.0, double mean = 0.0);

}  // namespace proplab::testing

// gtest helper: EXPECT that a GradCheckResult passed, printing its message otherwise.
#define EXPECT_GRAD_OK(result) EXPECT_TRUE((result).ok) << (result).message
