// foundry: pretraining mixture-of-experts language models on the hardware at hand.
#include <fmt/format.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>

#include "base/error.h"
#include "base/exit_codes.h"
#include "base/interrupt.h"
#include "bench/provenance.h"
#include "cli/commands.h"
#include "comm/launch.h"
#include "kernels/gemm.h"

namespace foundry::cli {
namespace {
int g_exit_code = kExitFinished;
}
void set_exit_code(int code) { g_exit_code = code; }
int exit_code() { return g_exit_code; }

namespace {

// Only train and bench run as several ranks. Any other command started as one of N > 1 ranks
// (mpirun -np N foundry generate ...) would do the whole job N times over, writing the same
// files at once: it is refused before it starts.
void refuse_many_ranks(int argc, char** argv) {
  const int ranks = launched_world_size();
  if (ranks <= 1) return;
  const char* command = nullptr;  // the subcommand: the first argument that is not an option
  for (int i = 1; i < argc && !command; ++i)
    if (argv[i][0] != '-') command = argv[i];
  if (!command || !std::strcmp(command, "train") || !std::strcmp(command, "bench")) return;
  const bool launch = !std::strcmp(command, "launch");
  fail(fmt::format("foundry {} runs as one process, but the MPI launcher started {} ranks of "
                   "it: each would do the whole job and write the same files",
                   command, ranks),
       fmt::format("run it without mpirun; only `foundry train` and `foundry bench` run as "
                   "several ranks{}",
                   launch ? " (`foundry launch --np N` starts mpirun itself)" : ""));
}

// What a command printed must have reached its destination: a full disk or a closed pipe
// under `foundry ... > FILE` fails the command instead of leaving an empty file behind.
int check_stdout_written(int code) {
  errno = 0;
  const bool failed = std::fflush(stdout) != 0 || std::ferror(stdout) != 0;
  if (!failed) return code;
  const int err = errno;
  // An earlier flush that failed leaves the error flag, not the reason.
  std::fprintf(
      stderr, "error: cannot write the standard output: %s\n",
      err ? std::strerror(err) : "a write failed (a full file system, or a closed output?)");
  if (err == ENOSPC || err == EDQUOT)
    std::fprintf(stderr, "hint: the file system the output goes to is full: free space there\n");
  return code == kExitFinished ? kExitFailed : code;
}

}  // namespace
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
  // A first word that names no command: said as such (CLI11 would ask for a subcommand).
  if (argc > 1 && argv[1][0] != '-') {
    std::string names;
    bool known = false;
    for (const CLI::App* sub : app.get_subcommands({})) {
      known = known || sub->get_name() == argv[1];
      names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    if (!known) {
      std::fprintf(stderr,
                   "error: unknown command '%s'\nhint: the commands are %s (foundry "
                   "--help says what each does)\n",
                   argv[1], names.c_str());
      return foundry::kExitUsage;
    }
  }
  try {
    foundry::gemm_rows_mode();  // a bad FOUNDRY_GEMM_ROWS fails before any command starts
    foundry::cli::refuse_many_ranks(argc, argv);
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // prints help, or the error naming the option
    return foundry::cli::check_stdout_written(code == 0 ? foundry::kExitFinished
                                                        : foundry::kExitUsage);
  } catch (const foundry::Interrupted& e) {
    std::fprintf(stderr, "%s\n", e.what());
    foundry::die_by_signal(e.signal());
  } catch (const foundry::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    if (!e.hint().empty()) std::fprintf(stderr, "hint: %s\n", e.hint().c_str());
    return foundry::kExitFailed;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return foundry::kExitFailed;
  }
  return foundry::cli::check_stdout_written(foundry::cli::exit_code());
}
