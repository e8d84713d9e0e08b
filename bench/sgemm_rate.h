// bench/sgemm_rate: sgemm throughput at the matrix shapes of one training step of a transformer, the ceiling a
// CPU engine built on OpenBLAS can reach: through proplab's ops::sgemm (OpenBLAS single-threaded on fixed pieces
// of C on the OpenMP pool, what every proplab product runs) or through OpenBLAS's own threading (GemmPath). Header-only so any bench executable (bench_sgemm, the
// engine benchmark) can measure it in the same run as its own timings.
//
// Shapes follow core/tensor.h: activations are [rows, features] with rows = batch * seq_len, Linear weights
// [out, in], y = x W^T. Per Linear of the step there are three sgemms (all row-major):
//   forward   y[rows, out]   = x[rows, in] W^T          M = rows, N = out, K = in    (no-trans, trans)
//   d_input   d_x[rows, in]  = d_y[rows, out] W         M = rows, N = in,  K = out   (no-trans, no-trans)
//   d_weight  d_W[out, in]  += d_y^T x                  M = out,  N = in,  K = rows  (trans, no-trans), beta 1
// (d_weight accumulates, like every parameter gradient in proplab). The tied LM head is a Linear with
// out = vocab, in = width. Attention adds six sgemms of one (batch, head) slice each, T = seq_len, dh = head
// width: scores q k^T and out P v forward; d_P = d_O v^T, d_v = P^T d_O, d_q = d_S k, d_k = d_S^T q backward.
//
// Units: FLOPs count a multiply-add as 2; rates are GFLOP/s (1e9 FLOP/s); times are seconds.
// The step rate is total step FLOPs / total step sgemm time, i.e. the FLOP-weighted harmonic mean of the
// per-shape rates: the number that predicts how long the step's matmuls take.
#pragma once

#include <cblas.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "ops/gemm.h"

extern "C" void openblas_set_num_threads(int);
extern "C" int openblas_get_parallel(void);

namespace proplab::bench {

// The dimensions of a decoder-only transformer step that decide its matmul shapes.
struct SgemmModelDims {
  int layers = 4;
  int width = 256;
  int heads = 4;
  int ffn = 1024;
  int vocab = 256;
  int seq_len = 128;
  int batch = 8;
};

enum class SgemmGroup { linear, attention };

// proplab: ops::sgemm. openblas_threads: one cblas_sgemm call on OpenBLAS's own threads (not bitwise the same
// for different thread counts, which is why proplab does not use it; measured for comparison).
enum class GemmPath { proplab, openblas_threads };

inline const char* gemm_path_name(GemmPath path) {
  return path == GemmPath::proplab ? "proplab ops::sgemm" : "OpenBLAS's own threads";
}

// One sgemm C[M, N] = alpha op(A) op(B) + beta C, row-major, run `per_step` times in one training step.
struct SgemmShape {
  std::string name;  // "qkv.forward", "attn.scores.forward", ...
  SgemmGroup group = SgemmGroup::linear;
  int m = 0;
  int n = 0;
  int k = 0;
  bool trans_a = false;
  bool trans_b = false;
  float beta = 0.0f;
  std::int64_t per_step = 1;

  double flops() const { return 2.0 * m * n * k; }
};

struct SgemmRate {
  SgemmShape shape;
  double seconds = 0.0;        // median time of one call
  double gflops = 0.0;         // shape.flops() / seconds / 1e9
  double max_rel_error = 0.0;  // spot check against a double-precision dot product
};

struct SgemmStepRate {
  int threads = 0;
  GemmPath path = GemmPath::proplab;
  std::vector<SgemmRate> rates;
  double step_flops = 0.0;    // sum of flops * per_step over the shapes measured
  double step_seconds = 0.0;  // sum of seconds * per_step
  double step_gflops = 0.0;   // step_flops / step_seconds / 1e9
  // Average cores busy with other processes while measuring (see OtherLoad); well above 0 means the machine
  // was shared and the rates are low and noisy. Negative when /proc/stat could not be read.
  double other_load_cores = -1.0;

  // The same step rate over one group only (linear layers or attention).
  double group_gflops(SgemmGroup group) const {
    double flops = 0.0;
    double seconds = 0.0;
    for (const SgemmRate& rate : rates) {
      if (rate.shape.group != group) continue;
      flops += rate.shape.flops() * static_cast<double>(rate.shape.per_step);
      seconds += rate.seconds * static_cast<double>(rate.shape.per_step);
    }
    return seconds > 0.0 ? flops / seconds / 1e9 : 0.0;
  }
};

// Every sgemm of one training step of `dims`: 3 per Linear (layers x {qkv, attn.out, fc, proj} + the tied LM
// head), and with include_attention the 6 per-(batch, head) attention sgemms.
inline std::vector<SgemmShape> step_sgemm_shapes(const SgemmModelDims& dims, bool include_attention = true) {
  PROPLAB_CHECK(dims.width % dims.heads == 0, "width ", dims.width, " not divisible by heads ", dims.heads);
  const int rows = dims.batch * dims.seq_len;
  std::vector<SgemmShape> shapes;
  auto add_linear = [&](const std::string& name, int out, int in, std::int64_t per_step) {
    shapes.push_back({name + ".forward", SgemmGroup::linear, rows, out, in, false, true, 0.0f, per_step});
    shapes.push_back({name + ".d_input", SgemmGroup::linear, rows, in, out, false, false, 0.0f, per_step});
    shapes.push_back({name + ".d_weight", SgemmGroup::linear, out, in, rows, true, false, 1.0f, per_step});
  };
  add_linear("qkv", 3 * dims.width, dims.width, dims.layers);
  add_linear("attn.out", dims.width, dims.width, dims.layers);
  add_linear("fc", dims.ffn, dims.width, dims.layers);
  add_linear("proj", dims.width, dims.ffn, dims.layers);
  add_linear("lm_head", dims.vocab, dims.width, 1);
  if (include_attention) {
    const int t = dims.seq_len;
    const int dh = dims.width / dims.heads;
    const std::int64_t slices = static_cast<std::int64_t>(dims.layers) * dims.batch * dims.heads;
    auto attention = [&](const std::string& name, int m, int n, int k, bool trans_a, bool trans_b) {
      shapes.push_back({"attn." + name, SgemmGroup::attention, m, n, k, trans_a, trans_b, 0.0f, slices});
    };
    attention("scores.forward", t, t, dh, false, true);   // S = q k^T
    attention("values.forward", t, dh, t, false, false);  // O = P v
    attention("d_probs", t, t, dh, false, true);          // d_P = d_O v^T
    attention("d_v", t, dh, t, true, false);              // d_v = P^T d_O
    attention("d_q", t, dh, t, false, false);             // d_q = d_S k
    attention("d_k", t, dh, t, true, false);              // d_k = d_S^T q
  }
  return shapes;
}

// Average number of cores other processes kept busy between construction and cores(): all busy CPU time in
// /proc/stat minus this process's own (getrusage, all threads), over wall time. Negative without /proc/stat.
class OtherLoad {
 public:
  OtherLoad() : busy_(busy_seconds()), own_(own_seconds()), start_(std::chrono::steady_clock::now()) {}

  double cores() const {
    const double busy = busy_seconds();
    if (busy < 0.0 || busy_ < 0.0) return -1.0;
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    return std::max(0.0, ((busy - busy_) - (own_seconds() - own_)) / std::max(wall, 1e-9));
  }

 private:
  static double busy_seconds() {
    std::ifstream stat("/proc/stat");
    std::string cpu;
    std::uint64_t fields[8] = {};
    if (!(stat >> cpu) || cpu != "cpu") return -1.0;
    for (std::uint64_t& field : fields) stat >> field;
    if (!stat) return -1.0;
    std::uint64_t busy = 0;
    for (int i = 0; i < 8; ++i) {
      if (i != 3 && i != 4) busy += fields[i];  // all but idle and iowait
    }
    return static_cast<double>(busy) / static_cast<double>(sysconf(_SC_CLK_TCK));
  }

  static double own_seconds() {
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
           1e-6 * static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
  }

  double busy_;
  double own_;
  std::chrono::steady_clock::time_point start_;
};

namespace detail {

inline void run_sgemm(const SgemmShape& s, const float* a, const float* b, float* c, GemmPath path) {
  // Row-major leading dimensions of the stored (untransposed) matrices.
  const int lda = s.trans_a ? s.m : s.k;
  const int ldb = s.trans_b ? s.k : s.n;
  if (path == GemmPath::proplab) {
    ops::sgemm(s.trans_a, s.trans_b, s.m, s.n, s.k, 1.0f, a, lda, b, ldb, s.beta, c, s.n);
    return;
  }
  cblas_sgemm(CblasRowMajor, s.trans_a ? CblasTrans : CblasNoTrans, s.trans_b ? CblasTrans : CblasNoTrans, s.m, s.n,
              s.k, 1.0f, a, lda, b, ldb, s.beta, c, s.n);
}

inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Largest relative error of a few entries of C against a double-precision dot product (C was zero before one
// call with beta 0 or 1, so C = op(A) op(B) either way). Catches wrong transposes or leading dimensions.
inline double spot_check(const SgemmShape& s, const std::vector<float>& a, const std::vector<float>& b,
                         const std::vector<float>& c) {
  double worst = 0.0;
  const int probes[][2] = {{0, 0}, {s.m - 1, s.n - 1}, {s.m / 2, s.n / 3}, {s.m / 3, s.n - 1}, {s.m - 1, 0}};
  for (const auto& probe : probes) {
    const int i = probe[0];
    const int j = probe[1];
    double exact = 0.0;
    double magnitude = 0.0;
    for (int p = 0; p < s.k; ++p) {
      const double x = s.trans_a ? a[static_cast<std::size_t>(p) * s.m + i] : a[static_cast<std::size_t>(i) * s.k + p];
      const double y = s.trans_b ? b[static_cast<std::size_t>(j) * s.k + p] : b[static_cast<std::size_t>(p) * s.n + j];
      exact += x * y;
      magnitude += std::abs(x * y);
    }
    const double got = c[static_cast<std::size_t>(i) * s.n + j];
    worst = std::max(worst, std::abs(got - exact) / std::max(magnitude, 1e-30));
  }
  return worst;
}

}  // namespace detail

// Median seconds per call of each shape on `threads` threads (set through proplab::set_threads, which is left at
// that value), through `path`; OpenBLAS is back on one thread afterwards. Each of `repeats` samples times enough back-to-back calls to last at least
// min_sample_seconds, so the small attention sgemms are not timer noise (median: the middle sample, the upper
// middle one for an even count). Must not be called inside an OpenMP parallel region.
inline SgemmStepRate measure_sgemm_rates(const std::vector<SgemmShape>& shapes, int threads, int repeats = 15,
                                         double min_sample_seconds = 2e-3, GemmPath path = GemmPath::proplab) {
  PROPLAB_CHECK(threads >= 1, "threads must be >= 1, got ", threads);
  PROPLAB_CHECK(repeats >= 1, "repeats must be >= 1, got ", repeats);
  set_threads(threads);
  // OpenBLAS's OpenMP build follows set_threads; its pthreads build keeps its own count, which ops::sgemm keeps
  // at 1 (its openblas_set_num_threads would also set the caller's OpenMP count in the OpenMP build).
  const bool own_count = path == GemmPath::openblas_threads && openblas_get_parallel() != 2;
  if (own_count) openblas_set_num_threads(threads);
  struct BackToOneThread {
    bool on;
    ~BackToOneThread() {
      if (on) openblas_set_num_threads(1);
    }
  } back_to_one_thread{own_count};
  SgemmStepRate result;
  result.threads = threads;
  result.path = path;
  const OtherLoad other_load;
  for (const SgemmShape& shape : shapes) {
    const std::size_t a_size = static_cast<std::size_t>(shape.m) * shape.k;
    const std::size_t b_size = static_cast<std::size_t>(shape.k) * shape.n;
    std::vector<float> a(a_size);
    std::vector<float> b(b_size);
    std::vector<float> c(static_cast<std::size_t>(shape.m) * shape.n, 0.0f);
    const CounterRng rng(0, stream_id(shape.name));
    for (std::size_t i = 0; i < a_size; ++i) a[i] = rng.normal(i);
    for (std::size_t i = 0; i < b_size; ++i) b[i] = rng.normal(a_size + i);

    detail::run_sgemm(shape, a.data(), b.data(), c.data(), path);
    SgemmRate rate;
    rate.shape = shape;
    rate.max_rel_error = detail::spot_check(shape, a, b, c);

    // Calibrate the calls per sample on a warm cache (the first call above also warmed OpenBLAS's threads).
    auto start = std::chrono::steady_clock::now();
    detail::run_sgemm(shape, a.data(), b.data(), c.data(), path);
    const double one_call = std::max(detail::seconds_since(start), 1e-7);
    const int calls = std::max(1, static_cast<int>(std::ceil(min_sample_seconds / one_call)));

    std::vector<double> samples;
    samples.reserve(static_cast<std::size_t>(repeats));
    for (int r = 0; r < repeats; ++r) {
      // beta = 1 shapes accumulate into C; its values grow but stay far from overflow for these call counts.
      start = std::chrono::steady_clock::now();
      for (int call = 0; call < calls; ++call) detail::run_sgemm(shape, a.data(), b.data(), c.data(), path);
      samples.push_back(detail::seconds_since(start) / calls);
    }
    std::nth_element(samples.begin(), samples.begin() + repeats / 2, samples.end());
    rate.seconds = samples[static_cast<std::size_t>(repeats / 2)];
    rate.gflops = shape.flops() / rate.seconds / 1e9;
    result.step_flops += shape.flops() * static_cast<double>(shape.per_step);
    result.step_seconds += rate.seconds * static_cast<double>(shape.per_step);
    result.rates.push_back(std::move(rate));
  }
  result.step_gflops = result.step_seconds > 0.0 ? result.step_flops / result.step_seconds / 1e9 : 0.0;
  result.other_load_cores = other_load.cores();
  return result;
}

}  // namespace proplab::bench
