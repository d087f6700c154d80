// GEMM throughput on the shapes the benchmark model runs (moe-bench: 2048 tokens per step,
// d_model 512, 8 experts of width 1024 with ~512 rows each, vocabulary 8192).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <vector>

#include "base/page_slab.h"
#include "kernels/gemm.h"
#include "kernels/row_products.h"

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
    ->Args({128, 128, 2048, 1, 1})                   // ZAYA1 router MLP dW (zaya-bench)
    ->Args({128, 512, 2048, 1, 1})                   // ZAYA1 router down-projection dW
    ->Args({1024, 1024, 1024, 0, 0})->Args({1024, 1024, 1024, 1, 0})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace foundry

namespace foundry {
namespace {

// A decode step's x·Wᵀ (K 512) over `rows` rows: {rows, N, kernel}, kernel 0 the row-invariant
// kernels (kernels/row_products.h, what decoding runs below AVX-512), 1 oneDNN's product in
// the default rows mode (runtime M, not row-invariant below AVX-512; exact M on AMX), fp32.
void BM_DecodeProduct(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = 512;
  // Page-aligned, as the model's weights and activations are (a row's loads never split).
  PageSlab<float> a(m * k), w(n * k), c(m * n);
  std::fill(a.data(), a.data() + m * k, 0.25f);
  std::fill(w.data(), w.data() + n * k, 0.5f);
  for (auto _ : state) {
    if (state.range(2) == 0)
      ops::row_product(MatView::rows_major(a.data(), DType::f32, m, k),
                       MatView::transposed(w.data(), DType::f32, k, n),
                       OutView::rows_major(c.data(), m, n), false);
    else
      gemm(a.data(), false, w.data(), true, c.data(), m, n, k, DType::f32);
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * m * n * k * state.iterations(), benchmark::Counter::kIsRate,
                         benchmark::Counter::kIs1000);
}
BENCHMARK(BM_DecodeProduct)
    ->ArgsProduct({{1, 16, 64}, {1536, 8192}, {0, 1}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

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

namespace foundry {
namespace {

// One expert's products at zaya-bench's shape (256 rows, d_model 512, 2 × 2176 gate|up
// outputs, 2176 down inputs) in a rows mode (gemm_rows_mode()): arg 0 the product (0 up
// forward, 1 down forward, 2 up input gradient, 3 up weight gradient, 4 down weight
// gradient), arg 1 the mode (0 runtime, 1 exact: exact-m for 0-2, exact-k for 3-4).
void BM_ExpertProduct(benchmark::State& state) {
  struct Shape { int64_t m, n, k; bool ta, tb; };
  const int64_t rows = 256;
  const Shape shapes[] = {{rows, 4352, 512, false, true}, {rows, 512, 2176, false, true},
                          {rows, 512, 4352, false, false}, {4352, 512, rows, true, false},
                          {512, 2176, rows, true, false}};
  const Shape& s = shapes[state.range(0)];
  const GemmRows restore = gemm_rows_mode();
  set_gemm_rows_mode(state.range(1) == 0 ? GemmRows::runtime
                     : state.range(0) < 3 ? GemmRows::exact_m
                                          : GemmRows::exact_k);
  std::vector<bf16> a(s.m * s.k, 0x3e80), b(s.k * s.n, 0x3f00);
  std::vector<float> c(s.m * s.n);
  gemm(a.data(), s.ta, b.data(), s.tb, c.data(), s.m, s.n, s.k, DType::bf16);  // creates it
  for (auto _ : state) gemm(a.data(), s.ta, b.data(), s.tb, c.data(), s.m, s.n, s.k, DType::bf16);
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * s.m * s.n * s.k * state.iterations(), benchmark::Counter::kIsRate,
                         benchmark::Counter::kIs1000);
  set_gemm_rows_mode(restore);
}
BENCHMARK(BM_ExpertProduct)
    ->ArgsProduct({{0, 1, 2, 3, 4}, {0, 1}})
    ->ArgNames({"product", "exact"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace foundry
