#include "kernels/pool.cuh"

#include <cuda_runtime.h>

#include "core/error.h"
#include "kernels/common.cuh"
#include "kernels/context.cuh"

namespace proplab::kernels {
namespace {

// Grid-stride loop over [0, total) as `e`.
#define PROPLAB_FOR_EACH(e, total)                                                                     \
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < (total); \
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x)

struct PoolShape {
  std::int64_t planes, h, w, h_out, w_out;
  int kernel, stride, padding;
};

// One thread per output: the window summed in float in (i, j) order, times inv.
__global__ void avg_pool_forward_kernel(const float* x, float* y, PoolShape s, float inv) {
  PROPLAB_FOR_EACH(e, s.planes * s.h_out * s.w_out) {
    const std::int64_t ow = e % s.w_out;
    const std::int64_t oh = (e / s.w_out) % s.h_out;
    const std::int64_t plane = e / (s.w_out * s.h_out);
    const float* in = x + plane * s.h * s.w;
    float sum = 0.0f;
    for (int i = 0; i < s.kernel; ++i)
      for (int j = 0; j < s.kernel; ++j) sum = __fadd_rn(sum, in[(oh * s.stride + i) * s.w + ow * s.stride + j]);
    y[e] = __fmul_rn(sum, inv);
  }
}

// First and last output index (inclusive) whose window [o·stride, o·stride + kernel) covers input index `in`;
// last < first when none does.
__device__ void covering_windows(std::int64_t in, std::int64_t out_size, int kernel, int stride, std::int64_t& first,
                                 std::int64_t& last) {
  const std::int64_t low = in - kernel + 1;  // o·stride >= low
  first = low <= 0 ? 0 : (low + stride - 1) / stride;
  last = in / stride;
  if (last > out_size - 1) last = out_size - 1;
}

// One thread per input element: Σ over the windows covering it, in window order (oh, ow), of d_y·inv.
__global__ void avg_pool_backward_kernel(const float* d_y, float* d_x, PoolShape s, float inv) {
  PROPLAB_FOR_EACH(e, s.planes * s.h * s.w) {
    const std::int64_t iw = e % s.w;
    const std::int64_t ih = (e / s.w) % s.h;
    const std::int64_t plane = e / (s.w * s.h);
    const float* in = d_y + plane * s.h_out * s.w_out;
    std::int64_t oh_first, oh_last, ow_first, ow_last;
    covering_windows(ih, s.h_out, s.kernel, s.stride, oh_first, oh_last);
    covering_windows(iw, s.w_out, s.kernel, s.stride, ow_first, ow_last);
    float sum = 0.0f;
    for (std::int64_t oh = oh_first; oh <= oh_last; ++oh)
      for (std::int64_t ow = ow_first; ow <= ow_last; ++ow) sum = __fadd_rn(sum, __fmul_rn(in[oh * s.w_out + ow], inv));
    d_x[e] = sum;
  }
}

// One thread per output: the first maximum of the window (padding skipped), as the CPU scans it.
__global__ void max_pool_forward_kernel(const float* x, float* y, std::int32_t* argmax, PoolShape s) {
  PROPLAB_FOR_EACH(e, s.planes * s.h_out * s.w_out) {
    const std::int64_t ow = e % s.w_out;
    const std::int64_t oh = (e / s.w_out) % s.h_out;
    const std::int64_t plane = e / (s.w_out * s.h_out);
    const float* in = x + plane * s.h * s.w;
    float best = -__int_as_float(0x7f800000);  // −inf
    std::int64_t best_index = -1;
    for (int i = 0; i < s.kernel; ++i) {
      const std::int64_t ih = oh * s.stride - s.padding + i;
      if (ih < 0 || ih >= s.h) continue;
      for (int j = 0; j < s.kernel; ++j) {
        const std::int64_t iw = ow * s.stride - s.padding + j;
        if (iw < 0 || iw >= s.w) continue;
        const float v = in[ih * s.w + iw];
        if (best_index < 0 || v > best) {
          best = v;
          best_index = ih * s.w + iw;
        }
      }
    }
    y[e] = best;
    argmax[e] = static_cast<std::int32_t>(best_index);
  }
}

// One thread per plane (cleared beforehand): d_y added at the argmax positions in output order.
__global__ void max_pool_backward_kernel(const float* d_y, const std::int32_t* argmax, float* d_x, std::int64_t planes,
                                         std::int64_t in_size, std::int64_t out_size) {
  PROPLAB_FOR_EACH(plane, planes) {
    float* out = d_x + plane * in_size;
    const float* in = d_y + plane * out_size;
    const std::int32_t* arg = argmax + plane * out_size;
    for (std::int64_t o = 0; o < out_size; ++o) {
      const std::int64_t index = arg[o];
      if (index >= 0 && index < in_size) out[index] = __fadd_rn(out[index], in[o]);
    }
  }
}

// One thread per plane: Σ in double in element order, divided by size, rounded to float.
__global__ void global_avg_forward_kernel(const float* x, float* y, std::int64_t planes, std::int64_t size) {
  PROPLAB_FOR_EACH(plane, planes) {
    const float* in = x + plane * size;
    double sum = 0.0;
    for (std::int64_t i = 0; i < size; ++i) sum = __dadd_rn(sum, static_cast<double>(in[i]));
    y[plane] = static_cast<float>(__ddiv_rn(sum, static_cast<double>(size)));
  }
}

__global__ void global_avg_backward_kernel(const float* d_y, float* d_x, std::int64_t planes, std::int64_t size,
                                           float inv) {
  PROPLAB_FOR_EACH(e, planes * size) { d_x[e] = __fmul_rn(d_y[e / size], inv); }
}

__global__ void nchw_to_nhwc_kernel(const float* x, float* y, std::int64_t n, std::int64_t channels,
                                    std::int64_t pixels) {
  PROPLAB_FOR_EACH(e, n * pixels * channels) {
    const std::int64_t c = e % channels;
    const std::int64_t p = (e / channels) % pixels;
    const std::int64_t b = e / (channels * pixels);
    y[e] = x[(b * channels + c) * pixels + p];
  }
}

__global__ void nhwc_to_nchw_kernel(const float* x, float* y, std::int64_t n, std::int64_t channels,
                                    std::int64_t pixels) {
  PROPLAB_FOR_EACH(e, n * channels * pixels) {
    const std::int64_t p = e % pixels;
    const std::int64_t c = (e / pixels) % channels;
    const std::int64_t b = e / (pixels * channels);
    y[e] = x[(b * pixels + p) * channels + c];
  }
}

#undef PROPLAB_FOR_EACH

}  // namespace

void avg_pool2d_forward(const float* x, float* y, std::int64_t planes, std::int64_t h, std::int64_t w,
                        std::int64_t h_out, std::int64_t w_out, int kernel, int stride) {
  const std::int64_t total = planes * h_out * w_out;
  if (total == 0) return;
  const float inv = 1.0f / static_cast<float>(kernel * kernel);
  avg_pool_forward_kernel<<<grid_blocks(total), kBlockThreads, 0, context().stream>>>(
      x, y, PoolShape{planes, h, w, h_out, w_out, kernel, stride, 0}, inv);
  PROPLAB_CUDA_CHECK_LAUNCH("avg_pool_forward_kernel");
}

void avg_pool2d_backward(const float* d_y, float* d_x, std::int64_t planes, std::int64_t h, std::int64_t w,
                         std::int64_t h_out, std::int64_t w_out, int kernel, int stride) {
  const std::int64_t total = planes * h * w;
  if (total == 0) return;
  const float inv = 1.0f / static_cast<float>(kernel * kernel);
  avg_pool_backward_kernel<<<grid_blocks(total), kBlockThreads, 0, context().stream>>>(
      d_y, d_x, PoolShape{planes, h, w, h_out, w_out, kernel, stride, 0}, inv);
  PROPLAB_CUDA_CHECK_LAUNCH("avg_pool_backward_kernel");
}

void max_pool2d_forward(const float* x, float* y, std::int32_t* argmax, std::int64_t planes, std::int64_t h,
                        std::int64_t w, std::int64_t h_out, std::int64_t w_out, int kernel, int stride, int padding) {
  const std::int64_t total = planes * h_out * w_out;
  if (total == 0) return;
  max_pool_forward_kernel<<<grid_blocks(total), kBlockThreads, 0, context().stream>>>(
      x, y, argmax, PoolShape{planes, h, w, h_out, w_out, kernel, stride, padding});
  PROPLAB_CUDA_CHECK_LAUNCH("max_pool_forward_kernel");
}

void max_pool2d_backward(const float* d_y, const std::int32_t* argmax, float* d_x, std::int64_t planes,
                         std::int64_t in_size, std::int64_t out_size) {
  if (planes * in_size == 0) return;
  cudaStream_t stream = context().stream;
  PROPLAB_CUDA_CHECK(cudaMemsetAsync(d_x, 0, sizeof(float) * static_cast<std::size_t>(planes * in_size), stream));
  if (out_size == 0) return;
  max_pool_backward_kernel<<<grid_blocks(planes), kBlockThreads, 0, stream>>>(d_y, argmax, d_x, planes, in_size,
                                                                              out_size);
  PROPLAB_CUDA_CHECK_LAUNCH("max_pool_backward_kernel");
}

void global_avg_pool_forward(const float* x, float* y, std::int64_t planes, std::int64_t size) {
  if (planes == 0) return;
  global_avg_forward_kernel<<<grid_blocks(planes), kBlockThreads, 0, context().stream>>>(x, y, planes, size);
  PROPLAB_CUDA_CHECK_LAUNCH("global_avg_forward_kernel");
}

void global_avg_pool_backward(const float* d_y, float* d_x, std::int64_t planes, std::int64_t size) {
  const std::int64_t total = planes * size;
  if (total == 0) return;
  const float inv = 1.0f / static_cast<float>(size);
  global_avg_backward_kernel<<<grid_blocks(total), kBlockThreads, 0, context().stream>>>(d_y, d_x, planes, size, inv);
  PROPLAB_CUDA_CHECK_LAUNCH("global_avg_backward_kernel");
}

void nchw_to_nhwc(const float* x, float* y, std::int64_t n, std::int64_t channels, std::int64_t pixels) {
  const std::int64_t total = n * channels * pixels;
  if (total == 0) return;
  nchw_to_nhwc_kernel<<<grid_blocks(total), kBlockThreads, 0, context().stream>>>(x, y, n, channels, pixels);
  PROPLAB_CUDA_CHECK_LAUNCH("nchw_to_nhwc_kernel");
}

void nhwc_to_nchw(const float* x, float* y, std::int64_t n, std::int64_t channels, std::int64_t pixels) {
  const std::int64_t total = n * channels * pixels;
  if (total == 0) return;
  nhwc_to_nchw_kernel<<<grid_blocks(total), kBlockThreads, 0, context().stream>>>(x, y, n, channels, pixels);
  PROPLAB_CUDA_CHECK_LAUNCH("nhwc_to_nchw_kernel");
}

}  // namespace proplab::kernels
