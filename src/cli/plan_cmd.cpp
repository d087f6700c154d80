// foundry plan: size a model to a hardware profile. Two modes:
//   foundry plan --profile P --total-params ... --active-params ...   search shapes
//   foundry plan --profile P --config run.json                        predict one config
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "base/error.h"
#include "base/format.h"
#include "base/io.h"
#include "bench/profile.h"
#include "cli/commands.h"
#include "model/info.h"
#include "plan/goodput.h"
#include "plan/search.h"
#include "train/run_config.h"

namespace foundry::cli {

namespace {

struct PlanOptions {
  std::string profile = "";
  std::string config_path;
  std::vector<std::string> overrides;
  std::string total = "0", active = "0", tokens = "0", memory = "0";
  int64_t seq = 0, global_batch = 0, devices = 1, vocab = 0;
  int64_t micro_batch = 0;  // --config: 0 = train.micro_batch_size, as train runs it
  int64_t cp = 0;           // 0 = train.context_parallel
  std::string arch = "zaya1", precision = "bf16", optimizer = "muon";
  double tolerance = 0.05, overlap = 1.0, scatter = 1.0;
  std::string aspect = "20,200";
  std::string hidden, head_dims, experts, top_ks, kv_ratios;
  int64_t decode_batch = 32;
  // Model-parallel layout and what the step repeats or waits for (--config).
  int64_t tp = 1, pp = 1, vp = 1;
  int64_t ep = 0;  // 0 = train.expert_parallel
  double expert_imbalance = 0;
  std::string recompute = "none";
  bool overlap_param_gather = false, overlap_expert_comm = false, dedup_dispatch = false;
  bool eager = false;            // unfused elementwise kernels
  std::string attention_kernel;  // a curve of the profile's efficiency.attention_kernels
  // Goodput: a negative value means "derive the default".
  double failure_rate = 1.97e-5;  // per device-hour: Llama 3 (docs/anchors.md)
  double checkpoint_stall = -1, checkpoint_write = -1, restart = -1, checkpoint_interval = 0;
  int top = 10;
  std::string out;
  std::vector<std::string> compare;
  bool json = false;
};

// "8.3e9", "8.3B", "760M", "192GiB", "64K": a non-negative number with an optional suffix.
double parse_amount(const std::string& flag, const std::string& text) {
  static const std::vector<std::pair<std::string, double>> suffixes = {
      {"GiB", 1024.0 * 1024 * 1024}, {"MiB", 1024.0 * 1024}, {"KiB", 1024.0}, {"GB", 1e9},
      {"MB", 1e6}, {"T", 1e12}, {"B", 1e9}, {"G", 1e9}, {"M", 1e6}, {"K", 1e3}};
  std::string num = text;
  double scale = 1;
  for (const auto& [s, f] : suffixes) {
    if (num.size() > s.size() && num.compare(num.size() - s.size(), s.size(), s) == 0) {
      num.resize(num.size() - s.size());
      scale = f;
      break;
    }
  }
  size_t used = 0;
  double v = -1;
  try {
    v = std::stod(num, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != num.size() || !(v >= 0) || !std::isfinite(v))
    fail(fmt::format("{} '{}' is not a non-negative number", flag, text),
         "write e.g. 8.3e9, 8.3B, 760M (parameters) or 192GiB, 192e9 (bytes)");
  return v * scale;
}

std::vector<int64_t> parse_list(const std::string& flag, const std::string& text) {
  std::vector<int64_t> out;
  if (text.empty()) return out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    const size_t length = comma == std::string::npos ? std::string::npos : comma - start;
    const std::string item = text.substr(start, length);
    const double v = parse_amount(flag, item);
    if (v < 1 || v != double(int64_t(v)))
      fail(fmt::format("{} '{}': '{}' is not a positive integer", flag, text, item),
           "give a comma-separated list, e.g. 64,128");
    out.push_back(int64_t(v));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

void print_prediction(const RunConfig& rc, const StepShape& s, const StepPrediction& p,
                      const HardwareProfile& profile, const std::string& config_path) {
  std::printf("profile: %s (%s)\nconfig: %s\n", profile.name.c_str(), profile.path.c_str(),
              config_path.c_str());
  std::printf(
      "step: %lld sequences x %lld tokens per device (micro-batch %lld x %lld), "
      "%lld data-parallel rank(s)%s, %s, %s\n",
      (long long)(s.micro_batch * s.accumulation), (long long)s.seq, (long long)s.micro_batch,
      (long long)s.accumulation, (long long)s.dp,
      s.dp > 1 ? (s.zero1 ? " (ZeRO-1)" : " (replicated optimizer state)") : "",
      dtype_name(s.precision), s.muon ? "Muon + AdamW" : "AdamW");
  if (s.cp > 1)
    std::printf("context parallel %lld: each device holds %lld of every sequence's %lld tokens\n",
                (long long)s.cp, (long long)(s.seq / s.cp), (long long)s.seq);
  if (s.tp > 1 || s.pp > 1 || s.ep > 1)
    std::printf("model parallel: tp %lld, pp %lld (vp %lld), ep %lld; %lld devices\n",
                (long long)s.tp, (long long)s.pp, (long long)s.vp, (long long)s.ep,
                (long long)(s.dp * s.tp * s.pp));
  if (s.recompute != Recompute::none)
    std::printf("activation recompute: %s\n", recompute_name(s.recompute));
  if (s.eager || !s.attention_kernel.empty())
    std::printf("kernels: %s elementwise, attention %s\n", s.eager ? "unfused (eager)" : "fused",
                s.attention_kernel.empty() ? "the profile's best" : s.attention_kernel.c_str());
  // Shares are of the step. The data-parallel exchanges hide behind backward and the next
  // forward (the all-to-alls behind another micro-batch with --overlap-expert-comm), data
  // loading behind the step: theirs are the exposed parts, in rows of their own. Context,
  // tensor and expert parallelism's exchanges otherwise block and count in full (the shares
  // then add up to 100%).
  std::printf("\n%-62s %10s %10s %12s\n", "operation", "ms", "share", "GFLOP");
  const auto overlapped = [&](const PredictionItem& it) {
    return it.name == "gradient reduce-scatter" || it.name == "gradient all-reduce" ||
           it.name.starts_with("weight all-gather") || it.name.starts_with("data loading") ||
           (s.overlap_expert_comm && it.name.starts_with("expert-parallel dispatch"));
  };
  double blocking_comm = 0, overlapped_comm = 0;
  for (const auto& it : p.items) {
    if (overlapped(it)) {
      if (it.category == CostCategory::comm) overlapped_comm += it.seconds;
      std::printf("%-62s %10.2f %10s %12.2f\n", it.name.c_str(), 1e3 * it.seconds, "(overlaps)",
                  it.flops / 1e9);
      continue;
    }
    if (it.category == CostCategory::comm) blocking_comm += it.seconds;
    std::printf("%-62s %10.2f %9.1f%% %12.2f\n", it.name.c_str(), 1e3 * it.seconds,
                100 * it.seconds / p.step_s, it.flops / 1e9);
  }
  const double dp_exposed = std::max(0.0, p.comm_exposed_s - blocking_comm);
  for (const auto& [what, exposed, total] :
       {std::tuple<const char*, double, double>{"overlapped communication, exposed", dp_exposed,
                                                overlapped_comm},
        {"data loading, exposed", p.data_exposed_s, p.data_s}})
    if (total > 0)
      std::printf("%-62s %10.2f %9.1f%% %12s\n", what, 1e3 * exposed, 100 * exposed / p.step_s, "");
  std::printf("\npredicted step time: %.2f ms (GEMMs %.2f, attention %.2f, elementwise %.2f, "
              "recompute %.2f, optimizer %.2f, communication exposed %.2f of %.2f, "
              "pipeline bubble %.2f, framework overhead %.2f, data loading exposed %.2f of "
              "%.2f)\n",
              1e3 * p.step_s, 1e3 * p.gemm_s, 1e3 * p.attention_s, 1e3 * p.elementwise_s,
              1e3 * p.recompute_s, 1e3 * p.optimizer_s, 1e3 * p.comm_exposed_s, 1e3 * p.comm_s,
              1e3 * p.bubble_s, 1e3 * p.overhead_s, 1e3 * p.data_exposed_s, 1e3 * p.data_s);
  std::printf("predicted tokens/s per device: %.0f   MFU: %.1f%% of the best measured GEMM rate",
              p.tokens_per_s, 100 * p.mfu_measured);
  if (p.mfu_spec > 0) std::printf(", %.1f%% of spec peak", 100 * p.mfu_spec);
  std::printf("\nmemory per device: %s\n", format_bytes(double(p.memory_bytes)).c_str());
  (void)rc;
}

// The model-parallel flags into `s`, checked against the device count and the model; `ep`
// (the flag or the config's train.expert_parallel) is named `ep_name` in errors.
void apply_layout(const PlanOptions& o, int64_t ep, const std::string& ep_name,
                  const ModelConfig& model, StepShape& s) {
  const int64_t stage = o.tp * o.pp;
  if (o.devices % stage != 0)
    fail(fmt::format("--tp {} x --pp {} = {} does not divide --devices {}", o.tp, o.pp, stage,
                     o.devices),
         "devices = data-parallel ranks x tp x pp: pick tp and pp that divide the device count");
  if ((o.devices / o.pp) % ep != 0)
    fail(fmt::format("{} {} does not divide the {} devices of a pipeline stage", ep_name, ep,
                     o.devices / o.pp),
         "expert-parallel ranks must divide --devices / --pp");
  if (ep > 1 && ep > model.n_experts)
    fail(fmt::format("{} {} is more than model.n_experts = {}", ep_name, ep, model.n_experts),
         "each expert-parallel rank holds at least one expert");
  if (o.vp > 1 && o.pp == 1)
    fail(fmt::format("--vp {} needs --pp > 1", o.vp), "virtual stages interleave a pipeline");
  if (o.expert_imbalance != 0 && !(o.expert_imbalance >= 1))
    fail(fmt::format("--expert-imbalance {} must be >= 1 (busiest rank's tokens / mean)",
                     o.expert_imbalance),
         "leave it out for balanced (binomial) routing, or give e.g. 1.2");
  s.tp = o.tp;
  s.pp = o.pp;
  s.vp = o.vp;
  s.ep = ep;
  s.dp = o.devices / stage;
  s.expert_imbalance = o.expert_imbalance;
  s.recompute = o.recompute == "full"        ? Recompute::full
                : o.recompute == "selective" ? Recompute::selective
                                             : Recompute::none;
  s.overlap_param_gather = o.overlap_param_gather;
  s.overlap_expert_comm = o.overlap_expert_comm;
  s.dedup_expert_dispatch = o.dedup_dispatch;
  s.data_scatter = o.scatter;
  s.eager = o.eager;
  s.attention_kernel = o.attention_kernel;
}

// Goodput for a run of `devices` with this step: the flags, or defaults derived from the
// checkpoint's size (goodput_defaults).
std::pair<GoodputInputs, GoodputPrediction> plan_goodput(const PlanOptions& o,
                                                         const ModelConfig& model,
                                                         const StepShape& s,
                                                         const HardwareProfile& profile,
                                                         double step_s) {
  if (!(o.failure_rate >= 0) || !std::isfinite(o.failure_rate))
    fail(fmt::format("--failure-rate {} must be a finite number >= 0", o.failure_rate),
         "failures per device-hour, e.g. 1.97e-5 (Llama 3's, the default)");
  if (!(o.checkpoint_interval >= 0))
    fail(fmt::format("--checkpoint-interval {} must be >= 0", o.checkpoint_interval),
         "seconds between checkpoints; 0 = the best interval (Daly)");
  const double bytes = double(checkpoint_bytes(model, s.muon));
  GoodputInputs in = goodput_defaults(bytes, o.devices, profile.kind == "gpu");
  in.failures_per_device_hour = o.failure_rate;
  if (o.checkpoint_stall >= 0) in.checkpoint_stall_s = o.checkpoint_stall;
  if (o.checkpoint_write >= 0) in.checkpoint_write_s = o.checkpoint_write;
  if (o.restart >= 0) in.restart_s = o.restart;
  // A run saves between steps: a given interval is a whole number of steps, at least one.
  in.interval_s = o.checkpoint_interval > 0
                      ? std::max(1.0, std::round(o.checkpoint_interval / step_s)) * step_s
                      : 0.0;
  if (in.interval_s > 0 && in.interval_s < in.checkpoint_write_s)
    fmt::print(stderr,
               "warning: --checkpoint-interval {} s ({:.3g} s in whole steps) is shorter than a "
               "checkpoint's write ({:.2f} s): each save would wait for the one before "
               "(train.checkpoint_overlap); the best interval (leave the option out) is never "
               "below the write\n",
               o.checkpoint_interval, in.interval_s, in.checkpoint_write_s);
  return {in, predict_goodput(in)};
}

void print_goodput(const GoodputInputs& in, const GoodputPrediction& g, double step_s) {
  std::printf("\ngoodput: %lld devices x %.3g failures per device-hour", (long long)in.devices,
              in.failures_per_device_hour);
  if (!std::isfinite(g.mtbf_s)) {
    std::printf(": no failures, goodput 100%%\n");
    return;
  }
  std::printf(" -> job MTBF %.1f h\n", g.mtbf_s / 3600);
  std::printf("  checkpoint stall %.3f s, write %.2f s, restart %.2f s\n", in.checkpoint_stall_s,
              in.checkpoint_write_s, in.restart_s);
  std::printf("  interval: Young %.1f s, Daly %.1f s; evaluated %.1f s (every %.0f steps)\n",
              g.young_s, g.daly_s, g.interval_s, std::max(1.0, std::round(g.interval_s / step_s)));
  std::printf("  lost per failure %.1f s; predicted goodput %.2f%%\n", g.lost_per_failure_s,
              100 * g.goodput);
}

json goodput_json(const GoodputInputs& in, const GoodputPrediction& g, double step_s) {
  const bool failures = std::isfinite(g.mtbf_s);
  return {{"devices", in.devices}, {"failures_per_device_hour", in.failures_per_device_hour},
          {"mtbf_s", failures ? json(g.mtbf_s) : json(nullptr)},
          {"checkpoint_stall_s", in.checkpoint_stall_s},
          {"checkpoint_write_s", in.checkpoint_write_s}, {"restart_s", in.restart_s},
          {"young_interval_s", g.young_s}, {"daly_interval_s", g.daly_s},
          {"interval_s", g.interval_s},
          {"interval_steps", g.interval_s > 0 ? std::max(1.0, std::round(g.interval_s / step_s))
                                              : 0.0},
          {"lost_per_failure_s", g.lost_per_failure_s}, {"goodput", g.goodput}};
}

// The global batch (train.batch_size, or --global-batch) split over the data-parallel groups
// as `foundry train` splits it: each device's share in micro-batches of --micro-batch, else of
// train.micro_batch_size (0: the share at once), their gradients accumulated (how the
// published runs of docs/anchors.md ran).
void split_global_batch(const PlanOptions& o, const RunConfig& rc, bool batch_given, StepShape& s) {
  const int64_t groups = s.dp / s.cp;  // devices that hold different sequences
  const int64_t global = batch_given ? o.global_batch : rc.train.batch_size;
  if (global % groups != 0) {
    const std::string what = batch_given ? fmt::format("--global-batch {}", global)
                                         : fmt::format(
                                               "train.batch_size = {} (the global batch "
                                               "of {})",
                                               global, o.config_path);
    fail(fmt::format("{} is not a multiple of the {} data-parallel groups (--devices {} / "
                     "(tp x pp x cp))",
                     what, groups, o.devices),
         fmt::format(
             "make the global batch a multiple of {} ({})", groups,
             batch_given ? "--global-batch N" : "--global-batch N, or --set train.batch_size=N"));
  }
  const int64_t share = global / groups;
  s.micro_batch =
      o.micro_batch > 0
          ? o.micro_batch
          : checked_micro_batch_rows(
                rc.train, share,
                fmt::format("each device's {} sequences (global batch {} over {} data-parallel "
                            "groups)",
                            share, global, groups));
  if (share % s.micro_batch != 0)
    fail(fmt::format("--micro-batch {} does not divide each device's {} sequences (global batch "
                     "{} over {} data-parallel groups)",
                     o.micro_batch, share, global, groups),
         "give a --micro-batch that divides the per-device share, or leave it out to take "
         "train.micro_batch_size (the whole share when it is 0)");
  s.accumulation = share / s.micro_batch;
}

// The one-device step `foundry train` would run for --config under the flags' layout.
StepShape config_step_shape(const PlanOptions& o, const RunConfig& rc, bool seq_given,
                            bool batch_given) {
  StepShape s;
  s.seq = seq_given ? o.seq : rc.train.seq_len;
  if (s.seq > rc.model.max_seq_len)
    fail(fmt::format("--seq {} exceeds model.max_seq_len = {} of {}", s.seq, rc.model.max_seq_len,
                     o.config_path),
         "give --seq up to model.max_seq_len, or raise it (--set model.max_seq_len=N)");
  if (o.ep > 0)
    apply_layout(o, o.ep, "--ep", rc.model, s);
  else
    apply_layout(o, rc.train.expert_parallel, "train.expert_parallel =", rc.model, s);
  s.cp = o.cp > 0 ? o.cp : rc.train.context_parallel;
  s.zero1 = rc.train.zero1;
  if (s.dp % s.cp != 0 || (s.cp > 1 && s.seq % (2 * s.cp) != 0))
    fail(fmt::format("--cp {} must divide the {} data-parallel ranks and cut --seq {} into {} "
                     "equal chunks", s.cp, s.dp, s.seq, 2 * s.cp),
         "each sequence is split over cp devices, two chunks per device");
  split_global_batch(o, rc, batch_given, s);
  s.precision = rc.train.precision;
  s.muon = rc.train.optimizer == OptimizerKind::muon;
  s.muon_ns_steps = static_cast<int>(rc.train.muon_ns_steps);
  s.muon_bf16 = rc.train.muon_ns_precision == DType::bf16;
  s.comm_overlap = o.overlap;
  return s;
}

json prediction_json(const PlanOptions& o, const StepShape& s, const StepPrediction& p,
                     const HardwareProfile& profile, const GoodputInputs& gin,
                     const GoodputPrediction& gp) {
  json j = {{"config_path", o.config_path},
            {"profile", profile.path},
            {"context_parallel", s.cp},
            {"step_s", p.step_s},
            {"tokens_per_s_per_device", p.tokens_per_s},
            {"mfu_measured", p.mfu_measured},
            {"memory_bytes", p.memory_bytes},
            {"breakdown_s",
             {{"gemm", p.gemm_s},
              {"attention", p.attention_s},
              {"elementwise", p.elementwise_s},
              {"recompute", p.recompute_s},
              {"optimizer", p.optimizer_s},
              {"comm", p.comm_s},
              {"comm_exposed", p.comm_exposed_s},
              {"imbalance", p.imbalance_s},
              {"pipeline_bubble", p.bubble_s},
              {"framework_overhead", p.overhead_s},
              {"data", p.data_s},
              {"data_exposed", p.data_exposed_s}}},
            {"layout",
             {{"dp", s.dp},
              {"tp", s.tp},
              {"pp", s.pp},
              {"vp", s.vp},
              {"ep", s.ep},
              {"cp", s.cp},
              {"zero1", s.zero1},
              {"micro_batch", s.micro_batch},
              {"accumulation", s.accumulation},
              {"recompute", recompute_name(s.recompute)},
              {"eager", s.eager},
              {"attention_kernel", s.attention_kernel}}},
            {"mfu_spec", p.mfu_spec},
            {"goodput", goodput_json(gin, gp, p.step_s)}};
  j["items"] = json::array();
  for (const auto& it : p.items)
    j["items"].push_back({{"name", it.name}, {"category", category_name(it.category)},
                          {"seconds", it.seconds}, {"flops", it.flops}, {"bytes", it.bytes}});
  return j;
}

// "45 s", "12.5 min", "3.2 h", "41.7 days".
std::string format_duration(double seconds) {
  if (seconds < 120) return fmt::format("{:.0f} s", seconds);
  if (seconds < 7200) return fmt::format("{:.1f} min", seconds / 60);
  if (seconds < 2 * 86400) return fmt::format("{:.1f} h", seconds / 3600);
  return fmt::format("{:.1f} days", seconds / 86400);
}

int64_t global_batch(const StepShape& s) { return s.micro_batch * s.accumulation * (s.dp / s.cp); }

// --tokens with --config: the steps of the config's global batch that train on them, and how
// long those steps take at the predicted step time.
struct TrainingTime {
  double tokens = 0, seconds = 0;
  int64_t steps = 0;
};

TrainingTime training_time(double tokens, const StepShape& s, const StepPrediction& p) {
  TrainingTime t;
  if (tokens <= 0) return t;
  t.tokens = tokens;
  t.steps = static_cast<int64_t>(std::ceil(tokens / double(global_batch(s) * s.seq)));
  t.seconds = double(t.steps) * p.step_s;
  return t;
}

// --config: predict one config's step on one device of the profile.
// A profile that measured no product of the run's dtype prices them all at its spec peak
// (bench gemm --dtype bf16 leaves fp32 unmeasured): say so, since the MFU then reads high.
void warn_unmeasured_dtype(const HardwareProfile& profile, DType dtype) {
  if (profile.peak(dtype).measured_flops_per_s > 0) return;
  for (const GemmPoint& p : profile.gemm_points)
    if (p.dtype == dtype) return;
  fmt::print(stderr,
             "warning: profile {} measured no {} product: every one is priced at its spec peak "
             "({}) (measure them with `foundry bench gemm --dtype {} --profile {}`)\n",
             profile.path, dtype_name(dtype), format_flops(profile.peak(dtype).spec_flops_per_s),
             dtype_name(dtype), profile.path);
}

void predict_config(const PlanOptions& o, const HardwareProfile& profile, double memory,
                    bool seq_given, bool batch_given) {
  const RunConfig rc = load_run_config(o.config_path, o.overrides);
  const StepShape s = config_step_shape(o, rc, seq_given, batch_given);
  warn_unmeasured_dtype(profile, s.precision);
  const StepPrediction p = predict_step(rc.model, s, profile);
  const auto [gin, gp] = plan_goodput(o, rc.model, s, profile, p.step_s);
  // The device's memory: --memory-per-device, else the profile's.
  const double device_memory = memory > 0 ? memory : double(profile.memory_bytes);
  if (device_memory > 0 && double(p.memory_bytes) > device_memory)
    fmt::print(stderr,
               "warning: {} needs {} per device, more than the {} of a device ({}): it does "
               "not fit (a search rejects such shapes); use more devices, a smaller batch, "
               "recomputation (--recompute) or expert parallelism (--ep)\n",
               o.config_path, format_bytes(double(p.memory_bytes)), format_bytes(device_memory),
               memory > 0 ? std::string("--memory-per-device") : profile.name);
  const TrainingTime training = training_time(parse_amount("--tokens", o.tokens), s, p);
  if (o.json) {
    json j = prediction_json(o, s, p, profile, gin, gp);
    if (training.tokens > 0)
      j["training"] = {{"tokens", training.tokens},
                       {"steps", training.steps},
                       {"days", training.seconds / 86400}};
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    print_prediction(rc, s, p, profile, o.config_path);
    if (training.tokens > 0)
      std::printf(
          "training %s tokens: %lld steps of %s tokens, %s at the predicted step "
          "time\n",
          format_count(training.tokens).c_str(), (long long)training.steps,
          format_count(double(global_batch(s) * s.seq)).c_str(),
          format_duration(training.seconds).c_str());
    print_goodput(gin, gp, p.step_s);
  }
}

// The search's request from the flags (budgets, shape lists, --compare configs).
PlanRequest search_request(const PlanOptions& o, double memory, bool seq_given,
                           bool batch_given) {
  PlanRequest rq;
  rq.arch = o.arch;
  rq.total_params = parse_amount("--total-params", o.total);
  rq.active_params = parse_amount("--active-params", o.active);
  rq.tokens = parse_amount("--tokens", o.tokens);
  rq.memory_per_device = int64_t(memory);
  rq.seq = seq_given ? o.seq : 4096;
  rq.devices = o.devices;
  rq.global_batch = batch_given ? o.global_batch : o.devices;
  rq.vocab = o.vocab > 0 ? o.vocab : 32000;
  rq.precision = parse_dtype(o.precision).value();  // CLI11 checked the choice
  rq.muon = parse_optimizer(o.optimizer) == OptimizerKind::muon;
  rq.tolerance = o.tolerance;
  rq.comm_overlap = o.overlap;
  rq.scatter = o.scatter;
  rq.eager = o.eager;
  rq.attention_kernel = o.attention_kernel;
  rq.decode_batch = o.decode_batch;
  const std::vector<int64_t> aspect = parse_list("--aspect-ratio", o.aspect);
  if (aspect.size() != 2)
    fail(fmt::format("--aspect-ratio '{}' must be min,max", o.aspect),
         "e.g. --aspect-ratio 20,200");
  rq.aspect_min = double(aspect[0]);
  rq.aspect_max = double(aspect[1]);
  if (!o.hidden.empty()) rq.hidden = parse_list("--hidden", o.hidden);
  if (!o.head_dims.empty()) rq.head_dims = parse_list("--head-dims", o.head_dims);
  if (!o.experts.empty()) rq.experts = parse_list("--experts", o.experts);
  if (!o.top_ks.empty()) rq.top_ks = parse_list("--top-k", o.top_ks);
  if (!o.kv_ratios.empty()) rq.kv_ratios = parse_list("--kv-ratios", o.kv_ratios);
  const Arch arch = parse_arch(rq.arch, "--arch");
  for (const auto& path : o.compare) {
    const RunConfig rc = load_run_config(path);
    if (rc.model.arch != arch)
      fail(fmt::format("--compare {}: model.arch = \"{}\" but the search is over --arch {}", path,
                       arch_name(rc.model.arch), rq.arch),
           "compare shapes of the architecture being searched");
    rq.compare.push_back({path, rc.model});
    rq.base = rc.model;  // fixed keys (router width, kernels, RoPE share) follow the reference
  }
  // The searched shapes take the compared model's vocabulary unless --vocab says otherwise:
  // an LM head of another size would be counted as the shape's difference.
  if (o.vocab <= 0 && !rq.compare.empty()) rq.vocab = rq.compare.front().second.vocab_size;
  for (const auto& [path, model] : rq.compare)
    if (model.vocab_size != rq.vocab)
      fmt::print(stderr,
                 "warning: --compare {} has model.vocab_size {}, the searched shapes {}{}: its "
                 "LM head's share of the step differs from theirs\n",
                 path, model.vocab_size, rq.vocab, o.vocab > 0 ? " (--vocab)" : "");
  return rq;
}

// The search: the ranking, the best shape's goodput, and its run config with --out.
void search_shapes(const PlanOptions& o, const HardwareProfile& profile, double memory,
                   bool seq_given, bool batch_given) {
  const PlanRequest rq = search_request(o, memory, seq_given, batch_given);
  warn_unmeasured_dtype(profile, rq.precision);
  const PlanResult r = plan_search(rq, profile);
  if (r.ranked.empty()) {
    if (o.json) std::printf("%s\n", plan_to_json(r, o.top).dump(2).c_str());
    else std::printf("%s", format_plan(r, profile, o.top).c_str());
  } else {
    const Candidate& best = r.ranked.front();
    const auto [gin, gp] =
        plan_goodput(o, best.config, best.shape, profile, best.prediction.step_s);
    if (o.json) {
      json j = plan_to_json(r, o.top);
      j["goodput"] = goodput_json(gin, gp, best.prediction.step_s);
      std::printf("%s\n", j.dump(2).c_str());
    } else {
      std::printf("%s", format_plan(r, profile, o.top).c_str());
      std::printf("\nThe best shape's run:");
      print_goodput(gin, gp, best.prediction.step_s);
    }
  }
  if (!o.out.empty()) {
    write_file_atomic(o.out, plan_run_config(r.ranked.front(), rq).dump(2) + "\n");
    std::fprintf(stderr,
                 "wrote the best shape's run config to %s (train it with `foundry train "
                 "--config %s`)\n",
                 o.out.c_str(), o.out.c_str());
  }
}

// --out writes a search's best shape as a run config: over none of plan's inputs, and over
// nothing but a run config (a JSON object of model, train and data sections).
void check_plan_out(const PlanOptions& o) {
  if (!o.config_path.empty())
    fail(fmt::format("--out '{}' writes the best shape of a search; with --config plan predicts "
                     "that one config and writes nothing",
                     o.out),
         "leave out --out, or leave out --config to search shapes");
  std::vector<std::pair<std::string, std::string>> inputs = {{"--profile", o.profile}};
  for (const std::string& c : o.compare) inputs.push_back({"--compare", c});
  check_output_file("--out", o.out, inputs, [](const std::string& contents) {
    return has_run_config_shape(json::parse(contents, nullptr, /*allow_exceptions=*/false));
  });
}

void run_plan(const PlanOptions& o, bool seq_given, bool batch_given) {
  if (o.profile.empty())
    fail("plan needs --profile", "name a reference profile (mi300x, h100) or a profile JSON "
                                 "written by `foundry bench all`");
  if (!o.out.empty()) check_plan_out(o);
  const HardwareProfile profile = load_profile(o.profile);
  profile.require_memory_bandwidth("plan");
  const double memory = parse_amount("--memory-per-device", o.memory);
  if (!(o.overlap >= 0 && o.overlap <= 1))  // NaN too
    fail(fmt::format("--comm-overlap {} must be in [0, 1]", o.overlap),
         "it is the share of communication hidden behind the backward pass: 0 none, 1 all");
  if (!(o.scatter >= 1 && std::isfinite(o.scatter)))
    fail(fmt::format("--scatter {} must be >= 1 (σ counts extra page touches)", o.scatter),
         "1 means contiguous storage; leave it out if unsure");
  if (!o.config_path.empty())
    predict_config(o, profile, memory, seq_given, batch_given);
  else search_shapes(o, profile, memory, seq_given, batch_given);
  std::fputs(profile.notes_on_extrapolation().c_str(), stderr);
}

}  // namespace

// Options of the other mode are refused rather than ignored: a search's budgets and shape
// lists mean nothing to one --config, a layout nothing to a search (which picks its own).
void check_mode_options(const CLI::App& plan, bool config) {
  static const char* const kSearchOnly[] = {
      "--total-params", "--active-params", "--tolerance", "--aspect-ratio",
      "--hidden",       "--head-dims",     "--experts",   "--top-k",
      "--kv-ratios",    "--compare",       "--top"};
  static const char* const kConfigOnly[] = {"--micro-batch",
                                            "--tp",
                                            "--pp",
                                            "--vp",
                                            "--ep",
                                            "--cp",
                                            "--set",
                                            "--recompute",
                                            "--expert-imbalance",
                                            "--overlap-param-gather",
                                            "--overlap-expert-comm",
                                            "--dedup-expert-dispatch"};
  // The search's model and run; --config's come from its keys.
  static const std::pair<const char*, const char*> kConfigKeys[] = {
      {"--arch", "model.arch"},
      {"--vocab", "model.vocab_size"},
      {"--precision", "train.precision"},
      {"--optimizer", "train.optimizer"}};
  if (config) {
    for (const auto& [name, key] : kConfigKeys)
      if (plan.count(name) > 0)
        fail(fmt::format("{} sets the searched shapes' {}; with --config plan predicts that "
                         "config, whose {} it reads",
                         name, key, key),
             fmt::format("change it with --set {}=VALUE, or leave out --config to search", key));
    for (const char* name : kSearchOnly)
      if (plan.count(name) > 0)
        fail(fmt::format("{} is an option of the search; with --config plan predicts that one "
                         "config",
                         name),
             fmt::format("leave out {}, or leave out --config to search shapes", name));
  } else {
    for (const char* name : kConfigOnly)
      if (plan.count(name) > 0)
        fail(fmt::format("{} is for --config: a search sizes its shapes on one layout of its own",
                         name),
             fmt::format("give --config RUN.json to predict that layout, or leave out {}", name));
  }
}

// The search's model and its budgets' slack, and the step's common knobs.
void add_shape_options(CLI::App* plan, PlanOptions* o) {
  plan->add_option("--arch", o->arch, "Architecture to size")
      ->check(CLI::IsMember({"zaya1", "moe"}));
  plan->add_option("--vocab", o->vocab,
                   "Vocabulary size (default: the first --compare config's, else 32000)")
      ->check(in_range(int64_t{2}, int64_t{1} << 31));
  plan->add_option("--precision", o->precision, "GEMM inputs")
      ->check(CLI::IsMember({"bf16", "fp32"}));
  plan->add_option("--optimizer", o->optimizer, "Optimizer")
      ->check(CLI::IsMember({"adamw", "muon"}));
  plan->add_option("--tolerance", o->tolerance, "Relative slack on each budget (default 0.05)");
  plan->add_option("--aspect-ratio", o->aspect,
                   "Allowed d_model / n_layers as min,max (default 20,200)");
  plan->add_option("--hidden", o->hidden,
                   "Hidden sizes to try (default: multiples of 256 with off-size probes)");
  plan->add_option("--head-dims", o->head_dims, "Head dims to try (default 64,80,96,128)");
  plan->add_option("--experts", o->experts, "Expert counts to try (default 8,16,32,64,128)");
  plan->add_option("--top-k", o->top_ks, "Top-k values to try (default 1,2,4,8)");
  plan->add_option("--kv-ratios", o->kv_ratios, "Query heads per KV head to try (default 1,2,4,8)");
  plan->add_option("--comm-overlap", o->overlap,
                   "Share of the backward pass communication hides behind (default 1)");
  plan->add_option("--decode-batch", o->decode_batch,
                   "Sequences decoded together for the latency column (default 32)")
      ->check(in_range(int64_t{1}, int64_t{1} << 20));
  plan->add_option("--scatter", o->scatter, "Storage scatter factor σ (default 1)");
}

// --config's model-parallel layout and the kernels of the training stack.
void add_layout_options(CLI::App* plan, PlanOptions* o) {
  using LayoutFlag = std::tuple<const char*, int64_t*, const char*>;
  for (const auto& [flag, value, help] :
       {LayoutFlag{"--tp", &o->tp, "With --config: tensor-parallel ranks (sequence parallel)"},
        LayoutFlag{"--pp", &o->pp, "With --config: pipeline stages (1F1B)"},
        LayoutFlag{"--vp", &o->vp, "With --config: virtual stages per device (interleaved)"},
        LayoutFlag{"--ep", &o->ep,
                   "With --config: expert-parallel ranks (all-to-alls; default "
                   "train.expert_parallel)"}})
    plan->add_option(flag, *value, help)->check(in_range(int64_t{1}, int64_t{1} << 20));
  plan->add_option("--expert-imbalance", o->expert_imbalance,
                   "Busiest expert-parallel rank's tokens / mean (default: binomial routing)");
  plan->add_option("--recompute", o->recompute, "Activation recomputation (default none)")
      ->check(CLI::IsMember({"none", "selective", "full"}));
  plan->add_flag("--overlap-param-gather", o->overlap_param_gather,
                 "The weight all-gather hides behind the next forward (default: exposed)");
  plan->add_flag("--overlap-expert-comm", o->overlap_expert_comm,
                 "Expert all-to-alls hide behind another micro-batch's compute (DualPipe)");
  plan->add_flag("--dedup-expert-dispatch", o->dedup_dispatch,
                 "A token crosses to each other node once (DeepEP-style dispatch)");
  plan->add_flag("--eager", o->eager,
                 "Unfused elementwise kernels (eager PyTorch, no compiler)");
  plan->add_option("--attention-kernel", o->attention_kernel,
                   "A fused attention kernel of the profile (efficiency.attention_kernels, "
                   "e.g. fa2; default: its best)");
}

// Goodput's failure rate and checkpoint costs.
void add_goodput_options(CLI::App* plan, PlanOptions* o) {
  plan->add_option("--failure-rate", o->failure_rate,
                   "Failures per device-hour for goodput (default 1.97e-5, Llama 3)");
  using SecondsFlag = std::tuple<const char*, double*, const char*>;
  for (const auto& [flag, value, help] :
       {SecondsFlag{"--checkpoint-stall", &o->checkpoint_stall,
                    "Seconds the loop blocks per checkpoint (default: snapshot copy estimate)"},
        SecondsFlag{"--checkpoint-write", &o->checkpoint_write,
                    "Seconds from snapshot to committed checkpoint (default: size / bandwidth)"},
        SecondsFlag{"--restart", &o->restart,
                    "Seconds from a failure to the first step after restart (default: derived)"},
        SecondsFlag{"--checkpoint-interval", &o->checkpoint_interval,
                    "Seconds between checkpoints to evaluate (default 0: the best, Daly)"}})
    plan->add_option(flag, *value, help)->check(in_range(0.0, 1e12));
}

void register_plan_commands(CLI::App& app) {
  CLI::App* plan = app.add_subcommand(
      "plan",
      "Size a model to a hardware profile: search shapes for a parameter budget and rank "
      "them by predicted throughput, or predict one config's step time (--config)");
  auto o = std::make_shared<PlanOptions>();
  plan->add_option("--profile", o->profile,
                   "Hardware profile: a JSON path or a reference name (mi300x, h100)");
  plan->add_option("--config", o->config_path,
                   "Predict this run config's step time instead of searching");
  plan->add_option("--set", o->overrides, "Override a field of --config, e.g. train.batch_size=4")
      ->type_name("KEY=VALUE");
  plan->add_option("--total-params", o->total,
                   "Budget: all parameters without embeddings (e.g. 8.3B)");
  plan->add_option("--active-params", o->active,
                   "Budget: parameters a token uses, without embeddings (e.g. 760M)");
  plan->add_option("--tokens", o->tokens,
                   "Training tokens (reports the training time; sets train.steps)");
  CLI::Option* seq = plan->add_option(
      "--seq", o->seq, "Sequence length (default 4096; with --config: train.seq_len)");
  CLI::Option* batch =
      plan->add_option("--global-batch", o->global_batch,
                       "Sequences per optimizer step over all devices (default: one per device; "
                       "with --config: train.batch_size)")
          ->check(in_range(int64_t{1}, int64_t{1} << 40));
  plan->add_option("--micro-batch", o->micro_batch,
                   "With --config: sequences a device runs at once, accumulating gradients over "
                   "its share of the global batch (default: train.micro_batch_size, as foundry "
                   "train runs it; 0 there is the whole share)")
      ->check(in_range(int64_t{1}, int64_t{1} << 30));
  plan->add_option("--cp", o->cp,
                   "With --config: devices per sequence (context parallel; default "
                   "train.context_parallel)")
      ->check(in_range(int64_t{1}, int64_t{1} << 30));
  plan->add_option("--devices", o->devices,
                   "Devices (data-parallel ranks; ZeRO-1 shards over them)")
      ->check(in_range(int64_t{1}, int64_t{1} << 30));
  plan->add_option("--memory-per-device", o->memory,
                   "Bytes per device (default: the profile's; e.g. 192GiB)");
  add_shape_options(plan, o.get());
  add_layout_options(plan, o.get());
  add_goodput_options(plan, o.get());
  plan->add_option("--top", o->top, "Shapes to list (default 10)")->check(in_range(1, 1 << 20));
  plan->add_option("--compare", o->compare,
                   "Also predict this run config's shape under the same run and compare it "
                   "with the best (repeatable)");
  plan->add_option("--out", o->out, "Write the best shape's run config here");
  plan->add_flag("--json", o->json, "Print JSON instead of tables");
  plan->callback([o, seq, batch, plan] {
    check_mode_options(*plan, !o->config_path.empty());
    run_plan(*o, seq->count() > 0, batch->count() > 0);
  });
}

}  // namespace foundry::cli
