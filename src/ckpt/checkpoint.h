// Checkpoints, format v1: one directory per step under RUN_DIR/checkpoints/, either whole
// and valid or ignored.
//
//   RUN_DIR/checkpoints/
//     latest                    "step_00001000\n", replaced by atomic rename after a commit
//     step_00001000/
//       model.safetensors       fp32 weights under their Hugging Face names, plus any extra
//                               (non-parameter) tensors the caller passes, e.g. buffers
//       optimizer.safetensors   optimizer state slabs, "<param name>.<state>"
//       config.json             Hugging Face config keys + "foundry": the model config
//       trainer_state.json      the caller's JSON (step, RNG, data cursor, schedule, ...)
//       manifest.json           format_version 1; each file's byte size and XXH3-64
//       COMMITTED               written last; holds the manifest's checksum
//     step_00002000.tmp/        a save in progress or interrupted: ignored, removed by the
//                               next save
//
// A checkpoint is valid when COMMITTED exists and every checksum in the chain matches.
// One process saves into a run directory at a time. The full description is
// docs/formats.md.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "base/config_reader.h"
#include "ckpt/sharded.h"
#include "model/config.h"
#include "model/params.h"

namespace foundry {

constexpr int kCheckpointFormatVersion = 1;

// An optimizer state slab with the parameter table's layout; each parameter's slice is
// saved as the tensor "<param name>.<suffix>" (e.g. "model.norm.weight.exp_avg").
struct StateSlabToSave {
  std::string suffix;
  const float* data = nullptr;
};
struct StateSlabToLoad {
  std::string suffix;
  float* data = nullptr;
};

// A tensor for model.safetensors that is not a parameter: a buffer the exported model
// needs, such as a ZAYA1 router's balancing bias ("model.layers.{l}.mlp.gate.balancing_biases").
// fp32, row-major, numel(shape) floats at `data`. Loading ignores such tensors.
struct ExtraTensorToSave {
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;
};

// "step_00001000" (eight digits or more).
std::string checkpoint_dir_name(int64_t step);

// Writes a checkpoint of `step` into RUN_DIR/checkpoints/step_<step>/, commits it, points
// `latest` at it and then keeps the newest `keep_last` committed checkpoints (0 keeps all;
// the new one is always kept). Removes leftovers of interrupted saves first. A checkpoint
// of the same step is replaced atomically. Returns the checkpoint directory.
// `extra_model_tensors` go into model.safetensors after the parameters; their names must
// differ from every parameter name and from each other.
std::string save_checkpoint(const std::string& run_dir, int64_t step, const ModelConfig& config,
                            const ParamTable& table, const float* params,
                            const std::vector<StateSlabToSave>& optimizer_state,
                            const json& trainer_state, int64_t keep_last,
                            const std::vector<ExtraTensorToSave>& extra_model_tensors = {});

// Throws Error naming the file and the check that failed unless `dir` is a complete,
// uncorrupted checkpoint: COMMITTED present, manifest matching its checksum, every listed
// file present with its size and checksum.
void verify_checkpoint(const std::string& dir);

// The newest checkpoint that verifies: the one `latest` names, else the step_* directories
// from the highest step down. Each invalid checkpoint skipped is reported on stderr.
std::optional<std::string> find_latest_checkpoint(const std::string& run_dir);

// The checkpoint directories under RUN_DIR/checkpoints (committed or not; without the
// .tmp ones), by ascending step.
struct CheckpointDir {
  int64_t step = 0;
  std::string path;
};
std::vector<CheckpointDir> list_checkpoint_dirs(const std::string& run_dir);

// The Foundry model config stored in a checkpoint's config.json.
ModelConfig read_checkpoint_model_config(const std::string& dir);

// A checkpoint's trainer_state.json as saved. Does not verify the checkpoint (call
// verify_checkpoint first, or use what load_checkpoint returns): for checks that must run
// before loading, such as comparing the optimizer a run was trained with.
json read_checkpoint_trainer_state(const std::string& dir);

// Verifies `dir`, checks that it was written for `expected` (an error names every key that
// differs) and that it holds every tensor the table and `optimizer_state` ask for with the
// right dtype and shape, and only then copies weights and states into the slabs. Optimizer
// states in the file that are not asked for are ignored (pass none to load weights only),
// and so are tensors of model.safetensors that are not parameters (the extra tensors of
// save_checkpoint). Returns trainer_state.json.
json load_checkpoint(const std::string& dir, const ModelConfig& expected, const ParamTable& table,
                     float* params, const std::vector<StateSlabToLoad>& optimizer_state);

// The same for any part of the slabs, from either format version: each target's tensor
// elements (padding is left alone) from the checkpoint, whatever layout wrote it. A version
// 2 checkpoint is read only where the targets overlap it. `on_tensor` (optional) is called
// as each tensor's part is read: a long load's progress (load_sharded_checkpoint).
json load_checkpoint_targets(const std::string& dir, const ModelConfig& expected,
                             const ParamTable& table, const std::vector<SlabTarget>& targets,
                             const std::function<void()>& on_tensor = {});

// Fails unless every weight of `params` (laid out by `table`) is finite, naming the checkpoint
// `dir` they were loaded from, the first tensor with a non-finite value, and how many there
// are: a run that diverged saves such checkpoints, and nothing computed from them means
// anything.
void check_finite_weights(const std::string& dir, const ParamTable& table, const float* params);

// The Hugging Face config.json object for `config` (Mixtral, Llama when dense, Qwen3 when
// dense with per-head QK-Norm, ZAYA). A model no transformers class reads under Foundry's
// tensor names (QK-Norm with experts, or over whole projections) gets no architectures and
// no model_type: has_hf_class says which.
json hf_config_json(const ModelConfig& config);
bool has_hf_class(const ModelConfig& config);
// What a model with that class computes differently from `config` (a setting the class has
// no key for), or empty when nothing does.
std::string hf_class_mismatch(const ModelConfig& config);

}  // namespace foundry
