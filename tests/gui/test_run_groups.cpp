// Filtering, grouping and diffing runs by config (pure functions over snapshots built in memory).
#include <gtest/gtest.h>

#include "gui/data/run_groups.h"

namespace proplab::gui {
namespace {

std::shared_ptr<const RunSnapshot> make_run(const std::string& name, std::map<std::string, std::string> config,
                                            RunStatus status = RunStatus::completed) {
  auto run = std::make_shared<RunSnapshot>();
  run->name = name;
  run->path = "/runs/" + name + ".h5";
  run->status = status;
  run->config = std::move(config);
  return run;
}

RunList sample_runs() {
  return {make_run("pre_standard", {{"model.layers", "48"}, {"model.norm", "pre"}, {"scaling.rule", "standard"}}),
          make_run("post_standard", {{"model.layers", "48"}, {"model.norm", "post"}, {"scaling.rule", "standard"}},
                   RunStatus::diverged),
          make_run("dslm_12", {{"model.layers", "12"}, {"model.norm", "pre"}, {"scaling.rule", "deepscalelm"}}),
          make_run("dslm_100", {{"model.layers", "100"}, {"model.norm", "pre"}, {"scaling.rule", "deepscalelm"}},
                   RunStatus::running),
          make_run("no_rule", {{"model.layers", "9"}, {"model.norm", "pre"}})};
}

TEST(RunGroups, GroupsByAConfigKey) {
  const RunList runs = sample_runs();
  const std::vector<std::size_t> all = {0, 1, 2, 3, 4};
  const auto by_rule = group_runs(runs, all, "scaling.rule");
  ASSERT_EQ(by_rule.size(), 3u);
  EXPECT_EQ(by_rule[0].value, "deepscalelm");
  EXPECT_EQ(by_rule[0].members, (std::vector<std::size_t>{2, 3}));
  EXPECT_EQ(by_rule[1].value, "standard");
  EXPECT_EQ(by_rule[1].members, (std::vector<std::size_t>{0, 1}));
  EXPECT_EQ(by_rule[2].value, unset_value);  // unset sorts last
  EXPECT_EQ(by_rule[2].members, (std::vector<std::size_t>{4}));

  // Numbers sort as numbers (9 < 12 < 48 < 100), not as text.
  const auto by_layers = group_runs(runs, all, "model.layers");
  ASSERT_EQ(by_layers.size(), 4u);
  EXPECT_EQ(by_layers[0].value, "9");
  EXPECT_EQ(by_layers[1].value, "12");
  EXPECT_EQ(by_layers[2].value, "48");
  EXPECT_EQ(by_layers[2].members.size(), 2u);
  EXPECT_EQ(by_layers[3].value, "100");

  // Only the chosen runs take part; no key: one group.
  const auto some = group_runs(runs, {1, 4}, "model.norm");
  ASSERT_EQ(some.size(), 2u);
  EXPECT_EQ(some[0].value, "post");
  EXPECT_EQ(some[1].members, (std::vector<std::size_t>{4}));
  const auto one = group_runs(runs, {0, 2}, "");
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].members, (std::vector<std::size_t>{0, 2}));
}

TEST(RunGroups, DifferingKeysAreTheColumnsWorthShowing) {
  const RunList runs = sample_runs();
  EXPECT_EQ(config_keys(runs), (std::vector<std::string>{"model.layers", "model.norm", "scaling.rule"}));
  EXPECT_EQ(differing_config_keys(runs), (std::vector<std::string>{"model.layers", "model.norm", "scaling.rule"}));
  const RunList pre_only = {runs[0], runs[2], runs[3]};
  EXPECT_EQ(differing_config_keys(pre_only), (std::vector<std::string>{"model.layers", "scaling.rule"}));
  // Missing in one run counts as different.
  const RunList with_missing = {runs[2], runs[4]};
  EXPECT_EQ(differing_config_keys(with_missing), (std::vector<std::string>{"model.layers", "scaling.rule"}));
  EXPECT_TRUE(differing_config_keys({runs[0]}).empty());
}

TEST(RunGroups, ConfigDiffListsChangedAddedAndRemovedKeys) {
  const std::map<std::string, std::string> left = {{"a", "1"}, {"b", "2"}, {"c", "3"}};
  const std::map<std::string, std::string> right = {{"b", "2"}, {"c", "4"}, {"d", "5"}};
  const auto diff = config_diff(left, right);
  ASSERT_EQ(diff.size(), 3u);
  EXPECT_EQ(diff[0].key, "a");
  EXPECT_EQ(diff[0].left, "1");
  EXPECT_FALSE(diff[0].right.has_value());
  EXPECT_EQ(diff[1].key, "c");
  EXPECT_EQ(diff[1].left, "3");
  EXPECT_EQ(diff[1].right, "4");
  EXPECT_EQ(diff[2].key, "d");
  EXPECT_FALSE(diff[2].left.has_value());
  EXPECT_EQ(diff[2].right, "5");
  EXPECT_TRUE(config_diff(left, left).empty());
}

TEST(RunGroups, FilterMatchesNameStatusAndConfigCaseInsensitively) {
  const RunList runs = sample_runs();
  EXPECT_TRUE(run_matches_filter(*runs[0], ""));
  EXPECT_TRUE(run_matches_filter(*runs[0], "PRE_Stan"));
  EXPECT_FALSE(run_matches_filter(*runs[0], "post"));
  EXPECT_TRUE(run_matches_filter(*runs[1], "diverged"));
  EXPECT_TRUE(run_matches_filter(*runs[3], "running"));
  EXPECT_TRUE(run_matches_filter(*runs[2], "rule=deepscale"));
  EXPECT_TRUE(run_matches_filter(*runs[3], "layers=100"));
  EXPECT_FALSE(run_matches_filter(*runs[2], "layers=100"));
  EXPECT_TRUE(run_matches_filter(*runs[4], "/runs/no_rule"));
}

}  // namespace
}  // namespace proplab::gui
