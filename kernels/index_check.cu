// kernels/index_check: the first id outside a range (see kernels/index_check.cuh).
#include "kernels/index_check.cuh"

#include <cuda_runtime.h>

#include "kernels/common.cuh"
#include "kernels/context.cuh"

namespace proplab::kernels {
namespace {

// block_first[block] = the smallest grid-stride index of this block whose id is outside [lo, hi), or n.
__global__ void __launch_bounds__(kBlockThreads)
    first_outside_kernel(const std::int32_t* ids, std::int64_t n, std::int64_t lo, std::int64_t hi,
                         std::int64_t* block_first) {
  __shared__ std::int64_t shared[kBlockThreads];
  std::int64_t first = n;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const std::int64_t id = ids[i];
    if (id < lo || id >= hi) {
      first = i;  // a thread's indices increase: its first hit is its smallest
      break;
    }
  }
  const int t = threadIdx.x;
  shared[t] = first;
  __syncthreads();
  for (int half = kBlockThreads / 2; half > 0; half >>= 1) {
    if (t < half && shared[t + half] < shared[t]) shared[t] = shared[t + half];
    __syncthreads();
  }
  if (t == 0) block_first[blockIdx.x] = shared[0];
}

// result[0] = min over blocks (n when none), result[1] = the id there (0 when none). One thread.
__global__ void first_outside_finish_kernel(const std::int64_t* block_first, unsigned blocks, const std::int32_t* ids,
                                            std::int64_t n, std::int64_t* result) {
  std::int64_t first = n;
  for (unsigned b = 0; b < blocks; ++b) first = block_first[b] < first ? block_first[b] : first;
  result[0] = first;
  result[1] = first < n ? ids[first] : 0;
}

}  // namespace

IdOutside first_id_outside(const std::int32_t* ids, std::int64_t n, std::int64_t lo, std::int64_t hi) {
  IdOutside answer{n, 0};
  if (n <= 0) return answer;
  const cudaStream_t stream = context().stream;
  const unsigned blocks = grid_blocks(n);
  Scratch scratch(sizeof(std::int64_t) * (static_cast<std::size_t>(blocks) + 2));
  std::int64_t* block_first = scratch.as<std::int64_t>();
  std::int64_t* result = block_first + blocks;
  first_outside_kernel<<<blocks, kBlockThreads, 0, stream>>>(ids, n, lo, hi, block_first);
  PROPLAB_CUDA_CHECK_LAUNCH("first_outside_kernel");
  first_outside_finish_kernel<<<1, 1, 0, stream>>>(block_first, blocks, ids, n, result);
  PROPLAB_CUDA_CHECK_LAUNCH("first_outside_finish_kernel");
  std::int64_t host[2] = {n, 0};
  copy_to_host(host, result, sizeof(host));
  answer.index = host[0];
  answer.value = static_cast<std::int32_t>(host[1]);
  return answer;
}

}  // namespace proplab::kernels
