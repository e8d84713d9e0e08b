#include "ops/gemm.h"

#include <cblas.h>
#include <dlfcn.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <string>
#include <string_view>

#include "core/error.h"

extern "C" void openblas_set_num_threads(int);

namespace proplab::ops {

namespace {

// About 64 MFLOP per piece (≈ 0.7 ms at one core's sgemm rate): every piece packs the operand it shares with the
// others again, which at 8 MFLOP pieces cost 7–10% of the reference transformer's Linear products on 2 threads;
// at 64 MFLOP they run within ±3% of OpenBLAS's own threading (bench_sgemm, docs/perf.md). The count is rounded
// up to an even number, and pieces are near-equal multiples of 16, so 2, 4 or 8 threads share them evenly.
constexpr std::int64_t kPieceFlops = std::int64_t{1} << 26;
constexpr std::int64_t kMinPiece = 64;    // no piece thinner than this many rows or columns
constexpr std::int64_t kPieceAlign = 16;  // pieces are multiples of this many rows or columns
constexpr std::int64_t kMaxPieces = 64;

// OpenBLAS's build: 0 sequential, 1 pthreads, 2 OpenMP.
extern "C" int openblas_get_parallel(void);

// Makes the next OpenBLAS call single-threaded; undone when it goes out of scope. OpenBLAS's OpenMP build runs
// single-threaded inside an active parallel region and otherwise on omp_get_max_threads() threads (its
// openblas_set_num_threads would also set the caller's OpenMP thread count, so it is not used): outside a region,
// the calling thread's OpenMP count is 1 for the call. The pthreads build keeps its own count: set to 1 once.
class OneBlasThread {
 public:
  OneBlasThread() {
    static const bool openmp_build = [] {
      const bool openmp = openblas_get_parallel() == 2;
      if (!openmp) openblas_set_num_threads(1);
      return openmp;
    }();
    if (openmp_build && !omp_in_parallel()) {
      saved_ = omp_get_max_threads();
      omp_set_num_threads(1);
    }
  }
  ~OneBlasThread() {
    if (saved_ > 0) omp_set_num_threads(saved_);
  }
  OneBlasThread(const OneBlasThread&) = delete;
  OneBlasThread& operator=(const OneBlasThread&) = delete;

 private:
  int saved_ = 0;
};

// oneDNN's row-major sgemm (dnnl_sgemm, oneDNN 2.x), loaded at run time from Debian's libdnnl2 when present.
using DnnlSgemm = int (*)(char, char, std::int64_t, std::int64_t, std::int64_t, float, const float*, std::int64_t,
                          const float*, std::int64_t, float, float*, std::int64_t);

struct Dnnl {
  DnnlSgemm sgemm = nullptr;
  std::string version;  // "oneDNN 2.7.3", or "" when not loaded
};

struct DnnlVersion {
  int major, minor, patch;
  const char* hash;
  unsigned cpu_runtime, gpu_runtime;
};

const Dnnl& dnnl() {
  static const Dnnl loaded = [] {
    Dnnl d;
    void* library = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!library) return d;
    d.sgemm = reinterpret_cast<DnnlSgemm>(dlsym(library, "dnnl_sgemm"));
    using VersionFn = const DnnlVersion* (*)();
    const auto version = reinterpret_cast<VersionFn>(dlsym(library, "dnnl_version"));
    if (!d.sgemm || !version) {
      d.sgemm = nullptr;
      return d;
    }
    const DnnlVersion* v = version();
    d.version = "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
    return d;
  }();
  return loaded;
}

std::atomic<GemmBackend>& backend_setting() {
  static std::atomic<GemmBackend> setting{[] {
    const char* env = std::getenv("PROPLAB_GEMM");
    if (env && std::string_view(env) == "openblas") return GemmBackend::openblas;
    return dnnl().sgemm ? GemmBackend::onednn : GemmBackend::openblas;
  }()};
  return setting;
}

int as_int(std::int64_t v, const char* what) {
  PROPLAB_CHECK(v >= 0 && v <= INT_MAX, "sgemm: ", what, " = ", v, " is out of BLAS's int range");
  return static_cast<int>(v);
}

}  // namespace

GemmPieces gemm_pieces(std::int64_t m, std::int64_t n, std::int64_t k) {
  GemmPieces p;
  p.split_rows = m >= n;
  const std::int64_t length = p.split_rows ? m : n;
  p.size = std::max<std::int64_t>(length, 1);
  const std::int64_t flops = 2 * m * n * std::max<std::int64_t>(k, 1);
  std::int64_t wanted = std::min({flops / kPieceFlops, length / kMinPiece, kMaxPieces});
  if (wanted <= 1) return p;
  wanted += wanted % 2;  // an even count shares evenly among 2, 4, 8 ... threads
  const std::int64_t even = (length + wanted - 1) / wanted;
  p.size = (even + kPieceAlign - 1) / kPieceAlign * kPieceAlign;
  p.count = (length + p.size - 1) / p.size;
  return p;
}

GemmBackend gemm_backend() { return backend_setting().load(std::memory_order_relaxed); }

bool set_gemm_backend(GemmBackend backend) {
  if (backend == GemmBackend::onednn && !dnnl().sgemm) return false;
  backend_setting().store(backend, std::memory_order_relaxed);
  return true;
}

std::string gemm_backend_name() {
  if (gemm_backend() == GemmBackend::onednn) return dnnl().version;
#ifdef OPENBLAS_VERSION
  std::string version = OPENBLAS_VERSION;  // " OpenBLAS 0.3.21 "
  version.erase(0, version.find_first_not_of(' '));
  version.erase(version.find_last_not_of(' ') + 1);
  return version;
#else
  return "OpenBLAS";
#endif
}

namespace {

// sgemm, and with `bias` (alpha = beta = 1) sgemm_bias: every piece of C seeded with it before its product.
void sgemm_pieces(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                  const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
                  std::int64_t ldc, const float* bias) {
  if (m <= 0 || n <= 0) return;
  const GemmPieces pieces = gemm_pieces(m, n, k);
  const DnnlSgemm onednn = gemm_backend() == GemmBackend::onednn ? dnnl().sgemm : nullptr;
  const CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans, tb = trans_b ? CblasTrans : CblasNoTrans;
  const int ik = as_int(k, "k"), ilda = as_int(lda, "lda"), ildb = as_int(ldb, "ldb"), ildc = as_int(ldc, "ldc");
  as_int(m, "m");
  as_int(n, "n");
  // One piece, C [rows, columns] at pa, pb, pc, on the calling thread with the backend's library.
  auto product = [&](std::int64_t rows, std::int64_t columns, const float* pa, const float* pb, float* pc) {
    if (onednn) {
      const int status =
          onednn(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', rows, columns, k, alpha, pa, lda, pb, ldb, beta, pc, ldc);
      PROPLAB_CHECK(status == 0, "sgemm: dnnl_sgemm failed with status ", status);
    } else {
      cblas_sgemm(CblasRowMajor, ta, tb, static_cast<int>(rows), static_cast<int>(columns), ik, alpha, pa, ilda, pb,
                  ildb, beta, pc, ildc);
    }
  };
#pragma omp parallel for schedule(dynamic) if (pieces.count > 1 && !omp_in_parallel())
  for (std::int64_t piece = 0; piece < pieces.count; ++piece) {
    // One thread per piece: OpenBLAS's and oneDNN's OpenMP builds run serially inside an active parallel region
    // and otherwise on omp_get_max_threads(), which OneBlasThread sets to 1 for the call.
    const OneBlasThread one_thread;
    const std::int64_t start = piece * pieces.size;
    const std::int64_t length = std::min(pieces.size, (pieces.split_rows ? m : n) - start);
    if (pieces.split_rows) {
      // Rows [start, start + length) of C and of op(A): A's rows, or A's columns when it is stored transposed.
      if (bias)
        for (std::int64_t r = start; r < start + length; ++r) std::copy(bias, bias + n, c + r * ldc);
      product(length, n, a + (trans_a ? start : start * lda), b, c + start * ldc);
    } else {
      // Columns [start, start + length) of C and of op(B): B's columns, or B's rows when it is stored transposed.
      if (bias)
        for (std::int64_t r = 0; r < m; ++r) std::copy(bias + start, bias + start + length, c + r * ldc + start);
      product(m, length, a, b + (trans_b ? start * ldb : start), c + start);
    }
  }
}

}  // namespace

void sgemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
           std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  sgemm_pieces(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, nullptr);
}

void sgemm_bias(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
                std::int64_t lda, const float* b, std::int64_t ldb, const float* bias, float* c, std::int64_t ldc) {
  sgemm_pieces(trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, 1.0f, c, ldc, bias);
}

}  // namespace proplab::ops
