// Tensor parallelism under mpirun (2 and 4 ranks, one tensor-parallel group over the world), in the manner of
// Megatron-LM's tests: the split transformer and the unsplit one are built from the same seed on every rank;
// every piece equals the unsplit parameter's piece bitwise; after one forward/backward the loss equals the unsplit
// loss, split gradients equal the pieces of the unsplit gradients, and the gradients of replicated parameters
// (norms, biases of the row-parallel outputs, the position embedding, residual scalars) are bitwise identical on
// every rank and equal the unsplit ones; the split model run as two pipeline stages equals the split model (tp × pp).
// Each rank runs every test; a failure on any rank fails the run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "dist/communicator.h"
#include "mpi_test_main.h"
#include "models/transformer.h"
#include "support/model_testing.h"

namespace proplab {
namespace {

TransformerConfig small_config() {
  TransformerConfig c;
  c.layers = 2;
  c.width = 32;
  c.heads = 4;
  c.vocab = 32;
  c.seq_len = 8;
  return c;
}

struct Variant {
  std::string name;
  TransformerConfig config;
  bool training = false;  // dropout on
};

std::vector<Variant> variants() {
  std::vector<Variant> out;
  out.push_back({"pre, tied", small_config()});
  Variant post{"post, untied, rmsnorm", small_config()};
  post.config.norm = NormPlacement::post;
  post.config.norm_kind = NormKind::rmsnorm;
  post.config.tie_embeddings = false;
  out.push_back(post);
  Variant dropout{"pre, dropout", small_config(), true};
  dropout.config.dropout = 0.2f;
  out.push_back(dropout);
  Variant both{"both norms, untied", small_config()};
  both.config.norm = NormPlacement::both;
  both.config.tie_embeddings = false;
  out.push_back(both);
  Variant none{"no norm, no bias", small_config()};
  none.config.norm = NormPlacement::none;
  none.config.bias = false;
  out.push_back(none);
  return out;
}

Parameter& find(ParameterStore& store, const std::string& name) {
  Parameter* p = store.find(name);
  EXPECT_NE(p, nullptr) << name;
  return *p;
}

TEST(TensorParallelTransformer, PiecesInitialiseToTheUnsplitModel) {
  auto world = dist::make_mpi_world(60.0);
  for (const Variant& v : variants()) {
    SCOPED_TRACE(v.name);
    Transformer full(v.config, ScalingConfig{}, 5);
    Transformer split(v.config, ScalingConfig{}, 5, TensorParallel(world.get()));
    ASSERT_EQ(split.params().all().size(), full.params().all().size());
    EXPECT_EQ(split.params().count_full_elements(), full.params().count_elements());
    for (auto& p : split.params().all()) {
      SCOPED_TRACE(p->name);
      Parameter& q = find(full.params(), p->name);
      if (!p->shard.split()) {
        EXPECT_EQ(p->value.to_vector(), q.value.to_vector());
        continue;
      }
      Tensor expected = Tensor::empty(p->value.shape());
      copy_shard_from_full(p->shard, q.value, expected);
      EXPECT_EQ(p->value.to_vector(), expected.to_vector());
    }
  }
}

TEST(TensorParallelTransformer, LossAndGradientsMatchOneProcess) {
  auto world = dist::make_mpi_world(60.0);
  const int ranks = world->size();
  for (const Variant& v : variants()) {
    SCOPED_TRACE(v.name);
    Transformer full(v.config, ScalingConfig{}, 7);
    Transformer split(v.config, ScalingConfig{}, 7, TensorParallel(world.get()));
    const Batch batch = testing::token_batch(3, v.config.seq_len, v.config.vocab, 11);
    StepContext context;
    context.seed = 7;
    context.micro_step = 2;
    context.training = v.training;
    full.params().zero_grads();
    split.params().zero_grads();
    const double full_loss = full.forward_backward(batch, 0.5f, context);
    const std::int64_t bytes_before = world->bytes_communicated();
    const double split_loss = split.forward_backward(batch, 0.5f, context);
    EXPECT_NEAR(split_loss, full_loss, 1e-6 * std::abs(full_loss));
    // The payload docs/distributed.md states: an [R, D] f32 all-reduce for the embedding, each sublayer's g and f
    // and the head's f, and 3 doubles per row for the cross-entropy.
    const std::int64_t rows = 3 * v.config.seq_len, width = v.config.width;
    EXPECT_EQ(world->bytes_communicated() - bytes_before, 4 * rows * width * (2 + 4 * v.config.layers) + 8 * 3 * rows);
    for (auto& p : split.params().all()) {
      SCOPED_TRACE(p->name);
      Parameter& q = find(full.params(), p->name);
      Tensor expected = Tensor::empty(p->grad.shape());
      if (p->shard.split())
        copy_shard_from_full(p->shard, q.grad, expected);
      else
        expected = q.grad;
      const std::vector<float> got = p->grad.to_vector(), want = expected.to_vector();
      float scale = 0.0f;
      for (float x : want) scale = std::max(scale, std::abs(x));
      for (std::size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-5f * scale + 1e-9f) << i;
      if (p->shard.split()) continue;
      // Replicated: the same bits on every rank.
      std::vector<float> all(static_cast<std::size_t>(ranks) * got.size());
      world->all_gather(got.data(), all.data(), static_cast<std::int64_t>(got.size()));
      for (int r = 1; r < ranks; ++r)
        ASSERT_TRUE(std::equal(got.begin(), got.end(), all.begin() + static_cast<std::ptrdiff_t>(r * got.size())))
            << "rank " << r << " differs from rank " << world->rank();
    }
  }
}

// tp × pp: the split model run as two pipeline stages (blocks [0, 1) with the embedding, [1, 2) with the head and
// loss; both in this process, the activation handed from one to the other as the pipeline sends it) computes what
// the split model computes: the same loss and, summing the tied embedding's two copies, the same gradients.
TEST(TensorParallelTransformer, SplitStagesMatchTheSplitModel) {
  auto world = dist::make_mpi_world(60.0);
  for (const Variant& v : variants()) {
    SCOPED_TRACE(v.name);
    Transformer whole(v.config, ScalingConfig{}, 7, TensorParallel(world.get()));
    Transformer first(v.config, ScalingConfig{}, 7, TensorParallel(world.get()));
    Transformer last(v.config, ScalingConfig{}, 7, TensorParallel(world.get()));
    first.set_stage(0, 1, 1);
    last.set_stage(1, 2, 1);
    const Batch batch = testing::token_batch(3, v.config.seq_len, v.config.vocab, 11);
    StepContext context;
    context.seed = 7;
    context.micro_step = 2;
    context.training = v.training;
    for (Transformer* m : {&whole, &first, &last}) m->params().zero_grads();
    const double whole_loss = whole.forward_backward(batch, 0.5f, context);
    Tensor boundary, boundary_grad, unused;
    first.stage_forward(0, batch, Tensor(), boundary, 0.5f, context);
    const double stage_loss = last.stage_forward(0, batch, boundary, unused, 0.5f, context);
    last.stage_backward(0, batch, Tensor(), boundary_grad, context);
    first.stage_backward(0, batch, boundary_grad, unused, context);
    EXPECT_EQ(stage_loss, whole_loss);
    for (auto& p : whole.params().all()) {
      SCOPED_TRACE(p->name);
      const bool on_first = p->name.rfind("embed.", 0) == 0 || p->name.rfind("blocks.0.", 0) == 0;
      std::vector<float> got = (on_first ? first : last).params().find(p->name)->grad.to_vector();
      if (p->name == "embed.token.weight" && v.config.tie_embeddings) {  // the head's copy on the last stage
        const std::vector<float> head = last.params().find(p->name)->grad.to_vector();
        for (std::size_t i = 0; i < got.size(); ++i) got[i] += head[i];
      }
      const std::vector<float> want = p->grad.to_vector();
      float scale = 0.0f;
      for (float x : want) scale = std::max(scale, std::abs(x));
      ASSERT_EQ(got.size(), want.size());
      for (std::size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-6f * scale + 1e-12f) << i;
    }
  }
}

TEST(TensorParallelTransformer, EvaluateMatchesOneProcess) {
  auto world = dist::make_mpi_world(60.0);
  const TransformerConfig config = small_config();
  Transformer full(config, ScalingConfig{}, 9);
  Transformer split(config, ScalingConfig{}, 9, TensorParallel(world.get()));
  const Batch batch = testing::token_batch(2, config.seq_len, config.vocab, 13);
  const double full_loss = full.evaluate(batch);
  EXPECT_NEAR(split.evaluate(batch), full_loss, 1e-6 * full_loss);
}

}  // namespace
}  // namespace proplab

int main(int argc, char** argv) { return proplab::testing::run_mpi_tests(argc, argv); }
