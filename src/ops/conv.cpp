// ops/conv: 2-D convolution on NCHW images, with stride, zero padding and groups. On CPUs with AVX-512F:
// Winograd F(2×2, 3×3) (ops/conv_winograd.h) for the forward and the stride-1 d_x of 3 × 3, stride-1, one-group
// convolutions; the packed direct kernel (ops/conv_direct.h) for the other forwards and d_x of one-group
// convolutions (strided ones from 32 input channels) and their weight gradients; im2col + sgemm for the rest
// (conv_kernel(), ops.h).
// The im2col path:
//
// Samples are processed in fixed chunks (a function of the shape only, sized so a chunk's columns stay in the L2
// cache): im2col writes a chunk's columns [C_in/groups · KH · KW, chunk · H_out · W_out] for one group, one sgemm
// multiplies them by that group's weights, and the result is scattered into NCHW. The weight gradient is one
// sgemm per chunk into its own partial, and the partials are added in chunk order, so it is bitwise the same for
// any thread count.
//
// Threads: with several chunks, chunks run in parallel on the OpenMP pool and each calls ops::sgemm (ops/gemm.h)
// from inside the region, where it runs on the calling thread: one pool, no oversubscription, and no fork-join
// inside every small product. With a single chunk, im2col/col2im and the product's fixed pieces run on the pool
// instead. Either way every chunk computes the same numbers, so results are bitwise the same for any thread count.
// Chunks are handed out dynamically: on shared cores a thread that loses its core no longer holds up the others
// at the barrier.
//
// On CUDA the same scheme runs in kernels/conv.cuh (im2col, cuBLASLt gemm, a gathering col2im), with bf16 product
// inputs under MatmulPrecision::bf16 (core/device.h); the CPU always runs f32.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

#include "ops/conv_direct.h"
#include "ops/conv_winograd.h"
#include "ops/dispatch.h"
#include "ops/gemm.h"
#include "ops/ops.h"

#ifdef PROPLAB_WITH_CUDA
#include "core/device.h"
#include "kernels/conv.cuh"
#include "kernels/matmul.cuh"
#endif

namespace proplab::ops {

namespace {

constexpr std::int64_t kParallelMin = 1 << 14;
// Upper bound on the floats of one chunk's column buffer (1 MiB: it stays in the L2 cache between im2col and
// sgemm, which measured faster than fewer, larger sgemm calls); at least one sample per chunk.
constexpr std::int64_t kColumnBudget = 1 << 18;

struct ConvGeometry {
  std::int64_t n = 0, c_in = 0, h = 0, w = 0;
  std::int64_t c_out = 0, kh = 0, kw = 0;
  std::int64_t h_out = 0, w_out = 0;
  std::int64_t groups = 1, c_in_group = 0, c_out_group = 0;
  std::int64_t patch = 0;   // c_in_group · kh · kw: rows of the column matrix
  std::int64_t pixels = 0;  // h_out · w_out
  std::int64_t chunk = 1;   // samples per chunk
  int stride = 1, padding = 0;
};

// Fills patch, pixels and chunk from the other fields.
void set_chunk(ConvGeometry& g) {
  g.patch = g.c_in_group * g.kh * g.kw;
  g.pixels = g.h_out * g.w_out;
  g.chunk = std::clamp<std::int64_t>(kColumnBudget / std::max<std::int64_t>(g.patch * g.pixels, 1), 1,
                                     std::max<std::int64_t>(g.n, 1));
}

ConvGeometry geometry(const char* op, const Tensor& x, const Tensor& weight, const Conv2dParams& params) {
  PROPLAB_CHECK(x.ndim() == 4, "op '", op, "': x must be [N, C, H, W], got ", shape_string(x.shape()));
  PROPLAB_CHECK(weight.ndim() == 4, "op '", op, "': weight must be [C_out, C_in/groups, KH, KW], got ",
                shape_string(weight.shape()));
  PROPLAB_CHECK(params.groups >= 1 && params.stride >= 1 && params.padding >= 0, "op '", op,
                "': groups and stride must be >= 1 and padding >= 0");
  ConvGeometry g;
  g.n = x.dim(0), g.c_in = x.dim(1), g.h = x.dim(2), g.w = x.dim(3);
  g.c_out = weight.dim(0), g.kh = weight.dim(2), g.kw = weight.dim(3);
  g.groups = params.groups;
  g.stride = params.stride;
  g.padding = params.padding;
  PROPLAB_CHECK(g.c_in % g.groups == 0 && g.c_out % g.groups == 0, "op '", op, "': channels ", g.c_in, " -> ", g.c_out,
                " are not divisible by groups ", g.groups);
  g.c_in_group = g.c_in / g.groups;
  g.c_out_group = g.c_out / g.groups;
  PROPLAB_CHECK(weight.dim(1) == g.c_in_group, "op '", op, "': weight ", shape_string(weight.shape()),
                " does not take ", g.c_in_group, " input channels per group");
  g.h_out = conv2d_out_size(g.h, g.kh, params.stride, params.padding);
  g.w_out = conv2d_out_size(g.w, g.kw, params.stride, params.padding);
  set_chunk(g);
  return g;
}

// The output columns [lo, hi) whose kernel tap at column offset j reads inside the input row (the rest read
// padding): iw = ow·stride − padding + j ∈ [0, w). Same for rows with (h, h_out).
struct TapRange {
  std::int64_t lo = 0, hi = 0;
};

TapRange tap_range(std::int64_t j, std::int64_t in, std::int64_t out, int stride, int padding) {
  const std::int64_t first = padding - j;          // ow·stride >= first
  const std::int64_t last = in - 1 + padding - j;  // ow·stride <= last
  TapRange r;
  r.lo = first <= 0 ? 0 : (first + stride - 1) / stride;
  r.hi = last < 0 ? 0 : std::min(out, last / stride + 1);
  if (r.hi < r.lo) r.hi = r.lo;
  return r;
}

// Columns for samples [n0, n0 + count) of group `group`: cols[(c·kh + i)·kw + j][s·pixels + p] is x at the
// input position that kernel tap (i, j) of output pixel p reads (0 in the padding). Each output row is a zero
// head, a contiguous (stride 1) or strided copy of the input row, and a zero tail.
void im2col(const float* x, const ConvGeometry& g, std::int64_t group, std::int64_t n0, std::int64_t count, float* cols,
            bool parallel) {
  const std::int64_t row_length = count * g.pixels;
#pragma omp parallel for collapse(2) schedule(static) if (parallel && g.patch * row_length > kParallelMin)
  for (std::int64_t row = 0; row < g.patch; ++row) {
    for (std::int64_t s = 0; s < count; ++s) {
      const std::int64_t c = row / (g.kh * g.kw), i = (row / g.kw) % g.kh, j = row % g.kw;
      const float* plane = x + ((n0 + s) * g.c_in + group * g.c_in_group + c) * g.h * g.w;
      float* out = cols + row * row_length + s * g.pixels;
      const TapRange rows = tap_range(i, g.h, g.h_out, g.stride, g.padding);
      const TapRange columns = tap_range(j, g.w, g.w_out, g.stride, g.padding);
      if (rows.hi <= rows.lo || columns.hi <= columns.lo) {
        std::fill(out, out + g.pixels, 0.0f);
        continue;
      }
      const std::int64_t shift = j - g.padding;
      if (g.stride == 1 && g.w_out == g.w) {
        // Same-size output: the tap's plane is the input plane shifted by (i − padding) rows and (j − padding)
        // columns, so one contiguous copy covers every valid row; the few elements it wraps across row ends
        // (and the rows that read padding) are then zeroed.
        const std::int64_t begin = rows.lo * g.w + columns.lo, end = (rows.hi - 1) * g.w + columns.hi;
        const float* from = plane + begin + (i - g.padding) * g.w + shift;
        std::fill(out, out + begin, 0.0f);
        std::memcpy(out + begin, from, sizeof(float) * static_cast<std::size_t>(end - begin));
        std::fill(out + end, out + g.pixels, 0.0f);
        for (std::int64_t oh = rows.lo; oh < rows.hi; ++oh) {
          float* out_row = out + oh * g.w;
          for (std::int64_t ow = 0; ow < columns.lo; ++ow) out_row[ow] = 0.0f;
          for (std::int64_t ow = columns.hi; ow < g.w; ++ow) out_row[ow] = 0.0f;
        }
        continue;
      }
      std::fill(out, out + rows.lo * g.w_out, 0.0f);
      for (std::int64_t oh = rows.lo; oh < rows.hi; ++oh) {
        // The input element tap (i, j) of output column ow reads: in_row[ow·stride + shift], valid in [lo, hi).
        const float* in_row = plane + (oh * g.stride - g.padding + i) * g.w;
        float* out_row = out + oh * g.w_out;
        for (std::int64_t ow = 0; ow < columns.lo; ++ow) out_row[ow] = 0.0f;
        for (std::int64_t ow = columns.lo; ow < columns.hi; ++ow) out_row[ow] = in_row[ow * g.stride + shift];
        for (std::int64_t ow = columns.hi; ow < g.w_out; ++ow) out_row[ow] = 0.0f;
      }
      std::fill(out + rows.hi * g.w_out, out + g.pixels, 0.0f);
    }
  }
}

// The inverse scatter: d_x planes of group `group`, samples [n0, n0 + count), are overwritten with the sum of the
// column gradients that read them. One task per (sample, channel) plane, taps in a fixed order: no races.
void col2im(const float* cols, const ConvGeometry& g, std::int64_t group, std::int64_t n0, std::int64_t count,
            float* d_x, bool parallel) {
  const std::int64_t row_length = count * g.pixels;
#pragma omp parallel for collapse(2) schedule(static) if (parallel && g.patch * row_length > kParallelMin)
  for (std::int64_t s = 0; s < count; ++s) {
    for (std::int64_t c = 0; c < g.c_in_group; ++c) {
      float* plane = d_x + ((n0 + s) * g.c_in + group * g.c_in_group + c) * g.h * g.w;
      std::fill(plane, plane + g.h * g.w, 0.0f);
      for (std::int64_t i = 0; i < g.kh; ++i) {
        const TapRange rows = tap_range(i, g.h, g.h_out, g.stride, g.padding);
        for (std::int64_t j = 0; j < g.kw; ++j) {
          const TapRange columns = tap_range(j, g.w, g.w_out, g.stride, g.padding);
          const float* in = cols + ((c * g.kh + i) * g.kw + j) * row_length + s * g.pixels;
          for (std::int64_t oh = rows.lo; oh < rows.hi; ++oh) {
            float* out_row = plane + (oh * g.stride - g.padding + i) * g.w;
            const std::int64_t shift = j - g.padding;
            const float* in_row = in + oh * g.w_out;
            if (g.stride == 1) {
              float* to = out_row + columns.lo + shift;
              const float* from = in_row + columns.lo;
#pragma omp simd
              for (std::int64_t k = 0; k < columns.hi - columns.lo; ++k) to[k] += from[k];
            } else {
              for (std::int64_t ow = columns.lo; ow < columns.hi; ++ow) out_row[ow * g.stride + shift] += in_row[ow];
            }
          }
        }
      }
    }
  }
}

// Scratch reused across calls on the calling thread (no allocation per step).
float* scratch(std::vector<float>& buffer, std::int64_t count) {
  if (static_cast<std::int64_t>(buffer.size()) < count) buffer.resize(static_cast<std::size_t>(count));
  return buffer.data();
}

std::atomic<ConvKernel>& kernel_setting() {
  static std::atomic<ConvKernel> setting{[] {
    const char* env = std::getenv("PROPLAB_CONV");
    const std::string_view name = env ? env : "";
    return name == "im2col" ? ConvKernel::im2col : name == "direct" ? ConvKernel::direct : ConvKernel::winograd;
  }()};
  return setting;
}

// The AVX-512 kernels' shape of g (one group).
detail::DirectConvShape kernel_shape(const ConvGeometry& g) {
  detail::DirectConvShape s;
  s.n = g.n, s.c_in = g.c_in, s.h = g.h, s.w = g.w;
  s.c_out = g.c_out, s.kh = g.kh, s.kw = g.kw, s.h_out = g.h_out, s.w_out = g.w_out;
  s.stride = g.stride, s.padding = g.padding;
  return s;
}

// Fills the direct kernel's shape for g and returns true when that kernel runs g (one group, the setting, the
// CPU, and not a strided convolution of few channels).
bool direct_shape(const ConvGeometry& g, detail::DirectConvShape& s) {
  if (g.groups != 1 || kernel_setting().load(std::memory_order_relaxed) == ConvKernel::im2col) return false;
  // Strided convolutions with few input channels run faster through im2col (bench_conv --kernels, ResNet-20:
  // 16 → 32 channels at stride 2, 0.70× and 0.74×; 32 → 64, 1.18× and 1.86×).
  if (g.stride != 1 && g.c_in < 32) return false;
  s = kernel_shape(g);
  return detail::direct_conv_fits(s);
}

// Fills the kernels' shape for g and returns true when Winograd F(2×2, 3×3) runs g (one group, 3 × 3, stride 1,
// the setting, the CPU).
bool winograd_shape(const ConvGeometry& g, detail::DirectConvShape& s) {
  if (g.groups != 1 || g.stride != 1 || g.kh != 3 || g.kw != 3) return false;
  if (kernel_setting().load(std::memory_order_relaxed) != ConvKernel::winograd) return false;
  s = kernel_shape(g);
  return detail::winograd_conv_fits(s);
}

// y = conv(x, weight) (+ bias) for the geometry g, chunk by chunk: im2col, one sgemm, scatter into NCHW.
void forward_columns(const float* x_data, const ConvGeometry& g, const float* weight, const float* bias_data,
                     float* y_data) {
  const std::int64_t chunks = (g.n + g.chunk - 1) / g.chunk;
  const bool per_chunk = chunks > 1;
#pragma omp parallel if (per_chunk)
  {
    thread_local std::vector<float> cols_buffer, out_buffer;
    float* cols = scratch(cols_buffer, g.patch * g.chunk * g.pixels);
    float* out = scratch(out_buffer, g.c_out_group * g.chunk * g.pixels);
#pragma omp for schedule(dynamic)
    for (std::int64_t chunk = 0; chunk < chunks; ++chunk) {
      const std::int64_t n0 = chunk * g.chunk;
      const std::int64_t count = std::min(g.chunk, g.n - n0);
      const std::int64_t columns = count * g.pixels;
      for (std::int64_t group = 0; group < g.groups; ++group) {
        im2col(x_data, g, group, n0, count, cols, !per_chunk);
        // out [C_out_g, columns] = W_g [C_out_g, patch] · cols [patch, columns]
        sgemm(false, false, g.c_out_group, columns, g.patch, 1.0f, weight + group * g.c_out_group * g.patch, g.patch,
              cols, columns, 0.0f, out, columns);
#pragma omp parallel for collapse(2) schedule(static) if (!per_chunk && g.c_out_group * columns > kParallelMin)
        for (std::int64_t s = 0; s < count; ++s) {
          for (std::int64_t o = 0; o < g.c_out_group; ++o) {
            const std::int64_t channel = group * g.c_out_group + o;
            const float b = bias_data ? bias_data[channel] : 0.0f;
            const float* from = out + o * columns + s * g.pixels;
            float* to = y_data + ((n0 + s) * g.c_out + channel) * g.pixels;
#pragma omp simd
            for (std::int64_t p = 0; p < g.pixels; ++p) to[p] = from[p] + b;
          }
        }
      }
    }
  }
}

// y = conv(x, weight) (+ bias) on the fastest kernel that runs g: Winograd, direct, or im2col (forward_columns).
void forward_any(const float* x_data, const ConvGeometry& g, const float* weight, const float* bias_data,
                 float* y_data) {
  if (detail::DirectConvShape s; winograd_shape(g, s))
    detail::winograd_conv_forward(x_data, weight, bias_data, y_data, s);
  else if (direct_shape(g, s))
    detail::direct_conv_forward(x_data, weight, bias_data, y_data, s);
  else
    forward_columns(x_data, g, weight, bias_data, y_data);
}

// d_weight += the weight gradient through im2col + sgemm, chunk by chunk; with d_x, also d_x through col2im.
void weight_grad_columns(const float* x_data, const float* d_y_data, const float* weight_data, const ConvGeometry& g,
                         float* d_w, Tensor* d_x) {
  // Each chunk's weight gradient goes to its own partial [groups · C_out_g, patch]; they are added below.
  const std::int64_t chunks = (g.n + g.chunk - 1) / g.chunk;
  const std::int64_t weight_numel = g.c_out * g.patch;
  thread_local std::vector<float> partial_buffer;
  float* partials = scratch(partial_buffer, chunks * weight_numel);
  const bool per_chunk = chunks > 1;
#pragma omp parallel if (per_chunk)
  {
    thread_local std::vector<float> cols_buffer, d_out_buffer;
    float* cols = scratch(cols_buffer, g.patch * g.chunk * g.pixels);
    float* d_out = scratch(d_out_buffer, g.c_out_group * g.chunk * g.pixels);
#pragma omp for schedule(dynamic)
    for (std::int64_t chunk = 0; chunk < chunks; ++chunk) {
      const std::int64_t n0 = chunk * g.chunk;
      const std::int64_t count = std::min(g.chunk, g.n - n0);
      const std::int64_t columns = count * g.pixels;
      for (std::int64_t group = 0; group < g.groups; ++group) {
        // d_out [C_out_g, columns] gathered from d_y's NCHW planes.
#pragma omp parallel for collapse(2) schedule(static) if (!per_chunk && g.c_out_group * columns > kParallelMin)
        for (std::int64_t s = 0; s < count; ++s) {
          for (std::int64_t o = 0; o < g.c_out_group; ++o) {
            const float* from = d_y_data + ((n0 + s) * g.c_out + group * g.c_out_group + o) * g.pixels;
            std::memcpy(d_out + o * columns + s * g.pixels, from, sizeof(float) * static_cast<std::size_t>(g.pixels));
          }
        }
        im2col(x_data, g, group, n0, count, cols, !per_chunk);
        // partial d_W_g [C_out_g, patch] = d_out [C_out_g, columns] · cols^T [columns, patch]
        sgemm(false, true, g.c_out_group, g.patch, columns, 1.0f, d_out, columns, cols, columns, 0.0f,
              partials + chunk * weight_numel + group * g.c_out_group * g.patch, g.patch);
        if (d_x) {
          // d_cols [patch, columns] = W_g^T [patch, C_out_g] · d_out [C_out_g, columns], scattered back into d_x.
          sgemm(true, false, g.patch, columns, g.c_out_group, 1.0f, weight_data + group * g.c_out_group * g.patch,
                g.patch, d_out, columns, 0.0f, cols, columns);
          col2im(cols, g, group, n0, count, d_x->f32(), !per_chunk);
        }
      }
    }
  }
  // d_weight += the partials, chunk by chunk in order, per element.
#pragma omp parallel for schedule(static) if (weight_numel * chunks > kParallelMin)
  for (std::int64_t i = 0; i < weight_numel; ++i) {
    float sum = d_w[i];
    for (std::int64_t chunk = 0; chunk < chunks; ++chunk) sum += partials[chunk * weight_numel + i];
    d_w[i] = sum;
  }
}

#ifdef PROPLAB_WITH_CUDA
kernels::ConvShape device_shape(const ConvGeometry& g) {
  kernels::ConvShape s;
  s.n = g.n, s.c_in = g.c_in, s.h = g.h, s.w = g.w;
  s.c_out = g.c_out, s.kh = g.kh, s.kw = g.kw;
  s.h_out = g.h_out, s.w_out = g.w_out;
  s.groups = g.groups, s.stride = g.stride, s.padding = g.padding;
  return s;
}

// The inputs of the convolution's CUDA products under the process's matrix-product precision (core/device.h).
kernels::GemmInput gemm_input() {
  return matmul_precision() == MatmulPrecision::bf16 ? kernels::GemmInput::bf16 : kernels::GemmInput::f32;
}
#endif

}  // namespace

std::int64_t conv2d_out_size(std::int64_t in, std::int64_t kernel, int stride, int padding) {
  const std::int64_t span = in + 2 * static_cast<std::int64_t>(padding) - kernel;
  if (span < 0 || stride < 1)
    throw UserError("conv2d: input size " + std::to_string(in) + " with padding " + std::to_string(padding) +
                    " is smaller than the kernel " + std::to_string(kernel) + " (or stride < 1)");
  return span / stride + 1;
}

void conv2d_forward(const Tensor& x, const Tensor& weight, const Tensor* bias, const Conv2dParams& params, Tensor& y) {
  constexpr const char* op = "conv2d_forward";
  const ConvGeometry g = geometry(op, x, weight, params);
  expect_shape(op, "x", x, x.shape());
  expect_shape(op, "weight", weight, weight.shape());
  if (bias) expect_shape(op, "bias", *bias, {g.c_out});
  expect_shape(op, "y", y, {g.n, g.c_out, g.h_out, g.w_out});
  const Device device = common_device(op, {&x, &weight, bias, &y});
  if (device == Device::cuda) {
#ifdef PROPLAB_WITH_CUDA
    kernels::conv2d_forward(x.f32(), weight.f32(), bias ? bias->f32() : nullptr, y.f32(), device_shape(g),
                            gemm_input());
    return;
#else
    missing_device_impl(op, device);
#endif
  }
  if (g.n == 0 || g.c_out == 0) return;
  forward_any(x.f32(), g, weight.f32(), bias ? bias->f32() : nullptr, y.f32());
}

ConvKernel conv_kernel() { return kernel_setting().load(std::memory_order_relaxed); }

bool conv_direct_supported() {
  detail::DirectConvShape probe;
  probe.n = probe.c_in = probe.h = probe.w = probe.c_out = probe.kh = probe.kw = probe.h_out = probe.w_out = 1;
  return detail::direct_conv_fits(probe);
}

void set_conv_kernel(ConvKernel kernel) { kernel_setting().store(kernel, std::memory_order_relaxed); }

void conv2d_backward(const Tensor& x, const Tensor& weight, const Tensor& d_y, const Conv2dParams& params, Tensor* d_x,
                     Tensor& d_weight, Tensor* d_bias) {
  constexpr const char* op = "conv2d_backward";
  const ConvGeometry g = geometry(op, x, weight, params);
  expect_shape(op, "x", x, x.shape());
  expect_shape(op, "weight", weight, weight.shape());
  expect_shape(op, "d_y", d_y, {g.n, g.c_out, g.h_out, g.w_out});
  if (d_x) expect_shape(op, "d_x", *d_x, x.shape());
  expect_shape(op, "d_weight", d_weight, weight.shape());
  if (d_bias) expect_shape(op, "d_bias", *d_bias, {g.c_out});
  const Device device = common_device(op, {&x, &weight, &d_y, d_x, &d_weight, d_bias});
  if (device == Device::cuda) {
#ifdef PROPLAB_WITH_CUDA
    kernels::conv2d_backward(x.f32(), weight.f32(), d_y.f32(), d_x ? d_x->f32() : nullptr, d_weight.f32(),
                             d_bias ? d_bias->f32() : nullptr, device_shape(g), gemm_input());
    return;
#else
    missing_device_impl(op, device);
#endif
  }
  if (g.n == 0) return;
  if (g.c_out == 0) {
    if (d_x) std::fill(d_x->f32(), d_x->f32() + d_x->numel(), 0.0f);
    return;
  }

  // Stride 1, one group, square kernel, padding < kernel: d_x is itself a convolution, of d_y with the kernel
  // flipped and its channel axes swapped, padding kernel − 1 − padding. That sgemm sums over C_out·KH·KW (not
  // C_out alone) and needs no col2im scatter: measured about twice as fast at ResNet shapes.
  const bool d_x_by_conv = d_x && g.groups == 1 && g.stride == 1 && g.kh == g.kw && g.padding < g.kh;
  thread_local std::vector<float> flipped_buffer;
  const float* x_data = x.f32();
  const float* d_y_data = d_y.f32();
  if (d_x_by_conv) {
    ConvGeometry t;
    t.n = g.n, t.c_in = g.c_out, t.h = g.h_out, t.w = g.w_out;
    t.c_out = g.c_in, t.kh = g.kh, t.kw = g.kw;
    t.h_out = g.h, t.w_out = g.w;
    t.groups = 1, t.c_in_group = g.c_out, t.c_out_group = g.c_in;
    t.stride = 1;
    t.padding = static_cast<int>(g.kh) - 1 - g.padding;
    set_chunk(t);
    // flipped [C_in, C_out, KH, KW]: flipped[ci][co][a][b] = weight[co][ci][KH−1−a][KW−1−b].
    float* flipped = scratch(flipped_buffer, g.c_out * g.patch);
    const float* w = weight.f32();
    const std::int64_t taps = g.kh * g.kw;
    for (std::int64_t co = 0; co < g.c_out; ++co)
      for (std::int64_t ci = 0; ci < g.c_in; ++ci)
        for (std::int64_t tap = 0; tap < taps; ++tap)
          flipped[(ci * g.c_out + co) * taps + (taps - 1 - tap)] = w[(co * g.c_in + ci) * taps + tap];
    forward_any(d_y_data, t, flipped, nullptr, d_x->f32());
  }
  // The weight gradient: the direct kernel where it runs this shape and d_x needs no col2im; else im2col below.
  if (detail::DirectConvShape s; (!d_x || d_x_by_conv) && direct_shape(g, s)) {
    detail::direct_conv_weight_grad(x_data, d_y_data, d_weight.f32(), s);
  } else {
    weight_grad_columns(x_data, d_y_data, weight.f32(), g, d_weight.f32(), d_x_by_conv ? nullptr : d_x);
  }
  if (d_bias) {
    float* d_b = d_bias->f32();
    // Per channel, summed over samples then pixels in a fixed order in double.
#pragma omp parallel for schedule(static) if (g.n * g.c_out * g.pixels > kParallelMin)
    for (std::int64_t o = 0; o < g.c_out; ++o) {
      double sum = 0.0;
      for (std::int64_t s = 0; s < g.n; ++s) {
        const float* plane = d_y_data + (s * g.c_out + o) * g.pixels;
        for (std::int64_t p = 0; p < g.pixels; ++p) sum += plane[p];
      }
      d_b[o] += static_cast<float>(sum);
    }
  }
}

}  // namespace proplab::ops
