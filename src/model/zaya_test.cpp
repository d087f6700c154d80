// Whole-model checks of arch "zaya1": gradients against finite differences (every tensor, EDA
// chained over several MoE sublayers, skip-class variants, top-k), causality, incremental
// decoding against the full forward pass, and router balancing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "base/rng.h"
#include "model/model.h"
#include "model/test_support.h"

namespace foundry {
namespace {

ModelConfig tiny_zaya(int64_t layers = 3) {
  ModelConfig c;
  c.arch = Arch::zaya1;
  c.norm_topk_prob = false;
  c.aux_loss_coef = 0;
  c.vocab_size = 50;  // padded to 128
  c.d_model = 16;
  c.n_layers = layers;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 4;
  c.rope_fraction = 0.5;
  c.n_experts = 4;
  c.top_k = 1;
  c.ffn_dim = 12;
  c.router_latent_dim = 8;
  c.max_seq_len = 8;
  c.init_std = 0.3;  // large enough that every path carries gradient
  c.validate("test");
  return c;
}

using testing::Batch;
using testing::random_batch;

using testing::randomize_scalars;

// The expert choice is piecewise constant; the perturbations are far too small to flip it.
void check_gradients(const ModelConfig& c) {
  Model model(c, DType::f32);
  model.init_weights(7);
  randomize_scalars(model, 8);
  testing::expect_gradients_match_finite_differences(model, random_batch(c, 12, 11), 2, 6);
}

TEST(ZayaGradient, Top1WithSkipClassMatchesFiniteDifferences) { check_gradients(tiny_zaya()); }

TEST(Zaya, GradientsFinalHookReportsOnlyFinishedGradients) {
  const ModelConfig c = tiny_zaya();
  Model model(c, DType::f32);
  model.init_weights(7);
  randomize_scalars(model, 8);
  testing::expect_gradients_final_hook_is_honest(model, random_batch(c, 12, 11), 2, 6);
}

TEST(ZayaGradient, SkipPassesInputMatchesFiniteDifferences) {
  ModelConfig c = tiny_zaya();
  c.skip_passes_input = true;
  check_gradients(c);
}

TEST(ZayaGradient, Top2WithoutEdaOrSkipMatchesFiniteDifferences) {
  ModelConfig c = tiny_zaya(2);
  c.top_k = 2;
  c.router_eda = false;
  c.router_skip_class = false;
  check_gradients(c);
}

TEST(ZayaGradient, WiderKernelsAndFullRopeMatchFiniteDifferences) {
  ModelConfig c = tiny_zaya(2);
  c.cca_kernel_depthwise = 3;
  c.cca_kernel_grouped = 1;
  c.rope_fraction = 1.0;
  c.n_kv_heads = 1;
  check_gradients(c);
}

// The skip class must actually be chosen in the tests above for them to cover it.
TEST(Zaya, SkipClassIsChosenAndGetsNoExpertRows) {
  ModelConfig c = tiny_zaya();
  Model model(c, DType::f32);
  model.init_weights(7);
  for (auto& b : model.balancers()) b.bias.back() = 100.0f;  // favour skipping
  Batch batch = random_batch(c, 12, 11);
  model.forward(batch.inputs.data(), batch.targets.data(), 2, 6);
  const auto& counts = model.router_class_counts();
  const int64_t S = c.router_classes();
  ASSERT_EQ(static_cast<int64_t>(counts.size()), c.n_layers * S);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    int64_t total = 0;
    for (int64_t s = 0; s < S; ++s) total += counts[l * S + s];
    EXPECT_EQ(total, 12 * c.top_k);
    EXPECT_EQ(counts[l * S + S - 1], 12) << "bias +100 on the skip class must win every token";
  }
}

// Changing token t never changes the outputs at positions before t: the convolutions and
// the value shift only look back. Not bitwise: a changed token may switch experts, which
// changes the row counts of the expert GEMMs and with them oneDNN's blocking (rounding) for
// the other rows. A leak through a convolution tap or the value shift would move the earlier
// logits by ~1e-2 with these weights; the tolerance is 1e-5.
TEST(Zaya, CausalityHoldsAtEveryPosition) {
  ModelConfig c = tiny_zaya();
  c.cca_kernel_depthwise = 3;
  Model model(c, DType::f32);
  model.init_weights(5);
  randomize_scalars(model, 6);
  const int64_t T = 8, Vp = c.padded_vocab();
  Batch batch = random_batch(c, T, 3);
  model.forward(batch.inputs.data(), nullptr, 1, T);
  const std::vector<float> base(model.logits(), model.logits() + T * Vp);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> changed = batch.inputs;
    changed[t] = (changed[t] + 17) % static_cast<int32_t>(c.vocab_size);
    model.forward(changed.data(), nullptr, 1, T);
    const float* out = model.logits();
    for (int64_t i = 0; i < t * Vp; ++i)
      ASSERT_NEAR(out[i], base[i], 1e-5 * (1 + std::abs(base[i])))
          << "changing token " << t << " moved position " << i / Vp;
    bool moved = false;
    for (int64_t i = t * Vp; i < (t + 1) * Vp && !moved; ++i)
      moved = std::abs(out[i] - base[i]) > 1e-3;
    EXPECT_TRUE(moved) << "token " << t << " does not affect its own position";
  }
}

void check_decode(const ModelConfig& c, DType precision, double tol) {
  Model model(c, precision);
  model.init_weights(3);
  randomize_scalars(model, 4);
  testing::expect_decode_matches_forward(model, 8, 5, tol);
}

TEST(Zaya, IncrementalDecodingMatchesFullForward) {
  check_decode(tiny_zaya(), DType::f32, 1e-4);
  ModelConfig c = tiny_zaya();
  c.top_k = 2;
  c.skip_passes_input = true;
  c.cca_kernel_depthwise = 3;
  check_decode(c, DType::f32, 1e-4);
}

TEST(Zaya, BatchedDecodingMatchesSingleSequences) {
  ModelConfig c = tiny_zaya();
  for (bool skip_passes_input : {false, true}) {
    c.top_k = skip_passes_input ? 2 : 1;
    c.skip_passes_input = skip_passes_input;
    for (DType precision : {DType::f32, DType::bf16}) {
      Model model(c, precision);
      model.init_weights(3);
      randomize_scalars(model, 4);
      testing::expect_batched_decode_matches_single(model, 5, 8, 9,
                                                    precision == DType::f32 ? 1e-5 : 1e-3);
    }
  }
}

TEST(Zaya, SameSeedSameLossBitwise) {
  ModelConfig c = tiny_zaya();
  Batch batch = random_batch(c, 12, 1);
  double losses[2];
  std::vector<float> grads[2];
  for (int i = 0; i < 2; ++i) {
    Model model(c, DType::bf16);
    model.init_weights(42);
    model.zero_grads();
    losses[i] = model.forward(batch.inputs.data(), batch.targets.data(), 2, 6).loss;
    model.backward();
    grads[i].assign(model.grads(), model.grads() + model.slab_size());
  }
  EXPECT_EQ(losses[0], losses[1]);
  EXPECT_EQ(grads[0], grads[1]);
}

// bf16 computes through its own paths (the CCA's output projection's backward reads dh written
// in bf16; the convolutions run through the stacked bf16 rows): every tensor's gradient stays
// within bf16's error of fp32's on the same weights and batch (a seed whose routing is the same
// in both, so that the gradients compare).
TEST(Zaya, Bf16GradientsTrackFp32) {
  const ModelConfig c = tiny_zaya();
  const Batch batch = random_batch(c, 12, 5);
  std::vector<float> grads[2];
  std::vector<int64_t> loads[2];
  for (DType precision : {DType::f32, DType::bf16}) {
    Model model(c, precision);
    model.init_weights(11);
    randomize_scalars(model, 12);
    model.zero_grads();
    model.forward(batch.inputs.data(), batch.targets.data(), 2, 6);
    model.backward();
    const int i = precision == DType::bf16;
    grads[i].assign(model.grads(), model.grads() + model.slab_size());
    loads[i] = model.expert_loads();
  }
  ASSERT_EQ(loads[0], loads[1]);  // the same routing, so the gradients compare
  const ParamTable table(c);
  for (const auto& p : table.params()) {
    double diff = 0, norm = 0;
    for (int64_t i = p.offset; i < p.offset + p.numel; ++i) {
      diff += std::pow(static_cast<double>(grads[1][i]) - grads[0][i], 2);
      norm += std::pow(static_cast<double>(grads[0][i]), 2);
    }
    EXPECT_LE(std::sqrt(diff), 0.05 * std::sqrt(norm) + 1e-6) << p.name;
  }
}

// A tiny ZAYA1 model whose router favours expert 0 in every sublayer (the router MLP's last
// GELU output is mostly positive, so adding 1 to out_proj's row 0 favours class 0), a batch
// of 64 tokens, and the max |load error| over its sublayers after a forward pass.
struct SkewedRouter {
  ModelConfig config;
  Model model;
  static constexpr int64_t B = 8, T = 8, N = B * T;
  Batch batch;

  explicit SkewedRouter(const ModelConfig& c)
      : config(c), model(c, DType::f32), batch(random_batch(c, N, 21)) {
    model.init_weights(9);
    for (int64_t l = 0; l < c.n_layers; ++l) {
      float* w =
          model.param(fmt::format("model.layers.{}.mlp.gate.router_mlp.out_proj.weight", l));
      for (int64_t i = 0; i < c.router_latent_dim; ++i) w[i] += 1.0f;  // row 0 = expert 0
    }
    model.sync_weights();
  }
  double forward_max_load_error() {
    model.forward(batch.inputs.data(), batch.targets.data(), B, T);
    const int64_t S = config.router_classes();
    double worst = 0;
    for (int64_t i = 0; i < config.n_layers * S; ++i)
      worst = std::max(worst, std::abs(static_cast<double>(model.router_class_counts()[i]) / N -
                                       1.0 / S));
    return worst;
  }
  // `updates` balancing steps, each from a fresh forward pass's counts.
  void balance(int updates) {
    for (int u = 0; u < updates; ++u) {
      forward_max_load_error();
      const std::vector<int64_t> counts = model.router_class_counts();
      const std::vector<int64_t> near = model.router_boundary_counts();
      model.update_balancers(counts.data(), N * config.top_k,
                             near.empty() ? nullptr : near.data());
    }
  }
};

// The balancer alone (no parameter training) must bring every class's load near uniform.
// Stated bound: within 300 updates the worst class is within 0.1 of uniform (1/S = 0.2) for a
// batch of 64 tokens (one token is 1/64 = 0.016 of the load).
TEST(Zaya, BalancingBiasDrivesLoadsTowardUniform) {
  ModelConfig c = tiny_zaya(2);
  // This tiny router's logits differ little between its 64 tokens, so a gain of 1 would
  // move every token at once; the gain is of the order of that spread.
  c.balance_rule = "proportional";
  c.balance_bias_lr = 0.1;
  SkewedRouter skewed(c);
  const int64_t S = c.router_classes();
  const double initial = skewed.forward_max_load_error();
  EXPECT_GT(initial, 0.25) << "the setup should favour expert 0 strongly";
  skewed.balance(300);
  EXPECT_LT(skewed.forward_max_load_error(), 0.1) << "initial " << initial;
  // Round trip of the balancer state.
  json state = skewed.model.balancer_state();
  Model other(skewed.config, DType::f32);
  EXPECT_EQ(other.load_balancer_state(state), "");
  EXPECT_EQ(other.balancers()[1].bias, skewed.model.balancers()[1].bias);
  EXPECT_EQ(other.balancers()[1].step, 300);

  // A state saved under the other rule routes as trained and restarts the configured rule.
  ModelConfig adamw = skewed.config;
  adamw.balance_rule = "adamw";
  Model switched(adamw, DType::f32);
  EXPECT_NE(switched.load_balancer_state(state).find("saved under balance rule \"proportional\""),
            std::string::npos);
  EXPECT_EQ(switched.balancers()[1].bias, skewed.model.balancers()[1].bias);
  EXPECT_EQ(switched.balancers()[1].exp_avg, std::vector<float>(S, 0.0f));
  EXPECT_THROW(Model(tiny_zaya(3), DType::f32).load_balancer_state(state), Error);
}

// The newton rule measures the slope the proportional rule above needs its gain tuned to: on
// the same router, with its default damping, it balances as well, from the boundary counts
// the forward pass leaves beside the class counts.
TEST(Zaya, NewtonBalancingNeedsNoTunedGain) {
  ModelConfig c = tiny_zaya(2);
  c.balance_rule = "newton";
  SkewedRouter skewed(c);
  const double initial = skewed.forward_max_load_error();
  EXPECT_GT(initial, 0.25);
  ASSERT_EQ(skewed.model.router_boundary_counts().size(),
            skewed.model.router_class_counts().size());
  skewed.balance(300);
  EXPECT_LT(skewed.forward_max_load_error(), 0.1) << "initial " << initial;
  EXPECT_EQ(skewed.model.balancer_state()[0]["rule"], "newton");
}

TEST(Zaya, ParamTableHasZayaNamesAndFusedPairs) {
  ModelConfig c = tiny_zaya(2);
  ParamTable t(c);
  const auto& q = t.get("model.layers.1.self_attn.qkv_proj.q_proj.weight");
  const auto& k = t.get("model.layers.1.self_attn.qkv_proj.k_proj.weight");
  EXPECT_EQ(k.offset, q.offset + q.numel) << "q and k must form one [Cc, C] matrix";
  const auto& vc = t.get("model.layers.1.self_attn.qkv_proj.v_proj_current.weight");
  const auto& vd = t.get("model.layers.1.self_attn.qkv_proj.v_proj_delayed.weight");
  EXPECT_EQ(vd.offset, vc.offset + vc.numel);
  EXPECT_EQ(vc.shape, (std::vector<int64_t>{4, 16}));  // Hk·d/2 = 4
  EXPECT_EQ(t.get("model.layers.0.self_attn.qkv_proj.conv_qk_grouped.weight").shape,
            (std::vector<int64_t>{24, 4, 2}));
  EXPECT_EQ(t.find("model.layers.0.mlp.gate.router_states_scale"), nullptr)
      << "the first MoE sublayer has no previous router state";
  EXPECT_NE(t.find("model.layers.1.mlp.gate.router_states_scale"), nullptr);
  EXPECT_EQ(t.get("model.layers.0.mlp.gate.router_mlp.out_proj.weight").shape,
            (std::vector<int64_t>{5, 8}));  // 4 experts + skip
  EXPECT_FALSE(t.get("model.layers.0.mlp.gate.down_proj.bias").weight_decay);
  EXPECT_FALSE(t.get("model.layers.0.post_mlp_residual_scale.residual_scale").weight_decay);
  EXPECT_TRUE(t.get("model.layers.0.mlp.experts.2.down_proj.weight").weight_decay);
  EXPECT_EQ(t.get("model.layers.0.self_attn.qk_norm.temp").init_value, 1.0);
}

// A config that names only the architecture gets ZAYA1's own router settings.
TEST(Zaya, ArchitectureDefaultsAreZaya1s) {
  const ModelConfig c = parse_model_config(json{{"arch", "zaya1"}}, "t.json");
  EXPECT_EQ(c.top_k, 1);
  EXPECT_FALSE(c.norm_topk_prob);
  EXPECT_EQ(c.aux_loss_coef, 0.0);
  EXPECT_EQ(c.rope_fraction, 0.5);
  EXPECT_EQ(parse_model_config(json{{"arch", "moe"}}, "t.json").top_k, 2);
  EXPECT_EQ(parse_model_config(json{{"arch", "zaya1"}, {"top_k", 2}}, "t.json").top_k, 2);
}

TEST(Zaya, RejectsBadConfigs) {
  json j = to_json(tiny_zaya());
  j["skip_passes_input"] = true;
  j["router_skip_class"] = false;
  EXPECT_THROW(parse_model_config(j, "t.json"), Error);
  json moe = to_json(ModelConfig{});
  moe["router_latent_dim"] = 64;
  try {
    parse_model_config(moe, "t.json");
    FAIL() << "a zaya1 key on arch moe must be rejected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.router_latent_dim"), std::string::npos);
  }
  json odd = to_json(tiny_zaya());
  odd["rope_fraction"] = 0.25;  // 1 rotary dim of head_dim 4: odd
  EXPECT_THROW(parse_model_config(odd, "t.json"), Error);
  json qk = to_json(tiny_zaya());
  qk["qk_norm"] = "head";  // the CCA normalizes q and k itself
  try {
    parse_model_config(qk, "t.json");
    FAIL() << "model.qk_norm on arch zaya1 must be rejected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.qk_norm"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace foundry
