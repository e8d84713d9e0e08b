// The GUI's data layer: loading run files into snapshots, bad files, discovery, the worker-thread library and
// following a run file while another process writes it.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cmath>
#include <functional>
#include <thread>

#include "gui/data/run_data.h"
#include "gui/data/run_library.h"
#include "gui/data/synthetic_run.h"
#include "gui_test_support.h"

namespace proplab::gui {
namespace {

using gui_test::ScratchDirectory;
namespace fs = std::filesystem;

SyntheticRunSpec small_spec(const std::string& name, const std::string& rule = "standard") {
  SyntheticRunSpec spec;
  spec.name = name;
  spec.rule = rule;
  spec.layers = 3;
  spec.records = 4;
  spec.steps_per_record = 5;
  return spec;
}

TEST(RunData, LoadsEverythingARunFileHolds) {
  ScratchDirectory dir;
  SyntheticRunSpec spec = small_spec("alpha", "deepscalelm");
  spec.status = RunStatus::diverged;
  spec.status_detail = "step 15: blocks.2.out (forward) went non-finite";
  write_synthetic_run(dir / "alpha.h5", spec);

  const auto run = load_run_snapshot(dir / "alpha.h5");
  ASSERT_TRUE(run->ok()) << run->error;
  EXPECT_EQ(run->name, "alpha");
  EXPECT_EQ(run->status_text(), "diverged");
  EXPECT_EQ(run->status_detail, spec.status_detail);
  EXPECT_FALSE(run->swmr);
  EXPECT_EQ(run->device, "cpu");
  EXPECT_EQ(run->threads, 1);
  EXPECT_FALSE(run->start_time.empty());
  EXPECT_FALSE(run->end_time.empty());
  EXPECT_EQ(run->config_value("scaling.rule"), "deepscalelm");
  EXPECT_EQ(run->config_value("model.layers"), "3");
  EXPECT_EQ(run->config_value("model.norm"), "pre");

  const std::int64_t probes = synthetic_probe_count(spec);
  ASSERT_EQ(run->probes.size(), static_cast<std::size_t>(probes));
  EXPECT_EQ(run->probes.front().name, "embed.out");
  EXPECT_EQ(run->probes[2].name, "blocks.0.mid");
  EXPECT_EQ(run->probes[2].kind, "residual");
  EXPECT_EQ(run->probes[2].block, 0);
  EXPECT_EQ(run->probes.back().kind, "logits");

  ASSERT_EQ(run->records(), 4u);
  EXPECT_EQ(run->record_steps, (std::vector<std::int64_t>{0, 5, 10, 15}));
  ASSERT_EQ(run->forward.size(), 2u);
  ASSERT_EQ(run->backward.size(), 1u);
  const Dataset2D* var = run->stat(Direction::forward, "var");
  ASSERT_NE(var, nullptr);
  EXPECT_EQ(var->rows, 4);
  EXPECT_EQ(var->columns, probes);
  for (std::int64_t r = 0; r < 4; ++r) {
    for (std::int64_t p = 0; p < probes; ++p) {
      EXPECT_DOUBLE_EQ(var->at(r, p), synthetic_forward_value(spec, p, r));
      EXPECT_DOUBLE_EQ(run->stat(Direction::backward, "var")->at(r, p), synthetic_backward_value(spec, p, r));
    }
  }
  EXPECT_EQ(run->stat(Direction::backward, "rms"), nullptr);
  ASSERT_NE(run->theory(Direction::forward, "var"), nullptr);
  EXPECT_DOUBLE_EQ((*run->theory(Direction::forward, "var"))[5], synthetic_forward_value(spec, 5, 0));
  EXPECT_EQ(run->theory(Direction::forward, "corr"), nullptr);

  EXPECT_EQ(run->train.size(), 16u);
  EXPECT_EQ(run->train.step.back(), 15);
  EXPECT_DOUBLE_EQ(run->final_loss(), run->train.loss.back());
  EXPECT_LT(run->final_loss(), run->train.loss.front());
}

TEST(RunData, LoadsWhatCompressionDid) {
  ScratchDirectory dir;
  SyntheticRunSpec spec = small_spec("compressed");
  spec.compression = true;
  write_synthetic_run(dir / "compressed.h5", spec);
  const auto run = load_run_snapshot(dir / "compressed.h5");
  ASSERT_TRUE(run->ok()) << run->error;
  EXPECT_EQ(run->compression_steps, (std::vector<std::int64_t>{0, 5, 10, 15}));
  ASSERT_EQ(run->compression_error.size(), 4u);
  for (std::int64_t r = 0; r < 4; ++r) {
    EXPECT_DOUBLE_EQ(run->compression_error[r], synthetic_compression_error(r));
    EXPECT_DOUBLE_EQ(run->compression_residual[r], static_cast<double>(r));
  }
  write_synthetic_run(dir / "plain.h5", small_spec("plain"));
  EXPECT_TRUE(load_run_snapshot(dir / "plain.h5")->compression_steps.empty());
}

// The example runs shipped for docs/gui.md are real `proplab run` output (16-layer transformers).
TEST(RunData, ReadsTheShippedExampleRuns) {
  const char* source = std::getenv("PROPLAB_SOURCE_DIR");
  ASSERT_NE(source, nullptr) << "PROPLAB_SOURCE_DIR is not set: run through ctest";
  const fs::path runs = fs::path(source) / "docs" / "examples" / "gui-runs";
  for (const char* name : {"pre_ln_standard", "post_ln_standard", "pre_ln_deepscalelm"}) {
    SCOPED_TRACE(name);
    const auto run = load_run_snapshot(runs / (std::string(name) + ".h5"));
    ASSERT_TRUE(run->ok()) << run->error;
    EXPECT_EQ(run->name, name);
    EXPECT_EQ(run->status_text(), "completed");
    EXPECT_EQ(run->config_value("model.layers"), "16");
    EXPECT_EQ(run->records(), 7u);
    EXPECT_EQ(run->record_steps.back(), 59);
    EXPECT_EQ(run->train.size(), 60u);
    EXPECT_GT(run->probes.size(), 150u);
    ASSERT_NE(run->stat(Direction::forward, "var"), nullptr);
    ASSERT_NE(run->stat(Direction::backward, "var"), nullptr);
    ASSERT_NE(run->theory(Direction::forward, "var"), nullptr);
    EXPECT_FALSE(run->params.empty());
    // The residual stream leaving the first, middle and last block.
    const auto probes = default_dynamics_probes(run->probes);
    ASSERT_EQ(probes.size(), 3u);
    EXPECT_EQ(run->probes[probes.front()].name, "blocks.0.out");
    EXPECT_EQ(run->probes[probes.back()].name, "blocks.15.out");
  }
}

TEST(RunData, FlattensTheResolvedConfig) {
  const auto flat = flatten_config(R"(name = "x"
seed = 7
[model]
layers = 48
norm = "post"
dropout = 0.1
betas = [0.9, 0.95]
tied = true
[record]
forward = ["var", "rms"]
[[sweep.axes]]
key = "model.layers"
)");
  EXPECT_EQ(flat.at("name"), "x");
  EXPECT_EQ(flat.at("seed"), "7");
  EXPECT_EQ(flat.at("model.layers"), "48");
  EXPECT_EQ(flat.at("model.norm"), "post");
  EXPECT_EQ(flat.at("model.dropout"), "0.1");
  EXPECT_EQ(flat.at("model.tied"), "true");
  EXPECT_EQ(flat.at("model.betas"), "[0.9, 0.95]");
  EXPECT_EQ(flat.at("record.forward"), "[\"var\", \"rms\"]");
  EXPECT_EQ(flat.at("sweep.axes[0].key"), "model.layers");
  EXPECT_THROW(flatten_config("[model\nlayers = "), UserError);
}

TEST(RunData, BadFilesBecomeMessagesNotCrashes) {
  ScratchDirectory dir;
  gui_test::write_text_file(dir / "notes.h5", "these are not HDF5 bytes\n");
  gui_test::write_text_file(dir / "empty.h5", "");
  gui_test::write_hdf5_with_attributes(dir / "other.h5", "", 0);
  gui_test::write_hdf5_with_attributes(dir / "future.h5", "proplab-run", 99);
  write_synthetic_run(dir / "whole.h5", small_spec("whole"));
  // The first half of a good run file.
  {
    const auto size = fs::file_size(dir / "whole.h5");
    fs::copy_file(dir / "whole.h5", dir / "truncated.h5");
    fs::resize_file(dir / "truncated.h5", size / 2);
  }

  for (const char* name : {"notes.h5", "empty.h5", "other.h5", "future.h5", "truncated.h5", "missing.h5"}) {
    SCOPED_TRACE(name);
    std::shared_ptr<const RunSnapshot> run;
    ASSERT_NO_THROW(run = load_run_snapshot(dir / name));
    EXPECT_FALSE(run->ok());
    EXPECT_FALSE(run->error.empty());
    EXPECT_EQ(run->status_text(), "unreadable");
    EXPECT_EQ(run->records(), 0u);
    EXPECT_TRUE(run->probes.empty());
  }
  EXPECT_NE(load_run_snapshot(dir / "future.h5")->error.find("format_version"), std::string::npos)
      << load_run_snapshot(dir / "future.h5")->error;
  EXPECT_NE(load_run_snapshot(dir / "other.h5")->error.find("proplab"), std::string::npos)
      << load_run_snapshot(dir / "other.h5")->error;
  EXPECT_TRUE(load_run_snapshot(dir / "whole.h5")->ok());
}

TEST(RunData, ProbeSelections) {
  SyntheticRunSpec spec = small_spec("p");
  spec.layers = 5;
  ScratchDirectory dir;
  write_synthetic_run(dir / "p.h5", spec);
  const auto run = load_run_snapshot(dir / "p.h5");
  ASSERT_TRUE(run->ok()) << run->error;
  EXPECT_EQ(probe_kinds(run->probes), (std::vector<std::string>{"embed", "branch", "residual", "logits"}));
  const auto residual = probes_of_kind(run->probes, "residual");
  ASSERT_EQ(residual.size(), 10u);
  for (const auto p : residual) EXPECT_EQ(run->probes[p].kind, "residual");
  EXPECT_EQ(probes_of_kind(run->probes, "").size(), run->probes.size());
  // The residual stream leaving blocks 0, 2 and 4.
  const auto chosen = default_dynamics_probes(run->probes);
  ASSERT_EQ(chosen.size(), 3u);
  EXPECT_EQ(run->probes[chosen[0]].name, "blocks.0.out");
  EXPECT_EQ(run->probes[chosen[1]].name, "blocks.2.out");
  EXPECT_EQ(run->probes[chosen[2]].name, "blocks.4.out");

  // Without blocks (and without residual probes): first, middle and last.
  std::vector<ProbeInfo> flat(7);
  for (std::size_t p = 0; p < flat.size(); ++p) flat[p].name = "p" + std::to_string(p);
  EXPECT_EQ(default_dynamics_probes(flat), (std::vector<std::size_t>{0, 3, 6}));
  EXPECT_TRUE(default_dynamics_probes({}).empty());
}

TEST(RunDiscovery, FindsRunFilesRecursivelyAndReportsEmptyFolders) {
  ScratchDirectory dir;
  write_synthetic_run(dir / "a.h5", small_spec("a"));
  write_synthetic_run(dir / "sweep" / "layers_8" / "b.h5", small_spec("b"));
  gui_test::write_text_file(dir / "sweep" / "layers_8" / "b.ckpt.h5", "checkpoint");
  gui_test::write_text_file(dir / "sweep" / "notes.txt", "not a run");
  fs::create_directories(dir / "empty");

  std::vector<std::string> problems;
  const auto files = discover_run_files({dir.path(), dir / "empty", dir / "nowhere"}, problems);
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(files[0].filename(), "a.h5");
  EXPECT_EQ(files[1].filename(), "b.h5");
  ASSERT_EQ(problems.size(), 2u);
  EXPECT_NE(problems[0].find("holds no run files"), std::string::npos) << problems[0];
  EXPECT_NE(problems[1].find("no such file or folder"), std::string::npos) << problems[1];

  // A file named directly is taken whatever its name.
  problems.clear();
  const auto named = discover_run_files({dir / "sweep" / "notes.txt"}, problems);
  EXPECT_EQ(named.size(), 1u);
  EXPECT_TRUE(problems.empty());
}

// Polls `condition` on the library's snapshots until it holds or `timeout_s` passes.
bool wait_until(const RunLibrary& library, const std::function<bool(const LibrarySnapshot&)>& condition,
                double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    const LibrarySnapshot state = library.snapshot();
    if (condition(state)) return true;
    if (std::chrono::steady_clock::now() > deadline) return false;
    library.wait_for_change(state.generation, 0.2);
  }
}

const RunSnapshot* find_run(const LibrarySnapshot& state, const std::string& file_name) {
  for (const auto& run : state.runs) {
    if (run->path.filename() == file_name) return run.get();
  }
  return nullptr;
}

TEST(RunLibrary, LoadsOnItsWorkerAndPicksUpNewRuns) {
  ScratchDirectory dir;
  write_synthetic_run(dir / "a.h5", small_spec("a"));
  write_synthetic_run(dir / "nested" / "b.h5", small_spec("b", "xavier"));
  gui_test::write_text_file(dir / "broken.h5", "garbage");

  RunLibraryOptions options;
  options.rescan_interval_s = 0.1;
  RunLibrary library({dir.path()}, options);
  ASSERT_TRUE(library.wait_for_initial_scan(20.0));
  LibrarySnapshot state = library.snapshot();
  ASSERT_EQ(state.runs.size(), 3u);
  EXPECT_TRUE(state.problems.empty());
  ASSERT_NE(find_run(state, "broken.h5"), nullptr);
  EXPECT_FALSE(find_run(state, "broken.h5")->ok());
  ASSERT_NE(find_run(state, "b.h5"), nullptr);
  EXPECT_EQ(find_run(state, "b.h5")->config_value("scaling.rule"), "xavier");
  EXPECT_EQ(find_run(state, "a.h5")->records(), 4u);

  // A run that appears later is found by the rescan; one that goes away disappears.
  write_synthetic_run(dir / "later.h5", small_spec("later"));
  EXPECT_TRUE(wait_until(
      library, [](const LibrarySnapshot& s) { return find_run(s, "later.h5") != nullptr; }, 20.0));
  fs::remove(dir / "a.h5");
  EXPECT_TRUE(wait_until(
      library, [](const LibrarySnapshot& s) { return find_run(s, "a.h5") == nullptr; }, 20.0));

  // Another root added at run time (Ctrl+O).
  ScratchDirectory other_dir_guard;
  const fs::path other = other_dir_guard / "other";
  write_synthetic_run(other / "c.h5", small_spec("c"));
  library.add_root(other);
  EXPECT_TRUE(wait_until(
      library, [](const LibrarySnapshot& s) { return find_run(s, "c.h5") != nullptr; }, 20.0));
}

TEST(RunLibrary, ReportsPathsThatHoldNoRuns) {
  ScratchDirectory dir;
  fs::create_directories(dir / "empty");
  RunLibrary library({dir / "empty", dir / "nope.h5"}, RunLibraryOptions{0.1, 0.1, false});
  library.update_now();
  const LibrarySnapshot state = library.snapshot();
  EXPECT_TRUE(state.initial_scan_done);
  EXPECT_TRUE(state.runs.empty());
  ASSERT_EQ(state.problems.size(), 2u);
}

// A child process writes a run step by step; the library follows it through SWMR without being restarted.
TEST(RunLibrary, FollowsARunFileWhileItIsWritten) {
  ScratchDirectory dir;
  const fs::path path = dir / "live.h5";
  int to_parent[2], to_child[2];
  ASSERT_EQ(pipe(to_parent), 0);
  ASSERT_EQ(pipe(to_child), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(to_parent[0]);
    close(to_child[1]);
    int code = 0;
    try {
      SyntheticRunSpec spec = small_spec("live");
      spec.records = 4;
      SyntheticRunWriter writer(path, spec);
      char go = 0;
      for (int phase = 0; phase < 2; ++phase) {
        writer.append_record();
        writer.append_record();
        writer.flush();
        if (write(to_parent[1], "r", 1) != 1 || read(to_child[0], &go, 1) != 1) throw std::runtime_error("pipe");
      }
      writer.finish();
    } catch (...) {
      code = 1;
    }
    _exit(code);
  }
  close(to_parent[1]);
  close(to_child[0]);
  char signal = 0;
  ASSERT_EQ(read(to_parent[0], &signal, 1), 1);

  RunLibraryOptions options;
  options.rescan_interval_s = 0.1;
  options.live_interval_s = 0.1;
  RunLibrary library({dir.path()}, options);
  auto records_are = [](std::size_t records, bool running) {
    return [=](const LibrarySnapshot& s) {
      const RunSnapshot* run = find_run(s, "live.h5");
      return run != nullptr && run->ok() && run->records() == records && (run->status == RunStatus::running) == running;
    };
  };
  EXPECT_TRUE(wait_until(library, records_are(2, true), 20.0));
  {
    const RunSnapshot* run = find_run(library.snapshot(), "live.h5");
    ASSERT_NE(run, nullptr);
    EXPECT_TRUE(run->swmr);
    for (const auto& [name, matrix] : run->forward) EXPECT_EQ(matrix.rows, 2) << name;
    EXPECT_EQ(run->train.size(), 6u);
  }
  ASSERT_EQ(write(to_child[1], "g", 1), 1);
  ASSERT_EQ(read(to_parent[0], &signal, 1), 1);
  EXPECT_TRUE(wait_until(library, records_are(4, true), 20.0));
  ASSERT_EQ(write(to_child[1], "g", 1), 1);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_TRUE(wait_until(library, records_are(4, false), 20.0));
  const RunSnapshot* run = find_run(library.snapshot(), "live.h5");
  ASSERT_NE(run, nullptr);
  EXPECT_EQ(run->status_text(), "completed");
  EXPECT_EQ(run->stat(Direction::forward, "var")->at(3, 2), synthetic_forward_value(small_spec("live"), 2, 3));
  close(to_parent[0]);
  close(to_child[1]);
}

}  // namespace
}  // namespace proplab::gui
