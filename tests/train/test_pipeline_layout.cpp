// train/pipeline: the checks of a pipeline layout against the study (each error names the key and what is
// allowed) and the FLOP-balanced split of the transformer's blocks into stages.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "dist/communicator.h"
#include "train/pipeline.h"

namespace proplab {
namespace {

RunSpec pipeline_spec(int pp, int microbatches) {
  RunSpec spec;
  spec.model.set_kind(ModelKind::transformer);
  spec.model.transformer().layers = 4;
  spec.train.batch = 8;
  spec.train.grad_accum = 2;
  spec.parallel.pp = pp;
  spec.parallel.microbatches = microbatches;
  return spec;
}

std::string error_of(const RunSpec& spec, int replicas = 1) {
  try {
    check_pipeline_layout(spec, nullptr, replicas);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(PipelineLayout, ErrorsNameTheKeyAndWhatIsAllowed) {
  EXPECT_NE(error_of(pipeline_spec(1, 2)).find("parallel.microbatches = 2 applies to pipeline parallelism only"),
            std::string::npos);
  RunSpec mlp = pipeline_spec(2, 2);
  mlp.model.set_kind(ModelKind::mlp);
  EXPECT_NE(error_of(mlp).find("parallel.pp = 2: pipeline parallelism is built for the transformer only; allowed: "
                               "pp = 1 for model.type = \"mlp\""),
            std::string::npos);
  EXPECT_NE(error_of(pipeline_spec(5, 10)).find("needs at least 5 transformer blocks, but model.layers = 4"),
            std::string::npos);
  EXPECT_NE(error_of(pipeline_spec(2, 3)).find("parallel.microbatches = 3 must be a multiple of train.grad_accum = 2"),
            std::string::npos);
  // 8 rows / 2 micro-batches / dp 2 = 2 rows, cut into 6 / 2 = 3 pieces.
  EXPECT_NE(error_of(pipeline_spec(2, 6), 2).find("into 3 pieces, but 3 does not divide 2"), std::string::npos);
  // A correct layout started as one process.
  EXPECT_NE(error_of(pipeline_spec(2, 4)).find("parallel.pp = 2 needs dp·tp·pp·sp = 2 processes (mpirun -np 2"),
            std::string::npos);
  EXPECT_EQ(error_of(pipeline_spec(1, 1)), "");
}

TEST(PipelineLayout, StagesBalanceTheBlocksAndTheHead) {
  TransformerConfig config;
  config.layers = 3;
  config.width = 32;
  config.ffn_mult = 4;
  config.seq_len = 16;
  config.vocab = 32;
  // A block costs 13 312 multiply-adds per token, the head 1 024: the last stage takes one block.
  EXPECT_EQ(pipeline_stage_blocks(config, 2), (std::vector<int>{0, 2, 3}));
  EXPECT_EQ(pipeline_stage_blocks(config, 3), (std::vector<int>{0, 1, 2, 3}));
  // Eight blocks and a head worth one: 5 | 3 + 1 and 4 | 4 + 1 tie at 5; ties put the blocks on earlier stages.
  config.layers = 8;
  config.vocab = 13312 / 32;
  EXPECT_EQ(pipeline_stage_blocks(config, 2), (std::vector<int>{0, 5, 8}));
  // A head worth four blocks: 6 | 2 + 4.
  config.vocab = 4 * 13312 / 32;  // head = four blocks
  EXPECT_EQ(pipeline_stage_blocks(config, 2), (std::vector<int>{0, 6, 8}));
}

}  // namespace
}  // namespace proplab
