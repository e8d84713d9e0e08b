// The optimizers' optional update measurement (recording's weight_rms and update_ratio) against a direct
// computation from copies of the tensor before and after, and its independence from the thread count.
#include <gtest/gtest.h>

#include <cstring>

#include "core/parallel.h"
#include "ops/ops.h"
#include "support/gradcheck.h"

namespace proplab {

namespace {

void expect_norms_match(const std::vector<float>& before, const Tensor& after, const ops::UpdateNorms& norms) {
  const std::vector<float> now = after.to_vector();
  double w = 0, u = 0;
  for (std::size_t i = 0; i < now.size(); ++i) {
    w += static_cast<double>(before[i]) * before[i];
    const double d = static_cast<double>(now[i]) - before[i];
    u += d * d;
  }
  EXPECT_NEAR(norms.weight_sq, w, 1e-12 * w);
  EXPECT_NEAR(norms.update_sq, u, 1e-12 * u);
  EXPECT_GT(norms.update_sq, 0.0);
}

}  // namespace

TEST(UpdateNorms, AdamWAndSgdMeasureTheirOwnUpdate) {
  const Shape shape{70001};  // several blocks and a ragged tail
  for (int optimizer = 0; optimizer < 2; ++optimizer) {
    Tensor param = testing::random_tensor(shape, 1), grad = testing::random_tensor(shape, 2);
    Tensor m = Tensor::zeros(shape), v = Tensor::zeros(shape);
    Tensor plain = param.clone(), plain_m = Tensor::zeros(shape), plain_v = Tensor::zeros(shape);
    const std::vector<float> before = param.to_vector();
    ops::UpdateNorms norms;
    if (optimizer == 0) {
      ops::AdamWHyper h;
      h.weight_decay = 0.1f;
      ops::adamw_update(param, grad, m, v, h, &norms);
      ops::adamw_update(plain, grad, plain_m, plain_v, h);
    } else {
      ops::SgdHyper h;
      ops::sgd_update(param, grad, m, h, &norms);
      ops::sgd_update(plain, grad, plain_m, h);
    }
    expect_norms_match(before, param, norms);
    EXPECT_EQ(param.to_vector(), plain.to_vector()) << "measuring must not change the update";
  }
}

TEST(UpdateNorms, BitwiseIndependentOfThreads) {
  const Shape shape{100003};
  ops::UpdateNorms one, two;
  for (int threads : {1, 2}) {
    set_threads(threads);
    Tensor param = testing::random_tensor(shape, 3), grad = testing::random_tensor(shape, 4);
    Tensor m = Tensor::zeros(shape), v = Tensor::zeros(shape);
    ops::adamw_update(param, grad, m, v, ops::AdamWHyper{}, threads == 1 ? &one : &two);
  }
  set_threads(0);
  EXPECT_EQ(std::memcmp(&one, &two, sizeof(one)), 0);
}

// The _each forms against one call per tensor: tensors of one block, of a ragged tail and of many blocks (together
// past the parallel threshold, alone partly below it), some measured and some not, AdamW and SGD (with momentum,
// Nesterov, and without momentum and buffer): parameters, optimizer state and norms bitwise the same, on 1 and 2
// threads.
TEST(UpdateNorms, EachFormIsBitwiseOneCallPerTensor) {
  const std::vector<Shape> shapes{{64}, {4097}, {70001}, {16, 16, 3, 3}, {5}};
  for (int kind = 0; kind < 3; ++kind) {
    for (int threads : {1, 2}) {
      set_threads(threads);
      std::vector<Tensor> each_p, each_g, each_m, each_v, one_p, one_m, one_v;
      std::vector<ops::UpdateNorms> each_n(shapes.size()), one_n(shapes.size());
      for (std::size_t i = 0; i < shapes.size(); ++i) {
        each_p.push_back(testing::random_tensor(shapes[i], 10 + i));
        each_g.push_back(testing::random_tensor(shapes[i], 20 + i));
        each_m.push_back(testing::random_tensor(shapes[i], 30 + i));
        each_v.push_back(Tensor::zeros(shapes[i]));
        one_p.push_back(each_p.back().clone());
        one_m.push_back(each_m.back().clone());
        one_v.push_back(each_v.back().clone());
      }
      if (kind == 0) {
        std::vector<ops::AdamWStep> steps;
        for (std::size_t i = 0; i < shapes.size(); ++i) {
          ops::AdamWHyper h;
          h.lr = 1e-3f * static_cast<float>(i + 1);
          h.weight_decay = i % 2 ? 0.1f : 0.0f;
          h.step = 3;
          ops::UpdateNorms* norms = i % 2 ? nullptr : &one_n[i];
          ops::adamw_update(one_p[i], each_g[i], one_m[i], one_v[i], h, norms);
          steps.push_back({&each_p[i], &each_g[i], &each_m[i], &each_v[i], h, i % 2 ? nullptr : &each_n[i]});
        }
        ops::adamw_update_each(steps);
      } else {
        std::vector<ops::SgdStep> steps;
        std::vector<Tensor> no_buffer(shapes.size());
        for (std::size_t i = 0; i < shapes.size(); ++i) {
          ops::SgdHyper h;
          h.lr = 1e-2f * static_cast<float>(i + 1);
          h.momentum = kind == 1 ? 0.9f : 0.0f;
          h.nesterov = kind == 1 && i % 2 == 0;
          h.weight_decay = 5e-4f;
          ops::UpdateNorms* norms = i % 2 ? nullptr : &one_n[i];
          ops::sgd_update(one_p[i], each_g[i], kind == 1 ? one_m[i] : no_buffer[i], h, norms);
          steps.push_back(
              {&each_p[i], &each_g[i], kind == 1 ? &each_m[i] : &no_buffer[i], h, i % 2 ? nullptr : &each_n[i]});
        }
        ops::sgd_update_each(steps);
      }
      for (std::size_t i = 0; i < shapes.size(); ++i) {
        const std::string what = "kind " + std::to_string(kind) + ", tensor " + std::to_string(i) + ", " +
                                 std::to_string(threads) + " threads";
        EXPECT_EQ(each_p[i].to_vector(), one_p[i].to_vector()) << what;
        EXPECT_EQ(each_m[i].to_vector(), one_m[i].to_vector()) << what;
        EXPECT_EQ(each_v[i].to_vector(), one_v[i].to_vector()) << what;
        EXPECT_EQ(std::memcmp(&each_n[i], &one_n[i], sizeof(ops::UpdateNorms)), 0) << what;
        if (i % 2 == 0) {
          EXPECT_GT(each_n[i].update_sq, 0.0) << what;
        }
      }
    }
  }
  set_threads(0);
}

}  // namespace proplab
