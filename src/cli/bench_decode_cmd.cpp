// foundry bench decode: decode latency and throughput of a config's model for several MoE
// widths and batch sizes (bench/decode_bench.h), against the planner's predicted latency
// from a hardware profile (plan/perf_model.h), and the KV cache per token against standard
// attention's. Prints a provenance header and Markdown tables (progress on stderr); --out
// writes them as Markdown, or as JSON when FILE ends in .json.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/io.h"
#include "base/memory_budget.h"
#include "base/progress.h"
#include "bench/decode_bench.h"
#include "bench/gemm_bench.h"
#include "bench/profile.h"
#include "bench/provenance.h"
#include "cli/commands.h"
#include "model/backends.h"
#include "plan/perf_model.h"
#include "train/run_config.h"

namespace foundry::cli {

namespace {

struct DecodeFlags {
  std::string config_path, profile, widths, batches = "1,4,16,64", out, device;
  std::vector<std::string> overrides;
  int64_t context = 256, warmup = 3, steps = 10, finer = 3;
  double warmup_s = 1.0;
  bool quiet = false;
};

std::string header(const Provenance& provenance, const DecodeBenchResult& r,
                   const std::string& profile_note) {
  std::string out = format_provenance(provenance, "# ");
  if (r.load_average[0] >= 0)
    out += fmt::format("# load average before: {:.2f} {:.2f} {:.2f}\n", r.load_average[0],
                       r.load_average[1], r.load_average[2]);
  out += fmt::format("# device: {}\n", r.device);
  out += "# weights: random (a decode step's time does not depend on their values)\n";
  return out + "# " + profile_note + "\n\n";
}

void run_bench_decode(const DecodeFlags& f, const CLI::App& cmd) {
  if (!f.out.empty())
    check_output_file("--out", f.out, {{"--config", f.config_path}, {"--profile", f.profile}},
                      is_bench_output);
  const RunConfig rc = load_run_config(f.config_path, f.overrides);
  DecodeBenchOptions o;
  o.model = rc.model;
  o.precision = rc.train.precision;
  o.context = f.context;
  o.warmup = f.warmup;
  o.warmup_s = f.warmup_s;
  o.steps = f.steps;
  o.batches = parse_int_list("--batches", f.batches);
  if (f.finer < 1) fail(fmt::format("--finer {}: must be >= 1", f.finer));
  o.widths = cmd.count("--widths") ? parse_widths("--widths", f.widths)
                                   : finer_widths(rc.model, f.finer);
  if (cmd.count("--widths") > 0 && cmd.count("--finer") > 0)
    fail("--finer chooses the widths when --widths does not, and both are given",
         "drop one of them");
  if (cmd.count("--finer") > 0 && static_cast<int64_t>(o.widths.size()) < f.finer)
    std::fprintf(
        stderr, "warning: %s\n",
        fmt::format("--finer {}: the config's MoE has {} width{} at its total and active "
                    "parameters (each finer one doubles the experts and top-k and halves "
                    "ffn_dim, {} here, which must stay a multiple of 64); measuring those",
                    f.finer, o.widths.size(), o.widths.size() == 1 ? "" : "s", rc.model.ffn_dim)
            .c_str());
  validate(o);  // before anything runs, so bad input fails at once
  const DeviceSpec device = parse_device("--device", f.device.empty() ? "cpu" : f.device);
  const std::unique_ptr<Backend> backend = open_backend(device, "--device " + device.name());
  if (device.cuda) o.backend = backend.get();
  check_memory({"bench decode", {{"the largest model and decode state", decode_bench_bytes(o)}}},
               memory_budget_of(device), "choose fewer or smaller batches (--batches) or --context");
  std::unique_ptr<HardwareProfile> profile;
  if (!f.profile.empty()) {
    profile = std::make_unique<HardwareProfile>(load_profile(f.profile));
    profile->require_memory_bandwidth("bench decode's prediction");
  }

  auto bar = std::make_shared<std::unique_ptr<Progress>>();
  if (!f.quiet)
    o.on_progress = [bar](int64_t done, int64_t total, const std::string& what) {
      if (!*bar) *bar = std::make_unique<Progress>("bench decode", total, "points");
      if (done >= total) (*bar)->finish(what);
      else (*bar)->update(done, what);
    };
  const Provenance provenance = collect_provenance();
  DecodeBenchResult r = run_decode_bench(o);
  std::string note = "no --profile: no predicted latency (pass --profile FILE, e.g. the "
                     "profile `foundry bench all` wrote for this machine)";
  if (profile) {
    note = fmt::format("predicted: predict_decode_latency over profile {} ({})", profile->name,
                       profile->path);
    for (DecodePoint& p : r.points)
      p.predicted_s = predict_decode_latency(with_width(o.model, p.width), p.batch, o.context,
                                             *profile, o.precision);
  }
  const std::string text = header(provenance, r, note) + format_decode_table(r) + "\n" +
                           format_kv_cache_sizes(o.model);
  std::printf("%s", text.c_str());
  if (!f.out.empty()) {
    const bool json_out = f.out.size() > 5 && f.out.ends_with(".json");
    std::string body = text;
    if (json_out) {
      nlohmann::json j = decode_bench_json(r, provenance);
      const KvCacheSizes kv = kv_cache_sizes(o.model);
      j["config"] = f.config_path;
      j["profile"] = profile ? profile->path : "";
      j["kv_cache_values_per_token_per_layer"] = {
          {"this", kv.per_token}, {"mha_full_width", kv.mha_full_width},
          {"mha_same_heads", kv.mha_same_heads}, {"gqa_same_kv_heads", kv.gqa_same_kv_heads},
          {"cca_state_per_sequence", kv.cca_state_per_sequence}};
      body = j.dump(2) + "\n";
    }
    write_file_atomic(f.out, body);
    std::printf("wrote %s\n", f.out.c_str());
  }
}

}  // namespace

void register_bench_decode_command(CLI::App& bench) {
  CLI::App* cmd = bench.add_subcommand(
      "decode", "Decode latency and tokens/s for MoE widths and batch sizes (random weights), "
                "against the planner's prediction; KV cache per token against standard attention");
  auto f = std::make_shared<DecodeFlags>();
  cmd->add_option("--config", f->config_path, "Run config whose model is measured")->required();
  cmd->add_option("--set", f->overrides, "Override a field of --config, e.g. model.n_layers=2")
      ->type_name("KEY=VALUE");
  cmd->add_option("--widths", f->widths,
                  "MoE widths EXPERTSxFFNxTOPK (default: the config's and finer ones at equal "
                  "total and active parameters, see --finer)")
      ->type_name("ExFxK,...");
  cmd->add_option("--finer", f->finer, "Widths by default: the config's and this many − 1 finer")
      ->capture_default_str();
  cmd->add_option("--batches", f->batches, "Sequences decoded together")->capture_default_str();
  cmd->add_option("--device", f->device, "Where to decode: cpu (default), cuda or cuda:N");
  cmd->add_option("--context", f->context, "Cached positions each step attends over")
      ->capture_default_str();
  cmd->add_option("--warmup", f->warmup, "Untimed steps first")->capture_default_str();
  cmd->add_option("--warmup-seconds", f->warmup_s, "... and at least this long")
      ->capture_default_str();
  cmd->add_option("--steps", f->steps, "Timed steps (the median is reported)")
      ->capture_default_str();
  cmd->add_option("--profile", f->profile,
                  "Hardware profile for the predicted latency (a JSON path or a name)");
  cmd->add_option("--out", f->out, "Write the tables to FILE (JSON when it ends in .json)")
      ->type_name("FILE");
  cmd->add_flag("--quiet,-q", f->quiet, "No progress on stderr");
  cmd->callback([f, cmd] { run_bench_decode(*f, *cmd); });
}

}  // namespace foundry::cli
