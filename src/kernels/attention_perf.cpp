// Attention at the benchmark model's shape, against the batched GEMMs it is built from.
//   perf_kernels --benchmark_filter=Attention
// "GFLOPs" counts the full (unmasked) score and value products: 2 GEMMs forward, 4 backward
// (the tiled backward runs a fifth, recomputing the scores, which is not credited),
// each 2·B·H·T²·D, so the figure compares directly with the plain GEMM rate below.
#include <benchmark/benchmark.h>

#include <vector>

#include "base/rng.h"
#include "kernels/attention.h"

namespace foundry::ops {
namespace {

std::vector<float> random_floats(int64_t count, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(count);
  for (auto& x : v) x = static_cast<float>(rng.normal());
  return v;
}

// Args {kv heads, bf16?}: the benchmark model's shape. Long: args {T, bf16?} at zaya-bench's
// attention shape (8 query heads, 2 kv heads, head dim 64), one sequence.
AttentionShape shape_of(const benchmark::State& state) {
  if (state.range(0) >= 512) return {1, state.range(0), 8, 2, 64};
  return {8, 256, 8, state.range(0), 64};
}

DType dtype_of(const benchmark::State& state) {
  return state.range(1) ? DType::bf16 : DType::f32;
}

double product_flops(const AttentionShape& s) {
  return 2.0 * s.b * s.h * s.t * s.t * s.d;
}

void BM_AttentionForward(benchmark::State& state) {
  const AttentionShape s = shape_of(state);
  const auto q = random_floats(s.b * s.t * s.h * s.d, 1);
  const auto k = random_floats(s.b * s.t * s.kvh * s.d, 2);
  const auto v = random_floats(s.b * s.t * s.kvh * s.d, 3);
  std::vector<float> out(q.size()), lse(s.b * s.h * s.t);
  for (auto _ : state)
    attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), s, dtype_of(state));
  state.counters["GFLOPs"] = benchmark::Counter(2 * product_flops(s) * 1e-9,
                                                benchmark::Counter::kIsIterationInvariantRate);
}

void BM_AttentionBackward(benchmark::State& state) {
  const AttentionShape s = shape_of(state);
  const auto q = random_floats(s.b * s.t * s.h * s.d, 1);
  const auto k = random_floats(s.b * s.t * s.kvh * s.d, 2);
  const auto v = random_floats(s.b * s.t * s.kvh * s.d, 3);
  const auto dout = random_floats(q.size(), 4);
  std::vector<float> out(q.size()), lse(s.b * s.h * s.t);
  std::vector<float> dq(q.size()), dk(k.size()), dv(v.size());
  attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), s, dtype_of(state));
  for (auto _ : state)
    attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(),
                       q.data(), k.data(), v.data(), s, dtype_of(state));
  state.counters["GFLOPs"] = benchmark::Counter(4 * product_flops(s) * 1e-9,
                                                benchmark::Counter::kIsIterationInvariantRate);
}

// One contiguous batched product of the same size: [B·H] × (T×D · D×T).
void BM_BatchedScoreGemm(benchmark::State& state) {
  const AttentionShape s = shape_of(state);
  const DType dtype = dtype_of(state);
  const int64_t batch = s.b * s.h;
  const auto a = random_floats(batch * s.t * s.d, 1), b = random_floats(batch * s.t * s.d, 2);
  std::vector<bf16> ah(a.size()), bh(b.size());
  convert_to_bf16(a.data(), ah.data(), a.size());
  convert_to_bf16(b.data(), bh.data(), b.size());
  const void* ap = dtype == DType::bf16 ? static_cast<const void*>(ah.data()) : a.data();
  const void* bp = dtype == DType::bf16 ? static_cast<const void*>(bh.data()) : b.data();
  std::vector<float> c(batch * s.t * s.t);
  const MatView av{ap, dtype, {batch, s.t, s.d}, {s.t * s.d, s.d, 1}};
  const MatView bv{bp, dtype, {batch, s.d, s.t}, {s.t * s.d, 1, s.d}};
  const OutView cv{c.data(), {batch, s.t, s.t}, {s.t * s.t, s.t, 1}};
  for (auto _ : state) matmul(av, bv, cv);
  state.counters["GFLOPs"] = benchmark::Counter(product_flops(s) * 1e-9,
                                                benchmark::Counter::kIsIterationInvariantRate);
}

// One decode step's attention: args {kv heads, batch}, 8 query heads of 64 against caches of
// 256 positions (moe-bench: 8 kv heads; zaya-bench: 2). "GFLOPs": 4·B·H·len·D.
void BM_AttentionDecode(benchmark::State& state) {
  const int64_t h = 8, kvh = state.range(0), batch = state.range(1), len = 256, d = 64;
  const auto q = random_floats(batch * h * d, 1);
  auto k = random_floats(DecodeKv::floats(batch, kvh, d, len), 2), v = random_floats(k.size(), 3);
  const DecodeKv cache{k.data(), v.data(), batch, kvh, d, len};
  std::vector<float> out(batch * h * d), scores(batch * h * len);
  for (auto _ : state) attention_decode(out.data(), scores.data(), q.data(), cache, len, h);
  state.counters["GFLOPs"] = benchmark::Counter(4.0 * batch * h * len * d * 1e-9,
                                                benchmark::Counter::kIsIterationInvariantRate);
}

// Batch generation's decode attention: `rows` rows (args {rows, shared?}), 6 query heads of 64
// over 2 KV heads, each reading a prefix of 1,024 positions and 64 of its own. shared = 1: one
// prefix for all the rows (read once per group); 0: a prefix each.
void BM_AttentionDecodeRows(benchmark::State& state) {
  const int64_t h = 6, kvh = 2, d = 64, rows = state.range(0), prefix = 1024, own = 64;
  const bool shared = state.range(1) != 0;
  const int64_t prefixes = shared ? 1 : rows;
  const auto q = random_floats(rows * h * d, 1);
  auto pk = random_floats(prefixes * DecodeKv::floats(1, kvh, d, prefix), 2);
  auto pv = random_floats(pk.size(), 3);
  auto ok = random_floats(rows * DecodeKv::floats(1, kvh, d, own), 4), ov = random_floats(ok.size(), 5);
  std::vector<DecodeSpan> spans;
  std::vector<int64_t> first = {0};
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t p = shared ? 0 : r;
    spans.push_back({pk.data() + p * DecodeKv::floats(1, kvh, d, prefix),
                     pv.data() + p * DecodeKv::floats(1, kvh, d, prefix), prefix, prefix});
    spans.push_back({ok.data() + r * DecodeKv::floats(1, kvh, d, own),
                     ov.data() + r * DecodeKv::floats(1, kvh, d, own), own, own});
    first.push_back(static_cast<int64_t>(spans.size()));
  }
  const int64_t len = prefix + own;
  std::vector<float> out(rows * h * d), scores(rows * h * len);
  for (auto _ : state)
    attention_decode_rows(out.data(), scores.data(), len, q.data(), spans.data(), first.data(),
                          rows, h, kvh, d);
  state.counters["GFLOPs"] = benchmark::Counter(4.0 * rows * h * len * d * 1e-9,
                                                benchmark::Counter::kIsIterationInvariantRate);
}

// A prompt chunk's attention in batch generation: `rows` consecutive positions of one
// sequence after 1,024 computed ones (args {rows}), 6 query heads of 64 over 2 KV heads; row r
// reads positions 0 … 1,024 + r of the same segment.
void BM_AttentionPromptChunk(benchmark::State& state) {
  const int64_t h = 6, kvh = 2, d = 64, rows = state.range(0), prefix = 1024;
  const int64_t capacity = prefix + rows;
  const auto q = random_floats(rows * h * d, 1);
  auto k = random_floats(DecodeKv::floats(1, kvh, d, capacity), 2);
  auto v = random_floats(k.size(), 3);
  std::vector<DecodeSpan> spans;
  std::vector<int64_t> first = {0};
  double positions = 0;
  for (int64_t r = 0; r < rows; ++r) {
    spans.push_back({k.data(), v.data(), prefix + r + 1, capacity});
    first.push_back(r + 1);
    positions += static_cast<double>(prefix + r + 1);
  }
  std::vector<float> out(rows * h * d), scores(rows * h * capacity);
  for (auto _ : state)
    attention_decode_rows(out.data(), scores.data(), capacity, q.data(), spans.data(),
                          first.data(), rows, h, kvh, d);
  state.counters["GFLOPs"] = benchmark::Counter(4.0 * positions * h * d * 1e-9,
                                                benchmark::Counter::kIsIterationInvariantRate);
}

// Args: {kv heads, bf16?}.
BENCHMARK(BM_AttentionForward)
    ->ArgsProduct({{8, 2}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_AttentionBackward)
    ->ArgsProduct({{8, 2}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_AttentionForward)
    ->Name("BM_AttentionLongForward")
    ->ArgsProduct({{2048, 4096, 8192, 16384, 32768}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_AttentionBackward)
    ->Name("BM_AttentionLongBackward")
    ->ArgsProduct({{2048, 4096, 8192, 16384, 32768}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_BatchedScoreGemm)
    ->ArgsProduct({{8}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_AttentionDecodeRows)
    ->ArgsProduct({{1, 8, 64}, {0, 1}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();
BENCHMARK(BM_AttentionPromptChunk)->Arg(16)->Arg(64)->Unit(benchmark::kMicrosecond)->UseRealTime();
// Args: {kv heads, batch}.
BENCHMARK(BM_AttentionDecode)
    ->ArgsProduct({{8, 4, 2, 1}, {1, 16, 64}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

}  // namespace
}  // namespace foundry::ops
