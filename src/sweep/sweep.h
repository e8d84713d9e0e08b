// sweep: a study's [sweep] table expanded into named, validated points (see docs/studies.md, "Sweeps").
//
//   [sweep]
//   grid  = { "model.layers" = [12, 48], "scaling.rule" = ["standard", "deepscalelm"] }  # cartesian product
//   zip   = { "train.lr" = [1e-3, 3e-4], "train.warmup" = [10, 40] }  # varied together, crossed with grid
//   seeds = 2                                                           # each point with seed, seed + 1, ...
//
// Invariants:
// - Point order: grid axes in file order (the first varies slowest), then the zip index, then the seed (fastest).
//   The order, the names and the shards are pure functions of the study text and the --set overrides.
// - Run names: `<label>=<value>` for every varied key joined by ',' (label: the key's last segment, or the whole
//   key path when two axes share it), then `seed=<seed>` when seeds > 1, e.g. `layers=48,rule=deepscalelm`.
//   Only [A-Za-z0-9._=,-] appear (other characters of a value become '_'); a name over 128 characters keeps its
//   first 119 and ends in '-' + 8 hex digits of a hash of the whole name. Distinct points have distinct names.
// - Validation: every point is checked by the study validator (study/study.h) before anything starts; a problem
//   caused by a swept value is located at that value (`study.toml:7: sweep.grid."model.layers"[2] = 0: ...`),
//   each distinct problem is reported once, all in one UserError.
// - Shard i of n (0-based) holds the points whose index % n == i, so the n shards partition the points.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace proplab {

struct SweepPoint {
  std::size_t index = 0;               // position in the whole sweep
  std::string name;                    // the run name: DIR/<name>.h5
  std::vector<std::string> values;     // one per SweepPlan::columns, as shown in index.csv
  std::vector<std::string> overrides;  // what the point sets over the study, as --set texts
  std::string study_toml;              // the point as a resolved study without [sweep]: what `proplab run` gets
  int ranks = 1;                       // processes its [parallel] layout needs (dp·tp·pp·sp)
};

struct SweepPlan {
  std::string study_name;
  std::string study_path;
  std::vector<std::string> columns;  // the varied key paths, then "seed" when seeds > 1
  std::int64_t seeds = 1;
  std::vector<SweepPoint> points;
};

// Loads the study, expands [sweep] and validates every point. UserError listing every problem.
SweepPlan load_sweep(const std::string& path, const std::vector<std::string>& overrides = {});
// Same, from text (source_name in messages; relative data paths resolve against base_dir).
SweepPlan parse_sweep(const std::string& toml_text, const std::string& source_name, const std::string& base_dir,
                      const std::vector<std::string>& overrides = {});

// A run name from (label, value label) pairs, cut and hashed when too long (see the invariants above).
std::string make_run_name(const std::vector<std::pair<std::string, std::string>>& parts);
// A value's text made safe for run names: characters outside [A-Za-z0-9._-] become '_'.
std::string name_safe(const std::string& text);

struct Shard {
  std::int64_t index = 0;
  std::int64_t count = 1;
};
// Parses "i/n" (0 <= i < n). UserError saying what is allowed.
Shard parse_shard(const std::string& text);
// The indices of the points in `shard`, ascending.
std::vector<std::size_t> shard_points(std::size_t point_count, Shard shard);

}  // namespace proplab
