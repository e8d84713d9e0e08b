#include "core/parallel.h"

#include <omp.h>

#include <algorithm>

namespace proplab {

namespace {
int g_threads = 0;
}

void set_threads(int n) {
  if (n <= 0) n = omp_get_num_procs();
  g_threads = n;
  omp_set_num_threads(n);
}

int threads() { return g_threads > 0 ? g_threads : omp_get_max_threads(); }

double chunked_sum(std::int64_t n, const std::function<double(std::int64_t, std::int64_t)>& chunk_sum,
                   std::int64_t chunk) {
  std::int64_t chunks = (n + chunk - 1) / chunk;
  std::vector<double> partial(static_cast<std::size_t>(std::max<std::int64_t>(chunks, 0)));
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (std::int64_t c = 0; c < chunks; ++c) {
    std::int64_t begin = c * chunk;
    partial[c] = chunk_sum(begin, std::min(n, begin + chunk));
  }
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

}  // namespace proplab
