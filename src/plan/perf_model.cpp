#include "plan/perf_model.h"

#include <algorithm>
#include <cmath>

#include "base/error.h"
#include "base/format.h"
#include "kernels/attention.h"
#include "model/info.h"

namespace foundry {

const char* category_name(CostCategory category) {
  switch (category) {
    case CostCategory::gemm: return "gemm";
    case CostCategory::attention: return "attention";
    case CostCategory::elementwise: return "elementwise";
    case CostCategory::recompute: return "recompute";
    case CostCategory::optimizer: return "optimizer";
    case CostCategory::comm: return "comm";
    case CostCategory::pipeline: return "pipeline";
    case CostCategory::overhead: return "overhead";
  }
  return "?";
}

const char* recompute_name(Recompute recompute) {
  switch (recompute) {
    case Recompute::none: return "none";
    case Recompute::selective: return "selective";
    case Recompute::full: return "full";
  }
  return "?";
}

namespace {

constexpr double kF32 = 4, kBf16 = 2;
constexpr const char* kFrameworkName = "framework overhead (kernel launches)";
constexpr const char* kAllToAllName = "expert-parallel dispatch and combine all-to-alls";
constexpr const char* kPipelineSendsName = "pipeline sends in the fill and drain (point-to-point)";
constexpr const char* kEagerNormsName =
    "elementwise, unfused: RMSNorms and RoPE op by op (eager)";
constexpr const char* kElementwiseName =
    "elementwise (norms, residuals, RoPE, SwiGLU, routing, loss)";

// Accumulates items by name so the breakdown stays short (one row per kind of operation).
// With tensor parallelism (split = tp) every product and pass of a micro-step is cut tp
// ways: a device runs 1/split of the FLOPs and bytes, its GEMMs at the rate of a shape with
// 1/split of the rows (the same work as splitting a weight dimension). `kernels` counts the
// kernel launches for the framework overhead.
class Ledger {
 public:
  explicit Ledger(const HardwareProfile& profile, int64_t split = 1)
      : profile_(profile), split_(split) {}

  // A GEMM C[m,n] = A[m,k]·B[k,n] run `count` times per micro-step, forward and backward:
  // forward m×n×k, input gradient m×k×n, weight gradient n×k×m (accumulated over tokens).
  void linear(const std::string& name, int64_t tokens, int64_t out, int64_t in, double count,
              DType dtype) {
    if (tokens <= 0 || out <= 0 || in <= 0 || count <= 0) return;
    const int64_t m = rows(tokens);
    const double f = 2.0 * double(m) * double(out) * double(in);
    const double t = f / profile_.gemm_rate(dtype, m, out, in) +
                     f / profile_.gemm_rate(dtype, m, in, out) +
                     f / profile_.gemm_rate(dtype, out, in, m);
    add(name, CostCategory::gemm, count * t, count * 3 * f, 0);
    kernels_ += 3 * count;
  }
  // `groups` independent GEMMs of one shape run as one grouped GEMM, `count` times: the
  // rate is that of one GEMM with the groups' rows stacked (dW: their columns).
  void grouped(const std::string& name, int64_t tokens, int64_t out, int64_t in, int64_t groups,
               double count, DType dtype) {
    const int64_t m = rows(tokens);
    const double f = 2.0 * double(m) * double(out) * double(in) * double(groups);
    const int64_t stacked = m * groups;
    const double t = f / profile_.gemm_rate(dtype, stacked, out, in) +
                     f / profile_.gemm_rate(dtype, stacked, in, out) +
                     f / profile_.gemm_rate(dtype, out * groups, in, m);
    add(name, CostCategory::gemm, count * t, count * 3 * f, 0);
    kernels_ += 3 * count;
  }
  // A product that only runs forward and backward as given (no weight): `flops` each.
  // `flops_m` (if given) is the M of one product when `m` is the stacked M its rate follows;
  // such batched attention products get no roofline cap (their score traffic is counted
  // apart on a CPU, and stays on chip in a GPU's fused kernel). `efficiency` scales the rate
  // (a fused attention kernel's achieved share of the GEMM rate).
  void product(const std::string& name, CostCategory category, int64_t m, int64_t n,
               int64_t k, double count, DType dtype, int64_t flops_m = 0,
               double efficiency = 1.0) {
    const double f = 2.0 * double(flops_m > 0 ? flops_m : m) * double(n) * double(k);
    const double rate = efficiency * profile_.gemm_rate(dtype, rows(m), n, k, flops_m == 0);
    add(name, category, count * f / double(split_) / rate, count * f / double(split_), 0);
  }
  void memory(const std::string& name, CostCategory category, double bytes) {
    const double b = bytes / double(split_);
    add(name, category, b / profile_.memory_bandwidth(), 0, b);
  }
  void count_kernels(double kernels) { kernels_ += kernels; }
  // The optimizer's work is already the device's share: no further split.
  void set_split(int64_t split) { split_ = split; }
  double kernels() const { return kernels_; }
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
    kernels_ *= factor;
    for (auto& it : items_) {
      it.seconds *= factor;
      it.flops *= factor;
      it.bytes *= factor;
    }
  }
  double seconds(const std::string& name) const {
    for (const auto& it : items_)
      if (it.name == name) return it.seconds;
    return 0;
  }
  double flops(const std::string& name) const {
    for (const auto& it : items_)
      if (it.name == name) return it.flops;
    return 0;
  }
  double seconds(CostCategory category) const {
    double s = 0;
    for (const auto& it : items_)
      if (it.category == category) s += it.seconds;
    return s;
  }
  std::vector<PredictionItem>& items() { return items_; }

 private:
  int64_t rows(int64_t m) const { return std::max<int64_t>(1, (m + split_ - 1) / split_); }

  const HardwareProfile& profile_;
  int64_t split_ = 1;
  double kernels_ = 0;
  std::vector<PredictionItem> items_;
};

// A profile's optional "efficiency" section (profiles/README.md): a fused attention kernel's
// achieved share of the best GEMM rate, forward and backward, against sequence length, and
// the framework's cost per kernel launch. Without it: attention at the GEMM rate, no
// overhead (a measured CPU profile: the measured GEMM rates are what the kernels achieve).
struct Efficiency {
  double attention_forward = 1, attention_backward = 1;
  double kernel_overhead_s = 0;
};

double efficiency_number(const json& obj, const char* key, const std::string& where,
                         double lo, double hi) {
  const auto it = obj.find(key);
  if (it == obj.end() || !it->is_number() || !(it->get<double>() >= lo) ||
      !(it->get<double>() <= hi))
    fail(fmt::format("{}: efficiency: '{}' must be a number in [{}, {}], got {}", where, key, lo,
                     hi, it == obj.end() ? std::string("nothing") : it->dump()),
         "fix the profile's efficiency section (profiles/README.md)");
  return it->get<double>();
}

// The fused attention kernel's curve the run uses: efficiency.attention_kernels[kernel] when
// a kernel is named, else efficiency.attention (nullptr if the profile has none).
const json* attention_curve(const json& section, const std::string& kernel,
                            const std::string& where) {
  if (kernel.empty()) {
    const auto it = section.find("attention");
    return it == section.end() ? nullptr : &*it;
  }
  const auto kernels = section.find("attention_kernels");
  if (kernels != section.end() && kernels->is_object() && kernels->contains(kernel))
    return &(*kernels)[kernel];
  std::string names;
  if (kernels != section.end() && kernels->is_object())
    for (const auto& [name, curve] : kernels->items()) names += (names.empty() ? "" : ", ") + name;
  fail(fmt::format("{}: no attention kernel '{}' in efficiency.attention_kernels (it has: {})",
                   where, kernel, names.empty() ? "none" : names),
       "name one of those with --attention-kernel, or add its curve to the profile");
}

// The attention curve is interpolated linearly in log2(seq) and held flat past its ends.
Efficiency efficiency_at(const HardwareProfile& profile, int64_t seq,
                         const std::string& attention_kernel) {
  Efficiency e;
  const std::string& where = profile.path.empty() ? profile.name : profile.path;
  static const json kNone = json::object();
  const auto found = profile.raw.find("efficiency");
  const json& section = found != profile.raw.end() && found->is_object() ? *found : kNone;
  if (section.contains("kernel_overhead_s"))
    e.kernel_overhead_s = efficiency_number(section, "kernel_overhead_s", where, 0, 1e-3);
  const json* curve = attention_curve(section, attention_kernel, where);
  if (curve == nullptr) return e;
  if (!curve->is_array() || curve->empty())
    fail(fmt::format("{}: efficiency: an attention curve must be a list of "
                     "{{seq, forward, backward}}", where),
         "fix the profile's efficiency section (profiles/README.md)");
  struct Point { double x, fwd, bwd; };
  std::vector<Point> pts;
  for (const auto& p : *curve)
    pts.push_back({std::log2(efficiency_number(p, "seq", where, 1, 1e9)),
                   efficiency_number(p, "forward", where, 1e-3, 1),
                   efficiency_number(p, "backward", where, 1e-3, 1)});
  std::sort(pts.begin(), pts.end(), [](const Point& a, const Point& b) { return a.x < b.x; });
  const double x = std::log2(double(std::max<int64_t>(1, seq)));
  Point at = x <= pts.front().x ? pts.front() : pts.back();
  for (size_t i = 1; i < pts.size(); ++i)
    if (x > pts[i - 1].x && x <= pts[i].x) {
      const double w = (x - pts[i - 1].x) / (pts[i].x - pts[i - 1].x);
      at = {x, pts[i - 1].fwd + w * (pts[i].fwd - pts[i - 1].fwd),
            pts[i - 1].bwd + w * (pts[i].bwd - pts[i - 1].bwd)};
    }
  e.attention_forward = at.fwd;
  e.attention_backward = at.bwd;
  return e;
}

// Elementwise kernels per layer, forward and backward (norms, residual adds, RoPE, SwiGLU,
// routing, dispatch, combine; ZAYA1 adds residual scaling, the CCA's means, convolution,
// QK-norm, value shift and the router's MLP passes), for the launch overhead.
constexpr double kElementwiseKernelsPerLayer = 30, kZayaElementwiseKernelsPerLayer = 72;

// Unfused (eager PyTorch, no compiler) RMSNorm and RoPE: each op is its own kernel that reads
// and writes HBM. Bytes per activation element, forward + backward, bf16 in and out:
// RMSNorm computed in fp32 (x.float(); x.pow(2); mean; x·rsqrt; .to(bf16); weight·x): forward
// 6 + 8 + 4 + 8 + 6 + 4 = 36 B; autograd's backward of the same chain (weight·g and the weight
// gradient's reduction 8, cast 6, the product's two gradients 16, pow 8, summing the two paths
// of x 12, cast 6) = 56 B: 92 B, where one fused kernel each way moves 10 B (bf16) and the fused
// count above 20 B (fp32). RoPE in fp32 in the rotate-half form (x.float(); neg and cat of the
// halves; x·cos; rot·sin; add; cast back): forward 6 + 12 + 8 + 8 + 12 + 6 = 52 B, backward the
// mirror image 52 B: 104 B against 16 B fused. Kernels: 14 per norm and 15 per RoPE of q or k.
constexpr double kEagerNormBytes = 92, kEagerRopeBytes = 104;
constexpr double kEagerNormKernels = 14, kEagerRopeKernels = 15;

// The attention of `layers` layers over B sequences of T tokens, Hq query heads (Hk KV heads)
// of d.
struct AttentionWork {
  int64_t B, T, Hq, Hk, d;
  double layers;
};

// Causal share of the products: the tiled kernel computes the tiles at or below the diagonal,
// (n+1)/2n of the square for n tiles; a GPU flash kernel likewise (tiles of 64).
double causal_share(const HardwareProfile& profile, const AttentionWork& w) {
  const int64_t tile =
      profile.kind == "gpu" ? 64 : ops::attention_tile_rows({w.B, w.T, w.Hq, w.Hk, w.d});
  const double tiles = std::ceil(double(w.T) / double(tile));
  return (tiles + 1) / (2 * tiles);
}

// The attention core's products into `led`: the forward's two at efficiency `fw` as
// `forward_name`, the backward's five at `bw` as `backward_name`. One batched product covers
// all B·Hq heads of a layer (oneDNN batched matmul on the CPU, a flash kernel on a GPU): its
// rate is that of the heads' rows stacked.
void attention_products(Ledger& led, const HardwareProfile& profile, const AttentionWork& w,
                        DType dt, double fw, double bw, const std::string& forward_name,
                        const std::string& backward_name) {
  const int64_t T = w.T, d = w.d, TH = T * w.B * w.Hq;
  const double heads = double(w.B * w.Hq) * w.layers * causal_share(profile, w);
  const auto core = CostCategory::attention;
  led.product(forward_name, core, TH, T, d, heads, dt, T, fw);        // S = Q·Kᵀ
  led.product(forward_name, core, TH, d, T, heads, dt, T, fw);        // O = P·V
  led.product(backward_name, core, TH, T, d, heads, dt, T, bw);       // S again
  led.product(backward_name, core, TH, T, d, heads, dt, T, bw);       // dP = dO·Vᵀ
  led.product(backward_name, core, TH, d, T, 3 * heads, dt, T, bw);  // dV, dQ, dK
}

// The GEMMs of one micro-step over N rows, forward and backward.
void micro_step_gemms(const ModelConfig& c, int64_t N, DType dt, const HardwareProfile& profile,
                      Ledger& led) {
  const int64_t C = c.d_model, Vp = c.padded_vocab();
  const int64_t E = c.n_experts, K = std::min(c.top_k, c.n_experts), F = c.ffn_dim;
  const int64_t Hq = c.n_heads, Hk = c.n_kv_heads, d = c.head_dim;
  const int64_t Dq = c.q_dim(), Dkv = c.kv_dim();
  const double Ld = double(c.n_layers);
  const bool gpu = profile.kind == "gpu";
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
    const char* name = E > 1 ? "expert GEMMs" : "MLP GEMMs (dense)";
    led.linear(name, rows, 2 * F, C, Ld * experts, dt);
    led.linear(name, rows, C, F, Ld * experts, dt);
  }
  led.linear("LM head", N, Vp, C, 1, dt);
}

// The attention core of one micro-step of B sequences of T tokens (a device's share under
// context parallelism): S = Q·Kᵀ, O = P·V forward; S again, dP, dV, dQ, dK backward.
void micro_step_attention(const ModelConfig& c, const StepShape& s,
                          const HardwareProfile& profile, Ledger& led) {
  const int64_t T = s.seq, B = s.micro_batch;
  const int64_t Hq = c.n_heads, Hk = c.n_kv_heads, d = c.head_dim;
  const DType dt = s.precision;
  const bool bf16 = dt == DType::bf16;
  const double Ld = double(c.n_layers);
  // A fused kernel's achieved efficiency (the profile's curve at this sequence length)
  // applies to the forward's two products and the backward's five. Context parallelism splits
  // the work evenly over the cp devices.
  const Efficiency eff = efficiency_at(profile, T, s.attention_kernel);
  const AttentionWork work{B, T, Hq, Hk, d, Ld / double(s.cp)};
  attention_products(led, profile, work, dt, eff.attention_forward, eff.attention_backward,
                     "attention core", "attention core");
  led.count_kernels(2 * Ld);
  const double heads = double(B * Hq) * Ld * causal_share(profile, work) / double(s.cp);
  if (profile.kind != "gpu") {
    // Scores written, read and probabilities written forward (12 B per element), then
    // probabilities, their gradient and the score gradient backward (12 B), fp32; bf16
    // copies of P and dS for the products (2 × 6 B).
    const double per_element = 24 + (bf16 ? 12 : 0);
    led.memory("attention softmax", CostCategory::attention,
               heads * double(T) * double(T) * per_element);
  }
}

// The elementwise traffic and kernels of one micro-step over N rows.
void micro_step_elementwise(const ModelConfig& c, const StepShape& s, int64_t N, Ledger& led) {
  const int64_t C = c.d_model, Vp = c.padded_vocab();
  const int64_t E = c.n_experts, K = std::min(c.top_k, c.n_experts), F = c.ffn_dim;
  const int64_t Dq = c.q_dim(), Dkv = c.kv_dim();
  const bool bf16 = s.precision == DType::bf16;
  const double Ld = double(c.n_layers);
  // Bytes per token (fwd + bwd), fp32 activations.
  // RMSNorm: forward reads x, writes y (2C); backward reads x, dy, writes dx (3C): 5C words.
  // Residual add: 3C forward, 2C backward. RoPE: read + write q and k, forward and backward.
  // SwiGLU per routed token: forward reads gate|up (2F) writes F; backward reads 2F + F,
  // writes 2F: 8F. Dispatch and combine: gather C forward, scatter-add C, the same backward
  // plus the gate gradient's dot product: 6C per routed token.
  // Unfused (eager) kernels replace the norms' and RoPE's counts by their op-by-op bytes.
  // Two per layer, the final norm, and model.qk_norm's over the q and k projections.
  const bool qk_norm = c.qk_norm != QkNorm::none;
  const double norm_elements = Ld * (2 * C + (qk_norm ? double(Dq + Dkv) : 0.0)) + C;
  const double norms_per_layer = qk_norm ? 4 : 2;
  const double rope_elements = Ld * double(Dq + Dkv) * c.rope_fraction;
  double words = 0;
  words += Ld * 2 * 5 * C;                            // two residual adds
  words += Ld * double(K) * (8 * F + 6 * C);          // SwiGLU, dispatch/combine
  words += 3 * double(Vp) + 2 * C;                    // cross-entropy, embedding
  if (s.eager) {
    led.memory(kEagerNormsName, CostCategory::elementwise,
               (norm_elements * kEagerNormBytes + rope_elements * kEagerRopeBytes) * double(N));
    led.count_kernels(Ld * (norms_per_layer * kEagerNormKernels + 2 * kEagerRopeKernels) +
                      kEagerNormKernels);
  } else {
    words += 5 * norm_elements + 4 * rope_elements;   // RMSNorm 5 words, RoPE 4
  }
  if (c.is_zaya()) {
    const int64_t Cc = Dq + Dkv, R = c.router_latent_dim;
    words += Ld * 2 * 12 * C;          // residual scaling: 2 merges of 4 vectors, fwd + bwd
    words += Ld * 10 * double(Cc);     // q-k means, depthwise convolution, biases
    words += Ld * 8 * double(Dq + Dkv);  // QK-norm with temperature
    words += Ld * 6 * double(Dkv / 2);   // value shift
    words +=
        Ld * (12 * double(R) + 3 * double(c.router_classes()));  // router norm, GELUs, EDA, softmax
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
  led.memory(kElementwiseName, CostCategory::elementwise, bytes * double(N));
  // A fused norm is one kernel forward and one backward.
  led.count_kernels(Ld * (c.is_zaya() ? kZayaElementwiseKernelsPerLayer
                                      : kElementwiseKernelsPerLayer + 2 * (norms_per_layer - 2)));
}

// One micro-step (forward + backward over micro_batch·T tokens) into `led`. With context
// parallelism a device holds T / cp rows of each sequence.
void micro_step(const ModelConfig& c, const StepShape& s, const HardwareProfile& profile,
                Ledger& led) {
  const int64_t N = s.micro_batch * s.seq / s.cp;
  micro_step_gemms(c, N, s.precision, profile, led);
  micro_step_attention(c, s, profile, led);
  micro_step_elementwise(c, s, N, led);
}

// Where a step's parameters live: experts spread over ep ranks (and, without expert
// parallelism, split tp ways like the dense weights), everything else tp ways, layers pp
// ways. Each part reduces over its own data-parallel group: dense weights over dp ranks
// strided by tp, experts over devices / (pp · ep · etp) ranks strided by ep · etp.
struct Layout {
  int64_t devices = 1, etp = 1, edp = 1;
  double params = 0;                   // the whole model
  double dense_held = 0, expert_held = 0;  // on one device
};

Layout layout_of(const ModelConfig& c, const StepShape& s) {
  Layout lay;
  const ParamCounts pc = count_parameters(c);
  lay.params = double(pc.total);
  const double experts =
      c.n_experts > 1 ? double(pc.experts_per_layer) * double(c.n_layers) : 0.0;
  lay.devices = s.dp * s.tp * s.pp;
  lay.etp = s.ep > 1 ? 1 : s.tp;
  lay.edp = std::max<int64_t>(1, lay.devices / (s.pp * s.ep * lay.etp));
  lay.dense_held = (lay.params - experts) / double(s.tp * s.pp);
  lay.expert_held = experts / double(s.pp * s.ep * lay.etp);
  return lay;
}

// Muon's matrices: every attention projection and every expert matrix, by shape.
struct MuonMatrices {
  int64_t rows, cols;
  double count;
};
std::vector<MuonMatrices> muon_matrices(const ModelConfig& c) {
  const int64_t C = c.d_model, Dq = c.q_dim(), Dkv = c.kv_dim(), F = c.ffn_dim;
  const double L = double(c.n_layers), E = double(c.n_experts);
  std::vector<MuonMatrices> mats = {{Dq, C, 2 * L}};  // q and o
  if (c.is_zaya()) {
    mats.push_back({Dkv, C, L});
    mats.push_back({Dkv / 2, C, 2 * L});
  } else {
    mats.push_back({Dkv, C, 2 * L});
  }
  mats.push_back({F, C, 3 * L * E});  // w1, w3, w2 (w2 is C × F: same product sizes)
  return mats;
}

// The share of the model's parameters whose optimizer state this device updates.
double optimizer_share(const StepShape& s, const Layout& lay) {
  if (!s.zero1) return (lay.dense_held + lay.expert_held) / lay.params;
  return (lay.dense_held / double(s.dp) + lay.expert_held / double(lay.edp)) / lay.params;
}

// The optimizer step over this rank's share of the parameters.
void optimizer_step(const ModelConfig& c, const StepShape& s, const HardwareProfile& profile,
                    Ledger& led) {
  const ParamCounts pc = count_parameters(c);
  const double P = double(pc.total);
  const double share = optimizer_share(s, layout_of(c, s));
  const bool bf16 = s.precision == DType::bf16;
  const std::vector<MuonMatrices> mats = s.muon ? muon_matrices(c) : std::vector<MuonMatrices>{};
  double muon_params = 0;
  for (const auto& m : mats) muon_params += double(m.rows * m.cols) * m.count;
  const double adam_params = P - muon_params;
  // Per parameter: clip reads the gradient (4 B), the update reads w, g, m, v and writes w,
  // m, v (28 B), the bf16 copy writes 2 B, zeroing the gradient writes 4 B. Muon: momentum
  // read + write, gradient read, weight read + write (20 B), plus the orthogonalization's
  // own passes (normalize, scale: ~16 B) and the same clip, copy and zeroing.
  const double extra = 4 + 4 + (bf16 ? 2 : 0);
  led.memory("optimizer", CostCategory::optimizer,
             share * (adam_params * (28 + extra) + muon_params * (36 + extra)));
  const DType ns = s.muon_bf16 ? DType::bf16 : DType::f32;
  for (const auto& m : mats) {
    const int64_t a = std::min(m.rows, m.cols), b = std::max(m.rows, m.cols);
    const double n = m.count * share * double(s.muon_ns_steps);
    led.product("optimizer (Muon Newton-Schulz)", CostCategory::optimizer, a, a, b, n, ns);  // X·Xᵀ
    led.product("optimizer (Muon Newton-Schulz)", CostCategory::optimizer, a, a, a, n, ns);  // A·A
    led.product("optimizer (Muon Newton-Schulz)", CostCategory::optimizer, a, b, a, n, ns);  // B·X
  }
}

// Expert parallelism: the busiest rank's extra expert rows, as a share of the expert GEMMs.
void add_imbalance(const ModelConfig& c, const StepShape& s, Ledger& led) {
  if (s.ep <= 1 || c.n_experts <= 1) return;
  const double extra = expert_imbalance(c, s) - 1;
  const double experts = led.seconds("expert GEMMs");
  if (extra > 0 && experts > 0)
    led.add("expert load imbalance (busiest expert-parallel rank)", CostCategory::gemm,
            extra * experts, 0, 0);
}

// Activation recomputation: a second forward in the backward. Full: a third of every GEMM
// and elementwise pass, and the attention forward (its 2 products of 7, at the forward's
// efficiency); selective: the elementwise forward passes (about 2/5 of their bytes).
void add_recompute(const StepShape& s, const Efficiency& eff, Ledger& led) {
  if (s.recompute == Recompute::none) return;
  const double elementwise = led.seconds(CostCategory::elementwise);
  double seconds = 0.4 * elementwise;
  if (s.recompute == Recompute::full) {
    const double forward = 2 / eff.attention_forward, backward = 5 / eff.attention_backward;
    const double attention_fwd = led.seconds("attention core") * forward / (forward + backward);
    seconds = led.seconds(CostCategory::gemm) / 3 + elementwise / 3 + attention_fwd;
  }
  led.add(fmt::format("activation recompute ({})", recompute_name(s.recompute)),
          CostCategory::recompute, seconds, 0, 0);
}

bool spans_nodes(const HardwareProfile& profile, int64_t ranks, int64_t stride) {
  return profile.devices_per_node > 1 && ranks > 1 && ranks * stride > profile.devices_per_node;
}

// Collectives inside a micro-step that the next operation waits for (per micro-step, on one
// device of a stage of L/pp layers). Returns the backward's share of those that cross
// nodes (they contend with the gradient reduction).
double add_blocking_comm(const ModelConfig& c, const StepShape& s, const HardwareProfile& profile,
                         Ledger& led) {
  const double layers = double(c.n_layers) / double(s.pp);
  const double act = s.precision == DType::bf16 ? kBf16 : kF32;
  double backward_inter = 0;
  // Context parallelism: k and v of the whole sequences (a tensor-parallel rank's share of
  // the heads), all-gathered per layer forward, their gradients reduce-scattered backward
  // (fp32 activations).
  if (s.cp > 1) {
    const double whole =
        double(s.micro_batch) * double(s.seq) * double(c.kv_dim()) * kF32 / double(s.tp);
    const double count = 2.0 * layers;
    const double sent = count * whole * double(s.cp - 1) / double(s.cp);
    led.add("context-parallel k, v all-gather", CostCategory::comm,
            count * group_collective_s(profile, "all_gather", s.cp, whole, s.tp), 0, sent);
    led.add("context-parallel k, v gradient reduce-scatter", CostCategory::comm,
            count * group_collective_s(profile, "reduce_scatter", s.cp, whole, s.tp), 0, sent);
  }
  // Tensor parallelism with sequence parallelism: before each of a layer's two sublayers an
  // all-gather of its input, after it a reduce-scatter of its output; the backward mirrors
  // them. S = the micro-batch's activations of the whole sequence chunk.
  if (s.tp > 1) {
    const double whole =
        double(s.micro_batch) * double(s.seq / s.cp) * double(c.d_model) * act;
    const double count = 4.0 * layers;
    led.add("tensor-parallel activation all-gathers and reduce-scatters", CostCategory::comm,
            count * (group_collective_s(profile, "all_gather", s.tp, whole, 1) +
                     group_collective_s(profile, "reduce_scatter", s.tp, whole, 1)),
            0, 2 * count * whole * double(s.tp - 1) / double(s.tp));
  }
  // Expert parallelism: per MoE layer the tokens' k copies are dispatched to the experts'
  // ranks and combined back, forward and backward: four all-to-alls of one rank's send
  // buffer (the busiest rank's, under imbalance).
  if (s.ep > 1 && c.n_experts > 1) {
    const double tokens = double(s.micro_batch) * double(s.seq / s.cp) / double(s.tp);
    const int64_t k = std::min(c.top_k, c.n_experts);
    const double dedup = s.dedup_expert_dispatch
                             ? dispatch_dedup_factor(c.n_experts, k, s.ep, profile.devices_per_node)
                             : 1.0;
    const double send =
        tokens * double(k) * double(c.d_model) * act * expert_imbalance(c, s) * dedup;
    const double one = group_collective_s(profile, "all_to_all", s.ep, send, 1);
    led.add(kAllToAllName, CostCategory::comm,
            4 * layers * one, 0, 4 * layers * send * double(s.ep - 1) / double(s.ep));
    if (spans_nodes(profile, s.ep, 1)) backward_inter = 2 * layers * one;
  }
  return backward_inter;
}

// The data-parallel collectives of one step: ZeRO-1's reduce-scatter and all-gather (or one
// all-reduce) of each parameter group over its data-parallel ranks.
struct DataParallelComm {
  double reduce_s = 0, gather_s = 0;
  bool inter_node = false;  // some group leaves the node
};

DataParallelComm add_data_parallel_comm(const StepShape& s, const HardwareProfile& profile,
                                        const Layout& lay, Ledger& led) {
  DataParallelComm dpc;
  const double weight_bytes = s.precision == DType::bf16 ? kBf16 : kF32;
  struct Group { double params; int64_t ranks, stride; };
  std::vector<Group> groups;
  if (s.ep > 1) {
    groups = {{lay.dense_held, s.dp, s.tp}, {lay.expert_held, lay.edp, s.ep * lay.etp}};
  } else {
    groups = {{lay.dense_held + lay.expert_held, s.dp, s.tp}};
  }
  double rs_bytes = 0, ag_bytes = 0;
  for (const Group& g : groups) {
    if (g.ranks <= 1 || g.params <= 0) continue;
    dpc.inter_node = dpc.inter_node || spans_nodes(profile, g.ranks, g.stride);
    if (s.zero1) {
      dpc.reduce_s += group_collective_s(profile, "reduce_scatter", g.ranks, g.params * kF32,
                                         g.stride);
      dpc.gather_s += group_collective_s(profile, "all_gather", g.ranks,
                                         g.params * weight_bytes, g.stride);
      ag_bytes += g.params * weight_bytes;
    } else {
      dpc.reduce_s += group_collective_s(profile, "all_reduce", g.ranks, g.params * kF32,
                                         g.stride);
    }
    rs_bytes += g.params * kF32;
  }
  if (rs_bytes == 0) return dpc;
  if (s.zero1) {
    led.add("gradient reduce-scatter", CostCategory::comm, dpc.reduce_s, 0, rs_bytes);
    led.add("weight all-gather (after the optimizer step)", CostCategory::comm, dpc.gather_s,
            0, ag_bytes);
  } else {
    led.add("gradient all-reduce", CostCategory::comm, dpc.reduce_s, 0, rs_bytes);
  }
  return dpc;
}

// Reading the step's tokens: the pages of the global batch over the storage IOPS budget
// (spec §5), prefetched while the step before runs.
double data_loading_s(const StepShape& s, const HardwareProfile& profile) {
  if (profile.storage_iops_budget <= 0) return 0;
  const int64_t sequences = s.micro_batch * s.accumulation * s.dp / s.cp;
  return data_loading_break_even_s(sequences, s.seq, s.data_bytes_per_token,
                                   profile.storage_page_bytes, profile.storage_iops_budget,
                                   s.data_scatter);
}

// One micro-step of one pipeline stage (L/pp layers) into `led`: compute, the blocking
// collectives, the launches.
struct MicroStep {
  double compute_s = 0;         // GEMMs, attention, elementwise, recompute
  double exposed_comm_s = 0;    // blocking collectives not hidden
  double backward_inter_s = 0;  // the backward's all-to-alls across nodes (contention)
  double total_s = 0;           // what one micro-step of the stage takes
};

MicroStep stage_micro_step(const ModelConfig& c, const StepShape& s,
                           const HardwareProfile& profile, Ledger& led) {
  const Efficiency eff = efficiency_at(profile, s.seq, s.attention_kernel);
  micro_step(c, s, profile, led);
  led.scale(1.0 / double(s.pp));
  add_imbalance(c, s, led);
  add_recompute(s, eff, led);
  MicroStep m;
  m.compute_s = led.seconds(CostCategory::gemm) + led.seconds(CostCategory::attention) +
                led.seconds(CostCategory::elementwise) + led.seconds(CostCategory::recompute);
  m.backward_inter_s = add_blocking_comm(c, s, profile, led);
  m.exposed_comm_s = led.seconds(CostCategory::comm);
  if (s.overlap_expert_comm) {
    const double all_to_all = led.seconds(kAllToAllName);
    m.exposed_comm_s +=
        std::max(0.0, all_to_all - s.comm_overlap * m.compute_s) - all_to_all;
  }
  led.add(kFrameworkName, CostCategory::overhead, led.kernels() * eff.kernel_overhead_s, 0, 0);
  m.total_s = m.compute_s + m.exposed_comm_s + led.seconds(kFrameworkName);
  return m;
}

// The data-parallel collectives into `led`, and the seconds of them exposed: the gradient
// reduction hides behind the last micro-step's backward (where the gradients become final),
// the weight all-gather follows the optimizer step, and a hidden reduction that shares
// inter-node links with the backward's all-to-alls queues with them.
double exposed_data_parallel_s(const StepShape& s, const HardwareProfile& profile,
                               const Layout& lay, const MicroStep& micro, Ledger& led) {
  const DataParallelComm dpc = add_data_parallel_comm(s, profile, lay, led);
  const double reduce_exposed =
      std::max(0.0, dpc.reduce_s - s.comm_overlap * 2.0 / 3.0 * micro.compute_s);
  const double gather_exposed =
      s.overlap_param_gather
          ? std::max(0.0, dpc.gather_s - s.comm_overlap * micro.compute_s / 3.0)
          : dpc.gather_s;
  double contention = 0;
  if (dpc.inter_node && micro.backward_inter_s > 0) {
    contention = std::min(dpc.reduce_s - reduce_exposed, micro.backward_inter_s);
    if (contention > 0)
      led.add("contention (gradient reduction and all-to-alls on shared links)",
              CostCategory::comm, contention, 0, 0);
  }
  return reduce_exposed + gather_exposed + contention;
}

// Pipeline parallelism's point-to-point sends: each micro-batch's activations leave every one
// of a device's vp chunks forward and their gradients come back backward (each tensor-parallel
// rank sends its 1/tp share, sequence parallel). In the steady 1F1B state they run while other
// micro-batches compute (asynchronous sends); in the fill and the drain each of the
// pp · vp − 1 chunk boundaries on the critical path waits for one send. A send is half of a
// two-rank all-gather at the stage stride (tp · dp ranks apart: across nodes once a node is
// full). Returns the exposed seconds.
double add_pipeline_sends(const ModelConfig& c, const StepShape& s,
                          const HardwareProfile& profile, Ledger& led) {
  if (s.pp <= 1) return 0;
  const double act = s.precision == DType::bf16 ? kBf16 : kF32;
  const double bytes = double(s.micro_batch) * double(s.seq / s.cp) * double(c.d_model) * act /
                       double(s.tp);
  const double one = group_collective_s(profile, "all_gather", 2, 2 * bytes, s.tp * s.dp);
  const double exposed = 2.0 * double(s.pp * s.vp - 1) * one;
  const double sent = 2.0 * double(s.vp) * double(s.accumulation) * bytes;
  led.add(kPipelineSendsName, CostCategory::comm, exposed, 0, sent);
  return exposed;
}

// Sums the ledger into the prediction's categories.
void sum_categories(const Ledger& led, StepPrediction& p) {
  p.gemm_s = led.seconds(CostCategory::gemm);
  p.attention_s = led.seconds(CostCategory::attention);
  p.elementwise_s = led.seconds(CostCategory::elementwise);
  p.recompute_s = led.seconds(CostCategory::recompute);
  p.optimizer_s = led.seconds(CostCategory::optimizer);
  p.comm_s = led.seconds(CostCategory::comm);
  p.bubble_s = led.seconds(CostCategory::pipeline);
  p.overhead_s = led.seconds(kFrameworkName);
  p.imbalance_s = led.seconds("expert load imbalance (busiest expert-parallel rank)");
  p.compute_s = p.gemm_s + p.attention_s + p.elementwise_s + p.recompute_s + p.optimizer_s;
}

}  // namespace

double expert_imbalance(const ModelConfig& c, const StepShape& s) {
  if (s.ep <= 1 || c.n_experts <= 1) return 1.0;
  if (s.expert_imbalance > 0) return std::max(1.0, s.expert_imbalance);
  const double routed = double(s.micro_batch) * double(s.seq / s.cp) / double(s.tp) *
                        double(std::min(c.top_k, c.n_experts));
  return binomial_imbalance(routed, s.ep);
}

double dispatch_dedup_factor(int64_t experts, int64_t top_k, int64_t ep, int64_t per_node) {
  if (per_node <= 1 || ep <= per_node || top_k <= 0) return 1.0;
  const int64_t nodes = (ep + per_node - 1) / per_node;
  const double local = double(ep) / double(nodes);
  const double per_node_experts = double(experts) / double(nodes);
  double miss = 1;  // a given other node holds none of the token's k experts
  for (int64_t i = 0; i < top_k; ++i)
    miss *= std::max(0.0, (double(experts) - per_node_experts - double(i)) /
                              (double(experts) - double(i)));
  const double dedup = double(nodes - 1) * (1 - miss);
  const double plain = double(top_k) * (double(ep) - local) / double(ep);
  return plain > 0 ? std::min(1.0, dedup / plain) : 1.0;
}

double binomial_imbalance(double routed, int64_t ranks) {
  if (ranks <= 1 || routed <= 0) return 1.0;
  const double r = double(ranks);
  return 1.0 + std::sqrt(2.0 * std::log(r) * (1.0 - 1.0 / r) / routed);
}

double group_collective_s(const HardwareProfile& profile, const std::string& op, int64_t ranks,
                          double bytes, int64_t stride) {
  if (ranks <= 1) return 0;
  const int64_t per_node = profile.devices_per_node;
  if (!spans_nodes(profile, ranks, stride)) return profile.collective_time(op, ranks, bytes);
  const CollectiveFit* inter = nullptr;  // the fit at the most ranks beyond one node
  for (const auto& f : profile.collectives)
    if (f.op == op && f.ranks > per_node && f.scope != "intra-node" &&
        (inter == nullptr || f.ranks > inter->ranks))
      inter = &f;
  if (inter == nullptr) return profile.collective_time(op, ranks, bytes);
  const CollectiveFit& intra = profile.collective(op, per_node);
  const double ring = inter->alpha_s * double(ranks - 1) / double(inter->ranks - 1);
  const double alpha = std::max(ring, intra.alpha_s);
  if (op == "all_to_all") {
    // Each rank sends S/ranks to every peer: the share for peers on other nodes leaves
    // through the NIC (the inter-node fit's bus bandwidth, about one NIC's), the share for
    // peers on its own node crosses the intra-node links at the same time.
    const int64_t local = std::clamp<int64_t>(per_node / std::max<int64_t>(stride, 1), 1, ranks);
    const double remote = bytes * double(ranks - local) / double(ranks);
    const double near = bytes * double(local - 1) / double(ranks);
    return alpha + std::max(remote / (inter->beta_bytes_per_s * busbw_factor(op, inter->ranks)),
                            near / (intra.beta_bytes_per_s * busbw_factor(op, intra.ranks)));
  }
  const double share = double(std::min(std::max<int64_t>(stride, 1), per_node));
  const double busbw = inter->beta_bytes_per_s * busbw_factor(op, inter->ranks) / share;
  const double algbw = busbw / busbw_factor(op, ranks);
  return alpha + bytes / algbw;
}

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
  // Optimizer state per parameter it covers. One process: AdamW's two moments of the tensors
  // it updates and, with Muon, Muon's momentum of its matrices (8 or 4 bytes each). ZeRO-1
  // over several ranks
  // (docs/zero1.md, "Memory per rank"): the reduced gradient shard (4), AdamW's moments of
  // the elements AdamW updates (8) and Muon's momentum of its matrices (4).
  const double P = double(count_parameters(config).total);
  double optimizer_per_param = double(m.optimizer_bytes) / P;
  if (s.zero1 && s.dp > 1) {
    double muon = 0;
    if (s.muon)
      for (const auto& mat : muon_matrices(config)) muon += double(mat.rows * mat.cols) * mat.count;
    optimizer_per_param = 4 + (8 * (P - muon) + 4 * muon) / P;
  }
  // On a CPU the asynchronous checkpoint's snapshot (the weights and the optimizer's state a
  // device saves, copied) takes the same memory; a GPU's goes to host memory.
  const bool snapshot = profile.kind != "gpu";
  const double state_per_param = optimizer_per_param - (s.zero1 && s.dp > 1 ? 4 : 0);
  if (s.tp == 1 && s.pp == 1 && s.ep == 1) {
    const double shards = s.zero1 ? double(s.dp) : 1.0;
    const int64_t optimizer = int64_t(std::ceil(optimizer_per_param * P / shards));
    const int64_t copied =
        snapshot ? int64_t(std::ceil((double(m.weights_fp32_bytes) + state_per_param * P) / shards))
                 : 0;
    return m.weights_fp32_bytes + m.weights_bf16_bytes + m.grads_bytes + optimizer + activations +
           copied;
  }
  // Model parallel: a device holds its part of the weights and gradients, its share of the
  // optimizer state, and 1/tp of the activations (1F1B keeps pp micro-batches of L/pp
  // layers in flight on the first stage: a whole model's worth).
  const Layout lay = layout_of(config, s);
  const double held = (lay.dense_held + lay.expert_held) / lay.params;
  const double states = double(m.weights_fp32_bytes + m.weights_bf16_bytes + m.grads_bytes);
  const double optimizer = optimizer_share(s, lay) * optimizer_per_param * P;
  const double copied =
      snapshot ? held * double(m.weights_fp32_bytes) + optimizer_share(s, lay) * state_per_param * P
               : 0.0;
  return int64_t(held * states + optimizer + double(activations) / double(s.tp) + copied);
}

AttentionCoreSeconds attention_core_seconds(const HardwareProfile& profile, int64_t batch,
                                            int64_t seq, int64_t heads, int64_t kv_heads,
                                            int64_t head_dim, DType dtype) {
  Ledger led(profile);
  attention_products(led, profile, {batch, seq, heads, kv_heads, head_dim, 1.0}, dtype, 1.0, 1.0,
                     "forward", "backward");
  return {led.seconds("forward"), led.seconds("backward"), led.flops("forward"),
          led.flops("backward")};
}

StepPrediction predict_step(const ModelConfig& config, const StepShape& s,
                            const HardwareProfile& profile) {
  FOUNDRY_CHECK(s.seq > 0 && s.micro_batch > 0 && s.accumulation > 0 && s.dp > 0 && s.cp > 0);
  FOUNDRY_CHECK(s.tp > 0 && s.pp > 0 && s.vp > 0 && s.ep > 0);
  Ledger led(profile, s.tp);
  const MicroStep micro = stage_micro_step(config, s, profile, led);
  led.scale(double(s.accumulation));
  // Pipeline fill and drain: (pp − 1)/vp micro-steps of a stage.
  if (s.pp > 1)
    led.add("pipeline bubble (1F1B fill and drain)", CostCategory::pipeline,
            double(s.pp - 1) / double(s.vp) * micro.total_s, 0, 0);
  led.set_split(1);
  optimizer_step(config, s, profile, led);
  const double data_parallel_exposed =
      exposed_data_parallel_s(s, profile, layout_of(config, s), micro, led);
  const double pipeline_sends_exposed = add_pipeline_sends(config, s, profile, led);

  StepPrediction p;
  sum_categories(led, p);
  p.comm_exposed_s = micro.exposed_comm_s * double(s.accumulation) + data_parallel_exposed +
                     pipeline_sends_exposed;
  const double busy = p.compute_s + p.comm_exposed_s + p.bubble_s + p.overhead_s;
  p.data_s = data_loading_s(s, profile);
  p.data_exposed_s = std::max(0.0, p.data_s - busy);
  if (p.data_s > 0)
    led.add("data loading (prefetched during the step)", CostCategory::overhead, p.data_s, 0, 0);
  p.step_s = busy + p.data_exposed_s;
  p.tokens_per_step =
      double(s.micro_batch * s.seq * s.accumulation) / double(s.cp) / double(s.tp * s.pp);
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
// routing, residuals) on a CPU: oneDNN's execute, OpenMP fork and join. Measured on the
// development machine (docs/PERFORMANCE.md, "Decode latency") from a model small enough
// that its weights stay in cache and its steps are nothing but calls. A GPU profile states
// its own per-kernel cost (efficiency.kernel_overhead_s).
constexpr double kDecodeCallOverheadS = 8e-6;

// The cores of a CPU profile's device (at least 1).
double cpu_cores(const HardwareProfile& profile) {
  return std::max(1.0, profile.raw.value("device", json::object()).value("cores", 1.0));
}

double decode_call_s(const HardwareProfile& profile) {
  return profile.kind == "gpu" ? efficiency_at(profile, 1, "").kernel_overhead_s
                               : kDecodeCallOverheadS;
}

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

// Foundry's decode attention on a CPU (ops::attention_decode over its blocked transposed key
// cache): per KV head, cached position and head dim, the key and value rows read; per query
// head sharing it, the FMAs of its score and weighted sum and its softmax. One core, caches
// resident (BM_AttentionDecode, batch 1, 256 positions, head_dim 64, 8 query heads, medians
// of 5: 23.4 µs with 8 KV heads, 21.1 µs with 1; docs/PERFORMANCE.md, "Decode attention over
// a blocked transposed key cache"): 0.020 ns per KV-head element, 0.158 ns per query-head one.
constexpr double kCpuDecodeKvElementS = 0.020e-9, kCpuDecodeQueryElementS = 0.158e-9;

// One decode GEMM y [m, n] = x [m, k] · Wᵀ: its FLOPs at the profile's rate for the shape,
// which the roofline caps by the operands' bytes (at small m, the weights' n·k), plus the
// fixed cost of a call; on a CPU profile, oneDNN's small-m behaviour above. m may be
// fractional (an expert's expected rows); it runs as ⌈m⌉. `calls` = 0 for one GEMM of a
// grouped launch (GPU MoE kernels), whose one call the caller counts.
double decode_gemm_s(const HardwareProfile& profile, DType dt, double m, int64_t n, int64_t k,
                     double calls = 1) {
  const int64_t rows = std::max<int64_t>(1, int64_t(std::ceil(m - 1e-9)));
  const double flops = 2.0 * double(rows) * double(n) * double(k);
  const double call = calls * decode_call_s(profile);
  if (profile.kind == "gpu") return flops / profile.gemm_rate(dt, rows, n, k) + call;
  // A CPU profile with decode points (bench gemm's decode sweep: cold weights, whole calls,
  // their fixed cost included).
  const double measured = profile.decode_gemm_rate(dt, rows, n, k);
  if (measured > 0) return flops / measured;
  const double in = dt == DType::bf16 ? kBf16 : kF32;
  const double bytes = (double(rows) * double(k) + double(k) * double(n)) * in +
                       double(rows) * double(n) * kF32;
  const double memory_s = bytes / profile.memory_bandwidth();
  if (rows == 1) return memory_s + double(n) * kCpuGemvRowS / cpu_cores(profile) + call;
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
    // The CCA's grouped convolution of the new row: one fp32 matmul batched over the
    // groups, the FLOPs and weights of a [B, d·t1] × [d·t1, Dq + Dkv] product.
    const int64_t conv_k = c.head_dim * c.cca_kernel_grouped;
    return decode_gemm_s(p, dt, batch, Dq + Dkv, C) + decode_gemm_s(p, dt, batch, Dkv, C) +
           decode_gemm_s(p, dt, batch, C, Dq) + decode_gemm_s(p, dt, batch, R, C) +
           2 * decode_gemm_s(p, dt, batch, R, R) + decode_gemm_s(p, DType::f32, batch, S, R) +
           decode_gemm_s(p, DType::f32, batch, Dq + Dkv, conv_k);
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
  if (grouped) r.expert_s += L * 2 * decode_call_s(profile);
  // Every sequence's keys and values of every cached position, read once per step: fp32, as
  // Foundry's decode caches them on the CPU and on a GPU.
  r.kv_cache_bytes = 2.0 * kF32 * double(c.kv_dim()) * L * double(context) * B;
  r.attention_flops = 4.0 * B * double(c.n_heads) * double(context) * double(c.head_dim) * L;
  r.attention_s = r.kv_cache_bytes / profile.memory_bandwidth();
  if (profile.kind != "gpu") {
    // Plus the kernel's arithmetic: it reads a KV head's block, then computes on it, with
    // little overlap between the two (BM_AttentionDecode, batch 64, two threads: the sum falls
    // inside the measured spread, the longer of the two below it). Its threads split the
    // sequences' KV heads, so fewer of those than cores leave cores idle.
    const double per_head = B * L * double(context) * double(c.head_dim);
    const double arithmetic = per_head * (double(c.n_kv_heads) * kCpuDecodeKvElementS +
                                          double(c.n_heads) * kCpuDecodeQueryElementS);
    const double threads = std::min(cpu_cores(profile), B * double(c.n_kv_heads));
    r.attention_s += arithmetic / threads;
  }
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
