// The layout of RUN_DIR/checkpoints shared by every checkpoint format (internal to ckpt/):
// file and directory names, the commit marker, `latest`, publishing a finished directory,
// leftovers of interrupted saves, retention, and the checks common to every version.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/config_reader.h"
#include "ckpt/safetensors.h"
#include "model/config.h"

namespace foundry {

inline constexpr char kModelFile[] = "model.safetensors";
inline constexpr char kOptimizerFile[] = "optimizer.safetensors";
inline constexpr char kConfigFile[] = "config.json";
inline constexpr char kTrainerStateFile[] = "trainer_state.json";
inline constexpr char kManifestFile[] = "manifest.json";
inline constexpr char kCommittedFile[] = "COMMITTED";
inline constexpr char kLatestFile[] = "latest";
inline constexpr char kStepPrefix[] = "step_";
// Directories ending in this are saves in progress, interrupted saves, or checkpoints on
// their way out; never read, removed by the next save.
inline constexpr char kTmpSuffix[] = ".tmp";

inline const char* const kRequiredFiles[] = {kModelFile, kOptimizerFile, kConfigFile,
                                      kTrainerStateFile};

inline constexpr char kMetadataFile[] = "metadata.json";  // format 2

inline constexpr char kCorruptHint[] =
    "the checkpoint is incomplete or corrupt; resume from an older checkpoint "
    "(training does so automatically) or delete this one";

std::string join(const std::string& dir, const std::string& name);
std::string checkpoints_root(const std::string& run_dir);
// A committed checkpoint's identity: the XXH3-64 (hex) of its commit marker, which names its
// metadata's checksum and so its contents; "" when it has no marker.
std::string checkpoint_checksum(const std::string& dir);
// Whether `dir` holds a commit marker Foundry wrote: COMMITTED parses as an object with a
// format_version and its manifest's (v1) or metadata's (v2) checksum. Retention removes only
// such checkpoints.
bool has_commit_marker(const std::string& dir);
// Whether `dir` is a checkpoint directory Foundry wrote: its commit marker, or (the marker
// damaged or lost since) the manifest or metadata its save writes. Any other step directory
// (a COMMITTED of the user's, or none) is not Foundry's: no save or --overwrite replaces or
// removes it, and a resume refuses to start beside it.
bool is_foundry_checkpoint_dir(const std::string& dir);
void warn(const std::string& message);  // "warning: ..." on stderr
// The entries of a directory, as (name, is a directory) pairs.
std::vector<std::pair<std::string, bool>> list_dir(const std::string& dir);
// The step of a directory named exactly "step_<digits>", if it is one.
std::optional<int64_t> parse_checkpoint_dir_name(const std::string& name);
// Durable (fsynced, with its directory) and checksummed.
FileDigest write_json_file(const std::string& path, const json& j);
json parse_json_text(const std::string& text, const std::string& path);
const std::string& string_field(const json& j, const char* key, const std::string& path);

// Moves a finished directory to its final name, atomically replacing a checkpoint of the
// same step if there is one.
void publish_dir(const std::string& tmp_dir, const std::string& final_dir);
// Removes interrupted saves and removals (step_*.tmp) and `latest` replacements, except the
// directory `keep` (a save in progress); returns the names of those removed.
std::vector<std::string> remove_leftovers(const std::string& root, const std::string& keep = "");
// Keeps the newest `keep_last` committed checkpoints, always including `saved_step`.
void apply_retention(const std::string& run_dir, int64_t saved_step, int64_t keep_last);
// Points RUN_DIR/checkpoints/latest at checkpoint `name` (atomically).
void write_latest(const std::string& root, const std::string& name);

// Fails naming every model key that differs between a checkpoint and the config.
void check_same_model(const std::string& dir, const ModelConfig& saved,
                      const ModelConfig& expected);

}  // namespace foundry
