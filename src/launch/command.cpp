#include "launch/command.h"

#include <sched.h>

#include <algorithm>
#include <set>
#include <thread>
#include <utility>

#include "base/error.h"
#include "base/io.h"
#include "train/run_dir.h"

namespace foundry {

Launcher parse_launcher(const std::string& name) {
  if (name == "auto") return Launcher::automatic;
  if (name == "local") return Launcher::local;
  if (name == "mpirun") return Launcher::mpirun;
  if (name == "srun") return Launcher::srun;
  fail(fmt::format("--launcher {}: unknown launcher", name), "use auto, local, mpirun or srun");
}

const char* launcher_name(Launcher l) {
  switch (l) {
    case Launcher::automatic:
      return "auto";
    case Launcher::local:
      return "local";
    case Launcher::mpirun:
      return "mpirun";
    case Launcher::srun:
      return "srun";
  }
  return "?";
}

namespace {

bool has_option(const std::vector<std::string>& args, const std::string& prefix) {
  return std::any_of(args.begin(), args.end(),
                     [&](const std::string& a) { return a.rfind(prefix, 0) == 0; });
}

std::vector<std::string> mpirun_prefix(const CommandInputs& in, JobCommand& cmd) {
  std::vector<std::string> argv = {"mpirun", "-np", std::to_string(in.ranks)};
  if (in.root) argv.push_back("--allow-run-as-root");
  if (in.ranks > std::min(in.host_cores, in.host_slots) &&
      !has_option(in.launcher_args, "--oversubscribe"))
    argv.push_back("--oversubscribe");
  // Each rank runs OpenMP threads: binding a rank to one core would pile them onto it.
  if (!has_option(in.launcher_args, "--bind-to")) {
    argv.push_back("--bind-to");
    argv.push_back("none");
  }
  if (!in.omp_threads_set)
    cmd.env["OMP_NUM_THREADS"] = std::to_string(std::max(1, in.host_cores / in.ranks));
  for (const char* exported : {"OMP_NUM_THREADS", kLaunchPidVariable, kLaunchStartupVariable}) {
    argv.push_back("-x");
    argv.push_back(exported);
  }
  return argv;
}

}  // namespace

int physical_cores() {
  const int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return threads;
  std::set<std::pair<std::string, std::string>> cores;  // (package, core) ids
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed)) continue;
    const std::string topo = fmt::format("/sys/devices/system/cpu/cpu{}/topology/", cpu);
    if (!path_exists(topo + "core_id")) return threads;
    cores.emplace(read_text_file(topo + "physical_package_id"), read_text_file(topo + "core_id"));
  }
  return cores.empty() ? threads : static_cast<int>(cores.size());
}

JobCommand job_command(const CommandInputs& in) {
  if (in.ranks < 1)
    fail(fmt::format("--np {}: a job needs at least one rank", in.ranks), "use --np 1 or more");
  Launcher l = in.launcher;
  if (l == Launcher::automatic)
    l = in.in_slurm && in.ranks > 1 ? Launcher::srun
        : in.ranks > 1              ? Launcher::mpirun
                                    : Launcher::local;
  if (l == Launcher::local && in.ranks > 1)
    fail(fmt::format("--launcher local runs one process, but --np is {}", in.ranks),
         "use --launcher mpirun (or srun) for several ranks");
  JobCommand cmd;
  if (l == Launcher::mpirun) cmd.argv = mpirun_prefix(in, cmd);
  if (l == Launcher::srun)
    cmd.argv = {"srun", "--ntasks=" + std::to_string(in.ranks), "--kill-on-bad-exit=1"};
  if (l != Launcher::local)
    cmd.argv.insert(cmd.argv.end(), in.launcher_args.begin(), in.launcher_args.end());
  cmd.argv.push_back(in.exe);
  cmd.argv.push_back("train");
  cmd.argv.insert(cmd.argv.end(), in.train_args.begin(), in.train_args.end());
  return cmd;
}

}  // namespace foundry
