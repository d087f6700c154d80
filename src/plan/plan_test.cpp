#include <gtest/gtest.h>

#include <cmath>

#include "model/info.h"
#include "plan/perf_model.h"
#include "plan/search.h"
#include "base/io.h"

namespace foundry {
namespace {

// A flat machine: every GEMM at 1e12 FLOP/s, `bandwidth` B/s, collectives α = 1e-5 s,
// β = 1e10 B/s.
HardwareProfile flat_profile(const std::string& kind = "cpu", double bandwidth = 1e11) {
  json doc = json::parse(R"({
    "format": "foundry-hardware-profile", "version": 1, "name": "flat",
    "device": {"memory_bytes": 100000000000},
    "compute": {"bf16": {"measured_flops_per_s": 1e12}, "fp32": {"measured_flops_per_s": 1e12}},
    "memory": {"measured_bytes_per_s": 1e11},
    "storage": {"iops_budget": 70000, "page_bytes": 4096},
    "collectives": [
      {"op": "reduce_scatter", "ranks": 8, "fit": {"alpha_s": 1e-5, "beta_bytes_per_s": 1e10}},
      {"op": "all_gather", "ranks": 8, "fit": {"alpha_s": 1e-5, "beta_bytes_per_s": 1e10}},
      {"op": "all_reduce", "ranks": 8, "fit": {"alpha_s": 1e-5, "beta_bytes_per_s": 1e10}}
    ]
  })");
  doc["device"]["kind"] = kind;
  doc["memory"]["measured_bytes_per_s"] = bandwidth;
  return parse_profile(doc, "flat.json");
}

ModelConfig model_of(const std::string& config) {
  const std::string path = std::string(FOUNDRY_SOURCE_DIR) + "/configs/" + config;
  return parse_model_config(json::parse(read_text_file(path))["model"], path);
}

ModelConfig moe_bench() { return model_of("moe-bench.json"); }

TEST(Storage, ReproducesThePapersExample) {
  // G = 4096 sequences of s = 4096 tokens of b = 4 bytes, pages of 4096 bytes, t = 2.5 s.
  for (double sigma : {1.0, 8.0}) {
    EXPECT_NEAR(data_loading_iops(4096, 4096, 4, 4096, 2.5, sigma), 6553.6 * sigma, 1e-9);
    // Break-even against 70,000 IOPS: 16,384 pages / 70,000 = 0.234 s per unit of σ.
    EXPECT_NEAR(data_loading_break_even_s(4096, 4096, 4, 4096, 70000, sigma), 16384.0 / 70000 * sigma, 1e-12);
    EXPECT_NEAR(data_loading_break_even_s(4096, 4096, 4, 4096, 70000, sigma), 0.234 * sigma, 1e-3 * sigma);
  }
}

TEST(PerfModel, GemmFlopsMatchTheModelCalculator) {
  // The planner's GEMM list and `model info` count the same matmuls: 6 × active matmul
  // parameters per token (forward + both backward products).
  const ModelConfig c = moe_bench();
  StepShape s;
  s.seq = 256;
  s.micro_batch = 8;
  // Memory fast enough that no GEMM is roofline-bound.
  const StepPrediction p = predict_step(c, s, flat_profile("cpu", 1e15));
  double gemm_flops = 0;
  for (const auto& it : p.items)
    if (it.category == CostCategory::gemm) gemm_flops += it.flops;
  const double tokens = 8 * 256;
  EXPECT_NEAR(gemm_flops / tokens, flops_per_token(c, 256).matmul_flops, 1e-6 * gemm_flops / tokens);
  // On a flat machine the GEMM time is exactly FLOPs / rate.
  EXPECT_NEAR(p.gemm_s, gemm_flops / 1e12, 1e-9);
}

TEST(PerfModel, AccumulationScalesComputeNotTheOptimizer) {
  const ModelConfig c = moe_bench();
  StepShape one;
  one.micro_batch = 4;
  StepShape two = one;
  two.accumulation = 2;
  const HardwareProfile prof = flat_profile();
  const StepPrediction a = predict_step(c, one, prof), b = predict_step(c, two, prof);
  EXPECT_NEAR(b.gemm_s, 2 * a.gemm_s, 1e-12);
  EXPECT_NEAR(b.elementwise_s, 2 * a.elementwise_s, 1e-12);
  EXPECT_NEAR(b.optimizer_s, a.optimizer_s, 1e-15);
  EXPECT_DOUBLE_EQ(b.tokens_per_step, 2 * a.tokens_per_step);
}

TEST(PerfModel, ZeroOneCommunicationAndSharding) {
  const ModelConfig c = moe_bench();
  const HardwareProfile prof = flat_profile();
  StepShape s;
  s.dp = 8;
  s.comm_overlap = 0;
  const double P = double(count_parameters(c).total);
  const StepPrediction z = predict_step(c, s, prof);
  // Reduce-scatter of fp32 gradients + all-gather of bf16 weights, each α + S/β (8 ranks).
  EXPECT_NEAR(z.comm_s, 2e-5 + P * 4 / 1e10 + P * 2 / 1e10, 1e-9);
  EXPECT_NEAR(z.step_s, z.compute_s + z.comm_s, 1e-12);
  s.zero1 = false;
  const StepPrediction d = predict_step(c, s, prof);
  EXPECT_NEAR(d.comm_s, 1e-5 + P * 4 / 1e10, 1e-9);
  EXPECT_GT(d.optimizer_s, 7 * z.optimizer_s);  // unsharded: 8× the optimizer work
  EXPECT_GT(d.memory_bytes, z.memory_bytes);
  // Full overlap hides communication up to the backward pass.
  s.zero1 = true;
  s.comm_overlap = 1;
  const StepPrediction o = predict_step(c, s, prof);
  EXPECT_NEAR(o.comm_exposed_s, std::max(0.0, o.comm_s - 2.0 / 3.0 * (o.compute_s - o.optimizer_s)), 1e-12);
}

// Context parallelism over cp devices: a device computes 1/cp of the tokens' GEMMs and of the
// causal attention, holds about 1/cp of the activations, and pays an all-gather and a
// reduce-scatter of k and v per layer that no overlap hides, growing with cp.
TEST(PerfModel, ContextParallelSplitsTheWorkAndAddsExposedExchanges) {
  const ModelConfig c = model_of("zaya-long.json");
  const HardwareProfile prof = flat_profile("cpu", 1e15);
  StepShape one;
  one.seq = 32768;
  one.micro_batch = 1;
  one.comm_overlap = 1;
  const StepPrediction base = predict_step(c, one, prof);
  double previous_comm = 0;
  for (int64_t cp : {2, 4}) {
    StepShape s = one;
    s.cp = cp;
    s.dp = cp;  // the cp devices are the run's ranks
    const StepPrediction p = predict_step(c, s, prof);
    EXPECT_NEAR(p.gemm_s, base.gemm_s / double(cp), 0.02 * base.gemm_s / double(cp)) << cp;
    EXPECT_NEAR(p.attention_s, base.attention_s / double(cp), 1e-9 * base.attention_s) << cp;
    EXPECT_DOUBLE_EQ(p.tokens_per_step, base.tokens_per_step / double(cp));
    EXPECT_LT(p.memory_bytes, base.memory_bytes);
    double cp_comm = 0, cp_bytes = 0;
    for (const auto& it : p.items)
      if (it.name.starts_with("context-parallel")) {
        cp_comm += it.seconds;
        cp_bytes += it.bytes;
      }
    // Bytes a rank sends: (cp − 1)/cp of the whole k and v, twice (forward and backward),
    // every layer: what `model info` reports.
    EXPECT_NEAR(cp_bytes, double(context_parallel_traffic(c, 1, 32768, cp).kv_gather_bytes +
                                 context_parallel_traffic(c, 1, 32768, cp).kv_grad_bytes),
                1.0);
    EXPECT_GT(cp_comm, previous_comm);
    EXPECT_GE(p.comm_exposed_s, cp_comm);  // blocking: never hidden
    previous_comm = cp_comm;
  }
}

TEST(PerfModel, DecodeLatencyGrowsFromActiveToAllExperts) {
  const ModelConfig c = moe_bench();  // 8 experts, top-2
  const HardwareProfile prof = flat_profile();
  const ParamCounts pc = count_parameters(c);
  const double kv1 = 2.0 * 4 * c.kv_dim() * c.n_layers;  // fp32 K and V per token of context
  // Batch 1 on a CPU: matrix-vector products stream the active weights (bf16) and pay a
  // fixed time per weight row, every GEMM call a fixed cost, and the KV cache is read once.
  const int64_t calls = c.n_layers * (4 + 1 + 2 * c.top_k) + 1;
  const int64_t rows = c.n_layers * (c.q_dim() + 2 * c.kv_dim() + c.d_model + c.n_experts +
                                     c.top_k * (2 * c.ffn_dim + c.d_model)) +
                       c.padded_vocab();
  const double one = predict_decode_latency(c, 1, 100, prof);
  // The matrices a token multiplies: the active parameters without the norms' vectors.
  const double matrices = double(pc.active - pc.norms_per_layer * c.n_layers - c.d_model);
  const double weights = (2.0 * matrices + kv1 * 100) / 1e11;
  EXPECT_GT(one, weights + rows * 50e-9 + calls * 5e-6);
  EXPECT_LT(one, 1.1 * weights + rows * 60e-9 + calls * 1e-5);
  const DecodePrediction p1 = predict_decode(c, 1, 100, prof);
  EXPECT_DOUBLE_EQ(p1.experts_touched, 2.0);
  EXPECT_DOUBLE_EQ(p1.attention_s, kv1 * 100 / 1e11);
  EXPECT_DOUBLE_EQ(p1.step_s, p1.gemm_s + p1.expert_s + p1.attention_s);
  // A large batch touches every expert, and its GEMMs become compute-bound: at 1e12 FLOP/s,
  // two FLOPs per weight and token.
  const DecodePrediction big = predict_decode(c, 1000, 1, prof);
  EXPECT_NEAR(big.experts_touched, 8.0, 1e-9);
  const double compute = 2.0 * 1000 * matrices / 1e12;
  EXPECT_GT(big.gemm_s + big.expert_s, compute);
  EXPECT_LT(big.gemm_s + big.expert_s, 1.5 * compute);
  // fp32 weights stream twice the bytes of bf16 ones.
  const double extra = predict_decode_latency(c, 1, 1, prof, DType::f32) -
                       predict_decode_latency(c, 1, 1, prof);
  EXPECT_NEAR(extra, 2.0 * matrices / 1e11, 0.05 * 2.0 * matrices / 1e11);
  // Below the CPU GEMM kernel's row block (24 rows) a GEMM costs the whole block: the
  // compute-bound projections of batch 2 take as long as those of batch 24.
  EXPECT_NEAR(predict_decode(c, 2, 1, prof).gemm_s, predict_decode(c, 24, 1, prof).gemm_s,
              0.02 * predict_decode(c, 24, 1, prof).gemm_s);
}

TEST(Plan, RespectsItsConstraints) {
  PlanRequest rq;
  rq.arch = "moe";
  rq.total_params = 200e6;
  rq.active_params = 50e6;
  rq.seq = 512;
  rq.global_batch = 16;
  rq.devices = 2;
  rq.vocab = 8000;
  rq.memory_per_device = int64_t{8} << 30;
  rq.hidden = {512, 768, 1024, 1000};
  rq.experts = {8, 16};
  rq.top_ks = {1, 2};
  const PlanResult r = plan_search(rq, flat_profile());
  ASSERT_FALSE(r.ranked.empty());
  for (size_t i = 0; i < r.ranked.size(); ++i) {
    const Candidate& c = r.ranked[i];
    EXPECT_NEAR(c.total_params / rq.total_params, 1.0, rq.tolerance);
    EXPECT_NEAR(c.active_params / rq.active_params, 1.0, rq.tolerance);
    EXPECT_LE(c.prediction.memory_bytes, rq.memory_per_device);
    const double aspect = double(c.config.d_model) / double(c.config.n_layers);
    EXPECT_GE(aspect, rq.aspect_min);
    EXPECT_LE(aspect, rq.aspect_max);
    EXPECT_EQ(c.config.d_model % 64, 0);
    EXPECT_EQ(c.config.head_dim % 64, 0);
    EXPECT_EQ(c.shape.micro_batch * c.shape.accumulation, 8);  // 16 sequences over 2 devices
    if (i > 0) {
      EXPECT_LE(c.cluster_tokens_per_s, r.ranked[i - 1].cluster_tokens_per_s);
    }
  }
  // The off-size hidden size (1000) and head dims (80, 96) are probed and reported.
  bool hidden_rule = false, head_rule = false;
  for (const auto& x : r.rejected) {
    if (x.rule.find("hidden size") != std::string::npos) hidden_rule = true;
    if (x.rule.find("head dim") != std::string::npos) head_rule = true;
  }
  EXPECT_TRUE(hidden_rule);
  EXPECT_TRUE(head_rule);
  // Exactly the non-dominated MoE widths are on the front.
  for (const auto& p : r.widths)
    for (const auto& q : r.widths)
      if (p.on_front) {
        EXPECT_FALSE(q.best.cluster_tokens_per_s > p.best.cluster_tokens_per_s &&
                     q.best.decode_latency_s < p.best.decode_latency_s);
      }
  // The chosen config's model section is valid and is the best shape.
  const json out = plan_run_config(r.ranked.front(), rq);
  EXPECT_EQ(parse_model_config(out["model"], "plan").d_model, r.ranked.front().config.d_model);
  EXPECT_EQ(out["train"]["batch_size"].get<int64_t>(), r.ranked.front().shape.micro_batch);
}

TEST(Plan, TightMemoryPushesToSmallerMicroBatchesOrRejects) {
  PlanRequest rq;
  rq.arch = "moe";
  rq.active_params = 30e6;
  rq.seq = 1024;
  rq.global_batch = 8;
  rq.vocab = 8000;
  rq.hidden = {512, 768};
  rq.experts = {8};
  rq.top_ks = {2};
  rq.memory_per_device = int64_t{64} << 30;
  const PlanResult roomy = plan_search(rq, flat_profile());
  rq.memory_per_device = int64_t{3} << 30;
  const PlanResult tight = plan_search(rq, flat_profile());
  EXPECT_EQ(roomy.ranked.front().shape.micro_batch, 8);
  for (const auto& c : tight.ranked) {
    EXPECT_LT(c.shape.micro_batch, 8);
    EXPECT_LE(c.prediction.memory_bytes, rq.memory_per_device);
  }
  rq.memory_per_device = int64_t{1} << 20;
  EXPECT_THROW(plan_search(rq, flat_profile()), Error);
}

TEST(Plan, BadRequestsFailClearly) {
  PlanRequest rq;
  rq.global_batch = 8;
  EXPECT_THROW(plan_search(rq, flat_profile()), Error);  // no budget
  rq.total_params = 1e8;
  rq.active_params = 2e8;
  EXPECT_THROW(plan_search(rq, flat_profile()), Error);  // active > total
  rq.active_params = 1e7;
  rq.devices = 3;
  EXPECT_THROW(plan_search(rq, flat_profile()), Error);  // 8 sequences over 3 devices
  rq.devices = 1;
  rq.arch = "gpt";
  EXPECT_THROW(plan_search(rq, flat_profile()), Error);
}

TEST(Plan, Zaya1BaseIsNearTheBestOnMi300x) {
  // ZAYA1-base's budget on 1,024 MI300X: its own shape within 10% of the best prediction.
  const HardwareProfile mi300x = load_profile("mi300x");
  const ModelConfig base = model_of("zaya1-base.json");
  PlanRequest rq;
  rq.arch = "zaya1";
  rq.total_params = 8.3e9;
  rq.active_params = 0.76e9;
  rq.seq = 4096;
  rq.global_batch = 4096;
  rq.devices = 1024;
  rq.vocab = 262272;
  rq.base = base;
  rq.compare = {{"zaya1-base", base}};
  const PlanResult r = plan_search(rq, mi300x);
  ASSERT_EQ(r.compared.size(), 1u);
  const Candidate& z = r.compared[0].second;
  EXPECT_TRUE(z.reject.empty()) << z.reject << " " << z.detail;
  EXPECT_GE(z.cluster_tokens_per_s, 0.9 * r.ranked.front().cluster_tokens_per_s);
}

}  // namespace
}  // namespace foundry
