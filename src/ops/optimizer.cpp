// ops/optimizer (CPU reference): AdamW and SGD steps applied in place to one parameter tensor.
//
// Both are elementwise, so results are bitwise the same for any thread count. Hyper-parameters are combined in
// double once per call; the per-element arithmetic is float. The CUDA path (kernels/optimizer.cuh) takes the same
// coefficients and rounds each element's operations as written here.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "ops/dispatch.h"
#include "ops/ops.h"

#ifdef PROPLAB_WITH_CUDA
#include "kernels/optimizer.cuh"
#endif

namespace proplab::ops {
namespace {

// Elements are processed in blocks of this size, the unit of work of the parallel loops: where the vector
// body ends and the scalar remainder starts depends only on the block, never on the thread count.
constexpr std::int64_t kBlock = 4096;
// Below this many elements a parallel region costs more than the loop.
constexpr std::int64_t kParallelMin = 1 << 15;

// Calls body(begin, end) on consecutive kBlock-sized ranges of [0, n), in parallel when n is large.
template <typename Body>
void for_blocks(std::int64_t n, const Body& body) {
  const std::int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (std::int64_t block = 0; block < blocks; ++block) body(block * kBlock, std::min(n, (block + 1) * kBlock));
}

// for_blocks, and when `norms` is given also Σ w² before and Σ Δw² of each block (the block's old values are kept
// in an L1-sized buffer), combined in block order.
template <typename Body>
void for_blocks_measured(std::int64_t n, const float* param, const Body& body, UpdateNorms* norms) {
  if (norms == nullptr) {
    for_blocks(n, body);
    return;
  }
  const std::int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> weight_sq(static_cast<std::size_t>(blocks)), update_sq(static_cast<std::size_t>(blocks));
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (std::int64_t block = 0; block < blocks; ++block) {
    const std::int64_t begin = block * kBlock, end = std::min(n, (block + 1) * kBlock);
    float before[kBlock];
    std::copy(param + begin, param + end, before);
    body(begin, end);
    double w = 0.0, u = 0.0;
    // Vectorised (the compiler's fixed lane order; a plain double chain was latency-bound at about 4 cycles an
    // element and cost ~2 ms of a reference-transformer step that records).
#pragma omp simd reduction(+ : w, u)
    for (std::int64_t i = begin; i < end; ++i) {
      const double old = before[i - begin], delta = static_cast<double>(param[i]) - old;
      w += old * old;
      u += delta * delta;
    }
    weight_sq[block] = w;
    update_sq[block] = u;
  }
  for (std::int64_t block = 0; block < blocks; ++block) {
    norms->weight_sq += weight_sq[block];
    norms->update_sq += update_sq[block];
  }
}

// The per-element coefficients of one AdamW step, combined from the hyper-parameters in double once per call
// (shared by the CPU loop and the CUDA kernel, so both start from the same floats).
struct AdamWCoefficients {
  float step_size, inv_sqrt_bc2, decay, beta1, beta2, eps, one_minus_beta1, one_minus_beta2;
};

AdamWCoefficients adamw_coefficients(const AdamWHyper& hyper) {
  const double bias_correction1 = 1.0 - std::pow(static_cast<double>(hyper.beta1), static_cast<double>(hyper.step));
  const double bias_correction2 = 1.0 - std::pow(static_cast<double>(hyper.beta2), static_cast<double>(hyper.step));
  AdamWCoefficients k;
  k.step_size = static_cast<float>(hyper.lr / bias_correction1);
  k.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bias_correction2));
  k.decay = static_cast<float>(1.0 - static_cast<double>(hyper.lr) * hyper.weight_decay);
  k.beta1 = hyper.beta1, k.beta2 = hyper.beta2, k.eps = hyper.eps;
  k.one_minus_beta1 = 1.0f - k.beta1, k.one_minus_beta2 = 1.0f - k.beta2;
  return k;
}

// As torch.optim.AdamW: param *= 1 - lr*wd; m, v updated; param -= (lr/bc1) * m / (sqrt(v)/sqrt(bc2) + eps).
void adamw_update_cpu(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWHyper& hyper,
                      UpdateNorms* norms) {
  const AdamWCoefficients k = adamw_coefficients(hyper);
  const float step_size = k.step_size, inv_sqrt_bc2 = k.inv_sqrt_bc2, decay = k.decay;
  const float beta1 = k.beta1, beta2 = k.beta2, eps = k.eps;
  const float one_minus_beta1 = k.one_minus_beta1, one_minus_beta2 = k.one_minus_beta2;
  float* p = param.f32();
  const float* g = grad.f32();
  float* m_data = m.f32();
  float* v_data = v.f32();
  for_blocks_measured(
      param.numel(), p,
      [=](std::int64_t begin, std::int64_t end) {
#pragma omp simd
        for (std::int64_t i = begin; i < end; ++i) {
          const float m_i = beta1 * m_data[i] + one_minus_beta1 * g[i];
          const float v_i = beta2 * v_data[i] + one_minus_beta2 * g[i] * g[i];
          m_data[i] = m_i;
          v_data[i] = v_i;
          p[i] = p[i] * decay - step_size * m_i / (std::sqrt(v_i) * inv_sqrt_bc2 + eps);
        }
      },
      norms);
}

// As torch.optim.SGD (dampening 0): g = grad + wd*param; buf = momentum*buf + g; the step uses
// g + momentum*buf (nesterov) or buf; with momentum 0 the step is g and the buffer is untouched.
void sgd_update_cpu(Tensor& param, const Tensor& grad, Tensor& momentum_buffer, const SgdHyper& hyper,
                    UpdateNorms* norms) {
  const float lr = hyper.lr, momentum = hyper.momentum, weight_decay = hyper.weight_decay;
  float* p = param.f32();
  const float* g = grad.f32();
  if (momentum == 0.0f) {
    for_blocks_measured(
        param.numel(), p,
        [=](std::int64_t begin, std::int64_t end) {
#pragma omp simd
          for (std::int64_t i = begin; i < end; ++i) p[i] -= lr * (g[i] + weight_decay * p[i]);
        },
        norms);
    return;
  }
  float* buf = momentum_buffer.f32();
  const bool nesterov = hyper.nesterov;
  for_blocks_measured(
      param.numel(), p,
      [=](std::int64_t begin, std::int64_t end) {
#pragma omp simd
        for (std::int64_t i = begin; i < end; ++i) {
          const float g_i = g[i] + weight_decay * p[i];
          const float buf_i = momentum * buf[i] + g_i;
          buf[i] = buf_i;
          p[i] -= lr * (nesterov ? g_i + momentum * buf_i : buf_i);
        }
      },
      norms);
}

#ifdef PROPLAB_WITH_CUDA
// The measurements of a CUDA step, added to norms (when given) exactly as the CPU adds its block sums.
struct DeviceNorms {
  explicit DeviceNorms(UpdateNorms* norms) : norms_(norms) {}
  kernels::UpdateSums* sums() { return norms_ ? &sums_ : nullptr; }
  void add() const {
    if (norms_ == nullptr) return;
    norms_->weight_sq += sums_.weight_sq;
    norms_->update_sq += sums_.update_sq;
  }

 private:
  UpdateNorms* norms_;
  kernels::UpdateSums sums_;
};

void adamw_update_cuda(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWHyper& hyper,
                       UpdateNorms* norms) {
  const AdamWCoefficients k = adamw_coefficients(hyper);
  kernels::AdamWCoefficients coefficients;
  coefficients.beta1 = k.beta1, coefficients.beta2 = k.beta2;
  coefficients.one_minus_beta1 = k.one_minus_beta1, coefficients.one_minus_beta2 = k.one_minus_beta2;
  coefficients.step_size = k.step_size, coefficients.inv_sqrt_bc2 = k.inv_sqrt_bc2;
  coefficients.decay = k.decay, coefficients.eps = k.eps;
  DeviceNorms measured(norms);
  kernels::adamw_update(param.f32(), grad.f32(), m.f32(), v.f32(), param.numel(), coefficients, measured.sums());
  measured.add();
}

void sgd_update_cuda(Tensor& param, const Tensor& grad, Tensor& momentum_buffer, const SgdHyper& hyper,
                     UpdateNorms* norms) {
  float* buffer = hyper.momentum != 0.0f ? momentum_buffer.f32() : nullptr;
  DeviceNorms measured(norms);
  kernels::sgd_update(param.f32(), grad.f32(), buffer, param.numel(), hyper.lr, hyper.momentum, hyper.weight_decay,
                      hyper.nesterov, measured.sums());
  measured.add();
}
#endif

}  // namespace

void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWHyper& hyper,
                  UpdateNorms* norms) {
  const char* op = "adamw_update";
  PROPLAB_CHECK(param.defined(), "op '", op, "': param is undefined");
  expect_shape(op, "param", param, param.shape());
  expect_shape(op, "grad", grad, param.shape());
  expect_shape(op, "m", m, param.shape());
  expect_shape(op, "v", v, param.shape());
  PROPLAB_CHECK(hyper.step >= 1, "op '", op, "': step is 1-based, got ", hyper.step);
  PROPLAB_CHECK(hyper.beta1 >= 0.0f && hyper.beta1 < 1.0f && hyper.beta2 >= 0.0f && hyper.beta2 < 1.0f, "op '", op,
                "': betas must lie in [0, 1), got ", hyper.beta1, ", ", hyper.beta2);
  const Device device = common_device(op, {&param, &grad, &m, &v});
  if (device == Device::cuda) {
#ifdef PROPLAB_WITH_CUDA
    adamw_update_cuda(param, grad, m, v, hyper, norms);
    return;
#else
    missing_device_impl(op, device);
#endif
  }
  adamw_update_cpu(param, grad, m, v, hyper, norms);
}

void sgd_update(Tensor& param, const Tensor& grad, Tensor& momentum_buffer, const SgdHyper& hyper, UpdateNorms* norms) {
  const char* op = "sgd_update";
  PROPLAB_CHECK(param.defined(), "op '", op, "': param is undefined");
  expect_shape(op, "param", param, param.shape());
  expect_shape(op, "grad", grad, param.shape());
  PROPLAB_CHECK(!hyper.nesterov || hyper.momentum > 0.0f, "op '", op, "': nesterov needs momentum > 0");
  // Without momentum the buffer is unused and may be left undefined.
  if (hyper.momentum != 0.0f || momentum_buffer.defined())
    expect_shape(op, "momentum_buffer", momentum_buffer, param.shape());
  const Device device = common_device(op, {&param, &grad, &momentum_buffer});
  if (device == Device::cuda) {
#ifdef PROPLAB_WITH_CUDA
    sgd_update_cuda(param, grad, momentum_buffer, hyper, norms);
    return;
#else
    missing_device_impl(op, device);
#endif
  }
  sgd_update_cpu(param, grad, momentum_buffer, hyper, norms);
}

}  // namespace proplab::ops
