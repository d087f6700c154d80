// A progress line for long work: a bar with rate and ETA on a terminal (stderr is a TTY),
// occasional plain lines otherwise, so logs stay readable.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

namespace foundry {

class Progress {
 public:
  Progress(std::string label, int64_t total, std::string unit = "");
  ~Progress();
  void update(int64_t done, const std::string& suffix = "");
  void finish(const std::string& suffix = "");
  static bool stderr_is_terminal();

 private:
  std::string label_, unit_;
  int64_t total_;
  double start_, last_print_ = 0;
  bool tty_, finished_ = false;
  int last_percent_ = -1;
};

// For work that cannot report how far it is (a library call): the time it has taken so far,
// from a thread of its own, every second on a terminal and every `log_every_s` otherwise.
class ElapsedTicker {
 public:
  explicit ElapsedTicker(std::string label, double log_every_s = 30);
  ~ElapsedTicker();  // stops the ticks (clearing the terminal's line)
  ElapsedTicker(const ElapsedTicker&) = delete;
  ElapsedTicker& operator=(const ElapsedTicker&) = delete;

 private:
  void run(double every_s);

  std::string label_;
  bool tty_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  bool printed_ = false;
  std::thread thread_;
};

}  // namespace foundry
