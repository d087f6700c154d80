#include "ckpt/model_state.h"

#include <cstdio>

#include "base/error.h"
#include "base/io.h"
#include "model/model.h"

namespace foundry {

std::vector<ExtraTensorToSave> balancing_bias_tensors(
    const std::vector<ops::ZayaBalancer>& balancers) {
  std::vector<ExtraTensorToSave> tensors;
  for (size_t l = 0; l < balancers.size(); ++l)
    tensors.push_back({fmt::format("model.layers.{}.mlp.gate.balancing_biases", l),
                       {balancers[l].classes()},
                       balancers[l].bias.data()});
  return tensors;
}

std::vector<ExtraTensorToSave> balancing_bias_tensors(const Model& model) {
  return balancing_bias_tensors(model.balancers());
}

std::vector<ops::ZayaBalancer> saved_router_balancers(const ModelConfig& config,
                                                      const json& trainer_state,
                                                      const std::string& where) {
  if (!config.is_zaya()) return {};
  std::vector<ops::ZayaBalancer> balancers(
      static_cast<size_t>(config.n_layers),
      ops::ZayaBalancer(config.n_experts, config.router_skip_class, balancer_options(config)));
  auto it = trainer_state.find("router_balancers");
  if (it == trainer_state.end() || (it->is_array() && it->empty())) {
    std::fprintf(stderr, "warning: %s has no \"router_balancers\"; the initial balancing "
                         "biases are used\n", where.c_str());
    return balancers;
  }
  try {
    const std::string note = balancers_from_json(balancers, *it);
    if (!note.empty()) std::fprintf(stderr, "warning: %s: %s\n", where.c_str(), note.c_str());
  } catch (const Error& e) {
    fail(fmt::format("{}: {}", where, e.what()), e.hint());
  }
  return balancers;
}

void restore_router_balancers(Model& model, const json& trainer_state,
                              const std::string& checkpoint_dir, bool required) {
  if (model.balancers().empty()) return;  // arch moe: nothing to restore
  // Where the trainer state is: format 2 keeps it in metadata.json, format 1 in its own file.
  const std::string file = path_exists(checkpoint_dir + "/metadata.json")
                               ? checkpoint_dir + "/metadata.json (trainer_state)"
                               : checkpoint_dir + "/trainer_state.json";
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
    const std::string note = model.load_balancer_state(*it);
    if (!note.empty()) std::fprintf(stderr, "warning: %s: %s\n", file.c_str(), note.c_str());
  } catch (const Error& e) {
    fail(fmt::format("{}: {}", file, e.what()), e.hint());
  }
}

}  // namespace foundry
