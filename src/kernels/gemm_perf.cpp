// GEMM throughput on the shapes the benchmark model runs (moe-bench: 2048 tokens per step,
// d_model 512, 8 experts of width 1024 with ~512 rows each, vocabulary 8192).
#include <benchmark/benchmark.h>

#include <vector>

#include "kernels/gemm.h"

namespace foundry {
namespace {

void BM_Gemm(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  const bool bf16_inputs = state.range(3) != 0;
  const bool trans_a = state.range(4) & 1, trans_b = state.range(4) & 2;
  std::vector<float> a(m * k, 0.25f), b(k * n, 0.5f), c(m * n);
  std::vector<bf16> ah(m * k), bh(k * n);
  convert_to_bf16(a.data(), ah.data(), m * k);
  convert_to_bf16(b.data(), bh.data(), k * n);
  const void* ap = bf16_inputs ? static_cast<const void*>(ah.data()) : a.data();
  const void* bp = bf16_inputs ? static_cast<const void*>(bh.data()) : b.data();
  const DType dt = bf16_inputs ? DType::bf16 : DType::f32;
  for (auto _ : state) gemm(ap, trans_a, bp, trans_b, c.data(), m, n, k, dt);
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * m * n * k * state.iterations(), benchmark::Counter::kIsRate,
                         benchmark::Counter::kIs1000);
}

// {M, N, K, bf16, transpose flags (1 = A, 2 = B)}
BENCHMARK(BM_Gemm)
    ->ArgNames({"M", "N", "K", "bf16", "trans"})
    ->Args({2048, 512, 512, 0, 2})->Args({2048, 512, 512, 1, 2})     // q/o projections (fwd)
    ->Args({512, 2048, 512, 0, 2})->Args({512, 2048, 512, 1, 2})     // expert gate|up (fwd)
    ->Args({512, 512, 1024, 1, 2})                                   // expert down (fwd)
    ->Args({2048, 512, 512, 1, 0})                                   // dX = dY·W
    ->Args({512, 512, 2048, 1, 1})                                   // dW = dY^T·X
    ->Args({2048, 8192, 512, 0, 2})->Args({2048, 8192, 512, 1, 2})   // LM head
    ->Args({8192, 512, 2048, 1, 1})                                  // LM head dW
    ->Args({1024, 1024, 1024, 0, 0})->Args({1024, 1024, 1024, 1, 0})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace foundry

namespace foundry {
namespace {

// Eight experts' up-projection GEMMs at zaya-bench's shape (rows ≈ 2048 · 0.9 / 8 each, d_model
// 512, 2 × 2176 outputs): one after another, each on every thread (arg 0), or two at a time on
// one thread each (arg 1).
void BM_ExpertGemms(benchmark::State& state) {
  const std::vector<int64_t> rows = {262, 198, 231, 247, 205, 219, 256, 222};
  const int64_t k = 512, n = 4352;
  int64_t total = 0;
  for (int64_t r : rows) total += r;
  std::vector<bf16> x(total * k, 0x3e80), w(rows.size() * n * k, 0x3f00);
  std::vector<float> y(total * n);
  auto one = [&](size_t e, int64_t first) {
    gemm(x.data() + first * k, false, w.data() + e * n * k, true, y.data() + first * n, rows[e],
         n, k, DType::bf16);
  };
  std::vector<int64_t> firsts(rows.size());
  for (size_t e = 1; e < rows.size(); ++e) firsts[e] = firsts[e - 1] + rows[e - 1];
  for (auto _ : state) {
    if (state.range(0) == 0) {
      for (size_t e = 0; e < rows.size(); ++e) one(e, firsts[e]);
    } else {
#pragma omp parallel for schedule(dynamic, 1)
      for (size_t e = 0; e < rows.size(); ++e) one(e, firsts[e]);
    }
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * total * n * k * state.iterations(), benchmark::Counter::kIsRate,
                         benchmark::Counter::kIs1000);
}
BENCHMARK(BM_ExpertGemms)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace foundry
