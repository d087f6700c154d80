// A checkpoint (either format version) as a Hugging Face model directory:
//
//   OUT/model.safetensors   the parameters under their Hugging Face names, F32, in table
//                           order; for arch zaya1 then the routers' balancing biases
//                           ("model.layers.{l}.mlp.gate.balancing_biases", from the trainer
//                           state), as version 1 checkpoints hold them
//   OUT/config.json         hf_config_json of the checkpoint's model config
//
// The tensors are streamed: the safetensors header first, then the parameters read from
// the checkpoint a few at a time, so memory holds about the largest tensor, never the model.
#pragma once
#include <cstdint>
#include <string>

namespace foundry {

struct ExportReport {
  int64_t tensors = 0;  // in model.safetensors
  int64_t bytes = 0;    // of model.safetensors
  double seconds = 0;
};

// Writes the export of `checkpoint_dir` to `out_dir`, which must not exist or be empty. All
// is written into "<out_dir>.tmp-<pid>" and renamed to `out_dir` at the end, so a failed
// export leaves nothing behind.
ExportReport export_hf_model(const std::string& checkpoint_dir, const std::string& out_dir);

}  // namespace foundry
