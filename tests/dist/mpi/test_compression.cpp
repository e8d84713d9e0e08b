// The compressed data-parallel gradient exchange (train/compression.h) under mpirun (2 and 4 ranks, one
// data-parallel group over the world): the bytes handed to the collectives are exactly the documented formulas;
// bf16 and int8 sums are the rank-ordered sums of each rank's payload as decoded here independently; with error
// feedback (topk, powersgd) the exchanged sums plus the replicas' residuals equal the true gradients' sum over
// steps; the recorded error and residual match a direct computation; every replica ends with bitwise the same
// sums, and a repeated exchange gives bitwise the same; bad combinations are refused naming the keys.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "dist/communicator.h"
#include "mpi_test_main.h"
#include "train/compression.h"
#include "train/data_parallel.h"

namespace proplab {
namespace {

// Matrices and vectors of several sizes; one spans several int8 blocks with a ragged last one.
void add_parameters(ParameterStore& store) {
  store.add("embed.token.weight", {8, 6}, ParamRole::token_embedding, 8, 6);
  store.add("blocks.0.attn.qkv.weight", {12, 5}, ParamRole::attn_qkv, 5, 12, 0);
  store.add("blocks.0.attn.qkv.bias", {13}, ParamRole::bias, 5, 12, 0);
  store.add("blocks.0.ffn.fc.weight", {40, 70}, ParamRole::ffn_in, 70, 40, 0);
  store.add("final_norm.gain", {7}, ParamRole::norm_gain, 7, 7);
}

// Rank r's gradient share at `step`: a pure function of (rank, step, parameter, element), so every rank can
// compute every other rank's. Scales differ per parameter, so int8's blocks and topk's choice are not trivial.
float share(int rank, int step, std::size_t parameter, std::int64_t element) {
  const CounterRng rng(17, stream_id("share", static_cast<std::uint64_t>(rank), static_cast<std::uint64_t>(step)));
  const double scale = std::pow(10.0, static_cast<double>(parameter % 3) - 1.0);
  return static_cast<float>(scale * rng.normal(parameter * 100000 + static_cast<std::uint64_t>(element)));
}

void fill(ParameterStore& store, int rank, int step) {
  for (std::size_t i = 0; i < store.all().size(); ++i) {
    Tensor& grad = store.all()[i]->grad;
    for (std::int64_t e = 0; e < grad.numel(); ++e) grad.f32()[e] = share(rank, step, i, e);
  }
}

ParallelConfig config_for(const std::string& scheme, int ranks) {
  ParallelConfig config;
  config.dp = ranks;
  config.compress = scheme;
  config.compress_ratio = 0.07;
  config.compress_rank = 3;
  return config;
}

// bfloat16 rounding written another way: 8 significant bits, nearest with ties to even.
float bf16_round(float x) {
  if (x == 0.0f || !std::isfinite(x)) return x;
  int exponent = 0;
  const double mantissa = std::frexp(static_cast<double>(x), &exponent);  // in [0.5, 1)
  return static_cast<float>(std::ldexp(std::nearbyint(std::ldexp(mantissa, 8)), exponent - 8));
}

// What int8 sends for `x` (n elements), decoded: per block of kInt8Block a scale max|x|/127.
std::vector<float> int8_round(const float* x, std::int64_t n) {
  std::vector<float> out(static_cast<std::size_t>(n));
  for (std::int64_t begin = 0; begin < n; begin += kInt8Block) {
    const std::int64_t end = std::min(n, begin + kInt8Block);
    float largest = 0.0f;
    for (std::int64_t e = begin; e < end; ++e) largest = std::max(largest, std::fabs(x[e]));
    const float scale = largest / 127.0f;
    for (std::int64_t e = begin; e < end; ++e)
      out[e] = scale > 0.0f ? static_cast<float>(std::nearbyint(x[e] / scale)) * scale : 0.0f;
  }
  return out;
}

// Every rank's gradients bitwise equal to rank 0's.
void expect_same_on_every_rank(dist::Communicator& world, ParameterStore& store) {
  for (auto& p : store.all()) {
    std::vector<float> mine(p->grad.f32(), p->grad.f32() + p->grad.numel());
    std::vector<float> all(mine.size() * static_cast<std::size_t>(world.size()));
    world.all_gather(mine.data(), all.data(), static_cast<std::int64_t>(mine.size()));
    for (int r = 0; r < world.size(); ++r)
      ASSERT_TRUE(std::equal(mine.begin(), mine.end(), all.begin() + r * static_cast<std::ptrdiff_t>(mine.size())))
          << p->name << " differs on rank " << r;
  }
}

TEST(Compression, BytesAreTheDocumentedFormulas) {
  // By hand: bf16 [12, 5] 4·30; int8 [3000] 4·3 + 4·750; topk 7% of 60 is 4.2 -> 5 pairs; powersgd r = 3.
  EXPECT_EQ(compressed_bytes(config_for("bf16", 2), {12, 5}), 120);
  EXPECT_EQ(compressed_bytes(config_for("bf16", 2), {13}), 28);
  EXPECT_EQ(compressed_bytes(config_for("int8", 2), {3000}), 3012);
  EXPECT_EQ(compressed_bytes(config_for("int8", 2), {13}), 4 + 16);
  EXPECT_EQ(compressed_bytes(config_for("topk", 2), {12, 5}), 40);
  EXPECT_EQ(compressed_bytes(config_for("topk", 2), {7}), 8);
  EXPECT_EQ(compressed_bytes(config_for("powersgd", 2), {40, 70}), 4 * 3 * 110);
  EXPECT_EQ(compressed_bytes(config_for("powersgd", 2), {13}), 52);
  EXPECT_EQ(compressed_bytes(config_for("none", 2), {12, 5}), 240);

  auto world = dist::make_mpi_world(60.0);
  for (const std::string scheme : {"bf16", "int8", "topk", "powersgd"}) {
    SCOPED_TRACE(scheme);
    ParameterStore store;
    add_parameters(store);
    const ParallelConfig config = config_for(scheme, world->size());
    // A pipeline stage's exchange: the last two parameters are not its own.
    const std::vector<bool> exchanged = {true, true, true, false, false};
    DataParallel exchange(config, world.get(), store, exchanged, 5);
    fill(store, world->rank(), 0);
    const std::int64_t gathered = world->bytes_communicated(dist::Traffic::all_gather);
    const std::int64_t reduced = world->bytes_communicated(dist::Traffic::all_reduce);
    exchange.finish_gradients(false);
    std::int64_t expected = 0;
    for (std::size_t i = 0; i < 3; ++i) expected += compressed_bytes(config, store.all()[i]->grad.shape());
    const bool gathers = scheme != "powersgd";
    EXPECT_EQ(world->bytes_communicated(dist::Traffic::all_gather) - gathered, gathers ? expected : 0);
    EXPECT_EQ(world->bytes_communicated(dist::Traffic::all_reduce) - reduced, gathers ? 0 : expected);
    // The parameters it does not exchange are left as they were.
    for (std::size_t i = 3; i < 5; ++i)
      for (std::int64_t e = 0; e < store.all()[i]->grad.numel(); ++e)
        ASSERT_EQ(store.all()[i]->grad.f32()[e], share(world->rank(), 0, i, e));
  }
}

TEST(Compression, Bf16AndInt8SumEachRanksDecodedPayloadInRankOrder) {
  auto world = dist::make_mpi_world(60.0);
  for (const std::string scheme : {"bf16", "int8"}) {
    SCOPED_TRACE(scheme);
    ParameterStore store;
    add_parameters(store);
    DataParallel exchange(config_for(scheme, world->size()), world.get(), store, {}, 5);
    fill(store, world->rank(), 0);
    exchange.finish_gradients(false);
    for (std::size_t i = 0; i < store.all().size(); ++i) {
      const Tensor& grad = store.all()[i]->grad;
      const std::int64_t n = grad.numel();
      std::vector<float> want(static_cast<std::size_t>(n), 0.0f);
      for (int r = 0; r < world->size(); ++r) {
        std::vector<float> x(static_cast<std::size_t>(n));
        for (std::int64_t e = 0; e < n; ++e) x[e] = share(r, 0, i, e);
        const std::vector<float> sent = scheme == "int8" ? int8_round(x.data(), n) : [&] {
          std::vector<float> rounded(x.size());
          std::transform(x.begin(), x.end(), rounded.begin(), bf16_round);
          return rounded;
        }();
        for (std::int64_t e = 0; e < n; ++e) want[e] += sent[e];
      }
      for (std::int64_t e = 0; e < n; ++e) ASSERT_EQ(grad.f32()[e], want[e]) << store.all()[i]->name << "[" << e << "]";
    }
    expect_same_on_every_rank(*world, store);
  }
}

TEST(Compression, ErrorFeedbackLosesNothing) {
  // Σ_t (exchanged sum)_t + Σ_r e_r = Σ_t Σ_r g_r,t after every step.
  auto world = dist::make_mpi_world(60.0);
  const int ranks = world->size();
  for (const std::string scheme : {"topk", "powersgd"}) {
    SCOPED_TRACE(scheme);
    ParameterStore store;
    add_parameters(store);
    DataParallel exchange(config_for(scheme, ranks), world.get(), store, {}, 5);
    GradientCompressor& compressor = *exchange.compressor();
    ASSERT_TRUE(compressor.error_feedback());
    const std::size_t count = store.all().size();
    std::vector<std::vector<double>> applied(count), truth(count);
    for (std::size_t i = 0; i < count; ++i) {
      applied[i].assign(static_cast<std::size_t>(store.all()[i]->grad.numel()), 0.0);
      truth[i] = applied[i];
    }
    for (int step = 0; step < 6; ++step) {
      fill(store, world->rank(), step);
      exchange.finish_gradients(false);
      for (std::size_t i = 0; i < count; ++i) {
        const Tensor& grad = store.all()[i]->grad;
        std::vector<double> residual(static_cast<std::size_t>(grad.numel()), 0.0);
        const std::vector<float>& mine = compressor.residual(i);
        for (std::size_t e = 0; e < mine.size(); ++e) residual[e] = mine[e];
        world->all_reduce(residual.data(), static_cast<std::int64_t>(residual.size()));
        double scale = 0.0, worst = 0.0;
        for (std::int64_t e = 0; e < grad.numel(); ++e) {
          applied[i][e] += grad.f32()[e];
          for (int r = 0; r < ranks; ++r) truth[i][e] += share(r, step, i, e);
          scale = std::max(scale, std::fabs(truth[i][e]));
          worst = std::max(worst, std::fabs(applied[i][e] + residual[e] - truth[i][e]));
        }
        // (float rounding of a few adds per element; a dropped part would be of the gradients' own size)
        EXPECT_LE(worst, 2e-5 * scale) << store.all()[i]->name << " at step " << step;
      }
    }
    expect_same_on_every_rank(*world, store);
  }
}

// What the direct computation of topk's step gives for one rank: x = residual + g; the k largest |x| sent.
struct Direct {
  double input_sq = 0.0, error_sq = 0.0, residual_sq = 0.0;
};

TEST(Compression, RecordedStatisticsMatchADirectComputation) {
  auto world = dist::make_mpi_world(60.0);
  const int rank = world->rank();
  for (const std::string scheme : {"bf16", "int8", "topk", "powersgd"}) {
    SCOPED_TRACE(scheme);
    ParameterStore store;
    add_parameters(store);
    const ParallelConfig config = config_for(scheme, world->size());
    DataParallel exchange(config, world.get(), store, {}, 5);
    GradientCompressor& compressor = *exchange.compressor();
    const std::size_t count = store.all().size();
    // Two steps, so that topk's second one starts from a residual.
    for (int step = 0; step < 2; ++step) {
      std::vector<std::vector<float>> before(count);
      if (compressor.error_feedback())
        for (std::size_t i = 0; i < count; ++i) before[i] = compressor.residual(i);
      fill(store, rank, step);
      std::vector<Direct> direct(count);
      // powersgd: the first step's P from every rank's x (all residuals 0) and the documented first Q.
      std::vector<std::vector<double>> p_hat(count);
      if (scheme == "powersgd" && step == 0) {
        for (std::size_t i = 0; i < count; ++i) {
          const Parameter& p = *store.all()[i];
          if (p.grad.shape().size() < 2) continue;
          const std::int64_t rows = p.grad.shape()[0], cols = p.grad.numel() / rows;
          const CounterRng rng(5, stream_id("powersgd." + p.name));
          std::vector<double> sum(static_cast<std::size_t>(rows * 3), 0.0);
          for (std::int64_t a = 0; a < rows; ++a)
            for (int j = 0; j < 3; ++j)
              for (std::int64_t b = 0; b < cols; ++b)
                sum[a * 3 + j] += static_cast<double>(p.grad.f32()[a * cols + b]) * rng.normal(b * 3 + j);
          world->all_reduce(sum.data(), static_cast<std::int64_t>(sum.size()));
          for (int j = 0; j < 3; ++j) {  // Gram–Schmidt in double
            for (int k = 0; k < j; ++k) {
              double dot = 0.0;
              for (std::int64_t a = 0; a < rows; ++a) dot += sum[a * 3 + j] * sum[a * 3 + k];
              for (std::int64_t a = 0; a < rows; ++a) sum[a * 3 + j] -= dot * sum[a * 3 + k];
            }
            double norm = 0.0;
            for (std::int64_t a = 0; a < rows; ++a) norm += sum[a * 3 + j] * sum[a * 3 + j];
            for (std::int64_t a = 0; a < rows; ++a) sum[a * 3 + j] /= std::sqrt(norm);
          }
          p_hat[i] = std::move(sum);
        }
      }
      for (std::size_t i = 0; i < count; ++i) {
        const Parameter& p = *store.all()[i];
        const std::int64_t n = p.grad.numel();
        std::vector<float> x(p.grad.f32(), p.grad.f32() + n);
        if (!before[i].empty())
          for (std::int64_t e = 0; e < n; ++e) x[e] += before[i][e];
        std::vector<double> sent(static_cast<std::size_t>(n), 0.0);
        if (scheme == "bf16") {
          for (std::int64_t e = 0; e < n; ++e) sent[e] = bf16_round(x[e]);
        } else if (scheme == "int8") {
          const std::vector<float> rounded = int8_round(x.data(), n);
          std::copy(rounded.begin(), rounded.end(), sent.begin());
        } else if (scheme == "topk") {
          const auto k = static_cast<std::int64_t>(std::ceil(config.compress_ratio * static_cast<double>(n)));
          std::vector<std::int64_t> order(static_cast<std::size_t>(n));
          std::iota(order.begin(), order.end(), 0);
          std::stable_sort(order.begin(), order.end(),
                           [&](std::int64_t a, std::int64_t b) { return std::fabs(x[a]) > std::fabs(x[b]); });
          for (std::int64_t j = 0; j < std::max<std::int64_t>(k, 1); ++j) sent[order[j]] = x[order[j]];
        } else if (p.grad.shape().size() < 2) {
          sent.assign(x.begin(), x.end());  // powersgd sends vectors whole
        } else {
          if (step > 0) continue;  // (later Q's are not documented inputs; the first step is checked)
          const std::int64_t rows = p.grad.shape()[0], cols = n / rows;
          for (int j = 0; j < 3; ++j) {  // c = P̂·P̂ᵀ·x, one column of P̂ at a time
            for (std::int64_t b = 0; b < cols; ++b) {
              double q = 0.0;
              for (std::int64_t a = 0; a < rows; ++a) q += p_hat[i][a * 3 + j] * x[a * cols + b];
              for (std::int64_t a = 0; a < rows; ++a) sent[a * cols + b] += p_hat[i][a * 3 + j] * q;
            }
          }
        }
        for (std::int64_t e = 0; e < n; ++e) {
          direct[i].input_sq += static_cast<double>(x[e]) * x[e];
          const double left = static_cast<double>(x[e]) - sent[e];
          direct[i].error_sq += left * left;
        }
        if (compressor.error_feedback() && p.grad.shape().size() >= (scheme == "powersgd" ? 2u : 1u))
          direct[i].residual_sq = direct[i].error_sq;
      }
      exchange.finish_gradients(true);
      std::vector<double> error, residual;
      compressor.measure(error, residual);
      std::vector<double> sums;
      for (const Direct& d : direct) sums.insert(sums.end(), {d.input_sq, d.error_sq, d.residual_sq});
      world->all_reduce(sums.data(), static_cast<std::int64_t>(sums.size()));
      ASSERT_EQ(error.size(), count + 1);
      for (std::size_t i = 0; i < count; ++i) {
        if (scheme == "powersgd" && step > 0 && store.all()[i]->grad.shape().size() >= 2) continue;
        const double want_error = sums[3 * i] == 0.0 ? 0.0 : std::sqrt(sums[3 * i + 1] / sums[3 * i]);
        const double want_residual = std::sqrt(sums[3 * i + 2]);
        EXPECT_NEAR(error[i], want_error, 1e-5 * want_error + 1e-9) << store.all()[i]->name << " step " << step;
        EXPECT_NEAR(residual[i], want_residual, 1e-5 * want_residual + 1e-9) << store.all()[i]->name;
        if (scheme == "bf16" || scheme == "int8") {
          EXPECT_EQ(residual[i], 0.0);
        }
        if (scheme != "powersgd" || store.all()[i]->grad.shape().size() >= 2) {
          EXPECT_GT(error[i], 0.0);
        }
      }
    }
  }
}

TEST(Compression, RepeatedExchangesAreBitwiseTheSame) {
  auto world = dist::make_mpi_world(60.0);
  for (const std::string scheme : {"bf16", "int8", "topk", "powersgd"}) {
    SCOPED_TRACE(scheme);
    std::vector<std::vector<float>> first;
    for (int repeat = 0; repeat < 2; ++repeat) {
      ParameterStore store;
      add_parameters(store);
      DataParallel exchange(config_for(scheme, world->size()), world.get(), store, {}, 5);
      for (int step = 0; step < 3; ++step) {
        fill(store, world->rank(), step);
        exchange.finish_gradients(step == 1);
      }
      for (std::size_t i = 0; i < store.all().size(); ++i) {
        const Tensor& grad = store.all()[i]->grad;
        std::vector<float> values(grad.f32(), grad.f32() + grad.numel());
        if (repeat == 0)
          first.push_back(values);
        else
          ASSERT_EQ(values, first[i]) << store.all()[i]->name;
      }
    }
  }
}

TEST(Compression, BadCombinationsAreRefusedNamingTheKeys) {
  auto world = dist::make_mpi_world(60.0);
  auto refused = [&](ParallelConfig config, dist::Communicator* group, const std::string& words) {
    ParameterStore store;
    add_parameters(store);
    try {
      DataParallel exchange(config, group, store, {}, 5);
      ADD_FAILURE() << "not refused: " << words;
    } catch (const UserError& error) {
      EXPECT_NE(std::string(error.what()).find(words), std::string::npos) << error.what();
    }
  };
  ParallelConfig rank_too_high = config_for("powersgd", world->size());
  rank_too_high.compress_rank = 7;  // embed.token.weight is 8 x 6
  refused(rank_too_high, world.get(),
          "parallel.compress_rank = 7: powersgd's rank exceeds the smaller side of "
          "embed.token.weight (8 x 6");
  ParallelConfig sharded = config_for("int8", world->size());
  sharded.zero = 1;
  refused(sharded, world.get(), "parallel.compress = \"int8\"");
  ParallelConfig local = config_for("topk", world->size());
  local.dp_mode = "local_sgd";
  refused(local, world.get(), "dp_mode = \"local_sgd\"");
  refused(config_for("bf16", 1), nullptr, "needs parallel.dp > 1");
  ParallelConfig unknown = config_for("zip", world->size());
  refused(unknown, world.get(), "parallel.compress = \"zip\": unknown scheme");
}

}  // namespace
}  // namespace proplab

int main(int argc, char** argv) { return proplab::testing::run_mpi_tests(argc, argv); }
