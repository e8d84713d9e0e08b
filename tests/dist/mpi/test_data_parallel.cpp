// The data-parallel gradient exchange (train/data_parallel.h) under mpirun (2 and 4 ranks, one data-parallel group
// over the world): the allreduce mode sums every gradient, or — for a pipeline stage — only the gradients of the
// parameters it updates, leaving the others as they are; in every bucketing (one all-reduce per tensor, one bucket
// per parameter, one bucket for all) the sums are exact and the bytes handed to the all-reduces are 4 bytes per
// exchanged element, no more. Each rank runs every test; a failure on any rank fails the run.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dist/communicator.h"
#include "mpi_test_main.h"
#include "train/data_parallel.h"

namespace proplab {
namespace {

// Parameters of several sizes, like a stage's: an embedding, block weights and biases, a final norm.
void add_parameters(ParameterStore& store) {
  store.add("embed.token.weight", {8, 4}, ParamRole::token_embedding, 8, 4);
  store.add("blocks.0.attn.qkv.weight", {12, 4}, ParamRole::attn_qkv, 4, 12, 0);
  store.add("blocks.0.attn.qkv.bias", {12}, ParamRole::bias, 4, 12, 0);
  store.add("blocks.1.ffn.fc.weight", {16, 4}, ParamRole::ffn_in, 4, 16, 1);
  store.add("final_norm.gain", {4}, ParamRole::norm_gain, 4, 4);
}

// A value that differs per rank, parameter and element, and whose sums over ranks are exact in float.
float local_value(int rank, std::size_t parameter, std::int64_t element) {
  return static_cast<float>((rank + 1) * 0.25 + static_cast<double>(parameter) * 8.0 + static_cast<double>(element));
}

void fill_gradients(ParameterStore& store, int rank) {
  for (std::size_t i = 0; i < store.all().size(); ++i) {
    Tensor& grad = store.all()[i]->grad;
    for (std::int64_t e = 0; e < grad.numel(); ++e) grad.f32()[e] = local_value(rank, i, e);
  }
}

struct Case {
  std::string name;
  double bucket_mb;
};

TEST(DataParallelExchange, SumsOnlyTheExchangedGradientsAndSendsOnlyTheirBytes) {
  auto world = dist::make_mpi_world(60.0);
  const int ranks = world->size(), rank = world->rank();
  // A last pipeline stage: the tied embedding copy (parameter 0), its block's FFN and the final norm.
  const std::vector<std::vector<bool>> exchanges = {
      {}, {true, false, false, true, true}, {false, true, true, false, false}};
  const std::vector<Case> cases = {
      {"one all-reduce per tensor", 0.0}, {"a bucket per parameter", 1e-6}, {"one bucket", 1.0}};
  for (const std::vector<bool>& exchanged : exchanges) {
    for (const Case& c : cases) {
      SCOPED_TRACE(c.name + (exchanged.empty() ? ", every parameter" : ", a stage's parameters"));
      ParameterStore store;
      add_parameters(store);
      ParallelConfig config;
      config.dp = ranks;
      config.bucket_mb = c.bucket_mb;
      DataParallel exchange(config, world.get(), store, exchanged);
      fill_gradients(store, rank);
      const std::int64_t before = world->bytes_communicated(dist::Traffic::all_reduce);
      exchange.finish_gradients();
      const std::int64_t sent = world->bytes_communicated(dist::Traffic::all_reduce) - before;
      std::int64_t expected_bytes = 0;
      for (std::size_t i = 0; i < store.all().size(); ++i) {
        const bool summed = exchanged.empty() || exchanged[i];
        const Tensor& grad = store.all()[i]->grad;
        if (summed) expected_bytes += 4 * grad.numel();
        for (std::int64_t e = 0; e < grad.numel(); ++e) {
          float want = local_value(rank, i, e);
          if (summed) {
            want = 0.0f;
            for (int r = 0; r < ranks; ++r) want += local_value(r, i, e);
          }
          ASSERT_EQ(grad.f32()[e], want) << store.all()[i]->name << "[" << e << "]";
        }
      }
      EXPECT_EQ(sent, expected_bytes);
    }
  }
}

}  // namespace
}  // namespace proplab

int main(int argc, char** argv) { return proplab::testing::run_mpi_tests(argc, argv); }
