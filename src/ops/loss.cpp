// ops/loss (CPU reference): softmax cross-entropy (forward and backward fused) and mean squared error.
//
// Determinism: per-row (or per-chunk) losses are computed in double and summed by chunked_sum over a fixed
// chunking, so the mean is bitwise the same for any thread count.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "core/parallel.h"
#include "ops/cpu_simd.h"
#include "ops/dispatch.h"
#include "ops/ops.h"

#ifdef PROPLAB_WITH_CUDA
#include "kernels/index_check.cuh"
#include "kernels/loss.cuh"
#endif

namespace proplab::ops {
namespace {

using simd::kLanes;
using simd::load;
using simd::store;
using simd::Vec;

constexpr std::int64_t kRowsPerChunk = 8;   // cross-entropy rows per reduction chunk
constexpr std::int64_t kVecsPerFlush = 64;  // float partial sums of exp are flushed to double this often

// Softmax cross-entropy of one row of `classes` logits; writes grad_coef * softmax - onehot_coef * onehot into
// d_row when it is given. Returns the row's loss in double.
double cross_entropy_row(const float* row, std::int64_t classes, std::int32_t target, float* d_row, double grad_coef) {
  const float target_logit = row[target];  // read first, so d_row may alias row
  const std::int64_t full = classes / kLanes * kLanes;
  // The tail is copied into a padded vector: -inf lanes give exp = 0 and never win the max.
  Vec tail = simd::splat(-std::numeric_limits<float>::infinity());
  std::memcpy(&tail, row + full, static_cast<std::size_t>(classes - full) * sizeof(float));

  Vec max_v = tail;
  for (std::int64_t j = 0; j < full; j += kLanes) max_v = simd::max(max_v, load(row + j));
  const float row_max = simd::horizontal_max(max_v);
  const Vec row_max_v = simd::splat(row_max);

  double sum = 0.0;
  Vec partial = Vec{};
  std::int64_t pending = 0;
  for (std::int64_t j = 0; j < full; j += kLanes) {
    Vec e = simd::exp_nonpositive(load(row + j) - row_max_v);
    if (d_row != nullptr) store(d_row + j, e);
    partial += e;
    if (++pending == kVecsPerFlush) {
      sum += simd::horizontal_sum_double(partial);
      partial = Vec{};
      pending = 0;
    }
  }
  const Vec tail_exp = simd::exp_nonpositive(tail - row_max_v);
  partial += tail_exp;
  sum += simd::horizontal_sum_double(partial);

  if (d_row != nullptr) {
    std::memcpy(d_row + full, &tail_exp, static_cast<std::size_t>(classes - full) * sizeof(float));
    const Vec coef = simd::splat(static_cast<float>(grad_coef / sum));
    for (std::int64_t j = 0; j < full; j += kLanes) store(d_row + j, load(d_row + j) * coef);
    for (std::int64_t j = full; j < classes; ++j) d_row[j] *= coef[0];
    d_row[target] -= static_cast<float>(grad_coef);
  }
  return std::log(sum) + row_max - target_logit;
}

double softmax_cross_entropy_cpu(const Tensor& logits, const Tensor& targets, Tensor* d_logits, float grad_scale) {
  const std::int64_t classes = logits.dim(-1);
  const std::int64_t rows = classes == 0 ? 0 : logits.numel() / classes;
  const float* logit_data = logits.f32();
  const std::int32_t* target_data = targets.i32();
  float* d_data = d_logits != nullptr ? d_logits->f32() : nullptr;
  const double grad_coef = static_cast<double>(grad_scale) / static_cast<double>(rows);
  const double total = chunked_sum(
      rows,
      [=](std::int64_t begin, std::int64_t end) {
        double chunk_loss = 0.0;
        for (std::int64_t r = begin; r < end; ++r)
          chunk_loss += cross_entropy_row(logit_data + r * classes, classes, target_data[r],
                                          d_data != nullptr ? d_data + r * classes : nullptr, grad_coef);
        return chunk_loss;
      },
      kRowsPerChunk);
  return total / static_cast<double>(rows);
}

double mse_loss_cpu(const Tensor& pred, const Tensor& target, Tensor* d_pred, float grad_scale) {
  const std::int64_t n = pred.numel();
  const float* pred_data = pred.f32();
  const float* target_data = target.f32();
  float* d_data = d_pred != nullptr ? d_pred->f32() : nullptr;
  const float grad_coef = static_cast<float>(static_cast<double>(grad_scale) / static_cast<double>(n));
  const double total = chunked_sum(n, [=](std::int64_t begin, std::int64_t end) {
    double chunk_sum = 0.0;
    for (std::int64_t i = begin; i < end; ++i) {
      const double diff = static_cast<double>(pred_data[i]) - target_data[i];
      chunk_sum += diff * diff;
      if (d_data != nullptr) d_data[i] = grad_coef * (pred_data[i] - target_data[i]);
    }
    return chunk_sum;
  });
  return 0.5 * total / static_cast<double>(n);
}

}  // namespace

double softmax_cross_entropy(const Tensor& logits, const Tensor& targets, Tensor* d_logits, float grad_scale) {
  const char* op = "softmax_cross_entropy";
  PROPLAB_CHECK(logits.defined() && logits.ndim() >= 1, "op '", op, "': logits must be [..., V]");
  expect_shape(op, "logits", logits, logits.shape());
  const Shape row_shape(logits.shape().begin(), logits.shape().end() - 1);
  const std::int64_t classes = logits.dim(-1);
  PROPLAB_CHECK(classes > 0 && shape_numel(row_shape) > 0, "op '", op, "': empty logits ",
                shape_string(logits.shape()));
  expect_shape(op, "targets", targets, row_shape, DType::i32);
  if (d_logits != nullptr) expect_shape(op, "d_logits", *d_logits, logits.shape());
  const Device device = common_device(op, {&logits, &targets, d_logits});
  if (device == Device::cuda) {
#ifdef PROPLAB_WITH_CUDA
    // The same check as below, on the device, before anything is written.
    const std::int64_t rows = targets.numel();
    const kernels::IdOutside bad = kernels::first_id_outside(targets.i32(), rows, 0, classes);
    PROPLAB_CHECK(bad.index == rows, "op '", op, "': target ", bad.value, " at row ", bad.index, " is outside [0, ",
                  classes, ")");
    const double grad_coef = static_cast<double>(grad_scale) / static_cast<double>(rows);
    const double total = kernels::softmax_cross_entropy_sum(logits.f32(), targets.i32(), rows, classes,
                                                            d_logits != nullptr ? d_logits->f32() : nullptr, grad_coef);
    return total / static_cast<double>(rows);
#else
    missing_device_impl(op, device);
#endif
  }
  // Checked before the parallel loop: an out-of-range label would read outside its row.
  const std::int32_t* target_data = targets.i32();
  for (std::int64_t r = 0, rows = targets.numel(); r < rows; ++r)
    PROPLAB_CHECK(target_data[r] >= 0 && target_data[r] < classes, "op '", op, "': target ", target_data[r], " at row ",
                  r, " is outside [0, ", classes, ")");
  return softmax_cross_entropy_cpu(logits, targets, d_logits, grad_scale);
}

double mse_loss(const Tensor& pred, const Tensor& target, Tensor* d_pred, float grad_scale) {
  const char* op = "mse_loss";
  PROPLAB_CHECK(pred.defined(), "op '", op, "': pred is undefined");
  expect_shape(op, "pred", pred, pred.shape());
  PROPLAB_CHECK(pred.numel() > 0, "op '", op, "': empty pred");
  expect_shape(op, "target", target, pred.shape());
  if (d_pred != nullptr) expect_shape(op, "d_pred", *d_pred, pred.shape());
  const Device device = common_device(op, {&pred, &target, d_pred});
  if (device == Device::cuda) {
#ifdef PROPLAB_WITH_CUDA
    const std::int64_t n = pred.numel();
    const float grad_coef = static_cast<float>(static_cast<double>(grad_scale) / static_cast<double>(n));
    const double total =
        kernels::squared_error_sum(pred.f32(), target.f32(), n, d_pred != nullptr ? d_pred->f32() : nullptr, grad_coef);
    return 0.5 * total / static_cast<double>(n);
#else
    missing_device_impl(op, device);
#endif
  }
  return mse_loss_cpu(pred, target, d_pred, grad_scale);
}

}  // namespace proplab::ops
