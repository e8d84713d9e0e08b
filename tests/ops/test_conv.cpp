#include <gtest/gtest.h>

#include <vector>

#include "ops/ops.h"
#include "ops_testing.h"
#include "support/gradcheck.h"

namespace proplab {
namespace {

using testing::check_gradient;
using testing::project;
using testing::projection_weights;
using testing::random_tensor;

// Direct convolution in double: the reference for im2col + sgemm.
std::vector<double> naive_conv(const Tensor& x, const Tensor& weight, const Tensor* bias, const ops::Conv2dParams& p) {
  const std::int64_t n = x.dim(0), c_in = x.dim(1), h = x.dim(2), w = x.dim(3);
  const std::int64_t c_out = weight.dim(0), cg = weight.dim(1), kh = weight.dim(2), kw = weight.dim(3);
  const std::int64_t og = c_out / p.groups;
  const std::int64_t h_out = (h + 2 * p.padding - kh) / p.stride + 1, w_out = (w + 2 * p.padding - kw) / p.stride + 1;
  const std::vector<float> xv = x.to_vector(), wv = weight.to_vector();
  std::vector<double> y;
  for (std::int64_t b = 0; b < n; ++b)
    for (std::int64_t o = 0; o < c_out; ++o)
      for (std::int64_t oh = 0; oh < h_out; ++oh)
        for (std::int64_t ow = 0; ow < w_out; ++ow) {
          double sum = bias ? bias->f32()[o] : 0.0;
          const std::int64_t group = o / og;
          for (std::int64_t c = 0; c < cg; ++c)
            for (std::int64_t i = 0; i < kh; ++i)
              for (std::int64_t j = 0; j < kw; ++j) {
                const std::int64_t ih = oh * p.stride - p.padding + i, iw = ow * p.stride - p.padding + j;
                if (ih < 0 || ih >= h || iw < 0 || iw >= w) continue;
                sum += static_cast<double>(xv[((b * c_in + group * cg + c) * h + ih) * w + iw]) *
                       wv[((o * cg + c) * kh + i) * kw + j];
              }
          y.push_back(sum);
        }
  return y;
}

struct ConvCase {
  std::int64_t n, c_in, h, w, c_out, k;
  ops::Conv2dParams params;
};

class Conv2dCases : public ::testing::TestWithParam<ConvCase> {};

TEST_P(Conv2dCases, ForwardMatchesDirectConvolution) {
  const ConvCase c = GetParam();
  Tensor x = random_tensor({c.n, c.c_in, c.h, c.w}, 1);
  Tensor weight = random_tensor({c.c_out, c.c_in / c.params.groups, c.k, c.k}, 2);
  Tensor bias = random_tensor({c.c_out}, 3);
  const std::int64_t h_out = ops::conv2d_out_size(c.h, c.k, c.params.stride, c.params.padding);
  const std::int64_t w_out = ops::conv2d_out_size(c.w, c.k, c.params.stride, c.params.padding);
  Tensor y = Tensor::empty({c.n, c.c_out, h_out, w_out});
  ops::conv2d_forward(x, weight, &bias, c.params, y);
  testing::expect_all_close(y, naive_conv(x, weight, &bias, c.params), 1e-4, 1e-4, "conv y");
  ops::conv2d_forward(x, weight, nullptr, c.params, y);
  testing::expect_all_close(y, naive_conv(x, weight, nullptr, c.params), 1e-4, 1e-4, "conv y without bias");
}

TEST_P(Conv2dCases, GradientsMatchFiniteDifferences) {
  const ConvCase c = GetParam();
  Tensor x = random_tensor({c.n, c.c_in, c.h, c.w}, 4);
  Tensor weight = random_tensor({c.c_out, c.c_in / c.params.groups, c.k, c.k}, 5, 0.5);
  Tensor bias = random_tensor({c.c_out}, 6);
  const std::int64_t h_out = ops::conv2d_out_size(c.h, c.k, c.params.stride, c.params.padding);
  const std::int64_t w_out = ops::conv2d_out_size(c.w, c.k, c.params.stride, c.params.padding);
  Tensor y = Tensor::empty({c.n, c.c_out, h_out, w_out});
  auto loss = [&] {
    ops::conv2d_forward(x, weight, &bias, c.params, y);
    return project(y, 7);
  };
  loss();
  Tensor d_y = projection_weights(y.shape(), 7);
  Tensor d_x = random_tensor(x.shape(), 8);  // overwritten
  Tensor d_weight = Tensor::zeros(weight.shape()), d_bias = Tensor::zeros(bias.shape());
  ops::conv2d_backward(x, weight, d_y, c.params, &d_x, d_weight, &d_bias);
  EXPECT_GRAD_OK(check_gradient(loss, x, d_x));
  EXPECT_GRAD_OK(check_gradient(loss, weight, d_weight));
  EXPECT_GRAD_OK(check_gradient(loss, bias, d_bias));
}

INSTANTIATE_TEST_SUITE_P(Shapes, Conv2dCases,
                         ::testing::Values(ConvCase{2, 3, 6, 5, 4, 3, {1, 1, 1}},    // same padding
                                           ConvCase{2, 4, 7, 7, 6, 3, {2, 1, 1}},    // strided transition
                                           ConvCase{3, 4, 5, 6, 4, 1, {2, 0, 1}},    // 1x1 projection shortcut
                                           ConvCase{2, 6, 5, 5, 4, 3, {1, 1, 2}},    // groups
                                           ConvCase{1, 4, 6, 6, 4, 3, {1, 0, 4}},    // depthwise, no padding
                                           ConvCase{2, 2, 4, 4, 3, 4, {3, 2, 1}},    // kernel 4, stride 3
                                           ConvCase{2, 3, 5, 6, 4, 3, {1, 0, 1}},    // no padding (d_x pads 2)
                                           ConvCase{2, 4, 5, 5, 6, 1, {1, 0, 1}},    // 1x1, stride 1
                                           ConvCase{2, 3, 6, 6, 4, 4, {1, 2, 1}}));  // even kernel, stride 1

TEST(Conv2d, ParameterGradsAccumulateActivationGradsOverwrite) {
  const ops::Conv2dParams p{1, 1, 1};
  Tensor x = random_tensor({2, 3, 5, 5}, 10), weight = random_tensor({4, 3, 3, 3}, 11);
  Tensor d_y = random_tensor({2, 4, 5, 5}, 12);
  Tensor d_x = random_tensor(x.shape(), 13), d_weight = Tensor::zeros(weight.shape()), d_bias = Tensor::zeros({4});
  ops::conv2d_backward(x, weight, d_y, p, &d_x, d_weight, &d_bias);
  const Tensor d_x_once = d_x.clone(), d_weight_once = d_weight.clone(), d_bias_once = d_bias.clone();
  ops::conv2d_backward(x, weight, d_y, p, &d_x, d_weight, &d_bias);
  EXPECT_TRUE(testing::bitwise_equal(d_x, d_x_once)) << "d_x must be overwritten";
  std::vector<double> twice_weight, twice_bias;
  for (float v : d_weight_once.to_vector()) twice_weight.push_back(2.0 * v);
  for (float v : d_bias_once.to_vector()) twice_bias.push_back(2.0 * v);
  testing::expect_all_close(d_weight, twice_weight, 1e-5, 1e-6, "d_weight after two calls");
  testing::expect_all_close(d_bias, twice_bias, 1e-5, 1e-6, "d_bias after two calls");
}

TEST(Conv2d, ResultsIndependentOfThreadCountAndChunking) {
  // 64 samples of 16 channels at 32x32: several sample chunks and the parallel paths.
  const ops::Conv2dParams p{1, 1, 1};
  Tensor x = random_tensor({64, 16, 32, 32}, 14), weight = random_tensor({16, 16, 3, 3}, 15, 0.1);
  Tensor d_y = random_tensor({64, 16, 32, 32}, 16);
  Tensor y[2], d_x[2], d_weight[2], d_bias[2];
  for (int run = 0; run < 2; ++run) {
    testing::ScopedThreads scoped(run == 0 ? 1 : 2);
    y[run] = Tensor::empty(d_y.shape());
    d_x[run] = Tensor::empty(x.shape());
    d_weight[run] = Tensor::zeros(weight.shape());
    d_bias[run] = Tensor::zeros({16});
    ops::conv2d_forward(x, weight, nullptr, p, y[run]);
    ops::conv2d_backward(x, weight, d_y, p, &d_x[run], d_weight[run], &d_bias[run]);
  }
  EXPECT_TRUE(testing::bitwise_equal(y[0], y[1]));
  EXPECT_TRUE(testing::bitwise_equal(d_x[0], d_x[1]));
  EXPECT_TRUE(testing::bitwise_equal(d_weight[0], d_weight[1]));
  EXPECT_TRUE(testing::bitwise_equal(d_bias[0], d_bias[1]));
  // A strided transition and its 1x1 projection (d_x through col2im), also over several chunks.
  for (const int kernel : {3, 1}) {
    const ops::Conv2dParams strided{2, kernel / 2, 1};
    Tensor w = random_tensor({32, 16, kernel, kernel}, 17, 0.1);
    Tensor d_out = random_tensor({64, 32, 16, 16}, 18);
    Tensor out[2], d_in[2], d_w[2];
    for (int run = 0; run < 2; ++run) {
      testing::ScopedThreads scoped(run == 0 ? 1 : 2);
      out[run] = Tensor::empty(d_out.shape());
      d_in[run] = Tensor::empty(x.shape());
      d_w[run] = Tensor::zeros(w.shape());
      ops::conv2d_forward(x, w, nullptr, strided, out[run]);
      ops::conv2d_backward(x, w, d_out, strided, &d_in[run], d_w[run], nullptr);
    }
    EXPECT_TRUE(testing::bitwise_equal(out[0], out[1])) << "kernel " << kernel;
    EXPECT_TRUE(testing::bitwise_equal(d_in[0], d_in[1])) << "kernel " << kernel;
    EXPECT_TRUE(testing::bitwise_equal(d_w[0], d_w[1])) << "kernel " << kernel;
  }
  // And the large case still matches the direct convolution (chunk boundaries included).
  Tensor x_small = x.slice(0, 0, 3).clone();
  Tensor y_small = Tensor::empty({3, 16, 32, 32});
  ops::conv2d_forward(x_small, weight, nullptr, p, y_small);
  testing::expect_all_close(y_small, naive_conv(x_small, weight, nullptr, p), 1e-4, 1e-4, "conv y, large");
  std::vector<double> small;
  for (float v : y_small.to_vector()) small.push_back(v);
  testing::expect_all_close(y[0].slice(0, 0, 3).clone(), small, 1e-5, 1e-5, "first samples of a chunked batch");
}

// The direct kernel (ops/conv_direct.h) against im2col + sgemm and the double-precision direct sum, on shapes that
// reach its edges: channel counts off the 16-channel tile, pixel counts off the 16-pixel block (blocks spanning
// samples, tiny images of fewer than 16 pixels, block plans reused across periods of lcm(pixels, 16) with and
// without spanning samples), padding 0 and 2, 1×1 and 5×5 kernels, stride 2 with 32+ input
// channels (strided loads) and stride 3 (gathers); forward, the stride-1 d_x and the weight gradient, and thread
// independence.
TEST(Conv2d, DirectKernelMatchesIm2col) {
  if (!ops::conv_direct_supported()) GTEST_SKIP() << "this CPU lacks AVX-512F: only the im2col kernel runs here";
  struct Case {
    std::int64_t n, c_in, h, w, c_out, k;
    ops::Conv2dParams params;
  };
  const Case cases[] = {{3, 16, 28, 28, 16, 3, {1, 1, 1}},  {5, 7, 7, 7, 19, 3, {1, 1, 1}},
                        {4, 3, 3, 2, 5, 3, {1, 1, 1}},      {2, 33, 14, 14, 40, 3, {2, 1, 1}},
                        {2, 32, 14, 13, 20, 1, {2, 0, 1}},  {3, 5, 9, 11, 17, 5, {1, 2, 1}},
                        {2, 6, 8, 8, 9, 3, {1, 0, 1}},      {2, 40, 10, 10, 16, 3, {3, 1, 1}},
                        {1, 1, 28, 28, 16, 3, {1, 1, 1}},   {40, 8, 7, 7, 16, 3, {1, 1, 1}},
                        {24, 32, 10, 10, 16, 3, {2, 1, 1}}};
  ASSERT_EQ(ops::conv_kernel(), ops::ConvKernel::winograd);
  std::uint64_t seed = 40;
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << c.n << "x" << c.c_in << "x" << c.h << "x" << c.w << " -> " << c.c_out << " k"
                                    << c.k << " s" << c.params.stride << " p" << c.params.padding);
    Tensor x = random_tensor({c.n, c.c_in, c.h, c.w}, seed++);
    Tensor weight = random_tensor({c.c_out, c.c_in, c.k, c.k}, seed++, 0.2);
    Tensor bias = random_tensor({c.c_out}, seed++);
    const std::int64_t h_out = ops::conv2d_out_size(c.h, c.k, c.params.stride, c.params.padding);
    const std::int64_t w_out = ops::conv2d_out_size(c.w, c.k, c.params.stride, c.params.padding);
    Tensor d_y = random_tensor({c.n, c.c_out, h_out, w_out}, seed++);
    Tensor y[3], d_x[3], d_w[3];
    for (int run = 0; run < 3; ++run) {  // direct on 1 thread, direct on 2, im2col
      testing::ScopedThreads scoped(run == 0 ? 1 : 2);
      ops::set_conv_kernel(run == 2 ? ops::ConvKernel::im2col : ops::ConvKernel::direct);
      y[run] = Tensor::empty(d_y.shape());
      d_x[run] = Tensor::empty(x.shape());
      d_w[run] = Tensor::zeros(weight.shape());
      ops::conv2d_forward(x, weight, &bias, c.params, y[run]);
      ops::conv2d_backward(x, weight, d_y, c.params, &d_x[run], d_w[run], nullptr);
    }
    ops::set_conv_kernel(ops::ConvKernel::winograd);
    EXPECT_TRUE(testing::bitwise_equal(y[0], y[1])) << "direct y depends on the thread count";
    EXPECT_TRUE(testing::bitwise_equal(d_x[0], d_x[1])) << "direct d_x depends on the thread count";
    testing::expect_all_close(y[0], naive_conv(x, weight, &bias, c.params), 1e-4, 1e-4, "direct y");
    std::vector<double> y_im2col, d_x_im2col;
    for (float v : y[2].to_vector()) y_im2col.push_back(v);
    for (float v : d_x[2].to_vector()) d_x_im2col.push_back(v);
    testing::expect_all_close(y[0], y_im2col, 1e-5, 1e-5, "direct y against im2col");
    testing::expect_all_close(d_x[0], d_x_im2col, 1e-5, 1e-5, "direct d_x against im2col");
    EXPECT_TRUE(testing::bitwise_equal(d_w[0], d_w[1])) << "direct d_weight depends on the thread count";
    std::vector<double> d_w_im2col;
    for (float v : d_w[2].to_vector()) d_w_im2col.push_back(v);
    testing::expect_all_close(d_w[0], d_w_im2col, 1e-4, 1e-5, "direct d_weight against im2col");
  }
}

// Winograd F(2×2, 3×3) (ops/conv_winograd.h) against the direct kernel and the double-precision direct sum, on
// shapes that reach its edges: tile rows of 1, 4, 7 (one load per input line), 8, 14 and 15 tiles (two loads)
// and 16+ (a row cut into segments of 15), blocks spanning tile rows and samples, odd output sizes (half tiles),
// padding 0, 1 and 2, channel counts off the 16-channel tile, a last partial block; forward with and without bias
// and the stride-1 d_x (a Winograd convolution of d_y with the flipped kernel), and thread independence. Other
// kernels and strides fall through to the direct kernel, so their results are bitwise the direct setting's.
TEST(Conv2d, WinogradMatchesDirectSum) {
  if (!ops::conv_direct_supported()) GTEST_SKIP() << "this CPU lacks AVX-512F: only the im2col kernel runs here";
  struct Case {
    std::int64_t n, c_in, h, w, c_out, k;
    ops::Conv2dParams params;
    bool bias;
  };
  const Case cases[] = {{3, 16, 28, 28, 16, 3, {1, 1, 1}, true}, {5, 7, 7, 7, 19, 3, {1, 1, 1}, true},
                        {4, 3, 3, 2, 5, 3, {1, 1, 1}, false},    {2, 33, 14, 14, 40, 3, {1, 1, 1}, true},
                        {2, 6, 8, 8, 9, 3, {1, 0, 1}, true},     {3, 5, 9, 11, 17, 3, {1, 2, 1}, false},
                        {2, 4, 5, 30, 3, 3, {1, 1, 1}, true},    {2, 4, 6, 33, 18, 3, {1, 0, 1}, true},
                        {1, 1, 28, 28, 16, 3, {1, 1, 1}, true},  {40, 8, 7, 7, 16, 3, {1, 1, 1}, false},
                        {2, 3, 16, 16, 4, 3, {1, 1, 1}, true},   {3, 2, 3, 3, 2, 3, {1, 0, 1}, true},
                        {2, 9, 14, 13, 20, 3, {2, 1, 1}, true},  {2, 6, 9, 9, 7, 5, {1, 2, 1}, true}};
  ASSERT_EQ(ops::conv_kernel(), ops::ConvKernel::winograd);
  std::uint64_t seed = 80;
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << c.n << "x" << c.c_in << "x" << c.h << "x" << c.w << " -> " << c.c_out << " k"
                                      << c.k << " s" << c.params.stride << " p" << c.params.padding);
    Tensor x = random_tensor({c.n, c.c_in, c.h, c.w}, seed++);
    Tensor weight = random_tensor({c.c_out, c.c_in, c.k, c.k}, seed++, 0.2);
    Tensor bias = random_tensor({c.c_out}, seed++);
    const std::int64_t h_out = ops::conv2d_out_size(c.h, c.k, c.params.stride, c.params.padding);
    const std::int64_t w_out = ops::conv2d_out_size(c.w, c.k, c.params.stride, c.params.padding);
    Tensor d_y = random_tensor({c.n, c.c_out, h_out, w_out}, seed++);
    Tensor y[3], d_x[3], d_w[3];
    for (int run = 0; run < 3; ++run) {  // winograd on 1 thread, winograd on 2, direct
      testing::ScopedThreads scoped(run == 0 ? 1 : 2);
      ops::set_conv_kernel(run == 2 ? ops::ConvKernel::direct : ops::ConvKernel::winograd);
      y[run] = Tensor::empty(d_y.shape());
      d_x[run] = Tensor::empty(x.shape());
      d_w[run] = Tensor::zeros(weight.shape());
      ops::conv2d_forward(x, weight, c.bias ? &bias : nullptr, c.params, y[run]);
      ops::conv2d_backward(x, weight, d_y, c.params, &d_x[run], d_w[run], nullptr);
    }
    ops::set_conv_kernel(ops::ConvKernel::winograd);
    EXPECT_TRUE(testing::bitwise_equal(y[0], y[1])) << "winograd y depends on the thread count";
    EXPECT_TRUE(testing::bitwise_equal(d_x[0], d_x[1])) << "winograd d_x depends on the thread count";
    EXPECT_TRUE(testing::bitwise_equal(d_w[0], d_w[2])) << "the weight gradient is the direct kernel's";
    testing::expect_all_close(y[0], naive_conv(x, weight, c.bias ? &bias : nullptr, c.params), 1e-5, 1e-5,
                              "winograd y");
    std::vector<double> y_direct, d_x_direct;
    for (float v : y[2].to_vector()) y_direct.push_back(v);
    for (float v : d_x[2].to_vector()) d_x_direct.push_back(v);
    testing::expect_all_close(y[0], y_direct, 1e-5, 1e-5, "winograd y against direct");
    testing::expect_all_close(d_x[0], d_x_direct, 1e-5, 1e-5, "winograd d_x against direct");
    if (c.k != 3 || c.params.stride != 1) {
      EXPECT_TRUE(testing::bitwise_equal(y[0], y[2])) << "a shape Winograd does not run is the direct kernel's";
    } else if (y[0].numel() > 1000) {
      EXPECT_FALSE(testing::bitwise_equal(y[0], y[2])) << "Winograd did not run";
    }
  }
}

TEST(Conv2d, RejectsAKernelLargerThanThePaddedInput) {
  EXPECT_THROW(ops::conv2d_out_size(2, 5, 1, 1), UserError);
  EXPECT_EQ(ops::conv2d_out_size(32, 3, 2, 1), 16);
  EXPECT_EQ(ops::conv2d_out_size(32, 1, 2, 0), 16);
}

}  // namespace
}  // namespace proplab
