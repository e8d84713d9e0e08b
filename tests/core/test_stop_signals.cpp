#include <gtest/gtest.h>
#include <pthread.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <thread>

#include "core/stop_signals.h"

namespace proplab {
namespace {

using namespace std::chrono_literals;

// Whether the calling thread blocks the signal.
bool blocks(int signal) {
  sigset_t mask;
  sigemptyset(&mask);
  EXPECT_EQ(pthread_sigmask(SIG_BLOCK, nullptr, &mask), 0);
  return sigismember(&mask, signal) == 1;
}

bool wait_for(const std::atomic<bool>& flag) {
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!flag.load() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
  return flag.load();
}

TEST(StopSignals, NoThreadStartedUnderItTakesTheSignals) {
  ASSERT_FALSE(blocks(SIGINT));
  ASSERT_FALSE(blocks(SIGTERM));
  {
    const StopSignals stop_signals;
    EXPECT_TRUE(blocks(SIGINT)) << "the calling thread computes: it must not take SIGINT";
    EXPECT_TRUE(blocks(SIGTERM)) << "the calling thread computes: it must not take SIGTERM";
    bool worker_blocks_int = false, worker_blocks_term = false;
    std::thread worker([&] {
      worker_blocks_int = blocks(SIGINT);
      worker_blocks_term = blocks(SIGTERM);
    });
    worker.join();
    EXPECT_TRUE(worker_blocks_int) << "a thread started later inherits the block";
    EXPECT_TRUE(worker_blocks_term);
    EXPECT_NE(stop_signals.taker(), std::this_thread::get_id());
    EXPECT_FALSE(stop_signals.requested().load());
  }
  EXPECT_FALSE(blocks(SIGINT)) << "the destructor restores the calling thread's mask";
  EXPECT_FALSE(blocks(SIGTERM));
}

TEST(StopSignals, SigintAndSigtermSetTheFlag) {
  for (int signal : {SIGINT, SIGTERM}) {
    const StopSignals stop_signals;
    EXPECT_FALSE(stop_signals.requested().load()) << "a new StopSignals starts unset";
    // Process-directed, as from a terminal, a launcher or `kill`: only the taker thread (or a thread older than the
    // StopSignals) may take it, and the process goes on.
    ASSERT_EQ(kill(getpid(), signal), 0);
    EXPECT_TRUE(wait_for(stop_signals.requested())) << "signal " << signal << " did not set the flag";
  }
}

TEST(StopSignals, ASignalWhileTheCallingThreadComputesLeavesItRunning) {
  const StopSignals stop_signals;
  // Many signals while this thread computes: none is handled here (it blocks them), none ends the process.
  volatile double sum = 0.0;
  for (int i = 0; i < 50; ++i) {
    ASSERT_EQ(kill(getpid(), i % 2 ? SIGINT : SIGTERM), 0);
    for (int j = 0; j < 10000; ++j) sum = sum + 1e-3 * j;
  }
  EXPECT_TRUE(wait_for(stop_signals.requested()));
  EXPECT_GT(sum, 0.0);
  sigset_t pending;
  sigemptyset(&pending);
  ASSERT_EQ(sigpending(&pending), 0);
  // The taker thread takes process-directed signals as they come: none waits for this thread.
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while ((sigismember(&pending, SIGINT) == 1 || sigismember(&pending, SIGTERM) == 1) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(1ms);
    sigemptyset(&pending);
    ASSERT_EQ(sigpending(&pending), 0);
  }
  EXPECT_NE(sigismember(&pending, SIGINT), 1);
  EXPECT_NE(sigismember(&pending, SIGTERM), 1);
}

}  // namespace
}  // namespace proplab
