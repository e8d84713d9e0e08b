// models/mlp: deep fully-connected network for mean-field signal-propagation studies.
//
// Graph: u_1 = W_1 x + b_1 (input_dim → width), h_1 = φ(u_1); for l = 2..L: u_l = W_l h_{l-1} + b_l,
// h_l = φ(u_l), or with `residual`: h_l = λ·h_{l-1} + β·φ(u_l); readout y = W_out h_L + b_out (width → outputs),
// then mean-squared error (regression) or softmax cross-entropy (classification). Rows are samples.
#pragma once

#include <vector>

#include "models/model.h"
#include "models/residual_site.h"
#include "nn/layers.h"

namespace proplab {

class Mlp final : public Model {
 public:
  Mlp(const MlpConfig& config, const ScalingConfig& scaling, std::uint64_t seed);
  // With the rule already built (make_model_rule), as a run builds it once for the model and the theory.
  Mlp(const MlpConfig& config, const ScalingRule& rule, std::uint64_t seed);

  ParameterStore& params() override { return params_; }
  const std::vector<ProbeInfo>& probes() const override { return probes_; }
  double forward_backward(const Batch& batch, float grad_scale, const StepContext& context) override;
  double evaluate(const Batch& batch) override;
  double train_flops(std::int64_t samples) const override;
  std::int64_t tokens_per_sample() const override { return 1; }
  void to_device(Device device) override {
    params_.to_device(device);
    rows_ = 0;  // activations are reallocated on the device
  }

 private:
  void ensure_buffers(std::int64_t rows);

  MlpConfig config_;
  ParameterStore params_;
  // Probes: per layer l, layers.l.preact and layers.l.postact (and layers.l.out in the residual form, l ≥ 1),
  // then readout.out.
  std::vector<ProbeInfo> probes_;
  std::vector<int> probe_pre_, probe_post_, probe_out_;
  int probe_readout_ = -1;
  std::vector<nn::Linear> layers_;
  std::vector<ResidualSite> residuals_;  // one per layer l ≥ 2 in the residual form (index l-1)
  nn::Linear readout_;
  float output_multiplier_ = 1.0f;

  std::int64_t rows_ = 0;
  std::vector<Tensor> pre_;     // u_l [rows, width]
  std::vector<Tensor> post_;    // φ(u_l) [rows, width]
  std::vector<Tensor> hidden_;  // h_l [rows, width] (equals post_ without residual); hidden_[0] unused
  Tensor output_, d_output_;
  Tensor d_hidden_, d_post_, d_pre_;
};

}  // namespace proplab
