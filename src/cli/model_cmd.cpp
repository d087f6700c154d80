// foundry model info: what a model config costs (parameters, FLOPs per token, memory) and
// which optimizer updates each parameter group, computed from the config without
// allocating the model.
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/format.h"
#include "cli/commands.h"
#include "model/info.h"
#include "optim/muon.h"
#include "optim/zero1.h"
#include "train/preflight.h"
#include "train/run_config.h"

namespace foundry::cli {

namespace {

struct ModelInfoOptions {
  std::string config_path;
  std::vector<std::string> overrides;
  int64_t batch = 0;  // 0 = train.batch_size
  int64_t seq = 0;    // 0 = train.seq_len
  std::string optimizer;  // "" = train.optimizer
  int64_t dp = 1;         // data-parallel ranks for the ZeRO-1 memory report
  int64_t ep = 1;         // expert-parallel group size for the weight storage report
  int64_t cp = 0;         // context-parallel ranks per sequence (0 = train.context_parallel)
  bool json = false;
};

// The layouts `foundry train` runs, checked (--dp ranks in groups of --ep, cp ranks per
// sequence, the batch split over the dp / cp groups that hold different sequences); returns
// the sequences the largest rank runs.
int64_t check_rank_layout_of(const ModelInfoOptions& o, int64_t cp, int64_t batch,
                             bool batch_given) {
  if (o.dp < 1)
    fail(fmt::format("--dp {} must be >= 1", o.dp),
         "pass the number of data-parallel ranks, or leave it out for one process");
  if (o.ep < 1 || o.dp % o.ep != 0)
    fail(fmt::format("--ep {} must divide --dp {} (the ranks form groups of --ep ranks)", o.ep,
                     o.dp),
         "pass --dp N (all ranks) and an --ep that divides it and model.n_experts");
  if (o.dp > 1 && o.dp % cp != 0)
    fail(fmt::format("--dp {} ranks cannot form context-parallel groups of {} ({})", o.dp, cp,
                     o.cp > 0 ? "--cp" : "train.context_parallel"),
         "pass a --dp that is a multiple of the context-parallel size, or another --cp");
  // A --batch given is the global batch and must split; train.batch_size of a config written
  // for fewer ranks is counted as the largest rank's share, ceil(batch / groups), and said.
  const int64_t groups = std::max<int64_t>(1, o.dp / cp);
  const std::string split =
      fmt::format("{} {} sequences cannot be split evenly over {} {}",
                  batch_given ? "--batch" : "train.batch_size =", batch, groups,
                  cp > 1 ? fmt::format("context-parallel groups ({} ranks of {})", o.dp, cp)
                         : std::string("data-parallel ranks"));
  if (o.dp > 1 && batch % groups != 0 && batch_given)
    fail(split, fmt::format("pass a --batch that is a multiple of {} (the global batch), or "
                            "another --dp",
                            groups));
  if (o.dp > 1 && batch % groups != 0 && !o.json)  // (--json: zero1.rank_sequences)
    std::fprintf(stderr,
                 "note: %s: the largest rank's share, %lld, is counted (pass --batch for the "
                 "global batch)\n",
                 split.c_str(), static_cast<long long>((batch + groups - 1) / groups));
  return (batch + groups - 1) / groups;
}

void run_model_info(const ModelInfoOptions& o, bool batch_given, bool seq_given) {
  const RunConfig rc = load_run_config(o.config_path, o.overrides);
  const int64_t batch = batch_given ? o.batch : rc.train.batch_size;
  const int64_t seq = seq_given ? o.seq : rc.train.seq_len;
  if (batch < 1)
    fail(fmt::format("--batch {} must be >= 1", batch),
         "pass the sequences per step, or leave it out to use train.batch_size");
  if (seq < 1)
    fail(fmt::format("--seq {} must be >= 1", seq),
         "pass the sequence length, or leave it out to use train.seq_len");
  if (seq > rc.model.max_seq_len)
    fail(fmt::format("--seq {} exceeds model.max_seq_len = {}", seq, rc.model.max_seq_len),
         "raise it with --set model.max_seq_len=N or choose a shorter --seq");
  const DType precision = rc.train.precision;
  // --optimizer is one of CLI11's checked choices.
  const OptimizerKind optimizer =
      o.optimizer.empty() ? rc.train.optimizer : parse_optimizer(o.optimizer).value();
  const bool muon = optimizer == OptimizerKind::muon;
  const int64_t cp = o.cp > 0 ? o.cp : rc.train.context_parallel;
  ModelInfo info = model_info(
      rc.model, batch, seq, precision, optimizer_name(optimizer),
      [muon](const ParamInfo& p) { return optimizer_for(p, muon); }, cp);
  // With train.micro_batch_size, one micro-batch's activations are in memory at a time.
  const int64_t micro =
      o.dp > 1
          ? batch
          : checked_micro_batch_rows(
                rc.train, batch,
                fmt::format("the {} sequence{} of the batch ({})", batch, batch == 1 ? "" : "s",
                            batch_given ? "--batch" : "train.batch_size"));
  if (micro < batch) {
    info.memory = estimate_memory(rc.model, micro, seq, precision, muon, cp);
    info.activation_batch = micro;
  }
  // The run's checkpoint copies, as the trainer's memory check counts them (--dp: ZeRO-1's).
  RunConfig run = rc;
  run.train.optimizer = optimizer;
  run.train.zero1 = true;
  const auto copies = [&](int ranks) {
    const int64_t snapshot = rank_checkpoint_bytes(run, ranks);
    return std::pair{run.train.checkpoint_async ? snapshot : 0,
                     run.train.memory_checkpoint_every > 0 ? 2 * snapshot : 0};
  };
  add_checkpoint_copies(info.memory, copies(1).first, copies(1).second);
  const int64_t rank_batch = check_rank_layout_of(o, cp, batch, batch_given);
  std::optional<Zero1MemoryReport> zero1;
  std::optional<ExpertStorageReport> storage;
  int64_t rank_total = 0;  // ZeRO-1 without expert parallelism: all of a rank's memory
  if (o.dp > 1) {
    // The parameter table holds names and offsets only: nothing of the model is allocated.
    const ParamTable table(rc.model);
    zero1 = zero1_memory(table, static_cast<int>(o.dp), muon);
    // A rank runs its group's batch / (dp / cp) sequences (seq / cp tokens of each): its
    // activations, with the replicated slabs and its share of the optimizer state.
    const int64_t rank_micro = checked_micro_batch_rows(
        rc.train, rank_batch,
        fmt::format("a rank's {} sequence{} of the batch ({} over --dp {})", rank_batch,
                    rank_batch == 1 ? "" : "s", batch, o.dp));
    const MemoryEstimate m = estimate_memory(rc.model, rank_micro, seq, precision, muon, cp);
    rank_total = zero1->replicated_bytes + m.weights_bf16_bytes + zero1->peak.total_bytes() +
                 m.activations_bytes + m.backward_buffers_bytes +
                 copies(static_cast<int>(o.dp)).first + copies(static_cast<int>(o.dp)).second;
    if (o.ep > 1)
      storage = expert_storage(table, Zero1Layout(table, static_cast<int>(o.dp), muon),
                               ExpertSharding(rc.model.n_experts, static_cast<int>(o.ep)));
  }
  if (o.json) {
    json out = to_json(info);
    out["config_path"] = o.config_path;
    if (zero1) {
      out["zero1"] = {{"dp", o.dp},
                      {"rank_sequences", rank_batch},
                      {"optimizer_bytes_per_rank_peak", zero1->peak.total_bytes()},
                      {"adamw_state_bytes", zero1->peak.adamw_state_bytes},
                      {"muon_momentum_bytes", zero1->peak.muon_momentum_bytes},
                      {"exchange_bytes", zero1->peak.exchange_bytes},
                      {"gather_everything_peak_bytes", zero1->gather_peak_bytes},
                      {"replicated_bytes", zero1->replicated_bytes},
                      {"checkpoint_snapshot_bytes", copies(static_cast<int>(o.dp)).first},
                      {"memory_checkpoints_bytes", copies(static_cast<int>(o.dp)).second}};
      if (o.ep == 1) out["zero1"]["bytes_per_rank_peak"] = rank_total;
    }
    if (storage)
      out["expert_storage"] = {{"ep", storage->ep},
                               {"rank", storage->rank},
                               {"slab_elements", storage->slab_elements},
                               {"weight_elements", storage->weight_elements},
                               {"gradient_elements", storage->gradient_elements}};
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    std::printf("config: %s\n%s", o.config_path.c_str(), format_model_info(info).c_str());
    if (micro_batch_rows(rc.train, o.dp > 1 ? rank_batch : batch) < (o.dp > 1 ? rank_batch : batch))
      std::printf(
          "(activations: one micro-batch of %lld sequences at a time, "
          "train.micro_batch_size)\n",
          static_cast<long long>(rc.train.micro_batch_size));
    if (zero1)
      std::printf("\nZeRO-1 over %lld data-parallel ranks (optimizer state per rank):\n%s",
                  static_cast<long long>(o.dp), format_zero1_memory(*zero1).c_str());
    if (zero1 && o.ep == 1)
      fmt::print("per rank in all (the largest, running {}{} of the {} sequences): {}\n",
                 cp > 1 ? fmt::format("{} tokens of each of ", seq / cp) : "", rank_batch, batch,
                 format_bytes(static_cast<double>(rank_total)));
    if (storage)
      std::printf("\n%s", format_expert_storage(*storage, precision == DType::bf16).c_str());
  }
}

}  // namespace

void register_model_commands(CLI::App& app) {
  CLI::App* model = app.add_subcommand("model", "Inspect model configurations");
  model->require_subcommand(1);
  CLI::App* info = model->add_subcommand(
      "info", "Parameter counts, training FLOPs per token and memory of a config");
  auto o = std::make_shared<ModelInfoOptions>();
  info->add_option("--config", o->config_path, "Run config JSON (model, train, data)")
      ->required();
  info->add_option("--set", o->overrides, "Override a config field, e.g. model.d_model=256")
      ->type_name("KEY=VALUE");
  CLI::Option* batch = info->add_option("--batch", o->batch, "Sequences per step "
                                                             "(default: train.batch_size)");
  CLI::Option* seq = info->add_option("--seq", o->seq, "Sequence length (default: train.seq_len)");
  info->add_option("--optimizer", o->optimizer,
                   "Optimizer to report (default: train.optimizer): which one updates each "
                   "parameter group, and its state's memory")
      ->check(CLI::IsMember({"adamw", "muon"}));
  info->add_option("--dp", o->dp, "Also report ZeRO-1 optimizer memory per rank over N "
                                  "data-parallel ranks");
  info->add_option("--cp", o->cp, "Context-parallel ranks per sequence (default "
                   "train.context_parallel): memory per rank and bytes each sends per step")
      ->check(in_range(int64_t{1}, int64_t{1} << 30));
  info->add_option("--ep", o->ep, "With --dp: also report the weights and gradients each rank "
                                  "stores when experts are sharded over groups of P ranks");
  info->add_flag("--json", o->json, "Print JSON instead of a table");
  info->callback([o, batch, seq] { run_model_info(*o, batch->count() > 0, seq->count() > 0); });
}

}  // namespace foundry::cli
