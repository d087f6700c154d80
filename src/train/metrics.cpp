#include "train/metrics.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/error.h"
#include "base/io.h"

namespace foundry {

// The file grows a line a step (a long run's holds hundreds of MB): it is read back from its
// end to the last line to keep, and cut there in place.
int64_t truncate_metrics(const std::string& path, int64_t last_step) {
  if (!path_exists(path)) return 0;
  int64_t keep_bytes = 0, last_kept = 0;
  for_each_line_from_end(path, [&](std::string_view line, int64_t offset) {
    if (line.empty()) return true;
    try {
      const int64_t step = json::parse(line).value("step", int64_t{0});
      if (step > last_step) return true;
      last_kept = step;
      keep_bytes = offset + static_cast<int64_t>(line.size()) + 1;
      return false;
    } catch (const json::exception&) {
      return true;  // a torn last line from a crash
    }
  });
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  struct stat st {};
  bool done = fd >= 0 && ::fstat(fd, &st) == 0;
  if (done && keep_bytes < st.st_size) done = ::ftruncate(fd, keep_bytes) == 0;
  // (a last line kept whole without its newline gets one)
  if (done && keep_bytes > st.st_size) done = ::pwrite(fd, "\n", 1, st.st_size) == 1;
  if (done) done = ::fsync(fd) == 0;
  const int err = errno;
  if (fd >= 0) ::close(fd);
  if (!done)
    fail(fmt::format("cannot cut '{}' back to step {}: {}", path, last_step, std::strerror(err)),
         io_error_hint(err, path, "check that the run directory is writable"));
  return last_kept;
}

MetricsWriter::MetricsWriter(const std::string& path, int64_t start_step) : path_(path) {
  last_step_ = truncate_metrics(path, start_step);
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    const int err = errno;
    fail(fmt::format("cannot open '{}' for writing: {}", path, std::strerror(err)),
         io_error_hint(err, path, "check that the run directory is writable"));
  }
}

MetricsWriter::~MetricsWriter() {
  if (fd_ >= 0) ::close(fd_);
}

MetricsWriter::MetricsWriter(MetricsWriter&& other) noexcept
    : path_(std::move(other.path_)), fd_(other.fd_), last_step_(other.last_step_) {
  other.fd_ = -1;
}

void MetricsWriter::write(const json& step_metrics) {
  const std::string line = step_metrics.dump() + "\n";
  struct stat before {};
  const bool sized = ::fstat(fd_, &before) == 0;
  // A short write is retried for the rest, which then says why it failed (ENOSPC, mostly).
  size_t done = 0;
  ssize_t n = 0;
  while (done < line.size() && (n = ::write(fd_, line.data() + done, line.size() - done)) > 0)
    done += static_cast<size_t>(n);
  if (done == line.size()) {
    last_step_ = step_metrics.value("step", last_step_);
    return;
  }
  const int err = n < 0 ? errno : EIO;
  const std::string why = std::strerror(err);
  if (sized && ::ftruncate(fd_, before.st_size) != 0) {
    // the torn line stays; a resume drops it (truncate_metrics)
  }
  fail(fmt::format("cannot append step {} to '{}': {}", step_metrics.value("step", int64_t{-1}),
                   path_, why),
       io_error_hint(err, path_, "free space on the run directory's file system") +
           "; then resume the run with --resume");
}

}  // namespace foundry
