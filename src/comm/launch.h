// Whether this process was started by an MPI launcher (mpirun, srun), from the environment it
// sets. Commands that can run alone or under mpirun (train) initialize MPI only then, so a
// plain single-process run never touches MPI.
#pragma once
#include <cstdlib>
#include <string>

namespace foundry {

inline bool launched_by_mpi() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK"})
    if (std::getenv(var) != nullptr) return true;
  return false;
}

// The number of ranks the launcher started, from its environment (Open MPI's, or PMI's under
// srun), without initializing MPI; 1 when it is not said or not a positive number.
inline int launched_world_size() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"})
    if (const char* value = std::getenv(var)) {
      try {
        const int n = std::stoi(value);
        if (n > 0) return n;
      } catch (...) {
      }
    }
  return 1;
}

}  // namespace foundry
