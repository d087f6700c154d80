// The memory this process may still allocate, and the check every command that allocates
// much (train, eval, generate, the benchmarks) makes against it before allocating: a config
// too large fails with the figures and the setting to change instead of being OOM-killed.
//
// The budget is the smallest of
//   - the headroom of every memory cgroup from this process's up to the root of the mounted
//     hierarchy: cgroup v2 memory.max − memory.current, v1 memory.limit_in_bytes −
//     memory.usage_in_bytes, the reclaimable page cache (inactive_file in memory.stat) not
//     counted as used; "max" (v2) or a v1 limit of 2^62 bytes or more is no limit;
//   - MemAvailable of /proc/meminfo: what the kernel can hand out without swapping.
// Missing files are no limit (a machine without cgroups); a file that is there but does not
// parse is an error naming it.
//
// FOUNDRY_MEMORY_LIMIT replaces the detected budget: bytes, or a number with a K, M, G or T
// suffix (powers of 1024: "24G", "1.5T"), or "off" to skip the check.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace foundry {

// Where the budget is read from; tests point these at fake files.
struct MemoryFiles {
  std::string proc_cgroup = "/proc/self/cgroup";
  // cgroup v2 is mounted here; the v1 memory controller at <cgroup_root>/memory.
  std::string cgroup_root = "/sys/fs/cgroup";
  std::string meminfo = "/proc/meminfo";
};

// gpu: a GPU's free memory, for work that runs there (the caller reads it).
enum class BudgetSource { unknown, cgroup_v2, cgroup_v1, meminfo, environment, off, gpu };

struct MemoryBudget {
  BudgetSource source = BudgetSource::unknown;  // unknown: no limit found
  int64_t bytes = 0;                            // when limited()
  bool limited() const { return source != BudgetSource::unknown && source != BudgetSource::off; }
};

// "cgroup memory.max", "cgroup memory.limit_in_bytes", "MemAvailable", "FOUNDRY_MEMORY_LIMIT",
// "the GPU's free memory".
const char* budget_source_name(BudgetSource source);

// The detected budget (cgroups and /proc/meminfo), ignoring FOUNDRY_MEMORY_LIMIT.
MemoryBudget detect_memory_budget(const MemoryFiles& files = {});

// `limit_env` is FOUNDRY_MEMORY_LIMIT's value: null (unset) detects the budget, "off" turns
// the check off, anything else must be a size (parse_memory_size).
MemoryBudget memory_budget(const char* limit_env = std::getenv("FOUNDRY_MEMORY_LIMIT"),
                           const MemoryFiles& files = {});

// "123", "64K", "1.5G", "2T" (K/M/G/T are powers of 1024, either case) → bytes > 0. Fails
// naming `what` otherwise.
int64_t parse_memory_size(std::string_view text, std::string_view what);

// What a command needs: per process, by part, times the processes on this host that each
// need as much.
struct MemoryNeed {
  std::string what;  // "training", "bench comm"
  std::vector<std::pair<std::string, int64_t>> parts;
  int processes = 1;
  int64_t per_process() const;
  int64_t total() const { return per_process() * processes; }
};

bool fits(const MemoryNeed& need, const MemoryBudget& budget);

// "weights 4.0 GiB, gradients 4.0 GiB, …": a need's parts, as the refusals list them.
std::string format_memory_parts(const MemoryNeed& need);

// "training needs about 31.2 GiB per process (weights 4.0 GiB, …) × 2 ranks on this host, but
// this process may use 22.9 GiB (cgroup memory.max)". `host` replaces "this host".
std::string memory_shortfall(const MemoryNeed& need, const MemoryBudget& budget,
                             const std::string& host = "this host");

// `hint`, and how to correct or skip the budget.
std::string memory_hint(const std::string& hint);

// Fails with memory_shortfall and memory_hint(hint) unless `need` fits `budget`.
void check_memory(const MemoryNeed& need, const MemoryBudget& budget, const std::string& hint);

}  // namespace foundry
