#include "train/run_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <thread>

#include "base/error.h"
#include "base/io.h"
#include "ckpt/checkpoint.h"
#include "ckpt/checkpoint_dir.h"
#include "comm/agree.h"
#include "train/events.h"
#include "train/memory_tier.h"
#include "train/processes.h"
#include "train/run_config.h"

namespace foundry {
namespace {

LockHolder read_holder(const std::string& path) {
  LockHolder h;
  try {
    const json j = json::parse(read_text_file(path));
    h.pid = j.value("pid", int64_t{0});
    h.host = j.value("host", std::string("?"));
    h.since = j.value("since", std::string("?"));
  } catch (const std::exception&) {
    // being written by its holder this very moment
  }
  return h;
}

// A run directory a `foundry launch` supervises takes only the jobs that launch starts: one
// started by hand between two of its attempts would train on while the launch restarts its
// own, both writing the same checkpoints and metrics. True when this job is that launch's.
bool check_not_supervised_by_another(const std::string& run_dir) {
  const std::string path = join(run_dir, kLaunchLockFile);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;  // no launch
  const bool held = ::flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  ::close(fd);  // (a shared lock taken here goes with it)
  if (!held) return false;
  const LockHolder h = read_holder(path);
  const char* mine = std::getenv(kLaunchPidVariable);
  if (mine && h.pid > 0 && std::to_string(h.pid) == mine) return true;
  fail(fmt::format("run directory '{}' is supervised by foundry launch (pid {} on host {}, since "
                   "{}); a training job started beside it would run alongside the launch's own "
                   "attempts",
                   run_dir, h.pid, h.host, h.since),
       "let that launch train it, or stop the launch first (SIGTERM saves a checkpoint), or set "
       "another train.run_dir");
}

std::string parent_dir(const std::string& path) {
  const size_t slash = path.find_last_of('/', path.size() > 1 ? path.size() - 2 : 0);
  return slash == std::string::npos || slash == 0 ? "" : path.substr(0, slash);
}

// Rank 0's verdict for every rank: "ok…" or the error's what and hint.
constexpr char kSeparator = '\x1f';

std::string error_verdict(const Error& e) { return std::string(e.what()) + kSeparator + e.hint(); }

// Rank 0's verdict on every rank: returns it when it is "ok…", else fails with rank 0's error.
std::string share_verdict(const Processes& processes, std::string verdict) {
  if (const Communicator* world = processes.world())
    verdict = allgather_strings(*world, verdict)[0];
  if (verdict.rfind("ok", 0) == 0) return verdict;
  const size_t sep = verdict.find(kSeparator);
  fail(verdict.substr(0, sep), sep == std::string::npos ? "" : verdict.substr(sep + 1));
}

}  // namespace

std::string RunDirContents::describe() const {
  std::vector<std::string> parts;
  if (checkpoints > 0)
    parts.push_back(fmt::format("{} checkpoint(s)", checkpoints));
  else if (latest)
    parts.push_back(fmt::format("checkpoints/{}", kLatestFile));
  if (metrics_lines > 0)
    parts.push_back(fmt::format("{} line(s) of {}", metrics_lines, kMetricsFile));
  if (memory_step > 0)
    parts.push_back(fmt::format("an in-memory checkpoint of step {}", memory_step));
  return parts.empty() ? "nothing" : fmt::format("{}", fmt::join(parts, " and "));
}

namespace {

// Why Foundry did not write entry `name` of checkpoints/ ("" when it did).
std::string foreign_reason(const std::string& root, const std::string& name, bool is_dir) {
  if (name == kLatestFile || name.starts_with(std::string(kLatestFile) + ".tmp.")) return "";
  if (name.starts_with(kStepPrefix) && name.ends_with(kTmpSuffix) && is_dir) return "";
  if (is_dir && parse_checkpoint_dir_name(name)) {
    // A save writes its commit marker before the directory takes its step_N name.
    const std::string dir = join(root, name);
    if (is_foundry_checkpoint_dir(dir)) return "";
    return path_exists(join(dir, kCommittedFile))
               ? "a step directory whose COMMITTED Foundry did not write"
               : "a step directory without a commit marker";
  }
  return is_dir ? "not a checkpoint directory" : "not a checkpoint file";
}

}  // namespace

namespace {

// What a path that is not a regular file is, for an error ("a named pipe").
std::string kind_of(std::filesystem::file_type t) {
  switch (t) {
    case std::filesystem::file_type::directory:
      return "a directory";
    case std::filesystem::file_type::fifo:
      return "a named pipe";
    case std::filesystem::file_type::socket:
      return "a socket";
    case std::filesystem::file_type::block:
    case std::filesystem::file_type::character:
      return "a device";
    default:
      return "not a regular file";
  }
}

}  // namespace

void check_run_files(const std::string& run_dir) {
  namespace fs = std::filesystem;
  const std::string root = checkpoints_root(run_dir);
  std::error_code ec;
  if (const fs::file_status st = fs::status(root, ec); fs::exists(st) && !fs::is_directory(st))
    fail(fmt::format("'{}' is {}, not the run's checkpoints directory", root, kind_of(st.type())),
         "move it out of the run directory, or set another train.run_dir");
  for (const std::string& path :
       {join(run_dir, kMetricsFile), join(run_dir, kEventsFile), join(run_dir, "config.json"),
        join(run_dir, kSkippedBatchesFile), join(root, kLatestFile)}) {
    const fs::file_status st = fs::status(path, ec);
    if (fs::exists(st) && !fs::is_regular_file(st))
      fail(fmt::format("'{}' is {}; Foundry reads and writes it as a file of the run", path,
                       kind_of(st.type())),
           "move it out of the run directory, or set another train.run_dir");
  }
}

RunDirContents inspect_run_dir(const std::string& run_dir, const TrainConfig* tier) {
  RunDirContents c;
  c.exists = path_exists(run_dir);
  if (!c.exists) return c;
  check_run_files(run_dir);
  const std::string root = checkpoints_root(run_dir);
  if (path_exists(root))
    for (const auto& [name, is_dir] : list_dir(root)) {
      if (name == kLatestFile) c.latest = true;
      if (is_dir && parse_checkpoint_dir_name(name)) ++c.checkpoints;
      const std::string why = foreign_reason(root, name, is_dir);
      if (why.empty()) {
        c.foundry_entries.push_back(name);
        continue;
      }
      c.foreign_entries.push_back(fmt::format("{} ({})", name, why));
      if (is_dir && parse_checkpoint_dir_name(name))
        c.foreign_steps.push_back(c.foreign_entries.back());
    }
  std::sort(c.foundry_entries.begin(), c.foundry_entries.end());
  std::sort(c.foreign_entries.begin(), c.foreign_entries.end());
  std::sort(c.foreign_steps.begin(), c.foreign_steps.end());
  c.metrics_lines = count_lines(join(run_dir, kMetricsFile));
  if (tier && tier->memory_checkpoint_every > 0)
    if (const auto memory = usable_memory_checkpoint(*tier, find_latest_checkpoint(run_dir)))
      c.memory_step = parse_checkpoint_dir_name(memory->substr(memory->rfind('/') + 1)).value_or(0);
  return c;
}

constexpr double kDyingHolderWaitSeconds = 30;

// The lock file exists only while it is held: the holder removes it when it ends (or the
// next holder replaces a file whose holder died). A process that opened the file just before
// its holder removed it could lock a file no longer in the directory, so a lock counts only
// while the path still names the file locked.
RunDirLock::RunDirLock(const std::string& run_dir, const char* file) : path_(join(run_dir, file)) {
  const bool launch = std::string(file) == kLaunchLockFile;
  double waited_s = 0;
  for (;;) {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0)
      fail(fmt::format("cannot open the lock file '{}': {}", path_, std::strerror(errno)),
           "check that the run directory is writable");
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      ::close(fd_);
      fd_ = -1;
      if (err != EWOULDBLOCK)
        fail(fmt::format("cannot lock '{}': {}", path_, std::strerror(err)),
             "the run directory's file system must support flock(2)");
      const LockHolder h = read_holder(path_);
      // A holder of this host that was killed holds the lock until its exit has closed its
      // files (which can wait for its last writes): a restart right after the kill waits
      // for that, up to kDyingHolderWaitSeconds, instead of being refused.
      if (h.pid > 0 && h.host == host_name() && process_ending(h.pid) &&
          waited_s < kDyingHolderWaitSeconds) {
        if (waited_s == 0)
          std::fprintf(stderr, "waiting for pid %lld, which is ending, to release %s\n",
                       static_cast<long long>(h.pid), path_.c_str());
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        waited_s += 0.1;
        continue;
      }
      const std::string holder =
          h.pid > 0 ? fmt::format("pid {} on host {}, since {}", h.pid, h.host, h.since)
                    : fmt::format(
                          "a process that has not written its pid to {} yet, or not "
                          "Foundry (`fuser {}` names it)",
                          path_, path_);
      fail(fmt::format("run directory '{}' is in use by another {} ({})", run_dir,
                       launch ? "foundry launch" : "training job", holder),
           launch ? "one launch supervises a run: wait for that one to end or stop it (SIGTERM "
                    "saves a checkpoint), or set another train.run_dir"
                  : "wait for that job to end or stop it, or set another train.run_dir");
    }
    struct stat locked {
    }, named{};
    if (::fstat(fd_, &locked) == 0 && ::stat(path_.c_str(), &named) == 0 &&
        locked.st_ino == named.st_ino && locked.st_dev == named.st_dev)
      break;
    ::close(fd_);  // removed by its holder meanwhile: lock the new one
  }
  const json holder = {
      {"pid", int64_t(getpid())}, {"host", host_name()}, {"since", utc_timestamp(unix_now())}};
  const std::string text = holder.dump() + "\n";
  if (::ftruncate(fd_, 0) != 0 ||
      ::pwrite(fd_, text.data(), text.size(), 0) != ssize_t(text.size()))
    fail(fmt::format("cannot write the lock file '{}': {}", path_, std::strerror(errno)),
         "free space on the run directory's file system");
}

RunDirLock::~RunDirLock() {
  if (fd_ < 0) return;
  ::unlink(path_.c_str());  // while still holding it: nobody else's file
  ::close(fd_);
}

RunDir::RunDir(const TrainConfig& tc, StartMode mode, const Processes& processes)
    : path_(tc.run_dir), tc_(tc), root_(processes.root()) {
  // "ok R S": R is 1 to resume, S is 1 when the job is a launch's.
  std::string verdict;
  if (root_) {
    try {
      claim(mode);
      verdict = fmt::format("ok {} {}", resume_ ? 1 : 0, supervised_ ? 1 : 0);
    } catch (const Error& e) {
      verdict = error_verdict(e);
      // Refused: a directory made for this run goes again (the destructor does not run), but
      // only by the job that holds its lock, or while it is empty (its lock file could not be
      // made): another start racing into it may own it.
      const bool locked = lock_ != nullptr;
      lock_.reset();
      if (created_ && locked) remove_all(created_path_);
      if (created_ && !locked) remove_empty_dirs(path_, created_path_);
    }
  }
  verdict = share_verdict(processes, verdict);
  resume_ = verdict[3] == '1';
  supervised_ = verdict[5] == '1';
}

void RunDir::replace_previous_run(const Processes& processes) {
  std::string verdict = "ok";
  if (root_ && overwrite_pending_) {
    overwrite_pending_ = false;
    try {
      overwrite(inspect_run_dir(path_, &tc_));
    } catch (const Error& e) {
      verdict = error_verdict(e);
    }
  }
  share_verdict(processes, verdict);
}

RunDir::~RunDir() {
  lock_.reset();
  // A job that failed before training started leaves no directory behind.
  if (created_) remove_all(created_path_);
}

bool is_skipped_batches_record(const json& file) {
  return file.is_object() && file.contains("batches") && file.at("batches").is_array();
}

namespace {

void check_skipped_batches_file(const std::string& run_dir) {
  const std::string path = join(run_dir, kSkippedBatchesFile);
  if (!path_exists(path)) return;
  if (!is_skipped_batches_record(
          json::parse(read_text_file(path), nullptr, /*allow_exceptions=*/false)))
    fail(fmt::format("{} is not a record of skipped batches that Foundry wrote; a new run in {} "
                     "would replace it",
                     path, run_dir),
         "move the file out of the run directory, or set another train.run_dir");
}

// The run's config.json, which every start rewrites: refused when it is not a run config
// (an object of model, train and data sections), so that a file of the user's is not replaced.
void check_config_file(const std::string& run_dir) {
  const std::string path = join(run_dir, "config.json");
  if (!path_exists(path) || std::filesystem::is_directory(path)) return;
  if (!has_run_config_shape(json::parse(read_text_file(path), nullptr, /*allow_exceptions=*/false)))
    fail(
        fmt::format("{} is not a run config (an object of model, train and data sections); the run "
                    "would replace it with its own",
                    path),
        "move the file out of the run directory, or set another train.run_dir");
}

// What a process killed while it wrote config.json left (write_file_atomic's
// config.json.tmp.PID): under the lock no other process is writing one.
void remove_stale_config_copies(const std::string& run_dir) {
  for (const auto& [name, is_dir] : list_dir(run_dir))
    if (!is_dir && name.starts_with("config.json.tmp.")) {
      std::error_code ec;
      std::filesystem::remove(join(run_dir, name), ec);
    }
}

}  // namespace

void RunDir::claim(StartMode mode) {
  if (path_.empty())
    fail("train.run_dir is empty: a run needs a directory of its own",
         "set train.run_dir (--set train.run_dir=runs/NAME)");
  if (path_exists(path_) && !std::filesystem::is_directory(path_))
    fail(fmt::format("train.run_dir '{}' is a file, not a directory", path_),
         "set train.run_dir to a directory (a new one is created)");
  if (!path_exists(path_)) {
    // The outermost directory this creates is the one to remove if nothing starts.
    created_path_ = path_;
    for (std::string up = parent_dir(path_); !up.empty() && !path_exists(up); up = parent_dir(up))
      created_path_ = up;
    make_dirs(path_);
    created_ = true;
  }
  lock_ = std::make_unique<RunDirLock>(path_);
  supervised_ = check_not_supervised_by_another(path_);
  remove_stale_config_copies(path_);
  // Checked under the lock: another job cannot change the directory meanwhile.
  const RunDirContents held = inspect_run_dir(path_, &tc_);
  const std::string other_hint =
      "continue it with --resume, replace it with --overwrite, or set another train.run_dir";
  const bool can_resume = held.checkpoints > 0 || held.latest || held.memory_step > 0;
  check_config_file(path_);
  // A new run forgets an earlier run's skipped batches (AnomalyMonitor::clear_record); a file of
  // that name Foundry did not write stops it instead, before anything is removed.
  if (mode == StartMode::fresh || mode == StartMode::overwrite ||
      (mode == StartMode::auto_resume && !can_resume))
    check_skipped_batches_file(path_);
  // A resumed run saves step directories by name: one that is not Foundry's would be replaced.
  if ((mode == StartMode::resume || mode == StartMode::auto_resume) && !held.foreign_steps.empty())
    fail(fmt::format("{} holds step directories Foundry did not write: {}; a save of that step "
                     "would replace them",
                     checkpoints_root(path_), fmt::join(held.foreign_steps, ", ")),
         "move them out of the checkpoints directory (or delete them yourself), then run again");
  switch (mode) {
    case StartMode::fresh:
      if (held.any())
        fail(fmt::format("run directory '{}' already holds a run ({}); a new run would replace it",
                         path_, held.describe()),
             other_hint);
      break;
    case StartMode::resume:
      if (!can_resume)
        fail(fmt::format("--resume: run directory '{}' has no checkpoint to resume from ({})",
                         path_, held.describe()),
             "start a new run without --resume (add --overwrite if the directory holds metrics), "
             "or use --auto-resume to resume when there is a checkpoint and start otherwise");
      resume_ = true;
      break;
    case StartMode::auto_resume:
      resume_ = can_resume;
      if (!resume_)
        std::fprintf(stderr, "starting a new run in %s: no checkpoint to resume from (%s)\n",
                     path_.c_str(), held.describe().c_str());
      break;
    case StartMode::overwrite:
      // Refused now if it would be refused then; removed once the job is ready to train.
      check_overwrite(held);
      overwrite_pending_ = true;
      break;
  }
}

// Fails, removing nothing, when checkpoints/ holds something Foundry did not write.
void RunDir::check_overwrite(const RunDirContents& held) const {
  if (!held.foreign_entries.empty())
    fail(fmt::format("--overwrite: {} holds what Foundry did not write there: {}; nothing was "
                     "removed",
                     checkpoints_root(path_), fmt::join(held.foreign_entries, ", ")),
         "move them out of the checkpoints directory (or delete them yourself), then run again");
}

// Removes the previous run's checkpoints and metrics, naming each, or nothing at all when
// checkpoints/ holds something Foundry did not write.
void RunDir::overwrite(const RunDirContents& held) {
  check_overwrite(held);
  const std::string root = checkpoints_root(path_);
  std::vector<std::string> removed;
  for (const std::string& name : held.foundry_entries) {
    // A checkpoint is renamed to a leftover first (as retention does): a removal cut short
    // leaves one the next start removes, never a step directory without its commit marker.
    std::string doomed = join(root, name);
    if (parse_checkpoint_dir_name(name)) {
      const std::string renamed = doomed + ".removed" + kTmpSuffix;
      if (::rename(doomed.c_str(), renamed.c_str()) != 0)
        fail(fmt::format("--overwrite: cannot remove '{}': {}", doomed, std::strerror(errno)),
             "check permissions on the run directory");
      doomed = renamed;
    }
    remove_all(doomed);
    removed.push_back("checkpoints/" + name);
  }
  if (held.metrics_lines > 0 || path_exists(join(path_, kMetricsFile))) {
    remove_all(join(path_, kMetricsFile));
    removed.push_back(fmt::format("{} ({} line(s))", kMetricsFile, held.metrics_lines));
  }
  // The new run's start clears the tier (Checkpointer::clear_memory_tier).
  if (held.memory_step > 0) removed.push_back("the in-memory checkpoint tier");
  // Logged even when there was nothing to remove: a launch learns the new run has begun.
  append_event(path_, "train", "overwrite", {{"removed", held.describe()}, {"entries", removed}});
  if (removed.empty()) return;
  std::fprintf(stderr, "overwrite: removed the previous run's files from %s: %s\n", path_.c_str(),
               fmt::format("{}", fmt::join(removed, ", ")).c_str());
}

}  // namespace foundry
