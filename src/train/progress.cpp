#include "train/progress.h"

#include <cmath>
#include <cstdio>

namespace proplab {

Progress::Progress(std::ostream& out, bool terminal, std::int64_t total_steps, double interval_s)
    : out_(out), terminal_(terminal), total_(total_steps), interval_s_(interval_s) {
  start_ = last_print_ = std::chrono::steady_clock::now();
}

std::string Progress::format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const long s = std::lround(seconds);
  char buffer[32];
  if (s >= 3600)
    std::snprintf(buffer, sizeof buffer, "%ldh%02ldm", s / 3600, (s / 60) % 60);
  else if (s >= 60)
    std::snprintf(buffer, sizeof buffer, "%ldm%02lds", s / 60, s % 60);
  else
    std::snprintf(buffer, sizeof buffer, "%lds", s);
  return buffer;
}

std::string Progress::line(std::int64_t step, double loss, std::optional<double> eval_loss, double tokens_per_s) const {
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const std::int64_t done = step - std::max<std::int64_t>(first_step_, 0);
  const double eta = done > 0 ? elapsed / static_cast<double>(done) * static_cast<double>(total_ - step) : NAN;
  char buffer[256];
  int n = std::snprintf(buffer, sizeof buffer, "step %lld/%lld  loss %.4f", static_cast<long long>(step),
                        static_cast<long long>(total_), loss);
  if (eval_loss) n += std::snprintf(buffer + n, sizeof buffer - n, "  val %.4f", *eval_loss);
  std::snprintf(buffer + n, sizeof buffer - n, "  %.0f tok/s  ETA %s", tokens_per_s, format_duration(eta).c_str());
  return buffer;
}

void Progress::update(std::int64_t step, double loss, std::optional<double> eval_loss, double tokens_per_s) {
  if (first_step_ < 0) first_step_ = step - 1;
  const auto now = std::chrono::steady_clock::now();
  const double since = std::chrono::duration<double>(now - last_print_).count();
  if (terminal_) {
    if (since < 0.1 && step != total_) return;
    out_ << "\r\033[K" << line(step, loss, eval_loss, tokens_per_s) << std::flush;
    printed_live_ = true;
  } else {
    if (since < interval_s_ && step != total_) return;
    out_ << line(step, loss, eval_loss, tokens_per_s) << "\n" << std::flush;
  }
  last_print_ = now;
}

void Progress::finish(const std::string& message) {
  if (terminal_ && printed_live_) out_ << "\n";
  if (!message.empty()) out_ << message << "\n";
  out_ << std::flush;
}

}  // namespace proplab
