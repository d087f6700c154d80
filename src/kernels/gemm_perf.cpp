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
