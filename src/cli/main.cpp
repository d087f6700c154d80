// foundry: pretraining mixture-of-experts language models on the hardware at hand.
#include <cstdio>
#include <exception>

#include "base/error.h"
#include "base/exit_codes.h"
#include "bench/provenance.h"
#include "cli/commands.h"
#include "kernels/gemm.h"

namespace foundry::cli {
namespace {
int g_exit_code = kExitFinished;
}
void set_exit_code(int code) { g_exit_code = code; }
int exit_code() { return g_exit_code; }
}  // namespace foundry::cli

int main(int argc, char** argv) {
  CLI::App app{"foundry: train mixture-of-experts language models on CPUs and GPUs"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show help for every subcommand");
  app.set_version_flag("--version", foundry::version_text, "Show what this binary was built from");
  foundry::cli::register_data_commands(app);
  foundry::cli::register_model_commands(app);
  foundry::cli::register_train_commands(app);
  foundry::cli::register_bench_commands(app);
  foundry::cli::register_plan_commands(app);
  foundry::cli::register_ckpt_commands(app);
  foundry::cli::register_launch_command(app);
  foundry::set_command_line(argc, argv);
  try {
    foundry::gemm_rows_mode();  // a bad FOUNDRY_GEMM_ROWS fails before any command starts
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // prints help, or the error naming the option
    return code == 0 ? foundry::kExitFinished : foundry::kExitUsage;
  } catch (const foundry::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    if (!e.hint().empty()) std::fprintf(stderr, "hint: %s\n", e.hint().c_str());
    return foundry::kExitFailed;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return foundry::kExitFailed;
  }
  return foundry::cli::exit_code();
}
