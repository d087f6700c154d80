#include "base/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "base/timer.h"

namespace foundry {

bool Progress::stderr_is_terminal() { return ::isatty(STDERR_FILENO) == 1; }

Progress::Progress(std::string label, int64_t total, std::string unit)
    : label_(std::move(label)), unit_(std::move(unit)), total_(total), start_(now_seconds()),
      tty_(stderr_is_terminal()) {}

Progress::~Progress() {
  if (tty_ && !finished_ && last_print_ > 0) std::fputc('\n', stderr);
}

void Progress::update(int64_t done, const std::string& suffix) {
  double now = now_seconds();
  double elapsed = now - start_;
  int percent = total_ > 0 ? static_cast<int>(100.0 * done / total_) : 0;
  double rate = elapsed > 0 ? done / elapsed : 0.0;
  if (tty_) {
    if (now - last_print_ < 0.1 && done < total_) return;
    last_print_ = now;
    const int width = 30;
    int filled = total_ > 0 ? static_cast<int>(width * static_cast<double>(done) / total_) : 0;
    if (filled > width) filled = width;
    std::string bar(filled, '#');
    bar.append(width - filled, '.');
    double eta = (rate > 0 && total_ > done) ? (total_ - done) / rate : 0.0;
    std::fprintf(stderr, "\r%s [%s] %3d%% %lld/%lld %s %.1f%s/s eta %.0fs %s\x1b[K", label_.c_str(),
                 bar.c_str(), percent, static_cast<long long>(done),
                 static_cast<long long>(total_), unit_.c_str(), rate, unit_.c_str(), eta,
                 suffix.c_str());
    std::fflush(stderr);
  } else {
    // Plain logs: one line per 10%.
    if (percent / 10 == last_percent_ / 10 && done < total_) return;
    last_percent_ = percent;
    last_print_ = now;
    std::fprintf(stderr, "%s: %d%% (%lld/%lld %s) %s\n", label_.c_str(), percent,
                 static_cast<long long>(done), static_cast<long long>(total_), unit_.c_str(),
                 suffix.c_str());
  }
}

void Progress::finish(const std::string& suffix) {
  if (finished_) return;
  const std::string timed =
      fmt::format("{}{}({:.1f} s)", suffix, suffix.empty() ? "" : " ", now_seconds() - start_);
  if (tty_) {
    update(total_, timed);
    std::fputc('\n', stderr);
  } else if (last_percent_ >= 100) {  // the 100% line is out: say it is done, and in how long
    std::fprintf(stderr, "%s: done: %s\n", label_.c_str(), timed.c_str());
  } else {
    update(total_, timed);
  }
  finished_ = true;
}

ElapsedTicker::ElapsedTicker(std::string label, double log_every_s)
    : label_(std::move(label)), tty_(Progress::stderr_is_terminal()) {
  thread_ = std::thread([this, every = tty_ ? 1.0 : log_every_s] { run(every); });
}

ElapsedTicker::~ElapsedTicker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
  }
  cv_.notify_all();
  thread_.join();
  if (tty_ && printed_) std::fprintf(stderr, "\r\x1b[K");
}

void ElapsedTicker::run(double every_s) {
  const double start = now_seconds();
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (cv_.wait_for(lock, std::chrono::duration<double>(every_s), [this] { return done_; }))
      return;
    const double elapsed = now_seconds() - start;
    if (tty_)
      std::fprintf(stderr, "\r%s: %.0f s\x1b[K", label_.c_str(), elapsed);
    else
      std::fprintf(stderr, "%s: %.0f s so far\n", label_.c_str(), elapsed);
    std::fflush(stderr);
    printed_ = true;
  }
}

}  // namespace foundry
