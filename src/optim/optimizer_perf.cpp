// The single-process optimizer step at moe-bench's shape (58.7 M parameters), bf16 training:
// the update with the clip factor and the bf16 weight copy fused into its pass, against the
// same work as separate passes (clip the gradient slab in place, update, convert the slab).
//   perf_optim --benchmark_filter=OptimizerStep
// "bytes" counts the fused step's minimum traffic: p, g, m, v read; p, m, v written; the
// bf16 copy written.
#include <benchmark/benchmark.h>

#include <cmath>
#include <string>
#include <vector>

#include "base/bf16.h"
#include "base/io.h"
#include "base/rng.h"
#include "model/config.h"
#include "optim/optimizer.h"

namespace foundry {
namespace {

ModelConfig moe_bench() {
  const std::string path = std::string(FOUNDRY_SOURCE_DIR) + "/configs/moe-bench.json";
  return parse_model_config(json::parse(read_text_file(path))["model"], path);
}

struct Slabs {
  ParamTable table{moe_bench()};
  std::vector<float> params, grads;
  std::vector<bf16> weights_bf16;
  Slabs() {
    const int64_t n = table.total_elements();
    Rng rng(7);
    params.resize(n);
    grads.resize(n);
    for (int64_t i = 0; i < n; ++i) {
      params[i] = static_cast<float>(0.02 * rng.normal());
      grads[i] = static_cast<float>(rng.normal());  // norm far above the clip: it scales
    }
    weights_bf16.resize(n);
  }
};

OptimizerOptions adamw_only() {
  OptimizerOptions o;
  o.adamw = AdamWOptions{};
  return o;
}

// A clip norm below the last one, so that a gradient clipped in place is clipped again.
double clip_norm(int64_t step) { return std::pow(0.999, static_cast<double>(step)); }

void set_bytes(benchmark::State& state, const Slabs& s) {
  state.SetBytesProcessed(state.iterations() * s.table.total_elements() *
                          static_cast<int64_t>(7 * sizeof(float) + sizeof(bf16)));
}

void BM_OptimizerStepFused(benchmark::State& state) {
  Slabs s;
  auto optimizer = make_optimizer(s.table, adamw_only(), nullptr);
  optimizer->write_bf16_weights(s.weights_bf16.data());
  int64_t step = 1;
  // One step untimed: its first writes to the moments fault their pages in (seconds on some
  // machines), which is start-up cost, not the step's.
  optimizer->step(s.params.data(), s.grads.data(), 1e-4, step, clip_norm(step));
  ++step;
  for (auto _ : state) {
    optimizer->step(s.params.data(), s.grads.data(), 1e-4, step, clip_norm(step));
    ++step;
  }
  set_bytes(state, s);
}

void BM_OptimizerStepSeparatePasses(benchmark::State& state) {
  Slabs s;
  AdamW adamw(s.table, AdamWOptions{});
  int64_t step = 1;
  auto one_step = [&] {
    clip_grad_norm(s.grads.data(), s.table, clip_norm(step));
    adamw.step(s.params.data(), s.grads.data(), 1e-4, step++);
    convert_to_bf16(s.params.data(), s.weights_bf16.data(), s.table.total_elements());
  };
  one_step();  // untimed, as above
  for (auto _ : state) one_step();
  set_bytes(state, s);
}

BENCHMARK(BM_OptimizerStepFused)->UseRealTime()->MinTime(2.0)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_OptimizerStepSeparatePasses)->UseRealTime()->MinTime(2.0)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace foundry
