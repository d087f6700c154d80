// The single-process optimizer behind make_optimizer: the same arithmetic as AdamW (and Muon)
// driven by hand after clipping, checkpoint state that round-trips, and the report text.
#include "optim/optimizer.h"
#include "optim/checkpoint_state_test_util.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "optim/clip.h"
#include "optim/device_optimizer.h"
#include "optim/test_util.h"

namespace foundry {
namespace {

using test::bitwise_equal;
using test::random_slab;

OptimizerOptions options(bool with_muon) { return test::optimizer_options(with_muon); }

class LocalOptimizerTest : public ::testing::TestWithParam<bool> {};  // with Muon or not

TEST_P(LocalOptimizerTest, StepIsClipThenTheOptimizersOnTheWholeSlab) {
  const bool with_muon = GetParam();
  ParamTable table(test::tiny_moe_config());
  auto optimizer = make_optimizer(table, options(with_muon), nullptr);
  AdamW adamw(table, test::adamw_options(with_muon));
  std::optional<Muon> muon;
  if (with_muon) muon.emplace(table, MuonOptions{});

  std::vector<float> params = random_slab(table, 1, 0.1), reference = params;
  for (int64_t step = 1; step <= 3; ++step) {
    std::vector<float> grads = random_slab(table, 100 + step, 1.0), ref_grads = grads;
    const double norm = optimizer->step(params.data(), grads.data(), 1e-2, step, 0.5);
    const double ref_norm = clip_grad_norm(ref_grads.data(), table, 0.5);
    adamw.step(reference.data(), ref_grads.data(), 1e-2, step);
    if (muon) muon->step(reference.data(), ref_grads.data(), 1e-2, step);
    EXPECT_EQ(norm, ref_norm);
    ASSERT_TRUE(bitwise_equal(params, reference)) << "step " << step;
  }
}

// The bf16 copy written in the update's pass is the copy of the updated weights, for the
// tensors of both optimizers; the padding between tensors is left alone.
TEST_P(LocalOptimizerTest, WritesTheBf16CopyOfTheUpdatedWeights) {
  const bool with_muon = GetParam();
  ParamTable table(test::tiny_moe_config());
  auto optimizer = make_optimizer(table, options(with_muon), nullptr);
  const bf16 kUntouched = 0x7fc1;
  std::vector<bf16> mirror(table.total_elements(), kUntouched);
  ASSERT_TRUE(optimizer->write_bf16_weights(mirror.data()));
  std::vector<float> params = random_slab(table, 3, 0.1);
  for (int64_t step = 1; step <= 2; ++step) {
    std::vector<float> grads = random_slab(table, 300 + step, 1.0);
    optimizer->step(params.data(), grads.data(), 1e-2, step, 0.5);
  }
  std::vector<bool> in_tensor(table.total_elements(), false);
  for (const ParamInfo& p : table.params())
    for (int64_t i = p.offset; i < p.offset + p.numel; ++i) in_tensor[i] = true;
  int64_t checked = 0;
  for (int64_t i = 0; i < table.total_elements(); ++i) {
    const bf16 expected = in_tensor[i] ? float_to_bf16(params[i]) : kUntouched;
    ASSERT_EQ(mirror[i], expected) << "element " << i;
    checked += in_tensor[i];
  }
  EXPECT_GT(checked, 0);
}

TEST_P(LocalOptimizerTest, CheckpointStateRoundTrips) {
  const bool with_muon = GetParam();
  ParamTable table(test::tiny_moe_config());
  auto trained = make_optimizer(table, options(with_muon), nullptr);
  std::vector<float> params = random_slab(table, 2, 0.1);
  for (int64_t step = 1; step <= 2; ++step) {
    std::vector<float> grads = random_slab(table, 200 + step, 1.0);
    trained->step(params.data(), grads.data(), 1e-2, step, 1.0);
  }
  // A fresh optimizer loads the saved state, then both take the same step.
  auto resumed = make_optimizer(table, options(with_muon), nullptr);
  const auto saved = test::saved_state(*trained, table.total_elements(), nullptr);
  ASSERT_EQ(saved.size(), with_muon ? 3u : 2u);
  test::load_state(*resumed, saved);
  std::vector<float> p1 = params, p2 = params, g1 = random_slab(table, 300, 1.0), g2 = g1;
  trained->step(p1.data(), g1.data(), 1e-2, 3, 1.0);
  resumed->step(p2.data(), g2.data(), 1e-2, 3, 1.0);
  EXPECT_TRUE(bitwise_equal(p1, p2));
}

TEST_P(LocalOptimizerTest, NonFiniteGradientChangesNothing) {
  const bool with_muon = GetParam();
  ParamTable table(test::tiny_moe_config());
  auto optimizer = make_optimizer(table, options(with_muon), nullptr);
  std::vector<float> params = random_slab(table, 3, 0.1), before = params;
  std::vector<float> grads = random_slab(table, 4, 1.0);
  grads[static_cast<size_t>(table.params().back().offset)] =
      std::numeric_limits<float>::quiet_NaN();
  EXPECT_FALSE(std::isfinite(optimizer->step(params.data(), grads.data(), 1e-2, 1, 1.0)));
  EXPECT_TRUE(bitwise_equal(params, before));
}

// The veto sees the norm before clipping; a vetoed step leaves the parameters and every
// state as they were, and the next step is the one an optimizer that never saw it takes.
TEST_P(LocalOptimizerTest, VetoedStepChangesNothing) {
  const bool with_muon = GetParam();
  ParamTable table(test::tiny_moe_config());
  auto optimizer = make_optimizer(table, options(with_muon), nullptr);
  auto reference = make_optimizer(table, options(with_muon), nullptr);
  std::vector<float> params = random_slab(table, 5, 0.1), ref_params = params;
  for (auto* o : {optimizer.get(), reference.get()}) {
    std::vector<float> grads = random_slab(table, 6, 1.0);
    o->step(o == reference.get() ? ref_params.data() : params.data(), grads.data(), 1e-2, 1, 0.5);
  }
  const std::vector<float> before = params;
  const auto state_before = test::saved_state(*optimizer, table.total_elements(), nullptr);
  std::vector<float> vetoed_grads = random_slab(table, 7, 1.0), check = vetoed_grads;
  double seen = -1;
  const double norm = optimizer->step(params.data(), vetoed_grads.data(), 1e-2, 2, 0.5,
                                      [&](double n) { seen = n; return true; });
  EXPECT_EQ(seen, norm);
  EXPECT_EQ(norm, grad_norm(check.data(), table));
  EXPECT_TRUE(bitwise_equal(params, before));
  EXPECT_EQ(test::saved_state(*optimizer, table.total_elements(), nullptr), state_before);
  for (int64_t step = 2; step <= 3; ++step) {
    std::vector<float> g1 = random_slab(table, 10 + step, 1.0), g2 = g1;
    optimizer->step(params.data(), g1.data(), 1e-2, step, 0.5, [](double) { return false; });
    reference->step(ref_params.data(), g2.data(), 1e-2, step, 0.5);
    EXPECT_TRUE(bitwise_equal(params, ref_params)) << "step " << step;
  }
}

INSTANTIATE_TEST_SUITE_P(AdamWAndMuon, LocalOptimizerTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Muon" : "AdamW"; });

TEST(LocalOptimizer, DescribesItsSplitAndLayout) {
  ParamTable table(test::tiny_moe_config());
  auto adamw = make_optimizer(table, options(false), nullptr);
  EXPECT_STREQ(adamw->layout_name(), "single process");
  EXPECT_EQ(adamw->last_reduce(), nullptr);
  EXPECT_EQ(
      adamw->describe().rfind(fmt::format("adamw (all {} tensors, ", table.params().size()), 0), 0u)
      << adamw->describe();
  EXPECT_EQ(adamw->state_bytes(), 2 * table.parameter_count() * 4);
  auto muon = make_optimizer(table, options(true), nullptr);
  EXPECT_EQ(muon->describe().rfind("muon (", 0), 0u) << muon->describe();
  EXPECT_NE(muon->describe().find(" + adamw (rest: "), std::string::npos);
  // AdamW's two moments of the tensors it updates, Muon's momentum of its matrices.
  int64_t muon_elements = 0;
  for (const ParamInfo& p : table.params())
    if (muon_applies(p)) muon_elements += p.numel;
  ASSERT_GT(muon_elements, 0);
  EXPECT_EQ(muon->state_bytes(),
            (2 * (table.parameter_count() - muon_elements) + muon_elements) * 4);
}

// Ranks on GPUs average over NCCL only where each has a GPU of its own and the build has
// NCCL: two ranks on one GPU (NCCL refuses them) go through host memory.
TEST(RanksOnGpus, AverageOverNcclOnlyWhereEachHasItsOwnGpu) {
  const std::array<int64_t, 2> a{1, 2}, b{1, 3}, c{4, 2};
  EXPECT_EQ(gpu_gradients_path({a, b, c}, true), GpuGradients::nccl);
  EXPECT_EQ(gpu_gradients_path({a, b, c}, false), GpuGradients::host);
  EXPECT_EQ(gpu_gradients_path({a, b, a}, true), GpuGradients::host);
  EXPECT_EQ(gpu_gradients_path({c, c}, true), GpuGradients::host);
}

}  // namespace
}  // namespace foundry
