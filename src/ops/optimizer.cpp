// ops/optimizer (CPU reference): AdamW and SGD steps applied in place to one parameter tensor.
//
// Both are elementwise, so results are bitwise the same for any thread count. Hyper-parameters are combined in
// double once per call; the per-element arithmetic is float. The CUDA path (kernels/optimizer.cuh) takes the same
// coefficients and rounds each element's operations as written here.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
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

// One tensor's update for for_blocks_each: body(begin, end) updates param[begin, end); norms, when given, receive
// Σ w² before and Σ Δw² of the update.
template <typename Body>
struct BlockJob {
  std::int64_t n;
  const float* param;
  Body body;
  UpdateNorms* norms;
};

// Calls each job's body on consecutive kBlock-sized ranges of its [0, n), all jobs' blocks in one parallel loop when
// they hold kParallelMin elements or more (one region for every tensor of a step, not one each). For a job with
// norms, each block's Σ w² and Σ Δw² are measured around its body (the old values kept in an L1-sized buffer) and
// added in block order: bitwise the same whatever the threads or the other jobs.
template <typename Body>
void for_blocks_each(const std::vector<BlockJob<Body>>& jobs) {
  std::vector<std::int64_t> first(jobs.size() + 1, 0);
  std::int64_t elements = 0;
  for (std::size_t j = 0; j < jobs.size(); ++j) {
    first[j + 1] = first[j] + (jobs[j].n + kBlock - 1) / kBlock;
    elements += jobs[j].n;
  }
  const std::int64_t blocks = first.back();
  std::vector<std::size_t> job_of(static_cast<std::size_t>(blocks));
  for (std::size_t j = 0; j < jobs.size(); ++j) std::fill(job_of.begin() + first[j], job_of.begin() + first[j + 1], j);
  std::vector<double> weight_sq(static_cast<std::size_t>(blocks)), update_sq(static_cast<std::size_t>(blocks));
#pragma omp parallel for schedule(static) if (elements >= kParallelMin)
  for (std::int64_t g = 0; g < blocks; ++g) {
    const BlockJob<Body>& job = jobs[job_of[static_cast<std::size_t>(g)]];
    const std::int64_t block = g - first[job_of[static_cast<std::size_t>(g)]];
    const std::int64_t begin = block * kBlock, end = std::min(job.n, (block + 1) * kBlock);
    if (job.norms == nullptr) {
      job.body(begin, end);
      continue;
    }
    const float* param = job.param;
    float before[kBlock];
    std::copy(param + begin, param + end, before);
    job.body(begin, end);
    double w = 0.0, u = 0.0;
    // Vectorised (the compiler's fixed lane order; a plain double chain was latency-bound at about 4 cycles an
    // element and cost ~2 ms of a reference-transformer step that records).
#pragma omp simd reduction(+ : w, u)
    for (std::int64_t i = begin; i < end; ++i) {
      const double old = before[i - begin], delta = static_cast<double>(param[i]) - old;
      w += old * old;
      u += delta * delta;
    }
    weight_sq[static_cast<std::size_t>(g)] = w;
    update_sq[static_cast<std::size_t>(g)] = u;
  }
  for (std::size_t j = 0; j < jobs.size(); ++j) {
    if (jobs[j].norms == nullptr) continue;
    for (std::int64_t g = first[j]; g < first[j + 1]; ++g) {
      jobs[j].norms->weight_sq += weight_sq[static_cast<std::size_t>(g)];
      jobs[j].norms->update_sq += update_sq[static_cast<std::size_t>(g)];
    }
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
// One AdamW step's loop over param[begin, end).
auto adamw_body(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWHyper& hyper) {
  const AdamWCoefficients k = adamw_coefficients(hyper);
  const float step_size = k.step_size, inv_sqrt_bc2 = k.inv_sqrt_bc2, decay = k.decay;
  const float beta1 = k.beta1, beta2 = k.beta2, eps = k.eps;
  const float one_minus_beta1 = k.one_minus_beta1, one_minus_beta2 = k.one_minus_beta2;
  float* p = param.f32();
  const float* g = grad.f32();
  float* m_data = m.f32();
  float* v_data = v.f32();
  return [=](std::int64_t begin, std::int64_t end) {
#pragma omp simd
    for (std::int64_t i = begin; i < end; ++i) {
      const float m_i = beta1 * m_data[i] + one_minus_beta1 * g[i];
      const float v_i = beta2 * v_data[i] + one_minus_beta2 * g[i] * g[i];
      m_data[i] = m_i;
      v_data[i] = v_i;
      p[i] = p[i] * decay - step_size * m_i / (std::sqrt(v_i) * inv_sqrt_bc2 + eps);
    }
  };
}
using AdamWBody = decltype(adamw_body(std::declval<Tensor&>(), std::declval<const Tensor&>(), std::declval<Tensor&>(),
                                      std::declval<Tensor&>(), std::declval<const AdamWHyper&>()));

// As torch.optim.SGD (dampening 0): g = grad + wd*param; buf = momentum*buf + g; the step uses
// g + momentum*buf (nesterov) or buf; with momentum 0 the step is g and the buffer is untouched.
auto sgd_body(Tensor& param, const Tensor& grad, Tensor& momentum_buffer, const SgdHyper& hyper) {
  const float lr = hyper.lr, momentum = hyper.momentum, weight_decay = hyper.weight_decay;
  float* p = param.f32();
  const float* g = grad.f32();
  float* buf = momentum != 0.0f ? momentum_buffer.f32() : nullptr;
  const bool nesterov = hyper.nesterov;
  return [=](std::int64_t begin, std::int64_t end) {
    if (momentum == 0.0f) {
#pragma omp simd
      for (std::int64_t i = begin; i < end; ++i) p[i] -= lr * (g[i] + weight_decay * p[i]);
      return;
    }
#pragma omp simd
    for (std::int64_t i = begin; i < end; ++i) {
      const float g_i = g[i] + weight_decay * p[i];
      const float buf_i = momentum * buf[i] + g_i;
      buf[i] = buf_i;
      p[i] -= lr * (nesterov ? g_i + momentum * buf_i : buf_i);
    }
  };
}
using SgdBody = decltype(sgd_body(std::declval<Tensor&>(), std::declval<const Tensor&>(), std::declval<Tensor&>(),
                                  std::declval<const SgdHyper&>()));

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

namespace {

Device check_adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, const AdamWHyper& hyper) {
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
#ifndef PROPLAB_WITH_CUDA
  if (device == Device::cuda) missing_device_impl(op, device);
#endif
  return device;
}

Device check_sgd(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer, const SgdHyper& hyper) {
  const char* op = "sgd_update";
  PROPLAB_CHECK(param.defined(), "op '", op, "': param is undefined");
  expect_shape(op, "param", param, param.shape());
  expect_shape(op, "grad", grad, param.shape());
  PROPLAB_CHECK(!hyper.nesterov || hyper.momentum > 0.0f, "op '", op, "': nesterov needs momentum > 0");
  // Without momentum the buffer is unused and may be left undefined.
  if (hyper.momentum != 0.0f || momentum_buffer.defined())
    expect_shape(op, "momentum_buffer", momentum_buffer, param.shape());
  const Device device = common_device(op, {&param, &grad, &momentum_buffer});
#ifndef PROPLAB_WITH_CUDA
  if (device == Device::cuda) missing_device_impl(op, device);
#endif
  return device;
}

}  // namespace

void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWHyper& hyper,
                  UpdateNorms* norms) {
  adamw_update_each({AdamWStep{&param, &grad, &m, &v, hyper, norms}});
}

void adamw_update_each(const std::vector<AdamWStep>& steps) {
  std::vector<BlockJob<AdamWBody>> jobs;
  jobs.reserve(steps.size());
  for (const AdamWStep& s : steps) {
    const Device device = check_adamw(*s.param, *s.grad, *s.m, *s.v, s.hyper);
#ifdef PROPLAB_WITH_CUDA
    if (device == Device::cuda) {
      adamw_update_cuda(*s.param, *s.grad, *s.m, *s.v, s.hyper, s.norms);
      continue;
    }
#else
    (void)device;
#endif
    jobs.push_back({s.param->numel(), s.param->f32(), adamw_body(*s.param, *s.grad, *s.m, *s.v, s.hyper), s.norms});
  }
  for_blocks_each(jobs);
}

void sgd_update(Tensor& param, const Tensor& grad, Tensor& momentum_buffer, const SgdHyper& hyper, UpdateNorms* norms) {
  sgd_update_each({SgdStep{&param, &grad, &momentum_buffer, hyper, norms}});
}

void sgd_update_each(const std::vector<SgdStep>& steps) {
  std::vector<BlockJob<SgdBody>> jobs;
  jobs.reserve(steps.size());
  for (const SgdStep& s : steps) {
    const Device device = check_sgd(*s.param, *s.grad, *s.momentum_buffer, s.hyper);
#ifdef PROPLAB_WITH_CUDA
    if (device == Device::cuda) {
      sgd_update_cuda(*s.param, *s.grad, *s.momentum_buffer, s.hyper, s.norms);
      continue;
    }
#else
    (void)device;
#endif
    jobs.push_back(
        {s.param->numel(), s.param->f32(), sgd_body(*s.param, *s.grad, *s.momentum_buffer, s.hyper), s.norms});
  }
  for_blocks_each(jobs);
}

}  // namespace proplab::ops
