#include "bench/decode_bench.h"

#include <algorithm>
#include <cstdlib>
#include <ctime>
#include <sstream>

#include <fmt/format.h>

#include "base/error.h"
#include "base/rng.h"
#include "base/timer.h"
#include "model/info.h"
#include "model/model.h"

namespace foundry {

std::string MoeWidth::label() const {
  return fmt::format("{}x{} top-{}", experts, ffn_dim, top_k);
}

std::vector<MoeWidth> parse_widths(const std::string& flag, const std::string& text) {
  const std::string hint =
      fmt::format("give EXPERTSxFFNxTOPK items, comma-separated, e.g. {} 8x1024x2,16x512x4", flag);
  std::vector<MoeWidth> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    int64_t v[3] = {0, 0, 0};
    size_t start = 0;
    for (int i = 0; i < 3; ++i) {
      const size_t end = i < 2 ? item.find('x', start) : item.size();
      const std::string part = end == std::string::npos ? "" : item.substr(start, end - start);
      char* stop = nullptr;
      const long long n = part.empty() ? 0 : std::strtoll(part.c_str(), &stop, 10);
      if (part.empty() || *stop != '\0' || n < 1)
        fail(fmt::format("{} '{}': '{}' is not EXPERTSxFFNxTOPK of positive integers", flag,
                         text, item),
             hint);
      v[i] = n;
      start = end + 1;
    }
    if (v[2] > v[0])
      fail(fmt::format("{} '{}': top-k {} exceeds {} experts", flag, text, v[2], v[0]), hint);
    out.push_back({v[0], v[1], v[2]});
  }
  if (out.empty()) fail(fmt::format("{} is empty", flag), hint);
  return out;
}

std::vector<MoeWidth> finer_widths(const ModelConfig& c, int64_t count) {
  std::vector<MoeWidth> out = {{c.n_experts, c.ffn_dim, c.top_k}};
  for (int64_t f = 2; static_cast<int64_t>(out.size()) < count; f *= 2) {
    const MoeWidth w{c.n_experts * f, c.ffn_dim / f, c.top_k * f};
    if (c.ffn_dim % f != 0 || w.ffn_dim % 64 != 0 || w.top_k > w.experts) break;
    out.push_back(w);
  }
  return out;
}

ModelConfig with_width(const ModelConfig& config, const MoeWidth& width) {
  ModelConfig c = config;
  c.n_experts = width.experts;
  c.ffn_dim = width.ffn_dim;
  c.top_k = width.top_k;
  return c;
}

namespace {

// The positions a decode state must hold: the cached context, then every step run.
int64_t positions(const DecodeBenchOptions& o) { return o.context + o.warmup + o.steps; }

std::vector<MoeWidth> widths_of(const DecodeBenchOptions& o) {
  return o.widths.empty() ? std::vector<MoeWidth>{{o.model.n_experts, o.model.ffn_dim,
                                                   o.model.top_k}}
                          : o.widths;
}

// The model of one width, with room for every position.
ModelConfig bench_config(const DecodeBenchOptions& o, const MoeWidth& w) {
  ModelConfig c = with_width(o.model, w);
  c.max_seq_len = std::max(c.max_seq_len, positions(o));
  return c;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// CPU time of this process, all threads (seconds).
double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

struct StepTimes {
  std::vector<double> wall, cpu;  // per timed step
};

// One batch size on one model: the wall and CPU times of the timed steps.
StepTimes time_steps(Model& model, const DecodeBenchOptions& o, int64_t batch, Rng& rng) {
  Model::DecodeState state = model.new_decode_state(positions(o), batch);
  state.pos = o.context;  // the caches hold `context` positions already (see decode_bench.h)
  std::vector<int32_t> tokens(batch);
  StepTimes times;
  auto step = [&] {
    for (int32_t& t : tokens) t = static_cast<int32_t>(rng.below(model.config().vocab_size));
    const double start = now_seconds(), cpu_start = cpu_seconds();
    model.decode_step(state, tokens.data());
    times.cpu.push_back(cpu_seconds() - cpu_start);
    return now_seconds() - start;
  };
  // Warm-up: `warmup` steps, then more (at the same position) until warmup_s has passed.
  const double warm_start = now_seconds();
  for (int64_t i = 0; i < o.warmup; ++i) step();
  while (now_seconds() - warm_start < o.warmup_s) {
    step();
    --state.pos;
  }
  times.cpu.clear();
  for (int64_t i = 0; i < o.steps; ++i) times.wall.push_back(step());
  return times;
}

}  // namespace

void validate(const DecodeBenchOptions& o) {
  if (o.batches.empty()) fail("--batches is empty", "give batch sizes, e.g. --batches 1,4,16,64");
  for (int64_t b : o.batches)
    if (b < 1) fail(fmt::format("--batches {}: batch sizes must be >= 1", b));
  if (o.context < 0) fail(fmt::format("--context {}: must be >= 0", o.context));
  if (o.warmup < 0) fail(fmt::format("--warmup {}: must be >= 0", o.warmup));
  if (!(o.warmup_s >= 0 && o.warmup_s <= 600))
    fail(fmt::format("--warmup-seconds {}: must be between 0 and 600", o.warmup_s));
  if (o.steps < 1) fail(fmt::format("--steps {}: must be >= 1", o.steps));
  for (const MoeWidth& w : widths_of(o)) {
    if (w.experts < 1 || w.ffn_dim < 1 || w.top_k < 1 || w.top_k > w.experts)
      fail(fmt::format("--widths: {} is not a width (experts, ffn_dim, top_k >= 1, top_k <= "
                       "experts)",
                       w.label()));
    bench_config(o, w).validate("--widths " + w.label());
  }
}

int64_t decode_bench_bytes(const DecodeBenchOptions& o) {
  int64_t most = 0;
  const int64_t batch = *std::max_element(o.batches.begin(), o.batches.end());
  for (const MoeWidth& w : widths_of(o)) {
    const ModelConfig c = bench_config(o, w);
    const int64_t params = count_parameters(c).total;
    // fp32 parameters, bf16 copies (a model for inference: no gradients), and the decode
    // state.
    most = std::max(most, params * (4 + 2) + decode_state_bytes(c, positions(o), batch));
  }
  return most;
}

DecodeBenchResult run_decode_bench(const DecodeBenchOptions& o) {
  validate(o);
  DecodeBenchResult r;
  r.arch = arch_name(o.model.arch);
  if (o.backend) r.device = o.backend->name();
  r.context = o.context;
  r.warmup = o.warmup;
  r.steps = o.steps;
  r.precision = o.precision;
  if (getloadavg(r.load_average, 3) < 0) r.load_average[0] = -1;
  const std::vector<MoeWidth> widths = widths_of(o);
  const int64_t total = static_cast<int64_t>(widths.size() * o.batches.size());
  Rng rng(o.seed);
  for (const MoeWidth& w : widths) {
    const ModelConfig c = bench_config(o, w);
    const ParamCounts counts = count_parameters(c);
    Model model(c, o.precision, o.backend ? *o.backend : cpu_backend(), ModelUse::inference);
    model.init_weights(o.seed);
    for (int64_t batch : o.batches) {
      const StepTimes t = time_steps(model, o, batch, rng);
      const std::vector<double>& s = t.wall;
      DecodePoint p;
      p.width = w;
      p.batch = batch;
      p.total_params = counts.non_embedding;
      p.active_params = counts.active_non_embedding;
      p.median_s = median(s);
      p.min_s = *std::min_element(s.begin(), s.end());
      p.max_s = *std::max_element(s.begin(), s.end());
      p.tokens_per_s = double(batch) / p.median_s;
      p.median_cpu_s = median(t.cpu);
      r.points.push_back(p);
      if (o.on_progress)
        o.on_progress(static_cast<int64_t>(r.points.size()), total,
                      fmt::format("{} batch {}", w.label(), batch));
    }
  }
  return r;
}

std::string format_decode_table(const DecodeBenchResult& r) {
  bool predicted = false;
  for (const DecodePoint& p : r.points) predicted = predicted || p.predicted_s > 0;
  std::string out = fmt::format(
      "decode, arch {}, {} weights, {} cached positions, median of {} steps after {} "
      "warm-up\n\n",
      r.arch, dtype_name(r.precision), r.context, r.steps, r.warmup);
  out += "| width | batch | params (total / active) | ms/step | CPU ms/step | tokens/s |";
  out += predicted ? " predicted ms | error |\n" : "\n";
  out += "| --- | ---: | ---: | ---: | ---: | ---: |";
  out += predicted ? " ---: | ---: |\n" : "\n";
  for (const DecodePoint& p : r.points) {
    out += fmt::format("| {} | {} | {:.1f}M / {:.1f}M | {:.3f} | {:.3f} | {:.0f} |",
                       p.width.label(), p.batch, p.total_params / 1e6, p.active_params / 1e6,
                       1e3 * p.median_s, 1e3 * p.median_cpu_s, p.tokens_per_s);
    if (predicted)
      out += p.predicted_s > 0
                 ? fmt::format(" {:.3f} | {:+.0f}% |", 1e3 * p.predicted_s,
                               100 * (p.median_s - p.predicted_s) / p.predicted_s)
                 : " - | - |";
    out += "\n";
  }
  return out;
}

nlohmann::json decode_bench_json(const DecodeBenchResult& r, const Provenance& provenance) {
  nlohmann::json rows = nlohmann::json::array();
  for (const DecodePoint& p : r.points) {
    nlohmann::json row = {{"experts", p.width.experts},
                          {"ffn_dim", p.width.ffn_dim},
                          {"top_k", p.width.top_k},
                          {"batch", p.batch},
                          {"total_params", p.total_params},
                          {"active_params", p.active_params},
                          {"median_ms", 1e3 * p.median_s},
                          {"min_ms", 1e3 * p.min_s},
                          {"max_ms", 1e3 * p.max_s},
                          {"median_cpu_ms", 1e3 * p.median_cpu_s},
                          {"tokens_per_s", p.tokens_per_s}};
    if (p.predicted_s > 0) {
      row["predicted_ms"] = 1e3 * p.predicted_s;
      row["error"] = (p.median_s - p.predicted_s) / p.predicted_s;
    }
    rows.push_back(row);
  }
  return {{"arch", r.arch},
          {"device", r.device},
          {"precision", dtype_name(r.precision)},
          {"context", r.context},
          {"warmup", r.warmup},
          {"steps", r.steps},
          {"load_average_before", {r.load_average[0], r.load_average[1], r.load_average[2]}},
          {"rows", rows},
          {"provenance", to_json(provenance)}};
}

KvCacheSizes kv_cache_sizes(const ModelConfig& c) {
  KvCacheSizes s;
  s.per_token = 2 * c.kv_dim();
  s.mha_same_heads = 2 * c.q_dim();
  s.mha_full_width = 2 * c.d_model;
  s.gqa_same_kv_heads = 2 * c.kv_dim();
  if (c.is_zaya())
    s.cca_state_per_sequence =
        (c.q_dim() + c.kv_dim()) * (c.cca_kernel_depthwise - 1 + c.cca_kernel_grouped - 1) +
        c.kv_dim() / 2;
  return s;
}

std::string format_kv_cache_sizes(const ModelConfig& c) {
  const KvCacheSizes s = kv_cache_sizes(c);
  const std::string self = c.is_zaya() ? "CCA" : "this attention";
  auto row = [&](const std::string& name, int64_t values) {
    return fmt::format("| {} | {} | {} | {} | {:.1f}x |\n", name, values, 2 * values,
                       4 * values, double(values) / double(s.per_token));
  };
  std::string out = fmt::format(
      "KV cache per token per layer (d_model {}, {} query heads, {} KV heads of {})\n\n"
      "| attention | values | bf16 bytes | fp32 bytes | vs {} |\n| --- | ---: | ---: | ---: | "
      "---: |\n",
      c.d_model, c.n_heads, c.n_kv_heads, c.head_dim, self);
  out += row(self + " (K and V of the KV heads)", s.per_token);
  out += row(fmt::format("MHA, {} heads of {} (full width)", c.d_model / c.head_dim, c.head_dim),
             s.mha_full_width);
  out += row(fmt::format("MHA, {} heads of {} (same query heads)", c.n_heads, c.head_dim),
             s.mha_same_heads);
  out += row(fmt::format("GQA, {} KV heads of {}", c.n_kv_heads, c.head_dim), s.gqa_same_kv_heads);
  if (s.cca_state_per_sequence > 0)
    out += fmt::format("\nCCA also keeps {} values per sequence and layer (convolution windows "
                       "and the delayed value half), whatever the context length.\n",
                       s.cca_state_per_sequence);
  return out;
}

}  // namespace foundry
