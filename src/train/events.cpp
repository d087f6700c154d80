#include "train/events.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <sstream>

#include "base/error.h"
#include "base/io.h"

namespace foundry {

double unix_now() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

std::string utc_timestamp(double unix_seconds) {
  const auto whole = static_cast<time_t>(std::floor(unix_seconds));
  const int millis = static_cast<int>((unix_seconds - double(whole)) * 1000);
  std::tm tm{};
  gmtime_r(&whole, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  return fmt::format("{}.{:03d}Z", buf, std::min(millis, 999));
}

void append_event(const std::string& run_dir, const std::string& source, const std::string& event,
                  const json& fields, double unix_time) {
  const double now = unix_time >= 0 ? unix_time : unix_now();
  json line = {{"time", utc_timestamp(now)}, {"unix", now}, {"source", source}, {"event", event}};
  if (fields.is_object()) line.update(fields);
  const std::string text = line.dump() + "\n";
  const std::string path = run_dir + "/" + kEventsFile;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0)
    fail(
        fmt::format("cannot open '{}' to record event '{}': {}", path, event, std::strerror(errno)),
        "check that the run directory exists and is writable");
  const ssize_t n = ::write(fd, text.data(), text.size());
  const int write_errno = errno;
  ::close(fd);
  if (n != static_cast<ssize_t>(text.size()))
    fail(fmt::format("cannot append event '{}' to '{}': {}", event, path,
                     n < 0 ? std::strerror(write_errno) : "short write (disk full?)"),
         io_error_hint(n < 0 ? write_errno : ENOSPC, path,
                       "free space on the run directory's file system"));
}

std::vector<json> read_events(const std::string& run_dir) {
  const std::string path = run_dir + "/" + kEventsFile;
  std::vector<json> events;
  if (!path_exists(path)) return events;
  std::istringstream in(read_text_file(path));
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    try {
      events.push_back(json::parse(line));
    } catch (const json::parse_error&) {
      // a torn line from a crash or a full disk
    }
  }
  return events;
}

}  // namespace foundry
