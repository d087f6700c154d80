// The whole model on a GPU against the same model on the CPU (suites Gpu*, ctest label gpu;
// skipped where no GPU is visible): fp32 losses within 1e-4 (relative) of the CPU's over 20
// steps and the gradients close, bf16 losses within 2% of the CPU's bf16 curve, and the same
// seed giving the same losses bit for bit on the GPU. Both architectures.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "cuda/cuda_backend.h"
#include "cuda/test_support.h"
#include "model/backends.h"
#include "model/test_support.h"

namespace foundry {
namespace {

using testing::sgd_steps;
using testing::small_moe_config;
using testing::small_zaya_config;

constexpr int kSteps = 20;
constexpr int64_t kBatch = 2, kSeq = 8;
constexpr double kLr = 0.05;

std::unique_ptr<Backend> gpu0() { return open_backend(DeviceSpec{true, 0}, "test"); }

// A somewhat wider model than the CPU tests' so that the kernels' tiles are exercised: two
// heads' worth of query tiles per group, experts with uneven row counts.
ModelConfig gpu_moe() {
  ModelConfig c = small_moe_config(4, 2);
  c.d_model = 64;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 16;
  c.ffn_dim = 48;
  c.init_std = 0.05;
  c.validate("test");
  return c;
}

ModelConfig gpu_zaya() {
  ModelConfig c = small_zaya_config(gpu_moe());
  c.top_k = 1;
  c.validate("test");
  return c;
}

struct Run {
  std::vector<double> losses;
  std::vector<float> grads;  // after the last step
};

Run train(const ModelConfig& c, DType precision, Backend* backend) {
  std::unique_ptr<Model> model = backend ? std::make_unique<Model>(c, precision, *backend)
                                         : std::make_unique<Model>(c, precision);
  model->init_weights(3);
  Run r;
  r.losses = sgd_steps(*model, kSteps, kBatch, kSeq, kLr, &r.grads);
  return r;
}

double relative_l2(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff += std::pow(static_cast<double>(got[i]) - want[i], 2);
    norm += std::pow(static_cast<double>(want[i]), 2);
  }
  return std::sqrt(diff / std::max(norm, 1e-30));
}

void expect_fp32_matches_cpu(const ModelConfig& c) {
  const std::unique_ptr<Backend> gpu = gpu0();
  const Run cpu_run = train(c, DType::f32, nullptr);
  const Run gpu_run = train(c, DType::f32, gpu.get());
  for (int s = 0; s < kSteps; ++s)
    EXPECT_NEAR(gpu_run.losses[s], cpu_run.losses[s], 1e-4 * std::abs(cpu_run.losses[s]))
        << "step " << s;
  EXPECT_LT(relative_l2(gpu_run.grads, cpu_run.grads), 1e-3);
}

void expect_bf16_tracks_cpu(const ModelConfig& c) {
  const std::unique_ptr<Backend> gpu = gpu0();
  const Run cpu_run = train(c, DType::bf16, nullptr);
  const Run gpu_run = train(c, DType::bf16, gpu.get());
  for (int s = 0; s < kSteps; ++s)
    EXPECT_NEAR(gpu_run.losses[s], cpu_run.losses[s], 0.02 * std::abs(cpu_run.losses[s]))
        << "step " << s;
}

void expect_bitwise_repeat(const ModelConfig& c, DType precision) {
  const std::unique_ptr<Backend> gpu = gpu0();
  const Run a = train(c, precision, gpu.get());
  const Run b = train(c, precision, gpu.get());
  EXPECT_EQ(a.losses, b.losses);
  EXPECT_TRUE(a.grads == b.grads);
}

TEST(GpuModel, MoeFp32MatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  expect_fp32_matches_cpu(gpu_moe());
}

TEST(GpuModel, ZayaFp32MatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  expect_fp32_matches_cpu(gpu_zaya());
}

TEST(GpuModel, MoeBf16TracksTheCpu) {
  SKIP_WITHOUT_GPU();
  expect_bf16_tracks_cpu(gpu_moe());
}

TEST(GpuModel, ZayaBf16TracksTheCpu) {
  SKIP_WITHOUT_GPU();
  expect_bf16_tracks_cpu(gpu_zaya());
}

TEST(GpuModel, SameSeedSameLossesBitwise) {
  SKIP_WITHOUT_GPU();
  for (DType precision : {DType::f32, DType::bf16}) {
    expect_bitwise_repeat(gpu_moe(), precision);
    expect_bitwise_repeat(gpu_zaya(), precision);
  }
}

// One process on one GPU: what needs the host's memory is refused with a clear error.
TEST(GpuModel, RefusesDecoding) {
  SKIP_WITHOUT_GPU();
  const std::unique_ptr<Backend> gpu = gpu0();
  Model model(gpu_moe(), DType::f32, *gpu);
  EXPECT_THROW(model.new_decode_state(4), Error);
}

TEST(GpuBackend, IsAClearErrorWithoutAGpu) {
  if (gpu::visible_gpus() > 0) GTEST_SKIP() << "a GPU is visible";
  try {
    open_backend(DeviceSpec{true, 0}, "--device cuda");
    FAIL() << "opening a GPU backend without a GPU did not fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--device cuda"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace foundry
