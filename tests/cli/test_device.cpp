// The [device] table at the command line: "cuda" without a CUDA build or a GPU, or for a run that cannot use one
// (a Fixup ResNet), is bad input (exit 2, naming device.type, nothing written); "auto" trains on the GPU when there is
// one and on the CPU otherwise, and the run file says which. device.precision = "bf16" needs the GPU: on the CPU (asked
// for, or what auto resolves to) it is bad input naming device.precision; the run file's precision attribute says which
// precision a run's matrix products used.
#include "cli/cli_test_support.h"
#include "core/tensor.h"
#include "io/run_reader.h"
#include "ops/gemm.h"

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

TEST_F(CliTest, CudaForFixupIsBadInput) {
  if (!built_with_cuda()) GTEST_SKIP() << "a build without CUDA refuses device.type = \"cuda\" first";
  write_file("study.toml", kTinyStudy);
  write_file("resnet.toml",
             "name = \"r\"\n[model]\ntype = \"resnet\"\ndepth = 8\nnorm = \"none\"\nimage_size = 8\n"
             "[scaling]\nrule = \"fixup\"\n[data]\nkind = \"images\"\n[train]\nsteps = 2\nbatch = 4\n"
             "[device]\ntype = \"cuda\"\n");
  expect_bad_input({"run", "resnet.toml"}, {"device.type = \"cuda\":", "scaling.rule = \"fixup\""});
}

TEST_F(CliTest, CudaLayoutsAreCheckedLikeCpuLayouts) {
  // A parallel layout on GPUs is allowed (tests/dist/check_cuda_parity.py runs them under mpirun); started as one
  // process it is refused as on the CPU, naming the processes it needs (or, without a GPU, the missing GPU).
  write_file("study.toml", kTinyStudy);
  const std::string why = !built_with_cuda() ? "has no CUDA backend"
                          : cuda_available() ? "needs 2 processes"
                                             : "no CUDA GPU is present on this machine";
  expect_bad_input({"run", "study.toml", "--set", "device.type=cuda", "--set", "parallel.dp=2"}, {why});
  // How device buffers travel is one of three transports.
  expect_bad_input({"run", "study.toml", "--set", "parallel.comm=infiniband"},
                   {"parallel.comm: \"infiniband\" is not a choice", "\"staged\""});
}

TEST_F(CliTest, AutoTrainsOnTheCpuWithoutAGpuAndSaysSo) {
  if (cuda_available()) GTEST_SKIP() << "a GPU is present: auto chooses it (CudaRunRecordsTheGpu)";
  write_file("study.toml", kTinyStudy);
  const CliResult result = run({"run", "study.toml", "--set", "device.type=auto", "--out", "out"});
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  const RunReader reader = RunReader::open(work_ / "out" / "tiny.h5");
  EXPECT_EQ(reader.attribute_string("device"), "cpu");
  // Which CPU libraries and kernels ran (they differ in the last bits): this process's, as ops reports them.
  const std::string kernels = reader.attribute_string("kernels");
  EXPECT_EQ(kernels.rfind("sgemm: " + ops::gemm_backend_name() + "; conv: ", 0), 0u) << kernels;
}

TEST_F(CliTest, Bf16OnTheCpuIsBadInput) {
  write_file("study.toml", kTinyStudy);
  expect_bad_input({"run", "study.toml", "--set", "device.type=cpu", "--set", "device.precision=bf16"},
                   {"device.precision = \"bf16\":", "device.type = \"cpu\"", "allowed on the CPU: \"fp32\""});
  write_file("bf16.toml", replaced(kTinyStudy, "threads = 1\n", "threads = 1\nprecision = \"bf16\"\n"));
  expect_bad_input({"run", "bf16.toml"}, {"device.precision = \"bf16\":", "allowed on the CPU: \"fp32\""});
  // A value that is no precision is refused by the study's validation.
  expect_bad_input({"run", "study.toml", "--set", "device.precision=fp16"},
                   {"device.precision: \"fp16\" is not a choice", "\"bf16\""});
}

TEST_F(CliTest, Bf16WithAutoOnTheCpuIsBadInput) {
  if (cuda_available()) GTEST_SKIP() << "a GPU is present: auto chooses it and bf16 trains (CudaRunRecordsTheGpu)";
  write_file("study.toml", kTinyStudy);
  expect_bad_input(
      {"run", "study.toml", "--set", "device.type=auto", "--set", "device.precision=bf16"},
      {"device.precision = \"bf16\":", "device.type = \"auto\" resolved to the CPU", "allowed on the CPU: \"fp32\""});
}

TEST_F(CliTest, Bf16WithAutoResolvingToTheCpuForSeveralProcessesIsBadInput) {
  // auto picks the CPU for a run of several processes on any machine, so bf16 is refused first (before the launch
  // is checked for its process count).
  write_file("study.toml", kTinyStudy);
  expect_bad_input(
      {"run", "study.toml", "--set", "device.type=auto", "--set", "device.precision=bf16", "--set", "parallel.dp=2"},
      {"device.precision = \"bf16\":", "device.type = \"auto\" resolved to the CPU"});
}

TEST_F(CliTest, CpuRunRecordsFp32Precision) {
  write_file("study.toml", kTinyStudy);
  const CliResult result = run({"run", "study.toml", "--set", "device.type=cpu", "--out", "out"});
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  const RunReader reader = RunReader::open(work_ / "out" / "tiny.h5");
  EXPECT_EQ(reader.attribute_string("precision"), "fp32");
  EXPECT_NE(reader.attribute_string("config").find("\nprecision = \"fp32\"\n"), std::string::npos);
}

TEST_F(CliTest, CudaRunRecordsTheGpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU: nothing trains on one here";
  write_file("study.toml", kTinyStudy);
  const CliResult result = run({"run", "study.toml", "--set", "device.type=cuda", "--out", "out"});
  ASSERT_EQ(result.exit_code, 0) << describe(result);
  const std::string device = RunReader::open(work_ / "out" / "tiny.h5").attribute_string("device");
  EXPECT_EQ(device.rfind("cuda:0 ", 0), 0u) << device;
  EXPECT_EQ(RunReader::open(work_ / "out" / "tiny.h5").attribute_string("precision"), "fp32");
  const CliResult bf16 =
      run({"run", "study.toml", "--set", "device.type=cuda", "--set", "device.precision=bf16", "--out", "out_bf16"});
  ASSERT_EQ(bf16.exit_code, 0) << describe(bf16);
  EXPECT_EQ(RunReader::open(work_ / "out_bf16" / "tiny.h5").attribute_string("precision"), "bf16");
}

}  // namespace
}  // namespace proplab::cli_test
