// The ZAYA1 architecture (arch "zaya1") as a composition of the sublayers, each merged into
// the residual stream by residual scaling:
//   res = (embed(tokens) + β_in) ⊙ α_in
//   per layer:  res = (res + β) ⊙ α + (h + β_h) ⊙ α_h,  h = CCA(res)   (model/cca_sublayer.h)
//               res = (res + β) ⊙ α + (h + β_h) ⊙ α_h,  h = MoE(res)   (the ZAYA1 router)
//   loss = lm_head(res)   (no auxiliary loss: the router balances with per-class biases)
// The router chains its EDA state r through the MoE sublayers.
#include <algorithm>

#include <fmt/format.h>

#include "base/error.h"
#include "kernels/ops.h"
#include "model/architecture.h"
#include "model/cca_sublayer.h"
#include "model/lm_head.h"
#include "model/moe_sublayer.h"
#include "model/routers.h"

namespace foundry {
namespace {

// ---- residual scaling ----------------------------------------------------------------------

struct ResidualScaleWeights {
  int64_t alpha_res, beta_res, alpha_h, beta_h;  // slab offsets, [C] each
  static ResidualScaleWeights of(const ParamTable& t, const std::string& prefix) {
    return {t.get(prefix + "residual_scale").offset, t.get(prefix + "residual_bias").offset,
            t.get(prefix + "hidden_states_scale").offset,
            t.get(prefix + "hidden_states_bias").offset};
  }
};

// out [N, C] = (res + β) ⊙ α + (h + β_h) ⊙ α_h (out may alias res).
void residual_scale_forward(Compute& cx, const ResidualScaleWeights& w, float* out,
                            const float* res, const float* h, int64_t n) {
  cx.ops.residual_scale_forward(out, res, h, cx.p(w.alpha_res), cx.p(w.beta_res),
                                cx.p(w.alpha_h), cx.p(w.beta_h), n, cx.config.d_model);
}

// From dout [N, C]: dh [N, C] (written, as `dh_type`) and the four vectors' gradients (+=).
// The residual's gradient α ⊙ dout is left to the sublayer's pre-norm backward: the
// InputGradient returned, into dres.
InputGradient residual_scale_backward(Compute& cx, const ResidualScaleWeights& w, float* dres,
                                      void* dh, DType dh_type, const float* dout,
                                      const float* res, const float* h, int64_t n) {
  const int64_t C = cx.config.d_model;
  auto t = cx.time("residual_scale");
  cx.ops.residual_scale_backward_params(dh, dh_type, cx.g(w.alpha_res), cx.g(w.beta_res),
                                        cx.g(w.alpha_h), cx.g(w.beta_h), dout, res, h,
                                        cx.p(w.alpha_res), cx.p(w.beta_res), cx.p(w.alpha_h),
                                        cx.p(w.beta_h), n, C);
  return InputGradient(dres, dout, cx.p(w.alpha_res));
}

// ---- the composition -------------------------------------------------------------------------

struct LayerWeights {
  CcaWeights cca;
  ResidualScaleWeights cca_merge;
  MoeWeights moe;
  ZayaRouterWeights router;
  ResidualScaleWeights moe_merge;
};

LayerWeights layer_weights(const ParamTable& t, const ModelConfig& c, int64_t l) {
  const std::string p = fmt::format("model.layers.{}.", l);
  LayerWeights w{CcaWeights::of_layer(t, l),
                 ResidualScaleWeights::of(t, p + "post_attention_residual_scale."),
                 {t.get(p + "post_attention_layernorm.weight").offset, {}},
                 ZayaRouterWeights::of_layer(t, l),
                 ResidualScaleWeights::of(t, p + "post_mlp_residual_scale.")};
  for (int64_t e = 0; e < c.n_experts; ++e) {
    const std::string ep = fmt::format("{}mlp.experts.{}.", p, e);
    w.moe.experts.w13.push_back(t.get(ep + "gate_proj.weight").offset);
    w.moe.experts.w2.push_back(t.get(ep + "down_proj.weight").offset);
  }
  return w;
}

// Everything one batch shape needs, in one allocation.
struct Activations : CommonActivations {
  float* emb;       // [N, C]           embedding rows
  float* res;       // [2L + 1, N, C]   the residual stream entering each sublayer, then the output
  float* h;         // [2L, N, C]       each sublayer's output before its merge
  int64_t* counts;  // [L, S]           class counts, copied to the host once per forward
  int64_t* near;    // [L, S]           boundary counts (the newton rule)
  std::vector<CcaActs> cca;
  std::vector<ZayaRouterActs> router;
  // backward scratch, shared by the sublayers
  float *dres, *dres2, *dh;  // [N, C]
  AttentionGrads attn_grads;
  CcaGrads cca_grads;
  MoeGrads moe_grads;
  ZayaRouterScratch router_scratch;

  Activations(const ModelConfig& c, BatchShape s, bool expert_parallel,
              const BlockSource* source, bool measure_only = false) {
    shape = s;
    const int64_t L = c.n_layers, NC = s.rows() * c.d_model;
    cca.resize(L);
    moe.resize(L);
    router.resize(L);
    const auto layout = [&](Arena& a) {
      inputs = a.take<int32_t>(s.rows());
      targets = a.take<int32_t>(s.rows());
      emb = a.take<float>(NC);
      res = a.take<float>((2 * L + 1) * NC);
      h = a.take<float>(2 * L * NC);
      counts = a.take<int64_t>(L * c.router_classes());
      near = a.take<int64_t>(L * c.router_classes());
      for (int64_t l = 0; l < L; ++l) {
        cca[l].take(a, c, s);
        moe[l].take(a, c, s, expert_parallel);
        router[l].take(a, c, s);
      }
      head.take(a, c, s);
      for (float** p : {&dres, &dres2, &dh}) *p = a.take<float>(NC);
      attn_grads.take(a, c, s);
      cca_grads.take(a, c, s);
      moe_grads.take(a, c, s, expert_parallel);
      router_scratch.take(a, c, s);
    };
    if (measure_only)
      measured_bytes = static_cast<int64_t>(arena.measure(layout));
    else
      arena.build(layout, source);
  }
};

// The decoding state of B sequences in step, in one allocation.
struct DecodeBuffers : DecodeScratch {
  int64_t max_len = 0, batch = 0;
  DecodeCaches caches;
  float* cca = nullptr;      // with own caches: [L, B] CCA state blocks (ops::decode_state_floats)
  int64_t cca_floats = 0;    // one block's floats
  float *x, *y, *emb;        // [B, C]
  CcaDecodeScratch attn;
  MoeActs moe;               // shape {B, 1}, shared by the layers
  float *r, *r_prev;         // [B, R]: this MoE sublayer's router state and the previous one's
  ZayaRouterDecodeScratch router;
  float* bias;               // [L, S]: the balancers' biases, copied in each step
  float* rstd;               // [B]
  Arena arena;

  DecodeBuffers(const Compute& cx, int64_t max_len, int64_t batch, bool own_caches)
      : max_len(max_len), batch(batch) {
    const ModelConfig& c = cx.config;
    const int64_t B = batch, L = c.n_layers;
    const int64_t Cc = c.q_dim() + c.kv_dim(), R = c.router_latent_dim, S = c.router_classes();
    cca_floats = ops::decode_state_floats(cca_dims(c));
    arena.build([&](Arena& a) {
      if (own_caches) {
        caches.take(a, c, max_len, B);
        cca = a.take<float>(L * B * cca_floats);
      }
      for (float** p : {&x, &y, &emb, &attn.n}) *p = a.take<float>(B * c.d_model);
      for (float** p : {&attn.rstd, &router.rstd, &rstd}) *p = a.take<float>(B);
      for (float** p : {&attn.c, &attn.qk}) *p = a.take<float>(B * Cc);
      attn.rnorm = a.take<float>(B * (c.n_heads + c.n_kv_heads));
      for (float** p : {&attn.q, &attn.att}) *p = a.take<float>(B * c.q_dim());
      for (float** p : {&attn.k, &attn.v}) *p = a.take<float>(B * c.kv_dim());
      attn.scores = a.take<float>(B * c.n_heads * max_len);
      moe.take(a, c, {B, 1}, /*expert_parallel=*/false);
      for (float** p : {&r, &r_prev, &router.u, &router.a1, &router.g1, &router.a2, &router.g2})
        *p = a.take<float>(B * R);
      for (float** p : {&router.logits, &router.probs}) *p = a.take<float>(B * S);
      bias = a.take<float>(L * S);
    }, cx.arena_source());
    if (own_caches) caches.clear(cx.ops);  // the CCA states start as the arena does: zero
  }
};

class Zaya1 final : public Composition<Activations> {
 public:
  explicit Zaya1(const ArchitectureParts& parts)
      : Composition(parts.cx, parts.experts), balancers_(parts.balancers),
        class_counts_(parts.class_counts), boundary_counts_(parts.boundary_counts),
        head_(LmHeadWeights::of(parts.table)) {
    const ParamTable& t = parts.table;
    in_alpha_ = t.get("model.input_hidden_states_scale").offset;
    in_beta_ = t.get("model.input_hidden_states_bias").offset;
    for (int64_t l = 0; l < cx_.config.n_layers; ++l)
      layers_.push_back(layer_weights(t, cx_.config, l));
  }

  ForwardResult forward(const int32_t* inputs, const int32_t* targets, BatchShape s) override;
  void backward() override;
  std::unique_ptr<DecodeScratch> new_decode(int64_t max_len, int64_t batch,
                                            bool own_caches) const override;
  void decode_rows(DecodeScratch& scratch, const DecodeRows& rows, const int32_t* tokens,
                   float* logits) override;

  const DecodeCaches& own_caches(const DecodeScratch& scratch) const override {
    return static_cast<const DecodeBuffers&>(scratch).caches;
  }

 private:
  // Sublayer i's input (i = 2l: layer l's CCA, 2l + 1: its MoE, 2L: the output) and output.
  float* res(int64_t i) const { return acts_->res + i * rows_c(); }
  float* h(int64_t i) const { return acts_->h + i * rows_c(); }
  int64_t rows_c() const { return acts_->shape.rows() * cx_.config.d_model; }
  // The router state of MoE sublayer l's predecessor (null for the first).
  const float* r_prev(int64_t l) const { return l > 0 ? acts_->router[l - 1].r : nullptr; }
  void moe_layer_forward(int64_t l);
  void moe_layer_backward(int64_t l, float*& dres);
  void embedding_backward(const float* dres);

  std::vector<ops::ZayaBalancer>& balancers_;
  std::vector<int64_t>& class_counts_;
  std::vector<int64_t>& boundary_counts_;
  std::vector<LayerWeights> layers_;
  LmHeadWeights head_;
  int64_t in_alpha_, in_beta_;
};

ForwardResult Zaya1::forward(const int32_t* inputs, const int32_t* targets, BatchShape s) {
  const ModelConfig& c = cx_.config;
  Activations& a = begin_forward(inputs, targets, s);
  const int64_t N = s.rows(), L = c.n_layers;
  {
    auto t = cx_.time("embedding");
    cx_.ops.embedding_forward(a.emb, a.inputs, cx_.p(head_.embed), N, c.d_model);
    cx_.ops.scale_shift_forward(res(0), a.emb, cx_.p(in_alpha_), cx_.p(in_beta_), N, c.d_model);
  }
  for (int64_t l = 0; l < L; ++l) {
    const LayerWeights& w = layers_[l];
    cca_forward(cx_, w.cca, a.cca[l], a.cca_grads, s, res(2 * l), h(2 * l));
    {
      auto t = cx_.time("residual_scale");
      residual_scale_forward(cx_, w.cca_merge, res(2 * l + 1), res(2 * l), h(2 * l), N);
    }
    moe_layer_forward(l);
    cx_.progress("forward");
  }
  // The balancers' inputs: one copy for every layer.
  const int64_t bytes = L * cx_.config.router_classes() * static_cast<int64_t>(sizeof(int64_t));
  cx_.ops.to_host(class_counts_.data(), a.counts, bytes);
  if (!boundary_counts_.empty()) cx_.ops.to_host(boundary_counts_.data(), a.near, bytes);
  ForwardResult result;
  result.ce_loss = lm_head_forward(cx_, head_, a.head, res(2 * L), a.targets_if_any(), N);
  result.loss = result.ce_loss;
  return result;
}

void Zaya1::moe_layer_forward(int64_t l) {
  Activations& a = *acts_;
  const LayerWeights& w = layers_[l];
  const int64_t i = 2 * l + 1, S = cx_.config.router_classes();
  ZayaRouterActs& r = a.router[l];
  cx_.ops.from_host(r.bias, balancers_[l].bias.data(), S * sizeof(float));
  moe_forward(cx_, experts_, l, w.moe, a.moe[l], a.shape, res(i), nullptr, h(i), [&](MoeActs& m) {
    zaya_router_forward(cx_, w.router, r, a.router_scratch, r_prev(l), r.bias,
                        balancers_[l], m, a.shape, a.counts + l * S,
                        boundary_counts_.empty() ? nullptr : a.near + l * S);
  });
  auto t = cx_.time("residual_scale");
  residual_scale_forward(cx_, w.moe_merge, res(i + 1), res(i), h(i), a.shape.rows());
}

void Zaya1::backward() {
  Activations& a = for_backward();
  const int64_t L = cx_.config.n_layers, N = a.shape.rows();
  // dres: d loss/d the residual stream at the current point, walked backward.
  float* dres = a.dres;
  lm_head_backward(cx_, head_, a.head, res(2 * L), dres, a.attn_grads.dn, N);
  cx_.gradients_final(head_.norm);
  a.router_scratch.begin_backward(cx_.ops, cx_.config, a.shape);
  for (int64_t l = L - 1; l >= 0; --l) {
    const LayerWeights& w = layers_[l];
    moe_layer_backward(l, dres);
    cx_.gradients_final(w.moe.norm);
    // The output projection's backward reads dh in the GEMM precision: written so here.
    float* dres_in = dres == a.dres ? a.dres2 : a.dres;
    const InputGradient to = residual_scale_backward(cx_, w.cca_merge, dres_in, a.dh,
                                                     cx_.precision, dres, res(2 * l), h(2 * l), N);
    cca_backward(cx_, w.cca, a.cca[l], a.attn_grads, a.cca_grads, a.shape, res(2 * l), a.dh, to);
    dres = dres_in;
    cx_.gradients_final(w.cca.norm);
    cx_.progress("backward");
  }
  embedding_backward(dres);
  cx_.gradients_final(0);
}

// dres: on entry d loss/d the MoE merge's output; on return d loss/d the MoE's input (the
// pointer moves to the other of the two residual-gradient buffers).
void Zaya1::moe_layer_backward(int64_t l, float*& dres) {
  Activations& a = *acts_;
  const LayerWeights& w = layers_[l];
  const int64_t i = 2 * l + 1;
  float* dres_in = dres == a.dres ? a.dres2 : a.dres;
  const InputGradient to = residual_scale_backward(cx_, w.moe_merge, dres_in, a.dh, DType::f32,
                                                   dres, res(i), h(i), a.shape.rows());
  dres = dres_in;
  moe_backward(cx_, experts_, l, w.moe, a.moe[l], a.moe_grads, a.shape, res(i), a.dh, to,
               [&](const float* dgate, float* dn) {
                 zaya_router_backward(cx_, w.router, a.router[l], a.router_scratch, r_prev(l),
                                      a.moe[l], a.shape, dgate, dn);
               });
}

void Zaya1::embedding_backward(const float* dres) {
  Activations& a = *acts_;
  const ModelConfig& c = cx_.config;
  const int64_t N = a.shape.rows();
  auto t = cx_.time("embedding");
  float* demb = a.attn_grads.dn;
  cx_.ops.scale_shift_backward(demb, cx_.g(in_alpha_), cx_.g(in_beta_), dres, a.emb,
                               cx_.p(in_alpha_), cx_.p(in_beta_), N, c.d_model);
  cx_.ops.embedding_backward(cx_.g(head_.embed), demb, a.inputs, N, c.d_model, c.padded_vocab());
}

std::unique_ptr<DecodeScratch> Zaya1::new_decode(int64_t max_len, int64_t batch,
                                                 bool own_caches) const {
  return std::make_unique<DecodeBuffers>(cx_, max_len, batch, own_caches);
}

// Rows with CCA states of their own (rows.cca) use them; otherwise row r's state is the
// step's own slot r.
void Zaya1::decode_rows(DecodeScratch& scratch, const DecodeRows& rows, const int32_t* tokens,
                        float* logits) {
  DecodeBuffers& d = static_cast<DecodeBuffers&>(scratch);
  const ModelConfig& c = cx_.config;
  const int64_t B = rows.n, C = c.d_model;
  FOUNDRY_CHECK(B >= 1 && B <= d.batch);
  const int64_t L = c.n_layers, S = c.router_classes();
  std::vector<float> biases(L * S);  // one copy in for every layer
  for (int64_t l = 0; l < L; ++l)
    std::copy_n(balancers_[l].bias.data(), S, biases.begin() + l * S);
  cx_.ops.from_host(d.bias, biases.data(), L * S * static_cast<int64_t>(sizeof(float)));
  float* x = d.x;
  cx_.ops.embedding_forward(d.emb, tokens, cx_.p(head_.embed), B, C);
  cx_.ops.scale_shift_forward(x, d.emb, cx_.p(in_alpha_), cx_.p(in_beta_), B, C);
  std::vector<float*> own(B);
  for (int64_t l = 0; l < L; ++l) {
    const LayerWeights& w = layers_[l];
    if (rows.cca.empty())
      for (int64_t r = 0; r < B; ++r) own[r] = d.cca + (l * d.batch + r) * d.cca_floats;
    const std::vector<float*>& states = rows.cca.empty() ? own : rows.cca[l];
    cca_decode(cx_, w.cca, states.data(), x, rows, l, d.attn, d.max_len, d.y);
    residual_scale_forward(cx_, w.cca_merge, x, x, d.y, B);
    moe_decode(cx_, experts_, w.moe, d.moe, B, x, nullptr, d.y, [&](MoeActs& m) {
      zaya_router_decode(cx_, w.router, m.n, B, d.r, d.r_prev, d.bias + l * S, d.router,
                         m.choice, m.gate);
    });
    residual_scale_forward(cx_, w.moe_merge, x, x, d.y, B);
    std::swap(d.r, d.r_prev);
  }
  lm_head_decode(cx_, head_, x, B, d.attn.n, d.rstd, logits);
}

}  // namespace

int64_t zaya1_arena_bytes(const ModelConfig& c, BatchShape s, bool expert_parallel) {
  return Zaya1::arena_bytes(c, s, expert_parallel);
}

std::unique_ptr<Architecture> make_zaya1(const ArchitectureParts& parts) {
  return std::make_unique<Zaya1>(parts);
}

}  // namespace foundry
