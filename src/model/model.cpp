#include "model/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "base/error.h"
#include "base/hash.h"
#include "base/rng.h"
#include "kernels/attention.h"
#include "kernels/ops.h"
#include "model/expert_parallel.h"

namespace foundry {
namespace {

// Slab offsets of one layer's tensors, looked up once.
struct LayerOffsets {
  int64_t ln1, q, k, v, o, ln2, router = -1;
  std::vector<int64_t> w13;  // per expert: [2F, C] (gate rows then up rows)
  std::vector<int64_t> w2;   // per expert: [C, F]
};

// True unless [begin, end) lies entirely inside one of `holes` (sorted, disjoint).
bool stored(int64_t begin, int64_t end, const std::vector<std::pair<int64_t, int64_t>>& holes) {
  for (const auto& [b, e] : holes)
    if (b <= begin && end <= e) return false;
  return true;
}

}  // namespace

// Buffers for one (batch, seq) shape. Names follow the forward pass; [N = B·T].
struct Activations {
  int64_t batch = 0, seq = 0;
  std::vector<LayerOffsets> layers;
  int64_t embed = 0, final_norm = 0;

  std::vector<int32_t> inputs, targets;
  // per layer
  std::vector<std::vector<float>> x_in;           // [N, C] residual stream entering the layer
  std::vector<std::vector<float>> n1, n1_rstd;    // [N, C], [N]
  std::vector<std::vector<float>> q, k, v;        // [N, H·D], [N, KVH·D] ×2 (after RoPE)
  std::vector<std::vector<float>> probs;          // [B, H, T, T]
  std::vector<std::vector<float>> att;            // [N, H·D]
  std::vector<std::vector<float>> x_mid;          // [N, C] after the attention residual
  std::vector<std::vector<float>> n2, n2_rstd;    // [N, C], [N]
  std::vector<std::vector<float>> router_probs;   // [N, E]
  std::vector<std::vector<int32_t>> topk_idx;     // [N, K]
  std::vector<std::vector<float>> topk_w;         // [N, K]
  std::vector<std::vector<int64_t>> expert_offsets;       // [E+1]
  std::vector<std::vector<int32_t>> slot_token, assignment_slot;  // [N·K]
  std::vector<std::vector<float>> xs;             // [N·K, C] tokens sorted by expert
  std::vector<std::vector<float>> h;              // [N·K, 2F] gate | up
  std::vector<std::vector<float>> act;            // [N·K, F] swiglu
  std::vector<std::vector<float>> ys;             // [N·K, C] expert outputs
  std::vector<std::vector<double>> fractions;     // [E] global expert shares (data parallel)
  std::vector<float> x_out, nf, nf_rstd;          // [N, C], [N, C], [N]
  std::vector<float> logits;                      // [N, Vp]; becomes dlogits in backward
  std::vector<float> losses;                      // [N]
  bool has_targets = false;
  // backward scratch
  std::vector<float> dx, dn, dq, dk, dv, datt, dxs, dh, dact, dys, dtopk_w, drouter;
};

// Expert parallelism: the group, its sharding and, per MoE sublayer, the exchange planned in
// the forward pass and the rows of the owned experts that the backward pass needs. The
// layers' row counts change every step with the routing; the buffers only grow.
struct ExpertParallelState {
  ExpertParallelState(const Communicator* g, int64_t n_experts, int64_t n_layers)
      : group(g), sharding(n_experts, g->size(), g->rank()), layers(n_layers) {}

  const Communicator* group;
  ExpertSharding sharding;
  struct Layer {
    ExpertExchange exchange;
    std::vector<float> xs, h, act;  // local layout: [L, C], [L, 2F], [L, F]
  };
  std::vector<Layer> layers;
  // Scratch shared by the layers: the exchanges' wire buffer and the owned experts' outputs
  // and gradients (wire, ys, dys, dxs: [L, C]; dh: [L, 2F]; dact: [L, F]).
  std::vector<float> wire, ys, dys, dxs, dh, dact;

  // The slab offsets of the owned experts' weights, from those of all experts.
  std::vector<int64_t> local(const std::vector<int64_t>& all) const {
    const int64_t first = sharding.first_expert(group->rank());
    return {all.begin() + first, all.begin() + first + sharding.experts_per_rank()};
  }
};

Model::Model(const ModelConfig& config, DType precision)
    : config_(config), table_(config), precision_(precision) {
  params_ = PageSlab<float>(static_cast<size_t>(table_.total_elements()));
  grads_ = PageSlab<float>(static_cast<size_t>(table_.total_elements()));
  if (precision_ == DType::bf16)
    params_bf16_ = PageSlab<bf16>(static_cast<size_t>(table_.total_elements()));
  reset_balancers();
}

Model::~Model() = default;

void Model::init_weights(uint64_t seed) {
  for_each_outside(released_params_, [&](int64_t b, int64_t e) {
    std::fill(params_.data() + b, params_.data() + e, 0.0f);
  });
  for (const auto& p : table_.params()) {
    if (!stored(p.offset, p.offset + p.numel, released_params_)) continue;
    float* w = params_.data() + p.offset;
    if (p.init == ParamInit::constant) {
      std::fill(w, w + p.numel, static_cast<float>(p.init_value));
      continue;
    }
    // One stream per tensor, keyed by its name, so adding a tensor never shifts the others.
    uint64_t key = seed ^ hash64(p.name.data(), p.name.size());
    Rng rng(Rng::splitmix64(key));
    int64_t rows_real = p.numel;
    if (p.kind == ParamKind::embedding) rows_real = config_.vocab_size * config_.d_model;
    for (int64_t i = 0; i < rows_real; ++i) w[i] = static_cast<float>(rng.normal() * p.init_value);
  }
  release_again();  // a tensor only partly kept was written whole
  reset_balancers();
  sync_weights();
}

void Model::sync_weights() {
  if (precision_ != DType::bf16) return;
  for_each_outside(unowned_experts_, [&](int64_t b, int64_t e) {
    convert_to_bf16(params_.data() + b, params_bf16_.data() + b, e - b);
  });
}

void Model::zero_grads() {
  for_each_outside(unowned_experts_, [&](int64_t b, int64_t e) {
    std::memset(grads_.data() + b, 0, static_cast<size_t>(e - b) * sizeof(float));
  });
}

void Model::shard_expert_storage(const std::vector<std::pair<int64_t, int64_t>>& released) {
  if (!ep_)
    fail("shard_expert_storage needs expert parallelism (set_expert_parallel first)");
  const auto unowned = unowned_expert_ranges(table_, ep_->sharding, ep_->group->rank());
  int64_t last = 0;
  for (const auto& [b, e] : released) {
    bool inside = false;
    for (const auto& [ub, ue] : unowned) inside = inside || (ub <= b && e <= ue);
    if (b < last || e < b || !inside)
      fail(fmt::format("shard_expert_storage on EP rank {}: [{}, {}) is not a sorted, disjoint "
                       "range inside another rank's experts",
                       ep_->group->rank(), b, e));
    last = e;
  }
  unowned_experts_ = unowned;
  released_params_ = released;
  release_again();
  for (const auto& [b, e] : unowned_experts_) {
    grads_.release(static_cast<size_t>(b), static_cast<size_t>(e));
    params_bf16_.release(static_cast<size_t>(b), static_cast<size_t>(e));
  }
}

void Model::release_again() {
  for (const auto& [b, e] : released_params_)
    params_.release(static_cast<size_t>(b), static_cast<size_t>(e));
}

const void* Model::gemm_weight(int64_t offset) const {
  if (precision_ == DType::bf16) return params_bf16_.data() + offset;
  return params_.data() + offset;
}

const void* Model::gemm_weight(const std::string& name) const {
  return gemm_weight(table_.get(name).offset);
}

const void* Model::as_gemm_input(const float* x, int64_t n, int which) {
  if (precision_ == DType::f32) return x;
  auto& buf = convert_scratch_[which];
  if (static_cast<int64_t>(buf.size()) < n) buf.resize(n);
  convert_to_bf16(x, buf.data(), n);
  return buf.data();
}

// y [n, out] = x [n, in] · W^T, W [out, in] at weight_offset.
void Model::linear_forward(float* y, const float* x, int64_t weight_offset, int64_t n,
                           int64_t out, int64_t in, int slot) {
  const void* xin = as_gemm_input(x, n * in, slot);
  gemm(xin, false, gemm_weight(weight_offset), true, y, n, out, in, precision_);
}

// dx [n, in] (+)= dy · W; dW [out, in] += dy^T · x.
void Model::linear_backward(float* dx, float* dweight, const float* dy, const float* x,
                            int64_t weight_offset, int64_t n, int64_t out, int64_t in,
                            bool accumulate_dx) {
  const void* dyin = as_gemm_input(dy, n * out, 0);
  if (dx) gemm(dyin, false, gemm_weight(weight_offset), false, dx, n, in, out, precision_,
               accumulate_dx);
  const void* xin = as_gemm_input(x, n * in, 1);
  gemm(dyin, true, xin, false, dweight, out, in, n, precision_, /*accumulate=*/true);
}

// Experts e < n_experts, each on its contiguous rows [offsets[e], offsets[e+1]) of the
// sorted token matrix: h = xs·W13ᵀ [rows, 2F] (gate | up), act = swiglu(h), ys = act·W2ᵀ.
// Rows from offsets[n_experts] on (the ZAYA1 skip class) are not touched.
void Model::experts_forward(const int64_t* offsets, int64_t n_experts, const float* xs, float* h,
                            float* act, float* ys, const std::vector<int64_t>& w13,
                            const std::vector<int64_t>& w2) {
  const int64_t C = config_.d_model, F = config_.ffn_dim, rows_all = offsets[n_experts];
  const size_t elem = precision_ == DType::bf16 ? 2 : 4;
  {
    ScopedOpTimer t(&op_times_, "expert_up_gemm");
    const char* xs_g = static_cast<const char*>(as_gemm_input(xs, rows_all * C, 0));
    for (int64_t e = 0; e < n_experts; ++e) {
      const int64_t rows = offsets[e + 1] - offsets[e];
      if (rows == 0) continue;
      gemm(xs_g + offsets[e] * C * elem, false, gemm_weight(w13[e]), true, h + offsets[e] * 2 * F,
           rows, 2 * F, C, precision_);
    }
  }
  {
    ScopedOpTimer t(&op_times_, "swiglu");
    ops::swiglu_forward(act, h, rows_all, F);
  }
  {
    ScopedOpTimer t(&op_times_, "expert_down_gemm");
    const char* act_g = static_cast<const char*>(as_gemm_input(act, rows_all * F, 0));
    for (int64_t e = 0; e < n_experts; ++e) {
      const int64_t rows = offsets[e + 1] - offsets[e];
      if (rows == 0) continue;
      gemm(act_g + offsets[e] * F * elem, false, gemm_weight(w2[e]), true, ys + offsets[e] * C,
           rows, C, F, precision_);
    }
  }
}

// The backward pass of experts_forward from dys: dxs (writes) on the expert rows, and the
// weight gradients (+=). dh and dact are scratch of the shapes of h and act.
void Model::experts_backward(const int64_t* offsets, int64_t n_experts, const float* dys,
                             const float* xs, const float* h, const float* act, float* dxs,
                             float* dh, float* dact, const std::vector<int64_t>& w13,
                             const std::vector<int64_t>& w2) {
  const int64_t C = config_.d_model, F = config_.ffn_dim, rows_all = offsets[n_experts];
  const size_t elem = precision_ == DType::bf16 ? 2 : 4;
  float* G = grads_.data();
  {
    ScopedOpTimer t(&op_times_, "expert_down_gemm");
    const char* dys_g = static_cast<const char*>(as_gemm_input(dys, rows_all * C, 0));
    const char* act_g = static_cast<const char*>(as_gemm_input(act, rows_all * F, 1));
    for (int64_t e = 0; e < n_experts; ++e) {
      const int64_t rows = offsets[e + 1] - offsets[e];
      if (rows == 0) continue;
      const char* dys_e = dys_g + offsets[e] * C * elem;
      gemm(dys_e, false, gemm_weight(w2[e]), false, dact + offsets[e] * F, rows, F, C,
           precision_);
      gemm(dys_e, true, act_g + offsets[e] * F * elem, false, G + w2[e], C, F, rows, precision_,
           true);
    }
  }
  {
    ScopedOpTimer t(&op_times_, "swiglu");
    ops::swiglu_backward(dh, dact, h, rows_all, F);
  }
  {
    ScopedOpTimer t(&op_times_, "expert_up_gemm");
    const char* dh_g = static_cast<const char*>(as_gemm_input(dh, rows_all * 2 * F, 0));
    const char* xs_g = static_cast<const char*>(as_gemm_input(xs, rows_all * C, 1));
    for (int64_t e = 0; e < n_experts; ++e) {
      const int64_t rows = offsets[e + 1] - offsets[e];
      if (rows == 0) continue;
      const char* dh_e = dh_g + offsets[e] * 2 * F * elem;
      gemm(dh_e, false, gemm_weight(w13[e]), false, dxs + offsets[e] * C, rows, C, 2 * F,
           precision_);
      gemm(dh_e, true, xs_g + offsets[e] * C * elem, false, G + w13[e], 2 * F, C, rows,
           precision_, true);
    }
  }
}

// ---- expert parallelism ---------------------------------------------------------------------

void Model::set_expert_parallel(const Communicator* group) {
  if (!unowned_experts_.empty())
    fail("the expert storage is sharded (shard_expert_storage): this rank no longer holds the "
         "other ranks' experts, so expert parallelism cannot change");
  // Validates (the sharding's constructor) before changing anything: on error the model
  // keeps its previous setting.
  std::unique_ptr<ExpertParallelState> state;
  if (group)
    state = std::make_unique<ExpertParallelState>(group, config_.n_experts, config_.n_layers);
  // Activations of a forward pass made under the other setting cannot be differentiated
  // under this one (the owned experts' rows live in different buffers): drop them.
  acts_.reset();
  zacts_.reset();
  ep_ = std::move(state);
}

const ExpertSharding* Model::expert_sharding() const { return ep_ ? &ep_->sharding : nullptr; }

const Communicator* Model::expert_parallel_group() const { return ep_ ? ep_->group : nullptr; }

int Model::expert_owner(const ParamInfo& p) const { return ep_ ? ep_->sharding.owner(p) : -1; }

void Model::moe_experts_forward(int64_t layer, const int64_t* offsets, const float* xs, float* h,
                                float* act, float* ys, const std::vector<int64_t>& w13,
                                const std::vector<int64_t>& w2) {
  if (!ep_) return experts_forward(offsets, config_.n_experts, xs, h, act, ys, w13, w2);
  ExpertParallelState& s = *ep_;
  ExpertParallelState::Layer& b = s.layers[layer];
  const int64_t C = config_.d_model, F = config_.ffn_dim;
  {
    ScopedOpTimer t(&op_times_, "ep_dispatch");
    b.exchange.plan(*s.group, s.sharding, offsets);
    const int64_t L = b.exchange.local_rows();
    b.xs.resize(L * C);
    b.h.resize(L * 2 * F);
    b.act.resize(L * F);
    s.ys.resize(L * C);
    b.exchange.dispatch(xs, b.xs.data(), C, s.wire);
  }
  experts_forward(b.exchange.local_offsets(), b.exchange.local_experts(), b.xs.data(),
                  b.h.data(), b.act.data(), s.ys.data(), s.local(w13), s.local(w2));
  {
    ScopedOpTimer t(&op_times_, "ep_combine");
    b.exchange.combine(s.ys.data(), ys, C, s.wire);
  }
}

void Model::moe_experts_backward(int64_t layer, const int64_t* offsets, const float* dys,
                                 const float* xs, const float* h, const float* act, float* dxs,
                                 float* dh, float* dact, const std::vector<int64_t>& w13,
                                 const std::vector<int64_t>& w2) {
  if (!ep_)
    return experts_backward(offsets, config_.n_experts, dys, xs, h, act, dxs, dh, dact, w13, w2);
  // The forward's plan still describes these rows: the routing is that of the forward.
  ExpertParallelState& s = *ep_;
  ExpertParallelState::Layer& b = s.layers[layer];
  FOUNDRY_CHECK(b.exchange.planned());
  const int64_t C = config_.d_model, F = config_.ffn_dim, L = b.exchange.local_rows();
  {
    ScopedOpTimer t(&op_times_, "ep_dispatch");
    s.dys.resize(L * C);
    s.dxs.resize(L * C);
    s.dh.resize(L * 2 * F);
    s.dact.resize(L * F);
    b.exchange.dispatch(dys, s.dys.data(), C, s.wire);
  }
  experts_backward(b.exchange.local_offsets(), b.exchange.local_experts(), s.dys.data(),
                   b.xs.data(), b.h.data(), b.act.data(), s.dxs.data(), s.dh.data(),
                   s.dact.data(), s.local(w13), s.local(w2));
  {
    ScopedOpTimer t(&op_times_, "ep_combine");
    b.exchange.combine(s.dxs.data(), dxs, C, s.wire);
  }
}

std::vector<int64_t> Model::expert_loads() const {
  const std::vector<std::vector<int64_t>>* offsets =
      config_.is_zaya() ? zaya_expert_offsets() : (acts_ ? &acts_->expert_offsets : nullptr);
  if (!offsets) return {};
  const int64_t E = config_.n_experts;
  std::vector<int64_t> loads(config_.n_layers * E);
  for (int64_t l = 0; l < config_.n_layers; ++l) {
    const int64_t* offs = (*offsets)[l].data();
    for (int64_t e = 0; e < E; ++e) loads[l * E + e] = offs[e + 1] - offs[e];
  }
  return loads;
}

void Model::ensure_activations(int64_t batch, int64_t seq) {
  if (acts_ && acts_->batch == batch && acts_->seq == seq) return;
  if (seq > config_.max_seq_len)
    fail(fmt::format("sequence length {} exceeds model.max_seq_len = {}", seq,
                     config_.max_seq_len));
  const ModelConfig& c = config_;
  auto a = std::make_unique<Activations>();
  a->batch = batch;
  a->seq = seq;
  const int64_t N = batch * seq, C = c.d_model, L = c.n_layers, E = c.n_experts, K = c.top_k;
  const int64_t F = c.ffn_dim, QD = c.q_dim(), KVD = c.kv_dim(), H = c.n_heads;
  a->embed = table_.get("model.embed_tokens.weight").offset;
  a->final_norm = table_.get("model.norm.weight").offset;
  for (int64_t l = 0; l < L; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    LayerOffsets o;
    o.ln1 = table_.get(p + "input_layernorm.weight").offset;
    o.q = table_.get(p + "self_attn.q_proj.weight").offset;
    o.k = table_.get(p + "self_attn.k_proj.weight").offset;
    o.v = table_.get(p + "self_attn.v_proj.weight").offset;
    o.o = table_.get(p + "self_attn.o_proj.weight").offset;
    o.ln2 = table_.get(p + "post_attention_layernorm.weight").offset;
    if (E == 1) {
      o.w13.push_back(table_.get(p + "mlp.gate_proj.weight").offset);
      o.w2.push_back(table_.get(p + "mlp.down_proj.weight").offset);
    } else {
      o.router = table_.get(p + "block_sparse_moe.gate.weight").offset;
      for (int64_t e = 0; e < E; ++e) {
        const std::string ep = fmt::format("{}block_sparse_moe.experts.{}.", p, e);
        o.w13.push_back(table_.get(ep + "w1.weight").offset);
        o.w2.push_back(table_.get(ep + "w2.weight").offset);
      }
    }
    a->layers.push_back(std::move(o));
  }
  auto per_layer = [&](auto& v, int64_t n) {
    v.resize(L);
    for (auto& x : v) x.assign(n, {});
  };
  a->inputs.resize(N);
  a->targets.resize(N);
  per_layer(a->x_in, N * C);
  per_layer(a->n1, N * C);
  per_layer(a->n1_rstd, N);
  per_layer(a->q, N * QD);
  per_layer(a->k, N * KVD);
  per_layer(a->v, N * KVD);
  per_layer(a->probs, batch * H * seq * seq);
  per_layer(a->att, N * QD);
  per_layer(a->x_mid, N * C);
  per_layer(a->n2, N * C);
  per_layer(a->n2_rstd, N);
  per_layer(a->router_probs, N * E);
  per_layer(a->topk_idx, N * K);
  per_layer(a->topk_w, N * K);
  per_layer(a->fractions, E);
  per_layer(a->expert_offsets, E + 1);
  per_layer(a->slot_token, N * K);
  per_layer(a->assignment_slot, N * K);
  per_layer(a->xs, N * K * C);
  // The experts' hidden activations and their gradients: with expert parallelism the owners
  // keep them for the rows they compute (ExpertParallelState), so none are needed here.
  const int64_t expert_rows = ep_ ? 0 : N * K;
  per_layer(a->h, expert_rows * 2 * F);
  per_layer(a->act, expert_rows * F);
  per_layer(a->ys, N * K * C);
  a->x_out.assign(N * C, 0);
  a->nf.assign(N * C, 0);
  a->nf_rstd.assign(N, 0);
  a->logits.assign(N * c.padded_vocab(), 0);
  a->losses.assign(N, 0);
  a->dx.assign(N * C, 0);
  a->dn.assign(N * C, 0);
  a->dq.assign(N * QD, 0);
  a->dk.assign(N * KVD, 0);
  a->dv.assign(N * KVD, 0);
  a->datt.assign(N * QD, 0);
  a->dxs.assign(N * K * C, 0);
  a->dh.assign(expert_rows * 2 * F, 0);
  a->dact.assign(expert_rows * F, 0);
  a->dys.assign(N * K * C, 0);
  a->dtopk_w.assign(N * K, 0);
  a->drouter.assign(N * E, 0);
  acts_ = std::move(a);
}

ForwardResult Model::forward(const int32_t* inputs, const int32_t* targets, int64_t batch,
                             int64_t seq) {
  if (config_.is_zaya()) return zaya_forward(inputs, targets, batch, seq);
  ensure_activations(batch, seq);
  Activations& a = *acts_;
  const ModelConfig& c = config_;
  const int64_t N = batch * seq, C = c.d_model, E = c.n_experts, K = c.top_k;
  const int64_t QD = c.q_dim(), KVD = c.kv_dim();
  const float eps = static_cast<float>(c.rms_norm_eps);
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
    ops::embedding_forward(a.x_in[0].data(), inputs, params_.data() + a.embed, N, C);
  }
  double aux_sum = 0;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LayerOffsets& o = a.layers[l];
    float* x = a.x_in[l].data();
    {
      ScopedOpTimer t(&op_times_, "rmsnorm");
      ops::rmsnorm_forward(a.n1[l].data(), a.n1_rstd[l].data(), x, params_.data() + o.ln1, N, C,
                           eps);
    }
    {
      ScopedOpTimer t(&op_times_, "attn_qkv_gemm");
      const void* n1 = as_gemm_input(a.n1[l].data(), N * C, 2);
      gemm(n1, false, gemm_weight(o.q), true, a.q[l].data(), N, QD, C, precision_);
      gemm(n1, false, gemm_weight(o.k), true, a.k[l].data(), N, KVD, C, precision_);
      gemm(n1, false, gemm_weight(o.v), true, a.v[l].data(), N, KVD, C, precision_);
    }
    {
      ScopedOpTimer t(&op_times_, "rope");
      ops::rope_apply(a.q[l].data(), batch, seq, c.n_heads, c.head_dim, c.rotary_dim(), 0,
                      c.rope_theta, false);
      ops::rope_apply(a.k[l].data(), batch, seq, c.n_kv_heads, c.head_dim, c.rotary_dim(), 0,
                      c.rope_theta, false);
    }
    {
      ScopedOpTimer t(&op_times_, "attention");
      ops::attention_forward(a.att[l].data(), a.probs[l].data(), a.q[l].data(), a.k[l].data(),
                             a.v[l].data(), {batch, seq, c.n_heads, c.n_kv_heads, c.head_dim},
                             precision_);
    }
    float* xm = a.x_mid[l].data();
    {
      ScopedOpTimer t(&op_times_, "attn_out_gemm");
      std::memcpy(xm, x, N * C * sizeof(float));
      const void* att = as_gemm_input(a.att[l].data(), N * QD, 0);
      gemm(att, false, gemm_weight(o.o), true, xm, N, C, QD, precision_, /*accumulate=*/true);
    }
    {
      ScopedOpTimer t(&op_times_, "rmsnorm");
      ops::rmsnorm_forward(a.n2[l].data(), a.n2_rstd[l].data(), xm, params_.data() + o.ln2, N,
                           C, eps);
    }
    // Routing.
    {
      ScopedOpTimer t(&op_times_, "router");
      if (E == 1) {
        std::fill(a.topk_idx[l].begin(), a.topk_idx[l].end(), 0);
        std::fill(a.topk_w[l].begin(), a.topk_w[l].end(), 1.0f);
      } else {
        float* logits = a.drouter.data();  // scratch; router logits are not needed later
        gemm(a.n2[l].data(), false, params_.data() + o.router, true, logits, N, E, C,
             DType::f32);
        ops::router_forward(a.router_probs[l].data(), a.topk_idx[l].data(), a.topk_w[l].data(),
                            logits, N, E, K, c.norm_topk_prob);
        const double* f = nullptr;
        if (dp_group_) {
          // The shares over the global batch: exact integer counts summed over the ranks.
          std::vector<int64_t> counts = ops::expert_counts(a.topk_idx[l].data(), N, E, K);
          counts.push_back(N * K);
          dp_group_->allreduce(counts.data(), counts.data(), counts.size());
          a.fractions[l].resize(E);
          for (int64_t j = 0; j < E; ++j)
            a.fractions[l][j] = static_cast<double>(counts[j]) / static_cast<double>(counts[E]);
          f = a.fractions[l].data();
        }
        aux_sum += ops::router_aux_loss(a.router_probs[l].data(), a.topk_idx[l].data(), N, E, K, f);
      }
      ops::moe_dispatch_plan(a.expert_offsets[l].data(), a.slot_token[l].data(),
                             a.assignment_slot[l].data(), a.topk_idx[l].data(), N, E, K);
      ops::moe_gather(a.xs[l].data(), a.n2[l].data(), a.slot_token[l].data(), N * K, C);
    }
    moe_experts_forward(l, a.expert_offsets[l].data(), a.xs[l].data(), a.h[l].data(),
                        a.act[l].data(), a.ys[l].data(), o.w13, o.w2);
    {
      ScopedOpTimer t(&op_times_, "moe_combine");
      float* next = l + 1 < c.n_layers ? a.x_in[l + 1].data() : a.x_out.data();
      std::memcpy(next, xm, N * C * sizeof(float));
      ops::moe_combine(next, a.ys[l].data(), a.topk_w[l].data(), a.assignment_slot[l].data(), N,
                       K, C);
    }
  }
  ForwardResult r;
  r.ce_loss = lm_head_forward(lm_head(a), a.x_out.data(), targets, N);
  if (E > 1) r.aux_loss = aux_sum / c.n_layers;
  if (targets) r.loss = r.ce_loss + c.aux_loss_coef * r.aux_loss;
  return r;
}

const float* Model::logits() const {
  if (config_.is_zaya()) return zaya_logits();
  FOUNDRY_CHECK(acts_ && !acts_->has_targets);
  return acts_->logits.data();
}

void Model::backward() {
  if (config_.is_zaya()) return zaya_backward();
  FOUNDRY_CHECK(acts_ && acts_->has_targets);
  Activations& a = *acts_;
  const ModelConfig& c = config_;
  const int64_t B = a.batch, T = a.seq, N = B * T, C = c.d_model, E = c.n_experts, K = c.top_k;
  const int64_t QD = c.q_dim(), KVD = c.kv_dim(), Vp = c.padded_vocab();
  float* P = params_.data();
  float* G = grads_.data();
  float* dx = a.dx.data();  // gradient of the residual stream, walked backward
  lm_head_backward(lm_head(a), dx, a.dn.data(), a.x_out.data(), N);
  const float aux_coef = static_cast<float>(c.aux_loss_coef / c.n_layers);
  for (int64_t l = c.n_layers - 1; l >= 0; --l) {
    const LayerOffsets& o = a.layers[l];
    const int64_t* offs = a.expert_offsets[l].data();
    // ---- MoE sublayer: x_out = x_mid + combine(experts(gather(n2))) ----
    {
      ScopedOpTimer t(&op_times_, "moe_combine");
      ops::moe_combine_backward(a.dys.data(), a.dtopk_w.data(), dx, a.ys[l].data(),
                                a.topk_w[l].data(), a.assignment_slot[l].data(), N, K, C);
    }
    moe_experts_backward(l, offs, a.dys.data(), a.xs[l].data(), a.h[l].data(),
                         a.act[l].data(), a.dxs.data(), a.dh.data(), a.dact.data(), o.w13, o.w2);
    {
      ScopedOpTimer t(&op_times_, "router");
      std::memset(a.dn.data(), 0, N * C * sizeof(float));
      ops::moe_gather_backward(a.dn.data(), a.dxs.data(), a.assignment_slot[l].data(), N, K, C);
      if (E > 1) {
        ops::router_backward(a.drouter.data(), a.dtopk_w.data(), a.router_probs[l].data(),
                             a.topk_idx[l].data(), a.topk_w[l].data(), N, E, K, c.norm_topk_prob,
                             aux_coef, dp_group_ ? a.fractions[l].data() : nullptr);
        gemm(a.drouter.data(), false, P + o.router, false, a.dn.data(), N, C, E, DType::f32, true);
        gemm(a.drouter.data(), true, a.n2[l].data(), false, G + o.router, E, C, N, DType::f32,
             true);
      }
    }
    {
      ScopedOpTimer t(&op_times_, "rmsnorm");
      ops::rmsnorm_backward(dx, G + o.ln2, a.dn.data(), a.x_mid[l].data(), P + o.ln2,
                            a.n2_rstd[l].data(), N, C);
    }
    gradients_final(o.ln2);
    // ---- attention sublayer: x_mid = x_in + o_proj(attn(...)) ----
    {
      ScopedOpTimer t(&op_times_, "attn_out_gemm");
      linear_backward(a.datt.data(), G + o.o, dx, a.att[l].data(), o.o, N, C, QD, false);
    }
    {
      ScopedOpTimer t(&op_times_, "attention");
      ops::attention_backward(a.dq.data(), a.dk.data(), a.dv.data(), a.datt.data(),
                              a.probs[l].data(), a.q[l].data(), a.k[l].data(), a.v[l].data(),
                              {B, T, c.n_heads, c.n_kv_heads, c.head_dim}, precision_);
    }
    {
      ScopedOpTimer t(&op_times_, "rope");
      ops::rope_apply(a.dq.data(), B, T, c.n_heads, c.head_dim, c.rotary_dim(), 0, c.rope_theta, true);
      ops::rope_apply(a.dk.data(), B, T, c.n_kv_heads, c.head_dim, c.rotary_dim(), 0, c.rope_theta,
                      true);
    }
    {
      ScopedOpTimer t(&op_times_, "attn_qkv_gemm");
      const void* n1 = as_gemm_input(a.n1[l].data(), N * C, 2);
      auto qkv_backward = [&](const float* dy, int64_t w, int64_t out, bool acc) {
        const void* dyin = as_gemm_input(dy, N * out, 0);
        gemm(dyin, false, gemm_weight(w), false, a.dn.data(), N, C, out, precision_, acc);
        gemm(dyin, true, n1, false, G + w, out, C, N, precision_, true);
      };
      qkv_backward(a.dq.data(), o.q, QD, false);
      qkv_backward(a.dk.data(), o.k, KVD, true);
      qkv_backward(a.dv.data(), o.v, KVD, true);
    }
    {
      ScopedOpTimer t(&op_times_, "rmsnorm");
      ops::rmsnorm_backward(dx, G + o.ln1, a.dn.data(), a.x_in[l].data(), P + o.ln1,
                            a.n1_rstd[l].data(), N, C);
    }
    gradients_final(o.ln1);
  }
  {
    ScopedOpTimer t(&op_times_, "embedding");
    ops::embedding_backward(G + a.embed, dx, a.inputs.data(), N, C, Vp);
  }
  gradients_final(0);
}

}  // namespace foundry

namespace foundry {

Model::DecodeState Model::new_decode_state(int64_t max_len) const {
  const ModelConfig& c = config_;
  if (max_len > c.max_seq_len)
    fail(fmt::format("generation length {} exceeds model.max_seq_len = {}", max_len,
                     c.max_seq_len),
         "shorten the prompt or the number of new tokens");
  if (c.is_zaya()) return zaya_new_decode_state(max_len);
  DecodeState s;
  s.max_len = max_len;
  s.k_cache.assign(c.n_layers, std::vector<float>(max_len * c.kv_dim()));
  s.v_cache.assign(c.n_layers, std::vector<float>(max_len * c.kv_dim()));
  s.x.resize(c.d_model);
  s.n.resize(c.d_model);
  s.q.resize(c.q_dim());
  s.att.resize(c.q_dim());
  s.h.resize(2 * c.ffn_dim);
  s.act.resize(c.ffn_dim);
  s.y.resize(c.d_model);
  s.scores.resize(max_len);
  s.router_logits.resize(c.n_experts);
  s.router_probs.resize(c.n_experts);
  s.logits.resize(c.padded_vocab());
  return s;
}

const float* Model::decode_step(DecodeState& s, int32_t token) {
  const ModelConfig& c = config_;
  if (s.pos >= s.max_len) fail("decode state is full", "create a longer decode state");
  if (token < 0 || token >= c.vocab_size)
    fail(fmt::format("token id {} is outside the vocabulary [0, {})", token, c.vocab_size));
  if (c.is_zaya()) return zaya_decode_step(s, token);
  ensure_activations(acts_ ? acts_->batch : 1, acts_ ? acts_->seq : 1);  // offsets table
  const Activations& a = *acts_;
  const int64_t C = c.d_model, E = c.n_experts, K = c.top_k, F = c.ffn_dim;
  const int64_t QD = c.q_dim(), KVD = c.kv_dim(), D = c.head_dim, H = c.n_heads;
  const int64_t pos = s.pos;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const float* P = params_.data();
  ops::embedding_forward(s.x.data(), &token, P + a.embed, 1, C);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LayerOffsets& o = a.layers[l];
    float rstd;
    ops::rmsnorm_forward(s.n.data(), &rstd, s.x.data(), P + o.ln1, 1, C, eps);
    float* kc = s.k_cache[l].data() + pos * KVD;
    float* vc = s.v_cache[l].data() + pos * KVD;
    linear_forward(s.q.data(), s.n.data(), o.q, 1, QD, C);
    linear_forward(kc, s.n.data(), o.k, 1, KVD, C);
    linear_forward(vc, s.n.data(), o.v, 1, KVD, C);
    ops::rope_apply(s.q.data(), 1, 1, H, D, c.rotary_dim(), pos, c.rope_theta, false);
    ops::rope_apply(kc, 1, 1, c.n_kv_heads, D, c.rotary_dim(), pos, c.rope_theta, false);
    ops::attention_decode(s.att.data(), s.scores.data(), s.q.data(), s.k_cache[l].data(),
                          s.v_cache[l].data(), pos + 1, H, c.n_kv_heads, D);
    linear_forward(s.y.data(), s.att.data(), o.o, 1, C, QD);
    for (int64_t i = 0; i < C; ++i) s.x[i] += s.y[i];
    ops::rmsnorm_forward(s.n.data(), &rstd, s.x.data(), P + o.ln2, 1, C, eps);
    std::vector<int32_t> idx(K, 0);
    std::vector<float> w(K, 1.0f);
    if (E > 1) {
      gemm(s.n.data(), false, P + o.router, true, s.router_logits.data(), 1, E, C, DType::f32);
      ops::router_forward(s.router_probs.data(), idx.data(), w.data(), s.router_logits.data(), 1,
                          E, K, c.norm_topk_prob);
    }
    for (int64_t j = 0; j < K; ++j) {
      linear_forward(s.h.data(), s.n.data(), o.w13[idx[j]], 1, 2 * F, C);
      ops::swiglu_forward(s.act.data(), s.h.data(), 1, F);
      linear_forward(s.y.data(), s.act.data(), o.w2[idx[j]], 1, C, F);
      for (int64_t i = 0; i < C; ++i) s.x[i] += w[j] * s.y[i];
    }
  }
  float rstd;
  ops::rmsnorm_forward(s.n.data(), &rstd, s.x.data(), P + a.final_norm, 1, C, eps);
  linear_forward(s.logits.data(), s.n.data(), a.embed, 1, c.padded_vocab(), C);
  for (int64_t v = c.vocab_size; v < c.padded_vocab(); ++v)
    s.logits[v] = -std::numeric_limits<float>::infinity();
  ++s.pos;
  return s.logits.data();
}

}  // namespace foundry
