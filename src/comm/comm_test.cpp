// Single-process tests of the communicator layer: the test binary runs without mpirun, so
// MPI starts as a singleton (world size 1) and every collective has its size-1 meaning.
// Multi-rank behaviour is covered end to end by tests/bench_comm_test.sh under mpirun.
//
// Leak checking: the sanitizer build runs this binary with LeakSanitizer on. Open MPI's own
// never-freed allocations (MPI_Init, MPI_Finalize, MPI_T) are excluded where those calls are
// made (comm/leak_check.h), so nothing here needs a suppression list, and every allocation
// of our own is still checked.
#include "comm/comm.h"

#include <gtest/gtest.h>

#include <climits>
#include <cstdint>
#include <string>
#include <vector>

#include "base/error.h"
#include "comm/coll_tuning.h"

namespace foundry {
namespace {

// One session for the whole binary (MPI starts once per process); finalized at exit.
// Forced algorithms are allowed so that CollTuning can be tested too; with none forced,
// collectives behave exactly as without it.
MpiSession& session() {
  static MpiSession s(MpiSessionOptions{.allow_forced_algorithms = true});
  return s;
}

Communicator& world() { return session().world(); }

std::string error_text(const Error& e) { return std::string(e.what()) + " | " + e.hint(); }

// Runs `body`, expects a foundry::Error whose message contains `needle`.
template <class F>
void expect_error(F body, const std::string& needle) {
  try {
    body();
    ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << error_text(e);
  }
}

class CommTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (world().size() != 1) GTEST_SKIP() << "these tests expect a singleton (no mpirun)";
  }
};

TEST_F(CommTest, SingletonWorld) {
  EXPECT_EQ(world().rank(), 0);
  EXPECT_EQ(world().size(), 1);
  EXPECT_TRUE(MpiSession::active());
  EXPECT_GE(session().thread_level(), MPI_THREAD_FUNNELED);
}

TEST_F(CommTest, SecondSessionIsAnError) {
  expect_error([] { MpiSession again; }, "already initialized");
}

TEST_F(CommTest, ErrorsReturnInsteadOfAborting) {
  MPI_Errhandler handler;
  ASSERT_EQ(MPI_Comm_get_errhandler(world().native(), &handler), MPI_SUCCESS);
  EXPECT_EQ(handler, MPI_ERRORS_RETURN);
  MPI_Errhandler_free(&handler);
  // A communicator made from the world inherits it.
  Communicator copy = world().dup();
  ASSERT_EQ(MPI_Comm_get_errhandler(copy.native(), &handler), MPI_SUCCESS);
  EXPECT_EQ(handler, MPI_ERRORS_RETURN);
  MPI_Errhandler_free(&handler);
}

TEST_F(CommTest, MpiErrorBecomesFoundryErrorNamingCallAndRank) {
  // Root 3 does not exist in a world of one: MPI's argument check returns MPI_ERR_ROOT,
  // which must surface as a foundry::Error rather than an abort.
  std::vector<float> data(4, 1.0f);
  try {
    world().broadcast(data.data(), data.size(), /*root=*/3);
    ADD_FAILURE() << "broadcast from a missing root did not fail";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("MPI_Bcast failed on rank 0 of 1"), std::string::npos) << what;
    EXPECT_NE(what.find("root"), std::string::npos) << what;
    EXPECT_FALSE(e.hint().empty());
  }
  // The same on a derived communicator.
  Communicator copy = world().dup();
  expect_error([&] { copy.broadcast(data.data(), data.size(), -2); },
               "MPI_Bcast failed on rank 0 of 1");
}

TEST_F(CommTest, CheckMpiNamesTheCall) {
  EXPECT_NO_THROW(check_mpi(MPI_SUCCESS, "MPI_Anything", world().native()));
  expect_error([] { check_mpi(MPI_ERR_COUNT, "MPI_Allgather", world().native()); },
               "MPI_Allgather failed on rank 0 of 1");
}

TEST_F(CommTest, CountsAboveMpiIntAreRejected) {
  const size_t too_many = static_cast<size_t>(INT_MAX) + 1;
  expect_error([&] { world().allreduce<float>(nullptr, nullptr, too_many); }, "count limit");
  // reduce_scatter's whole vector is size() * block elements: checked too.
  double a = 0, b = 0;
  expect_error([&] { world().reduce_scatter<double>(&a, &b, too_many); }, "count limit");
}

TEST_F(CommTest, AliasedBuffersAreRejectedWhereNotSupported) {
  std::vector<float> buf(8, 1.0f);
  expect_error([&] { world().allgather(buf.data(), buf.data(), 8); }, "same");
  expect_error([&] { world().alltoall(buf.data(), buf.data(), 8); }, "same");
  expect_error([&] { world().reduce_scatter(buf.data(), buf.data(), 8); }, "same");
}

// Size 1: every reduction is the identity, every exchange a copy.
template <class T>
void check_size_one_collectives() {
  Communicator& w = world();
  const std::vector<T> send = {T(3), T(-1), T(7), T(2), T(5)};
  const size_t n = send.size();
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min}) {
    std::vector<T> recv(n, T(0));
    w.allreduce(send.data(), recv.data(), n, op);
    EXPECT_EQ(recv, send);
    std::vector<T> inplace = send;
    w.allreduce(inplace.data(), inplace.data(), n, op);
    EXPECT_EQ(inplace, send);
  }
  {
    std::vector<T> recv(n, T(0));
    w.reduce_scatter(send.data(), recv.data(), n);
    EXPECT_EQ(recv, send);
  }
  {
    std::vector<T> recv(n, T(0));
    w.allgather(send.data(), recv.data(), n);
    EXPECT_EQ(recv, send);
  }
  {
    std::vector<T> data = send;
    w.broadcast(data.data(), n, 0);
    EXPECT_EQ(data, send);
  }
  {
    std::vector<T> recv(n, T(0));
    w.alltoall(send.data(), recv.data(), n);
    EXPECT_EQ(recv, send);
  }
  {
    // Send 3 of the 5 elements to ourselves; the rest of recv stays untouched.
    const std::vector<int64_t> counts = {3};
    std::vector<T> recv(n, T(-9));
    w.alltoallv(send.data(), counts, recv.data(), counts);
    EXPECT_EQ(recv, (std::vector<T>{T(3), T(-1), T(7), T(-9), T(-9)}));
  }
}

TEST_F(CommTest, SizeOneCollectivesFloat) { check_size_one_collectives<float>(); }
TEST_F(CommTest, SizeOneCollectivesDouble) { check_size_one_collectives<double>(); }
TEST_F(CommTest, SizeOneCollectivesInt64) { check_size_one_collectives<int64_t>(); }

TEST_F(CommTest, Int64ReductionIsExactBeyondDoublePrecision) {
  // 2^53 + 1 is not representable in double: an int64 sum that went through floating point
  // would lose the 1.
  const int64_t big = (int64_t(1) << 53) + 1;
  int64_t out = 0;
  world().allreduce(&big, &out, 1);
  EXPECT_EQ(out, big);
}

TEST_F(CommTest, AlltoallvChecksItsCounts) {
  std::vector<float> a(4), b(4);
  const std::vector<int64_t> two = {1, 1}, one = {1}, negative = {-1};
  expect_error([&] { world().alltoallv(a.data(), two, b.data(), one); }, "for 1 ranks");
  expect_error([&] { world().alltoallv(a.data(), negative, b.data(), negative); },
               "negative count");
}

TEST_F(CommTest, VCollectivesOnOneRank) {
  const std::vector<int64_t> counts = {3};
  std::vector<double> data = {4, 5, 6};
  world().allgatherv_in_place(data.data(), std::span(counts));
  EXPECT_EQ(data, (std::vector<double>{4, 5, 6}));
  const std::vector<int64_t> two = {1, 1}, negative = {-1};
  expect_error([&] { world().allgatherv_in_place(data.data(), std::span(two)); }, "2 counts");
  expect_error([&] { world().allgatherv_in_place(data.data(), std::span(negative)); },
               "negative count");
  const std::vector<int64_t> too_many = {int64_t{INT_MAX} + 1};
  expect_error([&] { world().allgatherv_in_place<float>(nullptr, std::span(too_many)); },
               "count limit");
}

TEST_F(CommTest, PointToPointToSelf) {
  // Receives posted before the sends: nothing waits on a send to complete first.
  const std::vector<int64_t> first = {1, 2, 3}, second = {4, 5};
  std::vector<int64_t> a(3, 0), b(2, 0);
  Request ra = world().irecv(a.data(), a.size(), 0, 5);
  Request rb = world().irecv(b.data(), b.size(), 0, 5);
  Request sa = world().isend(first.data(), first.size(), 0, 5);
  Request sb = world().isend(second.data(), second.size(), 0, 5);
  ra.wait();
  rb.wait();
  sa.wait();
  sb.wait();
  EXPECT_EQ(a, first);  // same pair, same tag: in the order sent
  EXPECT_EQ(b, second);
  // Receive of a message already sent.
  const double x = 2.5;
  double y = 0;
  Request s = world().isend(&x, 1, 0, 6);
  world().irecv(&y, 1, 0, 6).wait();
  s.wait();
  EXPECT_EQ(y, 2.5);
}

TEST_F(CommTest, ReceiveOfTheWrongLengthIsAnError) {
  const std::vector<float> four = {1, 2, 3, 4};
  {
    // Shorter than expected: our check, naming both lengths.
    std::vector<float> eight(8, 0.0f);
    Request r = world().irecv(eight.data(), eight.size(), 0, 3);
    Request s = world().isend(four.data(), four.size(), 0, 3);
    s.wait();
    expect_error([&] { r.wait(); }, "received 4 elements from rank 0, expected 8");
    EXPECT_TRUE(r.done());
  }
  {
    // Longer than the buffer: MPI's truncation error, as a foundry::Error. (The message is
    // sent first: Open MPI 4.1 truncates a message to self silently when the receive was
    // posted before it; between two processes it reports truncation either way, see
    // optim/zero1_mpitest.cpp.)
    std::vector<float> two(2, 0.0f);
    Request s = world().isend(four.data(), four.size(), 0, 4);
    expect_error([&] { world().irecv(two.data(), two.size(), 0, 4).wait(); },
                 "MPI_Irecv failed on rank 0 of 1");
    s.wait();
  }
  // A bad destination is reported, not an abort.
  expect_error([&] { world().send(four.data(), 4, /*dest=*/5, 0); }, "MPI_Send failed");
}

TEST_F(CommTest, BarriersAndRequests) {
  world().barrier();
  world().idle_barrier(std::chrono::microseconds(50));
  Request r = world().ibarrier();
  while (!r.test()) {
  }
  EXPECT_TRUE(r.done());
  EXPECT_TRUE(r.test());  // testing a finished request stays true
  r.wait();               // and waiting on it returns at once

  Request empty;
  EXPECT_TRUE(empty.done());
  // Moving transfers the pending operation; the moved-from handle has nothing to wait for.
  std::vector<double> send(16, 2.0), recv(16, 0.0);
  Request a = world().irecv(recv.data(), recv.size(), 0, 13);
  Request b = std::move(a);
  EXPECT_TRUE(a.done());
  Request sent = world().isend(send.data(), send.size(), 0, 13);
  b.wait();
  sent.wait();
  EXPECT_EQ(recv, send);
  // A pending request destroyed without wait() completes before its buffers can go away.
  std::vector<double> late(16, 0.0);
  sent = world().isend(send.data(), send.size(), 0, 14);
  { Request dropped = world().irecv(late.data(), late.size(), 0, 14); }
  EXPECT_EQ(late, send);
  sent.wait();
}

TEST_F(CommTest, DupAndSplitMakeIndependentCommunicators) {
  Communicator copy = world().dup();
  EXPECT_EQ(copy.size(), 1);
  EXPECT_NE(copy.native(), world().native());
  Communicator part = world().split(/*color=*/7, /*key=*/0);
  EXPECT_EQ(part.size(), 1);
  EXPECT_EQ(part.rank(), 0);
  // Move assignment frees the communicator it replaces and leaves the source empty.
  part = std::move(copy);
  EXPECT_EQ(copy.native(), MPI_COMM_NULL);
  float one = 1, out = 0;
  part.allreduce(&one, &out, 1);
  EXPECT_EQ(out, 1.0f);
}

TEST_F(CommTest, CollTuningListsForcesAndRestoresAlgorithms) {
  session();
  CollTuning tuning;
  if (!tuning.available()) GTEST_SKIP() << "not Open MPI with coll/tuned";
  ASSERT_TRUE(tuning.dynamic_rules()) << tuning.unavailable_reason();
  const std::vector<TunedAlgorithm> algorithms = tuning.algorithms("allreduce");
  ASSERT_GE(algorithms.size(), 2u);
  bool has_ring = false;
  for (const TunedAlgorithm& a : algorithms) {
    EXPECT_GT(a.id, 0);  // 0 ("ignore") is not an algorithm
    has_ring |= a.name == "ring";
  }
  EXPECT_TRUE(has_ring);
  EXPECT_EQ(tuning.forced("allreduce"), 0);
  const TunedAlgorithm last = algorithms.back();
  {
    CollTuning scoped;
    scoped.force("allreduce", last.id);
    EXPECT_EQ(tuning.forced("allreduce"), last.id);  // one variable, seen by both handles
    EXPECT_EQ(scoped.algorithm_name("allreduce", last.id), last.name);
    Communicator forced = world().dup();
    float x = 4, y = 0;
    forced.allreduce(&x, &y, 1);
    EXPECT_EQ(y, 4.0f);
    expect_error([&] { scoped.algorithms("no_such_collective"); }, "no control variable");
  }
  EXPECT_EQ(tuning.forced("allreduce"), 0) << "not restored";
}

TEST(CollTuningText, MpirunFlags) {
  EXPECT_EQ(mpirun_mca_flags("bcast", 6),
            "mpirun --mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_bcast_algorithm 6");
}

}  // namespace
}  // namespace foundry
