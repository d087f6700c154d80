// Element-wise and reduction kernels at the moe-bench model's shapes (B·T = 2048 tokens,
// C = 512, F = 1024, E = 8, K = 2, vocabulary 8192).
//   perf_kernels --benchmark_filter='RmsNorm|Rope|SwiGlu|Router|CrossEntropy|Moe'
// "bytes" is the minimum memory traffic (each tensor read or written once).
#include <benchmark/benchmark.h>

#include <vector>

#include "base/rng.h"
#include "kernels/ops.h"

namespace foundry::ops {
namespace {

constexpr int64_t kTokens = 2048, kModel = 512, kFfn = 1024, kExperts = 8, kTopK = 2;
constexpr int64_t kVocab = 8192;

std::vector<float> random_floats(int64_t count, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(count);
  for (auto& x : v) x = static_cast<float>(rng.normal());
  return v;
}

void set_bytes(benchmark::State& state, int64_t floats) {
  state.SetBytesProcessed(state.iterations() * floats * static_cast<int64_t>(sizeof(float)));
}

void BM_RmsNormForward(benchmark::State& state) {
  const auto in = random_floats(kTokens * kModel, 1), w = random_floats(kModel, 2);
  std::vector<float> out(in.size()), rstd(kTokens);
  for (auto _ : state)
    rmsnorm_forward(out.data(), rstd.data(), in.data(), w.data(), kTokens, kModel, 1e-5f);
  set_bytes(state, 2 * kTokens * kModel);
}

void BM_RmsNormBackward(benchmark::State& state) {
  const auto in = random_floats(kTokens * kModel, 1), w = random_floats(kModel, 2);
  const auto dout = random_floats(kTokens * kModel, 3);
  std::vector<float> out(in.size()), rstd(kTokens), din(in.size()), dw(kModel);
  rmsnorm_forward(out.data(), rstd.data(), in.data(), w.data(), kTokens, kModel, 1e-5f);
  for (auto _ : state)
    rmsnorm_backward(din.data(), dw.data(), dout.data(), in.data(), w.data(), rstd.data(),
                     kTokens, kModel);
  set_bytes(state, 4 * kTokens * kModel);
}

void BM_Rope(benchmark::State& state) {
  auto q = random_floats(kTokens * kModel, 1);
  for (auto _ : state) rope_apply(q.data(), 8, kTokens / 8, 8, 64, 64, 0, 10000.0, false);
  set_bytes(state, 2 * kTokens * kModel);
}

void BM_SwiGluForward(benchmark::State& state) {
  const auto h = random_floats(kTokens * kTopK * 2 * kFfn, 1);
  std::vector<float> out(kTokens * kTopK * kFfn);
  for (auto _ : state) swiglu_forward(out.data(), h.data(), kTokens * kTopK, kFfn);
  set_bytes(state, 3 * kTokens * kTopK * kFfn);
}

void BM_SwiGluBackward(benchmark::State& state) {
  const auto h = random_floats(kTokens * kTopK * 2 * kFfn, 1);
  const auto dout = random_floats(kTokens * kTopK * kFfn, 2);
  std::vector<float> dh(h.size());
  for (auto _ : state) swiglu_backward(dh.data(), dout.data(), h.data(), kTokens * kTopK, kFfn);
  set_bytes(state, 5 * kTokens * kTopK * kFfn);
}

void BM_RouterForwardBackward(benchmark::State& state) {
  const auto logits = random_floats(kTokens * kExperts, 1);
  const auto dw = random_floats(kTokens * kTopK, 2);
  std::vector<float> probs(logits.size()), w(kTokens * kTopK), dlogits(logits.size());
  std::vector<int32_t> idx(kTokens * kTopK);
  for (auto _ : state) {
    router_forward(probs.data(), idx.data(), w.data(), logits.data(), kTokens, kExperts, kTopK,
                   true);
    benchmark::DoNotOptimize(router_aux_loss(probs.data(), idx.data(), kTokens, kExperts, kTopK));
    router_backward(dlogits.data(), dw.data(), probs.data(), idx.data(), w.data(), kTokens,
                    kExperts, kTopK, true, 0.01f);
  }
}

void BM_MoeDispatchGatherCombine(benchmark::State& state) {
  const auto logits = random_floats(kTokens * kExperts, 1);
  const auto x = random_floats(kTokens * kModel, 2);
  std::vector<float> probs(logits.size()), w(kTokens * kTopK);
  std::vector<int32_t> idx(kTokens * kTopK), slot_token(kTokens * kTopK),
      assignment_slot(kTokens * kTopK);
  std::vector<int64_t> offsets(kExperts + 1);
  router_forward(probs.data(), idx.data(), w.data(), logits.data(), kTokens, kExperts, kTopK,
                 true);
  std::vector<float> xs(kTokens * kTopK * kModel), out(kTokens * kModel);
  for (auto _ : state) {
    moe_dispatch_plan(offsets.data(), slot_token.data(), assignment_slot.data(), idx.data(),
                      kTokens, kExperts, kTopK);
    moe_gather(xs.data(), x.data(), slot_token.data(), kTokens * kTopK, kModel);
    moe_combine(out.data(), xs.data(), w.data(), assignment_slot.data(), kTokens, kTopK, kModel);
  }
  set_bytes(state, (2 + 4 * kTopK) * kTokens * kModel);
}

void BM_CrossEntropy(benchmark::State& state) {
  const auto logits = random_floats(kTokens * kVocab, 1);
  std::vector<int32_t> targets(kTokens);
  for (int64_t i = 0; i < kTokens; ++i) targets[i] = static_cast<int32_t>(i * 7 % kVocab);
  std::vector<float> dlogits(logits.size()), losses(kTokens);
  for (auto _ : state)
    benchmark::DoNotOptimize(cross_entropy(dlogits.data(), losses.data(), logits.data(),
                                           targets.data(), kTokens, kVocab, kVocab,
                                           1.0f / kTokens));
  set_bytes(state, 2 * kTokens * kVocab);
}

BENCHMARK(BM_RmsNormForward)->UseRealTime();
BENCHMARK(BM_RmsNormBackward)->UseRealTime();
BENCHMARK(BM_Rope)->UseRealTime();
BENCHMARK(BM_SwiGluForward)->UseRealTime();
BENCHMARK(BM_SwiGluBackward)->UseRealTime();
BENCHMARK(BM_RouterForwardBackward)->UseRealTime();
BENCHMARK(BM_MoeDispatchGatherCombine)->UseRealTime();
BENCHMARK(BM_CrossEntropy)->UseRealTime();

}  // namespace
}  // namespace foundry::ops
