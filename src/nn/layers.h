// nn/layers: parameterised layers over the ops, each an explicit forward (filling what backward needs) and
// backward (consuming it).
//
// Rule (everywhere in nn and models): parameter gradients ACCUMULATE (+=) into Parameter::grad; activation
// gradients (d_x) OVERWRITE their output tensor. Activations are [rows, features], rows = batch * tokens.
#pragma once

#include <string>

#include "spec/model.h"
#include "nn/parameter.h"
#include "ops/ops.h"

namespace proplab::nn {

// y = x W^T + b; W [out, in].
struct Linear {
  Parameter* weight = nullptr;
  Parameter* bias = nullptr;  // null without bias

  static Linear create(ParameterStore& store, const std::string& name, std::int64_t in, std::int64_t out,
                       ParamRole role, bool with_bias, int block);
  std::int64_t in_features() const { return weight->value.dim(1); }
  std::int64_t out_features() const { return weight->value.dim(0); }
  void forward(const Tensor& x, Tensor& y) const;
  // d_x may be null (first layer): then only parameter gradients are computed.
  void backward(const Tensor& x, const Tensor& d_y, Tensor* d_x) const;
};

// LayerNorm or RMSNorm over features, with optional affine gain (and shift for LayerNorm).
struct Norm {
  NormKind kind = NormKind::layernorm;
  float eps = 1e-5f;
  Parameter* gain = nullptr;   // null without affine
  Parameter* shift = nullptr;  // LayerNorm with affine only

  // What forward saves for backward.
  struct Saved {
    Tensor mean;  // [rows] (LayerNorm only)
    Tensor rstd;  // [rows]
  };

  static Norm create(ParameterStore& store, const std::string& name, std::int64_t features, NormKind kind, bool affine,
                     float eps, int block);
  // Allocates saved statistics for `rows` rows.
  Saved make_saved(std::int64_t rows, Device device = Device::cpu) const;
  // With `moments`, the statistics of y (ops::OpMoments, output only).
  void forward(const Tensor& x, Tensor& y, Saved& saved, const ops::OpMoments* moments = nullptr) const;
  void backward(const Tensor& x, const Saved& saved, const Tensor& d_y, Tensor& d_x) const;
};

}  // namespace proplab::nn
