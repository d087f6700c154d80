// Shared helpers of the whole-model tests (model_test.cpp, zaya_test.cpp, model_mpitest.cpp).
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "base/rng.h"
#include "model/model.h"

namespace foundry::testing {

// A tiny standard MoE for whole-model tests: vocab 50 (padded to 128: the padded rows must get
// no gradient), C = 16, 2 layers, 4/2 heads of 4, F = 24, T ≤ 8, init_std 0.2 (large enough
// that every path carries gradient), aux loss 0.1 when there is a router.
inline ModelConfig small_moe_config(int64_t experts = 4, int64_t top_k = 2) {
  ModelConfig c;
  c.vocab_size = 50;
  c.d_model = 16;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 4;
  c.n_experts = experts;
  c.top_k = top_k;
  c.ffn_dim = 24;
  c.max_seq_len = 8;
  c.init_std = 0.2;
  c.aux_loss_coef = experts > 1 ? 0.1 : 0.0;
  c.validate("test");
  return c;
}

// `moe` as arch zaya1 (CCA, the ZAYA1 router with a skip class that passes its input, no aux
// loss), with narrower experts and an 8-wide router latent.
inline ModelConfig small_zaya_config(ModelConfig moe) {
  ModelConfig& c = moe;
  c.arch = Arch::zaya1;
  c.norm_topk_prob = false;
  c.aux_loss_coef = 0;
  c.rope_fraction = 0.5;
  c.ffn_dim = 12;
  c.router_latent_dim = 8;
  c.skip_passes_input = true;
  c.validate("test");
  return c;
}

struct Batch {
  std::vector<int32_t> inputs, targets;
};

// Perturbs every constant-initialized parameter (unit scales, zero biases, unit temperature and
// EDA gamma) by 0.3·N(0, 1) so that those constants do not hide a wrong gradient that happens
// to vanish there, or a bias read where zero was (the CCA's depthwise bias before a sequence).
inline void randomize_scalars(Model& model, uint64_t seed) {
  Rng rng(seed);
  for (const auto& p : model.table().params()) {
    if (p.init != ParamInit::constant) continue;
    float* w = model.params() + p.offset;
    for (int64_t i = 0; i < p.numel; ++i)
      w[i] = static_cast<float>(p.init_value + 0.3 * rng.normal());
  }
  model.sync_weights();
}

// n random input and target ids below the config's vocabulary.
inline Batch random_batch(const ModelConfig& c, int64_t n, uint64_t seed) {
  Rng rng(seed);
  Batch b;
  for (int64_t i = 0; i < n; ++i) {
    b.inputs.push_back(static_cast<int32_t>(rng.below(c.vocab_size)));
    b.targets.push_back(static_cast<int32_t>(rng.below(c.vocab_size)));
  }
  return b;
}

// `steps` training steps of b sequences of t tokens on fresh random batches: forward, backward,
// the ZAYA1 balancers' update, and plain SGD (p −= lr·g) on host copies of the slabs written
// back, so a model on a device is driven through its copies in and out. Returns the losses;
// `grads` (when given) gets the last step's gradient slab.
inline std::vector<double> sgd_steps(Model& model, int steps, int64_t b, int64_t t, double lr,
                                     std::vector<float>* grads = nullptr) {
  const ModelConfig& c = model.config();
  std::vector<float> p(model.slab_size()), g(model.slab_size());
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    const Batch batch = random_batch(c, b * t, 100 + s);
    model.zero_grads();
    losses.push_back(model.forward(batch.inputs.data(), batch.targets.data(), b, t).loss);
    model.backward();
    if (c.is_zaya()) {
      const std::vector<int64_t>& near = model.router_boundary_counts();
      model.update_balancers(model.router_class_counts().data(), b * t * c.top_k,
                             near.empty() ? nullptr : near.data());
    }
    model.read_params(p.data());
    model.read_grads(g.data());
    for (size_t i = 0; i < p.size(); ++i) p[i] -= static_cast<float>(lr) * g[i];
    model.write_params(p.data());
  }
  if (grads) *grads = g;
  return losses;
}

// For each tensor, compares the directional derivative g·d along a random direction d
// restricted to that tensor with the central difference (L(p+εd) − L(p−εd)) / 2ε, on the
// model as it is (an fp32 model). Losses are summed in double, so fp32 rounding limits the
// agreement to ~1e-3. Also checks that padded vocabulary rows get no gradient.
inline void expect_gradients_match_finite_differences(Model& model, const Batch& batch,
                                                      int64_t b, int64_t t) {
  const ModelConfig& c = model.config();
  model.zero_grads();
  model.forward(batch.inputs.data(), batch.targets.data(), b, t);
  model.backward();
  const std::vector<float> grads(model.grads(), model.grads() + model.slab_size());

  const ParamInfo& embed = model.table().get("model.embed_tokens.weight");
  for (int64_t i = c.vocab_size * c.d_model; i < embed.numel; ++i)
    ASSERT_EQ(grads[embed.offset + i], 0.0f) << "padded vocabulary row got a gradient";

  Rng rng(99);
  for (const auto& p : model.table().params()) {
    std::vector<float> dir(p.numel);
    double analytic = 0;
    for (int64_t i = 0; i < p.numel; ++i) {
      dir[i] = static_cast<float>(rng.normal());
      analytic += static_cast<double>(dir[i]) * grads[p.offset + i];
    }
    float* w = model.params() + p.offset;
    const std::vector<float> saved(w, w + p.numel);
    // The routing at the saved weights; the step shrinks (up to 3 times) until neither side
    // of the difference changes it.
    model.forward(batch.inputs.data(), batch.targets.data(), b, t);
    const std::vector<int64_t> loads = model.expert_loads(), classes = model.router_class_counts();
    // The loss at saved + step·dir, and whether the routing stayed as at the saved weights
    // (a token that changes expert makes the loss jump: no derivative there).
    auto loss_at = [&](double step, bool& same_routing) {
      for (int64_t i = 0; i < p.numel; ++i) w[i] = saved[i] + static_cast<float>(step) * dir[i];
      const double loss = model.forward(batch.inputs.data(), batch.targets.data(), b, t).loss;
      same_routing = same_routing && model.expert_loads() == loads &&
                     model.router_class_counts() == classes;
      return loss;
    };
    double eps = 1e-2 / std::sqrt(static_cast<double>(p.numel)), numeric = 0;
    for (int attempt = 0; attempt < 4; ++attempt) {
      bool same = true;
      const double plus = loss_at(eps, same), minus = loss_at(-eps, same);
      numeric = (plus - minus) / (2 * eps);
      if (same) break;
      eps /= 4;
    }
    std::copy(saved.begin(), saved.end(), w);
    EXPECT_NEAR(analytic, numeric, 2e-2 * std::abs(numeric) + 2e-3)
        << p.name << ": analytic " << analytic << " numeric " << numeric;
  }
}

// The gradients-final hook's contract (Model::set_gradients_final_hook): offsets decrease,
// the last is 0, the model's own sublayer boundaries are reported, and nothing at or above a
// reported offset changes afterwards (each report's final region is snapshotted and compared
// with the gradients backward returns).
inline void expect_gradients_final_hook_is_honest(Model& model, const Batch& batch, int64_t b,
                                                  int64_t t) {
  const int64_t E = model.slab_size();
  std::vector<int64_t> offsets;
  std::vector<std::vector<float>> snapshots;
  model.set_gradients_final_hook([&](int64_t o) {
    offsets.push_back(o);
    snapshots.emplace_back(model.grads() + o, model.grads() + E);
  });
  model.zero_grads();
  model.forward(batch.inputs.data(), batch.targets.data(), b, t);
  model.backward();
  model.set_gradients_final_hook({});
  const int64_t L = model.config().n_layers;
  ASSERT_EQ(static_cast<int64_t>(offsets.size()), 2 * L + 2);  // norm, 2 per layer, embedding
  EXPECT_EQ(offsets.front(), model.table().get("model.norm.weight").offset);
  EXPECT_EQ(offsets.back(), 0);
  EXPECT_EQ(offsets[2], model.table().get("model.layers." + std::to_string(L - 1) +
                                          ".input_layernorm.weight").offset);
  for (size_t i = 1; i < offsets.size(); ++i) EXPECT_LT(offsets[i], offsets[i - 1]);
  for (size_t i = 0; i < offsets.size(); ++i) {
    bool any_nonzero = false;
    for (float g : snapshots[i]) any_nonzero |= g != 0.0f;
    EXPECT_TRUE(any_nonzero) << "report " << i << " at offset " << offsets[i];
    EXPECT_EQ(0, std::memcmp(snapshots[i].data(), model.grads() + offsets[i],
                             snapshots[i].size() * sizeof(float)))
        << "gradients at offsets >= " << offsets[i] << " changed after being reported final";
  }
}

// One sequence of T random tokens decoded a token at a time against the full forward pass:
// every real logit within tol, the padded vocabulary −inf.
inline void expect_decode_matches_forward(Model& model, int64_t T, uint64_t seed, double tol) {
  const ModelConfig& c = model.config();
  const Batch batch = random_batch(c, T, seed);
  model.forward(batch.inputs.data(), nullptr, 1, T);
  const std::vector<float> full(model.logits(), model.logits() + T * c.padded_vocab());
  auto state = model.new_decode_state(T);
  for (int64_t t = 0; t < T; ++t) {
    const float* step = model.decode_step(state, batch.inputs[t]);
    for (int64_t v = 0; v < c.vocab_size; ++v)
      ASSERT_NEAR(step[v], full[t * c.padded_vocab() + v], tol) << "position " << t;
    for (int64_t v = c.vocab_size; v < c.padded_vocab(); ++v) ASSERT_TRUE(std::isinf(step[v]));
  }
}

// B sequences decoded in step (one decode state of batch B) against each decoded alone: the
// logits of every sequence at every position agree within tol·(1 + |logit|) (the GEMMs of B
// rows may round in another order than those of one row), padded entries stay −inf.
inline void expect_batched_decode_matches_single(Model& model, int64_t B, int64_t T,
                                                 uint64_t seed, double tol) {
  const ModelConfig& c = model.config();
  const int64_t Vp = c.padded_vocab();
  const Batch batch = random_batch(c, B * T, seed);  // sequence b: inputs [b·T, (b + 1)·T)
  std::vector<float> single(B * T * Vp);
  for (int64_t b = 0; b < B; ++b) {
    auto state = model.new_decode_state(T);
    for (int64_t t = 0; t < T; ++t) {
      const float* step = model.decode_step(state, batch.inputs[b * T + t]);
      std::copy(step, step + Vp, single.begin() + (b * T + t) * Vp);
    }
  }
  auto state = model.new_decode_state(T, B);
  std::vector<int32_t> tokens(B);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t b = 0; b < B; ++b) tokens[b] = batch.inputs[b * T + t];
    const float* step = model.decode_step(state, tokens.data());
    for (int64_t b = 0; b < B; ++b) {
      const float* alone = single.data() + (b * T + t) * Vp;
      for (int64_t v = 0; v < c.vocab_size; ++v)
        ASSERT_NEAR(step[b * Vp + v], alone[v], tol * (1 + std::abs(alone[v])))
            << "sequence " << b << " position " << t;
      for (int64_t v = c.vocab_size; v < Vp; ++v) ASSERT_TRUE(std::isinf(step[b * Vp + v]));
    }
  }
}

// The logits [13, Vp] of rows at their own positions over a shared prefix segment: a run of
// 5 prompt rows in one step into the prefix, then two sequences continuing it in segments of
// their own, side by side for 3 steps; the tokens drawn from `rng` (needs max_seq_len >= 8).
inline std::vector<float> shared_prefix_logits(Model& m, Rng& rng) {
  const int64_t Vp = m.config().padded_vocab();
  auto token = [&] { return static_cast<int32_t>(rng.below(m.config().vocab_size)); };
  Model::KvSegment prefix = m.new_kv_segment(0, 5);
  auto state = m.new_rows_state(5);
  std::vector<Model::DecodeRow> run;
  for (int i = 0; i < 5; ++i) run.push_back({token(), {&prefix}});
  const float* logits = m.decode_rows(state, run);
  std::vector<float> out(logits, logits + 5 * Vp);
  Model::KvSegment a = m.new_kv_segment(5, 3, &prefix), b = m.new_kv_segment(5, 3, &prefix);
  for (int i = 0; i < 3; ++i) {
    logits = m.decode_rows(state, {{token(), {&prefix, &a}}, {token(), {&prefix, &b}}});
    out.insert(out.end(), logits, logits + 2 * Vp);
  }
  return out;
}

}  // namespace foundry::testing
