#include "model/info.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <set>
#include <string>

#include "base/error.h"
#include "model/model.h"
#include "model/params.h"

namespace foundry {
namespace {

// vocab 200 -> padded 256, C = 16, L = 2, H = 4, KVH = 2, head_dim 4 (Dq = 16, Dkv = 8),
// E = 4, K = 2, F = 24.
ModelConfig tiny_moe() {
  ModelConfig c;
  c.vocab_size = 200;
  c.d_model = 16;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 4;
  c.n_experts = 4;
  c.top_k = 2;
  c.ffn_dim = 24;
  c.max_seq_len = 64;
  return c;
}

// vocab 128 (no padding), C = 8, L = 1, H = 2, KVH = 1, head_dim 4 (Dq = 8, Dkv = 4),
// one dense FFN of width 16.
ModelConfig tiny_dense() {
  ModelConfig c;
  c.vocab_size = 128;
  c.d_model = 8;
  c.n_layers = 1;
  c.n_heads = 2;
  c.n_kv_heads = 1;
  c.head_dim = 4;
  c.n_experts = 1;
  c.top_k = 1;
  c.ffn_dim = 16;
  return c;
}

TEST(ModelInfo, HandCountedMoeParameters) {
  const ParamCounts p = count_parameters(tiny_moe());
  EXPECT_EQ(p.embedding, 256 * 16);                               // 4096
  EXPECT_EQ(p.attention_per_layer, 16 * 16 + 8 * 16 + 8 * 16 + 16 * 16);  // q k v o = 768
  EXPECT_EQ(p.norms_per_layer, 2 * 16);                           // 32
  EXPECT_EQ(p.router_per_layer, 4 * 16);                          // 64
  EXPECT_EQ(p.per_expert, 3 * 24 * 16);                           // 1152
  EXPECT_EQ(p.experts_per_layer, 4 * 1152);                       // 4608
  EXPECT_EQ(p.per_layer, 768 + 32 + 64 + 4608);                   // 5472
  EXPECT_EQ(p.final_norm, 16);
  EXPECT_EQ(p.total, 4096 + 2 * 5472 + 16);                       // 15056
  EXPECT_EQ(p.non_embedding, 15056 - 4096);                       // 10960
  // A token runs 2 of the 4 experts: 768 + 32 + 64 + 2·1152 = 3168 per layer.
  EXPECT_EQ(p.active, 4096 + 2 * 3168 + 16);                      // 10448
  EXPECT_EQ(p.active_non_embedding, 2 * 3168 + 16);               // 6352
}

TEST(ModelInfo, HandCountedDenseParameters) {
  const ParamCounts p = count_parameters(tiny_dense());
  EXPECT_EQ(p.embedding, 128 * 8);                    // 1024
  EXPECT_EQ(p.attention_per_layer, 64 + 32 + 32 + 64);  // 192
  EXPECT_EQ(p.router_per_layer, 0);
  EXPECT_EQ(p.per_expert, 3 * 16 * 8);                // 384
  EXPECT_EQ(p.total, 1024 + (192 + 16 + 384) + 8);    // 1624
  EXPECT_EQ(p.active, p.total);                       // a dense model uses every weight
}

TEST(ModelInfo, TotalMatchesParamTable) {
  std::vector<ModelConfig> configs = {tiny_moe(), tiny_dense(), ModelConfig{}};
  ModelConfig mqa = tiny_moe();  // one kv head shared by all query heads
  mqa.n_kv_heads = 1;
  configs.push_back(mqa);
  ModelConfig odd = tiny_dense();  // vocab not a multiple of 128, Dq != C, 3 layers
  odd.vocab_size = 1001;
  odd.d_model = 24;
  odd.n_heads = 6;
  odd.n_kv_heads = 3;
  odd.head_dim = 6;
  odd.n_layers = 3;
  configs.push_back(odd);
  ModelConfig wide = ModelConfig{};  // many experts, top-1
  wide.n_experts = 16;
  wide.top_k = 1;
  wide.n_kv_heads = 2;
  configs.push_back(wide);
  for (QkNorm qk : {QkNorm::head, QkNorm::full}) {
    odd.qk_norm = qk;  // q and k norms: head_dim each, or Dq and Dkv
    configs.push_back(odd);
  }
  for (const ModelConfig& c : configs) {
    const ParamTable table(c);
    const ParamCounts p = count_parameters(c);
    EXPECT_EQ(p.total, table.parameter_count()) << to_json(c).dump();
    EXPECT_EQ(p.embedding, table.get("model.embed_tokens.weight").numel);
  }
}

// tiny_moe at T = 8:
//   matmul weights per token = L·(attention 768 + router 64 + 2 experts·1152) + LM head 4096
//                            = 2·3136 + 4096 = 10368  ->  6·10368 = 62208
//   attention = 6·2·L·T·Dq = 12·2·8·16 = 3072;  causal: 12·2·16·(8+1)/2 = 1728
TEST(ModelInfo, HandComputedFlopsPerToken) {
  const FlopsPerToken f = flops_per_token(tiny_moe(), 8);
  EXPECT_EQ(f.matmul_params, 10368);
  EXPECT_DOUBLE_EQ(f.matmul_flops, 62208);
  EXPECT_DOUBLE_EQ(f.attention_flops, 3072);
  EXPECT_DOUBLE_EQ(f.attention_causal_flops, 1728);
  EXPECT_DOUBLE_EQ(f.train_flops, 62208 + 1728);  // MFU counts the causal attention
  EXPECT_DOUBLE_EQ(f.forward_flops, (62208 + 1728) / 3.0);
  EXPECT_DOUBLE_EQ(train_flops_per_token(tiny_moe(), 8), 63936);

  // Dense, T = 4: 6·(192 + 384 + 1024) + 12·1·8·(4+1)/2 = 9600 + 240.
  EXPECT_DOUBLE_EQ(train_flops_per_token(tiny_dense(), 4), 9840);
}

// tiny_moe at B = 1, T = 8 (N = 8, N·K = 16), in floats:
//   per layer: x, n1, q, k+v, att, x_mid, n2 = 7·128; two 1/rms 2·8; row lse 1·4·8 = 32;
//     router probs 8·4 = 32; top-k ids + weights 2·16; dispatch plan 2·16; expert inputs
//     16·16 = 256; hidden 16·48 = 768; SwiGLU 16·24 = 384; expert outputs 256  -> 2704
//   once: final residual 128; final norm 128 + 8; logits 8·256 = 2048; losses 8; ids 16
//     -> 2336
//   activations = 4·(2·2704 + 2336) = 30976 bytes, and in bf16 the experts' inputs kept in
//     bf16, 2·(2·256) = 1024 -> 32000
//   backward: 3·128 + (128 + 2·64) + 128 + 2·256 + 16·72 + 8·6 = 2480 -> 9920 bytes, and the
//     attention kernel's scratch (bf16; one tile of 8 rows over B·H = 4 heads, 32 rows):
//     k, v in key tiles 2·2·64 = 256 and their fp32 gradients 2·4·64 = 512; q and dO blocks
//     (bf16) and the fp32 accumulator 32·4·(2·2 + 4) = 1024; two fp32 and two bf16 tiles
//     32·8·2·(4 + 2) = 3072; two row statistics 2·32·4 = 256 -> 5120 bytes; in all 15040
TEST(ModelInfo, HandComputedMemory) {
  const MemoryEstimate m = estimate_memory(tiny_moe(), 1, 8, DType::bf16);
  EXPECT_EQ(m.weights_fp32_bytes, 4 * 15056);
  EXPECT_EQ(m.weights_bf16_bytes, 2 * 15056);
  EXPECT_EQ(m.grads_bytes, 4 * 15056);
  EXPECT_EQ(m.optimizer_bytes, 8 * 15056);
  EXPECT_EQ(m.activations_bytes, 32000);
  EXPECT_EQ(m.backward_buffers_bytes, 15040);
  EXPECT_EQ(m.total_bytes, 18 * 15056 + 32000 + 15040);

  const MemoryEstimate fp32 = estimate_memory(tiny_moe(), 1, 8, DType::f32);
  EXPECT_EQ(fp32.weights_bf16_bytes, 0);
  // fp32: no bf16 weights, fp32 key tiles (2·2·64 = 256 more), fp32 blocks
  // (32·4·4·2 - 32·4·2·2 = 512 more), no bf16 tiles (32·8·2·2 = 1024 less), no bf16 expert
  // inputs.
  EXPECT_EQ(fp32.total_bytes, m.total_bytes - 2 * 15056 + 256 + 512 - 1024 - 1024);
}

// Context parallelism over C ranks adds the whole sequences' keys and values (kept every
// layer), their gradients, and the exchanges' staging: k and v of two slots, each this rank's
// rows of a slot and the group's, (1 + C)·[B, T/2C, Dkv] four times.
TEST(ModelInfo, ContextParallelItemsIncludeTheExchangesStaging) {
  const ModelConfig c = tiny_moe();  // L = 2, Dkv = 8
  const int64_t B = 3, T = 32;
  for (int64_t C : {2, 4}) {
    const MemoryEstimate m = estimate_memory(c, B, T, DType::f32, false, C);
    std::map<std::string, int64_t> items;
    for (const auto* list : {&m.activations, &m.backward_buffers})
      for (const MemoryItem& it : *list) items[it.name] += it.bytes;
    EXPECT_EQ(items.at("gathered k, v (context parallel)"), 2 * 4 * 2 * B * T * 8);
    EXPECT_EQ(items.at("gathered k, v gradients (context parallel)"), 4 * 2 * B * T * 8);
    EXPECT_EQ(items.at("k, v exchange staging (context parallel)"),
              4 * 4 * (1 + C) * B * (T / (2 * C)) * 8);
  }
  const MemoryEstimate one = estimate_memory(c, B, T, DType::f32);
  for (const MemoryItem& it : one.backward_buffers)
    EXPECT_EQ(it.name.find("context parallel"), std::string::npos) << it.name;
}

TEST(ModelInfo, MemoryScalesLinearlyInBatch) {
  for (const ModelConfig& c : {tiny_moe(), tiny_dense(), ModelConfig{}}) {
    const MemoryEstimate one = estimate_memory(c, 1, 64, DType::bf16);
    for (int64_t batch : {2, 3, 8}) {
      const MemoryEstimate m = estimate_memory(c, batch, 64, DType::bf16);
      EXPECT_EQ(m.activations_bytes, batch * one.activations_bytes);
      EXPECT_EQ(m.backward_buffers_bytes, batch * one.backward_buffers_bytes);
      for (size_t i = 0; i < m.activations.size(); ++i)
        EXPECT_EQ(m.activations[i].bytes, batch * one.activations[i].bytes)
            << m.activations[i].name;
      // Weights, gradients and optimizer state do not depend on the batch.
      EXPECT_EQ(m.weights_fp32_bytes, one.weights_fp32_bytes);
      EXPECT_EQ(m.grads_bytes, one.grads_bytes);
      EXPECT_EQ(m.optimizer_bytes, one.optimizer_bytes);
    }
  }
}

TEST(ModelInfo, ReportAndJson) {
  const ModelInfo info = model_info(ModelConfig{}, 8, 256, DType::bf16);
  EXPECT_DOUBLE_EQ(info.train_flops_per_step, info.flops.train_flops * 8 * 256);
  const json j = to_json(info);
  EXPECT_EQ(j["parameters"]["total"].get<int64_t>(), info.params.total);
  EXPECT_EQ(j["memory_bytes"]["total"].get<int64_t>(), info.memory.total_bytes);
  EXPECT_EQ(j["precision"], "bf16");
  EXPECT_EQ(j["activations"].size(), info.memory.activations.size());

  const std::string text = format_model_info(info);
  EXPECT_NE(text.find("parameters"), std::string::npos);
  // The default config has 8192·512 = 4,194,304 embedding parameters.
  EXPECT_NE(text.find("4,194,304"), std::string::npos) << text;
  EXPECT_NE(text.find("GFLOP"), std::string::npos) << text;
  EXPECT_NE(text.find("MiB"), std::string::npos) << text;

  EXPECT_THROW(model_info(ModelConfig{}, 0, 256, DType::bf16), Error);
  EXPECT_THROW(model_info(ModelConfig{}, 8, 0, DType::bf16), Error);
}

// ---- arch zaya1 ----------------------------------------------------------------------------

// The ZAYA1-base shape (spec §1), as configs/zaya1-base.json states it.
ModelConfig zaya1_base() {
  ModelConfig c;
  c.arch = Arch::zaya1;
  c.vocab_size = 262272;
  c.d_model = 2048;
  c.n_layers = 40;
  c.n_heads = 8;
  c.n_kv_heads = 2;
  c.head_dim = 128;
  c.n_experts = 16;
  c.top_k = 1;
  c.ffn_dim = 2048;
  c.router_latent_dim = 256;
  c.rope_fraction = 0.5;
  c.norm_topk_prob = false;
  c.aux_loss_coef = 0;
  c.max_seq_len = 4096;
  return c;
}

// vocab 200 -> padded 256, C = 16, L = 2, Hq = 4, Hk = 2, d = 4 (Cc = 24), E = 4, K = 1,
// F = 24, R = 8, skip class (S = 5), t0 = t1 = 2.
ModelConfig tiny_zaya() {
  ModelConfig c = tiny_moe();
  c.arch = Arch::zaya1;
  c.top_k = 1;
  c.router_latent_dim = 8;
  c.rope_fraction = 0.5;
  c.norm_topk_prob = false;
  c.aux_loss_coef = 0;
  return c;
}

// ZAYA1-base by hand (C = 2048, Hq = 8, Hk = 2, d = 128, Cc = 1280, R = 256, S = 17):
//   CCA   q 1024·2048 = 2,097,152; k 256·2048 = 524,288; v 2 × 128·2048 = 2 × 262,144;
//         convolutions 1280·2 + 1280 + 1280·128·2 + 1280 = 332,800; o 2,097,152; temp 2
//         -> 5,575,682
//   router down 256·2048 + 256 = 524,544; EDA 256; norm 256; fc1, fc2 2·(65,536 + 256);
//         out_proj 17·256 = 4,352 -> 660,992 (layer 0 has no EDA weight: 660,736)
//   expert 3·2048·2048 = 12,582,912; 16 experts 201,326,592
//   per layer: + residual scaling 8·2048 = 16,384 + norms 4,096 -> 207,583,746
//   non-embedding = 40·207,583,746 − 256 + 2·2048 (embedding scale, bias) + 2048 (final norm)
//                 = 8,303,349,840 − 256 + 6,144 = 8,303,355,728     (≈ 8.303 B)
//   active non-embedding = 40·(5,575,682 + 660,992 + 12,582,912 + 16,384 + 4,096) − 256 + 6,144
//                 = 40·18,840,066 + 5,888 = 753,608,528            (≈ 0.754 B)
//   embedding 262,272·2048 = 537,133,056
TEST(ModelInfo, Zaya1BaseMatchesTheSpec) {
  const ModelConfig c = zaya1_base();
  const ParamCounts p = count_parameters(c);
  EXPECT_EQ(p.cca.q, 2097152);
  EXPECT_EQ(p.cca.k, 524288);
  EXPECT_EQ(p.cca.v_half, 262144);
  EXPECT_EQ(p.cca.convolutions, 332800);
  EXPECT_EQ(p.cca.o, 2097152);
  EXPECT_EQ(p.cca.temperature, 2);
  EXPECT_EQ(p.cca.total, 5575682);
  EXPECT_EQ(p.attention_per_layer, 5575682);
  EXPECT_EQ(p.per_expert, 12582912);
  EXPECT_EQ(p.router_per_layer, 660992);
  EXPECT_EQ(p.router_first_layer, 660736);
  EXPECT_EQ(p.experts_per_layer, 201326592);
  EXPECT_EQ(p.residual_scales_per_layer, 16384);
  EXPECT_EQ(p.norms_per_layer, 4096);
  EXPECT_EQ(p.per_layer, 207583746);
  EXPECT_EQ(p.embedding, 537133056);
  EXPECT_EQ(p.non_embedding, 8303355728);
  EXPECT_EQ(p.active_non_embedding, 753608528);
  EXPECT_EQ(p.total, 8303355728 + 537133056);
  EXPECT_EQ(p.active, 753608528 + 537133056);
  EXPECT_NEAR(static_cast<double>(p.non_embedding) / 1e9, 8.303, 5e-4);
  EXPECT_NEAR(static_cast<double>(p.active_non_embedding) / 1e9, 0.754, 5e-4);
  // Exactly the parameter table's count (building the table allocates no weights).
  const ParamTable table(c);
  EXPECT_EQ(p.total, table.parameter_count());
  EXPECT_EQ(p.embedding, table.get("model.embed_tokens.weight").numel);
  EXPECT_EQ(table.find("model.layers.0.mlp.gate.router_states_scale"), nullptr);
  EXPECT_NE(table.find("model.layers.1.mlp.gate.router_states_scale"), nullptr);
}

// configs/zaya1-base.json holds exactly the shape above.
TEST(ModelInfo, Zaya1BaseConfigFile) {
  std::ifstream in(std::string(FOUNDRY_SOURCE_DIR) + "/configs/zaya1-base.json");
  ASSERT_TRUE(in) << "configs/zaya1-base.json";
  const json root = json::parse(in);
  const ModelConfig c = parse_model_config(root.at("model"), "zaya1-base.json");
  EXPECT_EQ(to_json(c), to_json(zaya1_base()));
  EXPECT_EQ(count_parameters(c).non_embedding, 8303355728);
  EXPECT_EQ(root.at("train").at("seq_len"), 4096);
  EXPECT_EQ(root.at("train").at("optimizer"), "muon");
}

// The itemized activations and backward buffers are the arena the model lays out: the
// itemized bytes that live in the arena (all but the attention kernel's scratch and the bf16
// copy of the expert inputs, which have their own buffers) against the layout measured, for
// the GPU benchmark configs at their batch shape, both precisions. They may differ by the
// arrays' 64-byte alignment and the few per-layer scalars the estimate leaves out.
TEST(ModelInfo, ActivationEstimateIsTheModelsArena) {
  for (const char* name : {"gpu-moe-bench.json", "gpu-zaya-bench.json", "zaya-bench.json"}) {
    std::ifstream in(std::string(FOUNDRY_SOURCE_DIR) + "/configs/" + name);
    ASSERT_TRUE(in) << name;
    const json root = json::parse(in);
    const ModelConfig c = parse_model_config(root.at("model"), name);
    const int64_t B = root.at("train").at("batch_size"), T = root.at("train").at("seq_len");
    const int64_t arena = Model::activation_arena_bytes(c, B, T);
    for (DType precision : {DType::bf16, DType::f32}) {
      const MemoryEstimate m = estimate_memory(c, B, T, precision);
      int64_t outside = 0;
      for (const auto* items : {&m.activations, &m.backward_buffers})
        for (const MemoryItem& item : *items)
          if (item.name.find("attention tiles") != std::string::npos ||
              item.name.find("in bf16") != std::string::npos)
            outside += item.bytes;
      const int64_t in_arena = m.activations_bytes + m.backward_buffers_bytes - outside;
      EXPECT_NEAR(static_cast<double>(in_arena), static_cast<double>(arena), 1e-3 * arena)
          << name << " " << dtype_name(precision) << ": estimate " << in_arena << ", layout "
          << arena;
    }
  }
}

// tiny_zaya by hand:
//   CCA  q 16·16 = 256; k 8·16 = 128; v 2 × 4·16 = 2 × 64; conv 24·2 + 24 + 24·4·2 + 24 = 288;
//        o 256; temp 2 -> 1058
//   router (8·16 + 8) + 8 (norm) + 2·(64 + 8) + 5·8 = 328 in layer 0; + 8 (EDA) = 336
//   expert 3·24·16 = 1152, experts 4608; residual scaling 8·16 = 128; norms 32
//   per layer 1058 + 32 + 336 + 4608 + 128 = 6162
//   total 4096 + 32 (embedding scale, bias) + 2·6162 − 8 + 16 = 16460
//   active 4096 + 32 + 2·(1058 + 32 + 336 + 1152 + 128) − 8 + 16 = 9548
TEST(ModelInfo, HandCountedZayaParameters) {
  const ParamCounts p = count_parameters(tiny_zaya());
  EXPECT_EQ(p.cca.total, 1058);
  EXPECT_EQ(p.cca.convolutions, 288);
  EXPECT_EQ(p.router_first_layer, 328);
  EXPECT_EQ(p.router_per_layer, 336);
  EXPECT_EQ(p.per_expert, 1152);
  EXPECT_EQ(p.input_scales, 32);
  EXPECT_EQ(p.per_layer, 6162);
  EXPECT_EQ(p.total, 16460);
  EXPECT_EQ(p.non_embedding, 16460 - 4096);
  EXPECT_EQ(p.active, 9548);
  EXPECT_EQ(p.active_non_embedding, 9548 - 4096);
  // A standard model reports no CCA, scale or first-layer differences.
  const ParamCounts moe = count_parameters(tiny_moe());
  EXPECT_EQ(moe.cca.total, 0);
  EXPECT_EQ(moe.residual_scales_per_layer, 0);
  EXPECT_EQ(moe.router_first_layer, moe.router_per_layer);
}

TEST(ModelInfo, ZayaTotalMatchesParamTable) {
  std::vector<ModelConfig> configs = {tiny_zaya(), zaya1_base()};
  ModelConfig no_eda = tiny_zaya();
  no_eda.router_eda = false;
  configs.push_back(no_eda);
  ModelConfig no_skip = tiny_zaya();
  no_skip.router_skip_class = false;
  configs.push_back(no_skip);
  ModelConfig one_layer = tiny_zaya();  // the first layer is the only one
  one_layer.n_layers = 1;
  configs.push_back(one_layer);
  ModelConfig kernels = tiny_zaya();  // other convolution sizes, top-2, odd vocabulary
  kernels.cca_kernel_depthwise = 3;
  kernels.cca_kernel_grouped = 1;
  kernels.top_k = 2;
  kernels.vocab_size = 1001;
  kernels.n_heads = 6;
  kernels.n_kv_heads = 3;
  configs.push_back(kernels);
  for (const ModelConfig& c : configs) {
    const ParamTable table(c);
    const ParamCounts p = count_parameters(c);
    EXPECT_EQ(p.total, table.parameter_count()) << to_json(c).dump();
    // The active count runs top_k of the E experts in every layer.
    EXPECT_EQ(p.total - p.active,
              c.n_layers * (c.n_experts - c.top_k) * p.per_expert) << to_json(c).dump();
  }
}

// tiny_zaya at T = 8:
//   matmul weights per token = L·(CCA 256 + 128 + 2·64 + 256 + router 8·16 + 2·64 + 5·8
//                              + 1 expert 1152) + LM head 4096 = 2·2216 + 4096 = 8528
//   convolutions = 6·L·(24·2 + 24·4·2) = 12·240 = 2880
//   attention = 12·L·T·Hq·d = 12·2·8·16 = 3072
TEST(ModelInfo, HandComputedZayaFlopsPerToken) {
  const FlopsPerToken f = flops_per_token(tiny_zaya(), 8);
  EXPECT_EQ(f.matmul_params, 8528);
  EXPECT_DOUBLE_EQ(f.matmul_flops, 6 * 8528);
  EXPECT_DOUBLE_EQ(f.conv_flops, 2880);
  EXPECT_DOUBLE_EQ(f.attention_flops, 3072);
  EXPECT_DOUBLE_EQ(f.attention_causal_flops, 1728);
  EXPECT_DOUBLE_EQ(f.train_flops, 6 * 8528 + 2880 + 1728);
  EXPECT_DOUBLE_EQ(train_flops_per_token(tiny_zaya(), 8), 55776);
  // The moe path has no convolution term.
  EXPECT_DOUBLE_EQ(flops_per_token(tiny_moe(), 8).conv_flops, 0);
}

// tiny_zaya at B = 1, T = 8 (N = 8, N·K = 8), in 4-byte elements:
//   CCA per layer: residual 128; norm 128 + 8; c, y, qk 3·192; 1/norms 8·6 = 48; q 128;
//     k, v 2·64; row lse 4·8 = 32; attention output 128; h 128            -> 1432
//   MoE per layer: residual 128; norm 136; r 64; u 64 + 8; a1 g1 a2 g2 256; probs 8·5 = 40;
//     choice + gate 16; plan 16; expert inputs 128; hidden 384; SwiGLU 192; outputs 128;
//     h 128                                                                -> 1688
//   once: embedding output 128; final residual 128; final norm 136; logits 2048; losses 8;
//     ids 16                                                               -> 2464
//   activations = 4·(2·(1432 + 1688) + 2464) = 34816 bytes
//   backward: 5·128 + 3·192 + 8·(16 + 16) + 128 + 2·64 + 8·(16 + 5) + 2·128 + 8·72 + 8
//     = 2736 -> 10944 bytes, and the attention kernel's fp32 scratch: k, v in key tiles and
//     their gradients 4·64·4 = 1024, blocks 32·4·12 = 1536, tiles 32·8·2·4 = 2048, row
//     statistics 256 -> 4864 bytes; in all 15808
// The elements of the matrices Muon updates: the 2-D attention and expert weights, counted
// from the shapes the config gives them.
int64_t muon_elements(const ModelConfig& c) {
  int64_t n = 0;
  const ParamTable table(c);
  for (const ParamInfo& p : table.params())
    if ((p.kind == ParamKind::attention || p.kind == ParamKind::expert) && p.shape.size() == 2)
      n += p.shape[0] * p.shape[1];
  return n;
}

// The count from the config is the table's, for both architectures, dense and MoE.
TEST(ModelInfo, MuonMatrixElementsAreTheTablesMatrices) {
  ModelConfig dense = tiny_moe();
  dense.n_experts = 1;
  dense.top_k = 1;
  for (const ModelConfig& c : {tiny_moe(), tiny_zaya(), dense, zaya1_base()}) {
    int64_t n = 0;
    const ParamTable table(c);
    for (const ParamInfo& p : table.params())
      if (is_muon_matrix(p)) n += p.numel;
    EXPECT_EQ(muon_matrix_elements(c), n) << arch_name(c.arch) << " " << c.n_experts;
  }
}

TEST(ModelInfo, HandComputedZayaMemory) {
  const MemoryEstimate m = estimate_memory(tiny_zaya(), 1, 8, DType::f32);
  EXPECT_EQ(m.activations_bytes, 34816);
  EXPECT_EQ(m.backward_buffers_bytes, 15808);
  EXPECT_EQ(m.weights_fp32_bytes, 4 * 16460);
  EXPECT_EQ(m.weights_bf16_bytes, 0);
  EXPECT_EQ(m.optimizer_bytes, 8 * 16460);
  EXPECT_EQ(m.total_bytes, 16 * 16460 + 34816 + 15808);
  // With Muon its matrices (the 2-D attention and expert weights) keep a momentum, 4 bytes an
  // element, and AdamW its two moments of the rest.
  const int64_t matrices = muon_elements(tiny_zaya());
  ASSERT_TRUE(matrices > 0 && matrices < 16460);
  const MemoryEstimate muon = estimate_memory(tiny_zaya(), 1, 8, DType::f32, true);
  EXPECT_EQ(muon.adamw_state_bytes, 8 * (16460 - matrices));
  EXPECT_EQ(muon.muon_momentum_bytes, 4 * matrices);
  EXPECT_EQ(muon.optimizer_bytes, 8 * 16460 - 4 * matrices);
  EXPECT_EQ(muon.total_bytes, m.total_bytes - 4 * matrices);
  // Activations stay proportional to the batch.
  const MemoryEstimate three = estimate_memory(tiny_zaya(), 3, 8, DType::f32);
  EXPECT_EQ(three.activations_bytes, 3 * m.activations_bytes);
  EXPECT_EQ(three.backward_buffers_bytes, 3 * m.backward_buffers_bytes);
}

// The Muon rule of optim/muon.h (the model layer cannot link it): 2-D attention and expert
// matrices.
std::string muon_rule(const ParamInfo& p) {
  return (p.kind == ParamKind::attention || p.kind == ParamKind::expert) && p.shape.size() == 2
             ? "muon"
             : "adamw";
}

TEST(ModelInfo, ParamGroupsCoverEveryTensor) {
  for (const ModelConfig& c : {tiny_zaya(), tiny_moe(), tiny_dense(), zaya1_base()}) {
    const ParamTable table(c);
    const std::vector<ParamGroup> groups = param_groups(c, muon_rule);
    int64_t params = 0, tensors = 0;
    std::set<std::pair<std::string, std::string>> seen;
    for (const ParamGroup& g : groups) {
      params += g.params;
      tensors += g.tensors;
      EXPECT_TRUE(seen.insert({g.name, g.optimizer}).second) << g.name;
    }
    EXPECT_EQ(params, table.parameter_count());
    EXPECT_EQ(tensors, static_cast<int64_t>(table.params().size()));
  }
  auto find = [](const std::vector<ParamGroup>& groups, const std::string& name) {
    for (const ParamGroup& g : groups)
      if (g.name == name) return g;
    ADD_FAILURE() << "no group " << name;
    return ParamGroup{};
  };
  const std::vector<ParamGroup> z = param_groups(zaya1_base(), muon_rule);
  const ParamGroup attn = find(z, "attention projections (q, k, v, o)");
  EXPECT_EQ(attn.params, 40 * (5575682 - 332800 - 2));
  EXPECT_EQ(attn.optimizer, "muon");
  const ParamGroup experts = find(z, "experts (gate, up, down)");
  EXPECT_EQ(experts.params, int64_t{40} * 201326592);
  EXPECT_EQ(experts.tensors, 40 * 16 * 3);
  EXPECT_EQ(experts.optimizer, "muon");
  // The convolution weights are 3-D, so they stay with AdamW, like the router.
  EXPECT_EQ(find(z, "CCA convolution weights").optimizer, "adamw");
  EXPECT_EQ(find(z, "CCA convolution weights").params, 40 * (2560 + 327680));
  EXPECT_EQ(find(z, "router matrices").optimizer, "adamw");
  const ParamGroup router_vectors = find(z, "router vectors (biases, EDA gamma, norm)");
  EXPECT_EQ(find(z, "router matrices").params + router_vectors.params, 40 * 660992 - 256);
  EXPECT_EQ(find(z, "QK-norm temperatures").params, 80);
  EXPECT_EQ(find(z, "residual scaling (alpha, beta)").params, 40 * 16384 + 2 * 2048);
  EXPECT_EQ(find(z, "embedding (tied LM head)").optimizer, "adamw");
  // Without a rule everything is AdamW; a group whose tensors differ is split.
  for (const ParamGroup& g : param_groups(tiny_zaya(), {})) EXPECT_EQ(g.optimizer, "adamw");
  const auto by_name = [](const ParamInfo& p) {
    return p.name.find("q_proj") != std::string::npos ? std::string("muon") : std::string("adamw");
  };
  int attention_rows = 0;
  for (const ParamGroup& g : param_groups(tiny_zaya(), by_name))
    attention_rows += g.name == "attention projections (q, k, v, o)";
  EXPECT_EQ(attention_rows, 2);
}

TEST(ModelInfo, Zaya1BaseReportAndJson) {
  const ModelInfo info = model_info(zaya1_base(), 1, 4096, DType::bf16, "muon", muon_rule);
  const int64_t matrices = muon_elements(zaya1_base());
  EXPECT_EQ(info.memory.optimizer_bytes, 8 * info.params.total - 4 * matrices);
  const std::string text = format_model_info(info);
  for (const char* needle :
       {"5,575,682", "2,097,152", "524,288", "2 x 262,144", "332,800", "12,582,912", "660,992",
        "660,736", "201,326,592", "537,133,056", "8,303,355,728", "753,608,528", "8.303 B",
        "0.754 B", "router_states_scale", "Muon momentum", "muon", "CCA convolutions"})
    EXPECT_NE(text.find(needle), std::string::npos) << needle << "\n" << text;
  const json j = to_json(info);
  EXPECT_EQ(j["optimizer"], "muon");
  EXPECT_EQ(j["parameters"]["cca_per_layer"]["total"], 5575682);
  EXPECT_EQ(j["parameters"]["router_first_layer"], 660736);
  EXPECT_EQ(j["parameters"]["non_embedding"], 8303355728);
  EXPECT_EQ(j["memory_bytes"]["muon_momentum"], 4 * matrices);
  int64_t group_params = 0;
  for (const json& g : j["param_groups"]) group_params += g["params"].get<int64_t>();
  EXPECT_EQ(group_params, info.params.total);
  EXPECT_THROW(model_info(zaya1_base(), 1, 4096, DType::bf16, "sgd"), Error);
  // The moe report has no CCA section.
  EXPECT_EQ(format_model_info(model_info(tiny_moe(), 1, 8, DType::f32)).find("CCA"),
            std::string::npos);
}

TEST(ModelInfo, DecodeStateGrowsByTheKeyValueCachesPerToken) {
  const ModelConfig c = tiny_moe();
  // Per token of context: a key and a value of kv_dim floats in every layer, and its score
  // in every head.
  const int64_t per_token = 4 * (2 * c.n_layers * c.kv_dim() + c.n_heads);
  EXPECT_EQ(decode_state_bytes(c, 32) - decode_state_bytes(c, 16), 16 * per_token);
  EXPECT_GT(decode_state_bytes(c, 1), 4 * c.padded_vocab());  // the logits, and more
  // A batch holds that much per sequence.
  EXPECT_EQ(decode_state_bytes(c, 32, 8), 8 * decode_state_bytes(c, 32));
}

}  // namespace
}  // namespace foundry
