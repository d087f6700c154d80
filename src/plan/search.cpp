#include "plan/search.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "base/format.h"
#include "model/info.h"

namespace foundry {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string shape_name(const ModelConfig& c) {
  return fmt::format("C={} L={} heads={}/{}x{} E={} k={} F={}", c.d_model, c.n_layers, c.n_heads,
                     c.n_kv_heads, c.head_dim, c.n_experts, c.top_k, c.ffn_dim);
}

// Non-expert and per-expert parameters of one layer (a layer other than the first).
struct LayerCounts {
  double non_expert = 0, per_expert_per_f = 0, extras = 0;
};

LayerCounts layer_counts(ModelConfig c) {
  c.n_layers = 2;
  c.ffn_dim = 64;
  const ParamCounts a = count_parameters(c);
  LayerCounts lc;
  lc.per_expert_per_f = double(a.per_expert) / 64.0;  // 3·C
  lc.non_expert = double(a.per_layer - a.experts_per_layer);
  // What does not scale with L: final norm, input scales, and layer 0's missing EDA weight.
  lc.extras = double(a.non_embedding) - 2.0 * double(a.per_layer);
  return lc;
}

bool aligned(int64_t x, int64_t multiple) { return x % multiple == 0; }

}  // namespace

int64_t fit_micro_batch(const ModelConfig& config, StepShape shape, int64_t per_device,
                        int64_t limit, const HardwareProfile& profile) {
  for (int64_t mb = per_device; mb >= 1; --mb) {
    if (per_device % mb != 0) continue;
    shape.micro_batch = mb;
    shape.accumulation = per_device / mb;
    if (limit <= 0 || predict_memory(config, shape, profile) <= limit) return mb;
  }
  return 0;
}

Candidate evaluate_shape(const ModelConfig& cc, const PlanRequest& rq,
                         const HardwareProfile& profile, int64_t memory_limit) {
  const int64_t hidden_multiple = profile.kind == "gpu" ? 128 : 64;
  const int64_t per_device = rq.global_batch / rq.devices;
  const int64_t C = cc.d_model, d = cc.head_dim, L = cc.n_layers;
  Candidate cand;
  cand.config = cc;
  const ParamCounts pc = count_parameters(cc);
  cand.total_params = double(pc.non_embedding);
  cand.active_params = double(pc.active_non_embedding);
  cand.off_size = !aligned(C, hidden_multiple) || !aligned(d, 64);
  auto off = [&](double have, double want) {
    return want > 0 && std::abs(have / want - 1) > rq.tolerance;
  };
  StepShape s;
  s.seq = rq.seq;
  s.dp = rq.devices;
  s.precision = rq.precision;
  s.muon = rq.muon;
  s.comm_overlap = rq.comm_overlap;
  s.eager = rq.eager;
  s.attention_kernel = rq.attention_kernel;
  const bool budget_ok =
      !off(cand.total_params, rq.total_params) && !off(cand.active_params, rq.active_params);
  const int64_t mb =
      budget_ok || rq.evaluate_all ? fit_micro_batch(cc, s, per_device, memory_limit, profile) : 0;
  if (!budget_ok) {
    cand.reject = "budget not met after rounding";
    cand.detail = fmt::format("total {} / active {}", format_count(cand.total_params),
                              format_count(cand.active_params));
    if (!rq.evaluate_all) return cand;
  }
  s.micro_batch = mb > 0 ? mb : 1;
  s.accumulation = per_device / s.micro_batch;
  cand.shape = s;
  cand.prediction = predict_step(cc, s, profile);
  cand.cluster_tokens_per_s = cand.prediction.tokens_per_s * double(rq.devices);
  cand.decode_latency_s = predict_decode_latency(
      cc, rq.decode_batch, rq.decode_context > 0 ? rq.decode_context : rq.seq, profile);
  if (!cand.reject.empty()) return cand;
  const double aspect = double(C) / double(L);
  if (mb == 0) {
    cand.reject = "memory per device";
    cand.detail = fmt::format("needs {} at micro-batch 1, the device has {}",
                              format_bytes(double(cand.prediction.memory_bytes), ByteUnit::GiB, 1),
                              format_bytes(double(memory_limit), ByteUnit::GiB, 1));
  } else if (aspect < rq.aspect_min || aspect > rq.aspect_max) {
    cand.reject = "aspect ratio";
    cand.detail = fmt::format("d_model/n_layers = {:.0f}, outside {:.0f}..{:.0f}", aspect,
                              rq.aspect_min, rq.aspect_max);
  } else if (!aligned(C, hidden_multiple)) {
    cand.reject = fmt::format("hidden size not a multiple of {}", hidden_multiple);
  } else if (!aligned(d, 64)) {
    cand.reject = "head dim not a multiple of 64";
  }
  return cand;
}

namespace {

// Clear errors naming the flag, before any work.
void check_request(const PlanRequest& rq) {
  if (rq.total_params <= 0 && rq.active_params <= 0)
    fail("plan needs a budget: --total-params and/or --active-params",
         "e.g. --total-params 8.3e9 --active-params 0.76e9 (without embeddings)");
  if (rq.total_params > 0 && rq.active_params > rq.total_params)
    fail(fmt::format("--active-params {:.4g} exceeds --total-params {:.4g}", rq.active_params,
                     rq.total_params),
         "active parameters are a subset of all parameters");
  if (rq.devices < 1)
    fail(fmt::format("--devices {} must be >= 1", rq.devices), "pass the number of devices");
  if (rq.seq < 1) fail(fmt::format("--seq {} must be >= 1", rq.seq), "e.g. --seq 4096");
  if (rq.global_batch < rq.devices || rq.global_batch % rq.devices != 0)
    fail(fmt::format("--global-batch {} sequences cannot be split evenly over --devices {}",
                     rq.global_batch, rq.devices),
         "make the global batch a multiple of the device count");
  if (!(rq.tolerance > 0 && rq.tolerance < 1))  // NaN too
    fail(fmt::format("--tolerance {} must be in (0, 1)", rq.tolerance),
         "it is the relative slack on each budget, e.g. --tolerance 0.05");
  if (rq.aspect_min <= 0 || rq.aspect_min > rq.aspect_max)
    fail(fmt::format("--aspect-ratio {}..{} is empty", rq.aspect_min, rq.aspect_max),
         "give min,max with 0 < min <= max, e.g. 20,200");
}

int64_t hidden_multiple_of(const HardwareProfile& profile) {
  return profile.kind == "gpu" ? 128 : 64;
}

// The hidden sizes to try: the request's, or multiples of 256 with off-size probes (2000
// beside 2048, and so on) that show what misalignment costs.
std::vector<int64_t> hidden_sizes(const PlanRequest& rq) {
  std::vector<int64_t> hidden = rq.hidden;
  if (hidden.empty())
    for (int64_t c = 256; c <= 16384; c += 256) hidden.push_back(c);
  std::vector<int64_t> probes;
  for (int64_t c : hidden) {
    probes.push_back(c);
    if (rq.hidden.empty() && c >= 1024 && c % 1024 == 0) probes.push_back(c - 48);
  }
  return probes;
}

// The shape's attention and MoE width, before its depth and expert width are chosen.
ModelConfig width_config(const PlanRequest& rq, Arch arch, int64_t C, int64_t d, int64_t Hq,
                         int64_t kv_ratio, int64_t E, int64_t k) {
  ModelConfig c = rq.base;
  c.arch = arch;
  c.vocab_size = rq.vocab;
  c.d_model = C;
  c.n_heads = Hq;
  c.n_kv_heads = Hq / kv_ratio;
  c.head_dim = d;
  c.n_experts = E;
  c.top_k = k;
  c.max_seq_len = std::max(c.max_seq_len, rq.seq);
  if (arch == Arch::zaya1) {
    c.router_latent_dim = rq.router_latent;
    c.norm_topk_prob = false;
    c.aux_loss_coef = 0;
    if (c.rope_fraction == 1.0) c.rope_fraction = 0.5;
  }
  return c;
}

// Candidate (layers, expert width) pairs that meet the budget with the width of `c`, sorted,
// without repeats. With both budgets the total/active ratio fixes F and the active budget L
// (each rounded both ways); with one, every L in the aspect range and the F it leaves.
std::vector<std::pair<int64_t, double>> depth_width_pairs(const PlanRequest& rq,
                                                          const ModelConfig& c,
                                                          int64_t ffn_multiple) {
  const int64_t C = c.d_model, E = c.n_experts, k = c.top_k;
  const LayerCounts lc = layer_counts(c);
  const double A = lc.non_expert, perF = lc.per_expert_per_f;
  std::vector<std::pair<int64_t, double>> lf;
  const int64_t lmin = std::max<int64_t>(1, int64_t(std::ceil(C / rq.aspect_max / 2)));
  const int64_t lmax = std::max<int64_t>(lmin, int64_t(std::floor(C / rq.aspect_min * 2)));
  if (rq.total_params > 0 && rq.active_params > 0) {
    const double r = rq.total_params / rq.active_params;
    if (double(E) <= r * double(k)) return lf;  // cannot reach the ratio
    const double F = A * (r - 1) / (perF * (double(E) - r * double(k)));
    const double m = double(ffn_multiple);
    for (double Fi : {std::floor(F / m) * m, std::ceil(F / m) * m}) {
      if (Fi < m) continue;
      const double L = rq.active_params / (A + double(k) * perF * Fi);
      for (int64_t Li : {int64_t(std::floor(L)), int64_t(std::ceil(L))})
        if (Li >= 1) lf.push_back({Li, Fi});
    }
  } else {
    const double budget = rq.active_params > 0 ? rq.active_params : rq.total_params;
    const double experts_counted = double(rq.active_params > 0 ? k : E);
    for (int64_t L = lmin; L <= lmax; ++L) {
      const double per_layer = budget / double(L);
      lf.push_back({L, (per_layer - A) / (perF * experts_counted)});
    }
  }
  std::sort(lf.begin(), lf.end());
  lf.erase(std::unique(lf.begin(), lf.end()), lf.end());
  return lf;
}

// Every shape of the search space, evaluated (accepted or with the rule it broke).
std::vector<Candidate> evaluate_all_shapes(const PlanRequest& rq, const HardwareProfile& profile,
                                           int64_t memory_limit) {
  const Arch arch = parse_arch(rq.arch, "--arch");
  const int64_t ffn_multiple = rq.ffn_multiple > 0 ? rq.ffn_multiple : hidden_multiple_of(profile);
  std::vector<Candidate> all;
  for (int64_t C : hidden_sizes(rq))
    for (int64_t d : rq.head_dims) {
      const int64_t ratio = arch == Arch::zaya1 ? rq.cca_compression : 1;
      const int64_t Hq = std::max<int64_t>(1, (C + ratio * d / 2) / (ratio * d));
      for (int64_t kvr : rq.kv_ratios) {
        if (Hq % kvr != 0) continue;
        for (int64_t E : rq.experts)
          for (int64_t k : rq.top_ks) {
            if (k >= E) continue;
            const ModelConfig c = width_config(rq, arch, C, d, Hq, kvr, E, k);
            if (c.rotary_dim() % 2 != 0) continue;
            for (auto [L, Fraw] : depth_width_pairs(rq, c, ffn_multiple)) {
              if (Fraw < ffn_multiple / 2.0) continue;
              ModelConfig cc = c;
              cc.n_layers = L;
              cc.ffn_dim = std::max<int64_t>(
                  ffn_multiple, int64_t(std::llround(Fraw / double(ffn_multiple))) * ffn_multiple);
              all.push_back(evaluate_shape(cc, rq, profile, memory_limit));
            }
          }
      }
    }
  return all;
}

// The accepted shapes, by cluster throughput, best first (fails when there are none).
std::vector<Candidate> rank_accepted(const std::vector<Candidate>& all, const PlanRequest& rq,
                                     const HardwareProfile& profile) {
  std::vector<Candidate> ranked;
  for (const auto& c : all)
    if (c.reject.empty()) ranked.push_back(c);
  std::stable_sort(ranked.begin(), ranked.end(), [](const Candidate& a, const Candidate& b) {
    return a.cluster_tokens_per_s > b.cluster_tokens_per_s;
  });
  if (ranked.empty())
    fail(fmt::format("no shape meets the budget within {:.0f}% on {} ({} shapes evaluated)",
                     rq.tolerance * 100, profile.name, all.size()),
         "loosen --tolerance or --aspect-ratio, add memory (--memory-per-device) or devices, or "
         "change the budget");
  return ranked;
}

// The aligned shape nearest an off-size probe `ex` (same everything, hidden size or head dim
// rounded), the fastest if several; null when the search has none.
const Candidate* aligned_twin(const std::vector<Candidate>& all, const Candidate& ex,
                              int64_t hidden_multiple) {
  const Candidate* twin = nullptr;
  for (const auto& c : all) {
    if (!c.reject.empty() && c.reject.find("multiple") == std::string::npos) continue;
    if (c.off_size || c.prediction.step_s <= 0) continue;
    const ModelConfig &a = c.config, &b = ex.config;
    const bool same_rest = a.n_experts == b.n_experts && a.top_k == b.top_k &&
                           a.n_heads / a.n_kv_heads == b.n_heads / b.n_kv_heads;
    const bool hidden_twin = a.d_model % hidden_multiple == 0 &&
                             std::llabs(a.d_model - b.d_model) < hidden_multiple &&
                             a.head_dim == b.head_dim;
    const bool head_twin = a.d_model == b.d_model && b.head_dim % 64 != 0 &&
                           a.head_dim % 64 == 0 && std::llabs(a.head_dim - b.head_dim) <= 32;
    if (same_rest && (hidden_twin || head_twin) &&
        (!twin || c.cluster_tokens_per_s > twin->cluster_tokens_per_s))
      twin = &c;
  }
  return twin;
}

// What rule `r` cost: its example against its aligned twin (an off-size probe) or the best.
void explain_rejection(RejectedExample& r, const std::vector<Candidate>& all,
                       const Candidate& best, const PlanRequest& rq,
                       const HardwareProfile& profile) {
  const Candidate& ex = r.example;
  if (ex.prediction.step_s <= 0) {
    r.explanation = ex.detail;
    return;
  }
  const int64_t hidden_multiple = hidden_multiple_of(profile);
  const Candidate* twin = ex.off_size ? aligned_twin(all, ex, hidden_multiple) : nullptr;
  const Candidate& ref = twin ? *twin : best;
  r.loss = 1.0 - ex.cluster_tokens_per_s / ref.cluster_tokens_per_s;
  if (!ex.off_size) {
    r.explanation = fmt::format("{}: {}; would be {:.1f}% {} than the best shape",
                                shape_name(ex.config), ex.detail, 100 * std::abs(r.loss),
                                r.loss >= 0 ? "slower" : "faster");
    return;
  }
  const bool hidden_off = ex.config.d_model % hidden_multiple != 0;
  const double fa = hidden_off ? profile.alignment_factor(ex.config.d_model, ex.config.d_model)
                               : profile.alignment_factor(rq.seq, ex.config.head_dim);
  const std::string what =
      hidden_off ? fmt::format("GEMMs with d_model = {} as an inner dimension", ex.config.d_model)
                 : fmt::format("the attention products over head_dim = {}", ex.config.head_dim);
  r.explanation = fmt::format(
      "{}: {:.1f}% {} throughput than {} ({}); {} run at {:.0f}% of the "
      "aligned rate on this profile",
      shape_name(ex.config), 100 * std::abs(r.loss), r.loss >= 0 ? "less" : "more",
      twin ? "its aligned twin" : "the best shape", shape_name(ref.config), what, 100 * fa);
}

// Rejections, one row per rule, with the best shape each rule turned away.
std::vector<RejectedExample> rejections(const std::vector<Candidate>& all, const Candidate& best,
                                        const PlanRequest& rq, const HardwareProfile& profile) {
  std::map<std::string, RejectedExample> by_rule;
  for (const auto& c : all) {
    if (c.reject.empty()) continue;
    auto& r = by_rule[c.reject];
    r.rule = c.reject;
    ++r.count;
    const bool better = r.count == 1 || (c.cluster_tokens_per_s > r.example.cluster_tokens_per_s);
    if (better && c.prediction.step_s > 0) r.example = c;
    else if (r.count == 1) r.example = c;
  }
  std::vector<RejectedExample> rows;
  for (auto& [rule, r] : by_rule) {
    explain_rejection(r, all, best, rq, profile);
    rows.push_back(r);
  }
  return rows;
}

// MoE widths: the best shape of each (E, k), then the Pareto front of throughput (higher is
// better) against decode latency (lower is better).
std::vector<ParetoPoint> moe_widths(const std::vector<Candidate>& ranked) {
  std::map<std::pair<int64_t, int64_t>, Candidate> best_of;
  for (const auto& c : ranked) {
    auto key = std::make_pair(c.config.n_experts, c.config.top_k);
    if (!best_of.count(key)) best_of[key] = c;  // ranked: the first is the best
  }
  std::vector<ParetoPoint> widths;
  for (const auto& [key, c] : best_of) widths.push_back({key.first, key.second, c, false});
  for (auto& p : widths) {
    p.on_front = true;
    for (const auto& q : widths) {
      const bool dominates = q.best.cluster_tokens_per_s >= p.best.cluster_tokens_per_s &&
                             q.best.decode_latency_s <= p.best.decode_latency_s &&
                             (q.best.cluster_tokens_per_s > p.best.cluster_tokens_per_s ||
                              q.best.decode_latency_s < p.best.decode_latency_s);
      if (dominates) p.on_front = false;
    }
  }
  return widths;
}

// Vocabulary padding: the LM head's rate with the padded against the raw vocabulary.
std::string vocabulary_note(const Candidate& best, const PlanRequest& rq,
                            const HardwareProfile& profile) {
  const ModelConfig& bc = best.config;
  if (bc.vocab_size == bc.padded_vocab())
    return fmt::format("vocabulary {} is a multiple of 128: no padding needed for the LM head",
                       bc.vocab_size);
  const int64_t N = best.shape.micro_batch * rq.seq;
  const double padded = profile.gemm_rate(rq.precision, N, bc.padded_vocab(), bc.d_model);
  const double raw = profile.gemm_rate(rq.precision, N, bc.vocab_size, bc.d_model);
  return fmt::format("vocabulary {} padded to {} (a multiple of 128): LM head GEMM at {:.0f} "
                     "against {:.0f} GFLOP/s unpadded ({:+.1f}%)",
                     bc.vocab_size, bc.padded_vocab(), padded / 1e9, raw / 1e9,
                     100 * (padded / raw - 1));
}

}  // namespace

PlanResult plan_search(const PlanRequest& rq, const HardwareProfile& profile) {
  parse_arch(rq.arch, "--arch");
  check_request(rq);
  const int64_t memory_limit =
      rq.memory_per_device > 0 ? rq.memory_per_device : profile.memory_bytes;
  PlanResult result;
  result.request = rq;
  const std::vector<Candidate> all = evaluate_all_shapes(rq, profile, memory_limit);
  result.evaluated = int64_t(all.size());
  result.ranked = rank_accepted(all, rq, profile);
  const Candidate& best = result.ranked.front();
  for (const auto& [label, config] : rq.compare) {
    PlanRequest all_rq = rq;
    all_rq.evaluate_all = true;
    result.compared.push_back({label, evaluate_shape(config, all_rq, profile, memory_limit)});
  }
  result.rejected = rejections(all, best, rq, profile);
  result.widths = moe_widths(result.ranked);

  // Data loading at the best shape's step time (the paper's storage analysis).
  result.iops_budget = profile.storage_iops_budget;
  result.iops = data_loading_iops(rq.global_batch, rq.seq, rq.bytes_per_token,
                                  profile.storage_page_bytes, best.prediction.step_s, rq.scatter);
  if (profile.storage_iops_budget > 0)
    result.break_even_s = data_loading_break_even_s(rq.global_batch, rq.seq, rq.bytes_per_token,
                                                    profile.storage_page_bytes,
                                                    profile.storage_iops_budget, rq.scatter);
  result.vocab_note = vocabulary_note(best, rq, profile);
  return result;
}

// Why one shape is slower than another: per-token time by category and GEMM efficiency.
std::string compare_breakdown(const Candidate& c, const Candidate& best) {
  auto per_token = [](const Candidate& x, double seconds) {
    return seconds / x.prediction.tokens_per_step;
  };
  auto gemm_eff = [](const Candidate& x) {
    double flops = 0;
    for (const auto& it : x.prediction.items)
      if (it.category == CostCategory::gemm) flops += it.flops;
    return x.prediction.gemm_s > 0 ? flops / x.prediction.gemm_s : 0.0;
  };
  const struct {
    const char* name;
    double a, b;
  } rows[] = {
      {"GEMMs", per_token(c, c.prediction.gemm_s), per_token(best, best.prediction.gemm_s)},
      {"attention", per_token(c, c.prediction.attention_s),
       per_token(best, best.prediction.attention_s)},
      {"elementwise", per_token(c, c.prediction.elementwise_s),
       per_token(best, best.prediction.elementwise_s)},
      {"optimizer", per_token(c, c.prediction.optimizer_s),
       per_token(best, best.prediction.optimizer_s)},
      {"exposed communication", per_token(c, c.prediction.comm_exposed_s),
       per_token(best, best.prediction.comm_exposed_s)},
      {"framework overhead", per_token(c, c.prediction.overhead_s),
       per_token(best, best.prediction.overhead_s)},
  };
  const double total = per_token(best, best.prediction.step_s);
  std::string out = "  why (time per token against the best shape, as a share of its step):";
  for (const auto& row : rows)
    if (std::abs(row.a - row.b) > 1e-4 * total)
      out += fmt::format(" {} {:+.1f}%;", row.name, 100 * (row.a - row.b) / total);
  out += fmt::format(
      " GEMMs average {:.0f} against {:.0f} TFLOP/s (more, smaller matrices: d_model {} "
      "against {}, {} against {} layers)\n",
      gemm_eff(c) / 1e12, gemm_eff(best) / 1e12, c.config.d_model, best.config.d_model,
      c.config.n_layers, best.config.n_layers);
  return out;
}

namespace {

std::string format_plan_request(const PlanResult& r, const HardwareProfile& profile) {
  const PlanRequest& q = r.request;
  std::string out;
  out += fmt::format("profile: {} ({})\n", profile.name, profile.path);
  out += fmt::format(
      "budget: total {} / active {} parameters without embeddings (±{:.0f}%), "
      "arch {}, vocabulary {}\n",
      q.total_params > 0 ? format_count(q.total_params) : "free",
      q.active_params > 0 ? format_count(q.active_params) : "free", 100 * q.tolerance, q.arch,
      q.vocab);
  const int64_t memory = q.memory_per_device > 0 ? q.memory_per_device : profile.memory_bytes;
  out +=
      fmt::format("run: {} devices, global batch {} × {} tokens, {}, {}, memory {}\n", q.devices,
                  q.global_batch, q.seq, dtype_name(q.precision), q.muon ? "Muon + AdamW" : "AdamW",
                  memory > 0 ? format_bytes(double(memory)) + " per device"
                             : std::string("per device unknown (no shape is turned away "
                                           "for it)"));
  out += fmt::format("{} shapes evaluated, {} accepted\n\n", r.evaluated, r.ranked.size());
  return out;
}

// The table of the `top` best shapes, how many are near the best, and the best one's step.
std::string format_ranked(const PlanResult& r, int top) {
  const PlanRequest& q = r.request;
  std::string out = "Ranked by predicted training throughput (decode latency: batch " +
                    std::to_string(q.decode_batch) + ", context " +
                    std::to_string(q.decode_context > 0 ? q.decode_context : q.seq) + "):\n";
  out +=
      fmt::format("{:>3}  {:<52} {:>9} {:>9} {:>9} {:>12} {:>6} {:>9} {:>8} {:>9}\n", "#", "shape",
                  "total", "active", "step s", "tokens/s", "MFU", "mem GiB", "micro", "decode ms");
  const int n = std::min<int>(top, int(r.ranked.size()));
  for (int i = 0; i < n; ++i) {
    const Candidate& c = r.ranked[size_t(i)];
    out += fmt::format(
        "{:>3}  {:<52} {:>9} {:>9} {:>9.3f} {:>12.4g} {:>5.1f}% {:>9.1f} {:>4}x{:<3} {:>9.2f}\n",
        i + 1, shape_name(c.config), format_count(c.total_params), format_count(c.active_params),
        c.prediction.step_s, c.cluster_tokens_per_s, 100 * c.prediction.mfu_measured,
        double(c.prediction.memory_bytes) / kGiB, c.shape.micro_batch, c.shape.accumulation,
        1e3 * c.decode_latency_s);
  }
  const Candidate& b = r.ranked.front();
  int64_t within = 0;
  for (const auto& c : r.ranked) within += c.cluster_tokens_per_s >= 0.9 * b.cluster_tokens_per_s;
  out += fmt::format("({} of the {} accepted shapes are within 10% of the best)\n", within,
                     r.ranked.size());
  out += fmt::format(
      "\nBest shape, step breakdown (s): GEMMs {:.4f}, attention {:.4f}, elementwise {:.4f}, "
      "optimizer {:.4f}, communication {:.4f} ({:.4f} exposed), framework overhead "
      "{:.4f}, data loading {:.4f} ({:.4f} exposed)\n",
      b.prediction.gemm_s, b.prediction.attention_s, b.prediction.elementwise_s,
      b.prediction.optimizer_s, b.prediction.comm_s, b.prediction.comm_exposed_s,
      b.prediction.overhead_s, b.prediction.data_s, b.prediction.data_exposed_s);
  if (q.tokens > 0)
    out += fmt::format("Training {} tokens: {:.1f} days at the predicted rate\n",
                       format_count(q.tokens), q.tokens / b.cluster_tokens_per_s / 86400);
  return out;
}

// The shapes the user asked to compare (--compare), each against the best.
std::string format_compared(const PlanResult& r) {
  const Candidate& b = r.ranked.front();
  std::string out;
  for (const auto& [label, c] : r.compared) {
    const double rel = c.cluster_tokens_per_s / b.cluster_tokens_per_s;
    int rank = 1;
    for (const auto& x : r.ranked)
      if (x.cluster_tokens_per_s > c.cluster_tokens_per_s) ++rank;
    out += fmt::format("\n{}: {}, total {} / active {}{}\n", label, shape_name(c.config),
                       format_count(c.total_params), format_count(c.active_params),
                       c.reject.empty() ? "" : " (" + c.reject + ")");
    out += fmt::format(
        "  predicted {:.4g} tokens/s = {:.1f}% of the best shape's ({:+.1f}%), rank {} of {} "
        "accepted; step {:.3f} s, MFU {:.1f}%, {} per device, decode {:.2f} ms against {:.2f} "
        "ms\n",
        c.cluster_tokens_per_s, 100 * rel, 100 * (rel - 1), rank, r.ranked.size() + 1,
        c.prediction.step_s, 100 * c.prediction.mfu_measured,
        format_bytes(double(c.prediction.memory_bytes), ByteUnit::GiB, 1), 1e3 * c.decode_latency_s,
        1e3 * b.decode_latency_s);
    out += compare_breakdown(c, b);
  }
  return out;
}

// The MoE widths' Pareto front, the rejection rules and the data loading's IOPS.
std::string format_widths_rejects_and_data(const PlanResult& r) {
  const PlanRequest& q = r.request;
  const Candidate& b = r.ranked.front();
  std::string out =
      "\nMoE widths (best shape per expert count and top-k): throughput against decode latency\n";
  out += fmt::format("{:>5} {:>4} {:>7} {:>12} {:>10}  {}\n", "E", "k", "F", "tokens/s",
                     "decode ms", "Pareto front");
  for (const auto& p : r.widths)
    out += fmt::format("{:>5} {:>4} {:>7} {:>12.4g} {:>10.2f}  {}\n", p.experts, p.top_k,
                       p.best.config.ffn_dim, p.best.cluster_tokens_per_s,
                       1e3 * p.best.decode_latency_s, p.on_front ? "yes" : "");

  out += "\nRejected shapes (one example per rule, the best it turned away):\n";
  for (const auto& x : r.rejected)
    out += fmt::format("  {} ({} shapes): {}\n", x.rule, x.count, x.explanation);

  out += fmt::format("\nData loading at the best step time ({:.3f} s), σ = {}: {:.0f} IOPS",
                     b.prediction.step_s, q.scatter, r.iops);
  if (r.iops_budget > 0)
    out += fmt::format(" of a {:.0f} IOPS budget; break-even step time {:.3f} s", r.iops_budget,
                       r.break_even_s);
  out += "\n" + r.vocab_note + "\n";
  return out;
}

}  // namespace

std::string format_plan(const PlanResult& r, const HardwareProfile& profile, int top) {
  return format_plan_request(r, profile) + format_ranked(r, top) + format_compared(r) +
         format_widths_rejects_and_data(r);
}

json plan_to_json(const PlanResult& r, int top) {
  auto cand = [](const Candidate& c) {
    json j = {{"model", to_json(c.config)},
              {"total_params", c.total_params},
              {"active_params", c.active_params},
              {"micro_batch", c.shape.micro_batch},
              {"accumulation", c.shape.accumulation},
              {"step_s", c.prediction.step_s},
              {"tokens_per_s_per_device", c.prediction.tokens_per_s},
              {"cluster_tokens_per_s", c.cluster_tokens_per_s},
              {"mfu_measured", c.prediction.mfu_measured},
              {"mfu_spec", c.prediction.mfu_spec},
              {"memory_bytes", c.prediction.memory_bytes},
              {"decode_latency_s", c.decode_latency_s},
              {"breakdown_s",
               {{"gemm", c.prediction.gemm_s},
                {"attention", c.prediction.attention_s},
                {"elementwise", c.prediction.elementwise_s},
                {"optimizer", c.prediction.optimizer_s},
                {"comm", c.prediction.comm_s},
                {"comm_exposed", c.prediction.comm_exposed_s},
                {"framework_overhead", c.prediction.overhead_s},
                {"data", c.prediction.data_s},
                {"data_exposed", c.prediction.data_exposed_s}}}};
    if (!c.reject.empty()) j["reject"] = c.reject;
    return j;
  };
  json j;
  j["evaluated"] = r.evaluated;
  j["ranked"] = json::array();
  for (size_t i = 0; i < r.ranked.size() && int(i) < top; ++i)
    j["ranked"].push_back(cand(r.ranked[i]));
  j["rejected"] = json::array();
  for (const auto& x : r.rejected)
    j["rejected"].push_back({{"rule", x.rule}, {"count", x.count}, {"loss", x.loss},
                             {"explanation", x.explanation}, {"example", cand(x.example)}});
  j["moe_widths"] = json::array();
  for (const auto& p : r.widths)
    j["moe_widths"].push_back({{"experts", p.experts}, {"top_k", p.top_k}, {"on_front", p.on_front},
                               {"best", cand(p.best)}});
  j["data_loading"] = {{"iops", r.iops},
                       {"iops_budget", r.iops_budget},
                       {"break_even_s", r.break_even_s},
                       {"scatter", r.request.scatter}};
  j["vocabulary"] = r.vocab_note;
  return j;
}

json plan_run_config(const Candidate& chosen, const PlanRequest& q) {
  // train.batch_size is the global batch: foundry train splits it over the ranks and runs each
  // rank's share in micro-batches of train.micro_batch_size (the shape's, which fits).
  json train = {{"batch_size", q.global_batch},
                {"seq_len", q.seq},
                {"precision", dtype_name(q.precision)},
                {"optimizer", optimizer_name(q.muon ? OptimizerKind::muon : OptimizerKind::adamw)}};
  if (chosen.shape.accumulation > 1) train["micro_batch_size"] = chosen.shape.micro_batch;
  if (q.tokens > 0)
    // Enough steps for the tokens (rounded up, as plan --config counts them).
    train["steps"] =
        std::max<int64_t>(1, int64_t(std::ceil(q.tokens / double(q.global_batch * q.seq))));
  return {{"model", to_json(chosen.config)}, {"train", train}, {"data", {{"dir", ""}}}};
}

}  // namespace foundry
