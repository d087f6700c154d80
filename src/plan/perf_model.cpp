#include "plan/perf_model.h"

#include <algorithm>
#include <cmath>

#include "kernels/attention.h"
#include "model/info.h"

namespace foundry {

const char* category_name(CostCategory category) {
  switch (category) {
    case CostCategory::gemm: return "gemm";
    case CostCategory::attention: return "attention";
    case CostCategory::elementwise: return "elementwise";
    case CostCategory::optimizer: return "optimizer";
    case CostCategory::comm: return "comm";
  }
  return "?";
}

namespace {

constexpr double kF32 = 4, kBf16 = 2;

// Accumulates items by name so the breakdown stays short (one row per kind of operation).
class Ledger {
 public:
  explicit Ledger(const HardwareProfile& profile) : profile_(profile) {}

  // A GEMM C[m,n] = A[m,k]·B[k,n] run `count` times per micro-step, forward and backward:
  // forward m×n×k, input gradient m×k×n, weight gradient n×k×m (accumulated over tokens).
  void linear(const std::string& name, int64_t tokens, int64_t out, int64_t in, double count,
              DType dtype) {
    if (tokens <= 0 || out <= 0 || in <= 0 || count <= 0) return;
    const double f = 2.0 * double(tokens) * double(out) * double(in);
    const double t = f / profile_.gemm_rate(dtype, tokens, out, in) +
                     f / profile_.gemm_rate(dtype, tokens, in, out) +
                     f / profile_.gemm_rate(dtype, out, in, tokens);
    add(name, CostCategory::gemm, count * t, count * 3 * f, 0);
  }
  // `groups` independent GEMMs of one shape run as one grouped GEMM, `count` times: the
  // rate is that of one GEMM with the groups' rows stacked (dW: their columns).
  void grouped(const std::string& name, int64_t tokens, int64_t out, int64_t in, int64_t groups,
               double count, DType dtype) {
    const double f = 2.0 * double(tokens) * double(out) * double(in) * double(groups);
    const int64_t stacked = tokens * groups;
    const double t = f / profile_.gemm_rate(dtype, stacked, out, in) +
                     f / profile_.gemm_rate(dtype, stacked, in, out) +
                     f / profile_.gemm_rate(dtype, out * groups, in, tokens);
    add(name, CostCategory::gemm, count * t, count * 3 * f, 0);
  }
  // A product that only runs forward and backward as given (no weight): `flops` each.
  // `flops_m` (if given) is the M of one product when `m` is the stacked M its rate follows;
  // such batched attention products get no roofline cap (their score traffic is counted
  // apart on a CPU, and stays on chip in a GPU's fused kernel).
  void product(const std::string& name, CostCategory category, int64_t m, int64_t n,
               int64_t k, double count, DType dtype, int64_t flops_m = 0) {
    const double f = 2.0 * double(flops_m > 0 ? flops_m : m) * double(n) * double(k);
    add(name, category, count * f / profile_.gemm_rate(dtype, m, n, k, flops_m == 0), count * f, 0);
  }
  void memory(const std::string& name, CostCategory category, double bytes) {
    add(name, category, bytes / profile_.memory_bandwidth(), 0, bytes);
  }
  void add(const std::string& name, CostCategory category, double s, double flops,
           double bytes) {
    for (auto& it : items_)
      if (it.name == name) {
        it.seconds += s;
        it.flops += flops;
        it.bytes += bytes;
        return;
      }
    items_.push_back({name, category, s, flops, bytes});
  }
  void scale(double factor) {
    for (auto& it : items_) {
      it.seconds *= factor;
      it.flops *= factor;
      it.bytes *= factor;
    }
  }
  std::vector<PredictionItem>& items() { return items_; }

 private:
  const HardwareProfile& profile_;
  std::vector<PredictionItem> items_;
};

// One micro-step (forward + backward over micro_batch·T tokens) into `led`.
void micro_step(const ModelConfig& c, const StepShape& s, const HardwareProfile& profile,
                Ledger& led) {
  // With context parallelism a device holds T / cp rows of each sequence.
  const int64_t T = s.seq, B = s.micro_batch, N = B * T / s.cp;
  const int64_t C = c.d_model, L = c.n_layers, Vp = c.padded_vocab();
  const int64_t E = c.n_experts, K = std::min(c.top_k, c.n_experts), F = c.ffn_dim;
  const int64_t Hq = c.n_heads, Hk = c.n_kv_heads, d = c.head_dim;
  const int64_t Dq = c.q_dim(), Dkv = c.kv_dim();
  const DType dt = s.precision;
  const bool bf16 = dt == DType::bf16;
  const double Ld = double(L);
  const bool gpu = profile.kind == "gpu";

  // ---- GEMMs ----
  if (c.is_zaya()) {
    led.linear("attention projections (q, k, v, o)", N, Dq, C, Ld, dt);
    led.linear("attention projections (q, k, v, o)", N, Dkv, C, Ld, dt);
    led.linear("attention projections (q, k, v, o)", N, Dkv / 2, C, 2 * Ld, dt);
    led.linear("attention projections (q, k, v, o)", N, C, Dq, Ld, dt);
    // Grouped causal convolution: per group (Hq + Hk of them) a d × d·t1 product; one
    // grouped kernel on a GPU, one GEMM per group on the CPU.
    if (gpu) led.grouped("CCA convolutions", N, d, d * c.cca_kernel_grouped, Hq + Hk, Ld, dt);
    else led.linear("CCA convolutions", N, d, d * c.cca_kernel_grouped, Ld * double(Hq + Hk), dt);
    // Foundry's CPU router runs in fp32 (it is small and the choice is rounding-sensitive);
    // GPU stacks run its linears in bf16 with an fp32 softmax, as ZAYA1 trained.
    const DType router_dt = gpu ? dt : DType::f32;
    const int64_t R = c.router_latent_dim, S = c.router_classes();
    led.linear("router", N, R, C, Ld, router_dt);
    led.linear("router", N, R, R, 2 * Ld, router_dt);
    led.linear("router", N, S, R, Ld, router_dt);
  } else {
    led.linear("attention projections (q, k, v, o)", N, Dq, C, Ld, dt);
    led.linear("attention projections (q, k, v, o)", N, Dkv, C, 2 * Ld, dt);
    led.linear("attention projections (q, k, v, o)", N, C, Dq, Ld, dt);
    if (E > 1) led.linear("router", N, E, C, Ld, dt);
  }
  // Experts: balanced routing gives each expert N·k/E rows; gate|up run as one [rows, 2F].
  const int64_t rows = E > 1 ? std::max<int64_t>(1, (N * K + E - 1) / E) : N;
  const double experts = E > 1 ? double(E) : 1.0;
  if (profile.grouped_expert_gemms && E > 1) {
    // One grouped GEMM runs all experts' products in one launch: its rate follows the
    // work of the whole group, as if the experts' rows were stacked.
    led.grouped("expert GEMMs", rows, 2 * F, C, E, Ld, dt);
    led.grouped("expert GEMMs", rows, C, F, E, Ld, dt);
  } else {
    led.linear("expert GEMMs", rows, 2 * F, C, Ld * experts, dt);
    led.linear("expert GEMMs", rows, C, F, Ld * experts, dt);
  }
  led.linear("LM head", N, Vp, C, 1, dt);

  // ---- attention core: S = Q·Kᵀ, O = P·V forward; S again, dP, dV, dQ, dK backward ----
  // Causal share of the products: the tiled kernel computes the tiles at or below the
  // diagonal, (n+1)/2n of the square for n tiles; a GPU flash kernel likewise (tiles of 64).
  // Context parallelism splits that work evenly over the cp devices.
  const int64_t tile =
      gpu ? 64 : ops::attention_tile_rows({B, T, Hq, c.n_kv_heads, d});
  const double tiles = std::ceil(double(T) / double(tile));
  const double causal = (tiles + 1) / (2 * tiles) / double(s.cp);
  // One batched product covers all B·Hq heads of a layer (oneDNN batched matmul on the CPU,
  // a flash kernel on a GPU): its rate is that of the heads' rows stacked.
  const double heads = double(B * Hq) * Ld * causal;
  const int64_t TH = T * B * Hq;
  led.product("attention core", CostCategory::attention, TH, T, d, 2 * heads, dt, T);  // Q·Kᵀ twice
  led.product("attention core", CostCategory::attention, TH, d, T, heads, dt, T);      // P·V
  led.product("attention core", CostCategory::attention, TH, T, d, heads, dt, T);      // dP = dO·Vᵀ
  led.product("attention core", CostCategory::attention, TH, d, T, 3 * heads, dt, T);  // dV, dQ, dK
  if (!gpu) {
    // Scores written, read and probabilities written forward (12 B per element), then
    // probabilities, their gradient and the score gradient backward (12 B), fp32; bf16
    // copies of P and dS for the products (2 × 6 B).
    const double per_element = 24 + (bf16 ? 12 : 0);
    led.memory("attention softmax", CostCategory::attention, heads * double(T) * double(T) * per_element);
  }

  // ---- elementwise traffic, bytes per token (fwd + bwd), fp32 activations ----
  // RMSNorm: forward reads x, writes y (2C); backward reads x, dy, writes dx (3C): 5C words.
  // Residual add: 3C forward, 2C backward. RoPE: read + write q and k, forward and backward.
  // SwiGLU per routed token: forward reads gate|up (2F) writes F; backward reads 2F + F,
  // writes 2F: 8F. Dispatch and combine: gather C forward, scatter-add C, the same backward
  // plus the gate gradient's dot product: 6C per routed token.
  double words = 0;
  words += Ld * (2 * 5 * C + 2 * 5 * C);              // two norms, two residual adds
  words += Ld * 4 * double(Dq + Dkv) * c.rope_fraction;  // RoPE on q and k
  words += Ld * double(K) * (8 * F + 6 * C);          // SwiGLU, dispatch/combine
  words += 5 * C + 3 * double(Vp) + 2 * C;            // final norm, cross-entropy, embedding
  if (c.is_zaya()) {
    const int64_t Cc = Dq + Dkv, R = c.router_latent_dim;
    words += Ld * 2 * 12 * C;          // residual scaling: 2 merges of 4 vectors, fwd + bwd
    words += Ld * 10 * double(Cc);     // q-k means, depthwise convolution, biases
    words += Ld * 8 * double(Dq + Dkv);  // QK-norm with temperature
    words += Ld * 6 * double(Dkv / 2);   // value shift
    words += Ld * (12 * double(R) + 3 * double(c.router_classes()));  // router norm, GELUs, EDA, softmax
  } else if (E > 1) {
    words += Ld * 4 * double(E);  // router softmax and top-k
  }
  double bytes = words * kF32;
  if (bf16) {
    // Each GEMM's activation input is converted to bf16 forward (read 4 B, write 2 B) and
    // each output gradient backward.
    double converted = Ld * (C + Dq + K * (C + F)) + C;                    // inputs
    converted += Ld * (Dq + 2 * Dkv + C + K * (2 * F + C)) + double(Vp);   // output gradients
    bytes += converted * (kF32 + kBf16);
  }
  led.memory("elementwise (norms, residuals, RoPE, SwiGLU, routing, loss)", CostCategory::elementwise,
             bytes * double(N));
}

// The optimizer step over this rank's share of the parameters.
void optimizer_step(const ModelConfig& c, const StepShape& s, const HardwareProfile& profile,
                    Ledger& led) {
  const ParamCounts pc = count_parameters(c);
  const double P = double(pc.total);
  const double share = s.zero1 ? 1.0 / double(s.dp) : 1.0;
  const bool bf16 = s.precision == DType::bf16;
  // Muon's matrices: every attention projection and every expert matrix.
  struct Mat {
    int64_t rows, cols;
    double count;
  };
  std::vector<Mat> mats;
  double muon_params = 0;
  if (s.muon) {
    const int64_t C = c.d_model, Dq = c.q_dim(), Dkv = c.kv_dim(), F = c.ffn_dim;
    const double L = double(c.n_layers), E = double(c.n_experts);
    mats.push_back({Dq, C, 2 * L});  // q and o
    if (c.is_zaya()) {
      mats.push_back({Dkv, C, L});
      mats.push_back({Dkv / 2, C, 2 * L});
    } else {
      mats.push_back({Dkv, C, 2 * L});
    }
    mats.push_back({F, C, 3 * L * E});  // w1, w3, w2 (w2 is C × F: same product sizes)
    for (const auto& m : mats) muon_params += double(m.rows * m.cols) * m.count;
  }
  const double adam_params = P - muon_params;
  // Per parameter: clip reads the gradient (4 B), the update reads w, g, m, v and writes w,
  // m, v (28 B), the bf16 copy writes 2 B, zeroing the gradient writes 4 B. Muon: momentum
  // read + write, gradient read, weight read + write (20 B), plus the orthogonalization's
  // own passes (normalize, scale: ~16 B) and the same clip, copy and zeroing.
  const double extra = 4 + 4 + (bf16 ? 2 : 0);
  led.memory("optimizer", CostCategory::optimizer, share * (adam_params * (28 + extra) + muon_params * (36 + extra)));
  const DType ns = s.muon_bf16 ? DType::bf16 : DType::f32;
  for (const auto& m : mats) {
    const int64_t a = std::min(m.rows, m.cols), b = std::max(m.rows, m.cols);
    const double n = m.count * share * double(s.muon_ns_steps);
    led.product("optimizer (Muon Newton-Schulz)", CostCategory::optimizer, a, a, b, n, ns);  // X·Xᵀ
    led.product("optimizer (Muon Newton-Schulz)", CostCategory::optimizer, a, a, a, n, ns);  // A·A
    led.product("optimizer (Muon Newton-Schulz)", CostCategory::optimizer, a, b, a, n, ns);  // B·X
  }
}

}  // namespace

int64_t predict_memory(const ModelConfig& config, const StepShape& s,
                       const HardwareProfile& profile) {
  const MemoryEstimate m =
      estimate_memory(config, s.micro_batch, s.seq, s.precision, s.muon, s.cp);
  int64_t activations = m.activations_bytes + m.backward_buffers_bytes;
  if (profile.kind == "gpu") {
    for (const auto* items : {&m.activations, &m.backward_buffers})
      for (const auto& it : *items)
        if (it.shape.find("T,T]") != std::string::npos) activations -= it.bytes;
  }
  const int64_t optimizer = s.zero1 ? (m.optimizer_bytes + s.dp - 1) / s.dp : m.optimizer_bytes;
  return m.weights_fp32_bytes + m.weights_bf16_bytes + m.grads_bytes + optimizer + activations;
}

StepPrediction predict_step(const ModelConfig& config, const StepShape& s,
                            const HardwareProfile& profile) {
  FOUNDRY_CHECK(s.seq > 0 && s.micro_batch > 0 && s.accumulation > 0 && s.dp > 0 && s.cp > 0);
  Ledger led(profile);
  micro_step(config, s, profile, led);
  led.scale(double(s.accumulation));
  optimizer_step(config, s, profile, led);

  StepPrediction p;
  const double P = double(count_parameters(config).total);
  if (s.dp > 1) {
    const bool bf16 = s.precision == DType::bf16;
    if (s.zero1) {
      const double rs = P * kF32, ag = P * (bf16 ? kBf16 : kF32);
      led.add("gradient reduce-scatter", CostCategory::comm, profile.collective_time("reduce_scatter", s.dp, rs), 0, rs);
      led.add("weight all-gather", CostCategory::comm, profile.collective_time("all_gather", s.dp, ag), 0, ag);
    } else {
      const double ar = P * kF32;
      led.add("gradient all-reduce", CostCategory::comm, profile.collective_time("all_reduce", s.dp, ar), 0, ar);
    }
  }
  // Context parallelism: k and v of the whole sequences, all-gathered per layer, and their
  // gradients reduce-scattered; blocking, so never hidden.
  double cp_s = 0;
  if (s.cp > 1) {
    const double whole = double(s.micro_batch) * double(s.seq) * double(config.kv_dim()) * kF32;
    const double count = 2.0 * double(config.n_layers) * double(s.accumulation);
    const double sent = count * whole * double(s.cp - 1) / double(s.cp);
    const double gather = count * profile.collective_time("all_gather", s.cp, whole);
    const double scatter = count * profile.collective_time("reduce_scatter", s.cp, whole);
    led.add("context-parallel k, v all-gather", CostCategory::comm, gather, 0, sent);
    led.add("context-parallel k, v gradient reduce-scatter", CostCategory::comm, scatter, 0, sent);
    cp_s = gather + scatter;
  }
  for (const auto& it : led.items()) {
    switch (it.category) {
      case CostCategory::gemm: p.gemm_s += it.seconds; break;
      case CostCategory::attention: p.attention_s += it.seconds; break;
      case CostCategory::elementwise: p.elementwise_s += it.seconds; break;
      case CostCategory::optimizer: p.optimizer_s += it.seconds; break;
      case CostCategory::comm: p.comm_s += it.seconds; break;
    }
  }
  p.compute_s = p.gemm_s + p.attention_s + p.elementwise_s + p.optimizer_s;
  const double backward = 2.0 / 3.0 * (p.compute_s - p.optimizer_s);
  p.comm_exposed_s = std::max(0.0, p.comm_s - cp_s - s.comm_overlap * backward) + cp_s;
  p.step_s = p.compute_s + p.comm_exposed_s;
  p.tokens_per_step = double(s.micro_batch * s.seq * s.accumulation) / double(s.cp);
  p.tokens_per_s = p.tokens_per_step / p.step_s;
  p.model_flops_per_step = train_flops_per_token(config, s.seq) * p.tokens_per_step;
  const double achieved = p.model_flops_per_step / p.step_s;
  p.mfu_measured = achieved / profile.max_gemm_rate(s.precision);
  const double spec = profile.peak(s.precision).spec_flops_per_s;
  p.mfu_spec = spec > 0 ? achieved / spec : 0;
  p.memory_bytes = predict_memory(config, s, profile);
  p.items = std::move(led.items());
  return p;
}

namespace {

// The fixed cost of one decode GEMM call and the small operations around it (norms, RoPE,
// routing, residuals): oneDNN's execute, OpenMP fork and join. Measured on the development
// machine (docs/PERFORMANCE.md, "Decode latency") from a model small enough that its
// weights stay in cache and its steps are nothing but calls.
constexpr double kDecodeCallOverheadS = 8e-6;

// oneDNN's CPU kernels at decode's shapes, which the profile's GEMM points (m ≥ 128) do not
// cover; measured on the development machine with `bench gemm`, one thread, weights larger
// than the caches (docs/PERFORMANCE.md, "Decode latency"):
//   m = 1 runs as a matrix-vector product that streams the weights but pays a fixed time per
//   weight row (output) besides: rows of k = 512 bf16 stream at 10.6 GB/s, of k = 65,536 at
//   31.6 GB/s (STREAM triad: 25.1): 1 KiB / 10.6 GB/s − 1 KiB / 25.1 GB/s ≈ 55 ns;
//   m > 1 runs the GEMM kernel, whose register blocking covers kCpuGemmTileRows rows: fewer
//   rows cost the whole block (m = 4: 21–30 GFLOP/s on one core, against ~200 from m = 64).
constexpr double kCpuGemvRowS = 55e-9;  // per weight row, on one core
constexpr double kCpuGemmTileRows = 24;

// One decode GEMM y [m, n] = x [m, k] · Wᵀ: its FLOPs at the profile's rate for the shape,
// which the roofline caps by the operands' bytes (at small m, the weights' n·k), plus the
// fixed cost of a call; on a CPU profile, oneDNN's small-m behaviour above. m may be
// fractional (an expert's expected rows); it runs as ⌈m⌉. `calls` = 0 for one GEMM of a
// grouped launch (GPU MoE kernels), whose one call the caller counts.
double decode_gemm_s(const HardwareProfile& profile, DType dt, double m, int64_t n, int64_t k,
                     double calls = 1) {
  const int64_t rows = std::max<int64_t>(1, int64_t(std::ceil(m - 1e-9)));
  const double flops = 2.0 * double(rows) * double(n) * double(k);
  const double call = calls * kDecodeCallOverheadS;
  if (profile.kind == "gpu") return flops / profile.gemm_rate(dt, rows, n, k) + call;
  const double in = dt == DType::bf16 ? kBf16 : kF32;
  const double bytes = (double(rows) * double(k) + double(k) * double(n)) * in +
                       double(rows) * double(n) * kF32;
  const double memory_s = bytes / profile.memory_bandwidth();
  const json device = profile.raw.value("device", json::object());
  const double cores = std::max(1.0, device.value("cores", 1.0));
  if (rows == 1) return memory_s + double(n) * kCpuGemvRowS / cores + call;
  const double tile = std::min(1.0, double(rows) / kCpuGemmTileRows);
  const double compute_s = flops / (profile.gemm_rate(dt, rows, n, k, false) * tile);
  return std::max(memory_s, compute_s) + call;
}

// The GEMMs of one layer's attention and router for `batch` tokens. The routers' logits run
// in fp32 (and ZAYA1's whole router MLP in the GEMM precision), as model/routers.cpp does.
double decode_dense_layer_s(const ModelConfig& c, double batch, DType dt,
                            const HardwareProfile& p) {
  const int64_t C = c.d_model, Dq = c.q_dim(), Dkv = c.kv_dim();
  if (c.is_zaya()) {
    const int64_t R = c.router_latent_dim, S = c.router_classes();
    return decode_gemm_s(p, dt, batch, Dq + Dkv, C) + decode_gemm_s(p, dt, batch, Dkv, C) +
           decode_gemm_s(p, dt, batch, C, Dq) + decode_gemm_s(p, dt, batch, R, C) +
           2 * decode_gemm_s(p, dt, batch, R, R) + decode_gemm_s(p, DType::f32, batch, S, R);
  }
  double s = decode_gemm_s(p, dt, batch, Dq, C) + 2 * decode_gemm_s(p, dt, batch, Dkv, C) +
             decode_gemm_s(p, dt, batch, C, Dq);
  if (c.n_experts > 1) s += decode_gemm_s(p, DType::f32, batch, c.n_experts, C);
  return s;
}

}  // namespace

DecodePrediction predict_decode(const ModelConfig& c, int64_t batch, int64_t context,
                                const HardwareProfile& profile, DType precision) {
  FOUNDRY_CHECK(batch > 0 && context >= 0);
  const double B = double(batch), L = double(c.n_layers);
  const double E = double(c.n_experts), K = double(std::min(c.top_k, c.n_experts));
  const int64_t C = c.d_model, F = c.ffn_dim;
  DecodePrediction r;
  r.experts_touched = E > 1 ? E * (1.0 - std::pow(1.0 - K / E, B)) : 1.0;
  const double rows = B * K / r.experts_touched;  // per touched expert, balanced routing
  r.gemm_s = L * decode_dense_layer_s(c, B, precision, profile);
  r.gemm_s += decode_gemm_s(profile, precision, B, c.padded_vocab(), C);  // LM head
  // One GEMM call per touched expert and projection on the CPU; one grouped launch per
  // projection for all experts on a GPU (profile.grouped_expert_gemms).
  const bool grouped = profile.grouped_expert_gemms;
  r.expert_s = L * r.experts_touched *
               (decode_gemm_s(profile, precision, rows, 2 * F, C, grouped ? 0 : 1) +
                decode_gemm_s(profile, precision, rows, C, F, grouped ? 0 : 1));
  if (grouped) r.expert_s += L * 2 * kDecodeCallOverheadS;
  // Every sequence's keys and values of every cached position, read once per step: fp32 in
  // Foundry's decode (CPU profiles), bf16 in a GPU serving stack's cache.
  const double kv_bytes = profile.kind == "gpu" ? kBf16 : kF32;
  r.kv_cache_bytes = 2.0 * kv_bytes * double(c.kv_dim()) * L * double(context) * B;
  r.attention_s = r.kv_cache_bytes / profile.memory_bandwidth();
  r.step_s = r.gemm_s + r.expert_s + r.attention_s;
  return r;
}

double predict_decode_latency(const ModelConfig& c, int64_t batch, int64_t context,
                              const HardwareProfile& profile, DType precision) {
  return predict_decode(c, batch, context, profile, precision).step_s;
}

double data_loading_iops(int64_t global_batch, int64_t seq, int64_t bytes_per_token,
                         int64_t page_bytes, double step_s, double scatter) {
  return scatter * double(global_batch) * double(seq) * double(bytes_per_token) /
         (double(page_bytes) * step_s);
}

double data_loading_break_even_s(int64_t global_batch, int64_t seq, int64_t bytes_per_token,
                                 int64_t page_bytes, double iops_budget, double scatter) {
  return scatter * double(global_batch) * double(seq) * double(bytes_per_token) /
         (double(page_bytes) * iops_budget);
}

}  // namespace foundry
