#include <gtest/gtest.h>
#include <hdf5.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <future>
#include <limits>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <thread>

#include "io/checkpoint.h"
#include "io/hdf5_util.h"
#include "io/run_file.h"
#include "io/run_reader.h"
#include "io_test_support.h"

namespace proplab {
namespace {

using io_test::ScratchDirectory;
using io_test::user_error_message;

RunHeader test_header() {
  RunHeader header;
  header.proplab_version = "0.1.0-test";
  header.config = "[model]\nkind = \"transformer\"\nwidth = 256\n# unicode: \xc3\xbc \xe2\x9c\x93\n";
  header.host = "test-host";
  header.device = "cpu";
  header.threads = 2;
  header.layout = "dp=1 tp=1 pp=1";
  header.precision = "bf16";
  header.kernels = "sgemm: OpenBLAS 0.3.21; conv: im2col";
  header.start_time = "2026-11-29T12:00:00Z";
  return header;
}

// Values with full 53-bit mantissas, so an inexact round trip would show.
TrainRow train_row(std::int64_t step) {
  TrainRow row;
  row.step = step;
  row.loss = 5.0 / (1.0 + 0.1 * static_cast<double>(step));
  row.lr = 1e-3 * std::cos(0.01 * static_cast<double>(step));
  row.grad_norm = std::sqrt(1.0 + static_cast<double>(step));
  row.tokens_per_s = 3300.0 + static_cast<double>(step) / 7.0;
  row.wall_time = 0.3 * static_cast<double>(step) + 1.0 / 3.0;
  return row;
}

bool train_rows_match(const TrainCurves& curves) {
  for (std::size_t i = 0; i < curves.size(); ++i) {
    const TrainRow expected = train_row(static_cast<std::int64_t>(i));
    if (curves.step[i] != expected.step || curves.loss[i] != expected.loss || curves.lr[i] != expected.lr ||
        curves.grad_norm[i] != expected.grad_norm || curves.tokens_per_s[i] != expected.tokens_per_s ||
        curves.wall_time[i] != expected.wall_time) {
      return false;
    }
  }
  return true;
}

RunWriterOptions no_automatic_flush() {
  RunWriterOptions options;
  options.flush_every = 1000;
  options.flush_interval_s = 3600.0;
  return options;
}

TEST(RunFile, WriteFinishAndReadBackEveryValue) {
  ScratchDirectory dir;
  const auto path = run_file_path(dir / "runs", "alpha");  // the directory does not exist yet
  EXPECT_EQ(path.filename(), "alpha.h5");
  RunWriterOptions options;
  options.flush_every = 64;  // 150 rows: two automatic writes and a remainder at finish
  options.flush_interval_s = 3600.0;
  RunWriter writer = RunWriter::create(path, test_header(), false, options);

  const std::vector<std::string> sites = {"embed", "", "blocks.0.attn \xe2\x9c\x93"};
  const std::vector<std::int64_t> layers = {0, -1, std::numeric_limits<std::int64_t>::max()};
  const std::vector<double> predictions = {0.5, -0.0, 1e-310};
  writer.write_strings("/forward/sites", sites);
  writer.write_ints("/forward/layer", layers);
  writer.write_doubles("/theory/predicted", predictions);
  writer.write_strings("/params/none", {});
  const SeriesId act_mean = writer.create_series_2d("/forward/act_mean", 3);
  const SeriesId record_step = writer.create_series_1d_int("/forward/step");
  writer.create_series_2d("/probes/attn/entropy", 2);  // intermediate group created on the way
  writer.write_attribute("/forward/act_mean", "unit", "activation units");
  writer.start();
  EXPECT_TRUE(writer.started());

  for (std::int64_t step = 0; step < 150; ++step) {
    writer.append_train(train_row(step));
    if (step % 50 == 0) writer.append_eval({step, 4.0 - 0.01 * static_cast<double>(step)});
    if (step % 10 == 0) {
      const double row[3] = {static_cast<double>(step), 0.5 * static_cast<double>(step) + 1.0 / 3.0,
                             -static_cast<double>(step)};
      if (step % 20 == 0) {
        writer.append_row(act_mean, row);
      } else {
        writer.append_row("/forward/act_mean", row);
      }
      writer.append_int(record_step, step);
    }
  }
  EXPECT_EQ(writer.train_rows(), 150);
  EXPECT_EQ(writer.eval_rows(), 3);
  writer.finish(RunStatus::completed, "reached 150 steps");
  EXPECT_TRUE(writer.finished());

  RunReader reader = RunReader::open(path);
  EXPECT_FALSE(reader.swmr());
  const RunHeader header = test_header();
  EXPECT_EQ(reader.attribute_string("format"), "proplab-run");
  EXPECT_EQ(reader.attribute_int("format_version"), 1);
  EXPECT_EQ(reader.attribute_string("proplab_version"), header.proplab_version);
  EXPECT_EQ(reader.attribute_string("config"), header.config);
  EXPECT_EQ(reader.attribute_string("status"), "completed");
  EXPECT_EQ(reader.status(), RunStatus::completed);
  EXPECT_EQ(reader.attribute_string("status_detail"), "reached 150 steps");
  EXPECT_EQ(reader.attribute_string("start_time"), header.start_time);
  EXPECT_TRUE(std::regex_match(reader.attribute_string("end_time"), std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)")))
      << reader.attribute_string("end_time");
  EXPECT_EQ(reader.attribute_string("host"), header.host);
  EXPECT_EQ(reader.attribute_string("device"), header.device);
  EXPECT_EQ(reader.attribute_int("threads"), 2);
  EXPECT_EQ(reader.attribute_string("layout"), header.layout);
  EXPECT_EQ(reader.attribute_string("precision"), "bf16");
  EXPECT_EQ(reader.attribute_string("kernels"), header.kernels);
  const auto names = reader.attribute_names();
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()),
            (std::set<std::string>{"format", "format_version", "proplab_version", "config", "status", "status_detail",
                                   "start_time", "end_time", "host", "device", "threads", "layout", "precision",
                                   "kernels"}));

  const TrainCurves train = reader.read_train();
  ASSERT_EQ(train.size(), 150u);
  EXPECT_TRUE(train_rows_match(train));
  EXPECT_EQ(reader.dataset_shape("/train/loss"), (std::vector<std::int64_t>{150}));

  const EvalCurves eval = reader.read_eval();
  ASSERT_EQ(eval.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(eval.step[i], static_cast<std::int64_t>(50 * i));
    EXPECT_EQ(eval.loss[i], 4.0 - 0.01 * static_cast<double>(50 * i));
  }

  const Dataset2D series = reader.read_2d("/forward/act_mean");
  ASSERT_EQ(series.rows, 15);
  ASSERT_EQ(series.columns, 3);
  for (std::int64_t r = 0; r < 15; ++r) {
    const double step = static_cast<double>(10 * r);
    EXPECT_EQ(series.at(r, 0), step);
    EXPECT_EQ(series.at(r, 1), 0.5 * step + 1.0 / 3.0);
    EXPECT_EQ(series.at(r, 2), -step);
  }
  const auto steps = reader.read_ints("/forward/step");
  ASSERT_EQ(steps.size(), 15u);
  for (std::size_t r = 0; r < 15; ++r) EXPECT_EQ(steps[r], static_cast<std::int64_t>(10 * r));

  EXPECT_EQ(reader.read_strings("/forward/sites"), sites);
  EXPECT_EQ(reader.read_strings("/params/none"), std::vector<std::string>{});
  EXPECT_EQ(reader.read_ints("/forward/layer"), layers);
  const auto read_predictions = reader.read_doubles("/theory/predicted");
  ASSERT_EQ(read_predictions.size(), 3u);
  EXPECT_EQ(read_predictions[0], 0.5);
  EXPECT_TRUE(std::signbit(read_predictions[1]) && read_predictions[1] == 0.0);
  EXPECT_EQ(read_predictions[2], 1e-310);
  EXPECT_EQ(reader.attribute_string("/forward/act_mean", "unit"), "activation units");

  EXPECT_EQ(reader.list("/"),
            (std::vector<std::string>{"backward", "eval", "forward", "params", "probes", "theory", "train"}));
  EXPECT_EQ(reader.list("/train"),
            (std::vector<std::string>{"grad_norm", "loss", "lr", "step", "tokens_per_s", "wall_time"}));
  EXPECT_EQ(reader.list("/backward"), std::vector<std::string>{});
  EXPECT_EQ(reader.dataset_shape("/probes/attn/entropy"), (std::vector<std::int64_t>{0, 2}));
  EXPECT_TRUE(reader.exists("/probes/attn/entropy"));
  EXPECT_FALSE(reader.exists("/probes/mlp/entropy"));
  EXPECT_FALSE(reader.exists("/train/loss/below_a_dataset"));

  EXPECT_NE(user_error_message([&] { reader.read_doubles("/train/nope"); }).find("/train/nope"), std::string::npos);
  EXPECT_NE(user_error_message([&] { reader.read_ints("/train/loss"); }).find("not an integer"), std::string::npos);
  EXPECT_NE(user_error_message([&] { reader.read_2d("/train/loss"); }).find("rank 1, expected 2"), std::string::npos);
  EXPECT_NE(user_error_message([&] { reader.read_doubles("/train"); }).find("not a dataset"), std::string::npos);
  EXPECT_NE(user_error_message([&] { reader.attribute_int("nope"); }).find("nope"), std::string::npos);
}

TEST(RunFile, LargeConfigAndLongStatusDetail) {
  ScratchDirectory dir;
  const auto path = dir / "large.h5";
  RunHeader header = test_header();
  header.config.clear();
  for (int i = 0; i < 5000; ++i) header.config += "key_" + std::to_string(i) + " = " + std::to_string(i) + "\n";
  ASSERT_GT(header.config.size(), 64u * 1024u);  // beyond HDF5's compact attribute storage
  RunWriter writer = RunWriter::create(path, header, false);
  writer.start();
  std::string detail(3000, 'x');
  detail[1020] = '\xc3';  // a two-byte UTF-8 sequence across the cut at 1021 bytes (1024 - "...")
  detail[1021] = '\xbc';
  writer.finish(RunStatus::diverged, detail);

  RunReader reader = RunReader::open(path);
  EXPECT_EQ(reader.attribute_string("config"), header.config);
  EXPECT_EQ(reader.status(), RunStatus::diverged);
  const std::string stored = reader.attribute_string("status_detail");
  EXPECT_EQ(stored, std::string(1020, 'x') + "...");  // cut before the UTF-8 sequence
}

TEST(RunFile, RefusesAnExistingFileUnlessOverwrite) {
  ScratchDirectory dir;
  const auto path = dir / "run.h5";
  {
    RunWriter writer = RunWriter::create(path, test_header(), false);
    writer.append_train(train_row(0));
    writer.append_train(train_row(1));
    writer.finish(RunStatus::completed, "");
  }
  const std::string message = user_error_message([&] { RunWriter::create(path, test_header(), false); });
  EXPECT_NE(message.find(path.string()), std::string::npos) << message;
  EXPECT_NE(message.find("--force"), std::string::npos) << message;
  EXPECT_EQ(RunReader::open(path).read_train().size(), 2u);  // untouched

  {
    RunWriter writer = RunWriter::create(path, test_header(), true);
    writer.append_train(train_row(0));
    writer.finish(RunStatus::completed, "");
  }
  EXPECT_EQ(RunReader::open(path).read_train().size(), 1u);
}

TEST(RunFile, BadArgumentsCreateNothing) {
  ScratchDirectory dir;
  const auto path = dir / "sub" / "run.h5";
  RunHeader header = test_header();
  header.proplab_version.clear();
  EXPECT_THROW(RunWriter::create(path, header, false), InternalError);
  header = test_header();
  header.precision = "fp16";  // only "fp32" and "bf16" are precisions
  EXPECT_THROW(RunWriter::create(path, header, false), InternalError);
  RunWriterOptions options;
  options.flush_every = 0;
  EXPECT_THROW(RunWriter::create(path, test_header(), false, options), InternalError);
  EXPECT_FALSE(std::filesystem::exists(dir / "sub"));
}

TEST(RunFile, LayoutAfterStartAndUseAfterFinishAreInternalErrors) {
  ScratchDirectory dir;
  RunWriter writer = RunWriter::create(dir / "run.h5", test_header(), false);
  EXPECT_THROW(writer.create_series_2d("/forward/bad", 0), InternalError);
  EXPECT_THROW(writer.create_series_2d("relative/path", 2), InternalError);
  writer.create_series_2d("/forward/x", 2);
  EXPECT_THROW(writer.create_series_2d("/forward/x", 2), InternalError);  // exists already
  writer.start();
  EXPECT_THROW(writer.create_series_2d("/forward/y", 2), InternalError);
  EXPECT_THROW(writer.write_strings("/forward/names", {"a"}), InternalError);
  EXPECT_THROW(writer.write_attribute("/forward/x", "unit", "u"), InternalError);
  EXPECT_THROW(writer.start(), InternalError);
  const double row[1] = {1.0};
  EXPECT_THROW(writer.append_row("/forward/missing", row), InternalError);
  EXPECT_THROW(writer.finish(RunStatus::running, ""), InternalError);
  writer.finish(RunStatus::failed, "stopped by test");
  EXPECT_THROW(writer.append_train(train_row(0)), InternalError);
  EXPECT_THROW(writer.finish(RunStatus::completed, ""), InternalError);
  EXPECT_EQ(RunReader::open(dir / "run.h5").status(), RunStatus::failed);
}

TEST(RunFile, WriterDestroyedWithoutFinishRecordsFailed) {
  ScratchDirectory dir;
  const auto path = dir / "run.h5";
  {
    RunWriter writer = RunWriter::create(path, test_header(), false, no_automatic_flush());
    writer.start();
    for (int step = 0; step < 5; ++step) writer.append_train(train_row(step));
  }
  RunReader reader = RunReader::open(path);
  EXPECT_EQ(reader.status(), RunStatus::failed);
  EXPECT_NE(reader.attribute_string("status_detail").find("before finish()"), std::string::npos);
  EXPECT_EQ(reader.read_train().size(), 5u);  // buffered rows were written on the way out
}

TEST(RunFile, MoveAssignmentFinishesTheOverwrittenWriter) {
  ScratchDirectory dir;
  RunWriter writer = RunWriter::create(dir / "first.h5", test_header(), false);
  writer = RunWriter::create(dir / "second.h5", test_header(), false);
  EXPECT_EQ(RunReader::open(dir / "first.h5").status(), RunStatus::failed);
  writer.finish(RunStatus::completed, "");
  EXPECT_EQ(RunReader::open(dir / "second.h5").status(), RunStatus::completed);
}

// A file with the given root attributes, written with the raw HDF5 API.
void write_foreign_file(const std::filesystem::path& path, const char* format, std::int64_t version) {
  const hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  const hid_t space = H5Screate(H5S_SCALAR);
  if (format != nullptr) {
    const hid_t type = H5Tcopy(H5T_C_S1);
    ASSERT_GE(H5Tset_size(type, std::strlen(format)), 0);
    const hid_t attribute = H5Acreate2(file, "format", type, space, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(H5Awrite(attribute, type, format), 0);
    H5Aclose(attribute);
    H5Tclose(type);
  }
  const hid_t attribute = H5Acreate2(file, "format_version", H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(H5Awrite(attribute, H5T_NATIVE_INT64, &version), 0);
  H5Aclose(attribute);
  H5Sclose(space);
  ASSERT_GE(H5Fclose(file), 0);
}

// The stage layout (/blocks) reads back as written, is empty for a file without it, and a malformed one is a
// UserError naming the dataset and what is allowed.
TEST(RunReader, ReadsTheBlockLayoutAndRejectsAMalformedOne) {
  ScratchDirectory dir;
  auto write = [&](const std::string& name, const std::vector<std::int64_t>* stages,
                   const std::vector<std::int64_t>* transitions) {
    RunWriter writer = RunWriter::create(dir / name, test_header(), false);
    if (stages) writer.write_ints("/blocks/stage", *stages);
    if (transitions) writer.write_ints("/blocks/transition", *transitions);
    writer.start();
    writer.finish(RunStatus::completed, "");
    return dir / name;
  };
  const std::vector<std::int64_t> stages = {0, 0, 1, 1, 2, 2}, transitions = {0, 0, 1, 0, 1, 0};
  const std::vector<RunBlock> blocks = RunReader::open(write("resnet.h5", &stages, &transitions)).read_block_layout();
  ASSERT_EQ(blocks.size(), 6u);
  for (std::size_t b = 0; b < blocks.size(); ++b) {
    EXPECT_EQ(blocks[b].stage, stages[b]) << b;
    EXPECT_EQ(blocks[b].transition, transitions[b] == 1) << b;
  }
  EXPECT_TRUE(RunReader::open(write("plain.h5", nullptr, nullptr)).read_block_layout().empty());

  auto message_for = [&](const std::string& name, const std::vector<std::int64_t>* s,
                         const std::vector<std::int64_t>* t) {
    const RunReader reader = RunReader::open(write(name, s, t));
    return user_error_message([&] { reader.read_block_layout(); });
  };
  std::string message = message_for("no_transition.h5", &stages, nullptr);
  EXPECT_NE(message.find("'/blocks/transition'"), std::string::npos) << message;
  const std::vector<std::int64_t> short_transitions = {0, 0, 1};
  message = message_for("lengths.h5", &stages, &short_transitions);
  EXPECT_NE(message.find("/blocks/stage has 6 entries but /blocks/transition has 3"), std::string::npos) << message;
  const std::vector<std::int64_t> decreasing = {0, 1, 0, 1, 2, 2};
  message = message_for("decreasing.h5", &decreasing, &transitions);
  EXPECT_NE(message.find("/blocks/stage[2] = 0; allowed: stages >= 0 that never decrease"), std::string::npos)
      << message;
  const std::vector<std::int64_t> two = {0, 0, 2, 0, 1, 0};
  message = message_for("two.h5", &stages, &two);
  EXPECT_NE(message.find("/blocks/transition[2] = 2; allowed: 0 or 1"), std::string::npos) << message;
}

TEST(RunReader, RefusesFilesThatAreNotProplabRuns) {
  ScratchDirectory dir;
  EXPECT_NE(user_error_message([&] { RunReader::open(dir / "missing.h5"); }).find("does not exist"), std::string::npos);

  const auto text = dir / "notes.h5";
  std::ofstream(text) << "just some text, not HDF5\n";
  EXPECT_NE(user_error_message([&] { RunReader::open(text); }).find("is not an HDF5 file"), std::string::npos);

  const auto plain = dir / "plain.h5";
  write_foreign_file(plain, nullptr, 1);
  std::string message = user_error_message([&] { RunReader::open(plain); });
  EXPECT_NE(message.find("is not a proplab run file"), std::string::npos) << message;
  EXPECT_NE(message.find(plain.string()), std::string::npos) << message;

  const auto checkpoint_path = dir / "model.ckpt";
  Checkpoint checkpoint;
  checkpoint.ints["step"] = 3;
  save_checkpoint(checkpoint_path, checkpoint);
  message = user_error_message([&] { RunReader::open(checkpoint_path); });
  EXPECT_NE(message.find("is not a proplab run file"), std::string::npos) << message;

  const auto newer = dir / "newer.h5";
  write_foreign_file(newer, "proplab-run", 2);
  message = user_error_message([&] { RunReader::open(newer); });
  EXPECT_NE(message.find("format_version 2"), std::string::npos) << message;
  EXPECT_NE(message.find("newer proplab"), std::string::npos) << message;
}

// ---- Concurrent reading (SWMR) from a forked child process -------------------------------------------------

// What the child saw, sent back through a pipe as plain bytes.
struct Observation {
  std::int64_t ok = 0;
  std::int64_t swmr = 0;
  std::int64_t train_rows = 0;
  std::int64_t train_match = 0;
  std::int64_t eval_rows = 0;
  std::int64_t series_rows = 0;
  char status[32] = {};
  char error[512] = {};
};

bool read_exactly(int descriptor, void* data, std::size_t bytes) {
  auto* cursor = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t got = ::read(descriptor, cursor, bytes);
    if (got <= 0) return false;
    cursor += got;
    bytes -= static_cast<std::size_t>(got);
  }
  return true;
}

bool write_exactly(int descriptor, const void* data, std::size_t bytes) {
  const auto* cursor = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t put = ::write(descriptor, cursor, bytes);
    if (put <= 0) return false;
    cursor += put;
    bytes -= static_cast<std::size_t>(put);
  }
  return true;
}

// A reader in a child process. Forked before the test opens any HDF5 file, so the child shares no HDF5 state
// with the writer. The child opens the run at the first observe() and keeps it open, so later observations
// exercise refreshing an open reader.
class ChildReader {
 public:
  ChildReader(std::filesystem::path path, RunOpenMode mode) {
    int requests[2];
    int results[2];
    PROPLAB_CHECK(::pipe(requests) == 0 && ::pipe(results) == 0, "pipes for the child reader");
    pid_ = ::fork();
    PROPLAB_CHECK(pid_ >= 0, "fork for the child reader");
    if (pid_ == 0) {
      ::close(requests[1]);
      ::close(results[0]);
      serve(path, mode, requests[0], results[1]);
    }
    ::close(requests[0]);
    ::close(results[1]);
    request_fd_ = requests[1];
    result_fd_ = results[0];
  }

  ~ChildReader() {
    const char quit = 'q';
    write_exactly(request_fd_, &quit, 1);
    ::close(request_fd_);
    ::close(result_fd_);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }

  Observation observe() {
    Observation observation;
    const char request = 'r';
    if (!write_exactly(request_fd_, &request, 1) || !read_exactly(result_fd_, &observation, sizeof observation)) {
      ADD_FAILURE() << "the child reader died";
    }
    return observation;
  }

  // Observes until `seen` holds (a flush hands rows to the writer thread, which writes them shortly after) or 20 s
  // have passed; the last observation.
  template <typename Predicate>
  Observation observe_until(Predicate seen) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    Observation observation = observe();
    while (observation.ok == 1 && !seen(observation) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      observation = observe();
    }
    return observation;
  }

 private:
  [[noreturn]] static void serve(const std::filesystem::path& path, RunOpenMode mode, int request_fd, int result_fd) {
    std::optional<RunReader> reader;
    char command = 0;
    while (read_exactly(request_fd, &command, 1) && command == 'r') {
      Observation observation;
      try {
        if (!reader) reader.emplace(RunReader::open(path, mode));
        observation.swmr = reader->swmr() ? 1 : 0;
        const TrainCurves train = reader->read_train();
        observation.train_rows = static_cast<std::int64_t>(train.size());
        observation.train_match = train_rows_match(train) ? 1 : 0;
        observation.eval_rows = static_cast<std::int64_t>(reader->read_eval().size());
        if (reader->exists("/forward/act_mean")) {
          observation.series_rows = reader->dataset_shape("/forward/act_mean")[0];
        }
        std::strncpy(observation.status, reader->attribute_string("status").c_str(), sizeof observation.status - 1);
        observation.ok = 1;
      } catch (const std::exception& error) {
        std::strncpy(observation.error, error.what(), sizeof observation.error - 1);
      }
      if (!write_exactly(result_fd, &observation, sizeof observation)) break;
    }
    reader.reset();
    ::_exit(0);
  }

  pid_t pid_ = -1;
  int request_fd_ = -1;
  int result_fd_ = -1;
};

TEST(RunFileSwmr, ChildReaderSeesFlushedRowsWhileTheWriterRuns) {
  ScratchDirectory dir;
  const auto path = dir / "live.h5";
  ChildReader child(path, RunOpenMode::automatic);
  RunWriter writer = RunWriter::create(path, test_header(), false, no_automatic_flush());
  const SeriesId series = writer.create_series_2d("/forward/act_mean", 2);
  writer.start();

  Observation seen = child.observe();
  ASSERT_EQ(seen.ok, 1) << seen.error;
  EXPECT_EQ(seen.swmr, 1);  // a plain open fails while the writer has the file: fell back to SWMR-read
  EXPECT_EQ(seen.train_rows, 0);
  EXPECT_STREQ(seen.status, "running");

  for (int step = 0; step < 10; ++step) writer.append_train(train_row(step));
  seen = child.observe();
  ASSERT_EQ(seen.ok, 1) << seen.error;
  EXPECT_EQ(seen.train_rows, 0);  // still buffered in the writer

  writer.flush();
  seen = child.observe_until([](const Observation& o) { return o.train_rows == 10; });
  ASSERT_EQ(seen.ok, 1) << seen.error;
  EXPECT_EQ(seen.train_rows, 10);
  EXPECT_EQ(seen.train_match, 1);

  for (int step = 10; step < 25; ++step) writer.append_train(train_row(step));
  writer.append_eval({20, 3.5});
  writer.append_eval({24, 3.25});
  for (int i = 0; i < 3; ++i) {
    const double row[2] = {static_cast<double>(i), 1.0};
    writer.append_row(series, row);
  }
  writer.flush();
  seen = child.observe_until([](const Observation& o) { return o.train_rows == 25; });
  ASSERT_EQ(seen.ok, 1) << seen.error;
  EXPECT_EQ(seen.train_rows, 25);
  EXPECT_EQ(seen.train_match, 1);
  EXPECT_EQ(seen.eval_rows, 2);
  EXPECT_EQ(seen.series_rows, 3);

  // flush_every (1000) buffered rows trigger a write without flush().
  for (int step = 25; step < 1025; ++step) writer.append_train(train_row(step));
  writer.append_train(train_row(1025));
  seen = child.observe_until([](const Observation& o) { return o.train_rows == 1025; });
  ASSERT_EQ(seen.ok, 1) << seen.error;
  EXPECT_EQ(seen.train_rows, 1025);
  EXPECT_EQ(seen.train_match, 1);

  writer.finish(RunStatus::completed, "");
  seen = child.observe();
  ASSERT_EQ(seen.ok, 1) << seen.error;
  EXPECT_EQ(seen.train_rows, 1026);
  EXPECT_EQ(seen.train_match, 1);
  EXPECT_STREQ(seen.status, "completed");  // the open SWMR reader sees the final status too
}

TEST(RunFileSwmr, RowsAreWrittenWhenTheFlushIntervalHasPassed) {
  ScratchDirectory dir;
  const auto path = dir / "timed.h5";
  ChildReader child(path, RunOpenMode::swmr);
  RunWriterOptions options;
  options.flush_every = 1000;
  options.flush_interval_s = 1.0;
  RunWriter writer = RunWriter::create(path, test_header(), false, options);
  writer.start();
  const auto started = std::chrono::steady_clock::now();
  writer.append_train(train_row(0));
  ASSERT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(), 1.0);
  Observation seen = child.observe();
  ASSERT_EQ(seen.ok, 1) << seen.error;
  EXPECT_EQ(seen.swmr, 1);
  EXPECT_EQ(seen.train_rows, 0);
  std::this_thread::sleep_until(started + std::chrono::milliseconds(1100));
  writer.append_train(train_row(1));
  seen = child.observe_until([](const Observation& o) { return o.train_rows == 2; });
  ASSERT_EQ(seen.ok, 1) << seen.error;
  EXPECT_EQ(seen.train_rows, 2);
  EXPECT_EQ(seen.train_match, 1);
  writer.finish(RunStatus::completed, "");
}

TEST(RunFileSwmr, KilledWriterLeavesFlushedRowsReadable) {
  ScratchDirectory dir;
  const auto path = dir / "killed.h5";
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    try {
      RunWriter writer = RunWriter::create(path, test_header(), false, no_automatic_flush());
      writer.start();
      for (int step = 0; step < 20; ++step) writer.append_train(train_row(step));
      writer.flush_and_wait();  // (flush() alone hands the rows to the writer thread, which the kill may beat)
      for (int step = 20; step < 25; ++step) writer.append_train(train_row(step));  // never written
      ::kill(::getpid(), SIGKILL);
    } catch (...) {
    }
    ::_exit(3);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "the writer child did not run to its kill";

  EXPECT_THROW(RunReader::open(path, RunOpenMode::normal), UserError);
  RunReader reader = RunReader::open(path);
  EXPECT_TRUE(reader.swmr());
  EXPECT_EQ(reader.status(), RunStatus::running);
  const TrainCurves train = reader.read_train();
  EXPECT_EQ(train.size(), 20u);
  EXPECT_TRUE(train_rows_match(train));
}

// ---- The writer thread (after start()) ------------------------------------------------------------------------

// A series' storage as created: chunk dimensions and filter ids, read with the raw HDF5 API (under the process-wide
// HDF5 lock, as every HDF5 call of the process).
std::vector<std::int64_t> storage_of(const std::filesystem::path& path, const std::string& dataset_path) {
  const io_detail::H5Guard guard;
  std::vector<std::int64_t> storage;
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  const hid_t dataset = H5Dopen2(file, dataset_path.c_str(), H5P_DEFAULT);
  const hid_t properties = H5Dget_create_plist(dataset);
  hsize_t chunk[2] = {0, 0};
  const int rank = H5Pget_chunk(properties, 2, chunk);
  for (int d = 0; d < rank; ++d) storage.push_back(static_cast<std::int64_t>(chunk[d]));
  const int filters = H5Pget_nfilters(properties);
  for (int f = 0; f < filters; ++f) {
    unsigned flags = 0;
    std::size_t count = 0;
    storage.push_back(
        H5Pget_filter2(properties, static_cast<unsigned>(f), &flags, &count, nullptr, 0, nullptr, nullptr));
  }
  H5Pclose(properties);
  H5Dclose(dataset);
  H5Fclose(file);
  return storage;
}

// Every value of a run file that says what was recorded: each dataset's shape, values (as bit patterns) and storage,
// and every root attribute but end_time (when finish() ran).
struct FileContents {
  std::map<std::string, std::vector<std::int64_t>> shapes;
  std::map<std::string, std::vector<std::uint64_t>> values;
  std::map<std::string, std::vector<std::int64_t>> storage;
  std::map<std::string, std::string> attributes;
};

FileContents read_contents(const std::filesystem::path& path) {
  FileContents contents;
  {
    const RunReader reader = RunReader::open(path, RunOpenMode::normal);
    for (const std::string group : {"/train", "/eval", "/forward", "/probes"}) {
      for (const std::string& name : reader.list(group)) {
        const std::string dataset = group + "/" + name;
        contents.shapes[dataset] = reader.dataset_shape(dataset);
        auto& bits = contents.values[dataset];
        const std::vector<double> values =
            contents.shapes[dataset].size() == 2 ? reader.read_2d(dataset).values : reader.read_doubles(dataset);
        for (const double value : values) bits.push_back(std::bit_cast<std::uint64_t>(value));
      }
    }
    for (const std::string& name : reader.attribute_names()) {
      if (name == "end_time") continue;
      contents.attributes[name] = name == "format_version" || name == "threads"
                                      ? std::to_string(reader.attribute_int(name))
                                      : reader.attribute_string(name);
    }
  }
  for (const auto& [dataset, shape] : contents.shapes) contents.storage[dataset] = storage_of(path, dataset);
  return contents;
}

// Many appends, automatic hand-offs (every 7 rows of a series) and flushes of a run, then finish(): every row is in
// the file, in order, exactly as a writer without the writer thread writes it.
void write_busy_run(const std::filesystem::path& path, bool write_on_thread) {
  RunWriterOptions options;
  options.flush_every = 7;
  options.flush_interval_s = 3600.0;
  options.write_on_thread = write_on_thread;
  RunWriter writer = RunWriter::create(path, test_header(), false, options);
  const SeriesId records = writer.create_series_1d_int("/forward/step");
  const SeriesId act_mean = writer.create_series_2d("/forward/act_mean", 3);
  const SeriesId wide = writer.create_series_2d("/probes/wide", 700);  // rows over a 4 KiB chunk
  writer.start();
  std::vector<double> wide_row(700);
  for (std::int64_t step = 0; step < 3000; ++step) {
    writer.append_train(train_row(step));
    if (step % 11 == 0) writer.append_eval({step, 1.0 / (3.0 + static_cast<double>(step))});
    if (step % 3 == 0) {
      writer.append_int(records, step);
      const double row[3] = {std::sqrt(static_cast<double>(step)), -1.0 / 3.0 * static_cast<double>(step), 1e-300};
      writer.append_row(act_mean, row);
      for (std::size_t c = 0; c < wide_row.size(); ++c)
        wide_row[c] = std::sin(static_cast<double>(step) + 0.001 * static_cast<double>(c));
      writer.append_row(wide, wide_row.data());
      writer.flush();
    }
  }
  writer.finish(RunStatus::completed, "3000 steps");
}

TEST(RunFileWriterThread, WritesEveryRowInOrderAsTheCallingThreadWould) {
  ScratchDirectory dir;
  write_busy_run(dir / "threaded.h5", true);
  write_busy_run(dir / "reference.h5", false);
  const FileContents threaded = read_contents(dir / "threaded.h5");
  const FileContents reference = read_contents(dir / "reference.h5");
  EXPECT_EQ(threaded.attributes, reference.attributes);
  ASSERT_EQ(threaded.shapes.size(), 11u);  // /train 6, /eval 2, /forward 2, /probes 1
  EXPECT_EQ(threaded.shapes, reference.shapes);
  EXPECT_EQ(threaded.storage, reference.storage);
  for (const auto& [dataset, bits] : reference.values) {
    EXPECT_TRUE(threaded.values.at(dataset) == bits) << dataset << " differs from the calling thread's file";
  }
  EXPECT_EQ(threaded.shapes.at("/probes/wide"), (std::vector<std::int64_t>{1000, 700}));
  const TrainCurves train = RunReader::open(dir / "threaded.h5").read_train();
  ASSERT_EQ(train.size(), 3000u);
  EXPECT_TRUE(train_rows_match(train));
}

// Lowers this process's file size limit (RLIMIT_FSIZE) to what the file at `path` has now, so that a write that
// grows it is refused with EFBIG (SIGXFSZ ignored); restored when the object goes away.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(const std::filesystem::path& path) {
    previous_handler_ = ::signal(SIGXFSZ, SIG_IGN);
    PROPLAB_CHECK(::getrlimit(RLIMIT_FSIZE, &previous_) == 0, "getrlimit");
    rlimit limited = previous_;
    limited.rlim_cur = static_cast<rlim_t>(std::filesystem::file_size(path));
    PROPLAB_CHECK(::setrlimit(RLIMIT_FSIZE, &limited) == 0, "setrlimit");
  }
  ~FileSizeLimit() { lift(); }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;

  void lift() {
    if (lifted_) return;
    ::setrlimit(RLIMIT_FSIZE, &previous_);
    ::signal(SIGXFSZ, previous_handler_);
    lifted_ = true;
  }

 private:
  rlimit previous_{};
  sighandler_t previous_handler_ = SIG_DFL;
  bool lifted_ = false;
};

// Runs `call` and returns the IoError's message; fails the test unless an IoError with EFBIG is thrown.
template <typename Call>
std::string efbig_message(Call call) {
  try {
    call();
  } catch (const IoError& error) {
    EXPECT_EQ(error.error_number(), EFBIG);
    return error.what();
  } catch (const std::exception& error) {
    ADD_FAILURE() << "expected an IoError, got: " << error.what();
    return "";
  }
  ADD_FAILURE() << "expected an IoError";
  return "";
}

// A run of 100 flushed rows whose next 20000 rows cannot be written (the file may not grow). Returns the writer.
RunWriter write_until_the_disk_refuses(const std::filesystem::path& path, bool write_on_thread,
                                       std::optional<FileSizeLimit>& limit) {
  RunWriterOptions options;
  options.flush_every = std::int64_t{1} << 40;
  options.flush_interval_s = 3600.0;
  options.write_on_thread = write_on_thread;
  RunWriter writer = RunWriter::create(path, test_header(), false, options);
  writer.start();
  for (int step = 0; step < 100; ++step) writer.append_train(train_row(step));
  writer.flush_and_wait();
  limit.emplace(path);
  for (int step = 100; step < 20100; ++step) writer.append_train(train_row(step));
  return writer;
}

TEST(RunFileWriterThread, ARefusedWriteSurfacesAtTheNextCallAsTheCallingThreadWouldThrowIt) {
  ScratchDirectory dir;
  const auto path = dir / "full.h5";
  // Without the writer thread the flush itself throws: the message every caller knows.
  std::string expected;
  {
    std::optional<FileSizeLimit> limit;
    RunWriter writer = write_until_the_disk_refuses(path, false, limit);
    expected = efbig_message([&] { writer.flush(); });
    EXPECT_FALSE(writer.failed_write_last_train_step().has_value());
    limit->lift();
    EXPECT_TRUE(writer.abandon(RunStatus::failed, "reference"));
  }
  EXPECT_EQ(expected, IoError(path.string(), EFBIG).what());
  std::filesystem::remove(path);

  std::optional<FileSizeLimit> limit;
  RunWriter writer = write_until_the_disk_refuses(path, true, limit);
  writer.flush();  // only hands the rows over: the write fails on the writer thread
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!writer.failed_write_last_train_step() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(writer.failed_write_last_train_step(), std::optional<std::int64_t>(20099));
  EXPECT_EQ(writer.queued_bytes(), 0u);
  // The next call rethrows it, and so does every later one: the writer takes no more rows.
  EXPECT_EQ(efbig_message([&] { writer.append_train(train_row(20100)); }), expected);
  EXPECT_EQ(efbig_message([&] { writer.append_eval({20100, 1.0}); }), expected);
  EXPECT_EQ(efbig_message([&] { writer.flush(); }), expected);
  EXPECT_EQ(efbig_message([&] { writer.flush_and_wait(); }), expected);
  EXPECT_EQ(writer.flushed("/train/step").rows, 100);
  EXPECT_EQ(writer.flushed("/train/step").last_int, 99);
  EXPECT_EQ(efbig_message([&] { writer.finish(RunStatus::completed, ""); }), expected);
  EXPECT_TRUE(writer.finished());
  limit->lift();
  EXPECT_TRUE(writer.abandon(RunStatus::failed, "disk full"));

  const RunReader reader = RunReader::open(path, RunOpenMode::normal);
  EXPECT_EQ(reader.status(), RunStatus::failed);
  TrainCurves train = reader.read_train();
  // What was flushed before the refused write stays; the extent of the write that failed may be there too (with or
  // without its values, as without the writer thread), never rows from after it.
  ASSERT_GE(train.size(), 100u);
  EXPECT_LE(train.size(), 20100u);
  train.step.resize(100);
  for (auto* column : {&train.loss, &train.lr, &train.grad_norm, &train.tokens_per_s, &train.wall_time})
    column->resize(100);
  EXPECT_TRUE(train_rows_match(train));
}

// The rows of `dataset` in the one HDF5 file this process has open, as the library sees them now (its extent,
// flushed or not). The caller holds the HDF5 lock.
std::int64_t extent_in_this_process(const std::string& dataset) {
  hid_t files[2];
  if (H5Fget_obj_ids(H5F_OBJ_ALL, H5F_OBJ_FILE, 2, files) != 1) return -1;
  const hid_t opened = H5Dopen2(files[0], dataset.c_str(), H5P_DEFAULT);
  const hid_t space = H5Dget_space(opened);
  hsize_t rows = 0;
  const int rank = H5Sget_simple_extent_dims(space, &rows, nullptr);
  H5Sclose(space);
  H5Dclose(opened);
  return rank == 1 ? static_cast<std::int64_t>(rows) : -1;
}

TEST(RunFileWriterThread, WritesUnderTheProcessWideHdf5LockAndFlushDoesNotWait) {
  ScratchDirectory dir;
  RunWriter writer = RunWriter::create(dir / "run.h5", test_header(), false, no_automatic_flush());
  writer.start();
  for (int step = 0; step < 50; ++step) writer.append_train(train_row(step));
  std::future<void> flushed;  // (declared first: it waits for flush() only once the lock below is released)
  {
    // While this thread holds the HDF5 lock, the writer thread makes no HDF5 call (its first would extend the
    // dataset), and flush() still returns.
    const io_detail::H5Guard guard;
    flushed = std::async(std::launch::async, [&] { writer.flush(); });
    const bool returned = flushed.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
    EXPECT_TRUE(returned) << "flush() waited for the writer thread";
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_EQ(extent_in_this_process("/train/step"), 0) << "the writer thread called HDF5 without the lock";
    EXPECT_EQ(writer.flushed("/train/step").rows, 0);
    if (returned) {
      EXPECT_EQ(writer.queued_bytes(), 50u * 6u * 8u);
    }
  }
  flushed.get();
  writer.flush_and_wait();
  EXPECT_EQ(writer.flushed("/train/step").rows, 50);
  EXPECT_EQ(writer.flushed("/train/step").last_int, 49);
  EXPECT_EQ(writer.queued_bytes(), 0u);
  writer.finish(RunStatus::completed, "");
}

TEST(RunFileWriterThread, DestroyedWithoutFinishWritesWhatWasHandedOverAndSaysFailed) {
  ScratchDirectory dir;
  const auto path = dir / "run.h5";
  {
    RunWriterOptions options;
    options.flush_every = 1;  // every append is a hand-off
    RunWriter writer = RunWriter::create(path, test_header(), false, options);
    writer.start();
    {
      const io_detail::H5Guard guard;  // the writer thread waits: every hand-off is still queued below
      for (int step = 0; step < 2000; ++step) writer.append_train(train_row(step));
      EXPECT_GT(writer.queued_bytes(), 0u);
      EXPECT_EQ(writer.flushed("/train/step").rows, 0);
    }
  }
  const RunReader reader = RunReader::open(path, RunOpenMode::normal);
  EXPECT_EQ(reader.status(), RunStatus::failed);
  EXPECT_EQ(reader.attribute_string("status_detail"),
            "the run's writer was destroyed before finish() (the program stopped early)");
  const TrainCurves train = reader.read_train();
  EXPECT_EQ(train.size(), 2000u);
  EXPECT_TRUE(train_rows_match(train));
}

TEST(RunFileWriterThread, QueueHoldsAtMostItsBoundAndAppendsWaitForRoom) {
  ScratchDirectory dir;
  RunWriterOptions options;
  options.flush_every = 1;  // every append is a hand-off of one train row: 48 bytes
  options.queue_bytes = 16 * 1024;
  RunWriter writer = RunWriter::create(dir / "run.h5", test_header(), false, options);
  writer.start();
  // Another thread holds the HDF5 lock for 300 ms: the writer thread cannot write, the queue fills up.
  std::promise<void> holding;
  std::thread holder([&] {
    const io_detail::H5Guard guard;
    holding.set_value();
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  });
  holding.get_future().wait();
  const auto started = std::chrono::steady_clock::now();
  std::size_t most_queued = 0;
  for (int step = 0; step < 5000; ++step) {  // 240 000 bytes in all
    writer.append_train(train_row(step));
    most_queued = std::max(most_queued, writer.queued_bytes());
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  holder.join();
  EXPECT_LE(most_queued, options.queue_bytes);
  EXPECT_GT(most_queued, options.queue_bytes - 48);  // it did fill up
  EXPECT_GT(seconds, 0.2) << "the appends never waited for the writer thread";
  // A hand-off larger than the bound is written alone.
  for (int step = 5000; step < 6000; ++step) writer.append_eval({step, 0.5});
  writer.finish(RunStatus::completed, "");
  const RunReader reader = RunReader::open(dir / "run.h5", RunOpenMode::normal);
  const TrainCurves train = reader.read_train();
  EXPECT_EQ(train.size(), 5000u);
  EXPECT_TRUE(train_rows_match(train));
  EXPECT_EQ(reader.read_eval().size(), 1000u);
}

// The thread ids (/proc/self/task) of this process.
std::set<std::string> thread_ids() {
  std::set<std::string> ids;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task"))
    ids.insert(entry.path().filename().string());
  return ids;
}

TEST(RunFileWriterThread, BlocksSigintAndSigterm) {
  ScratchDirectory dir;
  const std::set<std::string> before = thread_ids();
  RunWriter writer = RunWriter::create(dir / "run.h5", test_header(), false);
  writer.start();
  std::vector<std::string> started;
  for (const std::string& id : thread_ids())
    if (!before.count(id)) started.push_back(id);
  ASSERT_EQ(started.size(), 1u) << "start() starts one thread";
  // (once it has written something it runs its own code, with its own mask: a thread being created blocks all)
  writer.append_train(train_row(0));
  writer.flush_and_wait();
  std::ifstream status("/proc/self/task/" + started[0] + "/status");
  std::string line;
  std::uint64_t blocked = 0;
  while (std::getline(status, line))
    if (line.rfind("SigBlk:", 0) == 0) blocked = std::stoull(line.substr(7), nullptr, 16);
  EXPECT_TRUE(blocked & (std::uint64_t{1} << (SIGINT - 1))) << std::hex << blocked;
  EXPECT_TRUE(blocked & (std::uint64_t{1} << (SIGTERM - 1))) << std::hex << blocked;
  writer.finish(RunStatus::completed, "");
}

}  // namespace
}  // namespace proplab
