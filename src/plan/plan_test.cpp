#include <gtest/gtest.h>

#include <cmath>

#include "base/format.h"
#include "base/io.h"
#include "model/info.h"
#include "model/params.h"
#include "plan/goodput.h"
#include "plan/perf_model.h"
#include "plan/search.h"

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
    EXPECT_NEAR(data_loading_break_even_s(4096, 4096, 4, 4096, 70000, sigma),
                16384.0 / 70000 * sigma, 1e-12);
    EXPECT_NEAR(data_loading_break_even_s(4096, 4096, 4, 4096, 70000, sigma), 0.234 * sigma,
                1e-3 * sigma);
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
  EXPECT_NEAR(gemm_flops / tokens, flops_per_token(c, 256).matmul_flops,
              1e-6 * gemm_flops / tokens);
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
  // Full overlap hides the gradient reduce-scatter up to the backward pass; the weight
  // all-gather follows the optimizer step and stays exposed unless it may overlap the next
  // forward.
  s.zero1 = true;
  s.comm_overlap = 1;
  const StepPrediction o = predict_step(c, s, prof);
  const double rs = 1e-5 + P * 4 / 1e10, ag = 1e-5 + P * 2 / 1e10;
  const double backward = 2.0 / 3.0 * (o.compute_s - o.optimizer_s);
  EXPECT_NEAR(o.comm_exposed_s, std::max(0.0, rs - backward) + ag, 1e-12);
  s.overlap_param_gather = true;
  const StepPrediction g = predict_step(c, s, prof);
  EXPECT_NEAR(g.comm_exposed_s,
              std::max(0.0, rs - backward) + std::max(0.0, ag - backward / 2), 1e-12);
  EXPECT_LE(g.step_s, o.step_s);
}

// A collective fit measured up to some size and asked about far larger messages: the
// prediction stands, and the profile says which fit it stretched, and how far.
TEST(PerfModel, CollectivesBeyondTheirMeasuredSizesAreNoted) {
  const ModelConfig c = moe_bench();
  StepShape s;
  s.dp = 8;
  json doc = flat_profile().raw;
  for (json& entry : doc["collectives"]) entry["fit"]["max_bytes"] = 1 << 20;
  const HardwareProfile small = parse_profile(doc, "small.json");
  predict_step(c, s, small);
  const std::string notes = small.notes_on_extrapolation();
  const double P = double(count_parameters(c).total);
  EXPECT_NE(notes.find(fmt::format("note: reduce_scatter's fit at 8 ranks in small.json was "
                                   "measured up to 1 MiB and is stretched to messages of {}",
                                   format_bytes(4 * P, 1, Zeros::trim))),
            std::string::npos)
      << notes;
  for (json& entry : doc["collectives"]) entry["fit"]["max_bytes"] = 1e12;
  const HardwareProfile large = parse_profile(doc, "large.json");
  predict_step(c, s, large);
  EXPECT_EQ(large.notes_on_extrapolation(), "");
}

// ZeRO-1's memory per rank, as docs/zero1.md counts it: the replicated weights and gradients,
// and a 1/dp share of the reduced gradient shard (4 B), AdamW's moments of what AdamW updates
// (8 B) and Muon's momentum of its matrices (4 B); one process keeps that state whole. On a
// CPU the checkpoint snapshot copies the weights a rank saves (its share) and its state; a
// GPU's goes to host memory. Muon's elements are counted here from the parameter table,
// apart from the planner's own count by shape.
TEST(PerfModel, ZeroOneMemoryIsTheShardedStateOfDocsZero1) {
  for (const char* config : {"moe-bench.json", "zaya-bench.json"})
    for (bool muon : {false, true}) {
      const ModelConfig c = model_of(config);
      StepShape s;
      s.seq = 256;
      s.micro_batch = 2;
      s.muon = muon;
      const MemoryEstimate m = estimate_memory(c, s.micro_batch, s.seq, s.precision, muon);
      const double P = double(count_parameters(c).total);
      double muon_elements = 0;
      const ParamTable table(c);
      if (muon)
        for (const ParamInfo& info : table.params())
          if (is_muon_matrix(info)) muon_elements += double(info.numel);
      const int64_t replicated = m.weights_fp32_bytes + m.weights_bf16_bytes + m.grads_bytes +
                                 m.activations_bytes + m.backward_buffers_bytes;
      const double state = 8 * (P - muon_elements) + 4 * muon_elements;
      const double snapshot = double(m.weights_fp32_bytes) + state;
      for (const char* kind : {"gpu", "cpu"}) {
        const HardwareProfile prof = flat_profile(kind);
        const double copied = std::string(kind) == "cpu" ? 1.0 : 0.0;
        s.dp = 1;
        EXPECT_NEAR(double(predict_step(c, s, prof).memory_bytes - replicated),
                    state + copied * snapshot, 1.0)
            << config << " muon " << muon << " " << kind;
        s.dp = 4;
        EXPECT_NEAR(double(predict_step(c, s, prof).memory_bytes - replicated),
                    (4 * P + state + copied * snapshot) / 4, 2.0)
            << config << " muon " << muon << " " << kind;
      }
    }
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
  const DecodePrediction p1 = predict_decode(c, 1, 100, prof);
  // The attention: the KV cache read once, or on a CPU the kernel's arithmetic when that takes
  // longer; either grows linearly with the context.
  EXPECT_DOUBLE_EQ(p1.attention_flops, 4.0 * c.n_heads * 100 * c.head_dim * c.n_layers);
  EXPECT_GE(p1.attention_s, kv1 * 100 / 1e11);
  EXPECT_NEAR(predict_decode(c, 1, 200, prof).attention_s, 2 * p1.attention_s, 1e-15);
  // The matrices a token multiplies: the active parameters without the norms' vectors.
  const double matrices = double(pc.active - pc.norms_per_layer * c.n_layers - c.d_model);
  const double weights = 2.0 * matrices / 1e11 + p1.attention_s;
  EXPECT_GT(one, weights + rows * 50e-9 + calls * 5e-6);
  EXPECT_LT(one, 1.1 * weights + rows * 60e-9 + calls * 1e-5);
  EXPECT_DOUBLE_EQ(p1.experts_touched, 2.0);
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


// On a CPU the decode attention's arithmetic after its reads: per KV-head element a pass over
// the cached rows, per query-head element its FMAs (perf_model.cpp), split over the cores, but
// only as many as there are sequences' KV heads. Sharing KV heads (GQA) is never slower.
TEST(PerfModel, CpuDecodeAttentionFollowsTheKernel) {
  ModelConfig c = moe_bench();  // 8 heads of 64, each its own KV head
  HardwareProfile prof = flat_profile("cpu", 1e18);  // the reads take no time
  prof.raw["device"]["cores"] = 2;
  const double per_head = double(4 * c.n_layers * 256 * c.head_dim);  // batch 4, context 256
  const double mha = predict_decode(c, 4, 256, prof).attention_s;
  EXPECT_NEAR(mha, per_head * 8 * (0.020e-9 + 0.158e-9) / 2, 1e-6 * mha);
  // With memory at 1e11 B/s the reads add their time.
  HardwareProfile slow = flat_profile("cpu", 1e11);
  slow.raw["device"]["cores"] = 2;
  const double reads = 2.0 * 4 * c.kv_dim() * c.n_layers * 256 * 4;  // fp32 K and V, batch 4
  EXPECT_NEAR(predict_decode(c, 4, 256, slow).attention_s - mha, reads / 1e11, 1e-6 * mha);
  double previous = mha;
  for (int64_t kvh : {4, 2, 1}) {
    c.n_kv_heads = kvh;
    const double got = predict_decode(c, 4, 256, prof).attention_s;
    EXPECT_LT(got, previous) << kvh;
    previous = got;
  }
  // One sequence with one KV head: one thread works.
  const double one = per_head / 4 * (0.020e-9 + 8 * 0.158e-9);
  EXPECT_NEAR(predict_decode(c, 1, 256, prof).attention_s, one, 1e-6 * one);
}

// A cluster of nodes of 8 GPUs: intra-node collectives at 1e11 B/s (8-rank fits), inter-node
// at 1e10 B/s (64-rank fits), every GEMM at 1e14 FLOP/s, memory 1e12 B/s.
HardwareProfile cluster_profile(const json& efficiency = json()) {
  json doc = json::parse(R"({
    "format": "foundry-hardware-profile", "version": 1, "name": "cluster",
    "device": {"kind": "gpu", "memory_bytes": 100000000000, "devices_per_node": 8},
    "compute": {"bf16": {"measured_flops_per_s": 1e14}, "fp32": {"measured_flops_per_s": 1e14}},
    "memory": {"measured_bytes_per_s": 1e12},
    "storage": {"iops_budget": 70000, "page_bytes": 4096},
    "collectives": []
  })");
  for (const char* op : {"reduce_scatter", "all_gather", "all_reduce", "all_to_all"}) {
    doc["collectives"].push_back({{"op", op}, {"ranks", 8}, {"scope", "intra-node"},
                                  {"fit", {{"alpha_s", 1e-5}, {"beta_bytes_per_s", 1e11}}}});
    doc["collectives"].push_back({{"op", op}, {"ranks", 64}, {"scope", "inter-node"},
                                  {"fit", {{"alpha_s", 1e-4}, {"beta_bytes_per_s", 1e10}}}});
  }
  if (!efficiency.is_null()) doc["efficiency"] = efficiency;
  return parse_profile(doc, "cluster.json");
}

double item_seconds(const StepPrediction& p, const std::string& prefix) {
  double s = 0;
  for (const auto& it : p.items)
    if (it.name.starts_with(prefix)) s += it.seconds;
  return s;
}

double item_bytes(const StepPrediction& p, const std::string& prefix) {
  double b = 0;
  for (const auto& it : p.items)
    if (it.name.starts_with(prefix)) b += it.bytes;
  return b;
}

// bench attention turns a kernel's measured times into efficiency.attention by
// attention_core_seconds: a step prices its attention as those seconds over the curve's
// efficiencies, for every layer.
TEST(PerfModel, AttentionCoreSecondsAreWhatTheEfficiencyCurveScales) {
  const ModelConfig c = model_of("gpu-moe-bench.json");
  StepShape s;
  s.seq = 2048;
  s.micro_batch = 8;
  s.precision = DType::bf16;
  const HardwareProfile ideal = cluster_profile();
  const AttentionCoreSeconds one =
      attention_core_seconds(ideal, 8, 2048, c.n_heads, c.n_kv_heads, c.head_dim, DType::bf16);
  EXPECT_GT(one.forward, 0);
  EXPECT_NEAR(one.backward, 2.5 * one.forward, 1e-9 * one.backward);  // 5 products against 2
  // 2·T·T·d per head and product, over the causal share of 64-row tiles (32 of them).
  const double per_product = 2.0 * 2048 * 2048 * c.head_dim * 8 * c.n_heads * (33.0 / 64.0);
  EXPECT_NEAR(one.forward_flops, 2 * per_product, 1e-9 * per_product);
  EXPECT_NEAR(one.backward_flops, 5 * per_product, 1e-9 * per_product);
  EXPECT_NEAR(one.forward, one.forward_flops / 1e14, 1e-9 * one.forward);  // the flat 1e14 rate
  const double layers = double(c.n_layers);
  EXPECT_NEAR(predict_step(c, s, ideal).attention_s, layers * (one.forward + one.backward),
              1e-9 * layers * one.backward);
  const json curve = {{"attention", {{{"seq", 1024}, {"forward", 0.5}, {"backward", 0.2}},
                                     {{"seq", 4096}, {"forward", 0.5}, {"backward", 0.2}}}}};
  const HardwareProfile measured = cluster_profile(curve);
  EXPECT_NEAR(predict_step(c, s, measured).attention_s,
              layers * (one.forward / 0.5 + one.backward / 0.2), 1e-9 * layers * one.backward);
}

TEST(Topology, CollectivesFollowNodesAndNeverShrinkWithRanks) {
  const HardwareProfile prof = cluster_profile();
  const double S = 1e9;
  // Within a node: the profile's own fit.
  EXPECT_DOUBLE_EQ(group_collective_s(prof, "all_gather", 4, S, 2),
                   prof.collective_time("all_gather", 4, S));
  // Across nodes: the inter-node fit; groups strided over a node share its NICs.
  EXPECT_GT(group_collective_s(prof, "all_gather", 16, S, 1),
            group_collective_s(prof, "all_gather", 8, S, 1));
  EXPECT_NEAR(group_collective_s(prof, "all_gather", 64, S, 8) - 1e-4,
              8 * (group_collective_s(prof, "all_gather", 64, S, 1) - 1e-4), 1e-9);
  // An all-to-all across nodes: only the bytes for peers on other nodes cross the NIC.
  const double alpha16 = std::max(1e-4 * 15 / 63, 1e-5);
  EXPECT_NEAR(group_collective_s(prof, "all_to_all", 16, S, 1),
              alpha16 + std::max(S * 8 / 16 / (1e10 * 63 / 64), S * 7 / 16 / (1e11 * 7 / 8)),
              1e-12);
  // More devices never less communication time, for every op and stride.
  for (const char* op : {"reduce_scatter", "all_gather", "all_reduce", "all_to_all"})
    for (int64_t stride : {1, 2, 8}) {
      double previous = 0;
      for (int64_t ranks = 2; ranks <= 1024; ranks *= 2) {
        const double t = group_collective_s(prof, op, ranks, S, stride);
        EXPECT_GE(t, previous) << op << " " << ranks << " " << stride;
        previous = t;
      }
    }
}

TEST(PerfModel, MoreDevicesNeverLessCommunication) {
  const ModelConfig c = moe_bench();
  const HardwareProfile prof = cluster_profile();
  double previous_s = 0, previous_bytes = 0;
  for (int64_t dp = 2; dp <= 512; dp *= 2) {
    StepShape s;
    s.dp = dp;
    const StepPrediction p = predict_step(c, s, prof);
    EXPECT_GE(p.comm_s, previous_s) << dp;
    EXPECT_GE(item_bytes(p, "gradient") + item_bytes(p, "weight"), previous_bytes) << dp;
    previous_s = p.comm_s;
    previous_bytes = item_bytes(p, "gradient") + item_bytes(p, "weight");
  }
  // Expert parallelism: the all-to-all grows with the ranks it spans.
  double previous_a2a = 0;
  for (int64_t ep : {2, 4, 8}) {
    StepShape s;
    s.dp = 16;
    s.ep = ep;
    const double a2a = item_seconds(predict_step(c, s, prof), "expert-parallel");
    EXPECT_GT(a2a, previous_a2a) << ep;
    previous_a2a = a2a;
  }
}

TEST(PerfModel, OverlappedAllToAllsHideBehindCompute) {
  const ModelConfig c = moe_bench();
  const HardwareProfile prof = cluster_profile();
  StepShape s;
  s.dp = 8;
  s.ep = 8;
  const StepPrediction exposed = predict_step(c, s, prof);
  s.overlap_expert_comm = true;
  const StepPrediction hidden = predict_step(c, s, prof);
  const double a2a = item_seconds(exposed, "expert-parallel");
  ASSERT_GT(a2a, 0);
  EXPECT_LT(hidden.step_s, exposed.step_s);
  EXPECT_GE(hidden.comm_exposed_s, exposed.comm_exposed_s - a2a - 1e-15);
  EXPECT_DOUBLE_EQ(item_seconds(hidden, "expert-parallel"), a2a);  // the same traffic
}

TEST(PerfModel, DedupDispatchSendsFewerCopiesAcrossNodes) {
  EXPECT_DOUBLE_EQ(dispatch_dedup_factor(128, 8, 8, 8), 1.0);  // one node: nothing to save
  // 128 experts on 4 nodes, top-8: each other node is hit with p = 1 − C(96,8)/C(128,8).
  double miss = 1;
  for (int i = 0; i < 8; ++i) miss *= (96.0 - i) / (128.0 - i);
  EXPECT_NEAR(dispatch_dedup_factor(128, 8, 32, 8), 3 * (1 - miss) / (8 * 24.0 / 32), 1e-12);
  EXPECT_LT(dispatch_dedup_factor(128, 8, 32, 8), dispatch_dedup_factor(128, 2, 32, 8));
  EXPECT_LE(dispatch_dedup_factor(128, 1, 32, 8), 1.0);
  const ModelConfig c = model_of("moe-bench.json");
  StepShape s;
  s.dp = 16;
  s.ep = 8;
  s.micro_batch = 1;
  const HardwareProfile prof = cluster_profile();
  const double plain = item_seconds(predict_step(c, s, prof), "expert-parallel");
  s.dedup_expert_dispatch = true;
  EXPECT_DOUBLE_EQ(item_seconds(predict_step(c, s, prof), "expert-parallel"), plain);
}

TEST(PerfModel, MoreImbalanceIsNeverFaster) {
  EXPECT_DOUBLE_EQ(binomial_imbalance(1000, 1), 1.0);
  EXPECT_GT(binomial_imbalance(1000, 8), binomial_imbalance(1e6, 8));  // more rows: evener
  EXPECT_GT(binomial_imbalance(1000, 64), binomial_imbalance(1000, 8));
  EXPECT_NEAR(binomial_imbalance(1e12, 64), 1.0, 1e-5);
  const ModelConfig c = moe_bench();
  const HardwareProfile prof = cluster_profile();
  StepShape s;
  s.dp = 8;
  s.ep = 8;
  double previous = 0;
  for (double imbalance : {1.0, 1.1, 1.5, 2.0, 4.0}) {
    s.expert_imbalance = imbalance;
    const StepPrediction p = predict_step(c, s, prof);
    EXPECT_GE(p.step_s, previous) << imbalance;
    if (imbalance == 1.0) {
      EXPECT_EQ(p.imbalance_s, 0);
    }
    if (imbalance == 2.0) {
      EXPECT_NEAR(p.imbalance_s, item_seconds(p, "expert GEMMs"), 1e-12);
    }
    previous = p.step_s;
  }
  // Without expert parallelism every device holds every expert: no imbalance term.
  s.ep = 1;
  EXPECT_EQ(predict_step(c, s, prof).imbalance_s, 0);
}

TEST(PerfModel, PipelineBubbleIsStagesMinusOneMicroSteps) {
  const ModelConfig c = moe_bench();
  const HardwareProfile prof = cluster_profile();
  StepShape s;
  s.accumulation = 8;
  const StepPrediction one = predict_step(c, s, prof);
  EXPECT_EQ(one.bubble_s, 0);
  s.pp = 4;
  const StepPrediction four = predict_step(c, s, prof);
  // A stage runs a quarter of the layers; the bubble is 3 of its micro-steps.
  const double micro = (four.compute_s - four.optimizer_s + four.overhead_s) / 8;
  EXPECT_NEAR(four.bubble_s, 3 * micro, 1e-9 * four.bubble_s);
  s.vp = 3;
  EXPECT_NEAR(predict_step(c, s, prof).bubble_s, four.bubble_s / 3, 1e-9 * four.bubble_s);
  // More micro-batches: a smaller share of the step.
  s.vp = 1;
  s.accumulation = 32;
  const StepPrediction many = predict_step(c, s, prof);
  EXPECT_LT(many.bubble_s / many.step_s, four.bubble_s / four.step_s);
}

TEST(PerfModel, PipelineSendsAreExposedOnlyInTheFillAndDrain) {
  const ModelConfig c = moe_bench();
  const HardwareProfile prof = cluster_profile();
  StepShape s;
  s.accumulation = 8;
  s.dp = 4;
  EXPECT_EQ(item_seconds(predict_step(c, s, prof), "pipeline sends"), 0);
  s.pp = 4;
  const StepPrediction four = predict_step(c, s, prof);
  // 2 · (pp · vp − 1) sends on the critical path, each half of a two-rank all-gather of one
  // micro-batch's bf16 activations, stages tp · dp ranks apart.
  const double bytes = double(s.micro_batch * s.seq * c.d_model) * 2;
  const double one = group_collective_s(prof, "all_gather", 2, 2 * bytes, s.tp * s.dp);
  const double sends = item_seconds(four, "pipeline sends");
  EXPECT_NEAR(sends, 2 * 3 * one, 1e-12);
  // Exposed communication, not bubble.
  for (const auto& it : four.items) {
    if (it.name.starts_with("pipeline sends")) {
      EXPECT_EQ(it.category, CostCategory::comm);
    }
  }
  // The steady state hides them: more micro-batches expose no more.
  s.accumulation = 32;
  EXPECT_NEAR(item_seconds(predict_step(c, s, prof), "pipeline sends"), sends, 1e-12);
  // Interleaving trades bubble for sends: more chunk boundaries on the critical path.
  s.accumulation = 8;
  s.vp = 2;
  const StepPrediction two = predict_step(c, s, prof);
  EXPECT_NEAR(item_seconds(two, "pipeline sends"), 2 * 7 * one, 1e-12);
  EXPECT_LT(two.bubble_s, four.bubble_s);
  // Stages on other nodes send over the slower inter-node links.
  s.vp = 1;
  s.dp = 16;
  const double far = group_collective_s(prof, "all_gather", 2, 2 * bytes, s.tp * s.dp);
  EXPECT_GT(far, one);
  EXPECT_NEAR(item_seconds(predict_step(c, s, prof), "pipeline sends"), 2 * 3 * far, 1e-12);
}

TEST(PerfModel, TensorParallelSplitsComputeAndAddsBlockingCollectives) {
  const ModelConfig c = moe_bench();
  const HardwareProfile prof = flat_profile("cpu", 1e15);
  StepShape s;
  s.micro_batch = 8;
  const StepPrediction one = predict_step(c, s, prof);
  s.tp = 2;
  const StepPrediction two = predict_step(c, s, prof);
  EXPECT_NEAR(two.gemm_s, one.gemm_s / 2, 1e-9 * one.gemm_s);  // flat rates: exactly half
  EXPECT_NEAR(two.elementwise_s, one.elementwise_s / 2, 1e-9 * one.elementwise_s);
  EXPECT_GT(item_seconds(two, "tensor-parallel"), 0);
  EXPECT_GE(two.comm_exposed_s, item_seconds(two, "tensor-parallel"));
}

TEST(PerfModel, RecomputeAddsAForwardAndNeverSpeedsUp) {
  const ModelConfig c = moe_bench();
  const HardwareProfile prof = flat_profile("cpu", 1e15);
  StepShape s;
  const StepPrediction none = predict_step(c, s, prof);
  s.recompute = Recompute::selective;
  const StepPrediction sel = predict_step(c, s, prof);
  s.recompute = Recompute::full;
  const StepPrediction full = predict_step(c, s, prof);
  EXPECT_EQ(none.recompute_s, 0);
  EXPECT_NEAR(sel.recompute_s, 0.4 * none.elementwise_s, 1e-12);
  EXPECT_GT(full.recompute_s, none.gemm_s / 3);
  EXPECT_LT(none.step_s, sel.step_s);
  EXPECT_LT(sel.step_s, full.step_s);
}

TEST(PerfModel, AttentionEfficiencyAndLaunchOverheadComeFromTheProfile) {
  const ModelConfig c = moe_bench();
  StepShape s;
  s.seq = 1024;
  const StepPrediction plain = predict_step(c, s, cluster_profile());
  EXPECT_EQ(plain.overhead_s, 0);
  json eff = {{"kernel_overhead_s", 5e-6},
              {"attention", {{{"seq", 512}, {"forward", 0.5}, {"backward", 0.25}},
                             {{"seq", 2048}, {"forward", 0.5}, {"backward", 0.25}}}}};
  const StepPrediction slow = predict_step(c, s, cluster_profile(eff));
  // Forward: 2 of 7 products at half the rate; backward: 5 at a quarter.
  EXPECT_NEAR(slow.attention_s, plain.attention_s * (2.0 / 7 * 2 + 5.0 / 7 * 4),
              1e-9 * slow.attention_s);
  EXPECT_GT(slow.overhead_s, 0);
  EXPECT_NEAR(std::fmod(slow.overhead_s / 5e-6 + 0.5, 1.0), 0.5, 1e-6);  // whole kernels
  // Longer sequences: the kernel's efficiency interpolates in log2(seq) along the curve.
  eff["attention"][1]["forward"] = 1.0;
  eff["attention"][1]["backward"] = 1.0;
  const StepPrediction mid = predict_step(c, s, cluster_profile(eff));  // 1024: halfway
  EXPECT_LT(mid.attention_s, slow.attention_s);
  EXPECT_GT(mid.attention_s, plain.attention_s);
  eff["attention"][0]["forward"] = 2;
  EXPECT_THROW(predict_step(c, s, cluster_profile(eff)), Error);
}

TEST(PerfModel, NamedAttentionKernelUsesItsOwnCurve) {
  const ModelConfig c = moe_bench();
  StepShape s;
  s.seq = 1024;
  json eff = {{"attention", {{{"seq", 512}, {"forward", 1.0}, {"backward", 1.0}}}},
              {"attention_kernels",
               {{"older", {{{"seq", 512}, {"forward", 0.5}, {"backward", 0.25}}}}}}};
  const HardwareProfile prof = cluster_profile(eff);
  const StepPrediction best = predict_step(c, s, prof);
  s.attention_kernel = "older";
  const StepPrediction older = predict_step(c, s, prof);
  EXPECT_NEAR(older.attention_s, best.attention_s * (2.0 / 7 * 2 + 5.0 / 7 * 4),
              1e-9 * older.attention_s);
  EXPECT_EQ(older.gemm_s, best.gemm_s);
  // A kernel the profile does not have fails, naming the ones it has.
  s.attention_kernel = "fa9";
  try {
    predict_step(c, s, prof);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'fa9'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("older"), std::string::npos) << e.what();
  }
  EXPECT_THROW(predict_step(c, s, cluster_profile()), Error);
}

TEST(PerfModel, EagerKernelsMoveTheNormsAndRopeOpByOp) {
  const ModelConfig c = moe_bench();
  const HardwareProfile prof = cluster_profile();  // 1e12 B/s of memory bandwidth
  StepShape s;
  const StepPrediction fused = predict_step(c, s, prof);
  s.eager = true;
  const StepPrediction eager = predict_step(c, s, prof);
  // Per element: RMSNorm 92 B instead of 20, RoPE 104 B instead of 16 (perf_model.cpp).
  const double N = double(s.micro_batch * s.seq);
  const double norms = double(c.n_layers * 2 * c.d_model + c.d_model);
  const double rope = double(c.n_layers * (c.q_dim() + c.kv_dim())) * c.rope_fraction;
  EXPECT_NEAR(eager.elementwise_s - fused.elementwise_s,
              ((92 - 20) * norms + (104 - 16) * rope) * N / 1e12, 1e-12);
  EXPECT_GT(item_seconds(eager, "elementwise, unfused"), 0);
  EXPECT_EQ(item_seconds(fused, "elementwise, unfused"), 0);
  EXPECT_EQ(eager.gemm_s, fused.gemm_s);
  // More launches too: never faster.
  const HardwareProfile launches = cluster_profile({{"kernel_overhead_s", 5e-6}});
  s.eager = false;
  const double fused_overhead = predict_step(c, s, launches).overhead_s;
  s.eager = true;
  EXPECT_GT(predict_step(c, s, launches).overhead_s, fused_overhead);
  EXPECT_GT(eager.step_s, fused.step_s);
}

// model.qk_norm adds two norms per layer over the q and k projections' elements, whichever
// the norm's rows (a head or the projection), fused or op by op; the GEMMs are unchanged.
TEST(PerfModel, QkNormAddsTwoNormsOverTheProjections) {
  const HardwareProfile prof = cluster_profile();  // 1e12 B/s of memory bandwidth
  const ModelConfig plain = moe_bench();
  for (bool eager : {false, true}) {
    StepShape s;
    s.eager = eager;
    const double N = double(s.micro_batch * s.seq);
    const double extra = double(plain.n_layers * (plain.q_dim() + plain.kv_dim())) * N;
    const StepPrediction base = predict_step(plain, s, prof);
    for (QkNorm qk : {QkNorm::head, QkNorm::full}) {
      ModelConfig c = plain;
      c.qk_norm = qk;
      const StepPrediction got = predict_step(c, s, prof);
      // Per element: 92 B op by op, 5 fp32 words (20 B) fused.
      EXPECT_NEAR(got.elementwise_s - base.elementwise_s, (eager ? 92 : 20) * extra / 1e12,
                  1e-12) << qk_norm_name(qk);
      EXPECT_EQ(got.gemm_s, base.gemm_s);
      EXPECT_GT(got.step_s, base.step_s);
    }
  }
}

TEST(PerfModel, DataLoadingIsHiddenUnlessLongerThanTheStep) {
  const ModelConfig c = moe_bench();
  const HardwareProfile prof = cluster_profile();
  StepShape s;
  s.seq = 256;
  const StepPrediction p = predict_step(c, s, prof);
  // 8 sequences of 256 tokens of 4 bytes: 2 pages at 70,000 IOPS.
  EXPECT_NEAR(p.data_s, 2.0 / 70000, 1e-12);
  EXPECT_NEAR(p.data_exposed_s, std::max(0.0, p.data_s - (p.step_s - p.data_exposed_s)), 1e-12);
  s.data_scatter = 1e6;  // a pathological layout: the reads outlast the step
  const StepPrediction q = predict_step(c, s, prof);
  EXPECT_GT(q.data_exposed_s, 0);
  EXPECT_NEAR(q.step_s, q.data_s, 1e-12);
}

TEST(PerfModel, ContentionOnlyWhenBothCrossNodes) {
  const ModelConfig c = moe_bench();
  const HardwareProfile prof = cluster_profile();
  StepShape s;
  s.dp = 64;
  s.ep = 16;  // spans two nodes
  const StepPrediction both = predict_step(c, s, prof);
  s.ep = 8;   // within a node
  const StepPrediction inside = predict_step(c, s, prof);
  EXPECT_EQ(item_seconds(inside, "contention"), 0);
  const double contention = item_seconds(both, "contention");
  EXPECT_GE(contention, 0);
  EXPECT_LE(contention, item_seconds(both, "expert-parallel") / 2 + 1e-15);
}

TEST(Goodput, NoFailuresMeansFullGoodput) {
  GoodputInputs in;
  in.devices = 1024;
  in.checkpoint_stall_s = 1;
  in.restart_s = 100;
  const GoodputPrediction g = predict_goodput(in);
  EXPECT_EQ(g.goodput, 1.0);
  EXPECT_EQ(g.interval_s, 0);
  EXPECT_FALSE(std::isfinite(g.mtbf_s));
}

TEST(Goodput, YoungAndDalyAgainstTheirFormulas) {
  const double delta = 4, M = 1.0 / (1024 * 1.97e-5) * 3600;
  EXPECT_NEAR(young_interval_s(delta, M), std::sqrt(2 * delta * M), 1e-9);
  const double r = delta / (2 * M);
  EXPECT_NEAR(daly_interval_s(delta, M),
              std::sqrt(2 * delta * M) * (1 + std::sqrt(r) / 3 + r / 9) - delta, 1e-9);
  EXPECT_DOUBLE_EQ(daly_interval_s(3 * M, M), M);  // δ ≥ 2M: checkpoint once per MTBF
  GoodputInputs in;
  in.devices = 1024;
  in.failures_per_device_hour = 1.97e-5;
  in.checkpoint_stall_s = delta;
  in.restart_s = 60;
  const GoodputPrediction g = predict_goodput(in);
  EXPECT_NEAR(g.mtbf_s, M, 1e-6);
  EXPECT_NEAR(g.interval_s, daly_interval_s(delta, M), 1e-9);
  // The interval is (near) the best: shorter or longer ones lose goodput.
  for (double f : {0.5, 2.0})
    EXPECT_LT(goodput_at(f * g.interval_s, delta, 0, 60, M), g.goodput);
  EXPECT_NEAR(g.goodput, g.interval_s / (g.interval_s + delta) *
                             (1 - (60 + (g.interval_s + delta) / 2) / M), 1e-12);
  // More devices: shorter MTBF, lower goodput; a slow commit bounds the interval below.
  in.devices = 16384;
  EXPECT_LT(predict_goodput(in).goodput, g.goodput);
  in.checkpoint_write_s = 1e4;
  EXPECT_DOUBLE_EQ(predict_goodput(in).interval_s, 1e4);
  const GoodputInputs d = goodput_defaults(100e9, 1024, true);
  EXPECT_NEAR(d.checkpoint_stall_s, 100e9 / 1024 / 25e9, 1e-12);
  EXPECT_NEAR(d.checkpoint_write_s, 1.0, 1e-12);
  EXPECT_NEAR(d.restart_s, 4.5, 1e-12);
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
  // The global batch (train.batch_size is split over the ranks), not the plan's micro-batch.
  EXPECT_EQ(out["train"]["batch_size"].get<int64_t>(), rq.global_batch);
  EXPECT_EQ(out["train"]["seq_len"].get<int64_t>(), rq.seq);
  // The plan's micro-batch, when it accumulates: train runs the share as the plan predicted.
  const StepShape& shape = r.ranked.front().shape;
  if (shape.accumulation > 1)
    EXPECT_EQ(out["train"]["micro_batch_size"].get<int64_t>(), shape.micro_batch);
  else
    EXPECT_FALSE(out["train"].contains("micro_batch_size"));
}

// A small MoE search: 30M active parameters, hidden 512 or 768, 8 experts top-2.
PlanRequest small_moe_request() {
  PlanRequest rq;
  rq.arch = "moe";
  rq.active_params = 30e6;
  rq.seq = 1024;
  rq.global_batch = 8;
  rq.vocab = 8000;
  rq.hidden = {512, 768};
  rq.experts = {8};
  rq.top_ks = {2};
  return rq;
}

TEST(Plan, TightMemoryPushesToSmallerMicroBatchesOrRejects) {
  PlanRequest rq = small_moe_request();
  rq.memory_per_device = int64_t{64} << 30;
  const PlanResult roomy = plan_search(rq, flat_profile());
  rq.memory_per_device = int64_t{3} << 30;
  const PlanResult tight = plan_search(rq, flat_profile());
  EXPECT_EQ(roomy.ranked.front().shape.micro_batch, 8);
  for (const auto& c : tight.ranked) {
    EXPECT_LT(c.shape.micro_batch, 8);
    EXPECT_LE(c.prediction.memory_bytes, rq.memory_per_device);
  }
  // Its run config runs the share in the micro-batches that fit.
  ASSERT_FALSE(tight.ranked.empty());
  EXPECT_EQ(plan_run_config(tight.ranked.front(), rq)["train"]["micro_batch_size"].get<int64_t>(),
            tight.ranked.front().shape.micro_batch);
  rq.memory_per_device = int64_t{1} << 20;
  EXPECT_THROW(plan_search(rq, flat_profile()), Error);
}

TEST(Plan, TheStacksKernelsReachTheSearch) {
  PlanRequest rq = small_moe_request();
  const PlanResult fused = plan_search(rq, flat_profile());
  rq.eager = true;
  const PlanResult eager = plan_search(rq, flat_profile());
  ASSERT_EQ(fused.ranked.size(), eager.ranked.size());
  for (size_t i = 0; i < fused.ranked.size(); ++i) EXPECT_TRUE(eager.ranked[i].shape.eager);
  EXPECT_GT(eager.ranked.front().prediction.step_s, fused.ranked.front().prediction.step_s);
  rq.attention_kernel = "fa2";  // the flat profile names no kernels
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
  // ZAYA1-base's budget on 1,024 MI300X: its own shape near the best prediction.
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
  // Within 20%: the exposed weight all-gather (no longer hidden by its longer compute), the
  // launch overhead per kernel and the fused attention's efficiency (profiles/README.md,
  // note 5) charge depth: ZAYA1-base's 40 layers against the best shape's 17 give 81% of its
  // throughput (92.6% before those terms).
  EXPECT_GE(z.cluster_tokens_per_s, 0.8 * r.ranked.front().cluster_tokens_per_s);
}

// On a GPU profile the decode attention reads its fp32 KV cache (Foundry's, on the GPU as on
// the CPU) at memory bandwidth; the CPU kernel's arithmetic bound does not apply.
TEST(PerfModel, GpuDecodeAttentionReadsItsCache) {
  const ModelConfig c = moe_bench();
  const DecodePrediction p = predict_decode(c, 4, 1000, cluster_profile());
  EXPECT_DOUBLE_EQ(p.kv_cache_bytes, 2.0 * 4 * c.kv_dim() * c.n_layers * 1000 * 4);
  EXPECT_DOUBLE_EQ(p.attention_s, p.kv_cache_bytes / 1e12);
}

}  // namespace
}  // namespace foundry
