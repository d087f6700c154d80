// `foundry ckpt info | verify | export`: argument parsing only; the work is in ckpt/inspect.h
// and ckpt/export.h.
#include <cstdio>
#include <memory>
#include <string>

#include <fmt/ranges.h>

#include "base/error.h"
#include "ckpt/export.h"
#include "ckpt/inspect.h"
#include "cli/commands.h"

namespace foundry::cli {

namespace {

struct CkptArgs {
  std::string dir;
  std::string hf_out;
  bool json = false;
};

void run_info(const CkptArgs& args) {
  const CheckpointInfo info = inspect_checkpoint(args.dir);
  if (args.json)
    std::printf("%s\n", to_json(info).dump(2).c_str());
  else
    std::printf("%s", format_checkpoint_info(info).c_str());
  std::fflush(stdout);
  if (!info.problems.empty())
    fail(fmt::format("{} is not a usable checkpoint: {}", args.dir, fmt::join(info.problems, "; ")),
         "`foundry ckpt verify` checks the data too; resume from another checkpoint");
}

void run_verify(const CkptArgs& args) {
  const VerifyReport report = verify_checkpoint_data(args.dir);
  std::printf("%s", format_verify_report(args.dir, report).c_str());
}

void run_export(const CkptArgs& args) {
  if (args.hf_out.empty())
    fail(fmt::format("ckpt export {}: no output directory", args.dir),
         "pass --hf OUT, a new or empty directory for the Hugging Face model");
  const ExportReport report = export_hf_model(args.dir, args.hf_out);
  std::printf("exported %s to %s: model.safetensors (%lld tensors, %lld bytes) and config.json "
              "in %.2f s\n",
              args.dir.c_str(), args.hf_out.c_str(), static_cast<long long>(report.tensors),
              static_cast<long long>(report.bytes), report.seconds);
}

CLI::App* add_dir_command(CLI::App& ckpt, const char* name, const char* description,
                          const std::shared_ptr<CkptArgs>& args) {
  CLI::App* cmd = ckpt.add_subcommand(name, description);
  cmd->add_option("dir", args->dir, "Checkpoint directory, e.g. RUN_DIR/checkpoints/step_00001000")
      ->required();
  return cmd;
}

}  // namespace

void register_ckpt_commands(CLI::App& app) {
  CLI::App* ckpt = app.add_subcommand("ckpt", "Inspect, verify and export checkpoints");
  ckpt->require_subcommand(1);
  auto args = std::make_shared<CkptArgs>();

  CLI::App* info = add_dir_command(
      *ckpt, "info", "Format, step, layout, model, saved tensors and files of a checkpoint", args);
  info->add_flag("--json", args->json, "Print a JSON object instead of text");
  info->callback([args] { run_info(*args); });

  CLI::App* verify = add_dir_command(
      *ckpt, "verify", "Read every byte of a checkpoint and check every checksum", args);
  verify->callback([args] { run_verify(*args); });

  CLI::App* exp = add_dir_command(
      *ckpt, "export", "Write a checkpoint as a Hugging Face model directory", args);
  exp->add_option("--hf", args->hf_out,
                  "Directory to write (new or empty): model.safetensors and config.json");
  exp->callback([args] { run_export(*args); });
}

}  // namespace foundry::cli
