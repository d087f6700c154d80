// foundry train | eval | generate
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/exit_codes.h"
#include "base/hash.h"
#include "base/io.h"
#include "base/rng.h"
#include "bench/profile.h"
#include "ckpt/checkpoint.h"
#include "ckpt/checkpoint_dir.h"
#include "ckpt/inspect.h"
#include "ckpt/model_state.h"
#include "cli/commands.h"
#include "comm/comm.h"
#include "comm/launch.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "data/tokenizer.h"
#include "model/backends.h"
#include "model/model.h"
#include "train/checkpointer.h"
#include "train/evaluate.h"
#include "train/preflight.h"
#include "train/run_config.h"
#include "train/trainer.h"

namespace foundry::cli {
using data::BatchLoader;
using data::Dataset;
using data::Tokenizer;

namespace {

struct ConfigArgs {
  std::string config_path;
  std::vector<std::string> overrides;
};

void add_config_options(CLI::App* cmd, ConfigArgs& args) {
  cmd->add_option("--config,-c", args.config_path, "Run config (JSON)")->required();
  cmd->add_option("--set", args.overrides, "Override a config value: section.key=value")
      ->take_all();
}

// The checkpoint to read: an explicit directory, or the latest valid one of the run.
std::string resolve_checkpoint(const std::string& explicit_dir, const RunConfig& rc) {
  if (!explicit_dir.empty()) {
    checkpoint_format_version(explicit_dir);  // a directory of something else says so first
    verify_checkpoint(explicit_dir);
    return explicit_dir;
  }
  auto latest = find_latest_checkpoint(rc.train.run_dir);
  if (!latest)
    fail(fmt::format("no valid checkpoint in '{}/checkpoints'", rc.train.run_dir),
         "train first, or pass --checkpoint DIR");
  return *latest;
}

// The trained model of a checkpoint: its weights, which must be finite, and, for arch zaya1,
// the router balancing biases from trainer_state.json, so that tokens are routed as they
// were in training.
// On a device (a GPU backend) the weights are read into host memory and copied in.
std::unique_ptr<Model> load_model(const RunConfig& rc, const std::string& ckpt_dir,
                                  DType precision, Backend& backend = cpu_backend()) {
  auto model = std::make_unique<Model>(rc.model, precision, backend);
  std::vector<float> staged;
  if (model->on_device()) staged.resize(static_cast<size_t>(model->slab_size()));
  float* params = model->on_device() ? staged.data() : model->params();
  const json trainer_state = load_checkpoint(ckpt_dir, rc.model, model->table(), params, {});
  check_finite_weights(ckpt_dir, model->table(), params);
  restore_router_balancers(*model, trainer_state, ckpt_dir, /*required=*/false);
  if (model->on_device())
    model->write_params(staged.data());  // and its bf16 copy
  else
    model->sync_weights();
  return model;
}

// Samples a token from logits [v] with temperature, top-k and top-p (nucleus) filtering.
// Fails unless every logit is finite (they are the model's output at `position`), so there
// is always a candidate.
int32_t sample_token(const float* logits, int64_t v, int64_t position, double temperature,
                     int64_t top_k, double top_p, Rng& rng) {
  const int64_t bad = std::count_if(logits, logits + v, [](float x) { return !std::isfinite(x); });
  if (bad > 0)
    fail(fmt::format("{} of the {} logits at position {} are not finite", bad, v, position),
         "the weights are finite, so the forward pass overflowed; try --set "
         "train.precision=fp32, or an earlier checkpoint (--checkpoint)");
  if (temperature <= 0) {
    int64_t best = 0;
    for (int64_t i = 1; i < v; ++i)
      if (logits[i] > logits[best]) best = i;
    return static_cast<int32_t>(best);
  }
  std::vector<std::pair<double, int32_t>> cand;
  cand.reserve(v);
  double max_logit = -INFINITY;
  for (int64_t i = 0; i < v; ++i) max_logit = std::max(max_logit, double(logits[i]));
  for (int64_t i = 0; i < v; ++i)
    cand.emplace_back(std::exp((logits[i] - max_logit) / temperature), static_cast<int32_t>(i));
  std::sort(cand.begin(), cand.end(), [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  });
  if (top_k > 0 && static_cast<int64_t>(cand.size()) > top_k) cand.resize(top_k);
  double total = 0;
  for (const auto& c : cand) total += c.first;
  if (top_p < 1.0) {
    double cum = 0;
    size_t keep = 0;
    while (keep < cand.size()) {
      cum += cand[keep].first / total;
      ++keep;
      if (cum >= top_p) break;
    }
    cand.resize(keep);
    total = 0;
    for (const auto& c : cand) total += c.first;
  }
  double r = rng.uniform() * total;
  for (const auto& c : cand) {
    r -= c.first;
    if (r <= 0) return c.second;
  }
  return cand.back().second;
}

// train.hardware_profile's measured GEMM peak for the run's precision, per device; none when
// the config names no profile or gives train.peak_gflops (which wins).
std::optional<DevicePeak> profile_peak(const TrainConfig& tc) {
  if (tc.hardware_profile.empty() || tc.peak_gflops > 0) return std::nullopt;
  const HardwareProfile profile = load_profile(tc.hardware_profile);
  const PeakCompute& peak = profile.peak(tc.precision);
  if (peak.measured_flops_per_s <= 0)
    fail(fmt::format("train.hardware_profile '{}' has no measured {} GEMM peak "
                     "(compute.{}.measured_flops_per_s)",
                     profile.path, dtype_name(tc.precision), dtype_name(tc.precision)),
         "write a profile of this machine with `foundry bench all --out DIR` and name "
         "DIR/profile.json, or set train.peak_gflops");
  return DevicePeak{
      peak.measured_flops_per_s,
      fmt::format("profile {}, measured {} GEMM peak", profile.path, dtype_name(tc.precision)),
      profile.kind == "cpu"};
}

// `foundry train`: one process, or every rank under mpirun; rank 0 prints the summary.
void run_train(const ConfigArgs& args, TrainOptions options) {
  RunConfig rc = load_run_config(args.config_path, args.overrides);
  // Under mpirun every rank runs this; a plain run never initializes MPI.
  std::optional<MpiSession> session;
  if (launched_by_mpi()) session.emplace();
  options.world = session ? &session->world() : nullptr;
  options.profile_peak = profile_peak(rc.train);
  const TrainSummary s = train(rc, options);
  const bool root = !session || session->world().rank() == 0;
  if (session) session->finalize();
  if (s.interrupted) set_exit_code(kExitInterrupted);
  if (!root) return;
  if (s.already_complete) {
    std::printf(
        "the run in %s is already at step %lld = train.steps: nothing to train (pass "
        "--steps above it to train further)\n",
        rc.train.run_dir.c_str(), static_cast<long long>(s.final_step));
    return;
  }
  std::printf("trained steps %lld..%lld | final train loss %.4f",
              static_cast<long long>(s.start_step), static_cast<long long>(s.final_step),
              s.last_train_loss);
  if (s.initial_val_loss >= 0) std::printf(" | val loss before %.4f", s.initial_val_loss);
  if (s.final_val_loss >= 0) std::printf(" | val loss after %.4f", s.final_val_loss);
  std::printf(" | %.0f tokens/s | MFU %.1f%% of %.0f GFLOP/s (%s)\n", s.tokens_per_s, 100 * s.mfu,
              s.peak_gflops, s.peak_source.c_str());
}

// `foundry generate`: the prompt, continued by the model of a checkpoint.
struct GenArgs {
  ConfigArgs config;
  std::string checkpoint, prompt, tokenizer;
  int64_t max_new_tokens = 64, top_k = 0;
  double temperature = 0.8, top_p = 0.95;
  uint64_t seed = 0;
};

void run_generate(const GenArgs& g) {
  RunConfig rc = load_run_config(g.config.config_path, g.config.overrides);
  if (g.tokenizer.empty() && rc.data.dir.empty())
    fail("data.dir is empty and no --tokenizer is given: generate needs a tokenizer",
         "pass --tokenizer FILE, or set data.dir to the dataset the model was trained on");
  std::string tok_path = g.tokenizer.empty() ? rc.data.dir + "/tokenizer.model" : g.tokenizer;
  Tokenizer tok = Tokenizer::load(tok_path);
  if (tok.vocab_size() != rc.model.vocab_size)
    fail(fmt::format("tokenizer '{}' has {} pieces but model.vocab_size = {}", tok_path,
                     tok.vocab_size(), rc.model.vocab_size),
         "pass the tokenizer of the dataset the model was trained on");
  std::vector<int32_t> ids = tok.encode(g.prompt);
  // Training streams separate documents with EOS, so EOS is what precedes a document.
  ids.insert(ids.begin(), tok.eos_id());
  const int64_t max_len =
      std::min<int64_t>(rc.model.max_seq_len, static_cast<int64_t>(ids.size()) + g.max_new_tokens);
  if (static_cast<int64_t>(ids.size()) >= max_len)
    fail(fmt::format("the prompt is {} tokens; model.max_seq_len is {}", ids.size(),
                     rc.model.max_seq_len),
         "shorten the prompt");
  if (max_len < static_cast<int64_t>(ids.size()) + g.max_new_tokens)
    warn(
        fmt::format("generating at most {} tokens, not the {} of -n: the prompt ({} tokens "
                    "with the leading EOS) and the new tokens must fit model.max_seq_len = {}",
                    max_len - static_cast<int64_t>(ids.size()), g.max_new_tokens, ids.size(),
                    rc.model.max_seq_len));
  check_generate_memory(rc, max_len);
  const std::string dir = resolve_checkpoint(g.checkpoint, rc);
  const std::string tok_bytes = read_text_file(tok_path);
  check_checkpoint_tokenizer(dir, read_checkpoint_trainer_state(dir),
                             hash64(tok_bytes.data(), tok_bytes.size()),
                             fmt::format("tokenizer '{}'", tok_path));
  auto model = load_model(rc, dir, rc.train.precision);
  auto state = model->new_decode_state(max_len);
  const float* logits = nullptr;
  for (int32_t id : ids) logits = model->decode_step(state, id);
  Rng rng(g.seed);
  std::vector<int32_t> generated;
  while (static_cast<int64_t>(ids.size() + generated.size()) < max_len) {
    const int64_t position = static_cast<int64_t>(ids.size() + generated.size()) - 1;
    int32_t next =
        sample_token(logits, rc.model.vocab_size, position, g.temperature, g.top_k, g.top_p, rng);
    if (next == tok.eos_id()) break;
    generated.push_back(next);
    if (static_cast<int64_t>(ids.size() + generated.size()) >= max_len) break;
    logits = model->decode_step(state, next);
  }
  // Decode prompt and continuation together so word boundaries come out right.
  std::vector<int32_t> text(ids.begin() + 1, ids.end());
  text.insert(text.end(), generated.begin(), generated.end());
  std::printf("%s\n", tok.decode(text).c_str());
}

}  // namespace

void register_train_commands(CLI::App& app) {
  // ---- train ----
  {
    auto* cmd = app.add_subcommand("train", "Train a model from a run config");
    auto args = std::make_shared<ConfigArgs>();
    auto opts = std::make_shared<TrainOptions>();
    add_config_options(cmd, *args);
    cmd->add_option("--steps", opts->steps, "Override train.steps")
        ->check(in_range(int64_t{0}, int64_t{1} << 40));
    cmd->add_option("--stop-at-step", opts->stop_at_step,
                    "Checkpoint and stop after this step (the schedule still targets train.steps)")
        ->check(in_range(int64_t{1}, int64_t{1} << 40));
    auto* resume = cmd->add_flag_function(
        "--resume", [opts](int64_t) { opts->start = StartMode::resume; },
        "Continue the run in train.run_dir from its latest valid checkpoint (an error if it has "
        "none)");
    auto* auto_resume = cmd->add_flag_function(
        "--auto-resume", [opts](int64_t) { opts->start = StartMode::auto_resume; },
        "Continue the run if train.run_dir has a checkpoint, else start a new run");
    auto* overwrite = cmd->add_flag_function(
        "--overwrite", [opts](int64_t) { opts->start = StartMode::overwrite; },
        "Start a new run, removing the checkpoints and metrics of the run in train.run_dir");
    resume->excludes(auto_resume)->excludes(overwrite);
    auto_resume->excludes(overwrite);
    cmd->add_flag("--allow-config-change", opts->allow_config_change,
                  "With --resume: allow train.* settings that shape the run (lr, batch, seed, "
                  "schedule, ...) to differ from the run's config.json");
    cmd->add_flag("--synthetic-data", opts->synthetic_data,
                  "Train on uniformly random tokens (no dataset; for benchmarking)");
    cmd->add_flag("--op-breakdown", opts->op_breakdown,
                  "Time every operation and print a per-operation table at the end");
    cmd->add_flag("--quiet,-q", opts->quiet, "No per-step log lines");
    auto device = std::make_shared<std::string>();
    cmd->add_option("--device", *device,
                    "Where to train: cpu, cuda (GPU 0) or cuda:N (sets train.device)");
    cmd->callback([args, opts, device] {
      ConfigArgs with_device = *args;
      if (!device->empty()) with_device.overrides.push_back("train.device=" + *device);
      run_train(with_device, *opts);
    });
  }
  // ---- eval ----
  {
    auto* cmd = app.add_subcommand("eval", "Validation loss and perplexity of a checkpoint");
    auto args = std::make_shared<ConfigArgs>();
    auto ckpt = std::make_shared<std::string>();
    auto batches = std::make_shared<int64_t>(0);
    add_config_options(cmd, *args);
    cmd->add_option("--checkpoint", *ckpt, "Checkpoint directory (default: latest of the run)");
    cmd->add_option("--batches", *batches, "Validation batches (default: train.eval_batches)")
        ->check(in_range(int64_t{1}, int64_t{1} << 20));
    auto device = std::make_shared<std::string>();
    cmd->add_option("--device", *device,
                    "Where to compute: cpu, cuda (GPU 0) or cuda:N (sets train.device)");
    cmd->callback([args, ckpt, batches, device] {
      ConfigArgs with_device = *args;
      if (!device->empty()) with_device.overrides.push_back("train.device=" + *device);
      RunConfig rc = load_run_config(with_device.config_path, with_device.overrides);
      if (rc.data.dir.empty())
        fail("data.dir is empty: eval needs a prepared dataset",
             "set data.dir to the dataset the model was trained on (--set data.dir=DIR)");
      const std::unique_ptr<Backend> backend =
          open_backend(rc.train.device, "train.device " + rc.train.device.name());
      if (!rc.train.device.cuda) check_eval_memory(rc);  // the host's memory
      const std::string dir = resolve_checkpoint(*ckpt, rc);
      Dataset dataset(rc.data.dir);
      check_checkpoint_tokenizer(dir, read_checkpoint_trainer_state(dir),
                                 dataset.meta().tokenizer_checksum,
                                 fmt::format("data.dir '{}'", rc.data.dir));
      auto model = load_model(rc, dir, rc.train.precision, *backend);
      const int64_t B = rc.train.batch_size, T = rc.train.seq_len;
      BatchLoader loader = BatchLoader::for_eval(dataset, B, T);
      const int64_t n = *batches > 0 ? validation_batches(loader, *batches, "--batches")
                                     : validation_batches(loader, rc.train.eval_batches);
      const double loss = evaluate_loss(*model, loader, n);
      if (!std::isfinite(loss))
        fail(fmt::format("the validation loss of checkpoint '{}' is {} over {} batches", dir, loss,
                         n),
             "the weights are finite, so the forward pass overflowed; try --set "
             "train.precision=fp32, or an earlier checkpoint (--checkpoint)");
      std::printf("checkpoint %s\nval loss %.4f | perplexity %.2f | %lld tokens\n", dir.c_str(),
                  loss, std::exp(loss), static_cast<long long>(n * B * T));
    });
  }
  // ---- generate ----
  {
    auto* cmd = app.add_subcommand("generate", "Continue a prompt with a trained model");
    auto g = std::make_shared<GenArgs>();
    add_config_options(cmd, g->config);
    cmd->add_option("--checkpoint", g->checkpoint, "Checkpoint directory (default: latest)");
    cmd->add_option("--prompt,-p", g->prompt, "Prompt text")->required();
    cmd->add_option("--tokenizer", g->tokenizer,
                    "tokenizer.model (default: the dataset's, data.dir/tokenizer.model)");
    cmd->add_option("--max-new-tokens,-n", g->max_new_tokens, "Tokens to generate")
        ->check(in_range(int64_t{1}, int64_t{1} << 20));
    cmd->add_option("--temperature", g->temperature, "0 = greedy")->check(in_range(0.0, 100.0));
    cmd->add_option("--top-k", g->top_k, "Keep the k most likely tokens (0 = all)")
        ->check(in_range(int64_t{0}, int64_t{1} << 24));
    cmd->add_option("--top-p", g->top_p, "Nucleus sampling mass")->check(in_range(0.0, 1.0));
    cmd->add_option("--seed", g->seed, "Sampling seed (same seed, same text)");
    cmd->callback([g] { run_generate(*g); });
  }
}

}  // namespace foundry::cli
