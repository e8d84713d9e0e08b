// The main of every multi-process test binary (ctest runs each under mpirun): MPI is initialised with funnelled
// threads, every rank runs every test, only rank 0 prints the test listing while every rank reports its failures,
// and a failure on any rank fails the job on all of them.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>

namespace proplab::testing {

// Runs all registered tests on this rank; returns non-zero on every rank when any rank had a failure.
inline int run_mpi_tests(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  const int failed = RUN_ALL_TESTS();
  int any = failed;
  MPI_Allreduce(MPI_IN_PLACE, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any && rank == 0 && !failed) std::fprintf(stderr, "a test failed on another rank\n");
  MPI_Finalize();
  return any;
}

}  // namespace proplab::testing
