#include "support/gradcheck.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "core/rng.h"

namespace proplab::testing {

GradCheckResult check_gradient(const std::function<double()>& loss, Tensor& input, const Tensor& analytic,
                               const GradCheckOptions& options) {
  PROPLAB_CHECK(input.device() == Device::cpu && input.is_contiguous(), "gradcheck input must be contiguous CPU");
  PROPLAB_CHECK(analytic.shape() == input.shape(), "gradcheck: analytic gradient shape ",
                shape_string(analytic.shape()), " differs from input ", shape_string(input.shape()));
  std::vector<float> grad = analytic.to_vector();
  float* x = input.f32();
  const std::int64_t n = input.numel();
  const std::int64_t count = std::min<std::int64_t>(n, options.max_elements);
  GradCheckResult result;
  std::ostringstream failures;
  int reported = 0;
  for (std::int64_t k = 0; k < count; ++k) {
    // Deterministic spread over the tensor (first and last elements always included).
    std::int64_t i = count == n ? k : (k * (n - 1)) / std::max<std::int64_t>(count - 1, 1);
    const float original = x[i];
    const double h = options.step;
    x[i] = static_cast<float>(original + h);
    const double up = loss();
    x[i] = static_cast<float>(original - h);
    const double down = loss();
    x[i] = original;
    const double mid = loss();
    // Actual perturbations after float rounding.
    const double h_up = static_cast<double>(static_cast<float>(original + h)) - original;
    const double h_down = original - static_cast<double>(static_cast<float>(original - h));
    const double numeric = (up - down) / (h_up + h_down);
    const double slope_up = (up - mid) / h_up;
    const double slope_down = (mid - down) / h_down;
    const double slope_scale = std::max({std::fabs(slope_up), std::fabs(slope_down), options.atol / options.rtol});
    if (std::fabs(slope_up - slope_down) > options.kink_tolerance * slope_scale &&
        std::fabs(slope_up - slope_down) > 10 * options.atol / h_up) {
      ++result.kinks;
      continue;
    }
    ++result.checked;
    const double a = grad[i];
    const double scale = std::max(std::fabs(numeric), std::fabs(a));
    const double err = std::fabs(numeric - a) / (options.atol + options.rtol * scale);
    result.worst_error = std::max(result.worst_error, err);
    if (err > 1.0) {
      result.ok = false;
      if (reported++ < 8)
        failures << "  element " << i << ": numeric " << numeric << " analytic " << a << "\n";
    }
  }
  if (result.kinks > options.max_kink_fraction * std::max<std::int64_t>(count, 1)) {
    result.ok = false;
    failures << "  " << result.kinks << " of " << count << " elements skipped as kinks (allowed fraction "
             << options.max_kink_fraction << ")\n";
  }
  if (!result.ok) {
    std::ostringstream out;
    out << "gradient check failed (checked " << result.checked << ", kinks " << result.kinks << ", worst error "
        << result.worst_error << " x tolerance):\n"
        << failures.str();
    result.message = out.str();
  }
  return result;
}

double project(const Tensor& y, std::uint64_t seed) {
  std::vector<float> v = y.to_vector();
  CounterRng rng(seed, stream_id("gradcheck.projection"));
  double total = 0.0;
  for (std::size_t i = 0; i < v.size(); ++i) total += static_cast<double>(v[i]) * rng.normal(i);
  return total;
}

Tensor projection_weights(const Shape& shape, std::uint64_t seed) {
  Tensor r = Tensor::empty(shape);
  CounterRng rng(seed, stream_id("gradcheck.projection"));
  float* p = r.f32();
  for (std::int64_t i = 0; i < r.numel(); ++i) p[i] = rng.normal(static_cast<std::uint64_t>(i));
  return r;
}

Tensor random_tensor(const Shape& shape, std::uint64_t seed, double std, double mean) {
  Tensor t = Tensor::empty(shape);
  CounterRng rng(seed, stream_id("test.random_tensor", shape_numel(shape)));
  float* p = t.f32();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(mean + std * rng.normal(i));
  return t;
}

}  // namespace proplab::testing
