// The main() of a layer's multi-rank GoogleTest binary (*_mpitest.cpp, run under mpirun):
// every rank runs every test; rank 0 prints GoogleTest's report, the others only their
// failed assertions, each tagged with the rank; all ranks exit with the same status, failed
// if any rank failed.
//
//   int main(int argc, char** argv) { return foundry::mpi_test_main(argc, argv, &g_world); }
#pragma once
#include <gtest/gtest.h>

#include <cstdio>

#include "comm/comm.h"

namespace foundry {

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_,
                 result.file_name() ? result.file_name() : "?", result.line_number(),
                 result.message());
  }

 private:
  int rank_;
};

// Starts MPI, points `*world` at the world communicator for the tests, runs them, finalizes.
inline int mpi_test_main(int argc, char** argv, Communicator** world) {
  MpiSession session;
  *world = &session.world();
  ::testing::InitGoogleTest(&argc, argv);
  const int rank = session.world().rank();
  if (rank != 0) {
    ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  int64_t failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  session.world().allreduce(&failed, &failed, 1, ReduceOp::max);
  if (rank == 0 && failed)
    std::fprintf(stderr, "a test failed on at least one rank (see [rank N] lines)\n");
  session.finalize();
  *world = nullptr;
  return failed ? 1 : 0;
}

}  // namespace foundry
