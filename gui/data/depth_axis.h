// gui/data/depth_axis: where a run's probes sit along the x axis of a depth profile, which probes a view shows, and
// what a point or heatmap row is called. One x axis for every model:
//   block   block b spans [b, b + 1]: its probes at b + k/(n − 1) in forward order (block_axis.h), so a transformer
//           block's incoming stream is at b, its sublayers (attention, FFN, their norms and sums) at fractions and
//           its outgoing stream at b + 1, where the next block's incoming stream (the same tensor) is
//   depth   normalised depth l/L: the block position over the run's block count L, so the residual stream of a
//           2-layer and of a 24-layer run both span [0, 1] and overlay
//   probe   the probe index (/probes/depth)
// A run without blocks (no probe with /probes/block ≥ 0) is shown by probe index on every axis.
//
// The default axis (default_depth_axis) is the block axis, or l/L when the shown runs differ in depth (block count).
// The kind filter is a set of probe kinds (empty: every probe); views open on the residual stream (default_kinds).
// No GL, no ImGui: tested in tests/gui.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gui/data/run_data.h"
#include "gui/data/run_groups.h"

namespace proplab::gui {

enum class DepthAxis { block, depth, probe };
// "block" | "depth" | "probe".
const char* depth_axis_name(DepthAxis axis);
// The name's axis; nullopt for anything else.
std::optional<DepthAxis> parse_depth_axis(const std::string& text);
// The axis title: "block", "depth l/L" or "probe index".
const char* depth_axis_title(DepthAxis axis);

// The number of blocks L of a run: the largest /probes/block + 1; 0 when no probe is inside a block.
std::int64_t block_count(const std::vector<ProbeInfo>& probes);
// The block axis, or l/L when the runs (with blocks) do not all have the same block count.
DepthAxis default_depth_axis(const RunList& runs);
// The x position of every probe (forward order) on `axis` (see the header comment).
std::vector<double> depth_axis_positions(const std::vector<ProbeInfo>& probes, DepthAxis axis);
// A position on the block axis moved to `axis` for a run of `blocks` blocks (stage markers under l/L).
double block_position_on(double block_position, std::int64_t blocks, DepthAxis axis);

// The name of a probe's block: its name up to the block number ("blocks.3.attn.out" -> "blocks.3",
// "layers.2.preact" -> "layers.2"); "block <b>" when the name does not contain it; empty outside blocks.
std::string block_name(const ProbeInfo& probe);
// The name of every block 0 .. L − 1 of `runs` (L: the largest block_count): its block_name when every run that has
// the block names it alike ("blocks.3"), else its number ("3"). The block axis labels its ticks with them.
std::vector<std::string> block_names(const RunList& runs);

// The probes whose kind is one of `kinds` (every probe when `kinds` is empty), as indices in forward order.
std::vector<std::size_t> probes_of_kinds(const std::vector<ProbeInfo>& probes, const std::vector<std::string>& kinds);
// The kinds a view opens on: {"residual"} when any of the runs has residual-stream probes, else none (every probe).
std::vector<std::string> default_kinds(const RunList& runs);
std::vector<std::string> default_kinds(const std::vector<ProbeInfo>& probes);
// The kinds in a comma-separated list ("residual,branch"; spaces ignored); UserError for an empty item or a kind
// that is not one of residual, branch, norm, preact, postact, logits, embed.
std::vector<std::string> parse_kinds(const std::string& text);
// A short description of a filter: "all probes", "residual", "residual + branch".
std::string kinds_summary(const std::vector<std::string>& kinds);

// A probe's name and kind, and its block on a second line when inside one: "blocks.3.attn.out (branch)\nblock 3
// (blocks.3)". Heatmap rows are read out with it.
std::string probe_description(const ProbeInfo& probe);
// The read-out of one point of a depth profile or heatmap, one line each: the probe's name and kind, its block (when
// inside one), the step and the value (4 significant digits), e.g.
// "blocks.3.attn.out (branch)\nblock 3 (blocks.3)\nstep 120\nforward var = 1.234e-05".
std::string probe_point_text(const ProbeInfo& probe, std::int64_t step, const std::string& value_title, double value);

}  // namespace proplab::gui
