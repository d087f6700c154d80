// A progress line for long work: a bar with rate and ETA on a terminal (stderr is a TTY),
// occasional plain lines otherwise, so logs stay readable.
#pragma once
#include <cstdint>
#include <string>

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

}  // namespace foundry
