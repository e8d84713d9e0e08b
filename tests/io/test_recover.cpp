// Tests of io/recover: clearing a killed writer's open-for-write mark, and rewriting a run's status.
//
// Killed writers are real: a forked child writes a run file and SIGKILLs itself, leaving the file exactly as a
// killed `proplab run` would (superblock marked open, rows past the flushed ones lost).
#include <gtest/gtest.h>
#include <hdf5.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <iterator>
#include <regex>

#include "io/recover.h"
#include "io/run_file.h"
#include "io/run_reader.h"
#include "io_test_support.h"

namespace proplab {
namespace {

using io_test::ScratchDirectory;
using io_test::user_error_message;

RunHeader recover_header() {
  RunHeader header;
  header.proplab_version = "0.1.0-test";
  header.config = "name = \"killed\"\n";
  header.device = "cpu";
  header.threads = 1;
  header.layout = "dp=1 tp=1 pp=1";
  return header;
}

RunWriterOptions manual_flush() {
  RunWriterOptions options;
  options.flush_every = 1 << 30;
  options.flush_interval_s = 1e9;
  return options;
}

TrainRow row_at(std::int64_t step) {
  return {step,   4.0 / (1.0 + 0.01 * static_cast<double>(step)),
          1e-3,   std::sqrt(2.0 + static_cast<double>(step)),
          1000.0, 0.5 * static_cast<double>(step)};
}

double stat_at(std::int64_t record, std::int64_t column) { return 0.25 * static_cast<double>(record) + column; }

std::string bytes_of(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// SIGKILLs the calling process: called by a writer child while its file is still open.
void die_now() { ::kill(::getpid(), SIGKILL); }

// Runs `write` in a forked child, which must end by calling die_now() while its writer is still alive; fails the
// test unless the child died by SIGKILL.
void write_then_kill(const std::function<void()>& write) {
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    try {
      write();
    } catch (...) {
    }
    ::_exit(3);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "the writer child did not run to its kill";
}

// A killed SWMR writer: 300 train rows, 2 evaluations and 12 records of a 3-column series written, then 7 more
// train rows buffered and lost.
void write_killed_swmr_run(const std::filesystem::path& path) {
  write_then_kill([&] {
    RunWriter writer = RunWriter::create(path, recover_header(), false, manual_flush());
    const SeriesId steps = writer.create_series_1d_int("/steps");
    const SeriesId var = writer.create_series_2d("/forward/var", 3);
    writer.start();
    for (int step = 0; step < 300; ++step) writer.append_train(row_at(step));
    writer.append_eval({100, 3.5});
    writer.append_eval({200, 3.25});
    for (int record = 0; record < 12; ++record) {
      writer.append_int(steps, record * 25);
      const double row[3] = {stat_at(record, 0), stat_at(record, 1), stat_at(record, 2)};
      writer.append_row(var, row);
    }
    writer.flush_and_wait();  // (flush() alone hands the rows to the writer thread, which the kill may beat)
    for (int step = 300; step < 307; ++step) writer.append_train(row_at(step));
    die_now();
  });
}

void expect_recovered_contents(const RunReader& reader) {
  const TrainCurves train = reader.read_train();
  ASSERT_EQ(train.size(), 300u);
  for (std::int64_t i = 0; i < 300; ++i) {
    const TrainRow expected = row_at(i);
    ASSERT_EQ(train.step[i], expected.step);
    ASSERT_EQ(train.loss[i], expected.loss) << "row " << i;
    ASSERT_EQ(train.grad_norm[i], expected.grad_norm) << "row " << i;
  }
  EXPECT_EQ(reader.read_eval().step, (std::vector<std::int64_t>{100, 200}));
  const std::vector<std::int64_t> steps = reader.read_ints("/steps");
  ASSERT_EQ(steps.size(), 12u);
  const Dataset2D var = reader.read_2d("/forward/var");
  ASSERT_EQ(var.rows, 12);
  ASSERT_EQ(var.columns, 3);
  for (std::int64_t record = 0; record < 12; ++record) {
    EXPECT_EQ(steps[record], record * 25);
    for (std::int64_t column = 0; column < 3; ++column) EXPECT_EQ(var.at(record, column), stat_at(record, column));
  }
}

TEST(Recover, KilledSwmrWriterBecomesAPlainlyReadableFailedRun) {
  ScratchDirectory dir;
  const auto path = dir / "killed.h5";
  write_killed_swmr_run(path);
  ASSERT_TRUE(run_file_marked_open(path));
  EXPECT_THROW(RunReader::open(path, RunOpenMode::normal), UserError);

  const RecoverResult result = recover_run_file(path);
  EXPECT_EQ(result.outcome, RecoverOutcome::recovered);
  EXPECT_EQ(result.status_before, "running");
  EXPECT_EQ(result.status_after, "failed");
  EXPECT_FALSE(run_file_marked_open(path));

  RunReader reader = RunReader::open(path, RunOpenMode::normal);
  EXPECT_FALSE(reader.swmr());
  EXPECT_EQ(reader.status(), RunStatus::failed);
  EXPECT_EQ(reader.attribute_string("status_detail"), "killed");
  EXPECT_TRUE(std::regex_match(reader.attribute_string("end_time"), std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)")))
      << reader.attribute_string("end_time");
  EXPECT_EQ(reader.attribute_string("config"), recover_header().config);
  expect_recovered_contents(reader);
  EXPECT_TRUE(result.cuts.empty()) << "a file of whole records had " << result.cuts.size() << " families cut";
}

// A writer killed in the middle of a write: every series of that write that was extended before the kill is one
// row longer than the rest of its family. Here the child leaves that state on purpose (it appends to some series of
// a record and not to others, and flushes), so recovery must cut each family, and only its longer series, back to
// whole records, and keep every whole record.
TEST(Recover, SeriesOfAKilledWriteAreCutToWholeRecords) {
  ScratchDirectory dir;
  const auto path = dir / "midwrite.h5";
  write_then_kill([&] {
    RunWriter writer = RunWriter::create(path, recover_header(), false, manual_flush());
    const SeriesId steps = writer.create_series_1d_int("/steps");
    const SeriesId var = writer.create_series_2d("/forward/var", 3);
    const SeriesId grad = writer.create_series_2d("/params/grad_rms", 2);
    const SeriesId replica_steps = writer.create_series_1d_int("/replicas/steps");
    const SeriesId disagreement = writer.create_series_2d("/replicas/disagreement", 2);
    writer.start();
    for (int step = 0; step < 30; ++step) writer.append_train(row_at(step));
    for (int record = 0; record < 12; ++record) {
      writer.append_int(steps, record * 25);
      const double row[3] = {stat_at(record, 0), stat_at(record, 1), stat_at(record, 2)};
      writer.append_row(var, row);
      writer.append_row(grad, row);
      if (record < 5) {
        writer.append_int(replica_steps, record * 10);
        writer.append_row(disagreement, row);
      }
    }
    writer.flush_and_wait();
    // Record 12 reached /steps and /forward/var but not /params/grad_rms; a sixth /replicas row only its series.
    writer.append_int(steps, 300);
    const double partial[3] = {-1.0, -2.0, -3.0};
    writer.append_row(var, partial);
    writer.append_row(disagreement, partial);
    writer.flush_and_wait();
    die_now();
  });
  {
    const RunReader killed = RunReader::open(path, RunOpenMode::swmr);
    EXPECT_EQ(killed.read_ints("/steps").size(), 13u);
    EXPECT_EQ(killed.read_2d("/params/grad_rms").rows, 12);
    EXPECT_EQ(killed.read_2d("/replicas/disagreement").rows, 6);
  }

  const RecoverResult result = recover_run_file(path);
  EXPECT_EQ(result.outcome, RecoverOutcome::recovered);
  ASSERT_EQ(result.cuts.size(), 2u);
  EXPECT_EQ(result.cuts[0].family, "/");
  EXPECT_EQ(result.cuts[0].rows_kept, 12u);
  EXPECT_EQ(result.cuts[0].most_rows_cut, 1u);
  EXPECT_EQ(result.cuts[0].series_cut, (std::vector<std::string>{"/forward/var", "/steps"}));
  EXPECT_EQ(result.cuts[1].family, "/replicas");
  EXPECT_EQ(result.cuts[1].rows_kept, 5u);
  EXPECT_EQ(result.cuts[1].series_cut, (std::vector<std::string>{"/replicas/disagreement"}));

  const RunReader reader = RunReader::open(path, RunOpenMode::normal);
  EXPECT_EQ(reader.status(), RunStatus::failed);
  EXPECT_EQ(reader.read_train().size(), 30u);
  const std::vector<std::int64_t> recorded = reader.read_ints("/steps");
  ASSERT_EQ(recorded.size(), 12u);
  for (const char* series : {"/forward/var", "/params/grad_rms"}) {
    const Dataset2D values = reader.read_2d(series);
    ASSERT_EQ(values.rows, 12) << series;
    for (std::int64_t record = 0; record < 12; ++record) {
      EXPECT_EQ(recorded[record], record * 25);
      for (std::int64_t column = 0; column < values.columns; ++column)
        EXPECT_EQ(values.at(record, column), stat_at(record, column)) << series << " record " << record;
    }
  }
  EXPECT_EQ(reader.read_ints("/replicas/steps").size(), 5u);
  const Dataset2D replicas = reader.read_2d("/replicas/disagreement");
  ASSERT_EQ(replicas.rows, 5);
  EXPECT_EQ(replicas.at(4, 1), stat_at(4, 1));
}

TEST(Recover, SecondRecoverAndFinishedRunsAreLeftUnchanged) {
  ScratchDirectory dir;
  const auto killed = dir / "killed.h5";
  write_killed_swmr_run(killed);
  ASSERT_EQ(recover_run_file(killed).outcome, RecoverOutcome::recovered);
  const std::string recovered_bytes = bytes_of(killed);
  const RecoverResult again = recover_run_file(killed);
  EXPECT_EQ(again.outcome, RecoverOutcome::not_marked_open);
  EXPECT_EQ(again.status_before, "failed");
  EXPECT_EQ(again.status_after, "failed");
  EXPECT_EQ(bytes_of(killed), recovered_bytes);

  const auto finished = dir / "finished.h5";
  {
    RunWriter writer = RunWriter::create(finished, recover_header(), false);
    writer.start();
    for (int step = 0; step < 5; ++step) writer.append_train(row_at(step));
    writer.finish(RunStatus::completed, "done");
  }
  const std::string finished_bytes = bytes_of(finished);
  const auto finished_time = std::filesystem::last_write_time(finished);
  const RecoverResult untouched = recover_run_file(finished);
  EXPECT_EQ(untouched.outcome, RecoverOutcome::not_marked_open);
  EXPECT_EQ(untouched.status_before, "completed");
  EXPECT_EQ(bytes_of(finished), finished_bytes);
  EXPECT_EQ(std::filesystem::last_write_time(finished), finished_time);
}

TEST(Recover, WriterKilledBeforeSwmrStartIsRecovered) {
  ScratchDirectory dir;
  const auto path = dir / "early.h5";
  write_then_kill([&] {
    RunWriter writer = RunWriter::create(path, recover_header(), false, manual_flush());
    for (int step = 0; step < 40; ++step) writer.append_train(row_at(step));
    writer.flush();  // a plain (non-SWMR) flush: everything so far is consistent on disk
    die_now();
  });
  ASSERT_TRUE(run_file_marked_open(path));
  EXPECT_THROW(RunReader::open(path, RunOpenMode::automatic), UserError);

  const RecoverResult result = recover_run_file(path);
  EXPECT_EQ(result.outcome, RecoverOutcome::recovered);
  EXPECT_EQ(result.status_before, "running");
  RunReader reader = RunReader::open(path, RunOpenMode::normal);
  EXPECT_EQ(reader.status(), RunStatus::failed);
  const TrainCurves train = reader.read_train();
  ASSERT_EQ(train.size(), 40u);
  for (std::int64_t i = 0; i < 40; ++i) EXPECT_EQ(train.loss[i], row_at(i).loss);
}

TEST(Recover, LiveWriterIsRefusedAndUndisturbed) {
  ScratchDirectory dir;
  const auto path = dir / "live.h5";
  RunWriter writer = RunWriter::create(path, recover_header(), false, manual_flush());
  writer.start();
  for (int step = 0; step < 10; ++step) writer.append_train(row_at(step));
  writer.flush();
  ASSERT_TRUE(run_file_marked_open(path));
  const std::string message = user_error_message([&] { recover_run_file(path); });
  EXPECT_NE(message.find("open for writing by process " + std::to_string(::getpid())), std::string::npos) << message;
  EXPECT_NE(message.find("still going"), std::string::npos) << message;

  for (int step = 10; step < 20; ++step) writer.append_train(row_at(step));
  writer.finish(RunStatus::completed, "");
  RunReader reader = RunReader::open(path, RunOpenMode::normal);
  EXPECT_EQ(reader.status(), RunStatus::completed);
  EXPECT_EQ(reader.read_train().size(), 20u);
}

TEST(Recover, OtherFilesAreRefusedUntouched) {
  ScratchDirectory dir;
  // A killed SWMR writer of an HDF5 file that is not a proplab run.
  const auto foreign = dir / "foreign.h5";
  write_then_kill([&] {
    const hid_t access = H5Pcreate(H5P_FILE_ACCESS);
    H5Pset_libver_bounds(access, H5F_LIBVER_LATEST, H5F_LIBVER_LATEST);
    const hid_t file = H5Fcreate(foreign.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, access);
    const hsize_t count = 4;
    const hid_t space = H5Screate_simple(1, &count, nullptr);
    const hid_t dataset = H5Dcreate2(file, "/values", H5T_IEEE_F64LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    const double values[4] = {1, 2, 3, 4};
    H5Dwrite(dataset, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, values);
    if (file < 0 || dataset < 0 || H5Fstart_swmr_write(file) < 0 || H5Fflush(file, H5F_SCOPE_LOCAL) < 0) ::_exit(4);
    die_now();
  });
  ASSERT_TRUE(run_file_marked_open(foreign));
  const std::string foreign_bytes = bytes_of(foreign);
  std::string message = user_error_message([&] { recover_run_file(foreign); });
  EXPECT_NE(message.find("is not a proplab run file"), std::string::npos) << message;
  EXPECT_EQ(bytes_of(foreign), foreign_bytes);
  EXPECT_TRUE(run_file_marked_open(foreign));

  const auto text = dir / "notes.txt";
  std::ofstream(text) << "not hdf5 at all, but long enough to hold a superblock's first bytes\n";
  message = user_error_message([&] { recover_run_file(text); });
  EXPECT_NE(message.find("is not an HDF5 file"), std::string::npos) << message;
  message = user_error_message([&] { recover_run_file(dir / "missing.h5"); });
  EXPECT_NE(message.find("does not exist"), std::string::npos) << message;
}

TEST(Recover, RewriteRunStatusOverwritesTheThreeAttributes) {
  ScratchDirectory dir;
  const auto path = dir / "run.h5";
  {
    RunWriter writer = RunWriter::create(path, recover_header(), false);
    writer.start();
    writer.append_train(row_at(0));
    writer.finish(RunStatus::completed, "");
  }
  const std::string long_detail = std::string(1100, 'x');
  rewrite_run_status(path, RunStatus::diverged, long_detail, "2030-01-02T03:04:05Z");
  RunReader reader = RunReader::open(path, RunOpenMode::normal);
  EXPECT_EQ(reader.status(), RunStatus::diverged);
  const std::string detail = reader.attribute_string("status_detail");
  EXPECT_EQ(detail.size(), run_status_detail_size);
  EXPECT_EQ(detail.substr(detail.size() - 3), "...");
  EXPECT_EQ(reader.attribute_string("end_time"), "2030-01-02T03:04:05Z");
  EXPECT_EQ(reader.read_train().size(), 1u);
  EXPECT_THROW(rewrite_run_status(path, RunStatus::running, "", ""), InternalError);
}

}  // namespace
}  // namespace proplab
