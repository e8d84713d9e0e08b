// Tests for `proplab theory` (cli/theory.h): the predicted depth table, the MLP mean-field summary, speed on a
// very deep study (the model is never built), --compare against a run's record at step 0, and bad input.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "cli/cli_test_support.h"

namespace proplab {

namespace {

using cli_test::CliResult;
using cli_test::CliTest;
using cli_test::kTinyStudy;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::vector<std::string> words(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> out;
  for (std::string word; in >> word;) out.push_back(word);
  return out;
}

// The first line of `text` whose words include `word` (empty when none).
std::vector<std::string> row_with(const std::string& text, const std::string& word) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> row = words(line);
    for (const auto& w : row)
      if (w == word) return row;
  }
  return {};
}

// The value after "label:" on its line, parsed as a number (NaN when absent or not a number).
double labelled_number(const std::string& text, const std::string& label) {
  const auto at = text.find(label + ":");
  if (at == std::string::npos) return std::nan("");
  const char* start = text.c_str() + at + label.size() + 1;
  char* end = nullptr;
  const double value = std::strtod(start, &end);
  return end == start ? std::nan("") : value;
}

class TheoryCli : public CliTest {};

}  // namespace

TEST_F(TheoryCli, TinyTransformerPrintsEveryProbeWithPredictions) {
  write_file("tiny.toml", kTinyStudy);
  const CliResult result = run({"theory", "tiny.toml"});
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  for (const char* name : {"embed.out", "blocks.0.in", "blocks.0.attn.norm", "blocks.0.attn.logits",
                           "blocks.0.attn.out", "blocks.0.mid", "blocks.0.ffn.norm", "blocks.0.ffn.preact",
                           "blocks.0.ffn.postact", "blocks.0.ffn.out", "blocks.0.out", "final_norm.out", "head.logits"})
    EXPECT_FALSE(row_with(result.out, name).empty()) << name << " missing from\n" << result.out;
  // depth, block, kind, name, var, mean, corr, backward var, and the finite-width band (a normed transformer has
  // one): log-var sd, 95% low, 95% high.
  const std::vector<std::string> row = row_with(result.out, "blocks.0.out");
  ASSERT_EQ(row.size(), 11u) << result.out;
  const double sd = std::strtod(row[8].c_str(), nullptr), low = std::strtod(row[9].c_str(), nullptr),
               high = std::strtod(row[10].c_str(), nullptr);
  EXPECT_TRUE(sd > 0 && sd < 1) << row[8];
  EXPECT_LT(low, std::strtod(row[4].c_str(), nullptr));
  EXPECT_GT(high, std::strtod(row[4].c_str(), nullptr));
  EXPECT_TRUE(contains(result.out, "finite-width band")) << result.out;
  EXPECT_EQ(row[1], "0");
  EXPECT_EQ(row[2], "residual");
  char* end = nullptr;
  const double var = std::strtod(row[4].c_str(), &end);
  EXPECT_EQ(*end, '\0') << row[4];
  EXPECT_TRUE(std::isfinite(var) && var > 0) << row[4];
  EXPECT_TRUE(contains(result.out, "measured on the first training batch")) << result.out;
  EXPECT_TRUE(result.err.empty()) << result.err;
}

TEST_F(TheoryCli, GivenInputCorrIsUsedAndShown) {
  write_file("tiny.toml", std::string(kTinyStudy) + "\n[theory]\ninput_corr = 0.5\n");
  const CliResult result = run({"theory", "tiny.toml"});
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  EXPECT_TRUE(contains(result.out, "0.5 (theory.input_corr)")) << result.out;
  // The embedding output's predicted token correlation is the given one.
  const std::vector<std::string> row = row_with(result.out, "embed.out");
  ASSERT_EQ(row.size(), 11u) << result.out;
  EXPECT_NEAR(std::strtod(row[6].c_str(), nullptr), 0.5, 1e-6) << result.out;
}

TEST_F(TheoryCli, ThousandLayerTransformerPrintsQuickly) {
  std::string study = kTinyStudy;
  study.replace(study.find("layers = 1\n"), 11, "layers = 1000\n");
  write_file("deep.toml", study);
  const auto start = std::chrono::steady_clock::now();
  const CliResult result = run({"theory", "deep.toml"});
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "[ timing   ] proplab theory on a 1000-layer transformer (width 16, heads 2): " << seconds << " s\n";
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  EXPECT_FALSE(row_with(result.out, "blocks.999.out").empty());
  EXPECT_TRUE(row_with(result.out, "blocks.1000.out").empty());
  // The model is never built, so this takes well under a second; the bound leaves room for a loaded machine.
  EXPECT_LT(seconds, 10.0);
}

TEST_F(TheoryCli, CriticalTanhMlpPrintsTheMeanFieldSummary) {
  write_file("mlp.toml", R"(name = "mlp"
[model]
type = "mlp"
layers = 6
width = 32
input_dim = 8
activation = "tanh"
sigma_w2 = 1.0
sigma_b2 = 0.0
[train]
batch = 8
)");
  const CliResult result = run({"theory", "mlp.toml"});
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  EXPECT_TRUE(contains(result.out, "mean field of the hidden layers")) << result.out;
  const double q_star = labelled_number(result.out, "q*");
  const double chi1 = labelled_number(result.out, "χ₁");
  EXPECT_TRUE(std::isfinite(q_star)) << result.out;
  EXPECT_NEAR(q_star, 0.0, 1e-3) << result.out;  // tanh with σ_b² = 0: q decays to the fixed point 0
  EXPECT_NEAR(chi1, 1.0, 1e-3) << result.out;    // σ_w²·tanh'(0)² = 1
  EXPECT_TRUE(contains(result.out, "phase:")) << result.out;
  EXPECT_TRUE(contains(result.out, "critical, at the edge of chaos")) << result.out;
  EXPECT_FALSE(row_with(result.out, "postact").empty()) << result.out;
  // The finite-width band: log-var sd and the 95% range of one network's var, which contains the prediction and
  // widens with depth.
  EXPECT_TRUE(contains(result.out, "log-var sd")) << result.out;
  EXPECT_TRUE(contains(result.out, "finite-width band:")) << result.out;
  const std::vector<std::string> first = row_with(result.out, "layers.1.preact");
  const std::vector<std::string> last = row_with(result.out, "layers.5.preact");
  ASSERT_EQ(first.size(), 11u) << result.out;
  ASSERT_EQ(last.size(), 11u) << result.out;
  const auto number = [](const std::string& text) { return std::strtod(text.c_str(), nullptr); };
  EXPECT_GT(number(last[8]), number(first[8])) << "the band widens with depth";
  EXPECT_LT(number(last[9]), number(last[4]));
  EXPECT_GT(number(last[10]), number(last[4]));
  EXPECT_NEAR(number(last[9]), number(last[4]) * std::exp(-0.5 * number(last[8]) * number(last[8]) -
                                                           1.96 * number(last[8])),
              1e-6 * number(last[4]));
}

TEST_F(TheoryCli, CompareWithAnMlpRunCountsProbesInsideTheBand) {
  write_file("mlp.toml", R"(name = "mlp"
[model]
type = "mlp"
layers = 8
width = 64
input_dim = 16
[train]
steps = 1
batch = 16
)");
  const CliResult trained = run({"run", "mlp.toml", "--out", "out"});
  ASSERT_EQ(trained.exit_code, 0) << describe(trained);
  const CliResult result = run({"theory", "mlp.toml", "--compare", "out/mlp.h5"});
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  const auto at = result.out.rfind("finite-width band: ");  // the comparison's line, after the explanation
  ASSERT_NE(at, std::string::npos) << result.out;
  std::istringstream line(result.out.substr(at + 19));
  int inside = -1, banded = -1;
  std::string of;
  line >> inside >> of >> banded;
  EXPECT_EQ(banded, 17) << "8 preacts, 8 postacts and the readout";
  EXPECT_GE(inside, 0);
  EXPECT_LE(inside, banded);
}

TEST_F(TheoryCli, CompareWithARunOfTheStudyPrintsTheSummary) {
  write_file("tiny.toml", kTinyStudy);
  const CliResult trained = run({"run", "tiny.toml", "--out", "out"});
  ASSERT_EQ(trained.exit_code, 0) << describe(trained);
  const CliResult result = run({"theory", "tiny.toml", "--compare", "out/tiny.h5"});
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  EXPECT_TRUE(contains(result.out, "record at step 0")) << result.out;
  // Each probe has its measured row: name, then measured/predicted/rel.err for var, corr, backward var and
  // backward corr.
  const std::vector<std::string> rows = {"embed.out", "blocks.0.mid", "blocks.0.out", "head.logits"};
  for (const auto& name : rows) {
    std::istringstream in(result.out.substr(result.out.find("compared with")));
    bool found = false;
    for (std::string line; std::getline(in, line);) {
      const std::vector<std::string> row = words(line);
      if (row.empty() || row[0] != name) continue;
      found = true;
      EXPECT_EQ(row.size(), 13u) << line;
      EXPECT_TRUE(std::isfinite(std::strtod(row[1].c_str(), nullptr))) << line;  // measured var
      if (name == "blocks.0.out") {  // the gradient's token correlation is predicted for the stream
        EXPECT_TRUE(std::isfinite(std::strtod(row[11].c_str(), nullptr))) << line;
      }
    }
    EXPECT_TRUE(found) << name << " has no comparison row:\n" << result.out;
  }
  const auto summary = result.out.find("residual stream (");
  ASSERT_NE(summary, std::string::npos) << result.out;
  const std::string line = result.out.substr(summary, result.out.find('\n', summary) - summary);
  EXPECT_TRUE(contains(line, "forward var median ")) << line;
  EXPECT_TRUE(contains(line, "backward var median ")) << line;
  EXPECT_TRUE(contains(line, "worst ")) << line;
  // The residual stream of the one-block model: blocks.0.in, blocks.0.mid and blocks.0.out.
  EXPECT_TRUE(contains(line, "residual stream (3 probes)")) << line;
  const double forward_median = std::strtod(line.c_str() + line.find("forward var median ") + 19, nullptr);
  EXPECT_TRUE(forward_median >= 0 && forward_median < 0.5) << line;  // a loose sanity bound
}

TEST_F(TheoryCli, CompareWithARunOfAnotherStudyIsRefused) {
  std::string other = kTinyStudy;
  other.replace(other.find("layers = 1\n"), 11, "layers = 2\n");
  other.replace(other.find("name = \"tiny\""), 13, "name = \"other\"");
  write_file("other.toml", other);
  write_file("tiny.toml", kTinyStudy);
  const CliResult trained = run({"run", "other.toml", "--out", "out"});
  ASSERT_EQ(trained.exit_code, 0) << describe(trained);
  const CliResult result = expect_bad_input({"theory", "tiny.toml", "--compare", "out/other.h5"},
                                            {"proplab: error: ", "out/other.h5", "not those of the study's model"});
  EXPECT_TRUE(result.out.empty()) << result.out;
}

TEST_F(TheoryCli, CompareWithAMissingRunIsRefused) {
  write_file("tiny.toml", kTinyStudy);
  expect_bad_input({"theory", "tiny.toml", "--compare", "nothing.h5"}, {"proplab: error: ", "nothing.h5"});
}

TEST_F(TheoryCli, BadStudyIsRefused) {
  std::string study = kTinyStudy;
  study.replace(study.find("layers = 1\n"), 11, "layers = 0\n");
  write_file("bad.toml", study);
  const CliResult result = expect_bad_input({"theory", "bad.toml"}, {"proplab: error: ", "model.layers"});
  EXPECT_TRUE(result.out.empty()) << result.out;
  write_file("sweep.toml", std::string(kTinyStudy) + "\n[sweep]\n\"model.layers\" = [1, 2]\n");
  expect_bad_input({"theory", "sweep.toml"}, {"proplab: error: ", "[sweep]"});
  expect_bad_input({"theory", "tiny_missing.toml"}, {"proplab: error: ", "cannot read the study file"});
  write_file("tiny.toml", kTinyStudy);
  expect_bad_input({"theory", "tiny.toml", "--set", "model.width=17"}, {"model.heads"});
}

}  // namespace proplab
