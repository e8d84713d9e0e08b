// ops/pool: average, max and global average pooling over NCHW images, and the channels-last view for probes.
//
// Every loop is one task per (sample, channel) plane writing only its own outputs: no reductions across tasks,
// so results do not depend on the thread count. Max pooling saves each window's argmax (first on ties). The CUDA
// path (kernels/pool.cuh) computes every element in the same order and arithmetic.
#include <algorithm>
#include <cstdint>
#include <limits>

#include "ops/dispatch.h"
#include "ops/ops.h"

#ifdef PROPLAB_WITH_CUDA
#include "kernels/pool.cuh"
#endif

namespace proplab::ops {

namespace {

constexpr std::int64_t kParallelMin = 1 << 14;

void expect_image(const char* op, const char* what, const Tensor& t) {
  PROPLAB_CHECK(t.ndim() == 4, "op '", op, "': ", what, " must be [N, C, H, W], got ", shape_string(t.shape()));
  expect_shape(op, what, t, t.shape());
}

}  // namespace

void avg_pool2d_forward(const Tensor& x, int kernel, int stride, Tensor& y) {
  constexpr const char* op = "avg_pool2d_forward";
  expect_image(op, "x", x);
  const std::int64_t n = x.dim(0), c = x.dim(1), h = x.dim(2), w = x.dim(3);
  const std::int64_t h_out = conv2d_out_size(h, kernel, stride, 0), w_out = conv2d_out_size(w, kernel, stride, 0);
  expect_shape(op, "y", y, {n, c, h_out, w_out});
  if (common_device(op, {&x, &y}) == Device::cuda) {
#ifdef PROPLAB_WITH_CUDA
    kernels::avg_pool2d_forward(x.f32(), y.f32(), n * c, h, w, h_out, w_out, kernel, stride);
    return;
#else
    missing_device_impl(op, Device::cuda);
#endif
  }
  const float inv = 1.0f / static_cast<float>(kernel * kernel);
  const float* x_data = x.f32();
  float* y_data = y.f32();
#pragma omp parallel for schedule(static) if (x.numel() > kParallelMin)
  for (std::int64_t plane = 0; plane < n * c; ++plane) {
    const float* in = x_data + plane * h * w;
    float* out = y_data + plane * h_out * w_out;
    for (std::int64_t oh = 0; oh < h_out; ++oh)
      for (std::int64_t ow = 0; ow < w_out; ++ow) {
        float sum = 0.0f;
        for (int i = 0; i < kernel; ++i)
          for (int j = 0; j < kernel; ++j) sum += in[(oh * stride + i) * w + ow * stride + j];
        out[oh * w_out + ow] = sum * inv;
      }
  }
}

void avg_pool2d_backward(const Tensor& d_y, int kernel, int stride, Tensor& d_x) {
  constexpr const char* op = "avg_pool2d_backward";
  expect_image(op, "d_x", d_x);
  const std::int64_t n = d_x.dim(0), c = d_x.dim(1), h = d_x.dim(2), w = d_x.dim(3);
  const std::int64_t h_out = conv2d_out_size(h, kernel, stride, 0), w_out = conv2d_out_size(w, kernel, stride, 0);
  expect_shape(op, "d_y", d_y, {n, c, h_out, w_out});
  if (common_device(op, {&d_y, &d_x}) == Device::cuda) {
#ifdef PROPLAB_WITH_CUDA
    kernels::avg_pool2d_backward(d_y.f32(), d_x.f32(), n * c, h, w, h_out, w_out, kernel, stride);
    return;
#else
    missing_device_impl(op, Device::cuda);
#endif
  }
  const float inv = 1.0f / static_cast<float>(kernel * kernel);
  const float* d_y_data = d_y.f32();
  float* d_x_data = d_x.f32();
#pragma omp parallel for schedule(static) if (d_x.numel() > kParallelMin)
  for (std::int64_t plane = 0; plane < n * c; ++plane) {
    float* out = d_x_data + plane * h * w;
    const float* in = d_y_data + plane * h_out * w_out;
    for (std::int64_t i = 0; i < h * w; ++i) out[i] = 0.0f;
    for (std::int64_t oh = 0; oh < h_out; ++oh)
      for (std::int64_t ow = 0; ow < w_out; ++ow) {
        const float g = in[oh * w_out + ow] * inv;
        for (int i = 0; i < kernel; ++i)
          for (int j = 0; j < kernel; ++j) out[(oh * stride + i) * w + ow * stride + j] += g;
      }
  }
}

void max_pool2d_forward(const Tensor& x, int kernel, int stride, int padding, Tensor& y, Tensor& argmax) {
  constexpr const char* op = "max_pool2d_forward";
  expect_image(op, "x", x);
  const std::int64_t n = x.dim(0), c = x.dim(1), h = x.dim(2), w = x.dim(3);
  PROPLAB_CHECK(2 * padding < kernel, "op '", op, "': padding ", padding, " must be below half the kernel ", kernel);
  const std::int64_t h_out = conv2d_out_size(h, kernel, stride, padding);
  const std::int64_t w_out = conv2d_out_size(w, kernel, stride, padding);
  expect_shape(op, "y", y, {n, c, h_out, w_out});
  expect_shape(op, "argmax", argmax, {n, c, h_out, w_out}, DType::i32);
  if (common_device(op, {&x, &y, &argmax}) == Device::cuda) {
#ifdef PROPLAB_WITH_CUDA
    kernels::max_pool2d_forward(x.f32(), y.f32(), argmax.i32(), n * c, h, w, h_out, w_out, kernel, stride, padding);
    return;
#else
    missing_device_impl(op, Device::cuda);
#endif
  }
  const float* x_data = x.f32();
  float* y_data = y.f32();
  std::int32_t* arg = argmax.i32();
#pragma omp parallel for schedule(static) if (x.numel() > kParallelMin)
  for (std::int64_t plane = 0; plane < n * c; ++plane) {
    const float* in = x_data + plane * h * w;
    for (std::int64_t oh = 0; oh < h_out; ++oh)
      for (std::int64_t ow = 0; ow < w_out; ++ow) {
        float best = -std::numeric_limits<float>::infinity();
        std::int64_t best_index = -1;
        for (int i = 0; i < kernel; ++i) {
          const std::int64_t ih = oh * stride - padding + i;
          if (ih < 0 || ih >= h) continue;
          for (int j = 0; j < kernel; ++j) {
            const std::int64_t iw = ow * stride - padding + j;
            if (iw < 0 || iw >= w) continue;
            const float v = in[ih * w + iw];
            if (best_index < 0 || v > best) {
              best = v;
              best_index = ih * w + iw;
            }
          }
        }
        const std::int64_t o = plane * h_out * w_out + oh * w_out + ow;
        y_data[o] = best;
        arg[o] = static_cast<std::int32_t>(best_index);
      }
  }
}

void max_pool2d_backward(const Tensor& d_y, const Tensor& argmax, Tensor& d_x) {
  constexpr const char* op = "max_pool2d_backward";
  expect_image(op, "d_x", d_x);
  expect_image(op, "d_y", d_y);
  expect_shape(op, "argmax", argmax, d_y.shape(), DType::i32);
  PROPLAB_CHECK(d_y.dim(0) == d_x.dim(0) && d_y.dim(1) == d_x.dim(1), "op '", op, "': d_y ", shape_string(d_y.shape()),
                " and d_x ", shape_string(d_x.shape()), " differ in N or C");
  if (common_device(op, {&d_y, &argmax, &d_x}) == Device::cuda) {
#ifdef PROPLAB_WITH_CUDA
    kernels::max_pool2d_backward(d_y.f32(), argmax.i32(), d_x.f32(), d_x.dim(0) * d_x.dim(1), d_x.dim(2) * d_x.dim(3),
                                 d_y.dim(2) * d_y.dim(3));
    return;
#else
    missing_device_impl(op, Device::cuda);
#endif
  }
  const std::int64_t planes = d_x.dim(0) * d_x.dim(1), in_size = d_x.dim(2) * d_x.dim(3);
  const std::int64_t out_size = d_y.dim(2) * d_y.dim(3);
  const float* d_y_data = d_y.f32();
  const std::int32_t* arg = argmax.i32();
  float* d_x_data = d_x.f32();
#pragma omp parallel for schedule(static) if (d_x.numel() > kParallelMin)
  for (std::int64_t plane = 0; plane < planes; ++plane) {
    float* out = d_x_data + plane * in_size;
    for (std::int64_t i = 0; i < in_size; ++i) out[i] = 0.0f;
    for (std::int64_t o = 0; o < out_size; ++o) out[arg[plane * out_size + o]] += d_y_data[plane * out_size + o];
  }
}

void global_avg_pool_forward(const Tensor& x, Tensor& y) {
  constexpr const char* op = "global_avg_pool_forward";
  expect_image(op, "x", x);
  const std::int64_t planes = x.dim(0) * x.dim(1), size = x.dim(2) * x.dim(3);
  expect_shape(op, "y", y, {x.dim(0), x.dim(1)});
  if (common_device(op, {&x, &y}) == Device::cuda) {
#ifdef PROPLAB_WITH_CUDA
    kernels::global_avg_pool_forward(x.f32(), y.f32(), planes, size);
    return;
#else
    missing_device_impl(op, Device::cuda);
#endif
  }
  const float* x_data = x.f32();
  float* y_data = y.f32();
#pragma omp parallel for schedule(static) if (x.numel() > kParallelMin)
  for (std::int64_t plane = 0; plane < planes; ++plane) {
    double sum = 0.0;
    for (std::int64_t i = 0; i < size; ++i) sum += x_data[plane * size + i];
    y_data[plane] = static_cast<float>(sum / static_cast<double>(size));
  }
}

void global_avg_pool_backward(const Tensor& d_y, Tensor& d_x) {
  constexpr const char* op = "global_avg_pool_backward";
  expect_image(op, "d_x", d_x);
  const std::int64_t planes = d_x.dim(0) * d_x.dim(1), size = d_x.dim(2) * d_x.dim(3);
  expect_shape(op, "d_y", d_y, {d_x.dim(0), d_x.dim(1)});
  if (common_device(op, {&d_y, &d_x}) == Device::cuda) {
#ifdef PROPLAB_WITH_CUDA
    kernels::global_avg_pool_backward(d_y.f32(), d_x.f32(), planes, size);
    return;
#else
    missing_device_impl(op, Device::cuda);
#endif
  }
  const float* d_y_data = d_y.f32();
  float* d_x_data = d_x.f32();
  const float inv = 1.0f / static_cast<float>(size);
#pragma omp parallel for schedule(static) if (d_x.numel() > kParallelMin)
  for (std::int64_t plane = 0; plane < planes; ++plane) {
    const float g = d_y_data[plane] * inv;
    for (std::int64_t i = 0; i < size; ++i) d_x_data[plane * size + i] = g;
  }
}

void nchw_to_nhwc(const Tensor& x, Tensor& y) {
  constexpr const char* op = "nchw_to_nhwc";
  expect_image(op, "x", x);
  const std::int64_t n = x.dim(0), c = x.dim(1), pixels = x.dim(2) * x.dim(3);
  expect_shape(op, "y", y, {n, pixels, c});
  if (common_device(op, {&x, &y}) == Device::cuda) {
#ifdef PROPLAB_WITH_CUDA
    kernels::nchw_to_nhwc(x.f32(), y.f32(), n, c, pixels);
    return;
#else
    missing_device_impl(op, Device::cuda);
#endif
  }
  const float* in = x.f32();
  float* out = y.f32();
  // In blocks of kPixelBlock pixels: each channel's run of the block is read contiguously, and the block's output
  // rows (kPixelBlock × C floats) stay in L1 while every channel writes its column into them. The copy is still a
  // pass over memory (6.4 MB per probe in ResNet-20's first stage at batch 128): a recorded step spends about 3%
  // of its time here either way (perf); accumulating the moments straight from NCHW is what would remove it.
  constexpr std::int64_t kPixelBlock = 32;
  const std::int64_t blocks = (pixels + kPixelBlock - 1) / kPixelBlock;
#pragma omp parallel for collapse(2) schedule(static) if (x.numel() > kParallelMin)
  for (std::int64_t b = 0; b < n; ++b)
    for (std::int64_t block = 0; block < blocks; ++block) {
      const std::int64_t p0 = block * kPixelBlock, p1 = std::min(pixels, p0 + kPixelBlock);
      float* to = out + (b * pixels + p0) * c;
      for (std::int64_t ch = 0; ch < c; ++ch) {
        const float* from = in + (b * c + ch) * pixels + p0;
        for (std::int64_t p = 0; p < p1 - p0; ++p) to[p * c + ch] = from[p];
      }
    }
}

void nhwc_to_nchw(const Tensor& x, Tensor& y) {
  constexpr const char* op = "nhwc_to_nchw";
  expect_image(op, "y", y);
  const std::int64_t n = y.dim(0), c = y.dim(1), pixels = y.dim(2) * y.dim(3);
  expect_shape(op, "x", x, {n, pixels, c});
  if (common_device(op, {&x, &y}) == Device::cuda) {
#ifdef PROPLAB_WITH_CUDA
    kernels::nhwc_to_nchw(x.f32(), y.f32(), n, c, pixels);
    return;
#else
    missing_device_impl(op, Device::cuda);
#endif
  }
  const float* in = x.f32();
  float* out = y.f32();
#pragma omp parallel for schedule(static) if (x.numel() > kParallelMin)
  for (std::int64_t b = 0; b < n; ++b)
    for (std::int64_t ch = 0; ch < c; ++ch)
      for (std::int64_t p = 0; p < pixels; ++p) out[(b * c + ch) * pixels + p] = in[(b * pixels + p) * c + ch];
}

}  // namespace proplab::ops
