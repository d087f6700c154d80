#include "ckpt/model_state.h"

#include <cstdio>

#include "base/error.h"
#include "model/model.h"

namespace foundry {

std::vector<ExtraTensorToSave> balancing_bias_tensors(const Model& model) {
  std::vector<ExtraTensorToSave> tensors;
  const auto& balancers = model.balancers();
  for (size_t l = 0; l < balancers.size(); ++l)
    tensors.push_back({fmt::format("model.layers.{}.mlp.gate.balancing_biases", l),
                       {balancers[l].classes()},
                       balancers[l].bias.data()});
  return tensors;
}

void restore_router_balancers(Model& model, const json& trainer_state,
                              const std::string& checkpoint_dir, bool required) {
  if (model.balancers().empty()) return;  // arch moe: nothing to restore
  const std::string file = checkpoint_dir + "/trainer_state.json";
  auto it = trainer_state.find("router_balancers");
  if (it == trainer_state.end() || (it->is_array() && it->empty())) {
    const std::string what = fmt::format(
        "{} has no \"router_balancers\": the routing biases of this zaya1 model were not saved",
        file);
    if (required)
      fail(what, "resume from a checkpoint written by a zaya1 training run, or start a new run "
                 "directory (train.run_dir)");
    std::fprintf(stderr, "warning: %s; routing uses the initial balancing biases\n",
                 what.c_str());
    return;
  }
  try {
    model.load_balancer_state(*it);
  } catch (const Error& e) {
    fail(fmt::format("{}: {}", file, e.what()), e.hint());
  }
}

}  // namespace foundry
