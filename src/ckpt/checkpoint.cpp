#include "ckpt/checkpoint.h"

#include <fcntl.h>
#include <stdio.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "base/error.h"
#include "base/hash.h"
#include "base/io.h"
#include "ckpt/safetensors.h"

namespace foundry {
namespace {

namespace fs = std::filesystem;

constexpr char kModelFile[] = "model.safetensors";
constexpr char kOptimizerFile[] = "optimizer.safetensors";
constexpr char kConfigFile[] = "config.json";
constexpr char kTrainerStateFile[] = "trainer_state.json";
constexpr char kManifestFile[] = "manifest.json";
constexpr char kCommittedFile[] = "COMMITTED";
constexpr char kLatestFile[] = "latest";
constexpr char kStepPrefix[] = "step_";
// Directories ending in this are saves in progress, interrupted saves, or checkpoints on
// their way out; never read, removed by the next save.
constexpr char kTmpSuffix[] = ".tmp";

const char* const kRequiredFiles[] = {kModelFile, kOptimizerFile, kConfigFile,
                                      kTrainerStateFile};

std::string join(const std::string& dir, const std::string& name) {
  return (fs::path(dir) / name).string();
}
std::string checkpoints_root(const std::string& run_dir) { return join(run_dir, "checkpoints"); }

void warn(const std::string& message) { fmt::print(stderr, "warning: {}\n", message); }

// The entries of a directory, as (name, is a directory) pairs.
std::vector<std::pair<std::string, bool>> list_dir(const std::string& dir) {
  std::vector<std::pair<std::string, bool>> entries;
  try {
    for (const auto& entry : fs::directory_iterator(dir))
      entries.emplace_back(entry.path().filename().string(), entry.is_directory());
  } catch (const fs::filesystem_error& e) {
    fail(fmt::format("cannot list '{}': {}", dir, e.code().message()), "check permissions");
  }
  return entries;
}

// The step of a directory named exactly "step_<digits>", if it is one.
std::optional<int64_t> parse_checkpoint_dir_name(const std::string& name) {
  if (!name.starts_with(kStepPrefix)) return std::nullopt;
  const std::string digits = name.substr(std::strlen(kStepPrefix));
  if (digits.empty() || digits.size() > 18) return std::nullopt;
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  return std::stoll(digits);
}

std::string dump_json(const json& j, const std::string& what) {
  try {
    return j.dump(2) + "\n";
  } catch (const json::exception& e) {
    fail(fmt::format("cannot write {} as JSON: {}", what, e.what()),
         "JSON strings must be valid UTF-8");
  }
}

// Durable (fsynced, with its directory) and checksummed.
FileDigest write_json_file(const std::string& path, const json& j) {
  const std::string text = dump_json(j, path);
  write_file_atomic(path, text);
  return {text.size(), hash64(text.data(), text.size())};
}

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

// Moves the finished directory to its final name. If that name is taken (a checkpoint of
// the same step from an earlier attempt), the two are swapped in one rename so the name
// always holds a complete checkpoint; filesystems without RENAME_EXCHANGE move the old one
// aside first.
void publish_dir(const std::string& tmp_dir, const std::string& final_dir) {
  auto fail_rename = [](const std::string& from, const std::string& to) {
    fail(fmt::format("cannot rename '{}' to '{}': {}", from, to, std::strerror(errno)),
         "check permissions on the run directory");
  };
  if (!path_exists(final_dir)) {
    if (::rename(tmp_dir.c_str(), final_dir.c_str()) != 0) fail_rename(tmp_dir, final_dir);
    return;
  }
  if (::renameat2(AT_FDCWD, tmp_dir.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) {
    remove_all(tmp_dir);  // now holds the replaced checkpoint
    return;
  }
  if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) fail_rename(tmp_dir, final_dir);
  const std::string replaced = final_dir + ".replaced" + kTmpSuffix;
  remove_all(replaced);
  if (::rename(final_dir.c_str(), replaced.c_str()) != 0) fail_rename(final_dir, replaced);
  if (::rename(tmp_dir.c_str(), final_dir.c_str()) != 0) fail_rename(tmp_dir, final_dir);
  remove_all(replaced);
}

// Interrupted saves and removals, and a `latest` replacement that never got renamed.
void remove_leftovers(const std::string& root) {
  for (const auto& [name, is_dir] : list_dir(root)) {
    const bool tmp_checkpoint = name.starts_with(kStepPrefix) && name.ends_with(kTmpSuffix);
    const bool tmp_latest = name.starts_with(std::string(kLatestFile) + ".tmp.");
    if (tmp_checkpoint || tmp_latest) remove_all(join(root, name));
  }
}

// Keeps the newest `keep_last` committed checkpoints, always including `saved_step`.
// Each one removed is renamed to *.tmp first, so an interrupted removal leaves a leftover
// that is ignored, never a half-deleted checkpoint.
void apply_retention(const std::string& run_dir, int64_t saved_step, int64_t keep_last) {
  if (keep_last <= 0) return;
  std::vector<CheckpointDir> others;
  for (const auto& c : list_checkpoint_dirs(run_dir))
    if (c.step != saved_step && path_exists(join(c.path, kCommittedFile))) others.push_back(c);
  std::sort(others.begin(), others.end(),
            [](const CheckpointDir& a, const CheckpointDir& b) { return a.step > b.step; });
  for (size_t i = static_cast<size_t>(keep_last - 1); i < others.size(); ++i) {
    const std::string doomed = others[i].path + ".removed" + kTmpSuffix;
    if (::rename(others[i].path.c_str(), doomed.c_str()) != 0)
      fail(fmt::format("cannot remove old checkpoint '{}': {}", others[i].path,
                       std::strerror(errno)));
    remove_all(doomed);
  }
}

// ---- verifying and loading ----------------------------------------------------------------

const char kCorruptHint[] =
    "the checkpoint is incomplete or corrupt; resume from an older checkpoint "
    "(training does so automatically) or delete this one";

json parse_json_text(const std::string& text, const std::string& path) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    fail(fmt::format("{}: invalid JSON: {}", path, e.what()), kCorruptHint);
  }
}

void check_format_version(const json& j, const std::string& path) {
  auto v = j.find("format_version");
  if (v == j.end() || !v->is_number_integer())
    fail(fmt::format("{}: \"format_version\" is missing", path), kCorruptHint);
  if (*v != kCheckpointFormatVersion)
    fail(fmt::format("{}: format_version {} is not supported (this Foundry reads version {})",
                     path, v->dump(), kCheckpointFormatVersion),
         "load it with the Foundry version that wrote it");
}

const std::string& string_field(const json& j, const char* key, const std::string& path) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string())
    fail(fmt::format("{}: \"{}\" is missing or not a string", path, key), kCorruptHint);
  return it->get_ref<const std::string&>();
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

// Lists each differing key as "checkpoint has model.d_model = 256, the config says 512".
void check_same_model(const std::string& dir, const ModelConfig& saved,
                      const ModelConfig& expected) {
  const json saved_json = to_json(saved), expected_json = to_json(expected);
  std::vector<std::string> differences;
  for (const auto& [key, value] : expected_json.items()) {
    auto it = saved_json.find(key);
    if (it == saved_json.end() || *it != value)
      differences.push_back(fmt::format("checkpoint has model.{} = {}, the config says {}", key,
                                        it == saved_json.end() ? "nothing" : it->dump(),
                                        value.dump()));
  }
  if (!differences.empty())
    fail(fmt::format("{} was written for a different model: {}", dir,
                     fmt::join(differences, "; ")),
         "resume with the model config the checkpoint was written with (its config.json "
         "holds it under \"foundry\"), or start a new run directory");
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
  write_file_atomic(join(root, kLatestFile), name + "\n");
  apply_retention(run_dir, step, keep_last);
  return final_dir;
}

void verify_checkpoint(const std::string& dir) {
  if (!fs::is_directory(dir))
    fail(fmt::format("checkpoint '{}' is not a directory", dir),
         "pass a directory such as RUN_DIR/checkpoints/step_00001000");
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

std::optional<std::string> find_latest_checkpoint(const std::string& run_dir) {
  const std::string root = checkpoints_root(run_dir);
  const std::string latest_path = join(root, kLatestFile);
  std::string tried;
  if (path_exists(latest_path)) {
    std::string name = read_text_file(latest_path);
    while (!name.empty() && std::isspace(static_cast<unsigned char>(name.back()))) name.pop_back();
    if (!parse_checkpoint_dir_name(name)) {
      warn(fmt::format("{} holds '{}', which is not a checkpoint name; looking for checkpoints",
                       latest_path, name));
    } else {
      const std::string dir = join(root, name);
      try {
        verify_checkpoint(dir);
        return dir;
      } catch (const Error& e) {
        warn(fmt::format("skipping checkpoint {} named by {}: {}", dir, latest_path, e.what()));
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
      warn(fmt::format("skipping invalid checkpoint {}: {}", it->path, e.what()));
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
  const std::string path = join(dir, kTrainerStateFile);
  if (!path_exists(path)) fail(fmt::format("{} is missing", path), kCorruptHint);
  json state = parse_json_text(read_text_file(path), path);
  if (!state.is_object()) fail(fmt::format("{}: not a JSON object", path), kCorruptHint);
  return state;
}

json load_checkpoint(const std::string& dir, const ModelConfig& expected, const ParamTable& table,
                     float* params, const std::vector<StateSlabToLoad>& optimizer_state) {
  FOUNDRY_CHECK(params != nullptr && !table.params().empty());
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

  // Every parameter must be there; other tensors (buffers such as the ZAYA1 balancing
  // biases, written for Hugging Face loaders) are ignored: the model config was compared
  // above, and state that is not a parameter is restored from trainer_state.json.
  const SafetensorsReader model(join(dir, kModelFile));
  for (const ParamInfo& p : table.params()) {
    const TensorView* t = model.find(p.name);
    if (!t)
      fail(fmt::format("{} has no tensor '{}'", model.path(), p.name),
           "the checkpoint was written for a different model");
    check_tensor_matches(model, *t, p);
    copies.push_back({params + p.offset, t->data, t->bytes});
  }

  const SafetensorsReader optimizer(join(dir, kOptimizerFile));
  for (const StateSlabToLoad& s : optimizer_state) {
    FOUNDRY_CHECK(s.data != nullptr);
    for (const ParamInfo& p : table.params()) {
      const TensorView* t = optimizer.find(p.name + "." + s.suffix);
      if (!t)
        fail(fmt::format("{} has no optimizer state '{}' for '{}' (it holds: {})",
                         optimizer.path(), s.suffix, p.name,
                         fmt::join(saved_state_suffixes(optimizer, table), ", ")),
             "resume with the optimizer the checkpoint was written with");
      check_tensor_matches(optimizer, *t, p);
      copies.push_back({s.data + p.offset, t->data, t->bytes});
    }
  }

  for (const Copy& c : copies) std::memcpy(c.to, c.from, c.bytes);
  return trainer_state;
}

}  // namespace foundry
