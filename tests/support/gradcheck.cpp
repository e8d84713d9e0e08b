#include "support/gradcheck.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <utility>

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
  // Central difference at step h, with the actual perturbations after float rounding; also returns the
  // one-sided slopes.
  auto differences = [&](std::int64_t i, double h, double& slope_up, double& slope_down) {
    const float original = x[i];
    const float plus = static_cast<float>(original + h), minus = static_cast<float>(original - h);
    x[i] = plus;
    const double up = loss();
    x[i] = minus;
    const double down = loss();
    x[i] = original;
    const double mid = loss();
    const double h_up = static_cast<double>(plus) - original, h_down = original - static_cast<double>(minus);
    slope_up = (up - mid) / h_up;
    slope_down = (mid - down) / h_down;
    // Slope differences below what float rounding of the loss explains (~1e-6 relative, over h) are noise.
    const double rounding = 1e-6 * std::max(1.0, std::fabs(mid)) / std::min(h_up, h_down);
    return std::pair<double, double>((up - down) / (h_up + h_down), rounding);
  };
  auto agrees = [&](double numeric, double analytic) {
    const double scale = std::max(std::fabs(numeric), std::fabs(analytic));
    return std::fabs(numeric - analytic) / (options.atol + options.rtol * scale);
  };
  for (std::int64_t k = 0; k < count; ++k) {
    // Deterministic spread over the tensor (first and last elements always included).
    std::int64_t i = count == n ? k : (k * (n - 1)) / std::max<std::int64_t>(count - 1, 1);
    const double a = grad[i];
    double up = 0, down = 0;
    auto [numeric, rounding] = differences(i, options.step, up, down);
    double err = agrees(numeric, a);
    if (err > 1.0) {
      // A smooth function with large curvature is matched better by a smaller step; a kink (a ReLU input or a
      // max crossing within ±step) shows as one-sided slopes that disagree at both steps.
      double up_small = 0, down_small = 0;
      auto [numeric_small, rounding_small] = differences(i, options.step / 4, up_small, down_small);
      err = std::min(err, agrees(numeric_small, a));
      auto is_kink = [&](double u, double d, double noise) {
        const double scale = std::max({std::fabs(u), std::fabs(d), options.atol / options.rtol});
        return std::fabs(u - d) > options.kink_tolerance * scale && std::fabs(u - d) > 10 * noise;
      };
      if (err > 1.0 && is_kink(up, down, rounding) && is_kink(up_small, down_small, rounding_small)) {
        ++result.kinks;
        continue;
      }
    }
    ++result.checked;
    result.worst_error = std::max(result.worst_error, err);
    if (err > 1.0) {
      result.ok = false;
      if (reported++ < 8) failures << "  element " << i << ": numeric " << numeric << " analytic " << a << "\n";
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
