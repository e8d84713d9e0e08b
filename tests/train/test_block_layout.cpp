// The stage layout in run files (/blocks, docs/run-format.md): a ResNet's run file says which stage each block is in
// and which blocks are transitions, matching the model (Resnet::transition) and its probes' blocks; a transformer's
// and an MLP's run files have no /blocks; a layout that does not cover the probes' blocks is refused.
#include <gtest/gtest.h>

#include <algorithm>

#include "core/error.h"
#include "io/run_reader.h"
#include "models/resnet.h"
#include "support/temp_dir.h"
#include "train/recorder.h"
#include "train/trainer.h"

namespace proplab {
namespace {

RunSpec tiny_resnet_spec() {
  RunSpec spec;
  spec.name = "stages";
  spec.seed = 5;
  spec.model.set_kind(ModelKind::resnet);
  spec.model.resnet().depth = 14;  // 2 basic blocks per stage: transitions at blocks 2 and 4
  spec.model.resnet().image_size = 8;
  spec.data.kind = "images";
  spec.train.optimizer = OptimizerKind::sgd;
  spec.train.steps = 2;
  spec.train.batch = 2;
  spec.train.eval_every = 0;
  spec.config_toml = "name = \"stages\"";
  return spec;
}

TEST(BlockLayout, ResnetRunFileHoldsItsStagesAndTransitions) {
  testing::TempDir dir;
  const RunSpec spec = tiny_resnet_spec();
  RunOptions options;
  options.out_dir = dir.path();
  ASSERT_EQ(run_training(spec, options).status, RunStatus::completed);

  const Resnet model(spec.model.resnet(), spec.scaling, spec.seed);
  const std::vector<BlockInfo> layout = model.block_layout();
  ASSERT_EQ(static_cast<int>(layout.size()), model.blocks());
  const RunReader reader = RunReader::open(run_file_path(dir.path(), "stages"));
  EXPECT_EQ(reader.read_ints("/blocks/stage"), (std::vector<std::int64_t>{0, 0, 1, 1, 2, 2}));
  EXPECT_EQ(reader.read_ints("/blocks/transition"), (std::vector<std::int64_t>{0, 0, 1, 0, 1, 0}));
  const std::vector<RunBlock> blocks = reader.read_block_layout();
  ASSERT_EQ(blocks.size(), 6u);
  for (int b = 0; b < model.blocks(); ++b) {
    EXPECT_EQ(blocks[b].transition, model.transition(b)) << b;
    EXPECT_EQ(blocks[b].stage, layout[b].stage) << b;
  }
  // Every probe's block indexes /blocks (or is -1: the stem and the head).
  const std::vector<std::int64_t> probe_blocks = reader.read_ints("/probes/block");
  EXPECT_EQ(*std::max_element(probe_blocks.begin(), probe_blocks.end()), 5);
  EXPECT_EQ(probe_blocks.front(), -1);
  EXPECT_EQ(probe_blocks.back(), -1);
}

TEST(BlockLayout, ModelsWithoutStagesWriteNone) {
  testing::TempDir dir;
  RunOptions options;
  options.out_dir = dir.path();
  RunSpec transformer;
  transformer.name = "lm";
  transformer.model.set_kind(ModelKind::transformer);
  transformer.model.transformer().layers = 2;
  transformer.model.transformer().width = 16;
  transformer.model.transformer().heads = 2;
  transformer.model.transformer().vocab = 16;
  transformer.model.transformer().seq_len = 8;
  transformer.data.kind = "markov";
  transformer.train.steps = 2;
  transformer.train.batch = 2;
  transformer.train.eval_every = 0;
  transformer.config_toml = "name = \"lm\"";
  ASSERT_EQ(run_training(transformer, options).status, RunStatus::completed);
  const RunReader reader = RunReader::open(run_file_path(dir.path(), "lm"));
  EXPECT_FALSE(reader.exists("/blocks"));
  EXPECT_TRUE(reader.read_block_layout().empty());
  EXPECT_TRUE(make_model(transformer.model, transformer.scaling, 1)->block_layout().empty());
}

TEST(BlockLayout, ALayoutThatMissesAProbesBlockIsRefused) {
  testing::TempDir dir;
  const RunSpec spec = tiny_resnet_spec();
  Resnet model(spec.model.resnet(), spec.scaling, spec.seed);
  Recorder recorder(spec.record, model.probes(), model.params(), 2);
  RunHeader header;
  header.proplab_version = "test";
  RunWriter writer = RunWriter::create(dir.path() / "short.h5", header, false);
  std::vector<BlockInfo> layout = model.block_layout();
  layout.pop_back();
  EXPECT_THROW(recorder.write_block_layout(writer, layout), InternalError);
  recorder.write_block_layout(writer, {});  // no stages: nothing written
  writer.start();
  writer.finish(RunStatus::completed, "");
  EXPECT_FALSE(RunReader::open(dir.path() / "short.h5").exists("/blocks"));
}

}  // namespace
}  // namespace proplab
