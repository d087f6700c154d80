#include "train/heartbeat.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cstdio>
#include <fstream>

#include "base/config_reader.h"
#include "base/error.h"
#include "base/io.h"
#include "base/timer.h"

namespace foundry {
namespace {

std::string record_path(const std::string& run_dir, int rank) {
  return fmt::format("{}/rank_{:05d}.json", heartbeat_dir(run_dir), rank);
}

// A record is rewritten in place at a fixed size: the blocks are allocated once, at start, so
// heartbeats go on when the disk fills up (a full disk is not a dead rank), and no fsync: a
// heartbeat need not survive a crash. Readers may, rarely, see a torn record: it does not
// parse and counts as not seen.
constexpr size_t kRecordBytes = 512;

bool write_record(int fd, const std::string& text) {
  std::string padded = text.substr(0, kRecordBytes - 1);
  padded.resize(kRecordBytes - 1, ' ');
  padded += '\n';
  return ::pwrite(fd, padded.data(), padded.size(), 0) == ssize_t(padded.size());
}

json to_json(const HeartbeatRecord& r) {
  return {{"rank", r.rank},   {"pid", r.pid},   {"host", r.host},   {"beats", r.beats},
          {"progress", r.progress}, {"step", r.step}, {"phase", r.phase},
          {"hang_after_s", r.hang_after_s}, {"exited", r.exited}};
}

}  // namespace

std::string local_process_state(int64_t pid) {
  std::ifstream stat(fmt::format("/proc/{}/stat", pid));
  std::string line;
  if (!std::getline(stat, line)) return "gone";
  const size_t close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size()) return "running";
  const char state = line[close + 2];
  if (state == 'T' || state == 't') return "stopped";
  if (state == 'Z' || state == 'X') return "gone";
  return "running";
}

std::string heartbeat_dir(const std::string& run_dir) { return run_dir + "/heartbeat"; }

std::string launch_stop_path(const std::string& run_dir) {
  return heartbeat_dir(run_dir) + "/stop";
}

std::optional<HeartbeatRecord> read_heartbeat(const std::string& run_dir, int rank) {
  std::ifstream in(record_path(run_dir, rank));
  if (!in) return std::nullopt;
  try {
    const json j = json::parse(in);
    HeartbeatRecord r;
    r.rank = j.at("rank").get<int>();
    r.pid = j.at("pid").get<int64_t>();
    r.host = j.at("host").get<std::string>();
    r.beats = j.at("beats").get<int64_t>();
    r.progress = j.at("progress").get<int64_t>();
    r.step = j.at("step").get<int64_t>();
    r.phase = j.at("phase").get<std::string>();
    r.hang_after_s = j.at("hang_after_s").get<double>();
    r.exited = j.at("exited").get<bool>();
    return r;
  } catch (const std::exception&) {
    return std::nullopt;  // from an older layout, or torn by a full disk: as if absent
  }
}

std::map<int, HeartbeatRecord> read_heartbeats(const std::string& run_dir) {
  std::map<int, HeartbeatRecord> records;
  const std::string dir = heartbeat_dir(run_dir);
  if (!path_exists(dir)) return records;
  for (int rank = 0;; ++rank) {
    if (!path_exists(record_path(run_dir, rank))) break;
    if (auto r = read_heartbeat(run_dir, rank)) records[rank] = *r;
  }
  return records;
}

double ChangeClock::seen(int64_t value, double now) {
  if (!value_ || *value_ != value) {
    value_ = value;
    since_ = now;
  }
  return now - since_;
}

std::string describe_silence(const HeartbeatRecord& r) {
  if (r.host == host_name()) {
    const std::string s = local_process_state(r.pid);
    if (s == "gone") return "has died";
    if (s == "stopped") return "is stopped (SIGSTOP?)";
  }
  return "has stopped responding";
}

std::string describe_rank(const HeartbeatRecord& r) {
  return fmt::format("rank {} (pid {} on {}) at step {} ({})", r.rank, r.pid, r.host, r.step,
                     r.phase);
}

std::string describe_positions(const std::map<int, HeartbeatRecord>& records) {
  // Ranks grouped by where they are, in rank order of each group's first rank.
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (const auto& [rank, r] : records) {
    const std::string where =
        r.exited ? "exited" : fmt::format("at step {} ({})", r.step, r.phase);
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const auto& g) { return g.first == where; });
    if (it == groups.end()) groups.push_back({where, {rank}});
    else it->second.push_back(rank);
  }
  std::vector<std::string> parts;
  for (const auto& [where, ranks] : groups)
    parts.push_back(fmt::format("{} {} {}", ranks.size() == 1 ? "rank" : "ranks",
                                fmt::join(ranks, ", "), where));
  return fmt::format("{}", fmt::join(parts, "; "));
}

Heartbeat::Heartbeat(std::string run_dir, int rank, int ranks, HeartbeatConfig config,
                     FailureHandler on_failure)
    : run_dir_(std::move(run_dir)),
      rank_(rank),
      ranks_(ranks),
      config_(config),
      on_failure_(std::move(on_failure)),
      host_(host_name()) {
  if (config_.interval_s <= 0) return;
  make_dirs(heartbeat_dir(run_dir_));
  const std::string path = record_path(run_dir_, rank_);
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0)
    fail(fmt::format("cannot create the heartbeat file '{}': {}", path, std::strerror(errno)),
         "check that the run directory is writable");
  started_ = last_mark_ = now_seconds();
  write(false);
  thread_ = std::thread([this] { run(); });
}

Heartbeat::~Heartbeat() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
  write(true);
  ::close(fd_);
}

void Heartbeat::progress(int64_t step, const char* phase) {
  const double now = now_seconds();
  std::lock_guard<std::mutex> lock(mutex_);
  if (first_step_done_) longest_interval_ = std::max(longest_interval_, now - last_mark_);
  // The first mark is the start (step 0, or the step a resume starts from); a mark of the step
  // after the first one trained completes that first step, whose time the threshold covers.
  if (first_mark_step_ < 0) first_mark_step_ = step;
  if (step > first_mark_step_ + 1) first_step_done_ = true;
  ++progress_;
  step_ = step;
  phase_ = phase;
  last_mark_ = now;
}

void Heartbeat::starting(const char* phase) {
  const double now = now_seconds();
  std::lock_guard<std::mutex> lock(mutex_);
  ++progress_;
  phase_ = phase;
  last_mark_ = now;
}

double Heartbeat::hang_threshold() const {
  if (!first_step_done_) return std::max(4 * config_.hang_after_s, config_.startup_after_s);
  return std::max(config_.hang_after_s, 3 * longest_interval_);
}

void Heartbeat::write(bool exited) {
  HeartbeatRecord r;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    r.progress = progress_;
    r.step = step_;
    r.phase = phase_;
    r.hang_after_s = hang_threshold();
  }
  r.rank = rank_;
  r.pid = getpid();
  r.host = host_;
  r.beats = ++beats_;
  r.exited = exited;
  write_record(fd_, to_json(r).dump());
}

void Heartbeat::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  const auto interval = std::chrono::duration<double>(config_.interval_s);
  while (!wake_.wait_for(lock, interval, [this] { return stop_; })) {
    lock.unlock();
    write(false);
    const double now = now_seconds();
    if (!fired_) watch_neighbour(now);
    if (!fired_) watch_progress(now);
    lock.lock();
  }
}

void Heartbeat::watch_neighbour(double now) {
  if (ranks_ < 2) return;
  const int peer = (rank_ + 1) % ranks_;
  const std::optional<HeartbeatRecord> r = read_heartbeat(run_dir_, peer);
  if (r && r->exited) return;
  // No record yet: silent since this rank started.
  const double silent = r ? neighbour_beats_.seen(r->beats, now) : now - started_;
  if (silent < config_.lost_after_s) return;
  const std::string what = r ? describe_rank(*r) : fmt::format("rank {}", peer);
  const std::string state = r ? describe_silence(*r) : "has not started";
  fired_ = true;
  on_failure_("rank_lost", peer,
              fmt::format("{} {}: no heartbeat for {:.1f} s (seen by rank {})", what, state, silent,
                          rank_));
}

void Heartbeat::watch_progress(double now) {
  double idle, threshold;
  int64_t step;
  std::string phase;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    idle = now - last_mark_;
    threshold = hang_threshold();
    step = step_;
    phase = phase_;
  }
  if (idle < threshold) return;
  const std::map<int, HeartbeatRecord> records = read_heartbeats(run_dir_);
  // Every rank sees the hang: the lowest rank still running reports it.
  for (const auto& [rank, r] : records)
    if (!r.exited) {
      if (rank != rank_) return;
      break;
    }
  fired_ = true;
  on_failure_("hang", -1,
              fmt::format("the job hangs: rank {} has made no progress for {:.0f} s (limit {:.0f} "
                          "s) at step {} ({}); {}",
                          rank_, idle, threshold, step, phase, describe_positions(records)));
}

}  // namespace foundry
