// The command line of one attempt of a supervised job: `foundry train` run directly (one
// process), under mpirun, or under srun inside a Slurm allocation.
#pragma once
#include <map>
#include <string>
#include <vector>

namespace foundry {

enum class Launcher { automatic, local, mpirun, srun };
Launcher parse_launcher(const std::string& name);  // "auto" | "local" | "mpirun" | "srun"
const char* launcher_name(Launcher l);

struct JobCommand {
  std::vector<std::string> argv;
  std::map<std::string, std::string> env;  // set in the child's environment
};

struct CommandInputs {
  Launcher launcher = Launcher::automatic;
  int ranks = 1;
  std::string exe;                         // this foundry binary
  std::vector<std::string> train_args;     // after `foundry train`
  std::vector<std::string> launcher_args;  // extra mpirun/srun options
  // The environment it runs in: cores of this host (hardware threads, as OpenMP counts them),
  // the slots mpirun counts on it (its physical cores: a core's hardware threads are one
  // slot), whether OMP_NUM_THREADS is set, root, inside a Slurm allocation.
  int host_cores = 1;
  int host_slots = 1;
  bool omp_threads_set = false, root = false, in_slurm = false;
};

// automatic: srun inside a Slurm allocation, else mpirun for several ranks, else local.
// mpirun on one host: ranks are not bound to cores (each runs OpenMP threads) and share the
// cores (OMP_NUM_THREADS = cores / ranks unless set), oversubscribing when needed; as root
// it passes --allow-run-as-root.
JobCommand job_command(const CommandInputs& in);

// The physical cores among the CPUs this process may run on (Linux sysfs topology; the
// hardware threads' count where it cannot be read).
int physical_cores();

}  // namespace foundry
