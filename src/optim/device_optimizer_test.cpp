// The device optimizer against the CPU's single-process optimizer on the same slabs:
//  - on the CPU, with the CPU's kernels on a backend posing as a device (DeviceOptimizerOnCpu,
//    every machine): the same bits, on the whole slab and in parts;
//  - on a GPU (suite GpuOptimizer, ctest label gpu; skipped where no GPU is visible): AdamW
//    alone and with Muon, with clipping active, the bf16 copy, the veto, and checkpoint state
//    that round-trips.
#include "optim/device_optimizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "cuda/cuda_backend.h"
#include "cuda/nccl.h"
#include "cuda/runtime.h"
#include "cuda/test_support.h"
#include "kernels/backend.h"
#include "kernels/cpu_backend.h"
#include "optim/checkpoint_state_test_util.h"
#include "optim/test_util.h"
#include "optim/zero1_layout.h"

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

class DeviceOptimizerOnCpu : public ::testing::TestWithParam<bool> {};  // with Muon or not

// The device optimizer's arithmetic is the single-process optimizer's: on the CPU's kernels
// its steps give the same bits, clipped or not, with the bf16 copy, and its checkpoint state
// is the same.
TEST_P(DeviceOptimizerOnCpu, StepsAsTheSingleProcessOptimizerBitForBit) {
  const bool with_muon = GetParam();
  ParamTable table(test::tiny_moe_config());
  const std::unique_ptr<Backend> device = make_cpu_backend_posing_as_device();
  auto cpu = make_optimizer(table, options(with_muon), nullptr);
  auto dev = make_device_optimizer(table, options(with_muon), *device, cpu_optimizer_kernels());
  const int64_t n = table.total_elements();
  std::vector<float> params = random_slab(table, 1, 0.1), ref = params;
  std::vector<bf16> mirror(n), ref_mirror(n);
  ASSERT_TRUE(dev->write_bf16_weights(mirror.data()));
  ASSERT_TRUE(cpu->write_bf16_weights(ref_mirror.data()));
  for (int64_t step = 1; step <= 3; ++step) {
    std::vector<float> grads = random_slab(table, 100 + step, 1.0), ref_grads = grads;
    const double max_norm = step == 2 ? 0.0 : 0.5;  // clipped, unclipped, clipped
    const double norm = dev->step(params.data(), grads.data(), 1e-2, step, max_norm);
    const double ref_norm = cpu->step(ref.data(), ref_grads.data(), 1e-2, step, max_norm);
    EXPECT_EQ(norm, ref_norm) << "step " << step;
    EXPECT_TRUE(test::bitwise_equal(params, ref)) << "step " << step;
  }
  EXPECT_EQ(0, std::memcmp(mirror.data(), ref_mirror.data(), n * sizeof(bf16)));
  EXPECT_EQ(test::saved_state(*dev, n, nullptr), test::saved_state(*cpu, n, nullptr));
}

// Parts (the ranges of a ZeRO-1 layout over three ranks): each updates its own range only,
// sees its own sum of squares, keeps state for its range only, and together they take the
// whole slab's step; a part that cuts a Muon matrix is refused.
TEST_P(DeviceOptimizerOnCpu, PartsTakeTheWholeStepTogether) {
  const bool with_muon = GetParam();
  ParamTable table(test::tiny_moe_config());
  const std::unique_ptr<Backend> device = make_cpu_backend_posing_as_device();
  const int64_t n = table.total_elements();
  const Zero1Layout layout(table, 3, with_muon);
  auto whole = make_device_optimizer(table, options(with_muon), *device, cpu_optimizer_kernels());
  const std::vector<float> start = random_slab(table, 2, 0.1);
  std::vector<float> ref = start;
  std::vector<float> grads = random_slab(table, 3, 1.0);
  double ref_norm = whole->step(ref.data(), grads.data(), 1e-2, 1, 0.0);
  std::vector<float> assembled(n, 0.0f);
  double sums = 0;
  int64_t state_bytes = 0;
  for (int r = 0; r < 3; ++r) {
    const SlabRange range = layout.state_range(r);
    auto part = make_device_optimizer(table, options(with_muon), *device, cpu_optimizer_kernels(),
                                      {range, [&](double s) {
                                         sums += s;
                                         return ref_norm * ref_norm;
                                       }});
    std::vector<float> params = start;
    part->step(params.data(), grads.data(), 1e-2, 1, 0.0);
    for (int64_t i = 0; i < n; ++i) {
      if (i >= range.begin && i < range.end)
        assembled[i] = params[i];
      else
        ASSERT_EQ(params[i], start[i]) << "part " << r << " wrote element " << i;
    }
    EXPECT_EQ(part->parameters_to_save().begin, range.begin);
    for (const StateRun& run : part->states_to_save_runs())
      EXPECT_TRUE(run.begin >= range.begin && run.end <= range.end) << run.state;
    state_bytes += part->state_bytes();
  }
  EXPECT_TRUE(test::bitwise_equal(assembled, ref));
  EXPECT_NEAR(sums, ref_norm * ref_norm, 1e-9 * ref_norm * ref_norm);
  EXPECT_EQ(state_bytes, whole->state_bytes());  // the parts' state is the whole's, split
  // Each tensor's state is its optimizer's alone: AdamW's two moments, or Muon's momentum.
  int64_t expected = 0;
  for (const ParamInfo& p : table.params())
    expected += p.numel * (with_muon && muon_applies(p) ? 4 : 8);
  EXPECT_EQ(whole->state_bytes(), expected);

  if (!with_muon) return;
  const ParamInfo* matrix = nullptr;
  for (const ParamInfo& p : table.params())
    if (muon_applies(p)) matrix = &p;
  ASSERT_NE(matrix, nullptr);
  const SlabRange cut{0, matrix->offset + matrix->numel / 2};
  try {
    make_device_optimizer(table, options(true), *device, cpu_optimizer_kernels(), {cut, {}});
    FAIL() << "a part that cuts a Muon matrix was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(matrix->name), std::string::npos) << e.what();
  }
}

// A loaded state is the state from then on, whatever reads it first: a save (through host
// memory, or the device's live runs an asynchronous save copies) before the first step finds
// it on the device, and the step after continues from it as the optimizer that saved it does.
TEST_P(DeviceOptimizerOnCpu, ALoadedStateIsWhatASaveBeforeTheFirstStepFinds) {
  const bool with_muon = GetParam();
  ParamTable table(test::tiny_moe_config());
  const std::unique_ptr<Backend> device = make_cpu_backend_posing_as_device();
  const int64_t n = table.total_elements();
  auto a = make_device_optimizer(table, options(with_muon), *device, cpu_optimizer_kernels());
  std::vector<float> params = random_slab(table, 4, 0.1);
  for (int64_t step = 1; step <= 2; ++step) {
    std::vector<float> grads = random_slab(table, 20 + step, 1.0);
    a->step(params.data(), grads.data(), 1e-2, step, 0.0);
  }
  const auto saved = test::saved_state(*a, n, nullptr);
  for (bool live : {false, true}) {
    SCOPED_TRACE(live ? "live runs" : "runs through host memory");
    auto b = make_device_optimizer(table, options(with_muon), *device, cpu_optimizer_kernels());
    test::load_state(*b, saved);
    std::map<std::string, std::vector<float>> found;
    for (const auto& [name, slab] : saved) found[name].assign(static_cast<size_t>(n), 0.0f);
    for (const StateRun& r : live ? b->live_state_runs() : b->states_to_save_runs()) {
      std::vector<float>& slab = found.at(r.state);
      if (live)
        device->to_host(slab.data() + r.begin, r.data, (r.end - r.begin) * sizeof(float));
      else
        std::copy(r.data, r.data + (r.end - r.begin), slab.begin() + r.begin);
    }
    EXPECT_EQ(found, saved);
    std::vector<float> pa = params, pb = params, ga = random_slab(table, 30, 1.0), gb = ga;
    auto c = make_device_optimizer(table, options(with_muon), *device, cpu_optimizer_kernels());
    test::load_state(*c, saved);
    c->step(pa.data(), ga.data(), 1e-2, 3, 0.0);
    b->step(pb.data(), gb.data(), 1e-2, 3, 0.0);
    EXPECT_TRUE(test::bitwise_equal(pa, pb));
    EXPECT_EQ(test::saved_state(*b, n, nullptr), test::saved_state(*c, n, nullptr));
  }
}

INSTANTIATE_TEST_SUITE_P(AdamWOrMuon, DeviceOptimizerOnCpu, ::testing::Bool());

class GpuOptimizer : public ::testing::TestWithParam<bool> {};  // with Muon or not

// The GPU's backend, for the optimizer's state.
Backend& gpu_backend() {
  static std::unique_ptr<Backend> b = gpu::make_cuda_backend(0, "the optimizer tests");
  return *b;
}

TEST_P(GpuOptimizer, MatchesTheCpuOptimizerWithClippingAndTheBf16Copy) {
  SKIP_WITHOUT_GPU();
  const bool with_muon = GetParam();
  ParamTable table(test::tiny_moe_config());
  auto cpu = make_optimizer(table, options(with_muon), nullptr);
  auto gpu_opt = make_device_optimizer(table, options(with_muon), gpu_backend());
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
  auto opt = make_device_optimizer(table, options(GetParam()), gpu_backend());
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
  auto a = make_device_optimizer(table, options(GetParam()), gpu_backend());
  auto b = make_device_optimizer(table, options(GetParam()), gpu_backend());
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

// Data parallel on the GPU, NCCL against host staging, in a group of one (the GPU test machine
// has one GPU, and NCCL takes one rank a GPU): both layouts, with and without Muon, with the
// gradient reduction started during "backward" (each tensor reported final, the last first) in
// several buckets and clipping active. Of one rank both paths average to the rank's own
// gradients, so the steps must give the same bits. That runs the NCCL path end to end (the
// grouped reduce and broadcast, ZeRO-1's gather, the side stream and its joins) on a GPU; it
// cannot tell whether the buckets cover the slab (a reduction of one rank changes nothing):
// NcclBuckets.* checks that on every machine.
TEST(GpuDataParallel, NcclStepsAsHostStagingDoesInAGroupOfOne) {
  SKIP_WITHOUT_GPU();
  if (!gpu::built_with_nccl()) GTEST_SKIP() << "this build has no NCCL";
  Communicator& world = test::mpi_world();
  if (world.size() != 1) GTEST_SKIP() << "expects a singleton (no mpirun)";
  ParamTable table(test::tiny_moe_config());
  const int64_t n = table.total_elements();
  const std::vector<int64_t> offsets = test::offsets_last_first(table);
  for (const bool zero1 : {false, true})
    for (const bool with_muon : {false, true}) {
      SCOPED_TRACE(test::layout_case(zero1, with_muon));
      OptimizerOptions o = options(with_muon);
      o.zero1 = zero1;
      o.bucket_elements = 4096;  // several buckets
      auto host =
          make_device_data_parallel_optimizer(table, o, gpu_backend(), world, GpuGradients::host);
      auto nccl =
          make_device_data_parallel_optimizer(table, o, gpu_backend(), world, GpuGradients::nccl);
      EXPECT_NE(std::string(nccl->layout_name()).find("NCCL"), std::string::npos)
          << nccl->layout_name();
      const std::vector<float> start = random_slab(table, 3, 0.1);
      gpu::DeviceBuffer p_host = to_device(start), p_nccl = to_device(start);
      for (int64_t step = 1; step <= 3; ++step) {
        const std::vector<float> grads = random_slab(table, 20 + step, 1.0);
        gpu::DeviceBuffer g_host = to_device(grads), g_nccl = to_device(grads);
        const double norm_host =
            host->step(p_host.as<float>(), g_host.as<float>(), 1e-2, step, 0.5);
        nccl->begin_backward(g_nccl.as<float>());
        for (int64_t offset : offsets) nccl->gradients_final(offset);
        const double norm_nccl =
            nccl->step(p_nccl.as<float>(), g_nccl.as<float>(), 1e-2, step, 0.5);
        EXPECT_EQ(norm_nccl, norm_host) << "step " << step;
        ASSERT_EQ(to_host<float>(p_nccl, n), to_host<float>(p_host, n)) << "step " << step;
      }
    }
}

}  // namespace
}  // namespace foundry
