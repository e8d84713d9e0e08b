// The [device] table at the command line: "cuda" without a CUDA build or a GPU, or for a run that cannot use one,
// is bad input (exit 2, naming device.type, nothing written); "auto" trains on the GPU when there is one and on the
// CPU otherwise, and the run file says which.
#include "cli/cli_test_support.h"
#include "core/tensor.h"
#include "io/run_reader.h"

namespace proplab::cli_test {
namespace {

bool built_with_cuda() {
#ifdef PROPLAB_WITH_CUDA
  return true;
#else
  return false;
#endif
}

TEST_F(CliTest, CudaWithoutBackendOrGpuIsBadInput) {
  if (cuda_available()) GTEST_SKIP() << "a GPU is present: device.type = \"cuda\" trains (see CudaRunRecordsTheGpu)";
  write_file("study.toml", kTinyStudy);
  const std::string why = built_with_cuda() ? "no CUDA GPU is present on this machine" : "has no CUDA backend";
  expect_bad_input({"run", "study.toml", "--set", "device.type=cuda"},
                   {"device.type = \"cuda\":", why, "allowed here: \"cpu\" or \"auto\""});
}

TEST_F(CliTest, CudaForFixupOrSeveralProcessesIsBadInput) {
  if (!built_with_cuda()) GTEST_SKIP() << "a build without CUDA refuses device.type = \"cuda\" first";
  write_file("study.toml", kTinyStudy);
  write_file("resnet.toml",
             "name = \"r\"\n[model]\ntype = \"resnet\"\ndepth = 8\nnorm = \"none\"\nimage_size = 8\n"
             "[scaling]\nrule = \"fixup\"\n[data]\nkind = \"images\"\n[train]\nsteps = 2\nbatch = 4\n"
             "[device]\ntype = \"cuda\"\n");
  expect_bad_input({"run", "resnet.toml"}, {"device.type = \"cuda\":", "scaling.rule = \"fixup\""});
  expect_bad_input({"run", "study.toml", "--set", "device.type=cuda", "--set", "parallel.dp=2"},
                   {"device.type = \"cuda\":", "one GPU per run in this version"});
}

TEST_F(CliTest, AutoTrainsOnTheCpuWithoutAGpuAndSaysSo) {
  if (cuda_available()) GTEST_SKIP() << "a GPU is present: auto chooses it (CudaRunRecordsTheGpu)";
  write_file("study.toml", kTinyStudy);
  const CliResult result = run({"run", "study.toml", "--set", "device.type=auto", "--out", "out"});
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  EXPECT_EQ(RunReader::open(work_ / "out" / "tiny.h5").attribute_string("device"), "cpu");
}

TEST_F(CliTest, CudaRunRecordsTheGpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU: nothing trains on one here";
  write_file("study.toml", kTinyStudy);
  const CliResult result = run({"run", "study.toml", "--set", "device.type=cuda", "--out", "out"});
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  const std::string device = RunReader::open(work_ / "out" / "tiny.h5").attribute_string("device");
  EXPECT_EQ(device.rfind("cuda:0 ", 0), 0u) << device;
}

}  // namespace
}  // namespace proplab::cli_test
