// kernels/moments: the moment sums of probe/moments (probe::accumulate) for an f32 tensor on the GPU — host
// launcher; the kernels are in kernels/moments.cu.
//
// x (device pointer, row-major [B, T, F], B·T·F elements) is reduced to what probe::MomentSums holds, with the same
// definitions as the CPU path in src/probe/moments.cpp:
//   d = x - shift; Σd, Σd² (request.sums), Σd³, Σd⁴ (request.higher), max |x| as the bits of a float (request.max:
//   the largest of (bits(x) & 0x7fffffff), so a NaN wins over +Inf, which wins over every finite value), the count
//   of NaN/±Inf elements (request.nonfinite), Σ_b ‖Σ_t d_bt‖² (request.seq) and per-feature Σ_{b,t} d_btf,
//   Σ_{b,t} d_btf² (request.features).
//
// Invariants:
// - With request.choose_shift the shift is picked on the device exactly as the CPU picks it for empty sums: the
//   float64 mean of the finite ones among up to 64 elements x[k·n / min(n, 64)], k = 0, 1, ..., added in k order
//   (0 when none is finite). Otherwise request.shift is used.
// - Every sum is accumulated in float64. Launch geometry is a function of (B, T, F) and of which path the request
//   takes (layout-free or per-feature), never of the GPU; per-block partials are combined in a fixed order and no
//   floating-point atomics are used, so the same input and request give bitwise the same totals on every run.
// - All launches go on kernels::context().stream; temporaries come from kernels::Scratch; one device-to-host copy
//   brings every total back (the launcher waits for it).
// - Host-compilable: no device code here.
#pragma once

#include <cstdint>

namespace proplab::kernels {

// What to compute (see the header comment). seq and features imply sums.
struct MomentRequest {
  bool sums = false;
  bool higher = false;
  bool max = false;
  bool seq = false;
  bool features = false;
  bool nonfinite = false;
  bool choose_shift = false;  // pick the shift from x on the device; otherwise use `shift`
  double shift = 0.0;
};

// The totals of one tensor; fields not requested are 0.
struct MomentTotals {
  double shift = 0.0;  // the shift every sum is about (chosen or given)
  double sum = 0.0, sum_sq = 0.0, sum_cube = 0.0, sum_quad = 0.0;
  double seq_sum_norm_sq = 0.0;
  std::uint32_t max_abs_bits = 0;  // bits of max |x| as a float (0 when max was not requested)
  std::int64_t nonfinite = 0;
};

// The totals of x [sequences, tokens, features] for `request`. With request.features, the per-feature sums are
// added to the host arrays feature_sum[F] and feature_sum_sq[F] (both required then, ignored otherwise).
// sequences >= 0, tokens >= 1, features >= 1; nothing is launched when there are no elements or nothing is
// requested.
MomentTotals moment_sums(const float* x, std::int64_t sequences, std::int64_t tokens, std::int64_t features,
                         const MomentRequest& request, double* feature_sum, double* feature_sum_sq);

}  // namespace proplab::kernels
