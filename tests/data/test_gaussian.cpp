// gaussian data: x ~ N(0, I), and targets that come from one fixed linear teacher for every batch and split.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "core/parallel.h"
#include "data/dataset.h"

namespace proplab {
namespace {

DataConfig gaussian_config(double noise = 0.0) {
  DataConfig config;
  config.kind = "gaussian";
  config.gaussian_noise = noise;
  return config;
}

struct VectorBatch {
  Tensor x;
  Tensor y;
};

VectorBatch vector_batch(const VectorDataset& data, Split split, std::int64_t index, std::int64_t rows) {
  VectorBatch batch{Tensor::empty({rows, data.input_dim()}),
                    data.classification() ? Tensor::empty({rows}, DType::i32) : Tensor::empty({rows, data.outputs()})};
  data.batch(split, index, batch.x, batch.y);
  return batch;
}

// Least-squares W (outputs x dim) with y ≈ W x from the rows of a batch: normal equations by Gauss-Jordan.
std::vector<double> fit_linear(const VectorBatch& batch, int dim, int outputs) {
  const std::int64_t rows = batch.x.dim(0);
  std::vector<double> gram(dim * dim, 0.0), cross(dim * outputs, 0.0);
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* x = batch.x.f32() + r * dim;
    const float* y = batch.y.f32() + r * outputs;
    for (int i = 0; i < dim; ++i) {
      for (int j = 0; j < dim; ++j) gram[i * dim + j] += static_cast<double>(x[i]) * x[j];
      for (int o = 0; o < outputs; ++o) cross[i * outputs + o] += static_cast<double>(x[i]) * y[o];
    }
  }
  for (int col = 0; col < dim; ++col) {
    const double pivot = gram[col * dim + col];
    for (int j = 0; j < dim; ++j) gram[col * dim + j] /= pivot;
    for (int o = 0; o < outputs; ++o) cross[col * outputs + o] /= pivot;
    for (int r = 0; r < dim; ++r) {
      if (r == col) continue;
      const double f = gram[r * dim + col];
      for (int j = 0; j < dim; ++j) gram[r * dim + j] -= f * gram[col * dim + j];
      for (int o = 0; o < outputs; ++o) cross[r * outputs + o] -= f * cross[col * outputs + o];
    }
  }
  std::vector<double> w(outputs * dim);
  for (int o = 0; o < outputs; ++o)
    for (int i = 0; i < dim; ++i) w[o * dim + i] = cross[i * outputs + o];
  return w;
}

TEST(GaussianData, InputsAreStandardNormalAndBatchesArePure) {
  auto data = make_vector_dataset(gaussian_config(), 16, 3, false, 4);
  EXPECT_EQ(data->input_dim(), 16);
  EXPECT_EQ(data->outputs(), 3);
  EXPECT_FALSE(data->classification());
  const auto batch = vector_batch(*data, Split::train, 2, 512);
  double sum = 0.0, square = 0.0;
  for (float v : batch.x.to_vector()) {
    sum += v;
    square += static_cast<double>(v) * v;
  }
  const double n = static_cast<double>(batch.x.numel());
  EXPECT_NEAR(sum / n, 0.0, 0.03);
  EXPECT_NEAR(square / n, 1.0, 0.05);
  EXPECT_EQ(batch.x.to_vector(), vector_batch(*data, Split::train, 2, 512).x.to_vector());
  EXPECT_EQ(batch.y.to_vector(),
            vector_batch(*make_vector_dataset(gaussian_config(), 16, 3, false, 4), Split::train, 2, 512).y.to_vector());
  EXPECT_NE(batch.x.to_vector(), vector_batch(*data, Split::train, 3, 512).x.to_vector());
  EXPECT_NE(batch.x.to_vector(), vector_batch(*data, Split::validation, 2, 512).x.to_vector());
  // Micro-batches stack to the full batch.
  auto stacked = vector_batch(*data, Split::train, 4, 256).x.to_vector();
  const auto tail = vector_batch(*data, Split::train, 5, 256).x.to_vector();
  stacked.insert(stacked.end(), tail.begin(), tail.end());
  EXPECT_EQ(batch.x.to_vector(), stacked);
}

TEST(GaussianData, OneLinearTeacherForBothSplits) {
  const int dim = 8, outputs = 3;
  auto data = make_vector_dataset(gaussian_config(), dim, outputs, false, 21);
  const auto train = vector_batch(*data, Split::train, 0, 200);
  EXPECT_EQ(train.y.to_vector(), data->teacher(train.x).to_vector());
  // Fit W on train data alone; it must predict the validation targets: the same fixed linear map.
  const auto w = fit_linear(train, dim, outputs);
  const auto validation = vector_batch(*data, Split::validation, 7, 100);
  for (int r = 0; r < 100; ++r) {
    for (int o = 0; o < outputs; ++o) {
      double predicted = 0.0;
      for (int i = 0; i < dim; ++i) predicted += w[o * dim + i] * validation.x.f32()[r * dim + i];
      EXPECT_NEAR(validation.y.f32()[r * outputs + o], predicted, 1e-4);
    }
  }
  // Teacher outputs have about unit variance (W ~ N(0, 1 / dim)).
  double square = 0.0;
  for (float v : train.y.to_vector()) square += static_cast<double>(v) * v;
  EXPECT_GT(square / train.y.numel(), 0.3);
  EXPECT_LT(square / train.y.numel(), 3.0);
  // Another seed, another teacher.
  auto other = make_vector_dataset(gaussian_config(), dim, outputs, false, 22);
  EXPECT_NE(other->teacher(train.x).to_vector(), train.y.to_vector());
  ASSERT_TRUE(data->loss_floor().has_value());
  EXPECT_EQ(*data->loss_floor(), 0.0);
}

TEST(GaussianData, RegressionNoiseHasTheConfiguredSpread) {
  auto data = make_vector_dataset(gaussian_config(0.5), 10, 4, false, 3);
  const auto batch = vector_batch(*data, Split::train, 0, 4096);
  const auto clean = data->teacher(batch.x).to_vector();
  const auto noisy = batch.y.to_vector();
  double sum = 0.0, square = 0.0;
  for (std::size_t i = 0; i < clean.size(); ++i) {
    const double e = noisy[i] - clean[i];
    sum += e;
    square += e * e;
  }
  const double n = static_cast<double>(clean.size());
  EXPECT_NEAR(sum / n, 0.0, 0.02);
  EXPECT_NEAR(std::sqrt(square / n), 0.5, 0.02);
  ASSERT_TRUE(data->loss_floor().has_value());
  EXPECT_DOUBLE_EQ(*data->loss_floor(), 0.125);
}

TEST(GaussianData, ClassesAreTheTeachersArgmax) {
  auto data = make_vector_dataset(gaussian_config(), 12, 5, true, 8);
  EXPECT_TRUE(data->classification());
  const auto batch = vector_batch(*data, Split::validation, 1, 2000);
  const auto logits = data->teacher(batch.x).to_vector();
  std::vector<int> counts(5, 0);
  for (int r = 0; r < 2000; ++r) {
    const int label = batch.y.i32()[r];
    ASSERT_GE(label, 0);
    ASSERT_LT(label, 5);
    for (int o = 0; o < 5; ++o) EXPECT_LE(logits[r * 5 + o], logits[r * 5 + label]);
    ++counts[label];
  }
  for (int c : counts) EXPECT_GT(c, 100) << "every class should be common";
  ASSERT_TRUE(data->loss_floor().has_value());
  EXPECT_EQ(*data->loss_floor(), 0.0);

  auto noisy = make_vector_dataset(gaussian_config(0.3), 12, 5, true, 8);
  const auto noisy_batch = vector_batch(*noisy, Split::validation, 1, 2000);
  EXPECT_EQ(noisy_batch.x.to_vector(), batch.x.to_vector());
  int flipped = 0;
  for (int r = 0; r < 2000; ++r) flipped += noisy_batch.y.i32()[r] != batch.y.i32()[r];
  EXPECT_GT(flipped, 20);
  EXPECT_LT(flipped, 1000);
  EXPECT_FALSE(noisy->loss_floor().has_value());
}

TEST(GaussianData, IndependentOfThreadCount) {
  auto data = make_vector_dataset(gaussian_config(0.1), 64, 8, false, 5);
  const int before = threads();
  set_threads(1);
  const auto one = vector_batch(*data, Split::train, 9, 2048);
  set_threads(3);
  const auto three = vector_batch(*data, Split::train, 9, 2048);
  set_threads(before);
  EXPECT_EQ(one.x.to_vector(), three.x.to_vector());
  EXPECT_EQ(one.y.to_vector(), three.y.to_vector());
}

TEST(GaussianData, BadSettingsAreUserErrorsAndBadTensorsCallerBugs) {
  EXPECT_THROW(make_vector_dataset(gaussian_config(), 0, 3, false, 1), UserError);
  EXPECT_THROW(make_vector_dataset(gaussian_config(), 4, 1, true, 1), UserError);
  EXPECT_THROW(make_vector_dataset(gaussian_config(-0.1), 4, 3, false, 1), UserError);
  auto data = make_vector_dataset(gaussian_config(), 4, 3, true, 1);
  Tensor x = Tensor::empty({2, 4});
  Tensor wrong_labels = Tensor::empty({2, 3});
  EXPECT_THROW(data->batch(Split::train, 0, x, wrong_labels), InternalError);
  EXPECT_FALSE(data->describe().empty());
}

}  // namespace
}  // namespace proplab
