// Tests for the study's [theory] table (study/study.h): input_corr is optional, range-checked, transformer-only,
// written to the resolved study only when given, and copied into the RunSpec (study/run_spec.h).
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "study/run_spec.h"
#include "study/study.h"

namespace proplab {

namespace {

Study parse(const std::string& text, const std::vector<std::string>& overrides = {}) {
  return parse_study(text, "theory.toml", ".", overrides);
}

std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    parse(text, overrides);
  } catch (const UserError& error) {
    return error.what();
  }
  ADD_FAILURE() << "expected a UserError for\n" << text;
  return {};
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST(StudyTheory, InputCorrIsAbsentByDefaultAndLeftOutOfTheResolvedStudy) {
  const Study study = parse("name = \"t\"\n");
  EXPECT_FALSE(study.theory.input_corr.has_value());
  EXPECT_FALSE(contains(study.config_toml, "[theory]")) << study.config_toml;
  EXPECT_FALSE(contains(study.config_toml, "input_corr")) << study.config_toml;
  EXPECT_FALSE(to_run_spec(study).theory.input_corr.has_value());
}

TEST(StudyTheory, InputCorrIsReadWrittenBackAndCopiedToTheRunSpec) {
  const Study study = parse("name = \"t\"\n[theory]\ninput_corr = 0.25\n");
  ASSERT_TRUE(study.theory.input_corr.has_value());
  EXPECT_EQ(*study.theory.input_corr, 0.25);
  EXPECT_TRUE(contains(study.config_toml, "\n[theory]\ninput_corr = 0.25\n")) << study.config_toml;
  const Study again = parse_study(study.config_toml, "resolved.toml", ".");
  ASSERT_TRUE(again.theory.input_corr.has_value());
  EXPECT_EQ(*again.theory.input_corr, 0.25);
  EXPECT_EQ(again.config_toml, study.config_toml);
  const RunSpec spec = to_run_spec(study);
  ASSERT_TRUE(spec.theory.input_corr.has_value());
  EXPECT_EQ(*spec.theory.input_corr, 0.25);
}

TEST(StudyTheory, IntegersAndTheEndsOfTheRangeAreAccepted) {
  EXPECT_EQ(*parse("name = \"t\"\n[theory]\ninput_corr = 1\n").theory.input_corr, 1.0);
  EXPECT_EQ(*parse("name = \"t\"\n[theory]\ninput_corr = -1.0\n").theory.input_corr, -1.0);
  EXPECT_EQ(*parse("name = \"t\"\n", {"theory.input_corr=0.5"}).theory.input_corr, 0.5);
}

TEST(StudyTheory, BadValuesAreReportedWithLineAndRange) {
  std::string message = error_of("name = \"t\"\n[theory]\ninput_corr = 1.5\n");
  EXPECT_TRUE(contains(message, "theory.toml:3: theory.input_corr: 1.5 is out of range; allowed: a number in [-1, 1]"))
      << message;
  message = error_of("name = \"t\"\n[theory]\ninput_corr = \"high\"\n");
  EXPECT_TRUE(contains(message, "theory.input_corr: expected a number, got string \"high\"")) << message;
  message = error_of("name = \"t\"\n[theory]\ninput_cor = 0.1\n");
  EXPECT_TRUE(contains(message, "theory.input_cor: unknown key (did you mean `input_corr`?)")) << message;
  message = error_of("name = \"t\"\ntheory = 3\n");
  EXPECT_TRUE(contains(message, "theory: expected a table, got integer 3")) << message;
}

TEST(StudyTheory, InputCorrBelongsToTransformers) {
  const std::string message = error_of("name = \"m\"\n[model]\ntype = \"mlp\"\n[theory]\ninput_corr = 0.1\n");
  EXPECT_TRUE(contains(message, "theory.input_corr: only valid when model.type = \"transformer\"")) << message;
}

}  // namespace proplab
