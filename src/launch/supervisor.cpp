#include "launch/supervisor.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <optional>
#include <thread>
#include <vector>

#include "base/error.h"
#include "base/exit_codes.h"
#include "base/io.h"
#include "base/timer.h"
#include "train/events.h"
#include "train/heartbeat.h"
#include "train/memory_tier.h"
#include "train/run_config.h"
#include "train/run_dir.h"
#include "train/signals.h"

namespace foundry {
namespace {

constexpr double kPollSeconds = 0.2;
constexpr double kGoneGraceSeconds = 0.3;
// How long a job whose rank reported a lost or hung rank has to exit before the supervisor
// ends it (the ranks' abort takes well under a second).
constexpr double kJobEndingGraceSeconds = 10;
// How long mpirun/srun has to end a failed job's remaining ranks and clean up after them.
constexpr double kLauncherCleanupSeconds = 3;
// A rank's own account that the job is ending: a lost or a hung rank.
bool is_job_ending(const json& e) {
  const std::string event = e.value("event", "");
  return event == "rank_lost" || event == "hang";
}
// A job's account that it replaced the old run (train --overwrite).
bool is_overwrite(const json& e) { return e.value("event", "") == "overwrite"; }

const char* const kFaultVariables[] = {"FOUNDRY_CHECKPOINT_FAULT", "FOUNDRY_TRAIN_FAULT"};

// How an attempt ended.
struct Outcome {
  enum Kind { finished, interrupted, failed } kind = failed;
  bool retry = false;
  std::string cause;   // "exit", "signal", "rank_lost", "hang", "stopped"
  int rank = -1;       // the rank at fault, when known
  std::string detail;  // for the console and the events log
  int exit_code = -1;  // of the job, when it exited
};

// One start of the job and what its watcher has seen of it.
struct Attempt {
  int number = 0, ranks = 1;
  pid_t pid = -1;
  double started = 0;           // monotonic
  int64_t resume_step = 0;      // the checkpoint it starts from (0: none)
  bool overwrite = false;       // started with --overwrite
  int64_t last_step = 0;        // the furthest step any rank reached
  bool progressed = false;      // some rank completed a step in this attempt (by heartbeats)
  int64_t logged_at_start = 0;  // metrics.jsonl's last step when the attempt started
  std::map<int, ChangeClock> beats, progress;
  std::map<int, HeartbeatRecord> records;  // last seen, by rank
  std::map<int, double> gone_since;        // ranks whose process has vanished, since when
  double job_ending_since = -1;            // when the job's own rank_lost/hang event was seen
  bool stopped_whole_group = false;        // the stop went to mpirun/srun too (stop_job)
  std::string host;                        // this host's name
};

// The last step in metrics.jsonl (heartbeats are a second behind).
int64_t last_logged_step(const std::string& run_dir) {
  std::string last;
  for_each_line_from_end(run_dir + "/metrics.jsonl", [&](std::string_view line, int64_t) {
    last = line;
    return line.empty();
  });
  try {
    return last.empty() ? 0 : json::parse(last).value("step", int64_t{0});
  } catch (const json::exception&) {
    return 0;  // torn by the failure
  }
}

class Supervisor {
 public:
  explicit Supervisor(const LaunchOptions& o)
      : o_(o),
        rc_(load_run_config(o.config_path, o.overrides)),
        run_dir_(rc_.train.run_dir),
        overwrite_pending_(o.overwrite) {
    check_launchable();
  }
  int run();
  const std::string& run_dir() const { return run_dir_; }

 private:
  void check_launchable() const;
  Attempt start(int number);
  Outcome watch(Attempt& a);
  std::optional<Outcome> check_heartbeats(Attempt& a, double now);
  std::optional<Outcome> judge_heartbeats(Attempt& a, double now);
  std::optional<Outcome> check_rank_processes(Attempt& a, double now);
  Outcome classify_exit(const Attempt& a, int status) const;
  bool ended_by_stop(const Attempt& a, int status) const;
  // How to go on after a stop, with the checkpoint `committed` (launch --overwrite: whether
  // the old run was replaced decides).
  std::string after_stop(int64_t committed) const;
  // Whether the job logged an event matching `match` since `unix_start`.
  bool job_event_since(double unix_start, const std::function<bool(const json&)>& match) const;
  // `sig` to the ranks this host runs (by their heartbeat records): whether any was signalled.
  bool signal_ranks(const Attempt& a, int sig) const;
  void stop_job(Attempt& a);
  void kill_job(Attempt& a);
  std::vector<pid_t> local_rank_pids(const Attempt& a) const;
  void kill_leftover_ranks(const Attempt& a);
  bool is_job_rank(int64_t pid) const;
  void record(const std::string& event, const json& fields, const std::string& line);

  // First: SIGINT/SIGTERM are a stop from the moment launch reads its config on.
  StopSignals signals_;
  const LaunchOptions& o_;
  const RunConfig rc_;
  const std::string run_dir_;
  double attempt_unix_ = 0;
  // `launch --overwrite` until an attempt's job has taken the run directory (and so replaced
  // the old run): an attempt that dies before that leaves the old run for the next to replace.
  bool overwrite_pending_ = false;
  struct PendingEvent {
    std::string event;
    json fields;
    double time;
  };
  std::vector<PendingEvent> pending_;  // not yet in the events log (no directory, a full disk)
};

// The console line, and the events log once the run directory exists (the job creates it).
void Supervisor::record(const std::string& event, const json& fields, const std::string& line) {
  std::fprintf(stderr, "launch: %s\n", line.c_str());
  pending_.push_back({event, fields, unix_now()});
  if (!path_exists(run_dir_)) return;
  try {
    for (const PendingEvent& p : pending_)
      append_event(run_dir_, "launch", p.event, p.fields, p.time);
    pending_.clear();
  } catch (const Error& e) {
    // A full disk: the events wait for the next record; the console has them now.
    std::fprintf(stderr, "launch: warning: %s\n", e.what());
  }
}

// What every attempt would fail on, refused before the first: a layout that does not fit
// --np or --restart-np (a restart would otherwise fail the same way until the budget is
// spent), and heartbeats turned off (launch's watch would take the silent ranks for lost).
void Supervisor::check_launchable() const {
  check_rank_layout(rc_, o_.ranks, o_.ranks > 1, fmt::format("--np {}", o_.ranks));
  if (o_.restart_ranks > 0)
    check_rank_layout(rc_, o_.restart_ranks, o_.restart_ranks > 1,
                      fmt::format("--restart-np {}", o_.restart_ranks));
  if (rc_.train.heartbeat_interval_s <= 0)
    fail(
        "train.heartbeat_interval_s = 0 turns heartbeats off, and launch watches the ranks "
        "by them (a job without them would be taken for lost)",
        "leave train.heartbeat_interval_s above 0 under launch (default 1), or run foundry "
        "train directly");
}

Attempt Supervisor::start(int number) {
  Attempt a;
  a.number = number;
  a.host = host_name();
  a.ranks = number > 1 && o_.restart_ranks > 0 ? o_.restart_ranks : o_.ranks;
  // `launch --overwrite` starts the run anew, whatever the directory holds, until a job has.
  a.overwrite = overwrite_pending_;
  a.resume_step = a.overwrite ? 0 : latest_resume_step(rc_.train);
  // A training job that launch did not start (`foundry train` by hand) holds the directory:
  // refused before anything of its is touched (its heartbeats would vanish and it would take
  // its own ranks for lost). The lock is taken and let go at once; launch's job takes it next.
  // On a restart the holder may be the failed attempt's last rank, still exiting: then the
  // heartbeats stay, and the new job, refused the lock, fails and is retried with backoff.
  bool held = false;
  if (path_exists(run_dir_)) {
    try {
      const RunDirLock probe(run_dir_, kLockFile);
    } catch (const Error&) {
      if (number == 1) throw;
      held = true;
    }
  }
  // Records of the previous attempt would read as silent ranks.
  if (!held) remove_all(heartbeat_dir(run_dir_));
  remove_all(launch_stop_path(run_dir_));
  CommandInputs in;
  in.launcher = o_.launcher;
  in.ranks = a.ranks;
  in.exe = o_.exe;
  in.train_args = {"--config", o_.config_path};
  for (const std::string& s : o_.overrides) in.train_args.insert(in.train_args.end(), {"--set", s});
  in.train_args.insert(in.train_args.end(), o_.train_args.begin(), o_.train_args.end());
  in.train_args.push_back(a.overwrite ? "--overwrite" : "--auto-resume");
  in.launcher_args = o_.launcher_args;
  in.host_cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  in.host_slots = physical_cores();
  in.omp_threads_set = std::getenv("OMP_NUM_THREADS") != nullptr;
  in.root = geteuid() == 0;
  in.in_slurm = std::getenv("SLURM_JOB_ID") != nullptr;
  const JobCommand cmd = job_command(in);
  if (const char* threads = std::getenv("OMP_NUM_THREADS"); threads && a.ranks > 1)
    if (std::atoi(threads) * a.ranks > in.host_cores)
      std::fprintf(stderr,
                   "launch: warning: OMP_NUM_THREADS=%s × %d ranks is more threads than this "
                   "host's %d cores (if the ranks share it): unset OMP_NUM_THREADS to share them\n",
                   threads, a.ranks, in.host_cores);

  a.logged_at_start = last_logged_step(run_dir_);
  const std::string launch_pid = std::to_string(getpid());
  const pid_t pid = fork();
  if (pid < 0) fail(fmt::format("cannot start the job: fork: {}", std::strerror(errno)));
  if (pid == 0) {
    setpgid(0, 0);  // its own process group: ended as one
    for (const auto& [k, v] : cmd.env) setenv(k.c_str(), v.c_str(), 1);
    setenv(kLaunchPidVariable, launch_pid.c_str(), 1);  // the run directory lets it in
    setenv(kLaunchStartupVariable, fmt::format("{:g}", o_.startup_timeout_s).c_str(), 1);
    // Injected faults are for the first attempt: the restart is the recovery under test.
    if (number > 1)
      for (const char* fault : kFaultVariables) unsetenv(fault);
    std::vector<char*> argv;
    for (const std::string& s : cmd.argv) argv.push_back(const_cast<char*>(s.c_str()));
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    std::fprintf(stderr, "error: cannot run '%s': %s\n", argv[0], std::strerror(errno));
    std::_Exit(kExitFailed);
  }
  setpgid(pid, pid);  // here too: a stop right after the fork reaches the job's group
  a.pid = pid;
  a.started = now_seconds();
  attempt_unix_ = unix_now();
  record("start",
         {{"attempt", number},
          {"ranks", a.ranks},
          {"resume_step", a.resume_step},
          {"command", fmt::format("{}", fmt::join(cmd.argv, " "))}},
         fmt::format("attempt {}: {} rank(s), {} ({})", number, a.ranks,
                     a.overwrite         ? std::string("from the start (--overwrite)")
                     : a.resume_step > 0 ? fmt::format("resuming from step {}", a.resume_step)
                                         : std::string("from the start or the latest checkpoint"),
                     fmt::join(cmd.argv, " ")));
  return a;
}

// Silent or stuck ranks, judged as the ranks judge each other (train/heartbeat.h), for when
// they cannot: one process, or every rank of a node gone at once. Where a rank's own watch has
// already reported the loss or the hang (its event in events.jsonl), the job is ending with
// that rank's account, and the supervisor waits for its exit (kJobEndingGraceSeconds at most).
std::optional<Outcome> Supervisor::check_heartbeats(Attempt& a, double now) {
  std::optional<Outcome> verdict = judge_heartbeats(a, now);
  if (!verdict) return std::nullopt;
  if (a.job_ending_since < 0 && job_event_since(attempt_unix_, is_job_ending))
    a.job_ending_since = now;
  if (a.job_ending_since >= 0 && now - a.job_ending_since < kJobEndingGraceSeconds)
    return std::nullopt;
  return verdict;
}

std::optional<Outcome> Supervisor::judge_heartbeats(Attempt& a, double now) {
  const std::map<int, HeartbeatRecord> records = read_heartbeats(run_dir_);
  for (int rank = 0; rank < a.ranks; ++rank) {
    auto it = records.find(rank);
    if (it == records.end()) {
      if (now - a.started > o_.startup_timeout_s)
        return Outcome{Outcome::failed, true, "rank_lost", rank,
                       fmt::format("rank {} wrote no heartbeat within {:.0f} s of the start (a "
                                   "rank's first comes once MPI is up and the job holds the run "
                                   "directory: raise --startup-timeout if the start takes longer)",
                                   rank, o_.startup_timeout_s)};
      continue;
    }
    const HeartbeatRecord& r = it->second;
    a.records[rank] = r;
    // A step is complete once its rank has marked anything after it (its layers' forward and
    // backward marks are inside it).
    const bool inside_step = r.phase == "step" || r.phase == "forward" || r.phase == "backward";
    a.progressed =
        a.progressed || r.step > a.resume_step + 1 || (r.step == a.resume_step + 1 && !inside_step);
    a.last_step = std::max(a.last_step, r.step);
    if (r.exited) continue;
    const double silent = a.beats[rank].seen(r.beats, now);
    const double idle = a.progress[rank].seen(r.progress, now);
    // The ranks watch each other with the same limits; this is the second line.
    if (silent > rc_.train.heartbeat_timeout_s + 1)
      return Outcome{Outcome::failed, true, "rank_lost", rank,
                     fmt::format("{} {}: no heartbeat for {:.1f} s", describe_rank(r),
                                 describe_silence(r), silent)};
    if (idle > r.hang_after_s + 5)
      return Outcome{Outcome::failed, true, "hang", rank,
                     fmt::format("the job hangs: {} has made no progress for {:.0f} s; {}",
                                 describe_rank(r), idle, describe_positions(records))};
  }
  return std::nullopt;
}

// A rank on this host whose process is gone without saying it exited died (SIGKILL, the OOM
// killer, a crash): noticed within a poll, not after mpirun's own clean-up or a heartbeat
// timeout. The job's own exit says more when it comes soon (kGoneGraceSeconds: a job
// failing as a whole keeps its exit code), when the rank did exit normally since its record
// was read, or when a rank's heartbeat watch is already ending the job.
std::optional<Outcome> Supervisor::check_rank_processes(Attempt& a, double now) {
  for (auto& [rank, r] : a.records) {
    if (r.exited || r.host != a.host || local_process_state(r.pid) != "gone") {
      a.gone_since.erase(rank);
      continue;
    }
    const double since = a.gone_since.emplace(rank, now).first->second;
    if (now - since < kGoneGraceSeconds) continue;
    // Its last record: it exited normally since the one read, or it names the step it died in.
    if (auto fresh = read_heartbeat(run_dir_, rank)) r = *fresh;
    if (r.exited) continue;
    if (job_event_since(attempt_unix_, is_job_ending)) continue;
    // Its record is written every heartbeat interval: the step it names is where the rank
    // last reported, which a fast step loop may have left steps behind.
    return Outcome{Outcome::failed, true, "rank_lost", rank,
                   fmt::format("rank {} (pid {} on {}) has died (its process is gone; its last "
                               "heartbeat was at step {} ({}))",
                               r.rank, r.pid, r.host, r.step, r.phase)};
  }
  return std::nullopt;
}

bool Supervisor::job_event_since(double unix_start,
                                 const std::function<bool(const json&)>& match) const {
  for (const json& e : read_events(run_dir_))
    if (e.value("unix", 0.0) >= unix_start && e.value("source", "") == "train" && match(e))
      return true;
  return false;
}

Outcome Supervisor::classify_exit(const Attempt& a, int status) const {
  if (WIFSIGNALED(status))
    return {Outcome::failed, true, "signal", -1,
            fmt::format("the job was killed by signal {} ({})", WTERMSIG(status),
                        strsignal(WTERMSIG(status)))};
  const int code = WEXITSTATUS(status);
  Outcome o{Outcome::failed, true, "exit", -1, fmt::format("the job exited with code {}", code)};
  o.exit_code = code;
  if (code == kExitFinished) o.kind = Outcome::finished;
  // A stop signal sent to the ranks themselves (a scheduler's preemption): the job saved a
  // checkpoint and asks to stop, as when launch passed the signal on.
  if (code == kExitInterrupted) o.kind = Outcome::interrupted;
  if (code == kExitRankLost) {
    o.cause = "rank_lost";
    o.detail += " (a rank died, stopped or hung: see the job's error above)";
  }
  // A first start that fails before its first step met bad input and would fail the same
  // way again; a restart's may be the environment (a disk still full) and is retried. A fast
  // job can run many steps between two heartbeat reads, so a step logged since the start
  // counts as progress too.
  // (Under --overwrite the old run's steps are no progress: the new run's count once it
  // replaced them.)
  const int64_t logged = last_logged_step(run_dir_);
  const bool progressed =
      a.progressed || (a.overwrite ? logged > 0 && job_event_since(attempt_unix_, is_overwrite)
                                   : logged > a.logged_at_start);
  const bool bad_input = !progressed && a.number == 1;
  const auto fatal = [](const json& e) { return e.value("fatal", false); };
  if (code == kExitFailed && (bad_input || job_event_since(attempt_unix_, fatal))) {
    o.retry = false;
    o.detail += bad_input ? " before completing a step (it would fail the same way again)"
                          : " (a failure the job marked fatal)";
  }
  // A command line the job (or its launcher) refuses is refused again on every restart.
  if (code == kExitUsage) {
    o.retry = false;
    o.detail += " (its command line is wrong: it would fail the same way again)";
  }
  // mpirun reports a rank killed by signal N as 128 + N.
  if (code > 128 && code < 160)
    o.detail += fmt::format(" (a rank was killed by signal {})", code - 128);
  return o;
}

// Whether `pid` on this host is a rank of this job (a pid can be reused).
bool Supervisor::is_job_rank(int64_t pid) const {
  std::ifstream cmdline(fmt::format("/proc/{}/cmdline", pid));
  std::string args((std::istreambuf_iterator<char>(cmdline)), std::istreambuf_iterator<char>());
  return args.find(o_.config_path) != std::string::npos;
}

// The pids of the attempt's ranks running on this host that have not exited, found by their
// heartbeat records.
std::vector<pid_t> Supervisor::local_rank_pids(const Attempt& a) const {
  std::vector<pid_t> pids;
  for (const auto& [rank, r] : read_heartbeats(run_dir_))
    if (!r.exited && r.host == a.host && is_job_rank(r.pid)) pids.push_back(pid_t(r.pid));
  return pids;
}

// Ranks of a failed attempt still alive on this host (stopped, or missed by mpirun's clean-up).
void Supervisor::kill_leftover_ranks(const Attempt& a) {
  for (const pid_t pid : local_rank_pids(a)) kill(pid, SIGKILL);
}

// Asks the job to checkpoint and exit: SIGTERM to the ranks this host runs, which agree on
// the stop with every other rank at the end of the step. Not to mpirun: it answers SIGTERM by
// killing the ranks, long before a large model's checkpoint is written. Before any rank has
// a heartbeat record, or with no rank here, the whole process group gets it.
bool Supervisor::signal_ranks(const Attempt& a, int sig) const {
  bool signalled = false;
  for (const pid_t pid : local_rank_pids(a)) signalled = kill(pid, sig) == 0 || signalled;
  return signalled;
}

void Supervisor::stop_job(Attempt& a) {
  // First the request a rank still starting reads (mpirun may pass the signal on late).
  try {
    make_dirs(heartbeat_dir(run_dir_));
    write_file_atomic(launch_stop_path(run_dir_), fmt::format("{}\n", getpid()));
  } catch (const Error& e) {
    std::fprintf(stderr, "launch: warning: %s\n", e.what());
  }
  if (signal_ranks(a, SIGTERM)) return;
  kill(-a.pid, SIGTERM);
  // Before any rank beat, the stop reached mpirun/srun itself (after, the ranks here have
  // exited, or run elsewhere, and the job's exit says what happened).
  a.stopped_whole_group = a.records.empty() && read_heartbeats(run_dir_).empty();
}

// Ends the job at once and reaps it: SIGKILL to every rank this host runs, then SIGTERM to
// mpirun/srun, whose own clean-up ends the ranks elsewhere and removes the job's shared-memory
// segments (killed outright, it left 4 MiB in /dev/shm per restart); what of its process group
// is still there after kLauncherCleanupSeconds is killed.
void Supervisor::kill_job(Attempt& a) {
  kill_leftover_ranks(a);
  kill(a.pid, SIGTERM);
  int status = 0;
  const double until = now_seconds() + kLauncherCleanupSeconds;
  while (waitpid(a.pid, &status, WNOHANG) == 0) {
    if (now_seconds() >= until) {
      kill(-a.pid, SIGKILL);
      waitpid(a.pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(-a.pid, SIGKILL);  // anything of the group mpirun left behind
}

// Whether the job's exit `status` is the stop signal's own doing: killed by SIGTERM or SIGINT
// (mpirun reports a rank's as 128 + N), or ended before any rank wrote a heartbeat (a job
// still starting, before it handles the signal).
bool Supervisor::ended_by_stop(const Attempt& a, int status) const {
  const auto stop_signal = [](int sig) { return sig == SIGTERM || sig == SIGINT; };
  if (WIFSIGNALED(status)) return stop_signal(WTERMSIG(status));
  const int code = WEXITSTATUS(status);
  if (code > 128 && stop_signal(code - 128)) return true;
  return a.records.empty() && read_heartbeats(run_dir_).empty();
}

std::string Supervisor::after_stop(int64_t committed) const {
  bool old_run = overwrite_pending_;
  try {
    old_run = old_run && inspect_run_dir(run_dir_, &rc_.train).any();
  } catch (const Error&) {
  }
  if (old_run)
    return "stopped before the old run was replaced: it is as it was (run the same command to "
           "replace it, or drop --overwrite to resume it)";
  if (committed == 0)
    return "stopped before the run's first checkpoint: the same command starts it again";
  if (o_.overwrite)
    return fmt::format(
        "stopped; resume with the same command without --overwrite, which would "
        "replace this run again (checkpoint step {})",
        committed);
  return fmt::format("stopped; resume with the same command (checkpoint step {})", committed);
}

Outcome Supervisor::watch(Attempt& a) {
  bool stopping = false, interrupted_twice = false;
  double next_check = 0;
  for (;;) {
    int status = 0;
    if (waitpid(a.pid, &status, WNOHANG) == a.pid) {
      // Asked to stop, the job exits 75 (or 0 if it was done). One the stop itself ended
      // before it could save (still starting, before its stop handler: killed by the signal,
      // or with no heartbeat yet) is an interruption too; any other exit is a failure, which
      // run() records before it stops.
      Outcome o = classify_exit(a, status);
      // mpirun's SIGTERM does not end a stopped rank: one left behind would hold its memory.
      if (o.kind == Outcome::failed) kill_leftover_ranks(a);
      // A stop that reached mpirun/srun too (no rank had a heartbeat yet) ends it with a code
      // of its own, which says nothing of a failure.
      if (stopping && o.kind == Outcome::failed &&
          (a.stopped_whole_group || ended_by_stop(a, status)))
        o.kind = Outcome::interrupted;
      return o;
    }
    const double now = now_seconds();
    if (!stopping && signals_.received()) {
      stopping = true;  // the job saves a checkpoint and exits 75
      record("stop", {{"attempt", a.number}, {"signal", signals_.received()}},
             "stop signal: asking the job to checkpoint and exit");
      stop_job(a);
    }
    // A second signal, a Ctrl-C among them: passed on as SIGINT, which ends a job still
    // starting at once (a training one goes on to its checkpoint).
    if (stopping && !interrupted_twice && signals_.count() >= 2 && signals_.interrupts() >= 1) {
      interrupted_twice = true;
      std::fprintf(stderr,
                   "launch: second stop signal: passing SIGINT on (a job still starting "
                   "exits now)\n");
      if (!signal_ranks(a, SIGINT)) kill(-a.pid, SIGINT);
    }
    // While it stops too: a rank that died or went silent cannot save its part, and the job
    // would wait for it forever.
    if (std::optional<Outcome> o = check_rank_processes(a, now)) {
      kill_job(a);
      return *o;
    }
    if (now >= next_check) {
      next_check = now + std::min(1.0, std::max(kPollSeconds, rc_.train.heartbeat_interval_s));
      if (std::optional<Outcome> o = check_heartbeats(a, now)) {
        kill_job(a);
        return *o;
      }
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(kPollSeconds));
  }
}

int Supervisor::run() {
  const double first_backoff = std::min(o_.backoff_s, o_.max_backoff_s);
  double backoff = first_backoff;
  for (int number = 1;; ++number) {
    if (number == 1 && signals_.received()) {  // stopped while launch was starting
      record("stop", {{"attempt", number}, {"signal", signals_.received()}},
             "stop signal before the first attempt: no job started");
      record("interrupted", {{"attempt", number}, {"step", latest_resume_step(rc_.train)}},
             "stopped before any job started");
      return kExitInterrupted;
    }
    Attempt a = start(number);
    Outcome o = watch(a);
    // Heartbeats start once a job holds the run directory, and start() cleared the last
    // attempt's. Under --overwrite it replaces the old run only once it is ready to train (its
    // "overwrite" event, written even when there was nothing to remove).
    const bool held =
        o.kind != Outcome::failed || !a.records.empty() || !read_heartbeats(run_dir_).empty();
    const bool replaced = held && (o.kind == Outcome::finished || a.progressed ||
                                   job_event_since(attempt_unix_, is_overwrite));
    // An --overwrite attempt that failed or stopped before it replaced the old run trained
    // nothing of this run: the steps and checkpoints there are the old run's, not this run's to
    // count as lost, and the next attempt replaces them.
    const bool old_run_there = overwrite_pending_ && !replaced;
    if (replaced) overwrite_pending_ = false;
    const int64_t committed = old_run_there ? 0 : latest_resume_step(rc_.train);
    if (!old_run_there) a.last_step = std::max(a.last_step, last_logged_step(run_dir_));
    if (o.kind == Outcome::finished) {
      record(
          "finished", {{"attempt", number}, {"step", committed}},
          fmt::format("the run finished (attempt {}, last checkpoint step {})", number, committed));
      return kExitFinished;
    }
    if (o.kind == Outcome::interrupted) {
      record("interrupted", {{"attempt", number}, {"step", committed}}, after_stop(committed));
      return kExitInterrupted;
    }
    const int64_t lost = std::max<int64_t>(0, a.last_step - committed);
    record("failure",
           {{"attempt", number},
            {"cause", o.cause},
            {"rank", o.rank},
            {"message", o.detail},
            {"exit_code", o.exit_code},
            {"last_step", a.last_step},
            {"checkpoint_step", committed},
            {"steps_lost", lost}},
           old_run_there
               ? fmt::format("attempt {} failed before its job replaced the old run: {}; "
                             "none of the steps there are this run's (--overwrite still to do)",
                             number, o.detail)
               : fmt::format("attempt {} failed: {}; last step {}, last checkpoint step {}", number,
                             o.detail, a.last_step, committed));
    // Asked to stop while the job failed: no restart; what the run has stands.
    if (signals_.received()) {
      record("interrupted", {{"attempt", number}, {"step", committed}}, after_stop(committed));
      return kExitInterrupted;
    }
    if (!o.retry) return kExitFailed;
    if (number > o_.max_restarts) {
      record("gave_up", {{"attempt", number}, {"restarts", o_.max_restarts}},
             fmt::format("giving up after {} restarts (--max-restarts)", o_.max_restarts));
      return kExitFailed;
    }
    // An attempt that saved a newer checkpoint restarts at once; attempts that make no
    // headway wait, longer each time.
    double wait = 0;
    if (committed > a.resume_step && !overwrite_pending_) {
      backoff = first_backoff;
    } else {
      wait = backoff;
      backoff = std::min(o_.max_backoff_s, 2 * backoff);
    }
    record("restart",
           {{"attempt", number + 1},
            {"from_step", committed},
            {"steps_lost", lost},
            {"backoff_s", wait}},
           fmt::format("restarting {} from step {} ({} step(s) lost)",
                       wait > 0 ? fmt::format("in {:.1f} s", wait) : std::string("now"), committed,
                       lost));
    // The wait ends early on SIGINT/SIGTERM: no job runs, and the latest checkpoint stands.
    const double until = now_seconds() + wait;
    while (!signals_.received() && now_seconds() < until)
      std::this_thread::sleep_for(std::chrono::duration<double>(std::min(0.1, wait)));
    if (signals_.received()) {
      record("stop", {{"attempt", number + 1}, {"signal", signals_.received()}},
             "stop signal before the restart: no job is running");
      record("interrupted", {{"attempt", number + 1}, {"step", committed}}, after_stop(committed));
      return kExitInterrupted;
    }
  }
}

}  // namespace

// The run directory belongs to one supervisor, as it belongs to one trainer: a second launch
// on it would count the first one's steps as its own lost steps and write its events into
// the first one's log. The lock is taken before anything is written; a directory made here
// for a run that never started is removed again.
class LaunchClaim {
 public:
  explicit LaunchClaim(const std::string& run_dir) : run_dir_(run_dir) {
    created_ = !path_exists(run_dir);
    if (created_) make_dirs(run_dir);
    try {
      lock_.emplace(run_dir, kLaunchLockFile);
      check_run_files(run_dir);  // before launch appends to events.jsonl
    } catch (...) {
      if (created_) remove_all(run_dir);
      throw;
    }
  }
  ~LaunchClaim() {
    try {
      remove_all(launch_stop_path(run_dir_));  // a stop request ends with the launch
    } catch (const Error& e) {
      std::fprintf(stderr, "launch: warning: %s\n", e.what());
    }
    lock_.reset();
    try {
      if (created_ && !inspect_run_dir(run_dir_).any()) remove_all(run_dir_);
    } catch (const Error& e) {
      std::fprintf(stderr, "launch: warning: %s\n", e.what());
    }
  }

 private:
  std::string run_dir_;
  bool created_ = false;
  std::optional<RunDirLock> lock_;
};

int supervise(const LaunchOptions& options) {
  Supervisor supervisor(options);  // reads the config: bad input fails before anything exists
  LaunchClaim claim(supervisor.run_dir());
  return supervisor.run();
}

}  // namespace foundry
