// `proplab-gui --export` run as a child process: the SVG parsed as XML (series, axis titles, runs of different depth
// on one l/L range), the PNG's size and content, the CSV against the run files (read with RunReader), and bad flags
// (exit 2, one line, no file). Skipped, with a message, when the GUI app is not built.
#include <gtest/gtest.h>

#ifdef PROPLAB_GUI_BINARY

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <tuple>

#include "cli/cli_test_support.h"
#include "gui/data/depth_axis.h"
#include "gui/data/synthetic_run.h"
#include "io/run_reader.h"
#include "support/png_lines.h"

namespace proplab::gui {
namespace {

namespace fs = std::filesystem;

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Well-formed XML, checked by Python's parser (the test machine's /usr/bin/python3).
bool well_formed_xml(const fs::path& path) {
  const std::string command =
      "/usr/bin/python3 -c \"import sys, xml.dom.minidom; xml.dom.minidom.parse(sys.argv[1])\" '" + path.string() + "'";
  return std::system(command.c_str()) == 0;
}

struct SvgSeries {
  std::string label, run;
  bool dashed = false;
  double x_min = INFINITY, x_max = -INFINITY;  // pixels, over its polylines' points
  std::size_t points = 0;
};

std::string attribute(const std::string& tag, const std::string& name) {
  const std::regex pattern(" " + name + "=\"([^\"]*)\"");
  std::smatch match;
  return std::regex_search(tag, match, pattern) ? match[1].str() : std::string();
}

// Every <g class="series"> of `svg` with its points' pixel x range.
std::vector<SvgSeries> svg_series(const std::string& svg) {
  std::vector<SvgSeries> found;
  for (std::size_t at = svg.find("<g class=\"series\""); at != std::string::npos;
       at = svg.find("<g class=\"series\"", at + 1)) {
    const std::size_t tag_end = svg.find('>', at);
    const std::string tag = svg.substr(at, tag_end - at);
    SvgSeries series;
    series.label = attribute(tag, "data-label");
    series.run = attribute(tag, "data-run");
    series.dashed = attribute(tag, "data-dashed") == "true";
    const std::string body = svg.substr(tag_end, svg.find("</g>", tag_end) - tag_end);
    const std::regex points_pattern("points=\"([^\"]*)\"");
    for (auto it = std::sregex_iterator(body.begin(), body.end(), points_pattern); it != std::sregex_iterator(); ++it) {
      std::istringstream points((*it)[1].str());
      std::string point;
      while (points >> point) {
        const double x = std::stod(point.substr(0, point.find(',')));
        series.x_min = std::min(series.x_min, x);
        series.x_max = std::max(series.x_max, x);
        ++series.points;
      }
    }
    found.push_back(series);
  }
  return found;
}

// RFC 4180 rows: fields separated by commas, quoted when they hold one ("" inside quotes is a quote).
std::vector<std::vector<std::string>> parse_csv(const std::string& text) {
  std::vector<std::vector<std::string>> rows;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    std::vector<std::string> fields(1);
    bool quoted = false;
    for (std::size_t i = 0; i < line.size(); ++i) {
      const char c = line[i];
      if (quoted && c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        fields.back() += '"';
        ++i;
      } else if (c == '"') {
        quoted = !quoted;
      } else if (c == ',' && !quoted) {
        fields.emplace_back();
      } else {
        fields.back() += c;
      }
    }
    rows.push_back(fields);
  }
  return rows;
}

class GuiExportTest : public cli_test::CliTest {
 protected:
  void SetUp() override {
    CliTest::SetUp();  // a work folder; PROPLAB_BINARY trains the real runs
    gui_ = PROPLAB_GUI_BINARY;
    ASSERT_TRUE(fs::is_regular_file(gui_)) << gui_ << " is not built";
    fs::create_directories(work_ / "runs");
  }

  // A 2-layer and a 24-layer transformer trained by `proplab run` (blocks.0.in at l/L = 0, the last block's out at 1).
  void train_shallow_and_deep() {
    for (const auto& [name, layers] : {std::pair<std::string, int>{"a_shallow", 2}, {"b_deep", 24}}) {
      std::string study = cli_test::replaced(cli_test::kTinyStudy, "name = \"tiny\"", "name = \"" + name + "\"");
      study = cli_test::replaced(study, "layers = 1", "layers = " + std::to_string(layers));
      study = cli_test::replaced(study, "steps = 20", "steps = 4");
      study = cli_test::replaced(study, "eval_every = 10", "eval_every = 2");
      write_file(name + ".toml", study);
      const auto result = run({"run", name + ".toml", "--out", "trained"});
      ASSERT_EQ(result.exit_code, 0) << describe(result);
    }
  }

  // A 2-layer and a 24-layer transformer run (synthetic: every value known), theory included.
  void write_shallow_and_deep() {
    SyntheticRunSpec shallow;
    shallow.name = "shallow";
    shallow.layers = 2;
    shallow.records = 3;
    write_synthetic_run(work_ / "runs" / "a_shallow.h5", shallow);
    SyntheticRunSpec deep = shallow;
    deep.name = "deep";
    deep.layers = 24;
    deep.depth_slope = 0.05;
    write_synthetic_run(work_ / "runs" / "b_deep.h5", deep);
  }

  cli_test::CliResult export_view(const std::string& name, std::vector<std::string> extra) {
    std::vector<std::string> args = {"--export", (work_ / name).string(), "--size", "640x400"};
    args.insert(args.end(), extra.begin(), extra.end());
    return run_program(gui_, args);
  }

  fs::path gui_;
};

TEST_F(GuiExportTest, SvgOfDepthProfilesOfDifferentDepthsSharesTheLOverLRange) {
  train_shallow_and_deep();
  const auto result = export_view("depth.svg", {"--view", "depth", "--x", "depth", (work_ / "trained").string()});
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  EXPECT_NE(result.out.find("2 runs"), std::string::npos) << describe(result);
  ASSERT_TRUE(well_formed_xml(work_ / "depth.svg"));
  const std::string svg = read_text(work_ / "depth.svg");
  EXPECT_NE(svg.find("width=\"640\" height=\"400\""), std::string::npos);

  // Each run measured and its theory dashed: four series, in the selection order; each theory's finite-width band
  // (the transformers have norms, so they have one) adds its two dashed edges at the theory's probes.
  std::vector<SvgSeries> series, band;
  for (const SvgSeries& s : svg_series(svg))
    (s.label.find("95%") != std::string::npos ? band : series).push_back(s);
  ASSERT_EQ(series.size(), 4u) << svg;
  ASSERT_EQ(band.size(), 4u) << svg;
  for (const SvgSeries& edge : band) {
    EXPECT_TRUE(edge.dashed) << edge.label;
    EXPECT_EQ(edge.points, edge.run == "a_shallow" ? 6u : 72u) << edge.label;
  }
  EXPECT_EQ(series[0].run, "a_shallow");
  EXPECT_FALSE(series[0].dashed);
  EXPECT_TRUE(series[1].dashed);
  EXPECT_EQ(series[2].run, "b_deep");
  EXPECT_TRUE(series[3].dashed);
  // The residual stream: 3 probes a block, the theory at the same probes.
  EXPECT_EQ(series[0].points, 6u);
  EXPECT_EQ(series[2].points, 72u);
  EXPECT_EQ(series[1].points, 6u);

  // Axis titles, and both runs from l/L = 0 to 1 at the same pixels.
  EXPECT_NE(svg.find(std::string(">") + depth_axis_title(DepthAxis::depth) + "</text>"), std::string::npos);
  EXPECT_NE(svg.find(">forward var</text>"), std::string::npos);
  EXPECT_NEAR(series[0].x_min, series[2].x_min, 0.02);
  EXPECT_NEAR(series[0].x_max, series[2].x_max, 0.02);
  EXPECT_GT(series[0].x_max - series[0].x_min, 300.0);
  const std::regex range(" data-x-min=\"([^\"]*)\" data-x-max=\"([^\"]*)\"");
  std::smatch match;
  ASSERT_TRUE(std::regex_search(svg, match, range));
  EXPECT_NEAR(std::stod(match[1].str()), -0.02, 1e-9);
  EXPECT_NEAR(std::stod(match[2].str()), 1.02, 1e-9);
}

TEST_F(GuiExportTest, SvgOfEveryViewParses) {
  write_shallow_and_deep();
  for (const char* view : {"dynamics", "heatmap", "compare"}) {
    const std::string name = std::string(view) + ".svg";
    const auto result = export_view(name, {"--view", view, (work_ / "runs").string()});
    ASSERT_EQ(result.exit_code, 0) << describe(result);
    EXPECT_TRUE(well_formed_xml(work_ / name)) << name;
  }
  const std::string dynamics = read_text(work_ / "dynamics.svg");
  // Three probes per run in the dynamics plot, then loss per run (and eval dashed) in the training panels.
  EXPECT_GE(svg_series(dynamics).size(), 6u);
  const std::string heatmap = read_text(work_ / "heatmap.svg");
  // Every probe of the shallow run (4 · 2 + 2) × 3 records.
  std::size_t cells = 0;
  for (std::size_t at = heatmap.find("class=\"cell\""); at != std::string::npos;
       at = heatmap.find("class=\"cell\"", at + 1))
    ++cells;
  EXPECT_EQ(cells, 30u);
}

TEST_F(GuiExportTest, DynamicsOfACompressedRunShowsTheCompressionError) {
  write_shallow_and_deep();
  ASSERT_TRUE(export_view("plain.svg", {"--view", "dynamics", (work_ / "runs").string()}).exit_code == 0);
  EXPECT_EQ(read_text(work_ / "plain.svg").find(">compression error</text>"), std::string::npos);
  SyntheticRunSpec compressed;
  compressed.name = "compressed";
  compressed.layers = 2;
  compressed.records = 3;
  compressed.compression = true;
  write_synthetic_run(work_ / "runs" / "c_compressed.h5", compressed);
  const auto result = export_view("compressed.svg", {"--view", "dynamics", (work_ / "runs").string()});
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  ASSERT_TRUE(well_formed_xml(work_ / "compressed.svg"));
  const std::string svg = read_text(work_ / "compressed.svg");
  EXPECT_NE(svg.find(">compression error</text>"), std::string::npos);
  // The compressed run's three records in the panel, beside the other series.
  EXPECT_GT(svg_series(svg).size(), svg_series(read_text(work_ / "plain.svg")).size());
}

TEST_F(GuiExportTest, PngHasTheSizeAndIsNotBlank) {
  write_shallow_and_deep();
  const auto result = export_view("depth.png", {"--view", "depth", (work_ / "runs").string()});
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  const auto image = test_png::load_rgb(work_ / "depth.png");
  EXPECT_EQ(image.width, 640);
  EXPECT_EQ(image.height, 400);
  EXPECT_GT(test_png::distinct_colours(image), 30u);
  // The screen and the SVG paint in the same colours: every colour of the SVG (series, background, text, frame, grid
  // and legend box), blended at its opacity over the background, is a colour of the PNG (the view drawn by ImGui).
  ASSERT_EQ(export_view("depth.svg", {"--view", "depth", (work_ / "runs").string()}).exit_code, 0);
  const std::string svg = read_text(work_ / "depth.svg");
  const std::regex paint_pattern("(stroke|fill)=\"#([0-9a-f]{6})\" (stroke|fill)-opacity=\"([0-9.]+)\"");
  std::set<std::pair<std::string, double>> paints;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), paint_pattern); it != std::sregex_iterator(); ++it) {
    paints.insert({(*it)[2].str(), std::stod((*it)[4].str())});
  }
  std::set<std::string> colours;
  for (const auto& [hex, opacity] : paints) colours.insert(hex);
  for (const std::string wanted : {"1f77b4", "ff7f0e", "0f0f0f", "ffffff", "6e6e80"}) {
    EXPECT_TRUE(colours.count(wanted)) << wanted;
  }
  for (const auto& [hex, opacity] : paints) {
    test_png::Rgb rgb{};
    for (int c = 0; c < 3; ++c) {
      const double value = std::stoi(hex.substr(2 * c, 2), nullptr, 16);
      rgb[c] = static_cast<unsigned char>(std::lround(value * opacity + 15.0 * (1.0 - opacity)));  // over #0f0f0f
    }
    EXPECT_GT(test_png::count_colour(image, rgb), 20u) << "#" << hex << " at opacity " << opacity
                                                       << " is in the SVG but not on the screen";
  }
}

TEST_F(GuiExportTest, CsvHoldsTheRunFilesValues) {
  write_shallow_and_deep();
  const auto result =
      export_view("depth.csv", {"--view", "depth", "--kinds", "all", "--x", "probe", (work_ / "runs").string()});
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  const auto rows = parse_csv(read_text(work_ / "depth.csv"));
  ASSERT_FALSE(rows.empty());
  EXPECT_EQ(rows[0], (std::vector<std::string>{"panel", "series", "run", "probe", "x", "y"}));
  std::map<std::string, std::size_t> checked;
  for (const auto& [file, run] :
       {std::pair<std::string, std::string>{"a_shallow.h5", "shallow"}, {"b_deep.h5", "deep"}}) {
    const RunReader reader = RunReader::open(work_ / "runs" / file);
    const auto names = reader.read_strings("/probes/name");
    const Dataset2D var = reader.read_2d("/forward/var");
    const auto theory = reader.read_doubles("/theory/forward/var");
    for (std::size_t r = 1; r < rows.size(); ++r) {
      ASSERT_EQ(rows[r].size(), 6u) << r;
      if (rows[r][2] != run) continue;
      const bool predicted = rows[r][1].find("theory") != std::string::npos;
      const auto p = static_cast<std::size_t>(std::find(names.begin(), names.end(), rows[r][3]) - names.begin());
      ASSERT_LT(p, names.size()) << rows[r][3];
      EXPECT_DOUBLE_EQ(std::stod(rows[r][4]), static_cast<double>(p));  // x: the probe index
      const double expected = predicted ? theory[p] : var.at(var.rows - 1, static_cast<std::int64_t>(p));
      EXPECT_DOUBLE_EQ(std::stod(rows[r][5]), expected) << run << " " << rows[r][3];
      ++checked[run + (predicted ? " theory" : "")];
    }
    EXPECT_EQ(checked[run], names.size()) << run;
    EXPECT_EQ(checked[run + " theory"], names.size()) << run;
  }

  // The heatmap's CSV: every cell of the first run, by row (probe) and column (record).
  const auto cells = export_view("heatmap.csv", {"--view", "heatmap", (work_ / "runs").string()});
  ASSERT_EQ(cells.exit_code, 0) << describe(cells);
  const auto cell_rows = parse_csv(read_text(work_ / "heatmap.csv"));
  EXPECT_EQ(cell_rows[0], (std::vector<std::string>{"panel", "run", "row", "column", "probe", "step", "value"}));
  const RunReader reader = RunReader::open(work_ / "runs" / "a_shallow.h5");
  const Dataset2D var = reader.read_2d("/forward/var");
  const auto steps = reader.read_ints("/steps");
  ASSERT_EQ(cell_rows.size(), 1u + static_cast<std::size_t>(var.rows * var.columns));
  for (std::size_t r = 1; r < cell_rows.size(); ++r) {
    const auto probe = std::stoll(cell_rows[r][2]), record = std::stoll(cell_rows[r][3]);
    EXPECT_EQ(std::stoll(cell_rows[r][5]), steps[static_cast<std::size_t>(record)]);
    EXPECT_DOUBLE_EQ(std::stod(cell_rows[r][6]), var.at(record, probe));
  }
}

// The grid of a sweep (two scaling rules): 2 rows × 2 columns of panels, each run at init and at its last record, in
// the SVG and in the CSV (against the run files' /forward/var and /backward/var).
TEST_F(GuiExportTest, GridOfASweepHasARowPerDirectionAndAColumnPerRule) {
  const std::vector<std::tuple<std::string, std::string, std::string>> sweep = {
      {"pre_standard", "standard", "pre"},
      {"post_standard", "standard", "post"},
      {"pre_deepscalelm", "deepscalelm", "pre"}};
  for (const auto& [name, rule, norm] : sweep) {
    SyntheticRunSpec spec;
    spec.name = name;
    spec.rule = rule;
    spec.norm = norm;
    spec.layers = 3;
    spec.records = 3;
    write_synthetic_run(work_ / "runs" / (name + ".h5"), spec);
  }
  const std::string runs = (work_ / "runs").string();
  const auto result = export_view("grid.svg", {"--view", "grid", runs});
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  ASSERT_TRUE(well_formed_xml(work_ / "grid.svg"));
  const std::string svg = read_text(work_ / "grid.svg");
  std::size_t panels = 0;
  for (std::size_t at = svg.find("<g class=\"plot\""); at != std::string::npos;
       at = svg.find("<g class=\"plot\"", at + 1))
    ++panels;
  EXPECT_EQ(panels, 4u);
  // The panels' data areas line up: one size for all, though their legends list different runs.
  const std::regex area_pattern(" data-area=\"([^\"]*)\"");
  std::vector<std::vector<double>> areas;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), area_pattern); it != std::sregex_iterator(); ++it) {
    std::istringstream numbers((*it)[1].str());
    std::vector<double> area(4);
    numbers >> area[0] >> area[1] >> area[2] >> area[3];
    areas.push_back(area);
  }
  ASSERT_EQ(areas.size(), 4u);
  for (const auto& area : areas) {
    EXPECT_DOUBLE_EQ(area[2] - area[0], areas[0][2] - areas[0][0]);
    EXPECT_DOUBLE_EQ(area[3] - area[1], areas[0][3] - areas[0][1]);
  }
  EXPECT_DOUBLE_EQ(areas[1][0] - areas[0][0], areas[3][0] - areas[2][0]) << "columns start at the same x";
  // Each run is listed once per panel (its solid line; the dashed init line shares the entry).
  const std::regex entry_pattern("class=\"legend-entry\">([^<]*)</text>");
  std::map<std::string, int> entries;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), entry_pattern); it != std::sregex_iterator(); ++it) {
    ++entries[(*it)[1].str()];
  }
  EXPECT_EQ(entries, (std::map<std::string, int>{{"post_standard", 2}, {"pre_deepscalelm", 2}, {"pre_standard", 2}}));
  // The x axis is by block, its ticks named after the blocks.
  const std::regex x_tick_pattern("class=\"tick x-tick\">([^<]*)</text>");
  std::set<std::string> x_ticks;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), x_tick_pattern); it != std::sregex_iterator(); ++it) {
    x_ticks.insert((*it)[1].str());
  }
  EXPECT_EQ(x_ticks, (std::set<std::string>{"blocks.2"})) << "blocks 1 to 3 are in view (the stream leaving each "
                                                             "block's sublayers), every other one named";
  // 2 rows × (1 deepscalelm run + 2 standard runs) × (init + last).
  const auto series = svg_series(svg);
  EXPECT_EQ(series.size(), 12u);
  EXPECT_EQ(std::count_if(series.begin(), series.end(), [](const SvgSeries& s) { return s.dashed; }), 6);
  EXPECT_NE(svg.find(">scaling.rule = deepscalelm</text>"), std::string::npos);
  EXPECT_NE(svg.find(">scaling.rule = standard</text>"), std::string::npos);
  EXPECT_NE(svg.find(">backward var</text>"), std::string::npos);
  EXPECT_NE(svg.find("pre_standard (init)"), std::string::npos);
  EXPECT_NE(svg.find("pre_standard (step 20)"), std::string::npos);

  const auto csv = export_view("grid.csv", {"--view", "grid", runs});
  ASSERT_EQ(csv.exit_code, 0) << describe(csv);
  const auto rows = parse_csv(read_text(work_ / "grid.csv"));
  ASSERT_FALSE(rows.empty());
  EXPECT_EQ(rows[0], (std::vector<std::string>{"panel", "series", "run", "probe", "x", "y"}));
  std::map<std::string, std::size_t> checked;
  for (const auto& [name, rule, norm] : sweep) {
    const RunReader reader = RunReader::open(work_ / "runs" / (name + ".h5"));
    const auto names = reader.read_strings("/probes/name");
    for (const std::string direction : {"forward", "backward"}) {
      const Dataset2D var = reader.read_2d("/" + direction + "/var");
      for (std::size_t r = 1; r < rows.size(); ++r) {
        ASSERT_EQ(rows[r].size(), 6u) << r;
        if (rows[r][2] != name || rows[r][0] != "grid/" + direction + "/" + rule) continue;
        const bool init = rows[r][1] == name + " (init)";
        EXPECT_TRUE(init || rows[r][1] == name + " (step 20)") << rows[r][1];
        const auto p = static_cast<std::int64_t>(std::find(names.begin(), names.end(), rows[r][3]) - names.begin());
        ASSERT_LT(p, static_cast<std::int64_t>(names.size())) << rows[r][3];
        EXPECT_DOUBLE_EQ(std::stod(rows[r][5]), var.at(init ? 0 : var.rows - 1, p)) << name << " " << rows[r][3];
        ++checked[name + " " + direction + (init ? " init" : " last")];
      }
    }
  }
  // The residual stream of 3 blocks (mid and out), in each panel of each run, at init and at the last record.
  EXPECT_EQ(checked.size(), 12u);
  for (const auto& [series_name, count] : checked) EXPECT_EQ(count, 6u) << series_name;
}

// A bad flag value or an unreadable run: exit 2, one line naming it, and no file (not even a partial one).
TEST_F(GuiExportTest, BadInputExitsTwoWithoutWritingAnything) {
  write_shallow_and_deep();
  std::ofstream(work_ / "junk.h5") << "not a run file";
  const std::string runs = (work_ / "runs").string();
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--view", "sideways", runs}, "--view sideways"}, {{"--x", "sideways", runs}, "--x sideways"},
      {{"--stat", "nope", runs}, "--stat nope"},         {{runs, (work_ / "junk.h5").string()}, "junk.h5"},
      {{(work_ / "missing.h5").string()}, "missing.h5"},
  };
  for (const auto& [args, named] : cases) {
    const auto result = export_view("out.svg", args);
    EXPECT_EQ(result.exit_code, 2) << describe(result);
    EXPECT_NE(result.err.find(named), std::string::npos) << describe(result);
    EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1) << describe(result);
    EXPECT_FALSE(fs::exists(work_ / "out.svg")) << named;
    EXPECT_FALSE(fs::exists(work_ / "out.svg.partial")) << named;
  }
  const auto extension = run_program(gui_, {"--export", (work_ / "out.txt").string(), runs});
  EXPECT_EQ(extension.exit_code, 2);
  EXPECT_NE(extension.err.find("out.txt"), std::string::npos) << describe(extension);
  EXPECT_FALSE(fs::exists(work_ / "out.txt"));
  const auto folder = run_program(gui_, {"--export", (work_ / "nowhere" / "out.svg").string(), runs});
  EXPECT_EQ(folder.exit_code, 2);
  EXPECT_NE(folder.err.find("nowhere"), std::string::npos) << describe(folder);
}

}  // namespace
}  // namespace proplab::gui

#else

TEST(GuiExportTest, SkippedWithoutTheGuiApp) { GTEST_SKIP() << "proplab-gui is not built (PROPLAB_GUI off)"; }

#endif
