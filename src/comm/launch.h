// Whether this process was started by an MPI launcher (mpirun, srun), from the environment it
// sets. Commands that can run alone or under mpirun (train) initialize MPI only then, so a
// plain single-process run never touches MPI.
#pragma once
#include <cstdlib>

namespace foundry {

inline bool launched_by_mpi() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK"})
    if (std::getenv(var) != nullptr) return true;
  return false;
}

}  // namespace foundry
