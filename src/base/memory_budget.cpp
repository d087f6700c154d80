#include "base/memory_budget.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <optional>
#include <sstream>

#include "base/error.h"
#include "base/format.h"

namespace foundry {
namespace {

// cgroup v1 reports "no limit" as the largest page-aligned int64 (9223372036854771712).
constexpr int64_t kNoLimitV1 = int64_t{1} << 62;

constexpr const char* kBadFileHint =
    "the memory limit cannot be read; set FOUNDRY_MEMORY_LIMIT to what this process may use "
    "(e.g. 16G), or FOUNDRY_MEMORY_LIMIT=off to skip the memory check";

// The first line of `path`, trimmed, or nothing when the file cannot be opened.
std::optional<std::string> read_first_line(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::string line;
  std::getline(in, line);
  const auto space = [](unsigned char c) { return std::isspace(c) != 0; };
  line.erase(std::find_if_not(line.rbegin(), line.rend(), space).base(), line.end());
  line.erase(line.begin(), std::find_if_not(line.begin(), line.end(), space));
  return line;
}

int64_t parse_count(const std::string& text, const std::string& path) {
  const bool digits =
      !text.empty() && text.size() <= 19 &&
      std::all_of(text.begin(), text.end(), [](unsigned char c) { return std::isdigit(c); });
  if (!digits) fail(fmt::format("{}: '{}' is not a byte count", path, text), kBadFileHint);
  return std::stoll(text);
}

// The value of `key` in a cgroup memory.stat ("key value" lines); 0 when absent.
int64_t stat_value(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line))
    if (line.starts_with(key + " ")) return parse_count(line.substr(key.size() + 1), path);
  return 0;
}

struct CgroupFiles {
  BudgetSource source;
  const char* limit;
  const char* usage;
  const char* inactive_file;  // the reclaimable page cache in memory.stat
};
constexpr CgroupFiles kV2{BudgetSource::cgroup_v2, "memory.max", "memory.current", "inactive_file"};
constexpr CgroupFiles kV1{BudgetSource::cgroup_v1, "memory.limit_in_bytes", "memory.usage_in_bytes",
                          "total_inactive_file"};

// What the cgroup in `dir` lets its processes add, or nothing when it sets no limit. Page
// cache that the kernel would reclaim (a dataset read once) does not count as used.
std::optional<int64_t> cgroup_headroom(const std::string& dir, const CgroupFiles& f) {
  const std::string limit_path = dir + "/" + f.limit;
  const std::optional<std::string> limit_text = read_first_line(limit_path);
  if (!limit_text || *limit_text == "max") return std::nullopt;
  const int64_t limit = parse_count(*limit_text, limit_path);
  if (limit >= kNoLimitV1) return std::nullopt;
  const std::string usage_path = dir + "/" + f.usage;
  const std::optional<std::string> usage_text = read_first_line(usage_path);
  const int64_t usage = usage_text ? parse_count(*usage_text, usage_path) : 0;
  const int64_t cache = stat_value(dir + "/memory.stat", f.inactive_file);
  return std::max<int64_t>(0, limit - std::max<int64_t>(0, usage - cache));
}

void tighten(MemoryBudget& budget, BudgetSource source, int64_t bytes) {
  if (!budget.limited() || bytes < budget.bytes) budget = {source, bytes};
}

// Every cgroup from `path` (as /proc/self/cgroup gives it) up to the hierarchy's root at
// `mount`: a parent's limit binds its children. Levels the mount does not show (a container
// that sees only its own cgroup) are skipped.
void tighten_by_cgroups(MemoryBudget& budget, const std::string& mount, std::string path,
                        const CgroupFiles& f) {
  for (;;) {
    if (const std::optional<int64_t> headroom = cgroup_headroom(mount + path, f))
      tighten(budget, f.source, *headroom);
    if (path.empty() || path == "/") return;
    path.erase(path.find_last_of('/'));
  }
}

bool lists_memory(const std::string& controllers) {
  std::istringstream in(controllers);
  std::string name;
  while (std::getline(in, name, ','))
    if (name == "memory") return true;
  return false;
}

}  // namespace

const char* budget_source_name(BudgetSource source) {
  switch (source) {
    case BudgetSource::cgroup_v2: return "cgroup memory.max";
    case BudgetSource::cgroup_v1: return "cgroup memory.limit_in_bytes";
    case BudgetSource::meminfo: return "MemAvailable";
    case BudgetSource::environment: return "FOUNDRY_MEMORY_LIMIT";
    case BudgetSource::off: return "FOUNDRY_MEMORY_LIMIT=off";
    case BudgetSource::gpu: return "the GPU's free memory";
    case BudgetSource::unknown: break;
  }
  return "no limit found";
}

MemoryBudget detect_memory_budget(const MemoryFiles& files) {
  MemoryBudget budget;
  std::ifstream cgroups(files.proc_cgroup);
  std::string line;
  // "hierarchy-id:controllers:path"; v2 is "0::path".
  while (std::getline(cgroups, line)) {
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (line.compare(0, a, "0") == 0 && controllers.empty())
      tighten_by_cgroups(budget, files.cgroup_root, path, kV2);
    else if (lists_memory(controllers))
      tighten_by_cgroups(budget, files.cgroup_root + "/memory", path, kV1);
  }
  std::ifstream meminfo(files.meminfo);
  while (std::getline(meminfo, line)) {
    if (!line.starts_with("MemAvailable:")) continue;
    std::istringstream fields(line.substr(13));
    std::string kib, unit;
    fields >> kib >> unit;
    if (unit != "kB") fail(fmt::format("{}: cannot read '{}'", files.meminfo, line), kBadFileHint);
    tighten(budget, BudgetSource::meminfo, parse_count(kib, files.meminfo) * 1024);
  }
  return budget;
}

MemoryBudget memory_budget(const char* limit_env, const MemoryFiles& files) {
  if (!limit_env) return detect_memory_budget(files);
  if (std::string_view(limit_env) == "off") return {BudgetSource::off, 0};
  return {BudgetSource::environment, parse_memory_size(limit_env, "FOUNDRY_MEMORY_LIMIT")};
}

int64_t parse_memory_size(std::string_view text, std::string_view what) {
  const size_t end = text.find_first_not_of("0123456789.");
  const std::string number(text.substr(0, end));
  const std::string suffix(end == std::string_view::npos ? "" : text.substr(end));
  int shift = -1;
  if (suffix.empty()) shift = 0;
  else if (suffix.size() == 1)
    switch (std::toupper(static_cast<unsigned char>(suffix[0]))) {
      case 'K': shift = 10; break;
      case 'M': shift = 20; break;
      case 'G': shift = 30; break;
      case 'T': shift = 40; break;
    }
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(number, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const double bytes = std::ldexp(value, std::max(shift, 0));
  if (shift >= 0 && used != 0 && used == number.size() && bytes >= 0x1p62)
    fail(fmt::format("{}='{}' is too large: it must be below 2^62 bytes (4,194,304 T)", what, text),
         fmt::format("give the memory there is, e.g. {}=16G", what));
  if (shift < 0 || used == 0 || used != number.size() || bytes < 1)
    fail(fmt::format("{}='{}' is not a memory size", what, text),
         fmt::format("give bytes or a number with K, M, G or T (powers of 1024), e.g. {}=16G{}",
                     what,
                     what == "FOUNDRY_MEMORY_LIMIT"
                         ? fmt::format(", or {}=off to skip the memory check", what)
                         : std::string()));
  return std::llround(bytes);
}

int64_t MemoryNeed::per_process() const {
  int64_t sum = 0;
  for (const auto& [name, bytes] : parts) sum += bytes;
  return sum;
}

bool fits(const MemoryNeed& need, const MemoryBudget& budget) {
  return !budget.limited() || need.total() <= budget.bytes;
}

std::string format_memory_parts(const MemoryNeed& need) {
  std::string parts;
  for (const auto& [name, bytes] : need.parts)
    parts +=
        fmt::format("{}{} {}", parts.empty() ? "" : ", ", name, format_bytes(double(bytes), 1));
  return parts;
}

std::string memory_shortfall(const MemoryNeed& need, const MemoryBudget& budget,
                             const std::string& host) {
  std::string text = fmt::format("{} needs about {} per process ({})", need.what,
                                 format_bytes(double(need.per_process()), 1),
                                 format_memory_parts(need));
  if (need.processes > 1) text += fmt::format(" × {} ranks on {}", need.processes, host);
  return text + fmt::format(", but this process may use {} ({})",
                            format_bytes(double(budget.bytes), 1),
                            budget_source_name(budget.source));
}

std::string memory_hint(const std::string& hint) {
  return hint + "; if that limit is wrong, set FOUNDRY_MEMORY_LIMIT to what this process may use "
                "(e.g. 16G), or FOUNDRY_MEMORY_LIMIT=off to skip the memory check";
}

void check_memory(const MemoryNeed& need, const MemoryBudget& budget, const std::string& hint) {
  if (!fits(need, budget)) fail(memory_shortfall(need, budget), memory_hint(hint));
}

}  // namespace foundry
