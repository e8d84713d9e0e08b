// sweep: expansion (grid, zip, seeds), run names, validation of every point, sharding, the index and the Slurm
// script, without running anything.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "study/study.h"
#include "support/temp_dir.h"
#include "sweep/index.h"
#include "sweep/runner.h"
#include "sweep/slurm.h"
#include "sweep/sweep.h"

namespace proplab {
namespace {

constexpr const char* kBase = R"(name = "plan"
seed = 5

[model]
type = "transformer"
layers = 1
width = 16
heads = 2
vocab = 16
seq_len = 8

[train]
steps = 10
batch = 4

[device]
type = "cpu"
)";

SweepPlan plan_of(const std::string& sweep, const std::vector<std::string>& overrides = {}) {
  return parse_sweep(std::string(kBase) + sweep, "s.toml", ".", overrides);
}

// The UserError text of a sweep that must be refused.
std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    parse_sweep(text, "s.toml", ".", overrides);
  } catch (const UserError& error) {
    return error.what();
  }
  ADD_FAILURE() << "the sweep was accepted:\n" << text;
  return {};
}

std::vector<std::string> names(const SweepPlan& plan) {
  std::vector<std::string> out;
  for (const auto& point : plan.points) out.push_back(point.name);
  return out;
}

IndexRow status_row(PointStatus status) {
  IndexRow row;
  row.status = status;
  return row;
}

std::size_t count_lines(const std::string& text) {
  return static_cast<std::size_t>(std::count(text.begin(), text.end(), '\n')) + 1;
}

TEST(SweepExpand, GridIsTheCartesianProductFirstAxisSlowest) {
  const SweepPlan plan = plan_of(R"(
[sweep]
grid = { "model.layers" = [1, 3], "scaling.rule" = ["standard", "xavier", "mup"] }
)");
  EXPECT_EQ(plan.study_name, "plan");
  EXPECT_EQ(plan.columns, (std::vector<std::string>{"model.layers", "scaling.rule"}));
  EXPECT_EQ(names(plan),
            (std::vector<std::string>{"layers=1,rule=standard", "layers=1,rule=xavier", "layers=1,rule=mup",
                                      "layers=3,rule=standard", "layers=3,rule=xavier", "layers=3,rule=mup"}));
  const SweepPoint& point = plan.points[4];
  EXPECT_EQ(point.index, 4u);
  EXPECT_EQ(point.values, (std::vector<std::string>{"3", "xavier"}));
  EXPECT_EQ(point.overrides, (std::vector<std::string>{"model.layers=3", "scaling.rule=\"xavier\""}));
  // The point's study is what `proplab run` gets: no [sweep], the point's values and name, and it loads.
  const Study study = parse_study(point.study_toml, "point.toml", ".");
  EXPECT_FALSE(study.has_sweep);
  EXPECT_EQ(study.name, "layers=3,rule=xavier");
  EXPECT_EQ(study.model.transformer().layers, 3);
  EXPECT_EQ(study.scaling.rule, "xavier");
  EXPECT_EQ(study.seed, 5u);
  EXPECT_EQ(point.study_toml.find("[sweep"), std::string::npos);
  // Re-resolving the point's study gives the same text (what the run file's config will say).
  EXPECT_EQ(study.config_toml, point.study_toml);
}

TEST(SweepExpand, ZipAxesGoTogetherAndCrossTheGrid) {
  const SweepPlan plan = plan_of(R"(
[sweep]
grid = { "model.layers" = [1, 2] }
zip = { "train.lr" = [1e-3, 3e-4, 1e-4], "train.warmup" = [0, 2, 4] }
)");
  ASSERT_EQ(plan.points.size(), 6u);
  EXPECT_EQ(plan.columns, (std::vector<std::string>{"model.layers", "train.lr", "train.warmup"}));
  EXPECT_EQ(plan.points[0].name, "layers=1,lr=0.001,warmup=0");
  EXPECT_EQ(plan.points[2].name, "layers=1,lr=1e-4,warmup=4");
  EXPECT_EQ(plan.points[4].name, "layers=2,lr=3e-4,warmup=2");
  for (const SweepPoint& point : plan.points) {
    const Study study = parse_study(point.study_toml, "p.toml", ".");
    const int z = static_cast<int>(point.index % 3);
    EXPECT_EQ(study.train.warmup, 2 * z) << point.name;
    const std::vector<float> lrs{1e-3f, 3e-4f, 1e-4f};
    EXPECT_FLOAT_EQ(study.train.lr, lrs[static_cast<std::size_t>(z)]) << point.name;
    EXPECT_EQ(study.model.transformer().layers, 1 + static_cast<int>(point.index / 3)) << point.name;
  }
}

TEST(SweepExpand, SeedsRepeatEachPointFromTheStudySeed) {
  const SweepPlan plan = plan_of(R"(
[sweep]
grid = { "model.layers" = [1, 2] }
seeds = 3
)");
  EXPECT_EQ(plan.columns.back(), "seed");
  EXPECT_EQ(names(plan), (std::vector<std::string>{"layers=1,seed=5", "layers=1,seed=6", "layers=1,seed=7",
                                                   "layers=2,seed=5", "layers=2,seed=6", "layers=2,seed=7"}));
  EXPECT_EQ(parse_study(plan.points[5].study_toml, "p.toml", ".").seed, 7u);
  // Seeds alone make a sweep; a --set seed moves the base.
  const SweepPlan seeds_only = plan_of("[sweep]\nseeds = 2\n", {"seed=40"});
  EXPECT_EQ(names(seeds_only), (std::vector<std::string>{"seed=40", "seed=41"}));
}

TEST(SweepExpand, NestedTablesAreKeyPathsAndFileOrderNamesTheRun) {
  // A dotted key in [sweep.grid] is the same key path as a quoted one; the name follows the file, not the keys'
  // alphabetical order.
  const SweepPlan plan = plan_of(R"(
[sweep.grid]
train.lr = [0.01]
model.layers = [2]
)");
  ASSERT_EQ(plan.points.size(), 1u);
  EXPECT_EQ(plan.points[0].name, "lr=0.01,layers=2");
}

TEST(SweepNames, AreFilesystemSafeStableAndDistinct) {
  const SweepPlan plan = plan_of(R"(
[sweep]
grid = { "model.type" = ["transformer"], "device.type" = ["cpu"], "record.forward" = [["rms", "var"], ["mean"]] }
zip = { "train.lr" = [1e+1, 2.5e-7] }
)");
  // Two axes ending in `type`: both named by their whole path. Arrays join with '_'; '+' leaves exponents.
  EXPECT_EQ(plan.points[0].name, "model.type=transformer,device.type=cpu,forward=rms_var,lr=10");
  EXPECT_EQ(plan.points[3].name, "model.type=transformer,device.type=cpu,forward=mean,lr=2.5e-7");
  for (const SweepPoint& point : plan.points)
    for (const char c : point.name)
      EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c)) || std::string("._-=,").find(c) != std::string::npos)
          << point.name;
  EXPECT_EQ(name_safe("a/b c\"d"), "a_b_c_d");

  const std::string long_value(200, 'x');
  const std::string cut = make_run_name({{"path", long_value}});
  EXPECT_EQ(cut.size(), 128u);
  EXPECT_EQ(cut.substr(0, 119), ("path=" + long_value).substr(0, 119));
  EXPECT_EQ(cut, make_run_name({{"path", long_value}})) << "names must be stable";
  EXPECT_NE(cut, make_run_name({{"path", long_value + "y"}})) << "a cut name keeps a hash of the whole name";
  EXPECT_EQ(make_run_name({{"layers", "4"}, {"rule", "xavier"}}), "layers=4,rule=xavier");
}

TEST(SweepValidate, EveryPointsProblemsAtOnceAtTheSweptValue) {
  const std::string text = std::string(kBase) + R"(
[sweep]
grid = { "model.layers" = [1, 0], "model.heads" = [2, 3], "model.widht" = [8] }
zip = { "train.lr" = [1e-3, -1.0] }
)";
  const std::string message = error_of(text);
  // file:line: the swept value: the study validator's own problem.
  EXPECT_NE(message.find("s.toml:20: sweep.grid.\"model.layers\"[1] = 0: model.layers: 0 is out of range; allowed: "
                         "an integer in 1..100000"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("s.toml:20: sweep.grid.\"model.heads\"[1] = 3: model.heads: model.width = 16 is not "
                         "divisible by 3 heads"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("s.toml:20: sweep.grid.\"model.widht\"[0] = 8: model.widht: unknown key (did you mean "
                         "`width`?)"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("s.toml:21: sweep.zip.\"train.lr\"[1] = -1.0: train.lr: -1.0 is out of range"),
            std::string::npos)
      << message;
  // 16 points, each problem once.
  EXPECT_EQ(count_lines(message), 4u) << message;
}

TEST(SweepValidate, StudyProblemsComeWithTheSweepsAndLinesSort) {
  std::string text = kBase;
  text.replace(text.find("steps = 10"), 10, "steps = 0");
  const std::string message = error_of(text + R"(
[sweep]
grid = { "model.layers" = [2, 3] }
zip = { "train.lr" = [1e-3], "train.warmup" = [1, 2] }
size = 3
)");
  const auto steps = message.find("s.toml:13: train.steps: 0 is out of range");
  const auto zip = message.find("s.toml:21: sweep.zip.\"train.warmup\": has 2 values but sweep.zip.\"train.lr\" has 1");
  const auto size = message.find("s.toml:22: sweep.size: unknown key; allowed: grid, zip, seeds");
  ASSERT_NE(steps, std::string::npos) << message;
  ASSERT_NE(zip, std::string::npos) << message;
  ASSERT_NE(size, std::string::npos) << message;
  EXPECT_LT(steps, zip);
  EXPECT_LT(zip, size);
}

TEST(SweepValidate, RefusesMalformedSweeps) {
  const std::string base = kBase;
  EXPECT_NE(
      error_of(base + "[sweep]\ngrid = { \"model.layers\" = [] }\n").find("sweep.grid.\"model.layers\": is empty"),
      std::string::npos);
  EXPECT_NE(error_of(base + "[sweep]\ngrid = { \"model.layers\" = 4 }\n").find("expected an array of values"),
            std::string::npos);
  EXPECT_NE(error_of(base + "[sweep]\ngrid = { \"model.layers\" = [2, 2] }\n").find("2 is listed twice"),
            std::string::npos);
  EXPECT_NE(error_of(base + "[sweep]\nseeds = 0\n").find("sweep.seeds: expected an integer in 1..10000, got 0"),
            std::string::npos);
  EXPECT_NE(error_of(base + "[sweep]\nseeds = 1\n").find("sweep: varies nothing"), std::string::npos);
  EXPECT_NE(error_of(base + "[sweep]\ngrid = { name = [\"a\", \"b\"] }\n").find("`name` cannot be swept"),
            std::string::npos);
  EXPECT_NE(error_of(base + "[sweep]\ngrid = { \"model.layers\" = [2] }\nzip = { \"model.layers\" = [3] }\n")
                .find("is also swept as"),
            std::string::npos);
  EXPECT_NE(error_of(base + "[sweep]\ngrid = { seed = [1, 2] }\nseeds = 2\n").find("sweeps the seed"),
            std::string::npos);
  // Two values that become one name.
  EXPECT_NE(error_of(base + "[sweep]\ngrid = { \"model.norm_kind\" = [\"a b\", \"a/b\"] }\n")
                .find("both get the run name \"norm_kind=a_b\""),
            std::string::npos);
  // --set of a swept key would be overridden by the sweep: refused.
  EXPECT_NE(error_of(base + "[sweep]\ngrid = { \"model.layers\" = [2, 3] }\n", {"model.layers=4"})
                .find("--set model.layers=4: model.layers: is swept by sweep.grid.\"model.layers\""),
            std::string::npos);
  // --set of the sweep's own table would be ignored (the points come from the file): refused, naming the key.
  EXPECT_NE(
      error_of(base + "[sweep]\ngrid = { \"model.layers\" = [2, 3] }\n", {"sweep.grid={ \"model.layers\" = [2] }"})
          .find("sweep.grid: the sweep's own table is read from the file, not from --set"),
      std::string::npos);
  EXPECT_NE(error_of(base + "[sweep]\ngrid = { \"model.layers\" = [2, 3] }\n", {"sweep.seeds=3"})
                .find("sweep.seeds: the sweep's own table"),
            std::string::npos);
  // No [sweep]: proplab run is the command.
  EXPECT_NE(error_of(base).find("has no [sweep] table; run a single study with `proplab run s.toml`"),
            std::string::npos);
  // A syntax error is reported as the study loader does.
  EXPECT_NE(error_of(base + "[sweep\n").find("TOML syntax error"), std::string::npos);
}

TEST(SweepShard, ParsesIOfNAndRefusesTheRest) {
  const Shard shard = parse_shard("2/5");
  EXPECT_EQ(shard.index, 2);
  EXPECT_EQ(shard.count, 5);
  for (const std::string bad : {"5/5", "1/0", "-1/3", "1", "a/3", "1/3/4", "", "/3", "1/"})
    EXPECT_THROW(parse_shard(bad), UserError) << bad;
}

TEST(SweepShard, ShardsPartitionThePoints) {
  for (const std::size_t points : {0u, 1u, 7u, 12u, 100u}) {
    for (std::int64_t n = 1; n <= 9; ++n) {
      std::vector<int> seen(points, 0);
      for (std::int64_t i = 0; i < n; ++i) {
        const std::vector<std::size_t> mine = shard_points(points, {i, n});
        EXPECT_TRUE(std::is_sorted(mine.begin(), mine.end()));
        EXPECT_EQ(mine, shard_points(points, {i, n})) << "deterministic";
        // Balanced: sizes differ by at most one.
        EXPECT_LE(mine.size(), (points + static_cast<std::size_t>(n) - 1) / static_cast<std::size_t>(n));
        EXPECT_GE(mine.size(), points / static_cast<std::size_t>(n));
        for (const std::size_t p : mine) ++seen[p];
      }
      for (std::size_t p = 0; p < points; ++p)
        EXPECT_EQ(seen[p], 1) << "point " << p << " of " << points << ", n " << n;
    }
  }
}

TEST(SweepIndex, CsvRoundTripsAwkwardFields) {
  const std::vector<std::string> fields{"layers=1,rule=x", "say \"hi\"", "", "line\nbreak", "plain"};
  const auto records = parse_csv(csv_line({"a", "b", "c", "d", "e"}) + csv_line(fields));
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[1], fields);
  EXPECT_EQ(exact_text(0.1), "0.1");
  EXPECT_EQ(std::stod(exact_text(1.0 / 3.0)), 1.0 / 3.0);
}

TEST(SweepIndex, WritesEveryPointAndReadsBackTheRows) {
  const SweepPlan plan = plan_of("[sweep]\ngrid = { \"model.layers\" = [1, 2, 3] }\n");
  std::map<std::string, IndexRow> rows;
  rows["layers=2"] = IndexRow{PointStatus::failed, "", "", "", "", "proplab: error: x, \"y\""};
  rows["layers=3"] = IndexRow{PointStatus::completed, "1.25", "1.5", "10", "0.5", "completed 10 steps"};
  testing::TempDir dir("proplab-sweep-index");
  update_index(dir.path(), plan, rows);
  std::ifstream in(dir.path() / "index.csv");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto records = parse_csv(text);
  ASSERT_EQ(records.size(), 4u) << text;
  EXPECT_EQ(records[0], (std::vector<std::string>{"run", "model.layers", "status", "final_loss", "final_val_loss",
                                                  "steps", "seconds", "file", "detail"}));
  EXPECT_EQ(records[1], (std::vector<std::string>{"layers=1", "1", "pending", "", "", "", "", "layers=1.h5", ""}));
  EXPECT_EQ(records[3][2], "completed");
  EXPECT_EQ(records[3][3], "1.25");
  const auto read = read_index(dir.path() / "index.csv");
  EXPECT_EQ(read.at("layers=2").status, PointStatus::failed);
  EXPECT_EQ(read.at("layers=2").detail, "proplab: error: x, \"y\"");
  // A second writer (another shard) replaces only its own rows.
  update_index(dir.path(), plan, {{"layers=1", status_row(PointStatus::running)}});
  const auto merged = read_index(dir.path() / "index.csv");
  EXPECT_EQ(merged.at("layers=1").status, PointStatus::running);
  EXPECT_EQ(merged.at("layers=2").status, PointStatus::failed);
  EXPECT_EQ(merged.at("layers=3").final_loss, "1.25");
}

TEST(SweepIndex, DecidesWhatEachPointNeeds) {
  RunFileState none;
  RunFileState done;
  done.exists = done.readable = true;
  done.row.status = PointStatus::completed;
  RunFileState diverged = done;
  diverged.row.status = PointStatus::diverged;
  RunFileState stopped = done;
  stopped.row.status = PointStatus::interrupted;
  RunFileState killed = done;
  killed.row.status = PointStatus::running;
  RunFileState unreadable;
  unreadable.exists = true;
  const IndexRow failed = status_row(PointStatus::failed);
  const IndexRow running = status_row(PointStatus::running);
  EXPECT_EQ(decide_action(nullptr, none, false, false), PointAction::start);
  EXPECT_EQ(decide_action(nullptr, done, true, true), PointAction::skip_finished);
  EXPECT_EQ(decide_action(&failed, diverged, true, true), PointAction::skip_finished);
  EXPECT_EQ(decide_action(nullptr, stopped, true, false), PointAction::resume);
  EXPECT_EQ(decide_action(&running, killed, true, false), PointAction::resume);
  EXPECT_EQ(decide_action(&running, killed, false, false), PointAction::restart);
  EXPECT_EQ(decide_action(&running, unreadable, true, false), PointAction::restart);
  EXPECT_EQ(decide_action(&running, none, false, false), PointAction::start);
  EXPECT_EQ(decide_action(&failed, none, false, false), PointAction::skip_failed);
  EXPECT_EQ(decide_action(&failed, none, false, true), PointAction::start);
  EXPECT_EQ(decide_action(&failed, stopped, true, true), PointAction::restart);
}

TEST(SweepProgress, StatusLineCountsAndEta) {
  SweepCounts counts;
  counts.total = 12, counts.finished = 3, counts.running = 2, counts.failed = 1;
  EXPECT_EQ(sweep_status_line(counts, 250), "sweep: 3/12 done, 2 running, 1 failed, ETA 4m10s");
  EXPECT_EQ(sweep_status_line(counts, -1), "sweep: 3/12 done, 2 running, 1 failed, ETA ?");
  counts.diverged = 1, counts.interrupted = 2;
  EXPECT_EQ(sweep_status_line(counts, 0), "sweep: 3/12 done (1 diverged), 2 running, 1 failed, 2 interrupted");
}

TEST(SweepSlurm, ScriptRunsOneShardPerArrayTask) {
  const SweepPlan plan = plan_of("[sweep]\ngrid = { \"model.layers\" = [1, 2, 3, 4, 5] }\n");
  SlurmOptions options;
  options.executable = "/opt/proplab/bin/proplab";
  options.study = "/home/me/studies/my study.toml";
  options.out_dir = "/scratch/me/plan";
  options.overrides = {"train.steps=100", "scaling.rule=it's"};
  options.tasks = 2;
  options.jobs = 3;
  const std::string script = slurm_script(plan, options);
  EXPECT_EQ(script.rfind("#!/bin/bash\n", 0), 0u);
  for (const std::string expected :
       {"#SBATCH --array=0-1\n", "#SBATCH --cpus-per-task=6\n", "#SBATCH --job-name=plan\n",
        "#SBATCH --output=/scratch/me/plan/logs/slurm-%A_%a.out\n", "#SBATCH --signal=B:TERM@120\n",
        "5 points in 2 array tasks (at most 3 points each)",
        "exec '/opt/proplab/bin/proplab' sweep '/home/me/studies/my study.toml'", "--out '/scratch/me/plan' --jobs 3",
        "--set 'train.steps=100'", "--set 'scaling.rule=it'\\''s'",
        "--shard \"${SLURM_ARRAY_TASK_ID}/${SLURM_ARRAY_TASK_COUNT}\"\n"})
    EXPECT_NE(script.find(expected), std::string::npos) << "missing `" << expected << "` in:\n" << script;
  EXPECT_EQ(script.find("--retry-failed"), std::string::npos);
  // Every #SBATCH line comes before the first command (sbatch stops reading directives there).
  EXPECT_LT(script.rfind("#SBATCH"), script.find("\nset -euo pipefail"));
  // Default: one task per point, and never more tasks than points.
  options.tasks = 0;
  EXPECT_NE(slurm_script(plan, options).find("#SBATCH --array=0-4\n"), std::string::npos);
  options.tasks = 50;
  EXPECT_NE(slurm_script(plan, options).find("#SBATCH --array=0-4\n"), std::string::npos);
}

}  // namespace
}  // namespace proplab
