// bench_nccl: NCCL bandwidth and latency between the GPUs of a job, through proplab's own Communicator (the calls
// the trainer makes), as nccl-tests reports them, plus an α–β fit per collective and the overlap a bucketed
// gradient all-reduce gets behind matrix products. Built only when the build has NCCL.
//
//   mpirun -np N bench_nccl [--min-bytes B] [--max-bytes B] [--factor 2|4] [--warmup N] [--iters N]
//                           [--bucket-mb MB] [--overlap-mb MB] [--no-overlap] [--json FILE]
//   bench_nccl [...]        without a launcher: one rank (an in-place copy; what a one-GPU machine can measure)
//
// One rank per GPU (each takes the GPU of its node-local rank, as `proplab run` does). For each collective —
// all_reduce (sum), reduce_scatter, all_gather (float32) and send_receive (each rank sends to rank + 1 and
// receives from rank − 1, both in flight together) — and each message size S from --min-bytes (default 8) to
// --max-bytes (default 1 GiB) by --factor: --warmup calls, then --iters calls each timed on the host from the call
// to its return (the Communicator's calls are blocking: launch + completion, what the trainer waits for). A rank's
// time is the median of its calls; the time reported is the largest over the ranks.
//
// S is the size nccl-tests reports: the all-reduce buffer, the reduce-scatter input (each rank receives S/N), the
// all-gather output (each rank sends S/N), the send/receive message; S is rounded down to whole floats (and to
// N floats for reduce-scatter and all-gather; at least one per rank), and the bytes printed are the rounded ones.
// algbw = S / time; busbw (nccl-tests' definition, comparable with the link's bandwidth): all-reduce
// algbw · 2(N−1)/N, reduce-scatter and all-gather algbw · (N−1)/N, send/receive algbw. GB/s are 10⁹ bytes/s.
//
// Fit: time(S) = α + β·S by least squares of the relative error (Σ((α + β·S − t)/t)², so the small sizes fix α
// and the large ones β), printed as α (µs) and 1/β (GB/s, algorithm bandwidth). For the step-time model
// (scripts/comm_model.py) it also prints the ring's per-hop terms: a ring all-reduce takes 2(N−1)α_hop +
// 2(N−1)/N·S·β_link, reduce-scatter and all-gather (N−1)α_hop + (N−1)/N·S·β_link, send/receive α_hop + S·β_link,
// so α_hop = α / hops and 1/β_link = the fit's bus bandwidth. With N = 1 there is no link: only α (launch
// latency) means anything.
//
// Overlap (N ≥ 2, unless --no-overlap): the gradient of --overlap-mb MiB (default 475: GPT-2 124M's 124.4 M fp32
// gradients) all-reduced in buckets of --bucket-mb MiB (default 1, proplab's [parallel] bucket_mb), one call per
// bucket: T_comm. A GPU compute load of about the same length on the compute stream (kernels::gemm, fp32 4096³
// products, the count chosen so their time matches T_comm): T_compute. Then both at once — the products enqueued
// on the compute stream, the buckets all-reduced on the communicator's stream meanwhile, as the trainer overlaps
// backward with its buckets: T_both. Hidden fraction = (T_compute + T_comm − T_both) / min(T_compute, T_comm),
// clamped to [0, 1]: 1 when the slower of the two hides the other entirely, 0 when they serialise. The products
// and NCCL's kernels share the SMs and memory, which is the real cost of overlapping; a backward pass is not only
// products, so take it as an estimate of the `overlap` input of scripts/comm_model.py, not as the trainer's own.
//
// Prints a table on rank 0 and, with --json FILE, writes every row, the fits and the overlap there. Exit status 2
// when there is no GPU, NCCL cannot start, or an option is out of range (the message says which).
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "dist/communicator.h"
#include "dist/nccl_communicator.h"
#include "kernels/matmul.cuh"

namespace {

using namespace proplab;
using Clock = std::chrono::steady_clock;

void check_cuda(cudaError_t code, const char* what) {
  if (code != cudaSuccess)
    throw std::runtime_error(std::string("CUDA ") + what + " failed: " + cudaGetErrorString(code));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// The median over `iters` timed calls of `call` (after `warmup` untimed ones) on this rank, then the largest of
// the ranks' medians.
double timed(dist::Communicator& world, int warmup, int iters, const std::function<void()>& call) {
  for (int i = 0; i < warmup; ++i) call();
  std::vector<double> times;
  for (int i = 0; i < iters; ++i) {
    const auto start = Clock::now();
    call();
    times.push_back(seconds_since(start));
  }
  double slowest = median(times);
  world.all_reduce(&slowest, 1, dist::ReduceOp::max);
  return slowest;
}

struct Row {
  std::string op;
  std::int64_t bytes = 0;
  double time_s = 0.0, algbw = 0.0, busbw = 0.0;
};

struct Fit {
  double alpha_s = 0.0, beta_s_per_byte = 0.0;
};

// time = α + β·S minimising the relative error: a weighted least squares with weights 1/t².
Fit fit_alpha_beta(const std::vector<Row>& rows) {
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const Row& row : rows) {
    const double w = 1.0 / (row.time_s * row.time_s), x = static_cast<double>(row.bytes), y = row.time_s;
    sw += w, sx += w * x, sy += w * y, sxx += w * x * x, sxy += w * x * y;
  }
  const double det = sw * sxx - sx * sx;
  Fit fit;
  if (rows.size() < 2 || det <= 0) return fit;
  fit.beta_s_per_byte = (sw * sxy - sx * sy) / det;
  fit.alpha_s = (sy - fit.beta_s_per_byte * sx) / sw;
  return fit;
}

// Bus bandwidth factor (nccl-tests) and ring hops of a collective on n ranks.
double bus_factor(const std::string& op, int n) {
  if (op == "all_reduce") return 2.0 * (n - 1) / n;
  if (op == "send_receive") return 1.0;
  return static_cast<double>(n - 1) / n;
}
int ring_hops(const std::string& op, int n) {
  if (op == "all_reduce") return 2 * (n - 1);
  if (op == "send_receive") return 1;
  return n - 1;
}

struct Overlap {
  bool measured = false;
  std::string why_not;
  double bucket_mib = 0, total_mib = 0;
  int buckets = 0, gemms = 0, gemm_dim = 4096;
  double comm_s = 0, compute_s = 0, both_s = 0, hidden = 0;
};

Overlap measure_overlap(dist::Communicator& world, dist::Communicator& nccl, double total_mib, double bucket_mib,
                        int warmup, int iters) {
  Overlap o;
  o.total_mib = total_mib;
  o.bucket_mib = bucket_mib;
  const std::int64_t bucket_count = std::max<std::int64_t>(1, static_cast<std::int64_t>(bucket_mib * (1 << 20) / 4));
  const std::int64_t total_count =
      std::max<std::int64_t>(bucket_count, static_cast<std::int64_t>(total_mib * (1 << 20) / 4));
  o.buckets = static_cast<int>((total_count + bucket_count - 1) / bucket_count);
  float* gradient = nullptr;
  check_cuda(cudaMalloc(&gradient, static_cast<std::size_t>(total_count) * 4), "cudaMalloc");
  check_cuda(cudaMemset(gradient, 0, static_cast<std::size_t>(total_count) * 4), "cudaMemset");
  const auto all_reduce_buckets = [&] {
    for (std::int64_t at = 0; at < total_count; at += bucket_count)
      nccl.all_reduce(gradient + at, std::min(bucket_count, total_count - at));
  };

  const std::int64_t dim = o.gemm_dim;
  const std::size_t matrix_bytes = static_cast<std::size_t>(dim * dim) * 4;
  float *a = nullptr, *b = nullptr, *c = nullptr;
  for (float** m : {&a, &b, &c}) {
    check_cuda(cudaMalloc(m, matrix_bytes), "cudaMalloc");
    check_cuda(cudaMemset(*m, 0x3c, matrix_bytes), "cudaMemset");  // every float 0.0115: finite, not zero
  }
  const auto enqueue_gemms = [&](int count) {
    for (int i = 0; i < count; ++i) kernels::gemm(false, false, dim, dim, dim, a, dim, b, dim, c, dim, 1.0f, 0.0f);
  };

  o.comm_s = timed(world, warmup, iters, all_reduce_buckets);
  const double one_gemm_s = timed(world, warmup, iters, [&] {
    enqueue_gemms(1);
    cuda_synchronize("bench_nccl gemm");
  });
  // Every rank must enqueue the same count: the ranks' largest times decide it (timed() took the maximum).
  o.gemms = std::max(1, static_cast<int>(std::lround(o.comm_s / one_gemm_s)));
  o.compute_s = timed(world, warmup, iters, [&] {
    enqueue_gemms(o.gemms);
    cuda_synchronize("bench_nccl gemms");
  });
  o.both_s = timed(world, warmup, iters, [&] {
    enqueue_gemms(o.gemms);
    all_reduce_buckets();
    cuda_synchronize("bench_nccl gemms with all-reduce");
  });
  o.hidden = std::clamp((o.compute_s + o.comm_s - o.both_s) / std::min(o.compute_s, o.comm_s), 0.0, 1.0);
  o.measured = true;
  for (float* m : {gradient, a, b, c}) check_cuda(cudaFree(m), "cudaFree");
  return o;
}

std::string format_bytes(std::int64_t bytes) {
  char text[32];
  if (bytes >= (std::int64_t{1} << 30) && bytes % (std::int64_t{1} << 30) == 0)
    std::snprintf(text, sizeof text, "%lld GiB", static_cast<long long>(bytes >> 30));
  else if (bytes >= (1 << 20) && bytes % (1 << 20) == 0)
    std::snprintf(text, sizeof text, "%lld MiB", static_cast<long long>(bytes >> 20));
  else if (bytes >= (1 << 10) && bytes % (1 << 10) == 0)
    std::snprintf(text, sizeof text, "%lld KiB", static_cast<long long>(bytes >> 10));
  else
    std::snprintf(text, sizeof text, "%lld B", static_cast<long long>(bytes));
  return text;
}

int run(int argc, char** argv) {
  CLI::App app{"NCCL bandwidth and latency between the GPUs of an MPI job (one rank per GPU)"};
  std::int64_t min_bytes = 8, max_bytes = std::int64_t{1} << 30;
  int factor = 2, warmup = 5, iters = 20;
  double bucket_mb = 1.0, overlap_mb = 475.0, timeout_s = 300.0;
  bool no_overlap = false;
  std::string json_path;
  app.add_option("--min-bytes", min_bytes, "Smallest message (bytes, default 8)");
  app.add_option("--max-bytes", max_bytes, "Largest message (bytes, default 1 GiB)");
  app.add_option("--factor", factor, "Size step: 2 or 4");
  app.add_option("--warmup", warmup, "Untimed calls per size (default 5)");
  app.add_option("--iters", iters, "Timed calls per size; the median is reported (default 20)");
  app.add_option("--bucket-mb", bucket_mb, "Overlap: all-reduce bucket size in MiB (default 1)");
  app.add_option("--overlap-mb", overlap_mb, "Overlap: gradient size in MiB (default 475, GPT-2 124M in fp32)");
  app.add_flag("--no-overlap", no_overlap, "Skip the overlap measurement");
  app.add_option("--timeout", timeout_s, "Collective timeout in seconds (default 300)");
  app.add_option("--json", json_path, "Write every row, the fits and the overlap to this JSON file");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (min_bytes < 4 || max_bytes < min_bytes)
    throw UserError("--min-bytes " + std::to_string(min_bytes) + " --max-bytes " + std::to_string(max_bytes) +
                    ": allowed: 4 <= min-bytes <= max-bytes");
  if (factor != 2 && factor != 4) throw UserError("--factor " + std::to_string(factor) + ": allowed: 2 or 4");
  if (warmup < 0 || iters < 1) throw UserError("--warmup must be >= 0 and --iters >= 1");
  if (bucket_mb <= 0 || overlap_mb < bucket_mb) throw UserError("--bucket-mb must be > 0 and <= --overlap-mb");

  std::unique_ptr<dist::Communicator> world =
      dist::launched_by_mpi() ? dist::make_mpi_world(timeout_s) : dist::make_single_process();
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)
    throw UserError("bench_nccl needs a GPU: cudaGetDeviceCount found none");
  std::unique_ptr<dist::Communicator> nccl = dist::make_nccl_world(*world, timeout_s);
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  set_cuda_ordinal(device);  // kernels::gemm's compute stream on the GPU NCCL chose
  const int n = nccl->size(), rank = nccl->rank();
  const bool root = rank == 0;
  cudaDeviceProp properties{};
  check_cuda(cudaGetDeviceProperties(&properties, device), "cudaGetDeviceProperties");

  // Two buffers of max_bytes: the in-place all-reduce uses one; the others read one and write the other.
  const std::int64_t max_floats = max_bytes / 4;
  float *send = nullptr, *receive = nullptr;
  check_cuda(cudaMalloc(&send, static_cast<std::size_t>(max_floats) * 4), "cudaMalloc");
  check_cuda(cudaMalloc(&receive, static_cast<std::size_t>(max_floats) * 4), "cudaMalloc");
  check_cuda(cudaMemset(send, 0, static_cast<std::size_t>(max_floats) * 4), "cudaMemset");
  check_cuda(cudaMemset(receive, 0, static_cast<std::size_t>(max_floats) * 4), "cudaMemset");
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");

  if (root)
    std::cout << "bench_nccl: " << n << " rank(s), rank 0 on " << properties.name << "; sizes "
              << format_bytes(min_bytes) << " to " << format_bytes(max_bytes) << " by " << factor << ", " << warmup
              << " warm-up + " << iters << " timed calls each (median; slowest rank)\n";

  const std::vector<std::string> ops{"all_reduce", "reduce_scatter", "all_gather", "send_receive"};
  std::vector<Row> rows;
  std::vector<std::pair<std::string, Fit>> fits;
  for (const std::string& op : ops) {
    std::vector<Row> op_rows;
    const bool per_rank = op == "reduce_scatter" || op == "all_gather";
    if (root)
      std::printf("\n%-14s %10s %12s %12s %12s\n", op.c_str(), "bytes", "time (us)", "algbw GB/s", "busbw GB/s");
    std::int64_t last_bytes = -1;
    for (std::int64_t size = min_bytes; size <= max_bytes; size *= factor) {
      // Elements per call: per rank's block for reduce-scatter/all-gather (S/N each), else the whole S.
      const std::int64_t count =
          per_rank ? std::max<std::int64_t>(1, size / 4 / n) : std::max<std::int64_t>(1, size / 4);
      const std::int64_t bytes = per_rank ? count * 4 * n : count * 4;
      if (bytes == last_bytes || bytes > max_floats * 4) continue;  // rounding made the same size twice, or too big
      last_bytes = bytes;
      std::function<void()> call;
      if (op == "all_reduce")
        call = [&] { nccl->all_reduce(send, count); };
      else if (op == "reduce_scatter")
        call = [&] { nccl->reduce_scatter(send, receive, count); };
      else if (op == "all_gather")
        call = [&] { nccl->all_gather(send, receive, count); };
      else
        call = [&] { nccl->send_receive(send, (rank + 1) % n, receive, (rank + n - 1) % n, count, 0); };
      world->barrier();
      Row row;
      row.op = op;
      row.bytes = bytes;
      row.time_s = timed(*world, warmup, iters, call);
      row.algbw = static_cast<double>(bytes) / row.time_s / 1e9;
      row.busbw = row.algbw * bus_factor(op, n);
      if (root)
        std::printf("%-14s %10lld %12.2f %12.3f %12.3f\n", "", static_cast<long long>(bytes), row.time_s * 1e6,
                    row.algbw, row.busbw);
      op_rows.push_back(row);
    }
    const Fit fit = fit_alpha_beta(op_rows);
    fits.emplace_back(op, fit);
    if (root) {
      std::printf("%-14s fit: alpha %.2f us, 1/beta %.3f GB/s (algbw)", "", fit.alpha_s * 1e6,
                  fit.beta_s_per_byte > 0 ? 1e-9 / fit.beta_s_per_byte : 0.0);
      if (n > 1)
        std::printf("; ring per hop: alpha %.2f us, link %.3f GB/s (busbw)", fit.alpha_s * 1e6 / ring_hops(op, n),
                    fit.beta_s_per_byte > 0 ? 1e-9 * bus_factor(op, n) / fit.beta_s_per_byte : 0.0);
      std::printf("\n");
    }
    rows.insert(rows.end(), op_rows.begin(), op_rows.end());
  }
  check_cuda(cudaFree(send), "cudaFree");
  check_cuda(cudaFree(receive), "cudaFree");

  Overlap overlap;
  if (no_overlap)
    overlap.why_not = "--no-overlap";
  else if (n < 2)
    overlap.why_not = "one rank: an all-reduce on one rank moves nothing between GPUs";
  else
    overlap = measure_overlap(*world, *nccl, overlap_mb, bucket_mb, std::min(warmup, 2), std::max(3, iters / 4));
  if (root) {
    if (overlap.measured)
      std::printf(
          "\noverlap: %.0f MiB in %d buckets of %g MiB: all-reduce alone %.2f ms; %d fp32 %d^3 gemms alone %.2f ms; "
          "both %.2f ms; hidden fraction %.2f\n",
          overlap.total_mib, overlap.buckets, overlap.bucket_mib, overlap.comm_s * 1e3, overlap.gemms, overlap.gemm_dim,
          overlap.compute_s * 1e3, overlap.both_s * 1e3, overlap.hidden);
    else
      std::printf("\noverlap: not measured (%s)\n", overlap.why_not.c_str());
  }

  if (root && !json_path.empty()) {
    std::ostringstream json;
    json.precision(9);
    json << "{\"bench\": \"nccl\", \"ranks\": " << n << ", \"device\": \"" << properties.name
         << "\", \"iters\": " << iters << ", \"warmup\": " << warmup << ",\n \"rows\": [";
    for (std::size_t i = 0; i < rows.size(); ++i)
      json << (i ? ",\n  " : "\n  ") << "{\"op\": \"" << rows[i].op << "\", \"bytes\": " << rows[i].bytes
           << ", \"time_us\": " << rows[i].time_s * 1e6 << ", \"algbw_GBps\": " << rows[i].algbw
           << ", \"busbw_GBps\": " << rows[i].busbw << "}";
    json << "],\n \"fits\": {";
    for (std::size_t i = 0; i < fits.size(); ++i) {
      const auto& [op, fit] = fits[i];
      const double link = fit.beta_s_per_byte > 0 ? 1e-9 * bus_factor(op, n) / fit.beta_s_per_byte : 0.0;
      json << (i ? ",\n  " : "\n  ") << "\"" << op << "\": {\"alpha_us\": " << fit.alpha_s * 1e6
           << ", \"beta_s_per_byte\": " << fit.beta_s_per_byte << ", \"hops\": " << ring_hops(op, n)
           << ", \"alpha_hop_us\": " << (n > 1 ? fit.alpha_s * 1e6 / ring_hops(op, n) : fit.alpha_s * 1e6)
           << ", \"link_GBps\": " << (n > 1 ? link : 0.0) << "}";
    }
    json << "},\n \"overlap\": ";
    if (overlap.measured)
      json << "{\"bucket_mib\": " << overlap.bucket_mib << ", \"total_mib\": " << overlap.total_mib
           << ", \"buckets\": " << overlap.buckets << ", \"gemms\": " << overlap.gemms
           << ", \"gemm_dim\": " << overlap.gemm_dim << ", \"comm_ms\": " << overlap.comm_s * 1e3
           << ", \"compute_ms\": " << overlap.compute_s * 1e3 << ", \"both_ms\": " << overlap.both_s * 1e3
           << ", \"hidden_fraction\": " << overlap.hidden << "}";
    else
      json << "null";
    json << "}\n";
    std::ofstream file(json_path);
    file << json.str();
    if (!file) throw UserError("--json " + json_path + ": cannot write the file");
    std::cout << "wrote " << json_path << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const proplab::UserError& e) {
    std::cerr << "bench_nccl: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "bench_nccl: " << e.what() << "\n";
    if (proplab::dist::launched_by_mpi()) proplab::dist::abort_all(1);
    return 1;
  }
}
