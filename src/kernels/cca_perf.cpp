// The CCA convolutions at zaya-bench's shape (8 sequences of 256 tokens, 10 groups of
// 64 channels, 2 taps): the grouped convolution's register-tiled reference kernel against the
// oneDNN form, the depthwise convolution's backward, and a training step's whole CCA work
// (blocked against whole-batch, warm and with the caches evicted).
#include <benchmark/benchmark.h>

#include <vector>

#include "kernels/cca.h"

namespace foundry::ops {
namespace {

constexpr int64_t kB = 8, kT = 256, kGroups = 10, kD = 64, kTaps = 2, kC = kGroups * kD;

struct Data {
  std::vector<float> y = std::vector<float>(kB * kT * kC, 0.5f), z = y, dz = y, dy = y;
  std::vector<float> w1 = std::vector<float>(kC * kD * kTaps, 0.01f), dw1 = w1;
  std::vector<float> b1 = std::vector<float>(kC, 0.1f), db1 = b1, dbefore = b1;
};

double conv_flops() { return 2.0 * kB * kT * kC * kD * kTaps; }

// Arg 0: 0 = reference kernel, 1 = oneDNN fp32, 2 = oneDNN bf16.
void BM_CcaGroupedForward(benchmark::State& state) {
  Data d;
  for (auto _ : state) {
    if (state.range(0) == 0)
      cca_grouped_conv_forward(d.z.data(), d.y.data(), d.w1.data(), d.b1.data(), d.b1.data(), kB,
                               kT, kGroups, kD, kTaps);
    else
      cca_grouped_conv_forward_gemm(d.z.data(), d.y.data(), d.w1.data(), d.b1.data(), d.b1.data(),
                                    kB, kT, kGroups, kD, kTaps,
                                    state.range(0) == 2 ? DType::bf16 : DType::f32);
    benchmark::DoNotOptimize(d.z.data());
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(conv_flops() * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_CcaGroupedBackward(benchmark::State& state) {
  Data d;
  for (auto _ : state) {
    if (state.range(0) == 0)
      cca_grouped_conv_backward(d.dy.data(), d.dw1.data(), d.db1.data(), d.dbefore.data(),
                                d.dz.data(), d.y.data(), d.w1.data(), d.b1.data(), kB, kT, kGroups,
                                kD, kTaps);
    else
      cca_grouped_conv_backward_gemm(d.dy.data(), d.dw1.data(), d.db1.data(), d.dbefore.data(),
                                     d.dz.data(), d.y.data(), d.w1.data(), d.b1.data(), kB, kT,
                                     kGroups, kD, kTaps,
                                     state.range(0) == 2 ? DType::bf16 : DType::f32);
    benchmark::DoNotOptimize(d.dy.data());
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(2 * conv_flops() * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// The depthwise convolution's backward (dc, dw0, db0 in one pass): memory-bound.
void BM_CcaDepthwiseBackward(benchmark::State& state) {
  Data d;
  std::vector<float> w0(kC * kTaps, 0.3f), dw0 = w0, db0 = d.b1;
  for (auto _ : state) {
    cca_depthwise_conv_backward(d.dy.data(), dw0.data(), db0.data(), d.dz.data(), d.y.data(),
                                w0.data(), kB, kT, kC, kTaps);
    benchmark::DoNotOptimize(d.dy.data());
  }
  // dz and y read, dy read and written.
  state.SetBytesProcessed(state.iterations() * 4 * kB * kT * kC * int64_t{sizeof(float)});
}

// A training step's CCA work at this shape in bf16, from c to q, k and back. First argument:
// 0 the blocked forms the step runs (rows in blocks of kCcaRowsPerBlock, a task each), 1 the
// whole-batch compositions they replace (the same bits). Second argument: 1 evicts every array
// from the caches before each call (outside the timing), as the rest of a training step does.
constexpr int64_t kHq = 8, kHk = 2;
struct StepData : Data {
  std::vector<float> c = y, qk = y, dc = y, dqk = y, kept = y;
  std::vector<float> q = std::vector<float>(kB * kT * kHq * kD, 0.2f), dq = q;
  std::vector<float> k = std::vector<float>(kB * kT * kHk * kD, 0.3f), dk = k;
  std::vector<float> rnorm = std::vector<float>(kB * kT * kGroups, 0.1f);
  std::vector<float> w0 = std::vector<float>(kC * kTaps, 0.3f), dw0 = w0, b0 = b1, db0 = b1;
  std::vector<float> temp = std::vector<float>(kHk, 1.5f), dtemp = temp;
};

// With the second argument 1, writes a buffer larger than the last-level cache outside the
// timing: what the step's other work does between two calls.
void evict_caches_if_asked(benchmark::State& state) {
  if (!state.range(1)) return;
  state.PauseTiming();
  static std::vector<float> big(static_cast<size_t>(64) << 20);
  for (float& x : big) x += 1.0f;
  benchmark::DoNotOptimize(big.data());
  state.ResumeTiming();
}

void BM_CcaStepForward(benchmark::State& state) {
  StepData d;
  for (auto _ : state) {
    evict_caches_if_asked(state);
    if (state.range(0) == 0) {
      cca_convs_qk_norm_forward_gemm(d.q.data(), d.k.data(), d.rnorm.data(), d.qk.data(),
                                     d.kept.data(), d.c.data(), d.w0.data(), d.b0.data(),
                                     d.w1.data(), d.b1.data(), d.temp.data(), kB, kT, kHq, kHk, kD,
                                     kTaps, kTaps, 1e-6f);
    } else {
      cca_convs_forward_gemm(d.qk.data(), d.kept.data(), d.c.data(), d.w0.data(), d.b0.data(),
                             d.w1.data(), kB, kT, kGroups, kD, kTaps, kTaps);
      cca_means_qk_norm_forward(d.q.data(), d.k.data(), d.rnorm.data(), d.qk.data(), d.c.data(),
                                d.b1.data(), d.temp.data(), kB * kT, kHq, kHk, kD, 1e-6f);
    }
    benchmark::DoNotOptimize(d.q.data());
  }
}

void BM_CcaStepBackward(benchmark::State& state) {
  StepData d;
  cca_convs_forward_gemm(d.qk.data(), d.kept.data(), d.c.data(), d.w0.data(), d.b0.data(),
                         d.w1.data(), kB, kT, kGroups, kD, kTaps, kTaps);
  for (auto _ : state) {
    evict_caches_if_asked(state);
    if (state.range(0) == 0) {
      cca_qk_norm_convs_backward_gemm(
          d.dc.data(), d.dtemp.data(), d.dw0.data(), d.db0.data(), d.dw1.data(), d.db1.data(),
          d.dy.data(), d.dq.data(), d.dk.data(), d.qk.data(), d.rnorm.data(), d.temp.data(),
          d.kept.data(), d.c.data(), d.w0.data(), d.w1.data(), kB, kT, kHq, kHk, kD, kTaps, kTaps);
    } else {
      cca_qk_norm_means_backward(d.dqk.data(), d.dc.data(), d.dtemp.data(), d.dq.data(),
                                 d.dk.data(), d.qk.data(), d.rnorm.data(), d.temp.data(), kB * kT,
                                 kHq, kHk, kD);
      cca_convs_backward_gemm(d.dc.data(), d.dw0.data(), d.db0.data(), d.dw1.data(), d.db1.data(),
                              d.dy.data(), d.dqk.data(), d.kept.data(), d.c.data(), d.w0.data(),
                              d.w1.data(), kB, kT, kGroups, kD, kTaps, kTaps);
    }
    benchmark::DoNotOptimize(d.dc.data());
  }
}

// Args: (0 blocked | 1 whole batch, 0 warm | 1 caches evicted before each call).
BENCHMARK(BM_CcaStepForward)
    ->ArgsProduct({{0, 1}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_CcaStepBackward)
    ->ArgsProduct({{0, 1}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

BENCHMARK(BM_CcaGroupedForward)
    ->Arg(0)
    ->Arg(1)
    ->Arg(2)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_CcaGroupedBackward)
    ->Arg(0)
    ->Arg(1)
    ->Arg(2)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_CcaDepthwiseBackward)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace foundry::ops
