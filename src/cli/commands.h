// Each subcommand group registers itself on the root CLI::App. Callbacks throw
// foundry::Error on failure; main() prints it and exits with kExitFailed (base/exit_codes.h).
// A callback that ends otherwise than "finished" (an interrupted run) sets its exit code.
#pragma once
#include <CLI/CLI.hpp>

namespace foundry::cli {

void set_exit_code(int code);  // the status main() returns when the callback ends normally
int exit_code();

void register_data_commands(CLI::App& app);   // data prepare          (cli/data_cmd.cpp)
void register_model_commands(CLI::App& app);  // model info            (cli/model_cmd.cpp)
void register_train_commands(CLI::App& app);  // train, eval, generate (cli/train_cmd.cpp)
void register_bench_commands(CLI::App& app);  // bench ...             (cli/bench_cmd.cpp)
void register_plan_commands(CLI::App& app);   // plan                  (cli/plan_cmd.cpp)
void register_ckpt_commands(CLI::App& app);   // ckpt info, verify, export (cli/ckpt_cmd.cpp)
void register_launch_command(CLI::App& app);  // launch                (cli/launch_cmd.cpp)

// Subcommands of `bench`, each in its own file.
void register_bench_comm_command(CLI::App& bench);   // bench comm          (cli/bench_comm_cmd.cpp)
void register_bench_gemm_commands(CLI::App& bench);  // bench gemm, membw   (cli/bench_gemm_cmd.cpp)
void register_bench_decode_command(CLI::App& bench);  // bench decode (cli/bench_decode_cmd.cpp)

}  // namespace foundry::cli
