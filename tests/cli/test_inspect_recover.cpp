// End-to-end tests of `proplab inspect` and `proplab recover`, and of the crash safety of run files: a reader
// sees a running run grow (SWMR), a SIGKILLed run keeps every flushed row, and after `proplab recover` the file
// opens plainly in proplab, h5dump and h5py.
//
// The h5py checks run /usr/bin/python3 with tests/cli/check_run_file.py and are skipped (with a message) when
// h5py is missing; the h5dump checks are skipped when /usr/bin/h5dump is missing. A finished run must hold the
// statistics datasets (/steps and the rest) as well.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "cli/cli_test_support.h"
#include "core/error.h"
#include "io/run_file.h"
#include "io/run_reader.h"

namespace proplab {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using cli_test::CliResult;
using cli_test::kTinyStudy;
using cli_test::read_text;

// Never finishes within a test (about 0.3-0.6 ms a step): it is killed part way.
constexpr const char* kEndlessStudy = R"(name = "endless"

[model]
type = "transformer"
layers = 2
width = 32
heads = 2
vocab = 16
seq_len = 16

[train]
steps = 10000000
batch = 4
eval_every = 500

[device]
type = "cpu"
threads = 1
)";

constexpr auto kWaitLimit = 60s;
const fs::path kPython = "/usr/bin/python3";
const fs::path kH5dump = "/usr/bin/h5dump";

// The statistics fixture: 4 probes, records at steps 0, 5 and 10.
const std::vector<std::string> kProbeNames = {"embed", "blocks.0.attn.out", "blocks.0.mlp.out", "logits"};
const std::vector<std::int64_t> kProbeBlocks = {-1, 0, 0, -1};
const std::vector<std::string> kProbeKinds = {"embed", "branch", "branch", "logits"};
const std::vector<std::int64_t> kRecordSteps = {0, 5, 10};

double fixture_value(const std::string& series, std::int64_t record, std::int64_t probe) {
  const double r = static_cast<double>(record), p = static_cast<double>(probe);
  if (series == "/forward/var") return 1.5 * (r + 1.0) + 0.25 * p;
  if (series == "/forward/mean") return -(r + p) / 8.0;
  if (series == "/backward/var") return 1000.0 + 100.0 * r + p;
  return 0.01 * (r + 1.0) * (p + 1.0);  // /params/weight_rms
}

std::string format_g(double value) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.6g", value);
  return text;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::vector<std::string> words_of(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> words;
  for (std::string word; in >> word;) words.push_back(word);
  return words;
}

class InspectRecoverTest : public cli_test::CliTest {
 protected:
  // A finished run file with the statistics layout of docs/run-format.md, written with RunWriter.
  fs::path write_statistics_fixture() {
    const fs::path path = work_ / "stats.h5";
    RunHeader header;
    header.proplab_version = "0.1.0";
    header.config = kTinyStudy;
    header.device = "cpu";
    header.threads = 1;
    header.layout = "dp=1 tp=1 pp=1";
    RunWriter writer = RunWriter::create(path, header, false);
    const SeriesId steps = writer.create_series_1d_int("/steps");
    const std::int64_t probes = static_cast<std::int64_t>(kProbeNames.size());
    writer.write_strings("/probes/name", kProbeNames);
    writer.write_ints("/probes/depth", {0, 1, 2, 3});
    writer.write_ints("/probes/block", kProbeBlocks);
    writer.write_strings("/probes/kind", kProbeKinds);
    writer.write_strings("/params/name", {"embed.weight", "blocks.0.attn.qkv.weight"});
    const std::vector<std::pair<std::string, std::int64_t>> series = {
        {"/forward/var", probes}, {"/forward/mean", probes}, {"/backward/var", probes}, {"/params/weight_rms", 2}};
    std::vector<SeriesId> ids;
    for (const auto& [name, columns] : series) ids.push_back(writer.create_series_2d(name, columns));
    writer.start();
    for (std::int64_t step = 0; step <= 10; ++step) {
      const double s = static_cast<double>(step);
      writer.append_train({step, 3.0 - 0.1 * s, 1e-3, 1.0, 100.0, 0.1 * s});
    }
    writer.append_eval({10, 2.5});
    for (std::size_t record = 0; record < kRecordSteps.size(); ++record) {
      writer.append_int(steps, kRecordSteps[record]);
      for (std::size_t s = 0; s < series.size(); ++s) {
        std::vector<double> row;
        for (std::int64_t column = 0; column < series[s].second; ++column)
          row.push_back(fixture_value(series[s].first, static_cast<std::int64_t>(record), column));
        writer.append_row(ids[s], row.data());
      }
    }
    writer.finish(RunStatus::completed, "");
    return path;
  }

  // Checks the depth table in `out`: title, then one row per probe with `series` at `record`.
  void expect_table(const CliResult& result, const std::string& series, const std::string& stat, std::size_t record) {
    ASSERT_EQ(result.exit_code, 0) << describe(result);
    const std::string direction = series.substr(1, series.find('/', 1) - 1);
    const std::string title = direction + " " + stat + " at step " + std::to_string(kRecordSteps[record]) +
                              " (record " + std::to_string(record + 1) + " of 3)";
    EXPECT_TRUE(contains(result.out, title)) << "no `" << title << "` in:\n" << result.out;
    std::istringstream lines(result.out.substr(result.out.find(title)));
    std::string line;
    std::getline(lines, line);  // the title
    std::getline(lines, line);  // the column heads
    EXPECT_EQ(words_of(line), (std::vector<std::string>{"depth", "block", "kind", "name", stat})) << line;
    for (std::size_t p = 0; p < kProbeNames.size(); ++p) {
      ASSERT_TRUE(static_cast<bool>(std::getline(lines, line))) << "table ends before probe " << p;
      const std::vector<std::string> words = words_of(line);
      ASSERT_EQ(words.size(), 5u) << line;
      EXPECT_EQ(words[0], std::to_string(p)) << line;
      EXPECT_EQ(words[1], kProbeBlocks[p] < 0 ? "-" : std::to_string(kProbeBlocks[p])) << line;
      EXPECT_EQ(words[2], kProbeKinds[p]) << line;
      EXPECT_EQ(words[3], kProbeNames[p]) << line;
      const double expected = fixture_value(series, static_cast<std::int64_t>(record), static_cast<std::int64_t>(p));
      EXPECT_NEAR(std::stod(words[4]), expected, 1e-6 * std::max(1.0, std::fabs(expected))) << line;
    }
  }

  // Runs `proplab args...`, which must fail as bad input: exit 2, nothing on stdout, every text on stderr.
  void expect_refusal(const std::vector<std::string>& args, const std::vector<std::string>& expected) {
    const CliResult result = run(args);
    EXPECT_EQ(result.exit_code, 2) << describe(result);
    EXPECT_TRUE(result.out.empty()) << "a refusal printed a partial report:\n" << result.out;
    for (const auto& text : expected)
      EXPECT_TRUE(contains(result.err, text)) << "no `" << text << "` in:\n" << result.err;
  }

  // Polls until an SWMR-read RunReader opens `path` (the writer has started) and holds at least `rows` train
  // rows; returns the row count seen. Fails the test after kWaitLimit.
  std::int64_t wait_for_rows(const fs::path& path, std::int64_t rows) {
    const auto deadline = std::chrono::steady_clock::now() + kWaitLimit;
    std::string last_error;
    while (std::chrono::steady_clock::now() < deadline) {
      if (fs::exists(path)) {
        try {
          const RunReader reader = RunReader::open(path, RunOpenMode::swmr);
          const std::int64_t seen = static_cast<std::int64_t>(reader.read_train().size());
          if (seen >= rows) return seen;
        } catch (const UserError& error) {
          last_error = error.what();  // created but not yet switched to SWMR writing
        }
      }
      std::this_thread::sleep_for(20ms);
    }
    ADD_FAILURE() << "no SWMR reader saw " << rows << " rows in " << path << " within " << kWaitLimit.count()
                  << " s; last error: " << last_error;
    return -1;
  }

  // SIGKILLs the run `pid` and reaps it.
  void kill_run(pid_t pid) {
    ASSERT_EQ(kill(pid, SIGKILL), 0);
    const CliResult killed = finish(pid);
    EXPECT_EQ(killed.exit_code, 128 + SIGKILL) << describe(killed);
  }

  // Whether /usr/bin/python3 can import h5py.
  bool have_h5py() {
    if (!fs::exists(kPython)) return false;
    return run_program(kPython, {"-c", "import h5py"}).exit_code == 0;
  }

  // Runs tests/cli/check_run_file.py on `path` with `args`; expects it to pass.
  void expect_h5py_check(const fs::path& path, const std::vector<std::string>& args) {
    const char* source = std::getenv("PROPLAB_SOURCE_DIR");
    ASSERT_TRUE(source != nullptr && *source != '\0') << "PROPLAB_SOURCE_DIR is not set: run through ctest";
    const fs::path script = fs::path(source) / "tests" / "cli" / "check_run_file.py";
    ASSERT_TRUE(fs::exists(script)) << script;
    std::vector<std::string> command = {script.string(), path.string()};
    command.insert(command.end(), args.begin(), args.end());
    const CliResult result = run_program(kPython, command);
    EXPECT_EQ(result.exit_code, 0) << "check_run_file.py " << path << ":\n" << describe(result);
  }

  void expect_h5dump_header(const fs::path& path) {
    const CliResult result = run_program(kH5dump, {"-H", path.string()});
    EXPECT_EQ(result.exit_code, 0) << "h5dump -H " << path << ":\n" << describe(result);
    EXPECT_TRUE(contains(result.out, "GROUP \"train\"")) << result.out;
  }
};

// ---- inspect ----

TEST_F(InspectRecoverTest, InspectSummarisesAFinishedRun) {
  write_file("tiny.toml", kTinyStudy);
  const CliResult trained = run({"run", "tiny.toml", "--out", "out"});
  ASSERT_EQ(trained.exit_code, 0) << describe(trained);
  const fs::path run_file = work_ / "out" / "tiny.h5";
  const RunReader reader = RunReader::open(run_file);
  const TrainCurves train = reader.read_train();
  const EvalCurves eval = reader.read_eval();
  ASSERT_EQ(train.size(), 20u);
  ASSERT_EQ(eval.size(), 2u);

  const CliResult result = run({"inspect", "out/tiny.h5"});
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  for (const std::string& text :
       {std::string("status:   completed"), std::string("name:     tiny"), std::string("device:   cpu"),
        std::string("threads:  1"), std::string("layout:   dp=1 tp=1 pp=1\n"),
        std::string("model:    transformer, layers 1, width 16, heads 2"),
        std::string("scaling:  standard"), std::string("data:     markov"), std::string("steps:    20"),
        "started:  " + reader.attribute_string("start_time"), "ended:    " + reader.attribute_string("end_time"),
        "host:     " + reader.attribute_string("host"),
        "train:    20 rows, last loss " + format_g(train.loss.back()) + " at step 19",
        "eval:     2 rows, last loss " + format_g(eval.loss.back()) + " at step 20"}) {
    EXPECT_TRUE(contains(result.out, text)) << "no `" << text << "` in:\n" << result.out;
  }
  EXPECT_FALSE(contains(result.out, "SWMR")) << "a finished run opens plainly:\n" << result.out;
  if (reader.exists("/steps")) {
    EXPECT_TRUE(contains(result.out, " at step ")) << "a run with statistics prints a depth table:\n" << result.out;
  } else {
    EXPECT_TRUE(contains(result.out, "records:  0")) << result.out;
    expect_refusal({"inspect", "out/tiny.h5", "--stat", "var"}, {"records no statistics"});
  }
}

TEST_F(InspectRecoverTest, InspectPrintsTheDepthTableOfAStatistic) {
  write_statistics_fixture();
  const CliResult plain = run({"inspect", "stats.h5"});
  expect_table(plain, "/forward/var", "var", 2);
  EXPECT_TRUE(contains(plain.out, "probes:   4")) << plain.out;
  EXPECT_TRUE(contains(plain.out, "params:   2")) << plain.out;
  EXPECT_TRUE(contains(plain.out, "records:  3 (steps 0..10)")) << plain.out;
  EXPECT_TRUE(contains(plain.out, "train:    11 rows")) << plain.out;

  expect_table(run({"inspect", "stats.h5", "--step", "5"}), "/forward/var", "var", 1);
  expect_table(run({"inspect", "stats.h5", "--stat", "mean", "--step", "0"}), "/forward/mean", "mean", 0);
  expect_table(run({"inspect", "stats.h5", "--backward"}), "/backward/var", "var", 2);
  expect_table(run({"inspect", "stats.h5", "--backward", "--stat", "var", "--step", "5"}), "/backward/var", "var", 1);

  expect_refusal({"inspect", "stats.h5", "--stat", "kurtosis"},
                 {"statistic 'kurtosis' is not recorded in /forward", "recorded: mean, var"});
  expect_refusal({"inspect", "stats.h5", "--backward", "--stat", "mean"},
                 {"not recorded in /backward", "recorded: var"});
  expect_refusal({"inspect", "stats.h5", "--step", "7"},
                 {"step 7 was not recorded", "nearest recorded steps are 5 and 10"});
  expect_refusal({"inspect", "stats.h5", "--step", "99"}, {"step 99 was not recorded", "nearest recorded step is 10"});
  expect_refusal({"inspect", "stats.h5", "--step", "-1"}, {"--step"});
  expect_refusal({"inspect", "stats.h5", "--step", "ten"}, {"--step"});
}

TEST_F(InspectRecoverTest, InspectAndRecoverRefuseOtherFiles) {
  write_file("notes.txt", "this is not an HDF5 file\n");
  {
    // An HDF5 file without proplab's root attributes.
    const std::string path = (work_ / "other.h5").string();
    const hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(file, 0);
    const hsize_t count = 3;
    const hid_t space = H5Screate_simple(1, &count, nullptr);
    const hid_t dataset = H5Dcreate2(file, "/x", H5T_IEEE_F64LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(dataset, 0);
    H5Dclose(dataset);
    H5Sclose(space);
    ASSERT_GE(H5Fclose(file), 0);
  }
  {
    // A proplab run file of a future format version.
    const std::string path = (work_ / "future.h5").string();
    const hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(file, 0);
    const hid_t string_type = H5Tcopy(H5T_C_S1);
    H5Tset_size(string_type, std::strlen(run_format_name));
    const hid_t scalar = H5Screate(H5S_SCALAR);
    const hid_t format = H5Acreate2(file, "format", string_type, scalar, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(H5Awrite(format, string_type, run_format_name), 0);
    const std::int64_t version = 99;
    const hid_t format_version = H5Acreate2(file, "format_version", H5T_STD_I64LE, scalar, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(H5Awrite(format_version, H5T_NATIVE_INT64, &version), 0);
    H5Aclose(format);
    H5Aclose(format_version);
    H5Sclose(scalar);
    H5Tclose(string_type);
    ASSERT_GE(H5Fclose(file), 0);
  }
  const std::string other_bytes = read_text(work_ / "other.h5"), future_bytes = read_text(work_ / "future.h5");
  for (const char* command : {"inspect", "recover"}) {
    SCOPED_TRACE(command);
    expect_refusal({command, "notes.txt"}, {"notes.txt", "is not an HDF5 file"});
    expect_refusal({command, "other.h5"}, {"other.h5", "is not a proplab run file"});
    expect_refusal({command, "future.h5"}, {"future.h5", "format_version 99"});
    expect_refusal({command, "missing.h5"}, {"missing.h5", "does not exist"});
    expect_refusal({command}, {"run_file"});
  }
  EXPECT_EQ(read_text(work_ / "other.h5"), other_bytes);
  EXPECT_EQ(read_text(work_ / "future.h5"), future_bytes);
}

TEST_F(InspectRecoverTest, HelpListsInspectAndRecover) {
  const CliResult top = run({"--help"});
  EXPECT_EQ(top.exit_code, 0) << describe(top);
  EXPECT_TRUE(contains(top.out, "proplab inspect RUN.h5")) << top.out;
  EXPECT_TRUE(contains(top.out, "proplab recover RUN.h5")) << top.out;
  const CliResult help = run({"inspect", "--help"});
  EXPECT_EQ(help.exit_code, 0) << describe(help);
  for (const char* option : {"--stat", "--backward", "--step", "run_file"})
    EXPECT_TRUE(contains(help.out, option)) << "`proplab inspect --help` lacks " << option << ":\n" << help.out;
}

// ---- crash safety ----

TEST_F(InspectRecoverTest, SwmrReaderSeesARunningRunGrow) {
  write_file("endless.toml", kEndlessStudy);
  const fs::path run_file = work_ / "out" / "endless.h5";
  const pid_t pid = spawn({"run", "endless.toml", "--out", "out"});
  ASSERT_GT(pid, 0);
  const std::int64_t first = wait_for_rows(run_file, 1);
  if (first < 0) {
    kill_run(pid);
    return;
  }
  {
    // One reader kept open while the writer appends: each read refreshes and sees more train rows and, when
    // the run records statistics, more records.
    const RunReader reader = RunReader::open(run_file, RunOpenMode::swmr);
    EXPECT_EQ(reader.status(), RunStatus::running);
    std::vector<std::string> series = {"/train/step"};
    if (reader.exists("/steps")) series.push_back("/steps");
    std::vector<std::vector<std::int64_t>> counts(series.size());
    auto grown = [&] {
      return std::all_of(counts.begin(), counts.end(), [](const auto& seen) { return seen.size() >= 3; });
    };
    const auto deadline = std::chrono::steady_clock::now() + kWaitLimit;
    while (!grown() && std::chrono::steady_clock::now() < deadline) {
      for (std::size_t i = 0; i < series.size(); ++i) {
        const std::int64_t now = static_cast<std::int64_t>(reader.read_ints(series[i]).size());
        if (!counts[i].empty()) {
          ASSERT_GE(now, counts[i].back()) << series[i] << " shrank";
        }
        if (counts[i].empty() || now > counts[i].back()) counts[i].push_back(now);
      }
      std::this_thread::sleep_for(150ms);
    }
    for (std::size_t i = 0; i < series.size(); ++i) {
      EXPECT_GE(counts[i].size(), 3u) << series[i] << " did not grow twice within " << kWaitLimit.count() << " s";
      RecordProperty(series[i] + "_seen", std::to_string(counts[i].back()));
    }
  }

  // While the run goes on, inspect reads it (SWMR) and recover refuses to touch it.
  const CliResult inspected = run({"inspect", "out/endless.h5"});
  EXPECT_EQ(inspected.exit_code, 0) << describe(inspected);
  EXPECT_TRUE(contains(inspected.out, "SWMR-read mode")) << inspected.out;
  EXPECT_TRUE(contains(inspected.out, "status:   running")) << inspected.out;
  expect_refusal({"recover", "out/endless.h5"},
                 {"is being written by process " + std::to_string(pid) + " on host", "still going"});
  const std::int64_t before = wait_for_rows(run_file, 1);
  EXPECT_GT(wait_for_rows(run_file, before + 1), before) << "the run stopped growing after the refused recover";
  kill_run(pid);
}

TEST_F(InspectRecoverTest, KilledRunIsRecoveredWithEveryFlushedRow) {
  write_file("endless.toml", kEndlessStudy);
  const fs::path run_file = work_ / "out" / "endless.h5";
  const pid_t pid = spawn({"run", "endless.toml", "--out", "out"});
  ASSERT_GT(pid, 0);
  const std::int64_t seen = wait_for_rows(run_file, 200);
  kill_run(pid);
  ASSERT_GE(seen, 200);

  // Marked open for write: plain opens fail, SWMR-read holds every row seen before the kill.
  {
    const std::string path = run_file.string();
    H5E_auto2_t saved_function = nullptr;
    void* saved_data = nullptr;
    H5Eget_auto2(H5E_DEFAULT, &saved_function, &saved_data);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    H5Eset_auto2(H5E_DEFAULT, saved_function, saved_data);
    EXPECT_LT(file, 0) << "a plain HDF5 open of a killed run's file succeeded";
    if (file >= 0) H5Fclose(file);
  }
  EXPECT_THROW(RunReader::open(run_file, RunOpenMode::normal), UserError);
  std::int64_t rows_after_kill = 0;
  std::int64_t records_after_kill = -1;  // -1: the run records no statistics
  std::int64_t longest_after_kill = -1;  // the longest statistics series, one longer for a record killed mid-write
  {
    const RunReader reader = RunReader::open(run_file, RunOpenMode::swmr);
    EXPECT_EQ(reader.status(), RunStatus::running);
    rows_after_kill = static_cast<std::int64_t>(reader.read_train().size());
    if (reader.exists("/steps")) {
      // Whole records: the kill may come in the middle of a record's write, after some of its series were extended.
      records_after_kill = static_cast<std::int64_t>(reader.read_ints("/steps").size());
      longest_after_kill = records_after_kill;
      for (const std::string group : {"/forward", "/backward", "/params"}) {
        for (const std::string& stat : reader.list(group)) {
          if (group == "/params" && stat == "name") continue;
          const std::int64_t rows = reader.read_2d(group + "/" + stat).rows;
          records_after_kill = std::min(records_after_kill, rows);
          longest_after_kill = std::max(longest_after_kill, rows);
        }
      }
    }
    EXPECT_GE(rows_after_kill, seen);
    // An open reader holds HDF5's file lock: recover refuses, and the file is left as it was.
    const std::string killed_bytes = read_text(run_file);
    expect_refusal({"recover", "out/endless.h5"}, {"unable to lock", "holding the file open"});
    EXPECT_EQ(read_text(run_file), killed_bytes) << "a refused recover changed the file";
  }
  const CliResult inspected = run({"inspect", "out/endless.h5"});
  EXPECT_EQ(inspected.exit_code, 0) << describe(inspected);
  EXPECT_TRUE(contains(inspected.out, "proplab recover out/endless.h5")) << inspected.out;

  const CliResult recovered = run({"recover", "out/endless.h5"});
  ASSERT_EQ(recovered.exit_code, 0) << describe(recovered);
  EXPECT_TRUE(contains(recovered.out, "recovered out/endless.h5")) << recovered.out;
  EXPECT_TRUE(contains(recovered.out, "running -> failed (killed)")) << recovered.out;
  EXPECT_TRUE(contains(recovered.out, std::to_string(rows_after_kill) + " train rows")) << recovered.out;
  if (records_after_kill >= 0) {
    EXPECT_TRUE(contains(recovered.out, std::to_string(records_after_kill) + " records")) << recovered.out;
    EXPECT_EQ(contains(recovered.out, "cut the series of / to their "), longest_after_kill > records_after_kill)
        << recovered.out;
  }
  {
    const RunReader reader = RunReader::open(run_file, RunOpenMode::normal);
    EXPECT_FALSE(reader.swmr());
    EXPECT_EQ(reader.status(), RunStatus::failed);
    EXPECT_EQ(reader.attribute_string("status_detail"), "killed");
    EXPECT_FALSE(reader.attribute_string("end_time").empty());
    const TrainCurves train = reader.read_train();
    ASSERT_EQ(static_cast<std::int64_t>(train.size()), rows_after_kill) << "recovery lost or invented rows";
    for (std::int64_t i = 0; i < rows_after_kill; ++i) {
      ASSERT_EQ(train.step[i], i);
      ASSERT_TRUE(std::isfinite(train.loss[i])) << "row " << i;
    }
    if (records_after_kill >= 0) {
      EXPECT_EQ(static_cast<std::int64_t>(reader.read_ints("/steps").size()), records_after_kill);
      const std::int64_t probes = static_cast<std::int64_t>(reader.read_strings("/probes/name").size());
      for (const std::string direction : {"/forward/", "/backward/"}) {
        for (const std::string& stat : reader.list(direction.substr(0, direction.size() - 1))) {
          const Dataset2D values = reader.read_2d(direction + stat);
          EXPECT_EQ(values.columns, probes) << direction << stat;
          EXPECT_EQ(values.rows, records_after_kill) << direction << stat << ": not cut to whole records";
        }
      }
    }
  }
  const std::string recovered_bytes = read_text(run_file);
  const CliResult again = run({"recover", "out/endless.h5"});
  EXPECT_EQ(again.exit_code, 0) << describe(again);
  EXPECT_TRUE(contains(again.out, "nothing to recover")) << again.out;
  EXPECT_EQ(read_text(run_file), recovered_bytes) << "recovering a recovered file changed it";

  const bool h5dump = fs::exists(kH5dump), h5py = have_h5py();
  if (h5dump) expect_h5dump_header(run_file);
  if (h5py) {
    expect_h5py_check(run_file,
                      {"--status", "failed", "--detail", "killed", "--train-rows", std::to_string(rows_after_kill)});
  }
  if (!h5dump || !h5py) {
    GTEST_SKIP() << "checked with proplab only: " << (h5dump ? "" : "/usr/bin/h5dump is missing (hdf5-tools); ")
                 << (h5py ? "" : "/usr/bin/python3 cannot import h5py (python3-h5py)");
  }
}

TEST_F(InspectRecoverTest, FinishedRunFileMatchesTheLayoutInH5pyAndH5dump) {
  write_file("tiny.toml", kTinyStudy);
  const CliResult trained = run({"run", "tiny.toml", "--out", "out"});
  ASSERT_EQ(trained.exit_code, 0) << describe(trained);
  const fs::path run_file = work_ / "out" / "tiny.h5";
  ASSERT_TRUE(RunReader::open(run_file).exists("/steps")) << "a finished run has its statistics";
  if (fs::exists(kH5dump)) expect_h5dump_header(run_file);
  if (!have_h5py()) GTEST_SKIP() << "/usr/bin/python3 cannot import h5py (python3-h5py): layout not checked with h5py";
  std::vector<std::string> args = {"--status", "completed", "--train-rows", "20", "--eval-rows", "2", "--expect-stats"};
  expect_h5py_check(run_file, args);
  // The statistics layout itself, on a file that has it (the fixture), so the script's statistics checks run.
  expect_h5py_check(write_statistics_fixture(),
                    {"--status", "completed", "--train-rows", "11", "--eval-rows", "1", "--expect-stats"});
}

TEST_F(InspectRecoverTest, RecordedQuickstartRunOpensInH5pyAndH5dump) {
  // The README's quickstart study itself, shortened: every dataset of the layout, with statistics.
  const char* source = std::getenv("PROPLAB_SOURCE_DIR");
  ASSERT_TRUE(source != nullptr && *source != '\0') << "PROPLAB_SOURCE_DIR is not set: run through ctest";
  const fs::path study = fs::path(source) / "studies" / "quickstart.toml";
  const CliResult trained = run({"run", study.string(), "--out", "out", "--set", "train.steps=30", "--set",
                                 "train.eval_every=10", "--set", "train.warmup=5", "--set", "record.every=10"});
  ASSERT_EQ(trained.exit_code, 0) << describe(trained);
  const fs::path run_file = work_ / "out" / "quickstart.h5";
  const RunReader reader = RunReader::open(run_file);
  EXPECT_EQ(reader.read_ints("/steps"), (std::vector<std::int64_t>{0, 10, 20, 29}));
  if (fs::exists(kH5dump)) expect_h5dump_header(run_file);
  if (!have_h5py()) GTEST_SKIP() << "/usr/bin/python3 cannot import h5py (python3-h5py): layout not checked with h5py";
  expect_h5py_check(run_file, {"--status", "completed", "--train-rows", "30", "--eval-rows", "3", "--expect-stats"});
}

}  // namespace
}  // namespace proplab
