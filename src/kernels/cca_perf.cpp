// The CCA convolutions at zaya-bench's shape (8 sequences of 256 tokens, 10 groups of
// 64 channels, 2 taps): the grouped convolution's register-tiled reference kernel against the
// oneDNN form, and the depthwise convolution's backward.
#include <benchmark/benchmark.h>

#include <vector>

#include "kernels/cca.h"

namespace foundry::ops {
namespace {

constexpr int64_t kB = 8, kT = 256, kGroups = 10, kD = 64, kTaps = 2, kC = kGroups * kD;

struct Data {
  std::vector<float> y = std::vector<float>(kB * kT * kC, 0.5f), z = y, dz = y, dy = y;
  std::vector<float> w1 = std::vector<float>(kC * kD * kTaps, 0.01f), dw1 = w1;
  std::vector<float> b1 = std::vector<float>(kC, 0.1f), db1 = b1;
};

double conv_flops() { return 2.0 * kB * kT * kC * kD * kTaps; }

// Arg 0: 0 = reference kernel, 1 = oneDNN fp32, 2 = oneDNN bf16.
void BM_CcaGroupedForward(benchmark::State& state) {
  Data d;
  for (auto _ : state) {
    if (state.range(0) == 0)
      cca_grouped_conv_forward(d.z.data(), d.y.data(), d.w1.data(), d.b1.data(), kB, kT, kGroups,
                               kD, kTaps);
    else
      cca_grouped_conv_forward_gemm(d.z.data(), d.y.data(), d.w1.data(), d.b1.data(), kB, kT,
                                    kGroups, kD, kTaps,
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
      cca_grouped_conv_backward(d.dy.data(), d.dw1.data(), d.db1.data(), d.dz.data(), d.y.data(),
                                d.w1.data(), kB, kT, kGroups, kD, kTaps);
    else
      cca_grouped_conv_backward_gemm(d.dy.data(), d.dw1.data(), d.db1.data(), d.dz.data(),
                                     d.y.data(), d.w1.data(), kB, kT, kGroups, kD, kTaps,
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
