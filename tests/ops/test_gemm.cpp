// ops/gemm: under every backend this machine has (OpenBLAS, and oneDNN where libdnnl2 is installed), products match
// a double-precision reference for every transpose and stride, and are bitwise the same for 1, 2 and 3 threads at
// shapes where OpenBLAS's own threading is not (see ops/gemm.h).
#include "ops/gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/rng.h"
#include "ops_testing.h"

namespace proplab {
namespace {

struct Product {
  std::int64_t m, n, k;
  bool trans_a, trans_b;
  float beta;
};

std::vector<float> normal_values(std::size_t count, std::uint64_t stream) {
  const CounterRng rng(7, stream);
  std::vector<float> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = rng.normal(i);
  return v;
}

// C = op(A) op(B) + beta C through ops::sgemm with padded leading dimensions (ld = columns + 3).
std::vector<float> run(const Product& p, const std::vector<float>& a, const std::vector<float>& b,
                       const std::vector<float>& c0) {
  const std::int64_t lda = (p.trans_a ? p.m : p.k) + 3, ldb = (p.trans_b ? p.k : p.n) + 3, ldc = p.n + 3;
  std::vector<float> c = c0;
  ops::sgemm(p.trans_a, p.trans_b, p.m, p.n, p.k, 1.0f, a.data(), lda, b.data(), ldb, p.beta, c.data(), ldc);
  return c;
}

void matches_double_precision();
void bitwise_for_any_thread_count();

// Sets each backend this machine has in turn (OpenBLAS, then oneDNN where it loads); restores the default after.
class EveryBackend {
 public:
  EveryBackend() : saved_(ops::gemm_backend()) {}
  ~EveryBackend() { ops::set_gemm_backend(saved_); }
  template <typename F>
  void run(F f) {
    for (const ops::GemmBackend backend : {ops::GemmBackend::openblas, ops::GemmBackend::onednn}) {
      if (!ops::set_gemm_backend(backend)) {
        std::printf("ops::sgemm: oneDNN (libdnnl.so.2) is not installed here; only OpenBLAS is tested\n");
        continue;
      }
      SCOPED_TRACE(ops::gemm_backend_name());
      f();
    }
  }

 private:
  ops::GemmBackend saved_;
};

TEST(Gemm, MatchesDoublePrecisionForEveryTransposeAndStride) {
  EveryBackend().run([] { matches_double_precision(); });
}

TEST(Gemm, BackendsAgreeAndNameThemselves) {
  const ops::GemmBackend saved = ops::gemm_backend();
  ASSERT_TRUE(ops::set_gemm_backend(ops::GemmBackend::openblas));
  EXPECT_EQ(ops::gemm_backend_name().rfind("OpenBLAS", 0), 0u) << ops::gemm_backend_name();
  const Product p{300, 200, 100, false, true, 0.0f};
  const auto a = normal_values(static_cast<std::size_t>((p.m + 3) * (p.k + 3)), 7);
  const auto b = normal_values(static_cast<std::size_t>((p.k + 3) * (p.n + 3)), 8);
  const auto c0 = normal_values(static_cast<std::size_t>(p.m * (p.n + 3)), 9);
  const auto openblas = run(p, a, b, c0);
  if (!ops::set_gemm_backend(ops::GemmBackend::onednn)) {
    EXPECT_EQ(ops::gemm_backend(), ops::GemmBackend::openblas);
    GTEST_SKIP() << "oneDNN (libdnnl.so.2) is not installed here";
  }
  EXPECT_EQ(ops::gemm_backend_name().rfind("oneDNN ", 0), 0u) << ops::gemm_backend_name();
  const auto onednn = run(p, a, b, c0);
  ops::set_gemm_backend(saved);
  for (std::size_t i = 0; i < openblas.size(); ++i) ASSERT_NEAR(openblas[i], onednn[i], 1e-4) << i;
}

void matches_double_precision() {
  for (const bool ta : {false, true}) {
    for (const bool tb : {false, true}) {
      // Split along rows (m > n), along columns (n > m) and a single piece, with ragged last pieces.
      for (const Product shape : {Product{1000, 70, 300, ta, tb, 0.0f}, Product{70, 1000, 300, ta, tb, 1.0f},
                                  Product{5, 7, 3, ta, tb, 1.0f}}) {
        const std::int64_t a_rows = ta ? shape.k : shape.m, a_cols = ta ? shape.m : shape.k;
        const std::int64_t b_rows = tb ? shape.n : shape.k, b_cols = tb ? shape.k : shape.n;
        const std::int64_t lda = a_cols + 3, ldb = b_cols + 3, ldc = shape.n + 3;
        const auto a = normal_values(static_cast<std::size_t>(a_rows * lda), 1);
        const auto b = normal_values(static_cast<std::size_t>(b_rows * ldb), 2);
        const auto c0 = normal_values(static_cast<std::size_t>(shape.m * ldc), 3);
        const auto c = run(shape, a, b, c0);
        double worst = 0.0;
        for (std::int64_t i = 0; i < shape.m; ++i) {
          for (std::int64_t j = 0; j < ldc; ++j) {
            const std::size_t at = static_cast<std::size_t>(i * ldc + j);
            if (j >= shape.n) {  // the padding between rows of C is never written
              ASSERT_EQ(c[at], c0[at]);
              continue;
            }
            double exact = shape.beta * static_cast<double>(c0[at]);
            for (std::int64_t q = 0; q < shape.k; ++q) {
              const double x = ta ? a[static_cast<std::size_t>(q * lda + i)] : a[static_cast<std::size_t>(i * lda + q)];
              const double y = tb ? b[static_cast<std::size_t>(j * ldb + q)] : b[static_cast<std::size_t>(q * ldb + j)];
              exact += x * y;
            }
            worst = std::max(worst, std::abs(c[at] - exact) / std::sqrt(static_cast<double>(shape.k) + 1.0));
          }
        }
        EXPECT_LT(worst, 2e-5) << shape.m << "x" << shape.n << "x" << shape.k << " ta " << ta << " tb " << tb;
      }
    }
  }
}

TEST(Gemm, PiecesDependOnTheShapeAloneAndCoverIt) {
  const ops::GemmPieces small = ops::gemm_pieces(64, 64, 64);
  EXPECT_EQ(small.count, 1);
  const ops::GemmPieces rows = ops::gemm_pieces(1024, 768, 256);
  EXPECT_TRUE(rows.split_rows);
  EXPECT_GT(rows.count, 1);
  EXPECT_EQ(rows.size % 16, 0);
  EXPECT_EQ(rows.count % 2, 0);
  EXPECT_GE(rows.size * rows.count, 1024);
  EXPECT_LT(rows.size * (rows.count - 1), 1024);
  const ops::GemmPieces columns = ops::gemm_pieces(32, 16384, 144);
  EXPECT_FALSE(columns.split_rows);
  EXPECT_GT(columns.count, 1);
  EXPECT_GE(columns.size * columns.count, 16384);
}

// The shapes where OpenBLAS 0.3.21's own threading changed the last bits between 1 and 2 threads (a strided 1x1
// convolution's product, a transformer's Linear, a d_W accumulation with beta 1).
TEST(Gemm, BitwiseTheSameForAnyThreadCount) {
  EveryBackend().run([] { bitwise_for_any_thread_count(); });
}

void bitwise_for_any_thread_count() {
  for (const Product p : {Product{32, 16384, 16, false, false, 0.0f}, Product{1024, 768, 256, false, true, 0.0f},
                          Product{256, 1024, 1024, true, false, 1.0f}, Product{16, 4096, 16, false, false, 0.0f}}) {
    const auto a = normal_values(static_cast<std::size_t>((p.m + 3) * (p.k + 3)), 4);
    const auto b = normal_values(static_cast<std::size_t>((p.k + 3) * (p.n + 3)), 5);
    const auto c0 = normal_values(static_cast<std::size_t>(p.m * (p.n + 3)), 6);
    std::vector<float> results[3];
    for (int threads = 1; threads <= 3; ++threads) {
      testing::ScopedThreads scoped(threads);
      results[threads - 1] = run(p, a, b, c0);
    }
    for (int t = 1; t < 3; ++t) {
      EXPECT_EQ(std::memcmp(results[0].data(), results[t].data(), results[0].size() * sizeof(float)), 0)
          << p.m << "x" << p.n << "x" << p.k << ": 1 vs " << t + 1 << " threads";
    }
  }
}

// sgemm_bias seeds each piece of C with the bias before its product: bitwise the same as seeding all of C and
// calling sgemm with beta 1, for pieces along rows and along columns, with padded strides, on 1 and 2 threads; the
// padding columns past n are left as they were.
TEST(Gemm, BiasSeededPieceByPieceIsBitwiseSeedThenSgemm) {
  EveryBackend().run([] {
    for (const Product p : {Product{1024, 768, 256, false, true, 1.0f}, Product{32, 16384, 144, false, false, 1.0f},
                            Product{40, 24, 8, true, true, 1.0f}}) {
      // The first two are split in pieces (along rows, along columns), the last is one piece.
      ASSERT_EQ(ops::gemm_pieces(p.m, p.n, p.k).count > 1, p.m != 40) << "the shapes' pieces changed";
      const auto a = normal_values(static_cast<std::size_t>((p.m + 3) * (p.k + 3)), 8);
      const auto b = normal_values(static_cast<std::size_t>((p.k + 3) * (p.n + 3)), 9);
      const auto bias = normal_values(static_cast<std::size_t>(p.n), 10);
      const auto garbage = normal_values(static_cast<std::size_t>(p.m * (p.n + 3)), 11);
      const std::int64_t lda = (p.trans_a ? p.m : p.k) + 3, ldb = (p.trans_b ? p.k : p.n) + 3, ldc = p.n + 3;
      std::vector<float> seeded = garbage;
      for (std::int64_t r = 0; r < p.m; ++r)
        for (std::int64_t j = 0; j < p.n; ++j)
          seeded[static_cast<std::size_t>(r * ldc + j)] = bias[static_cast<std::size_t>(j)];
      const std::vector<float> expected = run(p, a, b, seeded);
      for (int threads = 1; threads <= 2; ++threads) {
        testing::ScopedThreads scoped(threads);
        std::vector<float> c = garbage;
        ops::sgemm_bias(p.trans_a, p.trans_b, p.m, p.n, p.k, a.data(), lda, b.data(), ldb, bias.data(), c.data(), ldc);
        EXPECT_EQ(std::memcmp(c.data(), expected.data(), c.size() * sizeof(float)), 0)
            << p.m << "x" << p.n << "x" << p.k << " on " << threads << " threads";
      }
    }
  });
}

}  // namespace
}  // namespace proplab
