#include "model/experts.h"

#include <algorithm>

#include "base/error.h"
#include "kernels/ops.h"
#include "model/device_exchange.h"

namespace foundry {

// Expert parallelism: the group, its sharding and, per MoE sublayer, the exchange planned in
// the forward pass and the owned experts' rows that the backward pass needs, in the backend's
// memory. Row counts change every step with the routing; the buffers only grow. On a device
// the rows travel over NCCL where the group has it (every rank on a GPU of its own), else
// through host memory: copied out, exchanged over MPI, copied back; the blocks are reordered
// on the device either way.
struct Experts::Parallel {
  Parallel(const Communicator* g, gpu::NcclGroup* nccl, int64_t n_experts, int64_t n_layers,
           Backend& backend)
      : group(g),
        sharding(n_experts, g->size(), g->rank()),
        backend(backend),
        wire_device(backend, kGrowth),
        moves(*g, backend, nccl),
        // Blocks of rows per peer between device buffers (over NCCL, or through host memory
        // and MPI), and reordered on the device.
        move([this](const float* send, const std::vector<int64_t>& send_counts, float* recv,
                    const std::vector<int64_t>& recv_counts) {
          moves.all_to_all_v(send, send_counts, recv, recv_counts);
        }),
        copy([this](float* to, const float* from, int64_t elements) {
          this->backend.copy(to, from, elements * static_cast<int64_t>(sizeof(float)));
        }),
        ys(backend, kGrowth),
        dys(backend, kGrowth),
        dxs(backend, kGrowth),
        dh(backend, kGrowth),
        dact(backend, kGrowth) {
    for (int64_t l = 0; l < n_layers; ++l) layers.emplace_back(backend);
  }

  // A rank's rows change with the routing every step: its buffers grow by half again when they
  // must grow.
  static constexpr double kGrowth = 1.5;
  const Communicator* group;
  ExpertSharding sharding;
  Backend& backend;
  GrowingBuffer wire_device;  // on a device: the exchanges' rows in the wire layout
  DeviceExchange moves;       // on a device: over NCCL, or through host memory
  ExpertExchange::Move move;
  ExpertExchange::Copy copy;
  struct Layer {
    explicit Layer(Backend& b) : xs(b, kGrowth), h(b, kGrowth), act(b, kGrowth) {}
    ExpertExchange exchange;
    GrowingBuffer xs, h, act;  // local layout: [L, C], [L, 2F], [L, F]
  };
  std::vector<Layer> layers;
  // Scratch shared by the layers: the owned experts' outputs and gradients (ys, dys, dxs:
  // [L, C]; dh: [L, 2F]; dact: [L, F]); in host memory, the exchanges' wire buffer.
  GrowingBuffer ys, dys, dxs, dh, dact;
  std::vector<float> wire;

  // The exchange's dispatch (origin [R, C] → local [L, C]) and combine (back).
  void dispatch(ExpertExchange& x, const float* origin, float* local, int64_t C) {
    if (backend.host_memory()) return x.dispatch(origin, local, C, wire);
    x.dispatch(origin, local, C, wire_device.get_as<float>(x.local_rows() * C), move, copy);
  }
  void combine(ExpertExchange& x, const float* local, float* origin, int64_t C) {
    if (backend.host_memory()) return x.combine(local, origin, C, wire);
    x.combine(local, origin, C, wire_device.get_as<float>(x.local_rows() * C), move, copy);
  }

  // The slab offsets of the owned experts' weights, from those of all experts.
  std::vector<int64_t> local(const std::vector<int64_t>& all) const {
    const int64_t first = sharding.first_expert(group->rank());
    return {all.begin() + first, all.begin() + first + sharding.experts_per_rank()};
  }
};

Experts::Experts(Compute& cx, int64_t n_layers)
    : cx_(cx), n_layers_(n_layers) {
  // Under expert parallelism a layer's rows change with the routing: half again when it grows.
  for (int64_t l = 0; l < n_layers; ++l) xs_gemm_.emplace_back(cx.ops, Parallel::kGrowth);
}

Experts::~Experts() = default;

void Experts::set_group(const Communicator* group, gpu::NcclGroup* nccl) {
  std::unique_ptr<Parallel> ep;
  if (group) ep = std::make_unique<Parallel>(group, nccl, cx_.config.n_experts, n_layers_, cx_.ops);
  ep_ = std::move(ep);
}

const Communicator* Experts::group() const { return ep_ ? ep_->group : nullptr; }

const ExpertSharding* Experts::sharding() const { return ep_ ? &ep_->sharding : nullptr; }

bool Experts::writes_whole_gradient(const ParamInfo& p) const {
  if (p.kind != ParamKind::expert) return false;
  return !ep_ || ep_->sharding.owner(p) == ep_->group->rank();
}

void Experts::forward(int64_t layer, const int64_t* offsets, const float* xs, float* h, float* act,
                      float* ys, const ExpertWeights& w) {
  if (!ep_)
    return local_forward(offsets, cx_.config.n_experts, xs, h, act, ys, w.w13, w.w2,
                         &xs_gemm_[layer]);
  Parallel& s = *ep_;
  Parallel::Layer& b = s.layers[layer];
  const int64_t C = cx_.config.d_model, F = cx_.config.ffn_dim;
  float *lxs, *lh, *lact, *lys;
  {
    auto t = cx_.time("ep_dispatch");
    b.exchange.plan(*s.group, s.sharding, offsets);
    const int64_t L = b.exchange.local_rows();
    lxs = b.xs.get_as<float>(L * C);
    lh = b.h.get_as<float>(L * 2 * F);
    lact = b.act.get_as<float>(L * F);
    lys = s.ys.get_as<float>(L * C);
    s.dispatch(b.exchange, xs, lxs, C);
  }
  local_forward(b.exchange.local_offsets(), b.exchange.local_experts(), lxs, lh, lact, lys,
                s.local(w.w13), s.local(w.w2), &xs_gemm_[layer]);
  {
    auto t = cx_.time("ep_combine");
    s.combine(b.exchange, lys, ys, C);
  }
}

void Experts::backward(int64_t layer, const int64_t* offsets, const float* dys, const float* xs,
                       const float* h, const float* act, float* dxs, float* dh, float* dact,
                       const ExpertWeights& w) {
  if (!ep_)
    return local_backward(offsets, cx_.config.n_experts, dys, xs, h, act, dxs, dh, dact, w.w13,
                          w.w2, &xs_gemm_[layer]);
  // The forward's plan still describes these rows: the routing is that of the forward.
  Parallel& s = *ep_;
  Parallel::Layer& b = s.layers[layer];
  FOUNDRY_CHECK(b.exchange.planned());
  const int64_t C = cx_.config.d_model, F = cx_.config.ffn_dim, L = b.exchange.local_rows();
  float *ldys, *ldxs, *ldh, *ldact;
  {
    auto t = cx_.time("ep_dispatch");
    ldys = s.dys.get_as<float>(L * C);
    ldxs = s.dxs.get_as<float>(L * C);
    ldh = s.dh.get_as<float>(L * 2 * F);
    ldact = s.dact.get_as<float>(L * F);
    s.dispatch(b.exchange, dys, ldys, C);
  }
  // The forward's rows of this layer, where it left them (its buffers only grow in forward).
  const auto kept = [](GrowingBuffer& g) { return static_cast<float*>(g.data()); };
  local_backward(b.exchange.local_offsets(), b.exchange.local_experts(), ldys, kept(b.xs),
                 kept(b.h), kept(b.act), ldxs, ldh, ldact, s.local(w.w13), s.local(w.w2),
                 &xs_gemm_[layer]);
  {
    auto t = cx_.time("ep_combine");
    s.combine(b.exchange, ldxs, dxs, C);
  }
}

namespace {

// The experts' row counts: the costs of their products (kernels/gemm.h, run_products).
std::vector<int64_t> row_counts(const int64_t* offsets, int64_t n_experts) {
  std::vector<int64_t> rows(n_experts);
  for (int64_t e = 0; e < n_experts; ++e) rows[e] = offsets[e + 1] - offsets[e];
  return rows;
}

}  // namespace

// Experts e < n_experts, each on its rows [offsets[e], offsets[e+1]) of the sorted matrix; the
// experts' products run concurrently when their rows split evenly over the threads.
void Experts::local_forward(const int64_t* offsets, int64_t n_experts, const float* xs, float* h,
                            float* act, float* ys, const std::vector<int64_t>& w13,
                            const std::vector<int64_t>& w2, GrowingBuffer* xs_gemm) {
  const int64_t C = cx_.config.d_model, F = cx_.config.ffn_dim, rows_all = offsets[n_experts];
  const std::vector<int64_t> costs = row_counts(offsets, n_experts);
  const DType dt = cx_.precision;
  const size_t elem = dt == DType::bf16 ? 2 : 4;
  {
    auto t = cx_.time("expert_up_gemm");
    // Kept for the backward's weight gradient when the caller gives a buffer.
    const char* xs_g = static_cast<const char*>(xs_gemm ? cx_.input(xs, rows_all * C, *xs_gemm)
                                                        : cx_.input(xs, rows_all * C, 0));
    cx_.ops.products(costs, [&](int64_t e) {
      const int64_t rows = offsets[e + 1] - offsets[e];
      if (rows == 0) return;
      cx_.ops.gemm(xs_g + offsets[e] * C * elem, false, cx_.weight(w13[e]), true,
                   h + offsets[e] * 2 * F, rows, 2 * F, C, dt);
    });
  }
  {
    auto t = cx_.time("swiglu");
    if (dt == DType::bf16)
      cx_.ops.swiglu_forward_bf16(reinterpret_cast<bf16*>(act), h, rows_all, F);
    else
      cx_.ops.swiglu_forward(act, h, rows_all, F);
  }
  {
    auto t = cx_.time("expert_down_gemm");
    const char* act_g = reinterpret_cast<const char*>(act);  // already in the GEMM dtype
    cx_.ops.products(costs, [&](int64_t e) {
      const int64_t rows = offsets[e + 1] - offsets[e];
      if (rows == 0) return;
      cx_.ops.gemm(act_g + offsets[e] * F * elem, false, cx_.weight(w2[e]), true,
                   ys + offsets[e] * C, rows, C, F, dt);
    });
  }
}

void Experts::local_backward(const int64_t* offsets, int64_t n_experts, const float* dys,
                             const float* xs, const float* h, const float* act, float* dxs,
                             float* dh, float* dact, const std::vector<int64_t>& w13,
                             const std::vector<int64_t>& w2, GrowingBuffer* xs_gemm) {
  const int64_t C = cx_.config.d_model, F = cx_.config.ffn_dim, rows_all = offsets[n_experts];
  const std::vector<int64_t> costs = row_counts(offsets, n_experts);
  const DType dt = cx_.precision;
  const size_t elem = dt == DType::bf16 ? 2 : 4;
  // The weight gradients are written whole, or added to earlier micro-batches' (accumulating).
  const bool add = cx_.accumulate_grads;
  {
    auto t = cx_.time("expert_down_gemm");
    const char* dys_g = static_cast<const char*>(cx_.input(dys, rows_all * C, 0));
    const char* act_g = reinterpret_cast<const char*>(act);
    cx_.ops.products(costs, [&](int64_t e) {
      const int64_t rows = offsets[e + 1] - offsets[e];
      if (rows == 0) {
        if (!add) cx_.ops.fill(cx_.g(w2[e]), C * F, 0.0f);
        return;
      }
      const char* dys_e = dys_g + offsets[e] * C * elem;
      cx_.ops.gemm(dys_e, false, cx_.weight(w2[e]), false, dact + offsets[e] * F, rows, F, C, dt);
      cx_.ops.gemm(dys_e, true, act_g + offsets[e] * F * elem, false, cx_.g(w2[e]), C, F, rows, dt,
                   add);
    });
  }
  {
    auto t = cx_.time("swiglu");
    if (dt == DType::bf16)
      cx_.ops.swiglu_backward_bf16(reinterpret_cast<bf16*>(dh), dact, h, rows_all, F);
    else
      cx_.ops.swiglu_backward(dh, dact, h, rows_all, F);
  }
  {
    auto t = cx_.time("expert_up_gemm");
    const char* dh_g = reinterpret_cast<const char*>(dh);  // already in the GEMM dtype
    const char* xs_g = static_cast<const char*>(
        dt == DType::bf16 && xs_gemm ? xs_gemm->data() : cx_.input(xs, rows_all * C, 1));
    cx_.ops.products(costs, [&](int64_t e) {
      const int64_t rows = offsets[e + 1] - offsets[e];
      if (rows == 0) {
        if (!add) cx_.ops.fill(cx_.g(w13[e]), 2 * F * C, 0.0f);
        return;
      }
      const char* dh_e = dh_g + offsets[e] * 2 * F * elem;
      cx_.ops.gemm(dh_e, false, cx_.weight(w13[e]), false, dxs + offsets[e] * C, rows, C, 2 * F,
                   dt);
      cx_.ops.gemm(dh_e, true, xs_g + offsets[e] * C * elem, false, cx_.g(w13[e]), 2 * F, C, rows,
                   dt, add);
    });
  }
}

}  // namespace foundry
