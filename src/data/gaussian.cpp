// The gaussian kind: x ~ N(0, I), targets from a fixed random linear teacher.
#include <cmath>
#include <sstream>

#include "core/error.h"
#include "data/dataset.h"
#include "data/internal.h"

namespace proplab::data_detail {

namespace {

class GaussianVectors final : public VectorDataset {
 public:
  GaussianVectors(int input_dim, int outputs, bool classification, double noise, std::uint64_t seed)
      : input_dim_(input_dim), outputs_(outputs), classification_(classification), noise_(noise), seed_(seed) {
    // W[o][i] ~ N(0, 1 / input_dim): every teacher output has unit variance over x ~ N(0, I).
    const CounterRng rng(seed, stream_id("data.gaussian.teacher"));
    const double scale = 1.0 / std::sqrt(static_cast<double>(input_dim));
    teacher_weight_.resize(static_cast<std::size_t>(outputs) * input_dim);
    for (std::size_t j = 0; j < teacher_weight_.size(); ++j)
      teacher_weight_[j] = static_cast<float>(rng.normal(j) * scale);
  }

  int input_dim() const override { return input_dim_; }
  int outputs() const override { return outputs_; }
  bool classification() const override { return classification_; }

  void batch(Split split, std::int64_t index, Tensor& x, Tensor& y) const override {
    PROPLAB_CHECK(index >= 0, "batch index must be >= 0, got ", index);
    const std::int64_t rows = check_inputs(x);
    PROPLAB_CHECK(y.defined() && y.device() == Device::cpu && y.is_contiguous(),
                  "vector batch targets must be an allocated contiguous CPU tensor");
    if (classification_) {
      PROPLAB_CHECK(y.dtype() == DType::i32 && y.shape() == Shape{rows}, "classification targets must be i32 [", rows,
                    "], got ", dtype_name(y.dtype()), " ", shape_string(y.shape()));
    } else {
      PROPLAB_CHECK(y.dtype() == DType::f32 && y.shape() == (Shape{rows, outputs_}), "regression targets must be f32 [",
                    rows, ", ", outputs_, "], got ", dtype_name(y.dtype()), " ", shape_string(y.shape()));
    }
    const CounterRng input_rng(seed_, split_stream("data.gaussian.inputs", split));
    const CounterRng noise_rng(seed_, split_stream("data.gaussian.noise", split));
    float* xs = x.f32();
#pragma omp parallel for schedule(static) if (rows * (input_dim_ + outputs_) >= kParallelElements)
    for (std::int64_t b = 0; b < rows; ++b) {
      const auto sample = static_cast<std::uint64_t>(index * rows + b);
      float* row = xs + b * input_dim_;
      for (int i = 0; i < input_dim_; ++i) row[i] = input_rng.normal(sample * input_dim_ + i);
      std::vector<double> logits(static_cast<std::size_t>(outputs_));
      teacher_row(row, logits.data());
      for (int o = 0; o < outputs_; ++o)
        logits[o] += noise_ == 0.0 ? 0.0 : noise_ * noise_rng.normal(sample * outputs_ + o);
      if (classification_) {
        int best = 0;
        for (int o = 1; o < outputs_; ++o)
          if (logits[o] > logits[best]) best = o;
        y.i32()[b] = best;
      } else {
        for (int o = 0; o < outputs_; ++o) y.f32()[b * outputs_ + o] = static_cast<float>(logits[o]);
      }
    }
  }

  Tensor teacher(const Tensor& x) const override {
    const std::int64_t rows = check_inputs(x);
    Tensor out = Tensor::empty({rows, outputs_});
    std::vector<double> logits(static_cast<std::size_t>(outputs_));
    for (std::int64_t b = 0; b < rows; ++b) {
      teacher_row(x.f32() + b * input_dim_, logits.data());
      for (int o = 0; o < outputs_; ++o) out.f32()[b * outputs_ + o] = static_cast<float>(logits[o]);
    }
    return out;
  }

  std::optional<double> loss_floor() const override {
    if (!classification_) return 0.5 * noise_ * noise_;
    if (noise_ == 0.0) return 0.0;
    return std::nullopt;
  }

  std::string describe() const override {
    std::ostringstream out;
    out << "gaussian: x ~ N(0, I) of dim " << input_dim_ << ", linear teacher, "
        << (classification_ ? "argmax over " : "") << outputs_ << (classification_ ? " classes" : " regression outputs")
        << ", noise " << noise_;
    return out.str();
  }

 private:
  std::int64_t check_inputs(const Tensor& x) const {
    PROPLAB_CHECK(x.defined() && x.dtype() == DType::f32 && x.device() == Device::cpu && x.is_contiguous(),
                  "vector batch inputs must be an allocated contiguous f32 CPU tensor");
    PROPLAB_CHECK(x.ndim() == 2 && x.dim(1) == input_dim_, "vector batch inputs must be [B, ", input_dim_, "], got ",
                  shape_string(x.shape()));
    return x.dim(0);
  }

  // logits[o] = Σ_i W[o][i] x[i], accumulated in double in index order.
  void teacher_row(const float* x, double* logits) const {
    for (int o = 0; o < outputs_; ++o) {
      const float* w = teacher_weight_.data() + static_cast<std::size_t>(o) * input_dim_;
      double sum = 0.0;
      for (int i = 0; i < input_dim_; ++i) sum += static_cast<double>(w[i]) * x[i];
      logits[o] = sum;
    }
  }

  int input_dim_;
  int outputs_;
  bool classification_;
  double noise_;
  std::uint64_t seed_;
  std::vector<float> teacher_weight_;  // [outputs, input_dim]
};

}  // namespace

std::unique_ptr<VectorDataset> make_gaussian_vectors(const DataConfig& config, int input_dim, int outputs,
                                                     bool classification, std::uint64_t seed) {
  if (input_dim < 1) throw UserError(detail::concat("gaussian data: input_dim must be >= 1, got ", input_dim));
  if (outputs < (classification ? 2 : 1))
    throw UserError(detail::concat(
        "gaussian data: ",
        classification ? "classification needs at least 2 classes" : "regression needs at least 1 output",
        ", got outputs = ", outputs));
  if (!(config.gaussian_noise >= 0.0) || !std::isfinite(config.gaussian_noise))
    throw UserError(detail::concat("data.gaussian_noise = ", config.gaussian_noise, " must be >= 0"));
  return std::make_unique<GaussianVectors>(input_dim, outputs, classification, config.gaussian_noise, seed);
}

}  // namespace proplab::data_detail
