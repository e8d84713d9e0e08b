#include "core/stop_signals.h"

#include <pthread.h>

#include <condition_variable>
#include <cstring>
#include <mutex>

#include "core/error.h"

namespace proplab {

namespace {

std::atomic<bool> g_stop_requested{false};
static_assert(std::atomic<bool>::is_always_lock_free, "the handler may only touch a lock-free flag");

extern "C" void on_stop_signal(int) { g_stop_requested.store(true); }

sigset_t stop_signal_set() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

// The taker thread waits here until the destructor lets it go.
std::mutex g_taker_mutex;
std::condition_variable g_taker_wake;
bool g_taker_done = false;

}  // namespace

StopSignals::StopSignals() {
  g_stop_requested.store(false);
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  PROPLAB_CHECK(sigaction(SIGINT, &action, nullptr) == 0, "sigaction(SIGINT): ", std::strerror(errno));
  PROPLAB_CHECK(sigaction(SIGTERM, &action, nullptr) == 0, "sigaction(SIGTERM): ", std::strerror(errno));
  const sigset_t stops = stop_signal_set();
  const int blocked = pthread_sigmask(SIG_BLOCK, &stops, &previous_mask_);
  PROPLAB_CHECK(blocked == 0, "pthread_sigmask blocks SIGINT and SIGTERM: ", std::strerror(blocked));
  {
    const std::lock_guard<std::mutex> lock(g_taker_mutex);
    g_taker_done = false;
  }
  try {
    taker_ = std::thread([] {
      const sigset_t taken = stop_signal_set();
      pthread_sigmask(SIG_UNBLOCK, &taken, nullptr);
      std::unique_lock<std::mutex> lock(g_taker_mutex);
      g_taker_wake.wait(lock, [] { return g_taker_done; });
      // Blocked again before it ends, so that no signal is handled while the thread exits.
      pthread_sigmask(SIG_BLOCK, &taken, nullptr);
    });
  } catch (...) {
    pthread_sigmask(SIG_SETMASK, &previous_mask_, nullptr);
    throw;
  }
}

StopSignals::~StopSignals() {
  {
    const std::lock_guard<std::mutex> lock(g_taker_mutex);
    g_taker_done = true;
  }
  g_taker_wake.notify_all();
  taker_.join();
  // A signal that arrived meanwhile is pending here and handled now, on this thread, which has finished computing.
  pthread_sigmask(SIG_SETMASK, &previous_mask_, nullptr);
}

const std::atomic<bool>& StopSignals::requested() const { return g_stop_requested; }

}  // namespace proplab
