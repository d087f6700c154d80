#include "train/run_config.h"

#include <algorithm>

namespace foundry {

RunConfig load_run_config(const std::string& path, const std::vector<std::string>& overrides) {
  json root = load_json_file(path);
  if (!root.is_object())
    fail(fmt::format("{}: the config must be a JSON object with \"model\" and \"train\" sections",
                     path),
         "start from a config in configs/, e.g. configs/demo.json");
  for (const auto& o : overrides) {
    // A section the file leaves out is made by its first --set; a misspelt one is named here,
    // as the override's, not the file's.
    const std::string section = o.substr(0, std::min(o.find('.'), o.find('=')));
    const size_t eq = o.find('=');
    if (eq != 0 && eq != std::string::npos && !root.contains(section) && section != "model" &&
        section != "train" && section != "data")
      fail(fmt::format("bad override '{}': unknown section '{}'", o, section),
           "the sections are model, train and data, e.g. --set train.lr=3e-4");
    apply_override(root, o);
  }
  return parse_run_config(root, path);
}

LrSchedule lr_schedule(const TrainConfig& config) {
  LrSchedule s;
  s.kind = config.schedule;
  s.lr = config.lr;
  s.min_lr_ratio = config.min_lr_ratio;
  s.warmup_steps = config.warmup_steps;
  s.total_steps = config.steps;
  s.decay_fraction = config.decay_fraction;
  return s;
}

namespace {

// The train section's keys, each against its range; `skip` gets train.skip_batches as written.
void read_train_keys(ConfigReader& r, TrainConfig& t, json& skip,
                     const std::string& where) {
  r.get("steps", t.steps, int64_t{0}, int64_t{1} << 40);
  r.get("batch_size", t.batch_size, int64_t{1}, int64_t{1} << 20);
  r.get("micro_batch_size", t.micro_batch_size, int64_t{0}, int64_t{1} << 20);
  r.get("seq_len", t.seq_len, int64_t{1}, int64_t{1} << 22);
  r.get("lr", t.lr, 0.0, 10.0);
  r.get("min_lr_ratio", t.min_lr_ratio, 0.0, 1.0);
  r.get("warmup_steps", t.warmup_steps, int64_t{0}, int64_t{1} << 40);
  r.get_parsed("schedule", t.schedule, parse_schedule, "cosine, wsd, constant");
  r.get("decay_fraction", t.decay_fraction, 0.0, 1.0);
  r.get("weight_decay", t.weight_decay, 0.0, 10.0);
  r.get("beta1", t.beta1, 0.0, 0.999999);
  r.get("beta2", t.beta2, 0.0, 0.999999999);
  r.get("eps", t.eps, 0.0, 1.0);
  r.get("grad_clip", t.grad_clip, 0.0, 1e9);
  r.get_parsed("optimizer", t.optimizer, parse_optimizer, "adamw, muon");
  r.get("muon_momentum", t.muon_momentum, 0.0, 0.999999);
  r.get("muon_nesterov", t.muon_nesterov);
  r.get("muon_ns_steps", t.muon_ns_steps, int64_t{1}, int64_t{100});
  r.get("muon_rms_scale", t.muon_rms_scale, 0.0, 100.0);
  r.get_parsed("muon_ns_precision", t.muon_ns_precision, parse_dtype, "bf16, fp32");
  r.get_parsed("precision", t.precision, parse_dtype, "fp32, bf16");
  std::string device = t.device.name();
  r.get("device", device);
  t.device = parse_device(fmt::format("{}: train.device", where), device);
  r.get("seed", t.seed);
  r.get("log_every", t.log_every, int64_t{1}, int64_t{1} << 40);
  r.get("eval_every", t.eval_every, int64_t{0}, int64_t{1} << 40);
  r.get("eval_batches", t.eval_batches, int64_t{1}, int64_t{1} << 20);
  r.get("checkpoint_every", t.checkpoint_every, int64_t{0}, int64_t{1} << 40);
  r.get("keep_checkpoints", t.keep_checkpoints, int64_t{0}, int64_t{1} << 20);
  r.get("checkpoint_at_end", t.checkpoint_at_end);
  r.get("checkpoint_async", t.checkpoint_async);
  r.get_choice<CheckpointOverlap>("checkpoint_overlap", t.checkpoint_overlap,
                                  {{"wait", CheckpointOverlap::wait},
                                   {"skip", CheckpointOverlap::skip}});
  r.get("memory_checkpoint_every", t.memory_checkpoint_every, int64_t{0}, int64_t{1} << 40);
  r.get("memory_checkpoint_dir", t.memory_checkpoint_dir);
  r.get_choice<AnomalyPolicy>("anomaly_policy", t.anomaly_policy,
                              {{"skip", AnomalyPolicy::skip},
                               {"rollback", AnomalyPolicy::rollback},
                               {"stop", AnomalyPolicy::stop}});
  r.get("spike_factor", t.spike_factor, 0.0, 1e9);
  r.get("spike_window", t.spike_window, int64_t{1}, int64_t{1} << 20);
  r.get("spike_warmup", t.spike_warmup, int64_t{1}, int64_t{1} << 20);
  r.get("max_consecutive_anomalies", t.max_consecutive_anomalies, int64_t{1}, int64_t{1} << 40);
  r.get("max_anomalies", t.max_anomalies, int64_t{0}, int64_t{1} << 40);
  r.get("skip_batches", skip);
  r.get("peak_gflops", t.peak_gflops, 0.0, 1e12);
  r.get("hardware_profile", t.hardware_profile);
  r.get("run_dir", t.run_dir);
  r.get("expert_parallel", t.expert_parallel, int64_t{1}, int64_t{1} << 20);
  r.get("context_parallel", t.context_parallel, int64_t{1}, int64_t{1} << 20);
  r.get("comm_timeout_s", t.comm_timeout_s, 0.0, 1e7);
  r.get("heartbeat_interval_s", t.heartbeat_interval_s, 0.0, 3600.0);
  r.get("heartbeat_timeout_s", t.heartbeat_timeout_s, 0.1, 1e7);
  r.get("hang_timeout_s", t.hang_timeout_s, 1.0, 1e7);
  r.get("zero1", t.zero1);
  r.get("overlap_grad_reduce", t.overlap_grad_reduce);
  r.get("grad_bucket_mib", t.grad_bucket_mib, 0.0, 8192.0);
  r.finish();
}

// The checks across keys (and against the model), each naming the keys and the fix.
void check_train_config(const RunConfig& rc, const std::string& where) {
  const TrainConfig& t = rc.train;
  if (t.seq_len > rc.model.max_seq_len)
    fail(fmt::format("{}: train.seq_len = {} exceeds model.max_seq_len = {}", where, t.seq_len,
                     rc.model.max_seq_len),
         "raise model.max_seq_len or lower train.seq_len");
  if (t.context_parallel > 1 && t.seq_len % (2 * t.context_parallel) != 0)
    fail(fmt::format("{}: train.seq_len = {} cannot be cut into {} equal chunks (two per rank "
                     "for train.context_parallel = {})",
                     where, t.seq_len, 2 * t.context_parallel, t.context_parallel),
         fmt::format("make train.seq_len a multiple of {}", 2 * t.context_parallel));
  const int64_t halo = rc.model.context_halo_rows();
  if (t.context_parallel > 1 && t.seq_len / (2 * t.context_parallel) < std::max<int64_t>(halo, 1))
    fail(fmt::format("{}: train.context_parallel = {} cuts train.seq_len = {} into chunks of {} "
                     "tokens, fewer than the {} rows the CCA convolutions read before a chunk",
                     where, t.context_parallel, t.seq_len, t.seq_len / (2 * t.context_parallel),
                     halo),
         "use a smaller train.context_parallel or longer sequences");

  if (t.heartbeat_interval_s > 0 && t.heartbeat_timeout_s < 2 * t.heartbeat_interval_s)
    fail(fmt::format("{}: train.heartbeat_timeout_s = {} is shorter than two heartbeats "
                     "(train.heartbeat_interval_s = {})",
                     where, t.heartbeat_timeout_s, t.heartbeat_interval_s),
         "make train.heartbeat_timeout_s at least twice train.heartbeat_interval_s");
  if (!(t.eps > 0))
    fail(fmt::format("{}: train.eps = {}: the optimizer divides by sqrt(v) + eps, and v is 0 "
                     "wherever a gradient is (the vocabulary's padding rows, unused experts)",
                     where, t.eps),
         "give a small positive eps, e.g. train.eps = 1e-8");
  if (!(t.muon_rms_scale > 0))
    fail(fmt::format("{}: train.muon_rms_scale = {} must be positive", where, t.muon_rms_scale),
         "set train.muon_rms_scale to 0.2 (matches the RMS of a typical AdamW update)");
  if (t.spike_factor > 0 && t.spike_factor <= 1)
    fail(fmt::format("{}: train.spike_factor = {} flags every step as a spike: a spike is a loss "
                     "above spike_factor times the window's median",
                     where, t.spike_factor),
         "give a factor above 1 (e.g. 3), or 0 to turn spike detection off");
  if (t.spike_warmup > t.spike_window)
    fail(fmt::format("{}: train.spike_warmup = {} exceeds train.spike_window = {}", where,
                     t.spike_warmup, t.spike_window),
         "spike detection starts once the window holds spike_warmup steps: lower it or widen "
         "the window");
}

// train.skip_batches: a list of 1-based batch numbers.
void read_skip_batches(const json& skip, TrainConfig& t, const std::string& where) {
  if (!skip.is_array())
    fail(fmt::format("{}: train.skip_batches = {} is not a list", where, skip.dump()),
         "give a list of batch numbers, e.g. --set 'train.skip_batches=[17,42]'");
  for (const json& b : skip) {
    if (!b.is_number_integer() || b.get<int64_t>() < 1)
      fail(fmt::format("{}: train.skip_batches holds {}, not a batch number (1, 2, …)", where,
                       b.dump()),
           "list the 1-based numbers of the batches to drop (events.jsonl names them)");
    t.skip_batches.push_back(b.get<int64_t>());
  }
}

}  // namespace

RunConfig parse_run_config(const json& root, const std::string& where) {
  RunConfig rc;
  ConfigReader top(root, where);
  // An unknown (say, misspelled) section first: its keys would otherwise go unread, and the
  // defaults in their place fail checks that name something else.
  const json& model = top.child("model");
  const json& train = top.child("train");
  const json& data = top.child("data");
  top.finish();
  rc.model = parse_model_config(model, where);

  TrainConfig& t = rc.train;
  ConfigReader r(train, where, "train.");
  json skip = json::array();
  read_train_keys(r, t, skip, where);
  check_train_config(rc, where);
  read_skip_batches(skip, t, where);

  ConfigReader d(data, where, "data.");
  d.get("dir", rc.data.dir);
  d.finish();
  rc.source = root;
  return rc;
}

int64_t checked_micro_batch_rows(const TrainConfig& tc, int64_t share,
                                 const std::string& share_is) {
  // (One at or above the share runs it whole: a restart on more ranks keeps working.)
  if (tc.micro_batch_size > 0 && tc.micro_batch_size < share && share % tc.micro_batch_size != 0)
    fail(fmt::format("train.micro_batch_size = {} does not divide {}", tc.micro_batch_size,
                     share_is),
         fmt::format("choose a train.micro_batch_size that divides {} (--set "
                     "train.micro_batch_size=M), or 0: the whole share at once",
                     share));
  return micro_batch_rows(tc, share);
}

void check_rank_layout(const RunConfig& rc, int64_t ranks, bool mpi,
                       const std::string& ranks_from) {
  const TrainConfig& tc = rc.train;
  // How to get `multiple` × k ranks: mpirun's -np for this job, else the launcher's flag that
  // set the count (ranks_from: "--np 3", "--restart-np 1").
  auto more_ranks = [&](int64_t multiple, const char* key) {
    const std::string how = ranks_from == "this job"
                                ? std::string("run under mpirun -np N")
                                : "pass " + ranks_from.substr(0, ranks_from.find(' ')) + " N";
    return fmt::format("{} with N a multiple of {}, or set {}=1", how, multiple, key);
  };
  if (tc.context_parallel > 1 && (!mpi || ranks % tc.context_parallel != 0))
    fail(fmt::format("train.context_parallel = {} needs a multiple of {} MPI ranks, but {} has {}",
                     tc.context_parallel, tc.context_parallel, ranks_from, ranks),
         more_ranks(tc.context_parallel, "train.context_parallel"));
  // Context-parallel groups share their sequences: the batch splits over the groups.
  const int64_t groups = ranks / tc.context_parallel;
  if (tc.batch_size % groups != 0)
    fail(fmt::format("train.batch_size = {} sequences cannot be split evenly over {} {}{}",
                     tc.batch_size, groups,
                     tc.context_parallel > 1
                         ? fmt::format("context-parallel groups ({} ranks of {})", ranks,
                                       tc.context_parallel)
                         : std::string("ranks"),
                     ranks_from == "this job" ? "" : " (" + ranks_from + ")"),
         fmt::format("make train.batch_size a multiple of {} (it is the global batch)", groups));
  const int64_t share = tc.batch_size / groups;  // each rank's sequences
  checked_micro_batch_rows(
      tc, share,
      fmt::format("a rank's {} sequence{} of the batch (train.batch_size = {} over {} {}{})", share,
                  share == 1 ? "" : "s", tc.batch_size, groups,
                  tc.context_parallel > 1 ? "context-parallel groups" : "rank(s)",
                  ranks_from == "this job" ? "" : ", " + ranks_from));
  if (tc.expert_parallel <= 1) return;
  if (!mpi)
    fail(fmt::format("train.expert_parallel = {} needs that many MPI ranks, but {} is one "
                     "process",
                     tc.expert_parallel, ranks_from),
         more_ranks(tc.expert_parallel, "train.expert_parallel"));
  if (ranks % tc.expert_parallel != 0)
    fail(fmt::format("train.expert_parallel = {} does not divide the {} ranks of {}",
                     tc.expert_parallel, ranks, ranks_from),
         "choose an expert-parallel size that divides the number of ranks (the data-parallel "
         "size is ranks / train.expert_parallel)");
  if (rc.model.n_experts % tc.expert_parallel != 0)
    fail(fmt::format("model.n_experts = {} cannot be sharded over train.expert_parallel = {} "
                     "ranks",
                     rc.model.n_experts, tc.expert_parallel),
         "choose a train.expert_parallel that divides model.n_experts");
}

std::vector<std::string> balancer_changes(const ModelConfig& before, const ModelConfig& now) {
  std::vector<std::string> changes;
  if (!before.is_zaya() || !now.is_zaya()) return changes;
  if (before.balance_rule != now.balance_rule)
    changes.push_back(
        fmt::format("model.balance_rule: {} -> {}", before.balance_rule, now.balance_rule));
  if (before.balance_bias_lr != now.balance_bias_lr)
    changes.push_back(fmt::format("model.balance_bias_lr: {} -> {}", before.balance_bias_lr,
                                  now.balance_bias_lr));
  if (before.skip_bias_init != now.skip_bias_init)
    changes.push_back(
        fmt::format("model.skip_bias_init: {} -> {}", before.skip_bias_init, now.skip_bias_init));
  return changes;
}

std::vector<std::string> trajectory_changes(const TrainConfig& before, const TrainConfig& now) {
  using Show = std::string (*)(const TrainConfig&);
  static const std::pair<const char*, Show> kFields[] = {
      {"batch_size", [](const TrainConfig& t) { return fmt::format("{}", t.batch_size); }},
      {"seq_len", [](const TrainConfig& t) { return fmt::format("{}", t.seq_len); }},
      {"seed", [](const TrainConfig& t) { return fmt::format("{}", t.seed); }},
      {"precision", [](const TrainConfig& t) { return std::string(dtype_name(t.precision)); }},
      {"lr", [](const TrainConfig& t) { return fmt::format("{}", t.lr); }},
      {"min_lr_ratio", [](const TrainConfig& t) { return fmt::format("{}", t.min_lr_ratio); }},
      {"warmup_steps", [](const TrainConfig& t) { return fmt::format("{}", t.warmup_steps); }},
      {"schedule", [](const TrainConfig& t) { return std::string(schedule_name(t.schedule)); }},
      {"decay_fraction", [](const TrainConfig& t) { return fmt::format("{}", t.decay_fraction); }},
      {"weight_decay", [](const TrainConfig& t) { return fmt::format("{}", t.weight_decay); }},
      {"beta1", [](const TrainConfig& t) { return fmt::format("{}", t.beta1); }},
      {"beta2", [](const TrainConfig& t) { return fmt::format("{}", t.beta2); }},
      {"eps", [](const TrainConfig& t) { return fmt::format("{}", t.eps); }},
      {"grad_clip", [](const TrainConfig& t) { return fmt::format("{}", t.grad_clip); }},
      {"muon_momentum", [](const TrainConfig& t) { return fmt::format("{}", t.muon_momentum); }},
      {"muon_nesterov", [](const TrainConfig& t) { return fmt::format("{}", t.muon_nesterov); }},
      {"muon_ns_steps", [](const TrainConfig& t) { return fmt::format("{}", t.muon_ns_steps); }},
      {"muon_rms_scale", [](const TrainConfig& t) { return fmt::format("{}", t.muon_rms_scale); }},
      {"muon_ns_precision",
       [](const TrainConfig& t) { return std::string(dtype_name(t.muon_ns_precision)); }},
  };
  std::vector<std::string> changes;
  for (const auto& [key, show] : kFields) {
    const std::string a = show(before), b = show(now);
    if (a != b) changes.push_back(fmt::format("train.{}: {} -> {}", key, a, b));
  }
  return changes;
}

bool has_run_config_shape(const json& doc) {
  if (!doc.is_object()) return false;
  for (const auto& item : doc.items())
    if (item.key() != "model" && item.key() != "train" && item.key() != "data") return false;
  return true;
}

}  // namespace foundry
