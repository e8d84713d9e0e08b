// `proplab report` end to end, headless (EGL surfaceless: Mesa llvmpipe on CI): a 4-point sweep of tiny
// transformers made by `proplab sweep` (2 depths × 2 seeds, so 2 groups of 2 runs), then the report: every expected
// PNG exists, has the figure size and is not blank (the runs' colours are in the depth and loss figures), report.md
// references every PNG, and its summary table holds the values read from the run files with RunReader. A plain
// folder of synthetic runs (no index.csv) is grouped by the config key that differs and its table checked against
// the values the synthetic runs were made with; bad folders exit 2.
//
// Learning-rate sweeps: a sweep of 2 widths × 4 learning rates × 2 seeds of tiny transformers under SGD (lr 100
// blows the loss up to ~10^4 in 20 steps), whose lr table must hold the best lr, its final loss and the diverged
// lrs that tests/report/lr_sweep_expected.py computes from the run files with h5py; and plans made in memory for
// the rules themselves (final loss, divergence, seeds averaged, diverged points never best, families and the
// series key, n/a and all-diverged rows, no section for a single lr).
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
#include "gui/report/report.h"
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

// The first markdown table after the heading line that starts at `heading` (npos: none): its first cell -> its cells,
// header and alignment rows left out. A heading before any table row ends the search.
std::map<std::string, std::vector<std::string>> table_after(const std::string& markdown, std::size_t heading) {
  std::map<std::string, std::vector<std::string>> rows;
  if (heading == std::string::npos) return rows;
  std::istringstream lines(markdown.substr(heading));
  std::string line;
  std::getline(lines, line);  // the heading
  int table_line = 0;
  while (std::getline(lines, line)) {
    if (line.rfind("|", 0) != 0) {
      if (table_line > 0 || line.rfind("## ", 0) == 0 || line.rfind("### ", 0) == 0) break;
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

// report.md's summary table: run name -> cells (run, group, status, final loss, growth fwd init, growth fwd end,
// growth bwd init, growth bwd end, theory error fwd, theory error bwd).
std::map<std::string, std::vector<std::string>> summary_table(const std::string& markdown) {
  const std::size_t at = markdown.find("\n## Summary\n");
  return table_after(markdown, at == std::string::npos ? at : at + 1);
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
  EXPECT_NE(result.err.find("proplab report: figure 10/10"), std::string::npos) << "progress lines:\n" << result.err;
  const fs::path report = work_ / "sweep" / "report";

  // Two groups (model.layers = 1, 2) of two seeds each: a depth and a loss figure per group, a heatmap per run.
  for (const char* group : {"model.layers=1", "model.layers=2"}) {
    expect_figure(report / "figures" / (std::string("depth_") + group + ".png"), 2);
    expect_figure(report / "figures" / (std::string("loss_") + group + ".png"), 2);
  }
  // And the four runs side by side, one colour each.
  expect_figure(report / "figures" / "depth_all.png", 4);
  expect_figure(report / "figures" / "loss_all.png", 4);
  std::vector<std::string> runs;
  for (std::size_t r = 1; r < index.size(); ++r) {
    runs.push_back(index[r][0]);
    expect_figure(report / "figures" / ("heatmap_" + index[r][0] + ".png"), 0);
  }
  std::size_t files = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(report / "figures")) ++files;
  EXPECT_EQ(files, 20u) << "10 figures, each a PNG and an SVG";
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
  // Two groups: the three runs also side by side (their losses are one curve, as above).
  expect_figure(report / "figures" / "depth_all.png", 3);
  expect_figure(report / "figures" / "loss_all.png", 0);
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

// ---- Learning-rate sweeps ----

const fs::path kPython = "/usr/bin/python3";

// A run snapshot with these training losses (one per step) and evaluation losses, and this config.
std::shared_ptr<const gui::RunSnapshot> loss_run(const std::vector<double>& train, const std::vector<double>& eval = {},
                                                 const std::map<std::string, std::string>& config = {}) {
  auto run = std::make_shared<gui::RunSnapshot>();
  for (std::size_t s = 0; s < train.size(); ++s) {
    run->train.step.push_back(static_cast<std::int64_t>(s));
    run->train.loss.push_back(train[s]);
  }
  for (std::size_t e = 0; e < eval.size(); ++e) {
    run->eval.step.push_back(static_cast<std::int64_t>(10 * (e + 1)));
    run->eval.loss.push_back(eval[e]);
  }
  run->config = config;
  return run;
}

// 30 training losses: `initial` for the first 5 steps, `final` after (so the initial loss is `initial` and the mean
// over the last 20 steps is `final`).
std::vector<double> flat_curve(double initial, double final) {
  std::vector<double> losses(30, final);
  std::fill(losses.begin(), losses.begin() + 5, initial);
  return losses;
}

gui::ReportRun report_run(const std::string& name, const std::string& status,
                          std::shared_ptr<const gui::RunSnapshot> snapshot, std::vector<std::string> values) {
  gui::ReportRun run;
  run.name = name;
  run.status = status;
  run.snapshot = std::move(snapshot);
  run.key_values = std::move(values);
  return run;
}

// Puts every run of a plan made in memory into one group (report_markdown's summary names each run's group).
void one_group(gui::ReportPlan& plan) {
  plan.groups.assign(1, gui::ReportGroup{"all runs", "all", {}});
  for (std::size_t r = 0; r < plan.runs.size(); ++r) plan.groups[0].members.push_back(r);
}

// The rows of the lr table under "### <family>" in report.md: first cell -> cells (value, best lr, final loss,
// lrs tried, diverged lrs).
std::map<std::string, std::vector<std::string>> lr_table(const std::string& markdown, const std::string& family) {
  const std::size_t at = markdown.find("\n### " + family + "\n");
  return table_after(markdown, at == std::string::npos ? at : at + 1);
}

// The centres (pixels) of the point markers of class `marker` ("marker-cross", "marker-circle") of the SVG series
// labelled `label`, and the plot's data area (x0 y0 x1 y1).
struct SvgMarks {
  std::vector<std::pair<double, double>> centres;
  double area[4] = {0, 0, 0, 0};
};
SvgMarks svg_marks(const std::string& svg, const std::string& label, const std::string& marker) {
  SvgMarks marks;
  const std::size_t area = svg.find("data-area=\"");
  if (area != std::string::npos) {
    std::istringstream numbers(svg.substr(area + 11, svg.find('"', area + 11) - area - 11));
    numbers >> marks.area[0] >> marks.area[1] >> marks.area[2] >> marks.area[3];
  }
  const std::size_t begin = svg.find("data-label=\"" + label + "\"");
  if (begin == std::string::npos) return marks;
  const std::size_t end = svg.find("</g>", begin);
  const bool cross = marker == "marker-cross";
  for (std::size_t at = svg.find("class=\"marker " + marker + "\"", begin); at != std::string::npos && at < end;
       at = svg.find("class=\"marker " + marker + "\"", at + 1)) {
    auto attribute = [&](const std::string& name) {
      const std::size_t value = svg.find(" " + name + "=\"", at) + name.size() + 3;
      return std::stod(svg.substr(value, svg.find('"', value) - value));
    };
    marks.centres.emplace_back(attribute(cross ? "data-x" : "cx"), attribute(cross ? "data-y" : "cy"));
  }
  return marks;
}

TEST_F(ReportTest, LrRunLossFollowsTheDocumentedRules) {
  // Training only: the mean over the last 20 steps (here 19 at 2 and a last one at 1), the first 5 for the initial.
  std::vector<double> train(30, 2.0);
  std::fill(train.begin(), train.begin() + 5, 4.0);
  train.back() = 1.0;
  gui::LrRunLoss loss = gui::lr_run_loss(report_run("a", "completed", loss_run(train), {}));
  EXPECT_TRUE(loss.has_loss);
  EXPECT_FALSE(loss.from_eval);
  EXPECT_DOUBLE_EQ(loss.final_loss, (19 * 2.0 + 1.0) / 20.0);
  EXPECT_DOUBLE_EQ(loss.initial_loss, 4.0);
  EXPECT_FALSE(loss.diverged);
  // Shorter than the windows: every step.
  loss = gui::lr_run_loss(report_run("b", "completed", loss_run({3.0, 2.0, 1.0}), {}));
  EXPECT_DOUBLE_EQ(loss.final_loss, 2.0);
  EXPECT_DOUBLE_EQ(loss.initial_loss, 2.0);
  // With evaluations: the last evaluation loss, whatever the training loss did.
  loss = gui::lr_run_loss(report_run("c", "completed", loss_run(flat_curve(3.0, 2.9), {2.6, 2.0}), {}));
  EXPECT_TRUE(loss.from_eval);
  EXPECT_DOUBLE_EQ(loss.final_loss, 2.0);
  // Diverged: above the initial loss (finite), not finite, or by status (even with a good loss).
  EXPECT_TRUE(gui::lr_run_loss(report_run("d", "completed", loss_run(flat_curve(3.0, 3.01)), {})).diverged);
  EXPECT_TRUE(gui::lr_run_loss(report_run("e", "completed", loss_run(flat_curve(3.0, std::nan(""))), {})).diverged);
  EXPECT_TRUE(gui::lr_run_loss(report_run("f", "completed", loss_run(flat_curve(3.0, 2.0), {INFINITY}), {})).diverged);
  EXPECT_TRUE(gui::lr_run_loss(report_run("g", "diverged", loss_run(flat_curve(3.0, 2.0)), {})).diverged);
  EXPECT_TRUE(gui::lr_run_loss(report_run("h", "failed", nullptr, {})).diverged);
  // No loss at all: n/a, not diverged.
  loss = gui::lr_run_loss(report_run("i", "completed", loss_run({}), {}));
  EXPECT_FALSE(loss.has_loss);
  EXPECT_FALSE(loss.diverged);
  EXPECT_FALSE(gui::lr_run_loss(report_run("j", "pending", nullptr, {})).diverged);
}

// A μP-style sweep, rule × width × lr (rule first in the index), made in memory: one family per rule, one line per
// width (the numeric key), seeds averaged, diverged points never best, n/a points listed, a family where every
// point diverged still drawn.
TEST_F(ReportTest, LrSweepFamiliesSeedsDivergenceAndTransfer) {
  gui::ReportPlan plan;
  plan.dir = work_;
  plan.from_index = true;
  plan.group_keys = {"scaling.rule", "model.width", "train.lr"};
  auto add = [&](const std::string& name, const std::string& status, std::shared_ptr<const gui::RunSnapshot> run,
                 const std::string& rule, const std::string& width, const std::string& lr) {
    plan.runs.push_back(report_run(name, status, std::move(run), {rule, width, lr}));
  };
  // Width 128 first: the lines still go by increasing width.
  add("m128a", "completed", loss_run(flat_curve(3.0, 2.5)), "mup", "128", "0.01");
  // Width 64: lr 0.01 averages 2.2 over its seeds, lr 0.1 2.3 (though one of its seeds is the lowest of all), and
  // lr 1 would be lower still but its status says diverged.
  add("m64a", "completed", loss_run(flat_curve(3.0, 2.2)), "mup", "64", "0.01");
  add("m64b", "completed", loss_run(flat_curve(3.0, 2.2)), "mup", "64", "1e-2");
  add("m64c", "completed", loss_run(flat_curve(3.0, 1.9)), "mup", "64", "0.1");
  add("m64d", "completed", loss_run(flat_curve(3.0, 2.7)), "mup", "64", "0.1");
  add("m64e", "diverged", loss_run(flat_curve(3.0, 2.0)), "mup", "64", "1");
  // Width 128: lr 0.1's evaluation loss (2.0) decides, not its training loss (2.9); lr 1 got worse than at
  // initialisation; lr 0.3 has no loss yet.
  add("m128b", "completed", loss_run(flat_curve(3.0, 2.9), {2.6, 2.0}), "mup", "128", "0.1");
  add("m128c", "completed", loss_run(flat_curve(3.0, 3.5)), "mup", "128", "1");
  add("m128d", "running", loss_run({}), "mup", "128", "0.3");
  // The standard rule: every point diverged (NaN, a failed point without a run file, above the initial loss, inf).
  add("s64a", "completed", loss_run(flat_curve(3.0, std::nan(""))), "standard", "64", "0.01");
  add("s64b", "failed", nullptr, "standard", "64", "0.1");
  add("s128a", "completed", loss_run(flat_curve(3.0, 3.1)), "standard", "128", "0.01");
  add("s128b", "completed", loss_run(flat_curve(3.0, 2.0), {INFINITY}), "standard", "128", "0.1");
  one_group(plan);
  plan.lr = gui::lr_sweeps(plan);

  const gui::LrSweeps& sweeps = plan.lr;
  EXPECT_EQ(sweeps.series_key, "model.width");
  EXPECT_EQ(sweeps.fixed_keys, std::vector<std::string>{"scaling.rule"});
  ASSERT_EQ(sweeps.families.size(), 2u);
  const gui::LrFamily& mup = sweeps.families[0];
  const gui::LrFamily& standard = sweeps.families[1];
  EXPECT_EQ(mup.label, "scaling.rule=mup");
  EXPECT_EQ(mup.slug, "scaling.rule=mup");
  EXPECT_EQ(standard.label, "scaling.rule=standard");
  ASSERT_EQ(mup.series.size(), 2u);
  EXPECT_EQ(mup.series[0].value, "64");
  EXPECT_EQ(mup.series[1].value, "128");
  const gui::LrSeries& w64 = mup.series[0];
  ASSERT_EQ(w64.points.size(), 3u) << "0.01 and 1e-2 are one point";
  EXPECT_EQ(w64.points[0].runs.size(), 2u);
  EXPECT_DOUBLE_EQ(w64.points[0].final_loss, 2.2);
  EXPECT_DOUBLE_EQ(w64.points[1].final_loss, 2.3);
  EXPECT_TRUE(w64.points[2].diverged);
  ASSERT_TRUE(w64.best.has_value());
  EXPECT_DOUBLE_EQ(w64.points[*w64.best].lr, 0.01);
  const gui::LrSeries& w128 = mup.series[1];
  ASSERT_EQ(w128.points.size(), 4u);
  ASSERT_TRUE(w128.best.has_value());
  EXPECT_DOUBLE_EQ(w128.points[*w128.best].lr, 0.1);
  EXPECT_DOUBLE_EQ(w128.points[*w128.best].final_loss, 2.0);
  EXPECT_FALSE(w128.points[2].has_loss);
  EXPECT_FALSE(w128.points[2].diverged);
  EXPECT_TRUE(w128.points[3].diverged);
  EXPECT_DOUBLE_EQ(mup.transfer, 10.0);
  for (const auto& series : standard.series) EXPECT_FALSE(series.best.has_value()) << series.value;
  EXPECT_TRUE(std::isnan(standard.transfer));

  gui::ReportFigures figures = gui::report_figure_names(plan);
  EXPECT_EQ(figures.lr,
            (std::vector<std::string>{"figures/lr_scaling.rule=mup.png", "figures/lr_scaling.rule=standard.png"}));
  std::vector<gui::RunMetrics> metrics(plan.runs.size());
  const std::string markdown = gui::report_markdown(plan, figures, metrics);
  EXPECT_NE(markdown.find("\n## Learning-rate sweeps\n"), std::string::npos) << markdown;
  EXPECT_NE(markdown.find("![learning-rate sweep: scaling.rule=mup](figures/lr_scaling.rule=mup.png)"),
            std::string::npos)
      << markdown;
  const auto mup_table = lr_table(markdown, "scaling.rule=mup");
  ASSERT_EQ(mup_table.size(), 2u) << markdown;
  EXPECT_EQ(mup_table.at("64"), (std::vector<std::string>{"64", "0.01", "2.2", "0.01, 0.1, 1", "1"}));
  EXPECT_EQ(mup_table.at("128"), (std::vector<std::string>{"128", "0.1", "2", "0.01, 0.1, 0.3 (n/a), 1", "1"}));
  EXPECT_NE(markdown.find("Transfer over `model.width`: max / min best lr = 10 "), std::string::npos) << markdown;
  const auto standard_table = lr_table(markdown, "scaling.rule=standard");
  ASSERT_EQ(standard_table.size(), 2u) << markdown;
  EXPECT_EQ(standard_table.at("64"), (std::vector<std::string>{"64", "all diverged", "n/a", "0.01, 0.1", "0.01, 0.1"}));
  EXPECT_EQ(standard_table.at("128"),
            (std::vector<std::string>{"128", "all diverged", "n/a", "0.01, 0.1", "0.01, 0.1"}));

  // The figures alone (no group, no heatmap): the all-diverged family is drawn too, its points as × at the top.
  plan.groups.clear();
  figures.depth.clear();
  figures.loss.clear();
  figures.heatmap.assign(plan.runs.size(), "");
  fs::create_directories(work_ / "out" / "figures");
  std::size_t drawn = 0;
  gui::render_report_figures(plan, figures, work_ / "out",
                             [&](std::size_t, std::size_t, const std::string&) { ++drawn; });
  EXPECT_EQ(drawn, 2u);
  for (const auto& figure : figures.lr) expect_figure(work_ / "out" / figure, 2);
  const std::string svg = read_text(work_ / "out" / "figures" / "lr_scaling.rule=standard.svg");
  for (const char* width : {"64", "128"}) {
    const SvgMarks crosses = svg_marks(svg, std::string("model.width = ") + width + ": diverged", "marker-cross");
    ASSERT_EQ(crosses.centres.size(), 2u) << width << "\n" << svg;
    for (const auto& [x, y] : crosses.centres) {
      EXPECT_GT(y, crosses.area[1]) << width;
      EXPECT_LT(y, crosses.area[1] + 0.3 * (crosses.area[3] - crosses.area[1])) << width << ": not at the top";
    }
    EXPECT_TRUE(svg_marks(svg, std::string("model.width = ") + width + ": best lr", "marker-circle").centres.empty());
  }
}

// One lr (the runs' configs, no lr column): no section and no figure. A key zipped with train.lr is not a line.
TEST_F(ReportTest, LrSweepsNeedTwoLearningRatesAndIgnoreKeysZippedWithIt) {
  gui::ReportPlan plan;
  plan.dir = work_;
  plan.group_keys = {"model.width"};
  for (const char* width : {"64", "128"}) {
    plan.runs.push_back(
        report_run(width, "completed", loss_run(flat_curve(3.0, 2.0), {}, {{"train.lr", "0.01"}}), {width}));
  }
  one_group(plan);
  plan.lr = gui::lr_sweeps(plan);
  EXPECT_TRUE(plan.lr.families.empty());
  const gui::ReportFigures figures = gui::report_figure_names(plan);
  EXPECT_TRUE(figures.lr.empty());
  EXPECT_EQ(
      gui::report_markdown(plan, figures, std::vector<gui::RunMetrics>(plan.runs.size())).find("Learning-rate sweeps"),
      std::string::npos);

  // The lr from the configs (not a group key): one line per width.
  for (const char* width : {"64", "128"}) {
    plan.runs.push_back(
        report_run(width, "completed", loss_run(flat_curve(3.0, 2.0), {}, {{"train.lr", "0.1"}}), {width}));
  }
  one_group(plan);
  plan.lr = gui::lr_sweeps(plan);
  ASSERT_EQ(plan.lr.families.size(), 1u);
  EXPECT_EQ(plan.lr.series_key, "model.width");
  EXPECT_EQ(plan.lr.families[0].label, "all runs");
  ASSERT_EQ(plan.lr.families[0].series.size(), 2u);
  EXPECT_EQ(plan.lr.families[0].series[1].points.size(), 2u);
  // Had only width 64 been run at 0.01 and only 128 at 0.1, the width would follow the lr: one line.
  plan.runs.erase(plan.runs.begin() + 1, plan.runs.begin() + 3);
  one_group(plan);
  plan.lr = gui::lr_sweeps(plan);
  ASSERT_EQ(plan.lr.families.size(), 1u);
  EXPECT_EQ(plan.lr.series_key, "");

  // zip = { "train.lr" = [...], "train.warmup" = [...] }: warmup follows the lr, so one family of one line.
  gui::ReportPlan zipped;
  zipped.dir = work_;
  zipped.from_index = true;
  zipped.group_keys = {"train.lr", "train.warmup"};
  for (const auto& [lr, warmup] : {std::pair{"0.01", "0"}, std::pair{"0.1", "10"}, std::pair{"1", "20"}})
    zipped.runs.push_back(report_run(lr, "completed", loss_run(flat_curve(3.0, 2.0)), {lr, warmup}));
  zipped.lr = gui::lr_sweeps(zipped);
  EXPECT_EQ(zipped.lr.series_key, "");
  ASSERT_EQ(zipped.lr.families.size(), 1u);
  EXPECT_EQ(zipped.lr.families[0].slug, "all");
  ASSERT_EQ(zipped.lr.families[0].series.size(), 1u);
  EXPECT_EQ(zipped.lr.families[0].series[0].points.size(), 3u);
  ASSERT_TRUE(zipped.lr.families[0].series[0].best.has_value());
  EXPECT_EQ(*zipped.lr.families[0].series[0].best, 0u) << "equal losses: the smaller lr";

  // zip = { "model.layers" = [...], "model.width" = [...] } (shapes of equal size) × lr, per norm: the width follows
  // the layers, the series key, so it fixes no family: one family per norm, one line per shape.
  gui::ReportPlan shapes;
  shapes.dir = work_;
  shapes.from_index = true;
  shapes.group_keys = {"model.norm", "model.layers", "model.width", "train.lr"};
  for (const char* norm : {"pre", "post"})
    for (const auto& [layers, width] : {std::pair{"2", "256"}, std::pair{"8", "128"}, std::pair{"32", "64"}})
      for (const char* lr : {"0.001", "0.003"})
        shapes.runs.push_back(report_run(std::string(norm) + layers + "_" + lr, "completed",
                                         loss_run(flat_curve(3.0, 2.0)), {norm, layers, width, lr}));
  shapes.lr = gui::lr_sweeps(shapes);
  EXPECT_EQ(shapes.lr.series_key, "model.layers");
  EXPECT_EQ(shapes.lr.fixed_keys, std::vector<std::string>{"model.norm"});
  ASSERT_EQ(shapes.lr.families.size(), 2u);
  EXPECT_EQ(shapes.lr.families[0].label, "model.norm=pre");
  ASSERT_EQ(shapes.lr.families[0].series.size(), 3u);
  EXPECT_EQ(shapes.lr.families[0].series[2].value, "32");
  EXPECT_EQ(shapes.lr.families[0].series[2].points.size(), 2u);

  // zip = { "model.norm" = ["pre", "post", "both"], "scaling.rule" = ["standard", "standard", "keel"] } × lr: the
  // norm (the series key: no key is numeric) determines the rule, so the rule fixes no family: one figure of three
  // lines. (A rule that did not follow the norm would fix one family per rule.)
  gui::ReportPlan placements;
  placements.dir = work_;
  placements.from_index = true;
  placements.group_keys = {"train.lr", "model.norm", "scaling.rule"};
  for (const char* lr : {"0.001", "0.004"})
    for (const auto& [norm, rule] :
         {std::pair{"pre", "standard"}, std::pair{"post", "standard"}, std::pair{"both", "keel"}})
      placements.runs.push_back(
          report_run(std::string(norm) + "_" + lr, "completed", loss_run(flat_curve(3.0, 2.0)), {lr, norm, rule}));
  placements.lr = gui::lr_sweeps(placements);
  EXPECT_EQ(placements.lr.series_key, "model.norm");
  EXPECT_TRUE(placements.lr.fixed_keys.empty());
  ASSERT_EQ(placements.lr.families.size(), 1u);
  EXPECT_EQ(placements.lr.families[0].series.size(), 3u);
}

// End to end: `proplab sweep` over width × lr × 2 seeds, then `proplab report`; the lr table against the run files
// read with h5py (tests/report/lr_sweep_expected.py, the rules written out again).
TEST_F(ReportTest, LrSweepTableMatchesTheRunFiles) {
  std::string study = replaced(kTinyStudy, "[train]\n", "[train]\noptimizer = \"sgd\"\n");
  study += "\n[sweep]\ngrid = { \"model.width\" = [16, 32], \"train.lr\" = [0.01, 0.1, 1, 100] }\nseeds = 2\n";
  write_file("study.toml", study);
  const CliResult sweep = run({"sweep", "study.toml", "--jobs", "2", "--out", "sweep"});
  ASSERT_EQ(sweep.exit_code, 0) << describe(sweep);
  const CliResult result = run({"report", "sweep"});
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  EXPECT_NE(result.err.find("learning-rate sweep, all runs"), std::string::npos) << result.err;
  const fs::path report = work_ / "sweep" / "report";
  expect_figure(report / "figures" / "lr_all.png", 2);
  expect_markdown_references(report);
  const std::string markdown = read_text(report / "report.md");
  EXPECT_NE(markdown.find("\n## Learning-rate sweeps\n"), std::string::npos) << markdown;
  EXPECT_NE(markdown.find("Transfer over `model.width`: max / min best lr = "), std::string::npos) << markdown;
  const auto table = lr_table(markdown, "all runs");
  ASSERT_EQ(table.size(), 2u) << markdown;
  for (const char* width : {"16", "32"}) {
    ASSERT_TRUE(table.count(width)) << markdown;
    const auto& row = table.at(width);
    ASSERT_EQ(row.size(), 5u) << markdown;
    EXPECT_EQ(row[3], "0.01, 0.1, 1, 100");
    EXPECT_NE(row[4].find("100"), std::string::npos) << "lr 100 must diverge: " << row[4];
    EXPECT_EQ(row[4].find("0.01"), std::string::npos) << row[4];
    // The × of the diverged lrs at the top of the figure's data area.
    const SvgMarks crosses = svg_marks(read_text(report / "figures" / "lr_all.svg"),
                                       std::string("model.width = ") + width + ": diverged", "marker-cross");
    EXPECT_EQ(crosses.centres.size(), static_cast<std::size_t>(std::count(row[4].begin(), row[4].end(), ',') + 1));
    for (const auto& [x, y] : crosses.centres)
      EXPECT_LT(y, crosses.area[1] + 0.3 * (crosses.area[3] - crosses.area[1])) << width << ": not at the top";
  }

  if (run_program(kPython, {"-c", "import h5py"}).exit_code != 0)
    GTEST_SKIP() << "/usr/bin/python3 cannot import h5py (python3-h5py): the lr table is not checked against h5py";
  const char* source = std::getenv("PROPLAB_SOURCE_DIR");
  ASSERT_TRUE(source != nullptr && *source != '\0') << "PROPLAB_SOURCE_DIR is not set: run through ctest";
  const CliResult expected = run_program(
      kPython, {(fs::path(source) / "tests" / "report" / "lr_sweep_expected.py").string(), "sweep", "model.width"});
  ASSERT_EQ(expected.exit_code, 0) << describe(expected);
  std::istringstream lines(expected.out);
  std::string line;
  std::size_t rows = 0;
  while (std::getline(lines, line)) {
    std::vector<std::string> fields;
    std::istringstream split(line);
    for (std::string field; std::getline(split, field, '\t');) fields.push_back(field);
    ASSERT_EQ(fields.size(), 5u) << line;
    SCOPED_TRACE("model.width = " + fields[0]);
    ASSERT_TRUE(table.count(fields[0])) << markdown;
    const auto& row = table.at(fields[0]);
    EXPECT_EQ(row[1], fields[1]) << "best lr";
    expect_number(row[2], fields[2] == "n/a" ? std::nan("") : std::stod(fields[2]), "final loss at the best lr");
    EXPECT_EQ(row[3], fields[3]) << "lrs tried";
    EXPECT_EQ(row[4], fields[4]) << "diverged lrs";
    ++rows;
  }
  EXPECT_EQ(rows, 2u) << expected.out;
}

}  // namespace
}  // namespace proplab::cli_test
