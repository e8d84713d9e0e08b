// train/progress: the run's live progress display.
//
// On a terminal: one line rewritten in place (step/total, loss, validation loss, tokens/s, ETA). Otherwise
// (a log file, a pipe, CI): a plain line at most every `interval_s` seconds and at the end, so logs stay short.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>

namespace proplab {

class Progress {
 public:
  Progress(std::ostream& out, bool terminal, std::int64_t total_steps, double interval_s = 10.0);
  // Called after every step (step = number of steps done).
  void update(std::int64_t step, double loss, std::optional<double> eval_loss, double tokens_per_s);
  // Ends the display with a final line (none when `message` is empty).
  void finish(const std::string& message);

  static std::string format_duration(double seconds);

 private:
  std::string line(std::int64_t step, double loss, std::optional<double> eval_loss, double tokens_per_s) const;

  std::ostream& out_;
  bool terminal_;
  std::int64_t total_;
  double interval_s_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_print_;
  std::int64_t first_step_ = -1;
  bool printed_live_ = false;
};

}  // namespace proplab
