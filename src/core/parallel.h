// core/parallel: the one thread pool (OpenMP) and thread-count-independent reductions.
//
// Invariants:
// - set_threads(n) sets the OpenMP pool to n threads. OpenBLAS always runs on one thread: ops/gemm splits every
//   matrix product into pieces fixed by its shape and runs them on this pool, because OpenBLAS's own threading
//   changes the last bits of a product with the thread count.
// - Reductions are split into chunks of a fixed size (kReduceChunk elements), independent of the thread count;
//   the per-chunk partial results are combined in chunk order. So every reduction gives bitwise the same
//   result for any number of threads.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace proplab {

constexpr std::int64_t kReduceChunk = 4096;

void set_threads(int threads);
int threads();

// Sum of f(begin, end) over fixed-size chunks of [0, n), combined in chunk order (double precision).
double chunked_sum(std::int64_t n, const std::function<double(std::int64_t, std::int64_t)>& chunk_sum,
                   std::int64_t chunk = kReduceChunk);

}  // namespace proplab
