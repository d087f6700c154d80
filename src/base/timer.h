// Wall-clock timing and a per-operation time breakdown (on the host's clock or a device's).
#pragma once
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace foundry {

inline double now_seconds() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

// Where an operation's time is read when it does not run on the host: a device's queue.
// mark() records a point in the queue (after everything queued so far) and names it;
// seconds(from, to) waits for `to` and returns the queue's time between the two points;
// reset() lets the marks be reused once every interval has been read.
class OpClock {
 public:
  virtual ~OpClock() = default;
  virtual int64_t mark() = 0;
  virtual double seconds(int64_t from, int64_t to) = 0;
  virtual void reset() = 0;
};

// Accumulates seconds per named operation; `enabled` off makes it free. Timed on the host's
// wall clock, or with a clock (set_clock: a GPU's events) whose intervals are read when the
// times are (seconds(), or every few thousand intervals), not while the device still works.
class OpTimes {
 public:
  bool enabled = false;
  void add(const std::string& op, double seconds) {
    if (enabled) seconds_[op] += seconds;
  }
  void clear() {
    resolve();
    seconds_.clear();
  }
  const std::map<std::string, double>& seconds() const {
    resolve();
    return seconds_;
  }

  void set_clock(OpClock* clock) { clock_ = clock; }
  OpClock* clock() const { return clock_; }
  void add_interval(const char* op, int64_t from, int64_t to) {
    pending_.push_back({op, from, to});
    if (pending_.size() >= kMaxPending) resolve();
  }

 private:
  struct Interval {
    const char* op;
    int64_t from, to;
  };
  static constexpr size_t kMaxPending = 4096;
  void resolve() const {
    if (pending_.empty()) return;
    for (const Interval& i : pending_) seconds_[i.op] += clock_->seconds(i.from, i.to);
    pending_.clear();
    clock_->reset();
  }

  mutable std::map<std::string, double> seconds_;
  OpClock* clock_ = nullptr;
  mutable std::vector<Interval> pending_;
};

// Times the scope it lives in into an OpTimes entry (on its clock when it has one).
class ScopedOpTimer {
 public:
  ScopedOpTimer(OpTimes* times, const char* op)
      : times_(times && times->enabled ? times : nullptr), op_(op) {
    if (!times_) return;
    if (OpClock* c = times_->clock())
      mark_ = c->mark();
    else
      start_ = now_seconds();
  }
  ~ScopedOpTimer() {
    if (!times_) return;
    if (OpClock* c = times_->clock())
      times_->add_interval(op_, mark_, c->mark());
    else
      times_->add(op_, now_seconds() - start_);
  }
  ScopedOpTimer(const ScopedOpTimer&) = delete;
  ScopedOpTimer& operator=(const ScopedOpTimer&) = delete;

 private:
  OpTimes* times_;
  const char* op_;
  double start_ = 0;
  int64_t mark_ = 0;
};

}  // namespace foundry
