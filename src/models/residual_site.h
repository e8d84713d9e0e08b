// models/residual_site: one residual combine x ← λ·x + β·f, with λ and β fixed or learnable scalars.
#pragma once

#include <string>

#include "nn/parameter.h"
#include "ops/ops.h"

namespace proplab {

struct ResidualSite {
  double lambda = 1.0;
  double beta = 1.0;
  Parameter* lambda_param = nullptr;  // set when λ is learnable (a [1] tensor)
  Parameter* beta_param = nullptr;    // set when β is learnable

  // Creates the site from the rule's spec, adding learnable scalars to the store as `<name>.lambda`/`.beta`.
  static ResidualSite create(ParameterStore& store, const std::string& name, const ResidualSpec& spec, int block);
  // Writes the spec's initial values into the learnable scalars (after ParameterStore::init).
  void init_values() const;
  // The scalars' current values (a learnable one on a GPU is read back: one small copy per use).
  float current_lambda() const { return lambda_param ? scalar_of(*lambda_param) : static_cast<float>(lambda); }
  float current_beta() const { return beta_param ? scalar_of(*beta_param) : static_cast<float>(beta); }
  static float scalar_of(const Parameter& p) {
    return p.value.device() == Device::cpu ? p.value.f32()[0] : p.value.item();
  }

  // With `moments`, the statistics of f and y (ops::residual_forward).
  void forward(const Tensor& x, const Tensor& f, Tensor& y, const ops::OpMoments* moments = nullptr) const;
  // d_x (may alias d_y) and d_f overwrite; learnable scalars' gradients accumulate. With `moments`, the statistics
  // of d_y and d_f.
  void backward(const Tensor& x, const Tensor& f, const Tensor& d_y, Tensor& d_x, Tensor& d_f,
                const ops::OpMoments* moments = nullptr) const;
  // y = relu(λ·x + β·f) in one pass (ops::residual_relu_forward); with `moments`, the statistics of f and y.
  void forward_relu(const Tensor& x, const Tensor& f, Tensor& y, const ops::OpMoments* moments = nullptr) const;
  // Its backward from y: d_y holds dL/dy on entry and dL/d(λ·x + β·f) on return; then as backward. With `moments`,
  // the statistics of d_y as it enters and of d_f.
  void backward_relu(const Tensor& x, const Tensor& f, const Tensor& y, Tensor& d_y, Tensor& d_x, Tensor& d_f,
                     const ops::OpMoments* moments = nullptr) const;
  // scalar[0] += value, for a [1] tensor on any device (in float, as on the CPU).
  static void add_to_scalar(Tensor& scalar, float value);
};

}  // namespace proplab
