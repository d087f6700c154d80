// The standard decoder-only MoE transformer (arch "moe") as a composition of the sublayers:
//   x = embed(tokens)
//   per layer:  x = attention(x)   (x + attn(rms(x)), model/attention_sublayer.h)
//               x = moe(x)         (x + Σ_k gate_k · expert_k(rms(x)), the standard router)
//   loss = lm_head(x) + aux_loss_coef · mean over layers of the router's aux loss
#include <cstring>

#include <fmt/format.h>

#include "base/error.h"
#include "kernels/ops.h"
#include "model/architecture.h"
#include "model/attention_sublayer.h"
#include "model/lm_head.h"
#include "model/moe_sublayer.h"
#include "model/routers.h"

namespace foundry {
namespace {

struct LayerWeights {
  AttentionWeights attn;
  MoeWeights moe;
  int64_t router = -1;  // Wr [E, C]; none with one expert
};

LayerWeights layer_weights(const ParamTable& t, const ModelConfig& c, int64_t l) {
  const std::string p = fmt::format("model.layers.{}.", l);
  LayerWeights w{AttentionWeights::of_layer(t, l),
                 {t.get(p + "post_attention_layernorm.weight").offset, {}}};
  ExpertWeights& e = w.moe.experts;
  if (c.n_experts == 1) {
    e.w13.push_back(t.get(p + "mlp.gate_proj.weight").offset);
    e.w2.push_back(t.get(p + "mlp.down_proj.weight").offset);
    return w;
  }
  w.router = t.get(p + "block_sparse_moe.gate.weight").offset;
  for (int64_t j = 0; j < c.n_experts; ++j) {
    const std::string ep = fmt::format("{}block_sparse_moe.experts.{}.", p, j);
    e.w13.push_back(t.get(ep + "w1.weight").offset);
    e.w2.push_back(t.get(ep + "w2.weight").offset);
  }
  return w;
}

// Everything one batch shape needs, in one allocation.
struct Activations : CommonActivations {
  float* x;         // [L + 1, N, C] the residual stream entering each layer, then after the last
  float* x_mid;     // [L, N, C]     after each attention sublayer
  double* aux;      // [L]           each layer's aux loss
  std::vector<double> aux_host;
  std::vector<AttentionActs> attn;
  std::vector<StandardRouterActs> router;
  // backward scratch, shared by the layers
  float* dx;  // [N, C] d loss/d the residual stream, walked backward
  AttentionGrads attn_grads;
  MoeGrads moe_grads;
  StandardRouterScratch router_scratch;

  Activations(const ModelConfig& c, BatchShape s, bool expert_parallel,
              const BlockSource* source, bool measure_only = false) {
    shape = s;
    const int64_t L = c.n_layers, NC = s.rows() * c.d_model;
    attn.resize(L);
    moe.resize(L);
    router.resize(L);
    aux_host.resize(L);
    const auto layout = [&](Arena& a) {
      inputs = a.take<int32_t>(s.rows());
      targets = a.take<int32_t>(s.rows());
      x = a.take<float>((L + 1) * NC);
      x_mid = a.take<float>(L * NC);
      aux = a.take<double>(L);
      for (int64_t l = 0; l < L; ++l) {
        attn[l].take(a, c, s);
        moe[l].take(a, c, s, expert_parallel);
        router[l].take(a, c, s);
      }
      head.take(a, c, s);
      dx = a.take<float>(NC);
      attn_grads.take(a, c, s);
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
  float *x, *out;            // [B, C]
  AttentionDecodeScratch attn;
  MoeActs moe;               // shape {B, 1}, shared by the layers
  float *router_logits, *router_probs;  // [B, E]
  float* rstd;               // [B]
  Arena arena;

  DecodeBuffers(const Compute& cx, int64_t max_len, int64_t batch, bool own_caches)
      : max_len(max_len), batch(batch) {
    const ModelConfig& c = cx.config;
    const int64_t B = batch;
    arena.build([&](Arena& a) {
      if (own_caches) caches.take(a, c, max_len, B);
      for (float** p : {&x, &out, &attn.n}) *p = a.take<float>(B * c.d_model);
      for (float** p : {&attn.rstd, &rstd}) *p = a.take<float>(B);
      for (float** p : {&attn.q, &attn.att}) *p = a.take<float>(B * c.q_dim());
      for (float** p : {&attn.k, &attn.v}) *p = a.take<float>(B * c.kv_dim());
      attn.scores = a.take<float>(B * c.n_heads * max_len);
      if (c.qk_norm != QkNorm::none) attn.qk_rstd = a.take<float>(B * c.n_heads);
      moe.take(a, c, {B, 1}, /*expert_parallel=*/false);
      for (float** p : {&router_logits, &router_probs}) *p = a.take<float>(B * c.n_experts);
    }, cx.arena_source());
    if (own_caches) caches.clear(cx.ops);
  }
};

class StandardMoe final : public Composition<Activations> {
 public:
  explicit StandardMoe(const ArchitectureParts& parts)
      : Composition(parts.cx, parts.experts), head_(LmHeadWeights::of(parts.table)) {
    for (int64_t l = 0; l < cx_.config.n_layers; ++l)
      layers_.push_back(layer_weights(parts.table, cx_.config, l));
  }

  ForwardResult forward(const int32_t* inputs, const int32_t* targets, BatchShape s) override;
  void backward() override;
  void set_data_parallel(const Communicator* group) override { dp_group_ = group; }
  std::unique_ptr<DecodeScratch> new_decode(int64_t max_len, int64_t batch,
                                            bool own_caches) const override;
  void decode_rows(DecodeScratch& scratch, const DecodeRows& rows, const int32_t* tokens,
                   float* logits) override;

  const DecodeCaches& own_caches(const DecodeScratch& scratch) const override {
    return static_cast<const DecodeBuffers&>(scratch).caches;
  }

 private:
  float* x(int64_t l) const { return acts_->x + l * acts_->shape.rows() * cx_.config.d_model; }
  float* x_mid(int64_t l) const {
    return acts_->x_mid + l * acts_->shape.rows() * cx_.config.d_model;
  }

  std::vector<LayerWeights> layers_;
  LmHeadWeights head_;
  const Communicator* dp_group_ = nullptr;
};

ForwardResult StandardMoe::forward(const int32_t* inputs, const int32_t* targets, BatchShape s) {
  const ModelConfig& c = cx_.config;
  Activations& a = begin_forward(inputs, targets, s);
  const int64_t N = s.rows(), L = c.n_layers;
  {
    auto t = cx_.time("embedding");
    cx_.ops.embedding_forward(x(0), a.inputs, cx_.p(head_.embed), N, c.d_model);
  }
  for (int64_t l = 0; l < L; ++l) {
    const LayerWeights& w = layers_[l];
    attention_forward(cx_, w.attn, a.attn[l], s, x(l), x_mid(l));
    moe_forward(cx_, experts_, l, w.moe, a.moe[l], s, x_mid(l), x_mid(l), x(l + 1),
                [&](MoeActs& m) {
                  standard_router_forward(cx_, w.router, a.router[l], a.router_scratch, m, s,
                                          dp_group_, a.aux + l);
                });
    cx_.progress("forward");
  }
  ForwardResult r;
  r.ce_loss = lm_head_forward(cx_, head_, a.head, x(L), a.targets_if_any(), N);
  if (c.n_experts > 1) {
    cx_.ops.to_host(a.aux_host.data(), a.aux, L * sizeof(double));
    double aux_sum = 0;
    for (int64_t l = 0; l < L; ++l) aux_sum += a.aux_host[l];
    r.aux_loss = aux_sum / L;
  }
  if (targets) r.loss = r.ce_loss + c.aux_loss_coef * r.aux_loss;
  return r;
}

void StandardMoe::backward() {
  Activations& a = for_backward();
  const ModelConfig& c = cx_.config;
  const BatchShape s = a.shape;
  const int64_t N = s.rows(), L = c.n_layers;
  const float aux_coef = static_cast<float>(c.aux_loss_coef * cx_.loss_weight / L);
  lm_head_backward(cx_, head_, a.head, x(L), a.dx, a.attn_grads.dn, N);
  cx_.gradients_final(head_.norm);
  for (int64_t l = L - 1; l >= 0; --l) {
    const LayerWeights& w = layers_[l];
    moe_backward(cx_, experts_, l, w.moe, a.moe[l], a.moe_grads, s, x_mid(l), a.dx, a.dx,
                 [&](const float* dgate, float* dn) {
                   standard_router_backward(cx_, w.router, a.router[l], a.router_scratch,
                                            a.moe[l], s, dgate, aux_coef, dn);
                 });
    cx_.gradients_final(w.moe.norm);
    attention_backward(cx_, w.attn, a.attn[l], a.attn_grads, s, x(l), a.dx);
    cx_.progress("backward");
    cx_.gradients_final(w.attn.norm);
  }
  {
    auto t = cx_.time("embedding");
    cx_.ops.embedding_backward(cx_.g(head_.embed), a.dx, a.inputs, N, c.d_model, c.padded_vocab());
  }
  cx_.gradients_final(0);
}

std::unique_ptr<DecodeScratch> StandardMoe::new_decode(int64_t max_len, int64_t batch,
                                                       bool own_caches) const {
  return std::make_unique<DecodeBuffers>(cx_, max_len, batch, own_caches);
}

void StandardMoe::decode_rows(DecodeScratch& scratch, const DecodeRows& rows,
                              const int32_t* tokens, float* logits) {
  DecodeBuffers& d = static_cast<DecodeBuffers&>(scratch);
  const ModelConfig& c = cx_.config;
  const int64_t B = rows.n, BC = B * c.d_model;
  FOUNDRY_CHECK(B >= 1 && B <= d.batch);
  float* x = d.x;
  cx_.ops.embedding_forward(x, tokens, cx_.p(head_.embed), B, c.d_model);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& w = layers_[l];
    attention_decode(cx_, w.attn, x, rows, l, d.attn, d.max_len, d.out);
    cx_.ops.add(x, d.out, BC);
    moe_decode(cx_, experts_, w.moe, d.moe, B, x, x, x, [&](MoeActs& m) {
      standard_router_decode(cx_, w.router, m.n, B, d.router_logits, d.router_probs, m.choice,
                             m.gate);
    });
  }
  lm_head_decode(cx_, head_, x, B, d.attn.n, d.rstd, logits);
}

}  // namespace

int64_t standard_moe_arena_bytes(const ModelConfig& c, BatchShape s, bool expert_parallel) {
  return StandardMoe::arena_bytes(c, s, expert_parallel);
}

std::unique_ptr<Architecture> make_standard_moe(const ArchitectureParts& parts) {
  return std::make_unique<StandardMoe>(parts);
}

}  // namespace foundry
