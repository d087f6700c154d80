// The GPU's optimizer against the CPU's single-process optimizer on the same slabs (suite
// GpuOptimizer, ctest label gpu; skipped where no GPU is visible): AdamW alone and with Muon,
// with clipping active, the bf16 copy, the veto, and checkpoint state that round-trips.
#include "optim/device_optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "cuda/runtime.h"
#include "cuda/test_support.h"
#include "optim/test_util.h"

namespace foundry {
namespace {

using gpu::testing::to_device;
using gpu::testing::to_host;
using test::random_slab;

OptimizerOptions options(bool with_muon) { return test::optimizer_options(with_muon); }

double max_relative_difference(const std::vector<float>& got, const std::vector<float>& want) {
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i)
    worst = std::max(worst,
                     std::abs(double(got[i]) - want[i]) / (std::abs(double(want[i])) + 1e-3));
  return worst;
}

class GpuOptimizer : public ::testing::TestWithParam<bool> {};  // with Muon or not

TEST_P(GpuOptimizer, MatchesTheCpuOptimizerWithClippingAndTheBf16Copy) {
  SKIP_WITHOUT_GPU();
  const bool with_muon = GetParam();
  ParamTable table(test::tiny_moe_config());
  auto cpu = make_optimizer(table, options(with_muon), nullptr);
  auto gpu_opt = make_device_optimizer(table, options(with_muon));
  const int64_t n = table.total_elements();
  std::vector<float> params = random_slab(table, 1, 0.1);
  gpu::DeviceBuffer d_params = to_device(params), d_mirror(n * 2);
  d_mirror.fill_bytes(0);
  ASSERT_TRUE(gpu_opt->write_bf16_weights(d_mirror.as<bf16>()));
  for (int64_t step = 1; step <= 3; ++step) {
    std::vector<float> grads = random_slab(table, 100 + step, 1.0);
    gpu::DeviceBuffer d_grads = to_device(grads);
    const double cpu_norm = cpu->step(params.data(), grads.data(), 1e-2, step, 0.5);
    const double gpu_norm =
        gpu_opt->step(d_params.as<float>(), d_grads.as<float>(), 1e-2, step, 0.5);
    EXPECT_NEAR(gpu_norm, cpu_norm, 1e-9 * cpu_norm) << "step " << step;
    // AdamW alone: a few fp32 roundings of an update of about lr (the GPU contracts to fused
    // multiply-adds where the CPU may not), against a floor of 1e-3 in the denominator.
    EXPECT_LT(max_relative_difference(to_host<float>(d_params, n), params),
              with_muon ? 1e-4 : 1e-5)
        << "step " << step;
  }
  // The bf16 copy is the updated weights rounded, for every tensor.
  const std::vector<float> updated = to_host<float>(d_params, n);
  const std::vector<bf16> mirror = to_host<bf16>(d_mirror, n);
  for (const ParamInfo& p : table.params())
    for (int64_t i = p.offset; i < p.offset + p.numel; ++i)
      ASSERT_EQ(mirror[i], float_to_bf16(updated[i])) << p.name;
}

TEST_P(GpuOptimizer, AVetoOrANonFiniteNormChangesNothing) {
  SKIP_WITHOUT_GPU();
  ParamTable table(test::tiny_moe_config());
  auto opt = make_device_optimizer(table, options(GetParam()));
  const int64_t n = table.total_elements();
  const std::vector<float> params = random_slab(table, 1, 0.1);
  gpu::DeviceBuffer d_params = to_device(params);
  std::vector<float> grads = random_slab(table, 5, 1.0);
  gpu::DeviceBuffer d_grads = to_device(grads);
  double seen = 0;
  opt->step(d_params.as<float>(), d_grads.as<float>(), 1e-2, 1, 1.0, [&](double norm) {
    seen = norm;
    return true;
  });
  EXPECT_GT(seen, 0);
  EXPECT_EQ(to_host<float>(d_params, n), params);
  grads[7] = std::nanf("");
  gpu::DeviceBuffer d_nan = to_device(grads);
  EXPECT_TRUE(std::isnan(opt->step(d_params.as<float>(), d_nan.as<float>(), 1e-2, 1, 1.0)));
  EXPECT_EQ(to_host<float>(d_params, n), params);
}

// Saving after two steps and loading into a fresh optimizer continues bit for bit as the
// original does.
TEST_P(GpuOptimizer, CheckpointStateRoundTrips) {
  SKIP_WITHOUT_GPU();
  ParamTable table(test::tiny_moe_config());
  auto a = make_device_optimizer(table, options(GetParam()));
  auto b = make_device_optimizer(table, options(GetParam()));
  const int64_t n = table.total_elements();
  gpu::DeviceBuffer pa = to_device(random_slab(table, 1, 0.1));
  for (int64_t step = 1; step <= 2; ++step) {
    gpu::DeviceBuffer g = to_device(random_slab(table, 10 + step, 1.0));
    a->step(pa.as<float>(), g.as<float>(), 1e-2, step, 0);
  }
  const std::vector<float> saved_params = to_host<float>(pa, n);
  const std::vector<StateRun> saved = a->states_to_save_runs();
  const std::vector<StateRun> load = b->states_to_load_runs();
  ASSERT_EQ(saved.size(), load.size());
  for (size_t i = 0; i < saved.size(); ++i) {
    ASSERT_EQ(saved[i].state, load[i].state);
    std::copy(saved[i].data, saved[i].data + (saved[i].end - saved[i].begin), load[i].data);
  }
  gpu::DeviceBuffer pb = to_device(saved_params);
  gpu::DeviceBuffer g = to_device(random_slab(table, 13, 1.0));
  a->step(pa.as<float>(), g.as<float>(), 1e-2, 3, 0);
  b->step(pb.as<float>(), g.as<float>(), 1e-2, 3, 0);
  EXPECT_EQ(to_host<float>(pa, n), to_host<float>(pb, n));
}

INSTANTIATE_TEST_SUITE_P(AdamWOrMuon, GpuOptimizer, ::testing::Bool());

}  // namespace
}  // namespace foundry
