// Model state that lives outside the parameter slab, in checkpoints: the ZAYA1 router's
// balancing biases (arch zaya1). Their full state (bias and its AdamW moments, for a bitwise
// resume) is in trainer_state.json ("router_balancers"); the biases alone are also exported to
// model.safetensors under Hugging Face ZAYA's buffer name, so an exported checkpoint routes
// like the trained model.
#pragma once
#include <string>
#include <vector>

#include "base/config_reader.h"
#include "ckpt/checkpoint.h"
#include "kernels/zaya_router.h"
#include "model/config.h"

namespace foundry {

class Model;

// One [classes] tensor per MoE sublayer: "model.layers.{l}.mlp.gate.balancing_biases".
// Empty for models without balancers (arch moe). Points into `model`.
std::vector<ExtraTensorToSave> balancing_bias_tensors(const Model& model);
// The same for balancers held outside a Model; points into `balancers`.
std::vector<ExtraTensorToSave> balancing_bias_tensors(
    const std::vector<ops::ZayaBalancer>& balancers);

// The router balancers of a `config` model as a checkpoint's trainer state holds them, without
// building the model (one per MoE sublayer; none for arch moe). `where` names the state in
// messages. A state without "router_balancers" gives the initial balancers and a warning on
// stderr; a state of another shape fails.
std::vector<ops::ZayaBalancer> saved_router_balancers(const ModelConfig& config,
                                                      const json& trainer_state,
                                                      const std::string& where);

// Restores the router balancers of an arch zaya1 model from a checkpoint's trainer state,
// so routing matches the trained model; a no-op for models without balancers (arch moe).
// `checkpoint_dir` names the checkpoint in messages. When the state has no balancers: an
// error if `required` (resuming training must restore everything), else a warning on stderr
// and the model keeps its initial biases (eval, generate).
void restore_router_balancers(Model& model, const json& trainer_state,
                              const std::string& checkpoint_dir, bool required);

}  // namespace foundry
