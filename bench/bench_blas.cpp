// bench_blas: the single-threaded sgemm of each BLAS this machine has, at the reference transformer's matrix
// shapes (sgemm_rate.h: every product of one training step), side by side: OpenBLAS (linked; what ops::sgemm calls
// on each of its pieces), BLIS (Debian's libblis.so.4) and oneDNN's dnnl_sgemm (libdnnl.so.2), the last two
// loaded at run time and left out when missing. One thread each, because ops::sgemm runs every piece of a
// product on one thread of the OpenMP pool: the kernel's single-thread rate is what a faster library would buy.
// For each shape the libraries take turns sample by sample (noise hits all alike); medians; every result is
// spot-checked against a double-precision dot product (exit 1 on a mismatch: the numbers would be for the wrong
// product). The step rate weights each shape by its FLOPs per step. On AVX-512 CPUs it also times our own packed
// kernel (own_sgemm.h, register tiles of 12 and 14 rows × 32 columns) beside them, and, at fc.forward's shape, a
// Linear forward with bias and ReLU: the fastest library's sgemm then one pass over y, against our kernel with the
// bias and ReLU fused into the tile's store.
//
//   bench_blas [--repeats N] [--no-attention]
#include <dlfcn.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/parallel.h"
#include "core/rng.h"
#include "own_sgemm.h"
#include "sgemm_rate.h"

namespace {

using namespace proplab;
using bench::SgemmShape;

// Row-major C[M, N] = op(A) op(B) + beta C with alpha 1, as sgemm_rate.h's shapes state it.
using Sgemm = std::function<void(const SgemmShape&, const float*, const float*, float*)>;

struct Library {
  Library(std::string n, Sgemm f) : name(std::move(n)), sgemm(std::move(f)) {}
  std::string name;
  Sgemm sgemm;
  std::vector<double> seconds;  // per shape
  double step_seconds() const {  // one step's products
    double total = 0.0;
    for (double v : seconds) total += v;
    return total;
  }
};

// BLIS's Fortran interface is column-major: row-major C = op(A) op(B) is column-major Cᵀ = op(B)ᵀ op(A)ᵀ.
using FortranSgemm = void (*)(const char*, const char*, const int*, const int*, const int*, const float*, const float*,
                              const int*, const float*, const int*, const float*, float*, const int*);
using DnnlSgemm = int (*)(char, char, std::int64_t, std::int64_t, std::int64_t, float, const float*, std::int64_t,
                          const float*, std::int64_t, float, float*, std::int64_t);
using SetThreads = void (*)(std::int64_t);

void* open_library(const char* name) { return dlopen(name, RTLD_NOW | RTLD_LOCAL); }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"single-threaded sgemm of OpenBLAS, BLIS and oneDNN at the reference transformer's shapes"};
  int repeats = 9;
  bool no_attention = false;
  app.add_option("--repeats", repeats, "timed samples per shape and library (median)")->check(CLI::PositiveNumber);
  app.add_flag("--no-attention", no_attention, "only the linear layers' products");
  CLI11_PARSE(app, argc, argv);
  set_threads(1);

  std::vector<Library> libraries;
  libraries.emplace_back("OpenBLAS", [](const SgemmShape& s, const float* a, const float* b, float* c) {
    bench::detail::run_sgemm(s, a, b, c, bench::GemmPath::proplab);
  });
  if (void* blis = open_library("libblis.so.4")) {
    auto fortran = reinterpret_cast<FortranSgemm>(dlsym(blis, "sgemm_"));
    if (auto set = reinterpret_cast<SetThreads>(dlsym(blis, "bli_thread_set_num_threads"))) set(1);
    if (fortran)
      libraries.emplace_back("BLIS", [fortran](const SgemmShape& s, const float* a, const float* b, float* c) {
        const int lda = s.trans_a ? s.m : s.k, ldb = s.trans_b ? s.k : s.n, ldc = s.n;
        const char ta = s.trans_b ? 'T' : 'N', tb = s.trans_a ? 'T' : 'N';
        const float one = 1.0f;
        fortran(&ta, &tb, &s.n, &s.m, &s.k, &one, b, &ldb, a, &lda, &s.beta, c, &ldc);
      });
  } else {
    std::printf("BLIS: not found (libblis.so.4; apt-get install libblis4)\n");
  }
  if (void* dnnl = open_library("libdnnl.so.2")) {
    if (auto sgemm = reinterpret_cast<DnnlSgemm>(dlsym(dnnl, "dnnl_sgemm")))
      libraries.emplace_back("oneDNN", [sgemm](const SgemmShape& s, const float* a, const float* b, float* c) {
        const std::int64_t lda = s.trans_a ? s.m : s.k, ldb = s.trans_b ? s.k : s.n;
        sgemm(s.trans_a ? 'T' : 'N', s.trans_b ? 'T' : 'N', s.m, s.n, s.k, 1.0f, a, lda, b, ldb, s.beta, c, s.n);
      });
  } else {
    std::printf("oneDNN: not found (libdnnl.so.2; apt-get install libdnnl2)\n");
  }

  if (__builtin_cpu_supports("avx512f")) {
    // Our own packed kernel (own_sgemm.h) with register tiles of 12 and 14 rows × 32 columns.
    auto own = [](auto kernel) {
      return [kernel](const SgemmShape& s, const float* a, const float* b, float* c) {
        kernel(bench::OwnSgemmShape{s.m, s.n, s.k, s.trans_a, s.trans_b, s.beta}, a, b, c);
      };
    };
    libraries.emplace_back("own 12x32", own([](const bench::OwnSgemmShape& s, const float* a, const float* b,
                                               float* c) { bench::own_sgemm<12>(s, a, b, c); }));
    libraries.emplace_back("own 14x32", own([](const bench::OwnSgemmShape& s, const float* a, const float* b,
                                               float* c) { bench::own_sgemm<14>(s, a, b, c); }));
  }
  const std::vector<SgemmShape> shapes = bench::step_sgemm_shapes(bench::SgemmModelDims{}, !no_attention);
  std::printf("bench_blas: 1 thread, %zu shapes of one reference-transformer step, median of %d samples\n",
              shapes.size(), repeats);
  std::printf("%-22s %6s %6s %6s", "shape", "m", "n", "k");
  for (const Library& l : libraries) std::printf(" %10s", (l.name + " GF/s").c_str());
  std::printf("\n");
  int status = 0;
  double step_flops = 0.0;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    const SgemmShape& s = shapes[i];
    const std::size_t a_size = static_cast<std::size_t>(s.m) * s.k, b_size = static_cast<std::size_t>(s.k) * s.n;
    std::vector<float> a(a_size), b(b_size), c(static_cast<std::size_t>(s.m) * s.n);
    const CounterRng rng(0, i);
    for (std::size_t j = 0; j < a_size; ++j) a[j] = rng.normal(j);
    for (std::size_t j = 0; j < b_size; ++j) b[j] = rng.normal(a_size + j);
    std::vector<int> calls(libraries.size());
    for (std::size_t l = 0; l < libraries.size(); ++l) {
      std::fill(c.begin(), c.end(), 0.0f);
      libraries[l].sgemm(s, a.data(), b.data(), c.data());
      const double error = bench::detail::spot_check(s, a, b, c);
      if (error > 1e-4) {
        std::printf("%s: %s gives a relative error of %.2e: wrong product\n", libraries[l].name.c_str(), s.name.c_str(),
                    error);
        status = 1;
      }
      const auto start = std::chrono::steady_clock::now();
      libraries[l].sgemm(s, a.data(), b.data(), c.data());
      const double one = std::max(bench::detail::seconds_since(start), 1e-7);
      calls[l] = std::max(1, static_cast<int>(std::ceil(2e-3 / one)));
    }
    std::vector<std::vector<double>> samples(libraries.size());
    for (int r = 0; r < repeats; ++r)
      for (std::size_t l = 0; l < libraries.size(); ++l) {
        const auto start = std::chrono::steady_clock::now();
        for (int k = 0; k < calls[l]; ++k) libraries[l].sgemm(s, a.data(), b.data(), c.data());
        samples[l].push_back(bench::detail::seconds_since(start) / calls[l]);
      }
    std::printf("%-22s %6d %6d %6d", s.name.c_str(), s.m, s.n, s.k);
    for (std::size_t l = 0; l < libraries.size(); ++l) {
      std::sort(samples[l].begin(), samples[l].end());
      const double median = samples[l][samples[l].size() / 2];
      libraries[l].seconds.push_back(median * static_cast<double>(s.per_step));
      std::printf(" %10.1f", s.flops() / median / 1e9);
    }
    std::printf("\n");
    step_flops += s.flops() * static_cast<double>(s.per_step);
  }
  std::printf("%-43s", "one step, FLOP-weighted");
  double openblas_seconds = 0.0;
  for (const Library& l : libraries) {
    if (l.name == "OpenBLAS") openblas_seconds = l.step_seconds();
    std::printf(" %10.1f", step_flops / l.step_seconds() / 1e9);
  }
  std::printf("\n%-43s", "time relative to OpenBLAS");
  for (const Library& l : libraries) std::printf(" %10.2f", l.step_seconds() / openblas_seconds);
  std::printf("\n");

  // The epilogue: a Linear forward with bias and ReLU (fc.forward's shape), as a library sgemm followed by one
  // vectorised pass over y, against our kernel with the bias and ReLU applied to the register tile before it is
  // stored. Samples alternate; medians.
  if (__builtin_cpu_supports("avx512f")) {
    const SgemmShape* fc = nullptr;
    for (const SgemmShape& s : shapes)
      if (s.name == "fc.forward") fc = &s;
    if (fc) {
      const SgemmShape& s = *fc;
      std::vector<float> a(static_cast<std::size_t>(s.m) * s.k), b(static_cast<std::size_t>(s.k) * s.n),
          bias(static_cast<std::size_t>(s.n)), c(static_cast<std::size_t>(s.m) * s.n), d(c.size());
      const CounterRng rng(1, 0);
      for (std::size_t j = 0; j < a.size(); ++j) a[j] = rng.normal(j);
      for (std::size_t j = 0; j < b.size(); ++j) b[j] = rng.normal(a.size() + j);
      for (std::size_t j = 0; j < bias.size(); ++j) bias[j] = rng.normal(a.size() + b.size() + j);
      // The fastest library over the step (our own kernels left out).
      const Library* best = &libraries.front();
      for (const Library& l : libraries)
        if (l.name.rfind("own", 0) != 0 && l.step_seconds() < best->step_seconds()) best = &l;
      auto library_then_pass = [&] {
        best->sgemm(s, a.data(), b.data(), c.data());
        for (int i = 0; i < s.m; ++i) {
          float* row = c.data() + static_cast<std::size_t>(i) * s.n;
#pragma omp simd
          for (int j = 0; j < s.n; ++j) row[j] = std::max(row[j] + bias[static_cast<std::size_t>(j)], 0.0f);
        }
      };
      auto fused = [&] {
        bench::own_sgemm<12>(bench::OwnSgemmShape{s.m, s.n, s.k, s.trans_a, s.trans_b, 0.0f}, a.data(), b.data(),
                             d.data(), bias.data(), true);
      };
      library_then_pass();
      fused();
      double worst = 0.0;
      for (std::size_t j = 0; j < c.size(); ++j) worst = std::max(worst, std::fabs(double(c[j]) - double(d[j])));
      if (worst > 1e-3) {
        std::printf("fused epilogue: differs from %s + pass by %.2e: wrong\n", best->name.c_str(), worst);
        status = 1;
      }
      std::vector<double> t_library, t_fused;
      for (int r = 0; r < 3 * repeats; ++r) {
        auto start = std::chrono::steady_clock::now();
        library_then_pass();
        t_library.push_back(bench::detail::seconds_since(start));
        start = std::chrono::steady_clock::now();
        fused();
        t_fused.push_back(bench::detail::seconds_since(start));
      }
      std::sort(t_library.begin(), t_library.end());
      std::sort(t_fused.begin(), t_fused.end());
      const double tl = t_library[t_library.size() / 2], tf = t_fused[t_fused.size() / 2];
      std::printf("fc.forward + bias + ReLU: %s then a pass %.3f ms, own 12x32 fused %.3f ms (%.2fx)\n",
                  best->name.c_str(), tl * 1e3, tf * 1e3, tl / tf);
    }
  }
  return status;
}
