#include "ckpt/checkpoint.h"

#include <fcntl.h>
#include <stdio.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>

#include "base/error.h"
#include "base/hash.h"
#include "base/io.h"
#include "ckpt/checkpoint_dir.h"
#include "ckpt/safetensors.h"
#include "ckpt/sharded.h"

namespace foundry {
namespace {

namespace fs = std::filesystem;

// ---- saving -------------------------------------------------------------------------------

// The parameters in table order, then the extra tensors in the order given.
std::vector<TensorToWrite> model_tensors(const ParamTable& table, const float* params,
                                         const std::vector<ExtraTensorToSave>& extras) {
  std::vector<TensorToWrite> tensors;
  tensors.reserve(table.params().size() + extras.size());
  for (const ParamInfo& p : table.params())
    tensors.push_back({p.name, StDtype::F32, p.shape, params + p.offset});
  std::set<std::string> extra_names;
  for (const ExtraTensorToSave& e : extras) {
    if (e.name.empty() || e.data == nullptr)
      fail(fmt::format("cannot save extra model tensor '{}': the name is empty or the data is "
                       "missing",
                       e.name));
    if (table.find(e.name) != nullptr || !extra_names.insert(e.name).second)
      fail(fmt::format("cannot save extra model tensor '{}': a parameter or another extra "
                       "tensor has that name",
                       e.name),
           "give every extra tensor a name of its own");
    if (std::any_of(e.shape.begin(), e.shape.end(), [](int64_t d) { return d < 0; }))
      fail(fmt::format("cannot save extra model tensor '{}': shape [{}] has a negative "
                       "dimension",
                       e.name, fmt::join(e.shape, ", ")));
    tensors.push_back({e.name, StDtype::F32, e.shape, e.data});
  }
  return tensors;
}

// State-major order, so each slab's tensors are contiguous in the file.
std::vector<TensorToWrite> state_tensors(const ParamTable& table,
                                         const std::vector<StateSlabToSave>& states) {
  std::set<std::string> suffixes;
  for (const auto& s : states) {
    if (s.suffix.empty() || !suffixes.insert(s.suffix).second || s.data == nullptr)
      fail(fmt::format("cannot save optimizer state '{}': the name is empty or repeated, or "
                       "the slab is missing",
                       s.suffix));
  }
  std::vector<TensorToWrite> tensors;
  tensors.reserve(table.params().size() * states.size());
  for (const auto& s : states)
    for (const ParamInfo& p : table.params())
      tensors.push_back({p.name + "." + s.suffix, StDtype::F32, p.shape, s.data + p.offset});
  return tensors;
}

// Everything but the rename into place: data files, manifest, then COMMITTED.
void write_checkpoint_files(const std::string& dir, int64_t step, const ModelConfig& config,
                            const ParamTable& table, const float* params,
                            const std::vector<StateSlabToSave>& optimizer_state,
                            const json& trainer_state,
                            const std::vector<ExtraTensorToSave>& extra_model_tensors) {
  // Hugging Face loaders look for this metadata to know the tensors are PyTorch-compatible.
  const std::map<std::string, std::string> hf_metadata = {{"format", "pt"}};
  std::map<std::string, FileDigest> files;
  files[kModelFile] =
      write_safetensors(join(dir, kModelFile), model_tensors(table, params, extra_model_tensors),
                        hf_metadata);
  files[kOptimizerFile] = write_safetensors(join(dir, kOptimizerFile),
                                            state_tensors(table, optimizer_state), hf_metadata);
  files[kConfigFile] = write_json_file(join(dir, kConfigFile), hf_config_json(config));
  files[kTrainerStateFile] = write_json_file(join(dir, kTrainerStateFile), trainer_state);

  json manifest = {{"format_version", kCheckpointFormatVersion}, {"step", step}};
  json& listed = manifest["files"] = json::object();
  for (const auto& [name, digest] : files)
    listed[name] = {{"bytes", digest.bytes}, {"xxh3_64", hash64_hex(digest.xxh3_64)}};
  const FileDigest manifest_digest = write_json_file(join(dir, kManifestFile), manifest);

  // Every file above is fsynced already; the directory entries too, by write_file_atomic
  // and here, so COMMITTED can only exist on disk after all of them.
  fsync_path(dir);
  write_json_file(join(dir, kCommittedFile),
                  {{"format_version", kCheckpointFormatVersion},
                   {"manifest_xxh3_64", hash64_hex(manifest_digest.xxh3_64)}});
}

// ---- verifying and loading ----------------------------------------------------------------

void check_format_version(const json& j, const std::string& path) {
  auto v = j.find("format_version");
  if (v == j.end() || !v->is_number_integer())
    fail(fmt::format("{}: \"format_version\" is missing", path), kCorruptHint);
  if (*v != kCheckpointFormatVersion)
    fail(fmt::format("{}: format_version {} is not supported (this Foundry reads version {})",
                     path, v->dump(), kCheckpointFormatVersion),
         "load it with the Foundry version that wrote it");
}


void verify_listed_file(const std::string& dir, const std::string& name, const json& entry,
                        const std::string& manifest_path) {
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
    fail(fmt::format("{}: lists an invalid file name '{}'", manifest_path, name), kCorruptHint);
  auto bytes = entry.find("bytes");
  if (!entry.is_object() || bytes == entry.end() || !bytes->is_number_unsigned())
    fail(fmt::format("{}: the entry for {} has no byte size", manifest_path, name), kCorruptHint);
  const std::string& expected_hash = string_field(entry, "xxh3_64", manifest_path);
  const std::string path = join(dir, name);
  if (!path_exists(path))
    fail(fmt::format("{} is missing (listed in {})", path, manifest_path), kCorruptHint);
  MappedFile file(path);
  if (file.size() != bytes->get<uint64_t>())
    fail(fmt::format("{} has {} bytes, {} lists {}", path, file.size(), manifest_path,
                     bytes->get<uint64_t>()),
         kCorruptHint);
  const std::string actual_hash = hash64_hex(hash64(file.data(), file.size()));
  if (actual_hash != expected_hash)
    fail(fmt::format("{}: XXH3-64 checksum {} does not match {} recorded in {}", path,
                     actual_hash, expected_hash, manifest_path),
         kCorruptHint);
}

void check_tensor_matches(const SafetensorsReader& file, const TensorView& t,
                          const ParamInfo& p) {
  if (t.dtype != StDtype::F32 || t.shape != p.shape)
    fail(fmt::format("{}: tensor '{}' is {} [{}], the model needs F32 [{}]", file.path(), t.name,
                     dtype_name(t.dtype), fmt::join(t.shape, ", "), fmt::join(p.shape, ", ")),
         "the checkpoint was written for a different model");
}

// The state suffixes a file holds, read off the first parameter's tensors (for messages).
std::vector<std::string> saved_state_suffixes(const SafetensorsReader& file,
                                              const ParamTable& table) {
  std::vector<std::string> suffixes;
  const std::string prefix = table.params().front().name + ".";
  for (const auto& t : file.tensors())
    if (t.name.starts_with(prefix)) suffixes.push_back(t.name.substr(prefix.size()));
  return suffixes;
}

}  // namespace

std::string checkpoint_dir_name(int64_t step) {
  FOUNDRY_CHECK(step >= 0);
  return fmt::format("{}{:08d}", kStepPrefix, step);
}

std::string save_checkpoint(const std::string& run_dir, int64_t step, const ModelConfig& config,
                            const ParamTable& table, const float* params,
                            const std::vector<StateSlabToSave>& optimizer_state,
                            const json& trainer_state, int64_t keep_last,
                            const std::vector<ExtraTensorToSave>& extra_model_tensors) {
  FOUNDRY_CHECK(params != nullptr && keep_last >= 0);
  const std::string root = checkpoints_root(run_dir);
  make_dirs(root);
  remove_leftovers(root);

  const std::string name = checkpoint_dir_name(step);
  const std::string final_dir = join(root, name);
  const std::string tmp_dir = final_dir + kTmpSuffix;
  make_dirs(tmp_dir);
  try {
    write_checkpoint_files(tmp_dir, step, config, table, params, optimizer_state,
                           trainer_state, extra_model_tensors);
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(tmp_dir, ignored);
    throw;
  }
  publish_dir(tmp_dir, final_dir);
  fsync_path(root);
  write_latest(root, name);
  apply_retention(run_dir, step, keep_last);
  return final_dir;
}

void verify_checkpoint(const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec))
    fail(fmt::format("checkpoint '{}' does not exist", dir),
         "pass a directory such as RUN_DIR/checkpoints/step_00001000");
  if (!fs::is_directory(dir))
    fail(fmt::format("checkpoint '{}' is not a directory", dir),
         "pass a directory such as RUN_DIR/checkpoints/step_00001000");
  if (is_sharded_checkpoint(dir)) return verify_sharded_checkpoint(dir);
  const std::string committed_path = join(dir, kCommittedFile);
  if (!path_exists(committed_path))
    fail(fmt::format("{}: no {} marker: the save did not finish", dir, kCommittedFile),
         kCorruptHint);
  const json committed = parse_json_text(read_text_file(committed_path), committed_path);
  if (!committed.is_object())
    fail(fmt::format("{}: not a JSON object", committed_path), kCorruptHint);
  check_format_version(committed, committed_path);

  const std::string manifest_path = join(dir, kManifestFile);
  if (!path_exists(manifest_path))
    fail(fmt::format("{} is missing", manifest_path), kCorruptHint);
  const std::string manifest_text = read_text_file(manifest_path);
  const std::string manifest_hash = hash64_hex(hash64(manifest_text.data(), manifest_text.size()));
  const std::string& recorded_hash = string_field(committed, "manifest_xxh3_64", committed_path);
  if (manifest_hash != recorded_hash)
    fail(fmt::format("{}: XXH3-64 checksum {} does not match {} recorded in {}", manifest_path,
                     manifest_hash, recorded_hash, committed_path),
         kCorruptHint);

  const json manifest = parse_json_text(manifest_text, manifest_path);
  if (!manifest.is_object())
    fail(fmt::format("{}: not a JSON object", manifest_path), kCorruptHint);
  check_format_version(manifest, manifest_path);
  auto files = manifest.find("files");
  if (files == manifest.end() || !files->is_object())
    fail(fmt::format("{}: \"files\" is missing", manifest_path), kCorruptHint);
  for (const char* required : kRequiredFiles)
    if (!files->contains(required))
      fail(fmt::format("{}: does not list {}", manifest_path, required), kCorruptHint);
  for (const auto& [name, entry] : files->items())
    verify_listed_file(dir, name, entry, manifest_path);
}

std::vector<CheckpointDir> list_checkpoint_dirs(const std::string& run_dir) {
  std::vector<CheckpointDir> dirs;
  const std::string root = checkpoints_root(run_dir);
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return dirs;
  for (const auto& [name, is_dir] : list_dir(root)) {
    if (!is_dir) continue;
    if (auto step = parse_checkpoint_dir_name(name)) dirs.push_back({*step, join(root, name)});
  }
  std::sort(dirs.begin(), dirs.end(),
            [](const CheckpointDir& a, const CheckpointDir& b) { return a.step < b.step; });
  return dirs;
}

namespace {

// A resume looks for the latest checkpoint more than once (the in-memory tier, then the
// checkpointer): each skipped checkpoint is reported once per process.
void warn_once(const std::string& message) {
  static std::mutex mutex;
  static std::set<std::string> said;
  std::lock_guard<std::mutex> lock(mutex);
  if (said.insert(message).second) warn(message);
}

}  // namespace

std::optional<std::string> find_latest_checkpoint(const std::string& run_dir) {
  const std::string root = checkpoints_root(run_dir);
  const std::string latest_path = join(root, kLatestFile);
  std::string tried;
  std::optional<std::string> pointer;
  if (path_exists(latest_path)) {
    // Unreadable (a directory, no permission) counts as no pointer: the scan decides.
    try {
      pointer = read_text_file(latest_path);
    } catch (const Error& e) {
      warn_once(fmt::format("{}; looking for checkpoints", e.what()));
    }
  }
  if (pointer) {
    std::string name = *pointer;
    while (!name.empty() && std::isspace(static_cast<unsigned char>(name.back()))) name.pop_back();
    if (!parse_checkpoint_dir_name(name)) {
      warn_once(
          fmt::format("{} holds '{}', which is not a checkpoint name; looking for "
                      "checkpoints",
                      latest_path, name));
    } else {
      const std::string dir = join(root, name);
      try {
        verify_checkpoint(dir);
        return dir;
      } catch (const Error& e) {
        warn_once(
            fmt::format("skipping checkpoint {} named by {}: {}", dir, latest_path, e.what()));
        tried = dir;
      }
    }
  }
  std::vector<CheckpointDir> dirs = list_checkpoint_dirs(run_dir);
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
    if (it->path == tried) continue;
    try {
      verify_checkpoint(it->path);
      return it->path;
    } catch (const Error& e) {
      warn_once(fmt::format("skipping invalid checkpoint {}: {}", it->path, e.what()));
    }
  }
  return std::nullopt;
}

ModelConfig read_checkpoint_model_config(const std::string& dir) {
  const std::string path = join(dir, kConfigFile);
  const json config = load_json_file(path);
  auto foundry_config = config.find("foundry");
  if (!config.is_object() || foundry_config == config.end() || !foundry_config->is_object())
    fail(fmt::format("{}: has no \"foundry\" model config", path),
         "this checkpoint was not written by Foundry");
  return parse_model_config(*foundry_config, path);
}

json read_checkpoint_trainer_state(const std::string& dir) {
  if (is_sharded_checkpoint(dir)) {
    const std::string path = join(dir, kMetadataFile);
    const json metadata = parse_json_text(read_text_file(path), path);
    auto state = metadata.find("trainer_state");
    if (state == metadata.end() || !state->is_object())
      fail(fmt::format("{}: \"trainer_state\" is missing", path), kCorruptHint);
    return *state;
  }
  const std::string path = join(dir, kTrainerStateFile);
  if (!path_exists(path)) fail(fmt::format("{} is missing", path), kCorruptHint);
  json state = parse_json_text(read_text_file(path), path);
  if (!state.is_object()) fail(fmt::format("{}: not a JSON object", path), kCorruptHint);
  return state;
}

json load_checkpoint(const std::string& dir, const ModelConfig& expected, const ParamTable& table,
                     float* params, const std::vector<StateSlabToLoad>& optimizer_state) {
  FOUNDRY_CHECK(params != nullptr && !table.params().empty());
  const int64_t n = table.total_elements();
  std::vector<SlabTarget> targets = {{"", 0, n, params}};
  for (const StateSlabToLoad& st : optimizer_state) {
    FOUNDRY_CHECK(st.data != nullptr);
    targets.push_back({st.suffix, 0, n, st.data});
  }
  return load_checkpoint_targets(dir, expected, table, targets);
}

void check_finite_weights(const std::string& dir, const ParamTable& table, const float* params) {
  const ParamInfo* first = nullptr;
  int64_t in_first = 0, total = 0, tensors = 0;
  for (const ParamInfo& p : table.params()) {
    const int64_t bad = std::count_if(params + p.offset, params + p.offset + p.numel,
                                      [](float w) { return !std::isfinite(w); });
    if (bad == 0) continue;
    if (!first) {
      first = &p;
      in_first = bad;
    }
    total += bad;
    ++tensors;
  }
  if (!first) return;
  fail(fmt::format("checkpoint '{}' has {} non-finite weight{} in {} tensor{}; the first is {} "
                   "({} of its {} values)",
                   dir, total, total == 1 ? "" : "s", tensors, tensors == 1 ? "" : "s",
                   first->name, in_first, first->numel),
       "the run diverged before this checkpoint was saved: use an earlier one (--checkpoint "
       "RUN_DIR/checkpoints/step_N), or train again from one with a lower train.lr");
}

json load_checkpoint_targets(const std::string& dir, const ModelConfig& expected,
                             const ParamTable& table, const std::vector<SlabTarget>& targets,
                             const std::function<void()>& on_tensor) {
  if (is_sharded_checkpoint(dir))
    return load_sharded_checkpoint(dir, expected, table, targets, on_tensor);
  verify_checkpoint(dir);
  check_same_model(dir, read_checkpoint_model_config(dir), expected);
  json trainer_state = load_json_file(join(dir, kTrainerStateFile));

  // Every copy is planned, and so every tensor checked, before the first byte is written.
  struct Copy {
    float* to;
    const uint8_t* from;
    uint64_t bytes;
  };
  std::vector<Copy> copies;
  // Parameters come from model.safetensors, where other tensors (buffers such as the ZAYA1
  // balancing biases, written for Hugging Face loaders) are ignored; states from
  // optimizer.safetensors as "<param>.<state>".
  const SafetensorsReader model(join(dir, kModelFile));
  std::optional<SafetensorsReader> optimizer;
  for (const SlabTarget& t : targets) {
    if (!t.slab.empty() && !optimizer) optimizer.emplace(join(dir, kOptimizerFile));
    const SafetensorsReader& file = t.slab.empty() ? model : *optimizer;
    for (const ParamInfo& p : table.params()) {
      const int64_t lo = std::max(t.begin, p.offset), hi = std::min(t.end, p.offset + p.numel);
      if (lo >= hi) continue;
      const std::string name = t.slab.empty() ? p.name : p.name + "." + t.slab;
      const TensorView* v = file.find(name);
      if (!v && t.slab.empty())
        fail(fmt::format("{} has no tensor '{}'", file.path(), name),
             "the checkpoint was written for a different model");
      if (!v)
        fail(fmt::format("{} has no optimizer state '{}' for '{}' (it holds: {})", file.path(),
                         t.slab, p.name, fmt::join(saved_state_suffixes(file, table), ", ")),
             "resume with the optimizer the checkpoint was written with");
      check_tensor_matches(file, *v, p);
      copies.push_back({t.data + (lo - t.begin), v->data + (lo - p.offset) * sizeof(float),
                        static_cast<uint64_t>(hi - lo) * sizeof(float)});
    }
  }
  for (const Copy& c : copies) {
    std::memcpy(c.to, c.from, c.bytes);
    if (on_tensor) on_tensor();
  }
  return trainer_state;
}

}  // namespace foundry
