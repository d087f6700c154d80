#include "launch/command.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <thread>

#include "base/test_expect_error.h"

namespace foundry {
namespace {

CommandInputs inputs(Launcher l, int ranks) {
  CommandInputs in;
  in.launcher = l;
  in.ranks = ranks;
  in.exe = "/bin/foundry";
  in.train_args = {"--config", "c.json", "--auto-resume"};
  in.host_cores = 2;
  in.host_slots = 2;
  return in;
}

std::string joined(const JobCommand& c) {
  std::string s;
  for (const std::string& a : c.argv) s += (s.empty() ? "" : " ") + a;
  return s;
}

TEST(JobCommand, OneProcessRunsTrainDirectly) {
  const JobCommand c = job_command(inputs(Launcher::automatic, 1));
  EXPECT_EQ(joined(c), "/bin/foundry train --config c.json --auto-resume");
  EXPECT_TRUE(c.env.empty());
}

TEST(JobCommand, MpirunSharesTheCoresAndOversubscribesOnlyWhenNeeded) {
  CommandInputs in = inputs(Launcher::automatic, 2);
  JobCommand c = job_command(in);
  EXPECT_EQ(joined(c),
            "mpirun -np 2 --bind-to none -x OMP_NUM_THREADS -x FOUNDRY_LAUNCH_PID -x "
            "FOUNDRY_LAUNCH_STARTUP_S /bin/foundry train --config c.json --auto-resume");
  EXPECT_EQ(c.env.at("OMP_NUM_THREADS"), "1");
  in.ranks = 4;
  in.root = true;
  in.omp_threads_set = true;  // the user's choice stays
  in.launcher_args = {"--hostfile=hosts"};
  c = job_command(in);
  EXPECT_EQ(joined(c),
            "mpirun -np 4 --allow-run-as-root --oversubscribe --bind-to none -x "
            "OMP_NUM_THREADS -x FOUNDRY_LAUNCH_PID -x FOUNDRY_LAUNCH_STARTUP_S --hostfile=hosts "
            "/bin/foundry train --config c.json --auto-resume");
  EXPECT_TRUE(c.env.empty());
}

// Two hardware threads of one core: mpirun counts one slot, so two ranks oversubscribe it.
TEST(JobCommand, MpirunOversubscribesACoresHardwareThreads) {
  CommandInputs in = inputs(Launcher::automatic, 2);
  in.host_slots = 1;
  EXPECT_EQ(joined(job_command(in)),
            "mpirun -np 2 --oversubscribe --bind-to none -x OMP_NUM_THREADS -x "
            "FOUNDRY_LAUNCH_PID -x FOUNDRY_LAUNCH_STARTUP_S /bin/foundry train --config c.json "
            "--auto-resume");
}

TEST(JobCommand, PhysicalCoresAreAtMostTheHardwareThreads) {
  const int cores = physical_cores();
  EXPECT_GE(cores, 1);
  EXPECT_LE(cores, static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
}

TEST(JobCommand, SrunInsideASlurmAllocation) {
  CommandInputs in = inputs(Launcher::automatic, 8);
  in.in_slurm = true;
  EXPECT_EQ(
      joined(job_command(in)),
      "srun --ntasks=8 --kill-on-bad-exit=1 /bin/foundry train --config c.json --auto-resume");
}

TEST(JobCommand, BadChoicesAreErrors) {
  expect_error([] { job_command(inputs(Launcher::local, 2)); },
               "--launcher local runs one process");
  expect_error([] { parse_launcher("pbs"); }, "--launcher pbs: unknown launcher");
}

}  // namespace
}  // namespace foundry
