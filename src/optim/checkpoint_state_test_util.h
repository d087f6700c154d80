// Optimizer state as a checkpoint sees it, for the optimizer tests: every rank's saved runs
// assembled into whole slabs (the single-process layout), and whole slabs loaded into an
// optimizer's load runs.
#pragma once
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "optim/optimizer.h"

namespace foundry::test {

// State name → whole slab (n elements; zero where no rank saves anything). Collective over
// `world` (null: one process): the ranks' runs are disjoint, so their sum is their union.
inline std::map<std::string, std::vector<float>> saved_state(DataParallelOptimizer& opt,
                                                              int64_t n,
                                                              const Communicator* world) {
  // Every rank reduces the same slabs (a rank may hold no run of a state), then states no
  // rank saved are dropped.
  std::map<std::string, std::vector<float>> slabs;
  std::map<std::string, double> saved;
  for (const char* name : {"exp_avg", "exp_avg_sq", "muon_momentum"}) {
    slabs[name].assign(static_cast<size_t>(n), 0.0f);
    saved[name] = 0;
  }
  for (const StateRun& r : opt.states_to_save_runs()) {
    std::copy(r.data, r.data + (r.end - r.begin), slabs.at(r.state).begin() + r.begin);
    saved[r.state] += 1;
  }
  for (auto& [name, slab] : slabs) {
    if (world) {
      world->allreduce(slab.data(), slab.data(), slab.size());
      world->allreduce(&saved[name], &saved[name], 1);
    }
  }
  for (const auto& [name, count] : saved)
    if (count == 0) slabs.erase(name);
  return slabs;
}

// Fills every load run of `opt` from whole slabs.
inline void load_state(DataParallelOptimizer& opt,
                       const std::map<std::string, std::vector<float>>& slabs) {
  for (const StateRun& r : opt.states_to_load_runs()) {
    const std::vector<float>& slab = slabs.at(r.state);
    std::copy(slab.begin() + r.begin, slab.begin() + r.end, r.data);
  }
}

}  // namespace foundry::test
