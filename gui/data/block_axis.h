// gui/data/block_axis: probe depth by block, for runs whose blocks form stages (ResNets, RunSnapshot::blocks).
//
// On the block axis, block b spans [b, b + 1]: its n probes (forward order) sit at b + k/(n − 1) (n = 1: b + 1/2), so
// a block's incoming residual stream is at b and its outgoing stream at b + 1, where the next block's incoming
// stream (the same tensor) is. Probes outside blocks keep the spacing of the nearest block: those before the first
// block sit before it (a ResNet's stem output at −1/2), those after the last block after it (its logits at
// blocks + 1/2). A stage starts at its first block; a transition block's start is where the stage it opens begins.
// Heatmaps have one row per shown probe instead: there a stage starts at the row of its first shown probe.
//
// Invariants: positions are non-decreasing in forward order; stage starts are in stage order, one per stage that
// has a block (in rows: a shown probe), the first one not a transition. No GL, no ImGui: tested in tests/gui.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "gui/data/run_data.h"

namespace proplab::gui {

// Where a stage begins on an axis (block axis: a block index; heatmap: a row index).
struct StageStart {
  std::int64_t stage = 0;   // 0-based (labels say "stage <stage + 1>")
  double position = 0.0;    // blocks or rows
  bool transition = false;  // it begins with a transition block (every stage but the first, in a ResNet)
};

// True when the run has a stage layout (the depth and heatmap views then use the block axis).
bool has_block_axis(const RunSnapshot& run);
// The position of every probe on the block axis (see the header comment); probes must be in forward order.
std::vector<double> block_axis_positions(const std::vector<ProbeInfo>& probes);
// Where each stage begins on the block axis.
std::vector<StageStart> stage_starts(const std::vector<RunBlock>& blocks);
// Where each stage begins among heatmap rows that show the probes `rows` (indices into `probes`, in forward order):
// the index of the row of its first shown probe. Stages without a shown probe are left out.
std::vector<StageStart> stage_starts_in_rows(const std::vector<ProbeInfo>& probes, const std::vector<RunBlock>& blocks,
                                             const std::vector<std::size_t>& rows);
// The rows of each block among `rows`: block b's rows are [first, end). Blocks without a shown probe are left out.
struct BlockRows {
  std::int64_t block = 0;
  std::size_t first = 0, end = 0;
};
std::vector<BlockRows> block_rows(const std::vector<ProbeInfo>& probes, const std::vector<std::size_t>& rows);
// "stage 1", "stage 2", ...
std::string stage_label(std::int64_t stage);

}  // namespace proplab::gui
