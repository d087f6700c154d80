// Each subcommand group registers itself on the root CLI::App. Callbacks throw
// foundry::Error on failure; main() prints it and exits with kExitFailed (base/exit_codes.h).
// A callback that ends otherwise than "finished" (an interrupted run) sets its exit code.
#pragma once
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <charconv>
#include <cstdint>
#include <string>
#include <type_traits>

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
void register_bench_gemm_commands(CLI::App& bench);  // bench gemm, membw, attention (cli/bench_gemm_cmd.cpp)
void register_bench_decode_command(CLI::App& bench);  // bench decode (cli/bench_decode_cmd.cpp)
// Before a bench measures anything: its --json and --csv files replace only an earlier bench
// output, never the --profile it merges into or each other (base/io.h, check_output_file).
void check_bench_outputs(const std::string& json_path, const std::string& csv_path,
                         const std::string& profile_path);
// Fails when this process may run on fewer CPUs than the `threads` a CPU benchmark would use
// (`fix`: the hint; empty, OMP_NUM_THREADS's).
void check_cpus_for_threads(const std::string& command, int threads, const std::string& fix = "");

// A value between lo and hi (inclusive). CLI::Range's message changes between CLI11 releases
// ("not in range 1 to 9" in 2.1, "[1 - 9]" in 2.4); this one reads the same everywhere:
// "--top: 0 is not in range 1 to 1048576".
template <typename T>
CLI::Validator in_range(T lo, T hi) {
  return CLI::Validator(
      [lo, hi](std::string& input) -> std::string {
        std::conditional_t<std::is_floating_point_v<T>, double, int64_t> value{};
        if (!CLI::detail::lexical_cast(input, value)) return "'" + input + "' is not a number";
        if (!(value >= lo && value <= hi))  // NaN too
          return fmt::format("{} is not in range {} to {}", input, lo, hi);
        return {};
      },
      fmt::format("in [{} - {}]", lo, hi));
}

// A seed: a whole number from 0 to 2^64 - 1, as written ("-1" would wrap to 2^64 - 1).
inline CLI::Validator seed_value() {
  return CLI::Validator(
      [](std::string& input) -> std::string {
        uint64_t value = 0;
        const char* end = input.data() + input.size();
        const auto [ptr, ec] = std::from_chars(input.data(), end, value);
        if (input.empty() || ec != std::errc() || ptr != end)
          return fmt::format("'{}' is not a whole number from 0 to 18446744073709551615", input);
        return {};
      },
      "UINT64");
}

}  // namespace foundry::cli
