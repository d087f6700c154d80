// The whole model on a GPU against the same model on the CPU (suites Gpu*, ctest label gpu;
// skipped where no GPU is visible): fp32 losses within 1e-4 (relative) of the CPU's over 20
// steps and the gradients close, bf16 losses within 2% of the CPU's bf16 curve, and the same
// seed giving the same losses bit for bit on the GPU; decoding with the CPU's greedy tokens
// and logits within 1e-4 in fp32; micro-batches' accumulated gradients against the CPU's whole
// batch. Both architectures.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <utility>
#include <vector>

#include "base/rng.h"
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

// Micro-batches on the GPU: four of one sequence each, their losses weighted 1/4 and their
// gradients accumulated (the GEMMs' accumulate flag; the experts' weight gradients added, not
// written), give the CPU's gradient of the whole batch (no auxiliary loss: a micro-batch's is
// its own).
void expect_micro_batches_match_cpus_whole_batch(ModelConfig c) {
  c.aux_loss_coef = 0;
  const std::unique_ptr<Backend> gpu = gpu0();
  Model cpu(c, DType::f32), dev(c, DType::f32, *gpu);
  cpu.init_weights(3);
  dev.init_weights(3);
  constexpr int64_t kRows = 4;
  const testing::Batch batch = testing::random_batch(c, kRows * kSeq, 7);
  cpu.zero_grads();
  const double whole = cpu.forward(batch.inputs.data(), batch.targets.data(), kRows, kSeq).loss;
  cpu.backward();
  dev.zero_grads();
  dev.set_loss_weight(1.0 / kRows);
  double mean = 0;
  for (int64_t m = 0; m < kRows; ++m) {
    mean +=
        dev.forward(batch.inputs.data() + m * kSeq, batch.targets.data() + m * kSeq, 1, kSeq).loss /
        kRows;
    dev.backward(/*accumulate=*/m > 0);
  }
  dev.set_loss_weight(1.0);
  EXPECT_NEAR(mean, whole, 1e-4 * whole);
  std::vector<float> want(cpu.slab_size()), got(dev.slab_size());
  cpu.read_grads(want.data());
  dev.read_grads(got.data());
  EXPECT_LT(relative_l2(got, want), 1e-3);
}

TEST(GpuModel, MicroBatchesAccumulateTheCpusWholeBatchGradient) {
  SKIP_WITHOUT_GPU();
  expect_micro_batches_match_cpus_whole_batch(gpu_moe());
  expect_micro_batches_match_cpus_whole_batch(gpu_zaya());
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

// ---- decoding ----------------------------------------------------------------------------
// B sequences decoded greedily in step for T tokens from one random first token each: the
// logits of every step [T, B, Vp] and the tokens chosen [T, B].
struct Decoded {
  std::vector<float> logits;
  std::vector<int32_t> tokens;
};

int32_t argmax(const float* logits, int64_t n) {
  return static_cast<int32_t>(std::max_element(logits, logits + n) - logits);
}

// With `forced` (the CPU's tokens), every step feeds those instead of its own choice, so both
// devices see the same inputs and their logits compare position by position.
Decoded decode_greedy(Model& m, int64_t B, int64_t T, const std::vector<int32_t>* forced) {
  const int64_t Vp = m.config().padded_vocab();
  Rng rng(29);
  std::vector<int32_t> tokens(B);
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng.below(m.config().vocab_size));
  auto state = m.new_decode_state(T + 1, B);
  Decoded d;
  for (int64_t t = 0; t < T; ++t) {
    const float* logits = m.decode_step(state, tokens.data());
    d.logits.insert(d.logits.end(), logits, logits + B * Vp);
    for (int64_t b = 0; b < B; ++b) {
      d.tokens.push_back(argmax(logits + b * Vp, Vp));
      tokens[b] = forced ? (*forced)[t * B + b] : d.tokens.back();
    }
  }
  return d;
}

// fp32: the GPU's logits within 1e-4 of the CPU's (relative to their size) at every step,
// and the same greedy tokens, both when each device follows its own choices and when both
// follow the CPU's.
void expect_decode_matches_cpu(const ModelConfig& c) {
  const std::unique_ptr<Backend> gpu = gpu0();
  Model cpu_model(c, DType::f32), gpu_model(c, DType::f32, *gpu);
  cpu_model.init_weights(11);
  gpu_model.init_weights(11);
  const int64_t B = 4, T = c.max_seq_len - 1;
  const Decoded cpu = decode_greedy(cpu_model, B, T, nullptr);
  const Decoded own = decode_greedy(gpu_model, B, T, nullptr);
  const Decoded forced = decode_greedy(gpu_model, B, T, &cpu.tokens);
  EXPECT_EQ(own.tokens, cpu.tokens);
  EXPECT_EQ(forced.tokens, cpu.tokens);
  ASSERT_EQ(forced.logits.size(), cpu.logits.size());
  double worst = 0, scale = 0;
  for (size_t i = 0; i < cpu.logits.size(); ++i)
    if (std::isfinite(cpu.logits[i])) scale = std::max(scale, std::abs(double(cpu.logits[i])));
  for (size_t i = 0; i < cpu.logits.size(); ++i) {
    if (!std::isfinite(cpu.logits[i])) {
      EXPECT_EQ(forced.logits[i], cpu.logits[i]) << i;  // the masked padded vocabulary
      continue;
    }
    worst = std::max(worst, std::abs(double(forced.logits[i]) - cpu.logits[i]));
  }
  EXPECT_LT(worst, 1e-4 * scale) << "largest logit " << scale;
}

// Rows at their own positions over a shared prefix segment (testing::shared_prefix_logits):
// the GPU's logits close to the CPU's and their greedy tokens the same, and the same steps
// twice give the GPU the same bits.
std::vector<float> shared_prefix_rows(Model& m) {
  Rng rng(31);
  return testing::shared_prefix_logits(m, rng);
}

// got's and want's elements where want is finite (the padded vocabulary is −inf).
std::pair<std::vector<float>, std::vector<float>> finite_pairs(const std::vector<float>& got,
                                                               const std::vector<float>& want) {
  std::pair<std::vector<float>, std::vector<float>> out;
  for (size_t i = 0; i < want.size(); ++i)
    if (std::isfinite(want[i])) out.first.push_back(got[i]), out.second.push_back(want[i]);
  return out;
}

void expect_rows_match_cpu(const ModelConfig& c) {
  const std::unique_ptr<Backend> gpu = gpu0();
  Model cpu_model(c, DType::f32), gpu_model(c, DType::f32, *gpu);
  cpu_model.init_weights(12);
  gpu_model.init_weights(12);
  const std::vector<float> want = shared_prefix_rows(cpu_model);
  const std::vector<float> got = shared_prefix_rows(gpu_model);
  EXPECT_TRUE(got == shared_prefix_rows(gpu_model)) << "not bitwise repeatable";
  ASSERT_EQ(got.size(), want.size());
  const int64_t Vp = c.padded_vocab();
  for (size_t r = 0; r < want.size() / Vp; ++r)
    EXPECT_EQ(argmax(&got[r * Vp], Vp), argmax(&want[r * Vp], Vp)) << "row " << r;
  const auto [finite_got, finite_want] = finite_pairs(got, want);
  EXPECT_LT(relative_l2(finite_got, finite_want), 1e-5);
}

TEST(GpuDecodeModel, MoeFp32MatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  expect_decode_matches_cpu(gpu_moe());
  expect_rows_match_cpu(gpu_moe());
}

TEST(GpuDecodeModel, ZayaFp32MatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  expect_decode_matches_cpu(gpu_zaya());
  expect_rows_match_cpu(gpu_zaya());
}

TEST(GpuDecodeModel, Bf16DecodesCloseToTheCpu) {
  SKIP_WITHOUT_GPU();
  for (const ModelConfig& c : {gpu_moe(), gpu_zaya()}) {
    const std::unique_ptr<Backend> gpu = gpu0();
    Model cpu_model(c, DType::bf16), gpu_model(c, DType::bf16, *gpu);
    cpu_model.init_weights(13);
    gpu_model.init_weights(13);
    const Decoded cpu = decode_greedy(cpu_model, 2, 6, nullptr);
    const Decoded gpu_run = decode_greedy(gpu_model, 2, 6, &cpu.tokens);
    const auto [a, b] = finite_pairs(gpu_run.logits, cpu.logits);
    EXPECT_LT(relative_l2(a, b), 2e-2) << (c.is_zaya() ? "zaya1" : "moe");
  }
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
