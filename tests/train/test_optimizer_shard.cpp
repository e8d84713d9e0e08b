// train/optimizer with a ParameterShard (ZeRO-1): replicas that each update their own slice of the flattened
// parameters, from the same gradients, together produce exactly the whole-model update, and keep state only for
// their slice.
#include <gtest/gtest.h>

#include <cstring>

#include "core/rng.h"
#include "train/optimizer.h"

namespace proplab {
namespace {

// Three tensors (12 + 5 + 8 = 25 elements) with values and gradients from the counter-based RNG.
void fill(ParameterStore& store, std::uint64_t seed) {
  store.add("a.weight", {3, 4}, ParamRole::ffn_in, 4, 3);
  store.add("b.bias", {5}, ParamRole::bias, 1, 5);
  store.add("c.weight", {2, 4}, ParamRole::ffn_out, 4, 2);
  std::uint64_t stream = 0;
  for (auto& p : store.all()) {
    p->grad = Tensor::zeros(p->value.shape());
    const CounterRng rng(seed, ++stream);
    for (std::int64_t i = 0; i < p->value.numel(); ++i) p->value.f32()[i] = rng.normal(2 * i);
  }
  store.all()[1]->weight_decay = false;
}

void set_grads(ParameterStore& store, int step) {
  std::uint64_t stream = 100;
  for (auto& p : store.all()) {
    const CounterRng rng(static_cast<std::uint64_t>(step), ++stream);
    for (std::int64_t i = 0; i < p->grad.numel(); ++i) p->grad.f32()[i] = rng.normal(i);
  }
}

std::vector<float> flat_values(ParameterStore& store) {
  std::vector<float> out;
  for (auto& p : store.all()) out.insert(out.end(), p->value.f32(), p->value.f32() + p->value.numel());
  return out;
}

void check_shards_match_whole(OptimizerKind kind) {
  TrainConfig config;
  config.optimizer = kind;
  config.weight_decay = 0.1;
  ParameterStore whole, left, right;
  fill(whole, 7);
  fill(left, 7);
  fill(right, 7);
  // The boundary 14 cuts b.bias (elements 12..16) in two.
  Optimizer full(config, whole);
  Optimizer first(config, left, ParameterShard{0, 14});
  Optimizer second(config, right, ParameterShard{14, -1});
  for (int step = 1; step <= 3; ++step) {
    set_grads(whole, step);
    set_grads(left, step);
    set_grads(right, step);
    full.step(1e-2);
    first.step(1e-2);
    second.step(1e-2);
  }
  const std::vector<float> expected = flat_values(whole), a = flat_values(left), b = flat_values(right);
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const float got = i < 14 ? a[i] : b[i];
    ASSERT_EQ(std::memcmp(&got, &expected[i], sizeof(float)), 0) << "element " << i;
    // Outside its slice a shard leaves the values alone (the all-gather brings them).
    ASSERT_NE(i < 14 ? b[i] : a[i], expected[i]) << "element " << i;
  }
  // State only for the slice: a.weight whole (its shape kept), b.bias split 2 + 3 as flat pieces, c.weight absent.
  const auto state = first.state();
  const std::size_t kinds = kind == OptimizerKind::adamw ? 2 : 1;
  ASSERT_EQ(state.size(), 3 * kinds);
  EXPECT_EQ(state[0].second->shape(), (Shape{3, 4}));
  EXPECT_EQ(state[kinds].second->shape(), (Shape{2}));
  EXPECT_FALSE(state[2 * kinds].second->defined());
  EXPECT_EQ(second.state()[kinds].second->shape(), (Shape{3}));
  EXPECT_EQ(second.pieces()[1].offset, 2);
  EXPECT_EQ(second.pieces()[1].length, 3);
  EXPECT_EQ(second.pieces()[0].length, 0);
}

TEST(OptimizerShard, SlicesOfAdamWMatchTheWholeUpdateBitwise) { check_shards_match_whole(OptimizerKind::adamw); }

TEST(OptimizerShard, SlicesOfSgdMomentumMatchTheWholeUpdateBitwise) { check_shards_match_whole(OptimizerKind::sgd); }

}  // namespace
}  // namespace proplab
