// CUDA-vs-CPU comparison of the losses (kernels/loss.cu against the CPU reference in src/ops/loss.cpp), through
// the ops entry points. Skipped at run time when no GPU is present.
//
// Tolerances: cross-entropy differs from the CPU only by exp (expf against the CPU's polynomial, ~1 ulp each) and
// the order of the per-row sums of exp: relative errors ~1e-7 in each row's Σ exp, so 1e-6 relative on the mean
// loss and 1e-5 relative (plus 1e-5 of grad_coef, for the target entry's cancellation) on d_logits. Squared error
// forms the same double terms and sums them in the CPU's chunks and order: 1e-12 relative on the loss (bitwise
// unless a compiler fuses the CPU's multiply-add), and d_pred is the same float expression: bitwise.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "kernels/cuda_compare.h"
#include "ops/ops.h"
#include "support/gradcheck.h"

namespace proplab {
namespace {

using testing::expect_close;
using testing::random_ids;
using testing::random_tensor;
using testing::to_cuda;

// rows × classes: one row, one class, odd sizes, rows longer than a 256-thread block, more rows than a chunk of 8,
// a language-model-like vocabulary.
const std::vector<std::pair<std::int64_t, std::int64_t>> kCrossEntropyShapes = {
    {1, 1}, {1, 7}, {3, 10}, {9, 257}, {64, 1000}, {37, 4099}, {130, 50257}};

TEST(LossCuda, CrossEntropyMatchesCpu) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 100;
  for (const auto& [rows, classes] : kCrossEntropyShapes) {
    for (const float grad_scale : {1.0f, 0.37f}) {
      SCOPED_TRACE("rows=" + std::to_string(rows) + " classes=" + std::to_string(classes) +
                   " grad_scale=" + std::to_string(grad_scale));
      const Tensor logits = random_tensor({rows, classes}, seed++, 3.0, 0.5);
      const Tensor targets = random_ids({rows}, seed++, 0, classes);
      Tensor d_cpu = Tensor::empty(logits.shape());
      const double loss_cpu = ops::softmax_cross_entropy(logits, targets, &d_cpu, grad_scale);

      const Tensor logits_cuda = to_cuda(logits), targets_cuda = to_cuda(targets);
      Tensor d_cuda = Tensor::empty(logits.shape(), DType::f32, Device::cuda);
      const double loss_cuda = ops::softmax_cross_entropy(logits_cuda, targets_cuda, &d_cuda, grad_scale);
      testing::expect_close_scalar(loss_cuda, loss_cpu, 1e-6, "loss");
      const double grad_coef = double(grad_scale) / double(rows);
      expect_close(d_cuda.to(Device::cpu).to_vector(), d_cpu.to_vector(), 1e-5, 1e-5 * grad_coef, "d_logits");

      // Without the gradient: the same loss, bitwise (the row losses do not depend on d_logits).
      const double loss_only = ops::softmax_cross_entropy(logits_cuda, targets_cuda, nullptr, grad_scale);
      EXPECT_EQ(loss_only, loss_cuda);
    }
  }
}

TEST(LossCuda, CrossEntropyLeadingDimsAndInPlaceGradient) {
  SKIP_WITHOUT_GPU();
  const Tensor logits = random_tensor({3, 5, 301}, 7, 2.0);
  const Tensor targets = random_ids({3, 5}, 8, 0, 301);
  Tensor d_cpu = Tensor::empty(logits.shape());
  const double loss_cpu = ops::softmax_cross_entropy(logits, targets, &d_cpu, 2.0f);
  // d_logits aliasing logits (allowed: each row's target logit is read before the row is written).
  Tensor in_place = to_cuda(logits);
  const double loss_cuda = ops::softmax_cross_entropy(in_place, to_cuda(targets), &in_place, 2.0f);
  testing::expect_close_scalar(loss_cuda, loss_cpu, 1e-6, "loss (in place)");
  expect_close(in_place.to(Device::cpu).to_vector(), d_cpu.to_vector(), 1e-5, 1e-5 * 2.0 / 15.0, "d_logits in place");
}

TEST(LossCuda, CrossEntropyRejectsOutOfRangeTargetsWithoutWriting) {
  SKIP_WITHOUT_GPU();
  const Tensor logits = to_cuda(random_tensor({4, 6}, 9));
  Tensor targets = random_ids({4}, 10, 0, 6);
  targets.i32()[2] = 6;
  Tensor d = to_cuda(Tensor::zeros({4, 6}));
  EXPECT_THROW(ops::softmax_cross_entropy(logits, to_cuda(targets), &d, 1.0f), InternalError);
  for (float v : d.to(Device::cpu).to_vector()) EXPECT_EQ(v, 0.0f);
  targets.i32()[2] = -1;
  EXPECT_THROW(ops::softmax_cross_entropy(logits, to_cuda(targets), &d, 1.0f), InternalError);
}

// Element counts: one, odd, one chunk of 4096 exactly and one more, several chunks, more than one grid pass.
const std::vector<Shape> kSquaredErrorShapes = {{1}, {3, 7}, {4096}, {4097}, {64, 1000}, {3, 300'007}};

TEST(LossCuda, MseMatchesCpu) {
  SKIP_WITHOUT_GPU();
  std::uint64_t seed = 200;
  for (const Shape& shape : kSquaredErrorShapes) {
    SCOPED_TRACE("shape " + shape_string(shape));
    const Tensor pred = random_tensor(shape, seed++);
    const Tensor target = random_tensor(shape, seed++, 0.5, 0.2);
    Tensor d_cpu = Tensor::empty(shape);
    const double loss_cpu = ops::mse_loss(pred, target, &d_cpu, 0.8f);

    const Tensor pred_cuda = to_cuda(pred), target_cuda = to_cuda(target);
    Tensor d_cuda = Tensor::empty(shape, DType::f32, Device::cuda);
    const double loss_cuda = ops::mse_loss(pred_cuda, target_cuda, &d_cuda, 0.8f);
    testing::expect_close_scalar(loss_cuda, loss_cpu, 1e-12, "loss");
    testing::expect_bitwise(d_cuda.to(Device::cpu).to_vector(), d_cpu.to_vector(), "d_pred");
    EXPECT_EQ(ops::mse_loss(pred_cuda, target_cuda, nullptr, 0.8f), loss_cuda);

    // d_pred aliasing pred.
    Tensor in_place = to_cuda(pred);
    EXPECT_EQ(ops::mse_loss(in_place, target_cuda, &in_place, 0.8f), loss_cuda);
    testing::expect_bitwise(in_place.to(Device::cpu).to_vector(), d_cpu.to_vector(), "d_pred in place");
  }
}

TEST(LossCuda, BitwiseRepeatable) {
  SKIP_WITHOUT_GPU();
  const Tensor logits = to_cuda(random_tensor({257, 3001}, 300, 2.0));
  const Tensor targets = to_cuda(random_ids({257}, 301, 0, 3001));
  const Tensor pred = to_cuda(random_tensor({5, 100'003}, 302));
  const Tensor target = to_cuda(random_tensor({5, 100'003}, 303));
  Tensor d_first = Tensor::empty(logits.shape(), DType::f32, Device::cuda);
  const double ce_first = ops::softmax_cross_entropy(logits, targets, &d_first, 1.0f);
  const double mse_first = ops::mse_loss(pred, target, nullptr);
  for (int run = 0; run < 2; ++run) {
    Tensor d = Tensor::empty(logits.shape(), DType::f32, Device::cuda);
    EXPECT_EQ(ops::softmax_cross_entropy(logits, targets, &d, 1.0f), ce_first);
    testing::expect_bitwise(d.to(Device::cpu).to_vector(), d_first.to(Device::cpu).to_vector(), "d_logits");
    EXPECT_EQ(ops::mse_loss(pred, target, nullptr), mse_first);
  }
}

}  // namespace
}  // namespace proplab
