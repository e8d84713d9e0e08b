#include "kernels/conv.cuh"

#include <cuda_runtime.h>

#include <algorithm>
#include <optional>

#include "core/error.h"
#include "kernels/block_reduce.cuh"
#include "kernels/common.cuh"
#include "kernels/context.cuh"
#include "kernels/convert.cuh"
#include "kernels/matmul.cuh"

namespace proplab::kernels {
namespace {

// The derived sizes of a convolution, passed by value to the kernels.
struct Geometry {
  ConvShape s;
  std::int64_t c_in_group = 0, c_out_group = 0;
  std::int64_t patch = 0;   // c_in_group · kh · kw: rows of the column matrix
  std::int64_t pixels = 0;  // h_out · w_out
  std::int64_t chunk = 1;   // samples per chunk
};

Geometry make_geometry(const ConvShape& s) {
  PROPLAB_CHECK(s.groups >= 1 && s.stride >= 1 && s.padding >= 0, "conv2d: bad groups/stride/padding");
  PROPLAB_CHECK(s.c_in % s.groups == 0 && s.c_out % s.groups == 0, "conv2d: channels not divisible by groups");
  Geometry g;
  g.s = s;
  g.c_in_group = s.c_in / s.groups;
  g.c_out_group = s.c_out / s.groups;
  g.patch = g.c_in_group * s.kh * s.kw;
  g.pixels = s.h_out * s.w_out;
  const std::int64_t per_sample = std::max<std::int64_t>(std::max(g.patch, g.c_out_group) * g.pixels, 1);
  g.chunk = std::clamp<std::int64_t>(kConvColumnBudget / per_sample, 1, std::max<std::int64_t>(s.n, 1));
  return g;
}

// cols[row · columns + s·pixels + p], row = (c·kh + i)·kw + j, for samples [n0, n0 + count) of group `group`: the
// input element tap (i, j) of output pixel p reads, 0 in the padding.
__global__ void im2col_kernel(const float* x, Geometry g, std::int64_t group, std::int64_t n0, std::int64_t count,
                              float* cols) {
  const std::int64_t columns = count * g.pixels;
  const std::int64_t total = g.patch * columns;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const std::int64_t row = e / columns, column = e % columns;
    const std::int64_t sample = column / g.pixels, p = column % g.pixels;
    const std::int64_t oh = p / g.s.w_out, ow = p % g.s.w_out;
    const std::int64_t c = row / (g.s.kh * g.s.kw), i = (row / g.s.kw) % g.s.kh, j = row % g.s.kw;
    const std::int64_t ih = oh * g.s.stride - g.s.padding + i;
    const std::int64_t iw = ow * g.s.stride - g.s.padding + j;
    float value = 0.0f;
    if (ih >= 0 && ih < g.s.h && iw >= 0 && iw < g.s.w)
      value = x[(((n0 + sample) * g.s.c_in + group * g.c_in_group + c) * g.s.h + ih) * g.s.w + iw];
    cols[e] = value;
  }
}

// d_x planes of group `group`, samples [n0, n0 + count), overwritten: each element sums the column gradients of
// the taps that read it, in tap order (i, j) from 0 (the CPU's order), so no two threads write one element.
__global__ void col2im_kernel(const float* cols, Geometry g, std::int64_t group, std::int64_t n0, std::int64_t count,
                              float* d_x) {
  const std::int64_t columns = count * g.pixels;
  const std::int64_t total = count * g.c_in_group * g.s.h * g.s.w;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const std::int64_t iw = e % g.s.w;
    std::int64_t rest = e / g.s.w;
    const std::int64_t ih = rest % g.s.h;
    rest /= g.s.h;
    const std::int64_t c = rest % g.c_in_group;
    const std::int64_t sample = rest / g.c_in_group;
    float sum = 0.0f;
    for (std::int64_t i = 0; i < g.s.kh; ++i) {
      const std::int64_t th = ih + g.s.padding - i;  // oh · stride
      if (th < 0 || th % g.s.stride != 0) continue;
      const std::int64_t oh = th / g.s.stride;
      if (oh >= g.s.h_out) continue;
      for (std::int64_t j = 0; j < g.s.kw; ++j) {
        const std::int64_t tw = iw + g.s.padding - j;  // ow · stride
        if (tw < 0 || tw % g.s.stride != 0) continue;
        const std::int64_t ow = tw / g.s.stride;
        if (ow >= g.s.w_out) continue;
        sum = __fadd_rn(sum, cols[((c * g.s.kh + i) * g.s.kw + j) * columns + sample * g.pixels + oh * g.s.w_out + ow]);
      }
    }
    d_x[(((n0 + sample) * g.s.c_in + group * g.c_in_group + c) * g.s.h + ih) * g.s.w + iw] = sum;
  }
}

// y[n0 + s, group·C_out_g + o, p] = out[o · columns + s·pixels + p] + bias (0 without bias).
__global__ void scatter_output_kernel(const float* out, const float* bias, Geometry g, std::int64_t group,
                                      std::int64_t n0, std::int64_t count, float* y) {
  const std::int64_t columns = count * g.pixels;
  const std::int64_t total = g.c_out_group * columns;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const std::int64_t p = e % g.pixels;
    const std::int64_t rest = e / g.pixels;
    const std::int64_t sample = rest % count, o = rest / count;
    const std::int64_t channel = group * g.c_out_group + o;
    const float b = bias != nullptr ? bias[channel] : 0.0f;
    y[((n0 + sample) * g.s.c_out + channel) * g.pixels + p] = __fadd_rn(out[e], b);
  }
}

// d_out[o · columns + s·pixels + p] = d_y[n0 + s, group·C_out_g + o, p].
__global__ void gather_output_kernel(const float* d_y, Geometry g, std::int64_t group, std::int64_t n0,
                                     std::int64_t count, float* d_out) {
  const std::int64_t columns = count * g.pixels;
  const std::int64_t total = g.c_out_group * columns;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const std::int64_t p = e % g.pixels;
    const std::int64_t rest = e / g.pixels;
    const std::int64_t sample = rest % count, o = rest / count;
    d_out[e] = d_y[((n0 + sample) * g.s.c_out + group * g.c_out_group + o) * g.pixels + p];
  }
}

// d_bias[o] += Σ_s Σ_p d_y[s, o, p]: one block per channel, double, fixed tree; the sum rounded to float once.
__global__ void __launch_bounds__(kBlockThreads)
    bias_grad_kernel(const float* d_y, std::int64_t n, std::int64_t c_out, std::int64_t pixels, float* d_bias) {
  __shared__ double shared[kBlockThreads];
  const std::int64_t o = blockIdx.x;
  const std::int64_t total = n * pixels;
  double sum[1] = {0.0};
  for (std::int64_t e = threadIdx.x; e < total; e += blockDim.x) {
    const std::int64_t sample = e / pixels, p = e % pixels;
    sum[0] += static_cast<double>(d_y[(sample * c_out + o) * pixels + p]);
  }
  block_sum<1>(sum, shared);
  if (threadIdx.x == 0) d_bias[o] = __fadd_rn(d_bias[o], static_cast<float>(sum[0]));
}

// Bytes of a scratch buffer of `count` values of `value_bytes` each (at least one value).
std::size_t buffer_bytes(std::int64_t count, std::size_t value_bytes) {
  return value_bytes * static_cast<std::size_t>(std::max<std::int64_t>(count, 1));
}

// bf16 copies of a product's operands (GemmInput::bf16): the weights, rounded once per call, and one chunk's
// columns and output gradients, rounded after they are written. Empty for f32 inputs.
struct Bf16Operands {
  std::optional<Bf16Copy> weight;
  std::optional<Scratch> cols, d_out;
};

// What a product reads: the bf16 copy for bf16 inputs, else the f32 values.
const void* operand(GemmInput input, const float* f32, const std::uint16_t* bf16) {
  return input == GemmInput::bf16 ? static_cast<const void*>(bf16) : static_cast<const void*>(f32);
}

}  // namespace

void conv2d_forward(const float* x, const float* weight, const float* bias, float* y, const ConvShape& shape,
                    GemmInput input) {
  const Geometry g = make_geometry(shape);
  if (g.s.n == 0 || g.s.c_out == 0) return;
  cudaStream_t stream = context().stream;
  Scratch cols(buffer_bytes(g.patch * g.chunk * g.pixels, sizeof(float)));
  Scratch out(sizeof(float) * static_cast<std::size_t>(g.c_out_group * g.chunk * g.pixels));
  const bool bf16 = input == GemmInput::bf16;
  Bf16Operands half;
  if (bf16) {
    half.weight.emplace(weight, g.s.c_out * g.patch);
    half.cols.emplace(buffer_bytes(g.patch * g.chunk * g.pixels, sizeof(std::uint16_t)));
  }
  for (std::int64_t n0 = 0; n0 < g.s.n; n0 += g.chunk) {
    const std::int64_t count = std::min(g.chunk, g.s.n - n0);
    const std::int64_t columns = count * g.pixels;
    for (std::int64_t group = 0; group < g.s.groups; ++group) {
      if (g.patch > 0) {
        im2col_kernel<<<grid_blocks(g.patch * columns), kBlockThreads, 0, stream>>>(x, g, group, n0, count,
                                                                                    cols.as<float>());
        PROPLAB_CUDA_CHECK_LAUNCH("im2col_kernel");
        if (bf16) convert_f32_to_bf16(cols.as<float>(), half.cols->as<std::uint16_t>(), g.patch * columns);
      }
      const std::int64_t weight_offset = group * g.c_out_group * g.patch;
      // out [C_out_g, columns] = W_g [C_out_g, patch] · cols [patch, columns] (zero when patch == 0).
      gemm(false, false, g.c_out_group, columns, g.patch,
           operand(input, weight + weight_offset, bf16 ? half.weight->data() + weight_offset : nullptr), g.patch,
           operand(input, cols.as<float>(), bf16 ? half.cols->as<std::uint16_t>() : nullptr), columns, out.as<float>(),
           columns, 1.0f, 0.0f, nullptr, input);
      scatter_output_kernel<<<grid_blocks(g.c_out_group * columns), kBlockThreads, 0, stream>>>(out.as<float>(), bias,
                                                                                                g, group, n0, count, y);
      PROPLAB_CUDA_CHECK_LAUNCH("scatter_output_kernel");
    }
  }
}

void conv2d_backward(const float* x, const float* weight, const float* d_y, float* d_x, float* d_weight, float* d_bias,
                     const ConvShape& shape, GemmInput input) {
  const Geometry g = make_geometry(shape);
  if (g.s.n == 0) return;
  cudaStream_t stream = context().stream;
  if (g.s.c_out == 0) {
    if (d_x != nullptr && g.s.c_in * g.s.h * g.s.w > 0)
      PROPLAB_CUDA_CHECK(
          cudaMemsetAsync(d_x, 0, sizeof(float) * static_cast<std::size_t>(g.s.n * g.s.c_in * g.s.h * g.s.w), stream));
    return;
  }
  Scratch cols(buffer_bytes(g.patch * g.chunk * g.pixels, sizeof(float)));
  Scratch d_out(sizeof(float) * static_cast<std::size_t>(g.c_out_group * g.chunk * g.pixels));
  const bool bf16 = input == GemmInput::bf16;
  Bf16Operands half;
  if (bf16) {
    if (d_x != nullptr) half.weight.emplace(weight, g.s.c_out * g.patch);
    half.cols.emplace(buffer_bytes(g.patch * g.chunk * g.pixels, sizeof(std::uint16_t)));
    half.d_out.emplace(buffer_bytes(g.c_out_group * g.chunk * g.pixels, sizeof(std::uint16_t)));
  }
  for (std::int64_t n0 = 0; n0 < g.s.n; n0 += g.chunk) {
    const std::int64_t count = std::min(g.chunk, g.s.n - n0);
    const std::int64_t columns = count * g.pixels;
    for (std::int64_t group = 0; group < g.s.groups; ++group) {
      gather_output_kernel<<<grid_blocks(g.c_out_group * columns), kBlockThreads, 0, stream>>>(d_y, g, group, n0, count,
                                                                                               d_out.as<float>());
      PROPLAB_CUDA_CHECK_LAUNCH("gather_output_kernel");
      if (bf16) convert_f32_to_bf16(d_out.as<float>(), half.d_out->as<std::uint16_t>(), g.c_out_group * columns);
      const void* d_out_in = operand(input, d_out.as<float>(), bf16 ? half.d_out->as<std::uint16_t>() : nullptr);
      const std::int64_t weight_offset = group * g.c_out_group * g.patch;
      if (g.patch > 0) {
        im2col_kernel<<<grid_blocks(g.patch * columns), kBlockThreads, 0, stream>>>(x, g, group, n0, count,
                                                                                    cols.as<float>());
        PROPLAB_CUDA_CHECK_LAUNCH("im2col_kernel");
        if (bf16) convert_f32_to_bf16(cols.as<float>(), half.cols->as<std::uint16_t>(), g.patch * columns);
        // d_W_g [C_out_g, patch] += d_out [C_out_g, columns] · cols^T [columns, patch] (f32 accumulation)
        gemm(false, true, g.c_out_group, g.patch, columns, d_out_in, columns,
             operand(input, cols.as<float>(), bf16 ? half.cols->as<std::uint16_t>() : nullptr), columns,
             d_weight + weight_offset, g.patch, 1.0f, 1.0f, nullptr, input);
      }
      if (d_x == nullptr) continue;
      // d_cols [patch, columns] = W_g^T [patch, C_out_g] · d_out [C_out_g, columns], gathered into d_x (the f32
      // columns buffer is free again: its bf16 copy, if any, was taken above).
      if (g.patch > 0)
        gemm(true, false, g.patch, columns, g.c_out_group,
             operand(input, weight + weight_offset, bf16 ? half.weight->data() + weight_offset : nullptr), g.patch,
             d_out_in, columns, cols.as<float>(), columns, 1.0f, 0.0f, nullptr, input);
      const std::int64_t d_x_elements = count * g.c_in_group * g.s.h * g.s.w;
      if (d_x_elements > 0) {
        col2im_kernel<<<grid_blocks(d_x_elements), kBlockThreads, 0, stream>>>(cols.as<float>(), g, group, n0, count,
                                                                               d_x);
        PROPLAB_CUDA_CHECK_LAUNCH("col2im_kernel");
      }
    }
  }
  if (d_bias != nullptr) {
    bias_grad_kernel<<<static_cast<unsigned>(g.s.c_out), kBlockThreads, 0, stream>>>(d_y, g.s.n, g.s.c_out, g.pixels,
                                                                                     d_bias);
    PROPLAB_CUDA_CHECK_LAUNCH("bias_grad_kernel");
  }
}

}  // namespace proplab::kernels
