#include "train/metrics.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>

#include "base/error.h"
#include "base/io.h"

namespace foundry {

int64_t truncate_metrics(const std::string& path, int64_t last_step) {
  if (!path_exists(path)) return 0;
  std::istringstream in(read_text_file(path));
  std::string line, kept;
  int64_t last_kept = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    try {
      json j = json::parse(line);
      const int64_t step = j.value("step", int64_t{0});
      if (step > last_step) continue;
      last_kept = step;
    } catch (const json::parse_error&) {
      continue;  // a torn last line from a crash
    }
    kept += line + "\n";
  }
  write_file_atomic(path, kept);
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
