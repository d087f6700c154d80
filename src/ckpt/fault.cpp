#include "ckpt/fault.h"

#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <thread>

#include "base/error.h"

namespace foundry {
namespace {

const char* const kPointNames[] = {"write", "before_fsync", "before_commit", "before_latest",
                                   "load"};
constexpr int kPoints = 5;

struct Fault {
  CheckpointFault point;
  int rank = 0, nth = 1;
  bool exit = false, pause = false;
  int sleep_s = 0;  // :sleep=S, a slow save or load that goes on after S seconds
};

// Parsed once; a malformed value is an error naming it, at the first save.
std::optional<Fault> configured_fault() {
  static const std::optional<Fault> fault = []() -> std::optional<Fault> {
    const char* env = std::getenv("FOUNDRY_CHECKPOINT_FAULT");
    if (!env || !*env) return std::nullopt;
    const std::string s = env;
    Fault f;
    const size_t at = s.find('@');
    bool ok = at != std::string::npos;
    const std::string point = ok ? s.substr(0, at) : s;
    ok = false;
    for (int i = 0; i < kPoints; ++i)
      if (point == kPointNames[i]) {
        f.point = static_cast<CheckpointFault>(i);
        ok = true;
      }
    if (ok) {
      std::string rest = s.substr(at + 1);
      if (rest.ends_with(":exit")) {
        f.exit = true;
        rest.resize(rest.size() - 5);
      } else if (rest.ends_with(":pause")) {
        f.pause = true;
        rest.resize(rest.size() - 6);
      } else if (const size_t colon = rest.find(":sleep="); colon != std::string::npos) {
        char* end = nullptr;
        f.sleep_s = static_cast<int>(std::strtol(rest.c_str() + colon + 7, &end, 10));
        ok = f.sleep_s > 0 && *end == '\0';
        rest.resize(colon);
      }
      char* end = nullptr;
      f.rank = static_cast<int>(std::strtol(rest.c_str(), &end, 10));
      if (*end == '#') f.nth = static_cast<int>(std::strtol(end + 1, &end, 10));
      ok = ok && end != rest.c_str() && *end == '\0' && f.rank >= 0 && f.nth >= 1;
    }
    if (!ok)
      fail(fmt::format("FOUNDRY_CHECKPOINT_FAULT = '{}' is not "
                       "<point>@<rank>[#<n>][:exit|:pause|:sleep=S]",
                       s),
           "points: write, before_fsync, before_commit, before_latest, load; or unset it");
    return f;
  }();
  return fault;
}

std::atomic<int> fault_rank{0};
std::atomic<int> hits[kPoints];

}  // namespace

void set_checkpoint_fault_rank(int rank) { fault_rank.store(rank); }

void checkpoint_fault_point(CheckpointFault point, const std::string& path) {
  const std::optional<Fault> f = configured_fault();
  if (!f || f->point != point || f->rank != fault_rank.load()) return;
  if (hits[static_cast<int>(point)].fetch_add(1) + 1 != f->nth) return;
  if (f->exit) ::_exit(86);
  if (f->pause || f->sleep_s > 0) {  // a save that hangs here, for a test to kill mid-save
    // The whole time, as a slow disk would take it: a handled signal does not cut it short.
    std::this_thread::sleep_for(std::chrono::seconds(f->pause ? 120 : f->sleep_s));
    return;
  }
  fail(fmt::format("cannot write '{}': No space left on device (injected fault {})", path,
                   kPointNames[static_cast<int>(point)]),
       "free space in the run directory's file system");
}

}  // namespace foundry
