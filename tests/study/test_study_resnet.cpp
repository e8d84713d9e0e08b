// [model] type = "resnet" in study files: its keys, its image data kinds and the ResNet rules' conflicts.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "study/study.h"
#include "support/temp_dir.h"

namespace proplab {
namespace {

std::string error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const UserError& error) {
    return error.what();
  }
  ADD_FAILURE() << "expected a UserError";
  return {};
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(StudyResnet, ParsesTheResnetKeysAndDefaultsToGaussianImages) {
  const Study study = parse_study(R"(name = "r"
[model]
type = "resnet"
depth = 56
width = 2
block = "basic"
norm = "none"
preact = true
activation = "gelu"
in_channels = 1
image_size = 28
classes = 10
[scaling]
rule = "nf"
alpha = 0.3
)",
                                  "test.toml", ".");
  EXPECT_EQ(study.model.kind(), ModelKind::resnet);
  EXPECT_EQ(study.model.resnet().depth, 56);
  EXPECT_EQ(study.model.resnet().width, 2);
  EXPECT_EQ(study.model.resnet().norm, ResnetNorm::none);
  EXPECT_TRUE(study.model.resnet().preact);
  EXPECT_EQ(study.model.resnet().activation, Activation::gelu_tanh);
  EXPECT_EQ(study.model.resnet().image_size, 28);
  EXPECT_EQ(study.data.kind, "images");
  EXPECT_EQ(study.scaling.params.at("alpha"), 0.3);
}

TEST(StudyResnet, ImageDataKindsAndDirectories) {
  testing::TempDir dir;
  const Study study = parse_study("name = \"r\"\n[model]\ntype = \"resnet\"\n[data]\nkind = \"idx\"\npath = \"" +
                                      dir.path().string() + "\"\naugment = false\ncrop_padding = 2\nflip = false\n",
                                  "test.toml", ".");
  EXPECT_EQ(study.data.kind, "idx");
  EXPECT_FALSE(study.data.augment);
  EXPECT_EQ(study.data.crop_padding, 2);
  EXPECT_FALSE(study.data.flip);
  const std::string not_dir = error_of([] {
    parse_study("name = \"r\"\n[model]\ntype = \"resnet\"\n[data]\nkind = \"cifar10\"\npath = \"/nonexistent/c\"\n",
                "test.toml", ".");
  });
  EXPECT_TRUE(contains(not_dir, "test.toml:6: data.path: \"/nonexistent/c\" is not a directory")) << not_dir;
  EXPECT_TRUE(contains(not_dir, "data_batch_1..5.bin")) << not_dir;
  const std::string tokens = error_of(
      [] { parse_study("name = \"r\"\n[model]\ntype = \"resnet\"\n[data]\nkind = \"markov\"\n", "test.toml", "."); });
  EXPECT_TRUE(contains(tokens, "data.kind: \"markov\" does not make images, which a resnet reads")) << tokens;
  const std::string images_for_mlp = error_of(
      [] { parse_study("name = \"r\"\n[model]\ntype = \"mlp\"\n[data]\nkind = \"images\"\n", "test.toml", "."); });
  EXPECT_TRUE(contains(images_for_mlp, "makes images, which only a resnet reads")) << images_for_mlp;
}

TEST(StudyResnet, RuleConflictsAndDepthAreReported) {
  const std::string nf_with_bn = error_of(
      [] { parse_study("name = \"r\"\n[model]\ntype = \"resnet\"\n[scaling]\nrule = \"nf\"\n", "test.toml", "."); });
  EXPECT_TRUE(contains(nf_with_bn, "model.norm = \"batchnorm\" conflicts with scaling rule \"nf\"")) << nf_with_bn;
  const std::string depth =
      error_of([] { parse_study("name = \"r\"\n[model]\ntype = \"resnet\"\ndepth = 21\n", "test.toml", "."); });
  EXPECT_TRUE(contains(depth, "test.toml:4: model.depth: 21 is not 6n + 2 for basic blocks")) << depth;
  const std::string fixup_transformer =
      error_of([] { parse_study("name = \"r\"\n[scaling]\nrule = \"fixup\"\n", "test.toml", "."); });
  EXPECT_TRUE(contains(fixup_transformer, "scaling rule \"fixup\" is defined for ResNets only")) << fixup_transformer;
}

}  // namespace
}  // namespace proplab
