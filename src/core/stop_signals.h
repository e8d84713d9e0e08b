// Stop requests by signal (SIGINT, SIGTERM) for a long command such as `proplab run`: a flag that the command reads
// at its own safe points (the trainer: each step boundary).
//
// Where a signal lands matters. oneDNN's JIT sgemm (ops::sgemm's backend when libdnnl loads; oneDNN 2.6 as Debian
// ships it) points the stack pointer into a heap buffer while its kernel runs; a signal handled on a thread inside
// that kernel has its frame pushed there and corrupts the heap (oneDNN issue 4845, fixed upstream in 3.x). So while a
// StopSignals lives, no thread that computes takes SIGINT or SIGTERM:
// - the constructor blocks both on the calling thread, and every thread started after it (OpenMP's workers, MPI's,
//   a run file's writer) inherits the block;
// - one thread of its own, which only waits, leaves them unblocked and takes them: the handler sets the flag there;
// - threads that already existed (a BLAS library's own pool, started when it was loaded) keep their mask and take a
//   signal through the same handler, as before.
// The destructor stops that thread and restores the calling thread's mask; the handlers stay (they only set the
// flag). One StopSignals at a time per process.
#pragma once

#include <atomic>
#include <csignal>
#include <thread>

namespace proplab {

class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // Set by SIGINT or SIGTERM; never cleared.
  const std::atomic<bool>& requested() const;
  // The thread that takes the signals (for tests: it is the one with them unblocked).
  std::thread::id taker() const { return taker_.get_id(); }

 private:
  sigset_t previous_mask_;
  std::thread taker_;
};

}  // namespace proplab
