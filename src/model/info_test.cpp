#include "model/info.h"

#include <gtest/gtest.h>

#include "base/error.h"
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
  EXPECT_DOUBLE_EQ(f.train_flops, 62208 + 3072);
  EXPECT_DOUBLE_EQ(f.forward_flops, (62208 + 3072) / 3.0);
  EXPECT_DOUBLE_EQ(train_flops_per_token(tiny_moe(), 8), 65280);

  // Dense, T = 4: 6·(192 + 384 + 1024) + 12·1·4·8 = 9600 + 384.
  EXPECT_DOUBLE_EQ(train_flops_per_token(tiny_dense(), 4), 9984);
}

// tiny_moe at B = 1, T = 8 (N = 8, N·K = 16), in floats:
//   per layer: x, n1, q, k+v, att, x_mid, n2 = 7·128; two 1/rms 2·8; probs 1·4·8·8 = 256;
//     router probs 8·4 = 32; top-k ids + weights 2·16; dispatch plan 2·16; expert inputs
//     16·16 = 256; hidden 16·48 = 768; SwiGLU 16·24 = 384; expert outputs 256  -> 2928
//   once: final residual 128; final norm 128 + 8; logits 8·256 = 2048; losses 8; ids 16
//     -> 2336
//   activations = 4·(2·2928 + 2336) = 32768 bytes
//   backward: 2·128 + (128 + 2·64) + 128 + 256 + 2·256 + 16·72 + 8·6 = 2608 -> 10432 bytes
TEST(ModelInfo, HandComputedMemory) {
  const MemoryEstimate m = estimate_memory(tiny_moe(), 1, 8, DType::bf16);
  EXPECT_EQ(m.weights_fp32_bytes, 4 * 15056);
  EXPECT_EQ(m.weights_bf16_bytes, 2 * 15056);
  EXPECT_EQ(m.grads_bytes, 4 * 15056);
  EXPECT_EQ(m.optimizer_bytes, 8 * 15056);
  EXPECT_EQ(m.activations_bytes, 32768);
  EXPECT_EQ(m.backward_buffers_bytes, 10432);
  EXPECT_EQ(m.total_bytes, 18 * 15056 + 32768 + 10432);

  const MemoryEstimate fp32 = estimate_memory(tiny_moe(), 1, 8, DType::f32);
  EXPECT_EQ(fp32.weights_bf16_bytes, 0);
  EXPECT_EQ(fp32.total_bytes, m.total_bytes - 2 * 15056);
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

}  // namespace
}  // namespace foundry
