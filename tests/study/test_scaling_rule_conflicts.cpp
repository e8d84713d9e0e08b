// A study whose [model] conflicts with what its scaling rule fixes fails at load, reported at scaling.rule with
// the rule's own message (model.norm, its value, what the rule requires).
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "study/study.h"

namespace proplab {

namespace {

std::string load_error(const std::string& text) {
  try {
    parse_study(text, "test.toml", ".", {});
  } catch (const UserError& error) {
    return error.what();
  }
  ADD_FAILURE() << "expected a UserError for:\n" << text;
  return {};
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST(StudyScalingRules, ReZeroWithPreNormFailsAtLoadNamingModelNorm) {
  const std::string message = load_error("name = \"x\"\n[model]\nnorm = \"pre\"\n[scaling]\nrule = \"rezero\"\n");
  EXPECT_TRUE(contains(message,
                       "test.toml:5: scaling.rule: rule \"rezero\" rejects this study: model.norm = \"pre\" "
                       "conflicts with scaling rule \"rezero\", which requires model.norm = \"none\""))
      << message;
  EXPECT_TRUE(contains(message, "; allowed: model.norm = \"none\"")) << message;
  // The default placement (pre) conflicts too; none is accepted, with the rule's parameter.
  EXPECT_TRUE(contains(load_error("name = \"x\"\n[scaling]\nrule = \"rezero\"\n"), "model.norm = \"pre\""));
  const Study study = parse_study(
      "name = \"x\"\n[model]\nnorm = \"none\"\n[scaling]\nrule = \"rezero\"\nalpha0 = 0.1\n", "test.toml", ".", {});
  EXPECT_EQ(study.scaling.rule, "rezero");
  EXPECT_EQ(study.scaling.params.at("alpha0"), 0.1);
}

TEST(StudyScalingRules, OtherRuleConflictsAreReportedAtLoad) {
  const std::string deepnorm = load_error("name = \"x\"\n[scaling]\nrule = \"deepnorm\"\n");
  EXPECT_TRUE(contains(deepnorm,
                       "model.norm = \"pre\" conflicts with scaling rule \"deepnorm\", which requires "
                       "model.norm = \"post\""))
      << deepnorm;
  const std::string tfixup = load_error("name = \"x\"\n[model]\nnorm = \"post\"\n[scaling]\nrule = \"tfixup\"\n");
  EXPECT_TRUE(contains(tfixup, "requires model.norm = \"none\"")) << tfixup;
  const std::string form =
      load_error("name = \"x\"\n[model]\nnorm = \"post\"\n[scaling]\nrule = \"deepnorm\"\nform = 0.5\n");
  EXPECT_TRUE(contains(form, "scaling.form: 0.5 is not a whole number")) << form;
  const std::string mlp = load_error("name = \"x\"\n[model]\ntype = \"mlp\"\n[scaling]\nrule = \"skipinit\"\n");
  EXPECT_TRUE(contains(mlp, "model.residual = false: scaling rule \"skipinit\"")) << mlp;
}

TEST(StudyScalingRules, AdminRequiresPostNormAndWholeProfileSequences) {
  const std::string pre = load_error("name = \"x\"\n[scaling]\nrule = \"admin\"\n");
  EXPECT_TRUE(contains(pre,
                       "scaling.rule: rule \"admin\" rejects this study: model.norm = \"pre\" conflicts with scaling "
                       "rule \"admin\", which requires model.norm = \"post\""))
      << pre;
  EXPECT_TRUE(contains(pre, "; allowed: model.norm = \"post\"")) << pre;
  const std::string none = load_error("name = \"x\"\n[model]\nnorm = \"none\"\n[scaling]\nrule = \"admin\"\n");
  EXPECT_TRUE(contains(none, "model.norm = \"none\" conflicts with scaling rule \"admin\"")) << none;
  const std::string sequences =
      load_error("name = \"x\"\n[model]\nnorm = \"post\"\n[scaling]\nrule = \"admin\"\nprofile_sequences = 2.5\n");
  EXPECT_TRUE(contains(sequences, "scaling.profile_sequences: 2.5 is not a whole number")) << sequences;
  const std::string mlp = load_error("name = \"x\"\n[model]\ntype = \"mlp\"\n[scaling]\nrule = \"admin\"\n");
  EXPECT_TRUE(contains(mlp, "scaling rule \"admin\" is defined for Post-LN transformers only")) << mlp;
  const Study study = parse_study(
      "name = \"x\"\n[model]\nnorm = \"post\"\n[scaling]\nrule = \"admin\"\nprofile_sequences = 4\n"
      "learnable = true\n",
      "test.toml", ".", {});
  EXPECT_EQ(study.scaling.rule, "admin");
  EXPECT_EQ(study.scaling.params.at("profile_sequences"), 4);
  EXPECT_EQ(study.scaling.params.at("learnable"), 1);
}

TEST(StudyScalingRules, KeelRequiresBothNorms) {
  // model.norm = "both" is a placement of its own; keel needs it and rejects the others at load.
  const Study both =
      parse_study("name = \"x\"\n[model]\nnorm = \"both\"\n[scaling]\nrule = \"keel\"\n", "test.toml", ".", {});
  EXPECT_EQ(both.model.transformer().norm, NormPlacement::both);
  EXPECT_EQ(both.scaling.rule, "keel");
  EXPECT_EQ(both.scaling.params.at("alpha"), 0.0);
  EXPECT_EQ(both.scaling.params.at("base_std"), 0.02);
  const std::string post = load_error("name = \"x\"\n[model]\nnorm = \"post\"\n[scaling]\nrule = \"keel\"\n");
  EXPECT_TRUE(contains(post,
                       "test.toml:5: scaling.rule: rule \"keel\" rejects this study: model.norm = \"post\" conflicts "
                       "with scaling rule \"keel\", which requires model.norm = \"both\""))
      << post;
  EXPECT_TRUE(contains(post, "; allowed: model.norm = \"both\"")) << post;
  EXPECT_TRUE(contains(load_error("name = \"x\"\n[scaling]\nrule = \"keel\"\n"), "model.norm = \"pre\" conflicts"));
  // A rule that fixes another placement rejects both.
  const std::string deepnorm = load_error("name = \"x\"\n[model]\nnorm = \"both\"\n[scaling]\nrule = \"deepnorm\"\n");
  EXPECT_TRUE(contains(deepnorm, "model.norm = \"both\" conflicts with scaling rule \"deepnorm\"")) << deepnorm;
  // Rules that fix no placement accept it.
  const Study standard = parse_study("name = \"x\"\n[model]\nnorm = \"both\"\n", "test.toml", ".", {});
  EXPECT_EQ(standard.model.transformer().norm, NormPlacement::both);
}

}  // namespace proplab
