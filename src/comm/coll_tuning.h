// Choosing Open MPI's collective algorithms at run time.
//
// Open MPI's coll/tuned component implements each collective with several algorithms
// (all-reduce: basic linear, recursive doubling, ring, Rabenseifner, ...) and picks one per
// call from compiled-in decision rules on message size and rank count. With
// coll_tuned_use_dynamic_rules on, a control variable coll_tuned_<collective>_algorithm
// forces one instead (0 = "ignore": keep the decision rules).
//
// Those variables are MCA parameters, normally set on the mpirun command line
// (`--mca coll_tuned_allreduce_algorithm 4`), but they are also MPI_T control variables that
// can be written while the program runs. tuned reads the forced algorithm when a
// communicator is created, so the recipe is: write the variable, then Communicator::dup();
// the new communicator uses the forced algorithm, existing ones keep theirs. Every rank must
// force the same algorithm before the dup, or the ranks run different algorithms against
// each other.
//
// use_dynamic_rules itself is read once in MPI_Init and cannot be written later: the session
// must be created with MpiSessionOptions::allow_forced_algorithms.
#pragma once
#include "comm/comm.h"  // mpi.h, C API only

#include <string>
#include <vector>

namespace foundry {

struct TunedAlgorithm {
  int id = 0;        // the value of coll_tuned_<collective>_algorithm
  std::string name;  // Open MPI's name for it ("ring", "recursive_doubling", ...)
};

// Access to the coll_tuned variables through MPI_T. Needs an active MpiSession. Restores
// every variable it changed when destroyed.
class CollTuning {
 public:
  CollTuning();
  ~CollTuning();
  CollTuning(const CollTuning&) = delete;
  CollTuning& operator=(const CollTuning&) = delete;

  // The library has coll/tuned's variables (false for MPI libraries other than Open MPI).
  bool available() const { return available_; }
  // coll_tuned_use_dynamic_rules is on, so forced algorithms take effect.
  bool dynamic_rules() const { return dynamic_rules_; }
  // Why forcing cannot work here ("" when it can).
  std::string unavailable_reason() const;

  // `collective` is Open MPI's name in the variable: allreduce, reduce_scatter_block,
  // allgather, bcast, alltoall, ... The algorithms it can force, excluding 0 ("ignore").
  std::vector<TunedAlgorithm> algorithms(const std::string& collective) const;
  // The forced algorithm now (0: tuned's decision rules).
  int forced(const std::string& collective) const;
  // The name of algorithm `id` of `collective` ("ignore" for 0).
  std::string algorithm_name(const std::string& collective, int id) const;
  // Writes coll_tuned_<collective>_algorithm = id and reads it back; throws when the write is
  // refused or does not stick. Takes effect for communicators created afterwards.
  void force(const std::string& collective, int id);

 private:
  int cvar_index(const std::string& collective) const;  // -1 when absent
  int read_int(int index) const;
  void write_int(int index, int value);

  bool initialized_ = false;
  bool available_ = false;
  bool dynamic_rules_ = false;
  std::vector<std::pair<int, int>> restore_;  // (cvar index, original value)
};

// How to get the same sweep without in-process control: the mpirun flags that force
// algorithm `id` of `collective` for a whole run.
std::string mpirun_mca_flags(const std::string& collective, int id);

}  // namespace foundry
