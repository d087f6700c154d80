// foundry train | eval | generate (the work of eval and generate is in train/ and infer/)
#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/exit_codes.h"
#include "base/format.h"
#include "base/hash.h"
#include "base/io.h"
#include "base/memory_budget.h"
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
#include "infer/batch.h"
#include "infer/generation.h"
#include "infer/loading.h"
#include "infer/sampling.h"
#include "infer/scoring.h"
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

// `args` with --device's choice (if given) as a train.device override.
ConfigArgs with_device(const ConfigArgs& args, const std::string& device) {
  ConfigArgs out = args;
  if (!device.empty()) out.overrides.push_back("train.device=" + device);
  return out;
}

// train.hardware_profile's measured GEMM peak for the run's precision, per device; none when
// the config names no profile or gives train.peak_gflops (which wins).
std::optional<DevicePeak> profile_peak(const TrainConfig& tc, bool root) {
  if (tc.hardware_profile.empty() || tc.peak_gflops > 0) return std::nullopt;
  const HardwareProfile profile = load_profile(tc.hardware_profile);
  const char* device_kind = tc.device.cuda ? "gpu" : "cpu";
  if (root && profile.kind != device_kind)
    warn(
        fmt::format("train.hardware_profile '{}' is a {} profile ({}), and this run trains on "
                    "the {}: its MFU is against that device's peak",
                    profile.path, profile.kind, profile.name, device_kind));
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
  options.profile_peak = profile_peak(rc.train, !session || session->world().rank() == 0);
  const TrainSummary s = train(rc, options);
  const bool root = !session || session->world().rank() == 0;
  if (session) session->finalize();
  if (s.interrupted) set_exit_code(kExitInterrupted);
  if (!root || s.stopped_at_start) return;
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
  if (s.final_val_loss >= 0 && s.final_val_step == s.final_step)
    std::printf(" | val loss after %.4f", s.final_val_loss);
  else if (s.final_val_loss >= 0)  // interrupted between validations
    std::printf(" | val loss at step %lld %.4f", static_cast<long long>(s.final_val_step),
                s.final_val_loss);
  std::printf(" | %.0f tokens/s | MFU %.1f%% of %.0f GFLOP/s (%s)\n", s.tokens_per_s, 100 * s.mfu,
              s.peak_gflops, s.peak_source.c_str());
}

// `foundry eval`: the validation loss of a checkpoint, or (--choices) multiple-choice scores.
struct EvalArgs {
  ConfigArgs config;
  std::string checkpoint, device, choices, out, tokenizer;
  int64_t batches = 0;
  bool quiet = false;
};

void run_eval(const EvalArgs& e) {
  if (!e.out.empty())
    fail(fmt::format("--out '{}' is for multiple-choice scores, which need --choices", e.out),
         "leave out --out for the validation loss (it is printed), or score items with "
         "--choices FILE --out FILE");
  if (!e.tokenizer.empty())
    fail(fmt::format("--tokenizer '{}' is for --choices: the validation loss reads the tokens "
                     "of data.dir",
                     e.tokenizer),
         "leave out --tokenizer (data.dir names the dataset and its tokenizer)");
  const ConfigArgs args = with_device(e.config, e.device);
  RunConfig rc = load_run_config(args.config_path, args.overrides);
  if (rc.data.dir.empty())
    fail("data.dir is empty: eval needs a prepared dataset",
         "set data.dir to the dataset the model was trained on (--set data.dir=DIR)");
  const std::unique_ptr<Backend> backend =
      open_backend(rc.train.device, "train.device " + rc.train.device.name());
  const int64_t rows = eval_micro_batch_rows(rc);    // train.micro_batch_size divides the batch
  if (!rc.train.device.cuda) check_eval_memory(rc);  // the host's memory
  const std::string dir = infer::resolve_checkpoint(e.checkpoint, rc);
  Dataset dataset(rc.data.dir);
  const json state = read_checkpoint_trainer_state(dir);
  const std::string source = fmt::format("data.dir '{}'", rc.data.dir);
  check_checkpoint_tokenizer(dir, state, dataset.meta().tokenizer_checksum, source);
  warn_if_synthetic(dir, state, source);
  auto model = infer::load_model(rc, dir, rc.train.precision, *backend);
  const int64_t B = rc.train.batch_size, T = rc.train.seq_len;
  BatchLoader loader = BatchLoader::for_eval(dataset, B, T);
  const int64_t n = e.batches > 0 ? validation_batches(loader, e.batches, "--batches")
                                  : validation_batches(loader, rc.train.eval_batches);
  const double loss = evaluate_loss(*model, loader, n, nullptr, rows);
  if (!std::isfinite(loss))
    fail(fmt::format("the validation loss of checkpoint '{}' is {} over {} batches", dir, loss, n),
         "the weights are finite, so the forward pass overflowed; try --set "
         "train.precision=fp32, or an earlier checkpoint (--checkpoint)");
  std::printf("checkpoint %s\nval loss %.4f | perplexity %.2f | %lld tokens\n", dir.c_str(),
              loss, std::exp(loss), static_cast<long long>(n * B * T));
}

void run_eval_choices(const EvalArgs& e) {
  const ConfigArgs args = with_device(e.config, e.device);
  RunConfig rc = load_run_config(args.config_path, args.overrides);
  if (e.batches > 0)
    fail(fmt::format("--batches {} counts validation batches; --choices scores every item of "
                     "its file",
                     e.batches),
         "leave out --batches (or --choices, for the validation loss)");
  if (!e.out.empty())
    check_output_file(
        "--out", e.out,
        {{"--choices", e.choices}, {"--config", args.config_path}, {"--tokenizer", e.tokenizer}},
        infer::is_choice_scores);
  std::string tok_path;
  const data::Tokenizer tok = infer::load_tokenizer(rc, e.tokenizer, &tok_path);
  const std::unique_ptr<Backend> backend =
      open_backend(rc.train.device, "train.device " + rc.train.device.name());
  check_generate_memory(rc, rc.model.max_seq_len, memory_budget_of(rc.train.device));
  const std::string dir = infer::resolve_checkpoint(e.checkpoint, rc);
  infer::check_tokenizer_of(dir, tok_path);
  auto model = infer::load_model(rc, dir, rc.train.precision, *backend);
  const infer::ChoiceSummary s = infer::run_choice_eval(*model, tok, e.choices, e.out, e.quiet);
  // With the scores on stdout (--out /dev/stdout), the summary goes to stderr.
  std::FILE* const report = !e.out.empty() && is_stream_file(e.out) ? stderr : stdout;
  std::fprintf(report, "checkpoint %s\n%lld items scored", dir.c_str(),
               static_cast<long long>(s.items - s.invalid));
  if (s.invalid > 0)
    std::fprintf(report, " (%lld invalid lines skipped)", static_cast<long long>(s.invalid));
  if (s.with_answer > 0)
    std::fprintf(report, " | accuracy %.4f (%lld of %lld) | by mean per-token log-likelihood %.4f",
                 static_cast<double>(s.correct) / s.with_answer, static_cast<long long>(s.correct),
                 static_cast<long long>(s.with_answer),
                 static_cast<double>(s.correct_by_mean) / s.with_answer);
  if (!e.out.empty()) std::fprintf(report, " | scores in %s", e.out.c_str());
  std::fprintf(report, "\n");
}

// `foundry generate`: a prompt (or, with --batch, a file of requests) continued by the model
// of a checkpoint.
struct GenArgs {
  ConfigArgs config;
  std::string device;
  std::string checkpoint, prompt, tokenizer, batch, out;
  bool prompt_given = false;  // --prompt, maybe "" (a document from its start)
  bool n_given = false;       // -n: fewer tokens than it asks for are warned about
  int64_t max_new_tokens = 64;
  infer::SamplingOptions sampling;
  uint64_t seed = 0;
  bool stop_on_error = false, quiet = false, no_sharing = false, ignore_eos = false;
  int64_t batch_tokens = 64, max_requests = 0;
  std::string kv_memory;  // a size; empty: default_kv_memory
  std::string schedule = "prefix-tree", trace;
};

// The model that computes a batch's results, for their keys: the checkpoint
// (checkpoint_checksum), the tokenizer, the precision and the device
// kind (a GPU's products round differently from the CPU's).
uint64_t batch_model_identity(const std::string& checkpoint_dir, const data::Tokenizer& tok,
                              const RunConfig& rc) {
  const std::string identity =
      fmt::format("{} {:016x} {} {}", checkpoint_checksum(checkpoint_dir), tok.checksum(),
                  dtype_name(rc.train.precision), rc.train.device.cuda ? "cuda" : "cpu");
  return hash64(identity.data(), identity.size());
}

void run_generate_batch(const GenArgs& g, infer::Schedule schedule, const RunConfig& rc,
                        const MemoryBudget& budget, const data::Tokenizer& tok, Model& model,
                        const std::string& checkpoint_dir) {
  infer::BatchOptions o;
  o.engine.max_rows = g.batch_tokens;
  o.engine.max_requests = g.max_requests;
  o.engine.share_prefixes = !g.no_sharing;
  o.engine.schedule = schedule;
  o.trace = g.trace;
  o.engine.kv_budget_bytes =
      g.kv_memory.empty() ? default_kv_memory(rc, budget)
                          : parse_memory_size(g.kv_memory, "--kv-memory");
  if (!g.kv_memory.empty()) warn_kv_memory_over_budget(rc, o.engine.kv_budget_bytes, budget);
  o.in = g.batch;
  o.out = g.out;
  o.defaults = {g.max_new_tokens, g.sampling, g.seed, g.ignore_eos,
                batch_model_identity(checkpoint_dir, tok, rc)};
  o.stop_on_error = g.stop_on_error;
  o.quiet = g.quiet;
  const infer::BatchSummary s = infer::run_generation_batch(model, tok, o);
  // With the results on stdout (--out /dev/stdout), the summary goes to stderr.
  std::FILE* const report = is_stream_file(g.out) ? stderr : stdout;
  std::fprintf(
      report,
      "%lld requests: %lld generated now (%lld tokens in %.2f s, %.0f tokens/s), %lld already "
      "done, %lld invalid | results in %s\n",
      static_cast<long long>(s.requests), static_cast<long long>(s.generated),
      static_cast<long long>(s.generated_tokens), s.seconds,
      s.generated_tokens / std::max(s.seconds, 1e-9), static_cast<long long>(s.already_done),
      static_cast<long long>(s.invalid), g.out.c_str());
  std::fprintf(report,
               "context tokens %lld (prompts with their document-start tokens), computed %lld "
               "(schedule %s) | %lld steps | KV memory at most %s of "
               "%s",
               static_cast<long long>(s.prompt_tokens), static_cast<long long>(s.prefill_tokens),
               infer::schedule_name(o.engine.schedule), static_cast<long long>(s.steps),
               format_bytes(static_cast<double>(s.peak_kv_bytes)).c_str(),
               o.engine.kv_budget_bytes > 0
                   ? format_bytes(static_cast<double>(o.engine.kv_budget_bytes)).c_str()
                   : "no limit");
  if (o.engine.schedule == infer::Schedule::lru)
    std::fprintf(report, " | %lld cached prefixes evicted", static_cast<long long>(s.evictions));
  std::fprintf(report, "\n");
  if (s.interrupted_by != 0) {
    std::fprintf(stderr,
                 "interrupted by %s: %lld of the %lld requests have their results in %s; run "
                 "the same command again to generate the rest\n",
                 s.interrupted_by == SIGINT ? "SIGINT" : "SIGTERM",
                 static_cast<long long>(s.already_done + s.generated),
                 static_cast<long long>(s.requests - s.invalid), g.out.c_str());
    set_exit_code(kExitInterrupted);
  }
}

// The options of --batch mean nothing to one prompt: given with --prompt, they are refused
// rather than ignored (a user who asked for a file would get none).
void check_prompt_options(const GenArgs& g) {
  for (const auto& [flag, value] : {std::pair<const char*, const std::string&>{"--out", g.out},
                                    {"--trace", g.trace},
                                    {"--kv-memory", g.kv_memory}})
    if (!value.empty())
      fail(fmt::format("{} '{}' is for --batch: one --prompt prints its text", flag, value),
           fmt::format("leave out {}, or run the prompt as a request of a --batch file", flag));
}

void run_generate(const GenArgs& g) {
  const ConfigArgs args = with_device(g.config, g.device);
  RunConfig rc = load_run_config(args.config_path, args.overrides);
  if (g.batch.empty() != g.prompt_given)
    fail(g.batch.empty() ? "generate needs --prompt TEXT or --batch FILE"
                         : "generate takes --prompt or --batch, not both",
         "--prompt continues one text; --batch IN.jsonl --out OUT.jsonl runs a file of "
         "requests");
  if (!g.batch.empty() && g.out.empty())
    fail("generate --batch needs --out FILE", "name the JSONL file the results go to");
  if (g.batch.empty()) check_prompt_options(g);
  const infer::Schedule schedule = infer::parse_schedule(g.schedule, "--schedule");
  if (!g.batch.empty()) {
    // --out is resumed when it holds these requests' results (infer/batch.h says how).
    check_output_file(
        "--out", g.out,
        {{"--batch", g.batch}, {"--config", args.config_path}, {"--tokenizer", g.tokenizer}});
    if (!g.trace.empty())
      check_output_file("--trace", g.trace,
                        {{"--batch", g.batch},
                         {"--out", g.out},
                         {"--config", args.config_path},
                         {"--tokenizer", g.tokenizer}},
                        infer::is_batch_trace);
  }
  std::string tok_path;
  const data::Tokenizer tok = infer::load_tokenizer(rc, g.tokenizer, &tok_path);
  std::vector<int32_t> ids;
  int64_t max_len = rc.model.max_seq_len;
  if (g.batch.empty()) {
    ids = tok.encode(g.prompt);
    // Training streams separate documents with EOS, so EOS is what precedes a document.
    ids.insert(ids.begin(), tok.eos_id());
    const int64_t n = static_cast<int64_t>(ids.size());
    if (n >= rc.model.max_seq_len)
      fail(fmt::format("the prompt is {} tokens ({} with the leading EOS); model.max_seq_len "
                       "is {}, and a new token needs room",
                       n - 1, n, rc.model.max_seq_len),
           "shorten the prompt");
    const int64_t room = infer::new_token_room(rc.model, n, g.max_new_tokens);
    if (room < g.max_new_tokens && g.n_given)
      warn(fmt::format(
          "generating at most {} tokens, not the {} of -n: the prompt ({} tokens with the "
          "leading EOS) and the new tokens must fit model.max_seq_len = {}",
          room, g.max_new_tokens, n, rc.model.max_seq_len));
    max_len = n + room;
  }
  const std::unique_ptr<Backend> backend =
      open_backend(rc.train.device, "train.device " + rc.train.device.name());
  const MemoryBudget budget = memory_budget_of(rc.train.device);
  check_generate_memory(rc, max_len, budget);
  const std::string dir = infer::resolve_checkpoint(g.checkpoint, rc);
  infer::check_tokenizer_of(dir, tok_path);
  auto model = infer::load_model(rc, dir, rc.train.precision, *backend);
  if (!g.batch.empty()) return run_generate_batch(g, schedule, rc, budget, tok, *model, dir);
  const infer::Generation gen =
      infer::generate(*model, ids, g.max_new_tokens, g.ignore_eos ? -1 : tok.eos_id(),
                      g.sampling, g.seed);
  // Decode prompt and continuation together so word boundaries come out right.
  std::vector<int32_t> text(ids.begin() + 1, ids.end());
  text.insert(text.end(), gen.tokens.begin(), gen.tokens.end());
  // Whole, NUL bytes included (byte-fallback tokens can decode to any byte).
  const std::string out = tok.decode(text) + "\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
}

void add_train_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("train", "Train a model from a run config");
  auto args = std::make_shared<ConfigArgs>();
  auto opts = std::make_shared<TrainOptions>();
  add_config_options(cmd, *args);
  cmd->add_option("--steps", opts->steps, "Override train.steps")
      ->check(in_range(int64_t{0}, int64_t{1} << 40));
  cmd->add_option("--stop-at-step", opts->stop_at_step,
                  "Validate, checkpoint and stop after this step (the schedule still targets "
                  "train.steps)")
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
  cmd->callback([args, opts, device] { run_train(with_device(*args, *device), *opts); });
}

void add_eval_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "eval", "Validation loss and perplexity of a checkpoint, or multiple-choice scores");
  auto e = std::make_shared<EvalArgs>();
  add_config_options(cmd, e->config);
  cmd->add_option("--checkpoint", e->checkpoint,
                  "Checkpoint directory (default: latest of the run)");
  cmd->add_option("--batches", e->batches, "Validation batches (default: train.eval_batches)")
      ->check(in_range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--device", e->device,
                  "Where to compute: cpu, cuda (GPU 0) or cuda:N (sets train.device)");
  CLI::Option* choices =
      cmd->add_option("--choices", e->choices,
                      "Score multiple-choice items instead, JSONL: {\"context\": \"...\", "
                      "\"choices\": [\"...\", \"...\"], \"answer\": 0} a line (answer optional)");
  cmd->add_option("--out", e->out,
                  "With --choices: each item's scores, JSONL in the items' order");
  cmd->add_option("--tokenizer", e->tokenizer,
                  "With --choices: tokenizer.model (default: data.dir/tokenizer.model)");
  cmd->add_flag("--quiet,-q", e->quiet, "With --choices: no progress line")->needs(choices);
  cmd->callback([e] { e->choices.empty() ? run_eval(*e) : run_eval_choices(*e); });
}

void add_generate_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("generate", "Continue a prompt with a trained model");
  auto g = std::make_shared<GenArgs>();
  add_config_options(cmd, g->config);
  cmd->add_option("--checkpoint", g->checkpoint, "Checkpoint directory (default: latest)");
  cmd->add_option("--device", g->device,
                  "Where to decode: cpu, cuda (GPU 0) or cuda:N (sets train.device)");
  CLI::Option* prompt =
      cmd->add_option("--prompt,-p", g->prompt, "Prompt text (\"\": a document from its start)");
  CLI::Option* batch = cmd->add_option(
      "--batch", g->batch,
      "Requests to run, JSONL: {\"prompt\": \"...\"} or {\"prompt_ids\": [...]} a "
      "line, optionally max_new_tokens, temperature, top_k, top_p, seed, ignore_eos");
  cmd->add_option("--out", g->out,
                  "With --batch: the results, JSONL in the requests' order (an existing file "
                  "of these requests' results is resumed)");
  // Batch-only options given with one --prompt are refused, never ignored (CLI11's needs;
  // --out, --trace and --kv-memory get check_prompt_options's own message).
  cmd->add_flag("--stop-on-error", g->stop_on_error,
                "With --batch: an invalid request line stops the run before any work")
      ->needs(batch);
  cmd->add_flag("--quiet,-q", g->quiet, "With --batch: no progress line")->needs(batch);
  cmd->add_option("--batch-tokens", g->batch_tokens,
                  "With --batch: tokens per step (decode tokens of many requests and runs "
                  "of prompt tokens together)")
      ->check(in_range(int64_t{1}, int64_t{4096}))
      ->needs(batch);
  cmd->add_flag("--no-prefix-sharing", g->no_sharing,
                "With --batch: compute every request's whole prompt (to measure what sharing "
                "saves)")
      ->needs(batch);
  cmd->add_option("--schedule", g->schedule,
                  "With --batch: prefix-tree (the default: each shared prefix's requests "
                  "together, computed once), or a baseline to measure it against: lru "
                  "(arrival order over a prefix cache that evicts the least recently used), "
                  "fixed (batches of --max-requests in arrival order, nothing shared)")
      ->needs(batch);
  cmd->add_option("--max-requests", g->max_requests,
                  "With --batch: requests in flight at most (default: --batch-tokens)")
      ->check(in_range(int64_t{1}, int64_t{1} << 20))
      ->needs(batch);
  cmd->add_option("--trace", g->trace,
                  "With --batch: a line per step to this file (TSV: seconds, requests done, "
                  "generated tokens, KV bytes in use, requests running, prompt and decode tokens "
                  "computed so far)");
  cmd->add_option("--kv-memory", g->kv_memory,
                  "With --batch: memory for KV caches, e.g. 2G (default: 80% of what the "
                  "memory budget leaves beside the weights; no limit without a budget)");
  cmd->add_option("--tokenizer", g->tokenizer,
                  "tokenizer.model (default: the dataset's, data.dir/tokenizer.model)");
  CLI::Option* n =
      cmd->add_option("--max-new-tokens,-n", g->max_new_tokens,
                      "Tokens to generate (default 64, fewer where model.max_seq_len leaves less "
                      "room; with --batch: for requests that do not say)")
          ->check(in_range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--temperature", g->sampling.temperature, "0 = greedy")
      ->check(in_range(0.0, 100.0))
      ->capture_default_str();
  cmd->add_option("--top-k", g->sampling.top_k, "Keep the k most likely tokens (0 = all)")
      ->check(in_range(int64_t{0}, int64_t{1} << 24))
      ->capture_default_str();
  cmd->add_option("--top-p", g->sampling.top_p, "Nucleus sampling mass")
      ->check(in_range(0.0, 1.0))
      ->capture_default_str();
  cmd->add_flag("--ignore-eos", g->ignore_eos,
                "Generate all --max-new-tokens, past the end-of-sequence token (with --batch: "
                "for requests that do not say)");
  cmd->add_option("--seed", g->seed,
                  "Sampling seed (same seed, same text; with --batch, request i's default "
                  "seed is this + i)")
      ->check(seed_value());
  cmd->callback([g, prompt, n] {
    g->prompt_given = prompt->count() > 0;
    g->n_given = n->count() > 0;
    run_generate(*g);
  });
}

}  // namespace

void register_train_commands(CLI::App& app) {
  add_train_command(app);
  add_eval_command(app);
  add_generate_command(app);
}

}  // namespace foundry::cli
