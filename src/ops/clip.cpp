// ops/clip (CPU reference): global gradient-norm clipping over a list of tensors.
//
// Determinism: each tensor's Σ g² is a chunked_sum (fixed chunks, combined in chunk order, in double) and the
// per-tensor sums are added in list order, so the norm is bitwise the same for any thread count. Scaling is
// elementwise.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/parallel.h"
#include "ops/dispatch.h"
#include "ops/ops.h"

namespace proplab::ops {
namespace {

// Below this many elements a parallel region costs more than the loop.
constexpr std::int64_t kParallelMin = 1 << 15;

double sum_of_squares_cpu(const Tensor& grad) {
  const float* data = grad.f32();
  return chunked_sum(grad.numel(), [=](std::int64_t begin, std::int64_t end) {
    double sum = 0.0;
    for (std::int64_t i = begin; i < end; ++i) sum += static_cast<double>(data[i]) * data[i];
    return sum;
  });
}

void scale_cpu(Tensor& grad, float factor) {
  float* data = grad.f32();
  const std::int64_t n = grad.numel();
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (std::int64_t i = 0; i < n; ++i) data[i] *= factor;
}

double clip_grad_norm_cpu(const std::vector<Tensor*>& grads, double max_norm) {
  double total = 0.0;
  for (const Tensor* grad : grads) total += sum_of_squares_cpu(*grad);
  const double norm = std::sqrt(total);
  // A non-finite norm is returned untouched for the caller to report; scaling by 0 would hide it in NaNs.
  if (max_norm > 0.0 && std::isfinite(norm) && norm > max_norm) {
    const float factor = static_cast<float>(max_norm / norm);
    for (Tensor* grad : grads) scale_cpu(*grad, factor);
  }
  return norm;
}

}  // namespace

double clip_grad_norm(const std::vector<Tensor*>& grads, double max_norm) {
  const char* op = "clip_grad_norm";
  if (grads.empty()) return 0.0;
  Device device = Device::cpu;
  for (std::size_t i = 0; i < grads.size(); ++i) {
    PROPLAB_CHECK(grads[i] != nullptr && grads[i]->defined(), "op '", op, "': gradient ", i, " is missing");
    expect_shape(op, "gradient", *grads[i], grads[i]->shape());
    const Device grad_device = grads[i]->device();
    PROPLAB_CHECK(i == 0 || grad_device == device, "op '", op, "' got gradients on different devices");
    device = grad_device;
  }
  if (device == Device::cuda) missing_device_impl(op, device);
  return clip_grad_norm_cpu(grads, max_norm);
}

}  // namespace proplab::ops
