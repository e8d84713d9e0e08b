// ops/clip (CPU reference): global gradient-norm clipping over a list of tensors.
//
// Determinism: each tensor's Σ g² is ops::sum_squares' (fixed chunks, combined in chunk order, in double; all
// tensors' chunks in one parallel region: sum_squares_each) and the per-tensor sums are added in list order, so the
// norm is bitwise the same for any thread count. Scaling is elementwise. On CUDA each tensor's sum is a fixed-order
// device reduction (same bits every run; the order within a tensor differs from the CPU's), the per-tensor sums are
// added in list order on the host.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "ops/dispatch.h"
#include "ops/ops.h"

#ifdef PROPLAB_WITH_CUDA
#include "kernels/context.cuh"
#include "kernels/optimizer.cuh"
#include "kernels/reduce.cuh"
#endif

namespace proplab::ops {
namespace {

// Below this many elements a parallel region costs more than the loop.
constexpr std::int64_t kParallelMin = 1 << 15;

void scale_cpu(Tensor& grad, float factor) {
  float* data = grad.f32();
  const std::int64_t n = grad.numel();
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (std::int64_t i = 0; i < n; ++i) data[i] *= factor;
}

double clip_grad_norm_cpu(const std::vector<Tensor*>& grads, double max_norm) {
  // Every tensor's Σ g² in one parallel region (ops::sum_squares' chunks and order), added in list order.
  double total = 0.0;
  for (double sum : sum_squares_each(std::vector<const Tensor*>(grads.begin(), grads.end()))) total += sum;
  const double norm = std::sqrt(total);
  // A non-finite norm is returned untouched for the caller to report; scaling by 0 would hide it in NaNs.
  if (max_norm > 0.0 && std::isfinite(norm) && norm > max_norm) {
    const float factor = static_cast<float>(max_norm / norm);
    for (Tensor* grad : grads) scale_cpu(*grad, factor);
  }
  return norm;
}

#ifdef PROPLAB_WITH_CUDA
// Each tensor's Σ g² on the device (double, fixed-order: kernels::dot_device), copied back together and added in
// list order on the host as the CPU does; the scaling runs on the device with the factor the CPU would use.
double clip_grad_norm_cuda(const std::vector<Tensor*>& grads, double max_norm) {
  const std::size_t count = grads.size();
  kernels::Scratch sums(sizeof(double) * count);
  for (std::size_t i = 0; i < count; ++i)
    kernels::dot_device(grads[i]->f32(), nullptr, grads[i]->numel(), sums.as<double>() + i, false);
  std::vector<double> host(count);
  kernels::copy_to_host(host.data(), sums.as<double>(), sizeof(double) * count);
  double total = 0.0;
  for (double sum : host) total += sum;
  const double norm = std::sqrt(total);
  if (max_norm > 0.0 && std::isfinite(norm) && norm > max_norm) {
    const float factor = static_cast<float>(max_norm / norm);
    for (Tensor* grad : grads) kernels::scale(grad->f32(), grad->numel(), factor);
  }
  return norm;
}
#endif

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
  if (device == Device::cuda) {
#ifdef PROPLAB_WITH_CUDA
    return clip_grad_norm_cuda(grads, max_norm);
#else
    missing_device_impl(op, device);
#endif
  }
  return clip_grad_norm_cpu(grads, max_norm);
}

}  // namespace proplab::ops
