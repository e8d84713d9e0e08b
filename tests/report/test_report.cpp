// `proplab report` end to end, headless (EGL surfaceless: Mesa llvmpipe on CI): a 4-point sweep of tiny
// transformers made by `proplab sweep` (2 depths × 2 seeds, so 2 groups of 2 runs), then the report: every expected
// PNG exists, has the figure size and is not blank (the runs' colours are in the depth and loss figures), report.md
// references every PNG, and its summary table holds the values read from the run files with RunReader. A plain
// folder of synthetic runs (no index.csv) is grouped by the config key that differs and its table checked against
// the values the synthetic runs were made with; bad folders exit 2.
#include <cmath>
#include <map>
#include <cstdlib>
#include <set>
#include <sstream>

#include "cli/cli_test_support.h"
#include "gui/data/synthetic_run.h"
#include "gui/gui_resnet_study.h"
#include "support/png_lines.h"
#include "gui/plot/plot_math.h"
#include "io/run_reader.h"
#include "io/csv.h"

namespace proplab::cli_test {
namespace {

using test_png::count_colour;
using test_png::distinct_colours;

constexpr int kWidth = 1200, kHeight = 800;

// Checks one figure: exists, the figure size, not blank; `runs` colours (series_rgb(0..runs-1)) drawn in it.
void expect_figure(const fs::path& path, std::size_t runs) {
  ASSERT_TRUE(fs::is_regular_file(path)) << path << " missing";
  const test_png::RgbImage image = test_png::load_rgb(path);
  ASSERT_EQ(image.width, kWidth) << path;
  ASSERT_EQ(image.height, kHeight) << path;
  EXPECT_GT(distinct_colours(image), 30u) << path << " looks blank";
  for (std::size_t r = 0; r < runs; ++r)
    EXPECT_GT(count_colour(image, gui::series_rgb(r)), 40u) << path << ": no line in run " << r << "'s colour";
}

// report.md's summary table: run name -> cells (run, group, status, final loss, growth fwd init, growth fwd end,
// growth bwd init, growth bwd end, theory error fwd, theory error bwd).
std::map<std::string, std::vector<std::string>> summary_table(const std::string& markdown) {
  std::map<std::string, std::vector<std::string>> rows;
  std::istringstream lines(markdown);
  std::string line;
  bool in_summary = false;
  int table_line = 0;
  while (std::getline(lines, line)) {
    if (line == "## Summary") {
      in_summary = true;
      continue;
    }
    if (!in_summary) continue;
    if (line.rfind("|", 0) != 0) {
      if (table_line > 0) break;
      continue;
    }
    if (++table_line <= 2) continue;  // header and alignment rows
    std::vector<std::string> cells;
    std::size_t start = 1;
    while (start < line.size()) {
      const std::size_t end = line.find(" |", start);
      if (end == std::string::npos) break;
      std::string cell = line.substr(start, end - start);
      cells.push_back(cell.substr(cell.find_first_not_of(' ')));
      start = end + 2;
    }
    if (!cells.empty()) rows[cells[0]] = cells;
  }
  return rows;
}

// A table number against the value from the run file: "n/a" for NaN, else equal to 6 significant digits.
void expect_number(const std::string& cell, double expected, const std::string& what) {
  if (std::isnan(expected)) {
    EXPECT_EQ(cell, "n/a") << what;
    return;
  }
  ASSERT_NE(cell, "n/a") << what << ": expected " << expected;
  const double value = std::stod(cell);
  EXPECT_NEAR(value, expected, 1e-5 * std::abs(expected) + 1e-300) << what << " (cell " << cell << ")";
}

double median(std::vector<double> values) {
  if (values.empty()) return std::nan("");
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// The summary values straight from a run file (the definitions of gui/report/report.h, written out again).
struct Expected {
  std::string status;
  double final_loss, fwd_init, fwd_end, bwd_init, bwd_end, theory_fwd, theory_bwd;
};

Expected expected_from_file(const fs::path& file, const std::string& first_probe, const std::string& last_probe) {
  const RunReader reader = RunReader::open(file);
  Expected e;
  e.status = run_status_name(reader.status());
  e.final_loss = reader.read_train().loss.back();
  const auto names = reader.read_strings("/probes/name");
  const auto kinds = reader.read_strings("/probes/kind");
  const auto first = std::find(names.begin(), names.end(), first_probe) - names.begin();
  const auto last = std::find(names.begin(), names.end(), last_probe) - names.begin();
  EXPECT_LT(static_cast<std::size_t>(first), names.size()) << file << " has no probe " << first_probe;
  EXPECT_LT(static_cast<std::size_t>(last), names.size()) << file << " has no probe " << last_probe;
  const Dataset2D forward = reader.read_2d("/forward/var"), backward = reader.read_2d("/backward/var");
  e.fwd_init = forward.at(0, last) / forward.at(0, first);
  e.fwd_end = forward.at(forward.rows - 1, last) / forward.at(forward.rows - 1, first);
  e.bwd_init = backward.at(0, last) / backward.at(0, first);
  e.bwd_end = backward.at(backward.rows - 1, last) / backward.at(backward.rows - 1, first);
  EXPECT_EQ(reader.read_ints("/steps").front(), 0) << file << ": the first record must be at step 0";
  auto theory_error = [&](const char* path, const Dataset2D& measured) {
    if (!reader.exists(path)) return std::nan("");
    const auto predicted = reader.read_doubles(path);
    std::vector<double> errors;
    for (std::size_t p = 0; p < names.size(); ++p) {
      if (kinds[p] != "residual" || std::isnan(predicted[p]) || std::isnan(measured.at(0, p))) continue;
      errors.push_back(std::abs(measured.at(0, p) - predicted[p]) / std::abs(predicted[p]));
    }
    return median(errors);
  };
  e.theory_fwd = theory_error("/theory/forward/var", forward);
  e.theory_bwd = theory_error("/theory/backward/var", backward);
  return e;
}

void expect_row(const std::vector<std::string>& row, const Expected& e, const std::string& run) {
  ASSERT_EQ(row.size(), 10u) << run;
  EXPECT_EQ(row[2], e.status) << run;
  expect_number(row[3], e.final_loss, run + " final loss");
  expect_number(row[4], e.fwd_init, run + " growth fwd init");
  expect_number(row[5], e.fwd_end, run + " growth fwd end");
  expect_number(row[6], e.bwd_init, run + " growth bwd init");
  expect_number(row[7], e.bwd_end, run + " growth bwd end");
  expect_number(row[8], e.theory_fwd, run + " theory error fwd");
  expect_number(row[9], e.theory_bwd, run + " theory error bwd");
}

// Every PNG under the report's figures/ is embedded in report.md, every embedded file exists, and every PNG has its
// SVG beside it (an SVG document with the figure's panels; nothing else is there).
void expect_markdown_references(const fs::path& report) {
  const std::string markdown = read_text(report / "report.md");
  std::set<std::string> pngs, embedded, svgs;
  for (const auto& entry : fs::directory_iterator(report / "figures")) {
    const std::string name = "figures/" + entry.path().filename().string();
    (entry.path().extension() == ".svg" ? svgs : pngs).insert(name);
  }
  EXPECT_EQ(svgs.size(), pngs.size());
  for (const auto& png : pngs) {
    const fs::path svg = report / fs::path(png).replace_extension(".svg");
    ASSERT_TRUE(fs::is_regular_file(svg)) << svg << " is missing beside " << png;
    const std::string text = read_text(svg);
    EXPECT_NE(text.find("<svg xmlns=\"http://www.w3.org/2000/svg\""), std::string::npos) << svg;
    EXPECT_NE(text.find("</svg>"), std::string::npos) << svg;
    EXPECT_TRUE(text.find("class=\"plot\"") != std::string::npos || text.find("class=\"heatmap\"") != std::string::npos)
        << svg << " has no panel";
    // Well-formed XML, as a browser or a vector editor reads it.
    const std::string parse =
        "/usr/bin/python3 -c \"import sys, xml.dom.minidom; xml.dom.minidom.parse(sys.argv[1])\" '" + svg.string() +
        "'";
    EXPECT_EQ(std::system(parse.c_str()), 0) << svg << " is not well-formed XML";
  }
  for (std::size_t at = markdown.find("](figures/"); at != std::string::npos; at = markdown.find("](figures/", at + 1))
    embedded.insert(markdown.substr(at + 2, markdown.find(')', at) - at - 2));
  EXPECT_EQ(embedded, pngs);
}

class ReportTest : public CliTest {};

TEST_F(ReportTest, SweepFolderFiguresAndTableMatchTheRunFiles) {
  std::string study = kTinyStudy;
  study += "\n[sweep]\ngrid = { \"model.layers\" = [1, 2] }\nseeds = 2\n";
  write_file("study.toml", study);
  const CliResult sweep = run({"sweep", "study.toml", "--jobs", "2", "--out", "sweep"});
  ASSERT_EQ(sweep.exit_code, 0) << describe(sweep);
  const auto index = parse_csv(read_text(work_ / "sweep" / "index.csv"));
  ASSERT_EQ(index.size(), 5u) << "a header and 4 points";

  const CliResult result = run({"report", "sweep"});
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  EXPECT_NE(result.err.find("proplab report: figure 8/8"), std::string::npos) << "progress lines:\n" << result.err;
  const fs::path report = work_ / "sweep" / "report";

  // Two groups (model.layers = 1, 2) of two seeds each: a depth and a loss figure per group, a heatmap per run.
  for (const char* group : {"model.layers=1", "model.layers=2"}) {
    expect_figure(report / "figures" / (std::string("depth_") + group + ".png"), 2);
    expect_figure(report / "figures" / (std::string("loss_") + group + ".png"), 2);
  }
  std::vector<std::string> runs;
  for (std::size_t r = 1; r < index.size(); ++r) {
    runs.push_back(index[r][0]);
    expect_figure(report / "figures" / ("heatmap_" + index[r][0] + ".png"), 0);
  }
  std::size_t files = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(report / "figures")) ++files;
  EXPECT_EQ(files, 16u) << "8 figures, each a PNG and an SVG";
  expect_markdown_references(report);

  const std::string markdown = read_text(report / "report.md");
  const auto table = summary_table(markdown);
  ASSERT_EQ(table.size(), 4u) << markdown;
  for (const auto& run : runs) {
    ASSERT_TRUE(table.count(run)) << run << " not in the table:\n" << markdown;
    const int layers = run.find("layers=1") != std::string::npos ? 1 : 2;
    EXPECT_EQ(table.at(run)[1], "model.layers=" + std::to_string(layers)) << run;
    const Expected e = expected_from_file(work_ / "sweep" / (run + ".h5"), "blocks.0.in",
                                          "blocks." + std::to_string(layers - 1) + ".out");
    EXPECT_FALSE(std::isnan(e.theory_fwd)) << run << ": the run file should carry a forward theory";
    expect_row(table.at(run), e, run);
  }
}

TEST_F(ReportTest, PlainFolderGroupsByDifferingKeyAndListsUnreadableFiles) {
  const fs::path runs = work_ / "runs";
  fs::create_directories(runs / "more");
  gui::SyntheticRunSpec a, b, c;
  a.name = "a";
  b.name = "b";
  b.forward_scale = 2.0;
  b.depth_slope = 0.25;
  c.name = "c";
  c.rule = "deepscalelm";
  c.theory_constant = 1.5;
  for (const auto& spec : {a, b, c})
    gui::write_synthetic_run(runs / (spec.name == "c" ? "more" : ".") / (spec.name + ".h5"), spec);
  write_file("runs/broken.h5", "not an HDF5 file");

  const CliResult result = run({"report", "runs", "--out", "out"});
  EXPECT_EQ(result.exit_code, 2) << describe(result);
  EXPECT_NE(result.err.find("broken.h5"), std::string::npos) << result.err;
  const fs::path report = work_ / "out";
  for (const auto& [group, members] :
       {std::pair{"scaling.rule=deepscalelm", 1}, std::pair{"scaling.rule=standard", 2}}) {
    expect_figure(report / "figures" / (std::string("depth_") + group + ".png"), members);
    // The synthetic runs' losses are the same curve: the last run's line covers the others.
    expect_figure(report / "figures" / (std::string("loss_") + group + ".png"), 0);
  }
  for (const char* run : {"a", "b", "c"})
    expect_figure(report / "figures" / (std::string("heatmap_") + run + ".png"), 0);
  expect_markdown_references(report);
  const std::string markdown = read_text(report / "report.md");
  EXPECT_NE(markdown.find("## Unreadable files"), std::string::npos) << markdown;
  EXPECT_NE(markdown.find("broken.h5"), std::string::npos) << markdown;

  // Synthetic runs: residual probes blocks.l.mid and blocks.l.out (no blocks.0.in), so the growth is
  // blocks.3.out / blocks.0.mid, with the values the spec defines.
  const auto table = summary_table(markdown);
  ASSERT_EQ(table.count("a") + table.count("b") + table.count("c"), 3u) << markdown;
  EXPECT_EQ(table.at("broken").at(2), "unreadable");
  for (const auto& spec : {a, b, c}) {
    const auto& row = table.at(spec.name);
    EXPECT_EQ(row[1], "scaling.rule=" + spec.rule);
    const std::int64_t first = 2, last = gui::synthetic_probe_count(spec) - 2;  // blocks.0.mid, blocks.3.out
    const std::int64_t end = spec.records - 1;
    expect_number(row[4], gui::synthetic_forward_value(spec, last, 0) / gui::synthetic_forward_value(spec, first, 0),
                  spec.name + " growth fwd init");
    expect_number(row[5],
                  gui::synthetic_forward_value(spec, last, end) / gui::synthetic_forward_value(spec, first, end),
                  spec.name + " growth fwd end");
    expect_number(row[6], gui::synthetic_backward_value(spec, last, 0) / gui::synthetic_backward_value(spec, first, 0),
                  spec.name + " growth bwd init");
    const Expected e = expected_from_file(runs / (spec.name == "c" ? "more" : ".") / (spec.name + ".h5"),
                                          "blocks.0.mid", "blocks.3.out");
    expect_row(row, e, spec.name);
    // The synthetic theory is the record-0 values (error 0), or a constant for c.
    if (spec.name != "c") {
      EXPECT_EQ(row[8], "0");
    }
  }
}

// An index row whose point failed before writing a run file is listed with the index's status and detail, and
// no values or heatmap; it is not an unreadable file (exit 0).
TEST_F(ReportTest, IndexRowWithoutRunFileIsListedAsFailed) {
  const fs::path dir = work_ / "sweep";
  gui::SyntheticRunSpec ok;
  ok.name = "rule=standard";
  gui::write_synthetic_run(dir / "rule=standard.h5", ok);
  write_file("sweep/index.csv",
             "run,scaling.rule,status,final_loss,final_val_loss,steps,seconds,file,detail\n"
             "rule=standard,standard,completed,1,,40,1,rule=standard.h5,\n"
             "rule=deepscalelm,deepscalelm,failed,,,0,0,rule=deepscalelm.h5,token id 99 >= vocab 50\n");
  const CliResult result = run({"report", "sweep"});
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  const fs::path report = dir / "report";
  expect_figure(report / "figures" / "depth_scaling.rule=standard.png", 1);
  expect_figure(report / "figures" / "heatmap_rule=standard.png", 0);
  EXPECT_FALSE(fs::exists(report / "figures" / "depth_scaling.rule=deepscalelm.png"));
  EXPECT_FALSE(fs::exists(report / "figures" / "heatmap_rule=deepscalelm.png"));
  expect_markdown_references(report);
  const std::string markdown = read_text(report / "report.md");
  const auto table = summary_table(markdown);
  ASSERT_EQ(table.size(), 2u) << markdown;
  const auto& failed = table.at("rule=deepscalelm");
  EXPECT_EQ(failed[1], "scaling.rule=deepscalelm");
  EXPECT_EQ(failed[2], "failed");
  for (std::size_t c = 3; c < failed.size(); ++c) EXPECT_EQ(failed[c], "n/a") << "column " << c;
  EXPECT_NE(markdown.find("token id 99 >= vocab 50"), std::string::npos) << markdown;
  expect_row(table.at("rule=standard"), expected_from_file(dir / "rule=standard.h5", "blocks.0.mid", "blocks.3.out"),
             "rule=standard");
}

// A ResNet run's figures are drawn by block: in each depth panel one dashed vertical line in the marker colour per
// transition (blocks 2 and 4 of the tiny ResNet, residual stream from x = 0 to 6), in each heatmap one dashed
// horizontal line per transition (rows 7 and 13 of 20).
TEST_F(ReportTest, ResnetFiguresMarkTheStageTransitions) {
  write_file("resnet.toml", gui_test::kTinyResnetStudy);
  const CliResult trained = run({"run", "resnet.toml", "--out", "runs"});
  ASSERT_EQ(trained.exit_code, 0) << describe(trained);
  const CliResult result = run({"report", "runs", "--out", "out"});
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  fs::path depth, heatmap;
  for (const auto& entry : fs::directory_iterator(work_ / "out" / "figures")) {
    const std::string name = entry.path().filename().string();
    if (entry.path().extension() != ".png") continue;
    if (name.rfind("depth_", 0) == 0) depth = entry.path();
    if (name.rfind("heatmap_", 0) == 0) heatmap = entry.path();
  }
  ASSERT_FALSE(depth.empty() || heatmap.empty()) << "figures: " << testing::PrintToString(list_tree(work_ / "out"));
  EXPECT_NE(read_text(work_ / "out" / "report.md").find("vertical dashed lines at the transitions"), std::string::npos);
  const test_png::Rgb marker = gui::marker_rgb();

  const auto figure = test_png::load_rgb(depth);
  ASSERT_EQ(figure.width, kWidth);
  const std::vector<double> ends = {0.0, 6.0};
  const gui::AxisRange range = gui::fit_range({{ends.data(), ends.size()}}, gui::AxisScale::linear, 0.02);
  // 2 × 2 panels: initialisation left, end right; forward top, backward bottom.
  for (int column = 0; column < 2; ++column) {
    for (int row = 0; row < 2; ++row) {
      SCOPED_TRACE("depth panel " + std::to_string(column) + "," + std::to_string(row));
      const int x0 = column * kWidth / 2 + 2, x1 = (column + 1) * kWidth / 2 - 2;
      const int y0 = 40 + row * (kHeight - 40) / 2, y1 = 40 + (row + 1) * (kHeight - 40) / 2;
      const auto frame = test_png::find_frame(figure, x0, x1, y0, y1);
      ASSERT_TRUE(frame.found);
      const auto lines =
          test_png::column_lines(figure, marker, static_cast<int>(frame.left) + 2, static_cast<int>(frame.right) - 1,
                                 static_cast<int>(frame.top), static_cast<int>(frame.bottom),
                                 static_cast<int>((frame.bottom - frame.top) * 0.35));
      ASSERT_EQ(lines.size(), 2u);
      for (int t = 0; t < 2; ++t) {
        const double block = 2.0 * (t + 1);
        EXPECT_NEAR(lines[t], frame.left + (block - range.min) / (range.max - range.min) * (frame.right - frame.left),
                    2.5);
      }
    }
  }

  const auto cells = test_png::load_rgb(heatmap);
  ASSERT_EQ(cells.width, kWidth);
  for (int column = 0; column < 2; ++column) {
    SCOPED_TRACE("heatmap panel " + std::to_string(column));
    const auto area = test_png::find_filled_area(cells, column * kWidth / 2 + 180, kHeight / 2);
    ASSERT_TRUE(area.found);
    const auto rows =
        test_png::row_lines(cells, marker, static_cast<int>(area.left) + 2, static_cast<int>(area.right) - 1,
                            static_cast<int>(area.top) + 2, static_cast<int>(area.bottom) - 1,
                            static_cast<int>((area.right - area.left) * 0.35));
    ASSERT_EQ(rows.size(), 2u);
    EXPECT_NEAR(rows[0], area.bottom - 13.0 / 20.0 * (area.bottom - area.top), 2.5);
    EXPECT_NEAR(rows[1], area.bottom - 7.0 / 20.0 * (area.bottom - area.top), 2.5);
  }
}

TEST_F(ReportTest, FolderWithoutRunsIsBadInputAndWritesNothing) {
  fs::create_directories(work_ / "empty");
  expect_bad_input({"report", "empty"}, {"empty", "no readable runs"});
  write_file("empty/broken.h5", "garbage");
  expect_bad_input({"report", "empty"}, {"no readable runs", "broken.h5"});
  expect_bad_input({"report", "missing"}, {"missing", "not a folder"});
}

}  // namespace
}  // namespace proplab::cli_test
