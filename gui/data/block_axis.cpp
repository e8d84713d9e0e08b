#include "gui/data/block_axis.h"

#include <map>

namespace proplab::gui {

namespace {

// Whether the first block of `stage` is a transition.
bool stage_opens_with_transition(const std::vector<RunBlock>& blocks, std::int64_t stage) {
  for (const auto& block : blocks) {
    if (block.stage == stage) return block.transition;
  }
  return false;
}

}  // namespace

bool has_block_axis(const RunSnapshot& run) { return !run.blocks.empty(); }

std::vector<double> block_axis_positions(const std::vector<ProbeInfo>& probes) {
  std::map<std::int64_t, std::int64_t> count;  // probes per block
  for (const auto& probe : probes) {
    if (probe.block >= 0) ++count[probe.block];
  }
  std::vector<double> positions(probes.size());
  if (count.empty()) {
    for (std::size_t p = 0; p < probes.size(); ++p) positions[p] = static_cast<double>(p);
    return positions;
  }
  // Spacing of a block's probes: 1/(n − 1), or 1/2 for a block of one probe (which sits in its middle).
  auto spacing = [&](std::int64_t block) {
    const std::int64_t n = count[block];
    return n >= 2 ? 1.0 / static_cast<double>(n - 1) : 0.5;
  };
  std::size_t leading = 0;  // probes before the first block's
  while (probes[leading].block < 0) ++leading;
  const std::int64_t first_block = probes[leading].block;
  for (std::size_t p = 0; p < leading; ++p)
    positions[p] = static_cast<double>(first_block) - static_cast<double>(leading - p) * spacing(first_block);
  std::map<std::int64_t, std::int64_t> seen;
  std::int64_t last_block = first_block;
  std::int64_t after_block = 0;  // probes outside blocks since the last block's
  for (std::size_t p = leading; p < probes.size(); ++p) {
    const std::int64_t block = probes[p].block;
    if (block >= 0) {
      const std::int64_t k = seen[block]++;
      const std::int64_t n = count[block];
      positions[p] = static_cast<double>(block) + (n >= 2 ? static_cast<double>(k) / static_cast<double>(n - 1) : 0.5);
      last_block = block;
      after_block = 0;
    } else {
      ++after_block;
      positions[p] = static_cast<double>(last_block + 1) + static_cast<double>(after_block) * spacing(last_block);
    }
  }
  return positions;
}

std::vector<StageStart> stage_starts(const std::vector<RunBlock>& blocks) {
  std::vector<StageStart> starts;
  for (std::size_t b = 0; b < blocks.size(); ++b) {
    if (starts.empty() || blocks[b].stage != starts.back().stage)
      starts.push_back(StageStart{blocks[b].stage, static_cast<double>(b), blocks[b].transition});
  }
  return starts;
}

std::vector<StageStart> stage_starts_in_rows(const std::vector<ProbeInfo>& probes, const std::vector<RunBlock>& blocks,
                                             const std::vector<std::size_t>& rows) {
  std::vector<StageStart> starts;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const std::int64_t block = probes[rows[i]].block;
    if (block < 0 || block >= static_cast<std::int64_t>(blocks.size())) continue;
    const std::int64_t stage = blocks[static_cast<std::size_t>(block)].stage;
    if (starts.empty() || stage > starts.back().stage)
      starts.push_back(StageStart{stage, static_cast<double>(i), stage_opens_with_transition(blocks, stage)});
  }
  return starts;
}

std::vector<BlockRows> block_rows(const std::vector<ProbeInfo>& probes, const std::vector<std::size_t>& rows) {
  std::vector<BlockRows> out;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const std::int64_t block = probes[rows[i]].block;
    if (block < 0) continue;
    if (!out.empty() && out.back().block == block && out.back().end == i) {
      out.back().end = i + 1;
    } else {
      out.push_back(BlockRows{block, i, i + 1});
    }
  }
  return out;
}

std::string stage_label(std::int64_t stage) { return "stage " + std::to_string(stage + 1); }

}  // namespace proplab::gui
