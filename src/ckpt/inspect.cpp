#include "ckpt/inspect.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>

#include "base/error.h"
#include "base/format.h"
#include "base/hash.h"
#include "base/io.h"
#include "base/timer.h"
#include "ckpt/checkpoint.h"
#include "ckpt/checkpoint_dir.h"
#include "ckpt/safetensors.h"
#include "model/params.h"

namespace foundry {
namespace {

namespace fs = std::filesystem;

constexpr char kCheckpointHint[] =
    "pass a checkpoint directory such as RUN_DIR/checkpoints/step_00001000";
constexpr size_t kNamesShown = 5;  // names listed in a message before "..."

template <typename T>
T field(const json& j, const char* key, const std::string& path) {
  auto it = j.find(key);
  if (!j.is_object() || it == j.end())
    fail(fmt::format("{}: \"{}\" is missing", path, key), kCorruptHint);
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    fail(fmt::format("{}: \"{}\" has the wrong type ({})", path, key, it->dump()), kCorruptHint);
  }
}

json read_json(const std::string& path) { return parse_json_text(read_text_file(path), path); }

// The description file of a checkpoint is of the version its name stands for, or unreadable.
void check_version(const json& description, const std::string& path, int expected) {
  const int version = field<int>(description, "format_version", path);
  if (version != expected)
    fail(fmt::format("{}: format_version {} is not supported (this Foundry reads version {})",
                     path, version, expected),
         "read it with the Foundry version that wrote it");
}

// "a, b, c" or "a, b, c, d, e, ... (12 in all)".
std::string some_names(const std::vector<std::string>& names) {
  if (names.size() <= kNamesShown) return fmt::format("{}", fmt::join(names, ", "));
  return fmt::format("{}, ... ({} in all)",
                     fmt::join(names.begin(), names.begin() + kNamesShown, ", "), names.size());
}

// 1234567 → "1,234,567".
std::string grouped(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

std::string human_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.1f} {}", v, units[u]);
}

std::string without_trailing_slash(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

// What to pass instead of a directory that is not a checkpoint: a run directory or its
// checkpoints/ folder names one of its checkpoints.
std::string not_a_checkpoint_hint(const std::string& dir) {
  const fs::path path(without_trailing_slash(dir));
  std::vector<CheckpointDir> found = list_checkpoint_dirs(path.string());
  if (found.empty() && path.filename() == "checkpoints")
    found = list_checkpoint_dirs(path.parent_path().string());
  if (found.empty()) return kCheckpointHint;
  return fmt::format("it holds checkpoints: pass one of them, e.g. {}", found.back().path);
}

// ---- reading the descriptions -------------------------------------------------------------

struct SavedTensor {
  std::string name;
  int64_t bytes = 0;
  std::vector<int64_t> shape;
  bool f32 = true;  // version 2 saves F32 only; version 1's headers say
};

std::optional<std::string> recorded_optimizer(const json& trainer_state) {
  auto it = trainer_state.find("optimizer");
  if (!trainer_state.is_object() || it == trainer_state.end() || !it->is_string())
    return std::nullopt;
  return it->get<std::string>();
}

// Version 2: everything is in metadata.json.
std::vector<SavedTensor> read_v2(const std::string& dir, CheckpointInfo& info) {
  const std::string path = join(dir, kMetadataFile);
  const json m = read_json(path);
  check_version(m, path, kShardedFormatVersion);
  info.step = field<int64_t>(m, "step", path);
  const json layout = field<json>(m, "layout", path);
  info.layout = SavedLayout{field<int>(layout, "world", path),
                            field<int>(layout, "expert_parallel", path),
                            field<bool>(layout, "zero1", path),
                            layout.value("context_parallel", 1)};  // absent before it existed
  info.model = parse_model_config(field<json>(m, "model", path), path);
  const json state = field<json>(m, "trainer_state", path);
  info.optimizer = recorded_optimizer(state).value_or("");
  // The step is written twice (the checkpoint's and the trainer's): they must agree.
  if (state.is_object() && state.contains("step") && state["step"] != info.step)
    info.problems.push_back(fmt::format("{}: step {} but trainer_state.step {}", path, info.step,
                                        state["step"].dump()));
  for (const json& f : field<json>(m, "files", path))
    info.files.push_back(
        {field<std::string>(f, "name", path), -1, field<int64_t>(f, "bytes", path)});
  for (const char* name : {kMetadataFile, kConfigFile, kCommittedFile})
    info.files.push_back({name});
  std::vector<SavedTensor> tensors;
  const json listed = field<json>(m, "tensors", path);
  for (const auto& [name, t] : listed.items()) {
    const std::vector<int64_t> shape = field<std::vector<int64_t>>(t, "shape", path);
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    tensors.push_back({name, numel * static_cast<int64_t>(sizeof(float)), shape});
  }
  return tensors;
}

// The tensors of one safetensors file of a version 1 checkpoint (none if it is unreadable:
// that is a problem, not a failure, so the rest can still be shown).
void read_safetensors_names(const std::string& path, std::vector<SavedTensor>& tensors,
                            CheckpointInfo& info) {
  if (!path_exists(path)) return;  // reported with the files
  try {
    const SafetensorsReader file(path);
    for (const TensorView& t : file.tensors())
      tensors.push_back({t.name, static_cast<int64_t>(t.bytes), t.shape, t.dtype == StDtype::F32});
  } catch (const Error& e) {
    info.problems.push_back(e.what());
  }
}

// Version 1: manifest.json, config.json, trainer_state.json and the safetensors headers.
std::vector<SavedTensor> read_v1(const std::string& dir, CheckpointInfo& info) {
  const std::string path = join(dir, kManifestFile);
  const json m = read_json(path);
  check_version(m, path, kCheckpointFormatVersion);
  info.step = field<int64_t>(m, "step", path);
  info.model = read_checkpoint_model_config(dir);
  const std::string state_path = join(dir, kTrainerStateFile);
  if (path_exists(state_path))
    info.optimizer = recorded_optimizer(read_json(state_path)).value_or("");
  const json files = field<json>(m, "files", path);
  for (const auto& [name, entry] : files.items())
    info.files.push_back({name, -1, field<int64_t>(entry, "bytes", path)});
  for (const char* name : {kManifestFile, kCommittedFile}) info.files.push_back({name});
  std::vector<SavedTensor> tensors;
  read_safetensors_names(join(dir, kModelFile), tensors, info);
  read_safetensors_names(join(dir, kOptimizerFile), tensors, info);
  return tensors;
}

// ---- what it means -------------------------------------------------------------------------

// Every state the recorded optimizer keeps, for each parameter it keeps it for: AdamW both
// moments of every parameter; Muon its momentum for the matrices it updates (is_muon_matrix)
// and AdamW's moments for the rest. `saved`: state slab → the parameters it has.
void check_optimizer_states(const ParamTable& table, const std::string& optimizer,
                            const std::map<std::string, std::set<std::string>>& saved,
                            CheckpointInfo& info) {
  if (optimizer != "adamw" && optimizer != "muon") return;  // not recorded: nothing to hold to
  const std::string run = optimizer == "adamw" ? "AdamW" : "Muon";
  for (const char* state : {"exp_avg", "exp_avg_sq", "muon_momentum"}) {
    const bool muon_state = std::string(state) == "muon_momentum";
    if (muon_state && optimizer == "adamw") continue;
    std::vector<std::string> without;
    int64_t expected = 0;
    const auto it = saved.find(state);
    for (const ParamInfo& p : table.params()) {
      if (optimizer == "muon" && is_muon_matrix(p) != muon_state) continue;
      ++expected;
      if (it == saved.end() || it->second.count(p.name) == 0) without.push_back(p.name);
    }
    if (without.empty()) continue;
    info.problems.push_back(
        without.size() == static_cast<size_t>(expected) && it == saved.end()
            ? fmt::format("the {} run saved no {}", run, state)
            : fmt::format("the {} run saved no {} for {} of the {} parameters it keeps one for: {}",
                          run, state, without.size(), expected, some_names(without)));
  }
}

// Sorts the tensors into slabs: a parameter's own name is "params", "<param>.<state>" is
// the state's slab, anything else is an extra tensor.
void classify(const std::vector<SavedTensor>& tensors, const ParamTable& table,
              CheckpointInfo& info) {
  std::map<std::string, SavedSlab> slabs;
  std::map<std::string, std::set<std::string>> saved;  // slab → parameters it has
  slabs["params"].name = "params";
  int64_t mismatched = 0;
  std::string first_mismatch;
  for (const SavedTensor& t : tensors) {
    std::string param = t.name, slab = "params";
    if (table.find(t.name) == nullptr) {
      const size_t dot = t.name.rfind('.');
      if (dot == std::string::npos || table.find(t.name.substr(0, dot)) == nullptr) {
        info.extra_tensors.push_back(t.name);
        continue;
      }
      param = t.name.substr(0, dot);
      slab = t.name.substr(dot + 1);
    }
    // What the loaders would refuse: a tensor of another shape or type than the model's.
    const ParamInfo& p = table.get(param);
    if (t.shape != p.shape || !t.f32) {
      if (mismatched++ == 0)
        first_mismatch = fmt::format("'{}' is {}[{}] where the model needs F32 [{}]", t.name,
                                     t.f32 ? "" : "not F32, ", fmt::join(t.shape, ", "),
                                     fmt::join(p.shape, ", "));
    }
    SavedSlab& s = slabs[slab];
    s.name = slab;
    s.tensors += 1;
    s.bytes += t.bytes;
    saved[slab].insert(param);
  }
  for (auto& [name, slab] : slabs)
    for (const ParamInfo& p : table.params())
      if (saved[name].count(p.name) == 0) slab.without.push_back(p.name);
  info.slabs.push_back(slabs["params"]);
  for (const auto& [name, slab] : slabs)
    if (name != "params") info.slabs.push_back(slab);
  if (mismatched > 0)
    info.problems.push_back(
        fmt::format("{} tensor{} of another shape or type than the model of "
                    "this checkpoint's config: {}",
                    mismatched, mismatched == 1 ? " is" : "s are",
                    first_mismatch + (mismatched > 1 ? ", ..." : "")));
  const std::vector<std::string>& missing = info.slabs.front().without;
  if (!missing.empty())
    info.problems.push_back(fmt::format("{} of {} parameters are not saved: {}", missing.size(),
                                        table.params().size(), some_names(missing)));
  check_optimizer_states(table, info.optimizer, saved, info);
}

// Sizes on disk; listed files that are missing or of another size are problems.
void check_files(const std::string& dir, const std::string& listed_in, CheckpointInfo& info) {
  std::vector<SavedFile> present;
  for (SavedFile f : info.files) {
    std::error_code ec;
    const auto size = fs::file_size(join(dir, f.name), ec);
    f.bytes = ec ? -1 : static_cast<int64_t>(size);
    if (f.listed_bytes >= 0 && f.bytes < 0)
      info.problems.push_back(
          fmt::format("{} is missing (listed in {})", join(dir, f.name), listed_in));
    else if (f.listed_bytes >= 0 && f.bytes != f.listed_bytes)
      info.problems.push_back(fmt::format("{} has {} bytes, {} lists {}", join(dir, f.name),
                                          f.bytes, listed_in, f.listed_bytes));
    if (f.bytes < 0 && f.listed_bytes < 0) continue;  // an optional file that is not there
    info.total_bytes += std::max<int64_t>(f.bytes, 0);
    present.push_back(f);
  }
  info.files = std::move(present);
}

// COMMITTED present and holding the checksum of the description it commits.
void check_committed(const std::string& dir, const std::string& description, const char* key,
                     CheckpointInfo& info) {
  const std::string committed_path = join(dir, kCommittedFile);
  info.committed = path_exists(committed_path);
  if (!info.committed) {
    info.problems.push_back(
        fmt::format("{}: no {} marker: the save did not finish", dir, kCommittedFile));
    return;
  }
  const json committed = read_json(committed_path);
  const std::string text = read_text_file(join(dir, description));
  const std::string sum = hash64_hex(hash64(text.data(), text.size()));
  auto it = committed.find(key);
  if (committed.is_object() && committed.contains("format_version") &&
      committed["format_version"] != info.format_version)
    info.problems.push_back(fmt::format("{}: format_version {}, but {} is version {}",
                                        committed_path, committed["format_version"].dump(),
                                        join(dir, description), info.format_version));
  if (!committed.is_object() || it == committed.end() || *it != sum) {
    info.committed = false;  // the marker commits another description than this one
    info.problems.push_back(fmt::format("{}: XXH3-64 checksum {} does not match {} recorded in {}",
                                        join(dir, description), sum,
                                        it == committed.end() ? "nothing" : it->dump(),
                                        committed_path));
  }
}

}  // namespace

// ---- public ----------------------------------------------------------------------------------

int checkpoint_format_version(const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec))
    fail(fmt::format("checkpoint '{}' does not exist", dir), kCheckpointHint);
  if (!fs::is_directory(dir, ec))
    fail(fmt::format("checkpoint '{}' is not a directory", dir), kCheckpointHint);
  if (path_exists(join(dir, kMetadataFile))) return kShardedFormatVersion;
  if (path_exists(join(dir, kManifestFile))) return kCheckpointFormatVersion;
  fail(fmt::format("'{}' is not a Foundry checkpoint: it has neither {} (format version 2) nor {} "
                   "(version 1)",
                   dir, kMetadataFile, kManifestFile),
       not_a_checkpoint_hint(dir));
}

ModelConfig checkpoint_model_config(const std::string& dir) {
  if (checkpoint_format_version(dir) == kCheckpointFormatVersion)
    return read_checkpoint_model_config(dir);
  const std::string path = join(dir, kMetadataFile);
  return parse_model_config(field<json>(read_json(path), "model", path), path);
}

CheckpointInfo inspect_checkpoint(const std::string& dir) {
  CheckpointInfo info;
  info.dir = dir;
  info.format_version = checkpoint_format_version(dir);
  const bool v2 = info.format_version == kShardedFormatVersion;
  const std::vector<SavedTensor> tensors = v2 ? read_v2(dir, info) : read_v1(dir, info);
  const char* description = v2 ? kMetadataFile : kManifestFile;
  check_committed(dir, description, v2 ? "metadata_xxh3_64" : "manifest_xxh3_64", info);
  check_files(dir, join(dir, description), info);
  const ParamTable table(info.model);
  info.model_tensors = static_cast<int64_t>(table.params().size());
  info.model_parameters = table.parameter_count();
  classify(tensors, table, info);
  return info;
}

namespace {

std::string format_layout(const CheckpointInfo& info) {
  if (!info.layout) return "not recorded (format version 1)";
  const SavedLayout& l = *info.layout;
  return fmt::format("{} rank{}, expert_parallel {}, ZeRO-1 {}{}", l.world,
                     l.world == 1 ? "" : "s", l.expert_parallel, l.zero1 ? "on" : "off",
                     l.context_parallel > 1
                         ? fmt::format(", context_parallel {}", l.context_parallel)
                         : std::string());
}

// One note per group of states that lack the same parameters, in slab order: "note: no
// exp_avg, exp_avg_sq for 12 of 33 parameters (...)".
std::string format_states_without(const CheckpointInfo& info) {
  std::vector<std::pair<std::vector<std::string>, std::vector<std::string>>> groups;
  for (size_t i = 1; i < info.slabs.size(); ++i) {
    const SavedSlab& s = info.slabs[i];
    if (s.without.empty()) continue;
    auto same = std::find_if(groups.begin(), groups.end(),
                             [&](const auto& g) { return g.first == s.without; });
    if (same == groups.end()) {
      groups.push_back({s.without, {}});
      same = std::prev(groups.end());
    }
    same->second.push_back(s.name);
  }
  std::string out;
  for (const auto& [without, states] : groups)
    out +=
        fmt::format("note: no {} for {} of {} parameters (their optimizer keeps none), e.g. {}\n",
                    fmt::join(states, ", "), without.size(), info.model_tensors, without.front());
  return out;
}

std::string format_files(const CheckpointInfo& info) {
  size_t width = 5;
  for (const SavedFile& f : info.files) width = std::max(width, f.name.size());
  std::string out = "files\n";
  for (const SavedFile& f : info.files)
    out += fmt::format("  {:<{}}  {:>15}\n", f.name, width,
                       f.bytes < 0 ? "missing" : grouped(f.bytes));
  out += fmt::format("  {:<{}}  {:>15}  ({})\n", "total", width, grouped(info.total_bytes),
                     human_bytes(info.total_bytes));
  return out;
}

}  // namespace

std::string format_checkpoint_info(const CheckpointInfo& info) {
  std::string out = fmt::format("checkpoint  {}\n", info.dir);
  out += fmt::format("format      version {} ({}), {}\n", info.format_version,
                     info.format_version == kShardedFormatVersion ? "sharded" : "safetensors",
                     info.committed ? "committed" : "NOT committed");
  out += fmt::format("step        {}\n", info.step);
  out += fmt::format("written by  {}\n", format_layout(info));
  out += fmt::format("model       arch {}, {} tensors, {} parameters ({})\n",
                     arch_name(info.model.arch), info.model_tensors,
                     format_count(static_cast<double>(info.model_parameters)),
                     grouped(info.model_parameters));
  out +=
      fmt::format("optimizer   {}\n\n", info.optimizer.empty() ? "not recorded" : info.optimizer);
  out += fmt::format("{:<16}{:>8}  {:>15}\n", "saved", "tensors", "bytes");
  for (const SavedSlab& s : info.slabs)
    out += fmt::format("  {:<14}{:>8}  {:>15}\n", s.name, s.tensors, grouped(s.bytes));
  if (!info.extra_tensors.empty())
    out += fmt::format("  {:<14}{:>8}  (not parameters: {})\n", "extra", info.extra_tensors.size(),
                       some_names(info.extra_tensors));
  return out + format_states_without(info) + "\n" + format_files(info);
}

json to_json(const CheckpointInfo& info) {
  json slabs = json::array(), files = json::array();
  for (const SavedSlab& s : info.slabs)
    slabs.push_back({{"name", s.name}, {"tensors", s.tensors}, {"bytes", s.bytes},
                     {"without", s.without}});
  auto bytes_or_null = [](int64_t b) { return b < 0 ? json(nullptr) : json(b); };
  for (const SavedFile& f : info.files)
    files.push_back({{"name", f.name}, {"bytes", bytes_or_null(f.bytes)},
                     {"listed_bytes", bytes_or_null(f.listed_bytes)}});
  json layout = nullptr;
  if (info.layout)
    layout = {{"world", info.layout->world}, {"expert_parallel", info.layout->expert_parallel},
              {"zero1", info.layout->zero1}, {"context_parallel", info.layout->context_parallel}};
  return {{"dir", info.dir},
          {"format_version", info.format_version},
          {"committed", info.committed},
          {"step", info.step},
          {"layout", layout},
          {"model",
           {{"arch", arch_name(info.model.arch)}, {"tensors", info.model_tensors},
            {"parameters", info.model_parameters}, {"config", to_json(info.model)}}},
          {"optimizer", info.optimizer.empty() ? json(nullptr) : json(info.optimizer)},
          {"slabs", slabs},
          {"extra_tensors", info.extra_tensors},
          {"files", files},
          {"total_bytes", info.total_bytes},
          {"problems", info.problems}};
}

VerifyReport verify_checkpoint_data(const std::string& dir) {
  const double t0 = now_seconds();
  VerifyReport report;
  report.format_version = checkpoint_format_version(dir);
  if (report.format_version == kShardedFormatVersion) {
    report.non_finite = verify_sharded_data(dir);
    const json m = read_sharded_metadata(dir);
    report.files = static_cast<int64_t>(m["files"].size());
    report.pieces = static_cast<int64_t>(m["pieces"].size());
    for (const json& p : m["pieces"]) report.bytes += p["byte_length"].get<int64_t>();
  } else {
    verify_checkpoint(dir);
    // Its F32 tensors' NaN and infinities, as version 2's are counted (a diverged run's).
    for (const char* file : {kModelFile, kOptimizerFile}) {
      if (!path_exists(join(dir, file))) continue;
      const SafetensorsReader reader(join(dir, file));
      for (const TensorView& t : reader.tensors()) {
        if (t.dtype != StDtype::F32) continue;
        const auto* values = reinterpret_cast<const float*>(t.data);
        const int64_t bad = std::count_if(values, values + t.bytes / sizeof(float),
                                          [](float x) { return !std::isfinite(x); });
        if (bad > 0) report.non_finite[t.name] += bad;
      }
    }
    const json m = read_json(join(dir, kManifestFile));
    report.files = static_cast<int64_t>(m["files"].size());
    for (const auto& [name, entry] : m["files"].items())
      report.bytes += entry["bytes"].get<int64_t>();
  }
  // The data is intact; the model must also be all there (and, for version 1, the
  // safetensors headers must parse: inspecting reads them).
  const CheckpointInfo info = inspect_checkpoint(dir);
  if (!info.problems.empty())
    fail(fmt::format("{}: {}", dir, fmt::join(info.problems, "; ")), kCorruptHint);
  report.seconds = now_seconds() - t0;
  return report;
}

std::string format_verify_report(const std::string& dir, const VerifyReport& r) {
  std::string warning;
  if (!r.non_finite.empty()) {
    int64_t values = 0;
    bool weights = false;  // or only optimizer states ("NAME.exp_avg", ...), which eval skips
    for (const auto& [name, n] : r.non_finite) {
      values += n;
      weights = weights || !(name.ends_with(".exp_avg") || name.ends_with(".exp_avg_sq") ||
                             name.ends_with(".muon_momentum"));
    }
    warning = fmt::format(
        "warning: {} non-finite value{} (NaN or inf) in {} tensor{}, the first {} ({}): written "
        "as saved, but the run had diverged; {}\n",
        values, values == 1 ? "" : "s", r.non_finite.size(), r.non_finite.size() == 1 ? "" : "s",
        r.non_finite.begin()->first, r.non_finite.begin()->second,
        weights ? "eval and generate refuse it"
                : "only in the optimizer state: eval and generate load it, a resume would not "
                  "recover");
  }
  if (r.format_version == kShardedFormatVersion)
    return warning + fmt::format(
                         "ok: {}: {} pieces in {} file{}, {} bytes ({}): every chunk checksum "
                         "matches, every tensor is covered exactly once, every parameter is "
                         "saved ({:.2f} s)\n",
                         dir, r.pieces, r.files, r.files == 1 ? "" : "s", grouped(r.bytes),
                         human_bytes(r.bytes), r.seconds);
  return fmt::format("ok: {}: {} files, {} bytes ({}): every file checksum matches, every "
                     "parameter is saved (format version 1, {:.2f} s)\n",
                     dir, r.files, grouped(r.bytes), human_bytes(r.bytes), r.seconds);
}

}  // namespace foundry
