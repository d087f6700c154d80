#include "ckpt/checkpoint_dir.h"

#include <fcntl.h>
#include <fmt/ranges.h>
#include <stdio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>

#include "base/error.h"
#include "base/hash.h"
#include "base/io.h"
#include "ckpt/checkpoint.h"

namespace foundry {

namespace fs = std::filesystem;

std::string checkpoint_checksum(const std::string& dir) {
  const std::string marker = join(dir, kCommittedFile);
  if (!path_exists(marker)) return "";
  const std::string bytes = read_text_file(marker);
  return hash64_hex(hash64(bytes.data(), bytes.size()));
}

bool has_commit_marker(const std::string& dir) {
  const std::string marker = join(dir, kCommittedFile);
  std::error_code ec;
  // Foundry's marker is a line of JSON: a large file is not one.
  if (!fs::is_regular_file(marker, ec) || fs::file_size(marker, ec) > 4096 || ec) return false;
  const json j = json::parse(read_text_file(marker), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("format_version") || !j["format_version"].is_number_integer())
    return false;
  for (const char* key : {"manifest_xxh3_64", "metadata_xxh3_64"})
    if (j.contains(key) && j[key].is_string()) return true;
  return false;
}

bool is_foundry_checkpoint_dir(const std::string& dir) {
  if (has_commit_marker(dir)) return true;
  // Its marker damaged or lost since: the checkpoint fails verification (a resume falls back
  // to an older one, and a save of the same step replaces it), but what its save wrote first
  // is there: the metadata (format 2) or manifest (format 1), beside the config.json whose
  // "foundry" section holds the model config (names other tools use too: both must be there).
  if (!path_exists(join(dir, kMetadataFile)) && !path_exists(join(dir, kManifestFile)))
    return false;
  const std::string config = join(dir, kConfigFile);
  std::error_code ec;
  if (!fs::is_regular_file(config, ec) || fs::file_size(config, ec) > (1 << 20) || ec) return false;
  const json j = json::parse(read_text_file(config), nullptr, /*allow_exceptions=*/false);
  return j.is_object() && j.contains("foundry") && j["foundry"].is_object();
}

std::string join(const std::string& dir, const std::string& name) {
  return (fs::path(dir) / name).string();
}
std::string checkpoints_root(const std::string& run_dir) { return join(run_dir, "checkpoints"); }

void warn(const std::string& message) { fmt::print(stderr, "warning: {}\n", message); }

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
  // Only a checkpoint is replaced: a directory of that name Foundry did not write stays.
  if (!is_foundry_checkpoint_dir(final_dir))
    fail(fmt::format("cannot save the checkpoint: '{}' exists and is not a checkpoint Foundry "
                     "wrote (neither its commit marker nor its metadata); it was left as it was",
                     final_dir),
         "move it out of the checkpoints directory, then resume the run");
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
std::vector<std::string> remove_leftovers(const std::string& root, const std::string& keep) {
  std::vector<std::string> removed;
  for (const auto& [name, is_dir] : list_dir(root)) {
    const bool tmp_checkpoint = name.starts_with(kStepPrefix) && name.ends_with(kTmpSuffix);
    const bool tmp_latest = name.starts_with(std::string(kLatestFile) + ".tmp.");
    if ((tmp_checkpoint || tmp_latest) && join(root, name) != keep) {
      remove_all(join(root, name));
      removed.push_back(name);
    }
  }
  return removed;
}

// Keeps the newest `keep_last` committed checkpoints, always including `saved_step`.
// Each one removed is renamed to *.tmp first, so an interrupted removal leaves a leftover
// that is ignored, never a half-deleted checkpoint.
void apply_retention(const std::string& run_dir, int64_t saved_step, int64_t keep_last) {
  if (keep_last <= 0) return;
  std::vector<CheckpointDir> others;
  for (const auto& c : list_checkpoint_dirs(run_dir))
    if (c.step != saved_step && has_commit_marker(c.path)) others.push_back(c);
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


json parse_json_text(const std::string& text, const std::string& path) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    fail(fmt::format("{}: invalid JSON: {}", path, e.what()), kCorruptHint);
  }
}

const std::string& string_field(const json& j, const char* key, const std::string& path) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string())
    fail(fmt::format("{}: \"{}\" is missing or not a string", path, key), kCorruptHint);
  return it->get_ref<const std::string&>();
}

// Lists each differing key as "checkpoint has model.d_model = 256, the config says 512".
void check_same_model(const std::string& dir, const ModelConfig& saved,
                      const ModelConfig& expected) {
  const json saved_json = to_json(saved), expected_json = to_json(expected);
  // How the ZAYA1 balancer moves its biases, and the skip bias it starts from, shape training
  // only: the saved biases load under another rule, which starts afresh (docs/formats.md,
  // router_balancers), and eval and generate never run the rule.
  static const std::set<std::string> kTrainingOnly = {"balance_rule", "balance_bias_lr",
                                                      "skip_bias_init"};
  std::vector<std::string> differences;
  for (const auto& [key, value] : expected_json.items()) {
    if (kTrainingOnly.count(key)) continue;
    auto it = saved_json.find(key);
    if (it == saved_json.end() || *it != value)
      differences.push_back(fmt::format("checkpoint has model.{} = {}, the config says {}", key,
                                        it == saved_json.end() ? "nothing" : it->dump(),
                                        value.dump()));
  }
  if (!differences.empty())
    fail(fmt::format("{} was written for a different model: {}", dir, fmt::join(differences, "; ")),
         "use the model config the checkpoint was written with (its config.json holds it "
         "under \"foundry\"; a run's RUN_DIR/config.json has it), or, to train, start a new "
         "run directory");
}

void write_latest(const std::string& root, const std::string& name) {
  write_file_atomic(join(root, kLatestFile), name + "\n");
}

}  // namespace foundry
