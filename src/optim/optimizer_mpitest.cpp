// The data-parallel optimizers behind make_optimizer at 2-4 ranks: ZeRO-1 and replicated
// steps against the single-process step on the averaged gradient, replicas that stay
// identical, and checkpoint state that round-trips and does not depend on the layout.
//
// Every rank draws every rank's gradient (deterministic in the seed, the step and the rank),
// so each computes the single-process reference itself.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "comm/comm.h"
#include "kernels/cpu_backend.h"
#include "optim/checkpoint_state_test_util.h"
#include "optim/device_optimizer.h"
#include "optim/optimizer.h"
#include "optim/test_util.h"

namespace foundry {
namespace {

using test::bitwise_equal;
using test::random_slab;

Communicator& world() {
  static Communicator w(MPI_COMM_WORLD, /*owned=*/false);
  return w;
}

// As in zero1_mpitest.cpp: the ranks' gradients are summed in another order than the
// reference's, and AdamW's sign-like first steps and Newton–Schulz amplify the last bits.
constexpr double kTolerance = 2e-5;

OptimizerOptions options(bool with_muon, bool zero1) {
  OptimizerOptions o;
  o.adamw = test::adamw_options(with_muon);
  o.muon = test::muon_options(with_muon);
  o.zero1 = zero1;
  o.bucket_elements = 4096;  // several buckets
  return o;
}

std::vector<float> rank_gradient(const ParamTable& table, int64_t step, int rank) {
  return random_slab(table, 1000 * static_cast<uint64_t>(step) + static_cast<uint64_t>(rank), 1.0);
}

double max_relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst,
                     std::abs(double(a[i]) - double(b[i])) / std::max(std::abs(double(b[i])), 1.0));
  return worst;
}

// True on every rank iff every rank's `slab` equals rank 0's bit for bit.
bool same_on_every_rank(const std::vector<float>& slab) {
  std::vector<float> root = slab;
  world().broadcast(root.data(), root.size(), 0);
  const int64_t mine = bitwise_equal(slab, root) ? 1 : 0;
  int64_t all = 0;
  world().allreduce(&mine, &all, 1, ReduceOp::min);
  return all == 1;
}

// What `a`'s ranks save, state by state, equals what `b`'s save (within kTolerance).
void expect_same_saved_state(DataParallelOptimizer& a, DataParallelOptimizer& b,
                             const ParamTable& table) {
  const auto saved_a = test::saved_state(a, table.total_elements(), &world());
  const auto saved_b = test::saved_state(b, table.total_elements(), &world());
  ASSERT_EQ(saved_a.size(), saved_b.size());
  for (const auto& [name, slab] : saved_a) {
    ASSERT_TRUE(saved_b.count(name)) << name;
    EXPECT_LT(max_relative_error(slab, saved_b.at(name)), kTolerance) << name;
  }
}

struct Layout {
  bool zero1, with_muon;
};

class DataParallelOptimizerTest : public ::testing::TestWithParam<Layout> {};

TEST_P(DataParallelOptimizerTest, StepsMatchTheSingleProcessStepOnTheAveragedGradient) {
  const auto [zero1, with_muon] = GetParam();
  ParamTable table(test::tiny_moe_config());
  auto optimizer = make_optimizer(table, options(with_muon, zero1), &world());
  auto reference = make_optimizer(table, options(with_muon, zero1), nullptr);
  EXPECT_STREQ(optimizer->layout_name(), zero1 ? "ZeRO-1" : "replicated");
  const int ranks = world().size();
  std::vector<float> params = random_slab(table, 7, 0.1), ref_params = params;
  for (int64_t step = 1; step <= 3; ++step) {
    std::vector<float> grads = rank_gradient(table, step, world().rank());
    std::vector<float> mean(grads.size(), 0.0f);
    for (int r = 0; r < ranks; ++r) {
      const std::vector<float> g = rank_gradient(table, step, r);
      for (size_t i = 0; i < g.size(); ++i) mean[i] += g[i];
    }
    for (float& v : mean) v /= static_cast<float>(ranks);
    const double norm = optimizer->step(params.data(), grads.data(), 1e-2, step, 0.5);
    const double ref_norm = reference->step(ref_params.data(), mean.data(), 1e-2, step, 0.5);
    ASSERT_NE(optimizer->last_reduce(), nullptr);
    EXPECT_NEAR(norm, ref_norm, 1e-5 * ref_norm);
    EXPECT_LT(max_relative_error(params, ref_params), kTolerance) << "step " << step;
    EXPECT_TRUE(same_on_every_rank(params)) << "the replicas drifted apart at step " << step;
  }
}

TEST_P(DataParallelOptimizerTest, CheckpointStateRoundTripsUnderTheSameLayout) {
  const auto [zero1, with_muon] = GetParam();
  ParamTable table(test::tiny_moe_config());
  auto trained = make_optimizer(table, options(with_muon, zero1), &world());
  std::vector<float> params = random_slab(table, 8, 0.1);
  for (int64_t step = 1; step <= 2; ++step) {
    std::vector<float> grads = rank_gradient(table, step, world().rank());
    trained->step(params.data(), grads.data(), 1e-2, step, 1.0);
  }
  // Each rank saves its runs; the loading optimizer of each rank fills its own runs.
  const auto saved = test::saved_state(*trained, table.total_elements(), &world());
  ASSERT_EQ(saved.size(), with_muon ? 3u : 2u);
  auto resumed = make_optimizer(table, options(with_muon, zero1), &world());
  test::load_state(*resumed, saved);
  std::vector<float> p1 = params, p2 = params;
  std::vector<float> g1 = rank_gradient(table, 3, world().rank()), g2 = g1;
  trained->step(p1.data(), g1.data(), 1e-2, 3, 1.0);
  resumed->step(p2.data(), g2.data(), 1e-2, 3, 1.0);
  EXPECT_TRUE(bitwise_equal(p1, p2));
}

// A vetoed step (the veto is called on every rank with the same norm) leaves the parameters
// and every rank's state as they were; the run goes on as one that never saw it. One rank's
// NaN gradient reaches every rank's veto through the reduction.
TEST_P(DataParallelOptimizerTest, VetoedStepChangesNothingOnAnyRank) {
  const auto [zero1, with_muon] = GetParam();
  ParamTable table(test::tiny_moe_config());
  auto optimizer = make_optimizer(table, options(with_muon, zero1), &world());
  auto reference = make_optimizer(table, options(with_muon, zero1), &world());
  std::vector<float> params = random_slab(table, 17, 0.1), ref_params = params;
  std::vector<float> g1 = rank_gradient(table, 1, world().rank()), g2 = g1;
  optimizer->step(params.data(), g1.data(), 1e-2, 1, 0.5);
  reference->step(ref_params.data(), g2.data(), 1e-2, 1, 0.5);
  const std::vector<float> before = params;
  const auto state_before = test::saved_state(*optimizer, table.total_elements(), &world());
  for (const bool poisoned : {false, true}) {
    std::vector<float> vetoed = rank_gradient(table, 50, world().rank());
    if (poisoned && world().rank() == world().size() - 1)
      vetoed[static_cast<size_t>(table.params().front().offset)] = std::nanf("");
    double seen = -1;
    int calls = 0;
    const double norm = optimizer->step(params.data(), vetoed.data(), 1e-2, 2, 0.5, [&](double n) {
      seen = n;
      ++calls;
      return true;
    });
    EXPECT_EQ(calls, 1);
    EXPECT_EQ(std::isnan(norm), poisoned);
    EXPECT_TRUE(seen == norm || (std::isnan(seen) && std::isnan(norm)));
    double norms[2] = {std::isnan(norm) ? -1.0 : norm, 0};
    world().allreduce(&norms[0], &norms[1], 1, ReduceOp::max);
    EXPECT_EQ(norms[0], norms[1]) << "every rank's veto sees the same norm";
    EXPECT_TRUE(bitwise_equal(params, before));
    EXPECT_EQ(test::saved_state(*optimizer, table.total_elements(), &world()), state_before);
  }
  for (int64_t step = 2; step <= 3; ++step) {
    std::vector<float> a = rank_gradient(table, step, world().rank()), b = a;
    optimizer->step(params.data(), a.data(), 1e-2, step, 0.5, [](double) { return false; });
    reference->step(ref_params.data(), b.data(), 1e-2, step, 0.5);
    EXPECT_TRUE(bitwise_equal(params, ref_params)) << "step " << step;
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, DataParallelOptimizerTest,
                         ::testing::Values(Layout{true, false}, Layout{true, true},
                                           Layout{false, false}, Layout{false, true}),
                         [](const auto& info) {
                           return std::string(info.param.zero1 ? "Zero1" : "Replicated") +
                                  (info.param.with_muon ? "Muon" : "AdamW");
                         });

// What a checkpoint holds does not depend on the layout: after the same steps, the state
// the ZeRO-1 ranks save equals the replicated optimizer's (within the summation-order
// tolerance), and each element is saved by exactly one rank.
TEST(DataParallelOptimizer, SavedStateIsTheSameUnderZero1AndReplicated) {
  ParamTable table(test::tiny_moe_config());
  auto sharded = make_optimizer(table, options(true, true), &world());
  auto replicated = make_optimizer(table, options(true, false), &world());
  std::vector<float> p1 = random_slab(table, 9, 0.1), p2 = p1;
  for (int64_t step = 1; step <= 2; ++step) {
    std::vector<float> g1 = rank_gradient(table, step, world().rank()), g2 = g1;
    sharded->step(p1.data(), g1.data(), 1e-2, step, 1.0);
    replicated->step(p2.data(), g2.data(), 1e-2, step, 1.0);
  }
  // Every element any rank saves is saved by exactly one rank.
  std::vector<double> times(static_cast<size_t>(table.total_elements()), 0.0);
  for (const StateRun& r : sharded->states_to_save_runs())
    if (r.state == "exp_avg" || r.state == "muon_momentum")
      for (int64_t i = r.begin; i < r.end; ++i) times[i] += 1;
  world().allreduce(times.data(), times.data(), times.size());
  EXPECT_EQ(std::count_if(times.begin(), times.end(), [](double t) { return t > 1; }), 0);
  expect_same_saved_state(*sharded, *replicated, table);
}

// The data-parallel optimizers of a device's slabs (a CPU backend posing as one, with the
// CPU's kernels), exchanging through host memory.
std::unique_ptr<DataParallelOptimizer> device_optimizer(const ParamTable& table, Backend& device,
                                                        bool with_muon, bool zero1) {
  return make_device_data_parallel_optimizer(table, options(with_muon, zero1), device, world(),
                                             GpuGradients::host, cpu_optimizer_kernels);
}

// Replicated: the CPU's replicated optimizer's steps on the same gradients, bit for bit (the
// same reduction, summing in rank order), replicas that stay identical, and the replicated
// layout's checkpoint shares, with the state's runs where it lives.
TEST(HostStagedOptimizer, StepsAsTheReplicatedOptimizerDoes) {
  ParamTable table(test::tiny_moe_config());
  const std::unique_ptr<Backend> device = make_cpu_backend_posing_as_device();
  for (const bool with_muon : {false, true}) {
    SCOPED_TRACE(with_muon ? "muon" : "adamw");
    auto staged = device_optimizer(table, *device, with_muon, false);
    auto replicated = make_optimizer(table, options(with_muon, false), &world());
    EXPECT_STREQ(staged->layout_name(), "replicated, host-staged");
    std::vector<float> params = random_slab(table, 7, 0.1), ref = params;
    for (int64_t step = 1; step <= 3; ++step) {
      std::vector<float> grads = rank_gradient(table, step, world().rank()), ref_grads = grads;
      const double norm = staged->step(params.data(), grads.data(), 1e-2, step, 0.5);
      const double ref_norm = replicated->step(ref.data(), ref_grads.data(), 1e-2, step, 0.5);
      EXPECT_EQ(norm, ref_norm);
      EXPECT_TRUE(bitwise_equal(params, ref)) << "step " << step;
      EXPECT_TRUE(same_on_every_rank(params)) << "the replicas drifted apart at step " << step;
    }
    EXPECT_EQ(staged->parameters_to_save().begin, replicated->parameters_to_save().begin);
    EXPECT_EQ(staged->parameters_to_save().end, replicated->parameters_to_save().end);
    expect_same_saved_state(*staged, *replicated, table);
  }
}

// ZeRO-1 on a device's slabs: the gradients reduce-scattered in rank order to whole-matrix
// ranges, as the CPU's replicated optimizer sums them, so unclipped steps are its bits at any
// rank count and clipped ones (the norm added over the ranks in another order) agree within
// rounding; replicas stay identical; every element's state is kept and saved by one rank and
// equals the replicated layout's; a veto skips the step on every rank.
TEST(HostStagedZero1, StepsAsTheReplicatedOptimizerDoes) {
  ParamTable table(test::tiny_moe_config());
  const std::unique_ptr<Backend> device = make_cpu_backend_posing_as_device();
  for (const bool with_muon : {false, true}) {
    SCOPED_TRACE(with_muon ? "muon" : "adamw");
    auto sharded = device_optimizer(table, *device, with_muon, true);
    auto replicated = make_optimizer(table, options(with_muon, false), &world());
    EXPECT_STREQ(sharded->layout_name(), "ZeRO-1, host-staged");
    EXPECT_FALSE(sharded->write_bf16_weights(nullptr));  // the caller refreshes the copy
    std::vector<float> params = random_slab(table, 7, 0.1), ref = params;
    for (int64_t step = 1; step <= 4; ++step) {
      const double max_norm = step <= 2 ? 0.0 : 0.5;
      std::vector<float> grads = rank_gradient(table, step, world().rank()), ref_grads = grads;
      const double norm = sharded->step(params.data(), grads.data(), 1e-2, step, max_norm);
      const double ref_norm = replicated->step(ref.data(), ref_grads.data(), 1e-2, step, max_norm);
      EXPECT_NEAR(norm, ref_norm, 1e-6 * ref_norm);
      if (max_norm == 0) {
        EXPECT_TRUE(bitwise_equal(params, ref)) << "step " << step;
      }
      EXPECT_LT(max_relative_error(params, ref), kTolerance) << "step " << step;
      EXPECT_TRUE(same_on_every_rank(params)) << "the replicas drifted apart at step " << step;
    }
    // Each element's state once over the ranks, the replicated layout's values.
    std::vector<double> times(static_cast<size_t>(table.total_elements()), 0.0);
    for (const StateRun& r : sharded->states_to_save_runs())
      if (r.state == "exp_avg" || r.state == "muon_momentum")
        for (int64_t i = r.begin; i < r.end; ++i) times[i] += 1;
    world().allreduce(times.data(), times.data(), times.size());
    EXPECT_EQ(std::count_if(times.begin(), times.end(), [](double t) { return t > 1; }), 0);
    expect_same_saved_state(*sharded, *replicated, table);
    // The parameter shares tile the slab.
    std::vector<int64_t> share = {sharded->parameters_to_save().begin,
                                  sharded->parameters_to_save().end};
    std::vector<int64_t> shares(2 * static_cast<size_t>(world().size()));
    world().allgather(share.data(), shares.data(), 2);
    EXPECT_EQ(shares.front(), 0);
    EXPECT_EQ(shares.back(), table.total_elements());
    for (size_t r = 1; r < shares.size() / 2; ++r) EXPECT_EQ(shares[2 * r], shares[2 * r - 1]);
    // A veto (the same on every rank) changes nothing anywhere.
    const std::vector<float> before = params;
    std::vector<float> grads = rank_gradient(table, 9, world().rank());
    double seen = 0;
    sharded->step(params.data(), grads.data(), 1e-2, 5, 0.5, [&](double n) {
      seen = n;
      return true;
    });
    EXPECT_GT(seen, 0);
    EXPECT_TRUE(bitwise_equal(params, before));
  }
}

// Overlapped with backward: the model's reports of finished gradients (here at each tensor's
// start, from the last) queue the copies to the host, which on a backend posing as a device
// land late (at a later report, or when the step waits for them), and the reduction starts on
// them before it ends: the same bits as reducing after backward, in both layouts, with
// buckets started during "backward".
TEST(HostStagedGradients, OverlappedWithBackwardTheSameBits) {
  ParamTable table(test::tiny_moe_config());
  const std::unique_ptr<Backend> device = make_cpu_backend_posing_as_device();
  const std::vector<int64_t> offsets = test::offsets_last_first(table);
  for (const bool zero1 : {false, true})
    for (const bool with_muon : {false, true}) {
      SCOPED_TRACE(test::layout_case(zero1, with_muon));
      auto after = device_optimizer(table, *device, with_muon, zero1);
      auto during = device_optimizer(table, *device, with_muon, zero1);
      std::vector<float> a = random_slab(table, 9, 0.1), b = a;
      for (int64_t step = 1; step <= 3; ++step) {
        std::vector<float> ga = rank_gradient(table, step, world().rank()), gb = ga;
        const double norm_a = after->step(a.data(), ga.data(), 1e-2, step, 0.5);
        during->begin_backward(gb.data());
        for (int64_t o : offsets) during->gradients_final(o);
        const double norm_b = during->step(b.data(), gb.data(), 1e-2, step, 0.5);
        EXPECT_EQ(norm_a, norm_b) << "step " << step;
        EXPECT_TRUE(bitwise_equal(a, b)) << "step " << step;
        ASSERT_NE(during->last_reduce(), nullptr);
        EXPECT_GT(during->last_reduce()->started_in_backward, 0) << "step " << step;
        EXPECT_EQ(after->last_reduce()->started_in_backward, 0) << "step " << step;
      }
    }
}

// A ZeRO-1 device checkpoint at this rank count loads into a fresh optimizer at the same count
// and continues bit for bit; and loads into the CPU's ZeRO-1 and replicated layouts.
TEST(HostStagedZero1, CheckpointStateRoundTripsAcrossLayouts) {
  ParamTable table(test::tiny_moe_config());
  const std::unique_ptr<Backend> device = make_cpu_backend_posing_as_device();
  for (const bool with_muon : {false, true}) {
    SCOPED_TRACE(with_muon ? "muon" : "adamw");
    auto trained = device_optimizer(table, *device, with_muon, true);
    std::vector<float> params = random_slab(table, 8, 0.1);
    for (int64_t step = 1; step <= 2; ++step) {
      std::vector<float> grads = rank_gradient(table, step, world().rank());
      trained->step(params.data(), grads.data(), 1e-2, step, 1.0);
    }
    const auto saved = test::saved_state(*trained, table.total_elements(), &world());
    ASSERT_EQ(saved.size(), with_muon ? 3u : 2u);
    auto resumed = device_optimizer(table, *device, with_muon, true);
    auto cpu = make_optimizer(table, options(with_muon, true), &world());
    test::load_state(*resumed, saved);
    test::load_state(*cpu, saved);
    std::vector<float> a = params, b = params, c = params;
    std::vector<float> ga = rank_gradient(table, 3, world().rank()), gb = ga, gc = ga;
    trained->step(a.data(), ga.data(), 1e-2, 3, 0.0);
    resumed->step(b.data(), gb.data(), 1e-2, 3, 0.0);
    cpu->step(c.data(), gc.data(), 1e-2, 3, 0.0);
    EXPECT_TRUE(bitwise_equal(a, b));
    EXPECT_LT(max_relative_error(a, c), kTolerance);
  }
}

}  // namespace
}  // namespace foundry
