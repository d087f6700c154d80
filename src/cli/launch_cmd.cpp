// foundry launch: a supervised training job (launch/supervisor.h).
#include <unistd.h>

#include <memory>

#include "base/error.h"
#include "cli/commands.h"
#include "launch/supervisor.h"

namespace foundry::cli {

namespace {

std::string this_executable() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) fail("cannot find the foundry executable (/proc/self/exe)");
  return std::string(buf, size_t(n));
}

}  // namespace

void register_launch_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "launch",
      "Run `foundry train` under a supervisor that restarts it from its latest checkpoint when a "
      "rank dies, hangs or the job fails");
  auto o = std::make_shared<LaunchOptions>();
  auto launcher = std::make_shared<std::string>("auto");
  auto steps = std::make_shared<int64_t>(-1);
  auto synthetic = std::make_shared<bool>(false);
  auto quiet = std::make_shared<bool>(false);
  cmd->add_option("--config,-c", o->config_path, "Run config (JSON)")->required();
  cmd->add_option("--set", o->overrides, "Override a config value: section.key=value")->take_all();
  cmd->add_option("--np", o->ranks, "Ranks of the job (1: one process without MPI)")
      ->check(in_range(1, 1 << 20));
  cmd->add_option("--restart-np", o->restart_ranks,
                  "Ranks of the restarts, e.g. fewer after losing a node (default: --np); "
                  "checkpoints load under any rank count")
      ->check(in_range(1, 1 << 20));
  cmd->add_option("--launcher", *launcher,
                  "auto (srun in a Slurm allocation, else mpirun for several ranks, else one "
                  "process), local, mpirun, srun")
      ->check(CLI::IsMember({"auto", "local", "mpirun", "srun"}));
  cmd->add_option("--launcher-args", o->launcher_args,
                  "Extra options for mpirun/srun (e.g. --launcher-args=--hostfile=hosts)")
      ->take_all();
  cmd->add_option("--max-restarts", o->max_restarts, "Restart budget")
      ->check(in_range(0, 1000000))
      ->capture_default_str();
  cmd->add_option("--backoff", o->backoff_s,
                  "Seconds before restarting an attempt that committed no new checkpoint; "
                  "doubles while attempts make no headway (one that did restarts at once)")
      ->check(in_range(0.0, 3600.0))
      ->capture_default_str();
  cmd->add_option("--max-backoff", o->max_backoff_s, "Longest wait between restarts (s)")
      ->check(in_range(0.0, 86400.0))
      ->capture_default_str();
  cmd->add_option("--startup-timeout", o->startup_timeout_s,
                  "A rank with no heartbeat this long after a start never took the run directory "
                  "(process and MPI start, the config's checks) (s)")
      ->check(in_range(1.0, 86400.0))
      ->capture_default_str();
  cmd->add_flag("--overwrite", o->overwrite,
                "The first start replaces the run in train.run_dir (default: resume it)");
  cmd->add_option("--steps", *steps, "Override train.steps")
      ->check(in_range(int64_t{0}, int64_t{1} << 40));
  cmd->add_flag("--synthetic-data", *synthetic, "Train on random tokens (no dataset)");
  cmd->add_flag("--quiet,-q", *quiet, "No per-step log lines from the job");
  auto allow_change = std::make_shared<bool>(false);
  cmd->add_flag("--allow-config-change", *allow_change,
                "Resume even when train.* settings that shape the run differ from its config.json");
  cmd->callback([o, launcher, steps, synthetic, quiet, allow_change] {
    LaunchOptions opts = *o;
    opts.launcher = parse_launcher(*launcher);
    opts.exe = this_executable();
    if (*steps >= 0)
      opts.train_args.insert(opts.train_args.end(), {"--steps", std::to_string(*steps)});
    if (*synthetic) opts.train_args.push_back("--synthetic-data");
    if (*quiet) opts.train_args.push_back("--quiet");
    if (*allow_change) opts.train_args.push_back("--allow-config-change");
    set_exit_code(supervise(opts));
  });
}

}  // namespace foundry::cli
