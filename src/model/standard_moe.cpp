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
  LayerWeights w{AttentionWeights::of_layer(t, l), {t.get(p + "post_attention_layernorm.weight").offset, {}}};
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
  std::vector<AttentionActs> attn;
  std::vector<StandardRouterActs> router;
  // backward scratch, shared by the layers
  float* dx;  // [N, C] d loss/d the residual stream, walked backward
  AttentionGrads attn_grads;
  MoeGrads moe_grads;
  StandardRouterScratch router_scratch;

  Activations(const ModelConfig& c, BatchShape s, bool expert_parallel) {
    shape = s;
    const int64_t L = c.n_layers, NC = s.rows() * c.d_model;
    attn.resize(L);
    moe.resize(L);
    router.resize(L);
    arena.build([&](Arena& a) {
      inputs = a.take<int32_t>(s.rows());
      x = a.take<float>((L + 1) * NC);
      x_mid = a.take<float>(L * NC);
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
    });
  }
};

struct DecodeBuffers : DecodeScratch {
  int64_t max_len = 0;
  std::vector<float> k_cache, v_cache;  // [L, max_len, KVH·D]
  std::vector<float> x, n, q, att, h, act, out, scores, router_logits, router_probs;
  std::vector<int32_t> choice;
  std::vector<float> gate;
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
  std::unique_ptr<DecodeScratch> new_decode(int64_t max_len) const override;
  void decode_step(DecodeScratch& scratch, int64_t pos, int32_t token, float* logits) override;

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
    ops::embedding_forward(x(0), inputs, cx_.p(head_.embed), N, c.d_model);
  }
  double aux_sum = 0;
  for (int64_t l = 0; l < L; ++l) {
    const LayerWeights& w = layers_[l];
    attention_forward(cx_, w.attn, a.attn[l], s, x(l), x_mid(l));
    moe_forward(cx_, experts_, l, w.moe, a.moe[l], s, x_mid(l), x_mid(l), x(l + 1),
                [&](MoeActs& m) {
                  aux_sum += standard_router_forward(cx_, w.router, a.router[l],
                                                     a.router_scratch, m, s, dp_group_);
                });
    cx_.progress("forward");
  }
  ForwardResult r;
  r.ce_loss = lm_head_forward(cx_, head_, a.head, x(L), targets, N);
  if (c.n_experts > 1) r.aux_loss = aux_sum / L;
  if (targets) r.loss = r.ce_loss + c.aux_loss_coef * r.aux_loss;
  return r;
}

void StandardMoe::backward() {
  Activations& a = for_backward();
  const ModelConfig& c = cx_.config;
  const BatchShape s = a.shape;
  const int64_t N = s.rows(), L = c.n_layers;
  const float aux_coef = static_cast<float>(c.aux_loss_coef / L);
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
    ops::embedding_backward(cx_.g(head_.embed), a.dx, a.inputs, N, c.d_model, c.padded_vocab());
  }
  cx_.gradients_final(0);
}

std::unique_ptr<DecodeScratch> StandardMoe::new_decode(int64_t max_len) const {
  const ModelConfig& c = cx_.config;
  auto d = std::make_unique<DecodeBuffers>();
  d->k_cache.resize(c.n_layers * max_len * c.kv_dim());
  d->v_cache.resize(c.n_layers * max_len * c.kv_dim());
  for (auto* v : {&d->x, &d->n, &d->out}) v->resize(c.d_model);
  d->q.resize(c.q_dim());
  d->att.resize(c.q_dim());
  d->h.resize(2 * c.ffn_dim);
  d->act.resize(c.ffn_dim);
  d->scores.resize(max_len);
  d->router_logits.resize(c.n_experts);
  d->router_probs.resize(c.n_experts);
  d->choice.resize(c.top_k);
  d->gate.resize(c.top_k);
  d->max_len = max_len;
  return d;
}

void StandardMoe::decode_step(DecodeScratch& scratch, int64_t pos, int32_t token, float* logits) {
  DecodeBuffers& d = static_cast<DecodeBuffers&>(scratch);
  const ModelConfig& c = cx_.config;
  const int64_t C = c.d_model, KVD = c.kv_dim();
  float* x = d.x.data();
  ops::embedding_forward(x, &token, cx_.p(head_.embed), 1, C);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& w = layers_[l];
    float* k_cache = d.k_cache.data() + l * d.max_len * KVD;
    float* v_cache = d.v_cache.data() + l * d.max_len * KVD;
    attention_decode(cx_, w.attn, x, pos, k_cache + pos * KVD, v_cache + pos * KVD, k_cache,
                     v_cache, {d.n.data(), d.q.data(), d.att.data(), d.scores.data()},
                     d.out.data());
    for (int64_t i = 0; i < C; ++i) x[i] += d.out[i];
    float rstd;
    ops::rmsnorm_forward(d.n.data(), &rstd, x, cx_.p(w.moe.norm), 1, C,
                         static_cast<float>(c.rms_norm_eps));
    standard_router_decode(cx_, w.router, d.n.data(), d.router_logits.data(),
                           d.router_probs.data(), d.choice.data(), d.gate.data());
    experts_.decode(x, d.n.data(), d.choice.data(), d.gate.data(), c.top_k, w.moe.experts,
                    d.h.data(), d.act.data(), d.out.data());
  }
  lm_head_decode(cx_, head_, x, d.n.data(), logits);
}

}  // namespace

std::unique_ptr<Architecture> make_standard_moe(const ArchitectureParts& parts) {
  return std::make_unique<StandardMoe>(parts);
}

}  // namespace foundry
