#include "ckpt/export.h"

#include <fcntl.h>
#include <fmt/ranges.h>
#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>

#include "base/error.h"
#include "base/io.h"
#include "base/timer.h"
#include "ckpt/checkpoint.h"
#include "ckpt/checkpoint_dir.h"
#include "ckpt/inspect.h"
#include "ckpt/model_state.h"
#include "ckpt/safetensors.h"

namespace foundry {
namespace {

namespace fs = std::filesystem;

// A version 2 checkpoint is read a batch of consecutive parameters per call (each call
// parses the metadata once): up to this many bytes, or one larger tensor alone, so memory
// holds about the largest tensor.
constexpr int64_t kMinBatchBytes = int64_t{64} << 20;

// Receives each parameter's values, in table order; `values` is valid during the call.
using ParamSink = std::function<void(const ParamInfo& p, const float* values)>;

// Consecutive parameters [first, last) of the table: one slab range.
struct ParamBatch {
  size_t first = 0, last = 0;
};

std::vector<ParamBatch> param_batches(const ParamTable& table) {
  const std::vector<ParamInfo>& params = table.params();
  int64_t largest = 0;
  for (const ParamInfo& p : params) largest = std::max(largest, p.numel);
  const int64_t limit = std::max(largest, kMinBatchBytes / static_cast<int64_t>(sizeof(float)));
  std::vector<ParamBatch> batches;
  ParamBatch batch;
  for (size_t i = 0; i < params.size(); ++i) {
    FOUNDRY_CHECK(i == 0 || params[i].offset >= params[i - 1].offset + params[i - 1].numel);
    if (batch.last > batch.first &&
        params[i].offset + params[i].numel - params[batch.first].offset > limit) {
      batches.push_back(batch);
      batch = {i, i};
    }
    batch.last = i + 1;
  }
  if (batch.last > batch.first) batches.push_back(batch);
  return batches;
}

void read_sharded_params(const std::string& dir, const ModelConfig& config,
                         const ParamTable& table, const ParamSink& sink) {
  const std::vector<ParamInfo>& params = table.params();
  std::vector<float> buffer;  // grows to the largest batch once
  for (const ParamBatch& b : param_batches(table)) {
    const int64_t begin = params[b.first].offset;
    const int64_t end = params[b.last - 1].offset + params[b.last - 1].numel;
    buffer.resize(static_cast<size_t>(std::max<int64_t>(end - begin, buffer.size())));
    load_checkpoint_targets(dir, config, table, {{"", begin, end, buffer.data()}});
    for (size_t i = b.first; i < b.last; ++i)
      sink(params[i], buffer.data() + (params[i].offset - begin));
  }
}

// Version 1: straight from the mapped model.safetensors (its checksum already verified).
void read_v1_params(const std::string& dir, const ParamTable& table, const ParamSink& sink) {
  const SafetensorsReader model(join(dir, kModelFile));
  for (const ParamInfo& p : table.params()) {
    const TensorView& t = model.get(p.name);
    if (t.dtype != StDtype::F32 || t.shape != p.shape)
      fail(fmt::format("{}: tensor '{}' is {} [{}], the model needs F32 [{}]", model.path(),
                       t.name, dtype_name(t.dtype), fmt::join(t.shape, ", "),
                       fmt::join(p.shape, ", ")),
           kCorruptHint);
    sink(p, reinterpret_cast<const float*>(t.data));
  }
}

FileDigest write_model_file(const std::string& path, const std::string& dir, int version,
                            const ModelConfig& config, const ParamTable& table,
                            const std::vector<ExtraTensorToSave>& extras) {
  std::vector<TensorHeader> headers;
  for (const ParamInfo& p : table.params()) headers.push_back({p.name, StDtype::F32, p.shape});
  for (const ExtraTensorToSave& e : extras) headers.push_back({e.name, StDtype::F32, e.shape});
  // Hugging Face loaders look for this metadata to know the tensors are PyTorch-compatible.
  SafetensorsStreamWriter writer(path, headers, {{"format", "pt"}});
  // A diverged run's weights are exported as saved, with a warning (eval and generate refuse
  // them).
  int64_t non_finite = 0, tensors = 0;
  std::string first;
  const ParamSink sink = [&](const ParamInfo& p, const float* values) {
    const int64_t bad =
        std::count_if(values, values + p.numel, [](float w) { return !std::isfinite(w); });
    if (bad > 0 && tensors++ == 0) first = p.name;
    non_finite += bad;
    writer.write_tensor(p.name, values);
  };
  if (version == kShardedFormatVersion)
    read_sharded_params(dir, config, table, sink);
  else
    read_v1_params(dir, table, sink);
  if (non_finite > 0)
    warn(fmt::format(
        "checkpoint '{}' has {} non-finite weight{} (NaN or inf) in {} tensor{}, "
        "the first {}: the run had diverged before it was saved, and the exported "
        "model computes NaN; an earlier checkpoint (RUN_DIR/checkpoints/step_N) may "
        "not",
        dir, non_finite, non_finite == 1 ? "" : "s", tensors, tensors == 1 ? "" : "s", first));
  for (const ExtraTensorToSave& e : extras) writer.write_tensor(e.name, e.data);
  return writer.finish();
}

// Where an export to `out` is staged: OUT.tmp-HOST-PID (a file system may be shared by hosts).
std::string staging_path(const std::string& out, int64_t pid) {
  return fmt::format("{}.tmp-{}-{}", out, host_name(), pid);
}

// What an export to `out` from this host killed before it finished left (the staging of a
// process that is gone): removed by the next export to `out`.
void remove_stale_exports(const std::string& out) {
  const fs::path target(out);
  const fs::path parent = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  const std::string prefix = fs::path(staging_path(out, 0)).filename().string();
  const std::string own = prefix.substr(0, prefix.size() - 1);  // "OUT.tmp-HOST-"
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(parent, ec)) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with(own)) continue;
    const std::string digits = name.substr(own.size());
    if (digits.empty() || digits.size() > 9 ||
        digits.find_first_not_of("0123456789") != std::string::npos)
      continue;
    if (const long pid = std::stol(digits); pid > 0 && process_gone(pid))
      fs::remove_all(entry.path(), ec);
  }
}

void check_out_dir(const std::string& out) {
  std::error_code ec;
  // The export is staged beside `out`, missing parents made: the nearest existing one must be
  // a directory.
  for (fs::path p = fs::path(out).parent_path(); !p.empty(); p = p.parent_path()) {
    if (!fs::exists(p, ec)) continue;
    if (!fs::is_directory(p, ec))
      fail(fmt::format("cannot export into '{}': '{}' is not a directory", out, p.string()),
           "export into a new or empty directory under a directory");
    break;
  }
  if (!fs::exists(out, ec)) return;
  if (!fs::is_directory(out, ec))
    fail(fmt::format("export directory '{}' exists and is not a directory", out),
         "export into a new or empty directory");
  if (!fs::is_empty(out, ec))
    fail(fmt::format("export directory '{}' is not empty", out),
         "export into a new or empty directory; nothing was written");
}

// `to` must not exist: a file that appeared in OUT since it was checked (another export into
// it) is not replaced.
void rename_or_fail(const std::string& from, const std::string& to) {
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) return;
  int err = errno;
  // File systems without rename flags (NFS): checked, then renamed (a narrow race remains).
  if (err == EINVAL || err == ENOSYS || err == ENOTSUP) {
    std::error_code ec;
    if (fs::exists(fs::symlink_status(to, ec)))
      err = EEXIST;
    else if (::rename(from.c_str(), to.c_str()) == 0)
      return;
    else
      err = errno;
  }
  if (err == EEXIST || err == ENOTEMPTY)
    fail(fmt::format("cannot move the export into '{}': it appeared there during the export "
                     "(another export into the same directory?)",
                     to),
         "export into a new or empty directory, one export at a time");
  fail(fmt::format("cannot rename '{}' to '{}': {}", from, to, std::strerror(err)),
       err == EXDEV ? "the export directory is a mount point (the export is staged beside it): "
                      "export into a new directory inside it"
                    : "export into a new or empty directory");
}

// Moves the finished `tmp` to `out` and makes it durable. A new `out` is `tmp` renamed; an
// existing (empty) one keeps its directory, which may be a shell's working directory, and
// receives the files, the model first: a config.json there means the export is whole.
void publish_export(const std::string& tmp, const std::string& out) {
  fsync_path(tmp);
  std::error_code ec;
  if (!fs::is_directory(out, ec)) {
    rename_or_fail(tmp, out);
    const std::string parent = fs::path(out).parent_path().string();
    fsync_path(parent.empty() ? "." : parent);
    return;
  }
  const std::string model = join(out, kModelFile);
  rename_or_fail(join(tmp, kModelFile), model);
  try {
    rename_or_fail(join(tmp, kConfigFile), join(out, kConfigFile));
  } catch (...) {
    fs::remove(model, ec);
    throw;
  }
  fsync_path(out);
  fs::remove(tmp, ec);
}

std::string without_trailing_slash(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

// The directory to publish into: a symbolic link stands for the directory it names (the
// finished export is renamed onto a directory, never onto the link itself).
std::string export_target(const std::string& out_dir) {
  std::string out = without_trailing_slash(out_dir);
  std::error_code ec;
  // "." or "..": the directory by its path, so the export is staged beside it, not inside it.
  if (const std::string last = fs::path(out).filename().string(); last == "." || last == "..")
    out = without_trailing_slash(fs::absolute(out, ec).lexically_normal().string());
  if (!fs::is_symlink(out, ec)) return out;
  const fs::path target = fs::canonical(out, ec);
  if (ec)
    fail(fmt::format("export directory '{}' is a symbolic link to a missing path", out),
         "export into a new or empty directory, or make the link name one");
  return target.string();
}

}  // namespace

ExportReport export_hf_model(const std::string& checkpoint_dir, const std::string& out_dir) {
  const double t0 = now_seconds();
  const std::string out = export_target(out_dir);
  const int version = checkpoint_format_version(checkpoint_dir);
  check_out_dir(out);
  verify_checkpoint(checkpoint_dir);  // v2: metadata and file sizes; v1: every checksum
  const ModelConfig config = checkpoint_model_config(checkpoint_dir);
  if (!has_hf_class(config))
    fail(fmt::format("{}: model.qk_norm = \"{}\" with {} expert(s): no Hugging Face class reads "
                     "these tensors under their names", checkpoint_dir,
                     qk_norm_name(config.qk_norm), config.n_experts),
         "export supports model.qk_norm \"head\" on a dense model (Qwen3) and models without "
         "qk_norm (Llama, Mixtral)");
  if (const std::string mismatch = hf_class_mismatch(config); !mismatch.empty())
    fail(fmt::format("{}: {}; the exported model would compute something else", checkpoint_dir,
                     mismatch),
         "export supports the standard MoE with model.norm_topk_prob = true and "
         "model.rope_fraction = 1 (or arch zaya1)");
  const ParamTable table(config);
  const std::string state_where =
      version == kShardedFormatVersion ? join(checkpoint_dir, kMetadataFile) + " (trainer_state)"
                                       : join(checkpoint_dir, kTrainerStateFile);
  const std::vector<ops::ZayaBalancer> balancers =
      saved_router_balancers(config, read_checkpoint_trainer_state(checkpoint_dir), state_where);
  const std::vector<ExtraTensorToSave> extras = balancing_bias_tensors(balancers);

  remove_stale_exports(out);
  const std::string tmp = staging_path(out, ::getpid());
  remove_all(tmp);
  const std::string parent = fs::path(out).parent_path().string();
  const std::string created = parent.empty() ? "" : make_dirs_outermost(parent);
  make_dirs(tmp);
  ExportReport report;
  try {
    report.bytes = static_cast<int64_t>(
        write_model_file(join(tmp, kModelFile), checkpoint_dir, version, config, table, extras)
            .bytes);
    write_json_file(join(tmp, kConfigFile), hf_config_json(config));
    publish_export(tmp, out);
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    remove_empty_dirs(parent, created);  // the missing parents this export made
    throw;
  }
  report.tensors = static_cast<int64_t>(table.params().size() + extras.size());
  report.seconds = now_seconds() - t0;
  return report;
}

}  // namespace foundry
