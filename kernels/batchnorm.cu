#include "kernels/batchnorm.cuh"

#include <cuda_runtime.h>

#include <limits>

#include "core/error.h"
#include "kernels/block_reduce.cuh"
#include "kernels/common.cuh"
#include "kernels/context.cuh"

namespace proplab::kernels {
namespace {

struct Layout {
  std::int64_t n = 0, channels = 0, spatial = 0;
  std::int64_t count = 0;   // n · spatial: values per channel
  std::int64_t chunks = 1;  // per channel, at least 1
};

enum class Partial : std::uint8_t { sum, squared_deviation, backward };

// Block (channel, chunk) = (blockIdx.x / chunks, blockIdx.x % chunks) writes partials[(channel·chunks + chunk)·2 +
// k] for the values of its chunk:
//   sum:               k = 0: Σ x
//   squared_deviation: k = 0: Σ (x − centre[c])² (double)
//   backward:          k = 0: Σ d_y, k = 1: Σ d_y·x̂ with x̂ = (x − m[c])·r[c] in float
// (unused k are 0).
template <Partial kMode>
__global__ void __launch_bounds__(kBlockThreads)
    channel_partials_kernel(const float* x, const float* d_y, const double* centre, const float* m, const float* r,
                            Layout layout, double* partials) {
  __shared__ double shared[2 * kBlockThreads];
  const std::int64_t channel = blockIdx.x / layout.chunks;
  const std::int64_t chunk = blockIdx.x % layout.chunks;
  const std::int64_t begin = chunk * kBatchnormChunk;
  const std::int64_t end = begin + kBatchnormChunk < layout.count ? begin + kBatchnormChunk : layout.count;
  double sums[2] = {0.0, 0.0};
  double centre_c = 0.0;
  float m_c = 0.0f, r_c = 0.0f;
  if constexpr (kMode == Partial::squared_deviation) centre_c = centre[channel];
  if constexpr (kMode == Partial::backward) {
    m_c = m[channel];
    r_c = r[channel];
  }
  for (std::int64_t idx = begin + threadIdx.x; idx < end; idx += blockDim.x) {
    const std::int64_t b = idx / layout.spatial, p = idx % layout.spatial;
    const std::int64_t offset = (b * layout.channels + channel) * layout.spatial + p;
    if constexpr (kMode == Partial::sum) {
      sums[0] = __dadd_rn(sums[0], static_cast<double>(x[offset]));
    } else if constexpr (kMode == Partial::squared_deviation) {
      const double centred = __dsub_rn(static_cast<double>(x[offset]), centre_c);
      sums[0] = __dadd_rn(sums[0], __dmul_rn(centred, centred));
    } else {
      const double d = d_y[offset];
      const float xhat = __fmul_rn(__fsub_rn(x[offset], m_c), r_c);
      sums[0] = __dadd_rn(sums[0], d);
      sums[1] = __dadd_rn(sums[1], __dmul_rn(d, static_cast<double>(xhat)));
    }
  }
  block_sum<2>(sums, shared);
  if (threadIdx.x == 0) {
    double* out = partials + (channel * layout.chunks + chunk) * 2;
    out[0] = sums[0];
    out[1] = sums[1];
  }
}

// Σ over a channel's chunk partials (value k), in chunk order.
__device__ double combine_chunks(const double* partials, const Layout& layout, std::int64_t channel, int k) {
  double total = 0.0;
  for (std::int64_t chunk = 0; chunk < layout.chunks; ++chunk)
    total = __dadd_rn(total, partials[(channel * layout.chunks + chunk) * 2 + k]);
  return total;
}

// channel_mean[c] = Σ x / count (double). One thread per channel.
__global__ void mean_kernel(const double* partials, Layout layout, double* channel_mean) {
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= layout.channels) return;
  channel_mean[c] = __ddiv_rn(combine_chunks(partials, layout, c, 0), static_cast<double>(layout.count));
}

// Per channel: the statistics (batch when training, with the running ones updated; running in eval), mean and rstd
// written, and the affine map y = (x − m)·a + shift prepared in a[c], shift[c]. One thread per channel.
__global__ void forward_stats_kernel(const double* partials, const double* channel_mean_in, const float* gamma,
                                     const float* beta, float eps, bool training, float momentum, Layout layout,
                                     float* running_mean, float* running_var, float* mean, float* rstd, float* a,
                                     float* shift) {
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= layout.channels) return;
  double channel_mean = 0.0, channel_var = 0.0;
  if (training) {
    const double count = static_cast<double>(layout.count);
    channel_mean = channel_mean_in[c];
    channel_var = __ddiv_rn(combine_chunks(partials, layout, c, 0), count);
    const double unbiased = __ddiv_rn(__dmul_rn(channel_var, count), static_cast<double>(layout.count - 1));
    const double keep = __dsub_rn(1.0, static_cast<double>(momentum));
    running_mean[c] = static_cast<float>(
        __dadd_rn(__dmul_rn(keep, static_cast<double>(running_mean[c])), __dmul_rn(momentum, channel_mean)));
    running_var[c] = static_cast<float>(
        __dadd_rn(__dmul_rn(keep, static_cast<double>(running_var[c])), __dmul_rn(momentum, unbiased)));
  } else {
    channel_mean = running_mean[c];
    channel_var = running_var[c];
  }
  const float m = static_cast<float>(channel_mean);
  const float r = static_cast<float>(__ddiv_rn(1.0, __dsqrt_rn(__dadd_rn(channel_var, static_cast<double>(eps)))));
  mean[c] = m;
  rstd[c] = r;
  a[c] = __fmul_rn(r, gamma != nullptr ? gamma[c] : 1.0f);
  shift[c] = beta != nullptr ? beta[c] : 0.0f;
}

// y = (x − m)·a + shift, elementwise.
__global__ void forward_apply_kernel(const float* x, const float* mean, const float* a, const float* shift,
                                     Layout layout, float* y) {
  const std::int64_t total = layout.n * layout.channels * layout.spatial;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const std::int64_t c = (e / layout.spatial) % layout.channels;
    y[e] = __fadd_rn(__fmul_rn(__fsub_rn(x[e], mean[c]), a[c]), shift[c]);
  }
}

// Per channel: d_gamma/d_beta accumulated, and the coefficients of d_x = gr·(d_y − mean_d_y − x̂·mean_d_y_xhat).
// One thread per channel.
__global__ void backward_stats_kernel(const double* partials, const float* gamma, const float* rstd, bool training,
                                      Layout layout, float* d_gamma, float* d_beta, float* gr, float* mean_d_y,
                                      float* mean_d_y_xhat) {
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= layout.channels) return;
  const double sum_d_y = combine_chunks(partials, layout, c, 0);
  const double sum_d_y_xhat = combine_chunks(partials, layout, c, 1);
  if (d_gamma != nullptr) d_gamma[c] = __fadd_rn(d_gamma[c], static_cast<float>(sum_d_y_xhat));
  if (d_beta != nullptr) d_beta[c] = __fadd_rn(d_beta[c], static_cast<float>(sum_d_y));
  const double count = static_cast<double>(layout.count);
  gr[c] = __fmul_rn(gamma != nullptr ? gamma[c] : 1.0f, rstd[c]);
  mean_d_y[c] = training ? static_cast<float>(__ddiv_rn(sum_d_y, count)) : 0.0f;
  mean_d_y_xhat[c] = training ? static_cast<float>(__ddiv_rn(sum_d_y_xhat, count)) : 0.0f;
}

// d_x = gr·(d_y − mean_d_y − ((x − m)·r)·mean_d_y_xhat), elementwise.
__global__ void backward_apply_kernel(const float* x, const float* d_y, const float* mean, const float* rstd,
                                      const float* gr, const float* mean_d_y, const float* mean_d_y_xhat, Layout layout,
                                      float* d_x) {
  const std::int64_t total = layout.n * layout.channels * layout.spatial;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const std::int64_t c = (e / layout.spatial) % layout.channels;
    const float xhat_term = __fmul_rn(__fmul_rn(__fsub_rn(x[e], mean[c]), rstd[c]), mean_d_y_xhat[c]);
    d_x[e] = __fmul_rn(gr[c], __fsub_rn(__fsub_rn(d_y[e], mean_d_y[c]), xhat_term));
  }
}

Layout make_layout(std::int64_t n, std::int64_t channels, std::int64_t spatial) {
  PROPLAB_CHECK(n >= 0 && channels >= 0 && spatial >= 0, "batchnorm: negative sizes");
  Layout layout;
  layout.n = n, layout.channels = channels, layout.spatial = spatial;
  layout.count = n * spatial;
  layout.chunks = layout.count > 0 ? (layout.count + kBatchnormChunk - 1) / kBatchnormChunk : 1;
  PROPLAB_CHECK(channels * layout.chunks <= std::numeric_limits<int>::max(), "batchnorm: too many blocks");
  return layout;
}

unsigned channel_grid(std::int64_t channels) {
  return static_cast<unsigned>((channels + kBlockThreads - 1) / kBlockThreads);
}

}  // namespace

void batchnorm_forward(const float* x, const float* gamma, const float* beta, float eps, bool training, float momentum,
                       float* running_mean, float* running_var, float* y, float* mean, float* rstd, std::int64_t n,
                       std::int64_t channels, std::int64_t spatial) {
  const Layout layout = make_layout(n, channels, spatial);
  if (channels == 0) return;
  PROPLAB_CHECK(!training || layout.count > 1, "batchnorm_forward: training needs more than one value per channel");
  cudaStream_t stream = context().stream;
  const unsigned partial_blocks = static_cast<unsigned>(channels * layout.chunks);
  // Layout of the scratch: [channels · chunks · 2] partials, [channels] means (double); then a[channels],
  // shift[channels] (float).
  const std::size_t partial_count = static_cast<std::size_t>(channels * layout.chunks * 2);
  Scratch scratch(sizeof(double) * (partial_count + static_cast<std::size_t>(channels)) +
                  sizeof(float) * 2 * static_cast<std::size_t>(channels));
  double* partials = scratch.as<double>();
  double* channel_mean = partials + partial_count;
  float* a = reinterpret_cast<float*>(channel_mean + channels);
  float* shift = a + channels;
  if (training) {
    channel_partials_kernel<Partial::sum>
        <<<partial_blocks, kBlockThreads, 0, stream>>>(x, nullptr, nullptr, nullptr, nullptr, layout, partials);
    PROPLAB_CUDA_CHECK_LAUNCH("channel_partials_kernel<sum>");
    mean_kernel<<<channel_grid(channels), kBlockThreads, 0, stream>>>(partials, layout, channel_mean);
    PROPLAB_CUDA_CHECK_LAUNCH("mean_kernel");
    channel_partials_kernel<Partial::squared_deviation>
        <<<partial_blocks, kBlockThreads, 0, stream>>>(x, nullptr, channel_mean, nullptr, nullptr, layout, partials);
    PROPLAB_CUDA_CHECK_LAUNCH("channel_partials_kernel<squared_deviation>");
  }
  forward_stats_kernel<<<channel_grid(channels), kBlockThreads, 0, stream>>>(partials, channel_mean, gamma, beta, eps,
                                                                             training, momentum, layout, running_mean,
                                                                             running_var, mean, rstd, a, shift);
  PROPLAB_CUDA_CHECK_LAUNCH("forward_stats_kernel");
  const std::int64_t total = n * channels * spatial;
  if (total == 0) return;
  forward_apply_kernel<<<grid_blocks(total), kBlockThreads, 0, stream>>>(x, mean, a, shift, layout, y);
  PROPLAB_CUDA_CHECK_LAUNCH("forward_apply_kernel");
}

void batchnorm_backward(const float* x, const float* gamma, const float* mean, const float* rstd, const float* d_y,
                        bool training, float* d_x, float* d_gamma, float* d_beta, std::int64_t n, std::int64_t channels,
                        std::int64_t spatial) {
  const Layout layout = make_layout(n, channels, spatial);
  if (channels == 0) return;
  cudaStream_t stream = context().stream;
  const unsigned partial_blocks = static_cast<unsigned>(channels * layout.chunks);
  // Layout of the scratch: [channels · chunks · 2] partials (double); gr, mean_d_y, mean_d_y_xhat [channels]
  // (float).
  const std::size_t partial_count = static_cast<std::size_t>(channels * layout.chunks * 2);
  Scratch scratch(sizeof(double) * partial_count + sizeof(float) * 3 * static_cast<std::size_t>(channels));
  double* partials = scratch.as<double>();
  float* gr = reinterpret_cast<float*>(partials + partial_count);
  float* mean_d_y = gr + channels;
  float* mean_d_y_xhat = mean_d_y + channels;
  channel_partials_kernel<Partial::backward>
      <<<partial_blocks, kBlockThreads, 0, stream>>>(x, d_y, nullptr, mean, rstd, layout, partials);
  PROPLAB_CUDA_CHECK_LAUNCH("channel_partials_kernel<backward>");
  backward_stats_kernel<<<channel_grid(channels), kBlockThreads, 0, stream>>>(
      partials, gamma, rstd, training, layout, d_gamma, d_beta, gr, mean_d_y, mean_d_y_xhat);
  PROPLAB_CUDA_CHECK_LAUNCH("backward_stats_kernel");
  const std::int64_t total = n * channels * spatial;
  if (total == 0) return;
  backward_apply_kernel<<<grid_blocks(total), kBlockThreads, 0, stream>>>(x, d_y, mean, rstd, gr, mean_d_y,
                                                                          mean_d_y_xhat, layout, d_x);
  PROPLAB_CUDA_CHECK_LAUNCH("backward_apply_kernel");
}

}  // namespace proplab::kernels
