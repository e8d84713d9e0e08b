// dist/pipeline_schedule: the 1F1B order of operations per stage, a simulated run of every stage under rendezvous
// sends (no deadlock, every transfer matched), the slots in flight, and the balanced split of layers.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "dist/pipeline_schedule.h"

namespace proplab::dist {
namespace {

using A = PipelineAction;

std::string describe(const std::vector<PipelineStep>& steps) {
  std::string out;
  for (const PipelineStep& s : steps) {
    const char* letter = s.action == A::forward ? "F" : s.action == A::backward ? "B" : nullptr;
    if (!letter) continue;
    if (!out.empty()) out += ' ';
    out += letter;
    out += std::to_string(s.microbatch);
  }
  return out;
}

TEST(OneFOneB, ComputeOrderPerStageForFourStagesAndSixMicrobatches) {
  // Warm-up forwards (3, 2, 1, 0), then forward/backward pairs, then the remaining backwards.
  EXPECT_EQ(describe(one_f_one_b(4, 0, 6)), "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5");
  EXPECT_EQ(describe(one_f_one_b(4, 1, 6)), "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5");
  EXPECT_EQ(describe(one_f_one_b(4, 2, 6)), "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5");
  EXPECT_EQ(describe(one_f_one_b(4, 3, 6)), "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5");
  // Fewer micro-batches than stages: the warm-up is every forward.
  EXPECT_EQ(describe(one_f_one_b(4, 0, 2)), "F0 F1 B0 B1");
  EXPECT_EQ(describe(one_f_one_b(4, 3, 2)), "F0 B0 F1 B1");
  EXPECT_EQ(describe(one_f_one_b(1, 0, 3)), "F0 B0 F1 B1 F2 B2");
}

TEST(OneFOneB, TransfersSurroundTheComputationsAndAreReorderedBetweenNeighbours) {
  // The middle stage of three, two micro-batches: it takes activation 1 before it sends gradient 0 down.
  std::vector<std::string> got;
  for (const PipelineStep& s : one_f_one_b(3, 1, 2))
    got.push_back(std::string(pipeline_action_name(s.action)) + " " + std::to_string(s.microbatch));
  const std::vector<std::string> expected = {"receive_activation 0", "forward 0",  "send_activation 0",
                                             "receive_activation 1", "forward 1",  "send_activation 1",
                                             "receive_gradient 0",   "backward 0", "send_gradient 0",
                                             "receive_gradient 1",   "backward 1", "send_gradient 1"};
  EXPECT_EQ(got, expected);
  const std::vector<PipelineStep> last = one_f_one_b(2, 1, 2);
  ASSERT_EQ(last.size(), 8u);
  EXPECT_EQ(last[3].action, A::receive_activation);  // receive_activation 0, F0, B0, then activation 1 ...
  EXPECT_EQ(last[3].microbatch, 1);
  EXPECT_EQ(last[4].action, A::send_gradient);  // ... before gradient 0 leaves
  EXPECT_EQ(last[4].microbatch, 0);
}

// Runs every stage's list at once with sends that complete only together with their matching receive. Fails on
// a deadlock, a transfer that meets the wrong micro-batch, a backward before its forward, and counts slots.
void simulate(int stages, int microbatches) {
  SCOPED_TRACE("stages " + std::to_string(stages) + ", micro-batches " + std::to_string(microbatches));
  std::vector<std::vector<PipelineStep>> lists;
  for (int s = 0; s < stages; ++s) lists.push_back(one_f_one_b(stages, s, microbatches));
  std::vector<std::size_t> at(stages, 0);
  std::vector<std::vector<int>> forwarded(stages), backwarded(stages);
  std::vector<int> in_flight(stages, 0), most_in_flight(stages, 0);
  // What each stage's forward consumed: micro-batch m's input must have been received first.
  std::vector<std::map<int, bool>> have_input(stages), have_gradient(stages);
  auto done = [&](int s) { return at[s] >= lists[s].size(); };
  for (int rounds = 0;; ++rounds) {
    ASSERT_LT(rounds, 100000) << "no progress bound";
    bool all_done = true, progressed = false;
    for (int s = 0; s < stages; ++s) {
      if (done(s)) continue;
      all_done = false;
      const PipelineStep step = lists[s][at[s]];
      switch (step.action) {
        case A::forward:
          if (s > 0) {
            ASSERT_TRUE(have_input[s][step.microbatch]) << "stage " << s << " F" << step.microbatch;
          }
          forwarded[s].push_back(step.microbatch);
          most_in_flight[s] = std::max(most_in_flight[s], ++in_flight[s]);
          ++at[s];
          progressed = true;
          break;
        case A::backward:
          ASSERT_TRUE(std::count(forwarded[s].begin(), forwarded[s].end(), step.microbatch) == 1)
              << "stage " << s << " B" << step.microbatch << " before its forward";
          if (s < stages - 1) {
            ASSERT_TRUE(have_gradient[s][step.microbatch]);
          }
          backwarded[s].push_back(step.microbatch);
          --in_flight[s];
          ++at[s];
          progressed = true;
          break;
        case A::send_activation:
        case A::send_gradient: {
          const bool up = step.action == A::send_activation;
          const int peer = up ? s + 1 : s - 1;
          ASSERT_TRUE(peer >= 0 && peer < stages);
          if (done(peer)) FAIL() << "stage " << s << " sends to finished stage " << peer;
          const PipelineStep theirs = lists[peer][at[peer]];
          const A expected = up ? A::receive_activation : A::receive_gradient;
          if (theirs.action == expected) {  // the rendezvous: both move on together
            ASSERT_EQ(theirs.microbatch, step.microbatch) << "stage " << s << " → " << peer << " mismatched";
            (up ? have_input : have_gradient)[peer][step.microbatch] = true;
            ++at[s];
            ++at[peer];
            progressed = true;
          }
          break;
        }
        case A::receive_activation:
        case A::receive_gradient:
          break;  // completes with the peer's send
      }
    }
    if (all_done) break;
    ASSERT_TRUE(progressed) << "deadlock: every unfinished stage waits on a transfer";
  }
  for (int s = 0; s < stages; ++s) {
    std::vector<int> every(microbatches);
    for (int m = 0; m < microbatches; ++m) every[m] = m;
    EXPECT_EQ(forwarded[s], every) << "stage " << s;
    EXPECT_EQ(backwarded[s], every) << "stage " << s;
    EXPECT_EQ(most_in_flight[s], pipeline_slots(stages, s, microbatches)) << "stage " << s;
  }
}

TEST(OneFOneB, EveryStageFinishesUnderRendezvousSends) {
  for (int stages = 1; stages <= 4; ++stages)
    for (int microbatches = 1; microbatches <= 9; ++microbatches) simulate(stages, microbatches);
}

TEST(OneFOneB, SlotOfAMicrobatchIsFreeWhenItArrives) {
  // Micro-batch m goes to slot m mod slots: no forward may land in a slot still held by an earlier micro-batch.
  for (int stages = 1; stages <= 4; ++stages)
    for (int microbatches = 1; microbatches <= 9; ++microbatches)
      for (int s = 0; s < stages; ++s) {
        const int slots = pipeline_slots(stages, s, microbatches);
        std::map<int, int> held;  // slot → micro-batch
        for (const PipelineStep& step : one_f_one_b(stages, s, microbatches)) {
          const int slot = step.microbatch % slots;
          // The first stage fills a slot when it embeds, the others when the activation arrives.
          const bool fills = s == 0 ? step.action == A::forward : step.action == A::receive_activation;
          if (fills) {
            EXPECT_EQ(held.count(slot), 0u) << "stage " << s << " slot " << slot << " m " << step.microbatch;
            held[slot] = step.microbatch;
          }
          if (step.action == A::backward) held.erase(slot);
        }
      }
}

TEST(PipelineBubble, Formula) {
  EXPECT_DOUBLE_EQ(bubble_fraction(1, 4), 0.0);
  EXPECT_DOUBLE_EQ(bubble_fraction(2, 4), 1.0 / 5.0);
  EXPECT_DOUBLE_EQ(bubble_fraction(4, 8), 3.0 / 11.0);
}

TEST(BalanceStages, EqualLayersSplitEvenlyAndTheHeadTakesLayersFromTheLastStage) {
  const std::vector<double> equal(8, 1.0);
  EXPECT_EQ(balance_stages(equal, 0.0, 0.0, 2), (std::vector<int>{0, 4, 8}));
  EXPECT_EQ(balance_stages(equal, 0.0, 0.0, 4), (std::vector<int>{0, 2, 4, 6, 8}));
  // A head worth two layers: the last stage gets two layers fewer (5 + 0 vs 3 + 2).
  EXPECT_EQ(balance_stages(equal, 0.0, 2.0, 2), (std::vector<int>{0, 5, 8}));
  // Uneven layers: the only split with the largest stage cost 6 is [1 1 1] [6] [1].
  const std::vector<double> uneven = {1, 1, 1, 6, 1};
  EXPECT_EQ(balance_stages(uneven, 0.0, 0.0, 3), (std::vector<int>{0, 3, 4, 5}));
  EXPECT_EQ(balance_stages(equal, 0.0, 0.0, 8), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(balance_stages(equal, 0.0, 0.0, 1), (std::vector<int>{0, 8}));
}

}  // namespace
}  // namespace proplab::dist
