// gui/app/plot_specs: the GL-free plot specs of the views (gui/app/plot_specs.cpp), shared by the windows and by
// `proplab report`; depth_plot_spec, train_plot_spec and heatmap_plot_spec are declared in app_state.h.
#pragma once

#include <cstddef>
#include <cstdint>

#include "gui/app/app_state.h"

namespace proplab::gui {

// The palette index of `run`: its position in the selection (0 when not selected).
std::size_t colour_index(const AppState& state, const RunSnapshot& run);
// The most records any of `runs` has.
std::int64_t max_records(const RunList& runs);
// The record of `run` shown for the state's record index (clamped to the run's last); -1 without records.
std::int64_t record_of(const RunSnapshot& run, std::int64_t record);
// The kinds the views show for `runs`: the chosen ones, else default_kinds (the residual stream).
std::vector<std::string> shown_kinds(const AppState& state, const RunList& runs);
// The depth profile's x axis for `runs`: the chosen one, else default_depth_axis (block; l/L when depths differ).
DepthAxis shown_depth_axis(const AppState& state, const RunList& runs);
// The chosen probes' statistic against the training step, one series per run and probe.
PlotSpec dynamics_plot_spec(const AppState& state, const RunList& runs);

}  // namespace proplab::gui
