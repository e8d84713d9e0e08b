#include "nn/layers.h"

namespace proplab::nn {

Linear Linear::create(ParameterStore& store, const std::string& name, std::int64_t in, std::int64_t out, ParamRole role,
                      bool with_bias, int block) {
  Linear layer;
  layer.weight = &store.add(name + ".weight", {out, in}, role, in, out, block);
  if (with_bias) layer.bias = &store.add(name + ".bias", {out}, ParamRole::bias, in, out, block);
  return layer;
}

void Linear::forward(const Tensor& x, Tensor& y) const {
  ops::linear_forward(x, weight->value, bias ? &bias->value : nullptr, y);
}

void Linear::backward(const Tensor& x, const Tensor& d_y, Tensor* d_x) const {
  ops::linear_backward(x, weight->value, d_y, d_x, weight->grad, bias ? &bias->grad : nullptr);
}

Norm Norm::create(ParameterStore& store, const std::string& name, std::int64_t features, NormKind kind, bool affine,
                  float eps, int block) {
  Norm norm;
  norm.kind = kind;
  norm.eps = eps;
  if (affine) {
    norm.gain = &store.add(name + ".weight", {features}, ParamRole::norm_gain, features, features, block);
    if (kind == NormKind::layernorm)
      norm.shift = &store.add(name + ".bias", {features}, ParamRole::norm_bias, features, features, block);
  }
  return norm;
}

Norm::Saved Norm::make_saved(std::int64_t rows, Device device) const {
  Saved saved;
  if (kind == NormKind::layernorm) saved.mean = Tensor::empty({rows}, DType::f32, device);
  saved.rstd = Tensor::empty({rows}, DType::f32, device);
  return saved;
}

void Norm::forward(const Tensor& x, Tensor& y, Saved& saved, const ops::OpMoments* moments) const {
  if (kind == NormKind::layernorm)
    ops::layernorm_forward(x, gain ? &gain->value : nullptr, shift ? &shift->value : nullptr, eps, y, saved.mean,
                           saved.rstd, moments);
  else
    ops::rmsnorm_forward(x, gain ? &gain->value : nullptr, eps, y, saved.rstd, moments);
}

void Norm::backward(const Tensor& x, const Saved& saved, const Tensor& d_y, Tensor& d_x) const {
  if (kind == NormKind::layernorm)
    ops::layernorm_backward(x, gain ? &gain->value : nullptr, saved.mean, saved.rstd, d_y, d_x,
                            gain ? &gain->grad : nullptr, shift ? &shift->grad : nullptr);
  else
    ops::rmsnorm_backward(x, gain ? &gain->value : nullptr, saved.rstd, d_y, d_x, gain ? &gain->grad : nullptr);
}

}  // namespace proplab::nn
