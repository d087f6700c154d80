// What a checkpoint directory holds and whether all of it is intact, for either format
// version: `foundry ckpt info` and `foundry ckpt verify`.
//
// inspect_checkpoint reads only the descriptions (metadata.json, or manifest.json and the
// safetensors headers), never the tensor data; verify_checkpoint_data reads every byte.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "base/config_reader.h"
#include "ckpt/sharded.h"
#include "model/config.h"

namespace foundry {

// The format version of checkpoint `dir`: 2 (it has metadata.json) or 1 (manifest.json).
// Fails naming `dir` when it is missing or not a checkpoint directory.
int checkpoint_format_version(const std::string& dir);

// The Foundry model config a checkpoint was written for: version 2's metadata "model",
// version 1's config.json "foundry".
ModelConfig checkpoint_model_config(const std::string& dir);

// One slab of saved tensors: the parameters ("params") or an optimizer state ("exp_avg").
struct SavedSlab {
  std::string name;
  int64_t tensors = 0, bytes = 0;
  // Parameters of the model with no tensor in this slab (for a state: tensors whose
  // optimizer keeps none, e.g. Muon's have no exp_avg; for "params": an error).
  std::vector<std::string> without;
};

struct SavedFile {
  std::string name;
  int64_t bytes = -1;         // on disk; -1 when the file is missing
  int64_t listed_bytes = -1;  // in metadata.json or manifest.json; -1 when not listed there
};

struct CheckpointInfo {
  std::string dir;
  int format_version = 0;
  bool committed = false;  // COMMITTED is present
  int64_t step = 0;
  std::optional<SavedLayout> layout;  // the layout that wrote it (version 2 only)
  ModelConfig model;
  int64_t model_tensors = 0, model_parameters = 0;
  std::string optimizer;                    // as the trainer state records it; "" if not
  std::vector<SavedSlab> slabs;             // "params" first, then the states by name
  std::vector<std::string> extra_tensors;   // neither a parameter nor "<param>.<state>"
  std::vector<SavedFile> files;
  int64_t total_bytes = 0;                  // of the files present
  // What makes the checkpoint unusable: parameters not saved, no COMMITTED, files missing
  // or of another size than listed, a metadata checksum that does not match.
  std::vector<std::string> problems;
};

// Reads what `dir` holds (not the tensor data). Fails only when the descriptions cannot be
// read; what is missing or inconsistent goes to `problems`.
CheckpointInfo inspect_checkpoint(const std::string& dir);
std::string format_checkpoint_info(const CheckpointInfo& info);
json to_json(const CheckpointInfo& info);

struct VerifyReport {
  int format_version = 0;
  int64_t files = 0;
  int64_t pieces = 0;  // version 2: pieces whose every chunk was checked
  int64_t bytes = 0;   // of data checked
  double seconds = 0;
  // Version 2: the tensors (parameters or optimizer states) with NaN or ±inf values, by name.
  std::map<std::string, int64_t> non_finite;
};

// Reads and checks all of `dir`: version 2, every chunk checksum of every piece and every
// saved tensor covered exactly once (verify_sharded_data); version 1, every file's
// checksum and the safetensors structure (verify_checkpoint); both, every parameter of the
// model saved. Fails naming the file (and for version 2 the byte range) of the first fault.
VerifyReport verify_checkpoint_data(const std::string& dir);
std::string format_verify_report(const std::string& dir, const VerifyReport& report);

}  // namespace foundry
