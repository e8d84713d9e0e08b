#include "models/residual_site.h"

namespace proplab {

ResidualSite ResidualSite::create(ParameterStore& store, const std::string& name, const ResidualSpec& spec, int block) {
  ResidualSite site;
  site.lambda = spec.lambda;
  site.beta = spec.beta;
  if (spec.learnable_lambda)
    site.lambda_param = &store.add(name + ".lambda", {1}, ParamRole::residual_scale, 1, 1, block);
  if (spec.learnable_beta) site.beta_param = &store.add(name + ".beta", {1}, ParamRole::residual_scale, 1, 1, block);
  return site;
}

void ResidualSite::init_values() const {
  if (lambda_param) lambda_param->value.f32()[0] = static_cast<float>(lambda);
  if (beta_param) beta_param->value.f32()[0] = static_cast<float>(beta);
}

void ResidualSite::forward(const Tensor& x, const Tensor& f, Tensor& y, const ops::OpMoments* moments) const {
  ops::residual_forward(x, f, current_lambda(), current_beta(), y, moments);
}

void ResidualSite::backward(const Tensor& x, const Tensor& f, const Tensor& d_y, Tensor& d_x, Tensor& d_f,
                            const ops::OpMoments* moments) const {
  double d_lambda = 0.0, d_beta = 0.0;
  ops::residual_backward(x, f, d_y, current_lambda(), current_beta(), &d_x, &d_f, lambda_param ? &d_lambda : nullptr,
                         beta_param ? &d_beta : nullptr, moments);
  if (lambda_param) add_to_scalar(lambda_param->grad, static_cast<float>(d_lambda));
  if (beta_param) add_to_scalar(beta_param->grad, static_cast<float>(d_beta));
}

void ResidualSite::forward_relu(const Tensor& x, const Tensor& f, Tensor& y, const ops::OpMoments* moments) const {
  ops::residual_relu_forward(x, f, current_lambda(), current_beta(), y, moments);
}

void ResidualSite::backward_relu(const Tensor& x, const Tensor& f, const Tensor& y, Tensor& d_y, Tensor& d_x,
                                 Tensor& d_f, const ops::OpMoments* moments) const {
  double d_lambda = 0.0, d_beta = 0.0;
  ops::residual_relu_backward(x, f, y, d_y, current_lambda(), current_beta(), &d_x, &d_f,
                              lambda_param ? &d_lambda : nullptr, beta_param ? &d_beta : nullptr, moments);
  if (lambda_param) add_to_scalar(lambda_param->grad, static_cast<float>(d_lambda));
  if (beta_param) add_to_scalar(beta_param->grad, static_cast<float>(d_beta));
}

void ResidualSite::add_to_scalar(Tensor& scalar, float value) {
  if (scalar.device() == Device::cpu) {
    scalar.f32()[0] += value;
    return;
  }
  Tensor host = scalar.to(Device::cpu);
  host.f32()[0] += value;
  scalar.copy_from(host);
}

}  // namespace proplab
