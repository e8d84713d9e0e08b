// kernels/embedding: token and position embeddings on the GPU (see kernels/embedding.cuh for the contract).
#include "kernels/embedding.cuh"

#include <cuda_runtime.h>

#include <cub/device/device_radix_sort.cuh>

#include "core/error.h"
#include "kernels/common.cuh"
#include "kernels/context.cuh"

namespace proplab::kernels {
namespace {

// y[p, j] = table[ids[p] − first, j] (0 outside the table) (+ pos[p % seq, j]); one thread per element.
__global__ void __launch_bounds__(kBlockThreads)
    embedding_gather_kernel(const std::int32_t* ids, std::int64_t positions, std::int64_t seq, const float* table,
                            std::int64_t first, std::int64_t rows, const float* pos, std::int64_t features, float* y) {
  const std::int64_t n = positions * features;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t index = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; index < n;
       index += stride) {
    const std::int64_t p = index / features, j = index % features;
    const std::int64_t local = static_cast<std::int64_t>(ids[p]) - first;
    const bool inside = local >= 0 && local < rows;
    if (pos != nullptr) {
      const float token = inside ? table[local * features + j] : 0.0f;
      y[index] = __fadd_rn(token, pos[(p % seq) * features + j]);
    } else {
      y[index] = inside ? table[local * features + j] : 0.0f;
    }
  }
}

// y[p, j] += pos[p % seq, j]; one thread per element.
__global__ void __launch_bounds__(kBlockThreads)
    position_add_kernel(const float* pos, std::int64_t positions, std::int64_t seq, std::int64_t features, float* y) {
  const std::int64_t n = positions * features;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t index = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; index < n;
       index += stride) {
    const std::int64_t p = index / features, j = index % features;
    y[index] = __fadd_rn(y[index], pos[(p % seq) * features + j]);
  }
}

// Sort keys: the table row of each position (ids outside the table get the key `rows`, sorted last and skipped);
// values: the positions, ascending.
__global__ void __launch_bounds__(kBlockThreads)
    embedding_sort_keys_kernel(const std::int32_t* ids, std::int64_t positions, std::int64_t first, std::int64_t rows,
                               unsigned* keys, std::int32_t* values) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t p = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < positions; p += stride) {
    const std::int64_t local = static_cast<std::int64_t>(ids[p]) - first;
    keys[p] = static_cast<unsigned>(local >= 0 && local < rows ? local : rows);
    values[p] = static_cast<std::int32_t>(p);
  }
}

// One thread per (sorted index k, feature j): when k starts a run of equal keys (a table row), the thread adds the
// run's gradients d_y[position, j] in sorted (= position) order onto d_table[row, j], in float, and stores it once.
__global__ void __launch_bounds__(kBlockThreads)
    embedding_accumulate_kernel(const unsigned* sorted_keys, const std::int32_t* sorted_positions,
                                std::int64_t positions, std::int64_t rows, const float* d_y, std::int64_t features,
                                float* d_table) {
  const std::int64_t n = positions * features;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t index = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; index < n;
       index += stride) {
    const std::int64_t k = index / features, j = index % features;
    const unsigned key = sorted_keys[k];
    if (key >= rows || (k > 0 && sorted_keys[k - 1] == key)) continue;
    float* target = d_table + static_cast<std::int64_t>(key) * features + j;
    float sum = *target;
    for (std::int64_t m = k; m < positions && sorted_keys[m] == key; ++m)
      sum = __fadd_rn(sum, d_y[static_cast<std::int64_t>(sorted_positions[m]) * features + j]);
    *target = sum;
  }
}

// d_pos[t, j] += d_y[b, t, j] for b = 0, 1, ... in order; one thread per (t, j).
__global__ void __launch_bounds__(kBlockThreads)
    position_backward_kernel(const float* d_y, std::int64_t batch, std::int64_t seq, std::int64_t features,
                             float* d_pos) {
  const std::int64_t n = seq * features;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t index = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; index < n;
       index += stride) {
    float sum = d_pos[index];
    for (std::int64_t b = 0; b < batch; ++b) sum = __fadd_rn(sum, d_y[b * n + index]);
    d_pos[index] = sum;
  }
}

}  // namespace

void embedding_gather(const std::int32_t* ids, std::int64_t positions, std::int64_t seq, const float* table,
                      std::int64_t first, std::int64_t rows, const float* pos, std::int64_t features, float* y) {
  const std::int64_t n = positions * features;
  if (n == 0) return;
  embedding_gather_kernel<<<grid_blocks(n), kBlockThreads, 0, context().stream>>>(ids, positions, seq, table, first,
                                                                                  rows, pos, features, y);
  PROPLAB_CUDA_CHECK_LAUNCH("embedding_gather_kernel");
}

void position_add(const float* pos, std::int64_t positions, std::int64_t seq, std::int64_t features, float* y) {
  const std::int64_t n = positions * features;
  if (n == 0) return;
  position_add_kernel<<<grid_blocks(n), kBlockThreads, 0, context().stream>>>(pos, positions, seq, features, y);
  PROPLAB_CUDA_CHECK_LAUNCH("position_add_kernel");
}

void embedding_table_backward(const std::int32_t* ids, std::int64_t positions, std::int64_t first, std::int64_t rows,
                              const float* d_y, std::int64_t features, float* d_table) {
  if (positions == 0 || features == 0 || rows == 0) return;
  PROPLAB_CHECK(positions <= 0x7fffffff, "embedding backward: ", positions, " positions exceed the sort's int count");
  PROPLAB_CHECK(rows < (std::int64_t{1} << 32) - 1, "embedding backward: ", rows, " table rows exceed 32-bit keys");
  const cudaStream_t stream = context().stream;
  const auto count = static_cast<std::size_t>(positions);
  Scratch keys_in(sizeof(unsigned) * count), keys_out(sizeof(unsigned) * count);
  Scratch positions_in(sizeof(std::int32_t) * count), positions_out(sizeof(std::int32_t) * count);
  embedding_sort_keys_kernel<<<grid_blocks(positions), kBlockThreads, 0, stream>>>(
      ids, positions, first, rows, keys_in.as<unsigned>(), positions_in.as<std::int32_t>());
  PROPLAB_CUDA_CHECK_LAUNCH("embedding_sort_keys_kernel");

  // Keys lie in [0, rows]: sort only the bits that can differ.
  int end_bit = 1;
  while (end_bit < 32 && (std::int64_t{1} << end_bit) <= rows) ++end_bit;
  const int items = static_cast<int>(positions);
  std::size_t temp_bytes = 0;
  PROPLAB_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in.as<unsigned>(),
                                                     keys_out.as<unsigned>(), positions_in.as<std::int32_t>(),
                                                     positions_out.as<std::int32_t>(), items, 0, end_bit, stream));
  Scratch temp(temp_bytes);
  PROPLAB_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.as<void>(), temp_bytes, keys_in.as<unsigned>(),
                                                     keys_out.as<unsigned>(), positions_in.as<std::int32_t>(),
                                                     positions_out.as<std::int32_t>(), items, 0, end_bit, stream));
  PROPLAB_CUDA_CHECK_LAUNCH("cub::DeviceRadixSort::SortPairs");

  const std::int64_t n = positions * features;
  embedding_accumulate_kernel<<<grid_blocks(n), kBlockThreads, 0, stream>>>(
      keys_out.as<unsigned>(), positions_out.as<std::int32_t>(), positions, rows, d_y, features, d_table);
  PROPLAB_CUDA_CHECK_LAUNCH("embedding_accumulate_kernel");
}

void position_backward(const float* d_y, std::int64_t batch, std::int64_t seq, std::int64_t features, float* d_pos) {
  const std::int64_t n = seq * features;
  if (n == 0 || batch == 0) return;
  position_backward_kernel<<<grid_blocks(n), kBlockThreads, 0, context().stream>>>(d_y, batch, seq, features, d_pos);
  PROPLAB_CUDA_CHECK_LAUNCH("position_backward_kernel");
}

}  // namespace proplab::kernels
