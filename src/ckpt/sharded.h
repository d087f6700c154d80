// Checkpoints, format v2: sharded and parallelism-agnostic. Every rank writes only what it
// holds into a file of its own; one metadata file describes each saved piece by its place
// in the global tensor (a box: n-d offsets and lengths) and by where its bytes are. Loading
// under any process layout is box intersection: a rank reads exactly the byte ranges (in
// checksummed chunks) that overlap what it now holds. docs/formats.md has the full format.
//
//   RUN_DIR/checkpoints/
//     latest                      "step_00001000\n"
//     step_00001000/
//       rank_00000.bin ...        one per rank: its pieces, raw little-endian F32, each
//                                 starting at a multiple of 64 bytes
//       metadata.json             format_version 2: tensors, pieces, files, the layout that
//                                 wrote it, the model config and the trainer state
//       config.json               the Hugging Face config (as in version 1)
//       COMMITTED                 written last: the metadata's checksum
//     step_00002000.<tag>.tmp/    a save in progress or interrupted: ignored, removed later
//
// Saving is split so that the collective parts stay with the caller: each rank
// write_rank_shard()s into the staging directory (no communication; a background thread
// may do it), the descriptions are gathered to one rank, which commit_sharded_checkpoint()s.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "base/config_reader.h"
#include "model/config.h"
#include "model/params.h"

namespace foundry {

constexpr int kShardedFormatVersion = 2;
// Checksums cover pieces in chunks of this many bytes, so a partial read verifies what it
// reads without reading whole pieces.
constexpr int64_t kChecksumChunkBytes = int64_t{1} << 20;

// A run of a slab (the parameter table's layout) that a rank saves or loads: slab elements
// [begin, end), values at data[0 .. end − begin). `slab` is "" for the parameters, else an
// optimizer state ("exp_avg"); its tensors are saved as "<param name>.<slab>".
struct SlabRun {
  std::string slab;
  int64_t begin = 0, end = 0;
  const float* data = nullptr;
};
struct SlabTarget {
  std::string slab;
  int64_t begin = 0, end = 0;
  float* data = nullptr;
};

// The staging directory of a save: RUN_DIR/checkpoints/step_<step>.<tag>.tmp (every rank of
// one save uses the same tag).
std::string staging_dir(const std::string& run_dir, int64_t step, const std::string& tag);

// Writes this rank's pieces of `runs` (padding between tensors is not saved) to
// staging/rank_<rank>.bin and fsyncs it. Returns the rank's description for the metadata:
// {"file", "bytes", "direct_io", "pieces": [{"tensor", "offsets", "lengths", "byte_offset",
// "byte_length", "xxh3_64": [per chunk]}]}. Fails naming the file on any I/O error (the
// caller reports it). The file is written with direct I/O where the filesystem takes it
// (bypassing the page cache; "direct_io" says whether it did).
// `recycle_dir`: an old checkpoint on its way out whose file of this rank, if it has one, is
// moved here and overwritten in place through the page cache (a RAM-backed directory then
// allocates no new pages); that checkpoint is no longer valid afterwards.
json write_rank_shard(const std::string& staging, int rank, const ParamTable& table,
                      const std::vector<SlabRun>& runs, const std::string& recycle_dir = "");

// What the metadata says about the layout that wrote a checkpoint (informational).
struct SavedLayout {
  int world = 1, expert_parallel = 1;
  bool zero1 = false;
  int context_parallel = 1;
};

// One rank, after every rank's write_rank_shard succeeded: writes metadata.json (from the
// ranks' descriptions in rank order), config.json and COMMITTED into `staging`, moves it to
// step_<step>, points `latest` at it and keeps the newest `keep_last` checkpoints. Checks
// that the pieces cover every parameter element exactly once. Returns the directory.
std::string commit_sharded_checkpoint(const std::string& run_dir, const std::string& staging,
                                      int64_t step, const ModelConfig& config,
                                      const ParamTable& table, const std::vector<json>& shards,
                                      const json& trainer_state, const SavedLayout& layout,
                                      int64_t keep_last);

// A committed version 2 checkpoint: its metadata checked against COMMITTED and every listed
// file present with its size (not the data: load_sharded checks what it reads; verify_data
// checks everything).
bool is_sharded_checkpoint(const std::string& dir);
void verify_sharded_checkpoint(const std::string& dir);
json read_sharded_metadata(const std::string& dir);  // verified

// Fills every target from a checkpoint written for `expected` (any layout), reading only the
// chunks that overlap the targets and verifying their checksums. Every tensor element a
// target covers must be in the checkpoint (an error names the tensor and the missing
// range); padding between tensors is left as it is. `on_tensor` (optional) is called after
// each tensor's part is read: a long load's progress. Returns the trainer state.
json load_sharded_checkpoint(const std::string& dir, const ModelConfig& expected,
                             const ParamTable& table, const std::vector<SlabTarget>& targets,
                             const std::function<void()>& on_tensor = {});

// Reads every piece, checks every chunk checksum and that the pieces cover each saved
// tensor exactly once. Fails naming the file and byte range of the first fault. Returns the
// tensors holding non-finite values (NaN, ±inf), with their counts: written faithfully, but a
// diverged run's.
std::map<std::string, int64_t> verify_sharded_data(const std::string& dir);

}  // namespace foundry
