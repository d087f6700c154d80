// The ZAYA1 architecture (arch "zaya1"): forward, backward and incremental decoding, composed
// from the kernels in kernels/cca.h, kernels/zaya_router.h, kernels/ops.h and attention.h
// following the recipes in those headers. See model.h for the layer structure.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "base/error.h"
#include "kernels/attention.h"
#include "kernels/ops.h"
#include "model/model.h"

namespace foundry {

namespace {

// ‖·‖ = sqrt(Σx² + eps) in the QK norm (see kernels/cca.h).
constexpr float kQkNormEps = 1e-6f;

// Slab offsets of one ZAYA1 layer's tensors, looked up once.
struct ResidualScaleOffsets {
  int64_t alpha_res, beta_res, alpha_h, beta_h;
};

struct ZayaLayerOffsets {
  // attention sublayer
  int64_t ln1, wqk, wv, w0, b0, w1, b1, temp, wo;
  ResidualScaleOffsets rs_attn;
  // MoE sublayer
  int64_t ln2, down_w, down_b, gamma = -1, rnorm, fc1_w, fc1_b, fc2_w, fc2_b, out_w;
  std::vector<int64_t> w13, w2;  // per expert: [2F, C] (gate rows then up rows), [C, F]
  ResidualScaleOffsets rs_moe;
};

ResidualScaleOffsets residual_scale_offsets(const ParamTable& t, const std::string& prefix) {
  return {t.get(prefix + "residual_scale").offset, t.get(prefix + "residual_bias").offset,
          t.get(prefix + "hidden_states_scale").offset,
          t.get(prefix + "hidden_states_bias").offset};
}

// out [N, C] = (x + beta) ⊙ alpha (the embedding's entry into the residual stream).
void scale_shift_forward(float* out, const float* x, const float* alpha, const float* beta,
                         int64_t n, int64_t c) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < c; ++j) out[i * c + j] = (x[i * c + j] + beta[j]) * alpha[j];
}

// dx [N, C] (writes) = alpha ⊙ dout; dalpha += Σ_n (x + beta) ⊙ dout; dbeta += alpha ⊙ Σ_n dout.
// Each thread owns a block of channels and walks the tokens in order (rows stay contiguous
// in memory), so every sum has a fixed order whatever the thread count.
void scale_shift_backward(float* dx, float* dalpha, float* dbeta, const float* dout,
                          const float* x, const float* alpha, const float* beta, int64_t n,
                          int64_t c) {
  constexpr int64_t kBlock = 64;
#pragma omp parallel for schedule(static)
  for (int64_t j0 = 0; j0 < c; j0 += kBlock) {
    const int64_t j1 = std::min(c, j0 + kBlock);
    double sa[kBlock] = {}, sb[kBlock] = {};
    for (int64_t i = 0; i < n; ++i) {
      const float* g = dout + i * c;
      const float* xi = x + i * c;
      float* dxi = dx + i * c;
      for (int64_t j = j0; j < j1; ++j) {
        sa[j - j0] += static_cast<double>((xi[j] + beta[j]) * g[j]);
        sb[j - j0] += g[j];
        dxi[j] = alpha[j] * g[j];
      }
    }
    for (int64_t j = j0; j < j1; ++j) {
      dalpha[j] += static_cast<float>(sa[j - j0]);
      dbeta[j] += static_cast<float>(alpha[j] * sb[j - j0]);
    }
  }
}

void residual_scale_fwd(float* out, const float* res, const float* h, const float* P,
                        const ResidualScaleOffsets& o, int64_t n, int64_t c) {
  ops::residual_scale_forward(out, res, h, P + o.alpha_res, P + o.beta_res, P + o.alpha_h,
                              P + o.beta_h, n, c);
}

}  // namespace

// Buffers for one (batch, seq) shape; [N = B·T], Cc = (Hq + Hk)·d packed CCA channels,
// R router latent, S router classes, K choices per token.
struct ZayaActivations {
  int64_t batch = 0, seq = 0;
  std::vector<ZayaLayerOffsets> layers;
  int64_t embed = 0, final_norm = 0, in_alpha = 0, in_beta = 0;
  std::vector<int32_t> inputs, targets;
  std::vector<float> emb;                           // [N, C] embedding rows
  // per layer, attention sublayer
  std::vector<std::vector<float>> res_a;            // [N, C] residual entering it
  std::vector<std::vector<float>> n1, n1_rstd;      // [N, C], [N]
  std::vector<std::vector<float>> c, y, qk;         // [N, Cc]: [q0 ‖ k0], depthwise out, pre-norm
  std::vector<std::vector<float>> rnorm;            // [N, Hq + Hk]
  std::vector<std::vector<float>> q, k, v;          // [N, Hq·d], [N, Hk·d] ×2
  std::vector<std::vector<float>> probs;            // [B, Hq, T, T]
  std::vector<std::vector<float>> att, h_a;         // [N, Hq·d], [N, C]
  // per layer, MoE sublayer
  std::vector<std::vector<float>> res_m;            // [N, C] residual entering it
  std::vector<std::vector<float>> n2, n2_rstd;      // [N, C], [N]
  std::vector<std::vector<float>> r, u, r_rstd;     // [N, R] ×2, [N]
  std::vector<std::vector<float>> a1, g1, a2, g2;   // [N, R]
  std::vector<std::vector<float>> rprobs, gate;     // [N, S], [N, K]
  std::vector<std::vector<int32_t>> choice;         // [N, K]
  std::vector<std::vector<int64_t>> offsets;        // [S + 1]
  std::vector<std::vector<int32_t>> slot_token, assignment_slot;  // [N·K]
  std::vector<std::vector<float>> xs, hh, act, ys;  // [N·K, C], [N·K, 2F], [N·K, F], [N·K, C]
  std::vector<std::vector<float>> h_m;              // [N, C]
  std::vector<float> res_out, nf, nf_rstd;          // [N, C], [N, C], [N]
  std::vector<float> logits, losses;                // [N, Vp] (dlogits in backward), [N]
  std::vector<float> router_logits;                 // [N, S] scratch
  bool has_targets = false;
  // backward scratch
  std::vector<float> dres, dres2, dh, dn;           // [N, C]
  std::vector<float> dc, dy, dqk;                   // [N, Cc]
  std::vector<float> dq, dk, dv, datt;              // [N, Hq·d], [N, Hk·d] ×2, [N, Hq·d]
  std::vector<float> dxs, dhh, dact, dys, dgate;    // [N·K, C], [N·K, 2F], [N·K, F], [N·K, C], [N, K]
  std::vector<float> dlogits_r, dg, da, dr, dr_prev;  // [N, S], [N, R] ×4
};

void ZayaActivationsDeleter::operator()(ZayaActivations* a) const { delete a; }

void Model::reset_balancers() {
  balancers_.clear();
  class_counts_.clear();
  if (!config_.is_zaya()) return;
  ops::ZayaBalancerOptions o;
  o.lr = config_.balance_bias_lr;
  o.skip_bias_init = static_cast<float>(config_.skip_bias_init);
  for (int64_t l = 0; l < config_.n_layers; ++l)
    balancers_.emplace_back(config_.n_experts, config_.router_skip_class, o);
  class_counts_.assign(config_.n_layers * config_.router_classes(), 0);
}

void Model::update_balancers(const int64_t* counts, int64_t assignments) {
  const int64_t S = config_.router_classes();
  for (size_t l = 0; l < balancers_.size(); ++l) balancers_[l].update(counts + l * S, assignments);
}

json Model::balancer_state() const {
  json layers = json::array();
  for (const auto& b : balancers_)
    layers.push_back({{"bias", b.bias}, {"exp_avg", b.exp_avg}, {"exp_avg_sq", b.exp_avg_sq},
                      {"step", b.step}});
  return layers;
}

void Model::load_balancer_state(const json& state) {
  if (!state.is_array() || state.size() != balancers_.size())
    fail(fmt::format("router balancer state holds {} MoE sublayers, the model has {}",
                     state.is_array() ? state.size() : 0, balancers_.size()),
         "load a checkpoint written for this model config");
  try {
    for (size_t l = 0; l < balancers_.size(); ++l) {
      const json& s = state[l];
      balancers_[l].load_state(s.at("bias").get<std::vector<float>>(),
                               s.at("exp_avg").get<std::vector<float>>(),
                               s.at("exp_avg_sq").get<std::vector<float>>(),
                               s.at("step").get<int64_t>());
    }
  } catch (const json::exception& e) {
    fail(fmt::format("router balancer state is malformed: {}", e.what()),
         "load a checkpoint written by this version of foundry");
  }
}

}  // namespace foundry

namespace foundry {

void Model::ensure_zaya_activations(int64_t batch, int64_t seq) {
  if (zacts_ && zacts_->batch == batch && zacts_->seq == seq) return;
  if (seq > config_.max_seq_len)
    fail(fmt::format("sequence length {} exceeds model.max_seq_len = {}", seq,
                     config_.max_seq_len));
  const ModelConfig& c = config_;
  std::unique_ptr<ZayaActivations, ZayaActivationsDeleter> za(new ZayaActivations);
  ZayaActivations& a = *za;
  a.batch = batch;
  a.seq = seq;
  const int64_t N = batch * seq, C = c.d_model, L = c.n_layers, K = c.top_k, F = c.ffn_dim;
  const int64_t QD = c.q_dim(), KVD = c.kv_dim(), Cc = QD + KVD, R = c.router_latent_dim;
  const int64_t S = c.router_classes(), G = c.n_heads + c.n_kv_heads;
  const ParamTable& t = table_;
  a.embed = t.get("model.embed_tokens.weight").offset;
  a.final_norm = t.get("model.norm.weight").offset;
  a.in_alpha = t.get("model.input_hidden_states_scale").offset;
  a.in_beta = t.get("model.input_hidden_states_bias").offset;
  for (int64_t l = 0; l < L; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    const std::string qkv = p + "self_attn.qkv_proj.", g = p + "mlp.gate.";
    ZayaLayerOffsets o;
    o.ln1 = t.get(p + "input_layernorm.weight").offset;
    o.wqk = t.get(qkv + "q_proj.weight").offset;  // k_proj follows: one [Cc, C] matrix
    o.wv = t.get(qkv + "v_proj_current.weight").offset;  // v_proj_delayed follows
    o.w0 = t.get(qkv + "conv_qk_depthwise.weight").offset;
    o.b0 = t.get(qkv + "conv_qk_depthwise.bias").offset;
    o.w1 = t.get(qkv + "conv_qk_grouped.weight").offset;
    o.b1 = t.get(qkv + "conv_qk_grouped.bias").offset;
    o.temp = t.get(p + "self_attn.qk_norm.temp").offset;
    o.wo = t.get(p + "self_attn.o_proj.weight").offset;
    o.rs_attn = residual_scale_offsets(t, p + "post_attention_residual_scale.");
    o.ln2 = t.get(p + "post_attention_layernorm.weight").offset;
    o.down_w = t.get(g + "down_proj.weight").offset;
    o.down_b = t.get(g + "down_proj.bias").offset;
    if (const ParamInfo* gamma = t.find(g + "router_states_scale")) o.gamma = gamma->offset;
    o.rnorm = t.get(g + "router_mlp.norm.weight").offset;
    o.fc1_w = t.get(g + "router_mlp.fc1.weight").offset;
    o.fc1_b = t.get(g + "router_mlp.fc1.bias").offset;
    o.fc2_w = t.get(g + "router_mlp.fc2.weight").offset;
    o.fc2_b = t.get(g + "router_mlp.fc2.bias").offset;
    o.out_w = t.get(g + "router_mlp.out_proj.weight").offset;
    for (int64_t e = 0; e < c.n_experts; ++e) {
      const std::string ep = fmt::format("{}mlp.experts.{}.", p, e);
      o.w13.push_back(t.get(ep + "gate_proj.weight").offset);
      o.w2.push_back(t.get(ep + "down_proj.weight").offset);
    }
    o.rs_moe = residual_scale_offsets(t, p + "post_mlp_residual_scale.");
    a.layers.push_back(std::move(o));
  }
  auto per_layer = [&](auto& v, int64_t n) {
    v.resize(L);
    for (auto& x : v) x.assign(n, {});
  };
  a.inputs.resize(N);
  a.targets.resize(N);
  a.emb.assign(N * C, 0);
  per_layer(a.res_a, N * C);
  per_layer(a.n1, N * C);
  per_layer(a.n1_rstd, N);
  per_layer(a.c, N * Cc);
  per_layer(a.y, N * Cc);
  per_layer(a.qk, N * Cc);
  per_layer(a.rnorm, N * G);
  per_layer(a.q, N * QD);
  per_layer(a.k, N * KVD);
  per_layer(a.v, N * KVD);
  per_layer(a.probs, batch * c.n_heads * seq * seq);
  per_layer(a.att, N * QD);
  per_layer(a.h_a, N * C);
  per_layer(a.res_m, N * C);
  per_layer(a.n2, N * C);
  per_layer(a.n2_rstd, N);
  per_layer(a.r, N * R);
  per_layer(a.u, N * R);
  per_layer(a.r_rstd, N);
  per_layer(a.a1, N * R);
  per_layer(a.g1, N * R);
  per_layer(a.a2, N * R);
  per_layer(a.g2, N * R);
  per_layer(a.rprobs, N * S);
  per_layer(a.gate, N * K);
  per_layer(a.choice, N * K);
  per_layer(a.offsets, S + 1);
  per_layer(a.slot_token, N * K);
  per_layer(a.assignment_slot, N * K);
  per_layer(a.xs, N * K * C);
  // Expert hidden activations: with expert parallelism the owners keep them (model.cpp).
  const int64_t expert_rows = ep_ ? 0 : N * K;
  per_layer(a.hh, expert_rows * 2 * F);
  per_layer(a.act, expert_rows * F);
  per_layer(a.ys, N * K * C);
  per_layer(a.h_m, N * C);
  a.res_out.assign(N * C, 0);
  a.nf.assign(N * C, 0);
  a.nf_rstd.assign(N, 0);
  a.logits.assign(N * c.padded_vocab(), 0);
  a.losses.assign(N, 0);
  a.router_logits.assign(N * S, 0);
  for (auto* v : {&a.dres, &a.dres2, &a.dh, &a.dn}) v->assign(N * C, 0);
  for (auto* v : {&a.dc, &a.dy, &a.dqk}) v->assign(N * Cc, 0);
  a.dq.assign(N * QD, 0);
  a.dk.assign(N * KVD, 0);
  a.dv.assign(N * KVD, 0);
  a.datt.assign(N * QD, 0);
  a.dxs.assign(N * K * C, 0);
  a.dhh.assign(expert_rows * 2 * F, 0);
  a.dact.assign(expert_rows * F, 0);
  a.dys.assign(N * K * C, 0);
  a.dgate.assign(N * K, 0);
  a.dlogits_r.assign(N * S, 0);
  for (auto* v : {&a.dg, &a.da, &a.dr, &a.dr_prev}) v->assign(N * R, 0);
  zacts_ = std::move(za);
}

ForwardResult Model::zaya_forward(const int32_t* inputs, const int32_t* targets, int64_t batch,
                                  int64_t seq) {
  ensure_zaya_activations(batch, seq);
  ZayaActivations& a = *zacts_;
  const ModelConfig& c = config_;
  const int64_t B = batch, T = seq, N = B * T, C = c.d_model, E = c.n_experts, K = c.top_k;
  const int64_t Hq = c.n_heads, Hk = c.n_kv_heads, d = c.head_dim;
  const int64_t QD = c.q_dim(), KVD = c.kv_dim(), Cc = QD + KVD, R = c.router_latent_dim;
  const int64_t S = c.router_classes(), G = Hq + Hk, half = KVD / 2;
  const int64_t rot = c.rotary_dim();
  const float eps = static_cast<float>(c.rms_norm_eps);
  const float* P = params_.data();
  for (int64_t i = 0; i < N; ++i) {
    if (inputs[i] < 0 || inputs[i] >= c.vocab_size)
      fail(fmt::format("input token id {} at position {} is outside the vocabulary [0, {})",
                       inputs[i], i, c.vocab_size),
           "the data and the model config disagree on the vocabulary");
  }
  std::memcpy(a.inputs.data(), inputs, N * sizeof(int32_t));
  a.has_targets = targets != nullptr;
  if (targets) std::memcpy(a.targets.data(), targets, N * sizeof(int32_t));

  {
    ScopedOpTimer t(&op_times_, "embedding");
    ops::embedding_forward(a.emb.data(), inputs, P + a.embed, N, C);
    scale_shift_forward(a.res_a[0].data(), a.emb.data(), P + a.in_alpha, P + a.in_beta, N, C);
  }
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const ZayaLayerOffsets& o = a.layers[l];
    // ---- CCA sublayer ----
    {
      ScopedOpTimer t(&op_times_, "rmsnorm");
      ops::rmsnorm_forward(a.n1[l].data(), a.n1_rstd[l].data(), a.res_a[l].data(), P + o.ln1, N,
                           C, eps);
    }
    {
      ScopedOpTimer t(&op_times_, "attn_qkv_gemm");
      const void* n1 = as_gemm_input(a.n1[l].data(), N * C, 2);
      gemm(n1, false, gemm_weight(o.wqk), true, a.c[l].data(), N, Cc, C, precision_);
      gemm(n1, false, gemm_weight(o.wv), true, a.v[l].data(), N, KVD, C, precision_);
    }
    {
      ScopedOpTimer t(&op_times_, "cca_conv");
      ops::cca_depthwise_conv_forward(a.y[l].data(), a.c[l].data(), P + o.w0, P + o.b0, B, T, Cc,
                                      c.cca_kernel_depthwise);
      ops::cca_grouped_conv_forward(a.qk[l].data(), a.y[l].data(), P + o.w1, P + o.b1, B, T, G, d,
                                    c.cca_kernel_grouped);
      ops::cca_means_forward(a.qk[l].data(), a.c[l].data(), N, Hq, Hk, d);
      ops::cca_qk_norm_forward(a.q[l].data(), a.k[l].data(), a.rnorm[l].data(), a.qk[l].data(),
                               P + o.temp, N, Hq, Hk, d, kQkNormEps);
      ops::cca_value_shift_inplace_forward(a.v[l].data(), static_cast<float*>(nullptr), B, T,
                                           half);
    }
    {
      ScopedOpTimer t(&op_times_, "rope");
      ops::rope_apply(a.q[l].data(), B, T, Hq, d, rot, 0, c.rope_theta, false);
      ops::rope_apply(a.k[l].data(), B, T, Hk, d, rot, 0, c.rope_theta, false);
    }
    {
      ScopedOpTimer t(&op_times_, "attention");
      ops::attention_forward(a.att[l].data(), a.probs[l].data(), a.q[l].data(), a.k[l].data(),
                             a.v[l].data(), {B, T, Hq, Hk, d}, precision_);
    }
    {
      ScopedOpTimer t(&op_times_, "attn_out_gemm");
      linear_forward(a.h_a[l].data(), a.att[l].data(), o.wo, N, C, QD);
    }
    {
      ScopedOpTimer t(&op_times_, "residual_scale");
      residual_scale_fwd(a.res_m[l].data(), a.res_a[l].data(), a.h_a[l].data(), P, o.rs_attn, N,
                         C);
    }
    // ---- MoE sublayer ----
    {
      ScopedOpTimer t(&op_times_, "rmsnorm");
      ops::rmsnorm_forward(a.n2[l].data(), a.n2_rstd[l].data(), a.res_m[l].data(), P + o.ln2, N,
                           C, eps);
    }
    {
      // The router runs in fp32 (it is small, and the choice is sensitive to rounding).
      ScopedOpTimer t(&op_times_, "router");
      float* r = a.r[l].data();
      gemm(a.n2[l].data(), false, P + o.down_w, true, r, N, R, C, DType::f32);
      ops::bias_add_forward(r, P + o.down_b, N, R);
      if (o.gamma >= 0) ops::eda_forward(r, a.r[l - 1].data(), P + o.gamma, N, R);
      ops::rmsnorm_forward(a.u[l].data(), a.r_rstd[l].data(), r, P + o.rnorm, N, R, eps);
      gemm(a.u[l].data(), false, P + o.fc1_w, true, a.a1[l].data(), N, R, R, DType::f32);
      ops::bias_add_forward(a.a1[l].data(), P + o.fc1_b, N, R);
      ops::gelu_forward(a.g1[l].data(), a.a1[l].data(), N, R);
      gemm(a.g1[l].data(), false, P + o.fc2_w, true, a.a2[l].data(), N, R, R, DType::f32);
      ops::bias_add_forward(a.a2[l].data(), P + o.fc2_b, N, R);
      ops::gelu_forward(a.g2[l].data(), a.a2[l].data(), N, R);
      gemm(a.g2[l].data(), false, P + o.out_w, true, a.router_logits.data(), N, S, R, DType::f32);
      ops::zaya_gating_forward(a.rprobs[l].data(), a.choice[l].data(), a.gate[l].data(),
                               a.router_logits.data(), balancers_[l].bias.data(), N, E, K,
                               c.router_skip_class, c.skip_passes_input);
      ops::zaya_class_counts(class_counts_.data() + l * S, a.choice[l].data(), N, K, S);
      ops::moe_dispatch_plan(a.offsets[l].data(), a.slot_token[l].data(),
                             a.assignment_slot[l].data(), a.choice[l].data(), N, S, K);
      ops::moe_gather(a.xs[l].data(), a.n2[l].data(), a.slot_token[l].data(), N * K, C);
    }
    const int64_t* offs = a.offsets[l].data();
    moe_experts_forward(l, offs, a.xs[l].data(), a.hh[l].data(), a.act[l].data(),
                        a.ys[l].data(), o.w13, o.w2);
    {
      // Skip rows: zero output, or the input itself (an identity "expert" gated by p_skip).
      float* skip = a.ys[l].data() + offs[E] * C;
      const int64_t skip_elems = (offs[S] - offs[E]) * C;
      if (c.skip_passes_input)
        std::memcpy(skip, a.xs[l].data() + offs[E] * C, skip_elems * sizeof(float));
      else
        std::memset(skip, 0, skip_elems * sizeof(float));
    }
    {
      ScopedOpTimer t(&op_times_, "moe_combine");
      std::memset(a.h_m[l].data(), 0, N * C * sizeof(float));
      ops::moe_combine(a.h_m[l].data(), a.ys[l].data(), a.gate[l].data(),
                       a.assignment_slot[l].data(), N, K, C);
    }
    {
      ScopedOpTimer t(&op_times_, "residual_scale");
      float* next = l + 1 < c.n_layers ? a.res_a[l + 1].data() : a.res_out.data();
      residual_scale_fwd(next, a.res_m[l].data(), a.h_m[l].data(), P, o.rs_moe, N, C);
    }
  }
  ForwardResult result;
  result.ce_loss = lm_head_forward(lm_head(a), a.res_out.data(), targets, N);
  result.loss = result.ce_loss;  // ZAYA1 balances with router biases, not an auxiliary loss
  return result;
}

const std::vector<std::vector<int64_t>>* Model::zaya_expert_offsets() const {
  return zacts_ ? &zacts_->offsets : nullptr;
}

const float* Model::zaya_logits() const {
  FOUNDRY_CHECK(zacts_ && !zacts_->has_targets);
  return zacts_->logits.data();
}

void Model::zaya_backward() {
  FOUNDRY_CHECK(zacts_ && zacts_->has_targets);
  ZayaActivations& a = *zacts_;
  const ModelConfig& c = config_;
  const int64_t B = a.batch, T = a.seq, N = B * T, C = c.d_model, E = c.n_experts, K = c.top_k;
  const int64_t Hq = c.n_heads, Hk = c.n_kv_heads, d = c.head_dim;
  const int64_t QD = c.q_dim(), KVD = c.kv_dim(), Cc = QD + KVD, R = c.router_latent_dim;
  const int64_t S = c.router_classes(), G = Hq + Hk, half = KVD / 2, Vp = c.padded_vocab();
  const int64_t rot = c.rotary_dim();
  const float* P = params_.data();
  float* Gr = grads_.data();
  // dres: gradient of the residual stream at the current point, walked backward; dres2 the
  // gradient of the residual entering the sublayer being differentiated.
  float* dres = a.dres.data();
  float* dres2 = a.dres2.data();
  lm_head_backward(lm_head(a), dres, a.dn.data(), a.res_out.data(), N);
  // The router state's gradient chains backward through the MoE sublayers (EDA).
  std::memset(a.dr.data(), 0, N * R * sizeof(float));
  for (int64_t l = c.n_layers - 1; l >= 0; --l) {
    const ZayaLayerOffsets& o = a.layers[l];
    const int64_t* offs = a.offsets[l].data();
    // ---- MoE merge: res_next = (res_m + β) ⊙ α + (h_m + β_h) ⊙ α_h ----
    {
      ScopedOpTimer t(&op_times_, "residual_scale");
      std::memset(dres2, 0, N * C * sizeof(float));
      std::memset(a.dh.data(), 0, N * C * sizeof(float));
      const ResidualScaleOffsets& rs = o.rs_moe;
      ops::residual_scale_backward(dres2, a.dh.data(), Gr + rs.alpha_res, Gr + rs.beta_res,
                                   Gr + rs.alpha_h, Gr + rs.beta_h, dres, a.res_m[l].data(),
                                   a.h_m[l].data(), P + rs.alpha_res, P + rs.beta_res,
                                   P + rs.alpha_h, P + rs.beta_h, N, C);
      std::swap(dres, dres2);  // dres: gradient of res_m (the norm's part comes below)
    }
    {
      ScopedOpTimer t(&op_times_, "moe_combine");
      ops::moe_combine_backward(a.dys.data(), a.dgate.data(), a.dh.data(), a.ys[l].data(),
                                a.gate[l].data(), a.assignment_slot[l].data(), N, K, C);
    }
    moe_experts_backward(l, offs, a.dys.data(), a.xs[l].data(), a.hh[l].data(),
                         a.act[l].data(), a.dxs.data(), a.dhh.data(), a.dact.data(), o.w13, o.w2);
    {
      float* dskip = a.dxs.data() + offs[E] * C;
      const int64_t skip_elems = (offs[S] - offs[E]) * C;
      if (c.skip_passes_input)
        std::memcpy(dskip, a.dys.data() + offs[E] * C, skip_elems * sizeof(float));
      else
        std::memset(dskip, 0, skip_elems * sizeof(float));
    }
    {
      ScopedOpTimer t(&op_times_, "router");
      float* dn = a.dn.data();
      std::memset(dn, 0, N * C * sizeof(float));
      ops::moe_gather_backward(dn, a.dxs.data(), a.assignment_slot[l].data(), N, K, C);
      ops::zaya_gating_backward(a.dlogits_r.data(), a.dgate.data(), a.rprobs[l].data(),
                                a.choice[l].data(), N, E, K, c.router_skip_class,
                                c.skip_passes_input);
      // logits = g2·W3ᵀ
      gemm(a.dlogits_r.data(), true, a.g2[l].data(), false, Gr + o.out_w, S, R, N, DType::f32,
           true);
      gemm(a.dlogits_r.data(), false, P + o.out_w, false, a.dg.data(), N, R, S, DType::f32);
      // a2 = g1·W2ᵀ + b2, g2 = gelu(a2)
      ops::gelu_backward(a.da.data(), a.dg.data(), a.a2[l].data(), N, R);
      ops::bias_add_backward(Gr + o.fc2_b, a.da.data(), N, R);
      gemm(a.da.data(), true, a.g1[l].data(), false, Gr + o.fc2_w, R, R, N, DType::f32, true);
      gemm(a.da.data(), false, P + o.fc2_w, false, a.dg.data(), N, R, R, DType::f32);
      // a1 = u·W1ᵀ + b1, g1 = gelu(a1)
      ops::gelu_backward(a.da.data(), a.dg.data(), a.a1[l].data(), N, R);
      ops::bias_add_backward(Gr + o.fc1_b, a.da.data(), N, R);
      gemm(a.da.data(), true, a.u[l].data(), false, Gr + o.fc1_w, R, R, N, DType::f32, true);
      gemm(a.da.data(), false, P + o.fc1_w, false, a.dg.data(), N, R, R, DType::f32);
      // u = rms(r): dr += (dr already holds the next MoE sublayer's EDA contribution)
      ops::rmsnorm_backward(a.dr.data(), Gr + o.rnorm, a.dg.data(), a.r[l].data(), P + o.rnorm,
                            a.r_rstd[l].data(), N, R);
      // r = n2·Wdownᵀ + b (+ γ ⊙ r_prev): the pre-EDA gradient is dr itself.
      std::memset(a.dr_prev.data(), 0, N * R * sizeof(float));
      if (o.gamma >= 0)
        ops::eda_backward(a.dr_prev.data(), Gr + o.gamma, a.dr.data(), a.r[l - 1].data(),
                          P + o.gamma, N, R);
      ops::bias_add_backward(Gr + o.down_b, a.dr.data(), N, R);
      gemm(a.dr.data(), true, a.n2[l].data(), false, Gr + o.down_w, R, C, N, DType::f32, true);
      gemm(a.dr.data(), false, P + o.down_w, false, dn, N, C, R, DType::f32, true);
      std::swap(a.dr, a.dr_prev);
    }
    {
      ScopedOpTimer t(&op_times_, "rmsnorm");
      ops::rmsnorm_backward(dres, Gr + o.ln2, a.dn.data(), a.res_m[l].data(), P + o.ln2,
                            a.n2_rstd[l].data(), N, C);
    }
    gradients_final(o.ln2);
    // ---- attention merge: res_m = (res_a + β) ⊙ α + (h_a + β_h) ⊙ α_h ----
    {
      ScopedOpTimer t(&op_times_, "residual_scale");
      std::memset(dres2, 0, N * C * sizeof(float));
      std::memset(a.dh.data(), 0, N * C * sizeof(float));
      const ResidualScaleOffsets& rs = o.rs_attn;
      ops::residual_scale_backward(dres2, a.dh.data(), Gr + rs.alpha_res, Gr + rs.beta_res,
                                   Gr + rs.alpha_h, Gr + rs.beta_h, dres, a.res_a[l].data(),
                                   a.h_a[l].data(), P + rs.alpha_res, P + rs.beta_res,
                                   P + rs.alpha_h, P + rs.beta_h, N, C);
      std::swap(dres, dres2);
    }
    // ---- CCA sublayer ----
    {
      ScopedOpTimer t(&op_times_, "attn_out_gemm");
      linear_backward(a.datt.data(), Gr + o.wo, a.dh.data(), a.att[l].data(), o.wo, N, C, QD,
                      false);
    }
    {
      ScopedOpTimer t(&op_times_, "attention");
      ops::attention_backward(a.dq.data(), a.dk.data(), a.dv.data(), a.datt.data(),
                              a.probs[l].data(), a.q[l].data(), a.k[l].data(), a.v[l].data(),
                              {B, T, Hq, Hk, d}, precision_);
    }
    {
      ScopedOpTimer t(&op_times_, "rope");
      ops::rope_apply(a.dq.data(), B, T, Hq, d, rot, 0, c.rope_theta, true);
      ops::rope_apply(a.dk.data(), B, T, Hk, d, rot, 0, c.rope_theta, true);
    }
    {
      ScopedOpTimer t(&op_times_, "cca_conv");
      ops::cca_value_shift_inplace_backward(a.dv.data(), B, T, half);
      std::memset(a.dqk.data(), 0, N * Cc * sizeof(float));
      ops::cca_qk_norm_backward(a.dqk.data(), Gr + o.temp, a.dq.data(), a.dk.data(),
                                a.qk[l].data(), a.rnorm[l].data(), P + o.temp, N, Hq, Hk, d);
      std::memset(a.dc.data(), 0, N * Cc * sizeof(float));
      ops::cca_means_backward(a.dc.data(), a.dqk.data(), N, Hq, Hk, d);
      std::memset(a.dy.data(), 0, N * Cc * sizeof(float));
      ops::cca_grouped_conv_backward(a.dy.data(), Gr + o.w1, Gr + o.b1, a.dqk.data(),
                                     a.y[l].data(), P + o.w1, B, T, G, d, c.cca_kernel_grouped);
      ops::cca_depthwise_conv_backward(a.dc.data(), Gr + o.w0, Gr + o.b0, a.dy.data(),
                                       a.c[l].data(), P + o.w0, B, T, Cc,
                                       c.cca_kernel_depthwise);
    }
    {
      ScopedOpTimer t(&op_times_, "attn_qkv_gemm");
      const void* n1 = as_gemm_input(a.n1[l].data(), N * C, 2);
      auto proj_backward = [&](const float* dy, int64_t w, int64_t out, bool acc) {
        const void* dyin = as_gemm_input(dy, N * out, 0);
        gemm(dyin, false, gemm_weight(w), false, a.dn.data(), N, C, out, precision_, acc);
        gemm(dyin, true, n1, false, Gr + w, out, C, N, precision_, true);
      };
      proj_backward(a.dc.data(), o.wqk, Cc, false);
      proj_backward(a.dv.data(), o.wv, KVD, true);
    }
    {
      ScopedOpTimer t(&op_times_, "rmsnorm");
      ops::rmsnorm_backward(dres, Gr + o.ln1, a.dn.data(), a.res_a[l].data(), P + o.ln1,
                            a.n1_rstd[l].data(), N, C);
    }
    gradients_final(o.ln1);
  }
  {
    ScopedOpTimer t(&op_times_, "embedding");
    scale_shift_backward(a.dn.data(), Gr + a.in_alpha, Gr + a.in_beta, dres, a.emb.data(),
                         P + a.in_alpha, P + a.in_beta, N, C);
    ops::embedding_backward(Gr + a.embed, a.dn.data(), a.inputs.data(), N, C, Vp);
  }
  gradients_final(0);
}


Model::DecodeState Model::zaya_new_decode_state(int64_t max_len) const {
  const ModelConfig& c = config_;
  const int64_t QD = c.q_dim(), KVD = c.kv_dim(), R = c.router_latent_dim;
  DecodeState s;
  s.max_len = max_len;
  s.k_cache.assign(c.n_layers, std::vector<float>(max_len * KVD));
  s.v_cache.assign(c.n_layers, std::vector<float>(max_len * KVD));
  const ops::CcaDims dims{c.n_heads, c.n_kv_heads, c.head_dim, c.cca_kernel_depthwise,
                          c.cca_kernel_grouped};
  s.cca.assign(c.n_layers, ops::CcaDecodeState<float>(dims, 1));
  for (auto* v : {&s.x, &s.n, &s.y}) v->resize(c.d_model);
  s.q.resize(QD);
  s.att.resize(std::max(QD, c.d_model));  // also the expert-output scratch [C]
  s.h.resize(2 * c.ffn_dim);
  s.act.resize(c.ffn_dim);
  s.scores.resize(max_len);
  s.router_logits.resize(c.router_classes());
  s.router_probs.resize(c.router_classes());
  s.logits.resize(c.padded_vocab());
  s.c.resize(QD + KVD);
  s.qk.resize(QD + KVD);
  s.rnorm.resize(c.n_heads + c.n_kv_heads);
  s.v.resize(KVD);
  for (auto* v : {&s.r, &s.r_prev, &s.u, &s.a1, &s.a2, &s.g1, &s.g2}) v->resize(R);
  return s;
}

const float* Model::zaya_decode_step(DecodeState& s, int32_t token) {
  const ModelConfig& c = config_;
  ensure_zaya_activations(zacts_ ? zacts_->batch : 1, zacts_ ? zacts_->seq : 1);  // offsets
  const ZayaActivations& a = *zacts_;
  const int64_t C = c.d_model, E = c.n_experts, K = c.top_k, F = c.ffn_dim, d = c.head_dim;
  const int64_t Hq = c.n_heads, Hk = c.n_kv_heads, QD = c.q_dim(), KVD = c.kv_dim();
  const int64_t R = c.router_latent_dim, S = c.router_classes(), pos = s.pos;
  const int64_t rot = c.rotary_dim();
  const float eps = static_cast<float>(c.rms_norm_eps);
  const float* P = params_.data();
  float rstd;
  ops::embedding_forward(s.y.data(), &token, P + a.embed, 1, C);
  scale_shift_forward(s.x.data(), s.y.data(), P + a.in_alpha, P + a.in_beta, 1, C);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const ZayaLayerOffsets& o = a.layers[l];
    // ---- CCA ----
    ops::rmsnorm_forward(s.n.data(), &rstd, s.x.data(), P + o.ln1, 1, C, eps);
    float* kc = s.k_cache[l].data() + pos * KVD;
    float* vc = s.v_cache[l].data() + pos * KVD;
    linear_forward(s.c.data(), s.n.data(), o.wqk, 1, QD + KVD, C);
    ops::cca_conv_decode(s.qk.data(), s.cca[l], s.c.data(), P + o.w0, P + o.b0, P + o.w1,
                         P + o.b1);
    ops::cca_means_forward(s.qk.data(), s.c.data(), 1, Hq, Hk, d);
    ops::cca_qk_norm_forward(s.q.data(), kc, s.rnorm.data(), s.qk.data(), P + o.temp, 1, Hq, Hk,
                             d, kQkNormEps);
    ops::rope_apply(s.q.data(), 1, 1, Hq, d, rot, pos, c.rope_theta, false);
    ops::rope_apply(kc, 1, 1, Hk, d, rot, pos, c.rope_theta, false);
    linear_forward(vc, s.n.data(), o.wv, 1, KVD, C);
    ops::cca_value_shift_decode(vc, s.cca[l]);
    ops::attention_decode(s.att.data(), s.scores.data(), s.q.data(), s.k_cache[l].data(),
                          s.v_cache[l].data(), pos + 1, Hq, Hk, d);
    linear_forward(s.y.data(), s.att.data(), o.wo, 1, C, QD);
    residual_scale_fwd(s.x.data(), s.x.data(), s.y.data(), P, o.rs_attn, 1, C);
    // ---- MoE with the ZAYA1 router ----
    ops::rmsnorm_forward(s.n.data(), &rstd, s.x.data(), P + o.ln2, 1, C, eps);
    gemm(s.n.data(), false, P + o.down_w, true, s.r.data(), 1, R, C, DType::f32);
    ops::bias_add_forward(s.r.data(), P + o.down_b, 1, R);
    if (o.gamma >= 0) ops::eda_forward(s.r.data(), s.r_prev.data(), P + o.gamma, 1, R);
    ops::rmsnorm_forward(s.u.data(), &rstd, s.r.data(), P + o.rnorm, 1, R, eps);
    gemm(s.u.data(), false, P + o.fc1_w, true, s.a1.data(), 1, R, R, DType::f32);
    ops::bias_add_forward(s.a1.data(), P + o.fc1_b, 1, R);
    ops::gelu_forward(s.g1.data(), s.a1.data(), 1, R);
    gemm(s.g1.data(), false, P + o.fc2_w, true, s.a2.data(), 1, R, R, DType::f32);
    ops::bias_add_forward(s.a2.data(), P + o.fc2_b, 1, R);
    ops::gelu_forward(s.g2.data(), s.a2.data(), 1, R);
    gemm(s.g2.data(), false, P + o.out_w, true, s.router_logits.data(), 1, S, R, DType::f32);
    std::vector<int32_t> choice(K);
    std::vector<float> gate(K);
    ops::zaya_gating_forward(s.router_probs.data(), choice.data(), gate.data(),
                             s.router_logits.data(), balancers_[l].bias.data(), 1, E, K,
                             c.router_skip_class, c.skip_passes_input);
    std::fill(s.y.begin(), s.y.end(), 0.0f);
    for (int64_t j = 0; j < K; ++j) {
      if (choice[j] >= E) {  // the skip class
        if (c.skip_passes_input)
          for (int64_t i = 0; i < C; ++i) s.y[i] += gate[j] * s.n[i];
        continue;
      }
      linear_forward(s.h.data(), s.n.data(), o.w13[choice[j]], 1, 2 * F, C);
      ops::swiglu_forward(s.act.data(), s.h.data(), 1, F);
      linear_forward(s.att.data(), s.act.data(), o.w2[choice[j]], 1, C, F);  // att: scratch [C]
      for (int64_t i = 0; i < C; ++i) s.y[i] += gate[j] * s.att[i];
    }
    residual_scale_fwd(s.x.data(), s.x.data(), s.y.data(), P, o.rs_moe, 1, C);
    std::swap(s.r, s.r_prev);
  }
  ops::rmsnorm_forward(s.n.data(), &rstd, s.x.data(), P + a.final_norm, 1, C, eps);
  linear_forward(s.logits.data(), s.n.data(), a.embed, 1, c.padded_vocab(), C);
  for (int64_t v = c.vocab_size; v < c.padded_vocab(); ++v)
    s.logits[v] = -std::numeric_limits<float>::infinity();
  ++s.pos;
  return s.logits.data();
}

}  // namespace foundry
