// Wall-clock timing and a per-operation time breakdown.
#pragma once
#include <chrono>
#include <map>
#include <string>

namespace foundry {

inline double now_seconds() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}

// Accumulates seconds per named operation; `enabled` off makes it free.
class OpTimes {
 public:
  bool enabled = false;
  void add(const std::string& op, double seconds) {
    if (enabled) seconds_[op] += seconds;
  }
  void clear() { seconds_.clear(); }
  const std::map<std::string, double>& seconds() const { return seconds_; }

 private:
  std::map<std::string, double> seconds_;
};

// Times the scope it lives in into an OpTimes entry.
class ScopedOpTimer {
 public:
  ScopedOpTimer(OpTimes* times, const char* op)
      : times_(times && times->enabled ? times : nullptr), op_(op),
        start_(times_ ? now_seconds() : 0.0) {}
  ~ScopedOpTimer() {
    if (times_) times_->add(op_, now_seconds() - start_);
  }

 private:
  OpTimes* times_;
  const char* op_;
  double start_;
};

}  // namespace foundry
