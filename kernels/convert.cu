#include "kernels/convert.cuh"

#include <cuda_bf16.h>

#include <algorithm>

#include "kernels/common.cuh"

namespace proplab::kernels {
namespace {

__global__ void f32_to_bf16_kernel(const float* src, std::uint16_t* dst, std::int64_t count) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride)
    dst[i] = __bfloat16_as_ushort(__float2bfloat16_rn(src[i]));
}

}  // namespace

void convert_f32_to_bf16(const float* src, std::uint16_t* dst, std::int64_t count) {
  if (count <= 0) return;
  f32_to_bf16_kernel<<<grid_blocks(count), kBlockThreads, 0, context().stream>>>(src, dst, count);
  PROPLAB_CUDA_CHECK_LAUNCH("f32_to_bf16_kernel");
}

Bf16Copy::Bf16Copy(const float* src, std::int64_t count)
    : scratch_(sizeof(std::uint16_t) * static_cast<std::size_t>(std::max<std::int64_t>(count, 1))) {
  convert_f32_to_bf16(src, scratch_.as<std::uint16_t>(), count);
}

}  // namespace proplab::kernels
